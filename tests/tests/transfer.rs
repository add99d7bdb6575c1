//! `recollect import` and `recollect export` through the real binary: each format (files the
//! test writes itself, never LoCoMo data), idempotent re-imports, export → import → export
//! giving the same turns, a malformed file storing nothing, and a running server as the target.

use std::path::Path;
use std::process::Command;

use recollect_tests::{binary, cli, env_refs, hash_env, Server};
use serde_json::{json, Value};

/// Exported lines, without what differs between two stores of the same turns.
fn export(data: &Path) -> Vec<Value> {
    let (ok, out, err) = cli(data, &["export"]);
    assert!(ok, "{err}");
    out.lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("recorded_at");
            v
        })
        .collect()
}

fn files(dir: &Path) -> Vec<(&'static str, std::path::PathBuf, usize, usize)> {
    let write = |name: &str, v: &Value| {
        let p = dir.join(name);
        std::fs::write(&p, v.to_string()).unwrap();
        p
    };
    let chatgpt = json!([{"id": "6f1c", "title": "Trip", "create_time": 1_700_000_000.0,
        "current_node": "n3", "mapping": {
            "root": {"id": "root", "parent": null, "message": null},
            "n0": {"id": "n0", "parent": "root", "message": {"id": "sys", "author": {"role": "system"},
                   "content": {"content_type": "text", "parts": [""]}}},
            "n1": {"id": "n1", "parent": "n0", "message": {"id": "m1", "author": {"role": "user"},
                   "create_time": 1_700_000_010.0, "content": {"content_type": "text", "parts": ["Plan a canoe trip on the Danube"]}}},
            "n2": {"id": "n2", "parent": "n1", "message": {"id": "m2", "author": {"role": "assistant"},
                   "create_time": 1_700_000_020.0, "content": {"content_type": "text", "parts": ["Start in Passau."]}}},
            "n3": {"id": "n3", "parent": "n2", "message": {"id": "m3", "author": {"role": "user"},
                   "create_time": 1_700_000_030.0, "content": {"content_type": "text", "parts": ["And then Vienna"]}}}}}]);
    let sharegpt = json!([{"id": "sg-1", "conversations": [
        {"from": "human", "value": "What is a good sourdough hydration?"},
        {"from": "gpt", "value": "Around 75 percent."},
        {"from": "human", "value": "And the bake time?"},
        {"from": "gpt", "value": "About 40 minutes."}]}]);
    let locomo = json!([{"sample_id": "conv-x", "qa": [], "conversation": {
        "speaker_a": "Ana", "speaker_b": "Ben",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ana", "dia_id": "D1:1", "text": "I started pottery classes."},
            {"speaker": "Ben", "dia_id": "D1:2", "text": "Nice, what did you make?"},
            {"speaker": "Ana", "dia_id": "D1:3", "text": "A blue bowl."}]}}]);
    let longmemeval = json!([{"question_id": "q1", "question": "?", "answer": "",
        "haystack_session_ids": ["sess-a", "sess-b"],
        "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/22 (Mon) 09:00"],
        "haystack_sessions": [
            [{"role": "user", "content": "I adopted a cat named Miso."},
             {"role": "assistant", "content": "Congratulations!"}],
            [{"role": "user", "content": "Miso likes tuna."}]]}]);
    let recollect: String = (0..3)
        .map(|i| {
            json!({"format": "recollect.v1", "conversation_id": "native", "turn_id": format!("t{i}"),
                   "memory_id": "ignored", "position": 99, "recorded_at": "2020-01-01T00:00:00Z",
                   "user": format!("Native turn {i} about glassblowing."),
                   "timestamp": format!("2024-02-0{}T08:00:00Z", i + 1),
                   "user_id": "u-7", "metadata": {"source": "test", "n": i}})
            .to_string()
                + "\n"
        })
        .collect();
    let native = dir.join("native.jsonl");
    std::fs::write(&native, recollect).unwrap();
    // (format, file, conversations, turns)
    vec![
        ("chatgpt", write("conversations.json", &chatgpt), 1, 2),
        ("sharegpt", write("sharegpt.json", &sharegpt), 1, 2),
        ("locomo", write("locomo.json", &locomo), 1, 2),
        ("longmemeval", write("longmemeval.json", &longmemeval), 2, 2),
        ("recollect", native, 1, 3),
    ]
}

