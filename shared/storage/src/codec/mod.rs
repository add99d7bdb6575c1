//! How the embedded stores keep their values: turns (raw store), turn records and fragments
//! (graph).
//!
//! What is written: [`BINARY_V2`], then a zstd frame of the value in [`binary`]'s layout
//! (postcard: times as integers, ids as 16 bytes, no field names). zstd takes out the texts'
//! redundancy.
//!
//! What older stores wrote is still read, so no migration is needed: JSON compressed with
//! zstd and [`DICTIONARY_V1`] (first byte [`DICT_V1`]), a zstd frame without a dictionary
//! (zstd's magic), or plain JSON (`{`).

use std::borrow::Cow;
use std::cell::RefCell;

use recollect_model::{ConversationState, Fragment, MemoryId, Turn};
use serde::de::DeserializeOwned;
#[cfg(test)]
use serde::Serialize;

use crate::graph::TurnRecord;
use crate::StoreError;

pub mod binary;

/// zstd's level: level 3 (its default) compresses a turn in tens of microseconds; higher
/// levels gain 4 % on values this small.
const ZSTD_LEVEL: i32 = 3;

/// Largest value [`content_of`] will inflate: a turn record is at most two 64 KiB texts per
/// version, so a frame that says more is damaged.
const MAX_CONTENT: usize = 64 << 20;

/// Marks JSON compressed with [`DICTIONARY_V1`] (written before [`BINARY_V2`]).
const DICT_V1: u8 = 1;

/// Marks a zstd frame, without a dictionary, of a value in [`binary`]'s layout.
const BINARY_V2: u8 = 2;

/// Marks a zstd frame of a raw turn whose conversation is the raw store's number for it
/// ([`binary::numbered_turn_bytes`]).
const NUMBERED_V3: u8 = 3;

/// Marks a turn record or a fragment whose conversation is the graph's number for it
/// ([`binary::numbered_record_bytes`], [`binary::numbered_fragment_bytes`]), in a zstd frame
/// without its magic number ([`pack_bare`]).
const NUMBERED_V4: u8 = 4;

/// Marks a raw turn as [`NUMBERED_V3`] does, in a zstd frame without its magic number.
const NUMBERED_V5: u8 = 5;

/// Marks a turn record whose conversation number, position and fragments come first,
/// uncompressed ([`binary::head_bytes`]), then its body as [`NUMBERED_V4`] writes it (fragments
/// left out) in a zstd frame without its magic number. A fragment formed later adds its id to
/// the head and copies the frame: before it, every member's record was inflated, decoded,
/// encoded and compressed again, about a tenth of a 100k ingest's CPU.
const NUMBERED_V6: u8 = 6;

/// What every zstd frame starts with. The layout byte before a frame already says what
/// follows, so from [`NUMBERED_V4`] on a value leaves these 4 bytes out.
const ZSTD_MAGIC: [u8; 4] = 0xFD2F_B528_u32.to_le_bytes();

/// A raw-content dictionary: the skeleton of a turn record and of a turn, as serde writes
/// them (field names and the shapes of their values, no data). zstd starts every value with it
/// as history, so the field names cost a few bytes of back-references instead of their text:
/// 27 % off a turn record, 21 % off a turn. Values written with it are still read: never edit
/// it.
const DICTIONARY_V1: &[u8] = concat!(
    r#"{"memory_id":"00000000-0000-0000-0000-000000000000","tenant":"","conversation_id":"","#,
    r#""turn_id":"","position":,"#,
    r#""user":"","assistant":"","user_speaker":"","assistant_speaker":"","#,
    r#""timestamp":"2023-01-01T00:00:00Z","recorded_at":"2026-01-01T00:00:00.000000Z","#,
    r#""metadata":{},"user_id":"","agent_id":"","version":2,"first_recorded_at":"","#,
    r#""expired_at":""}{"turn":{"memory_id":"00000000-0000-0000-0000-000000000000","#,
    r#""tenant":"","conversation_id":"","#,
    r#""turn_id":"","position":,"user":"","assistant":"","user_speaker":"","#,
    r#""assistant_speaker":"","timestamp":"2023-01-01T00:00:00Z","#,
    r#""recorded_at":"2026-01-01T00:00:00.000000Z","metadata":{},"user_id":"","#,
    r#""agent_id":"","version":2,"first_recorded_at":"","expired_at":""},"#,
    r#""extraction":{"keywords":[{"key":"","text":""},{"key":"","text":""}],"#,
    r#""entities":[""],"locations":[""],"events":[""],"#,
    r#""times":[{"text":"","start":"2023-01-01","end":"2023-01-01","granularity":"day"},"#,
    r#"{"text":"","start":"","end":"","granularity":"week"}],"#,
    r#""references":[{"mention":"she","kind":"entity","resolved":"","field":"assistant"},"#,
    r#"{"mention":"he","kind":"entity","resolved":"","field":"user"}],"#,
    r#""event_time":"2023-01-01T00:00:00Z","extractor":"rules"},"fragments":[""#
)
.as_bytes();

