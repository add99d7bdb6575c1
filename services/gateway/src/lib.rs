//! The gateway: the front door of the store path. It validates turns and hands them to the
//! pipeline on `recollect.turns.raw`.
//! - Embedded: turns are first written durably to the raw-turn store (the source of truth,
//!   which also numbers them); a 202 means the turn is on disk.
//! - Distributed: Kafka is the log; a 202 means every broker replica acknowledged the turn
//!   (idempotent producer, acks=all). The extractor numbers turns in partition order.
//!
//! With `wait`, a 202 also means the turns are recallable.

use std::sync::Arc;
use std::time::Duration;

use recollect_bus::{Bus, Message};
use recollect_model::{
    bus_key, request, topics, Envelope, MemoryId, RecollectError, TenantId, Turn, TurnInput,
    TurnPatch, MAX_TEXT_BYTES,
};
use recollect_storage::raw::Appended;
use recollect_storage::{Graph, RawStore};
use recollect_telemetry::events::{InternalEvent, TurnRejected, TurnsAccepted};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

pub use recollect_model::request::{is_forbidden_control, StoreRequest};

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StoreResponse {
    /// One per turn, in request order.
    #[schema(value_type = Vec<String>)]
    pub memory_ids: Vec<MemoryId>,
}

/// What erasing a conversation removed.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Erased {
    pub conversation_id: String,
    pub turns_erased: u64,
}

/// Erases a conversation of the caller's tenant from every store: what
/// `DELETE /v1/conversations/{id}` and gRPC `Delete` do.
pub async fn delete_conversation(
    eraser: &dyn Eraser,
    tenant: &TenantId,
    conversation: &str,
) -> Result<Erased, RecollectError> {
    validate_conversation_id(conversation)?;
    match eraser.erase_conversation(tenant, conversation).await? {
        None => Err(RecollectError::NotFound(format!(
            "conversation {conversation:?} not found"
        ))),
        Some(turns_erased) => Ok(Erased {
            conversation_id: conversation.to_string(),
            turns_erased,
        }),
    }
}

/// What erasing one memory removed.
/// A consistent copy of a data directory, made while the server runs (`POST
/// /v1/admin/backup`, `recollect backup`).
#[async_trait::async_trait]
pub trait Backup: Send + Sync {
    /// Copies every store kept in the data directory to `to` (absent or empty; absolute).
    async fn backup(&self, to: &std::path::Path) -> Result<BackupDone, RecollectError>;
}

/// `POST /v1/admin/backup` body.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackupRequest {
    /// Absolute path on the server's machine, absent or an empty directory.
    pub path: String,
}

/// What a backup wrote.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BackupDone {
    pub path: String,
    /// Bytes copied.
    pub bytes: u64,
    /// How long writes waited for the copy (recall went on throughout).
    pub paused_ms: u64,
    /// Stores kept elsewhere (a graph or vector server), not in this copy.
    pub not_included: Vec<String>,
}

/// What `POST /v1/reindex` started.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Reindexing {
    /// Conversations whose derivation starts over.
    pub conversations: u64,
    /// Turns sent through the workers again.
    pub turns: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MemoryErased {
    #[schema(value_type = String)]
    pub memory_id: MemoryId,
    pub conversation_id: String,
    pub turn_id: String,
}

/// Erases one memory (turn) of the caller's tenant from every store: what
/// `DELETE /v1/memories/{id}` and gRPC `DeleteMemory` do.
pub async fn delete_memory(
    eraser: &dyn Eraser,
    tenant: &TenantId,
    id: &str,
) -> Result<MemoryErased, RecollectError> {
    let Some(mid) = MemoryId::parse(id) else {
        return Err(RecollectError::invalid(format!(
            "memory id {id:?} is not a memory id (a UUID)"
        )));
    };
    match eraser.erase_memory(tenant, mid).await? {
        None => Err(RecollectError::NotFound(format!("memory {id} not found"))),
        Some(t) => Ok(MemoryErased {
            memory_id: mid,
            conversation_id: t.conversation_id,
            turn_id: t.turn_id,
        }),
    }
}

/// One turn of `tenant` as the graph holds it.
pub async fn graph_turn(
    graph: &dyn Graph,
    tenant: &TenantId,
    id: MemoryId,
) -> Result<Option<Turn>, RecollectError> {
    Ok(graph
        .turns(tenant, &[id])
        .await
        .map_err(RecollectError::from_classified)?
        .into_iter()
        .next()
        .map(|r| r.turn))
}

/// Erases one turn from the graph and the vector index (the raw store, where there is one, is
/// the caller's, last). The erasure record first, durably: from then on no stage writes the
/// turn back, however far along the pipeline a copy of it is. Keyword points go with it when no
/// other turn of the conversation links to them (they hold its words); fragments with it as a
/// member go too (their descriptions quote it). The rest of the conversation stays recallable.
pub async fn erase_turn_in_stores(
    graph: &dyn Graph,
    vectors: &dyn recollect_storage::VectorIndex,
    tenant: &TenantId,
    turn: &Turn,
) -> Result<(), RecollectError> {
    let classified = RecollectError::from_classified;
    let conv = turn.conversation_id.as_str();
    // Never before the turn was recorded (clocks of gateways and this process may differ), or
    // the record would not cover it.
    let at = chrono::Utc::now().max(turn.recorded_at);
    let stored = graph
        .turns(tenant, &[turn.memory_id])
        .await
        .map_err(classified)?;
    let position = stored.first().map_or(turn.position, |r| r.turn.position);
    graph
        .record_turn_erasure(
            tenant,
            conv,
            turn.memory_id,
            recollect_storage::TurnErasure { at, position },
        )
        .await
        .map_err(classified)?;
    let keywords = stored
        .first()
        .map(|r| recollect_storage::NodeKind::Keyword.names(&r.extraction))
        .unwrap_or_default();
    let links = graph
        .linked_turns(
            tenant,
            &recollect_storage::Scope::of(&[conv]),
            recollect_storage::NodeKind::Keyword,
            &keywords,
            None,
            None,
        )
        .await
        .map_err(classified)?;
    let only_ours: Vec<String> = keywords
        .into_iter()
        .filter(|k| {
            links
                .iter()
                .all(|l| l.name != *k || l.memory_id == turn.memory_id)
        })
        .collect();
    vectors
        .delete_turns(tenant, conv, &[turn.memory_id], &only_ours)
        .await
        .map_err(classified)?;
    graph.purge_erased(tenant, conv).await.map_err(classified)?;
    Ok(())
}

