//! The gateway: the front door of the store path. It validates turns, writes them durably to the
//! raw-turn store (the source of truth) and hands them to the pipeline on `recollect.turns.raw`.
//! A 202 means the turn is on disk; with `wait` it also means the turn is recallable.

use std::sync::Arc;
use std::time::Duration;

use recollect_bus::{Bus, Message};
use recollect_model::{
    bus_key, request, topics, Envelope, MemoryId, RecollectError, TenantId, Turn, TurnInput,
    MAX_TEXT_BYTES,
};
use recollect_store::raw::Appended;
use recollect_store::RawStore;
use recollect_telemetry as metrics;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

pub use recollect_model::request::{is_forbidden_control, StoreRequest};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoreResponse {
    pub memory_ids: Vec<MemoryId>,
}

#[derive(Debug, Clone)]
pub struct Limits {
    pub max_turns_per_request: usize,
    pub max_text_bytes: usize,
    pub wait_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_turns_per_request: 1000,
            max_text_bytes: MAX_TEXT_BYTES,
            wait_timeout: Duration::from_secs(120),
        }
    }
}

pub struct Gateway {
    raw: RawStore,
    bus: Arc<dyn Bus>,
    limits: Limits,
    /// Woken by the graph-writer whenever turns become recallable.
    stored: Arc<Notify>,
}

fn rejected(r: request::Rejection) -> RecollectError {
    metrics::TURNS_REJECTED.with_label_values(&[r.reason]).inc();
    RecollectError::Invalid(r.message)
}

/// Conversation ids end up in keys, paths and payload filters: keep them plain.
pub fn validate_conversation_id(id: &str) -> Result<(), RecollectError> {
    request::validate_conversation_id(id).map_err(rejected)
}

impl Gateway {
    pub fn new(raw: RawStore, bus: Arc<dyn Bus>, limits: Limits, stored: Arc<Notify>) -> Self {
        Self {
            raw,
            bus,
            limits,
            stored,
        }
    }

    pub fn raw(&self) -> &RawStore {
        &self.raw
    }

    /// Checks a request; nothing is stored unless every turn passes.
    pub fn validate(&self, conversation: &str, turns: &[TurnInput]) -> Result<(), RecollectError> {
        request::validate_store(
            conversation,
            turns,
            self.limits.max_turns_per_request,
            self.limits.max_text_bytes,
        )
        .map_err(rejected)
    }

    /// Validates, stores durably, publishes new turns; with `wait`, returns once they are recallable.
    pub async fn store(
        &self,
        tenant: &TenantId,
        conversation: &str,
        req: StoreRequest,
        trace_id: &str,
    ) -> Result<StoreResponse, RecollectError> {
        self.validate(conversation, &req.turns)?;
        let raw = self.raw.clone();
        let (t, c) = (tenant.clone(), conversation.to_string());
        let turns = req.turns;
        let appended: Vec<Appended> =
            tokio::task::spawn_blocking(move || raw.append(&t, &c, &turns))
                .await
                .map_err(RecollectError::internal)?
                .map_err(RecollectError::from_classified)?;
        metrics::TURNS_ACCEPTED
            .with_label_values(&[] as &[&str])
            .inc_by(appended.len() as u64);
        let new: Vec<Turn> = appended
            .iter()
            .filter(|a| a.new)
            .map(|a| a.turn.clone())
            .collect();
        self.publish(&new, trace_id).await?;
        let ids: Vec<MemoryId> = appended.iter().map(|a| a.turn.memory_id).collect();
        if req.wait.unwrap_or(false) {
            self.wait_stored(&ids).await?;
        }
        Ok(StoreResponse { memory_ids: ids })
    }

    async fn publish(&self, turns: &[Turn], trace_id: &str) -> Result<(), RecollectError> {
        if turns.is_empty() {
            return Ok(());
        }
        let msgs = turns
            .iter()
            .map(|t| {
                Message::json(
                    topics::RAW,
                    bus_key(&t.tenant, &t.conversation_id),
                    &Envelope::new(trace_id, t.clone()),
                    trace_id,
                )
            })
            .collect();
        self.bus
            .publish(msgs)
            .await
            .map_err(RecollectError::from_classified)
    }

    /// Blocks until none of `ids` is pending, or the wait timeout passes (then 503: the turns are
    /// stored and will become recallable; the client need not resend).
    pub async fn wait_stored(&self, ids: &[MemoryId]) -> Result<(), RecollectError> {
        let deadline = tokio::time::Instant::now() + self.limits.wait_timeout;
        loop {
            let notified = self.stored.notified();
            let raw = self.raw.clone();
            let ids2 = ids.to_vec();
            let pending = tokio::task::spawn_blocking(
                move || -> Result<bool, recollect_store::StoreError> {
                    for id in ids2 {
                        if raw.is_pending(id)? {
                            return Ok(true);
                        }
                    }
                    Ok(false)
                },
            )
            .await
            .map_err(RecollectError::internal)?
            .map_err(RecollectError::from_classified)?;
            if !pending {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(RecollectError::Unavailable(
                    "turns are stored but enrichment did not finish within the wait timeout".into(),
                ));
            }
        }
    }

