//! What every separately deployed service shares: settings from `--config`/env, the Kafka bus,
//! the stores, `/healthz` `/readyz` `/metrics`, and a shutdown that drains work in hand.
//! Service mains are a few lines on top of this; the embedded binary wires the same pieces
//! in one process.

// Every binary that starts from here (each service and the embedded binary) allocates through
// jemalloc rather than glibc's malloc: ~20 % less CPU a turn on ingest, a shorter recall tail,
// a smaller peak RSS (docs/SPEED.md, "jemalloc"). Declared once here, the one crate they all
// link, rather than in each main.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{MatchedPath, State};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use clap::Parser;
use recollect_bus::{run_stage, Bus, BusError, KafkaBus, KafkaSecurity, KafkaSettings, Stage};
use recollect_config::{BusKind, ConfigError, EmbedderKind, EmbedderRuntime, Settings};
use recollect_embed::{
    find_model_dir, model_dir_for, model_spec, BertEmbedder, Embedder, HashEmbedder,
    OnnxCrossEncoder, OnnxEmbedder, OnnxTokenEmbedder, Reranker, TokenEmbedder,
};
use recollect_model::{topics, TenantId};
use recollect_storage::{Graph, Scope, StoreError, VectorIndex};
use recollect_telemetry::events::{ComponentSelected, InternalEvent};
use recollect_telemetry::{self as telemetry, OtlpExport, TracingGuard};
use tokio::sync::watch;
use tower_http::trace::TraceLayer;
use tracing::Span;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Setup(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Telemetry(#[from] telemetry::TelemetryError),
}

/// Command line of every service: the config file, nothing else (env does the rest).
#[derive(Parser, Debug)]
pub struct ServiceArgs {
    /// Configuration file (TOML); RECOLLECT__SECTION__KEY variables override it.
    #[arg(long, env = "RECOLLECT_CONFIG")]
    pub config: Option<PathBuf>,
}

/// Loads and validates settings, starts logging (and the trace export, when configured) and
/// registers metrics for `service`. Keep the guard until the end of `main`: dropping it sends
/// the spans still buffered.
pub fn start(service: &'static str) -> Result<(Settings, TracingGuard), RuntimeError> {
    let args = ServiceArgs::parse();
    let settings = Settings::load(args.config.as_deref())?;
    settings.validate()?;
    let guard = init_tracing(&settings, &format!("recollect-{service}"))?;
    telemetry::register_all();
    ComponentSelected {
        seam: "service",
        kind: service,
    }
    .emit();
    tracing::info!(service, version = env!("CARGO_PKG_VERSION"), "starting");
    Ok((settings, guard))
}

/// Logs and, with `telemetry.otlp_endpoint` set, span export as `service` (its `service.name`).
pub fn init_tracing(settings: &Settings, service: &str) -> Result<TracingGuard, RuntimeError> {
    let t = &settings.telemetry;
    let otlp = t.otlp_traces_url().map(|traces_url| OtlpExport {
        traces_url,
        service: service.to_string(),
    });
    let guard = telemetry::init_tracing(&t.log_format, &t.log_level, otlp.as_ref())?;
    if let Some(o) = otlp.filter(|_| guard.exporting()) {
        tracing::info!(url = %o.traces_url, service, "exporting traces over OTLP");
    }
    Ok(guard)
}

/// Routes whose requests are probes and scrapes: traced at debug, so they neither fill the
/// logs at info nor send a trace every few seconds.
const OPS_ROUTES: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// One span per HTTP request (tower-http's `TraceLayer`), named by method and route pattern
/// (`POST /v1/recall`): never the raw URI, whose path and query carry conversation, memory and
/// user ids. The status is recorded on the span; 5xx marks it failed.
pub fn traced(router: Router) -> Router {
    router.layer(
        TraceLayer::new_for_http()
            .make_span_with(request_span)
            .on_response(
                |res: &Response, latency: std::time::Duration, span: &Span| {
                    let status = res.status().as_u16();
                    span.record("status", status);
                    if status >= 500 {
                        span.record("otel.status_code", "error");
                    }
                    tracing::debug!(
                        status,
                        latency_ms = latency.as_secs_f64() * 1e3,
                        "request finished"
                    );
                },
            )
            // Failures are the 5xx responses, logged by the handlers that made them and counted
            // in recollect_http_requests_total; a line per shed request would flood the log.
            .on_failure(()),
    )
}

fn request_span(req: &Request<Body>) -> Span {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str);
    let method = req.method().as_str();
    let name = format!("{method} {route}");
    if OPS_ROUTES.contains(&route) {
        tracing::debug_span!(
            "http.request",
            otel.name = name,
            otel.kind = "server",
            method,
            route,
            status = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        )
    } else {
        tracing::info_span!(
            "http.request",
            otel.name = name,
            otel.kind = "server",
            method,
            route,
            status = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        )
    }
}

