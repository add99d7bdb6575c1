//! Store telemetry, once for every adapter: [`Observed`] wraps a [`Graph`] or [`VectorIndex`]
//! and reports each call as an event (latency per seam, backend and operation, failures), so
//! the embedded stores, Neo4j, Qdrant and the remote service report alike and no adapter or
//! caller measures on its own. `open_graph` and `open_vectors` hand out wrapped stores.
//!
//! Every method of both traits is forwarded, the provided ones too (`copy_files_to`,
//! `optimize`, `sync`): a forgotten one would silently run the trait's default instead of the
//! adapter's.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use recollect_model::{Extraction, Fragment, MemoryId, TenantId, TokenVectors, Turn};
use recollect_telemetry::events::{
    InternalEvent, Seam, StoreBackend, StoreCallCompleted, StoreCallFailed, StoreOp,
};

use crate::graph::{ConversationState, Erasures, LinkedTurn, NodeKind, TurnErasure, TurnRecord};
use crate::vector::{FieldVectors, KeywordSet, ReplacedVersion, TurnPoint, VectorQuery};
use crate::{Graph, GraphRead, Scope, StoreError, VectorIndex};

/// A store that reports every call it serves.
pub struct Observed<S> {
    inner: S,
    backend: StoreBackend,
}

impl<S> Observed<S> {
    pub fn new(inner: S, backend: StoreBackend) -> Self {
        Self { inner, backend }
    }

    async fn call<T>(
        &self,
        seam: Seam,
        op: StoreOp,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let r = f.await;
        match &r {
            // A refused argument or a conflict is the caller's: the store answered.
            Ok(_) | Err(StoreError::Invalid(_) | StoreError::Conflict(_)) => StoreCallCompleted {
                seam,
                backend: self.backend,
                op,
                elapsed: started.elapsed(),
            }
            .emit(),
            Err(e @ (StoreError::Backend { .. } | StoreError::Corrupt { .. })) => StoreCallFailed {
                seam,
                backend: self.backend,
                op,
                error: e,
            }
            .emit(),
        }
        r
    }
}

impl<G: Graph> Observed<G> {
    async fn graph<T>(
        &self,
        op: StoreOp,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.call(Seam::Graph, op, f).await
    }
}

impl<V: VectorIndex> Observed<V> {
    async fn vectors<T>(
        &self,
        op: StoreOp,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.call(Seam::Vectors, op, f).await
    }
}

#[async_trait]
impl<G: Graph> GraphRead for Observed<G> {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn turns(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
    ) -> Result<Vec<TurnRecord>, StoreError> {
        self.graph(StoreOp::Turns, self.inner.turns(tenant, ids))
            .await
    }

    async fn conversation_turns(
        &self,
        tenant: &TenantId,
        conversation: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        self.graph(
            StoreOp::ConversationTurns,
            self.inner
                .conversation_turns(tenant, conversation, from, to),
        )
        .await
    }

    async fn conversations(&self, tenant: &TenantId) -> Result<Vec<String>, StoreError> {
        self.graph(StoreOp::Conversations, self.inner.conversations(tenant))
            .await
    }

    async fn conversations_after(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.graph(
            StoreOp::ConversationsAfter,
            self.inner.conversations_after(tenant, after, limit),
        )
        .await
    }

    async fn known_conversations(
        &self,
        tenant: &TenantId,
        conversations: &[String],
    ) -> Result<Vec<String>, StoreError> {
        self.graph(
            StoreOp::KnownConversations,
            self.inner.known_conversations(tenant, conversations),
        )
        .await
    }

    async fn conversations_of(
        &self,
        tenant: &TenantId,
        user_ids: &[String],
        agent_ids: &[String],
    ) -> Result<Vec<String>, StoreError> {
        self.graph(
            StoreOp::ConversationsOf,
            self.inner.conversations_of(tenant, user_ids, agent_ids),
        )
        .await
    }

    async fn vocabulary(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        kind: NodeKind,
    ) -> Result<Vec<String>, StoreError> {
        self.graph(
            StoreOp::Vocabulary,
            self.inner.vocabulary(tenant, scope, kind),
        )
        .await
    }

    async fn linked_turns(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        kind: NodeKind,
        names: &[String],
        recorded_by: Option<DateTime<Utc>>,
        valid_at: Option<DateTime<Utc>>,
    ) -> Result<Vec<LinkedTurn>, StoreError> {
        self.graph(
            StoreOp::LinkedTurns,
            self.inner
                .linked_turns(tenant, scope, kind, names, recorded_by, valid_at),
        )
        .await
    }

    async fn document_frequencies(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        kind: NodeKind,
        names: &[String],
    ) -> Result<(u64, Vec<u64>), StoreError> {
        self.graph(
            StoreOp::DocumentFrequencies,
            self.inner.document_frequencies(tenant, scope, kind, names),
        )
        .await
    }

