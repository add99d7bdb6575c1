//! `recollect-gateway`: the HTTP front door of the store path in a distributed deployment.
//! Validates turns and produces them to `recollect.turns.raw` (acks=all); stateless.

use std::sync::Arc;

use recollect_api::Auth;
use recollect_gateway::http::{router, GatewayState};
use recollect_gateway::{Gateway, Limits, StoreEraser};
use recollect_runtime::{
    bus_check, graph_check, open_bus, ops_router, serve_http, shutdown_signal, start,
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = start("gateway")?;
    let dir = settings.storage.data_dir.clone();
    let bus = open_bus(&settings, "gateway").await?;
    let graph = recollect_store::open_graph(&settings, &dir).await?;
    let vectors = recollect_store::open_vectors(&settings, &dir, settings.embedder_dim()).await?;
    let checks = vec![bus_check(bus.clone()), graph_check(graph.clone())];
    let limits = Limits {
        max_turns_per_request: settings.server.max_turns_per_request,
        wait_timeout: std::time::Duration::from_secs(settings.server.wait_timeout_secs),
        ..Limits::default()
    };
    let state = GatewayState {
        gateway: Arc::new(Gateway::distributed(bus, graph.clone(), limits)),
        eraser: Arc::new(StoreEraser { graph, vectors }),
        auth: Auth::new(settings.api_keys()),
    };
    let app = router(state)
        .merge(ops_router(checks))
        .layer(axum::extract::DefaultBodyLimit::max(
            settings.server.max_body_bytes,
        ));
    serve_http(&settings, app, true, shutdown_signal()).await?;
    Ok(())
}
