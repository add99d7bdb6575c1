//! Text embeddings for Recollect.
//!
//! * [`BertEmbedder`] (alias [`MiniLmEmbedder`]): the real, semantic embedder, a BERT sentence
//!   encoder on the CPU via candle: all-MiniLM-L6-v2 by default, or another of [`MODELS`] (the
//!   `embedder.model` setting), loaded from a model directory set up by
//!   `scripts/setup-model.sh` (see [`default_model_dir`], [`model_dir_for`]).
//! * [`OnnxEmbedder`]: the same all-MiniLM-L6-v2 through ONNX Runtime (`embedder.runtime =
//!   "onnx"`), 2.5–3× faster per question; set up by `scripts/setup-onnx.sh`. It also runs the
//!   models candle cannot: the int8 graphs, MPNet and nomic-embed-text-v1.5.
//! * [`Reranker`], [`OnnxCrossEncoder`]: a cross-encoder that scores a question and a passage
//!   read together (ms-marco-MiniLM-L-12-v2, int8), for recall's optional re-reading of its top
//!   results (`recall.rerank_model`).
//! * [`TokenEmbedder`], [`OnnxTokenEmbedder`]: one vector per token (late interaction,
//!   answerai-colbert-small-v1 int8) for recall's MaxSim re-scoring (`embedder.late_model`).
//! * [`CosineScale`]: where each model's cosines of unrelated texts sit, so that recall reads
//!   every model's cosines on all-MiniLM-L6-v2's scale.
//! * [`HashEmbedder`]: a deterministic, lexical-only feature-hashing embedder for fast tests and
//!   the explicit `embedder = "hash"` option.
//! * [`CachedEmbedder`]: a bounded cache in front of either, for repeated query/keyword texts;
//!   [`CachedTokenEmbedder`] the same for a question's token vectors.
//!
//! All embedders return L2-normalised vectors (except the zero vector for texts a
//! [`HashEmbedder`] finds no feature in), so [`cosine`] is a dot product.

mod bert;
mod cache;
mod error;
mod hash;
mod late;
mod models;
mod onnx;
mod rerank;

use std::path::PathBuf;
use std::sync::Arc;

pub use bert::{
    BertEmbedder, MiniLmEmbedder, DEFAULT_BATCH_SIZE, DEFAULT_MAX_SEQ_LEN, MINILM_DIM,
    MINILM_MODEL_NAME,
};
pub use cache::{
    CacheStats, CachedEmbedder, CachedTokenEmbedder, DEFAULT_CACHE_CAPACITY,
    DEFAULT_TOKEN_CACHE_CAPACITY,
};
pub use error::EmbedError;
pub use hash::{HashEmbedder, HASH_DIM};
pub use late::{
    pool_tokens, token_model_spec, HashTokenEmbedder, OnnxTokenEmbedder, TokenEmbedder,
    TokenModelSpec, ANSWERAI_COLBERT_SMALL_INT8, HASH_TOKEN_DIM, TOKEN_MODELS,
};
pub use models::{
    model_spec, CosineScale, ModelSpec, Pooling, BGE_SMALL_EN_V15, DEFAULT_MODEL, E5_SMALL_ENPT_Q4,
    E5_SMALL_Q4, E5_SMALL_V2_INT8, MINILM, MINILM_INT8, MODELS, MPNET_BASE, MPNET_BASE_INT8,
    NOMIC_EMBED_V15,
};
pub use onnx::{default_onnx_runtime_path, OnnxEmbedder, ONNX_MODEL_FILE, ONNX_RUNTIME_VERSION};
pub use rerank::{
    reranker_spec, OnnxCrossEncoder, Reranker, RerankerSpec, MS_MARCO_MINILM_L12_INT8, RERANKERS,
};

/// Environment variable naming the model directory; see [`default_model_dir`].
pub const MODEL_DIR_ENV: &str = "RECOLLECT_MODEL_DIR";
/// Where the default model lives relative to the repository (or installation) root.
pub const MODEL_SUBDIR: &str = "models/all-MiniLM-L6-v2";

