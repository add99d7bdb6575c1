//! Layered configuration: compiled-in defaults, then an optional file, then
//! `RECOLLECT__SECTION__KEY` environment variables; validated once at start so a bad value
//! stops the process with a message that names the key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod recall;

pub use recall::{FieldCosine, LateShift, RecallConfig, RERANK_MODELS};

const DEFAULTS: &str = include_str!("../config/default.toml");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration could not be read: {0}")]
    Load(#[from] config::ConfigError),
    #[error("invalid configuration: {key}: {message}")]
    Invalid { key: &'static str, message: String },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settings {
    pub server: ServerSettings,
    pub storage: StorageSettings,
    pub embedder: EmbedderSettings,
    pub extractor: ExtractorSettings,
    pub llm: LlmSettings,
    pub graph: GraphSettings,
    pub vectors: VectorSettings,
    pub bus: BusSettings,
    pub remote: RemoteSettings,
    pub consolidation: ConsolidationSettings,
    pub recall: RecallConfig,
    pub telemetry: TelemetrySettings,
}

#[derive(Clone, Serialize, Deserialize)]
pub struct ServerSettings {
    pub listen: String,
    /// gRPC address; empty: no gRPC server.
    pub grpc_listen: String,
    /// `key:tenant` pairs. Secrets: redacted from `Debug`.
    pub api_keys: Vec<String>,
    pub max_body_bytes: usize,
    pub max_turns_per_request: usize,
    pub max_query_bytes: usize,
    /// Longest text of one turn field (user, assistant; metadata as JSON).
    pub max_text_bytes: usize,
    pub max_k: usize,
    pub default_k: usize,
    pub wait_timeout_secs: u64,
    /// Sustained requests per second per tenant; 0: no rate limit.
    pub rate_limit_per_sec: u32,
    pub rate_limit_burst: u32,
    /// Bound on the per-tenant bucket map.
    pub rate_limit_max_tenants: usize,
    /// Work requests handled at once; beyond it a 503 with Retry-After instead of a queue.
    pub max_in_flight: usize,
    /// Serve the memory browser at `/ui` (where the read path is served). The Helm chart turns
    /// it off unless asked.
    pub ui: bool,
    /// Bearer key of the operator endpoints (backup); empty: they are off. Secret: redacted.
    #[serde(default)]
    pub admin_key: String,
    /// Once bound, the process writes the addresses it listens on here, as JSON
    /// (`{"http": "127.0.0.1:41234", "grpc": …}`); empty: nothing is written. For a supervisor
    /// or test that asks for port 0 and needs to know which port it got.
    #[serde(default)]
    pub address_file: String,
}

/// Tenants of the keys, never the keys themselves: `Debug` output ends up in logs.
impl std::fmt::Debug for ServerSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<String> = self
            .api_keys
            .iter()
            .map(|k| match k.split_once(':') {
                Some((_, tenant)) => format!("<redacted>:{tenant}"),
                None => "<redacted>".to_string(),
            })
            .collect();
        f.debug_struct("ServerSettings")
            .field("listen", &self.listen)
            .field("api_keys", &keys)
            .field(
                "admin_key",
                &if self.admin_key.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("address_file", &self.address_file)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_turns_per_request", &self.max_turns_per_request)
            .field("max_query_bytes", &self.max_query_bytes)
            .field("max_text_bytes", &self.max_text_bytes)
            .field("max_k", &self.max_k)
            .field("default_k", &self.default_k)
            .field("wait_timeout_secs", &self.wait_timeout_secs)
            .field("rate_limit_per_sec", &self.rate_limit_per_sec)
            .field("rate_limit_burst", &self.rate_limit_burst)
            .field("rate_limit_max_tenants", &self.rate_limit_max_tenants)
            .field("max_in_flight", &self.max_in_flight)
            .finish()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StorageSettings {
    pub data_dir: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EmbedderKind {
    Minilm,
    Hash,
}

/// What the settings know of a model `embedder.model` accepts: the width of its vectors and
/// the runtimes that run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbedderModel {
    pub name: &'static str,
    pub dim: usize,
    pub on_onnx: bool,
    pub on_candle: bool,
}

const fn model(name: &'static str, dim: usize, on_onnx: bool, on_candle: bool) -> EmbedderModel {
    EmbedderModel {
        name,
        dim,
        on_onnx,
        on_candle,
    }
}

/// The models `embedder.model` accepts (`recollect_embed::MODELS`, which a test in
/// `recollect-runtime` keeps equal to this list; this crate does not link the model code).
pub const EMBEDDER_MODELS: [EmbedderModel; 9] = [
    model("all-MiniLM-L6-v2", 384, true, true),
    model("all-MiniLM-L6-v2-int8", 384, true, false),
    model("multilingual-e5-small-q4", 384, true, true),
    model("multilingual-e5-small-enpt-q4", 384, true, true),
    model("e5-small-v2-int8", 384, true, false),
    model("bge-small-en-v1.5", 384, false, true),
    model("all-mpnet-base-v2", 768, true, false),
    model("all-mpnet-base-v2-int8", 768, true, false),
    model("nomic-embed-text-v1.5", 768, true, false),
];

/// The model named `name` (exact match), if `embedder.model` accepts it.
pub fn embedder_model(name: &str) -> Option<&'static EmbedderModel> {
    EMBEDDER_MODELS.iter().find(|m| m.name == name)
}

fn model_names(keep: impl Fn(&EmbedderModel) -> bool) -> String {
    let names: Vec<&str> = EMBEDDER_MODELS
        .iter()
        .filter(|m| keep(m))
        .map(|m| m.name)
        .collect();
    names.join(", ")
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EmbedderSettings {
    pub kind: EmbedderKind,
    /// Which sentence encoder `kind = "minilm"` runs: one of [`EMBEDDER_MODELS`].
    pub model: String,
    /// Empty: look for models/<model> beside the binary or the working directory, then in
    /// ~/.cache/recollect/models/<model>.
    pub model_dir: String,
    pub batch_size: usize,
    /// What runs the encoder: candle, ONNX Runtime (MiniLM, its int8 form, the E5 models and
    /// MPNet, not bge-small-en-v1.5; the int8 form and MPNet run on ONNX Runtime only), or auto:
    /// ONNX Runtime where it and the model's graph are installed.
    pub runtime: EmbedderRuntime,
    /// The ONNX Runtime library; empty: where `scripts/setup-onnx.sh` puts it.
    pub onnx_runtime: String,
    /// A late-interaction model (one of [`LATE_MODELS`]) that gives each turn one vector per
    /// token at ingest, for recall's MaxSim re-scoring of its top `recall.late_depth`
    /// (docs/RECALL.md, departure 12); empty: off. [`LATE_MODEL_AUTO`] (the default): the first
    /// of them where it can run (`kind = "minilm"`, the model and ONNX Runtime installed) and
    /// the vector index can hold token vectors (a new one, or one made with them), else off.
    /// Turns stored without token vectors have none: a named model on an index made without
    /// them is refused (a fresh data directory or a reindex turns it on).
    pub late_model: String,
    /// Where the late-interaction model's files are; empty: models/<late_model> beside the
    /// binary or the working directory, then ~/.cache/recollect/models/<late_model>.
    pub late_model_dir: String,
    /// A turn's token vectors pooled this many to one at ingest (Ward clustering of each field's
    /// rows; 1: every token kept). 2 halves the storage and the MaxSim work, moving LoCoMo dev's
    /// figures by at most 0.007 (docs/EVALUATION.md); questions are never pooled.
    pub late_pool_factor: usize,
    /// Each field's token vectors read after the last this many words said before it in its
    /// sitting (the extractor keeps them in the conversation's state); 0: each field alone.
    pub late_context_words: usize,
}

/// `embedder.late_context_words` at most: the model reads 128 tokens, the field's first.
pub const MAX_LATE_CONTEXT_WORDS: usize = 96;

/// `embedder.late_model = "auto"`: late interaction wherever it can run (see the setting).
pub const LATE_MODEL_AUTO: &str = "auto";

/// The late-interaction models `embedder.late_model` accepts, with the width of their token
/// vectors (`recollect_embed::TOKEN_MODELS`; a test in recollect-runtime keeps the two equal).
pub const LATE_MODELS: [(&str, usize); 1] = [("answerai-colbert-small-v1-int8", 384)];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EmbedderRuntime {
    /// ONNX Runtime when the model has a graph and the library and graph are installed, else
    /// candle (their vectors are the same, so a store may be served by either).
    Auto,
    Candle,
    Onnx,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExtractorKind {
    Rules,
    Llm,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExtractorSettings {
    pub kind: ExtractorKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GraphKind {
    Embedded,
    Neo4j,
    /// The embedded graph hosted by a `recollect-store` service (see `[remote]`).
    Remote,
}

#[derive(Clone, Serialize, Deserialize)]
pub struct LlmSettings {
    /// OpenAI-compatible API base, e.g. `http://127.0.0.1:8000/v1`.
    pub base_url: String,
    pub model: String,
    /// Secret: redacted from `Debug`.
    #[serde(default)]
    pub api_key: String,
    pub timeout_secs: u64,
    pub max_retries: usize,
    pub fallback_to_rules: bool,
}

impl std::fmt::Debug for LlmSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmSettings")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field(
                "api_key",
                &if self.api_key.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("timeout_secs", &self.timeout_secs)
            .field("max_retries", &self.max_retries)
            .field("fallback_to_rules", &self.fallback_to_rules)
            .finish()
    }
}

#[derive(Clone, Serialize, Deserialize)]
pub struct GraphSettings {
    pub kind: GraphKind,
    pub uri: String,
    pub user: String,
    /// Secret: redacted from `Debug`.
    pub password: String,
    pub database: String,
    /// PEM CA certificate for `bolt+s://` / `neo4j+s://`; empty: the system roots.
    #[serde(default)]
    pub ca_file: String,
}

impl std::fmt::Debug for GraphSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let password = if self.password.is_empty() {
            ""
        } else {
            "<redacted>"
        };
        f.debug_struct("GraphSettings")
            .field("kind", &self.kind)
            .field("uri", &self.uri)
            .field("user", &self.user)
            .field("password", &password)
            .field("database", &self.database)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VectorKind {
    Embedded,
    Qdrant,
    /// The embedded vector engine hosted by a `recollect-store` service (see `[remote]`).
    Remote,
}

#[derive(Clone, Serialize, Deserialize)]
pub struct VectorSettings {
    pub kind: VectorKind,
    /// Qdrant's gRPC address; `https://` for TLS.
    pub url: String,
    /// Qdrant API key. Secret: redacted from `Debug`.
    #[serde(default)]
    pub api_key: String,
}

/// "" when empty, a fixed marker otherwise: secrets never reach logs.
fn redacted(secret: &str) -> &'static str {
    if secret.is_empty() {
        ""
    } else {
        "<redacted>"
    }
}

impl std::fmt::Debug for VectorSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VectorSettings")
            .field("kind", &self.kind)
            .field("url", &self.url)
            .field("api_key", &redacted(&self.api_key))
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BusKind {
    InProcess,
    Kafka,
}

#[derive(Clone, Serialize, Deserialize)]
pub struct BusSettings {
    pub kind: BusKind,
    pub brokers: String,
    pub group_prefix: String,
    /// Partitions per topic when the admin step creates them.
    pub partitions: i32,
    pub replication: i32,
    #[serde(default)]
    pub security_protocol: KafkaSecurityProtocol,
    #[serde(default)]
    pub sasl_mechanism: SaslMechanism,
    #[serde(default)]
    pub sasl_username: String,
    /// Secret: redacted from `Debug`.
    #[serde(default)]
    pub sasl_password: String,
    /// PEM CA certificate of the brokers (ssl, sasl_ssl); empty: the system roots.
    #[serde(default)]
    pub ssl_ca_file: String,
}

impl std::fmt::Debug for BusSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BusSettings")
            .field("kind", &self.kind)
            .field("brokers", &self.brokers)
            .field("group_prefix", &self.group_prefix)
            .field("partitions", &self.partitions)
            .field("replication", &self.replication)
            .field("security_protocol", &self.security_protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &redacted(&self.sasl_password))
            .field("ssl_ca_file", &self.ssl_ca_file)
            .finish()
    }
}

