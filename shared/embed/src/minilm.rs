//! all-MiniLM-L6-v2 (sentence-transformers) on the CPU with candle.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use rayon::prelude::*;
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::{l2_normalize, EmbedError, Embedder};

/// The name [`MiniLmEmbedder`] reports, whatever directory it was loaded from.
pub const MINILM_MODEL_NAME: &str = "all-MiniLM-L6-v2";
/// Output dimension of all-MiniLM-L6-v2.
pub const MINILM_DIM: usize = 384;
/// Inputs are truncated to this many tokens (including `[CLS]` and `[SEP]`), as
/// sentence-transformers does for this model (`max_seq_length` in `sentence_bert_config.json`).
pub const DEFAULT_MAX_SEQ_LEN: usize = 256;
/// Texts per forward pass. Texts are sorted by token count first, so padding stays small.
pub const DEFAULT_BATCH_SIZE: usize = 32;
/// Upper bound on `batch × padded length` per forward pass, so batches of long texts shrink and
/// the attention scores (`batch × 12 heads × len²` floats) stay small.
const MAX_BATCH_TOKENS: usize = 4096;

/// all-MiniLM-L6-v2 sentence embeddings: BERT (6 layers, 384 hidden) via
/// [`candle_transformers::models::bert::BertModel`], mean pooling over the attention mask and
/// L2 normalisation, i.e. what `SentenceTransformer("all-MiniLM-L6-v2").encode(texts,
/// normalize_embeddings=True)` returns.
///
/// * Tokenisation: the model's `tokenizer.json` (lower-casing WordPiece), truncated to
///   [`DEFAULT_MAX_SEQ_LEN`] tokens, no fixed padding.
/// * Batching: [`Embedder::embed`] tokenises everything, sorts by token count, runs chunks of
///   up to [`DEFAULT_BATCH_SIZE`] texts each padded to its own longest (one chunk per core at
///   least, run concurrently), and restores the input order. Results do not depend on how
///   texts are batched (up to float rounding, ~1e-6).
/// * Threads: the tokenizer, the chunks and candle's CPU matmuls (gemm) all run on rayon's
///   global pool, which defaults to one thread per core; set `RAYON_NUM_THREADS` to change
///   that.
/// * The empty string is embedded like any other text (`[CLS] [SEP]`): a fixed unit vector,
///   not the zero vector. Callers that want to skip empty texts must do so themselves.
///
/// CPU-bound and blocking: async callers should use `spawn_blocking`. The embedder is
/// `Send + Sync` and may be shared (e.g. in an `Arc`) between threads.
pub struct MiniLmEmbedder {
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
    dim: usize,
    max_seq_len: usize,
    batch_size: usize,
}

impl std::fmt::Debug for MiniLmEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MiniLmEmbedder")
            .field("dim", &self.dim)
            .field("max_seq_len", &self.max_seq_len)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

fn require(dir: &Path, name: &str) -> Result<PathBuf, EmbedError> {
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(EmbedError::ModelNotFound { path })
    }
}

fn read(path: &Path) -> Result<Vec<u8>, EmbedError> {
    std::fs::read(path).map_err(|source| EmbedError::Io {
        path: path.to_owned(),
        source,
    })
}

