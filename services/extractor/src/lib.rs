//! The extractor worker: `recollect.turns.raw` → `recollect.turns.extracted`. Keywords, entities,
//! locations, times and references, resolved by the conversation's state machine, whose state
//! lives in the graph so a restart or a rebalance resumes it.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use recollect_bus::{Delivery, Message, Stage, StageError};
use recollect_extract::Extractor;
use recollect_model::{
    bus_key, field_text, topics, Envelope, ExtractedTurn, MemoryId, RawMessage, TenantId,
    Timestamp, Turn,
};
use recollect_storage::graph::ConversationState;
use recollect_storage::{ErasureMap, Graph};

pub struct ExtractorStage {
    extractor: Arc<dyn Extractor>,
    graph: Arc<dyn Graph>,
    /// Words of context each turn carries for the late-interaction model
    /// (`embedder.late_context_words`; 0: none, and none kept in the state).
    context_words: usize,
}

impl ExtractorStage {
    pub fn new(extractor: Arc<dyn Extractor>, graph: Arc<dyn Graph>) -> Self {
        Self {
            extractor,
            graph,
            context_words: 0,
        }
    }

    /// Each turn carries the last `words` words said before it in its sitting
    /// ([`ExtractedTurn::context`]), kept in the conversation's state.
    pub fn with_context_words(mut self, words: usize) -> Self {
        self.context_words = words;
        self
    }
}

/// Both fields with their speakers: what a later turn's context reads of this one.
fn turn_words(t: &Turn) -> String {
    format!(
        "{}\n{}",
        field_text(t.user_speaker.as_deref(), &t.user),
        field_text(t.assistant_speaker.as_deref(), &t.assistant)
    )
}

/// A conversation's state changed by a turn recorded `at`: it is saved with the batch.
fn changed(
    state: &mut ConversationState,
    at: Timestamp,
    dirty: &mut Vec<(String, String)>,
    key: &(String, String),
) {
    state.derived_from(at);
    if !dirty.contains(key) {
        dirty.push(key.clone());
    }
}

