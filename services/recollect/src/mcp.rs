//! `recollect mcp`: memory as agent tools over the Model Context Protocol, on stdio
//! (JSON-RPC 2.0, one message per line). Tools: `search_memory` and `store_turn`.
//!
//! The tenant comes from the credential only: with `--server` the key (RECOLLECT_API_KEY) goes to
//! the server as a bearer token; without it the data directory is opened directly and the key is
//! mapped through the configured keys (no keys configured: the open-mode tenant).
//! Stdout carries protocol messages only; logs go to stderr.

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::Args;
use recollect_api::Auth;
use recollect_config::Settings;
use recollect_gateway::StoreRequest;
use recollect_model::{ErrorKind, RecalledMemory, RecollectError, TenantId, TurnInput};
use recollect_recall::RecallRequest;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::app::App;

/// Newest first; the newest is offered when the client asks for one we do not know.
const PROTOCOL_VERSIONS: [&str; 3] = ["2025-06-18", "2025-03-26", "2024-11-05"];

#[derive(Args)]
pub struct McpArgs {
    /// A running server to talk to, e.g. http://127.0.0.1:8080 (default: the data dir directly).
    #[arg(long)]
    pub server: Option<String>,
    /// The API key; the tenant comes from it.
    #[arg(long, env = "RECOLLECT_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// Where the tools' calls go.
enum Backend {
    Remote {
        url: String,
        client: reqwest::Client,
    },
    Embedded {
        app: Box<App>,
        tenant: TenantId,
    },
}

/// JSON-RPC error codes used here.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

struct RpcError {
    code: i64,
    message: String,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    query: String,
    #[serde(default)]
    k: Option<i64>,
    #[serde(default)]
    conversation_id: Option<String>,
    #[serde(default)]
    now: Option<DateTime<Utc>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreArgs {
    conversation_id: String,
    #[serde(default)]
    turn_id: Option<String>,
    user: String,
    #[serde(default)]
    assistant: Option<String>,
    #[serde(default)]
    user_speaker: Option<String>,
    #[serde(default)]
    assistant_speaker: Option<String>,
    #[serde(default)]
    timestamp: Option<DateTime<Utc>>,
    #[serde(default)]
    metadata: serde_json::Map<String, Value>,
}

fn tools() -> Value {
    json!([
        {
            "name": "search_memory",
            "title": "Search memory",
            "description": "Recall past conversation turns relevant to a query (keyword, entity, time and semantic search). Returns the best turns first, each with its conversation, time, speakers, text, score and which retrieval paths found it.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "what to remember, in natural language"},
                    "k": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "how many memories to return (default 10)"},
                    "conversation_id": {"type": "string", "description": "only this conversation (default: all of them)"},
                    "now": {"type": "string", "format": "date-time", "description": "RFC 3339 anchor for relative times in the query (\"last week\")"}
                },
                "required": ["query"],
                "additionalProperties": false
            }
        },
        {
            "name": "store_turn",
            "title": "Store a turn",
            "description": "Remember one conversation turn (what the user said and the assistant's answer). Send a turn_id to make retries idempotent.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "conversation_id": {"type": "string", "description": "1 to 128 of letters, digits, _ - . : @"},
                    "turn_id": {"type": "string", "description": "stable id of this turn within the conversation"},
                    "user": {"type": "string", "description": "what the user said"},
                    "assistant": {"type": "string", "description": "the assistant's answer"},
                    "user_speaker": {"type": "string", "description": "the user's name"},
                    "assistant_speaker": {"type": "string", "description": "the assistant's name"},
                    "timestamp": {"type": "string", "format": "date-time", "description": "RFC 3339 time of the turn (default: now)"},
                    "metadata": {"type": "object", "description": "anything else to keep with the turn"}
                },
                "required": ["conversation_id", "user"],
                "additionalProperties": false
            }
        }
    ])
}

/// Decodes tool arguments; a bad one is an invalid-params error that says what is wrong.
fn arguments<T: serde::de::DeserializeOwned>(tool: &str, args: Value) -> Result<T, RpcError> {
    serde_json::from_value(args)
        .map_err(|e| RpcError::new(INVALID_PARAMS, format!("invalid arguments for {tool}: {e}")))
}

/// What a tool call returns: a text block for any client and the same data as structured content.
fn tool_result(data: Value) -> Value {
    json!({
        "content": [{"type": "text", "text": data.to_string()}],
        "structuredContent": data,
        "isError": false
    })
}

