//! The `Graph` seam (KeyMem's graph, Zep's bi-temporal edges). Turns are nodes; Keyword, Entity,
//! Location, TimePoint, Reference and Fragment nodes hang off them by typed edges; every edge
//! carries event time (`valid_from`/`valid_to`) and record time (`recorded_at`/`expired_at`).
//! Nothing is deleted or merged automatically; only an erasure removes data.

#[cfg(feature = "embedded")]
pub mod embedded;
#[cfg(feature = "neo4j")]
pub mod neo4j;
#[cfg(feature = "embedded")]
mod postings;
#[cfg(feature = "remote")]
pub mod remote;

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use recollect_model::{Extraction, Fragment, MemoryId, TenantId, Turn, TurnFilter};
use serde::{Deserialize, Serialize};

use crate::StoreError;

/// Structural node kinds a turn links to; the edge type follows from the kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeKind {
    /// HAS_KEYWORD, merged on the stemmed key
    Keyword,
    /// INVOLVES, merged on the lower-cased name
    Entity,
    /// AT_LOCATION
    Location,
    /// AT_TIME, merged on the ISO 8601 key
    TimePoint,
    /// HAS_REFERENCE, named `mention→resolved`
    Reference,
}

impl NodeKind {
    pub const ALL: [NodeKind; 5] = [
        NodeKind::Keyword,
        NodeKind::Entity,
        NodeKind::Location,
        NodeKind::TimePoint,
        NodeKind::Reference,
    ];

    pub fn tag(&self) -> u8 {
        match self {
            NodeKind::Keyword => b'k',
            NodeKind::Entity => b'e',
            NodeKind::Location => b'l',
            NodeKind::TimePoint => b't',
            NodeKind::Reference => b'r',
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            NodeKind::Keyword => "Keyword",
            NodeKind::Entity => "Entity",
            NodeKind::Location => "Location",
            NodeKind::TimePoint => "TimePoint",
            NodeKind::Reference => "Reference",
        }
    }

    pub fn edge(&self) -> &'static str {
        match self {
            NodeKind::Keyword => "HAS_KEYWORD",
            NodeKind::Entity => "INVOLVES",
            NodeKind::Location => "AT_LOCATION",
            NodeKind::TimePoint => "AT_TIME",
            NodeKind::Reference => "HAS_REFERENCE",
        }
    }

    /// The node names a turn's extraction links to, normalised as nodes are merged.
    pub fn names(&self, x: &Extraction) -> Vec<String> {
        let mut v: Vec<String> = match self {
            NodeKind::Keyword => x.keywords.iter().map(|k| k.key.clone()).collect(),
            NodeKind::Entity => x.entities.iter().map(|e| e.to_lowercase()).collect(),
            NodeKind::Location => x.locations.iter().map(|e| e.to_lowercase()).collect(),
            NodeKind::TimePoint => x.times.iter().map(|t| t.key()).collect(),
            NodeKind::Reference => x
                .references
                .iter()
                .map(|r| format!("{}→{}", r.mention.to_lowercase(), r.resolved))
                .collect(),
        };
        v.retain(|s| !s.is_empty());
        v.sort();
        v.dedup();
        v
    }
}

/// Bi-temporal stamps of an edge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeTimes {
    /// When the fact held in the world (the turn's event time).
    pub valid_from: DateTime<Utc>,
    pub valid_to: Option<DateTime<Utc>>,
    /// When Recollect recorded it.
    pub recorded_at: DateTime<Utc>,
    pub expired_at: Option<DateTime<Utc>>,
}

impl EdgeTimes {
    /// Whether the edge was recorded by `recorded_by` and not yet expired then, and held at `valid_at`.
    pub fn visible(
        &self,
        recorded_by: Option<DateTime<Utc>>,
        valid_at: Option<DateTime<Utc>>,
    ) -> bool {
        if let Some(r) = recorded_by {
            if self.recorded_at > r || self.expired_at.is_some_and(|e| e <= r) {
                return false;
            }
        } else if self.expired_at.is_some() {
            return false;
        }
        if let Some(v) = valid_at {
            if self.valid_from > v || self.valid_to.is_some_and(|e| e <= v) {
                return false;
            }
        }
        true
    }
}