    async fn fragments(
        &self,
        tenant: &TenantId,
        ids: &[String],
    ) -> Result<Vec<Fragment>, StoreError> {
        self.graph(StoreOp::Fragments, self.inner.fragments(tenant, ids))
            .await
    }
}

#[async_trait]
impl<G: Graph> Graph for Observed<G> {
    async fn write_turns(&self, turns: &[(Turn, Extraction)]) -> Result<(), StoreError> {
        self.graph(StoreOp::WriteTurns, self.inner.write_turns(turns))
            .await
    }

    async fn write_fragments(&self, fragments: &[Fragment]) -> Result<(), StoreError> {
        self.graph(
            StoreOp::WriteFragments,
            self.inner.write_fragments(fragments),
        )
        .await
    }

    async fn conversation_state(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<ConversationState, StoreError> {
        self.graph(
            StoreOp::ConversationState,
            self.inner.conversation_state(tenant, conversation),
        )
        .await
    }

    async fn save_conversation_state(
        &self,
        tenant: &TenantId,
        conversation: &str,
        state: &ConversationState,
    ) -> Result<bool, StoreError> {
        self.graph(
            StoreOp::SaveConversationState,
            self.inner
                .save_conversation_state(tenant, conversation, state),
        )
        .await
    }

    async fn save_conversation_states(
        &self,
        states: Vec<(TenantId, String, ConversationState)>,
    ) -> Result<Vec<bool>, StoreError> {
        self.graph(
            StoreOp::SaveConversationState,
            self.inner.save_conversation_states(states),
        )
        .await
    }

    async fn write_consolidation(
        &self,
        fragments: Vec<Fragment>,
        advances: Vec<(TenantId, String, u64)>,
    ) -> Result<(), StoreError> {
        self.graph(
            StoreOp::WriteConsolidation,
            self.inner.write_consolidation(fragments, advances),
        )
        .await
    }

    async fn record_erasure(
        &self,
        tenant: &TenantId,
        conversation: Option<&str>,
        at: DateTime<Utc>,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        self.graph(
            StoreOp::RecordErasure,
            self.inner.record_erasure(tenant, conversation, at),
        )
        .await
    }

    async fn advance_consolidated_until(
        &self,
        tenant: &TenantId,
        conversation: &str,
        until: u64,
    ) -> Result<(), StoreError> {
        self.graph(
            StoreOp::AdvanceConsolidatedUntil,
            self.inner
                .advance_consolidated_until(tenant, conversation, until),
        )
        .await
    }

    async fn record_turn_erasure(
        &self,
        tenant: &TenantId,
        conversation: &str,
        id: MemoryId,
        erasure: TurnErasure,
    ) -> Result<(), StoreError> {
        self.graph(
            StoreOp::RecordTurnErasure,
            self.inner
                .record_turn_erasure(tenant, conversation, id, erasure),
        )
        .await
    }

    async fn erasures(
        &self,
        tenant: &TenantId,
        conversations: &[String],
    ) -> Result<Erasures, StoreError> {
        self.graph(
            StoreOp::Erasures,
            self.inner.erasures(tenant, conversations),
        )
        .await
    }

    async fn purge_erased(&self, tenant: &TenantId, conversation: &str) -> Result<u64, StoreError> {
        self.graph(
            StoreOp::PurgeErased,
            self.inner.purge_erased(tenant, conversation),
        )
        .await
    }

    async fn restart_derivation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<(), StoreError> {
        self.graph(
            StoreOp::RestartDerivation,
            self.inner.restart_derivation(tenant, conversation),
        )
        .await
    }

    async fn delete_conversation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<u64, StoreError> {
        self.graph(
            StoreOp::DeleteConversation,
            self.inner.delete_conversation(tenant, conversation),
        )
        .await
    }
}

#[async_trait]
impl<V: VectorIndex> VectorIndex for Observed<V> {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn holds_token_vectors(&self) -> Option<bool> {
        self.inner.holds_token_vectors()
    }

    async fn upsert_turns(&self, points: Vec<TurnPoint>) -> Result<(), StoreError> {
        self.vectors(StoreOp::UpsertTurns, self.inner.upsert_turns(points))
            .await
    }

    async fn search(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        query: &VectorQuery,
        limit: usize,
    ) -> Result<Vec<(MemoryId, f32)>, StoreError> {
        self.vectors(
            StoreOp::Search,
            self.inner.search(tenant, scope, query, limit),
        )
        .await
    }

    async fn field_vectors(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
    ) -> Result<HashMap<MemoryId, FieldVectors>, StoreError> {
        self.vectors(StoreOp::FieldVectors, self.inner.field_vectors(tenant, ids))
            .await
    }

