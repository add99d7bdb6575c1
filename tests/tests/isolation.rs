//! Tenant isolation through the real binary: tenant A's key against tenant B's data on every
//! HTTP endpoint finds nothing and changes nothing. B's data is snapshotted through B's key
//! before and after, and must be identical.

use recollect_model::{MemoryId, TenantId};
use recollect_tests::distributed::{Deployment, Mode};
use recollect_tests::{env_refs, hash_env, Server};
use serde_json::{json, Value};

const A: &str = "key-a";
const B: &str = "key-b";

fn turns(prefix: &str) -> Value {
    json!({"turns": [
        {"turn_id": "1", "user": format!("{prefix} I adopted a greyhound named Biscuit in Lisbon."),
         "assistant": "Congratulations on Biscuit!", "user_speaker": "Maya", "assistant_speaker": "Bot",
         "timestamp": "2023-05-08T13:56:00Z", "user_id": "b-user", "agent_id": "b-agent",
         "metadata": {"owner": "b"}},
        {"turn_id": "2", "user": format!("{prefix} My sister Ines visits next Friday for the marathon."),
         "assistant": "Good luck to Ines at the marathon.", "timestamp": "2023-05-08T14:01:00Z"},
        {"turn_id": "3", "user": format!("{prefix} Biscuit hates the rain in Lisbon."),
         "timestamp": "2023-05-09T09:00:00Z"}
    ], "wait": true})
}

