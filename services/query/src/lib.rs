//! The query service: stateless recall over the stores (`POST /v1/recall`), reads of single
//! memories (`GET /v1/memories/{id}`) and where a conversation stands
//! (`GET /v1/conversations/{id}`). Any number of replicas can run behind a load balancer.

use std::sync::Arc;

use axum::extract::State;
use axum::routing::{get, post};
use axum::Router;
use recollect_api::{ApiError, Auth, HasAuth, Json, PathParam, Tenant};
use recollect_model::{request, MemoryId, RecollectError, TenantId, Turn};
use recollect_recall::{Recall, RecallError, RecallRequest, RecallResponse};
use recollect_store::RawStore;

#[derive(Clone)]
pub struct QueryState {
    pub recall: Arc<Recall>,
    pub auth: Auth,
    /// Embedded mode: the raw store answers for turns not yet enriched.
    pub raw: Option<RawStore>,
}

impl HasAuth for QueryState {
    fn auth(&self) -> &Auth {
        &self.auth
    }
}

impl QueryState {
    /// Recall for the caller's tenant: what `POST /v1/recall` and gRPC `Recall` answer.
    pub async fn recall_for(
        &self,
        tenant: &TenantId,
        req: &RecallRequest,
    ) -> Result<RecallResponse, RecollectError> {
        match self.recall.recall(tenant, req).await {
            Ok(memories) => Ok(RecallResponse { memories }),
            // A conversation whose turns are stored but not yet enriched exists: it has nothing to recall yet.
            Err(RecallError::UnknownConversation(c))
                if self
                    .raw
                    .as_ref()
                    .is_some_and(|r| r.conversation_exists(tenant, &c).unwrap_or(false)) =>
            {
                Ok(RecallResponse { memories: vec![] })
            }
            Err(e) => Err(RecollectError::from_classified(e)),
        }
    }

