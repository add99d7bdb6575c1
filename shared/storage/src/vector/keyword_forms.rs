//! Which keyword points each conversation says, for the embedded vector index.
//!
//! A keyword's vector depends on its text alone, so the embedded index stores it once per
//! tenant and form (stem + vector) rather than once per conversation: a chat platform of many
//! short conversations otherwise writes ~10 copies of common vectors a turn, half of the
//! ingest's CPU at 10k (docs/SPEED.md). This table says which forms each conversation said, so
//! a conversation-scoped search stays within them and an erasure removes a form with the last
//! conversation that said it.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use redb::{
    Database, MultimapTableDefinition, MultimapTableHandle, ReadableMultimapTable, ReadableTable,
    TableDefinition, WriteTransaction,
};

use crate::StoreError;

/// (tenant, conversation, stem) → the form's point id (16 bytes).
const SAID: MultimapTableDefinition<&[u8], &[u8]> = MultimapTableDefinition::new("said");
/// (tenant, point id) → how many conversations say the form: an erasure deletes a form with
/// the last of them. A count, not the list of them: a common form is said by most of a tenant's
/// conversations, and the lists were a quarter of this file at 10k turns (docs/SPEED.md).
const SAYERS: TableDefinition<&[u8], u64> = TableDefinition::new("sayer_counts");
/// What stores before the counts kept instead: (tenant, point id) → each conversation that
/// says it. Counted into [`SAYERS`] and deleted on open.
const LEGACY_SAYERS: MultimapTableDefinition<&[u8], &[u8]> = MultimapTableDefinition::new("sayers");

fn part(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s);
}

fn conversation_prefix(tenant: &str, conversation: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(tenant.len() + conversation.len() + 8);
    part(&mut k, tenant.as_bytes());
    part(&mut k, conversation.as_bytes());
    k
}

fn said_key(tenant: &str, conversation: &str, stem: &str) -> Vec<u8> {
    let mut k = conversation_prefix(tenant, conversation);
    part(&mut k, stem.as_bytes());
    k
}

fn sayers_key(tenant: &str, point: [u8; 16]) -> Vec<u8> {
    let mut k = Vec::with_capacity(tenant.len() + 20);
    part(&mut k, tenant.as_bytes());
    k.extend_from_slice(&point);
    k
}

fn stem_of(key: &[u8], prefix_len: usize) -> Option<String> {
    let rest = key.get(prefix_len + 4..)?;
    String::from_utf8(rest.to_vec()).ok()
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError::backend_msg(format!("keyword members: {e}"))
}

fn point_of(v: &[u8]) -> Option<[u8; 16]> {
    v.try_into().ok()
}

/// A form a conversation says.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Said {
    pub conversation: String,
    pub stem: String,
    pub point: [u8; 16],
}

pub(crate) struct KeywordForms {
    db: Database,
}

