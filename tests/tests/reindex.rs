//! `POST /v1/reindex` / `recollect reindex`: every turn derived again through the workers.
//! Embedded, the graph and the vector index are deleted outright and rebuilt from the raw
//! store (the same extraction, fragments and recall as before), also when the server is
//! killed part-way (the rest is done at the next start); distributed, from the graph's copy of
//! each turn. Recall answers throughout.

use recollect_tests::distributed::{Deployment, Mode};
use recollect_tests::{env_refs, hash_env};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const A: &str = "key-a";

fn turn(conv: &str, i: usize) -> Value {
    let topics = [
        "I ran the Lisbon half marathon in the rain with my sister Ines",
        "We adopted a greyhound called Biscuit from the shelter",
        "My pottery class made blue bowls for the market",
        "Caroline visited Oslo for a conference about glaciers",
    ];
    json!({"turn_id": i.to_string(), "user": format!("{} ({conv}, turn {i}).", topics[i % 4]),
           "assistant": "That sounds wonderful.", "user_speaker": "Maya",
           "timestamp": format!("2024-03-{:02}T09:00:00Z", 1 + i)})
}

/// What reindexing must reproduce: each turn's extraction, each conversation's fragments, and
/// the top hits of a few questions.
fn derived(s: &Deployment, ids: &[String]) -> Value {
    let mut out = serde_json::Map::new();
    for id in ids {
        let (st, m) = s.get(&format!("/v1/memories/{id}"), Some(A));
        assert_eq!(st, 200, "{m}");
        out.insert(id.clone(), json!([m["extraction"], m["fragments"]]));
    }
    for q in [
        "Who ran a marathon in the rain?",
        "greyhound Biscuit",
        "glaciers conference Oslo",
    ] {
        let (st, r) = s.post("/v1/recall", Some(A), &json!({"query": q, "k": 5}));
        assert_eq!(st, 200, "{r}");
        let top: Vec<Value> = r["memories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["memory_id"].clone())
            .collect();
        out.insert(q.into(), json!(top));
    }
    Value::Object(out)
}

fn seed(s: &Deployment) -> Vec<String> {
    let mut ids = Vec::new();
    for (conv, n) in [("r1", 12), ("r2", 5)] {
        let (st, r) = s.post(
            &format!("/v1/conversations/{conv}/turns"),
            Some(A),
            &json!({"turns": (0..n).map(|i| turn(conv, i)).collect::<Vec<_>>(), "wait": true}),
        );
        assert_eq!(st, 202, "{r}");
        ids.extend(
            r["memory_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string()),
        );
    }
    ids
}

/// What is derived, polled until `done` says so (or a minute passes): consolidation and the
/// re-enrichment run after the request answers.
fn poll(s: &Deployment, ids: &[String], done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = derived(s, ids);
        if done(&got) || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Polls until what is derived equals `want`; else fails naming each part that differs (the
/// whole of both would be cut short in a CI log).
fn assert_settles_to(s: &Deployment, ids: &[String], want: &Value, what: &str) {
    let got = poll(s, ids, |got| got == want);
    let differs: Vec<String> = want
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, v)| got.get(k.as_str()) != Some(*v))
        .map(|(k, v)| format!("{k}:\n  want {v}\n  got  {}", got[k.as_str()]))
        .collect();
    assert!(
        got == *want,
        "{what}: not as before the reindex after a minute\n{}",
        differs.join("\n")
    );
}

/// Fragments exist for the 10-turn window of r1: consolidation ran.
fn consolidated(s: &Deployment, ids: &[String]) -> Value {
    poll(s, ids, |d| {
        d[&ids[0]][1].as_array().is_some_and(|f| !f.is_empty())
    })
}

/// What is derived once consolidation has run and two readings a second apart agree: the first
/// fragments can be visible while the rest of the window's are still being written, and a
/// snapshot taken then is not what a rebuild settles to.
fn steady(s: &Deployment, ids: &[String]) -> Value {
    let mut last = consolidated(s, ids);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = derived(s, ids);
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

/// An embedded server with the two seeded conversations, consolidated: (server, ids, derived).
fn seeded(
    dir: &std::path::Path,
    env: &[(&'static str, String)],
) -> (Deployment, Vec<String>, Value) {
    let s = Deployment::start(Mode::Embedded, dir, &env_refs(env));
    let ids = seed(&s);
    let before = steady(&s, &ids);
    (s, ids, before)
}

/// Asks for a reindex of the two seeded conversations; recall answers right after.
fn reindex_answering_recall(s: &Deployment) {
    let (st, r) = s.post("/v1/reindex", Some(A), &json!({}));
    assert_eq!(st, 202, "{r}");
    let counts = (r["conversations"].as_u64(), r["turns"].as_u64());
    assert_eq!(counts, (Some(2), Some(17)), "{r}");
    let (st, _) = s.post(
        "/v1/recall",
        Some(A),
        &json!({"query": "greyhound Biscuit"}),
    );
    assert_eq!(
        st, 200,
        "recall answers while the workers go through the turns"
    );
}

fn env() -> Vec<(&'static str, String)> {
    let mut env = hash_env();
    env.push(("RECOLLECT_API_KEYS", format!("{A}:tenant-a")));
    env
}

#[test]
fn reindex_rebuilds_graph_vectors_and_fragments_from_the_raw_store_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let env = env();
    let (mut s, ids, before) = seeded(dir.path(), &env);
    assert!(before[&ids[0]][0]["keywords"]
        .as_array()
        .is_some_and(|k| !k.is_empty()));
    s.stop();

    for kill_part_way in [false, true] {
        // Every derived store gone: only the raw turns are left.
        std::fs::remove_file(dir.path().join("graph.redb")).unwrap();
        std::fs::remove_dir_all(dir.path().join("vectors")).unwrap();
        let mut s = Deployment::start(Mode::Embedded, dir.path(), &env_refs(&env));
        let (st, r) = s.post(
            "/v1/recall",
            Some(A),
            &json!({"query": "greyhound Biscuit"}),
        );
        assert_eq!(
            (st, r["memories"].as_array().map(Vec::len)),
            (200, Some(0)),
            "{r}"
        );
        reindex_answering_recall(&s);
        if kill_part_way {
            s.front.kill9();
            s = Deployment::start(Mode::Embedded, dir.path(), &env_refs(&env));
        }
        let (st, _) = s.post(
            "/v1/recall",
            Some(A),
            &json!({"query": "greyhound Biscuit"}),
        );
        assert_eq!(st, 200);
        assert_settles_to(
            &s,
            &ids,
            &before,
            &format!("rebuilt (killed part-way: {kill_part_way})"),
        );
        s.stop();
    }
}

#[test]
fn reindex_from_the_graph_distributed() {
    if !Mode::distributed_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let env = env();
    let mut s = Deployment::start(Mode::Distributed, dir.path(), &env_refs(&env));
    let ids = seed(&s);
    let before = steady(&s, &ids);
    reindex_answering_recall(&s);
    assert_settles_to(&s, &ids, &before, "reindexed from the graph");
    s.stop();
}

/// Only the vector index is gone: the graph still holds every turn's old record while the
/// workers go through them, and a window is consolidated only once all of its turns are
/// derived again (from the old records it grouped without their vectors, differently).
#[test]
fn recollect_reindex_on_a_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let env = env();
    let (mut s, ids, before) = seeded(dir.path(), &env);
    s.stop();
    std::fs::remove_dir_all(dir.path().join("vectors")).unwrap();
    let out = std::process::Command::new(recollect_tests::binary())
        .args(["--data-dir", dir.path().to_str().unwrap(), "reindex"])
        .env("RECOLLECT__EMBEDDER__KIND", "hash")
        .env("RECOLLECT__TELEMETRY__LOG_LEVEL", "warn")
        .env("RECOLLECT_API_KEYS", format!("{A}:tenant-a"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("reindexed in"));
    let s = Deployment::start(Mode::Embedded, dir.path(), &env_refs(&env));
    assert_settles_to(&s, &ids, &before, "reindexed on the data dir");
}
