//! The nouns every Recollect crate shares: turns as stored, what enrichment adds to them,
//! the messages that travel between workers, and the deterministic ids that make
//! at-least-once delivery exactly-once in effect.

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

pub mod error;
pub mod filter;
pub mod generations;
pub mod request;
pub use error::{Classify, ErrorKind, RecollectError};
pub use filter::TurnFilter;
pub use generations::Generations;

/// Version of every message put on the bus; readers accept this and all older versions.
/// Version 2: raw turns may leave out `memory_id`, `position` and `recorded_at` (producers that
/// write to `recollect.turns.raw` directly); version 1 messages, with every field, still read.
/// Version 3: dense vectors travel packed ([`packed_f32`]); arrays of numbers still read.
pub const SCHEMA_VERSION: u16 = 3;

/// Dense vectors on the bus as base64 of little-endian f32 instead of JSON numbers: formatting
/// and parsing ~1,000 floats per turn as decimal text was a third of the pipeline's CPU
/// (perf, `recollect bench`). Reads both forms, so version ≤ 2 messages still decode; refuses
/// non-finite values, which would poison a vector index.
pub mod packed_f32 {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use serde::de::{self, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[f32], s: S) -> Result<S::Ok, S::Error> {
        let mut bytes = Vec::with_capacity(v.len() * 4);
        for x in v {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
        struct Packed;
        impl<'de> Visitor<'de> for Packed {
            type Value = Vec<f32>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("base64 of little-endian f32, or an array of numbers")
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Vec<f32>, E> {
                let b = STANDARD.decode(s).map_err(E::custom)?;
                if b.len() % 4 != 0 {
                    return Err(E::custom("packed vector is not a whole number of f32"));
                }
                let v: Vec<f32> = b
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                if v.iter().any(|x| !x.is_finite()) {
                    return Err(E::custom("packed vector holds a non-finite value"));
                }
                Ok(v)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<f32>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(65_536));
                while let Some(x) = seq.next_element::<f32>()? {
                    out.push(x);
                }
                Ok(out)
            }
        }
        d.deserialize_any(Packed)
    }
}

/// [`packed_f32`] for a vector shared rather than copied (a keyword's vector goes out with
/// every turn that says the keyword).
pub mod packed_f32_shared {
    use std::sync::Arc;

    use serde::Deserializer;

    pub use super::packed_f32::serialize;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<[f32]>, D::Error> {
        super::packed_f32::deserialize(d).map(Arc::from)
    }
}

/// A text as one unit vector per token (late interaction, ColBERT's MaxSim): `rows` vectors of
/// `dim` values, flattened row after row. A turn's rows are its user field's tokens, then its
/// assistant field's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenVectors {
    pub dim: usize,
    pub values: Vec<f32>,
    /// Which sentence each row was read in (see [`Segment`]), one per row; empty where unknown
    /// (a question, or a turn stored before sentences were kept).
    pub segments: Vec<Segment>,
}

/// Where a turn's token row stands: which field (`part`) and which of its sentences
/// (`sentence`, from 1), or 0 for the rows every sentence of that field shares ([CLS], [SEP],
/// the speaker's name). Packed in a u16 (part × [`Segment::PART`] + sentence) to ride on the
/// bus and in a payload as one small integer per row.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Segment(pub u16);

impl Segment {
    /// Sentences a field can number; later ones share the last number.
    pub const PART: u16 = 1 << 12;

    pub fn new(part: u16, sentence: usize) -> Self {
        let sentence = sentence.min(usize::from(Self::PART) - 1) as u16;
        Self(part.saturating_mul(Self::PART).saturating_add(sentence))
    }
    pub fn part(self) -> u16 {
        self.0 / Self::PART
    }
    pub fn sentence(self) -> u16 {
        self.0 % Self::PART
    }
    /// The same place in a later field.
    fn shifted(self, parts: u16) -> Self {
        Self(self.0.saturating_add(parts.saturating_mul(Self::PART)))
    }
}

impl TokenVectors {
    /// Rows of `dim` values; refuses a ragged or empty matrix and non-finite values.
    pub fn new(dim: usize, values: Vec<f32>) -> Result<Self, String> {
        if dim == 0 || values.is_empty() || !values.len().is_multiple_of(dim) {
            return Err(format!(
                "token vectors of {} values are not whole rows of {dim}",
                values.len()
            ));
        }
        if values.iter().any(|x| !x.is_finite()) {
            return Err("token vectors hold a non-finite value".into());
        }
        Ok(Self {
            dim,
            values,
            segments: Vec::new(),
        })
    }

    /// The same rows with each one's sentence; refuses labels that are not one per row.
    pub fn with_segments(mut self, segments: Vec<Segment>) -> Result<Self, String> {
        if !segments.is_empty() && segments.len() != self.len() {
            return Err(format!(
                "{} sentence labels for {} token rows",
                segments.len(),
                self.len()
            ));
        }
        self.segments = segments;
        Ok(self)
    }

    pub fn rows(&self) -> impl Iterator<Item = &[f32]> {
        self.values.chunks_exact(self.dim.max(1))
    }

