//! The distributed pipeline on the production stores: tansu as the broker, a Bolt server
//! (ArcadeDB in `make test`; `graph.kind = "neo4j"`) and a Qdrant server (`vectors.kind =
//! "qdrant"`) instead of the recollect-store service, configured through the keys the Helm
//! chart renders into its ConfigMap (a TOML file in RECOLLECT_CONFIG, the Bolt password from the
//! environment as the chart's Secret gives it). 1,000 turns over 10 conversations go in through
//! the gateway; the graph-writer is killed with SIGKILL mid-stream and restarted.
//! The stores are then checked directly: every turn once, at its index, one vector point each;
//! recall through the query service finds turns by content.
//!
//! Needs tansu, RECOLLECT_TEST_BOLT_URI (+ _USER, _PASSWORD, _DATABASE) and QDRANT_URL (gRPC),
//! which scripts/test.sh provides; skips with a message when one is missing unless
//! REQUIRE_KAFKA / REQUIRE_ARCADEDB / REQUIRE_QDRANT say it must run. The servers are shared
//! with the contract suites: the run writes under a tenant of its own.

mod kafka_common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_common::*;
use recollect_model::TenantId;
use recollect_storage::{
    GraphRead, Neo4jGraph, Neo4jSettings, QdrantVectorIndex, Scope, VectorIndex,
};
use recollect_tests::{model_env, tansu, Broker};

const KEY: &str = "prod-stores-key";
const PARTITIONS: i32 = 6;
const CONVERSATIONS: usize = 10;
const TURNS_PER_CONVERSATION: usize = 100;
const BATCH: usize = 25;
const PACE_TURNS_PER_SEC: f64 = 100.0;

fn required(var: &str) -> bool {
    std::env::var(var).as_deref() == Ok("1")
}

/// What is missing to run, or None when everything is there.
fn missing() -> Option<String> {
    let mut missing = Vec::new();
    if tansu().is_none() {
        assert!(
            !required("REQUIRE_KAFKA"),
            "REQUIRE_KAFKA=1 but tansu is not installed"
        );
        missing.push("tansu (scripts/setup-kafka.sh)");
    }
    if std::env::var("RECOLLECT_TEST_BOLT_URI").is_err() {
        assert!(
            !required("REQUIRE_ARCADEDB"),
            "REQUIRE_ARCADEDB=1 but RECOLLECT_TEST_BOLT_URI is unset"
        );
        missing.push("a Bolt server (RECOLLECT_TEST_BOLT_URI/_USER/_PASSWORD/_DATABASE)");
    }
    if std::env::var("QDRANT_URL").is_err() {
        assert!(
            !required("REQUIRE_QDRANT"),
            "REQUIRE_QDRANT=1 but QDRANT_URL is unset"
        );
        missing.push("a Qdrant server (QDRANT_URL, gRPC)");
    }
    (!missing.is_empty()).then(|| missing.join(", "))
}

