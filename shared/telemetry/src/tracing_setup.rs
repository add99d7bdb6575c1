//! The process's `tracing` subscriber: log lines (text or JSON) on stderr and, when an OTLP
//! endpoint is configured, spans exported to it over OTLP/HTTP (protobuf).
//!
//! Each output has its own filter: the log level (or `RUST_LOG`) decides what is written, and
//! the export takes Recollect's spans at info and above whatever the log level is, so turning
//! logs down to `warn` does not empty the traces.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTLP trace export to {url}: {message}")]
    Otlp { url: String, message: String },
}

/// Where and as whom spans are exported.
#[derive(Debug, Clone)]
pub struct OtlpExport {
    /// The full URL spans are POSTed to, e.g. `http://otel-collector:4318/v1/traces`.
    pub traces_url: String,
    /// `service.name` of every exported span (`recollect`, `recollect-gateway`, …).
    pub service: String,
}

/// Keeps the span exporter running; dropping it sends what is still buffered (at most a few
/// seconds of spans, or they would be lost at every restart).
#[must_use = "dropping the guard stops the trace export"]
pub struct TracingGuard {
    provider: Option<SdkTracerProvider>,
}

impl TracingGuard {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for TracingGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            if let Err(e) = p.shutdown() {
                tracing::warn!(error = %e, "flushing the trace export failed");
            }
        }
    }
}

/// Spans the export takes: Recollect's own (every crate is `recollect_*` or `recollect`) and the
/// HTTP request spans of tower-http, at info and above. Dependencies' spans stay out: the
/// exporter's own HTTP client would otherwise trace itself.
fn export_filter() -> Targets {
    Targets::new()
        .with_target("recollect", LevelFilter::INFO)
        .with_target("tower_http", LevelFilter::INFO)
}

/// Installs the subscriber: logs in `format` (`text` or `json`) at `level` (`RUST_LOG` wins),
/// and the span export when `otlp` is given. A second call leaves the first subscriber in place
/// (tests start several servers in one process).
pub fn init_tracing(
    format: &str,
    level: &str,
    otlp: Option<&OtlpExport>,
) -> Result<TracingGuard, TelemetryError> {
    // qdrant-edge warns "Feature flags not initialized!" on every segment it opens: server-only
    // flags that do not apply to the embedded engine.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{level},qdrant_edge::common::flags=error")));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = if format == "json" {
        logs.json().flatten_event(true).boxed()
    } else {
        logs.boxed()
    }
    .with_filter(filter);
    let (export, provider) = match otlp {
        None => (None, None),
        Some(o) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(o.traces_url.clone())
                .build()
                .map_err(|e| TelemetryError::Otlp {
                    url: o.traces_url.clone(),
                    message: e.to_string(),
                })?;
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    Resource::builder()
                        .with_service_name(o.service.clone())
                        .build(),
                )
                .build();
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("recollect"))
                .with_filter(export_filter());
            (Some(layer), Some(provider))
        }
    };
    let installed = Registry::default()
        .with(logs)
        .with(export)
        .try_init()
        .is_ok();
    Ok(TracingGuard {
        // A subscriber installed earlier keeps running; this exporter would never see a span.
        provider: if installed { provider } else { None },
    })
}