    pub fn len(&self) -> usize {
        self.values.len() / self.dim.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// These rows followed by `other`'s (of the same width), `other`'s sentences as a field
    /// after these. Sentences are kept only when both sides have them.
    pub fn extend(&mut self, other: &TokenVectors) {
        let had_rows = !self.values.is_empty();
        if !had_rows {
            self.dim = other.dim;
        }
        if other.dim != self.dim {
            return;
        }
        if !had_rows {
            self.segments = other.segments.clone();
        } else if self.segments.is_empty() || other.segments.is_empty() {
            self.segments.clear();
        } else {
            let parts = self.segments.iter().map(|s| s.part()).max().unwrap_or(0) + 1;
            self.segments
                .extend(other.segments.iter().map(|s| s.shifted(parts)));
        }
        self.values.extend_from_slice(&other.values);
    }

    /// ColBERT's MaxSim of a question's token vectors against these, averaged over the
    /// question's tokens (so it reads on a cosine's scale whatever the question's length).
    pub fn max_sim(&self, question: &TokenVectors) -> f32 {
        if question.is_empty() || self.is_empty() || question.dim != self.dim {
            return 0.0;
        }
        let total: f32 = question
            .rows()
            .map(|q| {
                self.rows()
                    .map(|d| dot_lanes(q, d))
                    .fold(f32::NEG_INFINITY, f32::max)
            })
            .sum();
        total / question.len() as f32
    }

    /// MaxSim confined to one sentence: for each sentence, the question's tokens matched only
    /// among that sentence's rows and the rows its field shares (the speaker's name, [CLS],
    /// [SEP]); the best sentence's. None without sentence labels. A question whose words are
    /// all in one sentence scores higher than one whose words are spread over the turn
    /// (term proximity, as BERT-MaxP scores a document by its best passage).
    pub fn sentence_max_sim(&self, question: &TokenVectors) -> Option<f32> {
        if question.is_empty()
            || self.is_empty()
            || question.dim != self.dim
            || self.segments.len() != self.len()
        {
            return None;
        }
        // Sentences and parts as small indexes, so one pass over the rows per question row
        // keeps each sentence's best match and each field's shared best.
        let mut sentences: Vec<Segment> = self
            .segments
            .iter()
            .copied()
            .filter(|s| s.sentence() > 0)
            .collect();
        sentences.sort_unstable_by_key(|s| s.0);
        sentences.dedup();
        if sentences.is_empty() {
            return None;
        }
        let parts = usize::from(self.segments.iter().map(|s| s.part()).max().unwrap_or(0)) + 1;
        let slot: Vec<Option<usize>> = self
            .segments
            .iter()
            .map(|s| sentences.binary_search(s).ok())
            .collect();
        let mut total = vec![0f32; sentences.len()];
        let mut best = vec![f32::NEG_INFINITY; sentences.len()];
        let mut shared = vec![f32::NEG_INFINITY; parts];
        // One dispatch for the whole matrix, not one a dot product: the loop is compiled for
        // the CPU's vector unit as `dot_lanes` is.
        SIMD.dispatch(|| {
            for q in question.rows() {
                best.fill(f32::NEG_INFINITY);
                shared.fill(f32::NEG_INFINITY);
                for ((d, seg), at) in self.rows().zip(&self.segments).zip(&slot) {
                    let x = lanes(q, d);
                    let b = match at {
                        Some(i) => &mut best[*i],
                        None => &mut shared[usize::from(seg.part())],
                    };
                    *b = b.max(x);
                }
                for ((t, b), s) in total.iter_mut().zip(&best).zip(&sentences) {
                    *t += b.max(shared[usize::from(s.part())]);
                }
            }
        });
        total
            .into_iter()
            .reduce(f32::max)
            .map(|b| b / question.len() as f32)
    }
}

/// Token vectors on the bus: each unit-vector component as one signed byte (×127), base64;
/// a quarter of f32's bytes, and MaxSim over LoCoMo measured the same to three decimals.
impl Serialize for TokenVectors {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::Engine;
        use serde::ser::SerializeStruct;
        let bytes: Vec<u8> = self
            .values
            .iter()
            .map(|x| (x.clamp(-1.0, 1.0) * 127.0).round() as i8 as u8)
            .collect();
        let with_segments = !self.segments.is_empty();
        let mut st = s.serialize_struct("TokenVectors", 2 + usize::from(with_segments))?;
        st.serialize_field("dim", &self.dim)?;
        st.serialize_field(
            "i8",
            &base64::engine::general_purpose::STANDARD.encode(bytes),
        )?;
        if with_segments {
            st.serialize_field("segments", &self.segments)?;
        }
        st.end()
    }
}

impl<'de> Deserialize<'de> for TokenVectors {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use base64::Engine;
        #[derive(Deserialize)]
        struct Wire {
            dim: usize,
            i8: String,
            // Absent in messages from before sentences were kept.
            #[serde(default)]
            segments: Vec<Segment>,
        }
        let w = Wire::deserialize(d)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(w.i8)
            .map_err(serde::de::Error::custom)?;
        let values = bytes.iter().map(|&b| f32::from(b as i8) / 127.0).collect();
        TokenVectors::new(w.dim, values)
            .and_then(|t| t.with_segments(w.segments))
            .map_err(serde::de::Error::custom)
    }
}

/// Limits that apply to a stored turn, whatever the entry point.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;

/// A point in time as the model carries it (record times, erasure markers).
pub type Timestamp = DateTime<Utc>;

/// A tenant: derived from the caller's credential, never from a request field.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TenantId(pub String);

impl TenantId {
    /// The tenant used when the server runs open, with no API keys configured.
    pub fn default_tenant() -> Self {
        Self("default".to_string())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TenantId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Deterministic id of a memory (one turn): a UUID made from a hash of tenant,
/// conversation and turn id, so a retried write lands on the same id everywhere.
///
/// A turn's id comes in two forms. [`MemoryId::of_turn`] (every turn stored since 2026-11-29)
/// starts with 8 bytes of the conversation's hash, so the stores, which key turns by memory id,
/// keep a conversation's turns together: a request's turns rewrite a few pages of those tables
/// instead of one page each. [`MemoryId::derive`] (turns stored before, and the ids of keyword
/// points, fragments and kept versions) hashes all three parts together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemoryId(pub [u8; 16]);

/// blake3 over length-prefixed parts, so ("a","bc") and ("ab","c") stay apart.
fn hash_parts(parts: &[&str]) -> blake3::Hash {
    let mut h = blake3::Hasher::new();
    for part in parts {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize()
}

/// Stamps the version-4 UUID bits, so external stores that validate UUIDs accept the id.
fn stamped(mut out: [u8; 16]) -> MemoryId {
    out[6] = (out[6] & 0x0f) | 0x40;
    out[8] = (out[8] & 0x3f) | 0x80;
    MemoryId(out)
}

impl MemoryId {
    /// "Not derived yet" (a producer left the id out).
    pub fn nil() -> Self {
        Self([0; 16])
    }

    pub fn is_nil(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The hashed form: all 122 free bits from one hash of the three parts. Turns stored before
    /// [`MemoryId::of_turn`] keep it, and so do the ids made from a turn's (keyword points,
    /// fragments, kept versions), which must not change under a store that has them.
    pub fn derive(tenant: &TenantId, conversation: &str, turn_id: &str) -> Self {
        let mut out = [0u8; 16];
        out.copy_from_slice(
            &hash_parts(&[tenant.as_str(), conversation, turn_id]).as_bytes()[..16],
        );
        stamped(out)
    }

    /// A new turn's id: 8 bytes of the hash of tenant and conversation, then 8 of the hash of
    /// all three. Ids of one conversation share their first 8 bytes (60 bits once stamped), so
    /// key order groups them; between conversations they are as unlikely to meet as hashed ids
    /// (122 bits), and within one a clash needs 62 bits to agree.
    pub fn of_turn(tenant: &TenantId, conversation: &str, turn_id: &str) -> Self {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&hash_parts(&[tenant.as_str(), conversation]).as_bytes()[..8]);
        out[8..].copy_from_slice(
            &hash_parts(&[tenant.as_str(), conversation, turn_id]).as_bytes()[..8],
        );
        stamped(out)
    }

    /// The ids a turn may have been stored under, the current form first.
    pub fn forms_of_turn(tenant: &TenantId, conversation: &str, turn_id: &str) -> [Self; 2] {
        [
            Self::of_turn(tenant, conversation, turn_id),
            Self::derive(tenant, conversation, turn_id),
        ]
    }

    pub fn as_u128(&self) -> u128 {
        u128::from_be_bytes(self.0)
    }

    pub fn from_u128(v: u128) -> Self {
        Self(v.to_be_bytes())
    }

    /// Parses the canonical 8-4-4-4-12 hex form.
    pub fn parse(s: &str) -> Option<Self> {
        let hex: String = s.chars().filter(|c| *c != '-').collect();
        if hex.len() != 32 || s.len() != 36 {
            return None;
        }
        u128::from_str_radix(&hex, 16).ok().map(Self::from_u128)
    }
}

impl std::fmt::Display for MemoryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let h = format!("{:032x}", self.as_u128());
        write!(
            f,
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }
}

impl Serialize for MemoryId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for MemoryId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        MemoryId::parse(&s).ok_or_else(|| serde::de::Error::custom("invalid memory id"))
    }
}

