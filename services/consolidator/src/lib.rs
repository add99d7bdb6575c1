//! The consolidator worker: consumes `recollect.turns.stored` and, for every N (=10) stored turns
//! of a conversation, groups the window's turns by topic into Fragments (KeyMem §1,
//! consolidation). A fragment's keyword vocabulary is the union of its turns' keywords.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use recollect_bus::{Delivery, Message, Stage, StageError};
use recollect_model::{topics, Envelope, Fragment, MemoryId, StoredTurn, TenantId};
use recollect_store::{Graph, TurnRecord, VectorIndex};

pub struct ConsolidatorStage {
    graph: Arc<dyn Graph>,
    vectors: Arc<dyn VectorIndex>,
    window: u64,
}

/// Cosine above which two turns are on the same topic even without shared words.
const SAME_TOPIC_COSINE: f32 = 0.55;
/// Keyword-set overlap (Jaccard) above which two turns are on the same topic.
const SAME_TOPIC_OVERLAP: f32 = 0.12;

fn transient(e: impl std::fmt::Display) -> StageError {
    StageError::Transient(e.to_string())
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Speakers are in every turn of a conversation; they say nothing about the topic.
fn topic_keys(r: &TurnRecord) -> HashSet<String> {
    let speakers: Vec<String> = [&r.turn.user_speaker, &r.turn.assistant_speaker]
        .into_iter()
        .flatten()
        .map(|s| s.to_lowercase())
        .collect();
    let mut keys: HashSet<String> = r
        .extraction
        .keywords
        .iter()
        .map(|k| k.key.clone())
        .collect();
    keys.extend(
        r.extraction
            .entities
            .iter()
            .map(|e| e.to_lowercase())
            .filter(|e| !speakers.contains(e)),
    );
    keys
}

/// Groups a window's turns: a turn joins the existing group it is most related to (shared
/// keywords/entities, or embedding similarity), else opens a new group. Order is kept.
pub fn group_window(
    records: &[TurnRecord],
    vectors: &HashMap<MemoryId, Vec<Vec<f32>>>,
) -> Vec<Vec<usize>> {
    let keys: Vec<HashSet<String>> = records.iter().map(topic_keys).collect();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for i in 0..records.len() {
        let mut best: Option<(usize, f32)> = None;
        for (g, members) in groups.iter().enumerate() {
            let mut score = 0f32;
            for &j in members {
                let inter = keys[i].intersection(&keys[j]).count() as f32;
                let union = keys[i].union(&keys[j]).count().max(1) as f32;
                let overlap = inter / union;
                let cos = match (
                    vectors.get(&records[i].turn.memory_id),
                    vectors.get(&records[j].turn.memory_id),
                ) {
                    (Some(a), Some(b)) => a
                        .iter()
                        .flat_map(|x| b.iter().map(move |y| dot(x, y)))
                        .fold(f32::MIN, f32::max),
                    _ => 0.0,
                };
                let related = if overlap >= SAME_TOPIC_OVERLAP || cos >= SAME_TOPIC_COSINE {
                    overlap + cos
                } else {
                    0.0
                };
                score = score.max(related);
            }
            // Adjacent turns continue a topic more readily than distant ones.
            let adjacent = members.last().is_some_and(|&j| j + 1 == i);
            if adjacent && score > 0.0 {
                score += 0.1;
            }
            if score > 0.0 && best.is_none_or(|(_, s)| score > s) {
                best = Some((g, score));
            }
        }
        match best {
            Some((g, _)) => groups[g].push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}

pub fn fragment_id(
    tenant: &TenantId,
    conversation: &str,
    window_start: u64,
    group: usize,
) -> String {
    MemoryId::derive(
        tenant,
        conversation,
        &format!("fragment:{window_start}:{group}"),
    )
    .to_string()
}

impl ConsolidatorStage {
    pub fn new(graph: Arc<dyn Graph>, vectors: Arc<dyn VectorIndex>, window: usize) -> Self {
        Self {
            graph,
            vectors,
            window: window as u64,
        }
    }

    /// Consolidates every complete window of a conversation not yet consolidated.
    pub async fn consolidate(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<usize, StageError> {
        let mut made = 0;
        loop {
            let mut state = self
                .graph
                .conversation_state(tenant, conversation)
                .await
                .map_err(transient)?;
            let from = state.consolidated_until;
            let records = self
                .graph
                .conversation_turns(tenant, conversation, from, from + self.window)
                .await
                .map_err(transient)?;
            if (records.len() as u64) < self.window {
                return Ok(made);
            }
            let ids: Vec<MemoryId> = records.iter().map(|r| r.turn.memory_id).collect();
            let fv = self
                .vectors
                .field_vectors(tenant, &ids)
                .await
                .map_err(transient)?;
            let vectors: HashMap<MemoryId, Vec<Vec<f32>>> = fv
                .into_iter()
                .map(|(id, f)| (id, std::iter::once(f.user).chain(f.assistant).collect()))
                .collect();
            let groups = group_window(&records, &vectors);
            let now = Utc::now();
            let fragments: Vec<Fragment> = groups
                .iter()
                .enumerate()
                .map(|(g, members)| {
                    let mut vocab = BTreeSet::new();
                    let mut counts: HashMap<&str, usize> = HashMap::new();
                    for &i in members {
                        for k in &records[i].extraction.keywords {
                            vocab.insert(k.key.clone());
                            *counts.entry(k.text.as_str()).or_default() += 1;
                        }
                    }
                    let mut top: Vec<(&str, usize)> = counts.into_iter().collect();
                    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
                    let description = top
                        .iter()
                        .take(6)
                        .map(|(t, _)| *t)
                        .collect::<Vec<_>>()
                        .join(", ");
                    Fragment {
                        id: fragment_id(tenant, conversation, from, g),
                        tenant: tenant.clone(),
                        conversation_id: conversation.to_string(),
                        description,
                        members: members.iter().map(|&i| records[i].turn.memory_id).collect(),
                        keywords: vocab.into_iter().collect(),
                        created_at: now,
                    }
                })
                .collect();
            self.graph
                .write_fragments(&fragments)
                .await
                .map_err(transient)?;
            // Re-read: the extractor may have saved reference state meanwhile.
            state = self
                .graph
                .conversation_state(tenant, conversation)
                .await
                .map_err(transient)?;
            state.consolidated_until = from + self.window;
            self.graph
                .save_conversation_state(tenant, conversation, &state)
                .await
                .map_err(transient)?;
            made += fragments.len();
        }
    }
}

#[async_trait]
impl Stage for ConsolidatorStage {
    fn name(&self) -> &'static str {
        "consolidator"
    }

    fn input_topic(&self) -> &'static str {
        topics::STORED
    }

    fn max_batch(&self) -> usize {
        512
    }

    async fn handle(&self, batch: &[Delivery]) -> Vec<Result<Vec<Message>, StageError>> {
        let decoded: Vec<Result<Envelope<StoredTurn>, StageError>> = batch
            .iter()
            .map(|d| {
                serde_json::from_slice(&d.message.payload)
                    .map_err(|e| StageError::Permanent(format!("undecodable stored turn: {e}")))
            })
            .collect();
        let mut convs: Vec<(TenantId, String)> = Vec::new();
        for env in decoded.iter().flatten() {
            let k = (env.body.tenant.clone(), env.body.conversation_id.clone());
            if !convs.contains(&k) {
                convs.push(k);
            }
        }
        for (tenant, conv) in &convs {
            if let Err(e) = self.consolidate(tenant, conv).await {
                return batch.iter().map(|_| Err(e.clone())).collect();
            }
        }
        decoded.into_iter().map(|r| r.map(|_| vec![])).collect()
    }
}
