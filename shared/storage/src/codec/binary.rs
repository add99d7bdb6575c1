//! The binary layout of stored turns and turn records ([`super::BINARY_V2`]): postcard, with
//! times as integers, ids as 16 bytes, a keyword's key as what it adds to its text, and the
//! extractor's small vocabularies (granularities, reference kinds) as one byte. Compressed
//! JSON spent most of a record on what zstd cannot shrink in a value this small: digits of
//! timestamps and dates, hex of ids, and words that appear once per record ("granularity",
//! "entity", "rules"); and it parsed every field by name on each of the hundreds of records a
//! recall reads.
//!
//! Part of the stored format: a field is only ever appended at the end of a struct (postcard
//! has no field names), and then under a new version byte. The one exception is a turn
//! record's trailing flag byte ([`RECORD_REDERIVING`]): optional, absent on every record
//! written before it, so they read as they always did.

use chrono::{DateTime, NaiveDate, Utc};
use recollect_model::{
    Extraction, Field, Fragment, Keyword, MemoryId, Reference, TenantId, TimeRef, Turn,
};
use serde::{Deserialize, Serialize};

use crate::graph::{TurnRecord, TurnVersion};
use crate::StoreError;

/// A time to the nanosecond: seconds since the epoch and the nanoseconds past them.
#[derive(Serialize, Deserialize)]
struct Stamp(i64, u32);

impl From<DateTime<Utc>> for Stamp {
    fn from(t: DateTime<Utc>) -> Self {
        Self(t.timestamp(), t.timestamp_subsec_nanos())
    }
}

impl Stamp {
    fn time(&self) -> Result<DateTime<Utc>, StoreError> {
        DateTime::from_timestamp(self.0, self.1).ok_or_else(|| {
            StoreError::corrupt_msg(format!("time {}.{} out of range", self.0, self.1))
        })
    }
}

/// A word from a small vocabulary as its index in `known`, any other as itself.
#[derive(Serialize, Deserialize)]
enum Word {
    Known(u8),
    Other(String),
}

impl Word {
    fn of(s: String, known: &[&str]) -> Self {
        match known.iter().position(|k| *k == s) {
            Some(i) => Self::Known(i as u8),
            None => Self::Other(s),
        }
    }

    fn text(self, known: &[&str]) -> Result<String, StoreError> {
        match self {
            Self::Known(i) => known
                .get(usize::from(i))
                .map(|k| (*k).to_string())
                .ok_or_else(|| StoreError::corrupt_msg(format!("word {i} not in its vocabulary"))),
            Self::Other(s) => Ok(s),
        }
    }
}

/// Never reordered: a word's index is stored.
const GRANULARITIES: &[&str] = &["day", "week", "month", "season", "year"];
const REFERENCE_KINDS: &[&str] = &["entity", "location", "event", "time"];
const EXTRACTORS: &[&str] = &["rules"];

/// An id as its 16 bytes when it is one (in its canonical spelling), else as written.
#[derive(Serialize, Deserialize, PartialEq)]
enum Id {
    Uuid([u8; 16]),
    Other(String),
}

impl Id {
    fn of(s: String) -> Self {
        match MemoryId::parse(&s) {
            Some(id) if id.to_string() == s => Self::Uuid(id.as_u128().to_be_bytes()),
            _ => Self::Other(s),
        }
    }

    fn text(self) -> String {
        match self {
            Self::Uuid(b) => MemoryId::from_u128(u128::from_be_bytes(b)).to_string(),
            Self::Other(s) => s,
        }
    }
}

/// How a stored turn gives its memory id. The first two are the bytes of the `Option` an
/// older layout had here (postcard: 0 for None, 1 and the 16 bytes for Some), so its records
/// read unchanged.
#[derive(Serialize, Deserialize)]
enum IdForm {
    /// [`MemoryId::derive`] of tenant, conversation and turn id.
    Hashed,
    Explicit([u8; 16]),
    /// [`MemoryId::of_turn`] of tenant, conversation and turn id.
    OfTurn,
}

impl IdForm {
    fn of(id: MemoryId, tenant: &TenantId, conversation: &str, turn_id: &str) -> Self {
        if id == MemoryId::of_turn(tenant, conversation, turn_id) {
            Self::OfTurn
        } else if id == MemoryId::derive(tenant, conversation, turn_id) {
            Self::Hashed
        } else {
            Self::Explicit(id.as_u128().to_be_bytes())
        }
    }

