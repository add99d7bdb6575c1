//! Browsing what is kept, through the real binary in both modes: a tenant's conversations and a
//! conversation's turns a page at a time (opaque cursors, limits, pages that stay put under
//! concurrent writes), each turn with its extraction; bad paging input is a 400 naming the
//! parameter; another tenant's data is not there; and the memory browser page at `/ui`.

use recollect_tests::distributed::{Deployment, Mode};
use recollect_tests::{env_refs, hash_env};
use serde_json::{json, Value};

const A: &str = "key-a";
const B: &str = "key-b";

fn turns(n: usize, from: usize) -> Value {
    let turns: Vec<Value> = (from..from + n)
        .map(|i| {
            json!({"turn_id": format!("t{i:03}"),
                   "user": format!("Turn {i}: I hiked to the lighthouse in Porto with Ines last Friday."),
                   "assistant": "That sounds lovely.", "user_speaker": "Maya",
                   "timestamp": format!("2023-05-{:02}T10:00:00Z", 1 + i % 28)})
        })
        .collect();
    json!({ "turns": turns, "wait": true })
}

fn store(s: &Deployment, key: &str, conversation: &str, n: usize) {
    let (st, r) = s.post(
        &format!("/v1/conversations/{conversation}/turns"),
        Some(key),
        &turns(n, 0),
    );
    assert_eq!(st, 202, "{r}");
}

fn page(s: &Deployment, path: &str, key: &str) -> Value {
    let (st, r) = s.get(path, Some(key));
    assert_eq!(st, 200, "{path}: {r}");
    r
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn listing_embedded() {
    listing(Mode::Embedded);
}

#[test]
fn listing_distributed() {
    if Mode::distributed_available() {
        listing(Mode::Distributed);
    }
}

fn listing(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let mut env = hash_env();
    env.push(("RECOLLECT_API_KEYS", format!("{A}:tenant-a,{B}:tenant-b")));
    let s = Deployment::start(mode, dir.path(), &env_refs(&env));
    store(&s, A, "c-1", 25);
    for c in ["c-2", "c-3", "c-4"] {
        store(&s, A, c, 2);
    }
    store(&s, B, "b-only", 2);

    // Conversations, two at a time, in ascending order.
    let p1 = page(&s, "/v1/conversations?limit=2", A);
    assert_eq!(strings(&p1["conversations"]), ["c-1", "c-2"], "{p1}");
    let cursor = p1["next_cursor"].as_str().expect("a next page").to_string();
    // A conversation created meanwhile, sorting before the cursor, shifts nothing.
    store(&s, A, "a-0", 1);
    let p2 = page(&s, &format!("/v1/conversations?limit=2&cursor={cursor}"), A);
    assert_eq!(strings(&p2["conversations"]), ["c-3", "c-4"], "{p2}");
    assert!(p2.get("next_cursor").is_none(), "last page: {p2}");
    let all = page(&s, "/v1/conversations", A);
    assert_eq!(
        strings(&all["conversations"]),
        ["a-0", "c-1", "c-2", "c-3", "c-4"]
    );
    // Tenant B sees its own conversation only.
    let b = page(&s, "/v1/conversations", B);
    assert_eq!(strings(&b["conversations"]), ["b-only"], "{b}");

    // Turns of c-1, ten at a time: 10, 10, 5, positions 0..24 in order, each extracted.
    let mut positions = Vec::new();
    let mut pages = 0;
    let mut next: Option<String> = None;
    loop {
        let path = match &next {
            None => "/v1/conversations/c-1/turns?limit=10".to_string(),
            Some(c) => format!("/v1/conversations/c-1/turns?limit=10&cursor={c}"),
        };
        let p = page(&s, &path, A);
        pages += 1;
        for t in p["turns"].as_array().unwrap() {
            positions.push(t["position"].as_u64().unwrap());
            assert_eq!(t["conversation_id"], "c-1");
            let x = &t["extraction"];
            assert!(
                x["keywords"].as_array().is_some_and(|k| !k.is_empty()),
                "an enriched turn has keywords: {t}"
            );
            assert!(
                x["locations"].to_string().contains("porto"),
                "the location is extracted: {x}"
            );
        }
        match p.get("next_cursor").and_then(Value::as_str) {
            Some(c) => next = Some(c.to_string()),
            None => break,
        }
        assert!(pages < 10, "paging does not end");
    }
    assert_eq!(positions, (0..25).collect::<Vec<u64>>());
    assert_eq!(pages, 3);

    // One memory carries its extraction too.
    let first = page(&s, "/v1/conversations/c-1/turns?limit=1", A);
    let id = first["turns"][0]["memory_id"].as_str().unwrap().to_string();
    let m = page(&s, &format!("/v1/memories/{id}"), A);
    assert_eq!(m["memory_id"], id.as_str());
    assert!(m["extraction"]["entities"].is_array(), "{m}");

    // Bad paging input: a 400 naming the parameter; unknown conversations and other tenants'
    // conversations: 404.
    let conv_cursor = p1["next_cursor"].as_str().unwrap();
    for (path, names) in [
        ("/v1/conversations?limit=0".to_string(), "limit"),
        ("/v1/conversations?limit=501".to_string(), "limit"),
        ("/v1/conversations?limit=ten".to_string(), "limit"),
        ("/v1/conversations?cursor=%%%".to_string(), "cursor"),
        (
            "/v1/conversations?cursor=bm90LWEtY3Vyc29y".to_string(),
            "cursor",
        ),
        ("/v1/conversations?colour=red".to_string(), "colour"),
        (
            format!("/v1/conversations/c-1/turns?cursor={conv_cursor}"),
            "cursor",
        ),
        ("/v1/conversations/c-1/turns?limit=-3".to_string(), "limit"),
    ] {
        let (st, r) = s.get(&path, Some(A));
        assert_eq!(st, 400, "{path}: {r}");
        assert!(
            r["error"]["message"].as_str().unwrap_or("").contains(names),
            "{path}: the message names {names}: {r}"
        );
    }
    for (path, key) in [
        ("/v1/conversations/never/turns", A),
        ("/v1/conversations/b-only/turns", A),
        ("/v1/conversations/c-1/turns", B),
    ] {
        let (st, r) = s.get(path, Some(key));
        assert_eq!(st, 404, "{path}: {r}");
    }
    assert_eq!(s.get("/v1/conversations", None).0, 401);
    assert_eq!(s.get("/v1/conversations", Some("wrong")).0, 401);

    // The memory browser: a static page, where the read path is served.
    let (st, headers, body) = s.send("GET", "/ui", &[], None);
    assert_eq!(st, 200);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(body.contains("Recollect: memory browser"));
    assert!(headers.contains_key("content-security-policy"));
}

#[test]
fn the_memory_browser_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut env = hash_env();
    env.push(("RECOLLECT__SERVER__UI", "false".into()));
    let s = Deployment::start(Mode::Embedded, dir.path(), &env_refs(&env));
    assert_eq!(s.send("GET", "/ui", &[], None).0, 404);
}