    /// Where a conversation stands: what `GET /v1/conversations/{id}` answers. Embedded, the raw
    /// store counts stored and pending turns; distributed, the query service sees only the
    /// stores, so `turns` counts the turns that reached the graph and `pending` is 0 (turns still
    /// on the bus are not visible to it).
    pub async fn conversation_info(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<ConversationInfo, RecollectError> {
        request::validate_conversation_id(conversation)
            .map_err(|r| RecollectError::Invalid(r.message))?;
        let not_found =
            || RecollectError::NotFound(format!("conversation {conversation:?} not found"));
        let recallable = self
            .recall
            .graph()
            .conversation_turns(tenant, conversation, 0, u64::MAX)
            .await
            .map_err(RecollectError::from_classified)?
            .len() as u64;
        let Some(raw) = self.raw.clone() else {
            if recallable == 0 {
                return Err(not_found());
            }
            return Ok(ConversationInfo {
                conversation_id: conversation.to_string(),
                turns: recallable,
                pending: 0,
                recallable,
            });
        };
        let (t, c) = (tenant.clone(), conversation.to_string());
        let r = raw.clone();
        let turns = tokio::task::spawn_blocking(move || r.conversation_turns(&t, &c))
            .await
            .map_err(RecollectError::internal)?
            .map_err(RecollectError::from_classified)?;
        if turns.is_empty() {
            return Err(not_found());
        }
        let mut pending = 0;
        for t in &turns {
            if raw
                .is_pending(t.memory_id)
                .map_err(RecollectError::from_classified)?
            {
                pending += 1;
            }
        }
        Ok(ConversationInfo {
            conversation_id: conversation.to_string(),
            turns: turns.len() as u64,
            pending,
            recallable,
        })
    }

    /// One memory by id, tenant-checked: another tenant's id is simply not found.
    pub async fn memory(&self, tenant: &TenantId, id: &str) -> Result<Turn, RecollectError> {
        let Some(mid) = MemoryId::parse(id) else {
            return Err(RecollectError::invalid(format!(
                "{id:?} is not a memory id"
            )));
        };
        let not_found = || RecollectError::NotFound(format!("memory {id} not found"));
        if let Some(raw) = &self.raw {
            let r = raw.clone();
            let turn = tokio::task::spawn_blocking(move || r.get(mid))
                .await
                .map_err(RecollectError::internal)?
                .map_err(RecollectError::from_classified)?;
            return match turn {
                Some(t) if &t.tenant == tenant => Ok(t),
                _ => Err(not_found()),
            };
        }
        let recs = self
            .recall
            .graph()
            .turns(tenant, &[mid])
            .await
            .map_err(RecollectError::from_classified)?;
        recs.into_iter()
            .next()
            .map(|r| r.turn)
            .ok_or_else(not_found)
    }
}

/// Recall memories for a query, with why each was returned (sources and score parts).
#[utoipa::path(
    post,
    path = "/v1/recall",
    tag = "query",
    request_body = RecallRequest,
    responses(
        (status = 200, description = "memories, best first", body = RecallResponse),
        (status = 400, description = "bad input; names the field", body = recollect_api::ErrorBody),
        (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
        (status = 404, description = "unknown conversation", body = recollect_api::ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn recall(
    State(s): State<QueryState>,
    Tenant(tenant): Tenant,
    Json(req): Json<RecallRequest>,
) -> Result<axum::Json<RecallResponse>, ApiError> {
    Ok(axum::Json(s.recall_for(&tenant, &req).await?))
}

/// One stored turn by memory id.
#[utoipa::path(
    get,
    path = "/v1/memories/{id}",
    tag = "query",
    params(("id" = String, Path, description = "memory id (UUID)")),
    responses(
        (status = 200, description = "the stored turn", body = Turn),
        (status = 400, description = "not a memory id", body = recollect_api::ErrorBody),
        (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
        (status = 404, description = "no such memory for this tenant", body = recollect_api::ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn get_memory(
    State(s): State<QueryState>,
    Tenant(tenant): Tenant,
    PathParam(id): PathParam,
) -> Result<axum::Json<Turn>, ApiError> {
    Ok(axum::Json(s.memory(&tenant, &id).await?))
}

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ConversationInfo {
    pub conversation_id: String,
    /// Turns stored durably (distributed: turns that reached the graph).
    pub turns: u64,
    /// Turns whose enrichment has not finished (distributed: always 0, the bus is not visible here).
    pub pending: u64,
    /// Turns in the graph, recallable.
    pub recallable: u64,
}

/// Where a conversation stands: stored, pending and recallable turn counts.
#[utoipa::path(get, path = "/v1/conversations/{id}", tag = "store",
    params(("id" = String, Path, description = "conversation id")),
    responses(
        (status = 200, description = "turn counts", body = ConversationInfo),
        (status = 400, description = "bad conversation id", body = recollect_api::ErrorBody),
        (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
        (status = 404, description = "no such conversation for this tenant", body = recollect_api::ErrorBody),
    ),
    security((), ("bearer" = [])))]
pub async fn conversation_info(
    State(s): State<QueryState>,
    Tenant(tenant): Tenant,
    PathParam(conversation): PathParam,
) -> Result<axum::Json<ConversationInfo>, ApiError> {
    Ok(axum::Json(
        s.conversation_info(&tenant, &conversation).await?,
    ))
}

pub fn router(state: QueryState) -> Router {
    Router::new()
        .route("/v1/recall", post(recall))
        .route("/v1/memories/{id}", get(get_memory))
        .route("/v1/conversations/{id}", get(conversation_info))
        .with_state(state)
}

/// The OpenAPI paths of the read path.
#[derive(utoipa::OpenApi)]
#[openapi(
    paths(recall, get_memory, conversation_info),
    components(schemas(recollect_model::TimeRef, recollect_model::Binding))
)]
pub struct QueryApi;

/// The query service as the shared serving layer (HTTP, gRPC) calls it.
#[async_trait::async_trait]
impl recollect_serve::QueryRole for QueryState {
    fn router(&self) -> Router {
        router(self.clone())
    }

    fn openapi(&self) -> utoipa::openapi::OpenApi {
        <QueryApi as utoipa::OpenApi>::openapi()
    }

    async fn recall(
        &self,
        tenant: &TenantId,
        req: &RecallRequest,
    ) -> Result<RecallResponse, RecollectError> {
        self.recall_for(tenant, req).await
    }

    async fn memory(&self, tenant: &TenantId, id: &str) -> Result<Turn, RecollectError> {
        QueryState::memory(self, tenant, id).await
    }
}
