//! The embedded graph: redb tables laid out so every Path B lookup is a prefix scan over one
//! conversation's keys (cost grows with the answer, not with the store).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use recollect_model::{Extraction, Fragment, MemoryId, TenantId, Turn};
use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::graph::{
    ConversationState, EdgeTimes, Erasures, Graph, GraphRead, LinkedTurn, NodeKind, Scope,
    TurnErasure, TurnRecord, VersionWrite,
};
use crate::keys;
use crate::StoreError;

/// memory id → TurnRecord ([`record_bytes`])
const TURNS: TableDefinition<u128, &[u8]> = TableDefinition::new("turn_nodes");
/// tenant\0conversation\0 + position (BE) → memory id
const CONV_TURNS: TableDefinition<&[u8], u128> = TableDefinition::new("conversation_turns");
/// tag + tenant\0conversation\0name\0 + memory id (BE) → EdgeTimes ([`edge_bytes`])
const LINKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("links");
/// tag + tenant\0conversation\0name\0 + memory id (BE) + expired at (ns, BE) → EdgeTimes
/// ([`edge_bytes`]): links an edit took away, kept for recall as of an earlier time. Apart from LINKS so
/// that recall of the present never reads them.
const EXPIRED_LINKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("expired_links");
/// tag + tenant\0conversation\0name\0 → number of turns linked (df)
const VOCAB: TableDefinition<&[u8], u64> = TableDefinition::new("vocabulary");
/// tenant\0conversation\0 → ConversationState (JSON)
const CONV_STATE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("conversation_state");
/// tenant\0conversation\0 → turns stored
const CONV_COUNT: TableDefinition<&[u8], u64> = TableDefinition::new("conversation_count");
/// tenant\0fragment id\0 → Fragment (JSON)
const FRAGMENTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("fragments");
/// tenant\0conversation\0fragment id\0 → ()
const CONV_FRAGMENTS: TableDefinition<&[u8], ()> = TableDefinition::new("conversation_fragments");
/// tenant\0conversation\0 (empty conversation: the whole tenant) → erased at, ns since the epoch
const ERASURES: TableDefinition<&[u8], i64> = TableDefinition::new("erasures");
/// tenant\0conversation\0 + memory id → TurnErasure (JSON): turns erased on their own
const TURN_ERASURES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("turn_erasures");
/// tenant\0participant\0conversation\0 → (), participant `u:<user id>` or `a:<agent id>`: the
/// conversations of an end user or agent, for recall scoped to them
const PARTICIPANT_CONVS: TableDefinition<&[u8], ()> =
    TableDefinition::new("participant_conversations");
/// tenant\0conversation\0participant\0 → (): the same pairs by conversation, for erasure
const CONV_PARTICIPANTS: TableDefinition<&[u8], ()> =
    TableDefinition::new("conversation_participants");

/// The participants a turn adds to its conversation.
fn participants(t: &Turn) -> impl Iterator<Item = String> + '_ {
    let u = t.user_id.iter().map(|u| format!("u:{u}"));
    let a = t.agent_id.iter().map(|a| format!("a:{a}"));
    u.chain(a)
}

/// The third part of every `tenant\0conversation\0part\0` key under `prefix` (a
/// conversation's fragments or participants).
fn third_parts(
    table: &impl ReadableTable<&'static [u8], ()>,
    prefix: &[u8],
) -> Result<Vec<String>, StoreError> {
    let end = keys::prefix_end(prefix);
    let mut out = Vec::new();
    for e in table.range(prefix..end.as_slice())? {
        let (k, _) = e?;
        if let Some(p) = keys::split(k.value()).get(2) {
            out.push(String::from_utf8_lossy(p).into_owned());
        }
    }
    Ok(out)
}

/// Forgets every participant of a conversation (the conversation is gone).
fn forget_participants(
    w: &redb::WriteTransaction,
    tenant: &str,
    conversation: &str,
) -> Result<(), StoreError> {
    let cp = keys::join(&[tenant, conversation]);
    let cend = keys::prefix_end(&cp);
    let mut by_conv = w.open_table(CONV_PARTICIPANTS)?;
    let mut by_part = w.open_table(PARTICIPANT_CONVS)?;
    let parts = third_parts(&by_conv, &cp)?;
    for p in parts {
        by_part.remove(keys::join(&[tenant, &p, conversation]).as_slice())?;
    }
    by_conv.retain_in(cp.as_slice()..cend.as_slice(), |_, _| false)?;
    Ok(())
}

fn nanos(t: DateTime<Utc>) -> i64 {
    t.timestamp_nanos_opt().unwrap_or(i64::MAX)
}

/// zstd's level for turn records: level 3 (its default) compresses a record to about a third
/// in tens of microseconds; higher levels gain little on records this small.
const RECORD_ZSTD_LEVEL: i32 = 3;

/// A turn record as stored: its JSON, compressed with zstd. The record (texts, extraction,
/// earlier versions) is the graph's largest table once edges are binary, and JSON's repeated
/// field names and the texts compress well.
fn record_bytes(rec: &TurnRecord) -> Result<Vec<u8>, StoreError> {
    let json = serde_json::to_vec(rec)?;
    zstd::bulk::compress(&json, RECORD_ZSTD_LEVEL)
        .map_err(|e| StoreError::backend("compressing a turn record", e))
}

/// Largest record [`record_json`] will inflate: a record is at most two 64 KiB texts per version,
/// so a frame that says more is damaged.
const MAX_RECORD_JSON: usize = 64 << 20;

thread_local! {
    /// One decompression context per thread: recall reads hundreds of records, and a context
    /// made per record costs more than decompressing it.
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// The JSON of a stored turn record: [`record_bytes`], or the plain JSON older stores wrote.
fn record_json(b: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, StoreError> {
    if b.first() == Some(&b'{') {
        return Ok(std::borrow::Cow::Borrowed(b));
    }
    let corrupt = |e| StoreError::corrupt("turn record", e);
    // `record_bytes` compresses in one shot, so every frame records its size.
    let size = zstd::bulk::Decompressor::upper_bound(b)
        .filter(|&n| n <= MAX_RECORD_JSON)
        .ok_or_else(|| StoreError::corrupt_msg("turn record: not a sized zstd frame"))?;
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let decompressor = match &mut *slot {
            Some(d) => d,
            empty => empty.insert(zstd::bulk::Decompressor::new().map_err(corrupt)?),
        };
        decompressor
            .decompress(b, size)
            .map(std::borrow::Cow::Owned)
            .map_err(corrupt)
    })
}