/// Raw turns may come from any producer on the topic: the same rules as the gateway's.
fn check_direct(t: &Turn) -> Result<(), StageError> {
    let bad = |m: &str| Err(StageError::Permanent(format!("invalid raw turn: {m}")));
    if t.tenant.as_str().is_empty() || t.tenant.as_str().len() > 64 {
        return bad("tenant must be 1 to 64 characters");
    }
    if t.conversation_id.is_empty() || t.conversation_id.len() > 128 {
        return bad("conversation_id must be 1 to 128 characters");
    }
    if t.turn_id.is_empty() || t.turn_id.len() > 128 {
        return bad("turn_id must be 1 to 128 characters");
    }
    if t.user.trim().is_empty() {
        return bad("user text is empty");
    }
    if t.user.len() > recollect_model::MAX_TEXT_BYTES
        || t.assistant.len() > recollect_model::MAX_TEXT_BYTES
    {
        return bad("text over the size limit");
    }
    Ok(())
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
        let decoded: Vec<Result<RawMessage, StageError>> = batch.iter().map(decode).collect();
        // Erasure markers of every conversation in the batch, read once: a turn recorded at or
        // before its marker was erased while queued and goes no further.
        let pairs = decoded
            .iter()
            .flatten()
            .map(|e| (e.body.tenant.clone(), e.body.conversation_id.clone()));
        let erased = match ErasureMap::read(self.graph.as_ref(), pairs).await {
            Ok(m) => m,
            Err(e) => {
                return batch
                    .iter()
                    .map(|_| Err(StageError::classified(&e)))
                    .collect()
            }
        };
        // Turns of one conversation arrive in order; their state is loaded once per batch.
        let mut states: HashMap<(String, String), ConversationState> = HashMap::new();
        let mut dirty: Vec<(String, String)> = Vec::new();
        let mut results = Vec::with_capacity(batch.len());
        let mut kept: Vec<Option<(TenantId, String, Timestamp)>> = Vec::with_capacity(batch.len());
        for env in decoded {
            let mut seen = None;
            let r: Result<Vec<Message>, StageError> = async {
                let env = env?;
                let mut turn = env.body;
                if erased.covers_turn(&turn) {
                    return Ok(Vec::new());
                }
                seen = Some((
                    turn.tenant.clone(),
                    turn.conversation_id.clone(),
                    turn.recorded_at,
                ));
                let key = (turn.tenant.0.clone(), turn.conversation_id.clone());
                if !states.contains_key(&key) {
                    let mut s = self
                        .graph
                        .conversation_state(&turn.tenant, &turn.conversation_id)
                        .await
                        .map_err(StageError::classified)?;
                    // A state holding erased data (its erasure not finished yet) starts over.
                    if erased
                        .marker(&turn.tenant, &turn.conversation_id)
                        .is_some_and(|m| s.covered_by(m))
                    {
                        s = ConversationState::default();
                        dirty.push(key.clone());
                    }
                    states.insert(key.clone(), s);
                }
                let state = states.get_mut(&key).expect("loaded above");
                if !turn.is_sequenced() {
                    // Straight from Kafka: positions follow partition order. A redelivered or
                    // resent turn keeps the position it was given.
                    turn.position = match state.known_position(&turn.turn_id) {
                        Some(p) => p,
                        None => match self
                            .graph
                            .turns(&turn.tenant, &[turn.memory_id])
                            .await
                            .map_err(StageError::classified)?
                            .first()
                        {
                            Some(r) => r.turn.position,
                            None => {
                                changed(state, turn.recorded_at, &mut dirty, &key);
                                state.assign_position(&turn.turn_id)
                            }
                        },
                    };
                }
                // A redelivered turn must not advance the state twice: extract on a copy.
                let replay = state.reference_position.is_some_and(|p| turn.position <= p);
                let extraction = if replay {
                    let mut scratch = state.reference.clone();
                    self.extractor.extract(&turn, &mut scratch).await
                } else {
                    let x = self.extractor.extract(&turn, &mut state.reference).await;
                    if x.is_ok() {
                        state.reference_position = Some(turn.position);
                        changed(state, turn.recorded_at, &mut dirty, &key);
                    }
                    x
                }
                .map_err(|e| StageError::Permanent(format!("extraction failed: {e}")))?;
                // Read before this turn is kept, by position: a redelivery reads what it read.
                let words = self.context_words;
                let context = state.context_before(turn.position, turn.timestamp, words);
                if state.remember_text(turn.position, turn.timestamp, &turn_words(&turn), words) {
                    changed(state, turn.recorded_at, &mut dirty, &key);
                }
                let out = ExtractedTurn {
                    turn,
                    extraction,
                    context,
                };
                Ok(vec![Message::json(
                    topics::EXTRACTED,
                    bus_key(&out.turn.tenant, &out.turn.conversation_id),
                    Envelope::new(env.trace_id.clone(), out),
                    &env.trace_id,
                )])
            }
            .await;
            kept.push(seen);
            results.push(r);
        }
        // Without the states the outputs must not be published: retry the whole batch. A
        // refusal means an erasure began meanwhile; the retry drops what it covers.
        let to_save: Vec<(TenantId, String, ConversationState)> = dirty
            .iter()
            .filter_map(|k| states.remove_entry(k))
            .map(|((t, c), s)| (TenantId(t), c, s))
            .collect();
        let failed = match self.graph.save_conversation_states(to_save).await {
            Ok(saved) if saved.iter().all(|s| *s) => None,
            Ok(_) => Some("conversation erased while its turns were extracted".to_string()),
            Err(e) => Some(format!("saving reference state failed: {e}")),
        };
        if let Some(msg) = failed {
            return batch
                .iter()
                .map(|_| Err(StageError::Transient(msg.clone())))
                .collect();
        }
        // An erasure that began after the markers were read: what it covers is dropped, and a
        // state saved with erased data in it is removed again.
        if !dirty.is_empty() {
            let pairs = dirty.iter().map(|(t, c)| (TenantId(t.clone()), c.clone()));
            let now = match ErasureMap::read(self.graph.as_ref(), pairs).await {
                Ok(m) => m,
                Err(e) => {
                    return batch
                        .iter()
                        .map(|_| Err(StageError::classified(&e)))
                        .collect()
                }
            };
            for (t, c) in &dirty {
                let tenant = TenantId(t.clone());
                if now.marker(&tenant, c) == erased.marker(&tenant, c) {
                    continue;
                }
                if let Err(e) = self.graph.purge_erased(&tenant, c).await {
                    return batch
                        .iter()
                        .map(|_| Err(StageError::classified(&e)))
                        .collect();
                }
            }
            for (r, k) in results.iter_mut().zip(&kept) {
                if let Some((t, c, at)) = k {
                    if now.covers(t, c, *at) {
                        *r = Ok(Vec::new());
                    }
                }
            }
        }
        results
    }
}

