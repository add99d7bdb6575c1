//! `recollect-embedder`: `recollect.turns.extracted` → `recollect.turns.embedded` (field
//! vectors, sparse lexical vectors, keyword vectors).

use std::sync::Arc;

use recollect_embedder::EmbedderStage;
use recollect_runtime::{
    bus_check, graph_check, load_embedder, load_token_embedder, open_bus, run_workers, start,
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (settings, _telemetry) = start("embedder")?;
    let embedder = load_embedder(&settings)?;
    // Only erasure markers are read here: turns erased while queued are not embedded.
    let graph = recollect_storage::open_graph(&settings, &settings.storage.data_dir).await?;
    let bus = open_bus(&settings, "embedder").await?;
    let checks = vec![bus_check(bus.clone()), graph_check(graph.clone())];
    run_workers(
        &settings,
        bus,
        vec![Arc::new(
            EmbedderStage::new(embedder)
                .with_token_embedder(load_token_embedder(&settings)?)
                .with_token_pooling(settings.embedder.late_pool_factor)
                .with_context_words(settings.embedder.late_context_words)
                .with_erasures(graph),
        )],
        checks,
    )
    .await?;
    Ok(())
}
