//! Edits as bi-temporal versions (`PATCH /v1/memories/{id}`, `GET /v1/memories/{id}/history`,
//! `as_of` on recall and get), through the real binary in both modes: the edit is what recall
//! and get return, the old version stays in the history and is what recall and get see as of
//! an earlier time, retries are no-ops, bad edits change nothing, and an erased memory is gone
//! from every time (erasure is not history). Embedded: no residue of any version afterwards.

use recollect_model::TenantId;
use recollect_storage::{EdgeVectorIndex, EmbeddedGraph, RawStore, Scope};
use recollect_tests::distributed::{Deployment, Mode};
use recollect_tests::{env_refs, hash_env};
use serde_json::{json, Value};

const A: &str = "key-a";
const B: &str = "key-b";
const OLD: &str = "Biscuitqq";
const NEW: &str = "Pretzelqq";

fn turn(i: usize) -> Value {
    let user = if i == 3 {
        format!("I adopted a tabby cat named {OLD} from the shelter, turn {i}.")
    } else {
        format!("We walked along the river after lunch again, turn {i}.")
    };
    json!({"turn_id": i.to_string(), "user": user, "assistant": "How lovely.",
           "user_speaker": "Maya", "assistant_speaker": "Bot",
           "timestamp": format!("2024-05-{:02}T10:00:00Z", 1 + i)})
}

fn recall(s: &Deployment, body: Value) -> Vec<Value> {
    let mut body = body;
    body["k"] = json!(20);
    let (st, r) = s.post("/v1/recall", Some(A), &body);
    assert_eq!(st, 200, "{r}");
    r["memories"].as_array().unwrap().clone()
}

fn mentions(hits: &[Value], word: &str) -> bool {
    hits.iter().any(|m| m.to_string().contains(word))
}

#[test]
fn edits_embedded() {
    let dir = tempfile::tempdir().unwrap();
    edits(Mode::Embedded, dir.path());
    residue(dir.path());
}

#[test]
fn edits_distributed() {
    if Mode::distributed_available() {
        let dir = tempfile::tempdir().unwrap();
        edits(Mode::Distributed, dir.path());
    }
}