#[derive(Debug, Clone)]
pub struct Limits {
    pub max_turns_per_request: usize,
    pub max_text_bytes: usize,
    pub wait_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_turns_per_request: 1000,
            max_text_bytes: MAX_TEXT_BYTES,
            wait_timeout: Duration::from_secs(120),
        }
    }
}

pub struct Gateway {
    /// Embedded mode's durable log; None when Kafka is the log.
    raw: Option<RawStore>,
    /// Embedded mode: held (shared) around every write, taken whole by a backup.
    gate: Option<Arc<tokio::sync::RwLock<()>>>,
    /// Distributed mode: where `wait` looks for stored turns.
    graph: Option<Arc<dyn Graph>>,
    bus: Arc<dyn Bus>,
    limits: Limits,
    /// Woken by the graph-writer whenever turns become recallable.
    stored: Arc<Notify>,
}

fn rejected(r: request::Rejection) -> RecollectError {
    TurnRejected { reason: r.reason }.emit();
    RecollectError::Invalid(r.message)
}

/// Conversation ids end up in keys, paths and payload filters: keep them plain.
pub fn validate_conversation_id(id: &str) -> Result<(), RecollectError> {
    request::validate_conversation_id(id).map_err(rejected)
}

impl Gateway {
    pub fn new(raw: RawStore, bus: Arc<dyn Bus>, limits: Limits, stored: Arc<Notify>) -> Self {
        Self {
            raw: Some(raw),
            gate: None,
            graph: None,
            bus,
            limits,
            stored,
        }
    }

    /// Writes hold `gate` (shared) while they change a store; a backup takes it whole.
    pub fn with_gate(mut self, gate: Arc<tokio::sync::RwLock<()>>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Shared hold of the write gate (none in a distributed gateway). Never held while waiting
    /// for the workers: they need it too, and a backup waiting for it would stop them.
    async fn writing(&self) -> Option<tokio::sync::RwLockReadGuard<'_, ()>> {
        match &self.gate {
            Some(g) => Some(g.read().await),
            None => None,
        }
    }

    /// The embedded gateway with the graph beside its raw store (for `reindex`).
    pub fn with_graph(mut self, graph: Arc<dyn Graph>) -> Self {
        self.graph = Some(graph);
        self
    }

    /// A gateway in front of Kafka: no local state, any number of replicas.
    pub fn distributed(bus: Arc<dyn Bus>, graph: Arc<dyn Graph>, limits: Limits) -> Self {
        Self {
            raw: None,
            gate: None,
            graph: Some(graph),
            bus,
            limits,
            stored: Arc::new(Notify::new()),
        }
    }

    /// Checks a request; nothing is stored unless every turn passes.
    pub fn validate(&self, conversation: &str, turns: &[TurnInput]) -> Result<(), RecollectError> {
        request::validate_store(
            conversation,
            turns,
            self.limits.max_turns_per_request,
            self.limits.max_text_bytes,
        )
        .map_err(rejected)
    }

    /// Validates, stores durably, publishes new turns; with `wait`, returns once they are recallable.
    pub async fn store(
        &self,
        tenant: &TenantId,
        conversation: &str,
        req: StoreRequest,
        trace_id: &str,
    ) -> Result<StoreResponse, RecollectError> {
        self.validate(conversation, &req.turns)?;
        let Some(raw) = self.raw.clone() else {
            return self.store_on_bus(tenant, conversation, req, trace_id).await;
        };
        let (t, c) = (tenant.clone(), conversation.to_string());
        let turns = req.turns;
        let writing = self.writing().await;
        let appended: Vec<Appended> =
            tokio::task::spawn_blocking(move || raw.append(&t, &c, &turns))
                .await
                .map_err(RecollectError::internal)?
                .map_err(RecollectError::from_classified)?;
        // Published after the gate is let go: a pending turn in a backup is replayed at start.
        drop(writing);
        TurnsAccepted {
            count: appended.len(),
        }
        .emit();
        let ids: Vec<MemoryId> = appended.iter().map(|a| a.turn.memory_id).collect();
        let new: Vec<Turn> = appended
            .into_iter()
            .filter(|a| a.new)
            .map(|a| a.turn)
            .collect();
        self.publish(new, trace_id).await?;
        if req.wait.unwrap_or(false) {
            self.wait_stored(tenant, &ids).await?;
        }
        Ok(StoreResponse { memory_ids: ids })
    }

