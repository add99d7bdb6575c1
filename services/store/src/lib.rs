//! `recollect-store`: hosts the embedded graph (redb) and vector engine (Qdrant's edge engine)
//! for distributed deployments that run neither Neo4j nor Qdrant. One process owns the files;
//! extractor, graph-writer, consolidator, query and gateway reach it through `RemoteGraph` and
//! `RemoteVectorIndex`. Every call is one of the seams' trait methods, so behaviour is the
//! embedded stores' exactly (the contract suite runs through it).

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use recollect_storage::remote::{
    dispatch_graph, dispatch_vectors, GraphCall, VectorCall, WireError, GRAPH_PATH, VECTORS_PATH,
};
use recollect_storage::{Graph, StoreError, VectorIndex};

#[derive(Clone)]
pub struct Hosted {
    pub graph: Arc<dyn Graph>,
    pub vectors: Arc<dyn VectorIndex>,
}

fn reply(r: Result<serde_json::Value, StoreError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => {
            let status = match e {
                StoreError::Invalid(_) => StatusCode::BAD_REQUEST,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            (status, Json(WireError::from(&e))).into_response()
        }
    }
}

// The hosted stores come from `open_graph`/`open_vectors`, so each call served is reported by
// the store itself (backend embedded or edge), like in any other process.
async fn graph_call(State(h): State<Hosted>, Json(call): Json<GraphCall>) -> Response {
    reply(dispatch_graph(h.graph.as_ref(), call).await)
}

async fn vector_call(State(h): State<Hosted>, Json(call): Json<VectorCall>) -> Response {
    reply(dispatch_vectors(h.vectors.as_ref(), call).await)
}

/// Constant-time comparison of the bearer token (no early exit on the first differing byte).
fn token_ok(got: &[u8], want: &[u8]) -> bool {
    got.len() == want.len() && got.iter().zip(want).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0
}

/// The store routes; with a non-empty `token`, every call must carry it as a bearer token.
pub fn router(hosted: Hosted, token: String) -> Router {
    let token = Arc::new(token);
    Router::new()
        .route(GRAPH_PATH, post(graph_call))
        .route(VECTORS_PATH, post(vector_call))
        .with_state(hosted)
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            let token = token.clone();
            async move {
                if !token.is_empty() {
                    let got = req
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.strip_prefix("Bearer "))
                        .unwrap_or("");
                    if !token_ok(got.as_bytes(), token.as_bytes()) {
                        return (StatusCode::UNAUTHORIZED, "missing or wrong store token")
                            .into_response();
                    }
                }
                next.run(req).await
            }
        }))
        // Batches of turns with their vectors are large; the callers are our own services.
        .layer(DefaultBodyLimit::max(512 * 1024 * 1024))
}
