//! The HTTP API end to end, through the real binary: the README's session, bad input, erasure,
//! tenancy.

use recollect_tests::{model_available, model_env, Server};
use serde_json::{json, Value};

fn env_refs<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(k, s)| (*k, s.as_str())).collect()
}

fn two_turns() -> Value {
    json!({"turns": [
        {"turn_id": "1", "user": "I went to the LGBTQ support group yesterday, it was so powerful.",
         "assistant": "That sounds inspiring, Caroline! What happened there?",
         "user_speaker": "Caroline", "assistant_speaker": "Melanie", "timestamp": "2023-05-08T13:56:00Z"},
        {"turn_id": "2", "user": "I painted a sunrise over the lake last week.",
         "assistant": "Lovely! Painting by the lake must be calming.",
         "user_speaker": "Melanie", "assistant_speaker": "Caroline", "timestamp": "2023-05-08T14:01:00Z"}
    ], "wait": true})
}

fn turns_of(s: &Server, conv: &str, key: Option<&str>) -> u64 {
    s.get(&format!("/v1/conversations/{conv}"), key).1["turns"]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn store_recall_get_delete_and_bad_input() {
    if !model_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let env = model_env();
    let s = Server::start(dir.path(), &env_refs(&env));

    let (st, body) = s.post("/v1/conversations/chat-1/turns", None, &two_turns());
    assert_eq!(st, 202, "{body}");
    let ids: Vec<String> = body["memory_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 2);

    // A retried request changes nothing.
    let (st, again) = s.post("/v1/conversations/chat-1/turns", None, &two_turns());
    assert_eq!(st, 202);
    assert_eq!(again["memory_ids"], body["memory_ids"]);
    assert_eq!(turns_of(&s, "chat-1", None), 2);

    let (st, r) = s.post(
        "/v1/recall",
        None,
        &json!({"query": "What did Melanie paint?", "conversation_ids": ["chat-1"], "k": 5}),
    );
    assert_eq!(st, 200, "{r}");
    let mems = r["memories"].as_array().unwrap();
    assert!(!mems.is_empty());
    assert_eq!(
        mems[0]["memory_id"], ids[1],
        "the painting turn ranks first: {r}"
    );
    assert!(!mems[0]["sources"].as_array().unwrap().is_empty());
    assert!(mems[0]["score_parts"]["fused"].as_f64().unwrap() > 0.0);

    let (st, r) = s.post(
        "/v1/recall",
        None,
        &json!({"query": "support group Caroline went to"}),
    );
    assert_eq!(st, 200);
    assert_eq!(r["memories"][0]["memory_id"], ids[0], "{r}");

    let (st, m) = s.get(&format!("/v1/memories/{}", ids[0]), None);
    assert_eq!(st, 200);
    assert!(m["user"].as_str().unwrap().contains("LGBTQ"));
    assert_eq!(s.get("/v1/memories/not-an-id", None).0, 400);
    assert_eq!(
        s.get("/v1/memories/00000000-0000-4000-8000-000000000000", None)
            .0,
        404
    );

    // Bad input: a 4xx that says what is wrong, nothing stored, the server keeps serving.
    let ts = "2023-05-08T13:56:00Z";
    let big = "x".repeat(65 * 1024);
    let cases: Vec<(Value, &str)> = vec![
        (json!({"turns": [{"user": "", "timestamp": ts}]}), "empty"),
        (
            json!({"turns": [{"user": "   \n\t", "timestamp": ts}]}),
            "empty",
        ),
        (
            json!({"turns": [{"user": "ok", "assistant": " ", "timestamp": ts}]}),
            "assistant",
        ),
        (json!({"turns": [{"user": big, "timestamp": ts}]}), "limit"),
        (
            json!({"turns": [{"user": "ok", "timestamp": "yesterday"}]}),
            "timestamp",
        ),
        (json!({"turns": [{"user": 42, "timestamp": ts}]}), "user"),
        (json!({"turns": "nope"}), "turns"),
        (json!({"turns": []}), "at least one"),
        (
            json!({"turns": [{"user": "ok", "timestamp": ts, "surprise": 1}]}),
            "surprise",
        ),
        (
            json!({"turns": [{"user": "ok", "timestamp": ts}, {"user": "", "timestamp": ts}]}),
            "turns[1]",
        ),
    ];
    for (body, needle) in cases {
        let (st, r) = s.post("/v1/conversations/chat-1/turns", None, &body);
        assert!((400..500).contains(&st), "{body} → {st}");
        let msg = r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            msg.contains(needle),
            "message {msg:?} should mention {needle:?}"
        );
        assert!(r["error"]["code"].is_string());
    }
    let (st, r) = s.post_raw(
        "/v1/conversations/chat-1/turns",
        None,
        b"{not json".to_vec(),
        "application/json",
    );
    assert_eq!(st, 400, "{r}");
    let (st, _) = s.post(
        "/v1/conversations/bad%20id/turns",
        None,
        &json!({"turns": [{"user": "ok", "timestamp": ts}]}),
    );
    assert_eq!(st, 400);
    assert_eq!(
        turns_of(&s, "chat-1", None),
        2,
        "nothing stored by bad requests"
    );
    for (body, needle) in [
        (json!({"query": "x", "k": 0}), "k must"),
        (json!({"query": "x", "k": 1001}), "k must"),
        (json!({"query": "  "}), "empty"),
        (
            json!({"query": "x", "conversation_ids": ["nope"]}),
            "unknown conversation",
        ),
        (json!({"query": 7}), "query"),
    ] {
        let (st, r) = s.post("/v1/recall", None, &body);
        assert!((400..500).contains(&st), "{body} → {st}");
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{msg:?} should mention {needle:?}");
    }
    assert_eq!(s.get("/healthz", None).0, 200);

    let (st, metrics) = s.get("/metrics", None);
    assert_eq!(st, 200);
    let text = metrics.as_str().unwrap_or_default();
    for family in [
        "recollect_gateway_turns_accepted_total",
        "recollect_gateway_turns_rejected_total",
        "recollect_pipeline_messages_total",
        "recollect_recall_duration_seconds",
        "recollect_recall_candidates_turns",
        "recollect_store_write_duration_seconds_count{backend=\"embedded\",op=\"write_turns\",seam=\"graph\"}",
        "recollect_store_read_duration_seconds_count{backend=\"edge\",op=\"search\",seam=\"vectors\"}",
    ] {
        assert!(text.contains(family), "{family} missing from /metrics");
    }

    // Erasure: gone from every read path.
    let (st, r) = s.delete("/v1/conversations/chat-1", None);
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["turns_erased"], 2);
    assert_eq!(s.get(&format!("/v1/memories/{}", ids[0]), None).0, 404);
    assert_eq!(
        s.post(
            "/v1/recall",
            None,
            &json!({"query": "painting", "conversation_ids": ["chat-1"]})
        )
        .0,
        404
    );
    let (st, r) = s.post(
        "/v1/recall",
        None,
        &json!({"query": "painting lake sunrise"}),
    );
    assert_eq!(st, 200);
    assert!(
        r["memories"].as_array().unwrap().is_empty(),
        "erased turns must not be recalled: {r}"
    );
    assert_eq!(s.delete("/v1/conversations/chat-1", None).0, 404);
}