#[test]
fn kafka_pipeline_on_bolt_graph_and_qdrant() {
    if let Some(what) = missing() {
        eprintln!(
            "skipping the production-stores pipeline: missing {what} (scripts/test.sh starts them)"
        );
        return;
    }
    let var = |k: &str| std::env::var(k).ok();
    let bolt = Neo4jSettings {
        uri: var("RECOLLECT_TEST_BOLT_URI").unwrap(),
        user: var("RECOLLECT_TEST_BOLT_USER").unwrap_or_else(|| "root".into()),
        password: var("RECOLLECT_TEST_BOLT_PASSWORD").unwrap_or_default(),
        database: var("RECOLLECT_TEST_BOLT_DATABASE").unwrap_or_else(|| "recollect".into()),
        ca_file: String::new(),
    };
    let qdrant = var("QDRANT_URL").unwrap();
    let minilm = std::env::var("RECOLLECT_E2E_EMBEDDER").as_deref() == Ok("minilm");
    // The graph and Qdrant are shared with other suites: a tenant of this run's own.
    let tenant = format!(
        "prod-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );

    let broker = Broker::start(&tansu().unwrap());
    let dir = tempfile::tempdir().unwrap();
    // The chart's ConfigMap (helm/recollect/values.yaml `config`), with this run's endpoints.
    let config = dir.path().join("recollect.toml");
    std::fs::write(
        &config,
        format!(
            r#"[embedder]
kind = "{embedder}"
batch_size = 64

[extractor]
kind = "rules"

[graph]
kind = "neo4j"
uri = "{uri}"
user = "{user}"
database = "{database}"

[vectors]
kind = "qdrant"
url = "{qdrant}"

[bus]
kind = "kafka"
brokers = "{brokers}"
group_prefix = "recollect"
partitions = {PARTITIONS}
replication = 1

[consolidation]
window = 10

[telemetry]
log_format = "text"
log_level = "warn"
"#,
            embedder = if minilm { "minilm" } else { "hash" },
            uri = bolt.uri,
            user = bolt.user,
            database = bolt.database,
            brokers = broker.addr,
        ),
    )
    .unwrap();
    let mut env: Vec<(String, String)> = vec![
        ("RECOLLECT_CONFIG".into(), config.display().to_string()),
        // As the chart's Secret provides them.
        ("RECOLLECT__GRAPH__PASSWORD".into(), bolt.password.clone()),
        ("RECOLLECT_API_KEYS".into(), format!("{KEY}:{tenant}")),
        (
            "RECOLLECT__STORAGE__DATA_DIR".into(),
            dir.path().display().to_string(),
        ),
    ];
    env.extend(model_env().into_iter().map(|(k, v)| (k.to_string(), v)));

    // One graph-writer: with two members per group tansu 0.6 lost turns in the scaled-out run
    // (see kafka_e2e.rs).
    let instances = [1, 1, 1, 1];
    let mut stages: Vec<Workers> = STAGES
        .iter()
        .zip(instances)
        .map(|(&(kind, topic), n)| Workers::start(kind, topic, n, &env))
        .collect();
    let gateway = start_service("recollect-gateway", &env);
    let query = start_service("recollect-query", &env);
    let groups: Vec<String> = stages.iter().map(|s| s.group.clone()).collect();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let bus = kafka_bus(&broker.addr, PARTITIONS);
    let mut probe = LagProbe::start(
        bus.clone(),
        stages.iter().map(|s| (s.group.clone(), s.topic)).collect(),
    );

    let total_requests = CONVERSATIONS * TURNS_PER_CONVERSATION / BATCH;
    let mut client = Client::new(Duration::from_secs(10));
    let mut ids = HashSet::new();
    let mut killed = None;
    let started = Instant::now();
    for r in 0..total_requests {
        let (b, c) = (r / CONVERSATIONS, r % CONVERSATIONS);
        if r == 2 * total_requests / 5 {
            killed = Some(stages[2].kill_and_restart(0, &env));
            eprintln!(
                "{:.1} s: killed graph-writer #0 (SIGKILL) and restarted it",
                started.elapsed().as_secs_f64()
            );
        }
        let due = started + Duration::from_secs_f64((r * BATCH) as f64 / PACE_TURNS_PER_SEC);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        ids.extend(client.store(
            &gateway.url,
            KEY,
            &format!("conv-{c:02}"),
            &turns_body(c, b * BATCH, (b + 1) * BATCH),
        ));
    }
    let ingest_done = started.elapsed();
    let expected = CONVERSATIONS * TURNS_PER_CONVERSATION;
    assert_eq!(ids.len(), expected, "gateway ids are distinct");

    // The stores themselves, as the services see them.
    let t = TenantId(tenant.clone());
    let (graph, vectors) = rt.block_on(async {
        let g = Neo4jGraph::connect(&bolt).await.expect("bolt");
        let v = QdrantVectorIndex::connect(
            &qdrant,
            recollect_storage::open::QDRANT_COLLECTION_PREFIX,
            if minilm {
                384
            } else {
                recollect_embed::HASH_DIM
            },
        )
        .await
        .expect("qdrant");
        (Arc::new(g), Arc::new(v))
    });
    let stored = |c: usize| {
        rt.block_on(graph.conversation_turns(&t, &format!("conv-{c:02}"), 0, 1_000_000))
            .expect("conversation turns")
    };
    let ingest_end = Instant::now();
    let drained_at = match wait_drained(
        &mut probe,
        &groups,
        expected,
        Duration::from_secs(600),
        || (0..CONVERSATIONS).map(|c| stored(c).len()).sum(),
    ) {
        Ok(at) => at,
        Err(n) => panic!(
            "only {n} of {expected} turns in the graph (or lag not drained) 600 s after the intake ended"
        ),
    };
    let drain = drained_at - ingest_end;
    let all_done = drained_at - started;

    let mut placement = Placement::default();
    for c in 0..CONVERSATIONS {
        let turns: Vec<(String, u64)> = stored(c)
            .iter()
            .map(|r| (r.turn.turn_id.clone(), r.turn.position))
            .collect();
        placement.add(&format!("conv-{c:02}"), &turns);
    }
    let (lost, duplicated) = placement.assert_exactly_once(expected);
    let points = rt
        .block_on(vectors.count(&t, &Scope::all()))
        .expect("qdrant count");
    assert_eq!(points, expected as u64, "vector points in Qdrant");

    // Recall through the query service finds turns by their content.
    assert_recall_finds_t042(&query, KEY, (0..CONVERSATIONS).step_by(2));
    // The conversation listing, four at a time, reads the graph's pages.
    let (mut listed, mut cursor, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let path = match &cursor {
            None => "/v1/conversations?limit=4".to_string(),
            Some(c) => format!("/v1/conversations?limit=4&cursor={c}"),
        };
        let (status, body) = query.get(&path, Some(KEY));
        assert_eq!(status, 200, "{body}");
        listed.extend(
            body["conversations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap().to_string()),
        );
        pages += 1;
        match body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
        assert!(pages < 10, "paging does not end");
    }
    let want: Vec<String> = (0..CONVERSATIONS).map(|c| format!("conv-{c:02}")).collect();
    assert_eq!((listed, pages), (want, CONVERSATIONS.div_ceil(4)));
    assert!(
        stages[2].instances[0].metric_sum("recollect_pipeline_messages_total", "outcome=\"ok\"")
            > 0.0,
        "the restarted graph-writer processed nothing"
    );

    let killed = killed.expect("the graph-writer was killed");
    eprintln!(
        "kafka on production stores (Bolt graph, Qdrant; one worker per stage, {PARTITIONS} partitions; embedder {}):",
        if minilm { "minilm" } else { "hash" }
    );
    eprintln!(
        "  intake: {expected} turns / {CONVERSATIONS} conversations in {:.1} s ({:.0} turns/s, client paced at {PACE_TURNS_PER_SEC:.0}); client retries {}",
        ingest_done.as_secs_f64(),
        expected as f64 / ingest_done.as_secs_f64(),
        client.retries.total(),
    );
    eprintln!(
        "  drained {:.1} s after the intake ended; all stored in {:.1} s ({:.0} turns/s end to end)",
        drain.as_secs_f64(),
        all_done.as_secs_f64(),
        expected as f64 / all_done.as_secs_f64(),
    );
    for w in &stages {
        eprintln!("  max lag {}: {} messages", w.kind, probe.max_lag(&w.group));
    }
    eprintln!(
        "  recovery after kill -9 graph-writer at {:.1} s: {}",
        (killed - started).as_secs_f64(),
        secs(probe.recovery(&stages[2].group, killed))
    );
    eprintln!("  lost {lost}, duplicated {duplicated}, misplaced 0; {points} vector points");
}
