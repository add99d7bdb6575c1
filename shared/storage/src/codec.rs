//! Values the embedded stores keep as JSON compressed with zstd: turns (raw store) and turn
//! records (graph). JSON keeps them readable by every version and tolerant of added fields;
//! zstd takes out the texts' redundancy, and [`DICTIONARY_V1`] the field names that every
//! value repeats (zstd alone must spell them out once per value, which is most of a small one).
//!
//! First byte: [`DICT_V1`] then a zstd frame made with [`DICTIONARY_V1`] (what is written);
//! zstd's own magic (a frame without a dictionary) or `{` (plain JSON): what older stores
//! wrote, still read, so no migration is needed.

use std::borrow::Cow;
use std::cell::RefCell;

use recollect_model::{MemoryId, Turn};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::StoreError;

/// zstd's level: level 3 (its default) compresses a turn in tens of microseconds; higher
/// levels gain 4 % on values this small.
const ZSTD_LEVEL: i32 = 3;

/// Largest JSON [`json_of`] will inflate: a turn record is at most two 64 KiB texts per
/// version, so a frame that says more is damaged.
const MAX_JSON: usize = 64 << 20;

/// Marks a frame compressed with [`DICTIONARY_V1`].
const DICT_V1: u8 = 1;

/// A raw-content dictionary: the skeleton of a turn record and of a turn, as serde writes
/// them (field names and the shapes of their values, no data). zstd starts every value with it
/// as history, so the field names cost a few bytes of back-references instead of their text:
/// 27 % off a turn record, 21 % off a turn. Part of the stored format: never edit it; a
/// different skeleton is a new version byte and a new constant.
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
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
    static PLAIN_DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// `value` as stored: [`DICT_V1`], then its JSON compressed with [`DICTIONARY_V1`].
pub fn pack<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, StoreError> {
    let json = serde_json::to_vec(value)?;
    let failed = |e| StoreError::backend(what, e);
    COMPRESSOR.with(|cell| {
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

/// The JSON of a stored value: [`pack`]'s, or what older stores wrote.
pub fn json_of<'a>(what: &'static str, b: &'a [u8]) -> Result<Cow<'a, [u8]>, StoreError> {
    let (cell, frame, dictionary) = match b.first() {
        Some(b'{') => return Ok(Cow::Borrowed(b)),
        Some(&DICT_V1) => (&DECOMPRESSOR, &b[1..], DICTIONARY_V1),
        Some(_) => (&PLAIN_DECOMPRESSOR, b, &[][..]),
        None => return Err(StoreError::corrupt_msg(format!("{what}: empty"))),
    };
    let corrupt = |e| StoreError::corrupt(what, e);
    // `pack` compresses in one shot, so every frame records its size.
    let size = zstd::bulk::Decompressor::upper_bound(frame)
        .filter(|&n| n <= MAX_JSON)
        .ok_or_else(|| StoreError::corrupt_msg(format!("{what}: not a sized zstd frame")))?;
    cell.with(|cell| {
        let mut slot = cell.borrow_mut();
        let decompressor = match &mut *slot {
            Some(d) => d,
            empty => empty
                .insert(zstd::bulk::Decompressor::with_dictionary(dictionary).map_err(corrupt)?),
        };
        decompressor
            .decompress(frame, size)
            .map(Cow::Owned)
            .map_err(corrupt)
    })
}

/// A turn's memory id is a hash of its tenant, conversation and turn id, and as a 36-character
/// random-looking string it is a tenth of a compressed turn: stored turns leave it out (nil,
/// which [`DICTIONARY_V1`] holds) when it is that hash, and [`with_id`] derives it again.
pub fn without_id(t: &mut Turn) {
    if t.memory_id == MemoryId::derive(&t.tenant, &t.conversation_id, &t.turn_id) {
        t.memory_id = MemoryId::nil();
    }
}

/// Undoes [`without_id`].
pub fn with_id(t: &mut Turn) {
    if t.memory_id.is_nil() {
        t.memory_id = MemoryId::derive(&t.tenant, &t.conversation_id, &t.turn_id);
    }
}

/// Reads a value [`pack`] wrote (or plain JSON).
pub fn unpack<T: DeserializeOwned>(what: &'static str, b: &[u8]) -> Result<T, StoreError> {
    Ok(serde_json::from_slice(&json_of(what, b)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_compressed_and_as_older_stores_wrote_them() {
        let json = br#"{"turn":{"user":"hello there, hello there, hello there"}}"#;
        let v: serde_json::Value = serde_json::from_slice(json).unwrap();
        let packed = pack("x", &v).unwrap();
        assert_eq!(packed[0], DICT_V1);
        assert_eq!(unpack::<serde_json::Value>("x", &packed).unwrap(), v);
        // Older stores: a zstd frame without a dictionary, and plain JSON.
        let plain_frame = zstd::bulk::compress(json, ZSTD_LEVEL).unwrap();
        assert_eq!(&*json_of("x", &plain_frame).unwrap(), &json[..]);
        assert_eq!(&*json_of("x", json).unwrap(), &json[..]);
        for damaged in [
            &b"\x28\xb5\x2f\xfd garbage"[..],
            &[DICT_V1, 0x28, 0xb5][..],
            &[][..],
        ] {
            let e = json_of("x", damaged).unwrap_err();
            assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        }
    }

    /// The dictionary is part of the stored format: a value packed by this version must read
    /// back in every later one. If this fails, [`DICTIONARY_V1`] was edited.
    #[test]
    fn the_dictionary_is_the_one_values_were_written_with() {
        assert_eq!(
            blake3::hash(DICTIONARY_V1).to_hex().as_str(),
            "1f6bb6acf62c03d6ed9a7d007d226905fec900dfd2e074eacab51c562bbb182e"
        );
        let v = serde_json::json!({"turn": {"memory_id": "m", "user": "I went to the park"}});
        let json = serde_json::to_vec(&v).unwrap();
        let packed = pack("x", &v).unwrap();
        let without = zstd::bulk::compress(&json, ZSTD_LEVEL).unwrap();
        assert!(
            packed.len() < without.len(),
            "{} vs {}",
            packed.len(),
            without.len()
        );
    }

    /// The id is left out only when it can be derived again, and always comes back.
    #[test]
    fn a_turn_sheds_only_the_id_it_can_derive_again() {
        let json = r#"{"tenant":"t","conversation_id":"c","turn_id":"7","user":"hi","timestamp":"2023-05-08T13:56:00Z"}"#;
        let mut turn: Turn = serde_json::from_str(json).unwrap();
        let derived = MemoryId::derive(&turn.tenant, "c", "7");
        turn.memory_id = derived;
        let mut stored = turn.clone();
        without_id(&mut stored);
        assert!(stored.memory_id.is_nil());
        with_id(&mut stored);
        assert_eq!(stored, turn);
        // An id from elsewhere (a producer's) is kept as it is.
        let mut other = turn.clone();
        other.memory_id = MemoryId::derive(&turn.tenant, "c", "8");
        let mut stored = other.clone();
        without_id(&mut stored);
        with_id(&mut stored);
        assert_eq!(stored, other);
    }
}
