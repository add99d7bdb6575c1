//! Memory as agent tools over the Model Context Protocol, on the official Rust SDK (`rmcp`):
//! `search_memory`, `memory_history`, and where the process can store, `store_turn`,
//! `edit_memory` and `forget_memory`. The same handler serves `recollect mcp` on stdio and the
//! Streamable HTTP transport at `/mcp` of `recollect serve` and `recollect-query`.
//!
//! The tenant comes from the credential only: on stdio it is resolved once at start, over HTTP
//! from each request's bearer key (the same [`Auth`] as the rest of the API). The query service
//! cannot store: its MCP endpoint offers `search_memory` only, and agents store through the
//! gateway's HTTP or gRPC API (or an MCP endpoint of `recollect serve`).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use recollect_api::Auth;
use recollect_model::{
    Classify, ErrorKind, RecalledMemory, RecollectError, TenantId, Turn, TurnInput, TurnPatch,
};
use recollect_recall::RecallRequest;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{Roles, StoreRequest};

/// What the tools call: the local roles, or (stdio `--server`) a running server over HTTP.
#[async_trait::async_trait]
pub trait MemoryBackend: Send + Sync {
    async fn search(
        &self,
        tenant: &TenantId,
        req: RecallRequest,
    ) -> Result<Vec<RecalledMemory>, RecollectError>;
    /// Stores one turn and waits until it is recallable: its memory id.
    async fn store(
        &self,
        tenant: &TenantId,
        conversation: &str,
        turn: TurnInput,
    ) -> Result<Vec<String>, RecollectError>;
    /// Erases one memory: (conversation id, turn id) it had.
    async fn forget(
        &self,
        tenant: &TenantId,
        memory_id: &str,
    ) -> Result<(String, String), RecollectError>;
    /// Edits one memory (waiting until the new version is recallable): the version now current.
    async fn edit(
        &self,
        tenant: &TenantId,
        memory_id: &str,
        patch: TurnPatch,
    ) -> Result<Turn, RecollectError>;
    /// Every version of a memory, oldest first.
    async fn history(
        &self,
        tenant: &TenantId,
        memory_id: &str,
    ) -> Result<Vec<Turn>, RecollectError>;
    /// False where this process cannot store (the query service): `store_turn`, `edit_memory`
    /// and `forget_memory` are not offered.
    fn can_store(&self) -> bool;
}

#[async_trait::async_trait]
impl MemoryBackend for Roles {
    async fn search(
        &self,
        tenant: &TenantId,
        req: RecallRequest,
    ) -> Result<Vec<RecalledMemory>, RecollectError> {
        let q = self.query.as_ref().ok_or_else(|| {
            RecollectError::Unavailable(format!("search is served by {}", crate::QUERY_SERVICE))
        })?;
        Ok(q.recall(tenant, &req).await?.memories)
    }

    async fn store(
        &self,
        tenant: &TenantId,
        conversation: &str,
        turn: TurnInput,
    ) -> Result<Vec<String>, RecollectError> {
        let g = self.gateway.as_ref().ok_or_else(|| {
            RecollectError::Unavailable(format!("storing is served by {}", crate::GATEWAY_SERVICE))
        })?;
        let req = StoreRequest {
            turns: vec![turn],
            wait: Some(true),
        };
        let ids = g.store(tenant, conversation, req, "mcp").await?;
        Ok(ids.iter().map(ToString::to_string).collect())
    }

    async fn forget(
        &self,
        tenant: &TenantId,
        memory_id: &str,
    ) -> Result<(String, String), RecollectError> {
        let g = self.gateway.as_ref().ok_or_else(|| {
            RecollectError::Unavailable(format!("erasing is served by {}", crate::GATEWAY_SERVICE))
        })?;
        g.delete_memory(tenant, memory_id).await
    }

    async fn edit(
        &self,
        tenant: &TenantId,
        memory_id: &str,
        patch: TurnPatch,
    ) -> Result<Turn, RecollectError> {
        let g = self.gateway.as_ref().ok_or_else(|| {
            RecollectError::Unavailable(format!("editing is served by {}", crate::GATEWAY_SERVICE))
        })?;
        g.edit_memory(tenant, memory_id, patch, "mcp").await
    }

