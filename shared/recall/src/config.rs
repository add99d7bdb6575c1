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
        }
    }
}

/// A component of recall that an evaluation can switch off, to measure its worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Component {
    PathB,
    PathC,
    /// Entity, time and location traversal (Path B keeps only keyword vectors).
    Graph,
    /// Source-aware scoring (rank by dense cosine instead).
    Scoring,
    Dense,
    Lexical,
    /// Field max-sim (the mean of the field cosines instead).
    FieldMaxSim,
}

impl Component {
    pub const ALL: [Component; 7] = [
        Component::PathB,
        Component::PathC,
        Component::Graph,
        Component::Scoring,
        Component::Dense,
        Component::Lexical,
        Component::FieldMaxSim,
    ];

    /// The name `recollect eval --ablate` takes.
    pub fn name(self) -> &'static str {
        match self {
            Component::PathB => "path-b",
            Component::PathC => "path-c",
            Component::Graph => "graph",
            Component::Scoring => "scoring",
            Component::Dense => "dense",
            Component::Lexical => "lexical",
            Component::FieldMaxSim => "fields",
        }
    }
}

/// A recall run with at most one component switched off (the default: the full system).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ablation {
    pub off: Option<Component>,
}

impl Ablation {
    /// Whether this run leaves `c` out.
    pub fn without(&self, c: Component) -> bool {
        self.off == Some(c)
    }

    /// `none` or a component's name.
    pub fn parse(name: &str) -> Option<Self> {
        if name == "none" {
            return Some(Self::default());
        }
        Component::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .map(|c| Self { off: Some(c) })
    }

    pub const NAMES: [&'static str; 7] = [
        "path-b", "path-c", "graph", "scoring", "dense", "lexical", "fields",
    ];
}