thread_local! {
    /// One context of each per thread: recall reads hundreds of records, and a context made
    /// per record (loading the dictionary each time) costs more than the record.
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { RefCell::new(None) };
    #[cfg(test)]
    static DICT_COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
    static PLAIN_DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// `bytes` as stored: [`BINARY_V2`], then a zstd frame of them.
fn pack(what: &'static str, bytes: &[u8]) -> Result<Vec<u8>, StoreError> {
    pack_as(BINARY_V2, what, bytes)
}

/// `bytes` as stored: `layout`, then a zstd frame of them.
fn pack_as(layout: u8, what: &'static str, bytes: &[u8]) -> Result<Vec<u8>, StoreError> {
    compressed(&[layout], what, bytes)
}

/// `head`, then a zstd frame of `bytes`.
fn compressed(head: &[u8], what: &'static str, bytes: &[u8]) -> Result<Vec<u8>, StoreError> {
    let failed = |e| StoreError::backend(what, e);
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let compressor = match &mut *slot {
            Some(c) => c,
            empty => empty.insert(zstd::bulk::Compressor::new(ZSTD_LEVEL).map_err(failed)?),
        };
        let mut out = Vec::with_capacity(head.len() + zstd::zstd_safe::compress_bound(bytes.len()));
        out.extend_from_slice(head);
        out.extend(compressor.compress(bytes).map_err(failed)?);
        Ok(out)
    })
}

/// `bytes` as stored: `layout`, then a zstd frame of them without the frame's magic number.
fn pack_bare(layout: u8, what: &'static str, bytes: &[u8]) -> Result<Vec<u8>, StoreError> {
    let mut out = pack_as(layout, what, bytes)?;
    if out.get(1..5) != Some(&ZSTD_MAGIC[..]) {
        return Err(StoreError::backend_msg(format!(
            "{what}: zstd wrote a frame without its magic number"
        )));
    }
    out.drain(1..5);
    Ok(out)
}

/// `value` as [`DICT_V1`] stores wrote it: its JSON compressed with [`DICTIONARY_V1`]. Tests
/// make older stores' values with it.
#[cfg(test)]
pub fn pack_json_v1<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, StoreError> {
    let json = serde_json::to_vec(value)?;
    let failed = |e| StoreError::backend(what, e);
    DICT_COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let compressor = match &mut *slot {
            Some(c) => c,
            empty => empty.insert(
                zstd::bulk::Compressor::with_dictionary(ZSTD_LEVEL, DICTIONARY_V1)
                    .map_err(failed)?,
            ),
        };
        let mut out = Vec::with_capacity(1 + zstd::zstd_safe::compress_bound(json.len()));
        out.push(DICT_V1);
        out.extend(compressor.compress(&json).map_err(failed)?);
        Ok(out)
    })
}

