//! `recollect serve`: the HTTP API of the embedded binary (gateway and query routes), health,
//! readiness, Prometheus metrics and the OpenAPI document; and the gRPC service beside it.

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

/// Liveness.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "the process is up", body = String, content_type = "text/plain")))]
async fn healthz() -> &'static str {
    "ok"
}

/// Ready only when every store answers.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "every store answers", body = String, content_type = "text/plain"),
        (status = 503, description = "a store does not answer", body = recollect_api::ErrorBody),
    ))]
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

#[derive(serde::Serialize, utoipa::ToSchema)]
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
#[utoipa::path(get, path = "/v1/conversations/{id}", tag = "store",
    params(("id" = String, Path, description = "conversation id")),
    responses(
        (status = 200, description = "turn counts", body = ConversationInfo),
        (status = 400, description = "bad conversation id", body = recollect_api::ErrorBody),
        (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
        (status = 404, description = "no such conversation for this tenant", body = recollect_api::ErrorBody),
    ),
    security((), ("bearer" = [])))]
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

/// Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "every metric", body = String, content_type = "text/plain")))]
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

/// Adds the bearer-key scheme the operations refer to.
struct BearerKey;

impl utoipa::Modify for BearerKey {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                "bearer",
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(
                            "API key; the tenant comes from it. Not needed when the server runs \
                             open (no keys configured, loopback only).",
                        ))
                        .build(),
                ),
            );
    }
}

/// The HTTP API, derived from the handlers and the request/response types they use.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Recollect",
        description = "Long-term memory for LLM agents: store chat turns, recall them in milliseconds."
    ),
    paths(
        recollect_gateway::http::store_turns,
        recollect_gateway::http::delete_conversation,
        recollect_gateway::http::delete_tenant,
        recollect_query::recall,
        recollect_query::get_memory,
        conversation_info,
        healthz,
        readyz,
        metrics_text,
        openapi_json,
    ),
    components(schemas(recollect_model::TimeRef, recollect_model::Binding)),
    modifiers(&BearerKey)
)]
pub struct ApiDoc;

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "the OpenAPI 3.1 document of this API", body = Object)))]
async fn openapi_json() -> Response {
    static DOC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let text = DOC.get_or_init(|| {
        use utoipa::OpenApi;
        ApiDoc::openapi()
            .to_json()
            .expect("the OpenAPI document serialises")
    });
    ([("content-type", "application/json")], text.clone()).into_response()
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
        .route("/openapi.json", get(openapi_json))
        .fallback(not_found)
        .method_not_allowed_fallback(recollect_api::method_not_allowed)
        .layer(middleware::from_fn(count_requests))
        .layer(DefaultBodyLimit::max(app.settings.server.max_body_bytes))
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("signal handler");
    tokio::select! {
        _ = ctrl_c => {},
        _ = term.recv() => {},
    }
}

fn grpc_service(app: &App) -> crate::grpc::MemoryService {
    let auth = Auth::new(app.settings.api_keys());
    crate::grpc::MemoryService::new(
        GatewayState {
            gateway: app.gateway.clone(),
            eraser: app.eraser.clone(),
            auth: auth.clone(),
        },
        QueryState {
            recall: app.recall.clone(),
            auth: auth.clone(),
            raw: Some(app.raw.clone()),
        },
        auth,
    )
}

pub async fn serve(app: App) -> anyhow::Result<()> {
    let addr = app.settings.listen_addr();
    let grpc_addr = app.settings.grpc_listen_addr();
    let open = app.settings.api_keys().is_empty();
    for a in std::iter::once(addr).chain(grpc_addr) {
        if open && !a.ip().is_loopback() {
            anyhow::bail!(
                "no API keys are configured, so the server would be open to anyone: it only listens on loopback \
                 in that mode. Set RECOLLECT_API_KEYS=\"key:tenant\" to listen on {a}"
            );
        }
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let grpc_listener = match grpc_addr {
        Some(a) => Some(tokio::net::TcpListener::bind(a).await.with_context(|| {
            format!("binding {a} for gRPC (server.grpc_listen; \"\" turns it off)")
        })?),
        None => None,
    };
    if open {
        tracing::warn!(%addr, "no API keys configured: single-tenant and open, on loopback only");
    }
    // One signal stops both servers.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: draining in-flight work");
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let grpc_task = grpc_listener.map(|l| {
        let svc = grpc_service(&app).into_server(app.settings.server.max_body_bytes);
        let rx = stop_rx.clone();
        tracing::info!(addr = %grpc_addr.expect("bound"), "recollect gRPC serving");
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(l),
                    stopped(rx),
                )
                .await
        })
    });
    let app = Arc::new(app);
    tracing::info!(%addr, data_dir = %app.settings.storage.data_dir.display(), "recollect serving");
    axum::serve(listener, router(app.clone()))
        .with_graceful_shutdown(stopped(stop_rx))
        .await?;
    if let Some(t) = grpc_task {
        t.await?.context("gRPC server")?;
    }
    match Arc::try_unwrap(app) {
        Ok(app) => app.shutdown().await,
        Err(_) => tracing::warn!("requests still hold the app; exiting without draining"),
    }
    Ok(())
}
