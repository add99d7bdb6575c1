//! `recollect-embedder`: `recollect.turns.extracted` → `recollect.turns.embedded` (field
//! vectors, sparse lexical vectors, keyword vectors).

use std::sync::Arc;

use recollect_embedder::EmbedderStage;
use recollect_runtime::{bus_check, load_embedder, open_bus, run_workers, start};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = start("embedder")?;
    let embedder = load_embedder(&settings)?;
    let bus = open_bus(&settings, "embedder").await?;
    let checks = vec![bus_check(bus.clone())];
    run_workers(
        &settings,
        bus,
        vec![Arc::new(EmbedderStage::new(embedder))],
        checks,
    )
    .await?;
    Ok(())
}