/// A stored value's bytes uncompressed: the binary layout, or the JSON older stores wrote.
/// Erasure checks search them for what a value holds.
pub fn content_of<'a>(what: &'static str, b: &'a [u8]) -> Result<Cow<'a, [u8]>, StoreError> {
    let (cell, frame, dictionary) = match b.first() {
        Some(b'{') => return Ok(Cow::Borrowed(b)),
        Some(&DICT_V1) => (&DECOMPRESSOR, &b[1..], DICTIONARY_V1),
        Some(&(BINARY_V2 | NUMBERED_V3)) => (&PLAIN_DECOMPRESSOR, &b[1..], &[][..]),
        Some(&(NUMBERED_V4 | NUMBERED_V5)) => return bare_content(what, &b[1..]).map(Cow::Owned),
        Some(&NUMBERED_V6) => {
            return bare_content(what, binary::head_of(&b[1..])?.1).map(Cow::Owned);
        }
        Some(_) => (&PLAIN_DECOMPRESSOR, b, &[][..]),
        None => return Err(StoreError::corrupt_msg(format!("{what}: empty"))),
    };
    inflate(what, cell, frame, dictionary).map(Cow::Owned)
}

/// A zstd frame written without its magic number, inflated.
fn bare_content(what: &'static str, frame: &[u8]) -> Result<Vec<u8>, StoreError> {
    if frame.is_empty() {
        return Err(StoreError::corrupt_msg(format!("{what}: no zstd frame")));
    }
    let whole = [&ZSTD_MAGIC[..], frame].concat();
    inflate(what, &PLAIN_DECOMPRESSOR, &whole, &[])
}

type DecompressorCell = std::thread::LocalKey<RefCell<Option<zstd::bulk::Decompressor<'static>>>>;

/// One zstd frame inflated with the thread's decompressor of that dictionary.
fn inflate(
    what: &'static str,
    cell: &'static DecompressorCell,
    frame: &[u8],
    dictionary: &'static [u8],
) -> Result<Vec<u8>, StoreError> {
    if frame.is_empty() {
        return Err(StoreError::corrupt_msg(format!("{what}: no zstd frame")));
    }
    let corrupt = |e| StoreError::corrupt(what, e);
    // Values are compressed in one shot, so every frame records its size.
    let size = zstd::bulk::Decompressor::upper_bound(frame)
        .filter(|&n| n <= MAX_CONTENT)
        .ok_or_else(|| StoreError::corrupt_msg(format!("{what}: not a sized zstd frame")))?;
    cell.with(|cell| {
        let mut slot = cell.borrow_mut();
        let decompressor = match &mut *slot {
            Some(d) => d,
            empty => empty
                .insert(zstd::bulk::Decompressor::with_dictionary(dictionary).map_err(corrupt)?),
        };
        decompressor.decompress(frame, size).map_err(corrupt)
    })
}

/// Turns written as JSON left their memory id out (nil) when it was the hash of tenant,
/// conversation and turn id; a read derives it again.
fn with_id(t: &mut Turn) {
    if t.memory_id.is_nil() {
        t.memory_id = MemoryId::derive(&t.tenant, &t.conversation_id, &t.turn_id);
    }
}

/// Reads a value an older store wrote as JSON (compressed or plain).
fn json_value<T: DeserializeOwned>(what: &'static str, b: &[u8]) -> Result<T, StoreError> {
    Ok(serde_json::from_slice(&content_of(what, b)?)?)
}

/// A raw turn as stored.
pub fn turn_bytes(t: &Turn) -> Result<Vec<u8>, StoreError> {
    pack("turn", &binary::turn_bytes(t.clone())?)
}

/// Reads a stored turn, in any layout a store ever wrote.
pub fn turn_of(b: &[u8]) -> Result<Turn, StoreError> {
    if b.first() == Some(&BINARY_V2) {
        return binary::turn_of(&content_of("turn", b)?);
    }
    let mut t: Turn = json_value("turn", b)?;
    with_id(&mut t);
    Ok(t)
}

/// A raw turn as stored by the raw store, its conversation named by `number`.
pub fn numbered_turn_bytes(t: &Turn, number: u64) -> Result<Vec<u8>, StoreError> {
    pack_bare(
        NUMBERED_V5,
        "turn",
        &binary::numbered_turn_bytes(t.clone(), number)?,
    )
}

