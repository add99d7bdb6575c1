//! Load limits through the real binary: the per-tenant token bucket answers 429 with
//! Retry-After, the in-flight bound answers 503 with Retry-After, configured text limits apply,
//! and health stays reachable throughout.

use std::sync::Arc;

use recollect_tests::distributed::{Deployment, Mode};
use recollect_tests::env_refs;
use serde_json::{json, Value};

const TS: &str = "2023-05-08T13:56:00Z";

#[test]
fn rate_limit_is_per_tenant_with_retry_after_embedded() {
    rate_limit_is_per_tenant_with_retry_after(Mode::Embedded);
}

#[test]
fn rate_limit_is_per_tenant_with_retry_after_distributed() {
    if Mode::distributed_available() {
        rate_limit_is_per_tenant_with_retry_after(Mode::Distributed);
    }
}

fn rate_limit_is_per_tenant_with_retry_after(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let env: Vec<(&'static str, String)> = vec![
        ("RECOLLECT__EMBEDDER__KIND", "hash".into()),
        ("RECOLLECT__SERVER__RATE_LIMIT_PER_SEC", "1".into()),
        ("RECOLLECT__SERVER__RATE_LIMIT_BURST", "3".into()),
        ("RECOLLECT__SERVER__MAX_TEXT_BYTES", "100".into()),
        ("RECOLLECT_API_KEYS", "key-a:tenant-a,key-b:tenant-b".into()),
    ];
    let s = Deployment::start(mode, dir.path(), &env_refs(&env));
    let recall = br#"{"query": "anything"}"#.to_vec();
    let headers = [
        ("authorization", "Bearer key-a"),
        ("content-type", "application/json"),
    ];
    let mut limited = None;
    for i in 0..10 {
        let (st, h, body) = s.send("POST", "/v1/recall", &headers, Some(recall.clone()));
        if st == 429 {
            limited = Some((i, h, body));
            break;
        }
        assert_eq!(st, 200, "{body}");
    }
    let (i, h, body) = limited.expect("the bucket never ran dry");
    assert_eq!(i, 3, "burst of 3, then 429");
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "Retry-After {retry}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "rate_limited", "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("too many requests"));
    // Another tenant has its own bucket; health is never limited.
    let (st, _, body) = s.send(
        "POST",
        "/v1/recall",
        &[
            ("authorization", "Bearer key-b"),
            ("content-type", "application/json"),
        ],
        Some(recall.clone()),
    );
    assert_eq!(st, 200, "{body}");
    for _ in 0..5 {
        assert_eq!(s.get("/healthz", None).0, 200);
        assert_eq!(s.get("/readyz", None).0, 200);
    }
    // After the advertised wait, tenant A is served again.
    std::thread::sleep(std::time::Duration::from_secs(retry));
    let (st, _, body) = s.send("POST", "/v1/recall", &headers, Some(recall));
    assert_eq!(st, 200, "{body}");
    // The configured text limit, named in the message.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let (st, r) = s.post(
        "/v1/conversations/c/turns",
        Some("key-b"),
        &json!({"turns": [{"user": "x".repeat(101), "timestamp": TS}]}),
    );
    assert_eq!(st, 400, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limit is 100"),
        "{r}"
    );
}

#[test]
fn in_flight_bound_sheds_with_503_embedded() {
    in_flight_bound_sheds_with_503(Mode::Embedded);
}

#[test]
fn in_flight_bound_sheds_with_503_distributed() {
    if Mode::distributed_available() {
        in_flight_bound_sheds_with_503(Mode::Distributed);
    }
}

fn in_flight_bound_sheds_with_503(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let env: Vec<(&'static str, String)> = vec![
        ("RECOLLECT__EMBEDDER__KIND", "hash".into()),
        ("RECOLLECT__SERVER__RATE_LIMIT_PER_SEC", "0".into()),
        ("RECOLLECT__SERVER__MAX_IN_FLIGHT", "1".into()),
    ];
    let s = Arc::new(Deployment::start(mode, dir.path(), &env_refs(&env)));
    // A long request holds the only slot while others arrive.
    let turns: Vec<Value> = (0..400)
        .map(|i| json!({"turn_id": i.to_string(), "user": format!("turn number {i} about hiking and bread"), "timestamp": TS}))
        .collect();
    let big = serde_json::to_vec(&json!({"turns": turns, "wait": true})).unwrap();
    let mut handles = Vec::new();
    {
        let s = s.clone();
        handles.push(std::thread::spawn(move || {
            let (st, h, body) = s.send(
                "POST",
                "/v1/conversations/long/turns",
                &[("content-type", "application/json")],
                Some(big),
            );
            let retry = h
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_string());
            vec![(st, retry, body)]
        }));
    }
    for _ in 0..4 {
        let s = s.clone();
        handles.push(std::thread::spawn(move || {
            let mut out = Vec::new();
            for _ in 0..40 {
                let (st, h, body) = s.send(
                    "POST",
                    "/v1/recall",
                    &[("content-type", "application/json")],
                    Some(br#"{"query": "hiking bread"}"#.to_vec()),
                );
                let retry = h
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_string());
                out.push((st, retry, body));
            }
            out
        }));
    }
    let results: Vec<(u16, Option<String>, String)> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let shed: Vec<_> = results.iter().filter(|r| r.0 == 503).collect();
    for (st, retry, body) in &results {
        match st {
            200 | 202 => {}
            503 => {
                assert_eq!(retry.as_deref(), Some("1"), "{body}");
                let v: Value = serde_json::from_str(body).unwrap();
                assert_eq!(v["error"]["code"], "overloaded", "{v}");
            }
            _ => panic!("unexpected {st}: {body}"),
        }
    }
    assert!(
        !shed.is_empty(),
        "no request was shed with max_in_flight = 1"
    );
    println!(
        "in-flight bound ({mode:?}): {} requests, {} shed with 503",
        results.len(),
        shed.len()
    );
    // Once idle, requests are served again.
    let (st, r) = s.post("/v1/recall", None, &json!({"query": "hiking bread"}));
    assert_eq!(st, 200, "{r}");
    assert_eq!(s.get("/healthz", None).0, 200);
}
