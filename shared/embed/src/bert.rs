//! BERT sentence encoders on the CPU with candle: all-MiniLM-L6-v2 (the default) and the other
//! models of [`crate::MODELS`], each with its pooling and query/document prefixes.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::models::{ModelSpec, Pooling, MINILM};
use crate::{l2_normalize, EmbedError, Embedder};

/// The name [`BertEmbedder::load`] reports, whatever directory it was loaded from.
pub const MINILM_MODEL_NAME: &str = MINILM.name;
/// Output dimension of all-MiniLM-L6-v2 (and of every model in [`crate::MODELS`]).
pub const MINILM_DIM: usize = 384;
/// all-MiniLM-L6-v2's inputs are truncated to this many tokens (including `[CLS]` and `[SEP]`),
/// as sentence-transformers does for it (`max_seq_length` in `sentence_bert_config.json`).
pub const DEFAULT_MAX_SEQ_LEN: usize = MINILM.max_seq_len;
/// Texts per forward pass. Texts are sorted by token count first, so padding stays small.
pub const DEFAULT_BATCH_SIZE: usize = 32;

/// Sentence embeddings from a BERT encoder via
/// [`candle_transformers::models::bert::BertModel`]: the spec's pooling (mean over the attention
/// mask, or `[CLS]`) and L2 normalisation. For all-MiniLM-L6-v2 that is what
/// `SentenceTransformer("all-MiniLM-L6-v2").encode(texts, normalize_embeddings=True)` returns.
///
/// * Prefixes: [`Embedder::embed`] puts the spec's document prefix before each text,
///   [`Embedder::embed_queries`] its query prefix (E5: "passage: " / "query: "; BGE: an
///   instruction before queries only; MiniLM: none).
/// * Tokenisation: the model's `tokenizer.json`, truncated to the model's token limit, no fixed
///   padding.
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
pub struct BertEmbedder {
    spec: &'static ModelSpec,
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
    dim: usize,
    max_seq_len: usize,
    batch_size: usize,
}

/// The name the code has always used for the default model's embedder.
pub type MiniLmEmbedder = BertEmbedder;

impl std::fmt::Debug for BertEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertEmbedder")
            .field("model", &self.spec.name)
            .field("dim", &self.dim)
            .field("max_seq_len", &self.max_seq_len)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

pub(crate) fn require(dir: &Path, name: &str) -> Result<PathBuf, EmbedError> {
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(EmbedError::ModelNotFound { path })
    }
}

/// A model's `tokenizer.json`, truncating to `max_seq_len` tokens and padding nothing (MiniLM's
/// pads every input to 128 tokens; batches are padded to their own longest).
pub(crate) fn load_tokenizer(path: &Path, max_seq_len: usize) -> Result<Tokenizer, EmbedError> {
    let mut tokenizer =
        Tokenizer::from_file(path).map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: max_seq_len,
            strategy: TruncationStrategy::LongestFirst,
            stride: 0,
            direction: TruncationDirection::Right,
        }))
        .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
    Ok(tokenizer)
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

impl BertEmbedder {
    /// Loads all-MiniLM-L6-v2 from a directory holding `config.json`, `tokenizer.json` and
    /// `model.safetensors` (as laid out by `scripts/setup-model.sh`). Optional
    /// `sentence_bert_config.json` and `1_Pooling/config.json` are checked when present.
    /// Takes about a quarter of a second and ~100 MB of memory.
    pub fn load(dir: &Path) -> Result<Self, EmbedError> {
        Self::load_model(dir, &MINILM)
    }

    /// Loads the model `spec` describes from `dir` (same files as [`Self::load`]).
    pub fn load_model(dir: &Path, spec: &'static ModelSpec) -> Result<Self, EmbedError> {
        let config_path = require(dir, "config.json")?;
        let tokenizer_path = require(dir, "tokenizer.json")?;
        let weights_path = require(dir, "model.safetensors")?;

        let config: Config =
            serde_json::from_slice(&read(&config_path)?).map_err(|e| EmbedError::Config {
                path: config_path.clone(),
                message: e.to_string(),
            })?;

        let mut max_seq_len = spec.max_seq_len;
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
            let key = match spec.pooling {
                Pooling::Mean => "pooling_mode_mean_tokens",
                Pooling::Cls => "pooling_mode_cls_token",
            };
            if pooling.get(key) != Some(&serde_json::Value::Bool(true)) {
                return Err(EmbedError::Config {
                    path: pooling_path,
                    message: format!(
                        "{} needs {key}, which this directory does not set",
                        spec.name
                    ),
                });
            }
        }