/// Turns texts into fixed-size vectors.
pub trait Embedder: Send + Sync {
    /// A stable name for the model; vectors from embedders with different names are not
    /// comparable.
    fn model_name(&self) -> &str;
    /// The length of every vector returned.
    fn dim(&self) -> usize;
    /// What runs the model ("candle", "onnx"); for logs and reports.
    fn runtime(&self) -> &str {
        "builtin"
    }
    /// L2-normalised embeddings, one per text, in order: texts to be found (turns, keywords).
    /// CPU-bound: async callers use spawn_blocking.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError>;
    /// Like [`Self::embed`], for questions that search those texts: models trained with a
    /// query prefix or instruction (E5, BGE) put it here. The same as `embed` by default.
    fn embed_queries(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed(texts)
    }
    /// Whether [`Self::embed_queries`] differs from [`Self::embed`]; callers with both kinds
    /// of text batch them together when it does not.
    fn is_asymmetric(&self) -> bool {
        false
    }
    /// Where this model's cosines of unrelated texts sit; MiniLM's unless the model says.
    fn cosine_scale(&self) -> CosineScale {
        CosineScale::REFERENCE
    }
}

impl<E: Embedder + ?Sized> Embedder for Arc<E> {
    fn model_name(&self) -> &str {
        (**self).model_name()
    }
    fn dim(&self) -> usize {
        (**self).dim()
    }
    fn runtime(&self) -> &str {
        (**self).runtime()
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        (**self).embed(texts)
    }
    fn embed_queries(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        (**self).embed_queries(texts)
    }
    fn is_asymmetric(&self) -> bool {
        (**self).is_asymmetric()
    }
    fn cosine_scale(&self) -> CosineScale {
        (**self).cosine_scale()
    }
}

impl<E: Embedder + ?Sized> Embedder for Box<E> {
    fn model_name(&self) -> &str {
        (**self).model_name()
    }
    fn dim(&self) -> usize {
        (**self).dim()
    }
    fn runtime(&self) -> &str {
        (**self).runtime()
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        (**self).embed(texts)
    }
    fn embed_queries(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        (**self).embed_queries(texts)
    }
    fn is_asymmetric(&self) -> bool {
        (**self).is_asymmetric()
    }
    fn cosine_scale(&self) -> CosineScale {
        (**self).cosine_scale()
    }
}

/// The model directory to load the default model (all-MiniLM-L6-v2, whose directory holds its
/// int8 graph too) from; see [`model_dir_for`].
pub fn default_model_dir() -> PathBuf {
    model_dir_for(MINILM.dir)
}

/// The model directory to load the embedding model named `name` from:
/// `$RECOLLECT_MODEL_DIR` when set and non-empty, else [`find_model_dir`].
pub fn model_dir_for(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os(MODEL_DIR_ENV).filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    find_model_dir(name)
}

/// Where `models/<name>` is installed, whatever `$RECOLLECT_MODEL_DIR` says (it names the
/// embedder's directory, never the cross-encoder's):
/// 1. the first `models/<name>` directory found walking up from the running executable's
///    directory, then from the working directory;
/// 2. else the user's cache, where `make setup` installs it
///    (`$XDG_CACHE_HOME/recollect/models/<name>`, default `~/.cache/...`), so an
///    installed binary started from any directory (e.g. by a desktop MCP client) finds it;
/// 3. else `./models/<name>` (which may not exist: loading then reports it).
pub fn find_model_dir(name: &str) -> PathBuf {
    let subdir = PathBuf::from("models").join(name);
    let starts = [
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(PathBuf::from)),
        std::env::current_dir().ok(),
    ];
    for start in starts.into_iter().flatten() {
        for dir in start.ancestors() {
            let candidate = dir.join(&subdir);
            if candidate.is_dir() {
                return candidate;
            }
        }
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    if let Some(candidate) = cache.map(|c| c.join("recollect").join(&subdir)) {
        if candidate.is_dir() {
            return candidate;
        }
    }
    PathBuf::from(".").join(subdir)
}

/// Cosine similarity of two L2-normalised vectors: their dot product.
pub use recollect_model::dot as cosine;

/// Upper bound on `batch × padded length` per forward pass, so batches of long texts shrink and
/// the attention scores (`batch × 12 heads × len²` floats) stay small.
const MAX_BATCH_TOKENS: usize = 4096;