/// Reads a raw turn in any layout the raw store ever wrote; `name_of` gives a conversation
/// number's tenant and id.
pub fn raw_turn_of(
    b: &[u8],
    name_of: impl FnOnce(u64) -> Result<(String, String), StoreError>,
) -> Result<Turn, StoreError> {
    if matches!(b.first(), Some(&(NUMBERED_V3 | NUMBERED_V5))) {
        return binary::numbered_turn_of(&content_of("turn", b)?, name_of);
    }
    turn_of(b)
}

/// A turn record as stored before conversation numbers: its tenant and conversation spelled out.
pub fn record_bytes(rec: &TurnRecord) -> Result<Vec<u8>, StoreError> {
    pack("turn record", &binary::record_bytes(rec.clone())?)
}

/// A turn record as the graph stores it, its conversation named by `number`. A record with a
/// version of another conversation (which no write makes) keeps its names spelled out, so
/// the layout can never rename one.
pub fn numbered_record_bytes(rec: &TurnRecord, number: u64) -> Result<Vec<u8>, StoreError> {
    let (tenant, conversation) = (&rec.turn.tenant, &rec.turn.conversation_id);
    if rec
        .history
        .iter()
        .any(|v| v.turn.tenant != *tenant || v.turn.conversation_id != *conversation)
    {
        return record_bytes(rec);
    }
    let mut body = rec.clone();
    let fragments = std::mem::take(&mut body.fragments);
    let head = binary::head_bytes(number, rec.turn.position, fragments)?;
    let frame = pack_bare(
        NUMBERED_V6,
        "turn record",
        &binary::numbered_record_bytes(body, number)?,
    )?;
    let mut out = Vec::with_capacity(head.len() + frame.len());
    out.push(NUMBERED_V6);
    out.extend_from_slice(&head);
    out.extend_from_slice(&frame[1..]);
    Ok(out)
}

pub use binary::RecordHead;

/// A stored record's conversation number and position, when its layout keeps them ahead of its
/// body ([`NUMBERED_V6`]); None for the layouts before it.
pub fn record_head(b: &[u8]) -> Result<Option<RecordHead>, StoreError> {
    match b.split_first() {
        Some((&NUMBERED_V6, rest)) => Ok(Some(binary::head(rest)?)),
        _ => Ok(None),
    }
}

/// A stored [`NUMBERED_V6`] record with `fragment` among its fragments, its body copied as it
/// is; None when it already names it. Other layouts are an error: decode and write them again.
pub fn record_with_fragment(b: &[u8], fragment: &str) -> Result<Option<Vec<u8>>, StoreError> {
    let Some((&NUMBERED_V6, rest)) = b.split_first() else {
        return Err(StoreError::corrupt_msg(
            "turn record: a fragment is added in place only to a record with a head",
        ));
    };
    binary::with_fragment(NUMBERED_V6, rest, fragment)
}

/// Reads a stored turn record, in any layout a store ever wrote; `name_of` gives a
/// conversation number's tenant and id.
pub fn record_of(
    b: &[u8],
    name_of: impl FnOnce(u64) -> Result<(String, String), StoreError>,
) -> Result<TurnRecord, StoreError> {
    if let Some((&NUMBERED_V6, rest)) = b.split_first() {
        let (fragments, frame) = binary::head_of(rest)?;
        let mut rec = binary::numbered_record_of(&bare_content("turn record", frame)?, name_of)?;
        rec.fragments = fragments;
        return Ok(rec);
    }
    if b.first() == Some(&NUMBERED_V4) {
        return binary::numbered_record_of(&content_of("turn record", b)?, name_of);
    }
    if b.first() == Some(&BINARY_V2) {
        return binary::record_of(&content_of("turn record", b)?);
    }
    let mut rec: TurnRecord = json_value("turn record", b)?;
    with_id(&mut rec.turn);
    for v in &mut rec.history {
        with_id(&mut v.turn);
    }
    Ok(rec)
}

