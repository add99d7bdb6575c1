//! `[recall]`: the recall method's tunable constants. Their defaults (default.toml) are the
//! KeyMem paper's where it gives them (../shared/RECALL.md §1) and ours, measured on LoCoMo dev,
//! where it does not (docs/RECALL.md, Constants). The formulas' own constants (the slope of
//! `w`, the source mixes, the normaliser's floor) are not settings: they live, named, beside
//! the formulas in `shared/recall/src/keymem.rs`. The request limits recall enforces
//! (`default_k`, `max_k`, `max_query_bytes`) are `[server]`'s.

use serde::{Deserialize, Serialize};

use crate::{ConfigError, Settings};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecallConfig {
    /// Path B (paper: 30): nearest Keyword nodes per query keyword.
    pub keyword_neighbours: usize,
    /// Path B and SoftTF-IDF (paper: 0.45): the keyword cosine floor, on all-MiniLM-L6-v2's
    /// scale (another encoder's cosines are mapped onto it: `recollect_embed::CosineScale`).
    pub keyword_min_cosine: f32,
    /// Whether recall runs Path C, fragment expansion (ours: off; on LoCoMo it measured as
    /// noise on top of dense and BM25 candidates and cost ~1.5 ms a recall, docs/RECALL.md).
    /// Fragments are built either way, so turning it on needs no reindex.
    pub path_c: bool,
    /// Path C (paper: 10): fragments expanded into candidates.
    pub fragments_expanded: usize,
    /// Path B's candidates, and the reached turns Path C starts from, at most (ours).
    pub path_depth: usize,
    /// Phase 3 adaptive keyword weight (w_base, w_cap) for factual queries (paper: 0.30, 0.50).
    pub factual_weights: (f32, f32),
    /// The same for reasoning queries (paper: 0.60, 0.75).
    pub reasoning_weights: (f32, f32),
    /// Candidates taken from each of the dense and lexical retrievers (or k if larger).
    pub retrieve_depth: usize,
    /// How a round's two field cosines make KeyMem's `c`: their mean (the default since
    /// 2026-11-30, session 9) or the better of the two (the fielded max-sim it started with).
    /// Dense retrieval searches each field either way.
    pub field_cosine: FieldCosine,
    /// Weight of the normalised BM25 score in the fused score.
    pub lexical_weight: f32,
    /// A name in the question linked to at least this share of the scope's turns (a
    /// conversation's speakers: on every turn) is left out of the BM25 query (ours; 0 keeps
    /// every name). Within the scope it tells turns apart no more than a stopword, but the
    /// index's IDF is the whole index's, so it scored every turn and favoured the short ones.
    pub lexical_common_name_share: f32,
    /// Weight of the adjacent turn's score carried to a turn (conversation context).
    pub neighbour_weight: f32,
    /// Bonus for a turn that carries a time expression when the question asks "when", or whose
    /// times fall in the question's time hint.
    pub time_weight: f32,
    /// A cross-encoder that re-reads the question with each of the top `rerank_depth` results
    /// (one of [`RERANK_MODELS`]; empty: off, the default). It adds the most quality of any
    /// component and costs the most: tens of milliseconds a recall (docs/EVALUATION.md).
    pub rerank_model: String,
    /// Where the cross-encoder's files are; empty: models/<rerank_model> beside the binary or
    /// the working directory, then ~/.cache/recollect/models/<rerank_model>.
    pub rerank_model_dir: String,
    /// Results re-read by the cross-encoder (the rest keep their order below them).
    pub rerank_depth: usize,
    /// Weight of the cross-encoder's logit added to the fused score of each re-read result.
    pub rerank_weight: f32,
    /// The cross-encoder re-reads a recall only when the fused scores of its first two results
    /// are less than this apart (ours): a clear first is rarely overturned, and the recalls it
    /// skips cost what the fused ranking costs.
    pub rerank_gap: f32,
    /// Results re-scored by late interaction when `embedder.late_model` names a model (ours).
    pub late_depth: usize,
    /// Weight of the late-interaction MaxSim (a mean of cosines) added to the fused score.
    pub late_weight: f32,
    /// What each part of the fused score counts once late interaction has read the turn, added
    /// to that part's weight for the turns it re-scores (ours). MaxSim reads the question's
    /// words against the turn's better than the pooled cosine and the keyword similarity do,
    /// so those two count less beside it.
    pub late_shift: LateShift,
    /// Late interaction as a retriever too: the scope's best `late_candidates` turns by MaxSim
    /// join the candidates (100 by default; 0: off). It finds what shares neither words nor a
    /// close pooled vector with the question, mostly below the top 30 (ours).
    pub late_candidates: usize,
    /// The late retriever scans every turn of the scope, so it runs only where the scope holds
    /// at most this many turns (a conversation, a user's memory); wider recalls keep late
    /// interaction as a re-scoring of the fused top `late_depth` (ours).
    pub late_scan_max_turns: u64,
    /// Weight of the category term (ours; 0: off): for a question naming a kind of thing
    /// ("What activities…"), each head result's best cosine between that phrase and the
    /// keywords its named speaker said, minus the head's median (docs/RECALL.md, departure 16).
    pub category_weight: f32,
    /// Keywords of the scope nearest to the question's category phrase that the category term
    /// reads; a keyword further away counts as the furthest of them.
    pub category_neighbours: usize,
    /// Weight of the sentence term (ours; 0: off): each turn late interaction re-scores also
    /// gets this × its best sentence's MaxSim, the question's tokens matched within one
    /// sentence of the turn (term proximity, as BERT-MaxP reads a document by its best passage;
    /// docs/RECALL.md, departure 17). Turns stored without their rows' sentences get the
    /// others' mean.
    pub sentence_weight: f32,
    /// How many of the re-scored head the sentence term reads (their rows are read into the
    /// query service, so it costs with each one).
    pub sentence_depth: usize,
}

