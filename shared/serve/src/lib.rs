//! The one serving layer of `recollect serve`, `recollect-gateway` and `recollect-query`: the
//! HTTP router (auth, body limit, per-tenant rate limit, in-flight bound, request metrics and
//! spans), the
//! gRPC `Memory` service, the OpenAPI document, `/healthz`, `/readyz` (checks passed in),
//! `/metrics`, and one shutdown signal that stops HTTP and gRPC together.
//!
//! What a process serves is given by its [`Roles`]: the gateway role (store and erase), the query
//! role (recall, memories, conversation info), or both (the embedded binary). A route or gRPC
//! method of a role the process lacks answers 404 / UNIMPLEMENTED naming the service that has it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, on, MethodFilter};
use axum::Router;
use recollect_api::{error_response, Auth, Guard};
use recollect_config::Settings;
use recollect_model::{MemoryId, RecollectError, TenantId, Turn};
use recollect_recall::{RecallRequest, RecallResponse};
use recollect_runtime::Check;
use recollect_telemetry::events::{Api, HttpRequestCompleted, InternalEvent, RecallServed};
use tokio::sync::watch;

pub mod grpc;
pub mod mcp;
pub mod openapi;

/// The service that serves the store path in a distributed deployment.
pub const GATEWAY_SERVICE: &str = "recollect-gateway";
/// The service that serves the read path in a distributed deployment.
pub const QUERY_SERVICE: &str = "recollect-query";

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Setup(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("server task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Which half of the API a process serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Store and erase.
    Gateway,
    /// Recall, memories by id, conversation info.
    Query,
}

impl Role {
    pub fn service(self) -> &'static str {
        match self {
            Role::Gateway => GATEWAY_SERVICE,
            Role::Query => QUERY_SERVICE,
        }
    }
}

/// Every work operation of the HTTP API and the role that serves it.
pub const OPERATIONS: &[(&str, &str, Role)] = &[
    ("POST", "/v1/conversations/{id}/turns", Role::Gateway),
    ("DELETE", "/v1/conversations/{id}", Role::Gateway),
    ("DELETE", "/v1/memories/{id}", Role::Gateway),
    ("PATCH", "/v1/memories/{id}", Role::Gateway),
    ("DELETE", "/v1/tenant", Role::Gateway),
    ("POST", "/v1/reindex", Role::Gateway),
    ("POST", "/v1/admin/backup", Role::Gateway),
    ("POST", "/v1/recall", Role::Query),
    ("GET", "/v1/memories/{id}", Role::Query),
    ("GET", "/v1/memories/{id}/history", Role::Query),
    ("GET", "/v1/conversations/{id}", Role::Query),
    ("GET", "/v1/conversations", Role::Query),
    ("GET", "/v1/conversations/{id}/turns", Role::Query),
];

pub use recollect_model::request::StoreRequest;

