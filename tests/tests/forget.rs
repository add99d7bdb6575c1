//! One memory erased on its own (`DELETE /v1/memories/{id}`), through the real binary in both
//! modes: gone for every read path, the rest of its conversation recallable and still
//! consolidated across the gap, other tenants' ids not found, bad ids a 400, the same turn id
//! stored again a new memory; a turn id that holds other content a 409 before that; and
//! (embedded) no residue when every store is opened directly.

use recollect_model::TenantId;
use recollect_storage::{EdgeVectorIndex, EmbeddedGraph, RawStore, Scope, VectorIndex};
use recollect_tests::distributed::{Deployment, Mode};
use recollect_tests::{env_refs, hash_env};
use serde_json::{json, Value};

const A: &str = "key-a";
const B: &str = "key-b";
const MARKER: &str = "onlymarkerww";

fn turn(i: usize) -> Value {
    let user = if i == 5 {
        format!("{MARKER}: my zeppelin ride over Lake Constance, turn {i}.")
    } else {
        format!("We hiked the ridge trail with the dog again, turn {i}.")
    };
    json!({"turn_id": i.to_string(), "user": user, "assistant": "Tell me more.",
           "user_speaker": "Maya", "assistant_speaker": "Bot",
           "timestamp": format!("2024-04-{:02}T10:00:00Z", 1 + i % 28)})
}

