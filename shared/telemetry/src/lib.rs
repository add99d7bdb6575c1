//! Metrics, logs and traces. Every metric Recollect exports is declared here, so the whole set
//! reads in one place; names follow `recollect_<subsystem>_<name>_<unit>` and labels take values
//! from small fixed sets only (stage, outcome, reason, path, backend, op), never tenant ids or
//! text. The metrics are private to this crate: code elsewhere emits a typed event
//! ([`events`]), which writes one log line and updates its metrics, so a family is fed the
//! same way from every place that reports it.

pub mod events;
mod tracing_setup;

pub use tracing_setup::{init_tracing, OtlpExport, TelemetryError, TracingGuard};

use once_cell::sync::Lazy;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

pub(crate) static REGISTRY: Lazy<Registry> = Lazy::new(Registry::new);

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
pub(crate) static TURNS_ACCEPTED: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_gateway_turns_accepted_total",
        "turns accepted",
        &[],
    )
});
pub(crate) static TURNS_REJECTED: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_gateway_turns_rejected_total",
        "turns rejected by reason",
        &["reason"],
    )
});
/// Messages a pipeline stage finished, by outcome (ok, retried, dlq).
pub(crate) static STAGE_MESSAGES: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_pipeline_messages_total",
        "messages handled per stage and outcome",
        &["stage", "outcome"],
    )
});
pub(crate) static STAGE_RETRIES: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_pipeline_retries_total",
        "handler retries per stage",
        &["stage"],
    )
});
pub(crate) static STAGE_LATENCY: Lazy<HistogramVec> = Lazy::new(|| {
    histogram(
        "recollect_pipeline_batch_duration_seconds",
        "time to handle one batch, per stage",
        &["stage"],
        latency_buckets(),
    )
});
/// Messages per batch a stage handled: how much each of its store writes (and fsyncs) carries.
pub(crate) static STAGE_BATCH_SIZE: Lazy<HistogramVec> = Lazy::new(|| {
    histogram(
        "recollect_pipeline_batch_size_messages",
        "messages in one batch, per stage",
        &["stage"],
        vec![
            1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
        ],
    )
});
/// Messages waiting per topic (in-process queue depth, or Kafka consumer lag per partition).
pub(crate) static CONSUMER_LAG: Lazy<IntGaugeVec> = Lazy::new(|| {
    gauge(
        "recollect_bus_consumer_lag_messages",
        "messages not yet consumed, per topic and partition",
        &["topic", "partition"],
    )
});
/// One write call to a store seam, per backend and operation (the trait method).
pub(crate) static STORE_WRITE_LATENCY: Lazy<HistogramVec> = Lazy::new(|| {
    histogram(
        "recollect_store_write_duration_seconds",
        "store write latency per seam, backend and operation",
        &["seam", "backend", "op"],
        latency_buckets(),
    )
});
/// One read call to a store seam, per backend and operation.
pub(crate) static STORE_READ_LATENCY: Lazy<HistogramVec> = Lazy::new(|| {
    histogram(
        "recollect_store_read_duration_seconds",
        "store read latency per seam, backend and operation",
        &["seam", "backend", "op"],
        latency_buckets(),
    )
});
/// Store calls that failed in the store (unreachable, backend error, unreadable data); a
/// refused argument or a conflict is the caller's and is not counted.
pub(crate) static STORE_ERRORS: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_store_errors_total",
        "failed store calls per seam, backend and operation",
        &["seam", "backend", "op"],
    )
});
pub(crate) static RECALL_LATENCY: Lazy<HistogramVec> = Lazy::new(|| {
    histogram(
        "recollect_recall_duration_seconds",
        "recall latency: total, per phase (analyse; retrieve, and its overlapping path_b, path_c, dense, lexical; rank) and as each API serves it (http, grpc)",
        &["path"],
        latency_buckets(),
    )
});
pub(crate) static RECALL_CANDIDATES: Lazy<HistogramVec> = Lazy::new(|| {
    histogram(
        "recollect_recall_candidates_turns",
        "candidate turns found per retrieval path in one recall",
        &["path"],
        vec![0.0, 1.0, 5.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0],
    )
});
pub(crate) static RECALL_EMPTY: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_recall_empty_results_total",
        "recalls with no result",
        &[],
    )
});
/// What became of each recall's cross-encoder pass (`recall.rerank_model`).
pub(crate) static RECALL_RERANKS: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_recall_reranks_total",
        "recalls by what the cross-encoder did: reread, skipped (a clear first result), failed",
        &["outcome"],
    )
});
pub(crate) static EMBED_BATCH_SIZE: Lazy<HistogramVec> = Lazy::new(|| {
    histogram(
        "recollect_embedder_batch_size_texts",
        "texts per embedding batch",
        &["kind"],
        vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
    )
});
pub(crate) static EMBED_LATENCY: Lazy<HistogramVec> = Lazy::new(|| {
    histogram(
        "recollect_embedder_batch_duration_seconds",
        "time per embedding batch",
        &["kind"],
        latency_buckets(),
    )
});
pub(crate) static HTTP_REQUESTS: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_http_requests_total",
        "HTTP requests by route and status class",
        &["route", "status"],
    )
});
pub(crate) static GRPC_REQUESTS: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_grpc_requests_total",
        "gRPC calls by method and status code",
        &["method", "code"],
    )
});
pub(crate) static COMPONENT_INFO: Lazy<IntGaugeVec> = Lazy::new(|| {
    gauge(
        "recollect_component_info",
        "which implementation runs behind each seam (value 1)",
        &["seam", "kind"],
    )
});
pub(crate) static BUILD_INFO: Lazy<IntGaugeVec> = Lazy::new(|| {
    gauge(
        "recollect_build_info",
        "build information (value 1)",
        &["version"],
    )
});

