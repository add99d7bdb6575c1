//! Trace export over OTLP/HTTP: `recollect serve` with `telemetry.otlp_endpoint` set sends its
//! spans, as protobuf, to a stand-in collector (an axum server taking `POST /v1/traces` on a
//! loopback port); a bad endpoint stops the server at start, naming the key.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use recollect_tests::{binary, env_refs, free_port, hash_env, Server};
use serde_json::json;

/// What the stand-in collector received: (content type, body) of every export.
type Received = Arc<Mutex<Vec<(String, Bytes)>>>;

async fn take_traces(
    State(received): State<Received>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    received.lock().unwrap().push((content_type, body));
    StatusCode::OK
}

/// A collector on a free loopback port: its base URL and what it receives.
fn collector(rt: &tokio::runtime::Runtime) -> (String, Received) {
    let received = Received::default();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/v1/traces", post(take_traces))
        .with_state(received.clone());
    rt.spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

fn text(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            AnyValue::StringValue(s) => Some(s.clone()),
            AnyValue::IntValue(i) => Some(i.to_string()),
            _ => None,
        }
    })
}

/// Every span received so far, with the `service.name` of the resource that sent it.
fn spans(received: &Received) -> Vec<(String, Span)> {
    let mut out = Vec::new();
    for (_, body) in received.lock().unwrap().iter() {
        let req = ExportTraceServiceRequest::decode(body.as_ref()).expect("an OTLP protobuf body");
        for rs in req.resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| text(&r.attributes, "service.name"))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                out.extend(ss.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
    }
    out
}

#[test]
fn spans_of_a_store_and_a_recall_reach_an_otlp_receiver() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (endpoint, received) = collector(&rt);
    let dir = tempfile::tempdir().unwrap();
    let mut env = hash_env();
    env.push(("RECOLLECT_API_KEYS", "otlpkey:tenant-otlp".to_string()));
    env.push(("RECOLLECT__TELEMETRY__OTLP_ENDPOINT", endpoint));
    // Export every 100 ms rather than every 5 s, so the test does not wait on the batch timer.
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "100".to_string()));
    let mut s = Server::start(&dir.path().join("data"), &env_refs(&env));
    let key = Some("otlpkey");
    let marker = "otlpmarkerqz";
    let (st, r) = s.post(
        "/v1/conversations/chat-otlp/turns",
        key,
        &json!({"turns": [
            {"user": format!("I bake {marker} sourdough on Sundays"), "assistant": "Nice.",
             "timestamp": "2024-05-01T10:00:00Z"},
        ], "wait": true}),
    );
    assert_eq!(st, 202, "{r}");
    let (st, r) = s.post("/v1/recall", key, &json!({"query": "when do I bake?"}));
    assert_eq!(st, 200, "{r}");
    assert!(!r["memories"].as_array().unwrap().is_empty(), "{r}");

    // The batch processor exports on its timer; wait for the recall's spans to arrive.
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let spans = spans(&received);
        if spans.iter().any(|(_, s)| s.name == "recall") {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "no recall span within 30 s; received {:?}",
            spans.iter().map(|(_, s)| &s.name).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    s.stop();

    for (content_type, body) in received.lock().unwrap().iter() {
        assert_eq!(content_type, "application/x-protobuf");
        assert!(!body.is_empty(), "an empty export");
        let lossy = String::from_utf8_lossy(body);
        assert!(!lossy.contains(marker), "turn text in an exported span");
        assert!(
            !lossy.contains("otlpkey"),
            "the API key in an exported span"
        );
    }
    assert!(spans.iter().all(|(service, _)| service == "recollect"));
    let by_id: HashMap<&[u8], &Span> = spans.iter().map(|(_, s)| (&s.span_id[..], s)).collect();
    let parent = |s: &Span| by_id.get(&s.parent_span_id[..]).copied();

    // The recall's span sits in the handler's, which sits in the HTTP request's: one trace.
    let recall = &spans.iter().find(|(_, s)| s.name == "recall").unwrap().1;
    assert_eq!(
        text(&recall.attributes, "tenant").as_deref(),
        Some("tenant-otlp")
    );
    assert_eq!(text(&recall.attributes, "results").as_deref(), Some("1"));
    let handler = parent(recall).expect("the recall span has a parent");
    assert_eq!(handler.name, "http.recall");
    let request = parent(handler).expect("the handler span has a parent");
    assert_eq!(request.name, "POST /v1/recall");
    assert_eq!(
        text(&request.attributes, "route").as_deref(),
        Some("/v1/recall")
    );
    assert_eq!(text(&request.attributes, "status").as_deref(), Some("200"));
    assert!(recall.trace_id == request.trace_id && handler.trace_id == request.trace_id);

    // The store: its handler span carries the conversation and the trace id the pipeline
    // messages carry too.
    let store = &spans
        .iter()
        .find(|(_, s)| s.name == "http.store_turns")
        .expect("a store handler span")
        .1;
    assert_eq!(
        text(&store.attributes, "conversation").as_deref(),
        Some("chat-otlp")
    );
    let trace_id = text(&store.attributes, "trace_id").expect("the store span has a trace id");
    for stage in ["extractor", "embedder", "graph-writer"] {
        assert!(
            spans.iter().any(|(_, s)| s.name == "pipeline.message"
                && text(&s.attributes, "stage").as_deref() == Some(stage)
                && text(&s.attributes, "trace_id").as_deref() == Some(trace_id.as_str())
                && text(&s.attributes, "conversation").as_deref() == Some("chat-otlp")),
            "no {stage} message span with the request's trace id"
        );
    }
    println!(
        "otlp: {} exports, {} spans, e.g. {:?}",
        received.lock().unwrap().len(),
        spans.len(),
        spans
            .iter()
            .map(|(_, s)| s.name.as_str())
            .collect::<std::collections::BTreeSet<_>>()
    );
}

#[test]
fn a_bad_otlp_endpoint_stops_the_server_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for (endpoint, says) in [
        ("collector:4318", "scheme"),
        ("https://collector.example:4318", "https is not supported"),
    ] {
        let mut child = Command::new(binary())
            .arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", free_port()))
            .arg("--grpc-listen")
            .arg("")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .env("RECOLLECT__EMBEDDER__KIND", "hash")
            .env("RECOLLECT__TELEMETRY__OTLP_ENDPOINT", endpoint)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start recollect serve");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{endpoint}: the server started instead of refusing the setting");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert!(!status.success(), "{endpoint}: exited with {status}");
        assert!(
            err.contains("telemetry.otlp_endpoint") && err.contains(says),
            "{endpoint}: {err}"
        );
    }
}