/// Embeds token sequences in chunks, one forward pass each, and returns the vectors in input
/// order. Shortest first, so each chunk is padded to little more than its own lengths; at most
/// `batch_size` texts a chunk (fewer for long texts), and at least `parallel` chunks so that
/// every core (or session) gets one. Chunks run concurrently on rayon's pool, a lone chunk on
/// the caller's thread; `forward` gets the chunk's number and its sequences.
pub(crate) fn embed_in_chunks(
    seqs: &[&[u32]],
    parallel: usize,
    batch_size: usize,
    forward: impl Fn(usize, &[&[u32]]) -> Result<Vec<Vec<f32>>, EmbedError> + Sync,
) -> Result<Vec<Vec<f32>>, EmbedError> {
    use rayon::prelude::*;
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    order.sort_by_key(|&i| seqs[i].len());
    let per_chunk = seqs
        .len()
        .div_ceil(parallel.max(1))
        .clamp(1, batch_size.max(1));
    let mut chunks: Vec<&[usize]> = Vec::new();
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len()
            && end - start < per_chunk
            && (end - start + 1) * seqs[order[end]].len() <= MAX_BATCH_TOKENS
        {
            end += 1;
        }
        chunks.push(&order[start..end]);
        start = end;
    }
    let run = |(k, chunk): (usize, &&[usize])| {
        let batch: Vec<&[u32]> = chunk.iter().map(|&i| seqs[i]).collect();
        forward(k, &batch)
    };
    // One chunk (a question) runs on the caller's thread: the hop into rayon's pool and back
    // is two wake-ups, and the pool (a thread a core) may be busy with another caller's chunks.
    let embedded: Vec<Vec<Vec<f32>>> = if chunks.len() == 1 {
        vec![run((0, &chunks[0]))?]
    } else {
        chunks
            .par_iter()
            .enumerate()
            .map(run)
            .collect::<Result<_, _>>()?
    };
    let mut out: Vec<Vec<f32>> = vec![Vec::new(); seqs.len()];
    for (chunk, vectors) in chunks.iter().zip(embedded) {
        for (&i, v) in chunk.iter().zip(vectors) {
            out[i] = v;
        }
    }
    Ok(out)
}

/// Scales `v` to unit L2 norm in place; the zero vector is left as it is.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        for x in v {
            *x /= norm;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every vector comes back in its text's place, and a lone chunk (a question) runs on the
    /// caller's thread, not behind whatever holds rayon's threads.
    #[test]
    fn chunks_come_back_in_order_and_a_lone_one_runs_here() {
        let question: Vec<u32> = (0..20).collect();
        let keywords: Vec<Vec<u32>> = [3u32, 5, 4, 3].iter().map(|&n| (0..n).collect()).collect();
        let mut seqs: Vec<&[u32]> = vec![&question];
        seqs.extend(keywords.iter().map(Vec::as_slice));
        let out = embed_in_chunks(&seqs, 2, 32, |_, batch| {
            Ok(batch.iter().map(|s| vec![s.len() as f32]).collect())
        })
        .unwrap();
        let lens: Vec<f32> = out.iter().map(|v| v[0]).collect();
        assert_eq!(lens, vec![20.0, 3.0, 5.0, 4.0, 3.0]);

        let caller = std::thread::current().id();
        let ran_on = parking_lot::Mutex::new(None);
        embed_in_chunks(&[question.as_slice()], 2, 32, |_, batch| {
            *ran_on.lock() = Some(std::thread::current().id());
            Ok(vec![vec![0.0]; batch.len()])
        })
        .unwrap();
        assert_eq!(ran_on.into_inner(), Some(caller));
    }

    #[test]
    fn cosine_is_dot() {
        let a: Vec<f32> = (0..19).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..19).map(|i| (i as f32).sin()).collect();
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((cosine(&a, &b) - want).abs() < 1e-3);
        let mut u = vec![3.0, 4.0];
        l2_normalize(&mut u);
        assert!((cosine(&u, &u) - 1.0).abs() < 1e-6);
        let mut z = vec![0.0; 4];
        l2_normalize(&mut z);
        assert_eq!(z, vec![0.0; 4]);
    }

    #[test]
    fn trait_objects() {
        let e: Arc<dyn Embedder> = Arc::new(HashEmbedder::default());
        let boxed: Box<dyn Embedder> = Box::new(e.clone());
        assert_eq!(boxed.dim(), HASH_DIM);
        assert_eq!(boxed.embed(&["x"]).unwrap().len(), 1);
    }

    #[test]
    fn model_dir_from_env_or_repo() {
        // Without the variable, the walk from the working directory (the crate dir under
        // `cargo test`) finds the repository's models/ when it exists.
        if std::env::var_os(MODEL_DIR_ENV).is_none() {
            let dir = default_model_dir();
            assert!(dir.ends_with(MODEL_SUBDIR), "{}", dir.display());
        }
    }
}
