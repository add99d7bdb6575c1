//! The raw-turn store: every accepted turn, written durably (fsync on commit) before the client
//! hears 202, plus the set of turns whose enrichment has not finished. Everything derived can be
//! rebuilt from here; on start the pending set is replayed through the pipeline.

use std::path::Path;
use std::sync::Arc;

use chrono::Utc;
use recollect_model::{MemoryId, TenantId, Turn, TurnInput};
use redb::{
    Database, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle, WriteTransaction,
};

use crate::codec;
use crate::keys;
use crate::numbering::{self, number_of, turn_key, turn_range};
use crate::StoreError;

/// memory id → Turn ([`codec::turn_bytes`]; JSON in older stores)
const TURNS: TableDefinition<u128, &[u8]> = TableDefinition::new("turns");
/// conversation number (BE) + position (BE) → memory id: a conversation's turns in order
const TURN_POSITIONS: TableDefinition<&[u8; 16], u128> = TableDefinition::new("turn_positions");
/// tenant\0conversation\0 → the conversation's number, which [`TURN_POSITIONS`] names it by (8
/// bytes instead of its tenant and id spelled out in every turn's key)
const CONV_NUMBERS: TableDefinition<&[u8], u64> = TableDefinition::new("conversation_numbers");
/// conversation number → tenant\0conversation\0 (audits; the next number is the last + 1)
const CONV_NAMES: TableDefinition<u64, &[u8]> = TableDefinition::new("conversation_names");
/// What stores before conversation numbers kept instead of [`TURN_POSITIONS`]: tenant\0
/// conversation\0 + position (BE) → memory id. Rewritten on open ([`renumber`]).
const LEGACY_CONV_INDEX: TableDefinition<&[u8], u128> = TableDefinition::new("conversation_index");
/// tenant\0conversation\0 → next position
const CONV_NEXT: TableDefinition<&[u8], u64> = TableDefinition::new("conversation_next");
/// memory id → () for turns not yet stored by the graph-writer
const PENDING: TableDefinition<u128, ()> = TableDefinition::new("pending");
/// memory id (BE) + version (BE) → Turn ([`turn_bytes`]): versions an edit replaced, `expired_at` set
const VERSIONS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("turn_versions");
/// The store's settings that outlive a version of the code: [`OF_TURN_FROM`].
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The first conversation number whose turns all have [`MemoryId::of_turn`] ids. Conversations
/// numbered before it may hold turns under their hashed id ([`MemoryId::derive`]), which a
/// retry must still find.
const OF_TURN_FROM: &str = "of_turn_ids_from";

/// A turn as the raw store keeps it: its conversation named by number when it has one (every
/// conversation appended since numbers exist), so the turn does not spell out its tenant and id.
fn turn_bytes(t: &Turn, number: Option<u64>) -> Result<Vec<u8>, StoreError> {
    match number {
        Some(n) => codec::numbered_turn_bytes(t, n),
        None => codec::turn_bytes(t),
    }
}

/// Reads a stored turn, naming its conversation from `names` when it is stored by number.
fn turn_of(names: &impl ReadableTable<u64, &'static [u8]>, b: &[u8]) -> Result<Turn, StoreError> {
    codec::raw_turn_of(b, |n| numbering::name_of(names, n))
}

/// The number of the conversation `conv_key`, given one if it has none.
fn number_for(w: &WriteTransaction, conv_key: &[u8]) -> Result<u64, StoreError> {
    numbering::number_for(
        &mut w.open_table(CONV_NUMBERS)?,
        &mut w.open_table(CONV_NAMES)?,
        conv_key,
    )
}

/// Rewrites a store's conversation index from before conversation numbers
/// ([`LEGACY_CONV_INDEX`]) into [`TURN_POSITIONS`], in the caller's transaction; the number
/// of turns moved, or None when there was nothing to rewrite.
fn renumber(w: &WriteTransaction) -> Result<Option<u64>, StoreError> {
    let legacy = w
        .list_tables()?
        .any(|h| h.name() == LEGACY_CONV_INDEX.name());
    if !legacy {
        return Ok(None);
    }
    let rows: Vec<(Vec<u8>, u128)> = w
        .open_table(LEGACY_CONV_INDEX)?
        .iter()?
        .map(|e| e.map(|(k, v)| (k.value().to_vec(), v.value())))
        .collect::<Result<_, _>>()?;
    let mut moved = 0;
    for (key, id) in rows {
        let Some(split) = key.len().checked_sub(8) else {
            return Err(StoreError::corrupt_msg(
                "conversation index key shorter than a position",
            ));
        };
        let (conv_key, pos) = key.split_at(split);
        let mut position = [0u8; 8];
        position.copy_from_slice(pos);
        let n = number_for(w, conv_key)?;
        w.open_table(TURN_POSITIONS)?
            .insert(&turn_key(n, u64::from_be_bytes(position)), id)?;
        moved += 1;
    }
    w.delete_table(LEGACY_CONV_INDEX)?;
    Ok(Some(moved))
}