/// A fragment as stored before conversation numbers: its tenant and conversation spelled out.
pub fn fragment_bytes(f: &Fragment) -> Result<Vec<u8>, StoreError> {
    pack("fragment", &binary::fragment_bytes(f.clone())?)
}

/// A fragment as the graph stores it, its conversation named by `number`; `position_of`
/// gives a member's position where it is known.
pub fn numbered_fragment_bytes(
    f: &Fragment,
    number: u64,
    position_of: impl Fn(MemoryId) -> Option<u64>,
) -> Result<Vec<u8>, StoreError> {
    pack_bare(
        NUMBERED_V4,
        "fragment",
        &binary::numbered_fragment_bytes(f.clone(), number, position_of)?,
    )
}

/// Reads a stored fragment, in any layout a store ever wrote; `name_of` gives a conversation
/// number's tenant and id.
pub fn fragment_of(
    b: &[u8],
    name_of: impl FnOnce(u64) -> Result<(String, String), StoreError>,
) -> Result<Fragment, StoreError> {
    if b.first() == Some(&NUMBERED_V4) {
        return binary::numbered_fragment_of(&content_of("fragment", b)?, name_of);
    }
    if b.first() == Some(&BINARY_V2) {
        return binary::fragment_of(&content_of("fragment", b)?);
    }
    json_value("fragment", b)
}

/// States smaller than this are kept as plain JSON: a frame would not pay for itself.
const STATE_PLAIN_MAX: usize = 256;

/// A conversation's state as the graph stores it: its JSON in a zstd frame (with its magic
/// number), or plain JSON when short. The late model's context words make a long
/// conversation's state ~10 KB of text, of which zstd keeps about a fifth (at 100k turns, 165
/// → 23 B a turn on disk).
pub fn state_bytes(s: &ConversationState) -> Result<Vec<u8>, StoreError> {
    let json = serde_json::to_vec(s)?;
    if json.len() <= STATE_PLAIN_MAX {
        return Ok(json);
    }
    // No layout byte: a state's frame is told from JSON by zstd's magic number.
    compressed(&[], "conversation state", &json)
}

/// Reads a stored conversation state: a zstd frame of its JSON, or the plain JSON every store
/// wrote before.
pub fn state_of(b: &[u8]) -> Result<ConversationState, StoreError> {
    json_value("conversation state", b)
}

#[cfg(test)]
mod tests {
    use recollect_model::{Extraction, Keyword, TenantId};

    use super::*;

    fn record() -> TurnRecord {
        let json = r#"{"tenant":"t","conversation_id":"c","turn_id":"7","user":"I went to the park with my dog","assistant":"Which park?","timestamp":"2023-05-08T13:56:00Z","recorded_at":"2026-11-26T01:16:34.121841Z"}"#;
        let mut turn: Turn = serde_json::from_str(json).unwrap();
        turn.memory_id = MemoryId::derive(&turn.tenant, "c", "7");
        TurnRecord {
            turn,
            extraction: Extraction {
                keywords: vec![Keyword {
                    key: "park".into(),
                    text: "park".into(),
                }],
                extractor: "rules".into(),
                ..Extraction::default()
            },
            fragments: vec![MemoryId::from_u128(3).to_string()],
            history: vec![],
            rederiving: false,
        }
    }

    /// A long state (the late model's context words) is kept as a zstd frame, a short one as
    /// JSON; both, and the plain JSON of earlier stores, read back as the same state.
    #[test]
    fn conversation_states_are_compressed_when_long_and_read_in_every_layout() {
        use chrono::TimeZone;
        let at = chrono::Utc.with_ymd_and_hms(2023, 5, 8, 13, 0, 0).unwrap();
        let short = ConversationState {
            consolidated_until: 3,
            ..ConversationState::default()
        };
        let b = state_bytes(&short).unwrap();
        assert_eq!(b.first(), Some(&b'{'));
        assert_eq!(state_of(&b).unwrap(), short);

        let mut long = short.clone();
        for p in 0..ConversationState::RECENT_TEXTS as u64 {
            let text = format!("Caroline: turn {p} went to the pride parade with friends and then painted a sunset by the lake");
            assert!(long.remember_text(p, at, &text, 50));
        }
        let json = serde_json::to_vec(&long).unwrap();
        let b = state_bytes(&long).unwrap();
        assert_eq!(b.get(..4), Some(&ZSTD_MAGIC[..]));
        assert!(b.len() * 3 < json.len(), "{} of {}", b.len(), json.len());
        assert_eq!(state_of(&b).unwrap(), long);
        // What stores wrote before: plain JSON, however long.
        assert_eq!(state_of(&json).unwrap(), long);
        // The erasure scan reads the words inside the frame.
        let content = content_of("conversation state", &b).unwrap();
        assert!(content.windows(11).any(|w| w == b"pride parad"));
        assert!(state_of(&b[..b.len() / 2]).is_err());
    }

