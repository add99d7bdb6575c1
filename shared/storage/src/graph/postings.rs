//! The embedded graph's edges as packed posting lists, the way a search engine keeps an
//! inverted index: per conversation, node kind and node name, the positions of the turns
//! linked to it, delta-encoded in blocks of up to [`MAX_BLOCK`].
//!
//! A link costs a byte or two instead of a key (tenant, conversation and name spelled out)
//! and 18 bytes of times: the name is written once per block, the conversation as an 8-byte
//! number, and an edge's times are its turn's (kept once, in the turn index) unless they
//! differ, which only a re-derived or edited extraction makes happen.
//!
//! Key: conversation number (BE u64) + kind tag + name + `\0` + block's lower bound (BE u64).
//! Value: varint count, then per entry varint((gap << 1) | own times), gap from the previous
//! entry (the first from the key's bound), and when flagged, zigzag varints of valid_from and
//! recorded_at (ns since the epoch).

use redb::{ReadableTable, Table};

use crate::graph::NodeKind;
use crate::StoreError;

/// Entries per block: a write rewrites one block, so this bounds a link's write cost (a few
/// hundred bytes) while a name's list of a 1,000-turn conversation is still a handful of keys.
pub const MAX_BLOCK: usize = 128;

/// One link: the turn's position, and its times when they are not the turn's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Posting {
    pub position: u64,
    /// (valid_from, recorded_at) in ns; None: the turn's (see the turn index).
    pub times: Option<(i64, i64)>,
}

/// Every block of one conversation: conversation number.
pub fn conversation_prefix(conversation: u64) -> Vec<u8> {
    conversation.to_be_bytes().to_vec()
}

/// Every block of one conversation and kind.
pub fn kind_prefix(conversation: u64, kind: NodeKind) -> Vec<u8> {
    let mut k = conversation_prefix(conversation);
    k.push(kind.tag());
    k
}

/// Every block of one node.
pub fn name_prefix(conversation: u64, kind: NodeKind, name: &str) -> Vec<u8> {
    let mut k = kind_prefix(conversation, kind);
    // NUL ends the name in the key; names never need it.
    k.extend(name.bytes().filter(|b| *b != 0));
    k.push(0);
    k
}

/// The parts of a block key: conversation number, kind tag, name, lower bound.
pub fn parse_key(k: &[u8]) -> Result<(u64, u8, &[u8], u64), StoreError> {
    let bad = || StoreError::corrupt_msg(format!("posting key of {} bytes", k.len()));
    if k.len() < 8 + 1 + 1 + 8 || k[k.len() - 9] != 0 {
        return Err(bad());
    }
    let conv = u64::from_be_bytes(k[..8].try_into().map_err(|_| bad())?);
    let bound = u64::from_be_bytes(k[k.len() - 8..].try_into().map_err(|_| bad())?);
    Ok((conv, k[8], &k[9..k.len() - 9], bound))
}

fn block_key(prefix: &[u8], bound: u64) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(&bound.to_be_bytes());
    k
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn varint(&mut self) -> Result<u64, StoreError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self
                .0
                .split_first()
                .ok_or_else(|| StoreError::corrupt_msg("posting block: truncated"))?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(StoreError::corrupt_msg("posting block: varint too long"))
    }
}

/// A block's bytes; `entries` sorted by position, none below `bound`.
pub fn encode(bound: u64, entries: &[Posting]) -> Result<Vec<u8>, StoreError> {
    let mut out = Vec::with_capacity(2 + entries.len() * 2);
    put_varint(&mut out, entries.len() as u64);
    let mut prev = bound;
    for p in entries {
        let gap = p
            .position
            .checked_sub(prev)
            .filter(|g| *g <= u64::MAX >> 1)
            .ok_or_else(|| {
                StoreError::backend_msg(format!("posting at position {} out of order", p.position))
            })?;
        put_varint(&mut out, (gap << 1) | u64::from(p.times.is_some()));
        if let Some((valid_from, recorded_at)) = p.times {
            put_varint(&mut out, zigzag(valid_from));
            put_varint(&mut out, zigzag(recorded_at));
        }
        prev = p.position;
    }
    Ok(out)
}

