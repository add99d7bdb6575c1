//! `recollect mcp` end to end: an MCP client's handshake over stdio, the tool list, storing a
//! turn and searching it back, tenant isolation (embedded and against a running server, embedded
//! or distributed), and errors for bad arguments, unknown tools and unknown methods; and the
//! Streamable HTTP transport at `/mcp` of `recollect serve` and `recollect-query`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use recollect_tests::binary;
use recollect_tests::distributed::{Deployment, Mode};
use serde_json::{json, Value};

const KEYS: &str = "key-a:tenant-a,key-b:tenant-b";

/// A `recollect mcp` child process spoken to line by line.
struct Mcp {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_id: i64,
}

impl Mcp {
    fn start(data_dir: &Path, api_key: &str, server: Option<&str>) -> Mcp {
        let mut cmd = Command::new(binary());
        cmd.arg("mcp")
            .arg("--data-dir")
            .arg(data_dir)
            .env("RECOLLECT_API_KEYS", KEYS)
            .env("RECOLLECT_API_KEY", api_key)
            .env("RECOLLECT__EMBEDDER__KIND", "hash")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(url) = server {
            cmd.arg("--server").arg(url);
        }
        let mut child = cmd.spawn().expect("start recollect mcp");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // A reader thread, so a silent server fails the test by timeout instead of hanging it.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Mcp {
            stdin: child.stdin.take(),
            child,
            lines: rx,
            next_id: 1,
        }
    }

    fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    fn read(&self) -> Value {
        match self.lines.recv_timeout(Duration::from_secs(120)) {
            Ok(l) => serde_json::from_str(&l)
                .unwrap_or_else(|e| panic!("stdout carries only JSON-RPC, got {l:?}: {e}")),
            Err(RecvTimeoutError::Timeout) => panic!("no answer within 120 s"),
            Err(RecvTimeoutError::Disconnected) => panic!("recollect mcp closed stdout"),
        }
    }

    /// A request; returns the whole response after checking it answers this id.
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send_line(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        );
        let r = self.read();
        assert_eq!(r["jsonrpc"], "2.0", "{r}");
        assert_eq!(r["id"], id, "{r}");
        r
    }

    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
    }

    fn handshake(&mut self) -> Value {
        let r = self.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "recollect-tests", "version": "1"}}),
        );
        self.send_line(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        r
    }

    /// Closes stdin and waits: the server exits when its client goes away.
    fn finish(mut self) {
        drop(self.stdin.take());
        for _ in 0..600 {
            if let Ok(Some(st)) = self.child.try_wait() {
                assert!(st.success(), "recollect mcp exited with {st}");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("recollect mcp did not exit after stdin closed");
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn store_args() -> Value {
    json!({"conversation_id": "chat-1", "turn_id": "1",
           "user": "I painted a sunrise over the lake last week.",
           "assistant": "Lovely! Painting by the lake must be calming.",
           "user_speaker": "Melanie", "assistant_speaker": "Caroline",
           "timestamp": "2023-05-08T14:01:00Z"})
}

fn memories(r: &Value) -> Vec<Value> {
    assert_eq!(r["result"]["isError"], false, "{r}");
    let structured = r["result"]["structuredContent"]["memories"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .clone();
    // The text block carries the same data for clients that ignore structured content.
    let text: Value =
        serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text["memories"].as_array().unwrap(), &structured);
    structured
}

#[test]
fn handshake_tools_store_search_isolation_and_errors_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = Mcp::start(dir.path(), "key-a", None);
    let init = a.handshake();
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
    assert_eq!(init["result"]["serverInfo"]["name"], "recollect");
    assert!(init["result"]["capabilities"]["tools"].is_object());
    assert_eq!(a.request("ping", json!({}))["result"], json!({}));

    let tools = a.request("tools/list", json!({}));
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "search_memory",
            "memory_history",
            "store_turn",
            "forget_memory",
            "edit_memory"
        ]
    );
    for t in tools["result"]["tools"].as_array().unwrap() {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
        assert!(t["description"].as_str().unwrap().len() > 20);
    }

    let stored = a.call("store_turn", store_args());
    assert_eq!(stored["result"]["isError"], false, "{stored}");
    let id = stored["result"]["structuredContent"]["memory_id"]
        .as_str()
        .unwrap()
        .to_string();
    // Idempotent with a turn_id.
    let again = a.call("store_turn", store_args());
    assert_eq!(
        again["result"]["structuredContent"]["memory_id"],
        id.as_str()
    );

    let found = a.call(
        "search_memory",
        json!({"query": "What did Melanie paint?", "k": 5, "conversation_id": "chat-1"}),
    );
    let ms = memories(&found);
    assert_eq!(ms.len(), 1, "{found}");
    assert_eq!(ms[0]["memory_id"], id.as_str());
    assert!(ms[0]["user"].as_str().unwrap().contains("sunrise"));
    assert!(!ms[0]["sources"].as_array().unwrap().is_empty());

    // Bad arguments: a protocol error that names the problem.
    let bad = a.call("search_memory", json!({"k": 5}));
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    assert!(
        bad["error"]["message"].as_str().unwrap().contains("query"),
        "{bad}"
    );
    let bad = a.call(
        "store_turn",
        json!({"conversation_id": "c", "user": "hi", "colour": "red"}),
    );
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    assert!(
        bad["error"]["message"].as_str().unwrap().contains("colour"),
        "{bad}"
    );
    let bad = a.call("search_memory", json!({"query": "x", "k": "ten"}));
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    // Input the store refuses: a tool error the agent can read, and nothing stored.
    let refused = a.call(
        "store_turn",
        json!({"conversation_id": "chat-2", "user": "   "}),
    );
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert!(refused["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("turns[0].user is empty"));
    let refused = a.call("search_memory", json!({"query": "x", "k": 0}));
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    let unknown = a.call("forget_everything", json!({}));
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    assert!(unknown["error"]["message"]
        .as_str()
        .unwrap()
        .contains("forget_everything"));
    let unknown = a.request("resources/list", json!({}));
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    // A line that is not JSON has no id to answer: ignored (as the official SDKs do), so the
    // next answer is the ping's.
    a.send_line("{not json");
    // Still serving after all that.
    assert_eq!(a.request("ping", json!({}))["result"], json!({}));
    // Editing it: search returns the edit, the history both versions, search as of before
    // the edit the old text; a bad edit is a tool error and changes nothing.
    let before = chrono::Utc::now().to_rfc3339();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let edited = a.call(
        "edit_memory",
        json!({"memory_id": id, "user": "Melanie painted a lighthouse at dusk."}),
    );
    assert_eq!(edited["result"]["isError"], false, "{edited}");
    assert_eq!(
        edited["result"]["structuredContent"]["memory"]["version"],
        2
    );
    let found = a.call(
        "search_memory",
        json!({"query": "What did Melanie paint?", "k": 1}),
    );
    assert!(
        memories(&found)[0]["user"]
            .as_str()
            .unwrap()
            .contains("lighthouse"),
        "{found}"
    );
    let then = a.call(
        "search_memory",
        json!({"query": "What did Melanie paint?", "k": 1, "as_of": before}),
    );
    assert!(
        !memories(&then)[0]["user"]
            .as_str()
            .unwrap()
            .contains("lighthouse"),
        "{then}"
    );
    let history = a.call("memory_history", json!({"memory_id": id}));
    assert_eq!(
        history["result"]["structuredContent"]["versions"]
            .as_array()
            .map(Vec::len),
        Some(2),
        "{history}"
    );
    let bad = a.call("edit_memory", json!({"memory_id": id}));
    assert_eq!(bad["result"]["isError"], true, "{bad}");
    assert!(bad["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("at least one of user, assistant, metadata"));
    // Forgetting the memory: gone from search; a second time, a tool error naming it.
    let forgot = a.call("forget_memory", json!({"memory_id": id}));
    assert_eq!(forgot["result"]["isError"], false, "{forgot}");
    assert_eq!(
        forgot["result"]["structuredContent"]["conversation_id"],
        "chat-1"
    );
    let found = a.call(
        "search_memory",
        json!({"query": "What did Melanie paint?", "k": 5}),
    );
    assert!(memories(&found).is_empty(), "{found}");
    let again = a.call("forget_memory", json!({"memory_id": id}));
    assert_eq!(again["result"]["isError"], true, "{again}");
    assert!(again["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("not found"));
    let bad = a.call("forget_memory", json!({"memory_id": "nope"}));
    assert_eq!(bad["result"]["isError"], true, "{bad}");
    a.finish();

    // Another key on the same data sees nothing of tenant A's.
    let mut b = Mcp::start(dir.path(), "key-b", None);
    b.handshake();
    let r = b.call(
        "search_memory",
        json!({"query": "What did Melanie paint?", "k": 5}),
    );
    assert!(memories(&r).is_empty(), "{r}");
    let r = b.call(
        "search_memory",
        json!({"query": "What did Melanie paint?", "conversation_id": "chat-1"}),
    );
    assert_eq!(
        r["result"]["isError"], true,
        "unknown conversation for B: {r}"
    );
    b.finish();

    // An unknown key cannot open the store at all.
    let out = Command::new(binary())
        .args(["mcp", "--data-dir"])
        .arg(dir.path())
        .env("RECOLLECT_API_KEYS", KEYS)
        .env("RECOLLECT_API_KEY", "nope")
        .env("RECOLLECT__EMBEDDER__KIND", "hash")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "nothing but protocol on stdout");
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown API key"));
}

#[test]
fn against_a_running_server_the_key_decides_the_tenant_embedded() {
    against_a_running_server_the_key_decides_the_tenant(Mode::Embedded);
}

#[test]
fn against_a_running_server_the_key_decides_the_tenant_distributed() {
    if Mode::distributed_available() {
        against_a_running_server_the_key_decides_the_tenant(Mode::Distributed);
    }
}

fn against_a_running_server_the_key_decides_the_tenant(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let s = Deployment::start(
        mode,
        dir.path(),
        &[
            ("RECOLLECT_API_KEYS", KEYS),
            ("RECOLLECT__EMBEDDER__KIND", "hash"),
        ],
    );
    let elsewhere = tempfile::tempdir().unwrap();
    let mut a = Mcp::start(elsewhere.path(), "key-a", Some(&s.url));
    a.handshake();
    let stored = a.call("store_turn", store_args());
    assert_eq!(stored["result"]["isError"], false, "{stored}");
    let id = stored["result"]["structuredContent"]["memory_id"].clone();
    let ms = memories(&a.call("search_memory", json!({"query": "What did Melanie paint?"})));
    assert_eq!(ms[0]["memory_id"], id);
    // The server holds it under tenant A.
    assert_eq!(s.get("/v1/conversations/chat-1", Some("key-a")).0, 200);
    assert_eq!(s.get("/v1/conversations/chat-1", Some("key-b")).0, 404);
    let refused = a.call(
        "store_turn",
        json!({"conversation_id": "chat-1", "user": ""}),
    );
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    // Editing through the server.
    let edited = a.call(
        "edit_memory",
        json!({"memory_id": id, "metadata": {"checked": true}}),
    );
    assert_eq!(edited["result"]["isError"], false, "{edited}");
    let history = a.call("memory_history", json!({"memory_id": id}));
    assert_eq!(
        history["result"]["structuredContent"]["versions"][1]["metadata"]["checked"], true,
        "{history}"
    );
    // Forgetting through the server.
    let forgot = a.call("forget_memory", json!({"memory_id": id}));
    assert_eq!(forgot["result"]["isError"], false, "{forgot}");
    assert_eq!(
        s.get(
            &format!("/v1/memories/{}", id.as_str().unwrap()),
            Some("key-a")
        )
        .0,
        404
    );
    a.finish();

    let mut b = Mcp::start(elsewhere.path(), "key-b", Some(&s.url));
    b.handshake();
    let r = b.call("search_memory", json!({"query": "What did Melanie paint?"}));
    assert!(memories(&r).is_empty(), "{r}");
    b.finish();

    let mut bad = Mcp::start(elsewhere.path(), "nope", Some(&s.url));
    bad.handshake();
    let r = bad.call("search_memory", json!({"query": "paint"}));
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(r["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("unknown API key"));
    bad.finish();
}

/// One JSON-RPC call to `/mcp` over Streamable HTTP: (HTTP status, the JSON-RPC answer).
fn mcp_http(url: &str, key: Option<&str>, id: i64, method: &str, params: Value) -> (u16, Value) {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let mut r = client
        .post(format!("{url}/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .body(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string());
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    let resp = r.send().unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().unwrap_or_default();
    // JSON answers; an SSE answer carries the message on its data: line.
    let body = serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("id").is_some())
            .unwrap_or(Value::String(text.clone()))
    });
    (status, body)
}

#[test]
fn streamable_http_tools_with_the_tenant_from_the_key_embedded() {
    streamable_http_tools_with_the_tenant_from_the_key(Mode::Embedded);
}

#[test]
fn streamable_http_tools_with_the_tenant_from_the_key_distributed() {
    if Mode::distributed_available() {
        streamable_http_tools_with_the_tenant_from_the_key(Mode::Distributed);
    }
}

/// `/mcp` of `recollect serve` (both tools) and of `recollect-query` (search only: it cannot
/// store); storing goes through the HTTP API so both modes search the same data.
fn streamable_http_tools_with_the_tenant_from_the_key(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let s = Deployment::start(
        mode,
        dir.path(),
        &[
            ("RECOLLECT_API_KEYS", KEYS),
            ("RECOLLECT__EMBEDDER__KIND", "hash"),
        ],
    );
    // The MCP endpoint of the service that serves search: the front door in either mode.
    let url = s.url.clone();
    let (st, init) = mcp_http(
        &url,
        Some("key-a"),
        1,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "recollect-tests", "version": "1"}}),
    );
    assert_eq!(st, 200, "{init}");
    assert_eq!(init["result"]["serverInfo"]["name"], "recollect", "{init}");
    let (st, tools) = mcp_http(&url, Some("key-a"), 2, "tools/list", json!({}));
    assert_eq!(st, 200, "{tools}");
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{tools}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    match mode {
        Mode::Embedded => assert_eq!(
            names,
            [
                "search_memory",
                "memory_history",
                "store_turn",
                "forget_memory",
                "edit_memory"
            ]
        ),
        Mode::Distributed => assert_eq!(
            names,
            ["search_memory", "memory_history"],
            "the query service cannot store"
        ),
    }
    // Tenant A's turn, stored through the HTTP API (the gateway in distributed mode).
    let (st, r) = s.post(
        "/v1/conversations/chat-1/turns",
        Some("key-a"),
        &json!({"turns": [{"turn_id": "1", "user": "I painted a sunrise over the lake last week.",
                 "user_speaker": "Melanie", "timestamp": "2023-05-08T14:01:00Z"}], "wait": true}),
    );
    assert_eq!(st, 202, "{r}");
    let id = r["memory_ids"][0].clone();
    let search =
        json!({"name": "search_memory", "arguments": {"query": "What did Melanie paint?", "k": 5}});
    let (st, a) = mcp_http(&url, Some("key-a"), 3, "tools/call", search.clone());
    assert_eq!(st, 200, "{a}");
    let ms = memories(&a);
    assert_eq!(ms.len(), 1, "{a}");
    assert_eq!(ms[0]["memory_id"], id);
    // The key decides the tenant: B sees nothing, a bad key is refused before MCP.
    let (_, b) = mcp_http(&url, Some("key-b"), 4, "tools/call", search.clone());
    assert!(memories(&b).is_empty(), "{b}");
    let (st, _) = mcp_http(&url, Some("nope"), 5, "tools/call", search.clone());
    assert_eq!(st, 401);
    let (st, _) = mcp_http(&url, None, 6, "tools/call", search);
    assert_eq!(st, 401);
    // Bad arguments: the protocol error names the problem, as on stdio.
    let (_, bad) = mcp_http(
        &url,
        Some("key-a"),
        7,
        "tools/call",
        json!({"name": "search_memory", "arguments": {"k": 5}}),
    );
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    // Another turn id: turn "1" holds the turn stored over HTTP above.
    let mut args = store_args();
    args["turn_id"] = json!("2");
    let store = json!({"name": "store_turn", "arguments": args});
    let (_, stored) = mcp_http(&url, Some("key-a"), 8, "tools/call", store);
    match mode {
        Mode::Embedded => assert_eq!(stored["result"]["isError"], false, "{stored}"),
        Mode::Distributed => {
            assert_eq!(stored["error"]["code"], -32602, "{stored}");
            assert!(
                stored["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("store_turn"),
                "{stored}"
            );
        }
    }
}