        let tokenizer = load_tokenizer(&tokenizer_path, max_seq_len)?;

        let device = Device::Cpu;
        let vb = VarBuilder::from_buffered_safetensors(read(&weights_path)?, DType::F32, &device)?;
        let model = BertModel::load(vb, &config)?;
        tracing::info!(
            dir = %dir.display(),
            max_seq_len,
            threads = candle_core::utils::get_num_threads(),
            "loaded {}",
            spec.name
        );
        Ok(Self {
            spec,
            model,
            tokenizer,
            device,
            dim: config.hidden_size,
            max_seq_len,
            batch_size: DEFAULT_BATCH_SIZE,
        })
    }

    /// Loads all-MiniLM-L6-v2 from [`crate::default_model_dir`].
    pub fn load_default() -> Result<Self, EmbedError> {
        Self::load(&crate::default_model_dir())
    }

    /// The model this embedder runs.
    pub fn spec(&self) -> &'static ModelSpec {
        self.spec
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
        let pooled = match self.spec.pooling {
            // Mean over real tokens; the division by the count is dropped because the L2
            // normalisation that follows cancels it.
            Pooling::Mean if seqs.iter().all(|s| s.len() == len) => hidden.sum(1)?,
            Pooling::Mean => {
                let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
                hidden.broadcast_mul(&mask)?.sum(1)?
            }
            // The first token, [CLS] (padding is on the right).
            Pooling::Cls => hidden.narrow(1, 0, 1)?.squeeze(1)?,
        };
        let mut rows = pooled.to_vec2::<f32>()?;
        for row in &mut rows {
            l2_normalize(row);
        }
        Ok(rows)
    }
}

impl BertEmbedder {
    /// Embeds `texts`, each with `prefix` before it.
    fn embed_with(&self, prefix: &str, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let inputs: Vec<String> = texts.iter().map(|t| format!("{prefix}{t}")).collect();
        let encodings = self
            .tokenizer
            .encode_batch(inputs, true)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        let seqs: Vec<&[u32]> = encodings.iter().map(|e| e.get_ids()).collect();

        // One chunk per rayon thread at least. candle's matmuls also split across the pool,
        // but its element-wise ops (GELU, softmax, layer norm, ...) are single-threaded:
        // running one chunk per core keeps both busy. A lone chunk still gets parallel matmuls.
        crate::embed_in_chunks(
            &seqs,
            rayon::current_num_threads(),
            self.batch_size,
            |_, batch| self.forward(batch),
        )
    }
}

