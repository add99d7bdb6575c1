//! Path B, direct (KeyMem §1 Phase 2): keyword-vector neighbours → their turns (`kw`), plus
//! entity, time and location traversal (`ent`, `time`, `loc`); when two or more of those sets
//! are non-empty only their intersection is kept.

use std::collections::{HashMap, HashSet};

use chrono::NaiveDate;
use recollect_extract::QueryAnalysis;
use recollect_model::{MemoryId, TenantId};
use recollect_storage::{LinkedTurn, NodeKind, Scope};

use crate::softtfidf::{self, idf, Neighbours};
use crate::{Ablation, Component, QueryVectors, Recall, RecallError, ScopeEntities};

#[derive(Debug, Default, Clone)]
pub struct PathB {
    /// Per query keyword: neighbouring Keyword nodes and their cosine.
    pub neighbours: Neighbours,
    /// IDF of every neighbour keyword, over the turns in scope.
    pub idf: HashMap<String, f32>,
    pub kw: HashSet<MemoryId>,
    pub ent: HashSet<MemoryId>,
    pub time: HashSet<MemoryId>,
    pub loc: HashSet<MemoryId>,
    /// Every turn any lookup reached, best first: by how many of the four lookups reached it,
    /// then by its SoftTF-IDF against the query keywords (from the keyword links alone, no
    /// record read). Path C starts from the first `path_depth` of these.
    pub reached: Vec<MemoryId>,
    /// Path B's candidates, after the intersection filter: at most `path_depth`, the best by
    /// the same order.
    pub result: HashSet<MemoryId>,
}

/// Case-insensitive containment in either direction; very short names must match exactly.
fn contains_either(a: &str, b: &str) -> bool {
    if a.len() < 3 || b.len() < 3 {
        return a == b;
    }
    a.contains(b) || b.contains(a)
}

/// A TimePoint key: `YYYY-MM-DD` or `YYYY-MM-DD/YYYY-MM-DD`.
pub fn parse_time_key(k: &str) -> Option<(NaiveDate, NaiveDate)> {
    let p = |s: &str| NaiveDate::parse_from_str(s, "%Y-%m-%d").ok();
    match k.split_once('/') {
        Some((a, b)) => Some((p(a)?, p(b)?)),
        None => p(k).map(|d| (d, d)),
    }
}

async fn linked(
    r: &Recall,
    tenant: &TenantId,
    scope: &Scope,
    kind: NodeKind,
    names: &[String],
) -> Result<Vec<LinkedTurn>, RecallError> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    Ok(r.graph
        .linked_turns(tenant, scope, kind, names, scope.as_of, None)
        .await?)
}

fn turns_of(links: Vec<LinkedTurn>) -> HashSet<MemoryId> {
    links.into_iter().map(|l| l.memory_id).collect()
}

/// The turns linked to a name of `vocab` (the scope's names of `kind`, read when asked) that
/// contains a wanted one or is contained in it.
async fn contained<V: std::ops::Deref<Target = [String]>>(
    r: &Recall,
    tenant: &TenantId,
    scope: &Scope,
    kind: NodeKind,
    wanted: &[String],
    vocab: impl std::future::Future<Output = Result<V, RecallError>>,
) -> Result<HashSet<MemoryId>, RecallError> {
    if wanted.is_empty() {
        return Ok(HashSet::new());
    }
    let wanted: Vec<String> = wanted.iter().map(|w| w.to_lowercase()).collect();
    let names: Vec<String> = vocab
        .await?
        .iter()
        .filter(|n| wanted.iter().any(|w| contains_either(n, w)))
        .cloned()
        .collect();
    Ok(turns_of(linked(r, tenant, scope, kind, &names).await?))
}

