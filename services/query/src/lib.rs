//! The query service: stateless recall over the stores (`POST /v1/recall`) and reads of single
//! memories (`GET /v1/memories/{id}`). Any number of replicas can run behind a load balancer.

use std::sync::Arc;

use axum::extract::State;
use axum::routing::{get, post};
use axum::Router;
use recollect_api::{ApiError, Auth, HasAuth, Json, PathParam, Tenant};
use recollect_model::{MemoryId, RecollectError, TenantId, Turn};
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

pub fn router(state: QueryState) -> Router {
    Router::new()
        .route("/v1/recall", post(recall))
        .route("/v1/memories/{id}", get(get_memory))
        .with_state(state)
}
