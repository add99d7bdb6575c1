//! Phase 3 (KeyMem §1): source-aware scoring with query-local normalisation, fused with the
//! BM25 evidence so dense similarity never demotes an exact lexical hit.

use std::collections::{HashMap, HashSet};

use recollect_extract::{QueryAnalysis, QueryType, Want};
use recollect_model::{MemoryId, RecalledMemory, ScoreParts, TenantId};
use recollect_storage::Scope;

use crate::softtfidf;
use crate::{Ablation, Component, PathB, PathC, QueryVectors, Recall, RecallError};

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Field max-sim (never a mixture, unless ablated): the best of the user and assistant cosines.
fn field_cos(q: &[f32], f: &recollect_storage::vector::FieldVectors, mixture: bool) -> f32 {
    let u = dot(q, &f.user);
    match (f.assistant.as_ref().map(|a| dot(q, a)), mixture) {
        (Some(a), false) => u.max(a),
        (Some(a), true) => (u + a) / 2.0,
        (None, _) => u,
    }
}

/// `s̃ = s / max(max_s, 1)`: query-local normalisation with a floor of 1.
fn normaliser(values: impl Iterator<Item = f32>) -> f32 {
    values.fold(1.0f32, f32::max)
}

#[allow(clippy::too_many_arguments)]
pub async fn score(
    r: &Recall,
    tenant: &TenantId,
    scope: &Scope,
    qa: &QueryAnalysis,
    qv: &QueryVectors,
    b: &PathB,
    c: &PathC,
    dense: &HashMap<MemoryId, f32>,
    lexical: &HashMap<MemoryId, f32>,
    k: usize,
    ablation: &Ablation,
) -> Result<Vec<RecalledMemory>, RecallError> {
    let cfg = &r.config;
    let mut candidates: HashSet<MemoryId> = HashSet::new();
    candidates.extend(b.result.iter().copied());
    candidates.extend(c.turns.iter().copied());
    candidates.extend(dense.keys().copied());
    candidates.extend(lexical.keys().copied());
    if candidates.is_empty() {
        return Ok(vec![]);
    }
    let ids: Vec<MemoryId> = candidates.into_iter().collect();
    let (records, vectors) = tokio::join!(
        r.graph.turns(tenant, &ids),
        r.vectors.field_vectors(tenant, &ids)
    );
    let (mut records, mut vectors) = (records?, vectors?);
    // As of an earlier time: each turn as it was then (never one recorded later), with that
    // version's vectors.
    if let Some(at) = scope.as_of {
        records = records.iter().filter_map(|rec| rec.as_of(at)).collect();
        let older: Vec<(MemoryId, chrono::DateTime<chrono::Utc>)> = records
            .iter()
            .filter(|rec| rec.turn.expired_at.is_some())
            .map(|rec| (rec.turn.memory_id, rec.turn.recorded_at))
            .collect();
        if !older.is_empty() {
            for id in older.iter().map(|(m, _)| m) {
                vectors.remove(id);
            }
            vectors.extend(r.vectors.version_vectors(tenant, &older).await?);
        }
    }
    // The graph paths reach turns through conversation-level nodes: the turn filter applies
    // here, before any scoring, as the vector index applied it inside its searches.
    let filter = &scope.filter;
    if !filter.is_empty() {
        records.retain(|rec| filter.matches(&rec.turn));
    }

    struct Row {
        idx: usize,
        cos: f32,
        time: f32,
        s_kw: f32,
        s_frag: f32,
        in_b: bool,
        in_c: bool,
    }
    let mut rows: Vec<Row> = Vec::with_capacity(records.len());
    for (idx, rec) in records.iter().enumerate() {
        let id = rec.turn.memory_id;
        let cos = match vectors.get(&id) {
            Some(f) if !ablation.without(Component::Dense) => {
                field_cos(&qv.query, f, ablation.without(Component::FieldMaxSim))
            }
            _ => 0.0,
        };
        // Time evidence: the question asks "when" and the turn says when; or the turn's times
        // fall inside the question's time hint.
        let says_when = !rec.extraction.times.is_empty();
        let in_hint = qa.time_hint.as_ref().is_some_and(|h| {
            rec.extraction
                .times
                .iter()
                .any(|t| t.start <= h.end && t.end >= h.start)
                || (h.start..=h.end).contains(&rec.turn.timestamp.date_naive())
        });
        let time = if (qa.wants == Some(Want::Time) && says_when) || in_hint {
            1.0
        } else {
            0.0
        };
        let keys = rec.extraction.keywords.iter().map(|k| &k.key);
        let s_kw = softtfidf::score(&b.neighbours, keys, &b.idf);
        rows.push(Row {
            idx,
            cos,
            time,
            s_kw,
            s_frag: c.turn_score.get(&id).copied().unwrap_or(0.0),
            in_b: b.result.contains(&id),
            in_c: c.turns.contains(&id),
        });
    }
    let kw_norm = normaliser(rows.iter().map(|r| r.s_kw));
    let frag_norm = normaliser(rows.iter().map(|r| r.s_frag));
    let lex_max = lexical.values().copied().fold(0.0f32, f32::max);
    let (w_base, w_cap) = match qa.query_type {
        QueryType::Factual => cfg.factual_weights,
        QueryType::Reasoning => cfg.reasoning_weights,
    };

    let score_all = |rows: &[Row]| -> Vec<(f32, usize, ScoreParts, Vec<String>)> {
        rows.iter()
            .map(|row| {
                let id = records[row.idx].turn.memory_id;
                let kw = row.s_kw / kw_norm;
                let frag = row.s_frag / frag_norm;
                let w = (w_base + 0.15 * row.s_kw).min(w_cap);
                let keymem = if ablation.without(Component::Scoring) {
                    row.cos
                } else {
                    match (row.in_b, row.in_c) {
                        (true, true) => (1.0 - w) * row.cos + w * (0.7 * kw + 0.3 * frag),
                        (false, true) => (1.0 - w) * row.cos + w * (0.5 * kw + 0.5 * frag),
                        _ => (1.0 - w) * row.cos + w * kw,
                    }
                };
                let lex = if lex_max > 0.0 {
                    lexical.get(&id).copied().unwrap_or(0.0) / lex_max
                } else {
                    0.0
                };
                let fused = keymem + cfg.lexical_weight * lex + cfg.time_weight * row.time;
                let mut sources = Vec::new();
                match (row.in_b, row.in_c) {
                    (true, true) => sources.push("BC".to_string()),
                    (true, false) => sources.push("B".to_string()),
                    (false, true) => sources.push("C".to_string()),
                    _ => {}
                }
                if lexical.contains_key(&id) {
                    sources.push("lexical".to_string());
                }
                if dense.contains_key(&id) {
                    sources.push("dense".to_string());
                }
                let parts = ScoreParts {
                    dense: row.cos,
                    lexical: lex,
                    keyword: kw,
                    fragment: frag,
                    time: row.time,
                    fused,
                };
                (fused, row.idx, parts, sources)
            })
            .collect()
    };
    let mut scored = score_all(&rows);

    // Neighbouring rounds carry part of each other's score: answers often span adjacent turns.
    if cfg.neighbour_weight > 0.0 {
        let pos: HashMap<(&str, u64), f32> = scored
            .iter()
            .map(|(s, i, _, _)| {
                (
                    (
                        records[*i].turn.conversation_id.as_str(),
                        records[*i].turn.position,
                    ),
                    *s,
                )
            })
            .collect();
        for (s, i, parts, _) in scored.iter_mut() {
            let t = &records[*i].turn;
            let best_adj = [t.position.wrapping_sub(1), t.position + 1]
                .iter()
                .filter_map(|p| pos.get(&(t.conversation_id.as_str(), *p)))
                .fold(0.0f32, |a, b| a.max(*b));
            *s += cfg.neighbour_weight * best_adj;
            parts.fused = *s;
        }
    }

    scored.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then_with(|| records[a.1].turn.position.cmp(&records[b.1].turn.position))
    });
    scored.truncate(k);
    Ok(scored
        .into_iter()
        .map(|(s, i, parts, sources)| {
            let t = &records[i].turn;
            RecalledMemory {
                memory_id: t.memory_id,
                conversation_id: t.conversation_id.clone(),
                turn_id: t.turn_id.clone(),
                user: t.user.clone(),
                assistant: t.assistant.clone(),
                user_speaker: t.user_speaker.clone(),
                assistant_speaker: t.assistant_speaker.clone(),
                timestamp: t.timestamp,
                user_id: t.user_id.clone(),
                agent_id: t.agent_id.clone(),
                metadata: t.metadata.clone(),
                score: s,
                sources,
                score_parts: parts,
            }
        })
        .collect())
}