    fn id(self, tenant: &TenantId, conversation: &str, turn_id: &str) -> MemoryId {
        match self {
            Self::Hashed => MemoryId::derive(tenant, conversation, turn_id),
            Self::Explicit(b) => MemoryId::from_u128(u128::from_be_bytes(b)),
            Self::OfTurn => MemoryId::of_turn(tenant, conversation, turn_id),
        }
    }
}

#[derive(Serialize, Deserialize)]
struct StoredTurn {
    /// Left out when a read can derive it again from tenant, conversation and turn id.
    memory_id: IdForm,
    tenant: String,
    conversation_id: String,
    /// None when it is the position written out, as Recollect numbers turns sent without one.
    turn_id: Option<String>,
    position: u64,
    user: String,
    assistant: String,
    user_speaker: Option<String>,
    assistant_speaker: Option<String>,
    timestamp: Stamp,
    recorded_at: Stamp,
    /// The metadata object as JSON (postcard cannot hold arbitrary JSON); empty when empty.
    metadata: String,
    user_id: Option<String>,
    agent_id: Option<String>,
    version: u32,
    first_recorded_at: Option<Stamp>,
    expired_at: Option<Stamp>,
}

/// A keyword's key is its text stemmed: stored as how many leading bytes it shares with the
/// text, then the rest ("volunteering" → "volunt": 6, "").
#[derive(Serialize, Deserialize)]
struct StoredKeyword {
    text: String,
    shared: u32,
    rest: String,
}

#[derive(Serialize, Deserialize)]
struct StoredTime {
    text: String,
    /// Days since 0001-01-01 of the start, and the end's days after it.
    start: i32,
    days: i32,
    granularity: Word,
}

#[derive(Serialize, Deserialize)]
struct StoredReference {
    mention: String,
    kind: Word,
    resolved: String,
    assistant: bool,
}

#[derive(Serialize, Deserialize)]
struct StoredExtraction {
    keywords: Vec<StoredKeyword>,
    entities: Vec<String>,
    locations: Vec<String>,
    events: Vec<String>,
    times: Vec<StoredTime>,
    references: Vec<StoredReference>,
    event_time: Option<Stamp>,
    extractor: Word,
}

#[derive(Serialize, Deserialize)]
struct StoredRecord {
    turn: StoredTurn,
    extraction: StoredExtraction,
    fragments: Vec<Id>,
    history: Vec<(StoredTurn, StoredExtraction)>,
}

fn stored_turn(t: Turn) -> Result<StoredTurn, StoreError> {
    Ok(StoredTurn {
        memory_id: IdForm::of(t.memory_id, &t.tenant, &t.conversation_id, &t.turn_id),
        tenant: t.tenant.0,
        conversation_id: t.conversation_id,
        turn_id: (t.turn_id != t.position.to_string()).then_some(t.turn_id),
        position: t.position,
        user: t.user,
        assistant: t.assistant,
        user_speaker: t.user_speaker,
        assistant_speaker: t.assistant_speaker,
        timestamp: t.timestamp.into(),
        recorded_at: t.recorded_at.into(),
        metadata: if t.metadata.is_empty() {
            String::new()
        } else {
            serde_json::to_string(&t.metadata)?
        },
        user_id: t.user_id,
        agent_id: t.agent_id,
        version: t.version,
        first_recorded_at: t.first_recorded_at.map(Stamp::from),
        expired_at: t.expired_at.map(Stamp::from),
    })
}

fn turn(s: StoredTurn) -> Result<Turn, StoreError> {
    let tenant = TenantId(s.tenant);
    let turn_id = s.turn_id.unwrap_or_else(|| s.position.to_string());
    let memory_id = s.memory_id.id(&tenant, &s.conversation_id, &turn_id);
    Ok(Turn {
        memory_id,
        tenant,
        conversation_id: s.conversation_id,
        turn_id,
        position: s.position,
        user: s.user,
        assistant: s.assistant,
        user_speaker: s.user_speaker,
        assistant_speaker: s.assistant_speaker,
        timestamp: s.timestamp.time()?,
        recorded_at: s.recorded_at.time()?,
        metadata: if s.metadata.is_empty() {
            serde_json::Map::new()
        } else {
            serde_json::from_str(&s.metadata)?
        },
        user_id: s.user_id,
        agent_id: s.agent_id,
        version: s.version,
        first_recorded_at: s.first_recorded_at.map(|t| t.time()).transpose()?,
        expired_at: s.expired_at.map(|t| t.time()).transpose()?,
    })
}

/// Bytes `a` and `b` share at their start, ending on a character boundary.
fn shared_prefix(a: &str, b: &str) -> usize {
    let n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    (0..=n).rev().find(|&i| a.is_char_boundary(i)).unwrap_or(0)
}