/// Everything B can see of its own data, through B's key.
fn snapshot(s: &Server, convs: &[&str], ids: &[String]) -> Value {
    let mut out = serde_json::Map::new();
    for c in convs {
        out.insert(
            format!("info:{c}"),
            s.get(&format!("/v1/conversations/{c}"), Some(B)).1,
        );
    }
    for id in ids {
        let (st, m) = s.get(&format!("/v1/memories/{id}"), Some(B));
        out.insert(format!("memory:{id}"), json!([st, m]));
        let (st, h) = s.get(&format!("/v1/memories/{id}/history"), Some(B));
        out.insert(format!("history:{id}"), json!([st, h]));
    }
    let (st, r) = s.post(
        "/v1/recall",
        Some(B),
        &json!({"query": "greyhound Biscuit Lisbon sister Ines marathon rain", "k": 50}),
    );
    assert_eq!(st, 200, "{r}");
    let mut got: Vec<String> = r["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["memory_id"].as_str().unwrap().to_string())
        .collect();
    got.sort();
    out.insert("recall".into(), json!(got));
    out.insert(
        "conversations:b-user".into(),
        s.get("/v1/conversations?user_id=b-user", Some(B)).1,
    );
    Value::Object(out)
}

fn ids_of(r: &Value) -> Vec<String> {
    r["memory_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// The error body minus the name that was asked for: a foreign id and a never-used id must
/// look the same, or the answer would tell A that B has it.
fn shape(st: u16, body: &Value, name: &str) -> String {
    format!("{st} {}", body.to_string().replace(name, "<name>"))
}

#[test]
fn tenant_a_cannot_reach_tenant_b_embedded() {
    tenant_a_cannot_reach_tenant_b(Mode::Embedded);
}

#[test]
fn tenant_a_cannot_reach_tenant_b_distributed() {
    if Mode::distributed_available() {
        tenant_a_cannot_reach_tenant_b(Mode::Distributed);
    }
}

fn tenant_a_cannot_reach_tenant_b(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let mut env = hash_env();
    env.push(("RECOLLECT_API_KEYS", format!("{A}:tenant-a,{B}:tenant-b")));
    let s = Deployment::start(mode, dir.path(), &env_refs(&env));

    // B owns "b-private" and "shared"; A owns only its own "shared" (same id, another tenant).
    let (st, r) = s.post("/v1/conversations/b-private/turns", Some(B), &turns("Bee"));
    assert_eq!(st, 202, "{r}");
    let mut b_ids = ids_of(&r);
    let (st, r) = s.post("/v1/conversations/shared/turns", Some(B), &turns("Bee"));
    assert_eq!(st, 202, "{r}");
    b_ids.extend(ids_of(&r));
    let b_convs = ["b-private", "shared"];
    let before = snapshot(&s, &b_convs, &b_ids);
    assert_eq!(before["info:b-private"]["turns"], 3, "{before}");
    assert_eq!(before["recall"].as_array().unwrap().len(), 6, "{before}");
    assert_eq!(
        before["conversations:b-user"]["conversations"],
        json!(["b-private", "shared"]),
        "{before}"
    );

    let mut probes = 0;
    // Recall: tenant-wide, scoped to B's conversations, B's ids as conversation ids.
    let (st, r) = s.post(
        "/v1/recall",
        Some(A),
        &json!({"query": "greyhound Biscuit Lisbon sister Ines marathon rain", "k": 50}),
    );
    probes += 1;
    assert_eq!(st, 200, "{r}");
    assert!(r["memories"].as_array().unwrap().is_empty(), "A saw B: {r}");
    for c in ["b-private", "shared", "nobody-has-this"] {
        let (st, r) = s.post(
            "/v1/recall",
            Some(A),
            &json!({"query": "Biscuit", "conversation_ids": [c]}),
        );
        probes += 1;
        assert_eq!(st, 404, "{c}: {r}");
    }
    let (st_b, r_b) = s.post(
        "/v1/recall",
        Some(A),
        &json!({"query": "Biscuit", "conversation_ids": ["b-private"]}),
    );
    let (st_n, r_n) = s.post(
        "/v1/recall",
        Some(A),
        &json!({"query": "Biscuit", "conversation_ids": ["never-used"]}),
    );
    probes += 2;
    assert_eq!(
        shape(st_b, &r_b, "b-private"),
        shape(st_n, &r_n, "never-used")
    );

    // Memories by id: B's real ids, ids derived the way the server derives them (tenant,
    // conversation, turn id are all guessable), and random ones.
    let mut guessed: Vec<String> = b_ids.clone();
    for c in b_convs {
        for t in ["1", "2", "3", "4"] {
            for id in MemoryId::forms_of_turn(&TenantId("tenant-b".into()), c, t) {
                guessed.push(id.to_string());
            }
        }
    }
    guessed.push("00000000-0000-4000-8000-000000000000".into());
    for id in &guessed {
        let (st, r) = s.get(&format!("/v1/memories/{id}"), Some(A));
        probes += 1;
        assert_eq!(st, 404, "A read B's memory {id}: {r}");
        let never = "11111111-1111-4111-8111-111111111111";
        let (st2, r2) = s.get(&format!("/v1/memories/{never}"), Some(A));
        assert_eq!(shape(st, &r, id), shape(st2, &r2, never));
        // Erasing one of B's memories with A's key: not found, like an id nobody has.
        let (st, r) = s.delete(&format!("/v1/memories/{id}"), Some(A));
        probes += 1;
        assert_eq!(st, 404, "A erased B's memory {id}: {r}");
        let (st2, r2) = s.delete(&format!("/v1/memories/{never}"), Some(A));
        assert_eq!(shape(st, &r, id), shape(st2, &r2, never));
        // Editing it, reading its history, reading it as of any time: the same 404.
        let edit = json!({"user": "A was here", "wait": true});
        let (st, r) = s.patch(&format!("/v1/memories/{id}"), Some(A), &edit);
        probes += 1;
        assert_eq!(st, 404, "A edited B's memory {id}: {r}");
        let (st2, r2) = s.patch(&format!("/v1/memories/{never}"), Some(A), &edit);
        assert_eq!(shape(st, &r, id), shape(st2, &r2, never));
        for suffix in ["/history", "?as_of=2030-01-01T00:00:00Z"] {
            let (st, r) = s.get(&format!("/v1/memories/{id}{suffix}"), Some(A));
            probes += 1;
            assert_eq!(st, 404, "A read B's memory {id}{suffix}: {r}");
            let (st2, r2) = s.get(&format!("/v1/memories/{never}{suffix}"), Some(A));
            assert_eq!(shape(st, &r, id), shape(st2, &r2, never));
        }
    }
    // Recall as of any time sees nothing of B's either.
    for at in ["2030-01-01T00:00:00Z", "2000-01-01T00:00:00Z"] {
        let (st, r) = s.post(
            "/v1/recall",
            Some(A),
            &json!({"query": "greyhound Biscuit Lisbon sister Ines marathon rain", "k": 50, "as_of": at}),
        );
        probes += 1;
        assert_eq!(st, 200, "{r}");
        assert!(
            r["memories"]
                .as_array()
                .unwrap()
                .iter()
                .all(|m| !b_ids.iter().any(|b| m["memory_id"] == b.as_str())),
            "A recalled B's memory as of {at}: {r}"
        );
    }

    // B's end user, agent and metadata as A's filters and listing: nothing of B's.
    for body in [
        json!({"query": "Biscuit", "user_ids": ["b-user"]}),
        json!({"query": "Biscuit", "agent_ids": ["b-agent"]}),
        json!({"query": "Biscuit", "metadata": {"owner": "b"}}),
        json!({"query": "Biscuit", "speakers": ["Maya"]}),
    ] {
        let (st, r) = s.post("/v1/recall", Some(A), &body);
        probes += 1;
        assert_eq!(st, 200, "{body}: {r}");
        assert!(r["memories"].as_array().unwrap().is_empty(), "A saw B: {r}");
    }
    for q in [
        "user_id=b-user",
        "agent_id=b-agent",
        "user_id=b-user&agent_id=b-agent",
    ] {
        let (st, r) = s.get(&format!("/v1/conversations?{q}"), Some(A));
        probes += 1;
        assert_eq!(st, 200, "{q}: {r}");
        assert_eq!(r["conversations"], json!([]), "A listed B's: {r}");
    }

    // Conversation info and delete on B's conversation ids.
    for c in ["b-private", "shared"] {
        let (st, r) = s.get(&format!("/v1/conversations/{c}"), Some(A));
        probes += 1;
        assert_eq!(st, 404, "{c}: {r}");
        let (st2, r2) = s.get("/v1/conversations/never-used", Some(A));
        assert_eq!(shape(st, &r, c), shape(st2, &r2, "never-used"));
        let (st, r) = s.delete(&format!("/v1/conversations/{c}"), Some(A));
        probes += 1;
        assert_eq!(st, 404, "A deleted B's {c}: {r}");
    }

    // Tenant-wide erase: the tenant comes from the key; naming B is refused, and erasing A
    // touches only A.
    for q in [
        "",
        "?confirm=tenant-b",
        "?confirm=",
        "?confirm=tenant-a&tenant=tenant-b",
    ] {
        let (st, r) = s.delete(&format!("/v1/tenant{q}"), Some(A));
        probes += 1;
        assert_eq!(st, 400, "{q}: {r}");
    }

    // Tenant-ish fields and headers: unknown body fields are refused by name; metadata is
    // opaque data; headers and query strings name no tenant.
    for body in [
        json!({"query": "Biscuit", "tenant": "tenant-b"}),
        json!({"query": "Biscuit", "tenant_id": "tenant-b"}),
    ] {
        let (st, r) = s.post("/v1/recall", Some(A), &body);
        probes += 1;
        assert_eq!(st, 400, "{r}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains("tenant"),
            "{r}"
        );
    }
    for body in [
        json!({"tenant": "tenant-b", "turns": [{"user": "hi", "timestamp": "2023-05-08T13:56:00Z"}]}),
        json!({"turns": [{"user": "hi", "tenant": "tenant-b", "timestamp": "2023-05-08T13:56:00Z"}]}),
    ] {
        let (st, r) = s.post("/v1/conversations/shared/turns", Some(A), &body);
        probes += 1;
        assert_eq!(st, 400, "{r}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains("tenant"),
            "{r}"
        );
    }
    let (st, r) = s.post(
        "/v1/conversations/shared/turns",
        Some(A),
        &json!({"turns": [{"turn_id": "1", "user": "Alpha wrote this about Biscuit.",
            "timestamp": "2023-05-08T13:56:00Z", "metadata": {"tenant": "tenant-b", "tenant_id": "tenant-b"}}],
            "wait": true}),
    );
    probes += 1;
    assert_eq!(st, 202, "{r}");
    let a_id = ids_of(&r)[0].clone();
    assert!(
        !b_ids.contains(&a_id),
        "a colliding conversation id must not collide memory ids"
    );
    let (st, m) = s.get(&format!("/v1/memories/{a_id}"), Some(A));
    assert_eq!(st, 200);
    assert_eq!(m["tenant"], "tenant-a", "{m}");
    assert_eq!(s.get(&format!("/v1/memories/{a_id}"), Some(B)).0, 404);
    // A's reindex derives A's turns only (B's snapshot below is unchanged); the operator
    // backup takes no tenant's key.
    let (st, r) = s.post("/v1/reindex", Some(A), &json!({}));
    probes += 1;
    assert_eq!(st, 202, "{r}");
    assert_eq!(
        (r["conversations"].as_u64(), r["turns"].as_u64()),
        (Some(1), Some(1)),
        "A reindexed more than its own: {r}"
    );
    for key in [A, B] {
        let (st, r) = s.post(
            "/v1/admin/backup",
            Some(key),
            &json!({"path": "/tmp/not-here"}),
        );
        probes += 1;
        assert!(
            st == 404 || st == 401,
            "a tenant key ran a backup: {st} {r}"
        );
    }
    for (h, v) in [
        ("x-tenant", "tenant-b"),
        ("x-tenant-id", "tenant-b"),
        ("tenant", "tenant-b"),
    ] {
        let (st, _, body) = s.send(
            "POST",
            "/v1/recall?tenant=tenant-b",
            &[
                ("authorization", "Bearer key-a"),
                ("content-type", "application/json"),
                (h, v),
            ],
            Some(
                br#"{"query": "greyhound Biscuit Lisbon sister Ines marathon rain", "k": 50}"#
                    .to_vec(),
            ),
        );
        probes += 1;
        assert_eq!(st, 200, "{body}");
        let r: Value = serde_json::from_str(&body).unwrap();
        let got: Vec<&str> = r["memories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["memory_id"].as_str().unwrap())
            .collect();
        assert_eq!(got, vec![a_id.as_str()], "A must see only its own turn");
        let (st, _, body) = s.send(
            "GET",
            &format!("/v1/memories/{}?tenant=tenant-b", b_ids[0]),
            &[("authorization", "Bearer key-a"), (h, v)],
            None,
        );
        probes += 1;
        // An unknown query parameter is refused, naming it; nothing of B's either way.
        assert_eq!(st, 400, "{body}");
        assert!(
            body.contains("unknown field `tenant`") && !body.contains("Bee"),
            "{body}"
        );
    }
    // No key, a wrong key, a key with tenant-ish decorations: 401 everywhere.
    for auth in [
        None,
        Some("Bearer nope"),
        Some("Bearer key-b:tenant-b"),
        Some("key-b"),
        Some("Basic a2V5LWI6"),
    ] {
        let h: Vec<(&str, &str)> = auth.map(|a| vec![("authorization", a)]).unwrap_or_default();
        for (method, path) in [
            ("GET", format!("/v1/memories/{}", b_ids[0])),
            ("GET", "/v1/conversations/b-private".to_string()),
            ("DELETE", "/v1/conversations/b-private".to_string()),
            ("DELETE", "/v1/tenant?confirm=tenant-b".to_string()),
        ] {
            let (st, _, body) = s.send(method, &path, &h, None);
            probes += 1;
            assert_eq!(st, 401, "{method} {path} with {auth:?}: {body}");
        }
    }

    // A erases its whole tenant: only its own turn goes. The count is of the turns stored when
    // the erasure began: A's reindex may still have the turn in the graph writer, which, finding
    // the tenant's erasure marker after its write, purges the turn before the eraser's delete
    // (the eraser counts before recording the marker, so that purge is counted too).
    let (st, r) = s.delete("/v1/tenant?confirm=tenant-a", Some(A));
    probes += 1;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["turns_erased"], 1, "{r}");
    assert_eq!(r["conversations_erased"], 1, "{r}");
    assert_eq!(s.get(&format!("/v1/memories/{a_id}"), Some(A)).0, 404);

    let after = snapshot(&s, &b_convs, &b_ids);
    assert_eq!(before, after, "B's data changed");
    println!("isolation ({mode:?}): {probes} cross-tenant probes, 0 leaks, tenant B unchanged");
}
