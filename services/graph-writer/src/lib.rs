//! The graph-writer worker: `recollect.turns.embedded` → graph nodes and edges, vector points →
//! `recollect.turns.stored`. Every write is an idempotent upsert keyed by deterministic ids, so
//! a redelivered message changes nothing.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use recollect_bus::{Delivery, Message, Stage, StageError};
use recollect_model::{
    bus_key, topics, EmbeddedTurn, Envelope, KeywordVector, MemoryId, StoredTurn, TenantId, Turn,
};
use recollect_storage::{
    distinct_runs, ErasureMap, Graph, KeywordSet, NodeKind, ReplacedVersion, Scope, TurnPoint,
    VectorIndex, VersionWrite,
};

/// Embedded-mode hook after the write: report the turns handled (stored, or dropped as erased),
/// each with the `recorded_at` of the version handled (an edit made meanwhile stays pending).
/// With hooks the writer leaves [`VectorIndex::sync`] to them (the single binary syncs once for
/// several batches, then clears the turns' pending marks); without, it syncs every batch
/// before the batch is acknowledged. Called on an async worker: it must not block.
pub trait StoreHooks: Send + Sync {
    fn stored(&self, turns: &[(MemoryId, chrono::DateTime<chrono::Utc>)]);
    /// The writer's input is drained for now ([`Stage::idle`]).
    fn idle(&self) {}
}

/// Turns a graph write takes while the vector index takes the next ones' points (see
/// `write_run`).
const PIPELINE_CHUNK: usize = 512;

pub struct GraphWriterStage {
    graph: Arc<dyn Graph>,
    vectors: Arc<dyn VectorIndex>,
    hooks: Option<Arc<dyn StoreHooks>>,
}

impl GraphWriterStage {
    pub fn new(
        graph: Arc<dyn Graph>,
        vectors: Arc<dyn VectorIndex>,
        hooks: Option<Arc<dyn StoreHooks>>,
    ) -> Self {
        Self {
            graph,
            vectors,
            hooks,
        }
    }

    async fn write(&self, turns: &[&EmbeddedTurn]) -> Result<(), StageError> {
        // A turn and its edit in one batch are written one after the other.
        for run in distinct_runs(turns, usize::MAX, |e| e.turn.memory_id) {
            self.write_run(run).await?;
        }
        Ok(())
    }

    /// What the edits among `turns` do to the versions stored now: the versions they replace
    /// (whose points are kept as history before being overwritten), and the edits to skip (an
    /// older edit redelivered after a later one: writing its vectors would undo the later one).
    async fn versions_replaced(
        &self,
        turns: &[&EmbeddedTurn],
    ) -> Result<(Vec<(TenantId, ReplacedVersion)>, HashSet<MemoryId>), StageError> {
        let mut by_tenant: BTreeMap<TenantId, Vec<&Turn>> = BTreeMap::new();
        for e in turns.iter().filter(|e| e.turn.is_edit()) {
            by_tenant
                .entry(e.turn.tenant.clone())
                .or_default()
                .push(&e.turn);
        }
        let (mut replaced, mut skip) = (Vec::new(), HashSet::new());
        for (tenant, edits) in by_tenant {
            let ids: Vec<MemoryId> = edits.iter().map(|t| t.memory_id).collect();
            let stored = self
                .graph
                .turns(&tenant, &ids)
                .await
                .map_err(StageError::classified)?;
            for t in edits {
                let Some(rec) = stored.iter().find(|r| r.turn.memory_id == t.memory_id) else {
                    continue;
                };
                match rec.version_write(t) {
                    VersionWrite::Stale => {
                        skip.insert(t.memory_id);
                    }
                    VersionWrite::Rewrite => {}
                    VersionWrite::Supersede => replaced.push((
                        tenant.clone(),
                        ReplacedVersion {
                            memory_id: t.memory_id,
                            recorded_at: rec.turn.recorded_at,
                            expired_at: t.recorded_at,
                        },
                    )),
                }
            }
        }
        Ok((replaced, skip))
    }