    async fn history(
        &self,
        tenant: &TenantId,
        memory_id: &str,
    ) -> Result<Vec<Turn>, RecollectError> {
        let q = self.query.as_ref().ok_or_else(|| {
            RecollectError::Unavailable(format!("history is served by {}", crate::QUERY_SERVICE))
        })?;
        q.memory_history(tenant, memory_id).await
    }

    fn can_store(&self) -> bool {
        self.gateway.is_some()
    }
}

/// Where the caller's tenant comes from.
#[derive(Clone)]
pub enum Identity {
    /// Resolved once (stdio: the key given at start).
    Fixed(TenantId),
    /// Each HTTP request's `Authorization: Bearer` key.
    Bearer(Auth),
}

/// The MCP server: the tools over a backend.
#[derive(Clone)]
pub struct MemoryTools {
    backend: Arc<dyn MemoryBackend>,
    identity: Identity,
}

impl MemoryTools {
    pub fn new(backend: Arc<dyn MemoryBackend>, identity: Identity) -> Self {
        Self { backend, identity }
    }

    fn tenant(&self, ctx: &RequestContext<RoleServer>) -> Result<TenantId, RecollectError> {
        match &self.identity {
            Identity::Fixed(t) => Ok(t.clone()),
            Identity::Bearer(auth) => {
                let header = ctx
                    .extensions
                    .get::<axum::http::request::Parts>()
                    .and_then(|p| p.headers.get(axum::http::header::AUTHORIZATION))
                    .and_then(|v| v.to_str().ok());
                auth.tenant_for(header)
            }
        }
    }