impl Embedder for BertEmbedder {
    fn model_name(&self) -> &str {
        self.spec.name
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn runtime(&self) -> &str {
        "candle"
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_with(self.spec.document_prefix, texts)
    }

    fn embed_queries(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_with(self.spec.query_prefix, texts)
    }

    fn is_asymmetric(&self) -> bool {
        self.spec.query_prefix != self.spec.document_prefix
    }

    fn cosine_scale(&self) -> crate::CosineScale {
        self.spec.cosine_scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{BGE_SMALL_EN_V15, E5_SMALL_Q4};
    use candle_nn::VarMap;

    const TOKENIZER: &str = r###"{
      "version": "1.0", "truncation": null, "padding": null,
      "added_tokens": [
        {"id": 0, "content": "[PAD]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
        {"id": 1, "content": "[UNK]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
        {"id": 2, "content": "[CLS]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
        {"id": 3, "content": "[SEP]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
      ],
      "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
      "pre_tokenizer": {"type": "BertPreTokenizer"},
      "post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]}, "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
      "decoder": null,
      "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
        "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "query": 4, ":": 5, "passage": 6, "hello": 7, "world": 8, "big": 9, "small": 10, "cat": 11}}
    }"###;

    const CONFIG: &str = r#"{"vocab_size": 12, "hidden_size": 8, "num_hidden_layers": 2,
      "num_attention_heads": 2, "intermediate_size": 16, "hidden_act": "gelu",
      "hidden_dropout_prob": 0.0, "max_position_embeddings": 32, "type_vocab_size": 2,
      "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0,
      "classifier_dropout": null, "model_type": "bert"}"#;

    /// A two-layer BERT with random weights, written as a model directory.
    fn tiny_model() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "recollect-tiny-bert-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), TOKENIZER).unwrap();
        std::fs::write(dir.join("config.json"), CONFIG).unwrap();
        let config: Config = serde_json::from_str(CONFIG).unwrap();
        let vars = VarMap::new();
        let vb = VarBuilder::from_varmap(&vars, DType::F32, &Device::Cpu);
        BertModel::load(vb, &config).unwrap();
        // The layer norms start at exactly 1 and 0; nudge every variable so each one matters.
        for var in vars.all_vars() {
            let noise = Tensor::randn(0f32, 0.5, var.shape(), &Device::Cpu).unwrap();
            var.set(&(var.as_tensor() + noise).unwrap()).unwrap();
        }
        vars.save(dir.join("model.safetensors")).unwrap();
        dir
    }

    /// The last layer's token states for `text`, computed without the embedder.
    fn hidden(dir: &Path, text: &str) -> Vec<Vec<f32>> {
        let e = BertEmbedder::load(dir).unwrap();
        let ids = e.token_ids(text).unwrap();
        let n = ids.len();
        let ids = Tensor::from_vec(ids, (1, n), &Device::Cpu).unwrap();
        let types = Tensor::zeros((1, n), DType::U32, &Device::Cpu).unwrap();
        let h = e.model.forward(&ids, &types, None).unwrap();
        h.squeeze(0).unwrap().to_vec2::<f32>().unwrap()
    }

    fn normalised(mut v: Vec<f32>) -> Vec<f32> {
        l2_normalize(&mut v);
        v
    }

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5)
    }

    #[test]
    fn mean_pooling_averages_the_real_tokens_and_cls_pooling_takes_the_first() {
        let dir = tiny_model();
        let text = "hello big world";
        let states = hidden(&dir, text);
        let dim = states[0].len();
        let mean: Vec<f32> = (0..dim)
            .map(|j| states.iter().map(|s| s[j]).sum::<f32>() / states.len() as f32)
            .collect();

        let minilm = BertEmbedder::load(&dir).unwrap();
        // Batched with a longer text, so this one is padded: padding must not count.
        let got = minilm
            .embed(&[text, "hello big small cat world hello"])
            .unwrap();
        assert!(close(&got[0], &normalised(mean.clone())), "mean pooling");

        let bge = BertEmbedder::load_model(&dir, &BGE_SMALL_EN_V15).unwrap();
        let got = bge
            .embed(&[text, "hello big small cat world hello"])
            .unwrap();
        assert!(
            close(&got[0], &normalised(states[0].clone())),
            "CLS pooling"
        );
        assert!(
            !close(&got[0], &normalised(mean)),
            "the two poolings differ"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn prefixes_go_before_queries_and_documents_as_the_spec_says() {
        let dir = tiny_model();
        let e5 = BertEmbedder::load_model(&dir, &E5_SMALL_Q4).unwrap();
        assert!(e5.is_asymmetric());
        let q = e5.embed_queries(&["hello world"]).unwrap();
        let d = e5.embed(&["hello world"]).unwrap();
        let plain = BertEmbedder::load(&dir).unwrap();
        assert!(!plain.is_asymmetric());
        let want_q = plain.embed(&["query: hello world"]).unwrap();
        let want_d = plain.embed(&["passage: hello world"]).unwrap();
        assert!(close(&q[0], &want_q[0]) && close(&d[0], &want_d[0]));
        assert!(!close(&q[0], &d[0]));
        assert_eq!(
            plain.embed_queries(&["hello world"]).unwrap(),
            plain.embed(&["hello world"]).unwrap(),
            "MiniLM has no prefixes"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_pooling_config_that_contradicts_the_model_is_refused() {
        let dir = tiny_model();
        std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
        std::fs::write(
            dir.join("1_Pooling/config.json"),
            r#"{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}"#,
        )
        .unwrap();
        BertEmbedder::load_model(&dir, &BGE_SMALL_EN_V15).unwrap();
        let e = BertEmbedder::load(&dir).unwrap_err().to_string();
        assert!(e.contains("pooling_mode_mean_tokens"), "{e}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
