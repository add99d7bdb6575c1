//! all-MiniLM-L6-v2 (and the E5 models) through ONNX Runtime (`embedder.runtime = "onnx"`): the
//! same network and weights as [`crate::BertEmbedder`], written by `scripts/make-onnx.py` into a
//! graph of ONNX Runtime's fused CPU operators (7 nodes a layer), 2.5–3× faster per question on
//! this machine's cores than candle. The vectors match candle's to cosine 0.9999997, so the
//! model name is the same and a store built with one runtime is searched with the other.
//!
//! [`crate::MINILM_INT8`] is that graph with int8 arithmetic (`scripts/make-onnx-int8.py`),
//! another 2–3× faster; its vectors are close to (cosine ≥ 0.995), not equal to, the f32 ones,
//! so it is a model of its own name.
//!
//! The runtime library is not linked: `ort`'s `load-dynamic` opens the `libonnxruntime.so`
//! that `scripts/setup-onnx.sh` unpacks from the PyPI wheel (sha256-checked), once per process.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::TensorRef;
use parking_lot::Mutex;
use tokenizers::Tokenizer;

use crate::bert::{load_tokenizer, require};
use crate::models::{ModelSpec, MINILM};
use crate::{l2_normalize, EmbedError, Embedder};

/// The f32 graph `scripts/setup-onnx.sh` writes beside MiniLM's safetensors.
pub const ONNX_MODEL_FILE: &str = match MINILM.onnx_graph {
    Some(file) => file,
    None => panic!("MiniLM has a graph"),
};
/// ONNX Runtime version `scripts/setup-onnx.sh` installs (`ort`'s API 31 needs ≥ 1.31).
pub const ONNX_RUNTIME_VERSION: &str = "1.32.0";
/// Texts per forward pass (sorted by token count first, so padding stays small).
const BATCH_SIZE: usize = 32;

/// Where `scripts/setup-onnx.sh` puts the runtime library.
pub fn default_onnx_runtime_path() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".cache/recollect")
        .join(format!("onnxruntime-{ONNX_RUNTIME_VERSION}"))
        .join(format!("libonnxruntime.so.{ONNX_RUNTIME_VERSION}"))
}

pub(crate) fn model_error(e: impl std::fmt::Display) -> EmbedError {
    EmbedError::Runtime(e.to_string())
}

/// ONNX Runtime allows one environment per process; the first library that loads wins. A
/// failed load is not kept, so a later caller with another path may still succeed.
static ENVIRONMENT: OnceLock<ort::environment::Environment> = OnceLock::new();
static ENVIRONMENT_INIT: Mutex<()> = Mutex::new(());

pub(crate) fn environment(
    lib: &Path,
) -> Result<&'static ort::environment::Environment, EmbedError> {
    if let Some(env) = ENVIRONMENT.get() {
        return Ok(env);
    }
    let _one_at_a_time = ENVIRONMENT_INIT.lock();
    if let Some(env) = ENVIRONMENT.get() {
        return Ok(env);
    }
    if !lib.is_file() {
        return Err(EmbedError::Runtime(format!(
            "ONNX Runtime library {} not found (run scripts/setup-onnx.sh or set embedder.onnx_runtime)",
            lib.display()
        )));
    }
    let failed = |e: &dyn std::fmt::Display| {
        EmbedError::Runtime(format!("loading ONNX Runtime from {}: {e}", lib.display()))
    };
    let env = ort::init_from(lib)
        .map_err(|e| failed(&e))?
        .with_name("recollect")
        .build()
        .map_err(|e| failed(&e))?;
    Ok(ENVIRONMENT.get_or_init(|| env))
}

/// A BERT graph on ONNX Runtime, one session per core, with its tokenizer: what the sentence
/// embedder, the token embedder and the cross-encoder each load, and run the same way.
pub(crate) struct BertGraph {
    name: &'static str,
    pub(crate) sessions: Sessions,
    pub(crate) tokenizer: Tokenizer,
    /// Whether each text runs through the graph alone ([`quantises_per_pass`]).
    alone: bool,
}

