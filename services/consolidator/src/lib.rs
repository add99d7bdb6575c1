//! The consolidator worker: consumes `recollect.turns.stored` and, for every N (=10) stored turns
//! of a conversation, groups the window's turns by topic into Fragments (KeyMem §1,
//! consolidation). A fragment's keyword vocabulary is the union of its turns' keywords.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use futures::StreamExt;
use recollect_bus::{Delivery, Message, Stage, StageError};
use recollect_llm::ChatModel;
use recollect_model::{dot_lanes, topics, Envelope, Fragment, MemoryId, StoredTurn, TenantId};
use recollect_storage::{ErasureMap, Graph, TurnRecord, VectorIndex};

pub struct ConsolidatorStage {
    graph: Arc<dyn Graph>,
    vectors: Arc<dyn VectorIndex>,
    window: u64,
    /// `consolidation.kind = "llm"`: the model groups each window; the rules when it fails.
    llm: Option<Arc<ChatModel>>,
}

const LLM_SYSTEM: &str = "You group the numbered turns of a chat window by topic. Answer with \
one JSON object and nothing else: {\"groups\": [{\"turns\": [0, 1], \"topic\": \"a few \
words\"}]}. Every turn number appears in exactly one group; turns about the same subject go \
together even when not adjacent; keep the order of first appearance.";

/// The model's grouping, made valid: indices in range, each turn once (first claim wins), turns
/// left out become groups of their own; a topic of ≤ 80 printable chars, if given.
pub fn groups_from_answer(
    n: usize,
    answer: &serde_json::Value,
) -> Vec<(Vec<usize>, Option<String>)> {
    let mut taken = vec![false; n];
    let mut out: Vec<(Vec<usize>, Option<String>)> = Vec::new();
    for g in answer
        .get("groups")
        .and_then(|g| g.as_array())
        .into_iter()
        .flatten()
        .take(n)
    {
        let members: Vec<usize> = g
            .get("turns")
            .and_then(|t| t.as_array())
            .into_iter()
            .flatten()
            .filter_map(|i| i.as_u64())
            .map(|i| i as usize)
            .filter(|&i| i < n && !std::mem::replace(&mut taken[i], true))
            .collect();
        if members.is_empty() {
            continue;
        }
        let topic = g
            .get("topic")
            .and_then(|t| t.as_str())
            .map(str::trim)
            .filter(|t| {
                !t.is_empty() && t.chars().count() <= 80 && !t.chars().any(char::is_control)
            })
            .map(String::from);
        out.push((members, topic));
    }
    for (i, t) in taken.iter().enumerate() {
        if !t {
            out.push((vec![i], None));
        }
    }
    out
}

async fn llm_groups(
    model: &ChatModel,
    records: &[TurnRecord],
) -> Result<Vec<(Vec<usize>, Option<String>)>, recollect_llm::LlmError> {
    let mut prompt = String::new();
    for (i, r) in records.iter().enumerate() {
        let who = |s: &Option<String>, d: &str| s.clone().unwrap_or_else(|| d.to_string());
        prompt.push_str(&format!(
            "{i}. {}: {}",
            who(&r.turn.user_speaker, "user"),
            r.turn.user
        ));
        if !r.turn.assistant.trim().is_empty() {
            prompt.push_str(&format!(
                " / {}: {}",
                who(&r.turn.assistant_speaker, "assistant"),
                r.turn.assistant
            ));
        }
        prompt.push('\n');
    }
    let answer = model.json(LLM_SYSTEM, &prompt).await?;
    Ok(groups_from_answer(records.len(), &answer))
}