#[test]
fn tenants_never_see_each_other() {
    if !model_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut env = model_env();
    env.push((
        "RECOLLECT_API_KEYS",
        "key-a:tenant-a,key-b:tenant-b".to_string(),
    ));
    let s = Server::start(dir.path(), &env_refs(&env));
    let (st, r) = s.post(
        "/v1/conversations/shared-name/turns",
        Some("key-a"),
        &two_turns(),
    );
    assert_eq!(st, 202, "{r}");
    let id = r["memory_ids"][0].as_str().unwrap().to_string();
    let a_ids: Vec<Value> = r["memory_ids"].as_array().unwrap().clone();
    assert_eq!(
        s.post("/v1/conversations/shared-name/turns", None, &two_turns())
            .0,
        401
    );
    assert_eq!(
        s.post("/v1/recall", Some("wrong"), &json!({"query": "painting"}))
            .0,
        401
    );
    // Tenant B: same conversation id, guessed memory id, tenant-wide recall: nothing.
    assert_eq!(
        s.post(
            "/v1/recall",
            Some("key-b"),
            &json!({"query": "painting", "conversation_ids": ["shared-name"]})
        )
        .0,
        404
    );
    let (st, rb0) = s.post(
        "/v1/recall",
        Some("key-b"),
        &json!({"query": "painting lake LGBTQ support group"}),
    );
    assert_eq!(st, 200);
    assert!(rb0["memories"].as_array().unwrap().is_empty(), "{rb0}");
    assert_eq!(s.get(&format!("/v1/memories/{id}"), Some("key-b")).0, 404);
    assert_eq!(
        s.delete("/v1/conversations/shared-name", Some("key-b")).0,
        404
    );
    // B writes its own conversation with the same name: ids differ, A's data unchanged.
    let (st, rb) = s.post(
        "/v1/conversations/shared-name/turns",
        Some("key-b"),
        &two_turns(),
    );
    assert_eq!(st, 202);
    assert_ne!(rb["memory_ids"][0], a_ids[0]);
    assert_eq!(s.get(&format!("/v1/memories/{id}"), Some("key-a")).0, 200);
    let (_, ra) = s.post(
        "/v1/recall",
        Some("key-a"),
        &json!({"query": "painting", "conversation_ids": ["shared-name"]}),
    );
    let got = ra["memories"].as_array().unwrap();
    assert_eq!(got.len(), 2, "{ra}");
    for m in got {
        assert!(
            a_ids.contains(&m["memory_id"]),
            "tenant A recalled a memory that is not its own: {m}"
        );
    }
}
