//! Hostile input against a live server: well over 1,000 generated malformed requests on every
//! write and read endpoint. Each must get a 4xx with a JSON error naming the problem (never a
//! 5xx, never a hang), nothing may be stored, and the server must stay healthy.

use std::time::{Duration, Instant};

use recollect_tests::distributed::{Deployment, Mode};
use recollect_tests::{env_refs, hash_env};
use serde_json::{json, Value};

struct Case {
    label: String,
    method: &'static str,
    path: String,
    content_type: Option<&'static str>,
    body: Option<Vec<u8>>,
}

const TS: &str = "2023-05-08T13:56:00Z";
const TURNS: &str = "/v1/conversations/base/turns";
const FRESH: &str = "/v1/conversations/fresh/turns";

fn turn() -> Value {
    json!({"turn_id": "t1", "user": "hello there", "assistant": "hi", "user_speaker": "Ana",
           "assistant_speaker": "Bot", "timestamp": TS, "metadata": {"source": "test"}})
}

fn store_with(f: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut t = turn();
    f(&mut t);
    serde_json::to_vec(&json!({"turns": [t]})).unwrap()
}

fn recall() -> Value {
    json!({"query": "hello there", "conversation_ids": ["base"], "k": 5,
           "now": TS, "attention_state": {"entities": ["ana"], "locations": [], "events": [],
           "times": [], "bindings": {}, "turns_seen": 1}})
}

fn json_case(label: String, path: &str, body: Vec<u8>) -> Case {
    Case {
        label,
        method: "POST",
        path: path.to_string(),
        content_type: Some("application/json"),
        body: Some(body),
    }
}

/// Replaces the first occurrence of `marker` (a valid string value) by raw bytes.
fn splice(body: &[u8], marker: &str, bytes: &[u8]) -> Vec<u8> {
    let pos = body
        .windows(marker.len())
        .position(|w| w == marker.as_bytes())
        .unwrap_or_else(|| panic!("{marker} not in body"));
    let mut out = body[..pos].to_vec();
    out.extend_from_slice(bytes);
    out.extend_from_slice(&body[pos + marker.len()..]);
    out
}

