//! `recollect-gateway`: the front door of the store path in a distributed deployment (HTTP and
//! gRPC on the shared serving layer). Validates turns and produces them to
//! `recollect.turns.raw` (acks=all); stateless.

use std::sync::Arc;

use recollect_api::Auth;
use recollect_gateway::http::GatewayState;
use recollect_gateway::{Gateway, Limits, StoreEraser};
use recollect_runtime::{bus_check, graph_check, open_bus, start};
use recollect_serve::Roles;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (settings, _telemetry) = start("gateway")?;
    let dir = settings.storage.data_dir.clone();
    let bus = open_bus(&settings, "gateway").await?;
    let graph = recollect_storage::open_graph(&settings, &dir).await?;
    let vectors = recollect_storage::open_vectors(&settings, &dir, settings.embedder_dim()).await?;
    let checks = vec![bus_check(bus.clone()), graph_check(graph.clone())];
    let limits = Limits {
        max_turns_per_request: settings.server.max_turns_per_request,
        max_text_bytes: settings.server.max_text_bytes,
        wait_timeout: std::time::Duration::from_secs(settings.server.wait_timeout_secs),
    };
    let roles = Roles {
        gateway: Some(Arc::new(GatewayState {
            gateway: Arc::new(Gateway::distributed(bus, graph.clone(), limits)),
            eraser: Arc::new(StoreEraser { graph, vectors }),
            auth: Auth::new(settings.api_keys()),
            // No data directory here: Kafka, the graph and the vectors are backed up with
            // their own tools; the endpoint says so.
            backup: None,
            admin_key: settings.server.admin_key.clone(),
        })),
        query: None,
    };
    recollect_serve::serve(&settings, roles, checks).await?;
    Ok(())
}