    /// Distributed store: the turns go to Kafka unnumbered; a turn without an id gets one from
    /// its content, so a client retry lands on the same memory.
    async fn store_on_bus(
        &self,
        tenant: &TenantId,
        conversation: &str,
        req: StoreRequest,
        trace_id: &str,
    ) -> Result<StoreResponse, RecollectError> {
        let turn_ids: Vec<String> = req
            .turns
            .iter()
            .map(|input| input.turn_id.clone().unwrap_or_else(|| content_id(input)))
            .collect();
        let (ids, superseded) = self
            .resolve_ids(tenant, conversation, &req.turns, &turn_ids)
            .await?;
        let now = recollect_model::now_micros();
        let turns: Vec<Turn> = req
            .turns
            .into_iter()
            .zip(turn_ids)
            .zip(&ids)
            // A retry of a version an edit has replaced: nothing to send (a copy on the bus
            // would only be skipped by the writer).
            .filter(|(_, id)| !superseded.contains(*id))
            .map(|((input, turn_id), id)| Turn {
                memory_id: *id,
                tenant: tenant.clone(),
                conversation_id: conversation.to_string(),
                turn_id,
                position: Turn::UNSEQUENCED,
                user: input.user,
                assistant: input.assistant.unwrap_or_default(),
                user_speaker: input.user_speaker,
                assistant_speaker: input.assistant_speaker,
                timestamp: input.timestamp,
                recorded_at: now,
                metadata: input.metadata,
                user_id: input.user_id,
                agent_id: input.agent_id,
                version: 1,
                first_recorded_at: None,
                expired_at: None,
            })
            .collect();
        let count = turns.len();
        self.publish(turns, trace_id).await?;
        TurnsAccepted { count }.emit();
        if req.wait.unwrap_or(false) {
            self.wait_stored(tenant, &ids).await?;
        }
        Ok(StoreResponse { memory_ids: ids })
    }

    /// The id each input is stored under: [`MemoryId::of_turn`], unless the graph already
    /// holds the turn under its hashed id (stored before ids were grouped by conversation),
    /// which a retry must land on again. Also 409 for a turn id that already holds a different
    /// turn in the graph (what this gateway can see: a conflicting turn still on Kafka is not
    /// caught here, and the later copy then replaces the earlier one in the stores), and the
    /// memories the request repeats an edited-away version of (retries with nothing to do).
    async fn resolve_ids(
        &self,
        tenant: &TenantId,
        conversation: &str,
        inputs: &[TurnInput],
        turn_ids: &[String],
    ) -> Result<(Vec<MemoryId>, std::collections::HashSet<MemoryId>), RecollectError> {
        let mut ids: Vec<MemoryId> = turn_ids
            .iter()
            .map(|t| MemoryId::of_turn(tenant, conversation, t))
            .collect();
        let mut superseded = std::collections::HashSet::new();
        let Some(graph) = &self.graph else {
            return Ok((ids, superseded));
        };
        if inputs.is_empty() {
            return Ok((ids, superseded));
        }
        let forms: Vec<(usize, MemoryId)> = turn_ids
            .iter()
            .enumerate()
            .flat_map(|(i, t)| MemoryId::forms_of_turn(tenant, conversation, t).map(|id| (i, id)))
            .collect();
        let lookup: Vec<MemoryId> = forms.iter().map(|(_, id)| *id).collect();
        let input_of: std::collections::HashMap<MemoryId, usize> =
            forms.iter().map(|&(i, id)| (id, i)).collect();
        let stored = graph
            .turns(tenant, &lookup)
            .await
            .map_err(RecollectError::from_classified)?;
        for rec in stored {
            let id = rec.turn.memory_id;
            let Some(&i) = input_of.get(&id) else {
                continue;
            };
            ids[i] = id;
            // A retry of the store that made any version (an edit may have followed). A turn
            // without a turn id is named by its content, so only a named one can conflict.
            if inputs[i].turn_id.is_some()
                && !rec.versions().iter().any(|v| v.same_content(&inputs[i]))
            {
                return Err(RecollectError::Conflict(rec.turn.conflict_message(i)));
            }
            if rec.turn.is_edit() {
                superseded.insert(rec.turn.memory_id);
            }
        }
        Ok((ids, superseded))
    }

    async fn publish(&self, turns: Vec<Turn>, trace_id: &str) -> Result<(), RecollectError> {
        if turns.is_empty() {
            return Ok(());
        }
        let msgs = turns
            .into_iter()
            .map(|t| {
                Message::json(
                    topics::RAW,
                    bus_key(&t.tenant, &t.conversation_id),
                    Envelope::new(trace_id, t),
                    trace_id,
                )
            })
            .collect();
        self.bus
            .publish(msgs)
            .await
            .map_err(RecollectError::from_classified)
    }

    /// Blocks until none of `ids` is pending, or the wait timeout passes (then 503: the turns are
    /// stored and will become recallable; the client need not resend).
    pub async fn wait_stored(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
    ) -> Result<(), RecollectError> {
        let deadline = tokio::time::Instant::now() + self.limits.wait_timeout;
        let Some(raw) = self.raw.clone() else {
            return self.wait_in_graph(tenant, ids, deadline).await;
        };
        loop {
            let notified = self.stored.notified();
            let raw = raw.clone();
            let ids2 = ids.to_vec();
            let pending = tokio::task::spawn_blocking(
                move || -> Result<bool, recollect_storage::StoreError> {
                    for id in ids2 {
                        if raw.is_pending(id)? {
                            return Ok(true);
                        }
                    }
                    Ok(false)
                },
            )
            .await
            .map_err(RecollectError::internal)?
            .map_err(RecollectError::from_classified)?;
            if !pending {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(RecollectError::Unavailable(
                    "turns are stored but enrichment did not finish within the wait timeout".into(),
                ));
            }
        }
    }