    async fn write_run(&self, turns: &[&EmbeddedTurn]) -> Result<(), StageError> {
        let (replaced, skip) = self.versions_replaced(turns).await?;
        let kept: Vec<&EmbeddedTurn>;
        let turns = if skip.is_empty() {
            turns
        } else {
            kept = turns
                .iter()
                .copied()
                .filter(|e| !skip.contains(&e.turn.memory_id))
                .collect();
            &kept
        };
        let mut by_tenant: BTreeMap<TenantId, Vec<ReplacedVersion>> = BTreeMap::new();
        for (tenant, v) in replaced {
            by_tenant.entry(tenant).or_default().push(v);
        }
        for (tenant, versions) in by_tenant {
            self.vectors
                .keep_versions(&tenant, &versions)
                .await
                .map_err(StageError::classified)?;
        }
        // (tenant, conversation) → keyword → its vectors, shared with the turns that carry them:
        // every form of the keyword (the surface texts its turns said, "games" and "game"), not
        // the batch's first, which made what a conversation says depend on how its turns fell
        // into batches, and two ingests of the same turns rank differently (docs/EVALUATION.md,
        // session 22).
        type Said = BTreeMap<(String, String), BTreeMap<String, Vec<Arc<[f32]>>>>;
        let mut keywords: Said = BTreeMap::new();
        for e in turns {
            let slot = keywords
                .entry((e.turn.tenant.0.clone(), e.turn.conversation_id.clone()))
                .or_default();
            for k in &e.embeddings.keywords {
                let forms = slot.entry(k.keyword.clone()).or_default();
                if !forms
                    .iter()
                    .any(|v| Arc::ptr_eq(v, &k.vector) || **v == *k.vector)
                {
                    forms.push(Arc::clone(&k.vector));
                }
            }
        }
        // One call for the batch: the index writes (and flushes) once, not once per conversation.
        let sets: Vec<KeywordSet> = keywords
            .into_iter()
            .map(|((tenant, conversation), kws)| KeywordSet {
                tenant: TenantId(tenant),
                conversation,
                keywords: kws
                    .into_iter()
                    .flat_map(|(keyword, forms)| {
                        forms.into_iter().map(move |vector| KeywordVector {
                            keyword: keyword.clone(),
                            vector,
                        })
                    })
                    .collect(),
            })
            .collect();
        self.vectors
            .upsert_keyword_sets(sets)
            .await
            .map_err(StageError::classified)?;
        // Vectors first, graph last: a turn is recallable once its Turn node exists. The two
        // stores are independent, so the batch is pipelined in chunks: while the graph writes
        // one chunk, the vector index takes the next one's points. Each turn's points still
        // land before its node.
        let mut chunks = turns.chunks(PIPELINE_CHUNK);
        let Some(first) = chunks.next() else {
            return Ok(());
        };
        self.upsert_points(first).await?;
        let mut written = first;
        for next in chunks {
            let (graph, vectors) =
                futures::future::join(self.write_nodes(written), self.upsert_points(next)).await;
            graph?;
            vectors?;
            written = next;
        }
        self.write_nodes(written).await
    }

    async fn upsert_points(&self, turns: &[&EmbeddedTurn]) -> Result<(), StageError> {
        let points: Vec<TurnPoint> = turns
            .iter()
            .map(|e| TurnPoint {
                memory_id: e.turn.memory_id,
                tenant: e.turn.tenant.clone(),
                conversation_id: e.turn.conversation_id.clone(),
                turn_id: e.turn.turn_id.clone(),
                position: e.turn.position,
                timestamp: e.turn.timestamp,
                user_speaker: e.turn.user_speaker.clone(),
                assistant_speaker: e.turn.assistant_speaker.clone(),
                user_id: e.turn.user_id.clone(),
                agent_id: e.turn.agent_id.clone(),
                metadata: e.turn.metadata.clone(),
                user: e.embeddings.user.clone(),
                assistant: (!e.embeddings.assistant.is_empty())
                    .then(|| e.embeddings.assistant.clone()),
                lexical: e.embeddings.lexical.clone(),
                late: e.embeddings.tokens.clone(),
                recorded_at: e.turn.recorded_at,
            })
            .collect();
        self.vectors
            .upsert_turns(points)
            .await
            .map_err(StageError::classified)
    }

