//! The distributed pipeline end to end: a real Kafka-protocol broker (tansu), the store service
//! and every worker as a separate process. 5,000 turns over 50 conversations go in through the
//! gateway; the embedder and the graph-writer are killed with SIGKILL mid-stream and restarted;
//! a poison message is produced straight to the raw topic. Afterwards every turn is stored
//! exactly once (checked in the stores), readable through the query service, the poison is in
//! the dead-letter topic, and the metrics of every service moved.
//!
//! `make test` installs tansu and requires this test to run (REQUIRE_KAFKA=1); by hand it skips
//! with a message when tansu is not installed. `make e2e-kafka` runs it alone;
//! RECOLLECT_E2E_EMBEDDER=minilm measures with the local model instead of the hash embedder.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use recollect_bus::{Bus, KafkaBus, KafkaSettings, Message};
use recollect_model::topics;
use recollect_tests::{free_port, model_env, tansu, Broker, Server};
use serde_json::{json, Value};

const TENANT: &str = "acme";
const KEY: &str = "e2e-key";
const CONVERSATIONS: usize = 50;
const TURNS_PER_CONVERSATION: usize = 100;
const BATCH: usize = 25;

struct Pipeline {
    env: Vec<(String, String)>,
}

impl Pipeline {
    fn start(&self, name: &str) -> Server {
        Server::service(name, free_port(), &self.env, true)
    }
}

fn store_call(store: &Server, path: &str, body: Value) -> Value {
    let resp = store
        .client
        .post(format!("{}{path}", store.url))
        .bearer_auth("store-token")
        .json(&body)
        .send()
        .expect("store service call");
    assert!(
        resp.status().is_success(),
        "store call failed: {}",
        resp.status()
    );
    resp.json().expect("store reply")
}

fn stored_turns(store: &Server, conversation: &str) -> Vec<Value> {
    let v = store_call(
        store,
        "/v1/store/graph",
        json!({"op": "conversation_turns", "tenant": TENANT, "conversation": conversation, "from": 0, "to": 1_000_000}),
    );
    v.as_array().cloned().unwrap_or_default()
}

fn stored_total(store: &Server) -> usize {
    (0..CONVERSATIONS)
        .map(|c| stored_turns(store, &format!("conv-{c:02}")).len())
        .sum()
}

fn max_lag(workers: &[&Server]) -> f64 {
    workers
        .iter()
        .flat_map(|w| w.metric_values("recollect_bus_consumer_lag_messages", ""))
        .fold(0.0, f64::max)
}

fn turn_text(c: usize, t: usize) -> (String, String) {
    (
        format!("conversation {c} turn {t}: I visited lighthouse{c}x{t} with my sister on Tuesday"),
        format!("That sounds lovely. What did you see at lighthouse{c}x{t}?"),
    )
}