    fn tools(&self) -> Vec<Tool> {
        let mut tools = vec![Tool::new(
            "search_memory",
            "Recall past conversation turns relevant to a query (keyword, entity, time and semantic search). Returns the best turns first, each with its conversation, time, speakers, text, score and which retrieval paths found it.",
            schema(json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "what to remember, in natural language"},
                    "k": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "how many memories to return (default 10)"},
                    "conversation_id": {"type": "string", "description": "only this conversation (default: all of them)"},
                    "now": {"type": "string", "format": "date-time", "description": "RFC 3339 anchor for relative times in the query (\"last week\")"},
                    "user_id": {"type": "string", "description": "only turns of this end user"},
                    "agent_id": {"type": "string", "description": "only turns of this agent"},
                    "metadata": {"type": "object", "description": "only turns whose metadata has these keys equal to these string, number or boolean values"},
                    "as_of": {"type": "string", "format": "date-time", "description": "RFC 3339: recall what was remembered at that time (before later edits)"}
                },
                "required": ["query"],
                "additionalProperties": false
            })),
        )
        .with_title("Search memory"),
        Tool::new(
            "memory_history",
            "Every version of one remembered turn (by memory_id), oldest first: what each edit replaced and when.",
            schema(json!({
                "type": "object",
                "properties": {
                    "memory_id": {"type": "string", "description": "the memory's id (a UUID)"}
                },
                "required": ["memory_id"],
                "additionalProperties": false
            })),
        )
        .with_title("Memory history")];
        if self.backend.can_store() {
            tools.push(
                Tool::new(
                    "store_turn",
                    "Remember one conversation turn (what the user said and the assistant's answer). Send a turn_id to make retries idempotent.",
                    schema(json!({
                        "type": "object",
                        "properties": {
                            "conversation_id": {"type": "string", "description": "1 to 128 of letters, digits, _ - . : @"},
                            "turn_id": {"type": "string", "description": "stable id of this turn within the conversation"},
                            "user": {"type": "string", "description": "what the user said"},
                            "assistant": {"type": "string", "description": "the assistant's answer"},
                            "user_speaker": {"type": "string", "description": "the user's name"},
                            "assistant_speaker": {"type": "string", "description": "the assistant's name"},
                            "timestamp": {"type": "string", "format": "date-time", "description": "RFC 3339 time of the turn (default: now)"},
                            "metadata": {"type": "object", "description": "anything else to keep with the turn"},
                            "user_id": {"type": "string", "description": "the end user this turn belongs to (recall can be scoped to it)"},
                            "agent_id": {"type": "string", "description": "the agent that took part"}
                        },
                        "required": ["conversation_id", "user"],
                        "additionalProperties": false
                    })),
                )
                .with_title("Store a turn"),
            );
            tools.push(
                Tool::new(
                    "forget_memory",
                    "Erase one remembered turn for good (by the memory_id search_memory or store_turn returned), from every store. The rest of its conversation is kept.",
                    schema(json!({
                        "type": "object",
                        "properties": {
                            "memory_id": {"type": "string", "description": "the memory's id (a UUID)"}
                        },
                        "required": ["memory_id"],
                        "additionalProperties": false
                    })),
                )
                .with_title("Forget a memory"),
            );
            tools.push(
                Tool::new(
                    "edit_memory",
                    "Correct one remembered turn (by memory_id): its text or metadata. The edit becomes what search returns; the old version is kept in the memory's history, not lost.",
                    schema(json!({
                        "type": "object",
                        "properties": {
                            "memory_id": {"type": "string", "description": "the memory's id (a UUID)"},
                            "user": {"type": "string", "description": "the corrected user text"},
                            "assistant": {"type": "string", "description": "the corrected assistant text (empty removes it)"},
                            "metadata": {"type": "object", "description": "replaces the turn's metadata"}
                        },
                        "required": ["memory_id"],
                        "additionalProperties": false
                    })),
                )
                .with_title("Edit a memory"),
            );
        }
        tools
    }

    async fn call(
        &self,
        name: &str,
        args: Value,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let outcome = match name {
            "search_memory" => {
                let a: SearchArgs = arguments(name, args)?;
                let req = RecallRequest {
                    query: a.query,
                    conversation_ids: a.conversation_id.map(|c| vec![c]),
                    k: Some(a.k.unwrap_or(10)),
                    attention_state: None,
                    now: a.now,
                    user_ids: a.user_id.map(|u| vec![u]),
                    agent_ids: a.agent_id.map(|u| vec![u]),
                    metadata: a.metadata,
                    as_of: a.as_of,
                    ..Default::default()
                };
                match self.tenant(ctx) {
                    Ok(t) => self.backend.search(&t, req).await.map(
                        |ms| json!({"memories": ms.iter().map(memory_view).collect::<Vec<_>>()}),
                    ),
                    Err(e) => Err(e),
                }
            }
            "store_turn" if self.backend.can_store() => {
                let a: StoreArgs = arguments(name, args)?;
                let turn = TurnInput {
                    turn_id: a.turn_id,
                    user: a.user,
                    assistant: a.assistant,
                    user_speaker: a.user_speaker,
                    assistant_speaker: a.assistant_speaker,
                    timestamp: a.timestamp.unwrap_or_else(Utc::now),
                    metadata: a.metadata,
                    user_id: a.user_id,
                    agent_id: a.agent_id,
                };
                match self.tenant(ctx) {
                    Ok(t) => self
                        .backend
                        .store(&t, &a.conversation_id, turn)
                        .await
                        .map(|ids| {
                            json!({"memory_id": ids.first(), "conversation_id": a.conversation_id})
                        }),
                    Err(e) => Err(e),
                }
            }
            "forget_memory" if self.backend.can_store() => {
                let a: ForgetArgs = arguments(name, args)?;
                match self.tenant(ctx) {
                    Ok(t) => self.backend.forget(&t, &a.memory_id).await.map(|(c, turn)| {
                        json!({"memory_id": a.memory_id, "conversation_id": c, "turn_id": turn})
                    }),
                    Err(e) => Err(e),
                }
            }
            "edit_memory" if self.backend.can_store() => {
                let a: EditArgs = arguments(name, args)?;
                let patch = TurnPatch {
                    user: a.user,
                    assistant: a.assistant,
                    metadata: a.metadata,
                    wait: Some(true),
                };
                match self.tenant(ctx) {
                    Ok(t) => self
                        .backend
                        .edit(&t, &a.memory_id, patch)
                        .await
                        .map(|turn| json!({"memory": turn})),
                    Err(e) => Err(e),
                }
            }
            "memory_history" => {
                let a: ForgetArgs = arguments(name, args)?;
                match self.tenant(ctx) {
                    Ok(t) => self
                        .backend
                        .history(&t, &a.memory_id)
                        .await
                        .map(|v| json!({"memory_id": a.memory_id, "versions": v})),
                    Err(e) => Err(e),
                }
            }
            other => {
                let offered: Vec<_> = self.tools().into_iter().map(|t| t.name).collect();
                return Err(McpError::invalid_params(
                    format!(
                        "unknown tool {other:?}; the tools here are {}",
                        match offered.split_last() {
                            Some((last, rest)) if !rest.is_empty() =>
                                format!("{} and {last}", rest.join(", ")),
                            _ => offered.join(""),
                        }
                    ),
                    None,
                ));
            }
        };
        Ok(match outcome {
            Ok(data) => CallToolResult::structured(data),
            Err(e) => {
                if matches!(e.kind(), ErrorKind::Internal | ErrorKind::Unavailable) {
                    tracing::error!(error = %e, tool = name, "tool call failed");
                }
                // A failure the agent should read (bad input data, a store that does not answer).
                CallToolResult::error(vec![ContentBlock::text(e.to_string())])
            }
        })
    }
}