/// A turn as the graph holds it: the raw turn (its current version), its extraction, its
/// fragments, and the versions edits replaced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    pub turn: Turn,
    pub extraction: Extraction,
    pub fragments: Vec<String>,
    /// Earlier versions, oldest first, each with `expired_at` set (`PATCH /v1/memories/{id}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<TurnVersion>,
    /// Derived before its conversation's derivation was restarted (a reindex) and not written
    /// again since: its extraction and points are the old ones, so consolidation waits for it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rederiving: bool,
}

/// A superseded version of a turn and what was extracted from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnVersion {
    pub turn: Turn,
    pub extraction: Extraction,
}

impl TurnRecord {
    /// The record as Recollect held it at transaction time `at` (that version's text and
    /// extraction); None when the memory was not recorded yet.
    pub fn as_of(&self, at: DateTime<Utc>) -> Option<TurnRecord> {
        if self.turn.current_at(at) {
            return Some(self.clone());
        }
        let v = self.history.iter().find(|v| v.turn.current_at(at))?;
        Some(TurnRecord {
            turn: v.turn.clone(),
            extraction: v.extraction.clone(),
            fragments: self.fragments.clone(),
            history: vec![],
            rederiving: self.rederiving,
        })
    }

    /// Every version, oldest first, the current one last.
    pub fn versions(&self) -> Vec<Turn> {
        let mut v: Vec<Turn> = self.history.iter().map(|h| h.turn.clone()).collect();
        v.push(self.turn.clone());
        v
    }

    /// How a write of `incoming` relates to this record: see [`VersionWrite`].
    pub fn version_write(&self, incoming: &Turn) -> VersionWrite {
        let stored = &self.turn;
        if !incoming.is_edit() {
            // A store (or its replay): rewrites the memory until an edit has replaced it; a
            // retried store never reverts an edit.
            return if stored.is_edit() {
                VersionWrite::Stale
            } else {
                VersionWrite::Rewrite
            };
        }
        match incoming.recorded_at.cmp(&stored.recorded_at) {
            std::cmp::Ordering::Equal => VersionWrite::Rewrite,
            std::cmp::Ordering::Greater => VersionWrite::Supersede,
            // An edit already superseded (a replay, or one that lost a race with a later edit).
            std::cmp::Ordering::Less => VersionWrite::Stale,
        }
    }

    /// Makes `incoming` (a later version) current; the current one joins the history, expired
    /// at `incoming.recorded_at`.
    /// Versions are numbered in the order they become current (two edits accepted at once by
    /// different gateways both get a number).
    pub fn supersede(&mut self, mut incoming: Turn, extraction: Extraction) {
        incoming.version = self.turn.version + 1;
        incoming.first_recorded_at = Some(self.turn.first_recorded());
        let mut old = std::mem::replace(&mut self.turn, incoming);
        old.expired_at = Some(self.turn.recorded_at);
        let old_x = std::mem::replace(&mut self.extraction, extraction);
        self.history.push(TurnVersion {
            turn: old,
            extraction: old_x,
        });
        self.rederiving = false;
    }
}

/// Takes out of a conversation's state what a turn erased on its own (any of its versions)
/// put there: its words kept for context, and its references.
pub fn forget_record(state: &mut ConversationState, rec: &TurnRecord) {
    state.forget_text(rec.turn.position);
    state.reference.forget(&rec.extraction);
    for v in &rec.history {
        state.reference.forget(&v.extraction);
    }
}

/// `names` once each, in the order first asked: a name asked twice is looked up once (an
/// UNWIND over the list would otherwise repeat its rows).
pub(crate) fn distinct(names: &[String]) -> Vec<String> {
    let mut seen = std::collections::HashSet::with_capacity(names.len());
    names
        .iter()
        .filter(|n| seen.insert(n.as_str()))
        .cloned()
        .collect()
}

/// `items` cut into runs of at most `max` in which no key repeats, in order: a batch that
/// holds a memory twice (a turn and its edit) is written run by run.
pub fn distinct_runs<T, K: Eq + std::hash::Hash>(
    items: &[T],
    max: usize,
    key: impl Fn(&T) -> K,
) -> Vec<&[T]> {
    let mut out = Vec::new();
    let (mut start, mut seen) = (0, std::collections::HashSet::new());
    for (i, item) in items.iter().enumerate() {
        if i - start >= max.max(1) || !seen.insert(key(item)) {
            out.push(&items[start..i]);
            start = i;
            seen.clear();
            seen.insert(key(item));
        }
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

/// What writing a turn does to the stored record of the same memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionWrite {
    /// A later edit: the stored version is kept as history, the links it loses expire.
    Supersede,
    /// The same version again (a replay, a re-derived extraction): replaces its own links.
    Rewrite,
    /// An older version, or a store of a memory an edit has replaced: left alone.
    Stale,
}

/// A turn reached from a structural node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkedTurn {
    pub name: String,
    pub memory_id: MemoryId,
    pub conversation_id: String,
}