/// A turn as a client sends it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TurnInput {
    #[serde(default)]
    pub turn_id: Option<String>,
    pub user: String,
    #[serde(default)]
    pub assistant: Option<String>,
    #[serde(default)]
    pub user_speaker: Option<String>,
    #[serde(default)]
    pub assistant_speaker: Option<String>,
    pub timestamp: DateTime<Utc>,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// The platform's end user this turn belongs to; recall can be scoped to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// The agent (assistant persona) that took part; recall can be scoped to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
}

/// The raw turn, written durably before anything else happens to it: the source of truth
/// from which every derived store can be rebuilt.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Turn {
    /// Derived from tenant, conversation and turn id; a producer may leave it out (nil).
    #[serde(default = "MemoryId::nil")]
    #[schema(value_type = String)]
    pub memory_id: MemoryId,
    #[schema(value_type = String)]
    pub tenant: TenantId,
    pub conversation_id: String,
    pub turn_id: String,
    /// Order of arrival within the conversation; the state machine and consolidation follow it.
    /// [`Turn::UNSEQUENCED`] until assigned (by the raw store, or by the extractor in partition
    /// order when turns arrive straight from Kafka).
    #[serde(default = "unsequenced")]
    pub position: u64,
    pub user: String,
    #[serde(default)]
    pub assistant: String,
    #[serde(default)]
    pub user_speaker: Option<String>,
    #[serde(default)]
    pub assistant_speaker: Option<String>,
    pub timestamp: DateTime<Utc>,
    /// When Recollect accepted the turn; erasure markers are compared with it. A producer
    /// writing to Kafka directly may leave it out ([`Turn::UNRECORDED`]): the extractor then
    /// sets the message's bus timestamp, which a redelivery repeats.
    #[serde(default = "unrecorded")]
    pub recorded_at: DateTime<Utc>,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// Left out of the JSON when absent, so messages and records written before these fields
    /// existed read back unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// 1 as first stored, one more per edit (`PATCH /v1/memories/{id}`); left out at 1.
    #[serde(default = "first_version", skip_serializing_if = "is_first_version")]
    pub version: u32,
    /// On an edited version: when version 1 was recorded. Erasure markers compare with it, so
    /// an edit never outlives the erasure of the memory it edits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_recorded_at: Option<DateTime<Utc>>,
    /// On a superseded version (a memory's history): when the next version replaced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired_at: Option<DateTime<Utc>>,
}

/// Now, to the microsecond: transaction times are compared with times clients send back
/// (`as_of`), and most clients (Python's datetime, JavaScript's Date, Neo4j) hold no finer.
pub fn now_micros() -> DateTime<Utc> {
    chrono::DurationRound::duration_trunc(Utc::now(), chrono::Duration::microseconds(1))
        .unwrap_or_else(|_| Utc::now())
}

fn first_version() -> u32 {
    1
}

fn is_first_version(v: &u32) -> bool {
    *v == 1
}

/// `PATCH /v1/memories/{id}` body: the fields an edit replaces (at least one). The edit is a new
/// version of the memory; the one before is kept, expired, in its history.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TurnPatch {
    #[serde(default)]
    pub user: Option<String>,
    /// The assistant's text; an empty string removes it.
    #[serde(default)]
    pub assistant: Option<String>,
    /// Replaces the whole metadata object.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// Answer only once the new version is recallable (default: once it is stored durably).
    #[serde(default)]
    pub wait: Option<bool>,
}

impl TurnPatch {
    /// The version this edit makes of `current`, recorded at `now`; None when it changes
    /// nothing (a retried edit).
    pub fn apply(&self, current: &Turn, now: DateTime<Utc>) -> Option<Turn> {
        let mut next = current.clone();
        if let Some(u) = &self.user {
            next.user = u.clone();
        }
        if let Some(a) = &self.assistant {
            next.assistant = a.clone();
        }
        if let Some(m) = &self.metadata {
            next.metadata = m.clone();
        }
        if next.user == current.user
            && next.assistant == current.assistant
            && next.metadata == current.metadata
        {
            return None;
        }
        next.version = current.version + 1;
        next.first_recorded_at = Some(current.first_recorded());
        // Never at or before the version it replaces, whatever the clocks say.
        next.recorded_at = now.max(current.recorded_at + chrono::Duration::milliseconds(1));
        next.expired_at = None;
        Some(next)
    }
}

fn unsequenced() -> u64 {
    Turn::UNSEQUENCED
}

fn unrecorded() -> DateTime<Utc> {
    Turn::UNRECORDED
}

impl Turn {
    pub const UNSEQUENCED: u64 = u64::MAX;
    /// `recorded_at` of a raw turn whose producer did not set it.
    pub const UNRECORDED: DateTime<Utc> = DateTime::<Utc>::UNIX_EPOCH;

    pub fn is_recorded(&self) -> bool {
        self.recorded_at != Self::UNRECORDED
    }

    /// Sets `recorded_at` when the producer left it out: to when the producer handed the turn
    /// to the bus (its timestamp, ms), not when it was read, so an erasure in between covers
    /// it and a redelivery stamps it the same; to now when the bus has no timestamp.
    pub fn stamp_recorded(&mut self, bus_timestamp_ms: Option<i64>) {
        if !self.is_recorded() {
            self.recorded_at = bus_timestamp_ms
                .and_then(DateTime::from_timestamp_millis)
                .unwrap_or_else(Utc::now);
        }
    }

    /// When the memory's first version was recorded (erasure markers compare with it).
    pub fn first_recorded(&self) -> DateTime<Utc> {
        self.first_recorded_at.unwrap_or(self.recorded_at)
    }

    /// Whether this is an edit of a stored memory rather than its first version.
    pub fn is_edit(&self) -> bool {
        self.version > 1
    }

    /// Whether this version was what Recollect held at transaction time `at`.
    pub fn current_at(&self, at: DateTime<Utc>) -> bool {
        self.recorded_at <= at && self.expired_at.is_none_or(|e| e > at)
    }

    pub fn is_sequenced(&self) -> bool {
        self.position != Self::UNSEQUENCED
    }

    /// Whether `input` says exactly what this turn holds: a retry of the store that made it,
    /// not a different turn under the same turn id.
    pub fn same_content(&self, input: &TurnInput) -> bool {
        self.user == input.user
            && self.assistant == input.assistant.as_deref().unwrap_or_default()
            && self.user_speaker == input.user_speaker
            && self.assistant_speaker == input.assistant_speaker
            && self.timestamp == input.timestamp
            && self.metadata == input.metadata
            && self.user_id == input.user_id
            && self.agent_id == input.agent_id
    }