    /// A store written by any earlier version opens without a migration: each layout it may
    /// hold reads back as the same record.
    #[test]
    fn values_are_read_in_every_layout_stores_wrote() {
        let mut rec = record();
        // A fragment's id as the consolidator derives it: sixteen bytes zstd cannot shrink.
        rec.fragments = vec![MemoryId::derive(&rec.turn.tenant, "c", "fragment:0:0").to_string()];
        let binary = record_bytes(&rec).unwrap();
        assert_eq!(binary[0], BINARY_V2);
        // JSON layouts left a derivable id out.
        let mut as_json = rec.clone();
        as_json.turn.memory_id = MemoryId::nil();
        let json = serde_json::to_vec(&as_json).unwrap();
        let v1 = pack_json_v1("x", &as_json).unwrap();
        assert_eq!(v1[0], DICT_V1);
        let plain_frame = zstd::bulk::compress(&json, ZSTD_LEVEL).unwrap();
        let names = |n: u64| {
            assert_eq!(n, 9);
            Ok(("t".to_string(), "c".to_string()))
        };
        let numbered = numbered_record_bytes(&rec, 9).unwrap();
        assert_eq!(numbered[0], NUMBERED_V6);
        let numbered_v4 = pack_bare(
            NUMBERED_V4,
            "turn record",
            &binary::numbered_record_bytes(rec.clone(), 9).unwrap(),
        )
        .unwrap();
        // A version of another conversation: the names stay spelled out.
        let mut mixed = rec.clone();
        let mut other = rec.turn.clone();
        other.conversation_id = "elsewhere".into();
        mixed.history.push(crate::graph::TurnVersion {
            turn: other,
            extraction: Extraction::default(),
        });
        let kept = numbered_record_bytes(&mixed, 9).unwrap();
        assert_eq!(kept[0], BINARY_V2);
        assert_eq!(record_of(&kept, names).unwrap(), mixed);
        for stored in [&numbered, &numbered_v4, &binary, &v1, &plain_frame, &json] {
            assert_eq!(record_of(stored, names).unwrap(), rec);
        }
        assert!(binary.len() < v1.len(), "{} vs {}", binary.len(), v1.len());
        // The names and the frame's magic number are left out; the number is in.
        assert!(
            numbered_v4.len() + 4 <= binary.len(),
            "{numbered_v4:?} vs {binary:?}"
        );
        // A head repeats the number and the position (1 and 10 bytes here: this turn was
        // never numbered) outside the frame, and takes the fragment out of it.
        assert!(
            numbered.len() <= numbered_v4.len() + 12,
            "{} vs {}",
            numbered.len(),
            numbered_v4.len()
        );
        // Raw turns by number, with and without the frame's magic number.
        let raw_v3 = pack_as(
            NUMBERED_V3,
            "turn",
            &binary::numbered_turn_bytes(rec.turn.clone(), 9).unwrap(),
        )
        .unwrap();
        let raw_v5 = numbered_turn_bytes(&rec.turn, 9).unwrap();
        assert_eq!((raw_v5[0], raw_v5.len()), (NUMBERED_V5, raw_v3.len() - 4));
        for stored in [&raw_v3, &raw_v5] {
            assert_eq!(raw_turn_of(stored, names).unwrap(), rec.turn);
        }

        let turn_json = serde_json::to_vec(&as_json.turn).unwrap();
        for stored in [
            turn_bytes(&rec.turn).unwrap(),
            pack_json_v1("x", &as_json.turn).unwrap(),
            turn_json,
        ] {
            assert_eq!(turn_of(&stored).unwrap(), rec.turn);
        }
        let f = Fragment {
            id: "f".into(),
            tenant: TenantId("t".into()),
            conversation_id: "c".into(),
            description: "park".into(),
            members: vec![rec.turn.memory_id],
            keywords: vec!["park".into()],
            created_at: rec.turn.recorded_at,
        };
        let numbered_fragment = numbered_fragment_bytes(&f, 9, |_| None).unwrap();
        assert_eq!(numbered_fragment[0], NUMBERED_V4);
        for stored in [
            numbered_fragment,
            fragment_bytes(&f).unwrap(),
            pack_json_v1("x", &f).unwrap(),
            serde_json::to_vec(&f).unwrap(),
        ] {
            assert_eq!(fragment_of(&stored, names).unwrap(), f);
        }
        // What erasure checks search: the texts, in every layout.
        for stored in [&numbered, &binary, &v1, &raw_v5] {
            let content = content_of("x", stored).unwrap();
            assert!(content.windows(4).any(|w| w == b"park"));
        }
        for damaged in [
            &b"\x28\xb5\x2f\xfd garbage"[..],
            &[DICT_V1, 0x28, 0xb5][..],
            &[BINARY_V2, 0x28, 0xb5][..],
            &[BINARY_V2][..],
            &[NUMBERED_V4][..],
            &[NUMBERED_V4, 0x60, 0x50][..],
            &numbered[..numbered.len() - 1],
            &[NUMBERED_V5, 0x28, 0xb5][..],
            &[][..],
        ] {
            let e = content_of("x", damaged).unwrap_err();
            assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
            let e = record_of(damaged, names).unwrap_err();
            assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        }
    }

