//! Recall scoped to what a platform stored, through the real binary in both modes: end users,
//! agents, a time range, speakers and metadata, alone and together, applied inside every
//! candidate path, so a filter returns k turns whenever k matching turns exist, however much
//! better other turns match; results carry user, agent, metadata and conversation; bad filters
//! are a 400 naming the field; the conversation listing by user; other tenants stay apart.

use recollect_tests::distributed::{Deployment, Mode};
use recollect_tests::{env_refs, hash_env};
use serde_json::{json, Value};

const A: &str = "key-a";
const B: &str = "key-b";

/// Maya (user u-maya, agent coach) talks about kayaking in Lisbon in many turns across two
/// conversations; Leo (u-leo) talks about kayaking even more directly, in more turns.
fn seed(s: &Deployment) {
    let post = |key: &str, conv: &str, turns: Vec<Value>| {
        let (st, r) = s.post(
            &format!("/v1/conversations/{conv}/turns"),
            Some(key),
            &json!({"turns": turns, "wait": true}),
        );
        assert_eq!(st, 202, "{r}");
    };
    let maya = |i: usize, conv_day: usize| {
        json!({"turn_id": format!("m{i:02}"),
               "user": format!("Note {i}: my sister Ines and I went kayaking near Lisbon, turn {i}."),
               "assistant": "Sounds like a good trip.",
               "user_speaker": "Maya", "assistant_speaker": "Coach",
               "timestamp": format!("2024-03-{:02}T10:00:00Z", conv_day + i % 10),
               "user_id": "u-maya",
               "agent_id": if i.is_multiple_of(2) { "coach" } else { "planner" },
               "metadata": {"channel": if i < 6 { "web" } else { "app" }, "rating": i % 3, "paid": i.is_multiple_of(2)}})
    };
    post(A, "maya-1", (0..12).map(|i| maya(i, 1)).collect());
    post(A, "maya-2", (12..20).map(|i| maya(i, 15)).collect());
    let leo: Vec<Value> = (0..30)
        .map(|i| {
            json!({"turn_id": format!("l{i:02}"),
                   "user": format!("Kayaking kayaking! I love kayaking, went kayaking again ({i})."),
                   "assistant": "Kayaking is great.",
                   "user_speaker": "Leo", "assistant_speaker": "Coach",
                   "timestamp": format!("2024-03-{:02}T12:00:00Z", 1 + i % 28),
                   "user_id": "u-leo", "agent_id": "coach",
                   "metadata": {"channel": "web", "rating": 2, "paid": true}})
        })
        .collect();
    post(A, "leo-1", leo);
    // Another tenant with the same user id: never visible to tenant A.
    post(
        B,
        "b-1",
        vec![
            json!({"turn_id": "b0", "user": "I went kayaking in Lisbon.",
                    "timestamp": "2024-03-02T10:00:00Z", "user_id": "u-maya"}),
        ],
    );
}

fn recall(s: &Deployment, key: &str, body: Value) -> Vec<Value> {
    let (st, r) = s.post("/v1/recall", Some(key), &body);
    assert_eq!(st, 200, "{body}: {r}");
    r["memories"].as_array().unwrap().clone()
}

#[test]
fn filters_embedded() {
    filters(Mode::Embedded);
}

#[test]
fn filters_distributed() {
    if Mode::distributed_available() {
        filters(Mode::Distributed);
    }
}