/// Reads a stored turn record.
fn record_of(b: &[u8]) -> Result<TurnRecord, StoreError> {
    Ok(serde_json::from_slice(&record_json(b)?)?)
}

/// First byte of an edge's times in the binary layout; JSON, which stores before it wrote,
/// starts with `{`, and is still read.
const EDGE_V1: u8 = 1;

/// An edge's times in 18 bytes (26 or 34 with the optional ends) instead of ~110 of JSON: a
/// link is written for every keyword, entity, location and time of every turn, so this is
/// most of the graph. Layout: [`EDGE_V1`], a flags byte (1: valid_to, 2: expired_at), then
/// nanoseconds since the epoch (big-endian i64) of valid_from, recorded_at and the ends set.
fn edge_bytes(t: &EdgeTimes) -> Vec<u8> {
    let flags = u8::from(t.valid_to.is_some()) | (u8::from(t.expired_at.is_some()) << 1);
    let mut out = Vec::with_capacity(34);
    out.extend_from_slice(&[EDGE_V1, flags]);
    for at in [
        Some(t.valid_from),
        Some(t.recorded_at),
        t.valid_to,
        t.expired_at,
    ]
    .into_iter()
    .flatten()
    {
        out.extend_from_slice(&nanos(at).to_be_bytes());
    }
    out
}

/// Reads [`edge_bytes`], or the JSON that stores before it wrote.
fn edge_times(b: &[u8]) -> Result<EdgeTimes, StoreError> {
    if b.first() == Some(&b'{') {
        return Ok(serde_json::from_slice(b)?);
    }
    let bad = || StoreError::corrupt_msg(format!("edge times of {} bytes", b.len()));
    let [EDGE_V1, flags, rest @ ..] = b else {
        return Err(bad());
    };
    let (has_to, has_expired) = (flags & 1 != 0, flags & 2 != 0);
    if *flags > 3 || rest.len() != 8 * (2 + usize::from(has_to) + usize::from(has_expired)) {
        return Err(bad());
    }
    let mut stamps = rest.chunks_exact(8).map(|c| {
        let mut n = [0u8; 8];
        n.copy_from_slice(c);
        DateTime::from_timestamp_nanos(i64::from_be_bytes(n))
    });
    let mut next = || stamps.next().ok_or_else(bad);
    Ok(EdgeTimes {
        valid_from: next()?,
        recorded_at: next()?,
        valid_to: if has_to { Some(next()?) } else { None },
        expired_at: if has_expired { Some(next()?) } else { None },
    })
}

/// The markers of a tenant and some of its conversations, read from any view of the table
/// (inside a write transaction too, so a guarded write sees the markers it races with).
fn markers_in(
    table: &impl ReadableTable<&'static [u8], i64>,
    turn_table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    tenant: &str,
    conversations: &[&str],
) -> Result<Erasures, StoreError> {
    let at = |conv: &str| -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(table
            .get(keys::join(&[tenant, conv]).as_slice())?
            .map(|v| DateTime::from_timestamp_nanos(v.value())))
    };
    let mut e = Erasures {
        tenant: at("")?,
        ..Default::default()
    };
    for c in conversations {
        if let Some(m) = at(c)? {
            e.conversations.insert(c.to_string(), m);
        }
        let p = keys::join(&[tenant, c]);
        let end = keys::prefix_end(&p);
        for entry in turn_table.range(p.as_slice()..end.as_slice())? {
            let (k, v) = entry?;
            let id: [u8; 16] = k.value()[p.len()..]
                .try_into()
                .map_err(|_| StoreError::corrupt_msg("turn erasure key"))?;
            e.turns.insert(
                MemoryId(id),
                serde_json::from_slice::<TurnErasure>(v.value())?,
            );
        }
    }
    Ok(e)
}

#[derive(Clone)]
pub struct EmbeddedGraph {
    db: Arc<Database>,
}

fn link_prefix(kind: NodeKind, tenant: &str, conversation: &str, name: &str) -> Vec<u8> {
    let mut k = vec![kind.tag()];
    k.extend(keys::join(&[tenant, conversation, &keys::clean(name)]));
    k
}

fn conv_prefix(kind: NodeKind, tenant: &str, conversation: &str) -> Vec<u8> {
    let mut k = vec![kind.tag()];
    k.extend(keys::join(&[tenant, conversation]));
    k
}

