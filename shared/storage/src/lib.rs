//! Storage seams and their embedded implementations.
//!
//! - [`raw::RawStore`]: the durable log of raw turns (the source of truth) and the set of turns
//!   whose enrichment has not finished, replayed at start.
//! - [`Graph`]: turns, structural nodes and bi-temporal edges (embedded: redb; production: Neo4j through [`Neo4jGraph`]).
//! - [`VectorIndex`]: dense field vectors, sparse lexical vectors and keyword vectors
//!   (embedded: Qdrant's edge engine; production: a Qdrant server through [`QdrantVectorIndex`]).
//!
//! The recall pipeline is written against the traits only.
//!
//! Each seam is a folder: the trait and its plain types in `mod.rs`, one file per backend. A
//! backend is a cargo feature (`embedded`, `neo4j`, `qdrant`, `remote`): the deployables enable
//! them, while crates that only use the traits (recall, the runtime) link none of their clients.
//! `testsuite` exposes the contract suite every backend passes.

#[cfg(feature = "embedded")]
mod codec;
#[cfg(feature = "testsuite")]
pub mod contract;
pub mod error;
#[cfg(feature = "embedded")]
pub mod footprint;
pub mod graph;
#[cfg(any(feature = "embedded", feature = "neo4j"))]
mod keys;
#[cfg(feature = "embedded")]
mod numbering;
pub mod observed;
pub mod open;
#[cfg(feature = "embedded")]
pub mod raw;
pub mod remote;
pub mod vector;

pub use error::StoreError;
#[cfg(feature = "embedded")]
pub use graph::embedded::EmbeddedGraph;
#[cfg(feature = "neo4j")]
pub use graph::neo4j::{Neo4jGraph, Neo4jSettings};
#[cfg(feature = "remote")]
pub use graph::remote::RemoteGraph;
pub use graph::{
    distinct_runs, forget_record, EdgeTimes, ErasureMap, Erasures, Graph, GraphRead, LinkedTurn,
    NodeKind, Scope, TurnErasure, TurnRecord, TurnVersion, VersionWrite,
};
pub use observed::Observed;
pub use open::{open_graph, open_vectors, open_vectors_with};
#[cfg(feature = "embedded")]
pub use raw::RawStore;
#[cfg(feature = "embedded")]
pub use vector::edge::EdgeVectorIndex;
#[cfg(feature = "qdrant")]
pub use vector::qdrant::{QdrantSettings, QdrantVectorIndex};
#[cfg(feature = "remote")]
pub use vector::remote::RemoteVectorIndex;
pub use vector::{
    history_tenant, version_point_id, Flushes, KeywordSet, ReplacedVersion, TokenVectorsWanted,
    TurnPoint, VectorField, VectorIndex, VectorQuery,
};

/// Copies a directory tree (a backup of a store's files; the caller keeps writers away).
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> Result<(), StoreError> {
    copy_dir_except(from, to, &Default::default())
}

/// [`copy_dir`] without the files in `skip` (paths under `from`).
pub fn copy_dir_except(
    from: &std::path::Path,
    to: &std::path::Path,
    skip: &std::collections::HashSet<std::path::PathBuf>,
) -> Result<(), StoreError> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir_except(&e.path(), &target, skip)?;
        } else if !skip.contains(&e.path()) {
            std::fs::copy(e.path(), &target)?;
        }
    }
    Ok(())
}
