//! The embedded graph: redb tables laid out so every Path B lookup is a prefix scan over one
//! conversation's keys (cost grows with the answer, not with the store).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use recollect_model::{Extraction, Fragment, Generations, MemoryId, TenantId, Turn};
use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction};

use crate::codec;
use crate::graph::postings::{self, Posting};
use crate::graph::{
    distinct, ConversationState, EdgeTimes, Erasures, Graph, GraphRead, LinkedTurn, NodeKind,
    Scope, TurnErasure, TurnRecord, VersionWrite,
};
use crate::keys;
use crate::numbering::{self, turn_key, turn_range};
use crate::StoreError;

/// memory id → TurnRecord ([`codec::record_bytes`])
const TURNS: TableDefinition<u128, &[u8]> = TableDefinition::new("turn_nodes");
/// tenant\0conversation\0 → the conversation's number, which the turn index and the postings
/// name it by (8 bytes instead of its spelled-out key in every row)
const CONV_IDS: TableDefinition<&[u8], u64> = TableDefinition::new("conversation_ids");
/// conversation number → tenant\0conversation\0 (audits, and the next number: last + 1)
const CONV_KEYS: TableDefinition<u64, &[u8]> = TableDefinition::new("conversation_keys");
/// conversation number (BE) + position (BE) → [`TurnEntry`]: the conversation's turns in order
const TURN_INDEX: TableDefinition<&[u8; 16], &[u8; 32]> = TableDefinition::new("turn_index");
/// The links, as packed posting lists: see [`postings`]
const POSTINGS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("postings");
/// tag + tenant\0conversation\0name\0 + memory id (BE) + expired at (ns, BE) → EdgeTimes
/// ([`edge_bytes`]): links an edit took away, kept for recall as of an earlier time. Apart from POSTINGS so
/// that recall of the present never reads them.
const EXPIRED_LINKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("expired_links");
/// tenant\0conversation\0 → ConversationState (JSON)
const CONV_STATE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("conversation_state");
/// tenant\0conversation\0 → turns stored
const CONV_COUNT: TableDefinition<&[u8], u64> = TableDefinition::new("conversation_count");
/// tenant\0fragment id\0 → Fragment ([`codec::fragment_bytes`])
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

/// Reads a stored turn record, naming its conversation from `names` (CONV_KEYS) when it is
/// stored by number.
fn record_in(
    names: &impl ReadableTable<u64, &'static [u8]>,
    b: &[u8],
) -> Result<TurnRecord, StoreError> {
    codec::record_of(b, |n| numbering::name_of(names, n))
}

/// A fragment member's record, as [`Graph::write_fragments`] needs it.
enum Member {
    Missing,
    /// Its position, and the record as stored (with a head: [`codec::record_head`]).
    Head(u64, Vec<u8>),
    Decoded(Box<TurnRecord>),
}

/// Reads many records against one view of CONV_KEYS, each conversation's name looked up
/// once (a recall reads hundreds of records of a few conversations).
struct Names<'a, T> {
    table: &'a T,
    seen: HashMap<u64, (String, String)>,
}

impl<'a, T: ReadableTable<u64, &'static [u8]>> Names<'a, T> {
    fn new(table: &'a T) -> Self {
        Self {
            table,
            seen: HashMap::new(),
        }
    }

    fn name(&mut self, n: u64) -> Result<(String, String), StoreError> {
        if let Some(name) = self.seen.get(&n) {
            return Ok(name.clone());
        }
        let name = numbering::name_of(self.table, n)?;
        self.seen.insert(n, name.clone());
        Ok(name)
    }

    fn record(&mut self, b: &[u8]) -> Result<TurnRecord, StoreError> {
        codec::record_of(b, |n| self.name(n))
    }

    fn fragment(&mut self, b: &[u8]) -> Result<Fragment, StoreError> {
        codec::fragment_of(b, |n| self.name(n))
    }
}

/// Turn records a generation holds at most (two generations: at most twice this many, about
/// 2–3 KB each decoded, so ~40 MB full).
const DECODED_TURNS: usize = 8_192;

/// Turn records already decoded, each beside the stored bytes it was decoded from. Recall reads
/// the same few hundred turns of a conversation question after question, and inflating and
/// decoding them was most of its store time; a read that finds the same bytes in the table
/// clones the decoded record instead. Checked against the bytes on every read, so no write has
/// to invalidate it: a conversation's number is never given twice, so the same bytes always
/// decode to the same record. Two generations, as the embedder's cache: recent records stay,
/// the total is bounded.
struct DecodedTurns {
    records: parking_lot::Mutex<Generations<u128, Decoded>>,
}

/// The stored bytes of a turn record (by memory id) and the record they decode to.
type Decoded = Arc<(Box<[u8]>, TurnRecord)>;

impl Default for DecodedTurns {
    fn default() -> Self {
        Self {
            records: parking_lot::Mutex::new(Generations::new(DECODED_TURNS)),
        }
    }
}

impl DecodedTurns {
    /// The record stored as `bytes` under `id`, decoded by `decode` unless it is cached.
    fn get_or_decode(
        &self,
        id: u128,
        bytes: &[u8],
        decode: impl FnOnce(&[u8]) -> Result<TurnRecord, StoreError>,
    ) -> Result<TurnRecord, StoreError> {
        let cached = self.records.lock().get(&id);
        if let Some(hit) = cached.filter(|hit| *hit.0 == *bytes) {
            return Ok(hit.1.clone());
        }
        let rec = decode(bytes)?;
        self.records
            .lock()
            .insert(id, Arc::new((bytes.into(), rec.clone())));
        Ok(rec)
    }

    fn clear(&self) {
        self.records.lock().clear();
    }
}