impl EmbeddedGraph {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let db = Database::create(path)?;
        let w = db.begin_write()?;
        w.open_table(TURNS)?;
        w.open_table(CONV_TURNS)?;
        w.open_table(LINKS)?;
        w.open_table(EXPIRED_LINKS)?;
        w.open_table(VOCAB)?;
        w.open_table(CONV_STATE)?;
        w.open_table(CONV_COUNT)?;
        w.open_table(FRAGMENTS)?;
        w.open_table(CONV_FRAGMENTS)?;
        w.open_table(ERASURES)?;
        w.open_table(TURN_ERASURES)?;
        w.open_table(PARTICIPANT_CONVS)?;
        w.open_table(CONV_PARTICIPANTS)?;
        w.commit()?;
        Ok(Self { db: Arc::new(db) })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db)).await?
    }

    /// Read-modify-write of a conversation's state in one write transaction (redb serialises
    /// them), so concurrent writers of different fields do not undo each other.
    fn update_state(
        db: &Database,
        key: &[u8],
        f: impl FnOnce(&mut ConversationState),
    ) -> Result<(), StoreError> {
        let w = db.begin_write()?;
        {
            let mut t = w.open_table(CONV_STATE)?;
            let mut state: ConversationState = match t.get(key)? {
                Some(v) => serde_json::from_slice(v.value())?,
                None => ConversationState::default(),
            };
            f(&mut state);
            let v = serde_json::to_vec(&state)?;
            t.insert(key, v.as_slice())?;
        }
        w.commit()?;
        Ok(())
    }

    fn scope_conversations(
        db: &Database,
        tenant: &str,
        scope: &Scope,
    ) -> Result<Vec<String>, StoreError> {
        if let Some(c) = &scope.conversations {
            return Ok(c.clone());
        }
        let r = db.begin_read()?;
        let t = r.open_table(CONV_COUNT)?;
        let prefix = keys::join(&[tenant]);
        let end = keys::prefix_end(&prefix);
        let mut out = Vec::new();
        for e in t.range(prefix.as_slice()..end.as_slice())? {
            let (k, _) = e?;
            if let Some(c) = keys::split(k.value()).get(1) {
                out.push(String::from_utf8_lossy(c).into_owned());
            }
        }
        Ok(out)
    }

    fn write_turns_sync(db: &Database, turns: &[(Turn, Extraction)]) -> Result<(), StoreError> {
        let now = Utc::now();
        let w = db.begin_write()?;
        {
            let mut nodes = w.open_table(TURNS)?;
            let mut conv = w.open_table(CONV_TURNS)?;
            let mut links = w.open_table(LINKS)?;
            let mut expired = w.open_table(EXPIRED_LINKS)?;
            let mut vocab = w.open_table(VOCAB)?;
            let mut count = w.open_table(CONV_COUNT)?;
            let mut by_part = w.open_table(PARTICIPANT_CONVS)?;
            let mut by_conv = w.open_table(CONV_PARTICIPANTS)?;
            // The erasure guard, under the write lock: an eraser's marker is either committed
            // before this transaction (and seen here) or after it (and its delete follows).
            let erased = w.open_table(ERASURES)?;
            let erased_turns = w.open_table(TURN_ERASURES)?;
            let mut markers: HashMap<(&str, &str), Erasures> = HashMap::new();
            for (turn, x) in turns {
                let tenant = turn.tenant.as_str();
                let cid = turn.conversation_id.as_str();
                if let std::collections::hash_map::Entry::Vacant(v) = markers.entry((tenant, cid)) {
                    v.insert(markers_in(&erased, &erased_turns, tenant, &[cid])?);
                }
                if markers[&(tenant, cid)].covers_turn(turn) {
                    continue;
                }
                let id = turn.memory_id.as_u128();
                let old: Option<TurnRecord> = match nodes.get(id)? {
                    Some(v) => Some(record_of(v.value())?),
                    None => None,
                };
                // An edit keeps what it replaces: the old version in the record's history, its
                // links expired at the edit's time rather than deleted.
                let (record, edited_at) = match &old {
                    None => (
                        TurnRecord {
                            turn: turn.clone(),
                            extraction: x.clone(),
                            fragments: vec![],
                            history: vec![],
                        },
                        None,
                    ),
                    Some(o) => match o.version_write(turn) {
                        VersionWrite::Stale => continue,
                        VersionWrite::Rewrite => (
                            TurnRecord {
                                turn: turn.clone(),
                                extraction: x.clone(),
                                ..o.clone()
                            },
                            None,
                        ),
                        VersionWrite::Supersede => {
                            let mut r = o.clone();
                            r.supersede(turn.clone(), x.clone());
                            let at = r.turn.recorded_at;
                            (r, Some(at))
                        }
                    },
                };
                let turn = &record.turn;
                nodes.insert(id, record_bytes(&record)?.as_slice())?;
                let mut ck = keys::join(&[tenant, cid]);
                ck.extend_from_slice(&turn.position.to_be_bytes());
                conv.insert(ck.as_slice(), id)?;
                if old.is_none() {
                    let k = keys::join(&[tenant, cid]);
                    let n = count.get(k.as_slice())?.map(|v| v.value()).unwrap_or(0);
                    count.insert(k.as_slice(), n + 1)?;
                }
                for p in participants(turn) {
                    by_part.insert(keys::join(&[tenant, &p, cid]).as_slice(), ())?;
                    by_conv.insert(keys::join(&[tenant, cid, &p]).as_slice(), ())?;
                }
                let valid_from = x.event_time.unwrap_or(turn.timestamp);
                for kind in NodeKind::ALL {
                    let new_names: BTreeSet<String> = kind.names(x).into_iter().collect();
                    let old_names: BTreeSet<String> = old
                        .as_ref()
                        .map(|o| kind.names(&o.extraction).into_iter().collect())
                        .unwrap_or_default();
                    // A re-derived extraction replaces its own links; an edit expires them.
                    for name in old_names.difference(&new_names) {
                        let mut lk = link_prefix(kind, tenant, cid, name);
                        let vk = lk.clone();
                        lk.extend_from_slice(&id.to_be_bytes());
                        let Some(times) = links.remove(lk.as_slice())? else {
                            continue;
                        };
                        if let Some(at) = edited_at {
                            let mut times = edge_times(times.value())?;
                            times.expired_at = Some(at);
                            let mut ek = lk.clone();
                            ek.extend_from_slice(&nanos(at).to_be_bytes());
                            expired.insert(ek.as_slice(), edge_bytes(&times).as_slice())?;
                        }
                        let n = vocab.get(vk.as_slice())?.map(|v| v.value()).unwrap_or(1);
                        if n <= 1 {
                            vocab.remove(vk.as_slice())?;
                        } else {
                            vocab.insert(vk.as_slice(), n - 1)?;
                        }
                    }
                    for name in &new_names {
                        let mut lk = link_prefix(kind, tenant, cid, name);
                        let vk = lk.clone();
                        lk.extend_from_slice(&id.to_be_bytes());
                        if links.get(lk.as_slice())?.is_some() {
                            continue;
                        }
                        let times = EdgeTimes {
                            valid_from,
                            valid_to: None,
                            recorded_at: edited_at.unwrap_or(now),
                            expired_at: None,
                        };
                        links.insert(lk.as_slice(), edge_bytes(&times).as_slice())?;
                        let n = vocab.get(vk.as_slice())?.map(|v| v.value()).unwrap_or(0);
                        vocab.insert(vk.as_slice(), n + 1)?;
                    }
                }
            }
        }
        w.commit()?;
        Ok(())
    }
}