/// Whether the graph at `model` quantises its activations at run time
/// (`DynamicQuantizeLinear`, as every int8 graph here does). Such a node takes one scale from
/// the whole input of a pass, padding included, so a text sent with others got a vector that
/// depended on them (cosine 0.998–0.999 to its own): the same turn embedded twice differed,
/// a stored turn differed from the same text asked as a question, and two ingests of the same
/// conversations ranked differently. Run alone, a text gets one vector, and needs no padding
/// (the LoCoMo ingest ran 1.3× faster; MiniLM's short texts alone ~4 % slower).
fn quantises_per_pass(model: &Path) -> Result<bool, EmbedError> {
    use std::io::Read;
    const NODE: &[u8] = b"DynamicQuantizeLinear";
    let error = |e: std::io::Error| model_error(format!("reading {}: {e}", model.display()));
    // Read in pieces: an f32 graph may be half a gigabyte. Each piece keeps the previous
    // one's last bytes, so a name split between two reads is still found.
    let mut file = std::fs::File::open(model).map_err(error)?;
    let finder = memchr::memmem::Finder::new(NODE);
    let mut buf = vec![0u8; 1 << 20];
    let mut kept = 0;
    loop {
        let n = file.read(&mut buf[kept..]).map_err(error)?;
        if n == 0 {
            return Ok(false);
        }
        let end = kept + n;
        if finder.find(&buf[..end]).is_some() {
            return Ok(true);
        }
        kept = (NODE.len() - 1).min(end);
        buf.copy_within(end - kept..end, 0);
    }
}

impl std::fmt::Debug for BertGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertGraph")
            .field("model", &self.name)
            .field("sessions", &self.sessions.len())
            .finish_non_exhaustive()
    }
}

impl BertGraph {
    /// `graph` and `tokenizer.json` from `dir` (truncating to `max_seq_len` tokens), on the
    /// ONNX Runtime library at `lib`; `name` is the model's, for the log.
    pub(crate) fn load(
        dir: &Path,
        lib: &Path,
        name: &'static str,
        graph: &str,
        max_seq_len: usize,
    ) -> Result<Self, EmbedError> {
        let model = require(dir, graph)?;
        let tokenizer = load_tokenizer(&require(dir, "tokenizer.json")?, max_seq_len)?;
        let sessions = Sessions::load(lib, &model)?;
        let alone = quantises_per_pass(&model)?;
        tracing::info!(model = %model.display(), sessions = sessions.len(), one_text_a_pass = alone, "loaded {name} (ONNX Runtime)");
        Ok(Self {
            name,
            sessions,
            tokenizer,
            alone,
        })
    }

    /// Runs token sequences through `forward` in batches of at most `batch_size` (one where
    /// the graph quantises per pass), sorted by length, one batch per session at a time;
    /// `forward` gets a session hint and one batch, and gives a row per sequence. Every pass
    /// through the graph goes by here, so none can batch what must run alone.
    pub(crate) fn run_chunks(
        &self,
        seqs: &[&[u32]],
        batch_size: usize,
        forward: impl Fn(usize, &[&[u32]]) -> Result<Vec<Vec<f32>>, EmbedError> + Sync,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let per_pass = if self.alone { 1 } else { batch_size };
        crate::embed_in_chunks(seqs, self.sessions.len(), per_pass, forward)
    }

    /// Tokenizes `inputs` (texts, or question–passage pairs) and runs them as
    /// [`Self::run_chunks`] does.
    pub(crate) fn encode<'s, E>(
        &self,
        inputs: Vec<E>,
        batch_size: usize,
        forward: impl Fn(usize, &[&[u32]]) -> Result<Vec<Vec<f32>>, EmbedError> + Sync,
    ) -> Result<Vec<Vec<f32>>, EmbedError>
    where
        E: Into<tokenizers::EncodeInput<'s>> + Send,
    {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let encodings = self
            .tokenizer
            .encode_batch(inputs, true)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        let seqs: Vec<&[u32]> = encodings.iter().map(|e| e.get_ids()).collect();
        self.run_chunks(&seqs, batch_size, forward)
    }
}