/// librdkafka's `security.protocol`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaSecurityProtocol {
    #[default]
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl KafkaSecurityProtocol {
    /// The value librdkafka takes.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Plaintext => "plaintext",
            Self::Ssl => "ssl",
            Self::SaslPlaintext => "sasl_plaintext",
            Self::SaslSsl => "sasl_ssl",
        }
    }

    pub fn sasl(&self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }

    pub fn tls(&self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }
}

/// librdkafka's `sasl.mechanism`: the username/password ones this build supports (GSSAPI and
/// OAUTHBEARER need callbacks or libraries it does not have).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SaslMechanism {
    #[default]
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl SaslMechanism {
    /// The value librdkafka takes.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// A `recollect-store` service: the embedded graph and vector engine behind HTTP, for
/// distributed deployments without Neo4j/Qdrant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemoteSettings {
    pub url: String,
    /// Shared secret between the store service and its clients (RECOLLECT__REMOTE__TOKEN).
    /// Required when the store service listens beyond loopback.
    #[serde(default)]
    pub token: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConsolidationSettings {
    pub window: usize,
    pub kind: ConsolidationKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsolidationKind {
    Rules,
    Llm,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TelemetrySettings {
    /// text | json
    pub log_format: String,
    pub log_level: String,
    /// Base URL of an OTLP/HTTP trace receiver; empty: spans are not exported.
    pub otlp_endpoint: String,
}

/// Where OTLP/HTTP receivers take spans, below their base URL (the OpenTelemetry convention).
const OTLP_TRACES_PATH: &str = "/v1/traces";

impl TelemetrySettings {
    /// The URL spans are sent to: `otlp_endpoint` with `/v1/traces` appended (kept as it is when
    /// it already ends so); None when export is off. Call after `Settings::validate`.
    pub fn otlp_traces_url(&self) -> Option<String> {
        let base = self.otlp_endpoint.trim();
        if base.is_empty() {
            return None;
        }
        let base = base.trim_end_matches('/');
        Some(if base.ends_with(OTLP_TRACES_PATH) {
            base.to_string()
        } else {
            format!("{base}{OTLP_TRACES_PATH}")
        })
    }

    fn validate_otlp(&self) -> Result<(), String> {
        let raw = self.otlp_endpoint.trim();
        if raw.is_empty() {
            return Ok(());
        }
        let u = url::Url::parse(raw).map_err(|e| {
            format!("{raw:?} is not a URL ({e}); give the receiver's base URL, like http://otel-collector:4318")
        })?;
        match u.scheme() {
            "http" => {}
            // The exporter's HTTP client is built without TLS (the tree has no TLS stack for it);
            // a collector next to the service forwards over TLS instead.
            "https" => {
                return Err(format!(
                    "{raw:?}: https is not supported; send to an OpenTelemetry Collector over \
                     http:// (beside the service) and let it forward over TLS"
                ))
            }
            other => {
                return Err(format!(
                    "{raw:?}: scheme {other}:// is not OTLP/HTTP; use http://host:4318"
                ))
            }
        }
        if u.host_str().is_none_or(str::is_empty) {
            return Err(format!("{raw:?} names no host"));
        }
        if !u.username().is_empty() || u.password().is_some() {
            return Err(format!(
                "{:?}: credentials in the URL would be logged; the collector beside the service \
                 needs none",
                u.host_str().unwrap_or_default()
            ));
        }
        if u.query().is_some() || u.fragment().is_some() {
            return Err(format!("{raw:?}: a base URL takes no query or fragment"));
        }
        Ok(())
    }
}

impl Settings {
    /// Defaults, then `file` (if any), then `RECOLLECT__…` variables; validated.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut b = config::Config::builder()
            .add_source(config::File::from_str(DEFAULTS, config::FileFormat::Toml));
        if let Some(f) = file {
            b = b.add_source(config::File::from(f).required(true));
        }
        b = b.add_source(
            config::Environment::with_prefix("RECOLLECT")
                .prefix_separator("__")
                .separator("__")
                .list_separator(",")
                .with_list_parse_key("server.api_keys")
                .with_list_parse_key("recall.factual_weights")
                .with_list_parse_key("recall.reasoning_weights")
                .try_parsing(true),
        );
        let mut s: Settings = b.build()?.try_deserialize()?;
        if let Ok(keys) = std::env::var("RECOLLECT_API_KEYS") {
            s.server.api_keys.extend(
                keys.split(',')
                    .map(str::trim)
                    .filter(|k| !k.is_empty())
                    .map(String::from),
            );
        }
        s.validate()?;
        Ok(s)
    }

    /// Defaults only (tests, tools).
    pub fn defaults() -> Self {
        let s: Settings = config::Config::builder()
            .add_source(config::File::from_str(DEFAULTS, config::FileFormat::Toml))
            .build()
            .and_then(|c| c.try_deserialize())
            .expect("compiled-in defaults parse");
        s
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, message: String| Err(ConfigError::Invalid { key, message });
        if self.server.listen.parse::<SocketAddr>().is_err() {
            return invalid(
                "server.listen",
                format!(
                    "{:?} is not an address like 127.0.0.1:8080",
                    self.server.listen
                ),
            );
        }
        if !self.server.grpc_listen.is_empty()
            && self.server.grpc_listen.parse::<SocketAddr>().is_err()
        {
            return invalid(
                "server.grpc_listen",
                format!(
                    "{:?} is not an address like 127.0.0.1:50051 (empty turns gRPC off)",
                    self.server.grpc_listen
                ),
            );
        }
        for k in &self.server.api_keys {
            match k.split_once(':') {
                Some((key, tenant)) if !key.is_empty() && valid_tenant(tenant) => {}
                _ => {
                    return invalid(
                        "server.api_keys",
                        "each entry must be key:tenant, tenant of [A-Za-z0-9_.-]{1,64}".into(),
                    )
                }
            }
        }
        if self.server.max_k == 0 || self.server.max_k > 10_000 {
            return invalid("server.max_k", "must be in 1..=10000".into());
        }
        if self.server.default_k == 0 || self.server.default_k > self.server.max_k {
            return invalid("server.default_k", "must be in 1..=max_k".into());
        }
        if self.server.max_turns_per_request == 0 {
            return invalid("server.max_turns_per_request", "must be at least 1".into());
        }
        if self.server.max_body_bytes < 1024 {
            return invalid("server.max_body_bytes", "must be at least 1024".into());
        }
        if !(1..=self.server.max_body_bytes).contains(&self.server.max_text_bytes) {
            return invalid(
                "server.max_text_bytes",
                "must be in 1..=server.max_body_bytes".into(),
            );
        }
        if self.server.max_query_bytes == 0 {
            return invalid("server.max_query_bytes", "must be at least 1".into());
        }
        if self.server.rate_limit_per_sec > 0 && self.server.rate_limit_burst == 0 {
            return invalid(
                "server.rate_limit_burst",
                "must be at least 1 when server.rate_limit_per_sec is set".into(),
            );
        }
        if self.server.rate_limit_max_tenants == 0 {
            return invalid("server.rate_limit_max_tenants", "must be at least 1".into());
        }
        if !(1..=100_000).contains(&self.server.max_in_flight) {
            return invalid("server.max_in_flight", "must be in 1..=100000".into());
        }
        if self.extractor.kind == ExtractorKind::Llm
            || self.consolidation.kind == ConsolidationKind::Llm
        {
            if !(self.llm.base_url.starts_with("http://")
                || self.llm.base_url.starts_with("https://"))
            {
                return invalid(
                    "llm.base_url",
                    format!("{:?} is not an http(s) URL", self.llm.base_url),
                );
            }
            if self.llm.model.trim().is_empty() {
                return invalid("llm.model", "must name a model".into());
            }
            if !(1..=600).contains(&self.llm.timeout_secs) {
                return invalid("llm.timeout_secs", "must be in 1..=600".into());
            }
            if self.llm.max_retries > 10 {
                return invalid("llm.max_retries", "must be at most 10".into());
            }
        }
        let Some(model) = embedder_model(&self.embedder.model) else {
            return invalid(
                "embedder.model",
                format!(
                    "{:?} is not a known model; one of {}",
                    self.embedder.model,
                    model_names(|_| true)
                ),
            );
        };
        if self.embedder.runtime == EmbedderRuntime::Onnx && !model.on_onnx {
            return invalid(
                "embedder.runtime",
                format!(
                    "\"onnx\" runs {} only; {} runs on \"candle\"",
                    model_names(|m| m.on_onnx),
                    model.name
                ),
            );
        }
        if self.embedder.runtime == EmbedderRuntime::Candle && !model.on_candle {
            return invalid(
                "embedder.model",
                format!(
                    "{} runs on ONNX Runtime only; set embedder.runtime = \"onnx\" or \"auto\"",
                    model.name
                ),
            );
        }
        let late = self.embedder.late_model.as_str();
        if !late.is_empty() && late != LATE_MODEL_AUTO && self.late_dim().is_none() {
            return invalid(
                "embedder.late_model",
                format!(
                    "{:?} is not a known late-interaction model; one of: {}, \"auto\" (where it can run) or empty (off)",
                    self.embedder.late_model,
                    LATE_MODELS.map(|(n, _)| n).join(", ")
                ),
            );
        }
        if !(1..=8).contains(&self.embedder.late_pool_factor) {
            return invalid("embedder.late_pool_factor", "must be in 1..=8".into());
        }
        if self.embedder.late_context_words > MAX_LATE_CONTEXT_WORDS {
            return invalid(
                "embedder.late_context_words",
                format!("must be in 0..={MAX_LATE_CONTEXT_WORDS}"),
            );
        }
        if self.embedder.batch_size == 0 || self.embedder.batch_size > 4096 {
            return invalid("embedder.batch_size", "must be in 1..=4096".into());
        }
        if !(1..=1024).contains(&self.bus.partitions) {
            return invalid("bus.partitions", "must be in 1..=1024".into());
        }
        if self.bus.replication < 1 {
            return invalid("bus.replication", "must be at least 1".into());
        }
        self.validate_managed_services()?;
        let remote =
            self.graph.kind == GraphKind::Remote || self.vectors.kind == VectorKind::Remote;
        if remote && !self.remote.url.starts_with("http") {
            return invalid(
                "remote.url",
                "must be an http(s) URL of a recollect-store service".into(),
            );
        }
        if self.consolidation.window < 2 {
            return invalid("consolidation.window", "must be at least 2".into());
        }
        self.recall.validate()?;
        if !matches!(self.telemetry.log_format.as_str(), "text" | "json") {
            return invalid("telemetry.log_format", "must be text or json".into());
        }
        if let Err(message) = self.telemetry.validate_otlp() {
            return invalid("telemetry.otlp_endpoint", message);
        }
        if self.storage.data_dir.as_os_str().is_empty() {
            return invalid("storage.data_dir", "must not be empty".into());
        }
        Ok(())
    }

    /// Kafka security, the Bolt URI and the Qdrant URL, checked where they are used.
    fn validate_managed_services(&self) -> Result<(), ConfigError> {
        let invalid = |key, message: String| Err(ConfigError::Invalid { key, message });
        let bus = &self.bus;
        if bus.kind == BusKind::Kafka {
            if bus.security_protocol.sasl() {
                if bus.sasl_username.trim().is_empty() {
                    return invalid(
                        "bus.sasl_username",
                        format!(
                            "must be set when bus.security_protocol = {}",
                            bus.security_protocol.as_str()
                        ),
                    );
                }
                if bus.sasl_password.is_empty() {
                    return invalid(
                        "bus.sasl_password",
                        format!(
                            "must be set (RECOLLECT__BUS__SASL_PASSWORD) when \
                             bus.security_protocol = {}",
                            bus.security_protocol.as_str()
                        ),
                    );
                }
            } else if !bus.sasl_username.is_empty() || !bus.sasl_password.is_empty() {
                return invalid(
                    "bus.security_protocol",
                    format!(
                        "is {} but SASL credentials are set: use sasl_ssl (or sasl_plaintext) \
                         so they are sent",
                        bus.security_protocol.as_str()
                    ),
                );
            }
            if !bus.ssl_ca_file.is_empty() && !bus.security_protocol.tls() {
                return invalid(
                    "bus.ssl_ca_file",
                    format!(
                        "is set but bus.security_protocol = {} does not use TLS",
                        bus.security_protocol.as_str()
                    ),
                );
            }
        }
        if self.graph.kind == GraphKind::Neo4j {
            let scheme = self.graph.uri.split("://").next().unwrap_or_default();
            if !self.graph.uri.contains("://") || !BOLT_SCHEMES.contains(&scheme) {
                return invalid(
                    "graph.uri",
                    format!(
                        "{:?} must start with one of {}://",
                        self.graph.uri,
                        BOLT_SCHEMES.join("://, ")
                    ),
                );
            }
            if !self.graph.ca_file.is_empty() && !scheme.ends_with("+s") {
                return invalid(
                    "graph.ca_file",
                    format!("is set but graph.uri uses {scheme}://, not bolt+s:// or neo4j+s://"),
                );
            }
        }
        if self.vectors.kind == VectorKind::Qdrant
            && !(self.vectors.url.starts_with("http://")
                || self.vectors.url.starts_with("https://"))
        {
            return invalid(
                "vectors.url",
                format!(
                    "{:?} must be Qdrant's gRPC address, http:// or https://",
                    self.vectors.url
                ),
            );
        }
        Ok(())
    }

    /// API key → tenant pairs.
    pub fn api_keys(&self) -> Vec<(String, String)> {
        self.server
            .api_keys
            .iter()
            .filter_map(|k| k.split_once(':'))
            .map(|(k, t)| (k.to_string(), t.to_string()))
            .collect()
    }

    /// Dimension of the dense vectors: `embedder.model`'s (the hash embedder matches the
    /// default's 384). Services that only store vectors (graph-writer, consolidator) open their
    /// index with it.
    pub fn embedder_dim(&self) -> usize {
        match self.embedder.kind {
            EmbedderKind::Hash => 384,
            EmbedderKind::Minilm => embedder_model(&self.embedder.model).map_or(384, |m| m.dim),
        }
    }

    /// The late-interaction model `embedder.late_model` asks for: the one it names, or under
    /// `auto` the first of [`LATE_MODELS`] when the embedder is a model (`kind = "minilm"`; the
    /// hash embedder of tests and load runs has none); None when it is off.
    pub fn late_model(&self) -> Option<&'static str> {
        let name = self.embedder.late_model.as_str();
        if name == LATE_MODEL_AUTO {
            return (self.embedder.kind == EmbedderKind::Minilm).then_some(LATE_MODELS[0].0);
        }
        LATE_MODELS.iter().map(|&(n, _)| n).find(|n| *n == name)
    }

    /// Words of context each turn carries for the late-interaction model: none when it is off
    /// (the extractor then keeps no words in the conversation's state).
    pub fn late_context_words(&self) -> usize {
        self.late_model()
            .map_or(0, |_| self.embedder.late_context_words)
    }

    /// Whether `embedder.late_model` is `auto`: late interaction only where it can run.
    pub fn late_is_auto(&self) -> bool {
        self.embedder.late_model == LATE_MODEL_AUTO
    }

    /// Width of the token vectors [`Self::late_model`] gives; None when it is off.
    pub fn late_dim(&self) -> Option<usize> {
        let name = self.late_model()?;
        LATE_MODELS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, dim)| dim)
    }

    pub fn listen_addr(&self) -> SocketAddr {
        self.server.listen.parse().expect("validated at load")
    }

    /// The gRPC address, or None when gRPC is turned off.
    pub fn grpc_listen_addr(&self) -> Option<SocketAddr> {
        (!self.server.grpc_listen.is_empty())
            .then(|| self.server.grpc_listen.parse().expect("validated at load"))
    }
}