/// The store path as the serving layer calls it (implemented by `recollect-gateway`).
#[async_trait::async_trait]
pub trait StoreRole: Send + Sync {
    /// Its HTTP routes; the serving layer adds auth, limits and metrics around them.
    fn router(&self) -> Router;
    /// The OpenAPI paths of those routes.
    fn openapi(&self) -> utoipa::openapi::OpenApi;
    /// Operator routes (backup): their own key, outside the tenants' auth and limits.
    fn operator_router(&self) -> Option<Router> {
        None
    }
    /// Validates and stores one batch of a conversation (waiting when the request says so).
    async fn store(
        &self,
        tenant: &TenantId,
        conversation: &str,
        req: StoreRequest,
        trace_id: &str,
    ) -> Result<Vec<MemoryId>, RecollectError>;
    /// Returns once every id is recallable (or the wait timeout passes: Unavailable).
    async fn wait_stored(&self, tenant: &TenantId, ids: &[MemoryId]) -> Result<(), RecollectError>;
    /// Erases a conversation: the turns erased, NotFound when the tenant has no such conversation.
    async fn delete_conversation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<u64, RecollectError>;
    /// Erases one memory: (conversation id, turn id) it had, NotFound when the tenant has no
    /// such memory.
    async fn delete_memory(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> Result<(String, String), RecollectError>;
    /// Derives every turn of the tenant again: (conversations, turns) queued.
    async fn reindex(
        &self,
        tenant: &TenantId,
        trace_id: &str,
    ) -> Result<(u64, u64), RecollectError>;
    /// Edits one memory: the version now current (NotFound as for `delete_memory`).
    async fn edit_memory(
        &self,
        tenant: &TenantId,
        id: &str,
        patch: recollect_model::TurnPatch,
        trace_id: &str,
    ) -> Result<Turn, RecollectError>;
}

/// The read path as the serving layer calls it (implemented by `recollect-query`).
#[async_trait::async_trait]
pub trait QueryRole: Send + Sync {
    fn router(&self) -> Router;
    fn openapi(&self) -> utoipa::openapi::OpenApi;
    async fn recall(
        &self,
        tenant: &TenantId,
        req: &RecallRequest,
    ) -> Result<RecallResponse, RecollectError>;
    /// One memory by id of the caller's tenant; with `as_of`, the version held then.
    async fn memory(
        &self,
        tenant: &TenantId,
        id: &str,
        as_of: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Turn, RecollectError>;
    /// Every version of a memory, oldest first.
    async fn memory_history(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> Result<Vec<Turn>, RecollectError>;
    /// One page of the caller's conversation ids and the next cursor
    /// (`GET /v1/conversations`).
    async fn conversations_page(
        &self,
        tenant: &TenantId,
        page: ConversationPageRequest,
    ) -> Result<(Vec<String>, Option<String>), RecollectError>;
    /// One page of a conversation's turns, each with its extraction (None while pending) and
    /// fragments, and the next cursor (`GET /v1/conversations/{id}/turns`).
    async fn turns_page(
        &self,
        tenant: &TenantId,
        conversation: &str,
        limit: Option<i64>,
        cursor: Option<String>,
    ) -> Result<(Vec<ListedTurn>, Option<String>), RecollectError>;
}

/// What a conversation listing asks for, whichever edge it came through.
#[derive(Debug, Clone, Default)]
pub struct ConversationPageRequest {
    pub limit: Option<i64>,
    pub cursor: Option<String>,
    pub user_id: Option<String>,
    pub agent_id: Option<String>,
}

/// A listed turn: the turn, what the extractor found (None while pending), its fragments.
pub type ListedTurn = (Turn, Option<recollect_model::Extraction>, Vec<String>);

/// The roles one process serves: both in the embedded binary, one in each distributed service.
#[derive(Clone, Default)]
pub struct Roles {
    pub gateway: Option<Arc<dyn StoreRole>>,
    pub query: Option<Arc<dyn QueryRole>>,
}

impl Roles {
    pub fn has(&self, role: Role) -> bool {
        match role {
            Role::Gateway => self.gateway.is_some(),
            Role::Query => self.query.is_some(),
        }
    }

    /// The name this process answers with when a caller reaches the wrong service.
    pub fn service(&self) -> &'static str {
        match (self.gateway.is_some(), self.query.is_some()) {
            (true, true) => "recollect",
            (true, false) => GATEWAY_SERVICE,
            (false, true) => QUERY_SERVICE,
            (false, false) => "recollect (no API)",
        }
    }
}

/// What [`router`] and [`serve`] need besides the roles.
#[derive(Clone)]
pub struct Options {
    pub auth: Auth,
    pub max_body_bytes: usize,
    pub rate_limit_per_sec: u32,
    pub rate_limit_burst: u32,
    pub rate_limit_max_tenants: usize,
    pub max_in_flight: usize,
    /// Serve the memory browser at `/ui`.
    pub ui: bool,
}

impl Options {
    pub fn from_settings(settings: &Settings) -> Self {
        let s = &settings.server;
        Self {
            auth: Auth::new(settings.api_keys()),
            max_body_bytes: s.max_body_bytes,
            rate_limit_per_sec: s.rate_limit_per_sec,
            rate_limit_burst: s.rate_limit_burst,
            rate_limit_max_tenants: s.rate_limit_max_tenants,
            max_in_flight: s.max_in_flight,
            ui: s.ui,
        }
    }