/// Requests turned away before any work: rate_limited (429) or overloaded (503).
pub(crate) static HTTP_SHED: Lazy<IntCounterVec> = Lazy::new(|| {
    counter(
        "recollect_http_shed_requests_total",
        "requests refused by the rate limit or the in-flight bound",
        &["reason"],
    )
});

/// Touch every metric so a scrape shows the whole family set from the first second.
pub fn register_all() {
    Lazy::force(&HTTP_SHED);
    Lazy::force(&TURNS_ACCEPTED);
    Lazy::force(&TURNS_REJECTED);
    Lazy::force(&STAGE_MESSAGES);
    Lazy::force(&STAGE_RETRIES);
    Lazy::force(&STAGE_LATENCY);
    Lazy::force(&STAGE_BATCH_SIZE);
    Lazy::force(&CONSUMER_LAG);
    Lazy::force(&STORE_WRITE_LATENCY);
    Lazy::force(&STORE_READ_LATENCY);
    Lazy::force(&STORE_ERRORS);
    Lazy::force(&RECALL_LATENCY);
    Lazy::force(&RECALL_CANDIDATES);
    Lazy::force(&RECALL_EMPTY);
    Lazy::force(&RECALL_RERANKS);
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

/// `(sum, count)` so far of `recollect_recall_duration_seconds{path}`: a bench or eval reads it
/// before and after a run to print the run's mean per phase, as a scrape would give it.
pub fn recall_duration_totals(path: &str) -> (f64, u64) {
    let h = RECALL_LATENCY.with_label_values(&[path]);
    (h.get_sample_sum(), h.get_sample_count())
}

/// `(sum, count)` so far of `recollect_pipeline_batch_size_messages{stage}` and the time those
/// batches took (`recollect_pipeline_batch_duration_seconds{stage}`'s sum).
pub fn stage_batch_totals(stage: &str) -> (f64, u64, f64) {
    let size = STAGE_BATCH_SIZE.with_label_values(&[stage]);
    let took = STAGE_LATENCY.with_label_values(&[stage]);
    (
        size.get_sample_sum(),
        size.get_sample_count(),
        took.get_sample_sum(),
    )
}

/// `recollect_recall_reranks_total{outcome}` so far (`reread`, `skipped`, `failed`).
pub fn recall_reranks_total(outcome: &str) -> u64 {
    RECALL_RERANKS.with_label_values(&[outcome]).get()
}

/// `(sum, count)` so far of `recollect_recall_candidates_turns{path}`.
pub fn recall_candidates_totals(path: &str) -> (f64, u64) {
    let h = RECALL_CANDIDATES.with_label_values(&[path]);
    (h.get_sample_sum(), h.get_sample_count())
}

/// Prometheus text exposition of every registered metric.
pub fn render() -> String {
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&REGISTRY.gather(), &mut buf)
        .expect("text encoding cannot fail");
    String::from_utf8(buf).expect("prometheus text is utf-8")
}