fn filters(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let mut env = hash_env();
    env.push(("RECOLLECT_API_KEYS", format!("{A}:tenant-a,{B}:tenant-b")));
    let s = Deployment::start(mode, dir.path(), &env_refs(&env));
    seed(&s);
    let q = "kayaking";

    // Unfiltered, Leo's turns fill the top: they match the question best.
    let all = recall(&s, A, json!({"query": q, "k": 10}));
    assert_eq!(all.len(), 10);
    assert!(
        all.iter().all(|m| m["user_id"] == "u-leo"),
        "Leo's turns rank first unfiltered: {all:?}"
    );

    // One end user: k of their turns although 30 better-matching turns fail the filter.
    let maya = recall(&s, A, json!({"query": q, "k": 15, "user_ids": ["u-maya"]}));
    assert_eq!(maya.len(), 15, "15 of Maya's 20 turns");
    for m in &maya {
        assert_eq!(m["user_id"], "u-maya", "{m}");
        assert!(m["conversation_id"] == "maya-1" || m["conversation_id"] == "maya-2");
        assert!(
            m["metadata"]["channel"].is_string(),
            "results carry metadata: {m}"
        );
        assert!(m["agent_id"].is_string(), "{m}");
    }
    // Asking for more than exist returns all of them, nothing else.
    let every = recall(&s, A, json!({"query": q, "k": 100, "user_ids": ["u-maya"]}));
    assert_eq!(every.len(), 20);

    // Each kind of condition, alone and combined; every result passes all of them.
    type Check = fn(&Value) -> bool;
    let cases: Vec<(Value, usize, Check)> = vec![
        (json!({"agent_ids": ["planner"]}), 10, |m| {
            m["agent_id"] == "planner"
        }),
        (
            json!({"user_ids": ["u-maya"], "agent_ids": ["coach"]}),
            10,
            |m| m["user_id"] == "u-maya" && m["agent_id"] == "coach",
        ),
        (
            json!({"user_ids": ["u-maya", "u-leo"], "conversation_ids": ["maya-2", "leo-1"]}),
            38,
            |m| m["conversation_id"] != "maya-1",
        ),
        (json!({"speakers": ["Maya"]}), 20, |m| {
            m["user_speaker"] == "Maya"
        }),
        (
            // maya-2's turns fall on 03-17..24 (three before the 20th); Leo's fail the speaker.
            json!({"from": "2024-03-15T00:00:00Z", "to": "2024-03-20T00:00:00Z", "speakers": ["Maya"]}),
            3,
            |m| {
                let t = m["timestamp"].as_str().unwrap();
                ("2024-03-15".."2024-03-20").contains(&t) && m["user_speaker"] == "Maya"
            },
        ),
        (
            json!({"metadata": {"channel": "web"}, "user_ids": ["u-maya"]}),
            6,
            |m| m["metadata"]["channel"] == "web" && m["user_id"] == "u-maya",
        ),
        (json!({"metadata": {"rating": 0, "paid": true}}), 4, |m| {
            m["metadata"]["rating"] == 0 && m["metadata"]["paid"] == true
        }),
        (json!({"user_ids": ["nobody"]}), 0, |_| false),
    ];
    for (filter, expected, check) in cases {
        let mut body = filter.clone();
        body["query"] = json!(q);
        body["k"] = json!(100);
        let got = recall(&s, A, body);
        assert_eq!(got.len(), expected, "{filter}: {got:?}");
        for m in &got {
            assert!(check(m), "{filter}: {m}");
        }
        // A smaller k is still filled with matching turns.
        if expected >= 3 {
            let mut body = filter.clone();
            body["query"] = json!(q);
            body["k"] = json!(3);
            let top = recall(&s, A, body);
            assert_eq!(top.len(), 3, "{filter}");
            assert!(top.iter().all(check), "{filter}: {top:?}");
        }
    }

    // Tenant B's user of the same id is B's alone.
    let b = recall(&s, B, json!({"query": q, "user_ids": ["u-maya"]}));
    assert_eq!(b.len(), 1);
    assert_eq!(b[0]["conversation_id"], "b-1");

    // The conversation listing by end user and agent.
    let list = |path: &str, key: &str| {
        let (st, r) = s.get(path, Some(key));
        assert_eq!(st, 200, "{path}: {r}");
        r["conversations"].clone()
    };
    assert_eq!(
        list("/v1/conversations?user_id=u-maya", A),
        json!(["maya-1", "maya-2"])
    );
    assert_eq!(
        list("/v1/conversations?agent_id=coach", A),
        json!(["leo-1", "maya-1", "maya-2"])
    );
    assert_eq!(
        list("/v1/conversations?user_id=u-leo&agent_id=coach&limit=1", A),
        json!(["leo-1"])
    );
    assert_eq!(list("/v1/conversations?user_id=u-maya", B), json!(["b-1"]));

    // Bad filters: a 400 naming the field, for recall and for the listing.
    for (body, field) in [
        (json!({"query": q, "user_id": ["u-maya"]}), "user_id"),
        (json!({"query": q, "user_ids": []}), "user_ids"),
        (json!({"query": q, "user_ids": ["a b"]}), "user_ids[0]"),
        (json!({"query": q, "agent_ids": "coach"}), "agent_ids"),
        (json!({"query": q, "speakers": [""]}), "speakers[0]"),
        (
            json!({"query": q, "from": "2024-03-02T00:00:00Z", "to": "2024-03-01T00:00:00Z"}),
            "from",
        ),
        (json!({"query": q, "to": "yesterday"}), "to"),
        (
            json!({"query": q, "metadata": {"tags": ["a"]}}),
            "metadata.tags",
        ),
        (json!({"query": q, "metadata": {"a.b": 1}}), "metadata.a.b"),
        (json!({"query": q, "metadata": {"x": null}}), "metadata.x"),
        (json!({"query": q, "metadata": "web"}), "metadata"),
    ] {
        let (st, r) = s.post("/v1/recall", Some(A), &body);
        assert_eq!(st, 400, "{body}: {r}");
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(field), "{body}: {msg}");
    }
    for (path, field) in [
        ("/v1/conversations?user_id=a%20b", "user_id"),
        ("/v1/conversations?agent_id=", "agent_id"),
        ("/v1/conversations?users=u-maya", "users"),
    ] {
        let (st, r) = s.get(path, Some(A));
        assert_eq!(st, 400, "{path}: {r}");
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(field), "{path}: {msg}");
    }
    // A store with a bad user id stores nothing.
    let (st, r) = s.post(
        "/v1/conversations/maya-3/turns",
        Some(A),
        &json!({"turns": [{"user": "hi", "timestamp": "2024-03-01T00:00:00Z", "user_id": "u maya"}]}),
    );
    assert_eq!(st, 400, "{r}");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("turns[0].user_id"));
    assert_eq!(
        list("/v1/conversations?user_id=u-maya", A),
        json!(["maya-1", "maya-2"])
    );
}
