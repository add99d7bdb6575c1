//! The extractor worker: `recollect.turns.raw` → `recollect.turns.extracted`. Keywords, entities,
//! locations, times and references, resolved by the conversation's state machine, whose state
//! lives in the graph so a restart or a rebalance resumes it.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use recollect_bus::{Delivery, Message, Stage, StageError};
use recollect_extract::Extractor;
use recollect_model::{bus_key, topics, Envelope, ExtractedTurn, RawMessage};
use recollect_store::graph::ConversationState;
use recollect_store::Graph;

/// Whether a queued turn still exists (false once its conversation or tenant was erased).
pub type Liveness = Arc<dyn Fn(&recollect_model::Turn) -> bool + Send + Sync>;

pub struct ExtractorStage {
    extractor: Arc<dyn Extractor>,
    graph: Arc<dyn Graph>,
    live: Option<Liveness>,
}

impl ExtractorStage {
    pub fn new(extractor: Arc<dyn Extractor>, graph: Arc<dyn Graph>) -> Self {
        Self {
            extractor,
            graph,
            live: None,
        }
    }

    /// Drops queued turns that were erased meanwhile, so their reference state is not
    /// written back after an erasure.
    pub fn with_liveness(mut self, live: Liveness) -> Self {
        self.live = Some(live);
        self
    }
}

fn transient(e: impl std::fmt::Display) -> StageError {
    StageError::Transient(e.to_string())
}

#[async_trait]
impl Stage for ExtractorStage {
    fn name(&self) -> &'static str {
        "extractor"
    }

    fn input_topic(&self) -> &'static str {
        topics::RAW
    }

    fn max_batch(&self) -> usize {
        256
    }

    async fn handle(&self, batch: &[Delivery]) -> Vec<Result<Vec<Message>, StageError>> {
        // Turns of one conversation arrive in order; their state is loaded once per batch.
        let mut states: HashMap<(String, String), ConversationState> = HashMap::new();
        let mut dirty: Vec<(String, String)> = Vec::new();
        let mut results = Vec::with_capacity(batch.len());
        for d in batch {
            let r: Result<Vec<Message>, StageError> = async {
                let env: RawMessage = serde_json::from_slice(&d.message.payload)
                    .map_err(|e| StageError::Permanent(format!("undecodable raw turn: {e}")))?;
                let turn = env.body;
                if self.live.as_ref().is_some_and(|live| !live(&turn)) {
                    return Ok(Vec::new());
                }
                let key = (turn.tenant.0.clone(), turn.conversation_id.clone());
                if !states.contains_key(&key) {
                    let s = self
                        .graph
                        .conversation_state(&turn.tenant, &turn.conversation_id)
                        .await
                        .map_err(transient)?;
                    states.insert(key.clone(), s);
                }
                let state = states.get_mut(&key).expect("loaded above");
                // A redelivered turn must not advance the state twice: extract on a copy.
                let replay = state.reference_position.is_some_and(|p| turn.position <= p);
                let extraction = if replay {
                    let mut scratch = state.reference.clone();
                    self.extractor.extract(&turn, &mut scratch).await
                } else {
                    let x = self.extractor.extract(&turn, &mut state.reference).await;
                    if x.is_ok() {
                        state.reference_position = Some(turn.position);
                        if !dirty.contains(&key) {
                            dirty.push(key.clone());
                        }
                    }
                    x
                }
                .map_err(|e| StageError::Permanent(format!("extraction failed: {e}")))?;
                let out = ExtractedTurn { turn, extraction };
                Ok(vec![Message::json(
                    topics::EXTRACTED,
                    bus_key(&out.turn.tenant, &out.turn.conversation_id),
                    &Envelope::new(env.trace_id.clone(), out),
                    &env.trace_id,
                )])
            }
            .await;
            results.push(r);
        }
        for key in dirty {
            let s = &states[&key];
            if let Err(e) = self
                .graph
                .save_conversation_state(&recollect_model::TenantId(key.0.clone()), &key.1, s)
                .await
            {
                // Without the state the outputs must not be published: retry the whole batch.
                let msg = format!("saving reference state failed: {e}");
                return batch
                    .iter()
                    .map(|_| Err(StageError::Transient(msg.clone())))
                    .collect();
            }
        }
        results
    }
}