fn days(d: NaiveDate) -> i32 {
    chrono::Datelike::num_days_from_ce(&d)
}

fn date(days: i64) -> Result<NaiveDate, StoreError> {
    i32::try_from(days)
        .ok()
        .and_then(NaiveDate::from_num_days_from_ce_opt)
        .ok_or_else(|| StoreError::corrupt_msg(format!("day {days} out of range")))
}

fn stored_extraction(e: Extraction) -> StoredExtraction {
    StoredExtraction {
        keywords: e
            .keywords
            .into_iter()
            .map(|k| {
                let shared = shared_prefix(&k.key, &k.text);
                StoredKeyword {
                    rest: k.key[shared..].to_string(),
                    shared: shared as u32,
                    text: k.text,
                }
            })
            .collect(),
        entities: e.entities,
        locations: e.locations,
        events: e.events,
        times: e
            .times
            .into_iter()
            .map(|t| StoredTime {
                start: days(t.start),
                days: days(t.end) - days(t.start),
                granularity: Word::of(t.granularity, GRANULARITIES),
                text: t.text,
            })
            .collect(),
        references: e
            .references
            .into_iter()
            .map(|r| StoredReference {
                mention: r.mention,
                kind: Word::of(r.kind, REFERENCE_KINDS),
                resolved: r.resolved,
                assistant: r.field == Field::Assistant,
            })
            .collect(),
        event_time: e.event_time.map(Stamp::from),
        extractor: Word::of(e.extractor, EXTRACTORS),
    }
}