    async fn write_nodes(&self, turns: &[&EmbeddedTurn]) -> Result<(), StageError> {
        let nodes: Vec<_> = turns
            .iter()
            .map(|e| (e.turn.clone(), e.extraction.clone()))
            .collect();
        self.graph
            .write_turns(&nodes)
            .await
            .map_err(StageError::classified)
    }
}

fn pairs(turns: &[&EmbeddedTurn]) -> Vec<(TenantId, String)> {
    turns
        .iter()
        .map(|e| (e.turn.tenant.clone(), e.turn.conversation_id.clone()))
        .collect()
}

fn covered(m: &ErasureMap, e: &EmbeddedTurn) -> bool {
    m.covers_turn(&e.turn)
}

impl GraphWriterStage {
    /// The write, guarded against erasures: turns whose conversation (or tenant) was erased
    /// after they were recorded are dropped; the graph checks again inside its write; and the
    /// markers are read once more afterwards, so an erasure that began during the write has
    /// what it covers removed here (the eraser recorded its marker before deleting anything,
    /// so whichever of the two deletes last leaves nothing). Returns the turns dropped.
    async fn erase_guarded_write(
        &self,
        decoded: &[Result<Cow<'_, Envelope<EmbeddedTurn>>, StageError>],
    ) -> Result<std::collections::HashSet<MemoryId>, StageError> {
        let turns: Vec<&EmbeddedTurn> = decoded.iter().flatten().map(|e| &e.body).collect();
        let before = ErasureMap::read(self.graph.as_ref(), pairs(&turns))
            .await
            .map_err(StageError::classified)?;
        let (dropped, live): (Vec<&EmbeddedTurn>, Vec<&EmbeddedTurn>) =
            turns.into_iter().partition(|e| covered(&before, e));
        // A redelivery of a batch whose first attempt wrote before an erasure and died before
        // its own check: undo that write (idempotent; nothing to do otherwise).
        self.undo(&dropped).await?;
        self.write(&live).await?;
        let after = ErasureMap::read(self.graph.as_ref(), pairs(&live))
            .await
            .map_err(StageError::classified)?;
        let late: Vec<&EmbeddedTurn> = live
            .iter()
            .copied()
            .filter(|e| covered(&after, e))
            .collect();
        self.undo(&late).await?;
        Ok(dropped
            .iter()
            .chain(&late)
            .map(|e| e.turn.memory_id)
            .collect())
    }

    /// Removes the points and graph data of erased turns, per conversation.
    async fn undo(&self, turns: &[&EmbeddedTurn]) -> Result<(), StageError> {
        let mut by_conv: BTreeMap<(TenantId, String), (Vec<MemoryId>, Vec<String>)> =
            BTreeMap::new();
        for e in turns {
            let slot = by_conv
                .entry((e.turn.tenant.clone(), e.turn.conversation_id.clone()))
                .or_default();
            slot.0.push(e.turn.memory_id);
            slot.1
                .extend(e.embeddings.keywords.iter().map(|k| k.keyword.clone()));
        }
        for ((tenant, conv), (ids, mut keywords)) in by_conv {
            keywords.sort();
            keywords.dedup();
            // A turn erased on its own leaves the rest of its conversation: keep the keyword
            // points that other turns still link to (an erased conversation has none).
            let ours: std::collections::HashSet<MemoryId> = ids.iter().copied().collect();
            let links = self
                .graph
                .linked_turns(
                    &tenant,
                    &Scope::of(&[conv.as_str()]),
                    NodeKind::Keyword,
                    &keywords,
                    None,
                    None,
                )
                .await
                .map_err(StageError::classified)?;
            keywords.retain(|k| {
                links
                    .iter()
                    .all(|l| l.name != *k || ours.contains(&l.memory_id))
            });
            self.vectors
                .delete_turns(&tenant, &conv, &ids, &keywords)
                .await
                .map_err(StageError::classified)?;
            self.graph
                .purge_erased(&tenant, &conv)
                .await
                .map_err(StageError::classified)?;
            tracing::info!(
                tenant = tenant.as_str(),
                turns = ids.len(),
                "dropped turns of an erased conversation"
            );
        }
        Ok(())
    }
}

#[async_trait]
impl Stage for GraphWriterStage {
    fn name(&self) -> &'static str {
        "graph-writer"
    }