fn edits(mode: Mode, dir: &std::path::Path) {
    let mut env = hash_env();
    env.push(("RECOLLECT_API_KEYS", format!("{A}:tenant-a,{B}:tenant-b")));
    let mut s = Deployment::start(mode, dir, &env_refs(&env));
    let (st, r) = s.post(
        "/v1/conversations/e/turns",
        Some(A),
        &json!({"turns": (0..12).map(turn).collect::<Vec<_>>(), "wait": true}),
    );
    assert_eq!(st, 202, "{r}");
    let id = r["memory_ids"][3].as_str().unwrap().to_string();
    let path = format!("/v1/memories/{id}");
    let hits = recall(&s, json!({"query": format!("tabby cat {OLD}")}));
    assert_eq!(hits[0]["memory_id"], id.as_str(), "{hits:?}");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let before_edit = chrono::Utc::now();
    std::thread::sleep(std::time::Duration::from_millis(50));

    // The edit: a new version, answered once recallable.
    let (st, v2) = s.patch(
        &path,
        Some(A),
        &json!({"user": format!("I adopted a beagle puppy named {NEW} from the shelter."), "wait": true}),
    );
    assert_eq!(st, 202, "{v2}");
    assert_eq!(v2["version"], 2, "{v2}");
    assert_eq!(v2["memory_id"], id.as_str());
    assert_eq!(v2["assistant"], "How lovely.", "fields not named stay");
    let (st, m) = s.get(&path, Some(A));
    assert_eq!(st, 200, "{m}");
    assert!(m["user"].as_str().unwrap().contains(NEW), "{m}");
    assert!(
        m["extraction"]["keywords"].to_string().contains("beagl"),
        "the new version is enriched: {m}"
    );

    // History: both versions, the old one expired when the edit was recorded.
    let (st, h) = s.get(&format!("{path}/history"), Some(A));
    assert_eq!(st, 200, "{h}");
    let versions = h["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2, "{h}");
    assert!(versions[0]["user"].as_str().unwrap().contains(OLD));
    assert_eq!(versions[0]["expired_at"], v2["recorded_at"], "{h}");
    assert!(versions[1]["expired_at"].is_null() && versions[1]["version"] == 2);

    // Recall of the present returns the current version only.
    let hits = recall(&s, json!({"query": format!("beagle puppy {NEW}")}));
    assert_eq!(hits[0]["memory_id"], id.as_str(), "{hits:?}");
    assert!(hits[0]["user"].as_str().unwrap().contains(NEW));
    let hits = recall(&s, json!({"query": format!("tabby cat {OLD}")}));
    assert!(!mentions(&hits, OLD), "an old version recalled: {hits:?}");

    // As of before the edit: the old version, found by its own words, and nothing of the new.
    let at = before_edit.to_rfc3339();
    let hits = recall(
        &s,
        json!({"query": format!("tabby cat {OLD}"), "as_of": at}),
    );
    assert_eq!(hits[0]["memory_id"], id.as_str(), "{hits:?}");
    assert!(hits[0]["user"].as_str().unwrap().contains(OLD), "{hits:?}");
    let hits = recall(
        &s,
        json!({"query": format!("beagle puppy {NEW}"), "as_of": at}),
    );
    assert!(
        !mentions(&hits, NEW),
        "the edit seen before it was made: {hits:?}"
    );
    assert_eq!(
        hits.len(),
        12,
        "every turn recorded by then, once: {hits:?}"
    );
    let (st, old) = s.get(&format!("{path}?as_of={}", urlencode(&at)), Some(A));
    assert_eq!(st, 200, "{old}");
    assert!(old["user"].as_str().unwrap().contains(OLD), "{old}");
    assert!(
        old["extraction"]["keywords"].to_string().contains("tabbi"),
        "{old}"
    );
    // Before anything was stored: nothing.
    let long_ago = "2001-01-01T00:00:00Z";
    assert!(recall(&s, json!({"query": "river walk", "as_of": long_ago})).is_empty());
    assert_eq!(s.get(&format!("{path}?as_of={long_ago}"), Some(A)).0, 404);

    // Retries: the first store again is a no-op (it does not undo the edit); the same edit
    // again makes no version; the turn id with new content is a 409 naming the edit endpoint.
    let (st, r) = s.post(
        "/v1/conversations/e/turns",
        Some(A),
        &json!({"turns": [turn(3)], "wait": true}),
    );
    assert_eq!(
        (st, r["memory_ids"][0].as_str()),
        (202, Some(id.as_str())),
        "{r}"
    );
    let (st, again) = s.patch(
        &path,
        Some(A),
        &json!({"user": format!("I adopted a beagle puppy named {NEW} from the shelter."), "wait": true}),
    );
    assert_eq!((st, again["version"].as_u64()), (202, Some(2)), "{again}");
    let mut changed = turn(3);
    changed["user"] = json!("Something else entirely.");
    let (st, r) = s.post(
        "/v1/conversations/e/turns",
        Some(A),
        &json!({"turns": [changed]}),
    );
    assert_eq!(st, 409, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("PATCH {path}")),
        "{r}"
    );
    let (_, m) = s.get(&path, Some(A));
    assert!(
        m["user"].as_str().unwrap().contains(NEW),
        "still the edit: {m}"
    );

    // Metadata edits are versions too, and filters see the current metadata.
    let (st, v3) = s.patch(
        &path,
        Some(A),
        &json!({"metadata": {"pet": "dog"}, "wait": true}),
    );
    assert_eq!((st, v3["version"].as_u64()), (202, Some(3)), "{v3}");
    let hits = recall(&s, json!({"query": "adopted", "metadata": {"pet": "dog"}}));
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0]["memory_id"], id.as_str());
    let (_, h) = s.get(&format!("{path}/history"), Some(A));
    assert_eq!(h["versions"].as_array().unwrap().len(), 3, "{h}");

    // Bad edits: 4xx naming the field, nothing changed.
    for (body, want) in [
        (json!({}), "at least one of user, assistant, metadata"),
        (json!({"user": "  "}), "patch.user"),
        (json!({"user": "a\u{1}b"}), "patch.user"),
        (json!({"tenant": "b"}), "tenant"),
        (json!({"metadata": [1]}), "metadata"),
    ] {
        let (st, r) = s.patch(&path, Some(A), &body);
        assert_eq!(st, 400, "{body} → {r}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains(want),
            "{body} → {r}"
        );
    }
    assert_eq!(
        s.patch("/v1/memories/nope", Some(A), &json!({"user": "x"}))
            .0,
        400
    );
    // Another tenant's memory is not there for B, for edit, history and get.
    assert_eq!(s.patch(&path, Some(B), &json!({"user": "mine now"})).0, 404);
    assert_eq!(s.get(&format!("{path}/history"), Some(B)).0, 404);
    assert_eq!(s.get(&format!("{path}?as_of={long_ago}"), Some(B)).0, 404);
    assert_eq!(s.get(&format!("{path}?as_of=yesterday"), Some(A)).0, 400);
    assert_eq!(
        s.get(&format!("{path}?asof=2024-01-01T00:00:00Z"), Some(A))
            .0,
        400
    );
    let (st, r) = s.post(
        "/v1/recall",
        Some(A),
        &json!({"query": "x", "as_of": "1800-01-01T00:00:00Z"}),
    );
    assert_eq!(st, 400, "{r}");
    let (_, h) = s.get(&format!("{path}/history"), Some(A));
    assert_eq!(
        h["versions"].as_array().unwrap().len(),
        3,
        "nothing changed: {h}"
    );

    // Erasure is not history: gone now and at every earlier time, every version.
    assert_eq!(s.delete(&path, Some(A)).0, 200);
    assert_eq!(s.get(&format!("{path}/history"), Some(A)).0, 404);
    assert_eq!(
        s.get(&format!("{path}?as_of={}", urlencode(&at)), Some(A))
            .0,
        404
    );
    assert_eq!(s.patch(&path, Some(A), &json!({"user": "back?"})).0, 404);
    for q in [format!("tabby cat {OLD}"), format!("beagle puppy {NEW}")] {
        for body in [json!({"query": q}), json!({"query": q, "as_of": at})] {
            let hits = recall(&s, body);
            assert!(
                !mentions(&hits, OLD) && !mentions(&hits, NEW) && !mentions(&hits, &id),
                "an erased memory recalled: {hits:?}"
            );
        }
    }
    s.stop();
}

