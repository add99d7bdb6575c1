//! `recollect serve`: the HTTP API of the embedded binary (gateway and query routes), health,
//! readiness and Prometheus metrics.

use std::sync::Arc;

use anyhow::Context;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use recollect_api::{error_response, Auth, Guard};
use recollect_gateway::http::GatewayState;
use recollect_query::QueryState;
use recollect_telemetry as metrics;

use crate::app::App;

async fn healthz() -> &'static str {
    "ok"
}

/// Ready only when every store answers.
async fn readyz(State(app): State<Arc<App>>) -> Response {
    let tenant = recollect_model::TenantId::default_tenant();
    let raw = app.raw.clone();
    let raw_ok = tokio::task::spawn_blocking(move || raw.count().is_ok())
        .await
        .unwrap_or(false);
    let graph_ok = app.graph.conversations(&tenant).await.is_ok();
    let vec_ok = app
        .vectors
        .count(&tenant, &recollect_store::Scope::all())
        .await
        .is_ok();
    if raw_ok && graph_ok && vec_ok {
        (StatusCode::OK, "ready").into_response()
    } else {
        error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "a store does not answer",
        )
    }
}

#[derive(serde::Serialize)]
struct ConversationInfo {
    conversation_id: String,
    /// Turns stored durably.
    turns: u64,
    /// Turns whose enrichment has not finished.
    pending: u64,
    /// Turns in the graph, recallable.
    recallable: u64,
}

/// Where a conversation stands: stored, pending and recallable turn counts.
async fn conversation_info(
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
    recollect_api::PathParam(conversation): recollect_api::PathParam,
) -> Result<axum::Json<ConversationInfo>, recollect_api::ApiError> {
    use recollect_model::RecollectError;
    let auth = Auth::new(app.settings.api_keys());
    let tenant = auth.tenant_for(headers.get("authorization").and_then(|v| v.to_str().ok()))?;
    recollect_gateway::validate_conversation_id(&conversation)?;
    let raw = app.raw.clone();
    let (t, c) = (tenant.clone(), conversation.clone());
    let turns = tokio::task::spawn_blocking(move || raw.conversation_turns(&t, &c))
        .await
        .map_err(RecollectError::internal)?
        .map_err(RecollectError::from_classified)?;
    if turns.is_empty() {
        return Err(
            RecollectError::NotFound(format!("conversation {conversation:?} not found")).into(),
        );
    }
    let mut pending = 0;
    for t in &turns {
        if app
            .raw
            .is_pending(t.memory_id)
            .map_err(RecollectError::from_classified)?
        {
            pending += 1;
        }
    }
    let recallable = app
        .graph
        .conversation_turns(&tenant, &conversation, 0, u64::MAX)
        .await
        .map_err(RecollectError::from_classified)?
        .len() as u64;
    Ok(axum::Json(ConversationInfo {
        conversation_id: conversation,
        turns: turns.len() as u64,
        pending,
        recallable,
    }))
}

async fn metrics_text() -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        metrics::render(),
    )
}

async fn count_requests(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    let class = format!("{}xx", resp.status().as_u16() / 100);
    metrics::HTTP_REQUESTS
        .with_label_values(&[&route, &class])
        .inc();
    if route == "/v1/recall" {
        metrics::RECALL_LATENCY
            .with_label_values(&["http"])
            .observe(started.elapsed().as_secs_f64());
    }
    resp
}

async fn not_found() -> Response {
    error_response(StatusCode::NOT_FOUND, "not_found", "no such route")
}

pub fn router(app: Arc<App>) -> Router {
    let auth = Auth::new(app.settings.api_keys());
    let gw = GatewayState {
        gateway: app.gateway.clone(),
        eraser: app.eraser.clone(),
        auth: auth.clone(),
    };
    let q = QueryState {
        recall: app.recall.clone(),
        auth: auth.clone(),
        raw: Some(app.raw.clone()),
    };
    let server = &app.settings.server;
    let guard = Arc::new(Guard::new(
        auth,
        server.rate_limit_per_sec,
        server.rate_limit_burst,
        server.rate_limit_max_tenants,
        server.max_in_flight,
    ));
    // Only the work routes are limited: health, readiness and metrics must answer under load.
    let work = Router::new()
        .merge(recollect_gateway::http::router(gw))
        .merge(recollect_query::router(q))
        .route(
            "/v1/conversations/{id}",
            get(conversation_info).with_state(app.clone()),
        )
        .route_layer(middleware::from_fn_with_state(guard, recollect_api::guard));
    Router::new()
        .merge(work)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz).with_state(app.clone()))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .method_not_allowed_fallback(recollect_api::method_not_allowed)
        .layer(middleware::from_fn(count_requests))
        .layer(DefaultBodyLimit::max(app.settings.server.max_body_bytes))
}

pub async fn serve(app: App) -> anyhow::Result<()> {
    let addr = app.settings.listen_addr();
    let open = app.settings.api_keys().is_empty();
    if open && !addr.ip().is_loopback() {
        anyhow::bail!(
            "no API keys are configured, so the server would be open to anyone: it only listens on loopback \
             in that mode. Set RECOLLECT_API_KEYS=\"key:tenant\" to listen on {addr}"
        );
    }
    let app = Arc::new(app);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    if open {
        tracing::warn!(%addr, "no API keys configured: single-tenant and open, on loopback only");
    }
    tracing::info!(%addr, data_dir = %app.settings.storage.data_dir.display(), "recollect serving");
    axum::serve(listener, router(app.clone()))
        .with_graceful_shutdown(async {
            let ctrl_c = tokio::signal::ctrl_c();
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("signal handler");
            tokio::select! {
                _ = ctrl_c => {},
                _ = term.recv() => {},
            }
            tracing::info!("shutting down: draining in-flight work");
        })
        .await?;
    match Arc::try_unwrap(app) {
        Ok(app) => app.shutdown().await,
        Err(_) => tracing::warn!("requests still hold the app; exiting without draining"),
    }
    Ok(())
}
