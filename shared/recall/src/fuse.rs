//! Fusion and rerank (ours, beside KeyMem's Phase 3), a pure function of the fetched
//! candidates and their KeyMem scores: the normalised BM25 score is added, so dense similarity
//! never demotes an exact lexical hit; a time-evidence bonus; a share of the adjacent rounds'
//! scores; then the top k, each saying which paths found it and how its score was made.

use std::collections::HashMap;

use chrono::NaiveDate;
use recollect_extract::{QueryAnalysis, TimeHint, Want};
use recollect_model::{RecalledMemory, ScoreParts, TimeRef};

use crate::fetch::{Candidate, Candidates, Found};
use crate::keymem::KeyMemScore;
use crate::RecallConfig;

/// What the time evidence needs of the query analysis.
#[derive(Debug, Clone, Copy, Default)]
pub struct TimeQuestion<'a> {
    /// The question asks for a time ("when", "what year", "how long", …).
    pub wants_time: bool,
    pub hint: Option<&'a TimeHint>,
}

impl<'a> From<&'a QueryAnalysis> for TimeQuestion<'a> {
    fn from(qa: &'a QueryAnalysis) -> Self {
        Self {
            wants_time: qa.wants == Some(Want::Time),
            hint: qa.time_hint.as_ref(),
        }
    }
}

/// 1 when the question asks for a time and the turn states one, or the turn's times (or its
/// date) fall inside the question's time hint; else 0.
pub fn time_evidence(times: &[TimeRef], date: NaiveDate, q: TimeQuestion<'_>) -> f32 {
    let says_when = !times.is_empty();
    let in_hint = q.hint.is_some_and(|h| {
        times.iter().any(|t| t.start <= h.end && t.end >= h.start)
            || (h.start..=h.end).contains(&date)
    });
    if (q.wants_time && says_when) || in_hint {
        1.0
    } else {
        0.0
    }
}

/// `keymem + lexical_weight · bm25 / max bm25 + time_weight · time`.
pub fn fused(keymem: f32, lexical: f32, time: f32, cfg: &RecallConfig) -> f32 {
    keymem + cfg.lexical_weight * lexical + cfg.time_weight * time
}

/// The result's `sources`: `B`, `C` or `BC`, then `lexical`, then `dense`, then `late`.
pub fn sources(found: Found) -> Vec<String> {
    let mut out = Vec::new();
    match (found.path_b, found.path_c) {
        (true, true) => out.push("BC".to_string()),
        (true, false) => out.push("B".to_string()),
        (false, true) => out.push("C".to_string()),
        _ => {}
    }
    if found.lexical {
        out.push("lexical".to_string());
    }
    if found.dense {
        out.push("dense".to_string());
    }
    if found.late {
        out.push("late".to_string());
    }
    out
}

/// Each score plus `neighbour_weight` × the best score of the rounds just before and after it
/// in the same conversation (among the candidates): answers often span adjacent turns.
pub fn share_with_neighbours(candidates: &[Candidate], scores: &mut [f32], weight: f32) {
    let pos: HashMap<(&str, u64), f32> = candidates
        .iter()
        .zip(scores.iter())
        .map(|(cand, s)| ((cand.turn.conversation_id.as_str(), cand.turn.position), *s))
        .collect();
    for (cand, s) in candidates.iter().zip(scores.iter_mut()) {
        let t = &cand.turn;
        let best_adj = [t.position.wrapping_sub(1), t.position + 1]
            .iter()
            .filter_map(|p| pos.get(&(t.conversation_id.as_str(), *p)))
            .fold(0.0f32, |a, b| a.max(*b));
        *s += weight * best_adj;
    }
}