/// Sentence embeddings from all-MiniLM-L6-v2's ONNX graph: mean pooling over the attention mask
/// and L2 normalisation, as [`crate::BertEmbedder`] computes them.
#[derive(Debug)]
pub struct OnnxEmbedder {
    spec: &'static ModelSpec,
    graph: BertGraph,
    dim: usize,
}

/// One intra-op thread, sequential execution, every graph optimisation (the fastest options
/// measured here).
fn session(env: &ort::environment::Environment, model: &Path) -> ort::Result<Session> {
    Session::builder(env)?
        .with_optimization_level(GraphOptimizationLevel::All)?
        .with_intra_threads(1)?
        .with_inter_threads(1)?
        .with_parallel_execution(false)?
        .commit_from_file(model)
}

/// One session of a graph per core, each with one intra-op thread: a lone input runs fastest on
/// one thread (two made p50 2–3× worse when the other core was busy), and batches run one chunk
/// per session side by side. `Session::run` takes `&mut self`, hence a lock per session.
pub(crate) struct Sessions(Vec<Mutex<Session>>);

impl Sessions {
    /// The graph at `model`, once per core, on the ONNX Runtime library at `lib`.
    pub(crate) fn load(lib: &Path, model: &Path) -> Result<Self, EmbedError> {
        let env = environment(lib)?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (0..cores)
            .map(|_| {
                session(env, model)
                    .map(Mutex::new)
                    .map_err(|e| model_error(format!("loading {}: {e}", model.display())))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// A session: a free one if any, else the `hint`th one's turn.
    fn get(&self, hint: usize) -> parking_lot::MutexGuard<'_, Session> {
        self.0
            .iter()
            .find_map(|s| s.try_lock())
            .unwrap_or_else(|| self.0[hint % self.0.len()].lock())
    }

    /// One batch of token ids, padded to its longest, through a BERT graph (`input_ids`,
    /// `attention_mask`, `token_type_ids`); `read` gets the first output's shape and values.
    /// With `pair_separator`, the tokens after its first occurrence are segment 1 (a
    /// cross-encoder's `[CLS] question [SEP] passage [SEP]`); else every token is segment 0.
    pub(crate) fn run<R>(
        &self,
        hint: usize,
        seqs: &[&[u32]],
        pair_separator: Option<u32>,
        read: impl FnOnce(&[i64], &[f32]) -> Result<R, EmbedError>,
    ) -> Result<R, EmbedError> {
        let b = seqs.len();
        let n = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut ids = vec![0i64; b * n];
        let mut mask = vec![0i64; b * n];
        let mut types = vec![0i64; b * n];
        for (r, s) in seqs.iter().enumerate() {
            let mut segment = 0;
            for (t, &id) in s.iter().enumerate() {
                ids[r * n + t] = i64::from(id);
                mask[r * n + t] = 1;
                types[r * n + t] = segment;
                if Some(id) == pair_separator {
                    segment = 1;
                }
            }
        }
        let shape = [b, n];
        let mut session = self.get(hint);
        let outputs = session
            .run(ort::inputs![
                "input_ids" => TensorRef::from_array_view((shape, &ids[..])).map_err(model_error)?,
                "attention_mask" => TensorRef::from_array_view((shape, &mask[..])).map_err(model_error)?,
                "token_type_ids" => TensorRef::from_array_view((shape, &types[..])).map_err(model_error)?
            ])
            .map_err(model_error)?;
        let (out_shape, values) = outputs[0]
            .try_extract_tensor::<f32>()
            .map_err(model_error)?;
        read(out_shape, values)
    }
}

impl OnnxEmbedder {
    /// Loads all-MiniLM-L6-v2's f32 graph and `tokenizer.json` from `dir` with the ONNX Runtime
    /// library at `lib`.
    pub fn load(dir: &Path, lib: &Path) -> Result<Self, EmbedError> {
        Self::load_model(dir, lib, &MINILM)
    }

    /// Loads `spec`'s graph (one of the models with an [`ModelSpec::onnx_graph`]) and its
    /// tokenizer from `dir`.
    pub fn load_model(
        dir: &Path,
        lib: &Path,
        spec: &'static ModelSpec,
    ) -> Result<Self, EmbedError> {
        let Some(graph) = spec.onnx_graph else {
            return Err(EmbedError::Runtime(format!(
                "{} has no ONNX graph; it runs on candle",
                spec.name
            )));
        };
        // `forward` pools by the mean; a CLS-pooled model has no graph.
        if spec.pooling != crate::Pooling::Mean {
            return Err(EmbedError::Runtime(format!(
                "{} pools by its first token; its ONNX graph is not supported",
                spec.name
            )));
        }
        Ok(Self {
            spec,
            graph: BertGraph::load(dir, lib, spec.name, graph, spec.max_seq_len)?,
            dim: spec.dim,
        })
    }

    /// One padded batch; one normalised vector per sequence.
    fn forward(&self, seqs: &[&[u32]], hint: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
        let (b, n) = (seqs.len(), seqs.iter().map(|s| s.len()).max().unwrap_or(0));
        self.graph
            .sessions
            .run(hint, seqs, None, |out_shape, hidden| {
                if out_shape[..] != [b as i64, n as i64, self.dim as i64] {
                    return Err(model_error(format!(
                        "the graph returned shape {out_shape:?} for {b} texts of {n} tokens"
                    )));
                }
                Ok(self.pool(seqs, n, hidden))
            })
    }

    /// Mean pooling over each sequence's real tokens, then L2 normalisation.
    fn pool(&self, seqs: &[&[u32]], n: usize, hidden: &[f32]) -> Vec<Vec<f32>> {
        let mut rows = Vec::with_capacity(seqs.len());
        for (r, s) in seqs.iter().enumerate() {
            // Mean pooling over the real tokens (MiniLM, E5).
            let mut v = vec![0f32; self.dim];
            for t in 0..s.len() {
                let h = &hidden[(r * n + t) * self.dim..(r * n + t + 1) * self.dim];
                v.iter_mut().zip(h).for_each(|(a, x)| *a += x);
            }
            // The mean's division is cancelled by the normalisation.
            l2_normalize(&mut v);
            rows.push(v);
        }
        rows
    }

    /// `texts` with the model's `prefix` (E5's "query: " / "passage: "; none for MiniLM, whose
    /// texts are tokenized as they are).
    fn embed_with(&self, prefix: &str, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let forward = |k: usize, batch: &[&[u32]]| self.forward(batch, k);
        if prefix.is_empty() {
            self.graph.encode(texts.to_vec(), BATCH_SIZE, forward)
        } else {
            let inputs: Vec<String> = texts.iter().map(|t| format!("{prefix}{t}")).collect();
            self.graph.encode(inputs, BATCH_SIZE, forward)
        }
    }
}

impl Embedder for OnnxEmbedder {
    fn model_name(&self) -> &str {
        self.spec.name
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn runtime(&self) -> &str {
        "onnx"
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

    #[test]
    fn a_graph_that_quantises_per_pass_is_told_by_its_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let int8 = dir.path().join("int8.onnx");
        std::fs::write(&int8, b"\x08\x07...op_type\x12\x15DynamicQuantizeLinear...").unwrap();
        let f32 = dir.path().join("f32.onnx");
        std::fs::write(&f32, b"\x08\x07...op_type\x12\x06MatMul...").unwrap();
        assert!(quantises_per_pass(&int8).unwrap());
        assert!(!quantises_per_pass(&f32).unwrap());
        // Found where it straddles two reads of the file, and not in an empty one.
        let mut big = vec![b'x'; (1 << 20) - 5];
        big.extend_from_slice(b"DynamicQuantizeLinear");
        big.extend_from_slice(&[b'y'; 3 << 20]);
        let straddles = dir.path().join("big.onnx");
        std::fs::write(&straddles, &big).unwrap();
        assert!(quantises_per_pass(&straddles).unwrap());
        let empty = dir.path().join("empty.onnx");
        std::fs::write(&empty, b"").unwrap();
        assert!(!quantises_per_pass(&empty).unwrap());
        let err = quantises_per_pass(&dir.path().join("absent.onnx")).unwrap_err();
        assert!(err.to_string().contains("absent.onnx"), "{err}");
    }
}
