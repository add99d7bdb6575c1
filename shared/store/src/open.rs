//! Opens the graph and vector stores a configuration names. Every service and the embedded
//! binary go through here, so a new adapter is wired in one place.

use std::path::Path;
use std::sync::Arc;

use recollect_config::{GraphKind, Settings, VectorKind};

use crate::{
    EdgeVectorIndex, EmbeddedGraph, Graph, RemoteGraph, RemoteVectorIndex, StoreError, VectorIndex,
};

/// The graph named by `graph.kind`. Embedded stores live under `data_dir`.
pub async fn open_graph(
    settings: &Settings,
    data_dir: &Path,
) -> Result<Arc<dyn Graph>, StoreError> {
    match settings.graph.kind {
        GraphKind::Embedded => Ok(Arc::new(EmbeddedGraph::open(&data_dir.join("graph.redb"))?)),
        GraphKind::Neo4j => Err(StoreError::Invalid(
            "graph.kind = neo4j is not available in this build yet".into(),
        )),
        GraphKind::Remote => Ok(Arc::new(RemoteGraph::new(
            &settings.remote.url,
            &settings.remote.token,
        )?)),
    }
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
        VectorKind::Qdrant => Err(StoreError::Invalid(
            "vectors.kind = qdrant is not available in this build yet".into(),
        )),
        VectorKind::Remote => Ok(Arc::new(RemoteVectorIndex::new(
            &settings.remote.url,
            &settings.remote.token,
        )?)),
    }
}
