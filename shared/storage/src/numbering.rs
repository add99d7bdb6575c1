//! Conversations by number, for the embedded stores' redb tables (the graph's and the raw
//! store's): `tenant\0conversation\0` ↔ an 8-byte number, and a conversation's turns keyed by
//! number and position, so no key spells out the tenant and conversation id.

use redb::{ReadableTable, Table};

use crate::StoreError;

/// The number of the conversation `key` (tenant\0conversation\0), if it has one.
pub fn number_of(
    ids: &impl ReadableTable<&'static [u8], u64>,
    key: &[u8],
) -> Result<Option<u64>, StoreError> {
    Ok(ids.get(key)?.map(|v| v.value()))
}

/// The number of the conversation `key`, given one (the last one + 1) if it has none.
pub fn number_for(
    ids: &mut Table<&'static [u8], u64>,
    names: &mut Table<u64, &'static [u8]>,
    key: &[u8],
) -> Result<u64, StoreError> {
    if let Some(n) = number_of(ids, key)? {
        return Ok(n);
    }
    let n = names.last()?.map(|(k, _)| k.value() + 1).unwrap_or(1);
    ids.insert(key, n)?;
    names.insert(n, key)?;
    Ok(n)
}

/// Forgets the number of the conversation `key` (its turns are all gone): an erased
/// conversation leaves no trace of its name.
pub fn forget(
    ids: &mut Table<&'static [u8], u64>,
    names: &mut Table<u64, &'static [u8]>,
    key: &[u8],
) -> Result<(), StoreError> {
    if let Some(n) = ids.remove(key)? {
        names.remove(n.value())?;
    }
    Ok(())
}

/// A turn's key: its conversation's number and its position, big-endian, so a conversation's
/// turns are one range in order.
pub fn turn_key(conversation: u64, position: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&conversation.to_be_bytes());
    k[8..].copy_from_slice(&position.to_be_bytes());
    k
}

/// Every turn key of a conversation.
pub fn turn_range(conversation: u64) -> std::ops::RangeInclusive<[u8; 16]> {
    turn_key(conversation, 0)..=turn_key(conversation, u64::MAX)
}
