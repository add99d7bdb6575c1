//! Opens the graph and vector stores a configuration names. Every service and the embedded
//! binary go through here, so a new adapter is wired in one place.

use std::path::Path;
use std::sync::Arc;

use recollect_config::{GraphKind, Settings, VectorKind};

use crate::{
    EdgeVectorIndex, EmbeddedGraph, Graph, RemoteGraph, RemoteVectorIndex, StoreError, VectorIndex,
};

/// Qdrant collections are `recollect_turns` and `recollect_keywords`.
pub const QDRANT_COLLECTION_PREFIX: &str = "recollect";

/// The graph named by `graph.kind`. Embedded stores live under `data_dir`.
pub async fn open_graph(
    settings: &Settings,
    data_dir: &Path,
) -> Result<Arc<dyn Graph>, StoreError> {
    match settings.graph.kind {
        GraphKind::Embedded => Ok(Arc::new(EmbeddedGraph::open(&data_dir.join("graph.redb"))?)),
        GraphKind::Neo4j => open_neo4j(settings).await,
        GraphKind::Remote => Ok(Arc::new(RemoteGraph::new(
            &settings.remote.url,
            &settings.remote.token,
        )?)),
    }
}

async fn open_neo4j(settings: &Settings) -> Result<Arc<dyn Graph>, StoreError> {
    Ok(Arc::new(
        crate::Neo4jGraph::connect(&crate::Neo4jSettings {
            uri: settings.graph.uri.clone(),
            user: settings.graph.user.clone(),
            password: settings.graph.password.clone(),
            database: settings.graph.database.clone(),
            ca_file: settings.graph.ca_file.clone(),
        })
        .await?,
    ))
}

/// The vector index named by `vectors.kind`, with dense vectors of `dim` dimensions.
pub async fn open_vectors(
    settings: &Settings,
    data_dir: &Path,
    dim: usize,
) -> Result<Arc<dyn VectorIndex>, StoreError> {
    match settings.vectors.kind {
        VectorKind::Embedded => Ok(Arc::new(EdgeVectorIndex::open(
            &data_dir.join("vectors"),
            dim,
        )?)),
        VectorKind::Qdrant => open_qdrant(settings, dim).await,
        VectorKind::Remote => Ok(Arc::new(RemoteVectorIndex::new(
            &settings.remote.url,
            &settings.remote.token,
        )?)),
    }
}

async fn open_qdrant(settings: &Settings, dim: usize) -> Result<Arc<dyn VectorIndex>, StoreError> {
    Ok(Arc::new(
        crate::QdrantVectorIndex::connect_with(
            &crate::QdrantSettings {
                url: settings.vectors.url.clone(),
                api_key: settings.vectors.api_key.clone(),
            },
            QDRANT_COLLECTION_PREFIX,
            dim,
        )
        .await?,
    ))
}
