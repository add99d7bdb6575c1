//! The gRPC `Memory` service end to end, against a live `recollect serve`: round trip, streaming
//! bulk ingest, idempotent retries, bad input, tenant isolation and authentication, end users
//! and filters, paged listings. The HTTP API
//! of the same server cross-checks that both edges see the same data.

use recollect_proto::v1::{
    DeleteRequest, EditMemoryRequest, GetRequest, ListConversationsRequest, ListTurnsRequest,
    MemoryHistoryRequest, RecallRequest, StoreRequest, TurnInput,
};
use recollect_tests::distributed::{Deployment, GrpcClients, Mode};
use recollect_tests::Server;
use tonic::Code;

const KEYS: &str = "key-a:tenant-a,key-b:tenant-b";

/// A server with two tenants and the lexical-only embedder (no model files needed).
fn server(mode: Mode, dir: &std::path::Path) -> Deployment {
    Deployment::start(
        mode,
        dir,
        &[
            ("RECOLLECT_API_KEYS", KEYS),
            ("RECOLLECT__EMBEDDER__KIND", "hash"),
        ],
    )
}

/// Multi-threaded, so the blocking HTTP helper can run inside it through `block_in_place`.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs a blocking HTTP call of the `Server` helper from async test code.
fn http<R>(f: impl FnOnce() -> R) -> R {
    tokio::task::block_in_place(f)
}

/// Store path to the gateway, read path to the query service (one server when embedded).
async fn client(s: &Deployment) -> GrpcClients {
    GrpcClients::connect(s).await
}

/// A request carrying `key` as `authorization: Bearer KEY`.
fn authed<T>(msg: T, key: Option<&str>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(k) = key {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {k}").parse().unwrap());
    }
    r
}

fn turn(id: &str, user: &str, assistant: &str, speakers: (&str, &str), ts: &str) -> TurnInput {
    TurnInput {
        turn_id: Some(id.into()),
        user: user.into(),
        assistant: Some(assistant.into()),
        user_speaker: Some(speakers.0.into()),
        assistant_speaker: Some(speakers.1.into()),
        timestamp: ts.into(),
        metadata_json: String::new(),
        user_id: None,
        agent_id: None,
    }
}

fn two_turns(conversation: &str) -> StoreRequest {
    StoreRequest {
        conversation_id: conversation.into(),
        turns: vec![
            turn(
                "1",
                "I went to the LGBTQ support group yesterday, it was so powerful.",
                "That sounds inspiring, Caroline! What happened there?",
                ("Caroline", "Melanie"),
                "2023-05-08T13:56:00Z",
            ),
            turn(
                "2",
                "I painted a sunrise over the lake last week.",
                "Lovely! Painting by the lake must be calming.",
                ("Melanie", "Caroline"),
                "2023-05-08T14:01:00Z",
            ),
        ],
        wait: true,
    }
}

fn recall_req(query: &str, conversations: &[&str], k: i64) -> RecallRequest {
    RecallRequest {
        query: query.into(),
        conversation_ids: conversations.iter().map(|c| c.to_string()).collect(),
        k: Some(k),
        ..Default::default()
    }
}

fn http_turns(s: &Server, conversation: &str, key: &str) -> (u16, u64) {
    let (st, b) = http(|| s.get(&format!("/v1/conversations/{conversation}"), Some(key)));
    (st, b["turns"].as_u64().unwrap_or(0))
}

#[test]
fn store_recall_get_delete_round_trip_and_idempotent_retry_embedded() {
    store_recall_get_delete_round_trip_and_idempotent_retry(Mode::Embedded);
}

#[test]
fn store_recall_get_delete_round_trip_and_idempotent_retry_distributed() {
    if Mode::distributed_available() {
        store_recall_get_delete_round_trip_and_idempotent_retry(Mode::Distributed);
    }
}