    /// Re-publishes every turn whose enrichment had not finished (after a crash or restart).
    pub async fn replay_pending(&self) -> Result<usize, RecollectError> {
        let raw = self.raw.clone();
        let pending = tokio::task::spawn_blocking(move || raw.pending())
            .await
            .map_err(RecollectError::internal)?
            .map_err(RecollectError::from_classified)?;
        for chunk in pending.chunks(256) {
            self.publish(chunk, "replay").await?;
        }
        if !pending.is_empty() {
            tracing::info!(turns = pending.len(), "replayed unfinished turns");
        }
        Ok(pending.len())
    }
}

/// HTTP routes of the store path.
pub mod http {
    use std::sync::Arc;

    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::routing::{delete, post};
    use axum::Router;
    use recollect_api::{ApiError, Auth, HasAuth, Json, PathParam, Tenant};
    use recollect_model::RecollectError;
    use serde::Serialize;

    use super::{validate_conversation_id, Eraser, Gateway, StoreRequest, StoreResponse};

    #[derive(Clone)]
    pub struct GatewayState {
        pub gateway: Arc<Gateway>,
        pub eraser: Arc<dyn Eraser>,
        pub auth: Auth,
    }

    impl HasAuth for GatewayState {
        fn auth(&self) -> &Auth {
            &self.auth
        }
    }

    pub async fn store_turns(
        State(s): State<GatewayState>,
        Tenant(tenant): Tenant,
        PathParam(conversation): PathParam,
        Json(req): Json<StoreRequest>,
    ) -> Result<(StatusCode, axum::Json<StoreResponse>), ApiError> {
        let trace_id = uuid::Uuid::new_v4().to_string();
        tracing::debug!(trace_id, turns = req.turns.len(), "store request");
        let r = s
            .gateway
            .store(&tenant, &conversation, req, &trace_id)
            .await?;
        Ok((StatusCode::ACCEPTED, axum::Json(r)))
    }

    #[derive(Serialize)]
    pub struct Erased {
        pub conversation_id: String,
        pub turns_erased: u64,
    }

    #[derive(Serialize)]
    pub struct TenantErased {
        pub conversations_erased: u64,
        pub turns_erased: u64,
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct TenantEraseParams {
        /// Must repeat the caller's tenant name: a tenant-wide erase is never an accident.
        pub confirm: Option<String>,
    }

    /// Erases every conversation of the caller's tenant (the tenant comes from the credential;
    /// `?confirm=` must name it).
    pub async fn delete_tenant(
        State(s): State<GatewayState>,
        Tenant(tenant): Tenant,
        params: Result<
            axum::extract::Query<TenantEraseParams>,
            axum::extract::rejection::QueryRejection,
        >,
    ) -> Result<axum::Json<TenantErased>, ApiError> {
        let params = params
            .map_err(|e| {
                RecollectError::invalid(format!("invalid query string: {}", e.body_text()))
            })?
            .0;
        if params.confirm.as_deref() != Some(tenant.as_str()) {
            return Err(RecollectError::invalid(
                "erasing a whole tenant needs ?confirm=<your tenant name>".to_string(),
            )
            .into());
        }
        let (conversations_erased, turns_erased) = s.eraser.erase_tenant(&tenant).await?;
        Ok(axum::Json(TenantErased {
            conversations_erased,
            turns_erased,
        }))
    }

    pub async fn delete_conversation(
        State(s): State<GatewayState>,
        Tenant(tenant): Tenant,
        PathParam(conversation): PathParam,
    ) -> Result<axum::Json<Erased>, ApiError> {
        validate_conversation_id(&conversation)?;
        let n = s.eraser.erase_conversation(&tenant, &conversation).await?;
        match n {
            None => Err(RecollectError::NotFound(format!(
                "conversation {conversation:?} not found"
            ))
            .into()),
            Some(turns_erased) => Ok(axum::Json(Erased {
                conversation_id: conversation,
                turns_erased,
            })),
        }
    }

    pub fn router(state: GatewayState) -> Router {
        Router::new()
            .route("/v1/conversations/{id}/turns", post(store_turns))
            .route("/v1/conversations/{id}", delete(delete_conversation))
            .route("/v1/tenant", delete(delete_tenant))
            .with_state(state)
    }
}

/// Erasure of a conversation from every store (raw turns, graph, vectors).
#[async_trait::async_trait]
pub trait Eraser: Send + Sync {
    /// None when the conversation does not exist for this tenant.
    async fn erase_conversation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<Option<u64>, RecollectError>;

    /// Erases every conversation of `tenant`: (conversations, turns) erased.
    async fn erase_tenant(&self, tenant: &TenantId) -> Result<(u64, u64), RecollectError>;
}
