//! `POST /v1/admin/backup` / `recollect backup` while turns keep arriving, then `recollect
//! restore`: the copy opens as a data directory of its own, holds every turn accepted before
//! the backup began, and every turn in it becomes recallable (what the copy caught half-way is
//! finished at the first start). The operator endpoint refuses tenants' keys and bad paths and
//! changes nothing then; a distributed gateway says where its backups come from.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use recollect_tests::distributed::{Deployment, Mode};
use recollect_tests::{env_refs, hash_env};
use serde_json::{json, Value};

const A: &str = "key-a";

/// Memory ids of the batches stored so far, by batch.
type Accepted = Arc<Mutex<Vec<(usize, Vec<String>)>>>;
const ADMIN: &str = "admin-secret";

fn env() -> Vec<(&'static str, String)> {
    let mut env = hash_env();
    env.push(("RECOLLECT_API_KEYS", format!("{A}:tenant-a")));
    env.push(("RECOLLECT__SERVER__ADMIN_KEY", ADMIN.to_string()));
    env
}

fn batch(b: usize) -> Value {
    let turns: Vec<Value> = (0..25)
        .map(|i| {
            json!({"turn_id": format!("{b}-{i}"), "timestamp": "2024-06-01T10:00:00Z",
                   "user": format!("Batch {b} turn {i}: we talked about kayaks, bread and the river.")})
        })
        .collect();
    json!({"turns": turns})
}

/// The CLI on a data dir: (success, stdout and stderr).
fn cli(data: &std::path::Path, args: &[&str]) -> (bool, String) {
    let (ok, out, err) = recollect_tests::cli(data, args);
    (ok, format!("{out}{err}"))
}

#[test]
fn backup_while_ingesting_then_restore_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let env = env();
    let mut s = Deployment::start(Mode::Embedded, &data, &env_refs(&env));
    let url = s.url.clone();
    let accepted: Accepted = Arc::default();
    let writer = {
        let (accepted, url) = (accepted.clone(), url.clone());
        std::thread::spawn(move || {
            let c = reqwest::blocking::Client::new();
            for b in 0..40 {
                let r = c
                    .post(format!("{url}/v1/conversations/c{}/turns", b % 4))
                    .bearer_auth(A)
                    .json(&batch(b))
                    .send()
                    .unwrap();
                assert_eq!(r.status().as_u16(), 202);
                let v: Value = r.json().unwrap();
                let ids = v["memory_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m.as_str().unwrap().to_string())
                    .collect();
                accepted.lock().unwrap().push((b, ids));
            }
        })
    };
    while accepted.lock().unwrap().len() < 10 {
        std::thread::sleep(Duration::from_millis(10));
    }
    let before: Vec<String> = accepted
        .lock()
        .unwrap()
        .iter()
        .flat_map(|(_, ids)| ids.clone())
        .collect();
    let to = dir.path().join("backup");
    // Refused, nothing written: a tenant's key, no key, a relative path, a non-empty directory.
    for (key, path, want) in [
        (Some(A), to.to_str().unwrap().to_string(), 401),
        (None, to.to_str().unwrap().to_string(), 401),
        (Some(ADMIN), "relative/dir".to_string(), 400),
        (Some(ADMIN), data.to_str().unwrap().to_string(), 400),
    ] {
        let (st, r) = s.post("/v1/admin/backup", key, &json!({"path": path}));
        assert_eq!(st, want, "{path}: {r}");
    }
    assert!(!to.exists());
    let started = Instant::now();
    let (st, done) = s.post(
        "/v1/admin/backup",
        Some(ADMIN),
        &json!({"path": to.to_str().unwrap()}),
    );
    assert_eq!(st, 200, "{done}");
    println!(
        "backup during ingest: {} bytes, writes paused {} ms, answered in {:?}",
        done["bytes"],
        done["paused_ms"],
        started.elapsed()
    );
    assert_eq!(done["not_included"], json!([]), "{done}");
    // Recall answered throughout; ingest goes on after.
    let (st, _) = s.post("/v1/recall", Some(A), &json!({"query": "kayaks"}));
    assert_eq!(st, 200);
    writer.join().unwrap();
    let total: usize = accepted
        .lock()
        .unwrap()
        .iter()
        .map(|(_, ids)| ids.len())
        .sum();
    s.stop();

    let restored = dir.path().join("restored");
    let (ok, out) = cli(&restored, &["restore", to.to_str().unwrap()]);
    assert!(ok, "{out}");
    let (ok, out) = cli(&restored, &["restore", to.to_str().unwrap()]);
    assert!(
        !ok && out.contains("not empty"),
        "restoring over data refused: {out}"
    );
    let r = Deployment::start(Mode::Embedded, &restored, &env_refs(&env));
    // Every turn in the copy becomes recallable (pending ones are finished at start).
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut turns, mut recallable) = (0, 0);
    while Instant::now() < deadline {
        (turns, recallable) = (0, 0);
        for c in 0..4 {
            let (st, info) = r.get(&format!("/v1/conversations/c{c}"), Some(A));
            if st == 200 {
                turns += info["turns"].as_u64().unwrap();
                recallable += info["recallable"].as_u64().unwrap();
            }
        }
        if turns == recallable {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "restored: {turns} turns ({} accepted before the backup, {total} in all), {recallable} recallable",
        before.len()
    );
    assert_eq!(turns, recallable, "every turn of the copy recallable");
    assert!(turns as usize >= before.len() && turns as usize <= total);
    for id in &before {
        let (st, m) = r.get(&format!("/v1/memories/{id}"), Some(A));
        assert_eq!(st, 200, "{id}: {m}");
        assert!(m["extraction"].is_object(), "{m}");
    }
    let (st, hits) = r.post(
        "/v1/recall",
        Some(A),
        &json!({"query": "kayaks bread river", "k": 5}),
    );
    assert_eq!(
        (st, hits["memories"].as_array().map(Vec::len)),
        (200, Some(5)),
        "{hits}"
    );
}

#[test]
fn backup_of_a_data_dir_and_the_endpoint_off_without_an_admin_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut env = hash_env();
    env.push(("RECOLLECT_API_KEYS", format!("{A}:tenant-a")));
    let mut s = Deployment::start(Mode::Embedded, &data, &env_refs(&env));
    let (st, r) = s.post("/v1/conversations/c/turns", Some(A), &{
        let mut b = batch(0);
        b["wait"] = json!(true);
        b
    });
    assert_eq!(st, 202, "{r}");
    let (st, r) = s.post("/v1/admin/backup", Some(ADMIN), &json!({"path": "/tmp/x"}));
    assert_eq!(st, 404, "off without server.admin_key: {r}");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("server.admin_key"));
    s.stop();
    let to = dir.path().join("copy");
    let (ok, out) = cli(&data, &["backup", "--to", to.to_str().unwrap()]);
    assert!(ok, "{out}");
    let restored = dir.path().join("restored");
    let (ok, out) = cli(&restored, &["restore", to.to_str().unwrap()]);
    assert!(ok && out.contains("restored 25 turns"), "{out}");
}

#[test]
fn a_distributed_gateway_names_the_tools_for_backups() {
    if !Mode::distributed_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let env = env();
    let s = Deployment::start(Mode::Distributed, dir.path(), &env_refs(&env));
    let (st, r) = s.post("/v1/admin/backup", Some(ADMIN), &json!({"path": "/tmp/x"}));
    assert_eq!(st, 400, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("own tools"),
        "{r}"
    );
}