/// URI schemes neo4rs speaks: plain, TLS, TLS accepting any certificate; bolt (one server) or
/// neo4j (routing).
pub const BOLT_SCHEMES: [&str; 6] = [
    "bolt",
    "bolt+s",
    "bolt+ssc",
    "neo4j",
    "neo4j+s",
    "neo4j+ssc",
];

/// Tenants are path-safe names: they end up in keys and file names.
pub fn valid_tenant(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 64
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let s = Settings::defaults();
        s.validate().unwrap();
        assert_eq!(s.server.listen, "127.0.0.1:8080");
        assert_eq!(s.embedder.kind, EmbedderKind::Minilm);
    }

    #[test]
    fn bad_values_name_the_key() {
        let mut s = Settings::defaults();
        s.server.grpc_listen = "nowhere".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("server.grpc_listen"), "{e}");
        s.server.grpc_listen = String::new();
        assert!(s.validate().is_ok() && s.grpc_listen_addr().is_none());
        s.server.listen = "nowhere".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("server.listen"), "{e}");
        let mut s = Settings::defaults();
        s.server.api_keys = vec!["no-tenant".into()];
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("server.api_keys"));
    }

    #[test]
    fn limits_are_validated() {
        let mut s = Settings::defaults();
        s.server.max_in_flight = 0;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("server.max_in_flight"), "{e}");
        let mut s = Settings::defaults();
        s.server.max_text_bytes = s.server.max_body_bytes + 1;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("server.max_text_bytes"), "{e}");
        let mut s = Settings::defaults();
        s.server.rate_limit_burst = 0;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("server.rate_limit_burst"), "{e}");
        s.server.rate_limit_per_sec = 0;
        s.validate().unwrap();
    }

    #[test]
    fn llm_settings_are_checked_only_when_used() {
        let mut s = Settings::defaults();
        s.llm.base_url = "not a url".into();
        s.validate().unwrap();
        s.extractor.kind = ExtractorKind::Llm;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("llm.base_url"), "{e}");
        s.llm.base_url = "http://127.0.0.1:8000/v1".into();
        s.llm.model = " ".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("llm.model"), "{e}");
        s.llm.model = "qwen2.5-7b-instruct".into();
        s.validate().unwrap();
        let mut s = Settings::defaults();
        s.llm.base_url = "ftp://nope".into();
        s.consolidation.kind = ConsolidationKind::Llm;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("llm.base_url"), "{e}");
    }

    #[test]
    fn secrets_never_reach_debug_output() {
        let mut s = Settings::defaults();
        s.server.api_keys = vec![
            "sk-very-secret-1:tenant-a".into(),
            "sk-other-2:tenant-b".into(),
        ];
        s.graph.password = "hunter2-graph-password".into();
        s.llm.api_key = "sk-llm-secret-3".into();
        s.vectors.api_key = "qdrant-key-4".into();
        s.bus.sasl_password = "kafka-password-5".into();
        s.validate().unwrap();
        let out = format!(
            "{s:?} {s:#?} {:?} {:?} {:?} {:?} {:?}",
            s.server, s.graph, s.llm, s.vectors, s.bus
        );
        for secret in [
            "sk-very-secret-1",
            "sk-other-2",
            "hunter2-graph-password",
            "sk-llm-secret-3",
            "qdrant-key-4",
            "kafka-password-5",
        ] {
            assert!(!out.contains(secret), "{secret} leaked into Debug output");
        }
        assert!(
            out.contains("tenant-a") && out.contains("<redacted>"),
            "{out}"
        );
    }

    #[test]
    fn kafka_security_is_validated() {
        let mut s = Settings::defaults();
        s.bus.kind = BusKind::Kafka;
        s.validate().unwrap();
        s.bus.security_protocol = KafkaSecurityProtocol::SaslSsl;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("bus.sasl_username"), "{e}");
        s.bus.sasl_username = "recollect".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.contains("bus.sasl_password") && e.contains("RECOLLECT__BUS__SASL_PASSWORD"),
            "{e}"
        );
        s.bus.sasl_password = "pw".into();
        s.bus.ssl_ca_file = "/etc/recollect/ca/ca.crt".into();
        s.validate().unwrap();
        s.bus.security_protocol = KafkaSecurityProtocol::SaslPlaintext;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("bus.ssl_ca_file"), "{e}");
        s.bus.ssl_ca_file.clear();
        s.validate().unwrap();
        s.bus.security_protocol = KafkaSecurityProtocol::Ssl;
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.contains("bus.security_protocol"),
            "credentials never dropped: {e}"
        );
        // The in-process bus ignores all of it.
        s.bus.kind = BusKind::InProcess;
        s.validate().unwrap();
    }

    #[test]
    fn kafka_security_reads_from_files_and_names_bad_values() {
        let dir = std::env::temp_dir().join(format!("recollect-sasl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.toml");
        std::fs::write(
            &f,
            "[bus]\nkind = \"kafka\"\nsecurity_protocol = \"sasl_ssl\"\n\
             sasl_mechanism = \"SCRAM-SHA-512\"\nsasl_username = \"u\"\nsasl_password = \"p\"\n",
        )
        .unwrap();
        let s = Settings::load(Some(&f)).unwrap();
        assert_eq!(s.bus.security_protocol, KafkaSecurityProtocol::SaslSsl);
        assert_eq!(s.bus.sasl_mechanism, SaslMechanism::ScramSha512);
        assert_eq!(s.bus.sasl_mechanism.as_str(), "SCRAM-SHA-512");
        std::fs::write(&f, "[bus]\nsasl_mechanism = \"GSSAPI\"\n").unwrap();
        let e = Settings::load(Some(&f)).unwrap_err().to_string();
        assert!(e.contains("GSSAPI") && e.contains("sasl_mechanism"), "{e}");
    }

    #[test]
    fn store_uris_are_validated_where_used() {
        let mut s = Settings::defaults();
        s.graph.uri = "http://neo4j:7474".into();
        s.vectors.url = "qdrant:6334".into();
        s.validate().unwrap();
        s.graph.kind = GraphKind::Neo4j;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("graph.uri"), "{e}");
        for ok in BOLT_SCHEMES {
            s.graph.uri = format!("{ok}://neo4j.example:7687");
            s.validate().unwrap();
        }
        s.graph.ca_file = "/ca.pem".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.contains("graph.ca_file"),
            "ssc accepts any certificate: {e}"
        );
        s.graph.uri = "bolt+s://neo4j.example:7687".into();
        s.validate().unwrap();
        s.vectors.kind = VectorKind::Qdrant;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("vectors.url"), "{e}");
        s.vectors.url = "https://qdrant.example:6334".into();
        s.validate().unwrap();
    }

    #[test]
    fn the_otlp_endpoint_is_a_plain_http_base_url() {
        let mut s = Settings::defaults();
        assert_eq!(s.telemetry.otlp_traces_url(), None, "off by default");
        for (given, url) in [
            (
                "http://otel-collector:4318",
                "http://otel-collector:4318/v1/traces",
            ),
            ("http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces"),
            ("http://gw.example/otlp", "http://gw.example/otlp/v1/traces"),
            ("http://c:4318/v1/traces", "http://c:4318/v1/traces"),
        ] {
            s.telemetry.otlp_endpoint = given.into();
            s.validate().unwrap();
            assert_eq!(s.telemetry.otlp_traces_url().as_deref(), Some(url));
        }
        for (bad, says) in [
            ("otel-collector:4318", "scheme"),
            ("localhost", "not a URL"),
            ("https://collector.example:4318", "https is not supported"),
            ("grpc://c:4317", "not OTLP/HTTP"),
            ("http://user:pw@c:4318", "credentials"),
            ("http://c:4318/?x=1", "no query"),
        ] {
            s.telemetry.otlp_endpoint = bad.into();
            let e = s.validate().unwrap_err().to_string();
            assert!(
                e.contains("telemetry.otlp_endpoint") && e.contains(says),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn recall_defaults_are_the_constants_recall_always_used() {
        // Bit for bit the values recall's own defaults had before `[recall]` existed: the
        // LoCoMo figures depend on them.
        let r = Settings::defaults().recall;
        assert_eq!(r.keyword_neighbours, 30);
        assert_eq!(r.keyword_min_cosine.to_bits(), 0.45f32.to_bits());
        assert_eq!(r.fragments_expanded, 10);
        assert!(
            !r.path_c,
            "Path C measured as noise on LoCoMo: off by default"
        );
        let bits = |(a, b): (f32, f32)| (a.to_bits(), b.to_bits());
        assert_eq!(bits(r.factual_weights), bits((0.30, 0.50)));
        assert_eq!(bits(r.reasoning_weights), bits((0.60, 0.75)));
        assert_eq!(r.retrieve_depth, 100);
        assert_eq!(r.path_depth, 100);
        assert_eq!(r.lexical_weight.to_bits(), 0.3f32.to_bits());
        assert_eq!(r.neighbour_weight.to_bits(), 0.35f32.to_bits());
        assert_eq!(r.time_weight.to_bits(), 0.2f32.to_bits());
        assert_eq!(r.lexical_common_name_share.to_bits(), 0.5f32.to_bits());
        assert_eq!(
            (r.late_candidates, r.late_scan_max_turns),
            (100, 1000),
            "the late retriever: recall@30 0.937 -> 0.943 for ~2 ms of p50 (docs/EVALUATION.md)"
        );
        assert_eq!(
            r.late_shift,
            crate::LateShift {
                dense: -0.45,
                keyword: -0.35,
                lexical: -0.15,
                time: 0.1
            }
        );
        assert_eq!(RecallConfig::default(), r);
    }

    #[test]
    fn recall_keys_come_from_the_file_then_the_environment() {
        let dir = std::env::temp_dir().join(format!("recollect-recall-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.toml");
        std::fs::write(
            &f,
            "[recall]\nlexical_weight = 0.4\nfactual_weights = [0.2, 0.4]\nlate_shift = { dense = -0.3 }\n",
        )
        .unwrap();
        let s = Settings::load(Some(&f)).unwrap();
        assert_eq!(s.recall.lexical_weight, 0.4);
        assert_eq!(
            (s.recall.late_shift.dense, s.recall.late_shift.keyword),
            (-0.3, -0.35),
            "a table's key set alone, its other keys the defaults"
        );
        assert_eq!(s.recall.factual_weights, (0.2, 0.4));
        assert_eq!(s.recall.keyword_neighbours, 30);
        // Other tests load settings meanwhile: only keys no other test reads, valid values.
        std::env::set_var("RECOLLECT__RECALL__REASONING_WEIGHTS", "0.5,0.7");
        std::env::set_var("RECOLLECT__RECALL__FRAGMENTS_EXPANDED", "12");
        std::env::set_var("RECOLLECT__RECALL__LATE_SHIFT__TIME", "0.25");
        let s = Settings::load(Some(&f));
        std::env::remove_var("RECOLLECT__RECALL__REASONING_WEIGHTS");
        std::env::remove_var("RECOLLECT__RECALL__FRAGMENTS_EXPANDED");
        std::env::remove_var("RECOLLECT__RECALL__LATE_SHIFT__TIME");
        let s = s.unwrap();
        assert_eq!(s.recall.late_shift.time, 0.25);
        assert_eq!(s.recall.late_shift.dense, -0.3, "the file's value stays");
        assert_eq!(s.recall.reasoning_weights, (0.5, 0.7));
        assert_eq!(s.recall.fragments_expanded, 12);
        assert_eq!(s.recall.lexical_weight, 0.4, "the file's value stays");
        std::fs::write(&f, "[recall]\ntime_weight = -1\n").unwrap();
        let e = Settings::load(Some(&f)).unwrap_err().to_string();
        assert!(e.contains("recall.time_weight"), "{e}");
        // How c reads the fields: the mean unless a file says otherwise; anything else refused.
        assert_eq!(
            Settings::defaults().recall.field_cosine,
            crate::FieldCosine::Mean
        );
        std::fs::write(&f, "[recall]\nfield_cosine = \"max\"\n").unwrap();
        let s = Settings::load(Some(&f)).unwrap();
        assert_eq!(s.recall.field_cosine, crate::FieldCosine::Max);
        std::fs::write(&f, "[recall]\nfield_cosine = \"median\"\n").unwrap();
        let e = Settings::load(Some(&f)).unwrap_err().to_string();
        assert!(
            e.contains("median") && e.contains("recall.field_cosine"),
            "{e}"
        );
    }

    #[test]
    fn the_onnx_runtime_runs_minilm_and_e5_not_bge() {
        let mut s = Settings::defaults();
        assert_eq!(s.embedder.runtime, EmbedderRuntime::Auto);
        for model in EMBEDDER_MODELS {
            s.embedder.model = model.name.into();
            s.validate().unwrap();
        }
        s.embedder.runtime = EmbedderRuntime::Onnx;
        for model in EMBEDDER_MODELS.iter().filter(|m| m.on_onnx) {
            s.embedder.model = model.name.into();
            s.validate().unwrap();
        }
        s.embedder.model = "bge-small-en-v1.5".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.contains("embedder.runtime") && e.contains("multilingual-e5-small-enpt-q4"),
            "{e}"
        );
        // The int8 graphs and MPNet have no candle form.
        s.embedder.runtime = EmbedderRuntime::Candle;
        for model in [
            "all-MiniLM-L6-v2-int8",
            "all-mpnet-base-v2",
            "all-mpnet-base-v2-int8",
            "nomic-embed-text-v1.5",
        ] {
            s.embedder.model = model.into();
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains("embedder.model") && e.contains("onnx"), "{e}");
        }
    }

    #[test]
    fn embedder_model_is_one_of_the_known_models() {
        let mut s = Settings::defaults();
        assert_eq!(s.embedder.model, "all-MiniLM-L6-v2-int8");
        assert_eq!(s.embedder_dim(), 384);
        for m in EMBEDDER_MODELS {
            s.embedder.model = m.name.into();
            s.embedder.runtime = if m.on_candle {
                EmbedderRuntime::Candle
            } else {
                EmbedderRuntime::Onnx
            };
            s.validate().unwrap();
            assert_eq!(s.embedder_dim(), m.dim);
        }
        // The hash embedder's width, whatever the model setting says.
        s.embedder.kind = EmbedderKind::Hash;
        assert_eq!(s.embedder_dim(), 384);
        s.embedder.kind = EmbedderKind::Minilm;
        s.embedder.model = "bge-small".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.contains("embedder.model") && e.contains("multilingual-e5-small-q4"),
            "the error names the key and the choices: {e}"
        );
        // From a file, like any key (the environment layer is covered by the recall test).
        let dir = std::env::temp_dir().join(format!("recollect-embedder-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.toml");
        std::fs::write(&f, "[embedder]\nmodel = \"multilingual-e5-small-q4\"\n").unwrap();
        assert_eq!(
            Settings::load(Some(&f)).unwrap().embedder.model,
            "multilingual-e5-small-q4"
        );
        std::fs::write(&f, "[embedder]\nmodel = \"e5\"\n").unwrap();
        let e = Settings::load(Some(&f)).unwrap_err().to_string();
        assert!(e.contains("embedder.model"), "{e}");
    }

    #[test]
    fn recall_values_are_validated_by_key() {
        type Mutation = fn(&mut RecallConfig);
        let cases: [(Mutation, &str); 22] = [
            (|r| r.keyword_neighbours = 0, "recall.keyword_neighbours"),
            (|r| r.keyword_min_cosine = 1.5, "recall.keyword_min_cosine"),
            (|r| r.fragments_expanded = 5000, "recall.fragments_expanded"),
            (|r| r.factual_weights = (0.6, 0.5), "recall.factual_weights"),
            (
                |r| r.reasoning_weights = (0.6, 1.5),
                "recall.reasoning_weights",
            ),
            (|r| r.retrieve_depth = 0, "recall.retrieve_depth"),
            (|r| r.path_depth = 0, "recall.path_depth"),
            (|r| r.lexical_weight = f32::NAN, "recall.lexical_weight"),
            (
                |r| r.neighbour_weight = f32::INFINITY,
                "recall.neighbour_weight",
            ),
            (|r| r.time_weight = -0.1, "recall.time_weight"),
            (
                |r| r.lexical_common_name_share = 1.5,
                "recall.lexical_common_name_share",
            ),
            (
                |r| r.lexical_common_name_share = f32::NAN,
                "recall.lexical_common_name_share",
            ),
            (
                |r| r.rerank_model = "bge-reranker-large".into(),
                "recall.rerank_model",
            ),
            (|r| r.rerank_depth = 0, "recall.rerank_depth"),
            (|r| r.rerank_weight = -1.0, "recall.rerank_weight"),
            (|r| r.rerank_gap = -0.1, "recall.rerank_gap"),
            (|r| r.rerank_gap = f32::NAN, "recall.rerank_gap"),
            (|r| r.late_depth = 0, "recall.late_depth"),
            (|r| r.late_weight = f32::NAN, "recall.late_weight"),
            (|r| r.late_candidates = 1001, "recall.late_candidates"),
            (|r| r.late_shift.dense = -1.5, "recall.late_shift.dense"),
            (|r| r.late_shift.time = f32::NAN, "recall.late_shift.time"),
        ];
        for (mutate, key) in cases {
            let mut s = Settings::defaults();
            mutate(&mut s.recall);
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains(key), "{key}: {e}");
        }
        let mut s = Settings::defaults();
        // `auto`: the first late-interaction model, beside a sentence encoder only.
        assert!(s.late_is_auto());
        assert_eq!(s.late_model(), Some(LATE_MODELS[0].0));
        assert_eq!(s.late_dim(), Some(384));
        s.embedder.kind = EmbedderKind::Hash;
        assert_eq!((s.late_model(), s.late_dim()), (None, None));
        s.validate().unwrap();
        s.embedder.kind = EmbedderKind::Minilm;
        s.embedder.late_model = String::new();
        assert_eq!((s.late_model(), s.late_dim()), (None, None));
        s.embedder.late_model = "colbertv2.0".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("embedder.late_model"), "{e}");
        s.embedder.late_model = "answerai-colbert-small-v1-int8".into();
        assert!(!s.late_is_auto());
        assert_eq!(s.late_dim(), Some(384));
        assert_eq!(s.embedder.late_pool_factor, 2);
        for bad in [0, 9] {
            s.embedder.late_pool_factor = bad;
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains("embedder.late_pool_factor"), "{e}");
        }
        s.embedder.late_pool_factor = 1;
        assert_eq!(s.embedder.late_context_words, 50);
        s.embedder.late_context_words = 97;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("embedder.late_context_words"), "{e}");
        s.embedder.late_context_words = 0;
        s.recall.fragments_expanded = 0;
        s.recall.factual_weights = (0.4, 0.4);
        s.validate().unwrap();
    }

    #[test]
    fn file_overrides_defaults() {
        let dir = std::env::temp_dir().join(format!("recollect-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.toml");
        std::fs::write(&f, "[server]\nlisten = \"127.0.0.1:9999\"\n").unwrap();
        let s = Settings::load(Some(&f)).unwrap();
        assert_eq!(s.server.listen, "127.0.0.1:9999");
        assert_eq!(s.server.default_k, 30);
    }
}
