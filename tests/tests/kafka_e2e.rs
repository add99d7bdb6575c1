//! The distributed pipeline scaled out, under faults: a real Kafka-protocol broker (tansu), the
//! store service, and every worker as separate processes: 3 extractors, 3 embedders,
//! 3 graph-writers and 2 consolidators on topics of 6 partitions. 6,000 turns over 60
//! conversations go in through the gateway at a steady pace from a client that retries as a real
//! one does (request timeout, same turn ids). Mid-stream one instance of each worker kind is
//! killed with SIGKILL and restarted, then the broker itself is killed and restarted on the same
//! storage; a poison message is produced straight to the raw topic. Afterwards every turn is
//! stored exactly once with position == its index in the conversation, readable through the
//! query service, and the dead-letter topic holds the poison and nothing else.
//!
//! Printed: intake rate, drain time, max lag per stage, recovery after each fault (from the
//! fault until every partition of the stage is consumed again, read from the broker's committed
//! offsets), client retries.
//!
//! `make test` installs tansu and requires this test to run (REQUIRE_KAFKA=1); by hand it skips
//! with a message when tansu is not installed. `make e2e-kafka` runs it alone;
//! RECOLLECT_E2E_EMBEDDER=minilm measures with the local model instead of the hash embedder.

mod kafka_common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_common::*;
use recollect_model::topics;
use recollect_tests::{model_env, tansu, Broker, Server};
use serde_json::{json, Value};

const TENANT: &str = "acme";
const KEY: &str = "e2e-key";
const PARTITIONS: i32 = 6;
const CONVERSATIONS: usize = 60;
const TURNS_PER_CONVERSATION: usize = 100;
const BATCH: usize = 25;
/// Instances of extractor, embedder, graph-writer and consolidator.
const INSTANCES: [usize; 4] = [3, 3, 3, 2];
/// The client's steady rate, so that the faults fall mid-stream.
const PACE_TURNS_PER_SEC: f64 = 200.0;
/// What an application would wait for one request before retrying it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the broker stays down.
const BROKER_DOWN: Duration = Duration::from_secs(8);

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

enum Fault {
    Kill(usize, usize),
    Broker,
}