    /// Distributed `wait`: polls the graph until every turn is there (the graph-writer stored it).
    async fn wait_in_graph(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
        deadline: tokio::time::Instant,
    ) -> Result<(), RecollectError> {
        let graph = self
            .graph
            .as_ref()
            .expect("distributed gateway has a graph");
        loop {
            let found = graph
                .turns(tenant, ids)
                .await
                .map_err(RecollectError::from_classified)?;
            if found.len() >= ids.len() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(RecollectError::Unavailable(
                    "turns are stored but enrichment did not finish within the wait timeout".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Edits one memory of `tenant` (`PATCH /v1/memories/{id}`): a new version, the current one
    /// kept in its history (expired, its graph links expired rather than deleted). Returns the
    /// version now current; an edit that changes nothing returns the current one unchanged.
    /// NotFound for an unknown, erased or other tenant's memory (distributed: also one whose
    /// first version is still on its way to the graph).
    pub async fn edit(
        &self,
        tenant: &TenantId,
        id: &str,
        patch: TurnPatch,
        trace_id: &str,
    ) -> Result<Turn, RecollectError> {
        let Some(mid) = MemoryId::parse(id) else {
            return Err(RecollectError::invalid(format!(
                "memory id {id:?} is not a memory id (a UUID)"
            )));
        };
        request::validate_patch(&patch, self.limits.max_text_bytes).map_err(rejected)?;
        let not_found = || RecollectError::NotFound(format!("memory {id} not found"));
        let (turn, new) = match self.raw.clone() {
            Some(raw) => {
                let t = tenant.clone();
                let p = patch.clone();
                let _writing = self.writing().await;
                let edited = tokio::task::spawn_blocking(move || raw.edit(&t, mid, &p))
                    .await
                    .map_err(RecollectError::internal)?
                    .map_err(RecollectError::from_classified)?
                    .ok_or_else(not_found)?;
                (edited.turn, edited.new)
            }
            None => {
                let graph = self
                    .graph
                    .as_ref()
                    .expect("distributed gateway has a graph");
                let current = graph_turn(graph.as_ref(), tenant, mid)
                    .await?
                    .ok_or_else(not_found)?;
                match patch.apply(&current, recollect_model::now_micros()) {
                    Some(next) => (next, true),
                    None => (current, false),
                }
            }
        };
        if new {
            self.publish(vec![turn.clone()], trace_id).await?;
            TurnsAccepted { count: 1 }.emit();
        }
        if patch.wait.unwrap_or(false) {
            let deadline = tokio::time::Instant::now() + self.limits.wait_timeout;
            match &self.raw {
                Some(_) => self.wait_stored(tenant, &[mid]).await?,
                None => self.wait_for_version(tenant, &turn, deadline).await?,
            }
        }
        Ok(turn)
    }

    /// Distributed edit `wait`: polls the graph until it holds the version (or a later one).
    async fn wait_for_version(
        &self,
        tenant: &TenantId,
        turn: &Turn,
        deadline: tokio::time::Instant,
    ) -> Result<(), RecollectError> {
        let graph = self
            .graph
            .as_ref()
            .expect("distributed gateway has a graph");
        loop {
            let stored = graph_turn(graph.as_ref(), tenant, turn.memory_id).await?;
            if stored.is_some_and(|t| t.recorded_at >= turn.recorded_at) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(RecollectError::Unavailable(
                    "the edit is stored but enrichment did not finish within the wait timeout"
                        .into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Derives every turn of `tenant` again (`POST /v1/reindex`, `recollect reindex`): after an
    /// extractor, rule or model change, through the same workers as a store. Recall goes on
    /// meanwhile from what is there; each re-enriched turn replaces its own links and points,
    /// and each conversation is consolidated again. Embedded, from the raw store: every turn is
    /// marked pending first, durably, so a kill part-way resumes at the next start. Distributed,
    /// from the graph's copy of each turn (Kafka's retention may have dropped the log):
    /// re-publishing is idempotent, so a reindex cut short is simply run again.
    pub async fn reindex(
        &self,
        tenant: &TenantId,
        trace_id: &str,
    ) -> Result<Reindexing, RecollectError> {
        let classified = RecollectError::from_classified;
        let graph = self.graph.clone().ok_or_else(|| {
            RecollectError::internal("this gateway has no graph to reindex".to_string())
        })?;
        if let Some(raw) = self.raw.clone() {
            let t = tenant.clone();
            let writing = self.writing().await;
            let (turns, conversations) = tokio::task::spawn_blocking(move || {
                Ok::<_, recollect_storage::StoreError>((
                    raw.mark_pending(&t)?,
                    raw.conversations(&t)?,
                ))
            })
            .await
            .map_err(RecollectError::internal)?
            .map_err(classified)?;
            for c in &conversations {
                graph
                    .restart_derivation(tenant, c)
                    .await
                    .map_err(classified)?;
            }
            drop(writing);
            self.replay_pending().await?;
            return Ok(Reindexing {
                conversations: conversations.len() as u64,
                turns,
            });
        }
        let conversations = graph.conversations(tenant).await.map_err(classified)?;
        let mut turns = 0;
        for c in &conversations {
            graph
                .restart_derivation(tenant, c)
                .await
                .map_err(classified)?;
            let records = graph
                .conversation_turns(tenant, c, 0, u64::MAX)
                .await
                .map_err(classified)?;
            let all: Vec<Turn> = records.into_iter().map(|r| r.turn).collect();
            for chunk in all.chunks(256) {
                self.publish(chunk.to_vec(), trace_id).await?;
            }
            turns += all.len() as u64;
        }
        Ok(Reindexing {
            conversations: conversations.len() as u64,
            turns,
        })
    }

    /// Re-publishes every turn whose enrichment had not finished (after a crash or restart).
    pub async fn replay_pending(&self) -> Result<usize, RecollectError> {
        let Some(raw) = self.raw.clone() else {
            return Ok(0);
        };
        let pending = tokio::task::spawn_blocking(move || raw.pending())
            .await
            .map_err(RecollectError::internal)?
            .map_err(RecollectError::from_classified)?;
        for chunk in pending.chunks(256) {
            self.publish(chunk.to_vec(), "replay").await?;
        }
        if !pending.is_empty() {
            tracing::info!(turns = pending.len(), "replayed unfinished turns");
        }
        Ok(pending.len())
    }
}

/// A turn id from the turn's content, for clients that send none to a distributed gateway.
fn content_id(t: &TurnInput) -> String {
    let mut h = blake3::Hasher::new();
    for part in [
        t.timestamp.to_rfc3339().as_str(),
        t.user.as_str(),
        t.assistant.as_deref().unwrap_or(""),
        t.user_speaker.as_deref().unwrap_or(""),
        t.assistant_speaker.as_deref().unwrap_or(""),
    ] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    format!("c-{}", &h.finalize().to_hex()[..24])
}

/// Erasure in a distributed deployment: the marker, then vectors, then the graph (which holds
/// the raw turns). Turns still on Kafka are dropped by every stage on the marker.
pub struct StoreEraser {
    pub graph: Arc<dyn Graph>,
    pub vectors: Arc<dyn recollect_storage::VectorIndex>,
}

impl StoreEraser {
    /// Records the conversation's marker (durable before anything is deleted or answered;
    /// recorded for an id with nothing stored yet as well, since its turns may all still be in
    /// flight: the answer is then 404, and the turns in flight are dropped all the same), then
    /// erases it. None when the graph never held it (`known`: a tenant erasure found it). The
    /// count is of the turns held when the marker was recorded (`held`: the tenant marker's
    /// count, for a tenant erasure), whoever removes them: this delete, or a graph writer that
    /// meets the marker first and purges them.
    async fn erase_marked(
        &self,
        tenant: &TenantId,
        conversation: &str,
        held: u64,
        known: bool,
    ) -> Result<Option<u64>, RecollectError> {
        let covered = self
            .graph
            .record_erasure(tenant, Some(conversation), chrono::Utc::now())
            .await
            .map_err(RecollectError::from_classified)?;
        if !known && covered.is_empty() && held == 0 {
            return Ok(None);
        }
        let held = covered.iter().map(|(_, n)| *n).sum::<u64>().max(held);
        self.vectors
            .delete_conversation(tenant, conversation)
            .await
            .map_err(RecollectError::from_classified)?;
        let n = self
            .graph
            .delete_conversation(tenant, conversation)
            .await
            .map_err(RecollectError::from_classified)?;
        // A turn its writer stored after the marker (it had not met it yet) is this delete's.
        Ok(Some(n.max(held)))
    }
}

#[async_trait::async_trait]
impl Eraser for StoreEraser {
    async fn erase_conversation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<Option<u64>, RecollectError> {
        self.erase_marked(tenant, conversation, 0, false).await
    }

    async fn erase_memory(
        &self,
        tenant: &TenantId,
        id: MemoryId,
    ) -> Result<Option<Turn>, RecollectError> {
        // Distributed, the graph holds the raw turns the query service can see; a turn still
        // on Kafka is not found yet (store with "wait" to delete right after storing).
        let Some(turn) = graph_turn(self.graph.as_ref(), tenant, id).await? else {
            return Ok(None);
        };
        erase_turn_in_stores(self.graph.as_ref(), self.vectors.as_ref(), tenant, &turn).await?;
        Ok(Some(turn))
    }

    async fn erase_tenant(&self, tenant: &TenantId) -> Result<(u64, u64), RecollectError> {
        // The tenant's marker counts each conversation's turns as it is recorded.
        let mut held: std::collections::BTreeMap<String, u64> = self
            .graph
            .record_erasure(tenant, None, chrono::Utc::now())
            .await
            .map_err(RecollectError::from_classified)?
            .into_iter()
            .collect();
        // And the conversations first stored since (their turns recorded before the marker).
        for c in self
            .graph
            .conversations(tenant)
            .await
            .map_err(RecollectError::from_classified)?
        {
            held.entry(c).or_insert(0);
        }
        let (mut conversations, mut turns) = (0, 0);
        for (c, n) in &held {
            if let Some(erased) = self.erase_marked(tenant, c, *n, true).await? {
                conversations += 1;
                turns += erased;
            }
        }
        Ok((conversations, turns))
    }
}

/// HTTP routes of the store path.
pub mod http {
    use std::sync::Arc;

    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::routing::{delete, post};
    use axum::Router;
    use recollect_api::{ApiError, Auth, HasAuth, Json, PathParam, Tenant};
    use recollect_model::RecollectError;
    use serde::Serialize;

    use super::{Erased, Eraser, Gateway, MemoryErased, StoreRequest, StoreResponse};

    #[derive(Clone)]
    pub struct GatewayState {
        pub gateway: Arc<Gateway>,
        pub eraser: Arc<dyn Eraser>,
        pub auth: Auth,
        /// Embedded: the backup of the data directory; None where there is none (distributed).
        pub backup: Option<Arc<dyn super::Backup>>,
        /// Bearer key of the operator endpoints; empty: they are off.
        pub admin_key: String,
    }

    impl HasAuth for GatewayState {
        fn auth(&self) -> &Auth {
            &self.auth
        }
    }

    /// Store a batch of turns of one conversation.
    #[utoipa::path(
        post,
        path = "/v1/conversations/{id}/turns",
        tag = "store",
        params(("id" = String, Path, description = "conversation id: 1 to 128 of letters, digits, _ - . : @")),
        request_body = StoreRequest,
        responses(
            (status = 202, description = "stored durably (with wait: also recallable)", body = StoreResponse),
            (status = 400, description = "bad input; names the field; nothing stored", body = recollect_api::ErrorBody),
            (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
            (status = 409, description = "a turn_id already holds a different turn; nothing stored", body = recollect_api::ErrorBody),
            (status = 503, description = "stored, but enrichment did not finish within the wait timeout", body = recollect_api::ErrorBody),
        ),
        security((), ("bearer" = []))
    )]
    #[tracing::instrument(
        name = "http.store_turns",
        skip_all,
        fields(tenant = %tenant, conversation = %conversation, trace_id = tracing::field::Empty)
    )]
    pub async fn store_turns(
        State(s): State<GatewayState>,
        Tenant(tenant): Tenant,
        PathParam(conversation): PathParam,
        Json(req): Json<StoreRequest>,
    ) -> Result<(StatusCode, axum::Json<StoreResponse>), ApiError> {
        let trace_id = uuid::Uuid::new_v4().to_string();
        tracing::Span::current().record("trace_id", trace_id.as_str());
        tracing::debug!(trace_id, turns = req.turns.len(), "store request");
        let r = s
            .gateway
            .store(&tenant, &conversation, req, &trace_id)
            .await?;
        Ok((StatusCode::ACCEPTED, axum::Json(r)))
    }

    #[derive(Serialize, utoipa::ToSchema)]
    pub struct TenantErased {
        pub conversations_erased: u64,
        pub turns_erased: u64,
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct TenantEraseParams {
        /// Must repeat the caller's tenant name: a tenant-wide erase is never an accident.
        pub confirm: Option<String>,
    }

    /// Erases every conversation of the caller's tenant (the tenant comes from the credential;
    /// `?confirm=` must name it).
    #[utoipa::path(
        delete,
        path = "/v1/tenant",
        tag = "store",
        params(("confirm" = String, Query, description = "the caller's tenant name, repeated")),
        responses(
            (status = 200, description = "erased", body = TenantErased),
            (status = 400, description = "confirm missing or not the caller's tenant", body = recollect_api::ErrorBody),
            (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
        ),
        security((), ("bearer" = []))
    )]
    #[tracing::instrument(name = "http.delete_tenant", skip_all, fields(tenant = %tenant))]
    pub async fn delete_tenant(
        State(s): State<GatewayState>,
        Tenant(tenant): Tenant,
        params: Result<
            axum::extract::Query<TenantEraseParams>,
            axum::extract::rejection::QueryRejection,
        >,
    ) -> Result<axum::Json<TenantErased>, ApiError> {
        let params = params
            .map_err(|e| {
                RecollectError::invalid(format!("invalid query string: {}", e.body_text()))
            })?
            .0;
        if params.confirm.as_deref() != Some(tenant.as_str()) {
            return Err(RecollectError::invalid(
                "erasing a whole tenant needs ?confirm=<your tenant name>".to_string(),
            )
            .into());
        }
        let (conversations_erased, turns_erased) = s.eraser.erase_tenant(&tenant).await?;
        Ok(axum::Json(TenantErased {
            conversations_erased,
            turns_erased,
        }))
    }

    /// Erase a conversation from the raw store, graph and vectors.
    #[utoipa::path(
        delete,
        path = "/v1/conversations/{id}",
        tag = "store",
        params(("id" = String, Path, description = "conversation id")),
        responses(
            (status = 200, description = "erased", body = Erased),
            (status = 400, description = "bad conversation id", body = recollect_api::ErrorBody),
            (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
            (status = 404, description = "no such conversation for this tenant", body = recollect_api::ErrorBody),
        ),
        security((), ("bearer" = []))
    )]
    #[tracing::instrument(
        name = "http.delete_conversation",
        skip_all,
        fields(tenant = %tenant, conversation = %conversation)
    )]
    pub async fn delete_conversation(
        State(s): State<GatewayState>,
        Tenant(tenant): Tenant,
        PathParam(conversation): PathParam,
    ) -> Result<axum::Json<Erased>, ApiError> {
        Ok(axum::Json(
            super::delete_conversation(s.eraser.as_ref(), &tenant, &conversation).await?,
        ))
    }

    /// Erases one memory (turn) from every store; the rest of its conversation stays.
    #[utoipa::path(
        delete,
        path = "/v1/memories/{id}",
        tag = "store",
        params(("id" = String, Path, description = "memory id (a UUID)")),
        responses(
            (status = 200, description = "erased from raw store, graph and vectors", body = MemoryErased),
            (status = 400, description = "not a memory id", body = recollect_api::ErrorBody),
            (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
            (status = 404, description = "no such memory for this tenant (or already erased)", body = recollect_api::ErrorBody),
        ),
        security((), ("bearer" = []))
    )]
    #[tracing::instrument(name = "http.delete_memory", skip_all, fields(tenant = %tenant, memory = %id))]
    pub async fn delete_memory(
        State(s): State<GatewayState>,
        Tenant(tenant): Tenant,
        PathParam(id): PathParam,
    ) -> Result<axum::Json<MemoryErased>, ApiError> {
        let r = super::delete_memory(s.eraser.as_ref(), &tenant, &id).await?;
        tracing::info!(conversation = %r.conversation_id, "memory erased");
        Ok(axum::Json(r))
    }

    /// Edits one memory: a new version, the current one kept in its history (expired, its
    /// graph links expired rather than deleted). Recall returns the new version once enriched;
    /// recall and get with `as_of` still see the old one at earlier times.
    #[utoipa::path(
        patch,
        path = "/v1/memories/{id}",
        tag = "store",
        params(("id" = String, Path, description = "memory id (a UUID)")),
        request_body = recollect_model::TurnPatch,
        responses(
            (status = 202, description = "the version now current, stored durably (with wait: also recallable); an edit that changes nothing returns the current version", body = recollect_model::Turn),
            (status = 400, description = "bad input; names the field; nothing changed", body = recollect_api::ErrorBody),
            (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
            (status = 404, description = "no such memory for this tenant (or erased)", body = recollect_api::ErrorBody),
            (status = 503, description = "stored, but enrichment did not finish within the wait timeout", body = recollect_api::ErrorBody),
        ),
        security((), ("bearer" = []))
    )]
    #[tracing::instrument(
        name = "http.edit_memory",
        skip_all,
        fields(tenant = %tenant, memory = %id, trace_id = tracing::field::Empty)
    )]
    pub async fn edit_memory(
        State(s): State<GatewayState>,
        Tenant(tenant): Tenant,
        PathParam(id): PathParam,
        Json(patch): Json<recollect_model::TurnPatch>,
    ) -> Result<(StatusCode, axum::Json<recollect_model::Turn>), ApiError> {
        let trace_id = uuid::Uuid::new_v4().to_string();
        tracing::Span::current().record("trace_id", trace_id.as_str());
        let turn = s.gateway.edit(&tenant, &id, patch, &trace_id).await?;
        tracing::info!(trace_id, version = turn.version, "memory edited");
        Ok((StatusCode::ACCEPTED, axum::Json(turn)))
    }

    /// Derives every turn of the caller's tenant again (after an extractor, rule or model
    /// change); recall goes on meanwhile. Answers once the work is queued.
    #[utoipa::path(
        post,
        path = "/v1/reindex",
        tag = "store",
        responses(
            (status = 202, description = "queued: the turns go through the workers again", body = super::Reindexing),
            (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
        ),
        security((), ("bearer" = []))
    )]
    #[tracing::instrument(
        name = "http.reindex",
        skip_all,
        fields(tenant = %tenant, trace_id = tracing::field::Empty)
    )]
    pub async fn reindex(
        State(s): State<GatewayState>,
        Tenant(tenant): Tenant,
    ) -> Result<(StatusCode, axum::Json<super::Reindexing>), ApiError> {
        let trace_id = uuid::Uuid::new_v4().to_string();
        tracing::Span::current().record("trace_id", trace_id.as_str());
        let r = s.gateway.reindex(&tenant, &trace_id).await?;
        tracing::info!(
            trace_id,
            conversations = r.conversations,
            turns = r.turns,
            "reindex queued"
        );
        Ok((StatusCode::ACCEPTED, axum::Json(r)))
    }

    /// A consistent copy of the server's data directory, written on the server's machine while
    /// it runs: writes wait for the copy (recall does not), and the copy opens as a data
    /// directory of its own (`recollect restore`). An operator endpoint: the bearer key is
    /// `server.admin_key`, not a tenant's; off while that is empty.
    #[utoipa::path(
        post,
        path = "/v1/admin/backup",
        tag = "operations",
        request_body = super::BackupRequest,
        responses(
            (status = 200, description = "copied", body = super::BackupDone),
            (status = 400, description = "bad path (relative, or a non-empty directory), nothing written; or no data directory here (distributed)", body = recollect_api::ErrorBody),
            (status = 401, description = "not the admin key", body = recollect_api::ErrorBody),
            (status = 404, description = "operator endpoints are off (server.admin_key is empty)", body = recollect_api::ErrorBody),
        ),
        security(("bearer" = []))
    )]
    #[tracing::instrument(name = "http.backup", skip_all)]
    pub async fn backup(
        State(s): State<GatewayState>,
        headers: axum::http::HeaderMap,
        Json(req): Json<super::BackupRequest>,
    ) -> Result<axum::Json<super::BackupDone>, ApiError> {
        if s.admin_key.is_empty() {
            return Err(RecollectError::NotFound(
                "operator endpoints are off: set server.admin_key (RECOLLECT__SERVER__ADMIN_KEY)"
                    .into(),
            )
            .into());
        }
        let given = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        // No early exit on the first differing byte.
        let same = given.len() == s.admin_key.len()
            && given
                .bytes()
                .zip(s.admin_key.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same {
            return Err(RecollectError::Unauthenticated(
                "the admin key is required (Authorization: Bearer <server.admin_key>)".into(),
            )
            .into());
        }
        let Some(b) = &s.backup else {
            return Err(RecollectError::invalid(
                "no data directory here: a distributed deployment is backed up with Kafka's, \
                 Neo4j's and Qdrant's own tools (docs/OPERATIONS.md#backup)"
                    .to_string(),
            )
            .into());
        };
        let done = b.backup(std::path::Path::new(&req.path)).await?;
        tracing::info!(path = %done.path, bytes = done.bytes, paused_ms = done.paused_ms, "backup written");
        Ok(axum::Json(done))
    }

    pub fn router(state: GatewayState) -> Router {
        Router::new()
            .route("/v1/conversations/{id}/turns", post(store_turns))
            .route(
                "/v1/memories/{id}",
                delete(delete_memory).patch(edit_memory),
            )
            .route("/v1/conversations/{id}", delete(delete_conversation))
            .route("/v1/tenant", delete(delete_tenant))
            .route("/v1/reindex", post(reindex))
            .with_state(state)
    }

    /// The OpenAPI paths of the store path.
    #[derive(utoipa::OpenApi)]
    #[openapi(paths(
        store_turns,
        delete_conversation,
        delete_memory,
        edit_memory,
        delete_tenant,
        reindex,
        backup
    ))]
    pub struct GatewayApi;

    /// The gateway as the shared serving layer (HTTP, gRPC) calls it.
    #[async_trait::async_trait]
    impl recollect_serve::StoreRole for GatewayState {
        fn router(&self) -> Router {
            router(self.clone())
        }

        fn openapi(&self) -> utoipa::openapi::OpenApi {
            <GatewayApi as utoipa::OpenApi>::openapi()
        }

        fn operator_router(&self) -> Option<Router> {
            Some(
                Router::new()
                    .route("/v1/admin/backup", post(backup))
                    .with_state(self.clone()),
            )
        }

        async fn store(
            &self,
            tenant: &recollect_model::TenantId,
            conversation: &str,
            req: StoreRequest,
            trace_id: &str,
        ) -> Result<Vec<recollect_model::MemoryId>, RecollectError> {
            Ok(self
                .gateway
                .store(tenant, conversation, req, trace_id)
                .await?
                .memory_ids)
        }

        async fn wait_stored(
            &self,
            tenant: &recollect_model::TenantId,
            ids: &[recollect_model::MemoryId],
        ) -> Result<(), RecollectError> {
            self.gateway.wait_stored(tenant, ids).await
        }

        async fn delete_conversation(
            &self,
            tenant: &recollect_model::TenantId,
            conversation: &str,
        ) -> Result<u64, RecollectError> {
            Ok(
                super::delete_conversation(self.eraser.as_ref(), tenant, conversation)
                    .await?
                    .turns_erased,
            )
        }

        async fn delete_memory(
            &self,
            tenant: &recollect_model::TenantId,
            id: &str,
        ) -> Result<(String, String), RecollectError> {
            let r = super::delete_memory(self.eraser.as_ref(), tenant, id).await?;
            Ok((r.conversation_id, r.turn_id))
        }

        async fn reindex(
            &self,
            tenant: &recollect_model::TenantId,
            trace_id: &str,
        ) -> Result<(u64, u64), RecollectError> {
            let r = self.gateway.reindex(tenant, trace_id).await?;
            Ok((r.conversations, r.turns))
        }

        async fn edit_memory(
            &self,
            tenant: &recollect_model::TenantId,
            id: &str,
            patch: recollect_model::TurnPatch,
            trace_id: &str,
        ) -> Result<recollect_model::Turn, RecollectError> {
            self.gateway.edit(tenant, id, patch, trace_id).await
        }
    }
}