/// Which conversations of a tenant a query may see (None: all of them), and which of their
/// turns ([`TurnFilter`]; empty: all). Structural nodes and keyword points belong to
/// conversations, so only turn-level searches apply the filter.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Scope {
    pub conversations: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "TurnFilter::is_empty")]
    pub filter: TurnFilter,
    /// Transaction time: search what was held then (turn versions current at that time)
    /// instead of what is held now. Applies to turn-level searches, like the filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of: Option<DateTime<Utc>>,
}

impl Scope {
    pub fn all() -> Self {
        Self::default()
    }
    pub fn of(conversations: &[&str]) -> Self {
        Self {
            conversations: Some(conversations.iter().map(|s| s.to_string()).collect()),
            ..Self::default()
        }
    }
    /// The same conversations without the turn filter (for conversation-level data).
    pub fn conversations_only(&self) -> Self {
        Self {
            conversations: self.conversations.clone(),
            ..Self::default()
        }
    }
}

// The per-conversation state the workers keep here belongs to the extractor's model.
pub use recollect_model::ConversationState;

/// Erasure markers of one tenant: when the tenant as a whole and each asked-for conversation were
/// last erased. Data recorded at or before its marker is erased data: no stage may write it
/// (back), however late its message arrives. Markers are never removed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Erasures {
    pub tenant: Option<DateTime<Utc>>,
    pub conversations: BTreeMap<String, DateTime<Utc>>,
    /// Single turns erased in the asked-for conversations (`DELETE /v1/memories/{id}`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub turns: BTreeMap<MemoryId, TurnErasure>,
}

/// The erasure of one turn: when, and the position it held, so that consolidation knows the gap
/// it leaves in its conversation is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnErasure {
    pub at: DateTime<Utc>,
    pub position: u64,
}

impl Erasures {
    /// The marker that applies to a conversation: the later of its own and the tenant's.
    pub fn marker(&self, conversation: &str) -> Option<DateTime<Utc>> {
        self.conversations
            .get(conversation)
            .copied()
            .max(self.tenant)
    }

    /// Whether data of `conversation` recorded at `recorded_at` was erased.
    pub fn covers(&self, conversation: &str, recorded_at: DateTime<Utc>) -> bool {
        self.marker(conversation).is_some_and(|m| recorded_at <= m)
    }

    /// Whether a turn was erased: with its conversation or tenant, or on its own. A turn stored
    /// again under the same id after its erasure is a new memory, not covered.
    /// Any version of a memory recorded before its erasure is covered: an edit never brings
    /// an erased memory back.
    pub fn covers_turn(&self, t: &Turn) -> bool {
        let first = t.first_recorded();
        self.covers(&t.conversation_id, first)
            || self.turns.get(&t.memory_id).is_some_and(|e| first <= e.at)
    }

    /// Positions in `from..to` whose turn was erased on its own (the asked-for conversation).
    pub fn erased_positions(&self, from: u64, to: u64) -> std::collections::BTreeSet<u64> {
        self.turns
            .values()
            .map(|e| e.position)
            .filter(|p| (from..to).contains(p))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.tenant.is_none() && self.conversations.is_empty() && self.turns.is_empty()
    }
}

/// Markers of the conversations a batch touches, across tenants: one `erasures` call per tenant.
#[derive(Debug, Clone, Default)]
pub struct ErasureMap(pub HashMap<TenantId, Erasures>);

impl ErasureMap {
    pub async fn read(
        graph: &dyn Graph,
        pairs: impl IntoIterator<Item = (TenantId, String)>,
    ) -> Result<Self, StoreError> {
        let mut by_tenant: HashMap<TenantId, Vec<String>> = HashMap::new();
        for (t, c) in pairs {
            let v = by_tenant.entry(t).or_default();
            if !v.contains(&c) {
                v.push(c);
            }
        }
        let mut out = HashMap::with_capacity(by_tenant.len());
        for (t, convs) in by_tenant {
            let e = graph.erasures(&t, &convs).await?;
            out.insert(t, e);
        }
        Ok(Self(out))
    }