fn store(s: &Deployment, key: &str, conv: &str, turns: Vec<Value>) -> Vec<String> {
    let (st, r) = s.post(
        &format!("/v1/conversations/{conv}/turns"),
        Some(key),
        &json!({"turns": turns, "wait": true}),
    );
    assert_eq!(st, 202, "{r}");
    r["memory_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

fn recall(s: &Deployment, q: &str) -> Vec<Value> {
    let (st, r) = s.post("/v1/recall", Some(A), &json!({"query": q, "k": 100}));
    assert_eq!(st, 200, "{r}");
    r["memories"].as_array().unwrap().clone()
}

fn positions(s: &Deployment, conv: &str) -> Vec<u64> {
    let (st, r) = s.get(
        &format!("/v1/conversations/{conv}/turns?limit=500"),
        Some(A),
    );
    assert_eq!(st, 200, "{r}");
    r["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["position"].as_u64().unwrap())
        .collect()
}

/// Whether any turn of `conv` belongs to a fragment, polled: consolidation runs after the store.
fn consolidated(s: &Deployment, conv: &str, from_position: u64) -> bool {
    for _ in 0..100 {
        let (_, r) = s.get(
            &format!("/v1/conversations/{conv}/turns?limit=500"),
            Some(A),
        );
        if r["turns"].as_array().unwrap().iter().any(|t| {
            t["position"].as_u64().unwrap() >= from_position
                && t["fragments"].as_array().is_some_and(|f| !f.is_empty())
        }) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    false
}

#[test]
fn forget_one_memory_embedded() {
    let dir = tempfile::tempdir().unwrap();
    forget(Mode::Embedded, dir.path());
    residue(dir.path());
}

#[test]
fn forget_one_memory_distributed() {
    if Mode::distributed_available() {
        let dir = tempfile::tempdir().unwrap();
        forget(Mode::Distributed, dir.path());
    }
}

fn forget(mode: Mode, dir: &std::path::Path) {
    let mut env = hash_env();
    env.push(("RECOLLECT_API_KEYS", format!("{A}:tenant-a,{B}:tenant-b")));
    let mut s = Deployment::start(mode, dir, &env_refs(&env));
    let ids = store(&s, A, "c", (0..12).map(turn).collect());
    assert!(consolidated(&s, "c", 0), "the first window is consolidated");
    let hits = recall(&s, MARKER);
    assert_eq!(hits[0]["memory_id"], ids[5].as_str(), "{hits:?}");

    // A retried store of the same turn is a no-op; the same turn id with other content is a
    // 409 naming the way to replace it, and nothing of that request is stored.
    assert_eq!(store(&s, A, "c", vec![turn(5)]), vec![ids[5].clone()]);
    let mut changed = turn(5);
    changed["user"] = json!("Something else entirely.");
    let (st, r) = s.post(
        "/v1/conversations/c/turns",
        Some(A),
        &json!({"turns": [turn(40), changed], "wait": true}),
    );
    assert_eq!(st, 409, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("turns[1].turn_id") && msg.contains(&format!("PATCH /v1/memories/{}", ids[5])),
        "{msg}"
    );
    assert_eq!(r["error"]["code"], "conflict");
    assert_eq!(
        positions(&s, "c").len(),
        12,
        "nothing of the refused request stored"
    );
    let (_, m) = s.get(&format!("/v1/memories/{}", ids[5]), Some(A));
    assert!(m["user"].as_str().unwrap().contains(MARKER), "{m}");

    // Another tenant's id is not there for B, and stays for A; a bad id is a 400.
    let (st, r) = s.delete(&format!("/v1/memories/{}", ids[5]), Some(B));
    assert_eq!(st, 404, "{r}");
    assert_eq!(s.get(&format!("/v1/memories/{}", ids[5]), Some(A)).0, 200);
    let (st, r) = s.delete("/v1/memories/not-a-uuid", Some(A));
    assert_eq!(st, 400, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("memory id"),
        "{r}"
    );

    let (st, r) = s.delete(&format!("/v1/memories/{}", ids[5]), Some(A));
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["conversation_id"], "c");
    assert_eq!(r["turn_id"], "5");
    assert_eq!(r["memory_id"], ids[5].as_str());

    // Gone for every read path; a second delete finds nothing.
    assert_eq!(s.get(&format!("/v1/memories/{}", ids[5]), Some(A)).0, 404);
    assert_eq!(
        s.delete(&format!("/v1/memories/{}", ids[5]), Some(A)).0,
        404
    );
    for q in [MARKER, "zeppelin ride over Lake Constance"] {
        for m in recall(&s, q) {
            assert!(!m.to_string().contains(MARKER), "erased turn recalled: {m}");
            assert_ne!(m["memory_id"], ids[5].as_str());
        }
    }
    let expected: Vec<u64> = (0..12).filter(|p| *p != 5).collect();
    assert_eq!(positions(&s, "c"), expected, "the rest stays, in order");
    let (st, info) = s.get("/v1/conversations/c", Some(A));
    assert_eq!(st, 200);
    assert_eq!(info["recallable"], 11, "{info}");
    let hits = recall(&s, "ridge trail dog turn 7");
    assert!(
        hits.iter()
            .take(5)
            .any(|m| m["memory_id"] == ids[7].as_str()),
        "the other turns stay recallable: {hits:?}"
    );

    // Consolidation goes on across a gap in a window not yet consolidated.
    let g = store(&s, A, "g", (20..25).map(turn).collect());
    assert_eq!(s.delete(&format!("/v1/memories/{}", g[2]), Some(A)).0, 200);
    store(&s, A, "g", (25..30).map(turn).collect());
    assert!(
        consolidated(&s, "g", 0),
        "a window with an erased position is complete without it"
    );

    // The same turn id stored again is a new memory (same id, recorded after the erasure).
    let again = store(&s, A, "c", vec![turn(5)]);
    assert_eq!(again, vec![ids[5].clone()]);
    assert_eq!(s.get(&format!("/v1/memories/{}", ids[5]), Some(A)).0, 200);
    assert_eq!(recall(&s, MARKER)[0]["memory_id"], ids[5].as_str());
    // ...and erased again, for the residue check below.
    assert_eq!(
        s.delete(&format!("/v1/memories/{}", ids[5]), Some(A)).0,
        200
    );
    s.stop();
}

/// Every store opened directly: nothing of the erased turn, the rest whole.
fn residue(data: &std::path::Path) {
    let a = TenantId("tenant-a".into());
    let raw = RawStore::open(&data.join("raw.redb")).unwrap();
    let graph = EmbeddedGraph::open(&data.join("graph.redb")).unwrap();
    let vectors = EdgeVectorIndex::open(&data.join("vectors"), recollect_embed::HASH_DIM).unwrap();
    let raw_rows = raw.rows_containing(MARKER.as_bytes()).unwrap();
    let graph_rows = graph.rows_containing(MARKER.as_bytes()).unwrap();
    let graph_zeppelin = graph.rows_containing(b"zeppelin").unwrap();
    let (points, _) = vectors.audit_counts(&a, &Scope::of(&["c"])).unwrap();
    // Its own keywords' points went with it: nothing near them is left.
    let hash = recollect_embed::HashEmbedder::new(recollect_embed::HASH_DIM);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let near = |word: &str| {
        rt.block_on(vectors.search_keywords(&a, &Scope::of(&["c"]), &hash.embed_one(word), 5, 0.99))
            .unwrap()
    };
    let (marker_kw, zeppelin_kw) = (near(MARKER), near("zeppelin"));
    let (_, keyword_points) = vectors.audit_counts(&a, &Scope::of(&["c"])).unwrap();
    println!(
        "turn erasure residue: raw rows {raw_rows}, graph rows {graph_rows} (zeppelin {graph_zeppelin}), \
         keyword points near it {marker_kw:?} {zeppelin_kw:?}; turn points left {points}, keyword points left {keyword_points}"
    );
    assert_eq!(raw_rows + graph_rows + graph_zeppelin, 0);
    assert!(marker_kw.is_empty() && zeppelin_kw.is_empty());
    assert!(keyword_points > 0, "shared keywords stay");
    assert_eq!(points, 11);
    let kept = raw.rows_of(&a, Some("c")).unwrap();
    assert_eq!(kept["turns"], 11, "{kept:?}");
}
