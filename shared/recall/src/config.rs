//! Recall's configuration: the method's constants are `[recall]` in the settings
//! ([`RecallConfig`], defined beside the other sections in `shared/config`), the request limits
//! `[server]`'s ([`RecallLimits`]); and the ablation switches an evaluation uses.

use recollect_config::ServerSettings;
use serde::{Deserialize, Serialize};

pub use recollect_config::RecallConfig;

/// The request limits recall enforces. They are `[server]`'s keys, beside the API's other
/// limits, so a deployment sets each in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecallLimits {
    /// k when a request gives none.
    pub default_k: usize,
    pub max_k: usize,
    pub max_query_bytes: usize,
}

impl From<&ServerSettings> for RecallLimits {
    fn from(s: &ServerSettings) -> Self {
        Self {
            default_k: s.default_k,
            max_k: s.max_k,
            max_query_bytes: s.max_query_bytes,
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
    /// How `c` reads the two field cosines: off means the other of `recall.field_cosine`'s two
    /// (the max where the mean is set, and the other way round).
    FieldCosine,
    /// Late interaction's MaxSim re-scoring (only where `embedder.late_model` is on).
    Late,
    /// Late interaction as a retriever (`recall.late_candidates`); its re-scoring stays.
    LateScan,
    /// Late interaction's re-weighting of the score parts (`recall.late_shift`); its MaxSim
    /// stays.
    LateShift,
    /// The category term (`recall.category_weight`).
    Category,
    /// The sentence term (`recall.sentence_weight`); late interaction's MaxSim stays.
    Sentence,
}

impl Component {
    pub const ALL: [Component; 12] = [
        Component::PathB,
        Component::PathC,
        Component::Graph,
        Component::Scoring,
        Component::Dense,
        Component::Lexical,
        Component::FieldCosine,
        Component::Late,
        Component::LateScan,
        Component::LateShift,
        Component::Category,
        Component::Sentence,
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
            Component::FieldCosine => "fields",
            Component::Late => "late",
            Component::LateScan => "late-scan",
            Component::LateShift => "late-shift",
            Component::Category => "category",
            Component::Sentence => "sentence",
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

    /// What `--ablate all` runs, one at a time, in [`Component::ALL`]'s order (the late ones
    /// change nothing where `embedder.late_model` is off).
    pub fn names() -> impl Iterator<Item = &'static str> {
        Component::ALL.into_iter().map(Component::name)
    }
}