    /// A fragment formed after its members were written adds its id to their heads; the
    /// compressed body is copied byte for byte, and the record reads back with it.
    #[test]
    fn a_fragment_is_added_to_a_record_without_touching_its_body() {
        let names = |_| Ok(("t".to_string(), "c".to_string()));
        let mut rec = record();
        rec.turn.position = 300;
        let stored = numbered_record_bytes(&rec, 70_000).unwrap();
        assert_eq!(
            record_head(&stored).unwrap(),
            Some(RecordHead {
                number: 70_000,
                position: 300
            })
        );
        let named = "fragment-of-the-park".to_string();
        let uuid = MemoryId::from_u128(4).to_string();
        let once = record_with_fragment(&stored, &named).unwrap().unwrap();
        let twice = record_with_fragment(&once, &uuid).unwrap().unwrap();
        assert_eq!(record_with_fragment(&twice, &named).unwrap(), None);
        let body = |b: &[u8]| b[b.len() - 20..].to_vec();
        assert_eq!(body(&twice), body(&stored));
        rec.fragments.extend([named, uuid]);
        assert_eq!(record_of(&twice, names).unwrap(), rec);
        assert_eq!(twice, numbered_record_bytes(&rec, 70_000).unwrap());
        // Layouts without a head say so, and are decoded and written again instead.
        let older = record_bytes(&rec).unwrap();
        assert_eq!(record_head(&older).unwrap(), None);
        assert!(record_with_fragment(&older, "f").is_err());
        assert!(record_head(&[NUMBERED_V6, 0xff]).is_err());
    }

    /// [`DICTIONARY_V1`] is what stores before the binary layout wrote with: their values must
    /// read back in every later version. If this fails, the dictionary was edited.
    #[test]
    fn the_dictionary_is_the_one_values_were_written_with() {
        assert_eq!(
            blake3::hash(DICTIONARY_V1).to_hex().as_str(),
            "1f6bb6acf62c03d6ed9a7d007d226905fec900dfd2e074eacab51c562bbb182e"
        );
    }
}