fn schema(v: Value) -> Arc<serde_json::Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => unreachable!("tool schemas are objects"),
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
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(default)]
    metadata: Option<std::collections::BTreeMap<String, Value>>,
    #[serde(default)]
    as_of: Option<DateTime<Utc>>,
}

/// `forget_memory` and `memory_history`: one memory by id.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ForgetArgs {
    memory_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    memory_id: String,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    assistant: Option<String>,
    #[serde(default)]
    metadata: Option<serde_json::Map<String, Value>>,
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
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    agent_id: Option<String>,
}

/// Decodes tool arguments; a bad one is an invalid-params error that says what is wrong.
fn arguments<T: serde::de::DeserializeOwned>(tool: &str, args: Value) -> Result<T, McpError> {
    serde_json::from_value(args)
        .map_err(|e| McpError::invalid_params(format!("invalid arguments for {tool}: {e}"), None))
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
        "user_id": m.user_id,
        "agent_id": m.agent_id,
        "metadata": m.metadata,
        "score": m.score,
        "sources": m.sources,
    })
}

impl ServerHandler for MemoryTools {
    fn get_info(&self) -> InitializeResult {
        let mut server = Implementation::new("recollect", env!("CARGO_PKG_VERSION"));
        server.title = Some("Recollect memory".into());
        let instructions = if self.backend.can_store() {
            "Long-term memory of past conversations. Call search_memory before answering questions about the past; call store_turn to remember each exchange."
        } else {
            "Long-term memory of past conversations. Call search_memory before answering questions about the past (this endpoint only reads: turns are stored through the gateway)."
        };
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(server)
            .with_instructions(instructions)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.map(Value::Object).unwrap_or(json!({}));
        Ok(self.call(&request.name, args, &context).await?.into())
    }
}

/// The Streamable HTTP transport for `/mcp`: stateless request/response (JSON answers), the
/// tenant from each request's bearer key. Without API keys the server is loopback-only and the
/// SDK's Host check (loopback names) stays on against DNS rebinding; with keys the key is the
/// protection and any Host is accepted (ingress names differ per deployment).
pub fn http_service(
    roles: Roles,
    auth: Auth,
    max_body_bytes: usize,
) -> rmcp::transport::streamable_http_server::StreamableHttpService<
    MemoryTools,
    rmcp::transport::streamable_http_server::session::local::LocalSessionManager,
> {
    use rmcp::transport::streamable_http_server::{
        session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
    };
    let open = auth.is_open();
    let tools = MemoryTools::new(Arc::new(roles), Identity::Bearer(auth));
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_max_request_body_bytes(max_body_bytes);
    if !open {
        config = config.disable_allowed_hosts();
    }
    StreamableHttpService::new(
        move || Ok(tools.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    )
}