    /// The 409 message for a turn id that already holds other content.
    pub fn conflict_message(&self, index: usize) -> String {
        format!(
            "turns[{index}].turn_id {:?} already holds a different turn (memory {}); a retry must \
             repeat it exactly. To change it, edit it (PATCH /v1/memories/{}: a new version, the \
             old one kept in its history)",
            self.turn_id, self.memory_id, self.memory_id
        )
    }

    /// The fields that carry text, in the order they were said.
    pub fn fields(&self) -> [(Field, &str); 2] {
        [
            (Field::User, &self.user),
            (Field::Assistant, &self.assistant),
        ]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Field {
    User,
    Assistant,
}

/// A keyword: `key` is the stemmed, lower-case form Keyword nodes are merged on; `text` is
/// the surface form (lower case) that gets embedded.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
pub struct Keyword {
    pub key: String,
    pub text: String,
}

/// A time expression resolved against the turn's anchor time: a closed day range.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TimeRef {
    /// The words in the text ("last Friday"), or the source of an inferred time.
    pub text: String,
    pub start: NaiveDate,
    pub end: NaiveDate,
    /// day | week | month | season | year
    pub granularity: String,
}

impl TimeRef {
    /// ISO 8601 key of the TimePoint node: a day, a month, a year, or an interval.
    pub fn key(&self) -> String {
        let mut key = String::with_capacity(21);
        push_iso_date(&mut key, self.start);
        if self.start != self.end {
            key.push('/');
            push_iso_date(&mut key, self.end);
        }
        key
    }
}

/// `date` as chrono's `%Y-%m-%d` writes it. Keys are made for every time of every turn, and
/// chrono's format parses its pattern each time (~1 % of the ingest's CPU); years outside
/// 0..=9999, which `%Y` writes with a sign, go through chrono.
fn push_iso_date(out: &mut String, date: NaiveDate) {
    use std::fmt::Write as _;
    let year = date.year();
    if (0..=9999).contains(&year) {
        let _ = write!(out, "{year:04}-{:02}-{:02}", date.month(), date.day());
    } else {
        let _ = write!(out, "{}", date.format("%Y-%m-%d"));
    }
}

/// An anaphor resolved at store time by the reference-resolution state machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Reference {
    /// The words in the text ("she", "there", "that day").
    pub mention: String,
    /// entity | location | event | time
    pub kind: String,
    /// What it resolved to (an entity name, a location, an ISO date).
    pub resolved: String,
    pub field: Field,
}

/// What the extractor adds to a turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Extraction {
    /// Content words and short phrases; `key` (stemmed) names the Keyword node.
    pub keywords: Vec<Keyword>,
    /// Named entities, speakers first, as written.
    pub entities: Vec<String>,
    pub locations: Vec<String>,
    /// Event phrases (verb + object), used by the state machine's event stack.
    pub events: Vec<String>,
    pub times: Vec<TimeRef>,
    pub references: Vec<Reference>,
    /// ISO 8601 time the turn refers to (first resolved time), or the turn time if none.
    pub event_time: Option<DateTime<Utc>>,
    /// Which extractor produced this (`rules`, `llm:<model>`), for the info metric and audits.
    pub extractor: String,
}

/// The dot product of two embeddings, which is their cosine: every vector Recollect stores is
/// L2-normalised. One definition for recall, consolidation and the embedder, summed in order so
/// that a score is the same wherever it is computed. Vectors of different lengths are compared
/// over the shorter length.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// [`dot`] summed in eight lanes, so the compiler vectorises it (a plain `sum` of floats must
/// keep its order, and stays scalar): for comparisons made and used in one place, such as the
/// consolidator's grouping and the keyword-form scan, where a last-bit difference from [`dot`]
/// changes nothing. Also over the shorter length.
pub fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    // The same loop, compiled for the widest vector unit the CPU has (AVX2 where there is one:
    // eight lanes in one register, where the baseline target has four). Floats are never
    // contracted into fused multiply-adds, so every unit gives the same bits.
    SIMD.dispatch(|| lanes(a, b))
}

static SIMD: std::sync::LazyLock<pulp::Arch> = std::sync::LazyLock::new(pulp::Arch::new);

#[inline(always)]
fn lanes(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut lanes = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// Sparse lexical vector: stemmed-term ids and BM25 term weights.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SparseVector {
    pub indices: Vec<u32>,
    pub values: Vec<f32>,
}

/// A keyword with its embedding, for the keyword vector index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeywordVector {
    pub keyword: String,
    /// Shared: the embedder hands one keyword's vector to every turn that says it, and the
    /// graph writer gathers them per conversation, without copying 1.5 KB each time.
    #[serde(with = "packed_f32_shared")]
    pub vector: std::sync::Arc<[f32]>,
}

/// Everything the embedder adds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Embeddings {
    #[serde(with = "packed_f32")]
    pub user: Vec<f32>,
    /// Empty when the turn has no assistant text.
    #[serde(with = "packed_f32")]
    pub assistant: Vec<f32>,
    pub lexical: SparseVector,
    pub keywords: Vec<KeywordVector>,
    pub model: String,
    /// Both fields' token vectors, when `embedder.late_model` names a late-interaction model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenVectors>,
}

/// Bus payloads, one per topic. Every message carries its schema version and a trace id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Envelope<T> {
    #[serde(default = "default_schema_version")]
    pub schema_version: u16,
    #[serde(default)]
    pub trace_id: String,
    pub body: T,
}

fn default_schema_version() -> u16 {
    1
}

impl<T> Envelope<T> {
    pub fn new(trace_id: impl Into<String>, body: T) -> Self {
        Self {
            schema_version: SCHEMA_VERSION,
            trace_id: trace_id.into(),
            body,
        }
    }
}

/// `recollect.turns.raw`
pub type RawMessage = Envelope<Turn>;

/// `recollect.turns.extracted`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExtractedTurn {
    pub turn: Turn,
    pub extraction: Extraction,
    /// The last words said before this turn in the same sitting of its conversation
    /// (`embedder.late_context_words`; see [`ConversationState::context_before`]): the
    /// late-interaction model reads each field after them, so a turn's token vectors carry what
    /// it answers. Empty when off, at a conversation's start, and in messages from before it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub context: String,
}

/// The text a field's vectors and the lexical vector are made from: speaker and words.
pub fn field_text(speaker: Option<&str>, text: &str) -> String {
    match speaker {
        Some(s) if !text.is_empty() => format!("{s}: {text}"),
        _ => text.to_string(),
    }
}

/// `text`'s last `words` words, separated by single spaces.
pub fn last_words(text: &str, words: usize) -> String {
    let all: Vec<&str> = text.split_whitespace().collect();
    all[all.len().saturating_sub(words)..].join(" ")
}

/// `recollect.turns.embedded`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EmbeddedTurn {
    pub turn: Turn,
    pub extraction: Extraction,
    pub embeddings: Embeddings,
}

