//! `recollect mcp`: memory as agent tools over the Model Context Protocol on stdio, on the
//! official SDK (`rmcp`) through the serving layer's handler (`recollect_serve::mcp`), the same
//! one `recollect serve` and `recollect-query` serve at `/mcp` over Streamable HTTP.
//! Tools: `search_memory`, `memory_history`, `store_turn`, `edit_memory` and `forget_memory`.
//!
//! The tenant comes from the credential only: with `--server` the key (RECOLLECT_API_KEY) goes to
//! the server as a bearer token; without it the data directory is opened directly and the key is
//! mapped through the configured keys (no keys configured: the open-mode tenant).
//! Stdout carries protocol messages only; logs go to stderr.

use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use recollect_api::Auth;
use recollect_config::Settings;
use recollect_model::{RecalledMemory, RecollectError, TenantId, TurnInput};
use recollect_recall::RecallRequest;
use recollect_serve::mcp::{Identity, MemoryBackend, MemoryTools};
use recollect_serve::StoreRequest;
use rmcp::ServiceExt;
use serde_json::Value;

use crate::app::App;

#[derive(Args)]
pub struct McpArgs {
    /// A running server to talk to, e.g. http://127.0.0.1:8080 (default: the data dir directly).
    #[arg(long)]
    pub server: Option<String>,
    /// The API key; the tenant comes from it.
    #[arg(long, env = "RECOLLECT_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// A running server's HTTP API, the key in every request.
struct Remote {
    url: String,
    client: reqwest::Client,
}

#[async_trait::async_trait]
impl MemoryBackend for Remote {
    async fn search(
        &self,
        _tenant: &TenantId,
        req: RecallRequest,
    ) -> Result<Vec<RecalledMemory>, RecollectError> {
        let body = remote(
            self.client
                .post(format!("{}/v1/recall", self.url))
                .json(&req),
        )
        .await?;
        serde_json::from_value(body["memories"].clone())
            .map_err(|e| RecollectError::internal(format!("unexpected server answer: {e}")))
    }

    async fn store(
        &self,
        _tenant: &TenantId,
        conversation: &str,
        turn: TurnInput,
    ) -> Result<Vec<String>, RecollectError> {
        // Checked here too: the id becomes part of the URL.
        recollect_gateway::validate_conversation_id(conversation)?;
        let req = StoreRequest {
            turns: vec![turn],
            wait: Some(true),
        };
        let body = remote(
            self.client
                .post(format!(
                    "{}/v1/conversations/{conversation}/turns",
                    self.url
                ))
                .json(&req),
        )
        .await?;
        serde_json::from_value(body["memory_ids"].clone())
            .map_err(|e| RecollectError::internal(format!("unexpected server answer: {e}")))
    }

    async fn forget(
        &self,
        _tenant: &TenantId,
        memory_id: &str,
    ) -> Result<(String, String), RecollectError> {
        let id = memory_id_in_url(memory_id)?;
        let body = remote(self.client.delete(format!("{}/v1/memories/{id}", self.url))).await?;
        let field = |k: &str| body[k].as_str().unwrap_or_default().to_string();
        Ok((field("conversation_id"), field("turn_id")))
    }

    async fn edit(
        &self,
        _tenant: &TenantId,
        memory_id: &str,
        patch: recollect_model::TurnPatch,
    ) -> Result<recollect_model::Turn, RecollectError> {
        let id = memory_id_in_url(memory_id)?;
        let body = remote(
            self.client
                .patch(format!("{}/v1/memories/{id}", self.url))
                .json(&patch),
        )
        .await?;
        serde_json::from_value(body)
            .map_err(|e| RecollectError::internal(format!("unexpected server answer: {e}")))
    }

    async fn history(
        &self,
        _tenant: &TenantId,
        memory_id: &str,
    ) -> Result<Vec<recollect_model::Turn>, RecollectError> {
        let id = memory_id_in_url(memory_id)?;
        let body = remote(
            self.client
                .get(format!("{}/v1/memories/{id}/history", self.url)),
        )
        .await?;
        serde_json::from_value(body["versions"].clone())
            .map_err(|e| RecollectError::internal(format!("unexpected server answer: {e}")))
    }

    fn can_store(&self) -> bool {
        true
    }
}

/// Sends a request to the server; an error body keeps its message.
/// Checked here too: the id becomes part of the URL.
fn memory_id_in_url(memory_id: &str) -> Result<recollect_model::MemoryId, RecollectError> {
    recollect_model::MemoryId::parse(memory_id).ok_or_else(|| {
        RecollectError::invalid(format!("memory id {memory_id:?} is not a memory id"))
    })
}

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

/// The tools over the data directory (both roles in-process) or over a running server.
async fn tools(settings: Settings, a: McpArgs) -> anyhow::Result<(MemoryTools, Option<App>)> {
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
            let backend = Remote {
                url: url.trim_end_matches('/').to_string(),
                client: reqwest::Client::builder().default_headers(h).build()?,
            };
            // The server decides the tenant from the key.
            let tools = MemoryTools::new(
                Arc::new(backend),
                Identity::Fixed(TenantId::default_tenant()),
            );
            Ok((tools, None))
        }
        None => {
            let auth = Auth::new(settings.api_keys());
            let bearer = a.api_key.as_ref().map(|k| format!("Bearer {k}"));
            let tenant = auth
                .tenant_for(bearer.as_deref())
                .map_err(|e| anyhow::anyhow!("{e}: set RECOLLECT_API_KEY to a configured key"))?;
            let app = App::open(settings).await?;
            let tools = MemoryTools::new(
                Arc::new(crate::server::roles(&app)),
                Identity::Fixed(tenant),
            );
            Ok((tools, Some(app)))
        }
    }
}

pub async fn run(settings: Settings, a: McpArgs) -> anyhow::Result<()> {
    let (tools, app) = tools(settings, a).await?;
    tracing::info!("recollect MCP server on stdio");
    let running = tools
        .serve(rmcp::transport::stdio())
        .await
        .context("MCP handshake on stdio")?;
    // Returns when stdin closes: the client is gone.
    running.waiting().await.context("MCP server")?;
    if let Some(app) = app {
        app.shutdown().await;
    }
    Ok(())
}