/// The top `k` of `candidates` by fused score (ties: earlier in the conversation first, then
/// the candidates' order). `keymem` holds the KeyMem score of each candidate, in order.
pub fn fuse(
    candidates: Candidates,
    keymem: &[KeyMemScore],
    question: TimeQuestion<'_>,
    cfg: &RecallConfig,
    k: usize,
) -> Vec<RecalledMemory> {
    let Candidates { items, lexical_max } = candidates;
    let mut parts: Vec<ScoreParts> = items
        .iter()
        .zip(keymem)
        .map(|(cand, km)| {
            let time = time_evidence(&cand.times, cand.turn.timestamp.date_naive(), question);
            let lexical = if lexical_max > 0.0 {
                cand.lexical / lexical_max
            } else {
                0.0
            };
            ScoreParts {
                dense: km.dense,
                lexical,
                keyword: km.keyword,
                fragment: km.fragment,
                time,
                fused: fused(km.score, lexical, time, cfg),
                rerank: None,
                late: None,
                category: None,
                sentence: None,
            }
        })
        .collect();
    let mut scores: Vec<f32> = parts.iter().map(|p| p.fused).collect();
    if cfg.neighbour_weight > 0.0 {
        share_with_neighbours(&items, &mut scores, cfg.neighbour_weight);
        for (p, s) in parts.iter_mut().zip(&scores) {
            p.fused = *s;
        }
    }

    let mut ranked: Vec<(f32, Candidate, ScoreParts)> = scores
        .into_iter()
        .zip(items)
        .zip(parts)
        .map(|((s, cand), p)| (s, cand, p))
        .collect();
    ranked.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then_with(|| a.1.turn.position.cmp(&b.1.turn.position))
    });
    ranked.truncate(k);
    ranked
        .into_iter()
        .map(|(score, cand, score_parts)| {
            let t = cand.turn;
            RecalledMemory {
                memory_id: t.memory_id,
                conversation_id: t.conversation_id,
                turn_id: t.turn_id,
                user: t.user,
                assistant: t.assistant,
                user_speaker: t.user_speaker,
                assistant_speaker: t.assistant_speaker,
                timestamp: t.timestamp,
                user_id: t.user_id,
                agent_id: t.agent_id,
                metadata: t.metadata,
                score,
                sources: sources(cand.found),
                score_parts,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{candidate, turn};
    use recollect_extract::TimeHintKind;

    fn close(got: f32, want: f32) {
        assert!((got - want).abs() < 1e-6, "got {got}, want {want}");
    }

    fn day(d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(2023, 5, d).unwrap()
    }

    fn may(from: u32, to: u32) -> TimeRef {
        TimeRef {
            text: "in May".into(),
            start: day(from),
            end: day(to),
            granularity: "day".into(),
        }
    }

    fn cfg() -> RecallConfig {
        RecallConfig {
            lexical_weight: 0.3,
            time_weight: 0.2,
            neighbour_weight: 0.35,
            ..RecallConfig::default()
        }
    }

    fn keymem(score: f32) -> KeyMemScore {
        KeyMemScore {
            dense: 0.0,
            keyword: 0.0,
            fragment: 0.0,
            score,
        }
    }

    #[test]
    fn time_evidence_needs_a_stated_time_or_one_inside_the_hint() {
        let when = TimeQuestion {
            wants_time: true,
            hint: None,
        };
        assert_eq!(time_evidence(&[may(1, 31)], day(8), when), 1.0);
        assert_eq!(time_evidence(&[], day(8), when), 0.0);
        assert_eq!(
            time_evidence(&[may(1, 31)], day(8), TimeQuestion::default()),
            0.0
        );
        let hint = TimeHint {
            kind: TimeHintKind::Range,
            start: day(10),
            end: day(12),
        };
        let in_range = TimeQuestion {
            wants_time: false,
            hint: Some(&hint),
        };
        // Overlap of the turn's times with the hint, else the turn's own date.
        assert_eq!(time_evidence(&[may(12, 20)], day(1), in_range), 1.0);
        assert_eq!(time_evidence(&[may(13, 20)], day(1), in_range), 0.0);
        assert_eq!(time_evidence(&[], day(11), in_range), 1.0);
        assert_eq!(time_evidence(&[], day(13), in_range), 0.0);
    }

    #[test]
    fn fused_adds_weighted_bm25_and_time_to_the_keymem_score() {
        close(fused(0.5, 0.5, 1.0, &cfg()), 0.5 + 0.15 + 0.2);
        close(fused(0.5, 0.0, 0.0, &cfg()), 0.5);
    }

    #[test]
    fn sources_name_the_paths_then_lexical_then_dense_then_late() {
        let all = Found {
            path_b: true,
            path_c: true,
            dense: true,
            lexical: true,
            late: true,
        };
        assert_eq!(sources(all), vec!["BC", "lexical", "dense", "late"]);
        let c_dense = Found {
            path_c: true,
            dense: true,
            ..Found::default()
        };
        assert_eq!(sources(c_dense), vec!["C", "dense"]);
        assert!(sources(Found::default()).is_empty());
    }

    #[test]
    fn neighbours_share_within_their_conversation_only() {
        let mut cands = vec![candidate(4), candidate(5), candidate(7), candidate(0)];
        cands.push(Candidate {
            turn: turn("b", 6),
            ..candidate(6)
        });
        let mut scores = vec![1.0, 0.5, 0.8, 0.3, 2.0];
        share_with_neighbours(&cands, &mut scores, 0.35);
        // a4 takes a5's 0.5; a5 takes a4's 1.0 (b6 is another conversation); a7 and a0 have
        // no neighbour among the candidates (position 0 has no round before it).
        let want = [1.0 + 0.35 * 0.5, 0.5 + 0.35 * 1.0, 0.8, 0.3, 2.0];
        for (g, w) in scores.iter().zip(want) {
            close(*g, w);
        }
    }

    #[test]
    fn fuse_ranks_by_the_fused_score_and_keeps_the_top_k() {
        let mut a1 = candidate(1);
        a1.lexical = 2.0;
        a1.found.lexical = true;
        let mut a2 = candidate(2);
        a2.times = vec![may(1, 2)];
        a2.found.path_b = true;
        let mut a9 = candidate(9);
        a9.lexical = 4.0;
        a9.found.lexical = true;
        // The retrieval's best BM25 score was 8 (a turn the scope dropped).
        let cands = Candidates {
            items: vec![a1, a2, a9],
            lexical_max: 8.0,
        };
        let question = TimeQuestion {
            wants_time: true,
            hint: None,
        };
        let out = fuse(
            cands,
            &[keymem(0.4), keymem(0.5), keymem(0.6)],
            question,
            &cfg(),
            2,
        );
        // Before neighbours: a1 0.4 + 0.3·0.25 = 0.475; a2 0.5 + 0.2 = 0.7; a9 0.6 + 0.3·0.5
        // = 0.75. Then a1 + 0.35·0.7 = 0.72, a2 + 0.35·0.475 = 0.86625, a9 alone: 0.75.
        let ids: Vec<&str> = out.iter().map(|m| m.turn_id.as_str()).collect();
        assert_eq!(ids, vec!["2", "9"]);
        close(out[0].score, 0.866_25);
        close(out[0].score_parts.fused, 0.866_25);
        assert_eq!(out[0].score_parts.time, 1.0);
        assert_eq!(out[0].sources, vec!["B"]);
        close(out[1].score, 0.75);
        close(out[1].score_parts.lexical, 0.5);
        assert_eq!(out[1].sources, vec!["lexical"]);
        assert_eq!(out[0].user, "user text 2");
    }

    #[test]
    fn ties_go_to_the_earlier_round() {
        let cands = Candidates {
            items: vec![candidate(5), candidate(3)],
            lexical_max: 0.0,
        };
        let no_sharing = RecallConfig {
            neighbour_weight: 0.0,
            ..cfg()
        };
        let out = fuse(
            cands,
            &[keymem(0.5), keymem(0.5)],
            TimeQuestion::default(),
            &no_sharing,
            10,
        );
        let ids: Vec<&str> = out.iter().map(|m| m.turn_id.as_str()).collect();
        assert_eq!(ids, vec!["3", "5"]);
        assert_eq!(out[0].score_parts.lexical, 0.0);
    }
}