fn read_json(path: &Path) -> Result<serde_json::Value, EmbedError> {
    serde_json::from_slice(&read(path)?).map_err(|e| EmbedError::Config {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

impl MiniLmEmbedder {
    /// Loads the model from a directory holding `config.json`, `tokenizer.json` and
    /// `model.safetensors` (as laid out by `scripts/setup-model.sh`). Optional
    /// `sentence_bert_config.json` and `1_Pooling/config.json` are checked when present.
    /// Takes about a quarter of a second and ~100 MB of memory.
    pub fn load(dir: &Path) -> Result<Self, EmbedError> {
        let config_path = require(dir, "config.json")?;
        let tokenizer_path = require(dir, "tokenizer.json")?;
        let weights_path = require(dir, "model.safetensors")?;

        let config: Config =
            serde_json::from_slice(&read(&config_path)?).map_err(|e| EmbedError::Config {
                path: config_path.clone(),
                message: e.to_string(),
            })?;

        let mut max_seq_len = DEFAULT_MAX_SEQ_LEN;
        let st_path = dir.join("sentence_bert_config.json");
        if st_path.is_file() {
            if let Some(n) = read_json(&st_path)?
                .get("max_seq_length")
                .and_then(|v| v.as_u64())
            {
                max_seq_len = n as usize;
            }
        }
        max_seq_len = max_seq_len.clamp(2, config.max_position_embeddings);

        let pooling_path = dir.join("1_Pooling").join("config.json");
        if pooling_path.is_file() {
            let pooling = read_json(&pooling_path)?;
            if pooling.get("pooling_mode_mean_tokens") != Some(&serde_json::Value::Bool(true)) {
                return Err(EmbedError::Config {
                    path: pooling_path,
                    message: "only mean pooling (pooling_mode_mean_tokens) is supported".into(),
                });
            }
        }

        let mut tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        // tokenizer.json pads every input to 128 tokens; we pad per batch ourselves.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_seq_len,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;

        let device = Device::Cpu;
        let vb = VarBuilder::from_buffered_safetensors(read(&weights_path)?, DType::F32, &device)?;
        let model = BertModel::load(vb, &config)?;
        tracing::info!(
            dir = %dir.display(),
            max_seq_len,
            threads = candle_core::utils::get_num_threads(),
            "loaded {MINILM_MODEL_NAME}"
        );
        Ok(Self {
            model,
            tokenizer,
            device,
            dim: config.hidden_size,
            max_seq_len,
            batch_size: DEFAULT_BATCH_SIZE,
        })
    }

    /// Loads from [`crate::default_model_dir`].
    pub fn load_default() -> Result<Self, EmbedError> {
        Self::load(&crate::default_model_dir())
    }

    /// Sets the maximum number of texts per forward pass (at least 1).
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size.max(1);
        self
    }

    /// Maximum tokens per text, `[CLS]` and `[SEP]` included; longer texts are truncated.
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// The token ids the model sees for `text`, `[CLS]`/`[SEP]` included, after truncation.
    pub fn token_ids(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Runs one padded batch; returns one normalised vector per sequence.
    fn forward(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let b = seqs.len();
        let len = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut ids = vec![0u32; b * len];
        let mut mask = vec![0u32; b * len];
        for (row, seq) in seqs.iter().enumerate() {
            ids[row * len..row * len + seq.len()].copy_from_slice(seq);
            mask[row * len..row * len + seq.len()].fill(1);
        }
        let ids = Tensor::from_vec(ids, (b, len), &self.device)?;
        let token_types = Tensor::zeros((b, len), DType::U32, &self.device)?;
        let mask = Tensor::from_vec(mask, (b, len), &self.device)?;
        // (b, len, dim)
        let hidden = self.model.forward(&ids, &token_types, Some(&mask))?;
        // Mean pooling over real tokens; the division by the count is dropped because the L2
        // normalisation that follows cancels it.
        let summed = if seqs.iter().all(|s| s.len() == len) {
            hidden.sum(1)?
        } else {
            let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
            hidden.broadcast_mul(&mask)?.sum(1)?
        };
        let mut rows = summed.to_vec2::<f32>()?;
        for row in &mut rows {
            l2_normalize(row);
        }
        Ok(rows)
    }
}

impl Embedder for MiniLmEmbedder {
    fn model_name(&self) -> &str {
        MINILM_MODEL_NAME
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        let seqs: Vec<&[u32]> = encodings.iter().map(|e| e.get_ids()).collect();

        // Shortest first, so each chunk is padded to little more than its own lengths.
        let mut order: Vec<usize> = (0..seqs.len()).collect();
        order.sort_by_key(|&i| seqs[i].len());

        // Chunks of at most `batch_size` texts (fewer for long texts), and at least as many
        // chunks as threads so that every core gets one.
        let threads = rayon::current_num_threads().max(1);
        let per_chunk = seqs.len().div_ceil(threads).clamp(1, self.batch_size);
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

        // Chunks run concurrently on rayon's pool. candle's matmuls also split across the
        // pool, but its element-wise ops (GELU, softmax, layer norm, ...) are single-threaded:
        // running one chunk per core keeps both busy. A lone chunk still gets parallel matmuls.
        let embedded: Vec<Vec<Vec<f32>>> = chunks
            .par_iter()
            .map(|chunk| {
                let batch: Vec<&[u32]> = chunk.iter().map(|&i| seqs[i]).collect();
                self.forward(&batch)
            })
            .collect::<Result<_, _>>()?;

        let mut out: Vec<Vec<f32>> = vec![Vec::new(); seqs.len()];
        for (chunk, vectors) in chunks.iter().zip(embedded) {
            for (&i, v) in chunk.iter().zip(vectors) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}
