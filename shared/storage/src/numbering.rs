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
    let last = names
        .last()?
        .map(|(k, v)| (k.value(), v.value().is_empty()));
    let n = last.map_or(1, |(k, _)| k + 1);
    ids.insert(key, n)?;
    names.insert(n, key)?;
    // The last number's placeholder has done its work: `n` is the last one now.
    if let Some((k, true)) = last {
        names.remove(k)?;
    }
    Ok(n)
}

/// Forgets the number of the conversation `key` (its turns are all gone): an erased
/// conversation leaves no trace of its name. A number is never given twice: the last one
/// stays as an empty placeholder, so a value still naming it (one a failed erasure left
/// behind) reads as damaged, never as another conversation's.
pub fn forget(
    ids: &mut Table<&'static [u8], u64>,
    names: &mut Table<u64, &'static [u8]>,
    key: &[u8],
) -> Result<(), StoreError> {
    let Some(n) = ids.remove(key)?.map(|n| n.value()) else {
        return Ok(());
    };
    if names.last()?.is_some_and(|(k, _)| k.value() == n) {
        names.insert(n, &b""[..])?;
    } else {
        names.remove(n)?;
    }
    Ok(())
}

/// The tenant and conversation id a conversation number names, from `names` (number →
/// tenant\0conversation\0).
pub fn name_of(
    names: &impl ReadableTable<u64, &'static [u8]>,
    n: u64,
) -> Result<(String, String), StoreError> {
    let name = names
        .get(n)?
        .filter(|v| !v.value().is_empty())
        .ok_or_else(|| {
            StoreError::corrupt_msg(format!("a value of conversation {n}, which has no name"))
        })?;
    match crate::keys::split(name.value()).as_slice() {
        [tenant, conversation] => Ok((
            String::from_utf8_lossy(tenant).into_owned(),
            String::from_utf8_lossy(conversation).into_owned(),
        )),
        _ => Err(StoreError::corrupt_msg(format!(
            "conversation {n}: its name is not tenant and conversation"
        ))),
    }
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

#[cfg(test)]
mod tests {
    use redb::{Database, ReadableTableMetadata, TableDefinition};

    use super::*;

    const IDS: TableDefinition<&[u8], u64> = TableDefinition::new("ids");
    const NAMES: TableDefinition<u64, &[u8]> = TableDefinition::new("names");

    /// An erased conversation's number is never given again, whether it was the last one or
    /// not, and nothing is left that names it.
    #[test]
    fn numbers_are_never_given_twice() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path().join("n.redb")).unwrap();
        let w = db.begin_write().unwrap();
        {
            let (mut ids, mut names) = (w.open_table(IDS).unwrap(), w.open_table(NAMES).unwrap());
            let key = |c: &str| crate::keys::join(&["t", c]);
            assert_eq!(number_for(&mut ids, &mut names, &key("a")).unwrap(), 1);
            assert_eq!(number_for(&mut ids, &mut names, &key("b")).unwrap(), 2);
            assert_eq!(number_for(&mut ids, &mut names, &key("a")).unwrap(), 1);
            assert_eq!(
                name_of(&names, 2).unwrap(),
                ("t".to_string(), "b".to_string())
            );
            // The last number is forgotten: its name goes, the number stays taken.
            forget(&mut ids, &mut names, &key("b")).unwrap();
            let e = name_of(&names, 2).unwrap_err();
            assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
            assert_eq!(number_for(&mut ids, &mut names, &key("c")).unwrap(), 3);
            assert!(names.get(2).unwrap().is_none(), "placeholder kept");
            // One before the last: removed outright (the last + 1 is past it anyway).
            forget(&mut ids, &mut names, &key("a")).unwrap();
            assert!(names.get(1).unwrap().is_none());
            assert_eq!(number_for(&mut ids, &mut names, &key("a")).unwrap(), 4);
            assert_eq!(ids.len().unwrap(), 2);
            assert_eq!(names.len().unwrap(), 2);
            // Forgetting twice, or a conversation never numbered, changes nothing.
            forget(&mut ids, &mut names, &key("a")).unwrap();
            forget(&mut ids, &mut names, &key("a")).unwrap();
            forget(&mut ids, &mut names, &key("z")).unwrap();
            assert_eq!(number_for(&mut ids, &mut names, &key("d")).unwrap(), 5);
        }
        w.commit().unwrap();
    }
}