    async fn late_scores(
        &self,
        tenant: &TenantId,
        question: &TokenVectors,
        ids: &[MemoryId],
    ) -> Result<HashMap<MemoryId, f32>, StoreError> {
        self.vectors(
            StoreOp::LateScores,
            self.inner.late_scores(tenant, question, ids),
        )
        .await
    }

    async fn sentence_scores(
        &self,
        tenant: &TenantId,
        question: &TokenVectors,
        ids: &[MemoryId],
    ) -> Result<HashMap<MemoryId, f32>, StoreError> {
        self.vectors(
            StoreOp::SentenceScores,
            self.inner.sentence_scores(tenant, question, ids),
        )
        .await
    }

    async fn keep_versions(
        &self,
        tenant: &TenantId,
        versions: &[ReplacedVersion],
    ) -> Result<(), StoreError> {
        self.vectors(
            StoreOp::KeepVersions,
            self.inner.keep_versions(tenant, versions),
        )
        .await
    }

    async fn version_vectors(
        &self,
        tenant: &TenantId,
        versions: &[(MemoryId, DateTime<Utc>)],
    ) -> Result<HashMap<MemoryId, FieldVectors>, StoreError> {
        self.vectors(
            StoreOp::VersionVectors,
            self.inner.version_vectors(tenant, versions),
        )
        .await
    }

    async fn upsert_keyword_sets(&self, sets: Vec<KeywordSet>) -> Result<(), StoreError> {
        self.vectors(
            StoreOp::UpsertKeywords,
            self.inner.upsert_keyword_sets(sets),
        )
        .await
    }

    async fn search_keywords(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        vector: &[f32],
        limit: usize,
        min_score: f32,
    ) -> Result<Vec<(String, f32)>, StoreError> {
        self.vectors(
            StoreOp::SearchKeywords,
            self.inner
                .search_keywords(tenant, scope, vector, limit, min_score),
        )
        .await
    }

    async fn search_keywords_many(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        vectors: &[Vec<f32>],
        limit: usize,
        min_score: f32,
    ) -> Result<Vec<Vec<(String, f32)>>, StoreError> {
        self.vectors(
            StoreOp::SearchKeywords,
            self.inner
                .search_keywords_many(tenant, scope, vectors, limit, min_score),
        )
        .await
    }

    async fn delete_conversation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<u64, StoreError> {
        self.vectors(
            StoreOp::DeleteConversation,
            self.inner.delete_conversation(tenant, conversation),
        )
        .await
    }

    async fn delete_turns(
        &self,
        tenant: &TenantId,
        conversation: &str,
        ids: &[MemoryId],
        keywords: &[String],
    ) -> Result<(), StoreError> {
        self.vectors(
            StoreOp::DeleteTurns,
            self.inner.delete_turns(tenant, conversation, ids, keywords),
        )
        .await
    }

    async fn count(&self, tenant: &TenantId, scope: &Scope) -> Result<u64, StoreError> {
        self.vectors(StoreOp::Count, self.inner.count(tenant, scope))
            .await
    }

    async fn copy_files_to(&self, dir: &Path) -> Result<bool, StoreError> {
        self.vectors(StoreOp::CopyFilesTo, self.inner.copy_files_to(dir))
            .await
    }

    async fn optimize(&self) -> Result<(), StoreError> {
        self.vectors(StoreOp::Optimize, self.inner.optimize()).await
    }

    async fn sync(&self) -> Result<(), StoreError> {
        self.vectors(StoreOp::Sync, self.inner.sync()).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::contract::{self, Residue};
    use crate::{EdgeVectorIndex, EmbeddedGraph};

    /// The wrapper changes no behaviour: the embedded stores, wrapped, pass the contract suites;
    /// and what they did shows in the store families under their backend and operations.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wrapped_stores_pass_the_contracts_and_report_every_call() {
        let dir = tempfile::tempdir().unwrap();
        let g = EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap();
        let direct = g.clone();
        let residue: Residue = Arc::new(move |t, c| {
            let g = direct.clone();
            Box::pin(async move { g.residue(&t, &c).unwrap() })
        });
        contract::graph_contract(Arc::new(Observed::new(g, StoreBackend::Embedded)), residue).await;
        let v = EdgeVectorIndex::open(&dir.path().join("v"), 32).unwrap();
        contract::vector_contract(Arc::new(Observed::new(v, StoreBackend::Edge)), 32).await;
        let telemetry = recollect_telemetry::render();
        for series in [
            r#"recollect_store_write_duration_seconds_count{backend="embedded",op="write_turns",seam="graph"}"#,
            r#"recollect_store_read_duration_seconds_count{backend="embedded",op="linked_turns",seam="graph"}"#,
            r#"recollect_store_write_duration_seconds_count{backend="edge",op="upsert_turns",seam="vectors"}"#,
            r#"recollect_store_read_duration_seconds_count{backend="edge",op="search",seam="vectors"}"#,
        ] {
            assert!(telemetry.contains(series), "{series} missing");
        }
    }
}