fn extraction(s: StoredExtraction) -> Result<Extraction, StoreError> {
    let keywords = s
        .keywords
        .into_iter()
        .map(|k| {
            let head = k
                .text
                .get(..k.shared as usize)
                .ok_or_else(|| StoreError::corrupt_msg("keyword key longer than its text"))?;
            Ok(Keyword {
                key: format!("{head}{}", k.rest),
                text: k.text,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    let times = s
        .times
        .into_iter()
        .map(|t| {
            Ok(TimeRef {
                text: t.text,
                start: date(i64::from(t.start))?,
                end: date(i64::from(t.start) + i64::from(t.days))?,
                granularity: t.granularity.text(GRANULARITIES)?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    let references = s
        .references
        .into_iter()
        .map(|r| {
            Ok(Reference {
                mention: r.mention,
                kind: r.kind.text(REFERENCE_KINDS)?,
                resolved: r.resolved,
                field: if r.assistant {
                    Field::Assistant
                } else {
                    Field::User
                },
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Extraction {
        keywords,
        entities: s.entities,
        locations: s.locations,
        events: s.events,
        times,
        references,
        event_time: s.event_time.map(|t| t.time()).transpose()?,
        extractor: s.extractor.text(EXTRACTORS)?,
    })
}

fn encoded<T: Serialize>(what: &'static str, v: &T) -> Result<Vec<u8>, StoreError> {
    postcard::to_stdvec(v).map_err(|e| StoreError::backend(what, e))
}

fn decoded<'a, T: Deserialize<'a>>(what: &'static str, b: &'a [u8]) -> Result<T, StoreError> {
    postcard::from_bytes(b).map_err(|e| StoreError::corrupt(what, e))
}

/// A turn in the binary layout.
pub fn turn_bytes(t: Turn) -> Result<Vec<u8>, StoreError> {
    encoded("turn", &stored_turn(t)?)
}

/// Reads [`turn_bytes`].
pub fn turn_of(b: &[u8]) -> Result<Turn, StoreError> {
    turn(decoded("turn", b)?)
}

/// A raw turn whose tenant and conversation are named by the raw store's conversation
/// `number`: the number, then the binary layout with both left empty (the store keeps each
/// conversation's name once, so a turn does not spell it out again).
pub fn numbered_turn_bytes(t: Turn, number: u64) -> Result<Vec<u8>, StoreError> {
    // Whether the id is derivable was decided with the names; only then are they dropped.
    let mut stored = stored_turn(t)?;
    stored.tenant.clear();
    stored.conversation_id.clear();
    encoded("turn", &(number, stored))
}

/// Reads [`numbered_turn_bytes`]; `name_of` gives a conversation number's tenant and id.
pub fn numbered_turn_of(
    b: &[u8],
    name_of: impl FnOnce(u64) -> Result<(String, String), StoreError>,
) -> Result<Turn, StoreError> {
    let (number, mut s): (u64, StoredTurn) = decoded("turn", b)?;
    let (tenant, conversation) = name_of(number)?;
    s.tenant = tenant;
    s.conversation_id = conversation;
    turn(s)
}

/// Follows a record's struct when it is [`TurnRecord::rederiving`]; nothing follows otherwise.
const RECORD_REDERIVING: u8 = 1;

/// A record's parts in the binary layout, its turns (the current one and every earlier
/// version) stored by `store`; and whether it is rederiving.
fn stored_record(
    r: TurnRecord,
    store: impl Fn(Turn) -> Result<StoredTurn, StoreError>,
) -> Result<(StoredRecord, bool), StoreError> {
    let rec = StoredRecord {
        turn: store(r.turn)?,
        extraction: stored_extraction(r.extraction),
        fragments: r.fragments.into_iter().map(Id::of).collect(),
        history: r
            .history
            .into_iter()
            .map(|v| Ok((store(v.turn)?, stored_extraction(v.extraction))))
            .collect::<Result<_, StoreError>>()?,
    };
    Ok((rec, r.rederiving))
}

/// `rec` encoded, then [`RECORD_REDERIVING`] when the record is.
fn record_encoded<T: Serialize>(rec: &T, rederiving: bool) -> Result<Vec<u8>, StoreError> {
    let mut b = encoded("turn record", rec)?;
    if rederiving {
        b.push(RECORD_REDERIVING);
    }
    Ok(b)
}

/// A turn record in the binary layout.
pub fn record_bytes(r: TurnRecord) -> Result<Vec<u8>, StoreError> {
    let (rec, rederiving) = stored_record(r, stored_turn)?;
    record_encoded(&rec, rederiving)
}

/// Reads [`record_bytes`].
pub fn record_of(b: &[u8]) -> Result<TurnRecord, StoreError> {
    let (s, rest): (StoredRecord, &[u8]) =
        postcard::take_from_bytes(b).map_err(|e| StoreError::corrupt("turn record", e))?;
    record(s, rest, turn)
}

/// A turn record whose tenant and conversation are named by the graph's conversation
/// `number`: the number, then the binary layout with both left empty in the turn and in every
/// earlier version (a record's versions are all of its one conversation).
pub fn numbered_record_bytes(r: TurnRecord, number: u64) -> Result<Vec<u8>, StoreError> {
    // Whether an id is derivable is decided with the names; only then are they dropped.
    let unnamed = |t: Turn| -> Result<StoredTurn, StoreError> {
        let mut s = stored_turn(t)?;
        s.tenant.clear();
        s.conversation_id.clear();
        Ok(s)
    };
    let (rec, rederiving) = stored_record(r, unnamed)?;
    record_encoded(&(number, rec), rederiving)
}

/// Reads [`numbered_record_bytes`]; `name_of` gives a conversation number's tenant and id.
pub fn numbered_record_of(
    b: &[u8],
    name_of: impl FnOnce(u64) -> Result<(String, String), StoreError>,
) -> Result<TurnRecord, StoreError> {
    let ((number, s), rest): ((u64, StoredRecord), &[u8]) =
        postcard::take_from_bytes(b).map_err(|e| StoreError::corrupt("turn record", e))?;
    let (tenant, conversation) = name_of(number)?;
    let named = |mut t: StoredTurn| {
        t.tenant.clone_from(&tenant);
        t.conversation_id.clone_from(&conversation);
        turn(t)
    };
    record(s, rest, named)
}

/// What a [`super::NUMBERED_V6`] record keeps ahead of its compressed body, uncompressed: the
/// conversation's number and the turn's position (both also in the body), and its fragments
/// (not in the body). A fragment formed later adds its id here, and the body's bytes are
/// copied as they are.
#[derive(Serialize, Deserialize)]
struct StoredHead {
    number: u64,
    position: u64,
    fragments: Vec<Id>,
}

/// A [`super::NUMBERED_V6`] record's conversation number and turn position, read without
/// inflating its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHead {
    pub number: u64,
    pub position: u64,
}

/// A record's head in the binary layout.
pub fn head_bytes(
    number: u64,
    position: u64,
    fragments: Vec<String>,
) -> Result<Vec<u8>, StoreError> {
    encoded(
        "turn record",
        &StoredHead {
            number,
            position,
            fragments: fragments.into_iter().map(Id::of).collect(),
        },
    )
}

/// The head at the start of `b`, and the bytes after it.
fn take_head(b: &[u8]) -> Result<(StoredHead, &[u8]), StoreError> {
    postcard::take_from_bytes(b).map_err(|e| StoreError::corrupt("turn record", e))
}

/// The number and position of the head at the start of `b` (its fragments left as they are).
pub fn head(b: &[u8]) -> Result<RecordHead, StoreError> {
    let (h, _) = take_head(b)?;
    Ok(RecordHead {
        number: h.number,
        position: h.position,
    })
}

/// Reads the head at the start of `b`: its fragments, and the bytes after it.
pub fn head_of(b: &[u8]) -> Result<(Vec<String>, &[u8]), StoreError> {
    let (h, rest) = take_head(b)?;
    Ok((h.fragments.into_iter().map(Id::text).collect(), rest))
}

/// `layout`, the head at the start of `b` with `fragment` added, then the bytes after the head
/// as they are; None when the head already names it.
pub fn with_fragment(layout: u8, b: &[u8], fragment: &str) -> Result<Option<Vec<u8>>, StoreError> {
    let (mut h, rest) = take_head(b)?;
    let id = Id::of(fragment.to_string());
    if h.fragments.contains(&id) {
        return Ok(None);
    }
    h.fragments.push(id);
    let head = encoded("turn record", &h)?;
    let mut out = Vec::with_capacity(1 + head.len() + rest.len());
    out.push(layout);
    out.extend_from_slice(&head);
    out.extend_from_slice(rest);
    Ok(Some(out))
}

/// A decoded record's parts as a [`TurnRecord`], its turns read by `turn_of`; `rest` is what
/// followed the struct (the optional [`RECORD_REDERIVING`] byte).
fn record(
    s: StoredRecord,
    rest: &[u8],
    turn_of: impl Fn(StoredTurn) -> Result<Turn, StoreError>,
) -> Result<TurnRecord, StoreError> {
    let rederiving = match rest {
        [] => false,
        [RECORD_REDERIVING] => true,
        _ => return Err(StoreError::corrupt_msg("turn record: bytes after its end")),
    };
    Ok(TurnRecord {
        turn: turn_of(s.turn)?,
        extraction: extraction(s.extraction)?,
        fragments: s.fragments.into_iter().map(Id::text).collect(),
        history: s
            .history
            .into_iter()
            .map(|(t, e)| {
                Ok(TurnVersion {
                    turn: turn_of(t)?,
                    extraction: extraction(e)?,
                })
            })
            .collect::<Result<_, StoreError>>()?,
        rederiving,
    })
}

#[derive(Serialize, Deserialize)]
struct StoredFragment {
    id: Id,
    tenant: String,
    conversation_id: String,
    description: String,
    members: Vec<[u8; 16]>,
    keywords: Vec<String>,
    created_at: Stamp,
}

/// A fragment in the binary layout.
pub fn fragment_bytes(f: Fragment) -> Result<Vec<u8>, StoreError> {
    let stored = StoredFragment {
        id: Id::of(f.id),
        tenant: f.tenant.0,
        conversation_id: f.conversation_id,
        description: f.description,
        members: f
            .members
            .iter()
            .map(|m| m.as_u128().to_be_bytes())
            .collect(),
        keywords: f.keywords,
        created_at: f.created_at.into(),
    };
    encoded("fragment", &stored)
}

/// Reads [`fragment_bytes`].
pub fn fragment_of(b: &[u8]) -> Result<Fragment, StoreError> {
    let s: StoredFragment = decoded("fragment", b)?;
    Ok(Fragment {
        id: s.id.text(),
        tenant: TenantId(s.tenant),
        conversation_id: s.conversation_id,
        description: s.description,
        members: s
            .members
            .into_iter()
            .map(|m| MemoryId::from_u128(u128::from_be_bytes(m)))
            .collect(),
        keywords: s.keywords,
        created_at: s.created_at.time()?,
    })
}

/// A fragment member: its position when its memory id is the hash of tenant, conversation
/// and the position written out (as for turns sent without an id of the client's), else its
/// 16 bytes.
#[derive(Serialize, Deserialize)]
enum Member {
    /// The [`MemoryId::derive`] of the member's position.
    At(u64),
    Id([u8; 16]),
    /// The [`MemoryId::of_turn`] of the member's position (after the older two, whose
    /// encoding it keeps).
    TurnAt(u64),
}

#[derive(Serialize, Deserialize)]
struct NumberedFragment {
    id: Id,
    description: String,
    members: Vec<Member>,
    keywords: Vec<String>,
    created_at: Stamp,
}

/// A fragment whose tenant and conversation are named by the graph's conversation `number`;
/// `position_of` gives a member's position in its conversation where it is known.
pub fn numbered_fragment_bytes(
    f: Fragment,
    number: u64,
    position_of: impl Fn(MemoryId) -> Option<u64>,
) -> Result<Vec<u8>, StoreError> {
    let member = |m: MemoryId| match position_of(m).map(|p| {
        (
            p,
            IdForm::of(m, &f.tenant, &f.conversation_id, &p.to_string()),
        )
    }) {
        Some((p, IdForm::OfTurn)) => Member::TurnAt(p),
        Some((p, IdForm::Hashed)) => Member::At(p),
        _ => Member::Id(m.as_u128().to_be_bytes()),
    };
    let members = f.members.iter().map(|m| member(*m)).collect();
    let stored = NumberedFragment {
        id: Id::of(f.id),
        description: f.description,
        members,
        keywords: f.keywords,
        created_at: f.created_at.into(),
    };
    encoded("fragment", &(number, stored))
}

/// Reads [`numbered_fragment_bytes`]; `name_of` gives a conversation number's tenant and id.
pub fn numbered_fragment_of(
    b: &[u8],
    name_of: impl FnOnce(u64) -> Result<(String, String), StoreError>,
) -> Result<Fragment, StoreError> {
    let (number, s): (u64, NumberedFragment) = decoded("fragment", b)?;
    let (tenant, conversation_id) = name_of(number)?;
    let tenant = TenantId(tenant);
    let members = s
        .members
        .into_iter()
        .map(|m| match m {
            Member::At(p) => MemoryId::derive(&tenant, &conversation_id, &p.to_string()),
            Member::Id(b) => MemoryId::from_u128(u128::from_be_bytes(b)),
            Member::TurnAt(p) => MemoryId::of_turn(&tenant, &conversation_id, &p.to_string()),
        })
        .collect();
    Ok(Fragment {
        id: s.id.text(),
        tenant,
        conversation_id,
        description: s.description,
        members,
        keywords: s.keywords,
        created_at: s.created_at.time()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn at(secs: i64, nanos: u32) -> DateTime<Utc> {
        Utc.timestamp_opt(secs, nanos).single().unwrap()
    }

    fn turn(user: &str, id: Option<MemoryId>) -> Turn {
        let tenant = TenantId("acme".into());
        Turn {
            memory_id: id.unwrap_or_else(|| MemoryId::derive(&tenant, "c-1", "7")),
            tenant,
            conversation_id: "c-1".into(),
            turn_id: "7".into(),
            position: 7,
            user: user.into(),
            assistant: "Qu'est-ce que c'est ? 北京 🎉".into(),
            user_speaker: Some("Caroline".into()),
            assistant_speaker: None,
            timestamp: at(1_683_554_160, 0),
            recorded_at: at(1_764_115_200, 123_456_000),
            metadata: serde_json::json!({"source": "app", "n": [1, 2.5, null]})
                .as_object()
                .unwrap()
                .clone(),
            user_id: Some("u-9".into()),
            agent_id: None,
            version: 1,
            first_recorded_at: None,
            expired_at: None,
        }
    }

    fn extraction() -> Extraction {
        Extraction {
            keywords: vec![
                Keyword {
                    key: "volunt".into(),
                    text: "volunteering".into(),
                },
                Keyword {
                    key: "happi".into(),
                    text: "happy".into(),
                },
                // Not a prefix at all, and a multi-byte character where the two part.
                Keyword {
                    key: "zz".into(),
                    text: "abc".into(),
                },
                Keyword {
                    key: "café".into(),
                    text: "cafés".into(),
                },
                Keyword {
                    key: "caf\u{e8}".into(),
                    text: "café".into(),
                },
            ],
            entities: vec!["Caroline".into()],
            locations: vec!["Paris".into()],
            events: vec!["go park".into()],
            times: vec![
                TimeRef {
                    text: "last week".into(),
                    start: NaiveDate::from_ymd_opt(2023, 5, 1).unwrap(),
                    end: NaiveDate::from_ymd_opt(2023, 5, 7).unwrap(),
                    granularity: "week".into(),
                },
                TimeRef {
                    text: "odd".into(),
                    start: NaiveDate::from_ymd_opt(2023, 5, 9).unwrap(),
                    end: NaiveDate::from_ymd_opt(2023, 5, 2).unwrap(),
                    granularity: "fortnight".into(),
                },
            ],
            references: vec![
                Reference {
                    mention: "she".into(),
                    kind: "entity".into(),
                    resolved: "Caroline".into(),
                    field: Field::Assistant,
                },
                Reference {
                    mention: "it".into(),
                    kind: "thing".into(),
                    resolved: "x".into(),
                    field: Field::User,
                },
            ],
            event_time: Some(at(1_682_899_200, 0)),
            extractor: "llm:gpt-4o-mini".into(),
        }
    }

    /// Every field comes back as written, including what the layout shortens (derived ids,
    /// known words, keys sharing their text's start) and what it cannot (anything else).
    #[test]
    fn turns_records_and_fragments_read_back_as_written() {
        let derived = turn("I went to the park", None);
        let foreign = turn("", Some(MemoryId::from_u128(42)));
        // A turn id of the client's own, not its position written out.
        let mut named = turn("hi", None);
        named.turn_id = "msg-9".into();
        named.memory_id = MemoryId::derive(&named.tenant, "c-1", "msg-9");
        let names = |n: u64| {
            assert_eq!(n, 300);
            Ok(("acme".to_string(), "c-1".to_string()))
        };
        for t in [&derived, &foreign, &named] {
            assert_eq!(&turn_of(&turn_bytes(t.clone()).unwrap()).unwrap(), t);
            let numbered = numbered_turn_bytes(t.clone(), 300).unwrap();
            assert_eq!(&numbered_turn_of(&numbered, names).unwrap(), t);
        }
        // The names are not in the numbered layout; the number is (300: a 2-byte varint).
        let numbered = numbered_turn_bytes(derived.clone(), 300).unwrap();
        let plain = turn_bytes(derived.clone()).unwrap();
        assert_eq!(numbered.len(), plain.len() - "acme".len() - "c-1".len() + 2);
        let e =
            numbered_turn_of(&numbered, |_| Err(StoreError::corrupt_msg("no name"))).unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        let mut old = derived.clone();
        old.expired_at = Some(at(1_764_115_300, 1));
        let mut now = derived.clone();
        now.version = 2;
        now.first_recorded_at = Some(derived.recorded_at);
        now.position = Turn::UNSEQUENCED;
        let rec = TurnRecord {
            turn: now,
            extraction: extraction(),
            fragments: vec![
                MemoryId::from_u128(7).to_string(),
                "fragment 3".into(),
                // A uuid spelled in capitals is kept as spelled.
                MemoryId::from_u128(8).to_string().to_uppercase(),
            ],
            history: vec![TurnVersion {
                turn: old,
                extraction: Extraction::default(),
            }],
            rederiving: false,
        };
        assert_eq!(record_of(&record_bytes(rec.clone()).unwrap()).unwrap(), rec);
        let rederiving = TurnRecord {
            rederiving: true,
            ..rec.clone()
        };
        let b = record_bytes(rederiving.clone()).unwrap();
        assert_eq!(record_of(&b).unwrap(), rederiving);
        // One flag byte more than the same record not rederiving; any other tail is damage.
        assert_eq!(b.len(), record_bytes(rec.clone()).unwrap().len() + 1);
        let mut tail = b.clone();
        tail.push(0);
        assert!(matches!(record_of(&tail), Err(StoreError::Corrupt { .. })));
        // By number: the turn and every earlier version take their names from `names`.
        for r in [&rec, &rederiving] {
            let b = numbered_record_bytes(r.clone(), 300).unwrap();
            assert_eq!(&numbered_record_of(&b, names).unwrap(), r);
            assert_eq!(
                b.len(),
                record_bytes(r.clone()).unwrap().len() - 2 * ("acme".len() + "c-1".len()) + 2
            );
        }
        let b = numbered_record_bytes(rec.clone(), 300).unwrap();
        let e = numbered_record_of(&b, |_| Err(StoreError::corrupt_msg("no name"))).unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        let mut tail = b.clone();
        tail.push(0);
        assert!(matches!(
            numbered_record_of(&tail, names),
            Err(StoreError::Corrupt { .. })
        ));
        let f = Fragment {
            id: MemoryId::from_u128(9).to_string(),
            tenant: TenantId("acme".into()),
            conversation_id: "c-1".into(),
            description: "park, dogs".into(),
            members: vec![derived.memory_id, MemoryId::from_u128(1)],
            keywords: vec!["park".into()],
            created_at: at(1_764_115_200, 5),
        };
        assert_eq!(fragment_of(&fragment_bytes(f.clone()).unwrap()).unwrap(), f);
        // By number: a member at a known position whose id is its position's hash is stored
        // as the position (2 bytes instead of 17); a position that does not give its id is
        // not believed.
        let plain = numbered_fragment_bytes(f.clone(), 300, |_| None).unwrap();
        let at_position = |m: MemoryId| (m == derived.memory_id).then_some(7);
        let short = numbered_fragment_bytes(f.clone(), 300, at_position).unwrap();
        assert_eq!(short.len(), plain.len() - 15);
        let lying = numbered_fragment_bytes(f.clone(), 300, |_| Some(8)).unwrap();
        assert_eq!(lying.len(), plain.len());
        for b in [&plain, &short, &lying] {
            assert_eq!(numbered_fragment_of(b, names).unwrap(), f);
        }
        let e = numbered_fragment_of(&short[..short.len() - 1], names).unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
    }

    /// A turn stored with the id of its conversation's prefix keeps it left out, as a hashed
    /// one; records of the older layout (an `Option` where the id's form is now) read as they
    /// were written; a fragment member at a known position is stored as the position in
    /// either form.
    #[test]
    fn turn_ids_of_either_form_are_left_out_and_older_layouts_read() {
        assert_eq!(
            postcard::to_allocvec(&None::<[u8; 16]>).unwrap(),
            postcard::to_allocvec(&IdForm::Hashed).unwrap()
        );
        assert_eq!(
            postcard::to_allocvec(&Some([7u8; 16])).unwrap(),
            postcard::to_allocvec(&IdForm::Explicit([7u8; 16])).unwrap()
        );
        assert_eq!(postcard::to_allocvec(&IdForm::OfTurn).unwrap(), [2]);
        let hashed = turn("I went to the park", None);
        let mut clustered = hashed.clone();
        clustered.memory_id = MemoryId::of_turn(&hashed.tenant, "c-1", "7");
        let names = |_| Ok(("acme".to_string(), "c-1".to_string()));
        for t in [&hashed, &clustered] {
            let b = numbered_turn_bytes(t.clone(), 300).unwrap();
            assert_eq!(&numbered_turn_of(&b, names).unwrap(), t);
            assert_eq!(
                b.len(),
                numbered_turn_bytes(hashed.clone(), 300).unwrap().len()
            );
        }
        let f = Fragment {
            id: MemoryId::from_u128(9).to_string(),
            tenant: TenantId("acme".into()),
            conversation_id: "c-1".into(),
            description: "park".into(),
            members: vec![hashed.memory_id, clustered.memory_id],
            keywords: vec![],
            created_at: at(1_764_115_200, 5),
        };
        let plain = numbered_fragment_bytes(f.clone(), 300, |_| None).unwrap();
        let short = numbered_fragment_bytes(f.clone(), 300, |_| Some(7)).unwrap();
        assert_eq!(short.len(), plain.len() - 2 * 15);
        for b in [&plain, &short] {
            assert_eq!(numbered_fragment_of(b, names).unwrap(), f);
        }
    }

    /// Damaged bytes are an error naming what they were, never a panic or a wrong value.
    #[test]
    fn damaged_bytes_are_corrupt() {
        let good = record_bytes(TurnRecord {
            turn: turn("hello", None),
            extraction: extraction(),
            fragments: vec![],
            history: vec![],
            rederiving: false,
        })
        .unwrap();
        for n in [0, 1, good.len() / 2, good.len() - 1] {
            let e = record_of(&good[..n]).unwrap_err();
            assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        }
        let good = numbered_record_bytes(record_of(&good).unwrap(), 7).unwrap();
        let names = |_| Ok(("acme".to_string(), "c-1".to_string()));
        for n in [0, 1, good.len() / 2, good.len() - 1] {
            let e = numbered_record_of(&good[..n], names).unwrap_err();
            assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        }
        let e = turn_of(&[0xff; 40]).unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
    }

    proptest! {
        #[test]
        fn any_texts_and_keywords_read_back(
            user in ".{0,40}",
            key in ".{0,12}",
            text in ".{0,12}",
            secs in -62_000_000_000i64..250_000_000_000,
            nanos in 0u32..1_000_000_000,
            rederiving in any::<bool>(),
        ) {
            let mut t = turn(&user, None);
            t.timestamp = at(secs, nanos);
            let mut e = Extraction::default();
            e.keywords.push(Keyword { key, text });
            let rec = TurnRecord { turn: t, extraction: e, fragments: vec![], history: vec![], rederiving };
            prop_assert_eq!(&record_of(&record_bytes(rec.clone()).unwrap()).unwrap(), &rec);
            let names = |_| Ok(("acme".to_string(), "c-1".to_string()));
            let b = numbered_record_bytes(rec.clone(), secs.unsigned_abs()).unwrap();
            prop_assert_eq!(numbered_record_of(&b, names).unwrap(), rec);
        }
    }
}