/// Cosine above which two turns are on the same topic even without shared words.
const SAME_TOPIC_COSINE: f32 = 0.55;
/// Keyword-set overlap (Jaccard) above which two turns are on the same topic.
const SAME_TOPIC_OVERLAP: f32 = 0.12;

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
                let inter = keys[i].intersection(&keys[j]).count();
                // |a ∪ b| = |a| + |b| − |a ∩ b|, without walking both sets again.
                let union = (keys[i].len() + keys[j].len() - inter).max(1);
                let overlap = inter as f32 / union as f32;
                let cos = match (
                    vectors.get(&records[i].turn.memory_id),
                    vectors.get(&records[j].turn.memory_id),
                ) {
                    (Some(a), Some(b)) => a
                        .iter()
                        .flat_map(|x| b.iter().map(move |y| dot_lanes(x, y)))
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
            llm: None,
        }
    }

    /// As configured: `consolidation.window`, and the `[llm]` model when
    /// `consolidation.kind = "llm"`.
    pub fn from_settings(
        graph: Arc<dyn Graph>,
        vectors: Arc<dyn VectorIndex>,
        settings: &recollect_config::Settings,
    ) -> Result<Self, recollect_llm::LlmError> {
        let mut stage = Self::new(graph, vectors, settings.consolidation.window);
        if settings.consolidation.kind == recollect_config::ConsolidationKind::Llm {
            stage.llm = Some(Arc::new(ChatModel::new(&settings.llm)?));
        }
        Ok(stage)
    }

    /// Consolidates every complete window of a conversation not yet consolidated.
    pub async fn consolidate(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<usize, StageError> {
        self.consolidate_all(&[(tenant.clone(), conversation.to_string())])
            .await
    }

    /// Consolidates every complete window of several conversations, a pass at a time: each
    /// conversation's next windows are read (`CONVERSATIONS_AT_ONCE` at once), then every
    /// fragment of the pass and every conversation's advance go to the graph in one write
    /// ([`Graph::write_consolidation`]), instead of two writes for each conversation.
    pub async fn consolidate_all(
        &self,
        conversations: &[(TenantId, String)],
    ) -> Result<usize, StageError> {
        let mut made = 0;
        let mut todo: Vec<(TenantId, String)> = conversations.to_vec();
        while !todo.is_empty() {
            let mut passes: Vec<Pass> = Vec::new();
            let mut running = futures::stream::FuturesUnordered::new();
            for (t, c) in &todo {
                if running.len() >= CONVERSATIONS_AT_ONCE {
                    if let Some(p) = running.next().await {
                        passes.extend(p?);
                    }
                }
                running.push(self.next_pass(t, c));
            }
            while let Some(p) = running.next().await {
                passes.extend(p?);
            }
            drop(running);
            if passes.is_empty() {
                break;
            }
            let fragments: Vec<Fragment> = passes
                .iter()
                .flat_map(|p| p.fragments.iter().cloned())
                .collect();
            // Only our field of each state: the extractor saves the rest concurrently.
            let advances = passes
                .iter()
                .map(|p| (p.tenant.clone(), p.conversation.clone(), p.until))
                .collect();
            self.graph
                .write_consolidation(fragments, advances)
                .await
                .map_err(StageError::classified)?;
            // Erased while the windows were read: remove what the fragments or the advance may
            // have put back (purging what no marker covers removes nothing).
            let mut next: Vec<&Pass> = Vec::new();
            let mut running = futures::stream::FuturesUnordered::new();
            for p in &passes {
                if running.len() >= CONVERSATIONS_AT_ONCE {
                    if let Some(r) = running.next().await {
                        next.extend(r?);
                    }
                }
                running.push(self.settle(p));
            }
            while let Some(r) = running.next().await {
                next.extend(r?);
            }
            drop(running);
            todo.clear();
            for p in next {
                made += p.fragments.len();
                if p.more {
                    todo.push((p.tenant.clone(), p.conversation.clone()));
                }
            }
        }
        Ok(made)
    }

    /// A written pass checked against the erasures its conversation has now: the pass when
    /// unchanged; None when they changed, after what the new ones cover is purged (the
    /// conversation is left for this batch).
    async fn settle<'a>(&self, p: &'a Pass) -> Result<Option<&'a Pass>, StageError> {
        let now = self
            .graph
            .erasures(&p.tenant, std::slice::from_ref(&p.conversation))
            .await
            .map_err(StageError::classified)?;
        if now == p.marks {
            return Ok(Some(p));
        }
        self.graph
            .purge_erased(&p.tenant, &p.conversation)
            .await
            .map_err(StageError::classified)?;
        Ok(None)
    }

    /// A conversation's next complete windows (up to `WINDOWS_AT_ONCE`) grouped into
    /// fragments; None when there is none to consolidate.
    async fn next_pass(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<Option<Pass>, StageError> {
        // An erasure under way: what it covers is not consolidated (its eraser or the
        // graph-writer removes it; turns recorded after it start a fresh state).
        let marks = self
            .graph
            .erasures(tenant, &[conversation.to_string()])
            .await
            .map_err(StageError::classified)?;
        let erased = marks.marker(conversation);
        let state = self
            .graph
            .conversation_state(tenant, conversation)
            .await
            .map_err(StageError::classified)?;
        if erased.is_some_and(|m| state.covered_by(m)) {
            return Ok(None);
        }
        let from = state.consolidated_until;
        // Every complete window from `from` on, up to WINDOWS_AT_ONCE of them, read and
        // written together: a conversation stored in one request has many.
        let records = self
            .graph
            .conversation_turns(
                tenant,
                conversation,
                from,
                from + self.window * WINDOWS_AT_ONCE,
            )
            .await
            .map_err(StageError::classified)?;
        let mut windows: Vec<(u64, &[TurnRecord])> = Vec::new();
        let mut rest = records.as_slice();
        let mut start = from;
        while !rest.is_empty() {
            let end = start + self.window;
            let n = rest.iter().take_while(|r| r.turn.position < end).count();
            let (these, after) = rest.split_at(n);
            // A position whose turn was erased on its own stays empty for good (unless the
            // turn is stored again there): the window is complete without it.
            let present: std::collections::BTreeSet<u64> =
                these.iter().map(|r| r.turn.position).collect();
            let gaps = marks
                .erased_positions(start, end)
                .difference(&present)
                .count() as u64;
            if (present.len() as u64) + gaps < self.window || these.is_empty() {
                break;
            }
            // Not yet: a turn an erasure covers (its eraser removes it), or one a reindex has
            // not derived again (its old extraction and points would group the window as
            // before the reindex).
            if these
                .iter()
                .any(|r| r.rederiving || marks.covers_turn(&r.turn))
            {
                break;
            }
            windows.push((start, these));
            rest = after;
            start = end;
        }
        let Some(&(last, _)) = windows.last() else {
            return Ok(None);
        };
        let until = last + self.window;
        let ids: Vec<MemoryId> = windows
            .iter()
            .flat_map(|(_, w)| w.iter().map(|r| r.turn.memory_id))
            .collect();
        let fv = self
            .vectors
            .field_vectors(tenant, &ids)
            .await
            .map_err(StageError::classified)?;
        let vectors: HashMap<MemoryId, Vec<Vec<f32>>> = fv
            .into_iter()
            .map(|(id, f)| (id, std::iter::once(f.user).chain(f.assistant).collect()))
            .collect();
        let now = Utc::now();
        let mut fragments: Vec<Fragment> = Vec::new();
        for &(window_start, records) in &windows {
            let rules = || {
                group_window(records, &vectors)
                    .into_iter()
                    .map(|m| (m, None))
                    .collect::<Vec<(Vec<usize>, Option<String>)>>()
            };
            let groups = match &self.llm {
                None => rules(),
                Some(model) => match llm_groups(model, records).await {
                    Ok(g) => g,
                    Err(e) => {
                        tracing::warn!(error = %e, conversation, "llm consolidation failed; grouping by the rules");
                        rules()
                    }
                },
            };
            fragments.extend(groups.iter().enumerate().map(|(g, (members, topic))| {
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
                let description = topic.clone().unwrap_or_else(|| {
                    top.iter()
                        .take(6)
                        .map(|(t, _)| *t)
                        .collect::<Vec<_>>()
                        .join(", ")
                });
                Fragment {
                    id: fragment_id(tenant, conversation, window_start, g),
                    tenant: tenant.clone(),
                    conversation_id: conversation.to_string(),
                    description,
                    members: members.iter().map(|&i| records[i].turn.memory_id).collect(),
                    keywords: vocab.into_iter().collect(),
                    created_at: now,
                }
            }));
        }
        Ok(Some(Pass {
            tenant: tenant.clone(),
            conversation: conversation.to_string(),
            more: (windows.len() as u64) >= WINDOWS_AT_ONCE,
            fragments,
            until,
            marks,
        }))
    }
}