/// Reads [`encode`]'s bytes.
pub fn decode(bound: u64, b: &[u8]) -> Result<Vec<Posting>, StoreError> {
    let mut r = Reader(b);
    let n = r.varint()?;
    if n > b.len() as u64 {
        return Err(StoreError::corrupt_msg(
            "posting block: count beyond its bytes",
        ));
    }
    let mut out = Vec::with_capacity(n as usize);
    let mut prev = bound;
    for _ in 0..n {
        let v = r.varint()?;
        let position = prev
            .checked_add(v >> 1)
            .ok_or_else(|| StoreError::corrupt_msg("posting block: position overflows"))?;
        let times = if v & 1 == 1 {
            Some((unzigzag(r.varint()?), unzigzag(r.varint()?)))
        } else {
            None
        };
        out.push(Posting { position, times });
        prev = position;
    }
    if !r.0.is_empty() {
        return Err(StoreError::corrupt_msg(
            "posting block: bytes after its entries",
        ));
    }
    Ok(out)
}

/// A block's entry count, without decoding it.
pub fn count(b: &[u8]) -> Result<u64, StoreError> {
    Reader(b).varint()
}

/// Every posting of one node (`prefix` from [`name_prefix`]), by position.
pub fn read(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    prefix: &[u8],
) -> Result<Vec<Posting>, StoreError> {
    let end = crate::keys::prefix_end(prefix);
    let mut out = Vec::new();
    for e in table.range(prefix..end.as_slice())? {
        let (k, v) = e?;
        let (_, _, _, bound) = parse_key(k.value())?;
        out.extend(decode(bound, v.value())?);
    }
    Ok(out)
}

/// How many turns link to one node.
pub fn frequency(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    prefix: &[u8],
) -> Result<u64, StoreError> {
    let end = crate::keys::prefix_end(prefix);
    let mut n = 0;
    for e in table.range(prefix..end.as_slice())? {
        n += count(e?.1.value())?;
    }
    Ok(n)
}

/// The block that holds (or would hold) `position`: the last one whose bound is at most it.
fn block_of(
    table: &Table<&'static [u8], &'static [u8]>,
    prefix: &[u8],
    position: u64,
) -> Result<Option<(u64, Vec<Posting>)>, StoreError> {
    let hi = block_key(prefix, position);
    let Some(e) = table.range(prefix..=hi.as_slice())?.next_back() else {
        return Ok(None);
    };
    let (k, v) = e?;
    let (_, _, _, bound) = parse_key(k.value())?;
    Ok(Some((bound, decode(bound, v.value())?)))
}

fn write_block(
    table: &mut Table<&'static [u8], &'static [u8]>,
    prefix: &[u8],
    bound: u64,
    entries: &[Posting],
) -> Result<(), StoreError> {
    let k = block_key(prefix, bound);
    if entries.is_empty() {
        table.remove(k.as_slice())?;
    } else {
        table.insert(k.as_slice(), encode(bound, entries)?.as_slice())?;
    }
    Ok(())
}

/// Adds a link; false (and nothing written) when the node already links to that position.
pub fn insert(
    table: &mut Table<&'static [u8], &'static [u8]>,
    prefix: &[u8],
    p: Posting,
) -> Result<bool, StoreError> {
    let (bound, mut entries) = match block_of(table, prefix, p.position)? {
        Some(found) => found,
        None => {
            // Before every block: the first block takes it if it has room, under a new bound.
            let end = crate::keys::prefix_end(prefix);
            let first = match table.range(prefix..end.as_slice())?.next() {
                Some(e) => {
                    let (k, v) = e?;
                    let (_, _, _, bound) = parse_key(k.value())?;
                    Some((bound, decode(bound, v.value())?))
                }
                None => None,
            };
            match first {
                Some((bound, mut entries)) if entries.len() < MAX_BLOCK => {
                    table.remove(block_key(prefix, bound).as_slice())?;
                    entries.insert(0, p);
                    write_block(table, prefix, p.position, &entries)?;
                }
                _ => write_block(table, prefix, p.position, &[p])?,
            }
            return Ok(true);
        }
    };
    let at = match entries.binary_search_by_key(&p.position, |e| e.position) {
        Ok(_) => return Ok(false),
        Err(at) => at,
    };
    entries.insert(at, p);
    if entries.len() <= MAX_BLOCK {
        write_block(table, prefix, bound, &entries)?;
    } else {
        // Appends (the usual order) start a fresh block; an insert inside splits in halves, so
        // blocks filled in order stay full.
        let cut = if at == entries.len() - 1 {
            at
        } else {
            entries.len() / 2
        };
        write_block(table, prefix, bound, &entries[..cut])?;
        write_block(table, prefix, entries[cut].position, &entries[cut..])?;
    }
    Ok(true)
}