/// Added to the weight of each part of a turn's fused score where late interaction re-scores it:
/// its score becomes `fused + late_weight × MaxSim + dense × c + keyword × s̃_kw + lexical ×
/// bm25 + time × time` (the parts as `ScoreParts` reports them). Negative: the part counts less.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LateShift {
    pub dense: f32,
    pub keyword: f32,
    pub lexical: f32,
    pub time: f32,
}

/// How KeyMem's `c` reads a round's user and assistant cosines (`recall.field_cosine`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldCosine {
    /// The better of the two (fielded max-sim).
    Max,
    /// Their mean: with late interaction re-scoring the head, it measured better on every
    /// LoCoMo figure (docs/RECALL.md departure 3).
    #[default]
    Mean,
}

impl FieldCosine {
    /// The other one (what `recollect eval --ablate fields` runs).
    pub fn other(self) -> Self {
        match self {
            FieldCosine::Max => FieldCosine::Mean,
            FieldCosine::Mean => FieldCosine::Max,
        }
    }
}

/// The cross-encoders recall can load (`recollect_embed::RERANKERS` by name; a test in
/// recollect-runtime keeps the two equal).
pub const RERANK_MODELS: [&str; 1] = ["ms-marco-MiniLM-L-12-v2-int8"];

/// The compiled-in defaults (default.toml's `[recall]`).
impl Default for RecallConfig {
    fn default() -> Self {
        Settings::defaults().recall
    }
}

impl RecallConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, message: &str| {
            Err(ConfigError::Invalid {
                key,
                message: message.to_string(),
            })
        };
        if !(1..=1000).contains(&self.keyword_neighbours) {
            return invalid("recall.keyword_neighbours", "must be in 1..=1000");
        }
        if !(-1.0..=1.0).contains(&self.keyword_min_cosine) {
            return invalid("recall.keyword_min_cosine", "must be a cosine, in -1..=1");
        }
        if self.fragments_expanded > 1000 {
            return invalid("recall.fragments_expanded", "must be in 0..=1000");
        }
        for (key, (base, cap)) in [
            ("recall.factual_weights", self.factual_weights),
            ("recall.reasoning_weights", self.reasoning_weights),
        ] {
            if !(0.0..=1.0).contains(&base) || !(base..=1.0).contains(&cap) {
                return invalid(
                    key,
                    "must be [w_base, w_cap] with 0 <= w_base <= w_cap <= 1",
                );
            }
        }
        if !(1..=100_000).contains(&self.path_depth) {
            return invalid("recall.path_depth", "must be in 1..=100000");
        }
        if !(1..=10_000).contains(&self.retrieve_depth) {
            return invalid("recall.retrieve_depth", "must be in 1..=10000");
        }
        if !(0.0..=1.0).contains(&self.lexical_common_name_share) {
            return invalid(
                "recall.lexical_common_name_share",
                "must be a share of the turns, in 0..=1 (0: off)",
            );
        }
        for (key, w) in [
            ("recall.lexical_weight", self.lexical_weight),
            ("recall.neighbour_weight", self.neighbour_weight),
            ("recall.time_weight", self.time_weight),
            ("recall.rerank_weight", self.rerank_weight),
            ("recall.rerank_gap", self.rerank_gap),
            ("recall.late_weight", self.late_weight),
            ("recall.category_weight", self.category_weight),
            ("recall.sentence_weight", self.sentence_weight),
        ] {
            if !(w.is_finite() && w >= 0.0) {
                return invalid(key, "must be a finite number >= 0");
            }
        }
        if !self.rerank_model.is_empty() && !RERANK_MODELS.contains(&self.rerank_model.as_str()) {
            return Err(ConfigError::Invalid {
                key: "recall.rerank_model",
                message: format!(
                    "{:?} is not a known cross-encoder; one of: {} (or empty: off)",
                    self.rerank_model,
                    RERANK_MODELS.join(", ")
                ),
            });
        }
        if !(1..=1000).contains(&self.rerank_depth) {
            return invalid("recall.rerank_depth", "must be in 1..=1000");
        }
        for (key, w) in [
            ("recall.late_shift.dense", self.late_shift.dense),
            ("recall.late_shift.keyword", self.late_shift.keyword),
            ("recall.late_shift.lexical", self.late_shift.lexical),
            ("recall.late_shift.time", self.late_shift.time),
        ] {
            if !(-1.0..=1.0).contains(&w) {
                return invalid(key, "must be a finite number in -1..=1 (0: unchanged)");
            }
        }
        if !(1..=1000).contains(&self.late_depth) {
            return invalid("recall.late_depth", "must be in 1..=1000");
        }
        if self.late_candidates > 1000 {
            return invalid("recall.late_candidates", "must be in 0..=1000");
        }
        if !(1..=1000).contains(&self.category_neighbours) {
            return invalid("recall.category_neighbours", "must be in 1..=1000");
        }
        if !(1..=1000).contains(&self.sentence_depth) {
            return invalid("recall.sentence_depth", "must be in 1..=1000");
        }
        Ok(())
    }
}
