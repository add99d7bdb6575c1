//! Metrics and logs. Every metric Recollect exports is declared here, so the whole set reads in
//! one place; names follow `recollect_<subsystem>_<name>_<unit>` and labels take values from
//! small fixed sets only (stage, outcome, reason, path), never tenant ids or text.

use once_cell::sync::Lazy;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

pub static REGISTRY: Lazy<Registry> = Lazy::new(Registry::new);

fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    REGISTRY
        .register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

fn gauge(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    REGISTRY
        .register(Box::new(g.clone()))
        .expect("metric registered once");
    g
}

fn histogram(name: &str, help: &str, labels: &[&str], buckets: Vec<f64>) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        .expect("valid metric");
    REGISTRY
        .register(Box::new(h.clone()))
        .expect("metric registered once");
    h
}

fn latency_buckets() -> Vec<f64> {
    vec![
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ]
}

/// Turns accepted at the edge, and rejected by reason (empty_text, too_large, bad_timestamp, …).
pub static TURNS_ACCEPTED: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_gateway_turns_accepted_total",
        "turns accepted",
        &[],
    )
});
pub static TURNS_REJECTED: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_gateway_turns_rejected_total",
        "turns rejected by reason",
        &["reason"],
    )
});
/// Messages a pipeline stage finished, by outcome (ok, retried, dlq).
pub static STAGE_MESSAGES: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_pipeline_messages_total",
        "messages handled per stage and outcome",
        &["stage", "outcome"],
    )
});
pub static STAGE_RETRIES: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_pipeline_retries_total",
        "handler retries per stage",
        &["stage"],
    )
});
pub static STAGE_LATENCY: Lazy<HistogramVec> = Lazy::new(|| {
    histogram(
        "recollect_pipeline_batch_duration_seconds",
        "time to handle one batch, per stage",
        &["stage"],
        latency_buckets(),
    )
});
/// Messages waiting per topic (in-process queue depth, or Kafka consumer lag per partition).
pub static CONSUMER_LAG: Lazy<IntGaugeVec> = Lazy::new(|| {
    gauge(
        "recollect_bus_consumer_lag_messages",
        "messages not yet consumed, per topic and partition",
        &["topic", "partition"],
    )
});
pub static STORE_WRITE_LATENCY: Lazy<HistogramVec> = Lazy::new(|| {
    histogram(
        "recollect_store_write_duration_seconds",
        "store write latency per adapter",
        &["adapter"],
        latency_buckets(),
    )
});
pub static STORE_ERRORS: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_store_errors_total",
        "store errors per adapter",
        &["adapter"],
    )
});
pub static RECALL_LATENCY: Lazy<HistogramVec> = Lazy::new(|| {
    histogram(
        "recollect_recall_duration_seconds",
        "recall latency by phase (total, analyse, path_b, path_c, dense, lexical, score)",
        &["path"],
        latency_buckets(),
    )
});
pub static RECALL_CANDIDATES: Lazy<HistogramVec> = Lazy::new(|| {
    histogram(
        "recollect_recall_candidates_count",
        "candidates found per path",
        &["path"],
        vec![0.0, 1.0, 5.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0],
    )
});
pub static RECALL_EMPTY: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_recall_empty_results_total",
        "recalls with no result",
        &[],
    )
});
pub static EMBED_BATCH_SIZE: Lazy<HistogramVec> = Lazy::new(|| {
    histogram(
        "recollect_embedder_batch_size_texts",
        "texts per embedding batch",
        &["kind"],
        vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
    )
});
pub static EMBED_LATENCY: Lazy<HistogramVec> = Lazy::new(|| {
    histogram(
        "recollect_embedder_batch_duration_seconds",
        "time per embedding batch",
        &["kind"],
        latency_buckets(),
    )
});
pub static HTTP_REQUESTS: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_http_requests_total",
        "HTTP requests by route and status class",
        &["route", "status"],
    )
});
pub static GRPC_REQUESTS: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_grpc_requests_total",
        "gRPC calls by method and status code",
        &["method", "code"],
    )
});
pub static COMPONENT_INFO: Lazy<IntGaugeVec> = Lazy::new(|| {
    gauge(
        "recollect_component_info",
        "which implementation runs behind each seam (value 1)",
        &["seam", "kind"],
    )
});
pub static BUILD_INFO: Lazy<IntGaugeVec> = Lazy::new(|| {
    gauge(
        "recollect_build_info",
        "build information (value 1)",
        &["version"],
    )
});

/// Touch every metric so a scrape shows the whole family set from the first second.
/// Requests turned away before any work: rate_limited (429) or overloaded (503).
pub static HTTP_SHED: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_http_shed_requests_total",
        "requests refused by the rate limit or the in-flight bound",
        &["reason"],
    )
});

pub fn register_all() {
    Lazy::force(&HTTP_SHED);
    Lazy::force(&TURNS_ACCEPTED);
    Lazy::force(&TURNS_REJECTED);
    Lazy::force(&STAGE_MESSAGES);
    Lazy::force(&STAGE_RETRIES);
    Lazy::force(&STAGE_LATENCY);
    Lazy::force(&CONSUMER_LAG);
    Lazy::force(&STORE_WRITE_LATENCY);
    Lazy::force(&STORE_ERRORS);
    Lazy::force(&RECALL_LATENCY);
    Lazy::force(&RECALL_CANDIDATES);
    Lazy::force(&RECALL_EMPTY);
    Lazy::force(&EMBED_BATCH_SIZE);
    Lazy::force(&EMBED_LATENCY);
    Lazy::force(&HTTP_REQUESTS);
    Lazy::force(&GRPC_REQUESTS);
    Lazy::force(&COMPONENT_INFO);
    BUILD_INFO
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
    TURNS_ACCEPTED.with_label_values(&[] as &[&str]).inc_by(0);
    RECALL_EMPTY.with_label_values(&[] as &[&str]).inc_by(0);
}

/// Prometheus text exposition of every registered metric.
pub fn render() -> String {
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&REGISTRY.gather(), &mut buf)
        .expect("text encoding cannot fail");
    String::from_utf8(buf).expect("prometheus text is utf-8")
}

/// Logs: `RUST_LOG` wins over the configured level; `json` for log shippers.
pub fn init_tracing(format: &str, level: &str) {
    use tracing_subscriber::EnvFilter;
    // qdrant-edge warns "Feature flags not initialized!" on every segment it opens: server-only
    // flags that do not apply to the embedded engine.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{level},qdrant_edge::common::flags=error")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if format == "json" {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_exported_with_the_naming_rule() {
        register_all();
        STAGE_MESSAGES.with_label_values(&["extractor", "ok"]).inc();
        let text = render();
        for name in [
            "recollect_pipeline_messages_total",
            "recollect_build_info",
            "recollect_gateway_turns_accepted_total",
        ] {
            assert!(text.contains(name), "{name} missing");
        }
        for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
            assert!(
                line.split(' ').nth(2).unwrap().starts_with("recollect_"),
                "{line}"
            );
        }
    }
}