/// Adds several links to one node, as [`insert`] would one at a time in position order (the
/// same blocks), but when they all come after the node's last link (an ingest in order) with
/// one read of its last block and one write per block touched instead of a read and a write
/// per link.
pub fn insert_many(
    table: &mut Table<&'static [u8], &'static [u8]>,
    prefix: &[u8],
    mut postings: Vec<Posting>,
) -> Result<(), StoreError> {
    // Stable, so of two links at one position the first stays, as with `insert`.
    postings.sort_by_key(|p| p.position);
    postings.dedup_by_key(|p| p.position);
    let Some(first) = postings.first().map(|p| p.position) else {
        return Ok(());
    };
    // The block that would hold the highest position is the node's last.
    let rest = match block_of(table, prefix, u64::MAX)? {
        None => postings.as_slice(),
        Some((bound, mut entries)) if entries.last().is_none_or(|e| e.position < first) => {
            let take = MAX_BLOCK.saturating_sub(entries.len()).min(postings.len());
            if take > 0 {
                entries.extend_from_slice(&postings[..take]);
                write_block(table, prefix, bound, &entries)?;
            }
            &postings[take..]
        }
        Some(_) => {
            for p in postings {
                insert(table, prefix, p)?;
            }
            return Ok(());
        }
    };
    write_all(table, prefix, rest)
}

/// Writes a node's whole list (sorted by position, no repeats) as full blocks: bulk loads.
pub fn write_all(
    table: &mut Table<&'static [u8], &'static [u8]>,
    prefix: &[u8],
    entries: &[Posting],
) -> Result<(), StoreError> {
    for chunk in entries.chunks(MAX_BLOCK) {
        write_block(table, prefix, chunk[0].position, chunk)?;
    }
    Ok(())
}

