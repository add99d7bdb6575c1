//! Kill -9 during a 1,000-turn ingest, restart: every acknowledged turn is there exactly once and
//! enrichment resumes until every turn is recallable.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use recollect_tests::{model_available, model_env, Server};
use serde_json::{json, Value};

const TURNS: usize = 1000;
const BATCH: usize = 10;

fn batch(start: usize) -> Value {
    let turns: Vec<Value> = (start..start + BATCH)
        .map(|i| {
            json!({"turn_id": format!("t{i}"), "user": format!("Turn {i}: I walked my dog Rex to the park number {i}."),
                   "assistant": format!("Noted, walk {i} with Rex."), "user_speaker": "Ana", "assistant_speaker": "Bot",
                   "timestamp": "2024-03-01T10:00:00Z"})
        })
        .collect();
    json!({ "turns": turns })
}

#[test]
fn kill_9_mid_ingest_loses_nothing_acknowledged_and_duplicates_nothing() {
    if !model_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut env = model_env();
    // Reading back every acknowledged turn is a burst of GETs: the per-tenant rate limit is not
    // what this test is about.
    env.push(("RECOLLECT__SERVER__RATE_LIMIT_PER_SEC", "0".to_string()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut s = Server::start(dir.path(), &env);
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let batches_done = Arc::new(AtomicUsize::new(0));
    let url = s.url.clone();
    let (a2, b2) = (acked.clone(), batches_done.clone());
    let writer = std::thread::spawn(move || {
        let c = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        for b in 0..TURNS / BATCH {
            let Ok(r) = c
                .post(format!("{url}/v1/conversations/crash/turns"))
                .json(&batch(b * BATCH))
                .send()
            else {
                return;
            };
            if r.status().as_u16() != 202 {
                return;
            }
            let Ok(v) = r.json::<Value>() else { return };
            a2.lock().unwrap().extend(
                v["memory_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_str().unwrap().to_string()),
            );
            b2.fetch_add(1, Ordering::SeqCst);
        }
    });
    // Kill while batches are still arriving and enrichment is far behind.
    let t = Instant::now();
    while batches_done.load(Ordering::SeqCst) < 40 && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    s.kill9();
    writer.join().unwrap();
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= 400 && acked.len() < TURNS,
        "killed mid-stream after {} acknowledged turns",
        acked.len()
    );

    let s = Server::start(dir.path(), &env);
    for id in &acked {
        assert_eq!(
            s.get(&format!("/v1/memories/{id}"), None).0,
            200,
            "acknowledged turn {id} lost"
        );
    }
    let (_, info) = s.get("/v1/conversations/crash", None);
    let stored = info["turns"].as_u64().unwrap() as usize;
    assert!(stored >= acked.len(), "{info}");

    // The client retries everything; turns already stored are not duplicated.
    let mut all = Vec::new();
    for b in 0..TURNS / BATCH {
        let (st, r) = s.post("/v1/conversations/crash/turns", None, &batch(b * BATCH));
        assert_eq!(st, 202, "{r}");
        all.extend(
            r["memory_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap().to_string()),
        );
    }
    for id in &acked {
        assert!(
            all.contains(id),
            "retry gave a different id for an acknowledged turn"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (_, info) = s.get("/v1/conversations/crash", None);
        assert_eq!(
            info["turns"].as_u64(),
            Some(TURNS as u64),
            "exactly once: {info}"
        );
        if info["pending"].as_u64() == Some(0) && info["recallable"].as_u64() == Some(TURNS as u64)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "enrichment did not finish after restart: {info}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let (st, r) = s.post(
        "/v1/recall",
        None,
        &json!({"query": "walk 517 with Rex", "conversation_ids": ["crash"], "k": 30}),
    );
    assert_eq!(st, 200);
    let hits: Vec<&Value> = r["memories"].as_array().unwrap().iter().collect();
    let mut seen = std::collections::HashSet::new();
    for m in &hits {
        assert!(
            seen.insert(m["memory_id"].as_str().unwrap().to_string()),
            "duplicate memory in recall"
        );
    }
    assert!(
        hits.iter().any(|m| m["turn_id"] == "t517"),
        "turn t517 is recallable"
    );
}