/// A failure the agent should read (bad input data, a store that does not answer).
fn tool_error(message: &str) -> Value {
    json!({
        "content": [{"type": "text", "text": message}],
        "isError": true
    })
}

/// The fields an agent needs from a recalled memory.
fn memory_view(m: &RecalledMemory) -> Value {
    json!({
        "memory_id": m.memory_id.to_string(),
        "conversation_id": m.conversation_id,
        "turn_id": m.turn_id,
        "timestamp": m.timestamp,
        "user_speaker": m.user_speaker,
        "user": m.user,
        "assistant_speaker": m.assistant_speaker,
        "assistant": m.assistant,
        "score": m.score,
        "sources": m.sources,
    })
}

impl Backend {
    async fn search(&self, req: RecallRequest) -> Result<Vec<RecalledMemory>, RecollectError> {
        match self {
            Backend::Embedded { app, tenant } => {
                app.recall.recall(tenant, &req).await.or_else(|e| match e {
                    // Stored but not yet enriched: nothing to recall yet, as over HTTP.
                    recollect_recall::RecallError::UnknownConversation(c)
                        if app.raw.conversation_exists(tenant, &c).unwrap_or(false) =>
                    {
                        Ok(vec![])
                    }
                    e => Err(RecollectError::from_classified(e)),
                })
            }
            Backend::Remote { url, client } => {
                let body = remote(client.post(format!("{url}/v1/recall")).json(&req)).await?;
                serde_json::from_value(body["memories"].clone())
                    .map_err(|e| RecollectError::internal(format!("unexpected server answer: {e}")))
            }
        }
    }

    async fn store(
        &self,
        conversation: &str,
        turn: TurnInput,
    ) -> Result<Vec<String>, RecollectError> {
        recollect_gateway::validate_conversation_id(conversation)?;
        let req = StoreRequest {
            turns: vec![turn],
            wait: Some(true),
        };
        match self {
            Backend::Embedded { app, tenant } => Ok(app
                .gateway
                .store(tenant, conversation, req, "mcp")
                .await?
                .memory_ids
                .iter()
                .map(ToString::to_string)
                .collect()),
            Backend::Remote { url, client } => {
                let body = remote(
                    client
                        .post(format!("{url}/v1/conversations/{conversation}/turns"))
                        .json(&req),
                )
                .await?;
                serde_json::from_value(body["memory_ids"].clone())
                    .map_err(|e| RecollectError::internal(format!("unexpected server answer: {e}")))
            }
        }
    }
}

/// Sends a request to the server; an error body keeps its message.
async fn remote(req: reqwest::RequestBuilder) -> Result<Value, RecollectError> {
    let resp = req
        .send()
        .await
        .map_err(|e| RecollectError::Unavailable(format!("server unreachable: {e}")))?;
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if status.is_success() {
        return Ok(body);
    }
    let msg = body["error"]["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("server answered {status}"));
    Err(match status.as_u16() {
        400 | 413 | 415 | 422 => RecollectError::Invalid(msg),
        401 | 403 => RecollectError::Unauthenticated(msg),
        404 => RecollectError::NotFound(msg),
        429 => RecollectError::Exhausted(msg),
        _ => RecollectError::Unavailable(msg),
    })
}

async fn call_tool(backend: &Backend, params: &Value) -> Result<Value, RpcError> {
    let name = params["name"]
        .as_str()
        .ok_or_else(|| RpcError::new(INVALID_PARAMS, "tools/call needs params.name"))?;
    let args = match params.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(a) => a.clone(),
    };
    let outcome = match name {
        "search_memory" => {
            let a: SearchArgs = arguments(name, args)?;
            let req = RecallRequest {
                query: a.query,
                conversation_ids: a.conversation_id.map(|c| vec![c]),
                k: Some(a.k.unwrap_or(10)),
                attention_state: None,
                now: a.now,
            };
            backend
                .search(req)
                .await
                .map(|ms| json!({"memories": ms.iter().map(memory_view).collect::<Vec<_>>()}))
        }
        "store_turn" => {
            let a: StoreArgs = arguments(name, args)?;
            let turn = TurnInput {
                turn_id: a.turn_id,
                user: a.user,
                assistant: a.assistant,
                user_speaker: a.user_speaker,
                assistant_speaker: a.assistant_speaker,
                timestamp: a.timestamp.unwrap_or_else(Utc::now),
                metadata: a.metadata,
            };
            backend
                .store(&a.conversation_id, turn)
                .await
                .map(|ids| json!({"memory_id": ids.first(), "conversation_id": a.conversation_id}))
        }
        other => {
            return Err(RpcError::new(
                INVALID_PARAMS,
                format!("unknown tool {other:?}; the tools are search_memory and store_turn"),
            ))
        }
    };
    Ok(match outcome {
        Ok(data) => tool_result(data),
        Err(e) => {
            use recollect_model::Classify;
            if matches!(e.kind(), ErrorKind::Internal | ErrorKind::Unavailable) {
                tracing::error!(error = %e, tool = name, "tool call failed");
            }
            tool_error(&e.to_string())
        }
    })
}

