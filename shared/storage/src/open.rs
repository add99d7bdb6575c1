//! Opens the graph and vector stores a configuration names. Every service and the embedded
//! binary go through here, so a new adapter is wired in one place; each store comes wrapped in
//! [`Observed`], which reports its calls. A backend this build left out (its cargo feature is
//! off) is a configuration error that names the feature.

use std::path::Path;
use std::sync::Arc;

use recollect_config::{GraphKind, Settings, VectorKind};
#[allow(unused_imports)] // unused when no backend is built in
use recollect_telemetry::events::StoreBackend;

#[allow(unused_imports)]
use crate::Observed;
use crate::{Flushes, Graph, StoreError, VectorIndex};

/// Qdrant collections are `recollect_turns` and `recollect_keywords`.
pub const QDRANT_COLLECTION_PREFIX: &str = "recollect";

#[allow(dead_code)] // unused only when every backend is built in
fn not_built(kind: &str, feature: &str) -> StoreError {
    StoreError::Invalid(format!(
        "this binary was built without the `{feature}` feature of recollect-storage, so it cannot open a {kind} store"
    ))
}

/// The graph named by `graph.kind`. Embedded stores live under `data_dir`.
pub async fn open_graph(
    settings: &Settings,
    data_dir: &Path,
) -> Result<Arc<dyn Graph>, StoreError> {
    Ok(match settings.graph.kind {
        #[cfg(feature = "embedded")]
        GraphKind::Embedded => Arc::new(Observed::new(
            crate::EmbeddedGraph::open(&data_dir.join("graph.redb"))?,
            StoreBackend::Embedded,
        )),
        #[cfg(feature = "neo4j")]
        GraphKind::Neo4j => Arc::new(Observed::new(
            open_neo4j(settings).await?,
            StoreBackend::Neo4j,
        )),
        #[cfg(feature = "remote")]
        GraphKind::Remote => Arc::new(Observed::new(
            crate::RemoteGraph::new(&settings.remote.url, &settings.remote.token)?,
            StoreBackend::Remote,
        )),
        #[allow(unreachable_patterns)]
        other => {
            let _ = data_dir;
            return Err(not_built(&format!("{other:?} graph"), graph_feature(other)));
        }
    })
}

#[allow(dead_code)]
fn graph_feature(kind: GraphKind) -> &'static str {
    match kind {
        GraphKind::Embedded => "embedded",
        GraphKind::Neo4j => "neo4j",
        GraphKind::Remote => "remote",
    }
}

#[cfg(feature = "neo4j")]
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

/// The token vectors `embedder.late_model` asks of the vector index: a named model requires
/// them, `auto` takes them where the index can hold them.
#[cfg(any(feature = "embedded", feature = "qdrant"))]
fn token_vectors(settings: &Settings) -> crate::TokenVectorsWanted {
    match settings.late_dim() {
        None => crate::TokenVectorsWanted::No,
        Some(width) if settings.late_is_auto() => crate::TokenVectorsWanted::WherePossible(width),
        Some(width) => crate::TokenVectorsWanted::Required(width),
    }
}

/// The vector index named by `vectors.kind`, with dense vectors of `dim` dimensions.
pub async fn open_vectors(
    settings: &Settings,
    data_dir: &Path,
    dim: usize,
) -> Result<Arc<dyn VectorIndex>, StoreError> {
    open_vectors_with(settings, data_dir, dim, Default::default()).await
}

/// [`open_vectors`], with the embedded index's flushes deferred to `sync` when `flushes` says
/// so (the single binary, which replays what a crash loses); the servers ignore it.
pub async fn open_vectors_with(
    settings: &Settings,
    data_dir: &Path,
    dim: usize,
    flushes: Flushes,
) -> Result<Arc<dyn VectorIndex>, StoreError> {
    Ok(match settings.vectors.kind {
        #[cfg(feature = "embedded")]
        VectorKind::Embedded => Arc::new(Observed::new(
            crate::EdgeVectorIndex::open_shaped(
                &data_dir.join("vectors"),
                dim,
                token_vectors(settings),
                flushes,
            )?,
            StoreBackend::Edge,
        )),
        #[cfg(feature = "qdrant")]
        VectorKind::Qdrant => Arc::new(Observed::new(
            open_qdrant(settings, dim).await?,
            StoreBackend::Qdrant,
        )),
        #[cfg(feature = "remote")]
        VectorKind::Remote => Arc::new(Observed::new(
            crate::RemoteVectorIndex::new(&settings.remote.url, &settings.remote.token)?,
            StoreBackend::Remote,
        )),
        #[allow(unreachable_patterns)]
        other => {
            let _ = (data_dir, dim, flushes);
            return Err(not_built(
                &format!("{other:?} vector"),
                vector_feature(other),
            ));
        }
    })
}

#[allow(dead_code)]
fn vector_feature(kind: VectorKind) -> &'static str {
    match kind {
        VectorKind::Embedded => "embedded",
        VectorKind::Qdrant => "qdrant",
        VectorKind::Remote => "remote",
    }
}

#[cfg(feature = "qdrant")]
async fn open_qdrant(
    settings: &Settings,
    dim: usize,
) -> Result<crate::QdrantVectorIndex, StoreError> {
    crate::QdrantVectorIndex::connect_shaped(
        &crate::QdrantSettings {
            url: settings.vectors.url.clone(),
            api_key: settings.vectors.api_key.clone(),
        },
        QDRANT_COLLECTION_PREFIX,
        dim,
        token_vectors(settings),
    )
    .await
}