fn cases() -> Vec<Case> {
    let mut v: Vec<Case> = Vec::new();
    let values: Vec<(&str, Value)> = vec![
        ("int", json!(42)),
        ("neg", json!(-1)),
        ("float", json!(1.5)),
        ("hugefloat", json!(1e300)),
        ("true", json!(true)),
        ("false", json!(false)),
        ("null", Value::Null),
        ("emptyarr", json!([])),
        ("arr", json!([1])),
        ("emptyobj", json!({})),
        ("obj", json!({"a": 1})),
        ("str", json!("x")),
        ("empty", json!("")),
        ("blank", json!("   ")),
        ("ctrl", json!("\u{1}")),
    ];
    // Wrong types and bad values for every field; the values a field accepts are skipped.
    let turn_fields: [(&str, &[&str]); 7] = [
        ("user", &["str"]),
        ("assistant", &["null", "str"]),
        ("user_speaker", &["null", "str"]),
        ("assistant_speaker", &["null", "str"]),
        ("turn_id", &["null", "str", "blank"]),
        ("timestamp", &[]),
        ("metadata", &["emptyobj", "obj"]),
    ];
    for (field, ok) in turn_fields {
        for (name, val) in &values {
            if ok.contains(name) {
                continue;
            }
            let body = store_with(|t| t[field] = val.clone());
            v.push(json_case(format!("turn.{field}={name}"), TURNS, body));
        }
    }
    for (name, val) in &values {
        v.push(json_case(
            format!("turns={name}"),
            TURNS,
            serde_json::to_vec(&json!({"turns": val})).unwrap(),
        ));
        if !["null", "true", "false"].contains(name) {
            v.push(json_case(
                format!("wait={name}"),
                TURNS,
                serde_json::to_vec(&json!({"turns": [turn()], "wait": val})).unwrap(),
            ));
        }
    }
    let recall_fields: [(&str, &[&str]); 5] = [
        ("query", &["str"]),
        ("conversation_ids", &["null"]),
        ("k", &["null", "int"]),
        ("attention_state", &["null"]),
        ("now", &["null"]),
    ];
    for (field, ok) in recall_fields {
        for (name, val) in &values {
            if ok.contains(name) {
                continue;
            }
            let mut r = recall();
            r[field] = val.clone();
            v.push(json_case(
                format!("recall.{field}={name}"),
                "/v1/recall",
                serde_json::to_vec(&r).unwrap(),
            ));
        }
    }
    // Missing required fields.
    for (label, path, body) in [
        ("no user", TURNS, json!({"turns": [{"timestamp": TS}]})),
        ("no timestamp", TURNS, json!({"turns": [{"user": "x"}]})),
        ("no turns", TURNS, json!({"wait": true})),
        ("no query", "/v1/recall", json!({"k": 3})),
    ] {
        v.push(json_case(
            label.into(),
            path,
            serde_json::to_vec(&body).unwrap(),
        ));
    }
    // Unknown fields at every level, including tenant-ish names.
    for name in ["tenant", "tenant_id", "extra", "USER", "Query", "__proto__"] {
        let mut t = turn();
        t[name] = json!("tenant-b");
        v.push(json_case(
            format!("unknown turn.{name}"),
            TURNS,
            serde_json::to_vec(&json!({"turns": [t]})).unwrap(),
        ));
        v.push(json_case(
            format!("unknown store.{name}"),
            TURNS,
            serde_json::to_vec(&json!({"turns": [turn()], name: 1})).unwrap(),
        ));
        let mut r = recall();
        r[name] = json!("tenant-b");
        v.push(json_case(
            format!("unknown recall.{name}"),
            "/v1/recall",
            serde_json::to_vec(&r).unwrap(),
        ));
        let mut r = recall();
        r["attention_state"][name] = json!(1);
        v.push(json_case(
            format!("unknown attention_state.{name}"),
            "/v1/recall",
            serde_json::to_vec(&r).unwrap(),
        ));
    }
    // Bad JSON.
    let broken: &[&[u8]] = &[
        b"{",
        b"}",
        b"{not json",
        b"{\"turns\": [",
        b"{\"turns\": [}",
        b"{'turns': []}",
        b"{\"turns\": [1,]}",
        b"{\"turns\":[{\"user\":\"a\",}]}",
        b"{\"query\": \"a\"",
        b"{\"query\" \"a\"}",
        b"{\"query\": \"a\"}}",
        b"{\"query\": \"a\"} trailing",
        b"{\"query\": \"\\x41\"}",
        b"{\"query\": \"a\nb\"}",
        b"{\"query\": \"\\u12\"}",
        b"{\"query\": NaN}",
        b"{\"query\": Infinity}",
        b"{\"k\": 01, \"query\": \"a\"}",
        b"{\"query\": \"a\", \"query\": \"b\"}",
        b"{\"turns\": [], \"turns\": []}",
        b"/* c */ {\"query\": \"a\"}",
        b"\xef\xbb\xbf{\"query\": \"a\"}",
        b"\x00",
        b"{\"query\": tru}",
        b"[[[[",
        b"\"\\",
        b"{\"\": }",
    ];
    for (i, b) in broken.iter().enumerate() {
        v.push(json_case(
            format!("broken json {i} (turns)"),
            TURNS,
            b.to_vec(),
        ));
        v.push(json_case(
            format!("broken json {i} (recall)"),
            "/v1/recall",
            b.to_vec(),
        ));
    }
    // Every prefix of valid bodies: truncated JSON.
    let full_store = serde_json::to_vec(&json!({"turns": [turn()], "wait": false})).unwrap();
    for n in 0..full_store.len() {
        v.push(json_case(
            format!("truncated store at {n}"),
            FRESH,
            full_store[..n].to_vec(),
        ));
    }
    let full_recall = serde_json::to_vec(&recall()).unwrap();
    for n in 0..full_recall.len() {
        v.push(json_case(
            format!("truncated recall at {n}"),
            "/v1/recall",
            full_recall[..n].to_vec(),
        ));
    }
    // Invalid UTF-8 and lone surrogates inside every string field.
    let bad_bytes: &[(&str, &[u8])] = &[
        ("ff", b"\xff"),
        ("c328", b"\xc3\x28"),
        ("surrogate", b"\xed\xa0\x80"),
        ("5byte", b"\xf8\x88\x80\x80\x80"),
        ("overlong", b"\xc0\xaf"),
        ("esc-lone-high", b"\\ud800"),
        ("esc-lone-low", b"\\udc00"),
    ];
    let store_body = serde_json::to_vec(&json!({"turns": [turn()]})).unwrap();
    let store_markers = [
        "t1",
        "hello there",
        "\"hi\"",
        "Ana",
        "Bot",
        "2023-05-08",
        "source",
        "test",
    ];
    let recall_body = serde_json::to_vec(&recall()).unwrap();
    let recall_markers = ["hello there", "base", "ana", TS];
    for (bname, bytes) in bad_bytes {
        for m in store_markers {
            let target = m.trim_matches('"');
            let b = splice(&store_body, target, &[target.as_bytes(), bytes].concat());
            v.push(json_case(format!("{bname} in store {target}"), TURNS, b));
        }
        for m in recall_markers {
            let b = splice(&recall_body, m, &[m.as_bytes(), bytes].concat());
            v.push(json_case(format!("{bname} in recall {m}"), "/v1/recall", b));
        }
    }
    // Control characters (tab, CR and LF are allowed in text) in every text field.
    let controls: Vec<char> = (0u32..0x20)
        .filter(|c| ![9, 10, 13].contains(c))
        .chain([0x7f, 0x80, 0x85, 0x9f])
        .filter_map(char::from_u32)
        .collect();
    for c in &controls {
        for field in [
            "user",
            "assistant",
            "user_speaker",
            "assistant_speaker",
            "turn_id",
        ] {
            let body = store_with(|t| t[field] = json!(format!("ab{c}cd")));
            v.push(json_case(
                format!("U+{:04X} in {field}", *c as u32),
                TURNS,
                body,
            ));
        }
        let mut r = recall();
        r["query"] = json!(format!("hello{c}there"));
        v.push(json_case(
            format!("U+{:04X} in query", *c as u32),
            "/v1/recall",
            serde_json::to_vec(&r).unwrap(),
        ));
        let mut r = recall();
        r["attention_state"]["entities"] = json!([format!("an{c}a")]);
        v.push(json_case(
            format!("U+{:04X} in attention_state", *c as u32),
            "/v1/recall",
            serde_json::to_vec(&r).unwrap(),
        ));
    }
    // Huge strings and over-limit counts.
    fn big(n: usize) -> String {
        "x".repeat(n)
    }
    for (label, body) in [
        (
            "user over 64 KiB",
            store_with(|t| t["user"] = json!(big(65 * 1024))),
        ),
        (
            "assistant over 64 KiB",
            store_with(|t| t["assistant"] = json!(big(65 * 1024))),
        ),
        (
            "speaker 257",
            store_with(|t| t["user_speaker"] = json!(big(257))),
        ),
        (
            "assistant speaker 1 MiB",
            store_with(|t| t["assistant_speaker"] = json!(big(1 << 20))),
        ),
        (
            "turn id 129",
            store_with(|t| t["turn_id"] = json!(big(129))),
        ),
        (
            "metadata 70 KB",
            store_with(|t| t["metadata"] = json!({"blob": big(70_000)})),
        ),
        (
            "metadata many keys",
            store_with(|t| {
                t["metadata"] = Value::Object(
                    (0..8000)
                        .map(|i| (format!("k{i}"), json!(big(8))))
                        .collect(),
                )
            }),
        ),
        (
            "year 1899",
            store_with(|t| t["timestamp"] = json!("1899-12-31T23:59:59Z")),
        ),
        (
            "year 9999",
            store_with(|t| t["timestamp"] = json!("9999-12-31T23:59:59Z")),
        ),
        (
            "month 13",
            store_with(|t| t["timestamp"] = json!("2023-13-01T00:00:00Z")),
        ),
        (
            "feb 30",
            store_with(|t| t["timestamp"] = json!("2023-02-30T00:00:00Z")),
        ),
        (
            "no zone",
            store_with(|t| t["timestamp"] = json!("2023-05-08T13:56:00")),
        ),
        (
            "far year",
            store_with(|t| t["timestamp"] = json!("+275760-09-13T00:00:00Z")),
        ),
        (
            "1001 turns",
            serde_json::to_vec(&json!({"turns": (0..1001).map(|i| {
            let mut t = turn(); t["turn_id"] = json!(i.to_string()); t }).collect::<Vec<_>>()}))
            .unwrap(),
        ),
        (
            "repeated turn ids",
            serde_json::to_vec(&json!({"turns": [turn(), turn()]})).unwrap(),
        ),
        (
            "one bad turn of three",
            serde_json::to_vec(&json!({"turns": [
            {"turn_id": "a", "user": "fine", "timestamp": TS},
            {"turn_id": "b", "user": "also fine", "timestamp": TS},
            {"turn_id": "c", "user": " ", "timestamp": TS}]}))
            .unwrap(),
        ),
    ] {
        v.push(json_case(label.into(), TURNS, body));
    }
    let mut over = vec![b'['; 0];
    over.extend(b"{\"turns\": [{\"user\": \"");
    over.extend(std::iter::repeat_n(b'x', 8 * 1024 * 1024 + 16));
    over.extend(b"\", \"timestamp\": \"2023-05-08T13:56:00Z\"}]}");
    v.push(json_case(
        "body over max_body_bytes".into(),
        TURNS,
        over.clone(),
    ));
    v.push(json_case(
        "recall body over max_body_bytes".into(),
        "/v1/recall",
        over,
    ));
    type Edit = Box<dyn Fn(&mut Value)>;
    let recall_variants: Vec<(&str, Edit)> = vec![
        ("query 4097", Box::new(|r| r["query"] = json!(big(4097)))),
        (
            "query 1 MiB",
            Box::new(|r| r["query"] = json!(big(1 << 20))),
        ),
        ("k -1", Box::new(|r| r["k"] = json!(-1))),
        ("k 0", Box::new(|r| r["k"] = json!(0))),
        ("k 1001", Box::new(|r| r["k"] = json!(1001))),
        ("k i64 max", Box::new(|r| r["k"] = json!(i64::MAX))),
        ("k i64 min", Box::new(|r| r["k"] = json!(i64::MIN))),
        ("k u64 max", Box::new(|r| r["k"] = json!(u64::MAX))),
        ("k string", Box::new(|r| r["k"] = json!("5"))),
        (
            "1001 conversation ids",
            Box::new(|r| {
                r["conversation_ids"] =
                    json!((0..1001).map(|i| format!("c{i}")).collect::<Vec<_>>())
            }),
        ),
        (
            "empty conversation ids",
            Box::new(|r| r["conversation_ids"] = json!([])),
        ),
        (
            "unknown conversation",
            Box::new(|r| r["conversation_ids"] = json!(["nobody"])),
        ),
        (
            "long conversation id",
            Box::new(|r| r["conversation_ids"] = json!([big(129)])),
        ),
        (
            "65 entities",
            Box::new(|r| {
                r["attention_state"]["entities"] =
                    json!((0..65).map(|i| format!("e{i}")).collect::<Vec<_>>())
            }),
        ),
        (
            "entity 1 MiB",
            Box::new(|r| r["attention_state"]["entities"] = json!([big(1 << 20)])),
        ),
        (
            "65 bindings",
            Box::new(|r| {
                r["attention_state"]["bindings"] = Value::Object((0..65).map(|i| (format!("b{i}"), json!({"location": null, "event": null, "time": null, "expires_after": 1}))).collect())
            }),
        ),
        (
            "time start after end",
            Box::new(
                |r| r["attention_state"]["times"] = json!([{"text": "x", "start": "2023-05-09", "end": "2023-05-01", "granularity": "day"}]),
            ),
        ),
        (
            "now year 10000",
            Box::new(|r| r["now"] = json!("+10000-01-01T00:00:00Z")),
        ),
        ("now garbage", Box::new(|r| r["now"] = json!("yesterday"))),
        (
            "turns_seen negative",
            Box::new(|r| r["attention_state"]["turns_seen"] = json!(-1)),
        ),
    ];
    for (label, f) in recall_variants {
        let mut r = recall();
        f(&mut r);
        v.push(json_case(
            label.into(),
            "/v1/recall",
            serde_json::to_vec(&r).unwrap(),
        ));
    }
    // Deep nesting.
    for depth in [200usize, 10_000, 200_000] {
        let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let b = format!("{{\"turns\": [{{\"user\": \"x\", \"timestamp\": \"{TS}\", \"metadata\": {{\"deep\": {nested}}}}}]}}");
        v.push(json_case(
            format!("metadata depth {depth}"),
            TURNS,
            b.into_bytes(),
        ));
        let b = format!("{{\"query\": \"x\", \"attention_state\": {nested}}}");
        v.push(json_case(
            format!("attention_state depth {depth}"),
            "/v1/recall",
            b.into_bytes(),
        ));
        let objs = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        v.push(json_case(
            format!("top-level object depth {depth}"),
            TURNS,
            objs.into_bytes(),
        ));
    }
    // Wrong content types, empty and non-object bodies.
    for path in [TURNS, "/v1/recall"] {
        let ok_body = if path == TURNS {
            serde_json::to_vec(&json!({"turns": [turn()]})).unwrap()
        } else {
            serde_json::to_vec(&recall()).unwrap()
        };
        for ct in [
            None,
            Some("text/plain"),
            Some("application/xml"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
            Some("application/jsonx"),
            Some("json"),
            Some(""),
        ] {
            v.push(Case {
                label: format!("content type {ct:?} on {path}"),
                method: "POST",
                path: path.into(),
                content_type: ct,
                body: Some(ok_body.clone()),
            });
        }
        for b in ["", " ", "null", "[]", "\"\"", "0", "{}", "true"] {
            v.push(json_case(
                format!("body {b:?} on {path}"),
                path,
                b.as_bytes().to_vec(),
            ));
        }
        v.push(Case {
            label: format!("no body on {path}"),
            method: "POST",
            path: path.into(),
            content_type: None,
            body: None,
        });
    }
    // Bad path parameters on every route that takes one.
    let bad_convs = [
        "bad%20id",
        "%00",
        "..%2F..",
        "%C3%BC",
        "a%2Fb",
        "%FF",
        "%3Cscript%3E",
        "a;b",
        "a%7Cb",
        "%E2%80%AE",
        "a%0Ab",
        "%",
    ];
    let long = "a".repeat(129);
    for c in bad_convs.iter().copied().chain([long.as_str()]) {
        v.push(json_case(
            format!("conversation {c} (store)"),
            &format!("/v1/conversations/{c}/turns"),
            serde_json::to_vec(&json!({"turns": [turn()]})).unwrap(),
        ));
        for method in ["GET", "DELETE"] {
            v.push(Case {
                label: format!("conversation {c} ({method})"),
                method,
                path: format!("/v1/conversations/{c}"),
                content_type: None,
                body: None,
            });
        }
        v.push(Case {
            label: format!("conversation {c} (list turns)"),
            method: "GET",
            path: format!("/v1/conversations/{c}/turns"),
            content_type: None,
            body: None,
        });
    }
    // Bad paging of both listings.
    for q in [
        "?limit=0",
        "?limit=501",
        "?limit=-1",
        "?limit=ten",
        "?limit=1.5",
        "?limit=99999999999999999999",
        "?cursor=%%",
        "?cursor=%FF",
        "?cursor=bm90LWEtY3Vyc29y",
        "?cursor=",
        "?limit=1&limit=2",
        "?colour=red",
        "?cursor[]=x",
    ] {
        for base in ["/v1/conversations", TURNS] {
            v.push(Case {
                label: format!("listing {base}{q}"),
                method: "GET",
                path: format!("{base}{q}"),
                content_type: None,
                body: None,
            });
        }
    }
    for id in [
        "not-an-id",
        "%FF",
        "00000000-0000-4000-8000-00000000000g",
        "000000000000000000000000000000000000",
        "00000000000040008000000000000000",
        "%7B00000000-0000-4000-8000-000000000000%7D",
        "-1",
        "%00",
        "00000000-0000-4000-8000-0000000000000",
        "0000000-00000-4000-8000-000000000000",
    ] {
        v.push(Case {
            label: format!("memory id {id}"),
            method: "GET",
            path: format!("/v1/memories/{id}"),
            content_type: None,
            body: None,
        });
    }
    for q in [
        "",
        "?confirm=",
        "?confirm=tenant-b",
        "?confirm=%FF",
        "?confirm=default&x=1",
        "?confirm=default%00",
        "?confirm[]=default",
        "?%",
    ] {
        v.push(Case {
            label: format!("tenant erase {q}"),
            method: "DELETE",
            path: format!("/v1/tenant{q}"),
            content_type: None,
            body: None,
        });
    }
    // Edits of the seed turn (SEED: its memory id, filled in at run time) that must change
    // nothing, and reads as of times that are not times.
    let seed = "/v1/memories/SEED";
    for (label, body) in [
        ("edit: empty object", b"{}".to_vec()),
        ("edit: not JSON", b"{user: hi}".to_vec()),
        ("edit: array", b"[]".to_vec()),
        ("edit: null", b"null".to_vec()),
        ("edit: user a number", br#"{"user": 5}"#.to_vec()),
        ("edit: user blank", br#"{"user": "   "}"#.to_vec()),
        (
            "edit: user control char",
            b"{\"user\": \"a\\u0007b\"}".to_vec(),
        ),
        ("edit: user NUL", b"{\"user\": \"a\\u0000b\"}".to_vec()),
        ("edit: metadata a list", br#"{"metadata": [1, 2]}"#.to_vec()),
        ("edit: metadata a string", br#"{"metadata": "x"}"#.to_vec()),
        (
            "edit: unknown field",
            br#"{"user": "fine", "tenant": "b"}"#.to_vec(),
        ),
        (
            "edit: turn_id",
            br#"{"user": "fine", "turn_id": "other"}"#.to_vec(),
        ),
        (
            "edit: wait a string",
            br#"{"user": "fine", "wait": "yes"}"#.to_vec(),
        ),
        ("edit: invalid UTF-8", b"{\"user\": \"\xff\xfe\"}".to_vec()),
        (
            "edit: user over the limit",
            format!(r#"{{"user": "{}"}}"#, "a".repeat(70_000)).into_bytes(),
        ),
    ] {
        v.push(Case {
            label: label.to_string(),
            method: "PATCH",
            path: seed.to_string(),
            content_type: Some("application/json"),
            body: Some(body),
        });
    }
    for q in [
        "?as_of=yesterday",
        "?as_of=",
        "?as_of=1800-01-01T00:00:00Z&x=1",
        "?asof=2024-01-01T00:00:00Z",
        "?as_of=%FF",
    ] {
        v.push(Case {
            label: format!("memory {q}"),
            method: "GET",
            path: format!("{seed}{q}"),
            content_type: None,
            body: None,
        });
    }
    for as_of in [
        json!("yesterday"),
        json!(5),
        json!("1800-01-01T00:00:00Z"),
        json!({}),
    ] {
        v.push(json_case(
            format!("recall as_of {as_of}"),
            "/v1/recall",
            serde_json::to_vec(&json!({"query": "hello", "as_of": as_of})).unwrap(),
        ));
    }
    for id in ["not-an-id", "%FF", "00000000-0000-4000-8000-000000000000"] {
        v.push(Case {
            label: format!("history of {id}"),
            method: "GET",
            path: format!("/v1/memories/{id}/history"),
            content_type: None,
            body: None,
        });
        v.push(Case {
            label: format!("edit of {id}"),
            method: "PATCH",
            path: format!("/v1/memories/{id}"),
            content_type: Some("application/json"),
            body: Some(br#"{"user": "fine"}"#.to_vec()),
        });
    }
    // Wrong methods on every route.
    for (method, path) in [
        ("DELETE", TURNS),
        ("PUT", TURNS),
        ("POST", "/v1/conversations"),
        ("DELETE", "/v1/conversations"),
        ("GET", "/v1/recall"),
        ("DELETE", "/v1/recall"),
        ("POST", "/v1/memories/00000000-0000-4000-8000-000000000000"),
        ("PATCH", "/v1/conversations/base"),
        ("POST", "/v1/tenant"),
        ("GET", "/v1/tenant"),
        ("GET", "/v1/reindex"),
        ("DELETE", "/v1/reindex"),
        ("PUT", "/v1/memories/00000000-0000-4000-8000-000000000000"),
        (
            "POST",
            "/v1/memories/00000000-0000-4000-8000-000000000000/history",
        ),
    ] {
        v.push(Case {
            label: format!("{method} {path}"),
            method,
            path: path.into(),
            content_type: Some("application/json"),
            body: Some(b"{}".to_vec()),
        });
    }
    v
}

#[test]
fn malformed_requests_get_4xx_and_store_nothing_embedded() {
    malformed_requests_get_4xx_and_store_nothing(Mode::Embedded);
}

#[test]
fn malformed_requests_get_4xx_and_store_nothing_distributed() {
    if Mode::distributed_available() {
        malformed_requests_get_4xx_and_store_nothing(Mode::Distributed);
    }
}

fn malformed_requests_get_4xx_and_store_nothing(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let env = hash_env();
    let mut s = Deployment::start(mode, dir.path(), &env_refs(&env));
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let (st, r) = s.post(
        TURNS,
        None,
        &json!({"turns": [{"turn_id": "seed", "user": "the seed turn about hello there", "timestamp": TS}], "wait": true}),
    );
    assert_eq!(st, 202, "{r}");
    let seed_id = r["memory_ids"][0].as_str().unwrap().to_string();

    let cases = cases();
    let started = Instant::now();
    let (mut tried, mut four, mut five, mut other, mut hangs) = (0, 0, 0, 0, 0);
    let mut failures: Vec<String> = Vec::new();
    let mut slowest = Duration::ZERO;
    for c in &cases {
        tried += 1;
        let m = reqwest::Method::from_bytes(c.method.as_bytes()).unwrap();
        let path = c.path.replace("SEED", &seed_id);
        let mut req = client.request(m, format!("{}{path}", s.url));
        if let Some(ct) = c.content_type {
            req = req.header("content-type", ct);
        }
        if let Some(b) = &c.body {
            req = req.body(b.clone());
        }
        let t0 = Instant::now();
        let resp = match req.send() {
            Ok(r) => r,
            Err(e) => {
                hangs += 1;
                failures.push(format!("{}: no answer: {e}", c.label));
                continue;
            }
        };
        slowest = slowest.max(t0.elapsed());
        let status = resp.status().as_u16();
        let text = resp.text().unwrap_or_default();
        match status {
            400..=499 => {
                four += 1;
                let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                let msg = body["error"]["message"].as_str().unwrap_or_default();
                if msg.trim().is_empty() || !body["error"]["code"].is_string() {
                    failures.push(format!(
                        "{}: {status} without a JSON error: {text:.200}",
                        c.label
                    ));
                }
                if status == 401 || status == 429 || status == 503 {
                    failures.push(format!("{}: {status} is not about the input", c.label));
                }
            }
            500..=599 => {
                five += 1;
                failures.push(format!("{}: {status} {text:.300}", c.label));
            }
            _ => {
                other += 1;
                failures.push(format!("{}: accepted with {status}: {text:.300}", c.label));
            }
        }
    }
    let elapsed = started.elapsed();
    let crashed = !s.all_alive();

    // Still healthy, and a valid request still works.
    assert_eq!(s.get("/healthz", None).0, 200);
    assert_eq!(s.get("/readyz", None).0, 200);
    let info = s.get("/v1/conversations/base", None).1;
    let fresh = s.get("/v1/conversations/fresh", None).0;
    let (st, r) = s.post(
        "/v1/recall",
        None,
        &json!({"query": "hello there", "k": 50}),
    );
    assert_eq!(st, 200, "{r}");
    let recalled: Vec<&str> = r["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["memory_id"].as_str().unwrap())
        .collect();
    let (st, r) = s.post(
        TURNS,
        None,
        &json!({"turns": [{"turn_id": "after", "user": "still working after the storm", "timestamp": TS}], "wait": true}),
    );
    assert_eq!(st, 202, "{r}");
    // No edit went through: the seed is at its first version.
    let (st, h) = s.get(&format!("/v1/memories/{seed_id}/history"), None);
    assert_eq!(st, 200, "{h}");
    assert_eq!(h["versions"].as_array().map(Vec::len), Some(1), "{h}");
    s.stop();
    // Residue: anything stored besides the seed turn and the final valid one.
    let residue = s.stored_turns(dir.path(), "default") as i64 - 2
        + i64::from(fresh != 404)
        + (info["turns"].as_u64().unwrap_or(0) as i64 - 1).abs()
        + (recalled.len() as i64 - 1).abs();
    println!(
        "malformed requests ({mode:?}): tried {tried}, 4xx {four}, 5xx {five}, accepted {other}, no answer {hangs}, \
         crashes {}, residue {residue}; {:.1}s total, slowest {:?}",
        u8::from(crashed),
        elapsed.as_secs_f64(),
        slowest
    );
    assert!(
        failures.is_empty(),
        "{} bad outcomes:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(tried >= 1000, "only {tried} cases");
    assert_eq!(four, tried);
    assert_eq!((five, other, hangs), (0, 0, 0));
    assert!(!crashed, "the server died");
    assert_eq!(
        residue, 0,
        "malformed requests stored something (recalled {recalled:?}, info {info})"
    );
    assert_eq!(recalled, vec![seed_id.as_str()]);
}