/// The Kafka bus, with the topics created (brokers here have no auto-creation).
pub async fn open_bus(settings: &Settings, service: &str) -> Result<Arc<KafkaBus>, RuntimeError> {
    if settings.bus.kind != BusKind::Kafka {
        return Err(RuntimeError::Setup(
            "bus.kind = in_process only works inside `recollect serve`; set RECOLLECT__BUS__KIND=kafka and bus.brokers"
                .into(),
        ));
    }
    let bus = KafkaBus::connect(KafkaSettings {
        brokers: settings.bus.brokers.clone(),
        client_id: format!("recollect-{service}"),
        partitions: settings.bus.partitions,
        replication: settings.bus.replication,
        security: kafka_security(&settings.bus),
    })?;
    // The broker may still be starting (compose, Kubernetes): wait for it rather than crash-loop.
    let mut waited = 0;
    loop {
        match bus.ensure_topics(&topics::ALL).await {
            Ok(()) => break,
            Err(e) if waited < 60 => {
                tracing::warn!(error = %e, "brokers not ready, retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                waited += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
    ComponentSelected {
        seam: "bus",
        kind: "kafka",
    }
    .emit();
    Ok(bus)
}

/// The bus settings' TLS and SASL part, as the Kafka client takes it.
pub fn kafka_security(bus: &recollect_config::BusSettings) -> KafkaSecurity {
    KafkaSecurity {
        protocol: bus.security_protocol.as_str().into(),
        sasl_mechanism: bus.sasl_mechanism.as_str().into(),
        sasl_username: bus.sasl_username.clone(),
        sasl_password: bus.sasl_password.clone(),
        ssl_ca_file: bus.ssl_ca_file.clone(),
    }
}

/// The ONNX Runtime library `embedder.onnx_runtime` names, else where `scripts/setup-onnx.sh`
/// puts it (the embedder's and the cross-encoder's).
fn onnx_runtime_library(settings: &Settings) -> PathBuf {
    if settings.embedder.onnx_runtime.is_empty() {
        recollect_embed::default_onnx_runtime_path()
    } else {
        settings.embedder.onnx_runtime.clone().into()
    }
}

/// The embedder the config names (the model is loaded once per process).
pub fn load_embedder(settings: &Settings) -> Result<Arc<dyn Embedder>, RuntimeError> {
    let e: Arc<dyn Embedder> = match settings.embedder.kind {
        EmbedderKind::Minilm => {
            let name = settings.embedder.model.as_str();
            let spec = model_spec(name).ok_or_else(|| {
                RuntimeError::Setup(format!("embedder.model {name:?} is not a known model"))
            })?;
            let dir = if settings.embedder.model_dir.is_empty() {
                model_dir_for(spec.dir)
            } else {
                settings.embedder.model_dir.clone().into()
            };
            let lib = onnx_runtime_library(settings);
            let auto = settings.embedder.runtime == EmbedderRuntime::Auto;
            // What candle runs where ONNX Runtime does not: the model, or under `auto` its
            // stand-in (MiniLM's f32 weights for its int8 graph).
            let on_candle = if spec.on_candle {
                Some(spec)
            } else {
                spec.candle_stand_in.filter(|_| auto)
            };
            let on_onnx = match settings.embedder.runtime {
                EmbedderRuntime::Onnx => true,
                EmbedderRuntime::Candle => false,
                EmbedderRuntime::Auto => spec.onnx_graph.is_some(),
            };
            let onnx = if on_onnx {
                match OnnxEmbedder::load_model(&dir, &lib, spec) {
                    Ok(e) => Some(e),
                    // Candle's vectors equal ONNX Runtime's, so falling back changes no result.
                    Err(e) if auto && on_candle.is_some() => {
                        tracing::info!(
                            model = name,
                            reason = %e,
                            "ONNX Runtime not available; embedder.runtime = auto runs the model on candle"
                        );
                        None
                    }
                    Err(e) => {
                        return Err(RuntimeError::Setup(format!(
                        "loading {name} for ONNX Runtime from {}: {e} (run scripts/setup-onnx.sh)",
                        dir.display()
                    )))
                    }
                }
            } else {
                None
            };
            if let Some(onnx) = onnx {
                Arc::new(onnx)
            } else if let Some(spec) = on_candle {
                if spec.name != name {
                    tracing::info!(
                        model = name,
                        "ONNX Runtime not available; embedder.runtime = auto runs {} on candle",
                        spec.name
                    );
                }
                let hint = if spec.installed_by_setup {
                    format!("run `RECOLLECT_EMBED_MODEL={name} make setup` or scripts/setup-model.sh {name}")
                } else {
                    format!(
                        "setup cannot install {name}: put its files there or set embedder.model_dir"
                    )
                };
                Arc::new(BertEmbedder::load_model(&dir, spec).map_err(|e| {
                    RuntimeError::Setup(format!(
                        "loading the {name} model from {}: {e} ({hint})",
                        dir.display()
                    ))
                })?)
            } else {
                return Err(RuntimeError::Setup(format!(
                    "{name} runs on ONNX Runtime only: set embedder.runtime = \"onnx\" or \"auto\""
                )));
            }
        }
        EmbedderKind::Hash => Arc::new(HashEmbedder::new(recollect_embed::HASH_DIM)),
    };
    ComponentSelected {
        seam: "embedder",
        kind: e.model_name(),
    }
    .emit();
    Ok(e)
}

/// The cross-encoder `recall.rerank_model` names (none when it is empty), on the ONNX Runtime
/// library the embedder settings name. A named model that does not load stops the start: a
/// deployment that asked for it would otherwise serve another ranking than it measured.
pub fn load_reranker(settings: &Settings) -> Result<Option<Arc<dyn Reranker>>, RuntimeError> {
    let name = settings.recall.rerank_model.as_str();
    if name.is_empty() {
        return Ok(None);
    }
    let spec = recollect_embed::reranker_spec(name).ok_or_else(|| {
        RuntimeError::Setup(format!(
            "recall.rerank_model {name:?} is not a known cross-encoder"
        ))
    })?;
    // Not model_dir_for: $RECOLLECT_MODEL_DIR names the embedder's directory (the image sets it).
    let dir: PathBuf = if settings.recall.rerank_model_dir.is_empty() {
        find_model_dir(spec.dir)
    } else {
        settings.recall.rerank_model_dir.clone().into()
    };
    let lib = onnx_runtime_library(settings);
    let r = OnnxCrossEncoder::load(&dir, &lib, spec).map_err(|e| {
        RuntimeError::Setup(format!(
            "loading the cross-encoder {name} from {}: {e} (run scripts/setup-model.sh {name} and scripts/setup-onnx.sh)",
            dir.display()
        ))
    })?;
    ComponentSelected {
        seam: "reranker",
        kind: spec.name,
    }
    .emit();
    Ok(Some(Arc::new(r)))
}

/// The late-interaction model `embedder.late_model` names (none when it is empty), on the ONNX
/// Runtime library the embedder settings name. Loaded by the embedder (turns' token vectors)
/// and by recall (the question's). A named model that does not load stops the start; under
/// `auto` (the default) one that does not load (not installed, no ONNX Runtime) is left off.
pub fn load_token_embedder(
    settings: &Settings,
) -> Result<Option<Arc<dyn TokenEmbedder>>, RuntimeError> {
    let name = settings.embedder.late_model.as_str();
    let Some(model) = settings.late_model() else {
        if !name.is_empty() && !settings.late_is_auto() {
            return Err(RuntimeError::Setup(format!(
                "embedder.late_model {name:?} is not a known late-interaction model"
            )));
        }
        return Ok(None);
    };
    let spec = recollect_embed::token_model_spec(model).ok_or_else(|| {
        RuntimeError::Setup(format!(
            "embedder.late_model {model:?} is not a known late-interaction model"
        ))
    })?;
    // Not model_dir_for: $RECOLLECT_MODEL_DIR names the sentence encoder's directory.
    let dir: PathBuf = if settings.embedder.late_model_dir.is_empty() {
        find_model_dir(spec.dir)
    } else {
        settings.embedder.late_model_dir.clone().into()
    };
    let lib = onnx_runtime_library(settings);
    let m = match OnnxTokenEmbedder::load(&dir, &lib, spec) {
        Ok(m) => m,
        Err(e) if settings.late_is_auto() => {
            tracing::info!(
                model = model,
                reason = %e,
                "late interaction is off: embedder.late_model = auto and {model} does not load \
                 (scripts/setup-model.sh {model} and scripts/setup-onnx.sh install it)"
            );
            return Ok(None);
        }
        Err(e) => {
            return Err(RuntimeError::Setup(format!(
                "loading the late-interaction model {model} from {}: {e} (run scripts/setup-model.sh {model} and scripts/setup-onnx.sh)",
                dir.display()
            )))
        }
    };
    ComponentSelected {
        seam: "token_embedder",
        kind: spec.name,
    }
    .emit();
    Ok(Some(Arc::new(m)))
}

/// The token embedder recall uses with `vectors`: none when `embedder.late_model = "auto"` and
/// the index was made without token vectors (there is nothing to score the question against).
pub fn token_embedder_for(
    settings: &Settings,
    tokens: Option<Arc<dyn TokenEmbedder>>,
    vectors: &dyn VectorIndex,
) -> Option<Arc<dyn TokenEmbedder>> {
    tokens.filter(|_| !(settings.late_is_auto() && vectors.holds_token_vectors() == Some(false)))
}

/// A readiness probe: named checks, each true when its dependency answers.
pub type Check = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

pub fn bus_check(bus: Arc<KafkaBus>) -> (&'static str, Check) {
    (
        "bus",
        Arc::new(move || {
            let b = bus.clone();
            Box::pin(async move { b.ping().await })
        }),
    )
}

/// The graph answers a read (any tenant will do): one index lookup, where listing a tenant's
/// conversations would read every turn of it on a server graph at each probe.
pub fn graph_check(graph: Arc<dyn Graph>) -> (&'static str, Check) {
    (
        "graph",
        Arc::new(move || {
            let g = graph.clone();
            Box::pin(async move {
                g.known_conversations(&TenantId::default_tenant(), &[String::new()])
                    .await
                    .is_ok()
            })
        }),
    )
}

pub fn vectors_check(vectors: Arc<dyn VectorIndex>) -> (&'static str, Check) {
    (
        "vectors",
        Arc::new(move || {
            let v = vectors.clone();
            Box::pin(async move {
                v.count(&TenantId::default_tenant(), &Scope::all())
                    .await
                    .is_ok()
            })
        }),
    )
}

#[derive(Clone)]
struct Probes(Arc<Vec<(&'static str, Check)>>);

async fn healthz() -> &'static str {
    "ok"
}

/// Ready only when every dependency answers; the body says which does not.
async fn readyz(State(p): State<Probes>) -> Response {
    let mut failing = Vec::new();
    for (name, check) in p.0.iter() {
        if !check().await {
            failing.push(*name);
        }
    }
    if failing.is_empty() {
        (StatusCode::OK, "ready").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {} not answering", failing.join(", ")),
        )
            .into_response()
    }
}

async fn metrics_text() -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        telemetry::render(),
    )
}

/// `/healthz`, `/readyz` (the given checks) and `/metrics`.
pub fn ops_router(checks: Vec<(&'static str, Check)>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz).with_state(Probes(Arc::new(checks))))
        .route("/metrics", get(metrics_text))
}

/// Flips to true on SIGTERM or Ctrl-C.
pub fn shutdown_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        #[cfg(unix)]
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => futures::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let term = futures::future::pending::<()>();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term => {}
        }
        tracing::info!("shutting down: finishing work in hand");
        let _ = tx.send(true);
    });
    rx
}

