//! Byte keys for redb tables: NUL-separated parts, so a prefix scan over
//! `tenant\0conversation\0` finds exactly one conversation's rows.
// With Neo4j alone, only the node-key helpers are used.
#![cfg_attr(not(feature = "embedded"), allow(dead_code))]

pub fn join(parts: &[&str]) -> Vec<u8> {
    let mut k = Vec::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
    for p in parts {
        k.extend_from_slice(p.as_bytes());
        k.push(0);
    }
    k
}

/// The exclusive upper bound of all keys starting with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xff; prefix.len() + 1]
}

/// Up to `limit` of a tenant's conversation ids greater than `after`, from a table keyed
/// `tenant\0conversation\0` (so byte order is the ids' order): one listing page.
pub fn conversations_after(
    table: &impl redb::ReadableTable<&'static [u8], u64>,
    tenant: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>, redb::StorageError> {
    let prefix = join(&[tenant]);
    let start = after.map_or_else(|| prefix.clone(), |a| join(&[tenant, a]));
    let end = prefix_end(&prefix);
    let mut out = Vec::with_capacity(limit.min(1024));
    for e in table.range(start.as_slice()..end.as_slice())? {
        if out.len() == limit {
            break;
        }
        let (k, _) = e?;
        if let Some(c) = split(k.value()).get(1) {
            let c = String::from_utf8_lossy(c).into_owned();
            if after != Some(c.as_str()) {
                out.push(c);
            }
        }
    }
    Ok(out)
}

/// Splits a key made by [`join`] back into its parts (the last part may be binary).
pub fn split(key: &[u8]) -> Vec<&[u8]> {
    let mut parts: Vec<&[u8]> = key.split(|b| *b == 0).collect();
    if parts.last().is_some_and(|p| p.is_empty()) {
        parts.pop();
    }
    parts
}

/// NUL would break the key layout; text fields never need it.
#[cfg_attr(not(feature = "neo4j"), allow(dead_code))] // only Neo4j keys need it
pub fn clean(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        std::borrow::Cow::Owned(s.replace('\0', ""))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}
