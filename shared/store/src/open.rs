//! Opens the graph and vector stores a configuration names. Every service and the embedded
//! binary go through here, so a new adapter is wired in one place; each store comes wrapped in
//! [`Observed`], which reports its calls.

use std::path::Path;
use std::sync::Arc;

use recollect_config::{GraphKind, Settings, VectorKind};
use recollect_telemetry::events::StoreBackend;

use crate::{
    EdgeVectorIndex, EmbeddedGraph, Graph, Observed, RemoteGraph, RemoteVectorIndex, StoreError,
    VectorIndex,
};

/// Qdrant collections are `recollect_turns` and `recollect_keywords`.
pub const QDRANT_COLLECTION_PREFIX: &str = "recollect";

/// The graph named by `graph.kind`. Embedded stores live under `data_dir`.
pub async fn open_graph(
    settings: &Settings,
    data_dir: &Path,
) -> Result<Arc<dyn Graph>, StoreError> {
    Ok(match settings.graph.kind {
        GraphKind::Embedded => Arc::new(Observed::new(
            EmbeddedGraph::open(&data_dir.join("graph.redb"))?,
            StoreBackend::Embedded,
        )),
        GraphKind::Neo4j => Arc::new(Observed::new(
            open_neo4j(settings).await?,
            StoreBackend::Neo4j,
        )),
        GraphKind::Remote => Arc::new(Observed::new(
            RemoteGraph::new(&settings.remote.url, &settings.remote.token)?,
            StoreBackend::Remote,
        )),
    })
}

async fn open_neo4j(settings: &Settings) -> Result<crate::Neo4jGraph, StoreError> {
    crate::Neo4jGraph::connect(&crate::Neo4jSettings {
        uri: settings.graph.uri.clone(),
        user: settings.graph.user.clone(),
        password: settings.graph.password.clone(),
        database: settings.graph.database.clone(),
        ca_file: settings.graph.ca_file.clone(),
    })
    .await
}

/// The vector index named by `vectors.kind`, with dense vectors of `dim` dimensions.
pub async fn open_vectors(
    settings: &Settings,
    data_dir: &Path,
    dim: usize,
) -> Result<Arc<dyn VectorIndex>, StoreError> {
    Ok(match settings.vectors.kind {
        VectorKind::Embedded => Arc::new(Observed::new(
            EdgeVectorIndex::open(&data_dir.join("vectors"), dim)?,
            StoreBackend::Edge,
        )),
        VectorKind::Qdrant => Arc::new(Observed::new(
            open_qdrant(settings, dim).await?,
            StoreBackend::Qdrant,
        )),
        VectorKind::Remote => Arc::new(Observed::new(
            RemoteVectorIndex::new(&settings.remote.url, &settings.remote.token)?,
            StoreBackend::Remote,
        )),
    })
}

async fn open_qdrant(
    settings: &Settings,
    dim: usize,
) -> Result<crate::QdrantVectorIndex, StoreError> {
    crate::QdrantVectorIndex::connect_with(
        &crate::QdrantSettings {
            url: settings.vectors.url.clone(),
            api_key: settings.vectors.api_key.clone(),
        },
        QDRANT_COLLECTION_PREFIX,
        dim,
    )
    .await
}