fn version_key(id: MemoryId, version: u32) -> [u8; 20] {
    let mut k = [0u8; 20];
    k[..16].copy_from_slice(&id.as_u128().to_be_bytes());
    k[16..].copy_from_slice(&version.to_be_bytes());
    k
}

/// The key range of every stored version of `id`.
fn version_range(id: MemoryId) -> std::ops::Range<[u8; 20]> {
    version_key(id, 0)..{
        let mut end = version_key(id, u32::MAX);
        end[19] = u8::MAX;
        end
    }
}

/// Earlier versions of `id`, oldest first.
fn versions_in(
    t: &impl ReadableTable<&'static [u8], &'static [u8]>,
    names: &impl ReadableTable<u64, &'static [u8]>,
    id: MemoryId,
) -> Result<Vec<Turn>, StoreError> {
    let r = version_range(id);
    let mut out = Vec::new();
    for e in t.range(r.start.as_slice()..=r.end.as_slice())? {
        out.push(turn_of(names, e?.1.value())?);
    }
    Ok(out)
}

#[derive(Clone)]
pub struct RawStore {
    db: Arc<Database>,
    /// [`OF_TURN_FROM`], fixed when the store is first opened by a version that knows it.
    of_turn_from: u64,
}

/// The outcome of appending one input.
#[derive(Debug, Clone)]
pub struct Appended {
    pub turn: Turn,
    /// False when the same turn (same memory id) was already stored: a retry.
    pub new: bool,
}

