//! KeyMem's source-aware scoring (../shared/RECALL.md §1, Recall, Phase 3), a pure function of
//! the fetched candidates: `s_kw` (SoftTF-IDF of the candidate's keywords) and `s_frag` (its
//! fragment's) normalised query-locally with a floor of 1, the adaptive keyword weight `w`,
//! and one formula per source (B-only, C-only, BC) around `c`, the dense field max-sim.

use std::collections::HashMap;

use recollect_config::FieldCosine;
use recollect_embed::CosineScale;
use recollect_extract::QueryType;
use recollect_model::dot;
use recollect_storage::vector::FieldVectors;

use crate::fetch::Candidate;
use crate::softtfidf::{self, Neighbours};
use crate::{Ablation, Component, RecallConfig};

/// Slope of the adaptive keyword weight `w = min(w_cap, w_base + 0.15·s_kw)` (RECALL.md §1,
/// Phase 3). `w_base` and `w_cap` are `RecallConfig::factual_weights` / `reasoning_weights`.
pub const KEYWORD_WEIGHT_SLOPE: f32 = 0.15;

/// Floor of the query-local normaliser `s̃ = s / max(max s, 1)` (RECALL.md §1, Phase 3): a
/// query whose best match is weak keeps weak scores instead of being stretched to 1.
pub const NORMALISATION_FLOOR: f32 = 1.0;

/// How a candidate found by Path C mixes `s̃_kw` and `s̃_frag` (RECALL.md §1, Phase 3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mix {
    pub keyword: f32,
    pub fragment: f32,
}

/// Found by both paths: `0.7·s̃_kw + 0.3·s̃_frag`.
pub const BC_MIX: Mix = Mix {
    keyword: 0.7,
    fragment: 0.3,
};

/// Found by Path C only: `0.5·s̃_kw + 0.5·s̃_frag`. B-only candidates (and those only dense
/// retrieval or BM25 found) take `s̃_kw` alone.
pub const C_ONLY_MIX: Mix = Mix {
    keyword: 0.5,
    fragment: 0.5,
};

/// What scoring needs of the query.
#[derive(Debug, Clone, Copy)]
pub struct KeyMemQuery<'a> {
    /// The question's embedding (KeyMem: the hypothetical answer's; RECALL.md departure 2).
    pub vector: &'a [f32],
    /// Per query keyword, its neighbouring keywords and their cosine (Path B's lists).
    pub neighbours: &'a Neighbours,
    /// IDF of every neighbour keyword over the turns in scope.
    pub idf: &'a HashMap<String, f32>,
    /// `(w_base, w_cap)` of the query's type.
    pub weights: (f32, f32),
    /// The embedder's cosines of unrelated texts: `c` is read on MiniLM's scale, which the
    /// weights were set on.
    pub scale: CosineScale,
    /// How `c` reads the two field cosines (`recall.field_cosine`).
    pub fields: FieldCosine,
}

/// One candidate's KeyMem score and its parts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeyMemScore {
    /// `c`: the dense field max-sim (0 when dense is ablated or the turn has no vectors).
    pub dense: f32,
    /// `s̃_kw`.
    pub keyword: f32,
    /// `s̃_frag`.
    pub fragment: f32,
    pub score: f32,
}

/// `(w_base, w_cap)` of the query's type.
pub fn weights(cfg: &RecallConfig, query_type: QueryType) -> (f32, f32) {
    match query_type {
        QueryType::Factual => cfg.factual_weights,
        QueryType::Reasoning => cfg.reasoning_weights,
    }
}

/// `c` from the user and assistant cosines: their mean or the better of the two; a round
/// with no assistant field has the user's.
pub fn field_cos(q: &[f32], f: &FieldVectors, fields: FieldCosine) -> f32 {
    let u = dot(q, &f.user);
    match (f.assistant.as_ref().map(|a| dot(q, a)), fields) {
        (Some(a), FieldCosine::Max) => u.max(a),
        (Some(a), FieldCosine::Mean) => (u + a) / 2.0,
        (None, _) => u,
    }
}

/// `max(max s, 1)`: what every `s` of one query is divided by.
pub fn normaliser(values: impl Iterator<Item = f32>) -> f32 {
    values.fold(NORMALISATION_FLOOR, f32::max)
}

/// `w = min(w_cap, w_base + 0.15·s_kw)`, on the raw (not normalised) `s_kw`.
pub fn keyword_weight(s_kw: f32, (w_base, w_cap): (f32, f32)) -> f32 {
    (w_base + KEYWORD_WEIGHT_SLOPE * s_kw).min(w_cap)
}

/// The paper's three formulas: `(1 − w)·c + w·(mix of s̃_kw and s̃_frag by source)`.
pub fn source_aware(c: f32, kw: f32, frag: f32, w: f32, in_b: bool, in_c: bool) -> f32 {
    match (in_b, in_c) {
        (true, true) => (1.0 - w) * c + w * (BC_MIX.keyword * kw + BC_MIX.fragment * frag),
        (false, true) => (1.0 - w) * c + w * (C_ONLY_MIX.keyword * kw + C_ONLY_MIX.fragment * frag),
        _ => (1.0 - w) * c + w * kw,
    }
}