pub async fn run(
    r: &Recall,
    tenant: &TenantId,
    scope: &Scope,
    qa: &QueryAnalysis,
    qv: &QueryVectors,
    entities: &ScopeEntities<'_>,
    ablation: &Ablation,
) -> Result<PathB, RecallError> {
    let cfg = &r.config;
    // kw: the 30 nearest Keyword nodes (cosine ≥ 0.45) of every query and answer keyword, the
    // floor and the cosines on MiniLM's scale, which the constants were set on.
    let scale = r.embedder.cosine_scale();
    let vectors: Vec<Vec<f32>> = qv.keywords.iter().map(|(_, v)| v.clone()).collect();
    let neighbours: Neighbours = r
        .vectors
        .search_keywords_many(
            tenant,
            scope,
            &vectors,
            cfg.keyword_neighbours,
            scale.keyword_floor(cfg.keyword_min_cosine),
        )
        .await?
        .into_iter()
        .map(|hits| {
            hits.into_iter()
                .map(|(name, c)| (name, scale.keyword(c)))
                .collect()
        })
        .collect();
    let mut names: Vec<String> = neighbours.iter().flat_map(|n| n.keys().cloned()).collect();
    names.sort();
    names.dedup();
    let (total, dfs) = r
        .graph
        .document_frequencies(tenant, scope, NodeKind::Keyword, &names)
        .await?;
    let idf_map: HashMap<String, f32> = names
        .iter()
        .cloned()
        .zip(dfs.iter().map(|&d| idf(total, d)))
        .collect();

    // Each turn's keyword links are its keywords: its s_kw is known here, before any record
    // is read, and orders the turns when there are more than a path's depth.
    let mut kw_names: HashMap<MemoryId, Vec<String>> = HashMap::new();
    for l in linked(r, tenant, scope, NodeKind::Keyword, &names).await? {
        kw_names.entry(l.memory_id).or_default().push(l.name);
    }
    let kw_score: HashMap<MemoryId, f32> = kw_names
        .iter()
        .map(|(id, names)| (*id, softtfidf::score(&neighbours, names, &idf_map)))
        .collect();
    let kw: HashSet<MemoryId> = kw_names.into_keys().collect();
    let (ent, time, loc) = if ablation.without(Component::Graph) {
        Default::default()
    } else {
        let time_fut = async {
            let Some(h) = &qa.time_hint else {
                return Ok::<_, RecallError>(HashSet::new());
            };
            let vocab = r
                .graph
                .vocabulary(tenant, scope, NodeKind::TimePoint)
                .await?;
            let names: Vec<String> = vocab
                .into_iter()
                .filter(|k| {
                    // Hints are closed ranges (open sides at the calendar's ends): overlap covers
                    // before, after, exact and range alike.
                    parse_time_key(k).is_some_and(|(s, e)| s <= h.end && e >= h.start)
                })
                .collect();
            Ok(turns_of(
                linked(r, tenant, scope, NodeKind::TimePoint, &names).await?,
            ))
        };
        let locations = async {
            Ok::<_, RecallError>(
                r.graph
                    .vocabulary(tenant, scope, NodeKind::Location)
                    .await?,
            )
        };
        let (e, t, l) = tokio::join!(
            contained(
                r,
                tenant,
                scope,
                NodeKind::Entity,
                &qa.entities,
                entities.names()
            ),
            time_fut,
            contained(
                r,
                tenant,
                scope,
                NodeKind::Location,
                &qa.locations,
                locations
            ),
        );
        (e?, t?, l?)
    };

    let sets = [&kw, &ent, &time, &loc];
    let reached = rank(&sets, &kw_score);
    let non_empty: Vec<&HashSet<MemoryId>> =
        sets.iter().copied().filter(|s| !s.is_empty()).collect();
    let result = if ablation.without(Component::PathB) {
        HashSet::new()
    } else {
        // With two or more lookups answering, only the turns all of them reached.
        reached
            .iter()
            .copied()
            .filter(|id| non_empty.len() < 2 || non_empty.iter().all(|s| s.contains(id)))
            .take(cfg.path_depth)
            .collect()
    };
    Ok(PathB {
        neighbours,
        idf: idf_map,
        kw,
        ent,
        time,
        loc,
        reached,
        result,
    })
}

/// Every turn of `sets`, best first: reached by more lookups, then a higher s_kw, then the
/// smaller id (so equal turns keep one order from run to run).
fn rank(sets: &[&HashSet<MemoryId>], kw_score: &HashMap<MemoryId, f32>) -> Vec<MemoryId> {
    let mut hits: HashMap<MemoryId, usize> = HashMap::new();
    for id in sets.iter().flat_map(|s| s.iter()) {
        *hits.entry(*id).or_default() += 1;
    }
    let mut ranked: Vec<(usize, f32, MemoryId)> = hits
        .into_iter()
        .map(|(id, n)| (n, kw_score.get(&id).copied().unwrap_or(0.0), id))
        .collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)).then(a.2.cmp(&b.2)));
    ranked.into_iter().map(|(_, _, id)| id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containment_and_time_keys() {
        assert!(contains_either("new york city", "new york"));
        assert!(contains_either("york", "new york"));
        assert!(!contains_either("al", "alice"));
        assert_eq!(
            parse_time_key("2023-05-01/2023-05-31"),
            Some((
                NaiveDate::from_ymd_opt(2023, 5, 1).unwrap(),
                NaiveDate::from_ymd_opt(2023, 5, 31).unwrap()
            ))
        );
        assert!(parse_time_key("May").is_none());
    }

    #[test]
    fn reached_turns_rank_by_lookups_matched_then_keyword_score() {
        let t = TenantId::default_tenant();
        let id = |n: &str| MemoryId::derive(&t, "c", n);
        let (a, b, c, d) = (id("a"), id("b"), id("c"), id("d"));
        let kw = HashSet::from([a, b, c]);
        let ent = HashSet::from([c, d]);
        let none = HashSet::new();
        let scores = HashMap::from([(a, 0.2), (b, 0.9), (c, 0.1)]);
        let ranked = rank(&[&kw, &ent, &none, &none], &scores);
        // c is reached by two lookups; then b and a by keyword score; d (entity only, no
        // keyword score) last.
        assert_eq!(ranked, vec![c, b, a, d]);
        let ties = rank(&[&HashSet::from([a, b, c, d])], &HashMap::new());
        let mut sorted = vec![a, b, c, d];
        sorted.sort();
        assert_eq!(ties, sorted, "equal turns in one order, run to run");
    }
}