/// Erasure of a conversation from every store (raw turns, graph, vectors).
#[async_trait::async_trait]
pub trait Eraser: Send + Sync {
    /// None when the conversation does not exist for this tenant.
    async fn erase_conversation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<Option<u64>, RecollectError>;

    /// Erases every conversation of `tenant`: (conversations, turns) erased.
    async fn erase_tenant(&self, tenant: &TenantId) -> Result<(u64, u64), RecollectError>;

    /// Erases one turn of `tenant` from every store; the turn erased, None when the tenant has
    /// no such memory.
    async fn erase_memory(
        &self,
        tenant: &TenantId,
        id: MemoryId,
    ) -> Result<Option<Turn>, RecollectError>;
}

#[cfg(test)]
mod tests {
    use recollect_bus::InProcessBus;
    use recollect_model::Extraction;
    use recollect_storage::EmbeddedGraph;

    use super::*;

    fn input(turn_id: &str, user: &str) -> TurnInput {
        serde_json::from_value(serde_json::json!({
            "turn_id": turn_id,
            "user": user,
            "timestamp": "2024-01-01T10:00:00Z",
        }))
        .unwrap()
    }

    /// A distributed gateway over a graph that holds a turn under its hashed id (stored before
    /// ids were grouped by conversation): a retry lands on that id, a changed turn under the
    /// same turn id is refused, and a new turn gets the grouped form.
    #[tokio::test]
    async fn a_retry_of_a_turn_stored_under_its_hashed_id_lands_on_it() {
        let dir = tempfile::tempdir().unwrap();
        let graph = Arc::new(EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap());
        let tenant = TenantId("t".into());
        let old = input("a", "one");
        let hashed = MemoryId::derive(&tenant, "c", "a");
        // As the build before stored it: position 0, the hashed id.
        let turn: Turn = serde_json::from_value(serde_json::json!({
            "memory_id": hashed,
            "tenant": "t",
            "conversation_id": "c",
            "turn_id": "a",
            "position": 0,
            "user": old.user,
            "timestamp": old.timestamp,
            "recorded_at": "2024-01-02T00:00:00Z",
        }))
        .unwrap();
        graph
            .write_turns(&[(turn, Extraction::default())])
            .await
            .unwrap();
        let gateway = Gateway::distributed(InProcessBus::new(64), graph, Limits::default());
        let store = |turns: Vec<TurnInput>| {
            gateway.store(
                &tenant,
                "c",
                StoreRequest {
                    turns,
                    wait: Some(false),
                },
                "test",
            )
        };
        let r = store(vec![input("a", "one"), input("b", "two")])
            .await
            .unwrap();
        assert_eq!(
            r.memory_ids,
            vec![hashed, MemoryId::of_turn(&tenant, "c", "b")]
        );
        let e = store(vec![input("a", "changed")]).await.unwrap_err();
        assert!(matches!(e, RecollectError::Conflict(_)), "{e}");
    }
}