    pub fn marker(&self, tenant: &TenantId, conversation: &str) -> Option<DateTime<Utc>> {
        self.0.get(tenant).and_then(|e| e.marker(conversation))
    }

    pub fn covers(
        &self,
        tenant: &TenantId,
        conversation: &str,
        recorded_at: DateTime<Utc>,
    ) -> bool {
        self.marker(tenant, conversation)
            .is_some_and(|m| recorded_at <= m)
    }

    /// Whether a turn was erased, with its conversation or tenant or on its own.
    pub fn covers_turn(&self, t: &Turn) -> bool {
        self.0.get(&t.tenant).is_some_and(|e| e.covers_turn(t))
    }
}

/// What recall reads: turns, the graph around them and fragments. The query service and the
/// recall steps need nothing else, so they take this half (as qdrant's `VectorStorageRead`).
#[async_trait]
pub trait GraphRead: Send + Sync + 'static {
    fn kind(&self) -> &'static str;

    /// Turns by id, tenant-checked; unknown ids are skipped.
    async fn turns(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
    ) -> Result<Vec<TurnRecord>, StoreError>;

    /// Turns of a conversation with `from <= position < to`, in order.
    async fn conversation_turns(
        &self,
        tenant: &TenantId,
        conversation: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<TurnRecord>, StoreError>;

    /// Conversation ids of a tenant that have stored turns.
    async fn conversations(&self, tenant: &TenantId) -> Result<Vec<String>, StoreError>;

    /// One page of [`GraphRead::conversations`]: up to `limit` ids greater than `after`, in
    /// code point order (Rust's `str` order; the contract checks it past ASCII). A listing reads
    /// a page, not the tenant's every conversation.
    async fn conversations_after(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError>;

    /// Which of `conversations` the tenant has turns in, once each, in the order asked: a
    /// recall checks its scope with this rather than [`GraphRead::conversations`], which a
    /// server graph answers by reading every turn of the tenant.
    async fn known_conversations(
        &self,
        tenant: &TenantId,
        conversations: &[String],
    ) -> Result<Vec<String>, StoreError>;

    /// Conversations of a tenant with a turn of one of `user_ids` and (when both are given) one
    /// of `agent_ids`, sorted; empty when neither is given. A superset is allowed (a
    /// conversation whose last turn of that user was erased): recall filters turns again.
    async fn conversations_of(
        &self,
        tenant: &TenantId,
        user_ids: &[String],
        agent_ids: &[String],
    ) -> Result<Vec<String>, StoreError>;

    /// Distinct node names of `kind` linked from turns in scope (for containment and range matching).
    async fn vocabulary(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        kind: NodeKind,
    ) -> Result<Vec<String>, StoreError>;

    /// Turns in scope linked to any of `names` (a name asked twice links its turns once), with
    /// edges visible as of the given times.
    async fn linked_turns(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        kind: NodeKind,
        names: &[String],
        recorded_by: Option<DateTime<Utc>>,
        valid_at: Option<DateTime<Utc>>,
    ) -> Result<Vec<LinkedTurn>, StoreError>;

    /// Number of turns in scope and, for each name, how many of them link to it (df).
    async fn document_frequencies(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        kind: NodeKind,
        names: &[String],
    ) -> Result<(u64, Vec<u64>), StoreError>;

    async fn fragments(
        &self,
        tenant: &TenantId,
        ids: &[String],
    ) -> Result<Vec<Fragment>, StoreError>;
}

/// The writes and the workers' per-conversation state, on top of the reads.
#[async_trait]
pub trait Graph: GraphRead {
    /// Writes Turn nodes with all their structural nodes and edges. Idempotent (MERGE semantics).
    /// Skips every turn an erasure marker covers (`recorded_at` ≤ marker), checked in the write.
    async fn write_turns(&self, turns: &[(Turn, Extraction)]) -> Result<(), StoreError>;

    /// Writes Fragment nodes and PART_OF edges. Idempotent on fragment id. In a conversation with
    /// an erasure marker, skips every fragment with a member that is gone or covered by it.
    async fn write_fragments(&self, fragments: &[Fragment]) -> Result<(), StoreError>;

    async fn conversation_state(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<ConversationState, StoreError>;

    /// Saves the state unless an erasure marker covers it ([`ConversationState::covered_by`]);
    /// false when refused. `consolidated_until` never moves backwards here (the caller's copy
    /// may predate the consolidator's latest advance).
    async fn save_conversation_state(
        &self,
        tenant: &TenantId,
        conversation: &str,
        state: &ConversationState,
    ) -> Result<bool, StoreError>;

    /// [`Graph::save_conversation_state`] for several conversations, one answer each. A graph
    /// that can should save them together: the extractor saves every conversation a batch
    /// advanced, and each separate save waits its turn behind the graph's other writers.
    async fn save_conversation_states(
        &self,
        states: Vec<(TenantId, String, ConversationState)>,
    ) -> Result<Vec<bool>, StoreError> {
        let mut saved = Vec::with_capacity(states.len());
        for (t, c, s) in &states {
            saved.push(self.save_conversation_state(t, c, s).await?);
        }
        Ok(saved)
    }

    /// Records, durably before returning, that a conversation (or, with None, the whole tenant)
    /// was erased at `at`. Keeps the later marker when one exists. Returns the conversations the
    /// marker covers that the graph held as it was recorded, each with its number of turns: an
    /// eraser's count, which a graph writer meeting the marker and purging first cannot shrink.
    async fn record_erasure(
        &self,
        tenant: &TenantId,
        conversation: Option<&str>,
        at: DateTime<Utc>,
    ) -> Result<Vec<(String, u64)>, StoreError>;

    /// Moves `consolidated_until` forward to `until` (never back) and touches nothing else. The
    /// consolidator uses this rather than saving the whole state: the extractor saves the other
    /// fields concurrently, and a stale whole-state write would roll its `next_position` back,
    /// giving two turns one position. Not guarded by erasure markers: the consolidator re-reads
    /// the markers afterwards and purges what a marker that appeared meanwhile covers.
    async fn advance_consolidated_until(
        &self,
        tenant: &TenantId,
        conversation: &str,
        until: u64,
    ) -> Result<(), StoreError>;

    /// A consolidation pass over several conversations: their fragments
    /// ([`Graph::write_fragments`]), then each `(tenant, conversation, until)` advanced
    /// ([`Graph::advance_consolidated_until`]). A graph that can should write all of it in one
    /// transaction: the consolidator writes a batch's conversations together, and a pair of
    /// writes for each conversation waits twice behind the graph's other writers. The default
    /// writes the fragments first, so an advance is never saved without them.
    async fn write_consolidation(
        &self,
        fragments: Vec<Fragment>,
        advances: Vec<(TenantId, String, u64)>,
    ) -> Result<(), StoreError> {
        if !fragments.is_empty() {
            self.write_fragments(&fragments).await?;
        }
        for (t, c, until) in &advances {
            self.advance_consolidated_until(t, c, *until).await?;
        }
        Ok(())
    }

    /// Records, durably before returning, that one turn was erased at `at` (its position kept
    /// for consolidation). Stages drop the turn if it is still in flight, [`Graph::purge_erased`]
    /// removes it; a turn stored again under the same id afterwards is a new memory.
    async fn record_turn_erasure(
        &self,
        tenant: &TenantId,
        conversation: &str,
        id: MemoryId,
        erasure: TurnErasure,
    ) -> Result<(), StoreError>;

    /// The tenant's marker and those of the given conversations, in one call.
    async fn erasures(
        &self,
        tenant: &TenantId,
        conversations: &[String],
    ) -> Result<Erasures, StoreError>;

    /// Removes what the markers cover in a conversation: turns recorded at or before the marker
    /// and turns erased on their own, with their edges, structural nodes left without a turn,
    /// fragments with such a member, a covered state. A writer that lost a race with an eraser
    /// calls it; returns turns removed.
    async fn purge_erased(&self, tenant: &TenantId, conversation: &str) -> Result<u64, StoreError>;

    /// Starts a conversation's derivation over (a reindex): its fragments go, and its state
    /// forgets the reference state and how far consolidation got, so that re-enriching its
    /// turns in order derives them afresh. Turns, links and positions stay (recall goes on;
    /// each re-enriched turn replaces its own links), each marked
    /// [`rederiving`](TurnRecord::rederiving) until it is written again: a window is
    /// consolidated from the new derivation only, never from old records still in place.
    async fn restart_derivation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<(), StoreError>;

    /// Removes every node, edge, fragment and state of a conversation; returns turns removed.
    async fn delete_conversation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<u64, StoreError>;
}

#[cfg(test)]
mod version_tests {
    use super::*;
    use chrono::TimeZone;

    fn turn(user: &str) -> Turn {
        let t = Utc.with_ymd_and_hms(2024, 5, 1, 10, 0, 0).unwrap();
        serde_json::from_value(serde_json::json!({
            "tenant": "t", "conversation_id": "c", "turn_id": "1", "position": 0,
            "user": user, "timestamp": t, "recorded_at": t,
        }))
        .unwrap()
    }

    fn edit(of: &Turn, user: &str, secs: i64) -> Turn {
        recollect_model::TurnPatch {
            user: Some(user.into()),
            ..Default::default()
        }
        .apply(of, of.recorded_at + chrono::Duration::seconds(secs))
        .unwrap()
    }

    fn record(t: Turn) -> TurnRecord {
        TurnRecord {
            turn: t,
            extraction: Extraction::default(),
            fragments: vec![],
            history: vec![],
            rederiving: false,
        }
    }

    #[test]
    fn edits_supersede_replays_and_older_versions_do_not() {
        let v1 = turn("cat");
        let v2 = edit(&v1, "dog", 10);
        assert_eq!(
            (v2.version, v2.first_recorded_at),
            (2, Some(v1.recorded_at))
        );
        let mut rec = record(v1.clone());
        assert_eq!(
            rec.version_write(&v1),
            VersionWrite::Rewrite,
            "a replayed store"
        );
        assert_eq!(rec.version_write(&v2), VersionWrite::Supersede);
        rec.supersede(v2.clone(), Extraction::default());
        assert_eq!(
            rec.version_write(&v2),
            VersionWrite::Rewrite,
            "a replayed edit"
        );
        assert_eq!(
            rec.version_write(&v1),
            VersionWrite::Stale,
            "a retried store"
        );
        // Two edits made from the same version (two gateways): the later one is a new version.
        let other = edit(&v1, "bird", 20);
        assert_eq!(rec.version_write(&other), VersionWrite::Supersede);
        rec.supersede(other, Extraction::default());
        assert_eq!(
            rec.turn.version, 3,
            "numbered in the order they become current"
        );
        let early = edit(&v1, "fish", 5);
        assert_eq!(rec.version_write(&early), VersionWrite::Stale);
        assert_eq!(
            rec.versions()
                .iter()
                .map(|t| t.user.as_str())
                .collect::<Vec<_>>(),
            ["cat", "dog", "bird"]
        );
        assert_eq!(rec.history[0].turn.expired_at, Some(v2.recorded_at));
    }

    #[test]
    fn as_of_picks_the_version_current_then() {
        let v1 = turn("cat");
        let v2 = edit(&v1, "dog", 10);
        let mut rec = record(v1.clone());
        rec.supersede(v2.clone(), Extraction::default());
        let at = |s: i64| v1.recorded_at + chrono::Duration::seconds(s);
        assert!(rec.as_of(at(-1)).is_none(), "not recorded yet");
        assert_eq!(rec.as_of(at(0)).unwrap().turn.user, "cat");
        assert_eq!(rec.as_of(at(9)).unwrap().turn.user, "cat");
        assert_eq!(rec.as_of(at(10)).unwrap().turn.user, "dog");
        assert_eq!(rec.as_of(at(1000)).unwrap().turn.user, "dog");
    }

    #[test]
    fn an_edit_of_an_erased_memory_stays_erased() {
        let v1 = turn("cat");
        let late = edit(&v1, "dog", 3600);
        let mut e = Erasures::default();
        e.turns.insert(
            v1.memory_id,
            TurnErasure {
                at: v1.recorded_at + chrono::Duration::seconds(60),
                position: 0,
            },
        );
        assert!(e.covers_turn(&v1) && e.covers_turn(&late));
        // Stored again after the erasure: a new memory, and its edits are not covered.
        let mut again = turn("cat again");
        again.recorded_at += chrono::Duration::seconds(120);
        assert!(!e.covers_turn(&again) && !e.covers_turn(&edit(&again, "x", 1)));
    }

    #[test]
    fn runs_never_hold_a_key_twice() {
        let items = [1, 2, 1, 3, 4, 5, 2];
        let runs = distinct_runs(&items, 3, |i| *i);
        assert_eq!(runs, vec![&[1, 2][..], &[1, 3, 4], &[5, 2]]);
        assert_eq!(distinct_runs(&[] as &[u8], 3, |i| *i).len(), 0);
    }
}
