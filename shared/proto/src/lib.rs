//! The gRPC contract: messages, client and server generated from
//! `proto/recollect/v1/recollect.proto`, and conversions between them and the model types, so the
//! gRPC edge parses exactly what the HTTP edge parses.

use chrono::{DateTime, SecondsFormat, Utc};
use recollect_model::{RecalledMemory, RecollectError};

#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("recollect.v1");
}

fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// Parses an RFC 3339 field, naming it in the error.
pub fn parse_time(field: &str, s: &str) -> Result<DateTime<Utc>, RecollectError> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            RecollectError::invalid(format!("{field}: {s:?} is not an RFC 3339 time: {e}"))
        })
}

/// A JSON-object field; empty text means an empty object.
pub fn parse_object(
    field: &str,
    s: &str,
) -> Result<serde_json::Map<String, serde_json::Value>, RecollectError> {
    if s.trim().is_empty() {
        return Ok(Default::default());
    }
    serde_json::from_str(s)
        .map_err(|e| RecollectError::invalid(format!("{field} is not a JSON object: {e}")))
}

impl v1::TurnInput {
    /// The model turn; `i` is the turn's index in its request, for messages that name the field.
    pub fn to_model(&self, i: usize) -> Result<recollect_model::TurnInput, RecollectError> {
        Ok(recollect_model::TurnInput {
            turn_id: self.turn_id.clone(),
            user: self.user.clone(),
            assistant: self.assistant.clone(),
            user_speaker: self.user_speaker.clone(),
            assistant_speaker: self.assistant_speaker.clone(),
            timestamp: parse_time(&format!("turns[{i}].timestamp"), &self.timestamp)?,
            metadata: parse_object(&format!("turns[{i}].metadata_json"), &self.metadata_json)?,
            user_id: self.user_id.clone(),
            agent_id: self.agent_id.clone(),
        })
    }
}

impl From<&recollect_model::TurnInput> for v1::TurnInput {
    fn from(t: &recollect_model::TurnInput) -> Self {
        Self {
            turn_id: t.turn_id.clone(),
            user: t.user.clone(),
            assistant: t.assistant.clone(),
            user_speaker: t.user_speaker.clone(),
            assistant_speaker: t.assistant_speaker.clone(),
            timestamp: rfc3339(&t.timestamp),
            metadata_json: if t.metadata.is_empty() {
                String::new()
            } else {
                serde_json::Value::Object(t.metadata.clone()).to_string()
            },
            user_id: t.user_id.clone(),
            agent_id: t.agent_id.clone(),
        }
    }
}

impl From<recollect_model::Turn> for v1::Turn {
    fn from(t: recollect_model::Turn) -> Self {
        Self {
            memory_id: t.memory_id.to_string(),
            conversation_id: t.conversation_id,
            turn_id: t.turn_id,
            position: t.position,
            user: t.user,
            assistant: t.assistant,
            user_speaker: t.user_speaker,
            assistant_speaker: t.assistant_speaker,
            timestamp: rfc3339(&t.timestamp),
            recorded_at: rfc3339(&t.recorded_at),
            metadata_json: serde_json::Value::Object(t.metadata).to_string(),
            user_id: t.user_id,
            agent_id: t.agent_id,
            version: t.version,
            expired_at: t.expired_at.as_ref().map(rfc3339),
        }
    }
}

impl From<RecalledMemory> for v1::RecalledMemory {
    fn from(m: RecalledMemory) -> Self {
        let p = m.score_parts;
        Self {
            memory_id: m.memory_id.to_string(),
            conversation_id: m.conversation_id,
            turn_id: m.turn_id,
            user: m.user,
            assistant: m.assistant,
            user_speaker: m.user_speaker,
            assistant_speaker: m.assistant_speaker,
            timestamp: rfc3339(&m.timestamp),
            score: m.score,
            user_id: m.user_id,
            agent_id: m.agent_id,
            metadata_json: serde_json::Value::Object(m.metadata).to_string(),
            sources: m.sources,
            score_parts: Some(v1::ScoreParts {
                dense: p.dense,
                lexical: p.lexical,
                keyword: p.keyword,
                fragment: p.fragment,
                time: p.time,
                fused: p.fused,
                rerank: p.rerank,
                late: p.late,
                category: p.category,
                sentence: p.sentence,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turn_input_round_trips_and_bad_fields_are_named() {
        let t = v1::TurnInput {
            turn_id: Some("7".into()),
            user: "hello".into(),
            timestamp: "2023-05-08T13:56:00Z".into(),
            metadata_json: r#"{"lang":"en"}"#.into(),
            ..Default::default()
        };
        let m = t.to_model(0).unwrap();
        assert_eq!(m.metadata["lang"], "en");
        assert_eq!(v1::TurnInput::from(&m), t);

        let bad_time = v1::TurnInput {
            timestamp: "yesterday".into(),
            ..t.clone()
        };
        let e = bad_time.to_model(3).unwrap_err().to_string();
        assert!(e.contains("turns[3].timestamp"), "{e}");
        let bad_meta = v1::TurnInput {
            metadata_json: "[1]".into(),
            ..t
        };
        let e = bad_meta.to_model(0).unwrap_err().to_string();
        assert!(e.contains("metadata_json"), "{e}");
    }
}
