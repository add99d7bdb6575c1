//! `recollect-consolidator`: `recollect.turns.stored` → topic Fragments every N turns of a
//! conversation.

use std::sync::Arc;

use recollect_consolidator::ConsolidatorStage;
use recollect_runtime::{bus_check, graph_check, open_bus, run_workers, start, vectors_check};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (settings, _telemetry) = start("consolidator")?;
    let dir = settings.storage.data_dir.clone();
    let graph = recollect_storage::open_graph(&settings, &dir).await?;
    let vectors = recollect_storage::open_vectors(&settings, &dir, settings.embedder_dim()).await?;
    let bus = open_bus(&settings, "consolidator").await?;
    let checks = vec![
        bus_check(bus.clone()),
        graph_check(graph.clone()),
        vectors_check(vectors.clone()),
    ];
    let stage = Arc::new(ConsolidatorStage::from_settings(graph, vectors, &settings)?);
    run_workers(&settings, bus, vec![stage], checks).await?;
    Ok(())
}