/// `recollect.turns.stored`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StoredTurn {
    pub memory_id: MemoryId,
    pub tenant: TenantId,
    pub conversation_id: String,
    pub position: u64,
    /// The turn's `recorded_at` (absent in messages from before erasure markers).
    #[serde(default)]
    pub recorded_at: Option<DateTime<Utc>>,
}

/// Topic names, one place.
pub mod topics {
    pub const RAW: &str = "recollect.turns.raw";
    pub const EXTRACTED: &str = "recollect.turns.extracted";
    pub const EMBEDDED: &str = "recollect.turns.embedded";
    pub const STORED: &str = "recollect.turns.stored";
    pub const DLQ: &str = "recollect.dlq";
    pub const ALL: [&str; 5] = [RAW, EXTRACTED, EMBEDDED, STORED, DLQ];
}

/// Bus key: one conversation stays ordered on one partition.
pub fn bus_key(tenant: &TenantId, conversation: &str) -> String {
    format!("{}/{}", tenant.as_str(), conversation)
}

/// A Fragment: a topic group of turns made by consolidation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Fragment {
    pub id: String,
    pub tenant: TenantId,
    pub conversation_id: String,
    pub description: String,
    pub members: Vec<MemoryId>,
    pub keywords: Vec<String>,
    pub created_at: DateTime<Utc>,
}

/// Why a memory was returned.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ScoreParts {
    pub dense: f32,
    pub lexical: f32,
    pub keyword: f32,
    pub fragment: f32,
    pub time: f32,
    pub fused: f32,
    /// The cross-encoder's logit, when `recall.rerank_model` re-read this result (its score is
    /// then `fused + recall.rerank_weight × rerank`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerank: Option<f32>,
    /// Late interaction's MaxSim of the question's and the turn's token vectors, when
    /// `embedder.late_model` names a model (its score then has `recall.late_weight × late`, and
    /// each part above re-weighted by `recall.late_shift`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late: Option<f32>,
    /// The category term's evidence, when the question names a kind of thing ("What
    /// activities…") and `recall.category_weight` is on: the best cosine between that phrase
    /// and the keywords the turn's named speaker said (its score then has `recall.category_weight`
    /// × this, less the head's median).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<f32>,
    /// Late interaction confined to one sentence: the best sentence's MaxSim, when the turn's
    /// token vectors were stored with their sentences and `recall.sentence_weight` is on (its
    /// score then has `recall.sentence_weight` × this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sentence: Option<f32>,
}

/// One recalled memory, as the API returns it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct RecalledMemory {
    #[schema(value_type = String)]
    pub memory_id: MemoryId,
    pub conversation_id: String,
    pub turn_id: String,
    pub user: String,
    pub assistant: String,
    pub user_speaker: Option<String>,
    pub assistant_speaker: Option<String>,
    pub timestamp: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    pub score: f32,
    /// B, C, BC, lexical, dense, late (the late retriever, `recall.late_candidates`),
    /// neighbour, fallback
    pub sources: Vec<String>,
    pub score_parts: ScoreParts,
}

/// Per-conversation reference state of the resolution state machine (KeyMem §1).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReferenceState {
    /// Most recent first; bounded (entities 10, locations 4, events 4, times 4).
    pub entities: Vec<String>,
    pub locations: Vec<String>,
    pub events: Vec<String>,
    pub times: Vec<TimeRef>,
    /// entity (lower case) → binding to its latest location/event/time, with turns left to live.
    pub bindings: BTreeMap<String, Binding>,
    /// Turns seen, so bindings can expire.
    pub turns_seen: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    pub location: Option<String>,
    pub event: Option<String>,
    pub time: Option<TimeRef>,
    /// Turn count after which this binding is dead (3-turn TTL).
    pub expires_after: u64,
}

/// Per-conversation state the workers keep in the graph (never only in memory).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConversationState {
    pub reference: ReferenceState,
    /// Position of the last turn applied to `reference` (replays of older turns leave it alone).
    pub reference_position: Option<u64>,
    /// Turns before this position have been consolidated into fragments.
    pub consolidated_until: u64,
    /// Next position to assign to a turn that arrives unsequenced (straight from Kafka).
    #[serde(default)]
    pub next_position: u64,
    /// The latest assignments (turn id, position), so a redelivered turn gets its position back
    /// even before the graph-writer has stored it.
    #[serde(default)]
    pub recent_positions: Vec<(String, u64)>,
    /// Oldest `recorded_at` of the turns this state was derived from: an erasure marker at or
    /// after it means the state holds erased data. None on a state from before markers existed.
    #[serde(default)]
    pub recorded_from: Option<DateTime<Utc>>,
    /// The latest turns' words, in position order, each cut to the words a context can use:
    /// what [`Self::context_before`] reads. Kept by position, so a redelivered turn gets the
    /// context it had the first time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_text: Vec<RecentText>,
}

/// A turn's words as the conversation's context keeps them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecentText {
    pub position: u64,
    pub timestamp: DateTime<Utc>,
    /// Both fields with their speakers, cut to their last words.
    pub text: String,
}

impl ConversationState {
    /// Turns whose words are kept for context: a redelivery reaches at most a batch back, and a
    /// context of a few dozen words needs a few turns.
    pub const RECENT_TEXTS: usize = 32;

    /// Turns this far apart are different sittings: a context never reaches across a gap of more
    /// than this between a turn and the one before it.
    pub const SITTING_GAP: chrono::TimeDelta = chrono::TimeDelta::hours(1);

    /// The last `words` words said before the turn at `position` (at `timestamp`) in the same
    /// sitting, oldest first. Empty when the turns before it are gone from
    /// [`Self::recent_text`] (a redelivery further back than that, or after a reindex began).
    pub fn context_before(&self, position: u64, timestamp: DateTime<Utc>, words: usize) -> String {
        if words == 0 {
            return String::new();
        }
        let mut parts: Vec<&str> = Vec::new();
        let (mut next_at, mut have) = (timestamp, 0);
        for r in self.recent_text.iter().rev() {
            if r.position >= position {
                continue;
            }
            if (next_at - r.timestamp).abs() > Self::SITTING_GAP {
                break;
            }
            parts.push(&r.text);
            have += r.text.split_whitespace().count();
            next_at = r.timestamp;
            if have >= words {
                break;
            }
        }
        parts.reverse();
        last_words(&parts.join(" "), words)
    }

    /// Keeps the words of the turn at `position`, cut to its last `words`, for the contexts of
    /// the turns after it. An edit replaces what its turn said; the oldest are let go. Whether
    /// anything changed (a redelivery changes nothing).
    pub fn remember_text(
        &mut self,
        position: u64,
        timestamp: DateTime<Utc>,
        text: &str,
        words: usize,
    ) -> bool {
        if words == 0 {
            return false;
        }
        let entry = RecentText {
            position,
            timestamp,
            text: last_words(text, words),
        };
        match self
            .recent_text
            .binary_search_by_key(&position, |r| r.position)
        {
            Ok(i) if self.recent_text[i] == entry => return false,
            Ok(i) => self.recent_text[i] = entry,
            // Older than everything kept: no later turn's context can reach it.
            Err(0) if self.recent_text.len() >= Self::RECENT_TEXTS => return false,
            Err(i) => self.recent_text.insert(i, entry),
        }
        if self.recent_text.len() > Self::RECENT_TEXTS {
            let excess = self.recent_text.len() - Self::RECENT_TEXTS;
            self.recent_text.drain(..excess);
        }
        true
    }