/// Writes the bound addresses to `server.address_file` (when set) in one rename, so a reader
/// never sees half a file: how a process asked to listen on port 0 says which port it got.
pub fn report_addresses(
    settings: &Settings,
    http: SocketAddr,
    grpc: Option<SocketAddr>,
) -> std::io::Result<()> {
    if settings.server.address_file.is_empty() {
        return Ok(());
    }
    let path = std::path::Path::new(&settings.server.address_file);
    let body = serde_json::json!({
        "http": http.to_string(),
        "grpc": grpc.map(|a| a.to_string()),
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, body.to_string())?;
    std::fs::rename(&tmp, path)
}

/// Serves `router` on `server.listen` until shutdown. Services without API keys stay on
/// loopback unless they serve no API (`api = false`: workers expose only ops endpoints).
pub async fn serve_http(
    settings: &Settings,
    router: Router,
    api: bool,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), RuntimeError> {
    let addr: SocketAddr = settings.listen_addr();
    if api && settings.api_keys().is_empty() && !addr.ip().is_loopback() {
        return Err(RuntimeError::Setup(format!(
            "no API keys are configured, so the API would be open to anyone: it only listens on loopback in that mode. \
             Set RECOLLECT_API_KEYS=\"key:tenant\" to listen on {addr}"
        )));
    }
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    report_addresses(settings, bound, None)?;
    tracing::info!(addr = %bound, "listening");
    axum::serve(listener, traced(router))
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|s| *s).await;
        })
        .await?;
    Ok(())
}

