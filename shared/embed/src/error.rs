use std::path::PathBuf;

/// Everything that can go wrong loading or running an embedder.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// The model directory or one of its required files is missing. Run `scripts/setup-model.sh`.
    #[error("model file {path} not found (run scripts/setup-model.sh or set RECOLLECT_MODEL_DIR)")]
    ModelNotFound { path: PathBuf },
    /// A model file exists but could not be read.
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `config.json` (or another JSON side file) is not what a BERT sentence encoder needs.
    #[error("invalid model config {path}: {message}")]
    Config { path: PathBuf, message: String },
    /// Loading or running the tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The tensor library failed (bad weights, shape mismatch, out of memory, ...).
    #[error("model: {0}")]
    Model(#[from] candle_core::Error),
    /// ONNX Runtime failed: its library is missing or unloadable, or a session failed.
    #[error("ONNX Runtime: {0}")]
    Runtime(String),
    /// An inner embedder broke the contract of [`crate::Embedder::embed`].
    #[error("embedder returned {got} vectors for {expected} texts")]
    CountMismatch { expected: usize, got: usize },
}
