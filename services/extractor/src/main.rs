//! `recollect-extractor`: `recollect.turns.raw` → `recollect.turns.extracted`, one consumer
//! group; the reference state of each conversation lives in the graph.

use std::sync::Arc;

use recollect_extractor::ExtractorStage;
use recollect_runtime::{bus_check, graph_check, open_bus, run_workers, start};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (settings, _telemetry) = start("extractor")?;
    let extractor = recollect_llm::extractor_from(&settings)?;
    let graph = recollect_storage::open_graph(&settings, &settings.storage.data_dir).await?;
    let bus = open_bus(&settings, "extractor").await?;
    let checks = vec![bus_check(bus.clone()), graph_check(graph.clone())];
    // The embedder decides whether a late-interaction model runs; context is carried whenever
    // one is configured (unread words cost only the state's room).
    let stage = Arc::new(
        ExtractorStage::new(extractor, graph).with_context_words(settings.late_context_words()),
    );
    run_workers(&settings, bus, vec![stage], checks).await?;
    Ok(())
}