/// Answers one JSON-RPC message; None for notifications (and responses a client sent us).
async fn handle(backend: &Backend, msg: Value) -> Option<Value> {
    let Some(obj) = msg.as_object() else {
        return Some(error_reply(
            Value::Null,
            RpcError::new(INVALID_REQUEST, "a message must be a JSON object"),
        ));
    };
    let id = obj.get("id").cloned();
    let Some(method) = obj.get("method").and_then(Value::as_str) else {
        // A response to a request we never send, or garbage with an id.
        return id.map(|id| {
            error_reply(
                id,
                RpcError::new(INVALID_REQUEST, "a request needs a string \"method\""),
            )
        });
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Some(error_reply(
            id.unwrap_or(Value::Null),
            RpcError::new(INVALID_REQUEST, "\"jsonrpc\" must be \"2.0\""),
        ));
    }
    let params = obj.get("params").cloned().unwrap_or(json!({}));
    let Some(id) = id else {
        // Notifications (initialized, cancelled, ...) need no answer.
        tracing::debug!(method, "notification");
        return None;
    };
    let result = match method {
        "initialize" => {
            let asked = params["protocolVersion"].as_str().unwrap_or("");
            let version = PROTOCOL_VERSIONS
                .iter()
                .find(|v| **v == asked)
                .unwrap_or(&PROTOCOL_VERSIONS[0]);
            Ok(json!({
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": false}},
                "serverInfo": {"name": "recollect", "title": "Recollect memory", "version": env!("CARGO_PKG_VERSION")},
                "instructions": "Long-term memory of past conversations. Call search_memory before answering questions about the past; call store_turn to remember each exchange."
            }))
        }
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": tools()})),
        "tools/call" => call_tool(backend, &params).await,
        other => Err(RpcError::new(
            METHOD_NOT_FOUND,
            format!("method {other:?} not found"),
        )),
    };
    Some(match result {
        Ok(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
        Err(e) => error_reply(id, e),
    })
}

fn error_reply(id: Value, e: RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": e.code, "message": e.message}})
}

async fn backend(settings: Settings, a: McpArgs) -> anyhow::Result<Backend> {
    match a.server {
        Some(url) => {
            let mut h = reqwest::header::HeaderMap::new();
            if let Some(k) = &a.api_key {
                h.insert(
                    reqwest::header::AUTHORIZATION,
                    format!("Bearer {k}")
                        .parse()
                        .context("RECOLLECT_API_KEY is not a valid header value")?,
                );
            }
            Ok(Backend::Remote {
                url: url.trim_end_matches('/').to_string(),
                client: reqwest::Client::builder().default_headers(h).build()?,
            })
        }
        None => {
            let auth = Auth::new(settings.api_keys());
            let bearer = a.api_key.as_ref().map(|k| format!("Bearer {k}"));
            let tenant = auth
                .tenant_for(bearer.as_deref())
                .map_err(|e| anyhow::anyhow!("{e}: set RECOLLECT_API_KEY to a configured key"))?;
            let app = App::open(settings).await?;
            Ok(Backend::Embedded {
                app: Box::new(app),
                tenant,
            })
        }
    }
}

pub async fn run(settings: Settings, a: McpArgs) -> anyhow::Result<()> {
    let backend = backend(settings, a).await?;
    tracing::info!("recollect MCP server on stdio");
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(Value::Array(_)) => Some(error_reply(
                Value::Null,
                RpcError::new(INVALID_REQUEST, "batches are not supported"),
            )),
            Ok(msg) => handle(&backend, msg).await,
            Err(e) => Some(error_reply(
                Value::Null,
                RpcError::new(PARSE_ERROR, format!("not JSON: {e}")),
            )),
        };
        if let Some(r) = reply {
            let mut text = r.to_string();
            text.push('\n');
            out.write_all(text.as_bytes()).await?;
            out.flush().await?;
        }
    }
    // stdin closed: the client is gone.
    if let Backend::Embedded { app, .. } = backend {
        let app = *app;
        app.shutdown().await;
    }
    Ok(())
}