#[test]
fn kafka_pipeline_survives_kills_and_dead_letters_poison() {
    let Some(tansu) = tansu() else {
        assert!(
            std::env::var("REQUIRE_KAFKA").is_err(),
            "tansu is required here (scripts/setup-kafka.sh installs it)"
        );
        eprintln!("skipping: tansu is not installed (scripts/setup-kafka.sh; `make e2e-kafka` installs it)");
        return;
    };
    let minilm = std::env::var("RECOLLECT_E2E_EMBEDDER").as_deref() == Ok("minilm");
    let broker = Broker::start(&tansu);
    let data = tempfile::tempdir().unwrap();
    let store_port = free_port();
    let mut env: Vec<(String, String)> = [
        ("RECOLLECT__BUS__KIND", "kafka".to_string()),
        ("RECOLLECT__BUS__BROKERS", broker.addr.clone()),
        ("RECOLLECT__BUS__PARTITIONS", "4".into()),
        ("RECOLLECT__GRAPH__KIND", "remote".into()),
        ("RECOLLECT__VECTORS__KIND", "remote".into()),
        (
            "RECOLLECT__REMOTE__URL",
            format!("http://127.0.0.1:{store_port}"),
        ),
        ("RECOLLECT__REMOTE__TOKEN", "store-token".into()),
        (
            "RECOLLECT__STORAGE__DATA_DIR",
            data.path().display().to_string(),
        ),
        (
            "RECOLLECT__EMBEDDER__KIND",
            if minilm { "minilm" } else { "hash" }.into(),
        ),
        ("RECOLLECT__TELEMETRY__LOG_LEVEL", "warn".into()),
        ("RECOLLECT_API_KEYS", format!("{KEY}:{TENANT}")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    env.extend(model_env().into_iter().map(|(k, v)| (k.to_string(), v)));
    let p = Pipeline { env };

    let store = Server::service("recollect-store", store_port, &p.env, true);
    let extractor = p.start("recollect-extractor");
    let mut embedder = p.start("recollect-embedder");
    let mut graph_writer = p.start("recollect-graph-writer");
    let consolidator = p.start("recollect-consolidator");
    let gateway = p.start("recollect-gateway");
    let query = p.start("recollect-query");

    // A poison message straight on the raw topic, as a misbehaving producer would write it.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let bus = KafkaBus::connect(KafkaSettings {
        brokers: broker.addr.clone(),
        client_id: "e2e-test".into(),
        partitions: 4,
        replication: 1,
        security: Default::default(),
    })
    .unwrap();
    rt.block_on(bus.publish(vec![Message {
        topic: topics::RAW.into(),
        key: format!("{TENANT}/poison"),
        payload: b"{\"schema_version\": 2, \"body\": {not json".to_vec(),
        headers: vec![("trace_id".into(), "poison-trace".into())],
    }]))
    .unwrap();

    // Ingest round-robin over the conversations, killing two workers a third of the way in.
    let started = Instant::now();
    let mut ids: HashMap<String, (usize, usize)> = HashMap::new();
    let batches_per_conv = TURNS_PER_CONVERSATION / BATCH;
    let total_requests = CONVERSATIONS * batches_per_conv;
    let mut killed_at: Option<Instant> = None;
    let mut recovered: Option<std::thread::JoinHandle<Duration>> = None;
    let mut max_lag_seen: f64 = 0.0;
    for r in 0..total_requests {
        let (b, c) = (r / CONVERSATIONS, r % CONVERSATIONS);
        if r == total_requests / 3 {
            embedder.kill9();
            graph_writer.kill9();
            killed_at = Some(Instant::now());
            eprintln!("killed embedder and graph-writer (SIGKILL) after {r} requests");
        }
        if r == total_requests / 3 + 2 * CONVERSATIONS / 5 {
            embedder = p.start("recollect-embedder");
            graph_writer = p.start("recollect-graph-writer");
            eprintln!("restarted embedder and graph-writer");
            // Recovery: from the kill until the new graph-writer has stored its first batch.
            let (url, killed) = (graph_writer.url.clone(), killed_at.expect("killed before"));
            recovered = Some(std::thread::spawn(move || {
                let c = reqwest::blocking::Client::new();
                loop {
                    let text = c
                        .get(format!("{url}/metrics"))
                        .send()
                        .and_then(|r| r.text())
                        .unwrap_or_default();
                    let ok = text.lines().any(|l| {
                        l.starts_with("recollect_pipeline_messages_total{")
                            && l.contains("outcome=\"ok\"")
                            && l.rsplit(' ')
                                .next()
                                .and_then(|v| v.parse::<f64>().ok())
                                .unwrap_or(0.0)
                                > 0.0
                    });
                    if ok || killed.elapsed() > Duration::from_secs(300) {
                        return killed.elapsed();
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }));
        }
        let turns: Vec<Value> = (b * BATCH..(b + 1) * BATCH)
            .map(|t| {
                let (user, assistant) = turn_text(c, t);
                json!({"turn_id": format!("t{t:03}"), "user": user, "assistant": assistant,
                       "user_speaker": "Mel", "assistant_speaker": "Caroline",
                       "timestamp": format!("2024-05-{:02}T10:{:02}:00Z", 1 + t / 60, t % 60)})
            })
            .collect();
        let (status, body) = gateway.post(
            &format!("/v1/conversations/conv-{c:02}/turns"),
            Some(KEY),
            &json!({"turns": turns}),
        );
        assert_eq!(status, 202, "{body}");
        for (i, id) in body["memory_ids"].as_array().unwrap().iter().enumerate() {
            ids.insert(id.as_str().unwrap().to_string(), (c, b * BATCH + i));
        }
        if r % 20 == 0 {
            max_lag_seen = max_lag_seen.max(max_lag(&[&extractor, &consolidator]));
        }
    }
    let ingest_done = started.elapsed();
    assert_eq!(
        ids.len(),
        CONVERSATIONS * TURNS_PER_CONVERSATION,
        "gateway ids are distinct"
    );

    // Wait until everything is stored, watching lag drain.
    let expected = CONVERSATIONS * TURNS_PER_CONVERSATION;
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut lag_zero_at = None;
    loop {
        let workers = [&extractor, &embedder, &graph_writer, &consolidator];
        let lag = max_lag(&workers);
        max_lag_seen = max_lag_seen.max(lag);
        let n = stored_total(&store);
        if n >= expected {
            if lag == 0.0 && lag_zero_at.is_none() {
                lag_zero_at = Some(started.elapsed());
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {n} of {expected} turns stored after 900 s"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let all_stored = started.elapsed();
    // Lag back to 0 on every stage (librdkafka reports it every 2 s).
    let drain_deadline = Instant::now() + Duration::from_secs(60);
    while lag_zero_at.is_none() && Instant::now() < drain_deadline {
        if max_lag(&[&extractor, &embedder, &graph_writer, &consolidator]) == 0.0 {
            lag_zero_at = Some(started.elapsed());
        } else {
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    let recovery = recovered.map(|h| h.join().expect("recovery probe"));

    // Exactly once, in the stores: every conversation holds its 100 turns, positions 0..99.
    for c in 0..CONVERSATIONS {
        let turns = stored_turns(&store, &format!("conv-{c:02}"));
        let turn_ids: HashSet<&str> = turns
            .iter()
            .map(|t| t["turn"]["turn_id"].as_str().unwrap())
            .collect();
        let positions: HashSet<u64> = turns
            .iter()
            .map(|t| t["turn"]["position"].as_u64().unwrap())
            .collect();
        assert_eq!(
            turns.len(),
            TURNS_PER_CONVERSATION,
            "conv-{c:02}: turns stored"
        );
        assert_eq!(
            turn_ids.len(),
            TURNS_PER_CONVERSATION,
            "conv-{c:02}: duplicated turn"
        );
        assert_eq!(
            positions,
            (0..TURNS_PER_CONVERSATION as u64).collect(),
            "conv-{c:02}: positions"
        );
    }
    let vectors = store_call(
        &store,
        "/v1/store/vectors",
        json!({"op": "count", "tenant": TENANT, "scope": {"conversations": null}}),
    );
    assert_eq!(vectors.as_u64(), Some(expected as u64), "vector points");

    // Every turn readable through the query service, and recall finds a turn by its content.
    for (id, (c, t)) in &ids {
        let (status, body) = query.get(&format!("/v1/memories/{id}"), Some(KEY));
        assert_eq!(status, 200, "memory {id}: {body}");
        assert_eq!(body["conversation_id"], format!("conv-{c:02}"));
        assert_eq!(body["turn_id"], format!("t{t:03}"));
    }
    let recall_started = Instant::now();
    for c in (0..CONVERSATIONS).step_by(5) {
        let (status, body) = query.post(
            "/v1/recall",
            Some(KEY),
            &json!({"query": format!("when did I visit lighthouse{c}x42?"), "conversation_ids": [format!("conv-{c:02}")], "k": 10}),
        );
        assert_eq!(status, 200, "{body}");
        let hits: Vec<&str> = body["memories"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["turn"]["turn_id"].as_str().or(m["turn_id"].as_str()))
            .collect();
        assert!(
            hits.contains(&"t042"),
            "conv-{c:02}: recall missed t042: {hits:?}"
        );
    }
    let recall_ms = recall_started.elapsed().as_secs_f64() * 1000.0 / 10.0;

    // The poison went to the DLQ with its error and origin; nothing else did.
    let dead = rt.block_on(async {
        let mut sub = bus.subscribe(topics::DLQ, "e2e-dlq-reader").await.unwrap();
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while got.is_empty() && Instant::now() < deadline {
            got.extend(sub.poll(100, Duration::from_secs(2)).await.unwrap());
        }
        sub.close().await;
        got
    });
    assert_eq!(dead.len(), 1, "exactly the poison is dead-lettered");
    let dl: Value = serde_json::from_slice(&dead[0].message.payload).unwrap();
    assert_eq!(dl["stage"], "extractor");
    assert_eq!(dl["topic"], topics::RAW);
    assert!(
        dl["error"].as_str().unwrap().contains("undecodable"),
        "{dl}"
    );
    assert_eq!(dead[0].message.header("trace_id"), Some("poison-trace"));

    // The metrics of every service moved.
    assert_eq!(
        gateway.metric_sum("recollect_gateway_turns_accepted_total", ""),
        expected as f64
    );
    assert!(
        extractor.metric_sum("recollect_pipeline_messages_total", "outcome=\"ok\"")
            >= expected as f64
    );
    assert_eq!(
        extractor.metric_sum("recollect_pipeline_messages_total", "outcome=\"dlq\""),
        1.0
    );
    for (name, s) in [
        ("embedder", &embedder),
        ("graph_writer", &graph_writer),
        ("consolidator", &consolidator),
    ] {
        assert!(
            s.metric_sum("recollect_pipeline_messages_total", "outcome=\"ok\"") > 0.0,
            "{name} processed nothing after restart"
        );
        assert!(
            s.metric_sum("recollect_pipeline_batch_duration_seconds_count", "") > 0.0,
            "{name} latency"
        );
    }
    assert!(embedder.metric_sum("recollect_embedder_batch_size_texts_count", "") > 0.0);
    assert!(query.metric_sum("recollect_recall_duration_seconds_count", "path=\"total\"") > 0.0);
    assert!(store.metric_sum("recollect_store_write_duration_seconds_count", "") > 0.0);
    let lag_families = extractor
        .get("/metrics", None)
        .1
        .as_str()
        .unwrap_or_default()
        .contains("recollect_bus_consumer_lag_messages{");
    assert!(lag_families, "consumer lag per topic/partition is exported");

    eprintln!(
        "kafka e2e: {expected} turns / {CONVERSATIONS} conversations, embedder {}: gateway accepted all in {:.1} s ({:.0} turns/s); \
         all stored in {:.1} s ({:.1} turns/s end to end, including a kill -9 of embedder and graph-writer {:.1} s after start); \
         max consumer lag seen {max_lag_seen}; lag back to 0 on every stage at {:?} (ingest ended at {:.1} s); recovery from the kill to the new graph-writer's first stored batch {:?}; recall via query service {recall_ms:.1} ms avg; dead-lettered 1; lost 0; duplicated 0",
        if minilm { "minilm" } else { "hash" },
        ingest_done.as_secs_f64(),
        expected as f64 / ingest_done.as_secs_f64(),
        all_stored.as_secs_f64(),
        expected as f64 / all_stored.as_secs_f64(),
        killed_at.map(|k| (k - started).as_secs_f64()).unwrap_or(0.0),
        lag_zero_at,
        ingest_done.as_secs_f64(),
        recovery,
    );
    drop(bus);
}