impl KeywordForms {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let mut db = Database::create(path).map_err(err)?;
        let tx = db.begin_write().map_err(err)?;
        tx.open_multimap_table(SAID).map_err(err)?;
        tx.open_table(SAYERS).map_err(err)?;
        let started = std::time::Instant::now();
        let counted = count_legacy_sayers(&tx)?;
        tx.commit().map_err(err)?;
        if let Some(forms) = counted {
            // The lists' pages are free now; give them back to the file system once.
            db.compact().map_err(err)?;
            tracing::info!(
                forms,
                secs = started.elapsed().as_secs_f64(),
                "keyword forms: who says each form counted, file compacted"
            );
        }
        Ok(Self { db })
    }

    /// Records what conversations say (idempotent), in one durable commit.
    #[cfg(test)]
    pub fn add(&self, tenant: &str, said: &[Said]) -> Result<(), StoreError> {
        self.change(said.iter().map(|s| (tenant, s)), true)
    }

    /// What conversations of several tenants say (a writer's batch), in one durable commit.
    pub fn add_by_tenant(&self, said: &HashMap<String, Vec<Said>>) -> Result<(), StoreError> {
        self.change(
            said.iter()
                .flat_map(|(t, s)| s.iter().map(move |s| (t.as_str(), s))),
            true,
        )
    }

    /// Forgets what the given conversations said, in one durable commit.
    pub fn remove(&self, tenant: &str, said: &[Said]) -> Result<(), StoreError> {
        self.change(said.iter().map(|s| (tenant, s)), false)
    }

    /// Both tables in one commit, each (tenant, form said) inserted or removed; a form's count
    /// moves only when a conversation starts or stops saying it, so a repeat changes nothing.
    fn change<'a>(
        &self,
        said: impl Iterator<Item = (&'a str, &'a Said)>,
        insert: bool,
    ) -> Result<(), StoreError> {
        let mut said = said.peekable();
        if said.peek().is_none() {
            return Ok(());
        }
        let tx = self.db.begin_write().map_err(err)?;
        {
            let mut by_conv = tx.open_multimap_table(SAID).map_err(err)?;
            // A batch's conversations share their common forms: one count update per form.
            let mut moved: HashMap<Vec<u8>, i64> = HashMap::new();
            for (tenant, s) in said {
                let k = said_key(tenant, &s.conversation, &s.stem);
                let (k, v) = (k.as_slice(), s.point.as_slice());
                // insert: true if it was said already; remove: true if it was.
                let step = match (insert, insert_or_remove(&mut by_conv, k, v, insert)?) {
                    (true, false) => 1,
                    (false, true) => -1,
                    _ => continue,
                };
                *moved.entry(sayers_key(tenant, s.point)).or_default() += step;
            }
            let mut moved: Vec<(Vec<u8>, i64)> = moved.into_iter().filter(|m| m.1 != 0).collect();
            moved.sort_unstable();
            let mut counts = tx.open_table(SAYERS).map_err(err)?;
            for (k, step) in moved {
                let now = counts
                    .get(k.as_slice())
                    .map_err(err)?
                    .map_or(0, |v| v.value());
                match now.saturating_add_signed(step) {
                    0 => counts.remove(k.as_slice()).map(drop),
                    n => counts.insert(k.as_slice(), n).map(drop),
                }
                .map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }

    /// The forms a conversation says: all of them, or those of the given stems.
    pub fn said(
        &self,
        tenant: &str,
        conversation: &str,
        stems: Option<&[String]>,
    ) -> Result<Vec<Said>, StoreError> {
        let tx = self.db.begin_read().map_err(err)?;
        let t = tx.open_multimap_table(SAID).map_err(err)?;
        let mut out = Vec::new();
        let mut push = |points: redb::MultimapValue<&[u8]>, stem: String| {
            for p in points {
                let p = p.map_err(err)?;
                if let Some(point) = point_of(p.value()) {
                    out.push(Said {
                        conversation: conversation.to_string(),
                        stem: stem.clone(),
                        point,
                    });
                }
            }
            Ok::<(), StoreError>(())
        };
        match stems {
            Some(stems) => {
                for stem in stems {
                    let key = said_key(tenant, conversation, stem);
                    let points = t.get(key.as_slice()).map_err(err)?;
                    push(points, stem.clone())?;
                }
            }
            None => {
                let prefix = conversation_prefix(tenant, conversation);
                for entry in t.range(prefix.as_slice()..).map_err(err)? {
                    let (k, points) = entry.map_err(err)?;
                    let key = k.value();
                    if !key.starts_with(&prefix) {
                        break;
                    }
                    let Some(stem) = stem_of(key, prefix.len()) else {
                        continue;
                    };
                    push(points, stem)?;
                }
            }
        }
        Ok(out)
    }

    /// Of the given forms, the points no other conversation says (to delete with them).
    pub fn said_by_none_but(
        &self,
        tenant: &str,
        said: &[Said],
    ) -> Result<Vec<[u8; 16]>, StoreError> {
        let tx = self.db.begin_read().map_err(err)?;
        let t = tx.open_table(SAYERS).map_err(err)?;
        // Each form of `said` (read from SAID, so every pair is counted) and how many of the
        // leaving conversations say it: the form goes when they are all its sayers.
        let mut leaving: HashMap<[u8; 16], HashSet<&str>> = HashMap::new();
        let mut order = Vec::new();
        for s in said {
            let sayers = leaving.entry(s.point).or_insert_with(|| {
                order.push(s.point);
                HashSet::new()
            });
            sayers.insert(s.conversation.as_str());
        }
        let mut out = Vec::new();
        for point in order {
            let all = t
                .get(sayers_key(tenant, point).as_slice())
                .map_err(err)?
                .map_or(0, |v| v.value());
            if all <= leaving[&point].len() as u64 {
                out.push(point);
            }
        }
        Ok(out)
    }

    /// How many forms the given conversations say (erasure audits).
    pub fn count(&self, tenant: &str, conversations: &[String]) -> Result<u64, StoreError> {
        let mut n = 0;
        for c in conversations {
            n += self.said(tenant, c, None)?.len() as u64;
        }
        Ok(n)
    }
}

fn insert_or_remove(
    t: &mut redb::MultimapTable<&[u8], &[u8]>,
    k: &[u8],
    v: &[u8],
    insert: bool,
) -> Result<bool, StoreError> {
    if insert {
        t.insert(k, v).map_err(err)
    } else {
        t.remove(k, v).map_err(err)
    }
}

/// A store written before the counts: each form's list of conversations becomes its count,
/// in the transaction that opens the store, so a crash leaves either layout whole. Returns how
/// many forms were counted, None when there was nothing to do.
fn count_legacy_sayers(tx: &WriteTransaction) -> Result<Option<u64>, StoreError> {
    let legacy = tx
        .list_multimap_tables()
        .map_err(err)?
        .any(|h| h.name() == LEGACY_SAYERS.name());
    if !legacy {
        return Ok(None);
    }
    let mut forms = 0;
    {
        let old = tx.open_multimap_table(LEGACY_SAYERS).map_err(err)?;
        let mut counts = tx.open_table(SAYERS).map_err(err)?;
        for entry in old.iter().map_err(err)? {
            let (k, conversations) = entry.map_err(err)?;
            let n = conversations.len();
            if n > 0 {
                counts.insert(k.value(), n).map_err(err)?;
                forms += 1;
            }
        }
    }
    tx.delete_multimap_table(LEGACY_SAYERS).map_err(err)?;
    Ok(Some(forms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(c: &str, stem: &str, p: u8) -> Said {
        Said {
            conversation: c.into(),
            stem: stem.into(),
            point: [p; 16],
        }
    }

    /// How many conversations of tenant t say form `p`, as the counts table has it.
    fn sayers(f: &KeywordForms, p: u8) -> Option<u64> {
        let tx = f.db.begin_read().unwrap();
        let t = tx.open_table(SAYERS).unwrap();
        let n = t
            .get(sayers_key("t", [p; 16]).as_slice())
            .unwrap()
            .map(|v| v.value());
        n
    }

    #[test]
    fn a_store_with_lists_of_sayers_opens_with_their_counts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.redb");
        {
            // As stores before the counts wrote it: t's "swim" said by a and b, "tent" by a.
            let db = Database::create(&path).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let mut by_conv = tx.open_multimap_table(SAID).unwrap();
                let mut sayers = tx.open_multimap_table(LEGACY_SAYERS).unwrap();
                for (c, stem, p) in [("a", "swim", 1), ("a", "tent", 2), ("b", "swim", 1)] {
                    let k = said_key("t", c, stem);
                    by_conv.insert(k.as_slice(), [p; 16].as_slice()).unwrap();
                    let k = sayers_key("t", [p; 16]);
                    sayers.insert(k.as_slice(), c.as_bytes()).unwrap();
                }
            }
            tx.commit().unwrap();
        }
        let f = KeywordForms::open(&path).unwrap();
        let tx = f.db.begin_read().unwrap();
        assert_eq!(
            tx.list_multimap_tables().unwrap().count(),
            1,
            "only `said` is left"
        );
        drop(tx);
        assert_eq!((sayers(&f, 1), sayers(&f, 2)), (Some(2), Some(1)));
        let a = f.said("t", "a", None).unwrap();
        assert_eq!(f.said_by_none_but("t", &a).unwrap(), vec![[2; 16]]);
        f.remove("t", &a).unwrap();
        let b = f.said("t", "b", None).unwrap();
        assert_eq!(f.said_by_none_but("t", &b).unwrap(), vec![[1; 16]]);
        // Reopening finds nothing more to count.
        drop(f);
        let f = KeywordForms::open(&path).unwrap();
        assert_eq!(f.said_by_none_but("t", &b).unwrap(), vec![[1; 16]]);
    }

    #[test]
    fn a_count_moves_only_when_a_conversation_starts_or_stops_saying_a_form() {
        let dir = tempfile::tempdir().unwrap();
        let f = KeywordForms::open(&dir.path().join("k.redb")).unwrap();
        // One batch saying a form twice for one conversation, and again in a later batch.
        f.add(
            "t",
            &[
                said("a", "swim", 1),
                said("a", "swim", 1),
                said("b", "swim", 1),
            ],
        )
        .unwrap();
        f.add("t", &[said("a", "swim", 1)]).unwrap();
        assert_eq!(sayers(&f, 1), Some(2));
        // Forgetting what was never said changes nothing; the last sayer takes the count.
        f.remove("t", &[said("c", "swim", 1)]).unwrap();
        assert_eq!(sayers(&f, 1), Some(2));
        f.remove("t", &[said("a", "swim", 1), said("a", "swim", 1)])
            .unwrap();
        assert_eq!(sayers(&f, 1), Some(1));
        let b = f.said("t", "b", None).unwrap();
        assert_eq!(f.said_by_none_but("t", &b).unwrap(), vec![[1; 16]]);
        f.remove("t", &b).unwrap();
        assert_eq!(sayers(&f, 1), None);
    }

    #[test]
    fn a_form_goes_with_the_last_conversation_that_says_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = KeywordForms::open(&dir.path().join("k.redb")).unwrap();
        f.add(
            "t",
            &[
                said("a", "swim", 1),
                said("a", "tent", 2),
                said("b", "swim", 1),
            ],
        )
        .unwrap();
        f.add("u", &[said("a", "swim", 1)]).unwrap();
        // Idempotent.
        f.add("t", &[said("a", "swim", 1)]).unwrap();
        assert_eq!(f.count("t", &["a".into()]).unwrap(), 2);
        let points = |t: &str, c: &str| -> HashSet<[u8; 16]> {
            f.said(t, c, None)
                .unwrap()
                .into_iter()
                .map(|s| s.point)
                .collect()
        };
        assert_eq!(points("t", "a"), HashSet::from([[1; 16], [2; 16]]));
        assert_eq!(points("t", "b"), HashSet::from([[1; 16]]));
        // A conversation whose stems share a prefix with another's is not mixed in.
        f.add("t", &[said("ab", "kayak", 3)]).unwrap();
        let a = f.said("t", "a", None).unwrap();
        assert_eq!(a.len(), 2);
        assert!(a
            .iter()
            .all(|s| s.conversation == "a" && s.point != [3; 16]));
        // "swim" is still said by b, "tent" by nobody else; tenant u is apart.
        assert_eq!(f.said_by_none_but("t", &a).unwrap(), vec![[2; 16]]);
        f.remove("t", &a).unwrap();
        assert!(points("t", "a").is_empty());
        assert_eq!(points("u", "a"), HashSet::from([[1; 16]]));
        let b = f.said("t", "b", Some(&["swim".into()])).unwrap();
        assert_eq!(f.said_by_none_but("t", &b).unwrap(), vec![[1; 16]]);
    }
}