impl RawStore {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut db = Database::create(path)?;
        let w = db.begin_write()?;
        w.open_table(TURNS)?;
        w.open_table(TURN_POSITIONS)?;
        w.open_table(CONV_NUMBERS)?;
        w.open_table(CONV_NAMES)?;
        w.open_table(CONV_NEXT)?;
        w.open_table(PENDING)?;
        w.open_table(VERSIONS)?;
        let started = std::time::Instant::now();
        let renumbered = renumber(&w)?;
        let of_turn_from = {
            let mut meta = w.open_table(META)?;
            let known = meta.get(OF_TURN_FROM)?.map(|v| v.value());
            match known {
                Some(n) => n,
                None => {
                    // Every conversation numbered so far was written with hashed ids.
                    let next = w
                        .open_table(CONV_NAMES)?
                        .last()?
                        .map_or(1, |(k, _)| k.value() + 1);
                    meta.insert(OF_TURN_FROM, next)?;
                    next
                }
            }
        };
        w.commit()?;
        if let Some(turns) = renumbered {
            // The older index's pages are free now; give them back to the file system once.
            db.compact()?;
            tracing::info!(
                turns,
                secs = started.elapsed().as_secs_f64(),
                "raw store: conversation index rewritten by conversation number, file compacted"
            );
        }
        Ok(Self {
            db: Arc::new(db),
            of_turn_from,
        })
    }

    /// Appends turns to a conversation in one durable transaction. Inputs must be validated.
    pub fn append(
        &self,
        tenant: &TenantId,
        conversation: &str,
        inputs: &[TurnInput],
    ) -> Result<Vec<Appended>, StoreError> {
        let conv_key = keys::join(&[tenant.as_str(), conversation]);
        let now = recollect_model::now_micros();
        let w = self.db.begin_write()?;
        let mut out = Vec::with_capacity(inputs.len());
        {
            let number = number_for(&w, &conv_key)?;
            let names = w.open_table(CONV_NAMES)?;
            let mut turns = w.open_table(TURNS)?;
            let mut index = w.open_table(TURN_POSITIONS)?;
            let mut next = w.open_table(CONV_NEXT)?;
            let mut pending = w.open_table(PENDING)?;
            let mut position = next
                .get(conv_key.as_slice())?
                .map(|v| v.value())
                .unwrap_or(0);
            for input in inputs {
                let turn_id = input
                    .turn_id
                    .clone()
                    .unwrap_or_else(|| position.to_string());
                let [id, hashed] = MemoryId::forms_of_turn(tenant, conversation, &turn_id);
                // A turn stored before ids grouped by conversation keeps its hashed id.
                let mut existing = turns.get(id.as_u128())?;
                if existing.is_none() && number < self.of_turn_from {
                    existing = turns.get(hashed.as_u128())?;
                }
                let existing = existing.map(|v| turn_of(&names, v.value())).transpose()?;
                if let Some(turn) = existing {
                    // A retry of the store that made any version (an edit may have followed).
                    let retry = turn.same_content(input)
                        || versions_in(&w.open_table(VERSIONS)?, &names, turn.memory_id)?
                            .iter()
                            .any(|v| v.same_content(input));
                    // Dropping the transaction stores nothing of the request.
                    if !retry {
                        return Err(StoreError::Conflict(turn.conflict_message(out.len())));
                    }
                    out.push(Appended { turn, new: false });
                    continue;
                }
                let turn = Turn {
                    memory_id: id,
                    tenant: tenant.clone(),
                    conversation_id: conversation.to_string(),
                    turn_id,
                    position,
                    user: input.user.clone(),
                    assistant: input.assistant.clone().unwrap_or_default(),
                    user_speaker: input.user_speaker.clone(),
                    assistant_speaker: input.assistant_speaker.clone(),
                    timestamp: input.timestamp,
                    recorded_at: now,
                    metadata: input.metadata.clone(),
                    user_id: input.user_id.clone(),
                    agent_id: input.agent_id.clone(),
                    version: 1,
                    first_recorded_at: None,
                    expired_at: None,
                };
                turns.insert(id.as_u128(), turn_bytes(&turn, Some(number))?.as_slice())?;
                index.insert(&turn_key(number, position), id.as_u128())?;
                pending.insert(id.as_u128(), ())?;
                position += 1;
                out.push(Appended { turn, new: true });
            }
            next.insert(conv_key.as_slice(), position)?;
        }
        w.commit()?;
        Ok(out)
    }

    /// Applies an edit to a turn of `tenant` in one durable transaction: the current version
    /// moves to the history (expired now), the new one becomes current and pending. None when
    /// there is no such turn; `new: false` when the edit changes nothing (a retry).
    pub fn edit(
        &self,
        tenant: &TenantId,
        id: MemoryId,
        patch: &recollect_model::TurnPatch,
    ) -> Result<Option<Appended>, StoreError> {
        let w = self.db.begin_write()?;
        let next = {
            let names = w.open_table(CONV_NAMES)?;
            let mut turns = w.open_table(TURNS)?;
            let current: Turn = match turns.get(id.as_u128())? {
                Some(v) => turn_of(&names, v.value())?,
                None => return Ok(None),
            };
            if current.tenant != *tenant {
                return Ok(None);
            }
            let Some(next) = patch.apply(&current, recollect_model::now_micros()) else {
                return Ok(Some(Appended {
                    turn: current,
                    new: false,
                }));
            };
            let conv_key = keys::join(&[tenant.as_str(), &current.conversation_id]);
            let number = number_of(&w.open_table(CONV_NUMBERS)?, &conv_key)?;
            let mut old = current;
            old.expired_at = Some(next.recorded_at);
            w.open_table(VERSIONS)?.insert(
                version_key(id, old.version).as_slice(),
                turn_bytes(&old, number)?.as_slice(),
            )?;
            turns.insert(id.as_u128(), turn_bytes(&next, number)?.as_slice())?;
            w.open_table(PENDING)?.insert(id.as_u128(), ())?;
            next
        };
        w.commit()?;
        Ok(Some(Appended {
            turn: next,
            new: true,
        }))
    }

    /// Every version of a turn of `tenant`, oldest first, the current one last; empty when
    /// there is no such turn.
    pub fn versions(&self, tenant: &TenantId, id: MemoryId) -> Result<Vec<Turn>, StoreError> {
        let r = self.db.begin_read()?;
        let names = r.open_table(CONV_NAMES)?;
        let Some(current) = r.open_table(TURNS)?.get(id.as_u128())? else {
            return Ok(vec![]);
        };
        let current: Turn = turn_of(&names, current.value())?;
        if current.tenant != *tenant {
            return Ok(vec![]);
        }
        let mut out = versions_in(&r.open_table(VERSIONS)?, &names, id)?;
        out.push(current);
        Ok(out)
    }

    pub fn get(&self, id: MemoryId) -> Result<Option<Turn>, StoreError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(TURNS)?;
        match t.get(id.as_u128())? {
            Some(v) => Ok(Some(turn_of(&r.open_table(CONV_NAMES)?, v.value())?)),
            None => Ok(None),
        }
    }

    /// Turns whose enrichment has not finished, in conversation order.
    pub fn pending(&self) -> Result<Vec<Turn>, StoreError> {
        let r = self.db.begin_read()?;
        let p = r.open_table(PENDING)?;
        let t = r.open_table(TURNS)?;
        let names = r.open_table(CONV_NAMES)?;
        let mut out = Vec::new();
        for e in p.iter()? {
            let (id, _) = e?;
            if let Some(v) = t.get(id.value())? {
                out.push(turn_of(&names, v.value())?);
            }
        }
        out.sort_by(|a, b| {
            (&a.tenant, &a.conversation_id, a.position).cmp(&(
                &b.tenant,
                &b.conversation_id,
                b.position,
            ))
        });
        Ok(out)
    }

    /// Marks every turn of `tenant` pending (a reindex: the pipeline derives them again, and a
    /// kill part-way leaves the rest pending for the replay at start). Returns the turns marked.
    pub fn mark_pending(&self, tenant: &TenantId) -> Result<u64, StoreError> {
        let w = self.db.begin_write()?;
        let mut n = 0;
        {
            let numbers = w.open_table(CONV_NUMBERS)?;
            let idx = w.open_table(TURN_POSITIONS)?;
            let mut pending = w.open_table(PENDING)?;
            let prefix = keys::join(&[tenant.as_str()]);
            let end = keys::prefix_end(&prefix);
            for conv in numbers.range(prefix.as_slice()..end.as_slice())? {
                let r = turn_range(conv?.1.value());
                for e in idx.range::<&[u8; 16]>(r.start()..=r.end())? {
                    pending.insert(e?.1.value(), ())?;
                    n += 1;
                }
            }
        }
        w.commit()?;
        Ok(n)
    }

    pub fn pending_count(&self) -> Result<u64, StoreError> {
        let r = self.db.begin_read()?;
        Ok(r.open_table(PENDING)?.len()?)
    }

    pub fn is_pending(&self, id: MemoryId) -> Result<bool, StoreError> {
        let r = self.db.begin_read()?;
        Ok(r.open_table(PENDING)?.get(id.as_u128())?.is_some())
    }

    /// The graph-writer finished these turns, each at the version recorded at the given time:
    /// a turn edited since stays pending (its new version is still on its way).
    pub fn mark_stored(
        &self,
        turns: &[(MemoryId, chrono::DateTime<Utc>)],
    ) -> Result<(), StoreError> {
        let w = self.db.begin_write()?;
        {
            let mut p = w.open_table(PENDING)?;
            let t = w.open_table(TURNS)?;
            let names = w.open_table(CONV_NAMES)?;
            for (id, recorded_at) in turns {
                let current = match t.get(id.as_u128())? {
                    Some(v) => Some(turn_of(&names, v.value())?.recorded_at),
                    None => None,
                };
                if current.is_none_or(|c| c <= *recorded_at) {
                    p.remove(id.as_u128())?;
                }
            }
        }
        w.commit()?;
        Ok(())
    }

    pub fn conversation_exists(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<bool, StoreError> {
        let r = self.db.begin_read()?;
        let k = keys::join(&[tenant.as_str(), conversation]);
        Ok(r.open_table(CONV_NEXT)?.get(k.as_slice())?.is_some())
    }

    /// Every tenant with a conversation.
    pub fn tenants(&self) -> Result<Vec<TenantId>, StoreError> {
        let r = self.db.begin_read()?;
        let mut out: Vec<TenantId> = Vec::new();
        for e in r.open_table(CONV_NEXT)?.iter()? {
            let (k, _) = e?;
            if let Some(t) = keys::split(k.value()).first() {
                let t = String::from_utf8_lossy(t).into_owned();
                if out.last().is_none_or(|l| l.as_str() != t) {
                    out.push(TenantId(t));
                }
            }
        }
        Ok(out)
    }

    /// Conversation ids of a tenant.
    pub fn conversations(&self, tenant: &TenantId) -> Result<Vec<String>, StoreError> {
        self.conversations_after(tenant, None, usize::MAX)
    }

    /// One page of [`RawStore::conversations`]: up to `limit` ids greater than `after`, in
    /// order.
    pub fn conversations_after(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(CONV_NEXT)?;
        Ok(keys::conversations_after(
            &t,
            tenant.as_str(),
            after,
            limit,
        )?)
    }

    /// Every turn of a conversation, in order.
    pub fn conversation_turns(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<Vec<Turn>, StoreError> {
        let r = self.db.begin_read()?;
        let conv_key = keys::join(&[tenant.as_str(), conversation]);
        let Some(number) = number_of(&r.open_table(CONV_NUMBERS)?, &conv_key)? else {
            return Ok(vec![]);
        };
        let idx = r.open_table(TURN_POSITIONS)?;
        let t = r.open_table(TURNS)?;
        let names = r.open_table(CONV_NAMES)?;
        let mut out = Vec::new();
        let r = turn_range(number);
        for e in idx.range::<&[u8; 16]>(r.start()..=r.end())? {
            let (_, id) = e?;
            if let Some(v) = t.get(id.value())? {
                out.push(turn_of(&names, v.value())?);
            }
        }
        Ok(out)
    }

    /// Erases a conversation's raw turns, pending marks and position counter; returns turns removed.
    pub fn delete_conversation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<u64, StoreError> {
        let conv_key = keys::join(&[tenant.as_str(), conversation]);
        let w = self.db.begin_write()?;
        let mut n = 0;
        {
            let mut numbers = w.open_table(CONV_NUMBERS)?;
            // None: a conversation whose every turn was deleted before numbers existed.
            let number = number_of(&numbers, &conv_key)?;
            let mut idx = w.open_table(TURN_POSITIONS)?;
            let mut turns = w.open_table(TURNS)?;
            let mut pending = w.open_table(PENDING)?;
            let ids: Vec<u128> = match number.map(turn_range) {
                Some(r) => idx
                    .range::<&[u8; 16]>(r.start()..=r.end())?
                    .map(|e| e.map(|(_, v)| v.value()))
                    .collect::<Result<_, _>>()?,
                None => vec![],
            };
            let mut versions = w.open_table(VERSIONS)?;
            for id in ids {
                turns.remove(id)?;
                pending.remove(id)?;
                let r = version_range(MemoryId::from_u128(id));
                versions.retain_in(r.start.as_slice()..=r.end.as_slice(), |_, _| false)?;
                n += 1;
            }
            if let Some(n) = number {
                let r = turn_range(n);
                idx.retain_in::<&[u8; 16], _>(r.start()..=r.end(), |_, _| false)?;
                numbering::forget(&mut numbers, &mut w.open_table(CONV_NAMES)?, &conv_key)?;
            }
            w.open_table(CONV_NEXT)?.remove(conv_key.as_slice())?;
        }
        w.commit()?;
        Ok(n)
    }

    /// Removes one turn of `tenant` (its row, its place in the conversation, its pending mark);
    /// the positions of the others do not change. False when there is no such turn.
    pub fn delete_turn(&self, tenant: &TenantId, id: MemoryId) -> Result<bool, StoreError> {
        let w = self.db.begin_write()?;
        {
            let mut turns = w.open_table(TURNS)?;
            let turn: Turn = match turns.get(id.as_u128())? {
                Some(v) => turn_of(&w.open_table(CONV_NAMES)?, v.value())?,
                None => return Ok(false),
            };
            if turn.tenant != *tenant {
                return Ok(false);
            }
            turns.remove(id.as_u128())?;
            w.open_table(PENDING)?.remove(id.as_u128())?;
            let r = version_range(id);
            w.open_table(VERSIONS)?
                .retain_in(r.start.as_slice()..=r.end.as_slice(), |_, _| false)?;
            let conv_key = keys::join(&[tenant.as_str(), &turn.conversation_id]);
            if let Some(number) = number_of(&w.open_table(CONV_NUMBERS)?, &conv_key)? {
                w.open_table(TURN_POSITIONS)?
                    .remove(&turn_key(number, turn.position))?;
            }
        }
        w.commit()?;
        Ok(true)
    }

    pub fn count(&self) -> Result<u64, StoreError> {
        let r = self.db.begin_read()?;
        Ok(r.open_table(TURNS)?.len()?)
    }

    /// Rows per table that belong to `tenant` (and `conversation`, if given), pending marks
    /// included: erasure checks. Scans whole tables; for tests and audits.
    pub fn rows_of(
        &self,
        tenant: &TenantId,
        conversation: Option<&str>,
    ) -> Result<std::collections::HashMap<&'static str, u64>, StoreError> {
        let owned = |t: &[u8], c: Option<&[u8]>| {
            t == tenant.as_str().as_bytes()
                && conversation.is_none_or(|want| c == Some(want.as_bytes()))
        };
        let r = self.db.begin_read()?;
        let turns_t = r.open_table(TURNS)?;
        let pending_t = r.open_table(PENDING)?;
        let names_t = r.open_table(CONV_NAMES)?;
        let (mut turns, mut pending) = (0, 0);
        for e in turns_t.iter()? {
            let (id, v) = e?;
            let t: Turn = turn_of(&names_t, v.value())?;
            if owned(
                t.tenant.as_str().as_bytes(),
                Some(t.conversation_id.as_bytes()),
            ) {
                turns += 1;
                if pending_t.get(id.value())?.is_some() {
                    pending += 1;
                }
            }
        }
        let mut versions = 0;
        for e in r.open_table(VERSIONS)?.iter()? {
            let t: Turn = turn_of(&names_t, e?.1.value())?;
            versions += u64::from(owned(
                t.tenant.as_str().as_bytes(),
                Some(t.conversation_id.as_bytes()),
            ));
        }
        let mut m = std::collections::HashMap::from([
            ("turns", turns),
            ("pending", pending),
            ("turn_versions", versions),
        ]);
        // A tenant\0conversation\0 key or name of what is asked for.
        let owned_key = |k: &[u8]| {
            let parts = keys::split(k);
            owned(
                parts.first().copied().unwrap_or_default(),
                parts.get(1).copied(),
            )
        };
        let positions_t = r.open_table(TURN_POSITIONS)?;
        let (mut numbers, mut positions) = (0, 0);
        for e in r.open_table(CONV_NUMBERS)?.iter()? {
            let (k, number) = e?;
            if owned_key(k.value()) {
                numbers += 1;
                let r = turn_range(number.value());
                positions += positions_t.range::<&[u8; 16]>(r.start()..=r.end())?.count() as u64;
            }
        }
        let mut names = 0;
        for e in r.open_table(CONV_NAMES)?.iter()? {
            names += u64::from(owned_key(e?.1.value()));
        }
        let mut next = 0;
        for e in r.open_table(CONV_NEXT)?.iter()? {
            next += u64::from(owned_key(e?.0.value()));
        }
        m.insert("turn_positions", positions);
        m.insert("conversation_numbers", numbers);
        m.insert("conversation_names", names);
        m.insert("conversation_next", next);
        // Pending marks whose turn is gone would replay nothing, but count them as residue.
        let mut orphans = 0;
        for e in pending_t.iter()? {
            let (id, _) = e?;
            orphans += u64::from(turns_t.get(id.value())?.is_none());
        }
        m.insert("orphan_pending", orphans);
        Ok(m)
    }

    /// Stored turns whose text, speakers, ids or metadata contain `needle`: erasure checks.
    pub fn rows_containing(&self, needle: &[u8]) -> Result<u64, StoreError> {
        let r = self.db.begin_read()?;
        let hit = |v: &[u8]| {
            u64::from(!needle.is_empty() && v.windows(needle.len()).any(|w| w == needle))
        };
        let mut n = 0;
        for e in r.open_table(TURNS)?.iter()? {
            n += hit(&codec::content_of("turn", e?.1.value())?);
        }
        for e in r.open_table(VERSIONS)?.iter()? {
            n += hit(&codec::content_of("turn", e?.1.value())?);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(turn_id: Option<&str>, text: &str) -> TurnInput {
        TurnInput {
            turn_id: turn_id.map(String::from),
            user: text.into(),
            assistant: Some("ok".into()),
            user_speaker: None,
            assistant_speaker: None,
            timestamp: chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
            metadata: Default::default(),
            user_id: None,
            agent_id: None,
        }
    }

    /// Pages of the listing: byte (code point) order, strictly after the cursor, at most
    /// `limit`, one tenant's, what a deleted conversation leaves out.
    #[test]
    fn conversations_come_a_page_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let s = RawStore::open(&dir.path().join("raw.redb")).unwrap();
        let (t, u) = (TenantId("t".into()), TenantId("u".into()));
        for c in ["b", "ab", "a", "Z", "😀", "！"] {
            s.append(&t, c, &[input(None, "hi")]).unwrap();
        }
        s.append(&u, "aa", &[input(None, "hi")]).unwrap();
        let page =
            |after: Option<&str>, limit: usize| s.conversations_after(&t, after, limit).unwrap();
        let ids = |v: &[&str]| v.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        assert_eq!(page(None, 2), ids(&["Z", "a"]));
        assert_eq!(page(Some("a"), 2), ids(&["ab", "b"]));
        assert_eq!(page(Some("aa"), 10), ids(&["ab", "b", "！", "😀"]));
        assert_eq!(page(Some("😀"), 10), ids(&[]));
        assert_eq!(page(None, 0), ids(&[]));
        assert_eq!(page(None, 100), s.conversations(&t).unwrap());
        s.delete_conversation(&t, "ab").unwrap();
        assert_eq!(page(Some("a"), 10), ids(&["b", "！", "😀"]));
    }

    #[test]
    fn append_is_idempotent_on_turn_id_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raw.redb");
        let t = TenantId("t".into());
        let ids = {
            let s = RawStore::open(&path).unwrap();
            let a = s
                .append(&t, "c", &[input(Some("a"), "one"), input(None, "two")])
                .unwrap();
            assert!(a.iter().all(|x| x.new));
            let again = s.append(&t, "c", &[input(Some("a"), "one")]).unwrap();
            assert!(!again[0].new);
            assert_eq!(again[0].turn.memory_id, a[0].turn.memory_id);
            // The same turn id with other text: refused, and nothing of the batch is stored.
            let e = s
                .append(
                    &t,
                    "c",
                    &[input(Some("z"), "new"), input(Some("a"), "changed")],
                )
                .unwrap_err();
            assert!(matches!(e, StoreError::Conflict(_)), "{e}");
            assert!(e.to_string().contains("turns[1].turn_id"), "{e}");
            assert!(s.get(MemoryId::of_turn(&t, "c", "z")).unwrap().is_none());
            assert_eq!(a[0].turn.memory_id, MemoryId::of_turn(&t, "c", "a"));
            a.iter().map(|x| x.turn.memory_id).collect::<Vec<_>>()
        };
        let s = RawStore::open(&path).unwrap();
        assert_eq!(s.count().unwrap(), 2);
        assert_eq!(s.pending().unwrap().len(), 2);
        let first = s.get(ids[0]).unwrap().unwrap();
        s.mark_stored(&[(ids[0], first.recorded_at)]).unwrap();
        assert_eq!(s.pending().unwrap()[0].memory_id, ids[1]);
        let turns = s.conversation_turns(&t, "c").unwrap();
        assert_eq!(
            turns.iter().map(|t| t.position).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(s.conversations(&t).unwrap(), vec!["c".to_string()]);
        assert!(s.conversations(&TenantId("u".into())).unwrap().is_empty());
        assert_eq!(s.delete_conversation(&t, "c").unwrap(), 2);
        assert_eq!(s.count().unwrap(), 0);
        assert!(!s.conversation_exists(&t, "c").unwrap());
    }

    /// A store whose turns have hashed ids (written before ids grouped by conversation): a
    /// retry of one finds it under that id, a changed one is refused, and everything new (a
    /// turn of the same conversation, another conversation) gets the grouped form.
    #[test]
    fn turns_stored_under_hashed_ids_keep_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raw.redb");
        let t = TenantId("t".into());
        {
            let s = RawStore::open(&path).unwrap();
            s.append(&t, "old", &[input(Some("a"), "one"), input(None, "two")])
                .unwrap();
            // Back to hashed ids and no record of when grouped ids began.
            let w = s.db.begin_write().unwrap();
            {
                let names = w.open_table(CONV_NAMES).unwrap();
                let mut turns = w.open_table(TURNS).unwrap();
                let mut pending = w.open_table(PENDING).unwrap();
                let mut positions = w.open_table(TURN_POSITIONS).unwrap();
                let all: Vec<(u128, Turn)> = turns
                    .iter()
                    .unwrap()
                    .map(|e| {
                        let (k, v) = e.unwrap();
                        (k.value(), turn_of(&names, v.value()).unwrap())
                    })
                    .collect();
                for (id, mut turn) in all {
                    turn.memory_id = MemoryId::derive(&t, "old", &turn.turn_id);
                    let hashed = turn.memory_id.as_u128();
                    turns.remove(id).unwrap();
                    pending.remove(id).unwrap();
                    turns
                        .insert(hashed, turn_bytes(&turn, Some(1)).unwrap().as_slice())
                        .unwrap();
                    pending.insert(hashed, ()).unwrap();
                    positions
                        .insert(&turn_key(1, turn.position), hashed)
                        .unwrap();
                }
            }
            w.delete_table(META).unwrap();
            w.commit().unwrap();
        }
        let s = RawStore::open(&path).unwrap();
        assert_eq!(s.of_turn_from, 2, "conversation 1 was written before");
        let hashed = MemoryId::derive(&t, "old", "a");
        let again = s.append(&t, "old", &[input(Some("a"), "one")]).unwrap();
        assert!(!again[0].new);
        assert_eq!(again[0].turn.memory_id, hashed);
        let e = s
            .append(&t, "old", &[input(Some("a"), "changed")])
            .unwrap_err();
        assert!(matches!(e, StoreError::Conflict(_)), "{e}");
        let more = s.append(&t, "old", &[input(Some("b"), "three")]).unwrap();
        assert!(more[0].new);
        assert_eq!(more[0].turn.memory_id, MemoryId::of_turn(&t, "old", "b"));
        let other = s.append(&t, "new", &[input(Some("a"), "one")]).unwrap();
        assert_eq!(other[0].turn.memory_id, MemoryId::of_turn(&t, "new", "a"));
        assert!(!s.append(&t, "new", &[input(Some("a"), "one")]).unwrap()[0].new);
        assert_eq!(s.count().unwrap(), 4);
        assert_eq!(s.get(hashed).unwrap().unwrap().user, "one");
        let turns = s.conversation_turns(&t, "old").unwrap();
        assert_eq!(
            turns.iter().map(|t| t.position).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        // The mark is kept: a reopen does not move it past the conversations written since.
        drop(s);
        assert_eq!(RawStore::open(&path).unwrap().of_turn_from, 2);
    }

    /// A store written before conversation numbers opens with its index rewritten: the turns
    /// keep their order, appends go on from the next position, and erasing the conversation
    /// leaves nothing of it, its name included.
    #[test]
    fn an_older_store_is_renumbered_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raw.redb");
        let t = TenantId("t".into());
        {
            let s = RawStore::open(&path).unwrap();
            s.append(&t, "c", &[input(None, "zero"), input(None, "one")])
                .unwrap();
            s.append(&t, "d", &[input(None, "other")]).unwrap();
            // Back to the older layout: turns that spell out their conversation, and the
            // index keyed by tenant and conversation.
            let w = s.db.begin_write().unwrap();
            {
                let names = w.open_table(CONV_NAMES).unwrap();
                let mut turns = w.open_table(TURNS).unwrap();
                let all: Vec<(u128, Turn)> = turns
                    .iter()
                    .unwrap()
                    .map(|e| {
                        let (k, v) = e.unwrap();
                        assert_eq!(v.value()[0], 5, "stored by conversation number");
                        (k.value(), turn_of(&names, v.value()).unwrap())
                    })
                    .collect();
                for (id, turn) in all {
                    turns
                        .insert(id, codec::turn_bytes(&turn).unwrap().as_slice())
                        .unwrap();
                }
            }
            {
                let names = w.open_table(CONV_NAMES).unwrap();
                let positions = w.open_table(TURN_POSITIONS).unwrap();
                let mut legacy = w.open_table(LEGACY_CONV_INDEX).unwrap();
                for e in positions.iter().unwrap() {
                    let (k, id) = e.unwrap();
                    let k = k.value();
                    let number = u64::from_be_bytes(k[..8].try_into().unwrap());
                    let mut key = names.get(number).unwrap().unwrap().value().to_vec();
                    key.extend_from_slice(&k[8..]);
                    legacy.insert(key.as_slice(), id.value()).unwrap();
                }
            }
            for name in [
                "turn_positions",
                "conversation_numbers",
                "conversation_names",
            ] {
                let table: TableDefinition<&[u8], &[u8]> = TableDefinition::new(name);
                w.delete_table(table).unwrap();
            }
            w.commit().unwrap();
        }
        let s = RawStore::open(&path).unwrap();
        let tables: Vec<String> =
            s.db.begin_read()
                .unwrap()
                .list_tables()
                .unwrap()
                .map(|h| h.name().to_string())
                .collect();
        assert!(
            !tables.contains(&"conversation_index".to_string()),
            "{tables:?}"
        );
        let texts = |conv: &str| -> Vec<String> {
            s.conversation_turns(&t, conv)
                .unwrap()
                .into_iter()
                .map(|t| t.user)
                .collect()
        };
        assert_eq!(texts("c"), vec!["zero", "one"]);
        assert_eq!(texts("d"), vec!["other"]);
        let more = s.append(&t, "c", &[input(None, "two")]).unwrap();
        assert_eq!(more[0].turn.position, 2);
        assert_eq!(texts("c"), vec!["zero", "one", "two"]);
        // A new conversation takes a number of its own.
        s.append(&t, "e", &[input(None, "new")]).unwrap();
        assert_eq!(texts("e"), vec!["new"]);
        assert_eq!(texts("d"), vec!["other"]);
        assert_eq!(s.mark_pending(&t).unwrap(), 5);

        assert_eq!(s.delete_conversation(&t, "c").unwrap(), 3);
        let left = s.rows_of(&t, Some("c")).unwrap();
        assert!(left.values().all(|n| *n == 0), "{left:?}");
        assert!(texts("c").is_empty());
        let d = s.rows_of(&t, Some("d")).unwrap();
        assert_eq!(d["turn_positions"], 1);
        assert_eq!(d["conversation_names"], 1);
        // One turn deleted alone leaves its conversation's others in place.
        let e_id = MemoryId::of_turn(&t, "e", "0");
        assert!(s.delete_turn(&t, e_id).unwrap());
        assert!(texts("e").is_empty());
        assert_eq!(s.rows_of(&t, Some("e")).unwrap()["turn_positions"], 0);
    }
}
