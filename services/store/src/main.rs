//! `recollect-store`: the embedded graph and vector engine, served to the other services.

use recollect_runtime::{
    graph_check, ops_router, serve_http, shutdown_signal, start, vectors_check,
};
use recollect_store_service::{router, Hosted};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (mut settings, _telemetry) = start("store")?;
    // This process is where the data lives: it always opens the embedded stores.
    settings.graph.kind = recollect_config::GraphKind::Embedded;
    settings.vectors.kind = recollect_config::VectorKind::Embedded;
    let dir = settings.storage.data_dir.clone();
    std::fs::create_dir_all(&dir)?;
    let addr = settings.listen_addr();
    anyhow::ensure!(
        addr.ip().is_loopback() || !settings.remote.token.is_empty(),
        "recollect-store listens on {addr} without a token: set RECOLLECT__REMOTE__TOKEN (and the same on every client)"
    );
    let graph = recollect_storage::open_graph(&settings, &dir).await?;
    let vectors = recollect_storage::open_vectors(&settings, &dir, settings.embedder_dim()).await?;
    let checks = vec![graph_check(graph.clone()), vectors_check(vectors.clone())];
    let app =
        router(Hosted { graph, vectors }, settings.remote.token.clone()).merge(ops_router(checks));
    serve_http(&settings, app, false, shutdown_signal()).await?;
    Ok(())
}
