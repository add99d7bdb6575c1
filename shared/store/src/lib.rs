//! Storage seams and their embedded implementations.
//!
//! - [`raw::RawStore`]: the durable log of raw turns (the source of truth) and the set of turns
//!   whose enrichment has not finished, replayed at start.
//! - [`Graph`]: turns, structural nodes and bi-temporal edges (embedded: redb; production: Neo4j through [`Neo4jGraph`]).
//! - [`VectorIndex`]: dense field vectors, sparse lexical vectors and keyword vectors
//!   (embedded: Qdrant's edge engine; production: a Qdrant server through [`QdrantVectorIndex`]).
//!
//! The recall pipeline is written against the traits only.

pub mod contract;
pub mod error;
pub mod graph;
pub mod graph_embedded;
pub mod graph_neo4j;
mod keys;
pub mod observed;
pub mod open;
pub mod raw;
pub mod remote;
pub mod vector;
pub mod vector_edge;
pub mod vector_qdrant;

pub use error::StoreError;
pub use graph::{
    distinct_runs, forget_record, EdgeTimes, ErasureMap, Erasures, Graph, LinkedTurn, NodeKind,
    Scope, TurnErasure, TurnRecord, TurnVersion, VersionWrite,
};
pub use graph_embedded::EmbeddedGraph;
pub use graph_neo4j::{Neo4jGraph, Neo4jSettings};
pub use observed::Observed;
pub use open::{open_graph, open_vectors};
pub use raw::RawStore;
pub use remote::{RemoteGraph, RemoteVectorIndex};
pub use vector::{
    history_tenant, version_point_id, ReplacedVersion, TurnPoint, VectorField, VectorIndex,
    VectorQuery,
};
pub use vector_edge::EdgeVectorIndex;
pub use vector_qdrant::{QdrantSettings, QdrantVectorIndex};

/// Copies a directory tree (a backup of a store's files; the caller keeps writers away).
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> Result<(), StoreError> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &target)?;
        } else {
            std::fs::copy(e.path(), &target)?;
        }
    }
    Ok(())
}