/// A turn record as stored: its conversation by the number `ids` (CONV_IDS) gives it. Every
/// record is written after its conversation is numbered; one that is not (which would be a
/// bug) is still written whole, with its names spelled out.
fn record_bytes(
    ids: &impl ReadableTable<&'static [u8], u64>,
    rec: &TurnRecord,
) -> Result<Vec<u8>, StoreError> {
    match conversation_number(ids, rec.turn.tenant.as_str(), &rec.turn.conversation_id)? {
        Some(n) => codec::numbered_record_bytes(rec, n),
        None => codec::record_bytes(rec),
    }
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

/// The memory ids of a conversation's turns, in order.
fn conversation_ids(
    w: &redb::WriteTransaction,
    tenant: &str,
    conversation: &str,
) -> Result<Vec<u128>, StoreError> {
    let Some(num) = conversation_number(&w.open_table(CONV_IDS)?, tenant, conversation)? else {
        return Ok(vec![]);
    };
    let index = w.open_table(TURN_INDEX)?;
    let r = turn_range(num);
    let ids = index
        .range::<&[u8; 16]>(r.start()..=r.end())?
        .map(|e| e.map(|(_, v)| TurnEntry::of(v.value()).id))
        .collect::<Result<_, _>>()?;
    Ok(ids)
}

/// Removes a conversation's turn index, links and expired links.
fn forget_conversation_links(
    w: &redb::WriteTransaction,
    tenant: &str,
    conversation: &str,
) -> Result<(), StoreError> {
    if let Some(num) = conversation_number(&w.open_table(CONV_IDS)?, tenant, conversation)? {
        let r = turn_range(num);
        w.open_table(TURN_INDEX)?
            .retain_in::<&[u8; 16], _>(r.start()..=r.end(), |_, _| false)?;
        let p = postings::conversation_prefix(num);
        let end = keys::prefix_end(&p);
        w.open_table(POSTINGS)?
            .retain_in(p.as_slice()..end.as_slice(), |_, _| false)?;
    }
    let mut expired = w.open_table(EXPIRED_LINKS)?;
    for kind in NodeKind::ALL {
        let p = conv_prefix(kind, tenant, conversation);
        let end = keys::prefix_end(&p);
        expired.retain_in(p.as_slice()..end.as_slice(), |_, _| false)?;
    }
    Ok(())
}

#[derive(Clone)]
pub struct EmbeddedGraph {
    db: Arc<Database>,
    decoded: Arc<DecodedTurns>,
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

/// A conversation's number, if it has one (it has stored turns).
fn conversation_number(
    ids: &impl ReadableTable<&'static [u8], u64>,
    tenant: &str,
    conversation: &str,
) -> Result<Option<u64>, StoreError> {
    numbering::number_of(ids, &keys::join(&[tenant, conversation]))
}

/// A conversation's number, given one (the last one + 1) on its first turn.
fn number_conversation(
    ids: &mut redb::Table<&'static [u8], u64>,
    numbers: &mut redb::Table<u64, &'static [u8]>,
    tenant: &str,
    conversation: &str,
) -> Result<u64, StoreError> {
    numbering::number_for(ids, numbers, &keys::join(&[tenant, conversation]))
}

/// Forgets a conversation's number (its turns are all gone).
fn unnumber_conversation(w: &redb::WriteTransaction, key: &[u8]) -> Result<(), StoreError> {
    numbering::forget(
        &mut w.open_table(CONV_IDS)?,
        &mut w.open_table(CONV_KEYS)?,
        key,
    )
}

/// A turn in its conversation's order: its memory id, and the times its links carry unless a
/// posting says otherwise (valid_from: its event time; recorded_at: when the graph first
/// wrote it), in ns since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TurnEntry {
    id: u128,
    valid_from: i64,
    recorded_at: i64,
}

impl TurnEntry {
    fn bytes(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..16].copy_from_slice(&self.id.to_be_bytes());
        b[16..24].copy_from_slice(&self.valid_from.to_be_bytes());
        b[24..].copy_from_slice(&self.recorded_at.to_be_bytes());
        b
    }

    fn of(b: &[u8; 32]) -> Self {
        let mut id = [0u8; 16];
        id.copy_from_slice(&b[..16]);
        let mut t = [0u8; 8];
        t.copy_from_slice(&b[16..24]);
        let valid_from = i64::from_be_bytes(t);
        t.copy_from_slice(&b[24..]);
        Self {
            id: u128::from_be_bytes(id),
            valid_from,
            recorded_at: i64::from_be_bytes(t),
        }
    }

    fn times(&self) -> (i64, i64) {
        (self.valid_from, self.recorded_at)
    }

    /// A link's times: its own, or else the turn's.
    fn edge(&self, p: &Posting) -> EdgeTimes {
        let (valid_from, recorded_at) = p.times.unwrap_or(self.times());
        EdgeTimes {
            valid_from: DateTime::from_timestamp_nanos(valid_from),
            valid_to: None,
            recorded_at: DateTime::from_timestamp_nanos(recorded_at),
            expired_at: None,
        }
    }
}