    /// Drops what the turn at `position` said (it was erased).
    pub fn forget_text(&mut self, position: u64) {
        self.recent_text.retain(|r| r.position != position);
    }

    /// What a reindex keeps: positions (a turn keeps its place), nothing derived.
    pub fn restarted(&self) -> Self {
        Self {
            next_position: self.next_position,
            recent_positions: self.recent_positions.clone(),
            recorded_from: self.recorded_from,
            ..Self::default()
        }
    }

    /// Bound on `recent_positions`: far above what an uncommitted batch can redeliver.
    pub const RECENT_POSITIONS: usize = 1024;

    /// Notes that a turn recorded at `recorded_at` went into this state.
    pub fn derived_from(&mut self, recorded_at: DateTime<Utc>) {
        self.recorded_from = Some(
            self.recorded_from
                .map_or(recorded_at, |r| r.min(recorded_at)),
        );
    }

    /// Whether an erasure at `marker` covers data in this state. A non-empty state of unknown
    /// origin counts as covered: erring towards erasure.
    pub fn covered_by(&self, marker: DateTime<Utc>) -> bool {
        match self.recorded_from {
            Some(r) => r <= marker,
            None => *self != Self::default(),
        }
    }

    pub fn known_position(&self, turn_id: &str) -> Option<u64> {
        self.recent_positions
            .iter()
            .rev()
            .find(|(t, _)| t == turn_id)
            .map(|(_, p)| *p)
    }

    pub fn assign_position(&mut self, turn_id: &str) -> u64 {
        let p = self.next_position;
        self.next_position += 1;
        self.recent_positions.push((turn_id.to_string(), p));
        if self.recent_positions.len() > Self::RECENT_POSITIONS {
            let excess = self.recent_positions.len() - Self::RECENT_POSITIONS;
            self.recent_positions.drain(..excess);
        }
        p
    }
}

impl ReferenceState {
    /// Drops everything a turn's extraction could have put here (its entities, locations,
    /// events, times and their bindings), when that turn is erased on its own. A name another
    /// turn also mentioned goes too: erring towards erasure costs only a resolved pronoun.
    pub fn forget(&mut self, x: &Extraction) {
        let lower = |v: &[String]| -> Vec<String> { v.iter().map(|s| s.to_lowercase()).collect() };
        let (entities, locations, events) =
            (lower(&x.entities), lower(&x.locations), lower(&x.events));
        let gone = |list: &[String], s: &str| list.contains(&s.to_lowercase());
        self.entities.retain(|e| !gone(&entities, e));
        self.locations.retain(|l| !gone(&locations, l));
        self.events.retain(|e| !gone(&events, e));
        self.times.retain(|t| !x.times.contains(t));
        self.bindings.retain(|entity, b| {
            !gone(&entities, entity)
                && !b.location.as_deref().is_some_and(|l| gone(&locations, l))
                && !b.event.as_deref().is_some_and(|e| gone(&events, e))
                && !b.time.as_ref().is_some_and(|t| x.times.contains(t))
        });
    }

