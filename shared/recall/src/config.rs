//! Recall constants. Defaults are the paper's where it gives them (RECALL.md §1), and ours,
//! measured on the development set, where it does not.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecallConfig {
    pub default_k: usize,
    pub max_k: usize,
    pub max_query_bytes: usize,
    /// Path B: nearest Keyword nodes per query keyword, and their cosine floor.
    pub keyword_neighbours: usize,
    pub keyword_min_cosine: f32,
    /// Path C: fragments expanded into candidates.
    pub fragments_expanded: usize,
    /// Phase 3 adaptive keyword weight (w_base, w_cap) for factual and reasoning queries.
    pub factual_weights: (f32, f32),
    pub reasoning_weights: (f32, f32),
    /// Candidates taken from each of the dense and lexical retrievers.
    pub retrieve_depth: usize,
    /// Weight of the normalised BM25 score in the fused score.
    pub lexical_weight: f32,
    /// Weight of the adjacent turn's score carried to a turn (conversation context).
    pub neighbour_weight: f32,
    /// Bonus for a turn that carries a time expression when the question asks "when", or whose
    /// times fall in the question's time hint.
    pub time_weight: f32,
    /// Pseudo-relevance feedback: weight of the mean vector of the first pass's top turns added
    /// to the query vector for a second dense pass (0 = off).
    pub prf_weight: f32,
    pub prf_depth: usize,
    /// Weight of keyword-neighbour terms added to the BM25 query (times their cosine; 0 = off).
    pub lexical_expansion: f32,
    /// Discount on a field said by someone other than the person the question names.
    pub speaker_penalty: f32,
    /// Diversity: at most this many memories from one conversation-day before the rest of the
    /// ranking (0 = off). Questions about several events need more than one day's turns.
    pub day_cap: usize,
    /// BM25 over the analysed query terms (question scaffolding removed) instead of all terms.
    pub lexical_from_analysis: bool,
}

impl Default for RecallConfig {
    fn default() -> Self {
        Self {
            default_k: 30,
            max_k: 1000,
            max_query_bytes: 4096,
            keyword_neighbours: 30,
            keyword_min_cosine: 0.45,
            fragments_expanded: 10,
            factual_weights: (0.30, 0.50),
            reasoning_weights: (0.60, 0.75),
            retrieve_depth: 100,
            lexical_weight: 0.3,
            neighbour_weight: 0.35,
            time_weight: 0.2,
            prf_weight: 0.0,
            prf_depth: 3,
            lexical_from_analysis: false,
            day_cap: 0,
            speaker_penalty: 0.0,
            lexical_expansion: 0.0,
        }
    }
}

/// Components that can be switched off one at a time, to measure each one's worth.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ablation {
    pub path_b: bool,
    pub path_c: bool,
    /// Entity, time and location traversal (Path B keeps only keyword vectors).
    pub graph: bool,
    /// Source-aware scoring (rank by dense cosine instead).
    pub scoring: bool,
    pub dense: bool,
    pub lexical: bool,
    /// Field max-sim (use the mean of the field cosines instead).
    pub fields: bool,
}

impl Ablation {
    pub fn parse(name: &str) -> Option<Self> {
        let mut a = Self::default();
        match name {
            "none" => {}
            "path-b" => a.path_b = true,
            "path-c" => a.path_c = true,
            "graph" => a.graph = true,
            "scoring" => a.scoring = true,
            "dense" => a.dense = true,
            "lexical" => a.lexical = true,
            "fields" => a.fields = true,
            _ => return None,
        }
        Some(a)
    }

    pub const NAMES: [&'static str; 7] = [
        "path-b", "path-c", "graph", "scoring", "dense", "lexical", "fields",
    ];
}
