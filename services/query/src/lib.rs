//! The query service: stateless recall over the stores (`POST /v1/recall`) and reads of single
//! memories (`GET /v1/memories/{id}`). Any number of replicas can run behind a load balancer.

use std::sync::Arc;

use axum::extract::State;
use axum::routing::{get, post};
use axum::Router;
use recollect_api::{ApiError, Auth, HasAuth, Json, PathParam, Tenant};
use recollect_model::{MemoryId, RecollectError, Turn};
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

fn map_recall(e: RecallError) -> RecollectError {
    RecollectError::from_classified(e)
}

pub async fn recall(
    State(s): State<QueryState>,
    Tenant(tenant): Tenant,
    Json(req): Json<RecallRequest>,
) -> Result<axum::Json<RecallResponse>, ApiError> {
    match s.recall.recall(&tenant, &req).await {
        Ok(memories) => Ok(axum::Json(RecallResponse { memories })),
        // A conversation whose turns are stored but not yet enriched exists: it has nothing to recall yet.
        Err(RecallError::UnknownConversation(c))
            if s.raw
                .as_ref()
                .is_some_and(|r| r.conversation_exists(&tenant, &c).unwrap_or(false)) =>
        {
            Ok(axum::Json(RecallResponse { memories: vec![] }))
        }
        Err(e) => Err(map_recall(e).into()),
    }
}

/// One memory by id, tenant-checked: another tenant's id is simply not found.
pub async fn get_memory(
    State(s): State<QueryState>,
    Tenant(tenant): Tenant,
    PathParam(id): PathParam,
) -> Result<axum::Json<Turn>, ApiError> {
    let Some(mid) = MemoryId::parse(&id) else {
        return Err(RecollectError::invalid(format!("{id:?} is not a memory id")).into());
    };
    let not_found = || ApiError(RecollectError::NotFound(format!("memory {id} not found")));
    if let Some(raw) = &s.raw {
        let r = raw.clone();
        let turn = tokio::task::spawn_blocking(move || r.get(mid))
            .await
            .map_err(RecollectError::internal)?
            .map_err(RecollectError::from_classified)?;
        return match turn {
            Some(t) if t.tenant == tenant => Ok(axum::Json(t)),
            _ => Err(not_found()),
        };
    }
    let recs = s
        .recall
        .graph()
        .turns(&tenant, &[mid])
        .await
        .map_err(RecollectError::from_classified)?;
    recs.into_iter()
        .next()
        .map(|r| axum::Json(r.turn))
        .ok_or_else(not_found)
}

pub fn router(state: QueryState) -> Router {
    Router::new()
        .route("/v1/recall", post(recall))
        .route("/v1/memories/{id}", get(get_memory))
        .with_state(state)
}