    /// Checks a client-supplied state (recall's `attention_state`): bounded lists of short,
    /// printable names. The error names the offending field.
    pub fn check_client_supplied(&self) -> Result<(), String> {
        const MAX_ITEMS: usize = 64;
        const MAX_NAME: usize = 256;
        let name_ok = |s: &str| s.len() <= MAX_NAME && !s.chars().any(char::is_control);
        let lists: [(&str, Vec<&str>); 4] = [
            (
                "entities",
                self.entities.iter().map(String::as_str).collect(),
            ),
            (
                "locations",
                self.locations.iter().map(String::as_str).collect(),
            ),
            ("events", self.events.iter().map(String::as_str).collect()),
            (
                "times",
                self.times.iter().map(|t| t.text.as_str()).collect(),
            ),
        ];
        for (field, items) in lists {
            if items.len() > MAX_ITEMS {
                return Err(format!(
                    "attention_state.{field} holds {} items, the limit is {MAX_ITEMS}",
                    items.len()
                ));
            }
            if items.iter().any(|s| !name_ok(s)) {
                return Err(format!(
                    "attention_state.{field} items must be at most {MAX_NAME} printable bytes"
                ));
            }
        }
        if self.bindings.len() > MAX_ITEMS {
            return Err(format!(
                "attention_state.bindings holds {} items, the limit is {MAX_ITEMS}",
                self.bindings.len()
            ));
        }
        for (k, b) in &self.bindings {
            let texts = [
                Some(k.as_str()),
                b.location.as_deref(),
                b.event.as_deref(),
                b.time.as_ref().map(|t| t.text.as_str()),
            ];
            if texts.into_iter().flatten().any(|s| !name_ok(s)) {
                return Err(format!(
                    "attention_state.bindings entries must be at most {MAX_NAME} printable bytes"
                ));
            }
        }
        if self
            .times
            .iter()
            .chain(self.bindings.values().filter_map(|b| b.time.as_ref()))
            .any(|t| t.start > t.end)
        {
            return Err("attention_state times must have start <= end".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The context rides on `recollect.turns.extracted` as a field a message from before it
    /// lacks, and an empty one is left out.
    #[test]
    fn an_extracted_turn_carries_its_context_on_the_wire() {
        let turn: Turn = serde_json::from_value(serde_json::json!({"tenant": "acme",
            "conversation_id": "c", "turn_id": "1", "user": "yes, all weekend",
            "timestamp": "2024-05-01T10:00:00Z"}))
        .unwrap();
        let mut x = ExtractedTurn {
            turn,
            extraction: Extraction::default(),
            context: "Ann: did you research the agencies?".into(),
        };
        let bytes = serde_json::to_vec(&x).unwrap();
        assert_eq!(serde_json::from_slice::<ExtractedTurn>(&bytes).unwrap(), x);
        x.context.clear();
        let old = serde_json::to_value(&x).unwrap();
        assert!(old.get("context").is_none());
        assert_eq!(serde_json::from_value::<ExtractedTurn>(old).unwrap(), x);
    }

    #[test]
    fn a_turns_context_is_the_words_before_it_in_the_same_sitting() {
        let at = |h: i64, m: i64| {
            "2024-05-01T10:00:00Z".parse::<DateTime<Utc>>().unwrap()
                + chrono::TimeDelta::hours(h)
                + chrono::TimeDelta::minutes(m)
        };
        let mut s = ConversationState::default();
        assert_eq!(s.context_before(0, at(0, 0), 5), "");
        s.remember_text(0, at(0, 0), "A: we went camping\nB: where", 6);
        s.remember_text(1, at(0, 5), "A: by the lake near Tahoe", 6);
        // The newest words, across turns, in order.
        assert_eq!(
            s.context_before(2, at(0, 10), 8),
            "B: where A: by the lake near Tahoe"
        );
        assert_eq!(s.context_before(2, at(0, 10), 3), "lake near Tahoe");
        // A redelivered turn reads only what came before it, as the first time.
        assert_eq!(
            s.context_before(1, at(0, 5), 8),
            "A: we went camping B: where"
        );
        // Each turn is kept cut to the words a context can use.
        let mut cut = ConversationState::default();
        cut.remember_text(0, at(0, 0), "A: by the lake near Tahoe", 3);
        assert_eq!(cut.recent_text[0].text, "lake near Tahoe");
        // Over an hour later is another sitting: no context across the gap.
        assert_eq!(s.context_before(2, at(2, 0), 8), "");
        s.remember_text(2, at(2, 0), "A: back home", 6);
        assert_eq!(s.context_before(3, at(2, 1), 8), "A: back home");
        // An edit replaces its turn's words; an erasure drops them.
        s.remember_text(1, at(0, 5), "A: by the sea", 6);
        assert_eq!(
            s.context_before(2, at(0, 10), 8),
            "went camping B: where A: by the sea"
        );
        s.forget_text(1);
        assert_eq!(
            s.context_before(2, at(0, 10), 8),
            "A: we went camping B: where"
        );
        // Off: nothing kept, nothing read.
        let mut off = ConversationState::default();
        off.remember_text(0, at(0, 0), "A: hello", 0);
        assert!(off.recent_text.is_empty());
        assert_eq!(s.context_before(2, at(0, 10), 0), "");
        // The window is bounded, oldest out; a reindex starts it over.
        for p in 0..100 {
            s.remember_text(p, at(0, 0), "A: word", 5);
        }
        assert_eq!(s.recent_text.len(), ConversationState::RECENT_TEXTS);
        assert_eq!(
            s.recent_text[0].position,
            100 - ConversationState::RECENT_TEXTS as u64
        );
        assert_eq!(s.context_before(20, at(0, 0), 8), "");
        assert!(s.restarted().recent_text.is_empty());
        // A state saved before the window existed still reads.
        let old: ConversationState =
            serde_json::from_str(r#"{"reference":{"entities":[],"locations":[],"events":[],"times":[],"bindings":{},"turns_seen":0},"reference_position":null,"consolidated_until":0}"#).unwrap();
        assert!(old.recent_text.is_empty());
    }

    #[test]
    fn token_vectors_travel_as_bytes_and_score_by_max_sim() {
        let mut rows = vec![0.6, 0.8, 0.0, 1.0, -1.0, 0.0];
        let t = TokenVectors::new(2, std::mem::take(&mut rows)).unwrap();
        assert_eq!(t.len(), 3);
        let wire = serde_json::to_value(&t).unwrap();
        // Three rows of two components, a byte each.
        assert_eq!(wire["dim"], 2);
        assert_eq!(wire["i8"].as_str().unwrap().len(), 8);
        let back: TokenVectors = serde_json::from_value(wire).unwrap();
        for (a, b) in t.values.iter().zip(&back.values) {
            assert!((a - b).abs() <= 0.5 / 127.0, "{a} vs {b}");
        }
        // Each question row's best cosine, averaged: (1 + 0.8) / 2.
        let q = TokenVectors::new(2, vec![0.0, 1.0, 1.0, 0.0]).unwrap();
        assert!((t.max_sim(&q) - 0.8).abs() < 1e-6);
        assert_eq!(t.max_sim(&TokenVectors::default()), 0.0);
        assert!(TokenVectors::new(2, vec![1.0, 0.0, 1.0]).is_err());
        assert!(TokenVectors::new(2, vec![f32::NAN, 0.0]).is_err());
        let ragged = serde_json::json!({"dim": 3, "i8": "AAAAAA=="});
        assert!(serde_json::from_value::<TokenVectors>(ragged).is_err());
        let mut joined = TokenVectors::default();
        joined.extend(&q);
        joined.extend(&t);
        assert_eq!((joined.dim, joined.len()), (2, 5));
    }

    /// Sentence MaxSim: the question's rows matched within one sentence and its field's shared
    /// rows; labels ride on the wire, a message without them still reads, and a field joined
    /// after another keeps its sentences apart.
    #[test]
    fn sentences_confine_max_sim_and_travel_with_the_rows() {
        let (x, y, z) = ([1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]);
        // [CLS] (x, shared), sentence 1 says y, sentence 2 says z.
        let rows = |parts: &[[f32; 3]]| TokenVectors::new(3, parts.concat()).unwrap();
        let turn = rows(&[x, y, z])
            .with_segments(vec![
                Segment::new(0, 0),
                Segment::new(0, 1),
                Segment::new(0, 2),
            ])
            .unwrap();
        let q = rows(&[y, z]);
        assert!((turn.max_sim(&q) - 1.0).abs() < 1e-6);
        // Within sentence 1: y matches, z's best is 0 (x or y); sentence 2 the same: 0.5.
        assert!((turn.sentence_max_sim(&q).unwrap() - 0.5).abs() < 1e-6);
        // The shared row counts with every sentence.
        assert!((turn.sentence_max_sim(&rows(&[x, y])).unwrap() - 1.0).abs() < 1e-6);
        assert_eq!(rows(&[x]).sentence_max_sim(&q), None, "no labels, no score");
        assert!(rows(&[x])
            .with_segments(vec![Segment::new(0, 1); 2])
            .is_err());
        let wire = serde_json::to_value(&turn).unwrap();
        assert_eq!(wire["segments"], serde_json::json!([0, 1, 2]));
        let back: TokenVectors = serde_json::from_value(wire).unwrap();
        assert_eq!(back.segments, turn.segments);
        let old: TokenVectors =
            serde_json::from_value(serde_json::to_value(rows(&[x])).unwrap()).unwrap();
        assert!(old.segments.is_empty());
        // The assistant's field after the user's: its sentences are its own, its shared rows
        // count only with them.
        let mut joined = turn.clone();
        joined.extend(&turn);
        assert_eq!(joined.segments[3], Segment::new(1, 0));
        assert_eq!(joined.segments[5].part(), 1);
        assert_eq!(joined.segments[5].sentence(), 2);
        assert!((joined.sentence_max_sim(&q).unwrap() - 0.5).abs() < 1e-6);
        // Joined with a field without labels, the turn has none.
        let mut unlabelled = turn.clone();
        unlabelled.extend(&rows(&[y]));
        assert!(unlabelled.segments.is_empty());
    }

    #[test]
    fn the_dot_product_in_lanes_is_the_ordered_one_over_the_shorter_length() {
        // A fixed pseudo-random sequence: no dependency for a handful of numbers.
        let mut x = 0x2545_f491_u32;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32) - 0.5
        };
        for (la, lb) in [
            (0, 0),
            (3, 3),
            (8, 8),
            (384, 384),
            (10, 16),
            (16, 10),
            (385, 7),
        ] {
            let a: Vec<f32> = (0..la).map(|_| next()).collect();
            let b: Vec<f32> = (0..lb).map(|_| next()).collect();
            let (want, got) = (dot(&a, &b), dot_lanes(&a, &b));
            assert!(
                (want - got).abs() <= 1e-5 * (1.0 + want.abs()),
                "{la}/{lb}: {want} vs {got}"
            );
            // The CPU's widest unit gives the baseline's bits: scores do not depend on the host.
            assert_eq!(got.to_bits(), lanes(&a, &b).to_bits(), "{la}/{lb}");
        }
    }

    /// Time keys name graph nodes already stored: they must stay what chrono's `%Y-%m-%d`
    /// wrote, including the years it writes with a sign.
    #[test]
    fn time_keys_are_written_as_chrono_wrote_them() {
        let chrono_key = |t: &TimeRef| {
            if t.start == t.end {
                t.start.format("%Y-%m-%d").to_string()
            } else {
                format!(
                    "{}/{}",
                    t.start.format("%Y-%m-%d"),
                    t.end.format("%Y-%m-%d")
                )
            }
        };
        let day = |y, m, d| NaiveDate::from_ymd_opt(y, m, d).unwrap();
        let dates = [
            day(2023, 5, 7),
            day(1, 1, 1),
            day(0, 12, 31),
            day(999, 2, 3),
            day(9999, 12, 31),
            day(10000, 1, 1),
            day(-1, 6, 15),
            day(-44, 3, 15),
            NaiveDate::MIN,
            NaiveDate::MAX,
        ];
        for &start in &dates {
            for &end in &dates {
                let t = TimeRef {
                    text: String::new(),
                    start,
                    end,
                    granularity: "day".into(),
                };
                assert_eq!(t.key(), chrono_key(&t));
            }
        }
    }

    #[test]
    fn memory_id_is_deterministic_and_round_trips() {
        let t = TenantId("a".into());
        let a = MemoryId::derive(&t, "c1", "7");
        let b = MemoryId::derive(&t, "c1", "7");
        assert_eq!(a, b);
        assert_ne!(a, MemoryId::derive(&t, "c1", "8"));
        assert_ne!(a, MemoryId::derive(&TenantId("b".into()), "c1", "7"));
        assert_ne!(
            MemoryId::derive(&t, "c", "17"),
            MemoryId::derive(&t, "c1", "7")
        );
        let s = a.to_string();
        assert_eq!(s.len(), 36);
        assert_eq!(MemoryId::parse(&s), Some(a));
        assert_eq!(MemoryId::parse("not-an-id"), None);
    }

    /// A conversation's turn ids share their first 8 bytes, so they sort together; they are
    /// still deterministic, distinct, valid v4 UUIDs, and never the hashed form.
    #[test]
    fn turn_ids_of_a_conversation_share_a_prefix() {
        let t = TenantId("a".into());
        let ids: Vec<MemoryId> = (0..1000)
            .map(|i| MemoryId::of_turn(&t, "c1", &i.to_string()))
            .collect();
        assert_eq!(ids[7], MemoryId::of_turn(&t, "c1", "7"));
        assert!(ids.iter().all(|id| id.0[..8] == ids[0].0[..8]));
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        let other = MemoryId::of_turn(&t, "c2", "7");
        assert_ne!(other.0[..8], ids[0].0[..8]);
        assert_ne!(
            MemoryId::of_turn(&t, "c", "17"),
            MemoryId::of_turn(&t, "c1", "7")
        );
        assert_ne!(MemoryId::of_turn(&TenantId("b".into()), "c1", "7"), ids[7]);
        for id in [ids[7], other] {
            assert_eq!(id.0[6] >> 4, 4, "UUID version 4");
            assert_eq!(id.0[8] >> 6, 0b10, "RFC 4122 variant");
            assert_eq!(MemoryId::parse(&id.to_string()), Some(id));
        }
        assert_eq!(
            MemoryId::forms_of_turn(&t, "c1", "7"),
            [ids[7], MemoryId::derive(&t, "c1", "7")]
        );
        assert_ne!(ids[7], MemoryId::derive(&t, "c1", "7"));
    }

    #[test]
    fn vectors_travel_packed_and_old_arrays_still_read() {
        let e = Embeddings {
            user: vec![0.25, -1.5, 3.0e-7],
            assistant: vec![],
            keywords: vec![KeywordVector {
                keyword: "pottery".into(),
                vector: vec![1.0, 0.0].into(),
            }],
            ..Default::default()
        };
        let json = serde_json::to_string(&e).unwrap();
        assert!(json.contains(r#""user":"AACAPgAAwL"#), "{json}");
        assert_eq!(serde_json::from_str::<Embeddings>(&json).unwrap(), e);
        // Version 2: plain arrays.
        let v2 = r#"{"user":[0.25,-1.5],"assistant":[],"lexical":{"indices":[],"values":[]},
            "keywords":[{"keyword":"k","vector":[1.0,0.0]}],"model":"m"}"#;
        let old: Embeddings = serde_json::from_str(v2).unwrap();
        assert_eq!(old.user, vec![0.25, -1.5]);
        assert_eq!(*old.keywords[0].vector, [1.0, 0.0]);
        // Not base64, a ragged byte count, a NaN: refused, never a silently wrong vector.
        for bad in ["\"%%%\"", "\"AAAA\"", "\"AADAfw==\""] {
            let j = v2.replacen("[0.25,-1.5]", bad, 1);
            assert!(serde_json::from_str::<Embeddings>(&j).is_err(), "{j}");
        }
    }

    #[test]
    fn raw_messages_of_both_schema_versions_read() {
        // Version 1: the gateway filled every field.
        let v1 = r#"{"schema_version":1,"trace_id":"t","body":{"memory_id":"6f1c0f4e-7d41-4a4a-9a0e-0d0c7d1b2a33",
            "tenant":"acme","conversation_id":"c","turn_id":"3","position":3,"user":"hi","assistant":"hello",
            "user_speaker":null,"assistant_speaker":null,"timestamp":"2024-05-01T10:00:00Z",
            "recorded_at":"2024-05-01T10:00:01Z"}}"#;
        let m: RawMessage = serde_json::from_str(v1).unwrap();
        assert_eq!(m.schema_version, 1);
        assert_eq!(m.body.position, 3);
        assert!(m.body.is_sequenced() && !m.body.memory_id.is_nil());
        // Version 2: a platform producing straight to Kafka sends only what it knows.
        let v2 = r#"{"schema_version":2,"body":{"tenant":"acme","conversation_id":"c","turn_id":"t-9",
            "user":"hi","timestamp":"2024-05-01T10:00:00Z"}}"#;
        let m: RawMessage = serde_json::from_str(v2).unwrap();
        assert!(!m.body.is_sequenced());
        assert!(m.body.memory_id.is_nil());
        assert!(!m.body.is_recorded(), "the extractor stamps it");
        assert_eq!(m.body.assistant, "");
        assert_eq!(m.trace_id, "");
    }
}