/// Runs pipeline stages on the bus with the ops endpoints beside them, until shutdown; each
/// stage finishes (publishes and commits) the batch in hand before returning.
pub async fn run_workers(
    settings: &Settings,
    bus: Arc<dyn Bus>,
    stages: Vec<Arc<dyn Stage>>,
    checks: Vec<(&'static str, Check)>,
) -> Result<(), RuntimeError> {
    let shutdown = shutdown_signal();
    let mut handles = Vec::new();
    for s in stages {
        let group = format!("{}-{}", settings.bus.group_prefix, s.name());
        handles.push(tokio::spawn(run_stage(
            bus.clone(),
            s,
            group,
            shutdown.clone(),
        )));
    }
    let http = tokio::spawn({
        let settings = settings.clone();
        let shutdown = shutdown.clone();
        async move { serve_http(&settings, ops_router(checks), false, shutdown).await }
    });
    for h in handles {
        match h.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e.into()),
            Err(e) => return Err(RuntimeError::Setup(format!("stage task failed: {e}"))),
        }
    }
    http.abort();
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod kafka_security_tests {
    use super::*;
    use recollect_config::{KafkaSecurityProtocol, SaslMechanism};

    #[test]
    fn bus_settings_become_librdkafka_properties() {
        let mut s = Settings::defaults();
        assert_eq!(
            kafka_security(&s.bus).client_entries(),
            vec![("security.protocol", "plaintext".to_string())]
        );
        s.bus.security_protocol = KafkaSecurityProtocol::SaslSsl;
        s.bus.sasl_mechanism = SaslMechanism::ScramSha256;
        s.bus.sasl_username = "svc-recollect".into();
        s.bus.sasl_password = "pw".into();
        s.bus.ssl_ca_file = "/etc/recollect/ca/ca.crt".into();
        let entries = kafka_security(&s.bus).client_entries();
        let get = |k: &str| {
            entries
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(get("sasl.mechanism"), Some("SCRAM-SHA-256"));
        assert_eq!(get("sasl.username"), Some("svc-recollect"));
        assert_eq!(get("sasl.password"), Some("pw"));
        assert_eq!(get("ssl.ca.location"), Some("/etc/recollect/ca/ca.crt"));
    }
}

#[cfg(test)]
mod embedder_tests {
    use super::*;

    #[test]
    fn the_settings_list_of_models_is_the_embedders() {
        // Name, width and runtimes, in the same order.
        let config: Vec<_> = recollect_config::EMBEDDER_MODELS
            .iter()
            .map(|m| (m.name, m.dim, m.on_onnx, m.on_candle))
            .collect();
        let embed: Vec<_> = recollect_embed::MODELS
            .iter()
            .map(|m| (m.name, m.dim, m.onnx_graph.is_some(), m.on_candle))
            .collect();
        assert_eq!(
            config, embed,
            "recollect-config's EMBEDDER_MODELS and recollect-embed's MODELS must agree"
        );
        assert_eq!(
            Settings::defaults().embedder.model,
            recollect_embed::DEFAULT_MODEL
        );
    }

    #[test]
    fn the_settings_list_of_cross_encoders_is_the_embed_crates() {
        let embed: Vec<_> = recollect_embed::RERANKERS.iter().map(|r| r.name).collect();
        assert_eq!(recollect_config::RERANK_MODELS.to_vec(), embed);
        assert!(
            Settings::defaults().recall.rerank_model.is_empty(),
            "off by default"
        );
        assert!(load_reranker(&Settings::defaults()).unwrap().is_none());
    }

    #[test]
    fn the_settings_list_of_late_interaction_models_is_the_embed_crates() {
        let embed: Vec<_> = recollect_embed::TOKEN_MODELS
            .iter()
            .map(|m| (m.name, m.dim))
            .collect();
        assert_eq!(recollect_config::LATE_MODELS.to_vec(), embed);
        // `auto` (the default): a model that does not load leaves late interaction off; the
        // hash embedder never has it; empty is off.
        let mut s = Settings::defaults();
        assert!(s.late_is_auto());
        s.embedder.late_model_dir = "/nonexistent/late".into();
        assert!(load_token_embedder(&s).unwrap().is_none());
        s.embedder.kind = recollect_config::EmbedderKind::Hash;
        assert!(load_token_embedder(&s).unwrap().is_none());
        s.embedder.kind = recollect_config::EmbedderKind::Minilm;
        s.embedder.late_model.clear();
        assert!(load_token_embedder(&s).unwrap().is_none());
        // Named, it must load.
        s.embedder.late_model = "answerai-colbert-small-v1-int8".into();
        s.embedder.late_model_dir = "/nonexistent/late".into();
        let err = load_token_embedder(&s)
            .err()
            .expect("nothing there")
            .to_string();
        assert!(err.contains("/nonexistent/late"), "{err}");
        assert!(
            err.contains("setup-model.sh answerai-colbert-small-v1-int8"),
            "{err}"
        );
    }

    #[test]
    fn the_cross_encoder_is_loaded_from_its_own_directory() {
        let mut s = Settings::defaults();
        s.recall.rerank_model = "ms-marco-MiniLM-L-12-v2-int8".into();
        // The embedder's directory (where $RECOLLECT_MODEL_DIR points in the image) is not it.
        s.embedder.model_dir = "/opt/embedder".into();
        s.recall.rerank_model_dir = "/nonexistent/reranker".into();
        let err = load_reranker(&s).err().expect("nothing there").to_string();
        assert!(err.contains("/nonexistent/reranker"), "{err}");
        assert!(
            err.contains("setup-model.sh ms-marco-MiniLM-L-12-v2-int8"),
            "{err}"
        );
        // Unset, it is looked up by its own name, never under the embedder's.
        assert!(find_model_dir("ms-marco-MiniLM-L-12-v2-int8")
            .ends_with("models/ms-marco-MiniLM-L-12-v2-int8"));
    }

    #[test]
    fn auto_runs_onnx_where_it_is_installed_and_candle_elsewhere() {
        let dir = model_dir_for(recollect_embed::MINILM.dir);
        if !dir.join("model.safetensors").is_file() {
            eprintln!("SKIPPED: no MiniLM in {} (run make setup)", dir.display());
            return;
        }
        let mut s = Settings::defaults();
        assert_eq!(s.embedder.runtime, EmbedderRuntime::Auto);
        // No ONNX Runtime library there: the same model on candle.
        s.embedder.onnx_runtime = "/nonexistent/libonnxruntime.so".into();
        let e = load_embedder(&s).unwrap();
        assert_eq!(
            (e.model_name(), e.runtime()),
            ("all-MiniLM-L6-v2", "candle")
        );
        // Asked for explicitly, a missing runtime is an error that says how to install it.
        s.embedder.runtime = EmbedderRuntime::Onnx;
        let err = load_embedder(&s)
            .err()
            .expect("no runtime there")
            .to_string();
        assert!(err.contains("setup-onnx.sh"), "{err}");
        // MiniLM's int8 graph (the default model) falls back to the f32 weights it was made
        // from; another int8 graph has no candle form to fall back to.
        s.embedder.runtime = EmbedderRuntime::Auto;
        s.embedder.model = "all-MiniLM-L6-v2-int8".into();
        let e = load_embedder(&s).unwrap();
        assert_eq!(
            (e.model_name(), e.runtime()),
            ("all-MiniLM-L6-v2", "candle")
        );
        s.embedder.model = "all-mpnet-base-v2-int8".into();
        let err = load_embedder(&s)
            .err()
            .expect("no runtime there")
            .to_string();
        assert!(err.contains("setup-onnx.sh"), "{err}");
        s.embedder.model = "all-MiniLM-L6-v2".into();
        // Installed (make test sets it up on Linux x86_64): ONNX Runtime.
        let lib = recollect_embed::default_onnx_runtime_path();
        if lib.is_file() && dir.join(recollect_embed::ONNX_MODEL_FILE).is_file() {
            let e = load_embedder(&Settings::defaults()).unwrap();
            assert_eq!(
                (e.model_name(), e.runtime()),
                ("all-MiniLM-L6-v2-int8", "onnx")
            );
        } else {
            eprintln!(
                "SKIPPED the installed case: no {} (run scripts/setup-onnx.sh)",
                lib.display()
            );
        }
        // Here, not in a test of its own: the first ONNX Runtime library a process loads is the
        // one it keeps, so a test loading the real one would hide the missing one above.
        #[cfg(unix)]
        auto_runs_e5_on_onnx_runtime_with_its_graph_and_on_candle_without();
    }

    #[cfg(unix)]
    fn auto_runs_e5_on_onnx_runtime_with_its_graph_and_on_candle_without() {
        let spec = recollect_embed::E5_SMALL_ENPT_Q4;
        let dir = model_dir_for(spec.dir);
        let lib = recollect_embed::default_onnx_runtime_path();
        let graph = spec.onnx_graph.expect("E5 has a graph");
        if !dir.join(graph).is_file() || !lib.is_file() {
            eprintln!(
                "SKIPPED: no {graph} in {} or no {} (make test sets them up)",
                dir.display(),
                lib.display()
            );
            return;
        }
        let mut s = Settings::defaults();
        s.embedder.model = spec.name.into();
        let e = load_embedder(&s).unwrap();
        assert_eq!((e.model_name(), e.runtime()), (spec.name, "onnx"));
        assert!(e.is_asymmetric(), "E5's prefixes go with it");
        // A model directory with the weights and no graph (installed before graphs existed).
        let bare = tempfile::tempdir().unwrap();
        for f in ["model.safetensors", "tokenizer.json", "config.json"] {
            std::os::unix::fs::symlink(dir.join(f), bare.path().join(f)).unwrap();
        }
        s.embedder.model_dir = bare.path().display().to_string();
        let e = load_embedder(&s).unwrap();
        assert_eq!((e.model_name(), e.runtime()), (spec.name, "candle"));
        s.embedder.runtime = EmbedderRuntime::Onnx;
        let err = load_embedder(&s).err().expect("no graph there").to_string();
        assert!(err.contains("setup-onnx.sh"), "{err}");
    }

    #[test]
    fn a_missing_model_directory_is_reported_with_the_model_and_the_fix() {
        let mut s = Settings::defaults();
        s.embedder.model = "multilingual-e5-small-q4".into();
        s.embedder.model_dir = "/nonexistent/recollect-model".into();
        let e = load_embedder(&s).err().expect("no model there").to_string();
        assert!(
            e.contains("multilingual-e5-small-q4") && e.contains("setup-model.sh"),
            "{e}"
        );
        s.embedder.model = "bge-small-en-v1.5".into();
        let e = load_embedder(&s).err().expect("no model there").to_string();
        assert!(e.contains("setup cannot install"), "{e}");
    }
}