    /// The one rate limiter and in-flight bound of a process, shared by HTTP and gRPC.
    pub fn guard(&self) -> Arc<Guard> {
        Arc::new(Guard::new(
            self.auth.clone(),
            self.rate_limit_per_sec,
            self.rate_limit_burst,
            self.rate_limit_max_tenants,
            self.max_in_flight,
        ))
    }
}

/// Liveness.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "the process is up", body = String, content_type = "text/plain")))]
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

#[derive(Clone)]
struct Probes(Arc<Vec<(&'static str, Check)>>);

/// Ready only when every dependency answers; the message names those that do not.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "every dependency answers", body = String, content_type = "text/plain"),
        (status = 503, description = "a dependency does not answer", body = recollect_api::ErrorBody),
    ))]
pub(crate) async fn readyz(State(p): State<Probes>) -> Response {
    let mut failing = Vec::new();
    for (name, check) in p.0.iter() {
        if !check().await {
            failing.push(*name);
        }
    }
    if failing.is_empty() {
        (StatusCode::OK, "ready").into_response()
    } else {
        error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            &format!("not ready: {} not answering", failing.join(", ")),
        )
    }
}

/// Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "every metric", body = String, content_type = "text/plain")))]
pub(crate) async fn metrics_text() -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        recollect_telemetry::render(),
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
    HttpRequestCompleted {
        route: &route,
        status: resp.status().as_u16(),
    }
    .emit();
    if route == "/v1/recall" {
        RecallServed {
            api: Api::Http,
            elapsed: started.elapsed(),
        }
        .emit();
    }
    resp
}

async fn not_found() -> Response {
    error_response(StatusCode::NOT_FOUND, "not_found", "no such route")
}

fn method_filter(m: &str) -> MethodFilter {
    match m {
        "POST" => MethodFilter::POST,
        "DELETE" => MethodFilter::DELETE,
        "GET" => MethodFilter::GET,
        "PATCH" => MethodFilter::PATCH,
        other => unreachable!("no operation uses {other}"),
    }
}

/// 404 for an operation another service serves, naming it (a misrouted ingress or client
/// gets told where to go instead of a bare "no such route").
fn served_elsewhere(
    method: &'static str,
    path: &'static str,
    role: Role,
    here: &'static str,
) -> Router {
    let message = format!(
        "{method} {path} is served by {}, not by {here}",
        role.service()
    );
    Router::new().route(
        path,
        on(method_filter(method), move || {
            let message = message.clone();
            async move { error_response(StatusCode::NOT_FOUND, "not_found", &message) }
        }),
    )
}

/// The HTTP API of `roles`, with `/healthz`, `/readyz` (`checks`), `/metrics` and
/// `/openapi.json`; and MCP (Streamable HTTP) at `/mcp` where the query role is served.
pub fn router(
    roles: &Roles,
    options: &Options,
    guard: Arc<Guard>,
    checks: Vec<(&'static str, Check)>,
) -> Router {
    let mut work = Router::new();
    if let Some(gw) = &roles.gateway {
        work = work.merge(gw.router());
    }
    if let Some(q) = &roles.query {
        work = work.merge(q.router()).route_service(
            "/mcp",
            mcp::http_service(roles.clone(), options.auth.clone(), options.max_body_bytes),
        );
    }
    // Only the work routes are limited: health, readiness and metrics must answer under load.
    let work = work.route_layer(middleware::from_fn_with_state(guard, recollect_api::guard));
    let mut app = Router::new().merge(work);
    if let Some(op) = roles.gateway.as_ref().and_then(|g| g.operator_router()) {
        app = app.merge(op);
    }
    for &(method, path, role) in OPERATIONS {
        if !roles.has(role) {
            app = app.merge(served_elsewhere(method, path, role, roles.service()));
        }
    }
    let doc = openapi::document_json(roles);
    if options.ui && roles.query.is_some() {
        // A static page: it holds no data, and every call it makes carries the key typed in.
        app = app.route("/ui", get(ui_page));
    }
    let app = app
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz).with_state(Probes(Arc::new(checks))))
        .route("/metrics", get(metrics_text))
        .route(
            "/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move { ([("content-type", "application/json")], doc).into_response() }
            }),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(recollect_api::method_not_allowed)
        .layer(middleware::from_fn(count_requests))
        .layer(DefaultBodyLimit::max(options.max_body_bytes));
    recollect_runtime::traced(app)
}