fn urlencode(s: &str) -> String {
    s.replace('+', "%2B").replace(':', "%3A")
}

/// Every store opened directly: no version of the erased memory anywhere.
fn residue(data: &std::path::Path) {
    let a = TenantId("tenant-a".into());
    let raw = RawStore::open(&data.join("raw.redb")).unwrap();
    let graph = EmbeddedGraph::open(&data.join("graph.redb")).unwrap();
    let vectors = EdgeVectorIndex::open(&data.join("vectors"), recollect_embed::HASH_DIM).unwrap();
    let mut found = 0;
    for word in [OLD, NEW, "biscuitqq", "pretzelqq", "tabbi", "beagl"] {
        let (r, g) = (
            raw.rows_containing(word.as_bytes()).unwrap(),
            graph.rows_containing(word.as_bytes()).unwrap(),
        );
        if r + g > 0 {
            println!("{word}: raw {r}, graph {g}");
        }
        found += r + g;
    }
    let (points, _) = vectors.audit_counts(&a, &Scope::of(&["e"])).unwrap();
    let kept = raw.rows_of(&a, Some("e")).unwrap();
    println!("edit residue: rows naming any version {found}; turn points (kept versions included) {points}; raw {kept:?}");
    assert_eq!(found, 0);
    assert_eq!(points, 11, "11 turns, no kept version of the erased one");
    assert_eq!(kept["turn_versions"], 0, "{kept:?}");
}

/// `recollect edit`, `recollect history` and `recollect recall --as-of` on a data directory.
#[test]
fn edit_history_and_as_of_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let cli = |args: &[&str]| {
        let (ok, out, err) = recollect_tests::cli(data, args);
        assert!(ok, "{args:?}: {out} {err}");
        out
    };
    let file = data.join("turns.jsonl");
    std::fs::create_dir_all(data).unwrap();
    std::fs::write(
        &file,
        format!(
            "{}\n",
            json!({"conversation_id": "c", "turn_id": "t1", "timestamp": "2024-05-01T10:00:00Z",
                   "user": format!("I adopted a tabby cat named {OLD}.")})
        ),
    )
    .unwrap();
    cli(&["ingest", file.to_str().unwrap()]);
    let id = recollect_model::MemoryId::of_turn(&TenantId("default".into()), "c", "t1").to_string();
    let before = chrono::Utc::now().to_rfc3339();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let edited: Value = serde_json::from_str(&cli(&[
        "edit",
        &id,
        "--user",
        &format!("I adopted a beagle named {NEW}."),
        "--metadata",
        r#"{"source": "cli"}"#,
    ]))
    .unwrap();
    assert_eq!(edited["version"], 2, "{edited}");
    let h: Value = serde_json::from_str(&cli(&["history", &id])).unwrap();
    assert_eq!(h["versions"].as_array().unwrap().len(), 2, "{h}");
    let now = cli(&["recall", "adopted", "--json"]);
    assert!(now.contains(NEW) && !now.contains(OLD), "{now}");
    let then = cli(&["recall", "adopted", "--json", "--as-of", &before]);
    assert!(then.contains(OLD) && !then.contains(NEW), "{then}");

    // Export carries every version; import into another data dir replays them, once.
    let out = data.join("export.jsonl");
    cli(&["export", "--out", out.to_str().unwrap()]);
    let line: Value = serde_json::from_str(std::fs::read_to_string(&out).unwrap().trim()).unwrap();
    assert_eq!(line["version"], 2, "{line}");
    assert!(
        line["history"][0]["user"].as_str().unwrap().contains(OLD),
        "{line}"
    );
    let other = tempfile::tempdir().unwrap();
    let cli2 = |args: &[&str]| {
        let (ok, out, err) = recollect_tests::cli(other.path(), args);
        assert!(ok, "{args:?}: {err}");
        out
    };
    for _ in 0..2 {
        cli2(&["import", out.to_str().unwrap()]);
        let h: Value = serde_json::from_str(&cli2(&["history", &id])).unwrap();
        let texts: Vec<&str> = h["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["user"].as_str().unwrap())
            .collect();
        assert_eq!(texts.len(), 2, "{h}");
        assert!(texts[0].contains(OLD) && texts[1].contains(NEW), "{h}");
        assert_eq!(h["versions"][1]["metadata"]["source"], "cli", "{h}");
    }
}