/// KeyMem scores of `candidates`, in their order.
pub fn score(
    candidates: &[Candidate],
    query: &KeyMemQuery<'_>,
    ablation: &Ablation,
) -> Vec<KeyMemScore> {
    let fields = if ablation.without(Component::FieldCosine) {
        query.fields.other()
    } else {
        query.fields
    };
    let cos: Vec<f32> = candidates
        .iter()
        .map(|cand| match &cand.vectors {
            Some(f) if !ablation.without(Component::Dense) => {
                query.scale.question(field_cos(query.vector, f, fields))
            }
            _ => 0.0,
        })
        .collect();
    let s_kw: Vec<f32> = candidates
        .iter()
        .map(|cand| softtfidf::score(query.neighbours, &cand.keywords, query.idf))
        .collect();
    let kw_norm = normaliser(s_kw.iter().copied());
    let frag_norm = normaliser(candidates.iter().map(|cand| cand.fragment_score));
    candidates
        .iter()
        .zip(cos.iter().zip(&s_kw))
        .map(|(cand, (&c, &s_kw))| {
            let kw = s_kw / kw_norm;
            let frag = cand.fragment_score / frag_norm;
            let score = if ablation.without(Component::Scoring) {
                c
            } else {
                let w = keyword_weight(s_kw, query.weights);
                source_aware(c, kw, frag, w, cand.found.path_b, cand.found.path_c)
            };
            KeyMemScore {
                dense: c,
                keyword: kw,
                fragment: frag,
                score,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::Found;
    use crate::testing::{candidate, user_vector};

    fn close(got: f32, want: f32) {
        assert!((got - want).abs() < 1e-6, "got {got}, want {want}");
    }

    #[test]
    fn c_is_the_mean_of_the_field_cosines_or_the_better_one() {
        let f = FieldVectors {
            user: vec![0.6, 0.8],
            assistant: Some(vec![0.8, 0.6]),
        };
        close(field_cos(&[1.0, 0.0], &f, FieldCosine::Max), 0.8);
        close(field_cos(&[1.0, 0.0], &f, FieldCosine::Mean), 0.7);
        let user_only = FieldVectors {
            user: vec![0.6, 0.8],
            assistant: None,
        };
        close(field_cos(&[1.0, 0.0], &user_only, FieldCosine::Mean), 0.6);
        close(field_cos(&[1.0, 0.0], &user_only, FieldCosine::Max), 0.6);
    }

    #[test]
    fn normaliser_is_the_largest_value_with_a_floor_of_one() {
        assert_eq!(normaliser([0.4, 0.9].into_iter()), 1.0);
        assert_eq!(normaliser([0.4, 2.5, 1.5].into_iter()), 2.5);
        assert_eq!(normaliser(std::iter::empty()), 1.0);
    }

    #[test]
    fn keyword_weight_grows_with_s_kw_up_to_its_cap() {
        close(keyword_weight(0.0, (0.30, 0.50)), 0.30);
        close(keyword_weight(1.0, (0.30, 0.50)), 0.45);
        close(keyword_weight(2.0, (0.30, 0.50)), 0.50);
        close(keyword_weight(0.5, (0.60, 0.75)), 0.675);
        close(keyword_weight(1.0, (0.60, 0.75)), 0.75);
    }

    #[test]
    fn each_source_has_its_own_formula() {
        // c = 0.5, s̃_kw = 0.8, s̃_frag = 0.4, w = 0.4: (1 − w)·c = 0.3.
        close(
            source_aware(0.5, 0.8, 0.4, 0.4, true, true),
            0.3 + 0.4 * (0.56 + 0.12),
        );
        close(
            source_aware(0.5, 0.8, 0.4, 0.4, false, true),
            0.3 + 0.4 * (0.4 + 0.2),
        );
        close(
            source_aware(0.5, 0.8, 0.4, 0.4, true, false),
            0.3 + 0.4 * 0.8,
        );
        close(
            source_aware(0.5, 0.8, 0.4, 0.4, false, false),
            0.3 + 0.4 * 0.8,
        );
    }

    /// Four candidates against two query keywords, worked by hand:
    /// q0's neighbours dog 0.9, puppy 0.6; q1's park 0.8; IDF(dog) = 0.5, the others 1.
    fn worked_example() -> (Vec<Candidate>, Neighbours, HashMap<String, f32>) {
        let neighbours: Neighbours = vec![
            HashMap::from([("dog".to_string(), 0.9), ("puppy".to_string(), 0.6)]),
            HashMap::from([("park".to_string(), 0.8)]),
        ];
        let idf = HashMap::from([("dog".to_string(), 0.5)]);
        let kws = |ks: &[&str]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        // B-only: s_kw = 0.9·0.5 + 0.8 = 1.25; c = 0.5.
        let mut a = candidate(1);
        a.keywords = kws(&["dog", "park"]);
        a.vectors = user_vector(&[0.5, 0.5]);
        a.found = Found {
            path_b: true,
            ..Found::default()
        };
        // C-only: s_kw = 0.6; s_frag = 3; c = 0.2.
        let mut b = candidate(2);
        b.keywords = kws(&["puppy"]);
        b.vectors = user_vector(&[0.2, 0.7]);
        b.fragment_score = 3.0;
        b.found = Found {
            path_c: true,
            ..Found::default()
        };
        // BC: dog serves q0 (puppy cannot too), park q1: s_kw = 1.25; s_frag = 1.5; no vectors.
        let mut c = candidate(3);
        c.keywords = kws(&["dog", "puppy", "park"]);
        c.fragment_score = 1.5;
        c.found = Found {
            path_b: true,
            path_c: true,
            ..Found::default()
        };
        // Dense only: s_kw = 0; c = 0.9.
        let mut d = candidate(4);
        d.vectors = user_vector(&[0.9, 0.1]);
        d.found = Found {
            dense: true,
            ..Found::default()
        };
        (vec![a, b, c, d], neighbours, idf)
    }

    #[test]
    fn scores_follow_the_papers_formulas_on_a_worked_example() {
        let (cands, neighbours, idf) = worked_example();
        let q = KeyMemQuery {
            vector: &[1.0, 0.0],
            neighbours: &neighbours,
            idf: &idf,
            weights: (0.30, 0.50),
            scale: CosineScale::REFERENCE,
            fields: FieldCosine::Mean,
        };
        let s = score(&cands, &q, &Ablation::default());
        // max s_kw = 1.25 and max s_frag = 3 normalise.
        let kw: Vec<f32> = s.iter().map(|x| x.keyword).collect();
        let frag: Vec<f32> = s.iter().map(|x| x.fragment).collect();
        for (g, w) in kw.iter().zip([1.0, 0.48, 1.0, 0.0]) {
            close(*g, w);
        }
        for (g, w) in frag.iter().zip([0.0, 1.0, 0.5, 0.0]) {
            close(*g, w);
        }
        for (g, w) in s.iter().map(|x| x.dense).zip([0.5, 0.2, 0.0, 0.9]) {
            close(g, w);
        }
        // A: w = 0.3 + 0.15·1.25 = 0.4875; 0.5125·0.5 + 0.4875·1 = 0.74375
        // B: w = 0.3 + 0.15·0.6 = 0.39; 0.61·0.2 + 0.39·(0.5·0.48 + 0.5·1) = 0.4106
        // C: w = 0.4875; 0 + 0.4875·(0.7·1 + 0.3·0.5) = 0.414375
        // D: w = 0.3; 0.7·0.9 = 0.63
        for (g, w) in s
            .iter()
            .map(|x| x.score)
            .zip([0.74375, 0.4106, 0.414375, 0.63])
        {
            close(g, w);
        }
        // Reasoning weights (0.60, 0.75): A's w = min(0.75, 0.7875) = 0.75 → 0.125 + 0.75.
        let reasoning = KeyMemQuery {
            weights: (0.60, 0.75),
            ..q
        };
        close(
            score(&cands, &reasoning, &Ablation::default())[0].score,
            0.875,
        );
    }

    #[test]
    fn ablations_change_only_their_part() {
        let (cands, neighbours, idf) = worked_example();
        let q = KeyMemQuery {
            vector: &[1.0, 0.0],
            neighbours: &neighbours,
            idf: &idf,
            weights: (0.30, 0.50),
            scale: CosineScale::REFERENCE,
            fields: FieldCosine::Mean,
        };
        let off = |c| Ablation { off: Some(c) };
        let scoring: Vec<f32> = score(&cands, &q, &off(Component::Scoring))
            .iter()
            .map(|x| x.score)
            .collect();
        assert_eq!(scoring, vec![0.5, 0.2, 0.0, 0.9]);
        let dense = score(&cands, &q, &off(Component::Dense));
        assert!(dense.iter().all(|x| x.dense == 0.0));
        close(dense[0].score, 0.4875);
        close(dense[3].score, 0.0);
        // A round with both fields: c is their mean, and the ablation reads the better one.
        let mut both = cands.clone();
        both[0].vectors = Some(FieldVectors {
            user: vec![0.5, 0.5],
            assistant: Some(vec![0.9, 0.1]),
        });
        close(score(&both, &q, &Ablation::default())[0].dense, 0.7);
        close(score(&both, &q, &off(Component::FieldCosine))[0].dense, 0.9);
        let max = KeyMemQuery {
            fields: FieldCosine::Max,
            ..q
        };
        close(score(&both, &max, &Ablation::default())[0].dense, 0.9);
        close(
            score(&both, &max, &off(Component::FieldCosine))[0].dense,
            0.7,
        );
    }
}