/// A process's listeners: the HTTP address and, unless turned off, the gRPC one.
pub struct Listeners {
    pub http: tokio::net::TcpListener,
    pub grpc: Option<tokio::net::TcpListener>,
}

/// Binds `server.listen` and `server.grpc_listen`. Without API keys the API is open, so both
/// must be loopback addresses.
pub async fn bind(settings: &Settings) -> Result<Listeners, ServeError> {
    let addr = settings.listen_addr();
    let grpc_addr = settings.grpc_listen_addr();
    let open = settings.api_keys().is_empty();
    for a in std::iter::once(addr).chain(grpc_addr) {
        if open && !a.ip().is_loopback() {
            return Err(ServeError::Setup(format!(
                "no API keys are configured, so the server would be open to anyone: it only listens on loopback \
                 in that mode. Set RECOLLECT_API_KEYS=\"key:tenant\" to listen on {a}"
            )));
        }
    }
    let http = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Io {
            what: format!("binding {addr} (server.listen)"),
            source,
        })?;
    let grpc = match grpc_addr {
        Some(a) => Some(bind_grpc(a).await?),
        None => None,
    };
    if open {
        tracing::warn!(%addr, "no API keys configured: single-tenant and open, on loopback only");
    }
    Ok(Listeners { http, grpc })
}

async fn bind_grpc(a: SocketAddr) -> Result<tokio::net::TcpListener, ServeError> {
    tokio::net::TcpListener::bind(a)
        .await
        .map_err(|source| ServeError::Io {
            what: format!("binding {a} for gRPC (server.grpc_listen; \"\" turns it off)"),
            source,
        })
}

/// Serves `roles` over HTTP and gRPC on the bound `listeners` until `shutdown` flips to true;
/// both servers drain in-flight requests and stop on that one signal.
pub async fn serve_on(
    listeners: Listeners,
    roles: Roles,
    options: Options,
    checks: Vec<(&'static str, Check)>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ServeError> {
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let guard = options.guard();
    let grpc_task = listeners.grpc.map(|l| {
        let svc = grpc::MemoryService::new(roles.clone(), guard.clone())
            .into_server(options.max_body_bytes);
        let rx = shutdown.clone();
        if let Ok(a) = l.local_addr() {
            tracing::info!(addr = %a, service = roles.service(), "gRPC serving");
        }
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
    if let Ok(a) = listeners.http.local_addr() {
        tracing::info!(addr = %a, service = roles.service(), "HTTP serving");
    }
    let app = router(&roles, &options, guard, checks);
    axum::serve(listeners.http, app)
        .with_graceful_shutdown(stopped(shutdown))
        .await
        .map_err(|source| ServeError::Io {
            what: "HTTP server".into(),
            source,
        })?;
    if let Some(t) = grpc_task {
        t.await??;
    }
    Ok(())
}

/// [`bind`] then [`serve_on`] with the settings' limits, until SIGTERM or Ctrl-C.
pub async fn serve(
    settings: &Settings,
    roles: Roles,
    checks: Vec<(&'static str, Check)>,
) -> Result<(), ServeError> {
    let listeners = bind(settings).await?;
    let local = |l: &tokio::net::TcpListener| {
        l.local_addr().map_err(|source| ServeError::Io {
            what: "reading the bound address".into(),
            source,
        })
    };
    let grpc = match &listeners.grpc {
        Some(l) => Some(local(l)?),
        None => None,
    };
    recollect_runtime::report_addresses(settings, local(&listeners.http)?, grpc).map_err(
        |source| ServeError::Io {
            what: format!(
                "writing server.address_file {}",
                settings.server.address_file
            ),
            source,
        },
    )?;
    serve_on(
        listeners,
        roles,
        Options::from_settings(settings),
        checks,
        recollect_runtime::shutdown_signal(),
    )
    .await
}

/// The memory browser (`/ui`): one self-contained page over the HTTP API.
async fn ui_page() -> Response {
    (
        [
            ("content-type", "text/html; charset=utf-8"),
            // Nothing from elsewhere: scripts and styles are the page's own.
            (
                "content-security-policy",
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
            ),
        ],
        include_str!("ui.html"),
    )
        .into_response()
}