#[test]
fn kafka_pipeline_survives_kill9_of_every_worker_kind() {
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
    let brokers = broker.addr.clone();
    let broker = Arc::new(Mutex::new(broker));
    let data = tempfile::tempdir().unwrap();
    let mut env: Vec<(String, String)> = [
        ("RECOLLECT__BUS__KIND", "kafka".to_string()),
        ("RECOLLECT__BUS__BROKERS", brokers.clone()),
        ("RECOLLECT__BUS__PARTITIONS", PARTITIONS.to_string()),
        ("RECOLLECT__GRAPH__KIND", "remote".into()),
        ("RECOLLECT__VECTORS__KIND", "remote".into()),
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

    let store = recollect_tests::start_store(&env);
    env.push(("RECOLLECT__REMOTE__URL".into(), store.url.clone()));
    let instances = INSTANCES;
    let mut stages: Vec<Workers> = STAGES
        .iter()
        .zip(instances)
        .map(|(&(kind, topic), n)| Workers::start(kind, topic, n, &env))
        .collect();
    let gateway = start_service("recollect-gateway", &env);
    let query = start_service("recollect-query", &env);
    let groups: Vec<String> = stages.iter().map(|s| s.group.clone()).collect();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let bus = kafka_bus(&brokers, PARTITIONS);
    plant_poison(&bus, &rt, TENANT);
    let mut probe = LagProbe::start(
        bus.clone(),
        stages.iter().map(|s| (s.group.clone(), s.topic)).collect(),
    );

    // Round-robin over the conversations at a steady pace; one fault every ~5 s.
    let total_requests = CONVERSATIONS * TURNS_PER_CONVERSATION / BATCH;
    let mut schedule: Vec<(usize, Fault)> = vec![
        (total_requests / 6, Fault::Kill(0, 0)),
        (2 * total_requests / 6, Fault::Kill(1, 1)),
        (3 * total_requests / 6, Fault::Kill(2, 2)),
        (4 * total_requests / 6, Fault::Kill(3, 0)),
    ];
    schedule.push((5 * total_requests / 6, Fault::Broker));
    let mut faults: Vec<(String, Instant, Vec<String>)> = Vec::new();
    let mut broker_thread = None;
    // The first 202 after the broker was killed.
    let mut gateway_back: Option<Instant> = None;
    let mut client = Client::new(REQUEST_TIMEOUT);
    let mut ids: HashMap<String, (usize, usize)> = HashMap::new();
    let started = Instant::now();
    for r in 0..total_requests {
        let (b, c) = (r / CONVERSATIONS, r % CONVERSATIONS);
        for (_, f) in schedule.iter().filter(|(at, _)| *at == r) {
            match f {
                Fault::Kill(s, i) => {
                    let i = &(*i % stages[*s].instances.len());
                    let at = stages[*s].kill_and_restart(*i, &env);
                    eprintln!(
                        "{:.1} s: killed {} #{i} (SIGKILL) and restarted it",
                        (at - started).as_secs_f64(),
                        stages[*s].kind
                    );
                    faults.push((
                        format!("kill -9 {}", stages[*s].kind),
                        at,
                        vec![stages[*s].group.clone()],
                    ));
                }
                Fault::Broker => {
                    broker.lock().unwrap().kill9();
                    let at = Instant::now();
                    eprintln!(
                        "{:.1} s: killed the broker (SIGKILL); restarting it in {BROKER_DOWN:?}",
                        (at - started).as_secs_f64()
                    );
                    faults.push(("broker restart".into(), at, groups.clone()));
                    let broker = broker.clone();
                    broker_thread = Some(std::thread::spawn(move || {
                        std::thread::sleep(BROKER_DOWN);
                        broker.lock().unwrap().restart();
                        Instant::now()
                    }));
                }
            }
        }
        let due = started + Duration::from_secs_f64((r * BATCH) as f64 / PACE_TURNS_PER_SEC);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let conversation = format!("conv-{c:02}");
        let got = client.store(
            &gateway.url,
            KEY,
            &conversation,
            &turns_body(c, b * BATCH, (b + 1) * BATCH),
        );
        for (i, id) in got.into_iter().enumerate() {
            ids.insert(id, (c, b * BATCH + i));
        }
        if broker_thread.is_some() && gateway_back.is_none() {
            gateway_back = client.last_success;
        }
    }
    let ingest_done = started.elapsed();
    let expected = CONVERSATIONS * TURNS_PER_CONVERSATION;
    assert_eq!(ids.len(), expected, "gateway ids are distinct");
    let broker_back = broker_thread.map(|h| h.join().expect("broker restart"));

    // Drained: every turn stored and every group's committed offsets at the end of its topic.
    let ingest_end = Instant::now();
    let patience: u64 = std::env::var("RECOLLECT_E2E_DRAIN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let drained_at = match wait_drained(
        &mut probe,
        &groups,
        expected,
        Duration::from_secs(patience),
        || stored_total(&store),
    ) {
        Ok(at) => at,
        Err(n) => {
            // Where the turns went missing: what each topic carries, and each group's offsets.
            for topic in [
                topics::RAW,
                topics::EXTRACTED,
                topics::EMBEDDED,
                topics::STORED,
            ] {
                let (messages, ids) = topic_census(&bus, &rt, topic);
                eprintln!(
                    "  {topic}: {messages} messages, {} distinct turns",
                    ids.len()
                );
            }
            for g in &groups {
                if let Some(s) = probe.latest(g) {
                    eprintln!("  {g}: {:?}", s.partitions);
                }
            }
            panic!("only {n} of {expected} turns stored (or lag not drained) {patience} s after the intake ended");
        }
    };
    let drain = drained_at - ingest_end;
    let all_done = drained_at - started;

    // Exactly once, in order: each conversation holds its 100 turns, turn tNNN at position NNN.
    let mut placement = Placement::default();
    for c in 0..CONVERSATIONS {
        let conversation = format!("conv-{c:02}");
        let turns: Vec<(String, u64)> = stored_turns(&store, &conversation)
            .iter()
            .map(|t| {
                (
                    t["turn"]["turn_id"].as_str().unwrap().to_string(),
                    t["turn"]["position"].as_u64().unwrap(),
                )
            })
            .collect();
        placement.add(&conversation, &turns);
    }
    let (lost, duplicated) = placement.assert_exactly_once(expected);
    let vectors = store_call(
        &store,
        "/v1/store/vectors",
        json!({"op": "count", "tenant": TENANT, "scope": {"conversations": null}}),
    );
    assert_eq!(vectors.as_u64(), Some(expected as u64), "vector points");

    // Readable through the query service (a sample), and recall finds a turn by its content.
    for (id, (c, t)) in ids.iter().step_by(10) {
        let (status, body) = query.get(&format!("/v1/memories/{id}"), Some(KEY));
        assert_eq!(status, 200, "memory {id}: {body}");
        assert_eq!(body["conversation_id"], format!("conv-{c:02}"));
        assert_eq!(body["turn_id"], format!("t{t:03}"));
    }
    assert_recall_finds_t042(&query, KEY, (0..CONVERSATIONS).step_by(6));

    // The dead-letter topic holds the poison and nothing else.
    let dead = dead_letters(&bus, &rt);
    let dl: Vec<Value> = dead
        .iter()
        .map(|d| serde_json::from_slice(&d.message.payload()).unwrap())
        .collect();
    assert_eq!(dead.len(), 1, "exactly the poison is dead-lettered: {dl:?}");
    assert_eq!(dl[0]["stage"], "extractor");
    assert_eq!(dl[0]["topic"], topics::RAW);
    assert!(
        dl[0]["error"].as_str().unwrap().contains("undecodable"),
        "{}",
        dl[0]
    );
    assert_eq!(dead[0].message.header("trace_id"), Some("poison-trace"));

    // Every replacement took part (it rejoined its group and got partitions), and the metrics
    // of every service moved.
    assert!(gateway.metric_sum("recollect_gateway_turns_accepted_total", "") >= expected as f64);
    for (s, i) in [(0, 0), (1, 1), (2, 2), (3, 0)] {
        let w = &stages[s];
        let i = i % w.instances.len();
        assert!(
            w.instances[i].metric_sum("recollect_pipeline_messages_total", "outcome=\"ok\"") > 0.0,
            "the restarted {} processed nothing",
            w.kind
        );
        assert!(w.metric_sum("recollect_pipeline_batch_duration_seconds_count", "") > 0.0);
    }
    assert!(stages[1].metric_sum("recollect_embedder_batch_size_texts_count", "") > 0.0);
    assert!(query.metric_sum("recollect_recall_duration_seconds_count", "path=\"total\"") > 0.0);
    // The store service reports the writes of the stores it hosts; the graph-writers, theirs as
    // calls to the remote backend. (The exposition sorts labels by name.)
    for (backend, op, seam) in [
        ("embedded", "write_turns", "graph"),
        ("edge", "upsert_turns", "vectors"),
    ] {
        let labels = format!("backend=\"{backend}\",op=\"{op}\",seam=\"{seam}\"");
        assert!(
            store.metric_sum("recollect_store_write_duration_seconds_count", &labels) > 0.0,
            "recollect-store reported no {labels}"
        );
    }
    assert!(
        stages[2].metric_sum(
            "recollect_store_write_duration_seconds_count",
            "backend=\"remote\",op=\"write_turns\",seam=\"graph\""
        ) > 0.0
    );
    assert!(
        query.metric_sum(
            "recollect_store_read_duration_seconds_count",
            "backend=\"remote\""
        ) > 0.0
    );
    // Lag gauges of the members agree with the broker once drained: none is left stale by a
    // partition that moved to another member. They come from librdkafka's statistics (every
    // 2 s) of the committed offsets, so a member whose last commit landed after its last
    // statistics may show the old lag for a round or two: they are given 20 s to settle.
    let settle = Instant::now() + Duration::from_secs(20);
    for w in &stages {
        for s in &w.instances {
            let mut lag = s.metric_sum("recollect_bus_consumer_lag_messages", "");
            while lag != 0.0 && Instant::now() < settle {
                std::thread::sleep(Duration::from_millis(500));
                lag = s.metric_sum("recollect_bus_consumer_lag_messages", "");
            }
            assert_eq!(
                lag, 0.0,
                "{} reports a lag of {lag} 20 s after the drain",
                w.kind
            );
        }
    }

    let pipeline_retries: f64 = stages
        .iter()
        .map(|w| w.metric_sum("recollect_pipeline_retries_total", ""))
        .sum();
    eprintln!(
        "kafka e2e (instances extractor/embedder/graph-writer/consolidator {:?}; {PARTITIONS} partitions; embedder {}):",
        instances,
        if minilm { "minilm" } else { "hash" }
    );
    eprintln!(
        "  intake: {expected} turns / {CONVERSATIONS} conversations in {:.1} s ({:.0} turns/s, client paced at {PACE_TURNS_PER_SEC:.0}); client retries {} ({} unavailable, {} timeout/connection)",
        ingest_done.as_secs_f64(),
        expected as f64 / ingest_done.as_secs_f64(),
        client.retries.total(),
        client.retries.unavailable,
        client.retries.transport,
    );
    eprintln!(
        "  drained {:.1} s after the intake ended; all stored in {:.1} s from the start ({:.0} turns/s end to end)",
        drain.as_secs_f64(),
        all_done.as_secs_f64(),
        expected as f64 / all_done.as_secs_f64(),
    );
    for w in &stages {
        eprintln!("  max lag {}: {} messages", w.kind, probe.max_lag(&w.group));
    }
    for (what, at, affected) in &faults {
        let per: Vec<String> = affected
            .iter()
            .map(|g| format!("{g} {}", secs(probe.recovery(g, *at))))
            .collect();
        eprintln!(
            "  recovery after {what} at {:.1} s: {}",
            (*at - started).as_secs_f64(),
            per.join(", ")
        );
    }
    if let (Some(back), Some((_, down, _))) = (broker_back, faults.last()) {
        eprintln!(
            "  broker down {:.1} s; the gateway's first 202 after the kill {}",
            (back - *down).as_secs_f64(),
            secs(gateway_back.map(|g| g - *down)),
        );
    }
    eprintln!(
        "  lost {lost}, duplicated {duplicated}, misplaced 0, dead-lettered {} (the poison), pipeline retries {} (live instances)",
        dead.len(),
        pipeline_retries.abs()
    );
    let _ = data;
}