/// One conversation's pass: the fragments of its next windows, how far they reach, and the
/// erasures they were read under.
struct Pass {
    tenant: TenantId,
    conversation: String,
    fragments: Vec<Fragment>,
    until: u64,
    marks: recollect_storage::Erasures,
    /// As many windows as one pass takes: there may be more after them.
    more: bool,
}

/// Windows of one conversation consolidated in one pass (one read of their turns, one write
/// of their fragments, one advance), instead of a round of store calls for each.
const WINDOWS_AT_ONCE: u64 = 16;

/// Conversations of one batch read at once. One at a time, the stage was the pipeline's
/// slowest: each pass is a chain of small store reads (erasures, state, turns, vectors), each
/// waiting on the blocking pool. Their writes are one call for the whole batch.
const CONVERSATIONS_AT_ONCE: usize = 4;

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
                d.message
                    .decode()
                    .map_err(|e| StageError::Permanent(format!("undecodable stored turn: {e}")))
            })
            .collect();
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
        let mut convs: Vec<(TenantId, String)> = Vec::new();
        for env in decoded.iter().flatten() {
            let b = &env.body;
            // Stored before its conversation was erased: nothing to consolidate.
            if b.recorded_at
                .is_some_and(|at| erased.covers(&b.tenant, &b.conversation_id, at))
            {
                continue;
            }
            let k = (b.tenant.clone(), b.conversation_id.clone());
            if !convs.contains(&k) {
                convs.push(k);
            }
        }
        if let Err(e) = self.consolidate_all(&convs).await {
            return batch.iter().map(|_| Err(e.clone())).collect();
        }
        decoded.into_iter().map(|r| r.map(|_| vec![])).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use axum::{Json, Router};
    use recollect_model::{Extraction, Turn};
    use serde_json::json;

    #[test]
    fn a_model_grouping_is_made_valid() {
        let answer = json!({"groups": [
            {"turns": [0, 2, 2, 9, "x"], "topic": "the pottery class"},
            {"turns": [2, 1], "topic": ""},
            {"turns": []},
            {"turns": [4], "topic": "x".repeat(200)}
        ]});
        let g = groups_from_answer(5, &answer);
        assert_eq!(
            g,
            vec![
                (vec![0, 2], Some("the pottery class".to_string())),
                (vec![1], None),
                (vec![4], None),
                (vec![3], None),
            ]
        );
        // Junk: every turn its own group.
        let g = groups_from_answer(3, &json!("no"));
        assert_eq!(g.len(), 3);
        let covered: Vec<usize> = g.iter().flat_map(|(m, _)| m.clone()).collect();
        assert_eq!(covered, vec![0, 1, 2]);
    }

    fn record(i: u64, user: &str) -> TurnRecord {
        TurnRecord {
            turn: Turn {
                memory_id: MemoryId::derive(&TenantId("t".into()), "c", &i.to_string()),
                tenant: TenantId("t".into()),
                conversation_id: "c".into(),
                turn_id: i.to_string(),
                position: i,
                user: user.into(),
                assistant: String::new(),
                user_speaker: Some("Ana".into()),
                assistant_speaker: None,
                timestamp: Utc::now(),
                recorded_at: Utc::now(),
                metadata: Default::default(),
                user_id: None,
                agent_id: None,
                version: 1,
                first_recorded_at: None,
                expired_at: None,
            },
            extraction: Extraction::default(),
            fragments: vec![],
            history: vec![],
            rederiving: false,
        }
    }

    /// An embedded graph and vector index in `dir`.
    fn stores(dir: &std::path::Path) -> (Arc<dyn Graph>, Arc<dyn VectorIndex>) {
        let graph = recollect_storage::EmbeddedGraph::open(&dir.join("g.redb")).unwrap();
        let vectors = recollect_storage::EdgeVectorIndex::open(&dir.join("v"), 8).unwrap();
        (Arc::new(graph), Arc::new(vectors))
    }

    /// Turns `from..to`, each with one keyword, `key(position)`.
    fn keyed(from: u64, to: u64, key: impl Fn(u64) -> String) -> Vec<(Turn, Extraction)> {
        (from..to)
            .map(|i| {
                let k = key(i);
                let x = Extraction {
                    keywords: vec![recollect_model::Keyword {
                        key: k.clone(),
                        text: k.clone(),
                    }],
                    ..Default::default()
                };
                (record(i, &k).turn, x)
            })
            .collect()
    }

    /// A reindex re-derives a conversation whose old turns stay in the graph: a window is
    /// consolidated from the new derivation once all of it is written, never from the old
    /// records of the turns not yet re-enriched.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reindexed_window_waits_for_all_of_its_new_derivation() {
        let dir = tempfile::tempdir().unwrap();
        let (graph, vectors) = stores(dir.path());
        let t = TenantId("t".into());
        // Before: ten turns on ten topics. After the reindex: one topic.
        let stage = ConsolidatorStage::new(graph.clone(), vectors, 10);
        graph
            .write_turns(&keyed(0, 10, |i| format!("topic{i}")))
            .await
            .unwrap();
        assert_eq!(stage.consolidate(&t, "c").await.unwrap(), 10);

        graph.restart_derivation(&t, "c").await.unwrap();
        let pottery = |_| "pottery".to_string();
        graph.write_turns(&keyed(0, 6, pottery)).await.unwrap();
        assert_eq!(
            stage.consolidate(&t, "c").await.unwrap(),
            0,
            "four turns still hold their old derivation"
        );
        let state = graph.conversation_state(&t, "c").await.unwrap();
        assert_eq!(state.consolidated_until, 0);

        graph.write_turns(&keyed(6, 10, pottery)).await.unwrap();
        assert_eq!(stage.consolidate(&t, "c").await.unwrap(), 1);
        let f = graph
            .fragments(&t, &[fragment_id(&t, "c", 0, 0)])
            .await
            .unwrap();
        assert_eq!(
            (f[0].members.len(), f[0].keywords.clone()),
            (10, vec!["pottery".to_string()])
        );
    }

    /// Every complete window is consolidated, however many came at once (more than one
    /// pass of WINDOWS_AT_ONCE), each turn into one fragment; an incomplete window waits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_complete_window_is_consolidated_and_an_incomplete_one_waits() {
        let dir = tempfile::tempdir().unwrap();
        let (graph, vectors) = stores(dir.path());
        let t = TenantId("t".into());
        let topics = ["pottery", "the dog", "clay", "hiking"];
        let stored = |from: u64, to: u64| keyed(from, to, |i| topics[i as usize % 4].into());
        let window = 10u64;
        let stage = ConsolidatorStage::new(graph.clone(), vectors, window as usize);
        let total = window * (WINDOWS_AT_ONCE + 1) + 5;
        graph.write_turns(&stored(0, total)).await.unwrap();
        let made = stage.consolidate(&t, "c").await.unwrap();
        let until = window * (WINDOWS_AT_ONCE + 1);
        let state = graph.conversation_state(&t, "c").await.unwrap();
        assert_eq!(state.consolidated_until, until);
        let records = graph.conversation_turns(&t, "c", 0, total).await.unwrap();
        for r in &records {
            let expected = usize::from(r.turn.position < until);
            assert_eq!(r.fragments.len(), expected, "turn {}", r.turn.position);
        }
        // Four topics a window, each its own fragment, named by its window's start.
        assert_eq!(made, 4 * (WINDOWS_AT_ONCE as usize + 1));
        let ids: Vec<String> = (0..=WINDOWS_AT_ONCE)
            .flat_map(|w| (0..4).map(move |g| (w, g)))
            .map(|(w, g)| fragment_id(&t, "c", w * window, g))
            .collect();
        let fragments = graph.fragments(&TenantId("t".into()), &ids).await.unwrap();
        assert_eq!(fragments.len(), ids.len());
        assert!(fragments.iter().all(|f| f.members.len() >= 2));

        // Nothing new complete: nothing made, nothing moved.
        assert_eq!(stage.consolidate(&t, "c").await.unwrap(), 0);
        graph
            .write_turns(&stored(total, until + window))
            .await
            .unwrap();
        assert!(stage.consolidate(&t, "c").await.unwrap() > 0);
        let state = graph.conversation_state(&t, "c").await.unwrap();
        assert_eq!(state.consolidated_until, until + window);
    }

    #[tokio::test]
    async fn the_model_groups_a_window_through_an_openai_compatible_endpoint() {
        let app = Router::new().route(
            "/v1/chat/completions",
            post(|Json(body): Json<serde_json::Value>| async move {
                let prompt = body["messages"][1]["content"].as_str().unwrap_or_default();
                assert!(prompt.contains("0. Ana: pottery") && prompt.contains("2. Ana: clay"));
                let content = r#"{"groups": [{"turns": [0, 2], "topic": "pottery"}, {"turns": [1], "topic": "the dog"}]}"#;
                Json(json!({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                    "choices": [{"index": 0, "finish_reason": "stop",
                        "message": {"role": "assistant", "content": content}}]}))
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let mut s = recollect_config::Settings::defaults().llm;
        s.base_url = url;
        s.model = "m".into();
        s.max_retries = 0;
        let model = ChatModel::new(&s).unwrap();
        let records = vec![
            record(0, "pottery"),
            record(1, "walked the dog"),
            record(2, "clay"),
        ];
        let g = llm_groups(&model, &records).await.unwrap();
        assert_eq!(
            g,
            vec![
                (vec![0, 2], Some("pottery".to_string())),
                (vec![1], Some("the dog".to_string())),
            ]
        );
    }
}