/// A raw turn as the pipeline carries it: checked, with its memory id and record time filled
/// in when the producer left them out.
fn decode(d: &Delivery) -> Result<RawMessage, StageError> {
    let mut env: RawMessage = d
        .message
        .decode()
        .map_err(|e| StageError::Permanent(format!("undecodable raw turn: {e}")))?;
    let turn = &mut env.body;
    check_direct(turn)?;
    if turn.memory_id.is_nil() {
        // As the gateway names a new turn; a producer that wrote this turn before ids were
        // grouped by conversation, and retries it without its id, makes a second memory.
        turn.memory_id = MemoryId::of_turn(&turn.tenant, &turn.conversation_id, &turn.turn_id);
    }
    turn.stamp_recorded(d.timestamp_ms);
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;
    use recollect_extract::RuleExtractor;
    use recollect_model::TenantId;
    use recollect_storage::EmbeddedGraph;

    fn raw(turn_id: &str, text: &str) -> Delivery {
        let body = format!(
            r#"{{"schema_version":2,"trace_id":"tr","body":{{"tenant":"acme","conversation_id":"c",
            "turn_id":"{turn_id}","user":"{text}","timestamp":"2024-05-01T10:00:00Z"}}}}"#
        );
        Delivery {
            message: Message::from_bytes(topics::RAW, "acme/c".into(), body.into_bytes(), vec![]),
            partition: 0,
            offset: 0,
            timestamp_ms: None,
        }
    }

    fn positions(out: &[Result<Vec<Message>, StageError>]) -> Vec<u64> {
        out.iter()
            .map(|r| {
                let m = &r.as_ref().unwrap()[0];
                let e: Envelope<ExtractedTurn> = m.decode().unwrap();
                assert!(!e.body.turn.memory_id.is_nil());
                e.body.turn.position
            })
            .collect()
    }

    #[tokio::test]
    async fn unsequenced_turns_are_numbered_in_order_and_keep_their_number_on_redelivery() {
        let dir = tempfile::tempdir().unwrap();
        let graph = Arc::new(EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap());
        let stage = ExtractorStage::new(Arc::new(RuleExtractor::new()), graph.clone());
        let first = stage
            .handle(&[raw("a", "I met Anna in Paris"), raw("b", "She loves jazz")])
            .await;
        assert_eq!(positions(&first), vec![0, 1]);
        // A redelivery of "b" (crash before commit) and a new turn "c".
        let again = stage
            .handle(&[raw("b", "She loves jazz"), raw("c", "We went to a concert")])
            .await;
        assert_eq!(positions(&again), vec![1, 2]);
        let state = graph
            .conversation_state(&TenantId("acme".into()), "c")
            .await
            .unwrap();
        assert_eq!(state.next_position, 3);
        // A producer's bad turn is dead-letter material, not a retry.
        let bad = stage.handle(&[raw("", "no id")]).await;
        assert!(matches!(bad[0], Err(StageError::Permanent(_))));
    }

    fn contexts(out: &[Result<Vec<Message>, StageError>]) -> Vec<String> {
        out.iter()
            .map(|r| {
                let e: Envelope<ExtractedTurn> = r.as_ref().unwrap()[0].decode().unwrap();
                e.body.context
            })
            .collect()
    }

    #[tokio::test]
    async fn each_turn_carries_the_words_before_it_and_a_redelivery_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let graph = Arc::new(EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap());
        let stage = || {
            ExtractorStage::new(Arc::new(RuleExtractor::new()), graph.clone()).with_context_words(4)
        };
        let first = stage()
            .handle(&[raw("a", "I met Anna in Paris"), raw("b", "She loves jazz")])
            .await;
        assert_eq!(contexts(&first), vec!["", "met Anna in Paris"]);
        // Redelivered "b" reads what it read; "c" reads the newest words, across turns.
        let again = stage()
            .handle(&[raw("b", "She loves jazz"), raw("c", "We went to a concert")])
            .await;
        assert_eq!(
            contexts(&again),
            vec!["met Anna in Paris", "Paris She loves jazz"]
        );
        // The words live in the conversation's state: a new worker goes on from them.
        let state = graph
            .conversation_state(&TenantId("acme".into()), "c")
            .await
            .unwrap();
        assert_eq!(state.recent_text.len(), 3);
        let later = stage().handle(&[raw("d", "It was loud")]).await;
        assert_eq!(contexts(&later), vec!["went to a concert"]);
        // Off: no context carried, no words kept.
        let dir = tempfile::tempdir().unwrap();
        let graph = Arc::new(EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap());
        let off = ExtractorStage::new(Arc::new(RuleExtractor::new()), graph.clone());
        let out = off
            .handle(&[raw("a", "I met Anna in Paris"), raw("b", "She loves jazz")])
            .await;
        assert_eq!(contexts(&out), vec!["", ""]);
        let state = graph
            .conversation_state(&TenantId("acme".into()), "c")
            .await
            .unwrap();
        assert!(state.recent_text.is_empty());
    }
}