#[test]
fn every_format_imports_idempotently_and_exports_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut total = 0;
    for (format, file, convs, turns) in files(tmp.path()) {
        let (ok, _, err) = cli(&data, &["import", file.to_str().unwrap()]);
        assert!(ok, "{format}: {err}");
        assert!(
            err.contains(&format!("{turns} turns of {convs} conversations")),
            "{format} (auto-detected): {err}"
        );
        total += turns;
        // Again, with the format named: nothing new.
        let (ok, _, err) = cli(
            &data,
            &["import", file.to_str().unwrap(), "--format", format],
        );
        assert!(ok, "{format} again: {err}");
        assert_eq!(
            export(&data).len(),
            total,
            "{format}: a re-import stores nothing new"
        );
    }
    let lines = export(&data);
    let by_conv =
        |c: &str| -> Vec<&Value> { lines.iter().filter(|l| l["conversation_id"] == c).collect() };
    let gpt = by_conv("6f1c");
    assert_eq!(gpt[0]["user"], "Plan a canoe trip on the Danube");
    assert_eq!(gpt[0]["assistant"], "Start in Passau.");
    assert_eq!(gpt[0]["timestamp"], "2023-11-14T22:13:30Z");
    assert_eq!(gpt[1]["user"], "And then Vienna");
    let loc = by_conv("conv-x");
    assert_eq!(loc[0]["user_speaker"], "Ana");
    assert_eq!(loc[0]["assistant_speaker"], "Ben");
    assert_eq!(loc[0]["turn_id"], "D1:1+D1:2");
    assert_eq!(by_conv("sess-b")[0]["timestamp"], "2023-05-22T09:00:00Z");
    let native = by_conv("native");
    assert_eq!(native[2]["metadata"], json!({"source": "test", "n": 2}));
    assert_eq!(native[2]["user_id"], "u-7");
    assert_eq!(
        native[2]["position"], 2,
        "positions are the store's, not the file's"
    );
    assert!(lines.iter().all(|l| l["format"] == "recollect.v1"));

    // Export → import into another data dir → export: the same turns, ids and positions.
    let dump = tmp.path().join("dump.jsonl");
    let (ok, _, err) = cli(&data, &["export", "--out", dump.to_str().unwrap()]);
    assert!(ok, "{err}");
    let other = tmp.path().join("other");
    let (ok, _, err) = cli(&other, &["import", dump.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(export(&other), lines);
    // One conversation only; one end user's turns.
    let (ok, out, err) = cli(&other, &["export", "--conversation", "native"]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 3);
    let (ok, out, err) = cli(&other, &["export", "--user", "u-7"]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 3);
    let (ok, _, err) = cli(&other, &["export", "--conversation", "nope"]);
    assert!(!ok && err.contains("\"nope\" not found"), "{err}");
}

#[test]
fn a_malformed_file_names_the_problem_and_stores_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let bad_line = tmp.path().join("bad.jsonl");
    std::fs::write(
        &bad_line,
        "{\"conversation_id\":\"c\",\"turn_id\":\"1\",\"user\":\"fine\",\"timestamp\":\"2024-01-01T00:00:00Z\"}\n\
         {\"conversation_id\":\"c\",\"turn_id\":\"2\",\"user\":\"fine too\",\"timestamp\":\"2024-01-01T00:00:00Z\"}\n\
         {not json}\n",
    )
    .unwrap();
    let no_mapping = tmp.path().join("conversations.json");
    std::fs::write(&no_mapping, r#"[{"id": "x", "current_node": "n1"}]"#).unwrap();
    let empty_text = tmp.path().join("empty.jsonl");
    std::fs::write(
        &empty_text,
        "{\"conversation_id\":\"c\",\"user\":\"  \",\"timestamp\":\"2024-01-01T00:00:00Z\"}\n",
    )
    .unwrap();
    for (file, format, says) in [
        (&bad_line, "auto", "line 3"),
        (
            &no_mapping,
            "chatgpt",
            "conversation [0].mapping is missing",
        ),
        (&empty_text, "auto", "turns[0].user is empty"),
    ] {
        let (ok, _, err) = cli(
            &data,
            &["import", file.to_str().unwrap(), "--format", format],
        );
        assert!(!ok, "{format}: accepted");
        assert!(err.contains(says), "{format}: {err}");
    }
    assert!(export(&data).is_empty(), "nothing stored");
}

#[test]
fn import_and_export_through_a_running_server() {
    let tmp = tempfile::tempdir().unwrap();
    let mut env = hash_env();
    env.push(("RECOLLECT_API_KEYS", "key-a:tenant-a".to_string()));
    let server_dir = tmp.path().join("server");
    std::fs::create_dir_all(&server_dir).unwrap();
    let mut s = Server::start(&server_dir, &env_refs(&env));
    let (_, file, _, turns) = files(tmp.path()).pop().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(binary())
            .args(args)
            .args(["--server", &s.url])
            .env("RECOLLECT_API_KEY", "key-a")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for _ in 0..2 {
        let (ok, _, err) = run(&["import", file.to_str().unwrap()]);
        assert!(ok, "{err}");
    }
    let (ok, out, err) = run(&["export"]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), turns, "imported twice, stored once");
    // By end user: the participant index is the graph's, written a moment after the 202s.
    let mut lines = 0;
    for _ in 0..100 {
        let (ok, out, err) = run(&["export", "--user", "u-7"]);
        assert!(ok, "{err}");
        lines = out.lines().count();
        if lines == turns {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(lines, turns);
    let (ok, out, _) = run(&["export", "--user", "someone-else"]);
    assert!(ok);
    assert_eq!(out.lines().count(), 0);
    s.stop();
}