    fn input_topic(&self) -> &'static str {
        topics::EMBEDDED
    }

    fn idle(&self) {
        if let Some(h) = &self.hooks {
            h.idle();
        }
    }

    /// What a batch costs whatever its size (the erasure reads before and after, the vector
    /// index's writes) is spread over up to 2,048 turns: at 256, then at 1,024, this was the
    /// pipeline's slowest stage. A batch takes what is waiting, so a lone turn waits for
    /// nothing.
    fn max_batch(&self) -> usize {
        2048
    }

    async fn handle(&self, batch: &[Delivery]) -> Vec<Result<Vec<Message>, StageError>> {
        // Borrowed from the batch where the embedder's values never left the process (the
        // single binary): the batch's vectors were copied twice over before.
        let decoded: Vec<Result<Cow<'_, Envelope<EmbeddedTurn>>, StageError>> = batch
            .iter()
            .map(|d| {
                d.message
                    .decode_ref()
                    .map_err(|e| StageError::Permanent(format!("undecodable embedded turn: {e}")))
            })
            .collect();
        let written = match self.erase_guarded_write(&decoded).await {
            Ok(erased) if self.hooks.is_some() => Ok(erased),
            Ok(erased) => self
                .vectors
                .sync()
                .await
                .map(|()| erased)
                .map_err(StageError::classified),
            Err(e) => Err(e),
        };
        let erased = match written {
            Ok(e) => e,
            // The failed store call was counted by the store (`recollect_store_errors_total`).
            Err(e) => return batch.iter().map(|_| Err(e.clone())).collect(),
        };
        if let Some(h) = &self.hooks {
            let ids: Vec<(MemoryId, chrono::DateTime<chrono::Utc>)> = decoded
                .iter()
                .flatten()
                .map(|e| (e.body.turn.memory_id, e.body.turn.recorded_at))
                .collect();
            h.stored(&ids);
        }
        decoded
            .into_iter()
            .map(|env| {
                let env = env?;
                let t = &env.body.turn;
                if erased.contains(&t.memory_id) {
                    return Ok(Vec::new());
                }
                let stored = StoredTurn {
                    memory_id: t.memory_id,
                    tenant: t.tenant.clone(),
                    conversation_id: t.conversation_id.clone(),
                    position: t.position,
                    recorded_at: Some(t.recorded_at),
                };
                Ok(vec![Message::json(
                    topics::STORED,
                    bus_key(&t.tenant, &t.conversation_id),
                    Envelope::new(env.trace_id.clone(), stored),
                    &env.trace_id,
                )])
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    //! The interleavings of an erase with a write, made deterministic: a graph that runs the
    //! eraser's steps at a chosen point inside the writer's graph write.

    use std::path::PathBuf;

    use recollect_model::{Extraction, Fragment, Timestamp, Turn};
    use recollect_storage::graph::{ConversationState, Erasures};
    use recollect_storage::{
        EdgeVectorIndex, EmbeddedGraph, GraphRead, LinkedTurn, NodeKind, Scope, StoreError,
        TurnRecord,
    };
    use serde_json::json;

    use super::*;

    #[derive(Clone, Copy, PartialEq)]
    enum Race {
        /// Marker and the eraser's deletes all land between the writer's first marker read and
        /// its graph write: the store's own guard refuses the write.
        EraseBeforeWrite,
        /// Only the marker lands before the write (the eraser is slow, or died after it): the
        /// writer's second marker read removes what it wrote.
        MarkerBeforeWriteEraserGone,
        /// The marker lands right after the write; the eraser's deletes never come.
        MarkerAfterWrite,
        /// No erase: every graph write checks that its turns' points are already stored.
        Never,
    }

    struct Racing {
        inner: EmbeddedGraph,
        vectors: Arc<dyn VectorIndex>,
        race: Race,
        at: Timestamp,
        /// The race is run once, on the first write.
        fired: std::sync::atomic::AtomicBool,
    }

    fn t(s: &str) -> Timestamp {
        serde_json::from_value(json!(s)).unwrap()
    }

    impl Racing {
        async fn erase(&self, tenant: &TenantId, conv: &str, delete: bool) {
            self.inner
                .record_erasure(tenant, Some(conv), self.at)
                .await
                .unwrap();
            if delete {
                self.vectors
                    .delete_conversation(tenant, conv)
                    .await
                    .unwrap();
                self.inner.delete_conversation(tenant, conv).await.unwrap();
            }
        }
    }

    #[async_trait]
    impl GraphRead for Racing {
        fn kind(&self) -> &'static str {
            "racing"
        }
        async fn conversations_of(
            &self,
            t: &TenantId,
            u: &[String],
            a: &[String],
        ) -> Result<Vec<String>, StoreError> {
            self.inner.conversations_of(t, u, a).await
        }
        async fn turns(
            &self,
            t: &TenantId,
            ids: &[MemoryId],
        ) -> Result<Vec<TurnRecord>, StoreError> {
            self.inner.turns(t, ids).await
        }
        async fn conversation_turns(
            &self,
            t: &TenantId,
            c: &str,
            from: u64,
            to: u64,
        ) -> Result<Vec<TurnRecord>, StoreError> {
            self.inner.conversation_turns(t, c, from, to).await
        }
        async fn conversations(&self, t: &TenantId) -> Result<Vec<String>, StoreError> {
            self.inner.conversations(t).await
        }
        async fn conversations_after(
            &self,
            t: &TenantId,
            after: Option<&str>,
            limit: usize,
        ) -> Result<Vec<String>, StoreError> {
            self.inner.conversations_after(t, after, limit).await
        }
        async fn known_conversations(
            &self,
            t: &TenantId,
            c: &[String],
        ) -> Result<Vec<String>, StoreError> {
            self.inner.known_conversations(t, c).await
        }
        async fn vocabulary(
            &self,
            t: &TenantId,
            s: &Scope,
            k: NodeKind,
        ) -> Result<Vec<String>, StoreError> {
            self.inner.vocabulary(t, s, k).await
        }
        async fn linked_turns(
            &self,
            t: &TenantId,
            s: &Scope,
            k: NodeKind,
            n: &[String],
            rb: Option<Timestamp>,
            va: Option<Timestamp>,
        ) -> Result<Vec<LinkedTurn>, StoreError> {
            self.inner.linked_turns(t, s, k, n, rb, va).await
        }
        async fn document_frequencies(
            &self,
            t: &TenantId,
            s: &Scope,
            k: NodeKind,
            n: &[String],
        ) -> Result<(u64, Vec<u64>), StoreError> {
            self.inner.document_frequencies(t, s, k, n).await
        }
        async fn fragments(
            &self,
            t: &TenantId,
            ids: &[String],
        ) -> Result<Vec<Fragment>, StoreError> {
            self.inner.fragments(t, ids).await
        }
    }

    #[async_trait]
    impl Graph for Racing {
        async fn write_turns(&self, turns: &[(Turn, Extraction)]) -> Result<(), StoreError> {
            if self.race == Race::Never {
                for (turn, _) in turns {
                    let stored = self
                        .vectors
                        .field_vectors(&turn.tenant, &[turn.memory_id])
                        .await?;
                    assert_eq!(
                        stored.len(),
                        1,
                        "turn {} reached the graph before its points",
                        turn.turn_id
                    );
                }
                return self.inner.write_turns(turns).await;
            }
            if turns.is_empty() || self.fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return self.inner.write_turns(turns).await;
            }
            let (tenant, conv) = (
                turns[0].0.tenant.clone(),
                turns[0].0.conversation_id.clone(),
            );
            match self.race {
                Race::EraseBeforeWrite => self.erase(&tenant, &conv, true).await,
                Race::MarkerBeforeWriteEraserGone => self.erase(&tenant, &conv, false).await,
                Race::MarkerAfterWrite | Race::Never => {}
            }
            self.inner.write_turns(turns).await?;
            if self.race == Race::MarkerAfterWrite {
                self.erase(&tenant, &conv, false).await;
            }
            Ok(())
        }
        async fn write_fragments(&self, f: &[Fragment]) -> Result<(), StoreError> {
            self.inner.write_fragments(f).await
        }
        async fn record_turn_erasure(
            &self,
            t: &TenantId,
            c: &str,
            id: MemoryId,
            e: recollect_storage::TurnErasure,
        ) -> Result<(), StoreError> {
            self.inner.record_turn_erasure(t, c, id, e).await
        }
        async fn conversation_state(
            &self,
            t: &TenantId,
            c: &str,
        ) -> Result<ConversationState, StoreError> {
            self.inner.conversation_state(t, c).await
        }
        async fn save_conversation_state(
            &self,
            t: &TenantId,
            c: &str,
            s: &ConversationState,
        ) -> Result<bool, StoreError> {
            self.inner.save_conversation_state(t, c, s).await
        }
        async fn advance_consolidated_until(
            &self,
            t: &TenantId,
            c: &str,
            until: u64,
        ) -> Result<(), StoreError> {
            self.inner.advance_consolidated_until(t, c, until).await
        }
        async fn delete_conversation(&self, t: &TenantId, c: &str) -> Result<u64, StoreError> {
            self.inner.delete_conversation(t, c).await
        }
        async fn record_erasure(
            &self,
            t: &TenantId,
            c: Option<&str>,
            at: Timestamp,
        ) -> Result<Vec<(String, u64)>, StoreError> {
            self.inner.record_erasure(t, c, at).await
        }
        async fn erasures(&self, t: &TenantId, c: &[String]) -> Result<Erasures, StoreError> {
            self.inner.erasures(t, c).await
        }
        async fn purge_erased(&self, t: &TenantId, c: &str) -> Result<u64, StoreError> {
            self.inner.purge_erased(t, c).await
        }
        async fn restart_derivation(&self, t: &TenantId, c: &str) -> Result<(), StoreError> {
            self.inner.restart_derivation(t, c).await
        }
    }

    fn delivery(i: usize, recorded_at: &str) -> Delivery {
        delivery_saying(i, recorded_at, [0.0, 1.0, 0.0, 0.0])
    }

    /// Turn `i`, saying the keyword "secret" in a form whose vector is `form`.
    fn delivery_saying(i: usize, recorded_at: &str, form: [f32; 4]) -> Delivery {
        let body = json!({"turn": {"tenant": "acme", "conversation_id": "c", "turn_id": i.to_string(),
                     "memory_id": MemoryId::derive(&TenantId("acme".into()), "c", &i.to_string()),
                     "position": i, "user": format!("secret {i}"), "timestamp": "2024-05-01T10:00:00Z",
                     "recorded_at": recorded_at},
                 "extraction": {"keywords": [{"key": "secret", "text": "secret"}], "entities": ["Ana"],
                     "locations": [], "events": [], "times": [], "references": [],
                     "event_time": null, "extractor": "rules"},
                 "embeddings": {"user": [1.0, 0.0, 0.0, 0.0], "assistant": [],
                     "lexical": {"indices": [7], "values": [1.0]},
                     "keywords": [{"keyword": "secret", "vector": form}], "model": "m"}});
        Delivery {
            message: Message::from_bytes(
                topics::EMBEDDED,
                "acme/c".into(),
                serde_json::to_vec(&json!({"schema_version": 3, "trace_id": "tr", "body": body}))
                    .unwrap(),
                vec![],
            ),
            partition: 0,
            offset: i as i64,
            timestamp_ms: None,
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "recollect-gw-{name}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A writer over a fresh embedded graph (wrapped in [`Racing`]) and vector index in `dir`.
    fn writer(
        dir: &std::path::Path,
        race: Race,
    ) -> (GraphWriterStage, EmbeddedGraph, Arc<dyn VectorIndex>) {
        let vectors: Arc<dyn VectorIndex> =
            Arc::new(EdgeVectorIndex::open(&dir.join("v"), 4).unwrap());
        let inner = EmbeddedGraph::open(&dir.join("g.redb")).unwrap();
        let graph = Arc::new(Racing {
            inner: inner.clone(),
            vectors: vectors.clone(),
            race,
            at: t("2025-01-01T00:00:00Z"),
            fired: Default::default(),
        });
        let stage = GraphWriterStage::new(graph, vectors.clone(), None);
        (stage, inner, vectors)
    }

    async fn run(race: Race) -> (u64, u64, usize) {
        let dir = scratch(&format!("{}", race as u8));
        let (stage, inner, vectors) = writer(&dir, race);
        let batch: Vec<Delivery> = (0..5)
            .map(|i| delivery(i, "2024-12-31T00:00:00Z"))
            .collect();
        let out = stage.handle(&batch).await;
        assert!(
            out.iter().all(|r| r.as_ref().is_ok_and(|m| m.is_empty())),
            "nothing goes on"
        );
        let tenant = TenantId("acme".into());
        let left = inner.residue(&tenant, "c").unwrap();
        let points = vectors.count(&tenant, &Scope::all()).await.unwrap();
        let keywords = vectors
            .search_keywords(&tenant, &Scope::all(), &[0.0, 1.0, 0.0, 0.0], 10, -2.0)
            .await
            .unwrap()
            .len();
        // A redelivery of the same batch (the marker stays) writes nothing back either.
        let again = stage.handle(&batch).await;
        assert!(again.iter().all(|r| r.as_ref().is_ok_and(|m| m.is_empty())));
        assert_eq!(inner.residue(&tenant, "c").unwrap(), 0);
        // A turn recorded after the erase is stored and goes on to the consolidator.
        let after = stage.handle(&[delivery(9, "2025-01-02T00:00:00Z")]).await;
        assert_eq!(after[0].as_ref().unwrap().len(), 1);
        assert_eq!(vectors.count(&tenant, &Scope::all()).await.unwrap(), 1);
        drop(stage);
        drop(inner);
        drop(vectors);
        let _ = std::fs::remove_dir_all(&dir);
        (left, points, keywords)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_erase_racing_the_write_leaves_nothing_in_any_interleaving() {
        for race in [
            Race::EraseBeforeWrite,
            Race::MarkerBeforeWriteEraserGone,
            Race::MarkerAfterWrite,
        ] {
            assert_eq!(run(race).await, (0, 0, 0), "interleaving {}", race as u8);
        }
    }

    /// A batch several pipeline chunks long: every turn is written, each one's points before
    /// its node, and each goes on to the consolidator.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_batch_is_written_whole_points_before_nodes() {
        let dir = scratch("long");
        let (stage, inner, vectors) = writer(&dir, Race::Never);
        let n = 2 * PIPELINE_CHUNK + 77;
        let batch: Vec<Delivery> = (0..n)
            .map(|i| delivery(i, "2024-12-31T00:00:00Z"))
            .collect();
        let out = stage.handle(&batch).await;
        assert!(out.iter().all(|r| r.as_ref().is_ok_and(|m| m.len() == 1)));
        let tenant = TenantId("acme".into());
        assert_eq!(
            vectors.count(&tenant, &Scope::all()).await.unwrap(),
            n as u64
        );
        let ids: Vec<MemoryId> = (0..n)
            .map(|i| MemoryId::derive(&tenant, "c", &i.to_string()))
            .collect();
        assert_eq!(inner.turns(&tenant, &ids).await.unwrap().len(), n);
        drop(stage);
        drop(inner);
        drop(vectors);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// What a conversation says does not depend on how its turns fell into batches: every form
    /// of a keyword its turns said is kept, not the first of each batch (two ingests of the same
    /// turns ranked differently when the machine was busy).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_form_of_a_keyword_is_said_however_the_turns_are_batched() {
        let forms = [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]];
        let turns: Vec<Delivery> = forms
            .iter()
            .enumerate()
            .map(|(i, f)| delivery_saying(i, "2024-12-31T00:00:00Z", *f))
            .collect();
        let tenant = TenantId("acme".into());
        for batches in [vec![&turns[..]], vec![&turns[..1], &turns[1..]]] {
            let dir = scratch(&format!("forms-{}", batches.len()));
            let (stage, inner, vectors) = writer(&dir, Race::Never);
            for b in &batches {
                assert!(stage.handle(b).await.iter().all(|r| r.is_ok()));
            }
            for f in &forms {
                let hits = vectors
                    .search_keywords(&tenant, &Scope::of(&["c"]), f, 10, -2.0)
                    .await
                    .unwrap();
                assert_eq!(hits.len(), 1, "{hits:?}");
                assert!(
                    (hits[0].1 - 1.0).abs() < 1e-5,
                    "{} batch(es): the form {f:?} is found as itself: {hits:?}",
                    batches.len()
                );
            }
            drop(stage);
            drop(inner);
            drop(vectors);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