#[async_trait]
impl GraphRead for EmbeddedGraph {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    async fn turns(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
    ) -> Result<Vec<TurnRecord>, StoreError> {
        let tenant = tenant.clone();
        let ids = ids.to_vec();
        self.blocking(move |db| {
            let r = db.begin_read()?;
            let t = r.open_table(TURNS)?;
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                if let Some(v) = t.get(id.as_u128())? {
                    let rec = record_of(v.value())?;
                    if rec.turn.tenant == tenant {
                        out.push(rec);
                    }
                }
            }
            Ok(out)
        })
        .await
    }

    async fn conversation_turns(
        &self,
        tenant: &TenantId,
        conversation: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        let prefix = keys::join(&[tenant.as_str(), conversation]);
        self.blocking(move |db| {
            let r = db.begin_read()?;
            let idx = r.open_table(CONV_TURNS)?;
            let t = r.open_table(TURNS)?;
            let mut lo = prefix.clone();
            lo.extend_from_slice(&from.to_be_bytes());
            let mut hi = prefix.clone();
            hi.extend_from_slice(&to.to_be_bytes());
            let mut out = Vec::new();
            for e in idx.range(lo.as_slice()..hi.as_slice())? {
                let (_, id) = e?;
                if let Some(v) = t.get(id.value())? {
                    out.push(record_of(v.value())?);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn conversations(&self, tenant: &TenantId) -> Result<Vec<String>, StoreError> {
        let tenant = tenant.clone();
        self.blocking(move |db| Self::scope_conversations(db, tenant.as_str(), &Scope::all()))
            .await
    }

    async fn conversations_of(
        &self,
        tenant: &TenantId,
        user_ids: &[String],
        agent_ids: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let tenant = tenant.clone();
        let (users, agents) = (user_ids.to_vec(), agent_ids.to_vec());
        self.blocking(move |db| {
            let r = db.begin_read()?;
            let t = r.open_table(PARTICIPANT_CONVS)?;
            let of = |prefix: &str, ids: &[String]| -> Result<BTreeSet<String>, StoreError> {
                let mut out = BTreeSet::new();
                for id in ids {
                    let p = keys::join(&[tenant.as_str(), &format!("{prefix}{id}")]);
                    let end = keys::prefix_end(&p);
                    for e in t.range(p.as_slice()..end.as_slice())? {
                        let (k, _) = e?;
                        if let Some(c) = keys::split(k.value()).get(2) {
                            out.insert(String::from_utf8_lossy(c).into_owned());
                        }
                    }
                }
                Ok(out)
            };
            let found = match (users.is_empty(), agents.is_empty()) {
                (false, false) => {
                    let a = of("a:", &agents)?;
                    of("u:", &users)?.intersection(&a).cloned().collect()
                }
                (false, true) => of("u:", &users)?,
                (true, false) => of("a:", &agents)?,
                (true, true) => BTreeSet::new(),
            };
            Ok(found.into_iter().collect())
        })
        .await
    }

    async fn vocabulary(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        kind: NodeKind,
    ) -> Result<Vec<String>, StoreError> {
        let tenant = tenant.clone();
        let scope = scope.clone();
        self.blocking(move |db| {
            let convs = Self::scope_conversations(db, tenant.as_str(), &scope)?;
            let r = db.begin_read()?;
            let v = r.open_table(VOCAB)?;
            let mut out = BTreeSet::new();
            for c in convs {
                let p = conv_prefix(kind, tenant.as_str(), &c);
                let end = keys::prefix_end(&p);
                for e in v.range(p.as_slice()..end.as_slice())? {
                    let (k, _) = e?;
                    let name = &k.value()[p.len()..];
                    let name = name.strip_suffix(&[0]).unwrap_or(name);
                    out.insert(String::from_utf8_lossy(name).into_owned());
                }
            }
            Ok(out.into_iter().collect())
        })
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
        let tenant = tenant.clone();
        let scope = scope.clone();
        let names = names.to_vec();
        self.blocking(move |db| {
            let convs = Self::scope_conversations(db, tenant.as_str(), &scope)?;
            let r = db.begin_read()?;
            let links = r.open_table(LINKS)?;
            let expired = r.open_table(EXPIRED_LINKS)?;
            let mut out = Vec::new();
            for c in &convs {
                for name in &names {
                    let p = link_prefix(kind, tenant.as_str(), c, name);
                    let end = keys::prefix_end(&p);
                    for e in links.range(p.as_slice()..end.as_slice())? {
                        let (k, v) = e?;
                        let idb = &k.value()[p.len()..];
                        let Ok(idb) = <[u8; 16]>::try_from(idb) else {
                            continue;
                        };
                        if recorded_by.is_some() || valid_at.is_some() {
                            let times = edge_times(v.value())?;
                            if !times.visible(recorded_by, valid_at) {
                                continue;
                            }
                        }
                        out.push(LinkedTurn {
                            name: name.clone(),
                            memory_id: MemoryId(idb),
                            conversation_id: c.clone(),
                        });
                    }
                    // As of an earlier time: the links edits have since taken away, too.
                    let Some(rb) = recorded_by else { continue };
                    for e in expired.range(p.as_slice()..end.as_slice())? {
                        let (k, v) = e?;
                        let Some(Ok(idb)) = k
                            .value()
                            .get(p.len()..p.len() + 16)
                            .map(<[u8; 16]>::try_from)
                        else {
                            continue;
                        };
                        let times = edge_times(v.value())?;
                        if times.visible(Some(rb), valid_at) {
                            out.push(LinkedTurn {
                                name: name.clone(),
                                memory_id: MemoryId(idb),
                                conversation_id: c.clone(),
                            });
                        }
                    }
                }
            }
            Ok(out)
        })
        .await
    }

    async fn document_frequencies(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        kind: NodeKind,
        names: &[String],
    ) -> Result<(u64, Vec<u64>), StoreError> {
        let tenant = tenant.clone();
        let scope = scope.clone();
        let names = names.to_vec();
        self.blocking(move |db| {
            let convs = Self::scope_conversations(db, tenant.as_str(), &scope)?;
            let r = db.begin_read()?;
            let v = r.open_table(VOCAB)?;
            let cnt = r.open_table(CONV_COUNT)?;
            let mut total = 0;
            let mut df = vec![0u64; names.len()];
            for c in &convs {
                total += cnt
                    .get(keys::join(&[tenant.as_str(), c]).as_slice())?
                    .map(|x| x.value())
                    .unwrap_or(0);
                for (i, n) in names.iter().enumerate() {
                    let k = link_prefix(kind, tenant.as_str(), c, n);
                    df[i] += v.get(k.as_slice())?.map(|x| x.value()).unwrap_or(0);
                }
            }
            Ok((total, df))
        })
        .await
    }

    async fn fragments(
        &self,
        tenant: &TenantId,
        ids: &[String],
    ) -> Result<Vec<Fragment>, StoreError> {
        let tenant = tenant.clone();
        let ids = ids.to_vec();
        self.blocking(move |db| {
            let r = db.begin_read()?;
            let t = r.open_table(FRAGMENTS)?;
            let mut out = Vec::new();
            for id in ids {
                if let Some(v) = t.get(keys::join(&[tenant.as_str(), &id]).as_slice())? {
                    out.push(serde_json::from_slice(v.value())?);
                }
            }
            Ok(out)
        })
        .await
    }
}

#[async_trait]
impl Graph for EmbeddedGraph {
    async fn write_turns(&self, turns: &[(Turn, Extraction)]) -> Result<(), StoreError> {
        let turns = turns.to_vec();
        self.blocking(move |db| Self::write_turns_sync(db, &turns))
            .await
    }

    async fn write_fragments(&self, fragments: &[Fragment]) -> Result<(), StoreError> {
        let fragments = fragments.to_vec();
        self.blocking(move |db| {
            let w = db.begin_write()?;
            {
                let mut ft = w.open_table(FRAGMENTS)?;
                let mut cf = w.open_table(CONV_FRAGMENTS)?;
                let mut nodes = w.open_table(TURNS)?;
                let erased = w.open_table(ERASURES)?;
                let erased_turns = w.open_table(TURN_ERASURES)?;
                for f in &fragments {
                    let t = f.tenant.as_str();
                    let m = markers_in(&erased, &erased_turns, t, &[f.conversation_id.as_str()])?;
                    if !m.is_empty() {
                        let mut whole = true;
                        for id in &f.members {
                            whole &= match nodes.get(id.as_u128())? {
                                Some(v) => !m.covers_turn(&record_of(v.value())?.turn),
                                None => false,
                            };
                        }
                        if !whole {
                            continue;
                        }
                    }
                    ft.insert(
                        keys::join(&[t, &f.id]).as_slice(),
                        serde_json::to_vec(f)?.as_slice(),
                    )?;
                    cf.insert(keys::join(&[t, &f.conversation_id, &f.id]).as_slice(), ())?;
                    for m in &f.members {
                        let rec = match nodes.get(m.as_u128())? {
                            Some(v) => record_of(v.value())?,
                            None => continue,
                        };
                        if rec.fragments.contains(&f.id) || rec.turn.tenant != f.tenant {
                            continue;
                        }
                        let mut rec = rec;
                        rec.fragments.push(f.id.clone());
                        nodes.insert(m.as_u128(), record_bytes(&rec)?.as_slice())?;
                    }
                }
            }
            w.commit()?;
            Ok(())
        })
        .await
    }

    async fn conversation_state(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<ConversationState, StoreError> {
        let k = keys::join(&[tenant.as_str(), conversation]);
        self.blocking(move |db| {
            let r = db.begin_read()?;
            let t = r.open_table(CONV_STATE)?;
            match t.get(k.as_slice())? {
                Some(v) => Ok(serde_json::from_slice(v.value())?),
                None => Ok(ConversationState::default()),
            }
        })
        .await
    }

    async fn save_conversation_state(
        &self,
        tenant: &TenantId,
        conversation: &str,
        state: &ConversationState,
    ) -> Result<bool, StoreError> {
        let k = keys::join(&[tenant.as_str(), conversation]);
        let (t, c, st) = (tenant.clone(), conversation.to_string(), state.clone());
        self.blocking(move |db| {
            let w = db.begin_write()?;
            let m = markers_in(
                &w.open_table(ERASURES)?,
                &w.open_table(TURN_ERASURES)?,
                t.as_str(),
                &[c.as_str()],
            )?;
            if m.marker(&c).is_some_and(|m| st.covered_by(m)) {
                return Ok(false);
            }
            {
                let mut table = w.open_table(CONV_STATE)?;
                // The caller's copy may predate the consolidator's latest advance.
                let until = table
                    .get(k.as_slice())?
                    .map(|v| {
                        serde_json::from_slice::<ConversationState>(v.value())
                            .map(|s| s.consolidated_until)
                    })
                    .transpose()?
                    .unwrap_or(0);
                let mut st = st;
                st.consolidated_until = st.consolidated_until.max(until);
                let v = serde_json::to_vec(&st)?;
                table.insert(k.as_slice(), v.as_slice())?;
            }
            w.commit()?;
            Ok(true)
        })
        .await
    }

    async fn restart_derivation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<(), StoreError> {
        let (tenant, conversation) = (tenant.as_str().to_string(), conversation.to_string());
        self.blocking(move |db| {
            let cp = keys::join(&[&tenant, &conversation]);
            let cend = keys::prefix_end(&cp);
            let w = db.begin_write()?;
            {
                let mut states = w.open_table(CONV_STATE)?;
                let state: Option<ConversationState> = match states.get(cp.as_slice())? {
                    Some(v) => Some(serde_json::from_slice(v.value())?),
                    None => None,
                };
                if let Some(state) = state {
                    let fresh = state.restarted();
                    states.insert(cp.as_slice(), serde_json::to_vec(&fresh)?.as_slice())?;
                }
                let mut cf = w.open_table(CONV_FRAGMENTS)?;
                let mut ft = w.open_table(FRAGMENTS)?;
                for f in third_parts(&cf, &cp)? {
                    ft.remove(keys::join(&[&tenant, &f]).as_slice())?;
                }
                cf.retain_in(cp.as_slice()..cend.as_slice(), |_, _| false)?;
                let idx = w.open_table(CONV_TURNS)?;
                let mut nodes = w.open_table(TURNS)?;
                let ids: Vec<u128> = idx
                    .range(cp.as_slice()..cend.as_slice())?
                    .map(|e| e.map(|(_, v)| v.value()))
                    .collect::<Result<_, _>>()?;
                for id in ids {
                    let rec: Option<TurnRecord> = match nodes.get(id)? {
                        Some(v) => Some(record_of(v.value())?),
                        None => None,
                    };
                    if let Some(mut rec) = rec.filter(|r| !r.fragments.is_empty()) {
                        rec.fragments.clear();
                        nodes.insert(id, record_bytes(&rec)?.as_slice())?;
                    }
                }
            }
            w.commit()?;
            Ok(())
        })
        .await
    }

    async fn advance_consolidated_until(
        &self,
        tenant: &TenantId,
        conversation: &str,
        until: u64,
    ) -> Result<(), StoreError> {
        let k = keys::join(&[tenant.as_str(), conversation]);
        self.blocking(move |db| {
            Self::update_state(db, &k, |s| {
                s.consolidated_until = s.consolidated_until.max(until)
            })
        })
        .await
    }

    async fn record_erasure(
        &self,
        tenant: &TenantId,
        conversation: Option<&str>,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let k = keys::join(&[tenant.as_str(), conversation.unwrap_or("")]);
        self.blocking(move |db| {
            let w = db.begin_write()?;
            {
                let mut t = w.open_table(ERASURES)?;
                let old = t.get(k.as_slice())?.map(|v| v.value());
                t.insert(k.as_slice(), old.unwrap_or(i64::MIN).max(nanos(at)))?;
            }
            w.commit()?;
            Ok(())
        })
        .await
    }

    async fn record_turn_erasure(
        &self,
        tenant: &TenantId,
        conversation: &str,
        id: MemoryId,
        erasure: TurnErasure,
    ) -> Result<(), StoreError> {
        let mut k = keys::join(&[tenant.as_str(), conversation]);
        k.extend_from_slice(&id.0);
        self.blocking(move |db| {
            let w = db.begin_write()?;
            {
                let mut t = w.open_table(TURN_ERASURES)?;
                let old: Option<TurnErasure> = match t.get(k.as_slice())? {
                    Some(v) => Some(serde_json::from_slice(v.value())?),
                    None => None,
                };
                // The later erasure wins, as for conversation markers.
                let keep = match old {
                    Some(o) if o.at >= erasure.at => o,
                    _ => erasure,
                };
                t.insert(k.as_slice(), serde_json::to_vec(&keep)?.as_slice())?;
            }
            w.commit()?;
            Ok(())
        })
        .await
    }

    async fn erasures(
        &self,
        tenant: &TenantId,
        conversations: &[String],
    ) -> Result<Erasures, StoreError> {
        let tenant = tenant.clone();
        let convs = conversations.to_vec();
        self.blocking(move |db| {
            let r = db.begin_read()?;
            let c: Vec<&str> = convs.iter().map(String::as_str).collect();
            markers_in(
                &r.open_table(ERASURES)?,
                &r.open_table(TURN_ERASURES)?,
                tenant.as_str(),
                &c,
            )
        })
        .await
    }

    async fn purge_erased(&self, tenant: &TenantId, conversation: &str) -> Result<u64, StoreError> {
        let tenant = tenant.as_str().to_string();
        let conversation = conversation.to_string();
        self.blocking(move |db| {
            let w = db.begin_write()?;
            let n = Self::purge_sync(&w, &tenant, &conversation)?;
            w.commit()?;
            Ok(n)
        })
        .await
    }

    async fn delete_conversation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<u64, StoreError> {
        let tenant = tenant.as_str().to_string();
        let conversation = conversation.to_string();
        self.blocking(move |db| {
            let cp = keys::join(&[&tenant, &conversation]);
            let cend = keys::prefix_end(&cp);
            let w = db.begin_write()?;
            let n;
            {
                let mut idx = w.open_table(CONV_TURNS)?;
                let mut nodes = w.open_table(TURNS)?;
                let ids: Vec<u128> = idx
                    .range(cp.as_slice()..cend.as_slice())?
                    .map(|e| e.map(|(_, v)| v.value()))
                    .collect::<Result<_, _>>()?;
                n = ids.len() as u64;
                for id in ids {
                    nodes.remove(id)?;
                }
                idx.retain_in(cp.as_slice()..cend.as_slice(), |_, _| false)?;
                let mut links = w.open_table(LINKS)?;
                let mut expired = w.open_table(EXPIRED_LINKS)?;
                let mut vocab = w.open_table(VOCAB)?;
                for kind in NodeKind::ALL {
                    let p = conv_prefix(kind, &tenant, &conversation);
                    let end = keys::prefix_end(&p);
                    links.retain_in(p.as_slice()..end.as_slice(), |_, _| false)?;
                    expired.retain_in(p.as_slice()..end.as_slice(), |_, _| false)?;
                    vocab.retain_in(p.as_slice()..end.as_slice(), |_, _| false)?;
                }
                w.open_table(CONV_STATE)?.remove(cp.as_slice())?;
                w.open_table(CONV_COUNT)?.remove(cp.as_slice())?;
                let mut cf = w.open_table(CONV_FRAGMENTS)?;
                let mut ft = w.open_table(FRAGMENTS)?;
                let frag_ids = third_parts(&cf, &cp)?;
                for f in frag_ids {
                    ft.remove(keys::join(&[&tenant, &f]).as_slice())?;
                }
                cf.retain_in(cp.as_slice()..cend.as_slice(), |_, _| false)?;
            }
            forget_participants(&w, &tenant, &conversation)?;
            // The conversation's marker, recorded before this delete, covers every turn a
            // single-turn erasure named.
            w.open_table(TURN_ERASURES)?
                .retain_in(cp.as_slice()..cend.as_slice(), |_, _| false)?;
            w.commit()?;
            Ok(n)
        })
        .await
    }
}

impl EmbeddedGraph {
    /// Removes what the markers cover in one conversation, inside the caller's transaction.
    fn purge_sync(
        w: &redb::WriteTransaction,
        tenant: &str,
        conversation: &str,
    ) -> Result<u64, StoreError> {
        let m = markers_in(
            &w.open_table(ERASURES)?,
            &w.open_table(TURN_ERASURES)?,
            tenant,
            &[conversation],
        )?;
        if m.is_empty() {
            return Ok(0);
        }
        let marker = m.marker(conversation);
        let cp = keys::join(&[tenant, conversation]);
        let cend = keys::prefix_end(&cp);
        let mut nodes = w.open_table(TURNS)?;
        let mut idx = w.open_table(CONV_TURNS)?;
        let mut links = w.open_table(LINKS)?;
        let mut expired = w.open_table(EXPIRED_LINKS)?;
        let mut vocab = w.open_table(VOCAB)?;
        let mut removed: BTreeSet<u128> = BTreeSet::new();
        let mut erased: Vec<TurnRecord> = Vec::new();
        let entries: Vec<(Vec<u8>, u128)> = idx
            .range(cp.as_slice()..cend.as_slice())?
            .map(|e| e.map(|(k, v)| (k.value().to_vec(), v.value())))
            .collect::<Result<_, _>>()?;
        for (key, id) in entries {
            let rec: Option<TurnRecord> = match nodes.get(id)? {
                Some(v) => Some(record_of(v.value())?),
                None => None,
            };
            if rec.as_ref().is_some_and(|r| !m.covers_turn(&r.turn)) {
                continue;
            }
            idx.remove(key.as_slice())?;
            let Some(rec) = rec else { continue };
            nodes.remove(id)?;
            removed.insert(id);
            erased.push(rec.clone());
            for kind in NodeKind::ALL {
                for v in &rec.history {
                    for name in kind.names(&v.extraction) {
                        let mut lk = link_prefix(kind, tenant, conversation, &name);
                        lk.extend_from_slice(&id.to_be_bytes());
                        let end = keys::prefix_end(&lk);
                        expired.retain_in(lk.as_slice()..end.as_slice(), |_, _| false)?;
                    }
                }
                for name in kind.names(&rec.extraction) {
                    let mut lk = link_prefix(kind, tenant, conversation, &name);
                    let vk = lk.clone();
                    lk.extend_from_slice(&id.to_be_bytes());
                    if links.remove(lk.as_slice())?.is_some() {
                        let n = vocab.get(vk.as_slice())?.map(|v| v.value()).unwrap_or(1);
                        if n <= 1 {
                            vocab.remove(vk.as_slice())?;
                        } else {
                            vocab.insert(vk.as_slice(), n - 1)?;
                        }
                    }
                }
            }
        }
        let mut count = w.open_table(CONV_COUNT)?;
        let left = count
            .get(cp.as_slice())?
            .map(|v| v.value())
            .unwrap_or(0)
            .saturating_sub(removed.len() as u64);
        if left == 0 {
            count.remove(cp.as_slice())?;
            // A partly erased conversation keeps its participants: the index may then name a
            // conversation with no turn of theirs left, which the turn filter still excludes.
            forget_participants(w, tenant, conversation)?;
        } else {
            count.insert(cp.as_slice(), left)?;
        }
        // Fragments with an erased (or already missing) member are erased data themselves.
        let mut cf = w.open_table(CONV_FRAGMENTS)?;
        let mut ft = w.open_table(FRAGMENTS)?;
        let fkeys: Vec<Vec<u8>> = cf
            .range(cp.as_slice()..cend.as_slice())?
            .map(|e| e.map(|(k, _)| k.value().to_vec()))
            .collect::<Result<_, _>>()?;
        for ck in fkeys {
            let Some(fid) = keys::split(&ck)
                .get(2)
                .map(|s| String::from_utf8_lossy(s).into_owned())
            else {
                continue;
            };
            let fk = keys::join(&[tenant, &fid]);
            let f: Option<Fragment> = match ft.get(fk.as_slice())? {
                Some(v) => Some(serde_json::from_slice(v.value())?),
                None => None,
            };
            let mut erased = f.is_none();
            if let Some(f) = &f {
                for m in &f.members {
                    erased |= removed.contains(&m.as_u128()) || nodes.get(m.as_u128())?.is_none();
                }
            }
            if !erased {
                continue;
            }
            cf.remove(ck.as_slice())?;
            ft.remove(fk.as_slice())?;
            for m in f.map(|f| f.members).unwrap_or_default() {
                let rec = match nodes.get(m.as_u128())? {
                    Some(v) => record_of(v.value())?,
                    None => continue,
                };
                let mut rec = rec;
                rec.fragments.retain(|x| *x != fid);
                nodes.insert(m.as_u128(), record_bytes(&rec)?.as_slice())?;
            }
        }
        let mut states = w.open_table(CONV_STATE)?;
        // Only a conversation or tenant marker reaches the state; a single turn's erasure
        // leaves the rest of the conversation's state as it is.
        let covered = match (states.get(cp.as_slice())?, marker) {
            (Some(v), Some(marker)) => {
                serde_json::from_slice::<ConversationState>(v.value())?.covered_by(marker)
            }
            _ => false,
        };
        if covered {
            states.remove(cp.as_slice())?;
        } else if !erased.is_empty() {
            // A turn erased on its own: out of the state goes what it put there.
            let state: Option<ConversationState> = match states.get(cp.as_slice())? {
                Some(v) => Some(serde_json::from_slice(v.value())?),
                None => None,
            };
            if let Some(mut state) = state {
                for rec in &erased {
                    crate::graph::forget_record(&mut state, rec);
                }
                states.insert(cp.as_slice(), serde_json::to_vec(&state)?.as_slice())?;
            }
        }
        Ok(removed.len() as u64)
    }

    /// Rows any table still holds of a tenant's conversation (erasure checks).
    pub fn residue(&self, tenant: &TenantId, conversation: &str) -> Result<u64, StoreError> {
        let r = self.db.begin_read()?;
        let cp = keys::join(&[tenant.as_str(), conversation]);
        let cend = keys::prefix_end(&cp);
        let mut n = r
            .open_table(CONV_TURNS)?
            .range(cp.as_slice()..cend.as_slice())?
            .count() as u64;
        n += r
            .open_table(CONV_FRAGMENTS)?
            .range(cp.as_slice()..cend.as_slice())?
            .count() as u64;
        n += r.open_table(CONV_STATE)?.get(cp.as_slice())?.is_some() as u64;
        n += r.open_table(CONV_COUNT)?.get(cp.as_slice())?.is_some() as u64;
        n += r
            .open_table(CONV_PARTICIPANTS)?
            .range(cp.as_slice()..cend.as_slice())?
            .count() as u64;
        let links = r.open_table(LINKS)?;
        let expired = r.open_table(EXPIRED_LINKS)?;
        let vocab = r.open_table(VOCAB)?;
        for kind in NodeKind::ALL {
            let p = conv_prefix(kind, tenant.as_str(), conversation);
            let end = keys::prefix_end(&p);
            n += links.range(p.as_slice()..end.as_slice())?.count() as u64;
            n += expired.range(p.as_slice()..end.as_slice())?.count() as u64;
            n += vocab.range(p.as_slice()..end.as_slice())?.count() as u64;
        }
        for e in r.open_table(TURNS)?.iter()? {
            let (_, v) = e?;
            let rec = record_of(v.value())?;
            if rec.turn.tenant == *tenant && rec.turn.conversation_id == conversation {
                n += 1;
            }
        }
        for e in r.open_table(FRAGMENTS)?.iter()? {
            let (_, v) = e?;
            let f: Fragment = serde_json::from_slice(v.value())?;
            if f.tenant == *tenant && f.conversation_id == conversation {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Rows in every table, for erasure checks and disk accounting.
    pub fn table_sizes(&self) -> Result<HashMap<&'static str, u64>, StoreError> {
        let r = self.db.begin_read()?;
        let mut m = HashMap::new();
        m.insert("turn_nodes", r.open_table(TURNS)?.len()?);
        m.insert("links", r.open_table(LINKS)?.len()?);
        m.insert("expired_links", r.open_table(EXPIRED_LINKS)?.len()?);
        m.insert("vocabulary", r.open_table(VOCAB)?.len()?);
        m.insert("fragments", r.open_table(FRAGMENTS)?.len()?);
        m.insert("conversation_state", r.open_table(CONV_STATE)?.len()?);
        Ok(m)
    }

    /// Rows per table that belong to `tenant` (and `conversation`, if given): erasure checks.
    /// Scans whole tables; meant for tests and audits, not for serving.
    pub fn rows_of(
        &self,
        tenant: &TenantId,
        conversation: Option<&str>,
    ) -> Result<HashMap<&'static str, u64>, StoreError> {
        let owned = |t: &[u8], c: Option<&[u8]>| {
            t == tenant.as_str().as_bytes()
                && conversation.is_none_or(|want| c == Some(want.as_bytes()))
        };
        // Keys `tenant\0conversation\0…`, optionally after a one-byte node-kind tag.
        let by_key = |key: &[u8], tagged: bool| {
            let key = if tagged {
                &key[1.min(key.len())..]
            } else {
                key
            };
            let parts = keys::split(key);
            owned(
                parts.first().copied().unwrap_or_default(),
                parts.get(1).copied(),
            )
        };
        let r = self.db.begin_read()?;
        let mut m = HashMap::new();
        let mut n = 0;
        for e in r.open_table(TURNS)?.iter()? {
            let (_, v) = e?;
            let rec = record_of(v.value())?;
            if owned(
                rec.turn.tenant.as_str().as_bytes(),
                Some(rec.turn.conversation_id.as_bytes()),
            ) {
                n += 1;
            }
        }
        m.insert("turn_nodes", n);
        n = 0;
        for e in r.open_table(FRAGMENTS)?.iter()? {
            let (_, v) = e?;
            let f: Fragment = serde_json::from_slice(v.value())?;
            if owned(
                f.tenant.as_str().as_bytes(),
                Some(f.conversation_id.as_bytes()),
            ) {
                n += 1;
            }
        }
        m.insert("fragments", n);
        macro_rules! count_keys {
            ($table:expr, $name:literal, $tagged:expr) => {{
                let mut n = 0u64;
                for e in r.open_table($table)?.iter()? {
                    let (k, _) = e?;
                    if by_key(k.value(), $tagged) {
                        n += 1;
                    }
                }
                m.insert($name, n);
            }};
        }
        count_keys!(CONV_TURNS, "conversation_turns", false);
        count_keys!(LINKS, "links", true);
        count_keys!(EXPIRED_LINKS, "expired_links", true);
        count_keys!(VOCAB, "vocabulary", true);
        count_keys!(CONV_STATE, "conversation_state", false);
        count_keys!(CONV_COUNT, "conversation_count", false);
        count_keys!(CONV_FRAGMENTS, "conversation_fragments", false);
        Ok(m)
    }

    /// Rows of any table whose key or value contains `needle` (e.g. a marker word): erasure checks.
    pub fn rows_containing(&self, needle: &[u8]) -> Result<u64, StoreError> {
        let has = |b: &[u8]| !needle.is_empty() && b.windows(needle.len()).any(|w| w == needle);
        let r = self.db.begin_read()?;
        let mut n = 0;
        // Records are compressed: what they hold is searched, not their bytes.
        for e in r.open_table(TURNS)?.iter()? {
            let (_, v) = e?;
            n += u64::from(has(&record_json(v.value())?));
        }
        macro_rules! scan {
            ($table:expr) => {{
                for e in r.open_table($table)?.iter()? {
                    let (k, _) = e?;
                    n += u64::from(has(k.value()));
                }
            }};
        }
        scan!(CONV_TURNS);
        scan!(LINKS);
        scan!(EXPIRED_LINKS);
        scan!(VOCAB);
        scan!(CONV_COUNT);
        scan!(CONV_FRAGMENTS);
        for table in [CONV_STATE, FRAGMENTS] {
            for e in r.open_table(table)?.iter()? {
                let (k, v) = e?;
                n += u64::from(has(k.value()) || has(v.value()));
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(s, 123_456_789).unwrap()
    }

    #[test]
    fn edge_times_round_trip_in_their_binary_layout() {
        for (valid_to, expired_at) in [
            (None, None),
            (Some(at(1_700_000_300)), None),
            (None, Some(at(1_700_000_400))),
            (Some(at(1_700_000_300)), Some(at(1_700_000_400))),
        ] {
            let t = EdgeTimes {
                valid_from: at(1_600_000_000),
                valid_to,
                recorded_at: at(1_700_000_000),
                expired_at,
            };
            let b = edge_bytes(&t);
            let ends = usize::from(valid_to.is_some()) + usize::from(expired_at.is_some());
            assert_eq!(b.len(), 18 + 8 * ends);
            assert_eq!(edge_times(&b).unwrap(), t);
        }
    }

    #[test]
    fn edge_times_written_as_json_by_older_stores_are_read() {
        let t = EdgeTimes {
            valid_from: at(1_600_000_000),
            valid_to: None,
            recorded_at: at(1_700_000_000),
            expired_at: Some(at(1_700_000_400)),
        };
        assert_eq!(edge_times(&serde_json::to_vec(&t).unwrap()).unwrap(), t);
    }

    #[test]
    fn damaged_edge_times_are_corrupt_not_misread() {
        let good = edge_bytes(&EdgeTimes {
            valid_from: at(1_600_000_000),
            valid_to: None,
            recorded_at: at(1_700_000_000),
            expired_at: None,
        });
        let mut wrong_flags = good.clone();
        wrong_flags[1] = 1; // says valid_to is there; it is not
        let mut unknown_version = good.clone();
        unknown_version[0] = 9;
        for b in [
            &[][..],
            &good[..17],
            &wrong_flags[..],
            &unknown_version[..],
            &[EDGE_V1, 4][..],
        ] {
            let e = edge_times(b).unwrap_err();
            assert!(matches!(e, StoreError::Corrupt { .. }), "{b:?}: {e}");
        }
    }

    #[test]
    fn turn_records_are_read_compressed_and_as_the_json_older_stores_wrote() {
        let json = br#"{"turn":{"user":"hello there, hello there, hello there"}}"#;
        let packed = zstd::bulk::compress(json, RECORD_ZSTD_LEVEL).unwrap();
        assert_ne!(packed.first(), Some(&b'{'));
        assert_eq!(&*record_json(&packed).unwrap(), &json[..]);
        assert_eq!(&*record_json(json).unwrap(), &json[..]);
        let e = record_json(b"\x28\xb5\x2f\xfd garbage").unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
    }
}
