//! The graph-writer worker: `recollect.turns.embedded` → graph nodes and edges, vector points →
//! `recollect.turns.stored`. Every write is an idempotent upsert keyed by deterministic ids, so
//! a redelivered message changes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use recollect_bus::{Delivery, Message, Stage, StageError};
use recollect_model::{
    bus_key, topics, EmbeddedTurn, Envelope, KeywordVector, MemoryId, StoredTurn, Turn,
};
use recollect_store::{Graph, TurnPoint, VectorIndex};
use recollect_telemetry as metrics;

/// Embedded-mode hooks around the write: skip turns erased meanwhile, and report stored turns.
pub trait StoreHooks: Send + Sync {
    /// False when the turn's conversation was erased after the turn was queued.
    fn is_live(&self, turn: &Turn) -> bool;
    fn stored(&self, ids: &[MemoryId]);
}

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

    async fn write(&self, turns: &[EmbeddedTurn]) -> Result<(), StageError> {
        let t = |e: recollect_store::StoreError| StageError::Transient(e.to_string());
        let started = Instant::now();
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
                user: e.embeddings.user.clone(),
                assistant: (!e.embeddings.assistant.is_empty())
                    .then(|| e.embeddings.assistant.clone()),
                lexical: e.embeddings.lexical.clone(),
            })
            .collect();
        // Vectors first, graph last: a turn is recallable once its Turn node exists.
        self.vectors.upsert_turns(points).await.map_err(t)?;
        let mut keywords: BTreeMap<(String, String), BTreeMap<String, Vec<f32>>> = BTreeMap::new();
        for e in turns {
            let slot = keywords
                .entry((e.turn.tenant.0.clone(), e.turn.conversation_id.clone()))
                .or_default();
            for k in &e.embeddings.keywords {
                slot.entry(k.keyword.clone())
                    .or_insert_with(|| k.vector.clone());
            }
        }
        for ((tenant, conv), kws) in keywords {
            let kws = kws
                .into_iter()
                .map(|(keyword, vector)| KeywordVector { keyword, vector })
                .collect();
            self.vectors
                .upsert_keywords(&recollect_model::TenantId(tenant), &conv, kws)
                .await
                .map_err(t)?;
        }
        metrics::STORE_WRITE_LATENCY
            .with_label_values(&[&format!("vectors_{}", self.vectors.kind())])
            .observe(started.elapsed().as_secs_f64());
        let started = Instant::now();
        let nodes: Vec<_> = turns
            .iter()
            .map(|e| (e.turn.clone(), e.extraction.clone()))
            .collect();
        self.graph.write_turns(&nodes).await.map_err(t)?;
        metrics::STORE_WRITE_LATENCY
            .with_label_values(&[&format!("graph_{}", self.graph.kind())])
            .observe(started.elapsed().as_secs_f64());
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

    fn max_batch(&self) -> usize {
        256
    }

    async fn handle(&self, batch: &[Delivery]) -> Vec<Result<Vec<Message>, StageError>> {
        let decoded: Vec<Result<Envelope<EmbeddedTurn>, StageError>> = batch
            .iter()
            .map(|d| {
                serde_json::from_slice(&d.message.payload)
                    .map_err(|e| StageError::Permanent(format!("undecodable embedded turn: {e}")))
            })
            .collect();
        let live: Vec<EmbeddedTurn> = decoded
            .iter()
            .flatten()
            .filter(|e| self.hooks.as_ref().is_none_or(|h| h.is_live(&e.body.turn)))
            .map(|e| e.body.clone())
            .collect();
        if let Err(e) = self.write(&live).await {
            // Adapter pair of this writer, e.g. graph_embedded+vectors_embedded.
            metrics::STORE_ERRORS
                .with_label_values(&[&format!(
                    "graph_{}+vectors_{}",
                    self.graph.kind(),
                    self.vectors.kind()
                )])
                .inc();
            return batch.iter().map(|_| Err(e.clone())).collect();
        }
        if let Some(h) = &self.hooks {
            let ids: Vec<MemoryId> = decoded
                .iter()
                .flatten()
                .map(|e| e.body.turn.memory_id)
                .collect();
            // The hook writes (and fsyncs) the raw store: keep it off the async workers.
            let h = h.clone();
            let _ = tokio::task::spawn_blocking(move || h.stored(&ids)).await;
        }
        decoded
            .into_iter()
            .map(|env| {
                let env = env?;
                let t = &env.body.turn;
                let stored = StoredTurn {
                    memory_id: t.memory_id,
                    tenant: t.tenant.clone(),
                    conversation_id: t.conversation_id.clone(),
                    position: t.position,
                };
                Ok(vec![Message::json(
                    topics::STORED,
                    bus_key(&t.tenant, &t.conversation_id),
                    &Envelope::new(env.trace_id.clone(), stored),
                    &env.trace_id,
                )])
            })
            .collect()
    }
}