#[cfg(test)]
mod tests {
    use super::events::*;
    use super::*;
    use std::time::Duration;

    /// Every family, fed through its events, named `recollect_<subsystem>_<name>_<unit>`:
    /// counters end in `_total`, and no histogram ends in a suffix Prometheus adds itself.
    #[test]
    fn every_family_is_exported_with_the_naming_rule() {
        register_all();
        let ms = Duration::from_millis(1);
        TurnRejected {
            reason: "too_large",
        }
        .emit();
        StageMessageProcessed {
            stage: "extractor",
            trace_id: "t",
            partition: 0,
            offset: 0,
        }
        .emit();
        StageMessageRetried {
            stage: "extractor",
            error: &"broker away",
        }
        .emit();
        StageBatchHandled {
            stage: "extractor",
            messages: 1,
            elapsed: ms,
        }
        .emit();
        ConsumerLagObserved {
            topic: "recollect.turns.raw",
            partition: 0,
            lag: 3,
        }
        .emit();
        StoreCallCompleted {
            seam: Seam::Graph,
            backend: StoreBackend::Embedded,
            op: StoreOp::Turns,
            elapsed: ms,
        }
        .emit();
        StoreCallCompleted {
            seam: Seam::Graph,
            backend: StoreBackend::Embedded,
            op: StoreOp::WriteTurns,
            elapsed: ms,
        }
        .emit();
        StoreCallFailed {
            seam: Seam::Graph,
            backend: StoreBackend::Neo4j,
            op: StoreOp::WriteTurns,
            error: &"down",
        }
        .emit();
        RecallPhaseCompleted {
            phase: RecallPhase::Analyse,
            elapsed: ms,
        }
        .emit();
        RecallCandidatesFound {
            reached: 1,
            path_b: 1,
            path_c: 1,
            dense: 1,
            lexical: 1,
            late: 1,
        }
        .emit();
        EmbedderBatchCompleted {
            model: "hash",
            texts: 2,
            elapsed: ms,
        }
        .emit();
        HttpRequestCompleted {
            route: "/v1/recall",
            status: 200,
        }
        .emit();
        GrpcRequestCompleted {
            method: "Recall",
            code: "ok",
        }
        .emit();
        RequestShed {
            reason: ShedReason::Overloaded,
        }
        .emit();
        ComponentSelected {
            seam: "graph",
            kind: "embedded",
        }
        .emit();
        let text = render();
        let types: Vec<(&str, &str)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .collect();
        assert_eq!(types.len(), 20, "every family was fed: {types:?}");
        for (name, kind) in types {
            let parts: Vec<&str> = name.split('_').collect();
            let unit = *parts.last().unwrap();
            // `_info` gauges (value 1, the facts in labels) are Prometheus's own convention.
            let least = if unit == "info" { 3 } else { 4 };
            assert!(
                parts.len() >= least && parts[0] == "recollect",
                "{name}: recollect_<subsystem>_<name>_<unit>"
            );
            match kind {
                "counter" => assert_eq!(unit, "total", "{name}"),
                "histogram" => assert!(
                    ["seconds", "texts", "turns", "messages"].contains(&unit),
                    "{name}: a histogram ends in its unit"
                ),
                "gauge" => assert!(["messages", "info"].contains(&unit), "{name}"),
                other => panic!("{name}: unexpected type {other}"),
            }
        }
    }
}