/// Takes a link away; the removed posting, or None when there was none.
pub fn remove(
    table: &mut Table<&'static [u8], &'static [u8]>,
    prefix: &[u8],
    position: u64,
) -> Result<Option<Posting>, StoreError> {
    let Some((bound, mut entries)) = block_of(table, prefix, position)? else {
        return Ok(None);
    };
    let Ok(at) = entries.binary_search_by_key(&position, |e| e.position) else {
        return Ok(None);
    };
    let p = entries.remove(at);
    write_block(table, prefix, bound, &entries)?;
    Ok(Some(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use redb::{Database, TableDefinition};

    const T: TableDefinition<&[u8], &[u8]> = TableDefinition::new("postings");

    #[test]
    fn blocks_round_trip_and_damage_is_corrupt() {
        let entries = [
            Posting {
                position: 7,
                times: None,
            },
            Posting {
                position: 9,
                times: Some((-5, 1_700_000_000_123_456_789)),
            },
            Posting {
                position: 300,
                times: None,
            },
        ];
        let b = encode(7, &entries).unwrap();
        assert_eq!(b.len(), 1 + 1 + 1 + 1 + 9 + 2);
        assert_eq!(decode(7, &b).unwrap(), entries);
        assert_eq!(count(&b).unwrap(), 3);
        for bad in [&b[..b.len() - 1], &[5, 0][..], &[0xff; 11][..]] {
            assert!(matches!(
                decode(7, bad).unwrap_err(),
                StoreError::Corrupt { .. }
            ));
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(decode(7, &extra).is_err());
        assert!(encode(8, &entries).is_err(), "an entry below the bound");
        let k = block_key(&name_prefix(3, NodeKind::Keyword, "dog"), 7);
        assert_eq!(parse_key(&k).unwrap(), (3, b'k', &b"dog"[..], 7));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Links added in groups ([`insert_many`]) leave the same blocks as added one by one in
        /// position order, whether a group comes after the node's last link or falls among its
        /// links.
        #[test]
        fn grouped_inserts_write_the_blocks_single_ones_do(
            before in proptest::collection::vec(0u64..900, 0..300),
            groups in proptest::collection::vec(
                (any::<bool>(), proptest::collection::vec(0u64..1200, 0..300)),
                1..4,
            ),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let db = Database::create(dir.path().join("p.redb")).unwrap();
            let w = db.begin_write().unwrap();
            {
                let mut one = w.open_table(T).unwrap();
                let (a, b) = (name_prefix(1, NodeKind::Entity, "ana"), name_prefix(2, NodeKind::Entity, "ana"));
                let p = |pos: u64| Posting { position: pos, times: pos.is_multiple_of(5).then_some((pos as i64, 1)) };
                for &pos in &before {
                    insert(&mut one, &a, p(pos)).unwrap();
                    insert(&mut one, &b, p(pos)).unwrap();
                }
                for (i, (after, g)) in groups.iter().enumerate() {
                    // Half the groups come after every link so far (the fast path).
                    let shift = if *after { 2000 * (i as u64 + 1) } else { 0 };
                    let g: Vec<u64> = g.iter().map(|pos| pos + shift).collect();
                    let mut in_order = g.clone();
                    in_order.sort_unstable();
                    for &pos in &in_order {
                        insert(&mut one, &a, p(pos)).unwrap();
                    }
                    insert_many(&mut one, &b, g.iter().map(|&pos| p(pos)).collect()).unwrap();
                }
                prop_assert_eq!(read(&one, &a).unwrap(), read(&one, &b).unwrap());
                let blocks = |prefix: &[u8]| -> Vec<(Vec<u8>, Vec<u8>)> {
                    let end = crate::keys::prefix_end(prefix);
                    one.range(prefix..end.as_slice())
                        .unwrap()
                        .map(|e| {
                            let (k, v) = e.unwrap();
                            (k.value()[prefix.len()..].to_vec(), v.value().to_vec())
                        })
                        .collect()
                };
                prop_assert_eq!(blocks(&a), blocks(&b));
            }
            w.abort().unwrap();
        }

        /// Any sequence of inserts and removes leaves exactly the set a BTreeSet would hold,
        /// whatever the order, across block splits.
        #[test]
        fn inserts_and_removes_keep_the_set(ops in proptest::collection::vec((any::<bool>(), 0u64..600), 1..700)) {
            let dir = tempfile::tempdir().unwrap();
            let db = Database::create(dir.path().join("p.redb")).unwrap();
            let w = db.begin_write().unwrap();
            let mut model = std::collections::BTreeSet::new();
            {
                let mut t = w.open_table(T).unwrap();
                let prefix = name_prefix(1, NodeKind::Entity, "ana");
                let other = name_prefix(1, NodeKind::Entity, "anabel");
                insert(&mut t, &other, Posting { position: 5, times: None }).unwrap();
                for (add, pos) in ops {
                    let p = Posting { position: pos, times: (pos % 7 == 0).then_some((pos as i64, -1)) };
                    if add {
                        prop_assert_eq!(insert(&mut t, &prefix, p).unwrap(), model.insert(pos));
                    } else {
                        prop_assert_eq!(remove(&mut t, &prefix, pos).unwrap().is_some(), model.remove(&pos));
                    }
                }
                let got = read(&t, &prefix).unwrap();
                let want: Vec<u64> = model.iter().copied().collect();
                prop_assert_eq!(got.iter().map(|p| p.position).collect::<Vec<_>>(), want);
                prop_assert!(got.iter().all(|p| p.times.is_some() == (p.position % 7 == 0)));
                prop_assert_eq!(frequency(&t, &prefix).unwrap(), model.len() as u64);
                prop_assert_eq!(read(&t, &other).unwrap().len(), 1);
                for e in t.range(prefix.as_slice()..crate::keys::prefix_end(&prefix).as_slice()).unwrap() {
                    let (_, v) = e.unwrap();
                    prop_assert!(count(v.value()).unwrap() as usize <= MAX_BLOCK);
                }
            }
            w.abort().unwrap();
        }
    }
}