impl EmbeddedGraph {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut db = Database::create(path)?;
        let w = db.begin_write()?;
        let started = std::time::Instant::now();
        let upgraded = legacy::upgrade(&w)?;
        w.open_table(TURNS)?;
        w.open_table(CONV_IDS)?;
        w.open_table(CONV_KEYS)?;
        w.open_table(TURN_INDEX)?;
        w.open_table(POSTINGS)?;
        w.open_table(EXPIRED_LINKS)?;
        w.open_table(CONV_STATE)?;
        w.open_table(CONV_COUNT)?;
        w.open_table(FRAGMENTS)?;
        w.open_table(CONV_FRAGMENTS)?;
        w.open_table(ERASURES)?;
        w.open_table(TURN_ERASURES)?;
        w.open_table(PARTICIPANT_CONVS)?;
        w.open_table(CONV_PARTICIPANTS)?;
        w.commit()?;
        if let Some(links) = upgraded {
            // The older tables' pages are free now; give them back to the file system once.
            db.compact()?;
            tracing::info!(
                path = %path.display(),
                links,
                seconds = started.elapsed().as_secs_f64(),
                "graph: links rewritten as packed postings"
            );
        }
        Ok(Self {
            db: Arc::new(db),
            decoded: Default::default(),
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db)).await?
    }

    /// `consolidated_until` moved forward to `until` (never back), nothing else touched: a
    /// read-modify-write inside the caller's write transaction (redb serialises them), so the
    /// extractor's concurrent saves of the other fields are not undone.
    fn advance_in(
        t: &mut redb::Table<&[u8], &[u8]>,
        key: &[u8],
        until: u64,
    ) -> Result<(), StoreError> {
        let mut state: ConversationState = match t.get(key)? {
            Some(v) => codec::state_of(v.value())?,
            None => ConversationState::default(),
        };
        if state.consolidated_until >= until {
            return Ok(());
        }
        state.consolidated_until = until;
        let v = codec::state_bytes(&state)?;
        t.insert(key, v.as_slice())?;
        Ok(())
    }

    /// Fragment nodes and their members' links, inside the caller's write transaction.
    fn write_fragments_in(w: &WriteTransaction, fragments: &[Fragment]) -> Result<(), StoreError> {
        if fragments.is_empty() {
            return Ok(());
        }
        let mut ft = w.open_table(FRAGMENTS)?;
        let mut cf = w.open_table(CONV_FRAGMENTS)?;
        let mut nodes = w.open_table(TURNS)?;
        let (ids, names) = (w.open_table(CONV_IDS)?, w.open_table(CONV_KEYS)?);
        let erased = w.open_table(ERASURES)?;
        let erased_turns = w.open_table(TURN_ERASURES)?;
        for f in fragments {
            let t = f.tenant.as_str();
            let m = markers_in(&erased, &erased_turns, t, &[f.conversation_id.as_str()])?;
            let number = conversation_number(&ids, t, &f.conversation_id)?;
            // The members' records as stored, read once. A record of the fragment's
            // conversation with a head gives its position without being inflated; any
            // other (an older layout, or an erasure under way, which needs each turn) is
            // decoded.
            let mut members = Vec::with_capacity(f.members.len());
            for id in &f.members {
                let Some(v) = nodes.get(id.as_u128())? else {
                    members.push((*id, Member::Missing));
                    continue;
                };
                let stored = v.value().to_vec();
                drop(v);
                let head = codec::record_head(&stored)?
                    .filter(|h| m.is_empty() && Some(h.number) == number);
                members.push((
                    *id,
                    match head {
                        Some(h) => Member::Head(h.position, stored),
                        None => Member::Decoded(Box::new(record_in(&names, &stored)?)),
                    },
                ));
            }
            let whole = members.iter().all(|(_, r)| match r {
                Member::Missing => false,
                Member::Head(..) => true,
                Member::Decoded(r) => !m.covers_turn(&r.turn),
            });
            if !m.is_empty() && !whole {
                continue;
            }
            let positions: HashMap<MemoryId, u64> = members
                .iter()
                .filter_map(|(id, r)| match r {
                    Member::Missing => None,
                    Member::Head(p, _) => Some((*id, *p)),
                    Member::Decoded(r) => Some((*id, r.turn.position)),
                })
                .collect();
            let stored = match number {
                Some(n) => codec::numbered_fragment_bytes(f, n, |m| positions.get(&m).copied())?,
                None => codec::fragment_bytes(f)?,
            };
            ft.insert(keys::join(&[t, &f.id]).as_slice(), stored.as_slice())?;
            cf.insert(keys::join(&[t, &f.conversation_id, &f.id]).as_slice(), ())?;
            for (id, member) in members {
                let value = match member {
                    Member::Missing => continue,
                    Member::Head(_, stored) => match codec::record_with_fragment(&stored, &f.id)? {
                        Some(v) => v,
                        None => continue,
                    },
                    Member::Decoded(mut rec) => {
                        if rec.fragments.contains(&f.id) || rec.turn.tenant != f.tenant {
                            continue;
                        }
                        rec.fragments.push(f.id.clone());
                        record_bytes(&ids, &rec)?
                    }
                };
                nodes.insert(id.as_u128(), value.as_slice())?;
            }
        }
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
        Ok(keys::conversations_after(&t, tenant, None, usize::MAX)?)
    }

    fn write_turns_sync(db: &Database, turns: &[(Turn, Extraction)]) -> Result<(), StoreError> {
        let now = Utc::now();
        let w = db.begin_write()?;
        {
            let mut nodes = w.open_table(TURNS)?;
            let mut conv_ids = w.open_table(CONV_IDS)?;
            let mut conv_keys = w.open_table(CONV_KEYS)?;
            let mut index = w.open_table(TURN_INDEX)?;
            let mut links = w.open_table(POSTINGS)?;
            let mut expired = w.open_table(EXPIRED_LINKS)?;
            let mut count = w.open_table(CONV_COUNT)?;
            let mut by_part = w.open_table(PARTICIPANT_CONVS)?;
            let mut by_conv = w.open_table(CONV_PARTICIPANTS)?;
            // The erasure guard, under the write lock: an eraser's marker is either committed
            // before this transaction (and seen here) or after it (and its delete follows).
            let erased = w.open_table(ERASURES)?;
            let erased_turns = w.open_table(TURN_ERASURES)?;
            let mut markers: HashMap<(&str, &str), Erasures> = HashMap::new();
            // The batch's new links, per node: added together at the end, one read and write
            // per block rather than per link (a node's earlier links are flushed before one of
            // them is taken away). Not in key order: blocks inserted in order leave redb's
            // leaves half full as they split (+45 B a turn at 100k, docs/SPEED.md).
            let mut pending: HashMap<Vec<u8>, Vec<Posting>> = HashMap::new();
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
                    Some(v) => Some(record_in(&conv_keys, v.value())?),
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
                            rederiving: false,
                        },
                        None,
                    ),
                    Some(o) => match o.version_write(turn) {
                        VersionWrite::Stale => continue,
                        VersionWrite::Rewrite => (
                            TurnRecord {
                                turn: turn.clone(),
                                extraction: x.clone(),
                                rederiving: false,
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
                let num = number_conversation(&mut conv_ids, &mut conv_keys, tenant, cid)?;
                nodes.insert(id, codec::numbered_record_bytes(&record, num)?.as_slice())?;
                let valid_from = nanos(x.event_time.unwrap_or(turn.timestamp));
                let recorded_at = nanos(edited_at.unwrap_or(now));
                // The turn's entry keeps the times of its first write: links added later (a
                // re-derivation, an edit) carry their own when they differ.
                let tk = turn_key(num, turn.position);
                let stored = index.get(&tk)?.map(|v| TurnEntry::of(v.value()));
                let entry = match stored {
                    Some(e) if e.id == id => e,
                    _ => {
                        let e = TurnEntry {
                            id,
                            valid_from,
                            recorded_at,
                        };
                        index.insert(&tk, &e.bytes())?;
                        e
                    }
                };
                if old.is_none() {
                    let k = keys::join(&[tenant, cid]);
                    let n = count.get(k.as_slice())?.map(|v| v.value()).unwrap_or(0);
                    count.insert(k.as_slice(), n + 1)?;
                }
                for p in participants(turn) {
                    by_part.insert(keys::join(&[tenant, &p, cid]).as_slice(), ())?;
                    by_conv.insert(keys::join(&[tenant, cid, &p]).as_slice(), ())?;
                }
                let old_position = old.as_ref().map_or(turn.position, |o| o.turn.position);
                let own = (valid_from, recorded_at);
                let times = (own != entry.times()).then_some(own);
                for kind in NodeKind::ALL {
                    let new_names: BTreeSet<String> = kind.names(x).into_iter().collect();
                    let old_names: BTreeSet<String> = old
                        .as_ref()
                        .map(|o| kind.names(&o.extraction).into_iter().collect())
                        .unwrap_or_default();
                    // A re-derived extraction replaces its own links; an edit expires them.
                    for name in old_names.difference(&new_names) {
                        let prefix = postings::name_prefix(num, kind, name);
                        if let Some(adds) = pending.remove(&prefix) {
                            postings::insert_many(&mut links, &prefix, adds)?;
                        }
                        let Some(p) = postings::remove(&mut links, &prefix, old_position)? else {
                            continue;
                        };
                        if let Some(at) = edited_at {
                            let mut times = entry.edge(&p);
                            times.expired_at = Some(at);
                            let mut ek = link_prefix(kind, tenant, cid, name);
                            ek.extend_from_slice(&id.to_be_bytes());
                            ek.extend_from_slice(&nanos(at).to_be_bytes());
                            expired.insert(ek.as_slice(), edge_bytes(&times).as_slice())?;
                        }
                    }
                    for name in &new_names {
                        let prefix = postings::name_prefix(num, kind, name);
                        let p = Posting {
                            position: turn.position,
                            times,
                        };
                        pending.entry(prefix).or_default().push(p);
                    }
                }
            }
            for (prefix, adds) in pending {
                postings::insert_many(&mut links, &prefix, adds)?;
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
        let decoded = self.decoded.clone();
        self.blocking(move |db| {
            let r = db.begin_read()?;
            let t = r.open_table(TURNS)?;
            let keys = r.open_table(CONV_KEYS)?;
            let mut names = Names::new(&keys);
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                if let Some(v) = t.get(id.as_u128())? {
                    let rec =
                        decoded.get_or_decode(id.as_u128(), v.value(), |b| names.record(b))?;
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
        let (tenant, conversation) = (tenant.clone(), conversation.to_string());
        let decoded = self.decoded.clone();
        self.blocking(move |db| {
            let r = db.begin_read()?;
            let ids = r.open_table(CONV_IDS)?;
            let Some(num) = conversation_number(&ids, tenant.as_str(), &conversation)? else {
                return Ok(vec![]);
            };
            let idx = r.open_table(TURN_INDEX)?;
            let t = r.open_table(TURNS)?;
            let keys = r.open_table(CONV_KEYS)?;
            let mut names = Names::new(&keys);
            let mut out = Vec::new();
            if from >= to {
                return Ok(out);
            }
            for e in idx.range::<&[u8; 16]>(&turn_key(num, from)..&turn_key(num, to))? {
                let (_, v) = e?;
                let id = TurnEntry::of(v.value()).id;
                if let Some(v) = t.get(id)? {
                    out.push(decoded.get_or_decode(id, v.value(), |b| names.record(b))?);
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

    async fn conversations_after(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let (tenant, after) = (tenant.clone(), after.map(str::to_string));
        self.blocking(move |db| {
            let r = db.begin_read()?;
            let t = r.open_table(CONV_COUNT)?;
            Ok(keys::conversations_after(
                &t,
                tenant.as_str(),
                after.as_deref(),
                limit,
            )?)
        })
        .await
    }

    async fn known_conversations(
        &self,
        tenant: &TenantId,
        conversations: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let (tenant, asked) = (tenant.clone(), distinct(conversations));
        self.blocking(move |db| {
            let r = db.begin_read()?;
            let counts = r.open_table(CONV_COUNT)?;
            let mut out: Vec<String> = Vec::with_capacity(asked.len());
            for c in asked {
                if counts
                    .get(keys::join(&[tenant.as_str(), &c]).as_slice())?
                    .is_some()
                {
                    out.push(c);
                }
            }
            Ok(out)
        })
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
            let ids = r.open_table(CONV_IDS)?;
            let links = r.open_table(POSTINGS)?;
            let mut out = BTreeSet::new();
            for c in convs {
                let Some(num) = conversation_number(&ids, tenant.as_str(), &c)? else {
                    continue;
                };
                let p = postings::kind_prefix(num, kind);
                let end = keys::prefix_end(&p);
                // A name's blocks are adjacent: one name per run of keys.
                let mut last: Option<Vec<u8>> = None;
                for e in links.range(p.as_slice()..end.as_slice())? {
                    let (k, _) = e?;
                    let (_, _, name, _) = postings::parse_key(k.value())?;
                    if last.as_deref() != Some(name) {
                        out.insert(String::from_utf8_lossy(name).into_owned());
                        last = Some(name.to_vec());
                    }
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
        let names = distinct(names);
        self.blocking(move |db| {
            let convs = Self::scope_conversations(db, tenant.as_str(), &scope)?;
            let r = db.begin_read()?;
            let ids = r.open_table(CONV_IDS)?;
            let links = r.open_table(POSTINGS)?;
            let index = r.open_table(TURN_INDEX)?;
            let expired = r.open_table(EXPIRED_LINKS)?;
            let mut out = Vec::new();
            for c in &convs {
                let Some(num) = conversation_number(&ids, tenant.as_str(), c)? else {
                    continue;
                };
                for name in &names {
                    for p in postings::read(&links, &postings::name_prefix(num, kind, name))? {
                        let Some(entry) = index
                            .get(&turn_key(num, p.position))?
                            .map(|v| TurnEntry::of(v.value()))
                        else {
                            continue;
                        };
                        if (recorded_by.is_some() || valid_at.is_some())
                            && !entry.edge(&p).visible(recorded_by, valid_at)
                        {
                            continue;
                        }
                        out.push(LinkedTurn {
                            name: name.clone(),
                            memory_id: MemoryId::from_u128(entry.id),
                            conversation_id: c.clone(),
                        });
                    }
                    // As of an earlier time: the links edits have since taken away, too.
                    let Some(rb) = recorded_by else { continue };
                    let p = link_prefix(kind, tenant.as_str(), c, name);
                    let end = keys::prefix_end(&p);
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
            let ids = r.open_table(CONV_IDS)?;
            let links = r.open_table(POSTINGS)?;
            let cnt = r.open_table(CONV_COUNT)?;
            let mut total = 0;
            let mut df = vec![0u64; names.len()];
            for c in &convs {
                total += cnt
                    .get(keys::join(&[tenant.as_str(), c]).as_slice())?
                    .map(|x| x.value())
                    .unwrap_or(0);
                let Some(num) = conversation_number(&ids, tenant.as_str(), c)? else {
                    continue;
                };
                for (i, n) in names.iter().enumerate() {
                    df[i] += postings::frequency(&links, &postings::name_prefix(num, kind, n))?;
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
            let keys_t = r.open_table(CONV_KEYS)?;
            let mut names = Names::new(&keys_t);
            let mut out = Vec::new();
            for id in ids {
                if let Some(v) = t.get(keys::join(&[tenant.as_str(), &id]).as_slice())? {
                    out.push(names.fragment(v.value())?);
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
        self.write_consolidation(fragments.to_vec(), Vec::new())
            .await
    }

    async fn write_consolidation(
        &self,
        fragments: Vec<Fragment>,
        advances: Vec<(TenantId, String, u64)>,
    ) -> Result<(), StoreError> {
        if fragments.is_empty() && advances.is_empty() {
            return Ok(());
        }
        self.blocking(move |db| {
            let w = db.begin_write()?;
            Self::write_fragments_in(&w, &fragments)?;
            if !advances.is_empty() {
                let mut t = w.open_table(CONV_STATE)?;
                for (tenant, conversation, until) in &advances {
                    let k = keys::join(&[tenant.as_str(), conversation.as_str()]);
                    Self::advance_in(&mut t, &k, *until)?;
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
                Some(v) => codec::state_of(v.value()),
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
        let saved = self
            .save_conversation_states(vec![(
                tenant.clone(),
                conversation.to_string(),
                state.clone(),
            )])
            .await?;
        Ok(saved.first().copied().unwrap_or(false))
    }

    async fn save_conversation_states(
        &self,
        states: Vec<(TenantId, String, ConversationState)>,
    ) -> Result<Vec<bool>, StoreError> {
        if states.is_empty() {
            return Ok(Vec::new());
        }
        self.blocking(move |db| {
            let w = db.begin_write()?;
            let mut saved = Vec::with_capacity(states.len());
            {
                let erasures = w.open_table(ERASURES)?;
                let turn_erasures = w.open_table(TURN_ERASURES)?;
                let mut table = w.open_table(CONV_STATE)?;
                for (t, c, mut st) in states {
                    let m = markers_in(&erasures, &turn_erasures, t.as_str(), &[c.as_str()])?;
                    if m.marker(&c).is_some_and(|m| st.covered_by(m)) {
                        saved.push(false);
                        continue;
                    }
                    let k = keys::join(&[t.as_str(), c.as_str()]);
                    // The caller's copy may predate the consolidator's latest advance.
                    let until = table
                        .get(k.as_slice())?
                        .map(|v| codec::state_of(v.value()).map(|s| s.consolidated_until))
                        .transpose()?
                        .unwrap_or(0);
                    st.consolidated_until = st.consolidated_until.max(until);
                    let v = codec::state_bytes(&st)?;
                    table.insert(k.as_slice(), v.as_slice())?;
                    saved.push(true);
                }
            }
            w.commit()?;
            Ok(saved)
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
                    Some(v) => Some(codec::state_of(v.value())?),
                    None => None,
                };
                if let Some(state) = state {
                    let fresh = state.restarted();
                    states.insert(cp.as_slice(), codec::state_bytes(&fresh)?.as_slice())?;
                }
                let mut cf = w.open_table(CONV_FRAGMENTS)?;
                let mut ft = w.open_table(FRAGMENTS)?;
                for f in third_parts(&cf, &cp)? {
                    ft.remove(keys::join(&[&tenant, &f]).as_slice())?;
                }
                cf.retain_in(cp.as_slice()..cend.as_slice(), |_, _| false)?;
                let mut nodes = w.open_table(TURNS)?;
                let ids = conversation_ids(&w, &tenant, &conversation)?;
                let (numbers, names) = (w.open_table(CONV_IDS)?, w.open_table(CONV_KEYS)?);
                for id in ids {
                    let rec: Option<TurnRecord> = match nodes.get(id)? {
                        Some(v) => Some(record_in(&names, v.value())?),
                        None => None,
                    };
                    if let Some(mut rec) = rec {
                        rec.fragments.clear();
                        rec.rederiving = true;
                        nodes.insert(id, record_bytes(&numbers, &rec)?.as_slice())?;
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
        self.write_consolidation(
            Vec::new(),
            vec![(tenant.clone(), conversation.to_string(), until)],
        )
        .await
    }

    async fn record_erasure(
        &self,
        tenant: &TenantId,
        conversation: Option<&str>,
        at: DateTime<Utc>,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let k = keys::join(&[tenant.as_str(), conversation.unwrap_or("")]);
        // What the marker covers, counted from the per-conversation turn counts in the marker's
        // own transaction: no turn record is read.
        let (from, to) = match conversation {
            Some(_) => (k.clone(), keys::prefix_end(&k)),
            None => {
                let p = keys::join(&[tenant.as_str()]);
                let end = keys::prefix_end(&p);
                (p, end)
            }
        };
        self.blocking(move |db| {
            let w = db.begin_write()?;
            let mut held = Vec::new();
            {
                let mut t = w.open_table(ERASURES)?;
                let old = t.get(k.as_slice())?.map(|v| v.value());
                t.insert(k.as_slice(), old.unwrap_or(i64::MIN).max(nanos(at)))?;
                let counts = w.open_table(CONV_COUNT)?;
                for e in counts.range(from.as_slice()..to.as_slice())? {
                    let (key, n) = e?;
                    if let Some(c) = keys::split(key.value()).get(1) {
                        held.push((String::from_utf8_lossy(c).into_owned(), n.value()));
                    }
                }
            }
            w.commit()?;
            Ok(held)
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
        let n = self
            .blocking(move |db| {
                let w = db.begin_write()?;
                let n = Self::purge_sync(&w, &tenant, &conversation)?;
                w.commit()?;
                Ok(n)
            })
            .await?;
        // Erased text is not kept in memory either (the cache would not serve it: its bytes
        // are gone from the table).
        self.decoded.clear();
        Ok(n)
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
                let mut nodes = w.open_table(TURNS)?;
                let ids = conversation_ids(&w, &tenant, &conversation)?;
                n = ids.len() as u64;
                for id in ids {
                    nodes.remove(id)?;
                }
                forget_conversation_links(&w, &tenant, &conversation)?;
                unnumber_conversation(&w, &cp)?;
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
        .inspect(|_| self.decoded.clear())
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
        let mut removed: BTreeSet<u128> = BTreeSet::new();
        let mut erased: Vec<TurnRecord> = Vec::new();
        let num = conversation_number(&w.open_table(CONV_IDS)?, tenant, conversation)?;
        if let Some(num) = num {
            let mut index = w.open_table(TURN_INDEX)?;
            let mut links = w.open_table(POSTINGS)?;
            let mut expired = w.open_table(EXPIRED_LINKS)?;
            let names = w.open_table(CONV_KEYS)?;
            let r = turn_range(num);
            let entries: Vec<([u8; 16], TurnEntry)> = index
                .range::<&[u8; 16]>(r.start()..=r.end())?
                .map(|e| e.map(|(k, v)| (*k.value(), TurnEntry::of(v.value()))))
                .collect::<Result<_, _>>()?;
            for (key, entry) in entries {
                let id = entry.id;
                let rec: Option<TurnRecord> = match nodes.get(id)? {
                    Some(v) => Some(record_in(&names, v.value())?),
                    None => None,
                };
                if rec.as_ref().is_some_and(|r| !m.covers_turn(&r.turn)) {
                    continue;
                }
                index.remove(&key)?;
                let Some(rec) = rec else { continue };
                nodes.remove(id)?;
                removed.insert(id);
                erased.push(rec.clone());
                let position = u64::from_be_bytes(key[8..].try_into().unwrap_or_default());
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
                        let prefix = postings::name_prefix(num, kind, &name);
                        postings::remove(&mut links, &prefix, position)?;
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
        // Fragments with an erased (or already missing) member are erased data themselves.
        // Read before the conversation's number goes (below): fragments and records name it by it.
        {
            let mut cf = w.open_table(CONV_FRAGMENTS)?;
            let mut ft = w.open_table(FRAGMENTS)?;
            let (numbers, keys_t) = (w.open_table(CONV_IDS)?, w.open_table(CONV_KEYS)?);
            let mut names = Names::new(&keys_t);
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
                    Some(v) => Some(names.fragment(v.value())?),
                    None => None,
                };
                let mut erased = f.is_none();
                if let Some(f) = &f {
                    for m in &f.members {
                        erased |=
                            removed.contains(&m.as_u128()) || nodes.get(m.as_u128())?.is_none();
                    }
                }
                if !erased {
                    continue;
                }
                cf.remove(ck.as_slice())?;
                ft.remove(fk.as_slice())?;
                for m in f.map(|f| f.members).unwrap_or_default() {
                    let rec = match nodes.get(m.as_u128())? {
                        Some(v) => names.record(v.value())?,
                        None => continue,
                    };
                    let mut rec = rec;
                    rec.fragments.retain(|x| *x != fid);
                    nodes.insert(m.as_u128(), record_bytes(&numbers, &rec)?.as_slice())?;
                }
            }
        }
        if left == 0 {
            count.remove(cp.as_slice())?;
            forget_conversation_links(w, tenant, conversation)?;
            unnumber_conversation(w, &cp)?;
            // A partly erased conversation keeps its participants: the index may then name a
            // conversation with no turn of theirs left, which the turn filter still excludes.
            forget_participants(w, tenant, conversation)?;
        } else {
            count.insert(cp.as_slice(), left)?;
        }
        let mut states = w.open_table(CONV_STATE)?;
        // Only a conversation or tenant marker reaches the state; a single turn's erasure
        // leaves the rest of the conversation's state as it is.
        // Read (and inflated) once, and only where something may change it.
        let state = if marker.is_some() || !erased.is_empty() {
            states
                .get(cp.as_slice())?
                .map(|v| codec::state_of(v.value()))
                .transpose()?
        } else {
            None
        };
        match (state, marker) {
            (Some(state), Some(marker)) if state.covered_by(marker) => {
                states.remove(cp.as_slice())?;
            }
            // A turn erased on its own: out of the state goes what it put there.
            (Some(mut state), _) if !erased.is_empty() => {
                for rec in &erased {
                    crate::graph::forget_record(&mut state, rec);
                }
                states.insert(cp.as_slice(), codec::state_bytes(&state)?.as_slice())?;
            }
            _ => {}
        }
        Ok(removed.len() as u64)
    }

    /// Rows any table still holds of a tenant's conversation (erasure checks).
    pub fn residue(&self, tenant: &TenantId, conversation: &str) -> Result<u64, StoreError> {
        let r = self.db.begin_read()?;
        let cp = keys::join(&[tenant.as_str(), conversation]);
        let cend = keys::prefix_end(&cp);
        let mut n = 0;
        if let Some(num) =
            conversation_number(&r.open_table(CONV_IDS)?, tenant.as_str(), conversation)?
        {
            n += 1;
            let tr = turn_range(num);
            n += r
                .open_table(TURN_INDEX)?
                .range::<&[u8; 16]>(tr.start()..=tr.end())?
                .count() as u64;
            let p = postings::conversation_prefix(num);
            let end = keys::prefix_end(&p);
            n += r
                .open_table(POSTINGS)?
                .range(p.as_slice()..end.as_slice())?
                .count() as u64;
        }
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
        let expired = r.open_table(EXPIRED_LINKS)?;
        for kind in NodeKind::ALL {
            let p = conv_prefix(kind, tenant.as_str(), conversation);
            let end = keys::prefix_end(&p);
            n += expired.range(p.as_slice()..end.as_slice())?.count() as u64;
        }
        let keys_t = r.open_table(CONV_KEYS)?;
        let mut names = Names::new(&keys_t);
        for e in r.open_table(TURNS)?.iter()? {
            let (_, v) = e?;
            let rec = names.record(v.value())?;
            if rec.turn.tenant == *tenant && rec.turn.conversation_id == conversation {
                n += 1;
            }
        }
        for e in r.open_table(FRAGMENTS)?.iter()? {
            let (_, v) = e?;
            let f = names.fragment(v.value())?;
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
        m.insert("postings", r.open_table(POSTINGS)?.len()?);
        m.insert("expired_links", r.open_table(EXPIRED_LINKS)?.len()?);
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
        let keys_t = r.open_table(CONV_KEYS)?;
        let mut names = Names::new(&keys_t);
        for e in r.open_table(TURNS)?.iter()? {
            let (_, v) = e?;
            let rec = names.record(v.value())?;
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
            let f = names.fragment(v.value())?;
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
        count_keys!(EXPIRED_LINKS, "expired_links", true);
        // Rows keyed by conversation number: owned when the number's key is.
        let mut owned_numbers = BTreeSet::new();
        for e in r.open_table(CONV_KEYS)?.iter()? {
            let (k, v) = e?;
            if by_key(v.value(), false) {
                owned_numbers.insert(k.value());
            }
        }
        m.insert("conversation_ids", owned_numbers.len() as u64);
        let mut n = 0;
        for e in r.open_table(TURN_INDEX)?.iter()? {
            let (k, _) = e?;
            n += u64::from(owned_numbers.contains(&u64::from_be_bytes(
                k.value()[..8].try_into().unwrap_or_default(),
            )));
        }
        m.insert("turn_index", n);
        let (mut links, mut postings) = (0, 0);
        for e in r.open_table(POSTINGS)?.iter()? {
            let (k, v) = e?;
            if owned_numbers.contains(&postings::parse_key(k.value())?.0) {
                links += 1;
                postings += postings::count(v.value())?;
            }
        }
        // Links: blocks of the owned conversations; postings: the edges they hold.
        m.insert("links", links);
        m.insert("postings", postings);
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
            n += u64::from(has(&codec::content_of("turn record", v.value())?));
        }
        macro_rules! scan {
            ($table:expr) => {{
                for e in r.open_table($table)?.iter()? {
                    let (k, _) = e?;
                    n += u64::from(has(k.value()));
                }
            }};
        }
        scan!(POSTINGS);
        scan!(EXPIRED_LINKS);
        scan!(CONV_IDS);
        for e in r.open_table(CONV_KEYS)?.iter()? {
            n += u64::from(has(e?.1.value()));
        }
        scan!(CONV_COUNT);
        scan!(CONV_FRAGMENTS);
        for e in r.open_table(CONV_STATE)?.iter()? {
            let (k, v) = e?;
            n += u64::from(
                has(k.value()) || has(&codec::content_of("conversation state", v.value())?),
            );
        }
        for e in r.open_table(FRAGMENTS)?.iter()? {
            let (k, v) = e?;
            n += u64::from(has(k.value()) || has(&codec::content_of("fragment", v.value())?));
        }
        Ok(n)
    }
}

/// The layout stores wrote before packed postings: one row per edge (tenant, conversation and
/// name spelled out in its key, 18+ bytes of times), a vocabulary row per node, and the
/// conversation index keyed by tenant and conversation. [`upgrade`] rewrites it once, on open.
mod legacy {
    use redb::{TableHandle, WriteTransaction};

    use super::*;

    /// tenant\0conversation\0 + position (BE) → memory id
    const CONV_TURNS: TableDefinition<&[u8], u128> = TableDefinition::new("conversation_turns");
    /// tag + tenant\0conversation\0name\0 + memory id (BE) → EdgeTimes ([`edge_bytes`])
    pub(super) const LINKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("links");
    /// tag + tenant\0conversation\0name\0 → number of turns linked
    pub(super) const VOCAB: TableDefinition<&[u8], u64> = TableDefinition::new("vocabulary");

    fn text(b: &[u8]) -> &str {
        std::str::from_utf8(b).unwrap_or_default()
    }

    /// Moves the older layout's rows into the turn index and the postings, in the caller's
    /// transaction (all or nothing), and drops its tables. The links moved; None when the
    /// store had none of the older tables.
    pub(super) fn upgrade(w: &WriteTransaction) -> Result<Option<u64>, StoreError> {
        let tables: BTreeSet<String> = w.list_tables()?.map(|h| h.name().to_string()).collect();
        if ![LINKS.name(), VOCAB.name(), CONV_TURNS.name()]
            .iter()
            .any(|t| tables.contains(*t))
        {
            return Ok(None);
        }
        let corrupt = |what: &str| StoreError::corrupt_msg(format!("older graph layout: {what}"));
        let mut moved = 0u64;
        {
            let mut conv_ids = w.open_table(CONV_IDS)?;
            let mut conv_keys = w.open_table(CONV_KEYS)?;
            let mut index = w.open_table(TURN_INDEX)?;
            let mut links = w.open_table(POSTINGS)?;
            let nodes = w.open_table(TURNS)?;
            // memory id → (conversation number, position)
            let mut place: HashMap<u128, (u64, u64)> = HashMap::new();
            for e in w.open_table(CONV_TURNS)?.iter()? {
                let (k, v) = e?;
                let k = k.value();
                let split = k
                    .len()
                    .checked_sub(8)
                    .ok_or_else(|| corrupt("turn index key"))?;
                let (conv, pos) = k.split_at(split);
                let parts = keys::split(conv);
                let [tenant, conversation] = parts[..] else {
                    return Err(corrupt("turn index key"));
                };
                let num = number_conversation(
                    &mut conv_ids,
                    &mut conv_keys,
                    text(tenant),
                    text(conversation),
                )?;
                let pos = u64::from_be_bytes(pos.try_into().map_err(|_| corrupt("position"))?);
                place.insert(v.value(), (num, pos));
            }
            // A turn's times are those of the first of its links met; links that differ keep theirs.
            let mut base: HashMap<u128, (i64, i64)> = HashMap::new();
            let mut node: Option<(Vec<u8>, Vec<Posting>)> = None;
            let flush = |links: &mut redb::Table<&'static [u8], &'static [u8]>,
                         node: Option<(Vec<u8>, Vec<Posting>)>|
             -> Result<(), StoreError> {
                if let Some((prefix, mut list)) = node {
                    list.sort_by_key(|p| p.position);
                    list.dedup_by_key(|p| p.position);
                    postings::write_all(links, &prefix, &list)?;
                }
                Ok(())
            };
            for e in w.open_table(LINKS)?.iter()? {
                let (k, v) = e?;
                let k = k.value();
                let split = k.len().checked_sub(16).ok_or_else(|| corrupt("link key"))?;
                let (head, id) = k.split_at(split);
                let id = u128::from_be_bytes(id.try_into().map_err(|_| corrupt("link key"))?);
                let (&tag, rest) = head.split_first().ok_or_else(|| corrupt("link key"))?;
                let kind = NodeKind::ALL
                    .into_iter()
                    .find(|k| k.tag() == tag)
                    .ok_or_else(|| corrupt("link kind"))?;
                let [_, _, name] = keys::split(rest)[..] else {
                    return Err(corrupt("link key"));
                };
                // A link whose turn is gone leads nowhere: recall skipped it, so does this.
                let Some(&(num, position)) = place.get(&id) else {
                    continue;
                };
                let t = edge_times(v.value())?;
                let own = (nanos(t.valid_from), nanos(t.recorded_at));
                let turn = *base.entry(id).or_insert(own);
                let prefix = postings::name_prefix(num, kind, text(name));
                if node.as_ref().is_none_or(|(p, _)| *p != prefix) {
                    flush(&mut links, node.take())?;
                    node = Some((prefix, Vec::new()));
                }
                if let Some((_, list)) = node.as_mut() {
                    list.push(Posting {
                        position,
                        times: (own != turn).then_some(own),
                    });
                }
                moved += 1;
            }
            flush(&mut links, node.take())?;
            for (id, (num, position)) in place {
                let (valid_from, recorded_at) = match base.get(&id) {
                    Some(b) => *b,
                    None => match nodes.get(id)? {
                        Some(v) => {
                            let rec = record_in(&conv_keys, v.value())?;
                            let from = rec.extraction.event_time.unwrap_or(rec.turn.timestamp);
                            (nanos(from), nanos(rec.turn.recorded_at))
                        }
                        None => continue,
                    },
                };
                let entry = TurnEntry {
                    id,
                    valid_from,
                    recorded_at,
                };
                index.insert(&turn_key(num, position), &entry.bytes())?;
            }
        }
        w.delete_table(LINKS)?;
        w.delete_table(VOCAB)?;
        w.delete_table(CONV_TURNS)?;
        Ok(Some(moved))
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

    fn legacy_turn(pos: u64, words: &[&str]) -> (Turn, Extraction) {
        let tenant = TenantId("t".into());
        let mut turn: Turn = serde_json::from_value(serde_json::json!({
            "tenant": "t", "conversation_id": "c", "turn_id": pos.to_string(), "position": pos,
            "user": format!("turn {pos}"), "timestamp": at(1_600_000_000 + pos as i64 * 60),
            "recorded_at": at(1_700_000_000),
        }))
        .unwrap();
        turn.memory_id = MemoryId::derive(&tenant, "c", &pos.to_string());
        let x = Extraction {
            keywords: words
                .iter()
                .map(|w| recollect_model::Keyword {
                    key: w.to_string(),
                    text: w.to_string(),
                })
                .collect(),
            entities: vec!["Ana".into()],
            ..Default::default()
        };
        (turn, x)
    }

    /// A decoded record is served again only for the bytes it was decoded from: an edit, a
    /// record rewritten under the graph's feet and an erasure each read what the table holds.
    #[tokio::test]
    async fn decoded_records_are_served_only_for_the_bytes_they_came_from() {
        let dir = tempfile::tempdir().unwrap();
        let g = EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap();
        let tenant = TenantId("t".into());
        let turns: Vec<(Turn, Extraction)> = (0..3).map(|p| legacy_turn(p, &["dog"])).collect();
        g.write_turns(&turns).await.unwrap();
        let ids: Vec<MemoryId> = turns.iter().map(|(t, _)| t.memory_id).collect();
        let users = |recs: Vec<TurnRecord>| -> Vec<String> {
            recs.into_iter().map(|r| r.turn.user).collect()
        };
        for _ in 0..2 {
            assert_eq!(
                users(g.turns(&tenant, &ids).await.unwrap()),
                ["turn 0", "turn 1", "turn 2"]
            );
            assert_eq!(
                users(g.conversation_turns(&tenant, "c", 0, 3).await.unwrap()),
                ["turn 0", "turn 1", "turn 2"]
            );
        }
        // The turn written again with other text.
        let (mut edited, x) = turns[1].clone();
        edited.user = "turn 1, edited".into();
        g.write_turns(&[(edited, x)]).await.unwrap();
        let read = g.turns(&tenant, &ids[1..2]).await.unwrap();
        assert_eq!(read[0].turn.user, "turn 1, edited");
        assert_eq!(
            users(g.conversation_turns(&tenant, "c", 1, 2).await.unwrap()),
            ["turn 1, edited"]
        );
        // Bytes written past the graph (as an older store's layout would be).
        let mut rec = g.turns(&tenant, &ids[2..3]).await.unwrap().remove(0);
        rec.fragments = vec!["f9".into()];
        {
            let w = g.db.begin_write().unwrap();
            w.open_table(TURNS)
                .unwrap()
                .insert(
                    ids[2].as_u128(),
                    codec::record_bytes(&rec).unwrap().as_slice(),
                )
                .unwrap();
            w.commit().unwrap();
        }
        assert_eq!(
            g.turns(&tenant, &ids[2..3]).await.unwrap()[0].fragments,
            ["f9"]
        );
        // Erased: nothing read, nothing kept.
        g.delete_conversation(&tenant, "c").await.unwrap();
        assert!(g.turns(&tenant, &ids).await.unwrap().is_empty());
        assert!(g.decoded.records.lock().is_empty());
    }

    /// Records name their conversation by number, not by its tenant and id; an erased
    /// conversation's number is not given to the next one; records an older store wrote with
    /// the names spelled out are still read, and rewritten by number.
    #[tokio::test]
    async fn records_name_their_conversation_by_number() {
        let dir = tempfile::tempdir().unwrap();
        let g = EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap();
        let of = |tenant: &str, conversation: &str| -> Vec<(Turn, Extraction)> {
            (0..3)
                .map(|p| {
                    let (mut t, x) = legacy_turn(p, &["dog"]);
                    t.tenant = TenantId(tenant.into());
                    t.conversation_id = conversation.into();
                    t.memory_id = MemoryId::derive(&t.tenant, conversation, &t.turn_id);
                    (t, x)
                })
                .collect()
        };
        let layouts = |g: &EmbeddedGraph| -> Vec<u8> {
            let r = g.db.begin_read().unwrap();
            let t = r.open_table(TURNS).unwrap();
            let mut v: Vec<u8> = t.iter().unwrap().map(|e| e.unwrap().1.value()[0]).collect();
            v.sort();
            v
        };
        let number = |g: &EmbeddedGraph, key: &[&str]| {
            let r = g.db.begin_read().unwrap();
            numbering::number_of(&r.open_table(CONV_IDS).unwrap(), &keys::join(key)).unwrap()
        };
        let first = of("t", "c");
        g.write_turns(&first).await.unwrap();
        assert_eq!(layouts(&g), vec![6; 3]);
        assert_eq!(number(&g, &["t", "c"]), Some(1));
        let ids: Vec<MemoryId> = first.iter().map(|(t, _)| t.memory_id).collect();
        let read = g.turns(&TenantId("t".into()), &ids).await.unwrap();
        assert_eq!(
            read.iter().map(|r| r.turn.clone()).collect::<Vec<_>>(),
            first.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>()
        );
        g.delete_conversation(&TenantId("t".into()), "c")
            .await
            .unwrap();
        let second = of("u", "d");
        g.write_turns(&second).await.unwrap();
        assert_eq!(
            number(&g, &["u", "d"]),
            Some(2),
            "an erased number given again"
        );
        // One record as an older store wrote it, names spelled out: read, and rewritten by
        // number when the record next changes.
        let (t0, x0) = second[0].clone();
        let old = TurnRecord {
            turn: t0.clone(),
            extraction: x0,
            fragments: vec![],
            history: vec![],
            rederiving: false,
        };
        {
            let w = g.db.begin_write().unwrap();
            w.open_table(TURNS)
                .unwrap()
                .insert(
                    t0.memory_id.as_u128(),
                    codec::record_bytes(&old).unwrap().as_slice(),
                )
                .unwrap();
            w.commit().unwrap();
        }
        assert_eq!(layouts(&g), vec![2, 6, 6]);
        let u = TenantId("u".into());
        let window = g.conversation_turns(&u, "d", 0, 3).await.unwrap();
        assert_eq!(window[0], old);
        assert!(g
            .turns(&TenantId("t".into()), &[t0.memory_id])
            .await
            .unwrap()
            .is_empty());
        let fragment = Fragment {
            id: "f".into(),
            tenant: u.clone(),
            conversation_id: "d".into(),
            description: "dog".into(),
            // One member not in the graph: kept by its id.
            members: vec![t0.memory_id, second[2].0.memory_id, MemoryId::from_u128(5)],
            keywords: vec!["dog".into()],
            created_at: at(1_700_000_000),
        };
        g.write_fragments(std::slice::from_ref(&fragment))
            .await
            .unwrap();
        assert_eq!(layouts(&g), vec![6; 3]);
        assert_eq!(
            g.fragments(&u, &["f".into()]).await.unwrap(),
            vec![fragment.clone()]
        );
        {
            let r = g.db.begin_read().unwrap();
            let t = r.open_table(FRAGMENTS).unwrap();
            let stored = t.get(keys::join(&["u", "f"]).as_slice()).unwrap().unwrap();
            let by_id = codec::numbered_fragment_bytes(&fragment, 2, |_| None).unwrap();
            // Two members by position (1 byte each) rather than 16 bytes.
            assert_eq!(stored.value()[0], 4);
            assert!(
                stored.value().len() + 20 < by_id.len(),
                "{:?}",
                stored.value()
            );
        }
        // The older record was decoded and written again; the other member took the id in its
        // head.
        for (t, _) in [&second[0], &second[2]] {
            let rec = g.turns(&u, &[t.memory_id]).await.unwrap().remove(0);
            assert_eq!((&rec.turn, rec.fragments), (t, vec!["f".to_string()]));
        }
        let rec = g
            .turns(&u, &[second[1].0.memory_id])
            .await
            .unwrap()
            .remove(0);
        assert!(rec.fragments.is_empty());
    }

    /// A store written in the layout before packed postings (one row per edge, a vocabulary,
    /// the conversation index by tenant and conversation) opens with every link, its times
    /// and every turn in place, and without the older tables.
    #[tokio::test]
    async fn a_store_of_the_older_layout_is_upgraded_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.redb");
        let turns: Vec<(Turn, Extraction)> = (0..300)
            .map(|p| {
                legacy_turn(
                    p,
                    if p % 2 == 0 {
                        &["dog", "walk"]
                    } else {
                        &["cat"]
                    },
                )
            })
            .collect();
        // Turn 7's "cat" link was added later (a re-derivation): its own recorded_at.
        let late = at(1_800_000_000);
        {
            let db = Database::create(&path).unwrap();
            let w = db.begin_write().unwrap();
            {
                let mut nodes = w.open_table(TURNS).unwrap();
                let mut conv = w
                    .open_table(TableDefinition::<&[u8], u128>::new("conversation_turns"))
                    .unwrap();
                let mut links = w.open_table(legacy::LINKS).unwrap();
                let mut vocab = w.open_table(legacy::VOCAB).unwrap();
                for (turn, x) in &turns {
                    let id = turn.memory_id.as_u128();
                    let rec = TurnRecord {
                        turn: turn.clone(),
                        extraction: x.clone(),
                        fragments: vec![],
                        history: vec![],
                        rederiving: false,
                    };
                    nodes
                        .insert(id, codec::record_bytes(&rec).unwrap().as_slice())
                        .unwrap();
                    let mut ck = keys::join(&["t", "c"]);
                    ck.extend_from_slice(&turn.position.to_be_bytes());
                    conv.insert(ck.as_slice(), id).unwrap();
                    for kind in NodeKind::ALL {
                        for name in kind.names(x) {
                            let mut lk = link_prefix(kind, "t", "c", &name);
                            let vk = lk.clone();
                            lk.extend_from_slice(&id.to_be_bytes());
                            let recorded_at = if turn.position == 7 {
                                late
                            } else {
                                at(1_700_000_000)
                            };
                            let times = EdgeTimes {
                                valid_from: turn.timestamp,
                                valid_to: None,
                                recorded_at,
                                expired_at: None,
                            };
                            // The very first stores wrote JSON times.
                            let v = if turn.position == 3 {
                                serde_json::to_vec(&times).unwrap()
                            } else {
                                edge_bytes(&times)
                            };
                            links.insert(lk.as_slice(), v.as_slice()).unwrap();
                            let n = vocab
                                .get(vk.as_slice())
                                .unwrap()
                                .map(|v| v.value())
                                .unwrap_or(0);
                            vocab.insert(vk.as_slice(), n + 1).unwrap();
                        }
                    }
                }
            }
            w.commit().unwrap();
        }
        let g = EmbeddedGraph::open(&path).unwrap();
        let t = TenantId("t".into());
        let scope = Scope::of(&["c"]);
        let ids = |v: Vec<LinkedTurn>| -> BTreeSet<MemoryId> {
            v.into_iter().map(|l| l.memory_id).collect()
        };
        let want = |odd: bool| -> BTreeSet<MemoryId> {
            turns
                .iter()
                .filter(|(t, _)| (t.position % 2 == 1) == odd)
                .map(|(t, _)| t.memory_id)
                .collect()
        };
        let dog = g
            .linked_turns(&t, &scope, NodeKind::Keyword, &["dog".into()], None, None)
            .await
            .unwrap();
        assert_eq!(ids(dog), want(false));
        let cat = g
            .linked_turns(&t, &scope, NodeKind::Keyword, &["cat".into()], None, None)
            .await
            .unwrap();
        assert_eq!(ids(cat), want(true));
        // As recorded before turn 7's late link: every cat but turn 7.
        let before = g
            .linked_turns(
                &t,
                &scope,
                NodeKind::Keyword,
                &["cat".into()],
                Some(at(1_750_000_000)),
                None,
            )
            .await
            .unwrap();
        let mut early = want(true);
        early.remove(&turns[7].0.memory_id);
        assert_eq!(ids(before), early);
        // Held in the world before turn 100's time: turns 0..=100.
        let valid = g
            .linked_turns(
                &t,
                &scope,
                NodeKind::Entity,
                &["ana".into()],
                None,
                Some(turns[100].0.timestamp),
            )
            .await
            .unwrap();
        assert_eq!(valid.len(), 101);
        assert_eq!(
            g.vocabulary(&t, &scope, NodeKind::Keyword).await.unwrap(),
            vec!["cat".to_string(), "dog".into(), "walk".into()]
        );
        let (total, df) = g
            .document_frequencies(
                &t,
                &scope,
                NodeKind::Keyword,
                &["dog".into(), "cat".into(), "none".into()],
            )
            .await
            .unwrap();
        assert_eq!(
            (total, df),
            (0, vec![150, 150, 0]),
            "the count table was not part of the test layout"
        );
        let window = g.conversation_turns(&t, "c", 10, 20).await.unwrap();
        let positions: Vec<u64> = window.iter().map(|r| r.turn.position).collect();
        assert_eq!(positions, (10..20).collect::<Vec<_>>());
        let r = g.db.begin_read().unwrap();
        let tables: BTreeSet<String> = r
            .list_tables()
            .unwrap()
            .map(|h| redb::TableHandle::name(&h).to_string())
            .collect();
        for old in ["links", "vocabulary", "conversation_turns"] {
            assert!(!tables.contains(old), "{old} is still there: {tables:?}");
        }
        drop(r);
        drop(g);
        // A second open finds nothing to upgrade and the same links.
        let g = EmbeddedGraph::open(&path).unwrap();
        let dog = g
            .linked_turns(&t, &scope, NodeKind::Keyword, &["dog".into()], None, None)
            .await
            .unwrap();
        assert_eq!(ids(dog), want(false));
    }
}