fn store_recall_get_delete_round_trip_and_idempotent_retry(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let s = server(mode, dir.path());
    runtime().block_on(async {
        let mut c = client(&s).await;
        let ka = Some("key-a");
        let ids = c
            .store(authed(two_turns("chat-1"), ka))
            .await
            .unwrap()
            .into_inner()
            .memory_ids;
        assert_eq!(ids.len(), 2);

        // A retried request returns the same ids and stores nothing twice.
        let again = c
            .store(authed(two_turns("chat-1"), ka))
            .await
            .unwrap()
            .into_inner()
            .memory_ids;
        assert_eq!(again, ids);
        assert_eq!(http_turns(&s, "chat-1", "key-a"), (200, 2));

        let r = c
            .recall(authed(
                recall_req("What did Melanie paint?", &["chat-1"], 5),
                ka,
            ))
            .await
            .unwrap()
            .into_inner();
        let top = &r.memories[0];
        assert_eq!(top.memory_id, ids[1], "the painting turn ranks first: {r:?}");
        assert!(top.user.contains("sunrise"));
        assert_eq!(top.user_speaker.as_deref(), Some("Melanie"));
        assert!(!top.sources.is_empty(), "{top:?}");
        assert!(top.score_parts.as_ref().unwrap().fused > 0.0, "{top:?}");
        // The same question over HTTP ranks the same memories.
        let (st, h) = http(|| {
            s.post(
                "/v1/recall",
                Some("key-a"),
                &serde_json::json!({"query": "What did Melanie paint?", "conversation_ids": ["chat-1"], "k": 5}),
            )
        });
        assert_eq!(st, 200);
        let http_ids: Vec<&str> = h["memories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["memory_id"].as_str().unwrap())
            .collect();
        let grpc_ids: Vec<&str> = r.memories.iter().map(|m| m.memory_id.as_str()).collect();
        assert_eq!(http_ids, grpc_ids);

        let t = c
            .get(authed(
                GetRequest {
                    memory_id: ids[0].clone(),
                    as_of: None,
                },
                ka,
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(t.user.contains("LGBTQ"));
        assert_eq!(t.conversation_id, "chat-1");
        assert_eq!(t.turn_id, "1");
        assert_eq!(t.timestamp, "2023-05-08T13:56:00Z");
        assert_eq!(t.version, 1);

        // Edit: a new version; the history has both; Get as of before it, the first.
        let before = chrono::Utc::now().to_rfc3339();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let v2 = c
            .edit_memory(authed(
                EditMemoryRequest {
                    memory_id: ids[0].clone(),
                    user: Some("I went to a support group yesterday, it was moving.".into()),
                    metadata_json: Some(r#"{"edited": true}"#.into()),
                    wait: true,
                    ..Default::default()
                },
                ka,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(v2.version, 2, "{v2:?}");
        assert_eq!(v2.metadata_json, r#"{"edited":true}"#);
        let h = c
            .memory_history(authed(
                MemoryHistoryRequest {
                    memory_id: ids[0].clone(),
                },
                ka,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(h.versions.len(), 2);
        assert!(h.versions[0].expired_at.is_some() && h.versions[1].expired_at.is_none());
        let old = c
            .get(authed(
                GetRequest {
                    memory_id: ids[0].clone(),
                    as_of: Some(before),
                },
                ka,
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(old.user.contains("LGBTQ"), "{old:?}");
        let bad = c
            .edit_memory(authed(
                EditMemoryRequest {
                    memory_id: ids[0].clone(),
                    ..Default::default()
                },
                ka,
            ))
            .await
            .unwrap_err();
        assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
        let other = c
            .edit_memory(authed(
                EditMemoryRequest {
                    memory_id: ids[0].clone(),
                    user: Some("not yours".into()),
                    ..Default::default()
                },
                Some("key-b"),
            ))
            .await
            .unwrap_err();
        assert_eq!(other.code(), Code::NotFound, "{other:?}");
        let re = c
            .reindex(authed(recollect_proto::v1::ReindexRequest {}, ka))
            .await
            .unwrap()
            .into_inner();
        assert_eq!((re.conversations, re.turns), (1, 2), "{re:?}");

        let d = c
            .delete(authed(
                DeleteRequest {
                    conversation_id: "chat-1".into(),
                },
                ka,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!((d.conversation_id.as_str(), d.turns_erased), ("chat-1", 2));
        let gone = c
            .get(authed(
                GetRequest {
                    memory_id: ids[0].clone(),
                    as_of: None,
                },
                ka,
            ))
            .await
            .unwrap_err();
        assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
        let again = c
            .delete(authed(
                DeleteRequest {
                    conversation_id: "chat-1".into(),
                },
                ka,
            ))
            .await
            .unwrap_err();
        assert_eq!(again.code(), Code::NotFound);
        assert_eq!(http_turns(&s, "chat-1", "key-a").0, 404);
    });
}

#[test]
fn streaming_store_of_hundreds_of_turns_embedded() {
    streaming_store_of_hundreds_of_turns(Mode::Embedded);
}

#[test]
fn streaming_store_of_hundreds_of_turns_distributed() {
    if Mode::distributed_available() {
        streaming_store_of_hundreds_of_turns(Mode::Distributed);
    }
}

fn streaming_store_of_hundreds_of_turns(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let s = server(mode, dir.path());
    const BATCHES: usize = 6;
    const PER_BATCH: usize = 50;
    let batches: Vec<StoreRequest> = (0..BATCHES)
        .map(|b| StoreRequest {
            conversation_id: "bulk".into(),
            turns: (0..PER_BATCH)
                .map(|i| {
                    let n = b * PER_BATCH + i;
                    turn(
                        &format!("t{n}"),
                        &format!("Note number {n}: I fed the parrot called Kiwi{n} today."),
                        "Good to know.",
                        ("Sam", "Ada"),
                        &format!("2024-01-{:02}T10:{:02}:00Z", 1 + n / 60, n % 60),
                    )
                })
                .collect(),
            // Waiting is asked once; the server waits at the end for every id.
            wait: b == BATCHES - 1,
        })
        .collect();
    runtime().block_on(async {
        let mut c = client(&s).await;
        let ids = c
            .store_stream(authed(
                futures::stream::iter(batches.clone()),
                Some("key-a"),
            ))
            .await
            .unwrap()
            .into_inner()
            .memory_ids;
        assert_eq!(ids.len(), BATCHES * PER_BATCH);
        let unique: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len());

        let (st, info) = http(|| s.get("/v1/conversations/bulk", Some("key-a")));
        assert_eq!(st, 200);
        assert_eq!(info["turns"], 300, "{info}");
        assert_eq!(
            info["recallable"], 300,
            "wait covers the whole stream: {info}"
        );

        let r = c
            .recall(authed(
                recall_req("which parrot is called Kiwi217?", &["bulk"], 5),
                Some("key-a"),
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.memories[0].memory_id, ids[217], "{:?}", r.memories[0]);

        // Streaming the same batches again is idempotent.
        let again = c
            .store_stream(authed(futures::stream::iter(batches), Some("key-a")))
            .await
            .unwrap()
            .into_inner()
            .memory_ids;
        assert_eq!(again, ids);
        assert_eq!(http_turns(&s, "bulk", "key-a"), (200, 300));

        // A bad batch fails the call and names the batch and the field.
        let bad = vec![StoreRequest {
            conversation_id: "bulk-2".into(),
            turns: vec![turn("x", "   ", "a", ("A", "B"), "2024-01-01T00:00:00Z")],
            wait: false,
        }];
        let e = c
            .store_stream(authed(futures::stream::iter(bad), Some("key-a")))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.message().contains("batch 0") && e.message().contains("turns[0].user"),
            "{e:?}"
        );
        assert_eq!(http_turns(&s, "bulk-2", "key-a").0, 404);
    });
}

#[test]
fn invalid_input_is_invalid_argument_naming_the_field_and_stores_nothing_embedded() {
    invalid_input_is_invalid_argument_naming_the_field_and_stores_nothing(Mode::Embedded);
}

#[test]
fn invalid_input_is_invalid_argument_naming_the_field_and_stores_nothing_distributed() {
    if Mode::distributed_available() {
        invalid_input_is_invalid_argument_naming_the_field_and_stores_nothing(Mode::Distributed);
    }
}

fn invalid_input_is_invalid_argument_naming_the_field_and_stores_nothing(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let s = server(mode, dir.path());
    runtime().block_on(async {
        let mut c = client(&s).await;
        let ka = Some("key-a");
        let mut cases: Vec<(StoreRequest, &str)> = Vec::new();
        let mut empty_user = two_turns("bad");
        empty_user.turns[1].user = " \n ".into();
        cases.push((empty_user, "turns[1].user is empty"));
        let mut bad_time = two_turns("bad");
        bad_time.turns[0].timestamp = "last tuesday".into();
        cases.push((bad_time, "turns[0].timestamp"));
        let mut bad_meta = two_turns("bad");
        bad_meta.turns[0].metadata_json = "{not json".into();
        cases.push((bad_meta, "turns[0].metadata_json"));
        let mut huge = two_turns("bad");
        huge.turns[0].user = "x".repeat(70 * 1024);
        cases.push((huge, "turns[0].user is 71680 bytes"));
        let mut repeated = two_turns("bad");
        repeated.turns[1].turn_id = Some("1".into());
        cases.push((repeated, "repeats"));
        cases.push((two_turns("bad/id"), "conversation id"));
        cases.push((
            StoreRequest {
                conversation_id: "bad".into(),
                turns: vec![],
                wait: false,
            },
            "at least one turn",
        ));
        for (req, want) in cases {
            let e = c.store(authed(req, ka)).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            assert!(
                e.message().contains(want),
                "{want:?} not in {:?}",
                e.message()
            );
        }
        // Nothing was stored, not even the valid first turn of a batch.
        assert_eq!(http_turns(&s, "bad", "key-a").0, 404);

        for (req, want) in [
            (recall_req("anything", &[], 0), "k"),
            (recall_req("   ", &[], 5), "query"),
            (
                RecallRequest {
                    now: Some("tomorrow-ish".into()),
                    ..recall_req("x", &[], 5)
                },
                "now",
            ),
        ] {
            let e = c.recall(authed(req, ka)).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            assert!(
                e.message().contains(want),
                "{want:?} not in {:?}",
                e.message()
            );
        }
        let e = c
            .get(authed(
                GetRequest {
                    memory_id: "not-an-id".into(),
                    as_of: None,
                },
                ka,
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let e = c
            .delete(authed(
                DeleteRequest {
                    conversation_id: String::new(),
                },
                ka,
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert_eq!(
            http(|| s.get("/readyz", None)).0,
            200,
            "the server stays healthy"
        );
    });
}

#[test]
fn one_tenant_cannot_see_or_delete_another_tenants_data_embedded() {
    one_tenant_cannot_see_or_delete_another_tenants_data(Mode::Embedded);
}

#[test]
fn one_tenant_cannot_see_or_delete_another_tenants_data_distributed() {
    if Mode::distributed_available() {
        one_tenant_cannot_see_or_delete_another_tenants_data(Mode::Distributed);
    }
}

fn one_tenant_cannot_see_or_delete_another_tenants_data(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let s = server(mode, dir.path());
    runtime().block_on(async {
        let mut c = client(&s).await;
        let (ka, kb) = (Some("key-a"), Some("key-b"));
        // The same conversation id in both tenants.
        let a_ids = c
            .store(authed(two_turns("shared-name"), ka))
            .await
            .unwrap()
            .into_inner()
            .memory_ids;

        // B sees nothing of A's: not by recall, by id, nor by conversation.
        let e = c
            .recall(authed(
                recall_req("What did Melanie paint?", &["shared-name"], 5),
                kb,
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        let r = c
            .recall(authed(recall_req("What did Melanie paint?", &[], 5), kb))
            .await
            .unwrap()
            .into_inner();
        assert!(r.memories.is_empty(), "{r:?}");
        for id in &a_ids {
            let e = c
                .get(authed(
                    GetRequest {
                        memory_id: id.clone(),
                        as_of: None,
                    },
                    kb,
                ))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::NotFound);
        }
        let e = c
            .delete(authed(
                DeleteRequest {
                    conversation_id: "shared-name".into(),
                },
                kb,
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        // ... and changed nothing.
        assert_eq!(http_turns(&s, "shared-name", "key-a"), (200, 2));
        let t = c
            .get(authed(
                GetRequest {
                    memory_id: a_ids[1].clone(),
                    as_of: None,
                },
                ka,
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(t.user.contains("sunrise"));

        // B's own turns in the same-named conversation get other ids and stay B's.
        let mut mine = two_turns("shared-name");
        mine.turns.truncate(1);
        mine.turns[0].user = "My cat Pixel chased a moth at the lake.".into();
        let b_ids = c
            .store(authed(mine, kb))
            .await
            .unwrap()
            .into_inner()
            .memory_ids;
        assert!(!a_ids.contains(&b_ids[0]));
        let r = c
            .recall(authed(recall_req("lake", &["shared-name"], 10), ka))
            .await
            .unwrap()
            .into_inner();
        assert!(
            r.memories.iter().all(|m| a_ids.contains(&m.memory_id)),
            "{r:?}"
        );
        let r = c
            .recall(authed(recall_req("lake", &["shared-name"], 10), kb))
            .await
            .unwrap()
            .into_inner();
        let got: Vec<_> = r.memories.iter().map(|m| m.memory_id.clone()).collect();
        assert_eq!(got, b_ids);
    });
}

#[test]
fn missing_or_unknown_key_is_unauthenticated_embedded() {
    missing_or_unknown_key_is_unauthenticated(Mode::Embedded);
}

#[test]
fn missing_or_unknown_key_is_unauthenticated_distributed() {
    if Mode::distributed_available() {
        missing_or_unknown_key_is_unauthenticated(Mode::Distributed);
    }
}

fn missing_or_unknown_key_is_unauthenticated(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let s = server(mode, dir.path());
    runtime().block_on(async {
        let mut c = client(&s).await;
        for key in [None, Some("not-a-key")] {
            let e = c.store(authed(two_turns("x"), key)).await.unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
            let e = c
                .recall(authed(recall_req("x", &[], 5), key))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated);
            let e = c
                .get(authed(
                    GetRequest {
                        memory_id: "00000000-0000-4000-8000-000000000000".into(),
                        as_of: None,
                    },
                    key,
                ))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated);
            let e = c
                .delete(authed(
                    DeleteRequest {
                        conversation_id: "x".into(),
                    },
                    key,
                ))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated);
            let e = c
                .store_stream(authed(futures::stream::iter(vec![two_turns("x")]), key))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated);
        }
        // A key without the Bearer scheme is refused too.
        let mut r = tonic::Request::new(two_turns("x"));
        r.metadata_mut()
            .insert("authorization", "key-a".parse().unwrap());
        assert_eq!(c.store(r).await.unwrap_err().code(), Code::Unauthenticated);
        assert_eq!(http_turns(&s, "x", "key-a").0, 404, "nothing stored");
    });
}

/// Distributed: each service answers the other's operations with a clear 404 / UNIMPLEMENTED
/// naming the service that serves them, over HTTP and gRPC alike.
#[test]
fn each_service_names_the_one_that_serves_an_operation() {
    if !Mode::distributed_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = server(Mode::Distributed, dir.path());
    let p = s.pipeline.as_ref().unwrap();
    let direct = |url: &str, method: &str, path: &str| -> (u16, serde_json::Value) {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let r = s
            .client
            .request(m, format!("{url}{path}"))
            .bearer_auth("key-a")
            .header("content-type", "application/json")
            .body(r#"{"query": "x", "turns": []}"#)
            .send()
            .unwrap();
        (r.status().as_u16(), r.json().unwrap_or_default())
    };
    let query_url = p.query_direct_url.clone();
    for (url, method, path, served_by) in [
        (
            &query_url,
            "POST",
            "/v1/conversations/c/turns",
            "recollect-gateway",
        ),
        (
            &query_url,
            "DELETE",
            "/v1/conversations/c",
            "recollect-gateway",
        ),
        (&query_url, "DELETE", "/v1/tenant", "recollect-gateway"),
        (&p.gateway.url, "POST", "/v1/recall", "recollect-query"),
        (&p.gateway.url, "GET", "/v1/memories/x", "recollect-query"),
        (
            &p.gateway.url,
            "GET",
            "/v1/conversations/c",
            "recollect-query",
        ),
    ] {
        let (st, body) = direct(url, method, path);
        assert_eq!(st, 404, "{method} {path}: {body}");
        let msg = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(served_by),
            "{method} {path} should name {served_by}: {body}"
        );
    }
    runtime().block_on(async {
        use recollect_proto::v1::memory_client::MemoryClient;
        let mut gateway = MemoryClient::connect(s.grpc_store_url()).await.unwrap();
        let mut query = MemoryClient::connect(s.grpc_url.clone()).await.unwrap();
        let ka = Some("key-a");
        let e = query.store(authed(two_turns("c"), ka)).await.unwrap_err();
        assert_eq!(e.code(), Code::Unimplemented);
        assert!(e.message().contains("recollect-gateway"), "{e:?}");
        let e = query
            .delete(authed(
                DeleteRequest {
                    conversation_id: "c".into(),
                },
                ka,
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unimplemented);
        let e = gateway
            .recall(authed(recall_req("x", &[], 5), ka))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unimplemented);
        assert!(e.message().contains("recollect-query"), "{e:?}");
        let e = gateway
            .get(authed(
                GetRequest {
                    memory_id: "x".into(),
                    as_of: None,
                },
                ka,
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unimplemented);
    });
}

#[test]
fn end_users_filters_and_listings_embedded() {
    end_users_filters_and_listings(Mode::Embedded);
}

#[test]
fn end_users_filters_and_listings_distributed() {
    if Mode::distributed_available() {
        end_users_filters_and_listings(Mode::Distributed);
    }
}

fn end_users_filters_and_listings(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let s = server(mode, dir.path());
    runtime().block_on(async {
        let mut c = client(&s).await;
        let ka = Some("key-a");
        for (conv, user) in [("u1-chat", "u-1"), ("u2-chat", "u-2")] {
            let turns = (0..5)
                .map(|i| {
                    let mut t = turn(
                        &i.to_string(),
                        &format!("I baked sourdough bread again, loaf {i}."),
                        "Nice crumb!",
                        ("Maya", "Bot"),
                        &format!("2024-02-0{}T09:00:00Z", i + 1),
                    );
                    t.user_id = Some(user.into());
                    t.agent_id = Some("baker-bot".into());
                    t.metadata_json = format!(r#"{{"loaf": {i}}}"#);
                    t
                })
                .collect();
            c.store(authed(
                StoreRequest {
                    conversation_id: conv.into(),
                    turns,
                    wait: true,
                },
                ka,
            ))
            .await
            .unwrap();
        }
        // Recall scoped to one end user, a time range and metadata.
        let r = c
            .recall(authed(
                RecallRequest {
                    query: "sourdough bread".into(),
                    k: Some(10),
                    user_ids: vec!["u-2".into()],
                    from: Some("2024-02-02T00:00:00Z".into()),
                    to: Some("2024-02-05T00:00:00Z".into()),
                    ..Default::default()
                },
                ka,
            ))
            .await
            .unwrap()
            .into_inner()
            .memories;
        assert_eq!(r.len(), 3, "{r:?}");
        assert!(r
            .iter()
            .all(|m| m.user_id.as_deref() == Some("u-2") && m.conversation_id == "u2-chat"));
        assert!(r.iter().all(|m| m.metadata_json.contains("loaf")));
        let r = c
            .recall(authed(
                RecallRequest {
                    query: "sourdough bread".into(),
                    metadata_json: r#"{"loaf": 4}"#.into(),
                    agent_ids: vec!["baker-bot".into()],
                    ..Default::default()
                },
                ka,
            ))
            .await
            .unwrap()
            .into_inner()
            .memories;
        assert_eq!(r.len(), 2, "one per user: {r:?}");
        for (req, field) in [
            (
                RecallRequest {
                    query: "x".into(),
                    user_ids: vec!["a b".into()],
                    ..Default::default()
                },
                "user_ids[0]",
            ),
            (
                RecallRequest {
                    query: "x".into(),
                    metadata_json: r#"{"tags": ["a"]}"#.into(),
                    ..Default::default()
                },
                "metadata.tags",
            ),
            (
                RecallRequest {
                    query: "x".into(),
                    metadata_json: "[1]".into(),
                    ..Default::default()
                },
                "metadata_json",
            ),
        ] {
            let e = c.recall(authed(req, ka)).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            assert!(e.message().contains(field), "{field}: {e:?}");
        }

        // Listings: conversations (all, by user, paged) and turns with their extraction.
        let list = |limit: Option<i64>, cursor: Option<String>, user: Option<&str>| {
            authed(
                ListConversationsRequest {
                    limit,
                    cursor,
                    user_id: user.map(String::from),
                    agent_id: None,
                },
                ka,
            )
        };
        let mut rp = c.read_path.clone();
        let p1 = rp
            .list_conversations(list(Some(1), None, None))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(p1.conversation_ids, ["u1-chat"]);
        let p2 = rp
            .list_conversations(list(Some(1), p1.next_cursor.clone(), None))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(p2.conversation_ids, ["u2-chat"]);
        assert!(p2.next_cursor.is_none());
        let mine = rp
            .list_conversations(list(None, None, Some("u-2")))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(mine.conversation_ids, ["u2-chat"]);
        let theirs = rp
            .list_conversations(authed(
                ListConversationsRequest {
                    user_id: Some("u-2".into()),
                    ..Default::default()
                },
                Some("key-b"),
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(theirs.conversation_ids.is_empty(), "tenant B sees none");
        let t = rp
            .list_turns(authed(
                ListTurnsRequest {
                    conversation_id: "u1-chat".into(),
                    limit: Some(3),
                    cursor: None,
                },
                ka,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(t.turns.len(), 3);
        let first = &t.turns[0];
        assert_eq!(first.turn.as_ref().unwrap().position, 0);
        assert_eq!(first.turn.as_ref().unwrap().user_id.as_deref(), Some("u-1"));
        assert!(first.extraction_json.contains("sourdough"), "{first:?}");
        let rest = rp
            .list_turns(authed(
                ListTurnsRequest {
                    conversation_id: "u1-chat".into(),
                    limit: Some(3),
                    cursor: t.next_cursor.clone(),
                },
                ka,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(rest.turns.len(), 2);
        assert!(rest.next_cursor.is_none());
        for (req, code, field) in [
            (list(Some(0), None, None), Code::InvalidArgument, "limit"),
            (
                list(None, Some("%%".into()), None),
                Code::InvalidArgument,
                "cursor",
            ),
            (
                list(None, None, Some("a b")),
                Code::InvalidArgument,
                "user_id",
            ),
        ] {
            let e = rp.list_conversations(req).await.unwrap_err();
            assert_eq!(e.code(), code, "{e:?}");
            assert!(e.message().contains(field), "{field}: {e:?}");
        }
        let e = rp
            .list_turns(authed(
                ListTurnsRequest {
                    conversation_id: "u1-chat".into(),
                    ..Default::default()
                },
                Some("key-b"),
            ))
            .await
            .unwrap_err();
        assert_eq!(
            e.code(),
            Code::NotFound,
            "another tenant's conversation: {e:?}"
        );
    });
}
