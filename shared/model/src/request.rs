//! Decoding and validation of store requests, free of any I/O so every entry point (HTTP,
//! gRPC, tools) and the fuzz targets share exactly one definition of a valid request.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::TurnInput;

/// `POST /v1/conversations/{id}/turns` body.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StoreRequest {
    pub turns: Vec<TurnInput>,
    /// Answer only once the turns are recallable (default: once they are stored durably).
    #[serde(default)]
    pub wait: Option<bool>,
}

/// Why a request was refused: a metric label and a message naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: &'static str,
    pub message: String,
}

fn reject(reason: &'static str, message: String) -> Rejection {
    Rejection { reason, message }
}

/// Control characters other than tab, CR and LF have no place in chat text; NUL would also
/// break key layouts downstream.
pub fn is_forbidden_control(c: char) -> bool {
    c.is_control() && !matches!(c, '\t' | '\n' | '\r')
}

/// Conversation ids end up in keys, paths and payload filters: keep them plain.
pub fn validate_conversation_id(id: &str) -> Result<(), Rejection> {
    if id.is_empty() || id.len() > 128 {
        return Err(reject(
            "bad_conversation_id",
            "conversation id must be 1 to 128 characters".into(),
        ));
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '@'))
    {
        return Err(reject(
            "bad_conversation_id",
            "conversation id may contain only letters, digits and _ - . : @".into(),
        ));
    }
    Ok(())
}

fn check_text(field: &str, i: usize, text: &str, max: usize) -> Result<(), Rejection> {
    if text.trim().is_empty() {
        return Err(reject(
            "empty_text",
            format!("turns[{i}].{field} is empty or whitespace"),
        ));
    }
    if text.len() > max {
        return Err(reject(
            "too_large",
            format!(
                "turns[{i}].{field} is {} bytes, the limit is {max}",
                text.len()
            ),
        ));
    }
    if let Some(c) = text.chars().find(|c| is_forbidden_control(*c)) {
        return Err(reject(
            "bad_text",
            format!(
                "turns[{i}].{field} contains the control character U+{:04X}; only tab, CR and LF are allowed",
                c as u32
            ),
        ));
    }
    Ok(())
}

fn check_label(field: &str, i: usize, v: &Option<String>) -> Result<(), Rejection> {
    if let Some(s) = v {
        if s.trim().is_empty() || s.len() > 256 || s.chars().any(char::is_control) {
            return Err(reject(
                "bad_label",
                format!("turns[{i}].{field} must be 1 to 256 printable characters"),
            ));
        }
    }
    Ok(())
}

/// Checks a store request; nothing is stored unless every turn passes.
pub fn validate_store(
    conversation: &str,
    turns: &[TurnInput],
    max_turns: usize,
    max_text_bytes: usize,
) -> Result<(), Rejection> {
    validate_conversation_id(conversation)?;
    if turns.is_empty() {
        return Err(reject(
            "no_turns",
            "turns must hold at least one turn".into(),
        ));
    }
    if turns.len() > max_turns {
        return Err(reject(
            "too_many_turns",
            format!(
                "{} turns in one request, the limit is {max_turns}",
                turns.len()
            ),
        ));
    }
    let max = max_text_bytes;
    let mut seen = HashSet::new();
    for (i, t) in turns.iter().enumerate() {
        check_text("user", i, &t.user, max)?;
        if let Some(a) = &t.assistant {
            check_text("assistant", i, a, max)?;
        }
        check_label("user_speaker", i, &t.user_speaker)?;
        check_label("assistant_speaker", i, &t.assistant_speaker)?;
        for (field, v) in [("user_id", &t.user_id), ("agent_id", &t.agent_id)] {
            if let Some(v) = v {
                crate::filter::validate_scope_id(&format!("turns[{i}].{field}"), v)
                    .map_err(|m| reject("bad_scope_id", m))?;
            }
        }
        if let Some(id) = &t.turn_id {
            if id.is_empty() || id.len() > 128 || id.chars().any(char::is_control) {
                return Err(reject(
                    "bad_turn_id",
                    format!("turns[{i}].turn_id must be 1 to 128 printable characters"),
                ));
            }
            if !seen.insert(id.as_str()) {
                return Err(reject(
                    "bad_turn_id",
                    format!("turns[{i}].turn_id {id:?} repeats in this request"),
                ));
            }
        }
        let year = chrono::Datelike::year(&t.timestamp);
        if !(1900..=2200).contains(&year) {
            return Err(reject(
                "bad_timestamp",
                format!("turns[{i}].timestamp year {year} is out of range"),
            ));
        }
        if serde_json::to_vec(&t.metadata)
            .map(|v| v.len())
            .unwrap_or(usize::MAX)
            > max
        {
            return Err(reject(
                "too_large",
                format!("turns[{i}].metadata is over {max} bytes"),
            ));
        }
    }
    Ok(())
}

/// Checks an edit; nothing changes unless it passes.
pub fn validate_patch(patch: &crate::TurnPatch, max_text_bytes: usize) -> Result<(), Rejection> {
    if patch.user.is_none() && patch.assistant.is_none() && patch.metadata.is_none() {
        return Err(reject(
            "empty_patch",
            "an edit must set at least one of user, assistant, metadata".into(),
        ));
    }
    let field = |f: &str| format!("patch.{f}");
    if let Some(u) = &patch.user {
        check_text("user", 0, u, max_text_bytes).map_err(|r| renamed(r, &field("user")))?;
    }
    if let Some(a) = patch.assistant.as_deref().filter(|a| !a.is_empty()) {
        check_text("assistant", 0, a, max_text_bytes)
            .map_err(|r| renamed(r, &field("assistant")))?;
    }
    if let Some(m) = &patch.metadata {
        if serde_json::to_vec(m).map(|v| v.len()).unwrap_or(usize::MAX) > max_text_bytes {
            return Err(reject(
                "too_large",
                format!("patch.metadata is over {max_text_bytes} bytes"),
            ));
        }
    }
    Ok(())
}

/// A turn-field rejection reworded for an edit's body (`turns[0].user` → `patch.user`).
fn renamed(r: Rejection, field: &str) -> Rejection {
    let prefix = format!("turns[0].{}", field.trim_start_matches("patch."));
    Rejection {
        reason: r.reason,
        message: r.message.replacen(&prefix, field, 1),
    }
}

/// Decodes and validates a store request body as the HTTP edge does: `Err` with a message for
/// anything malformed. For fuzzing and property tests of the decoding path.
pub fn decode_store(
    conversation: &str,
    body: &[u8],
    max_turns: usize,
    max_text_bytes: usize,
) -> Result<StoreRequest, String> {
    let req: StoreRequest = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    validate_store(conversation, &req.turns, max_turns, max_text_bytes).map_err(|r| r.message)?;
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_and_invalid_bodies() {
        let ok = br#"{"turns":[{"user":"hi","timestamp":"2023-05-08T13:56:00Z"}]}"#;
        assert!(decode_store("c", ok, 10, 100).is_ok());
        for bad in [
            &br#"{"turns":[{"user":"h\u0001i","timestamp":"2023-05-08T13:56:00Z"}]}"#[..],
            br#"{"turns":[{"user":"hi","timestamp":"2023-05-08T13:56:00Z","tenant":"b"}]}"#,
            br#"{"turns":[]}"#,
            br#"{"turns":[{"user":"hi","timestamp":"1800-05-08T13:56:00Z"}]}"#,
            br#"{"turns":[{"user":"hi","timestamp":"2023-05-08T13:56:00Z","user_id":"a b"}]}"#,
        ] {
            assert!(decode_store("c", bad, 10, 100).is_err());
        }
        assert!(decode_store("bad id", ok, 10, 100).is_err());
    }
}

#[cfg(test)]
mod patch_tests {
    use super::*;
    use crate::TurnPatch;

    #[test]
    fn an_edit_names_the_field_it_gets_wrong() {
        let bad = |p: TurnPatch| validate_patch(&p, 100).unwrap_err().message;
        assert!(bad(TurnPatch::default()).contains("at least one of"));
        let p = |u: &str| TurnPatch {
            user: Some(u.into()),
            ..Default::default()
        };
        assert!(bad(p(" ")).starts_with("patch.user"), "{}", bad(p(" ")));
        assert!(bad(p("a\u{7}")).starts_with("patch.user"));
        assert!(bad(p(&"a".repeat(101))).starts_with("patch.user"));
        // An empty assistant text removes it: allowed.
        let remove = TurnPatch {
            assistant: Some(String::new()),
            ..Default::default()
        };
        assert!(validate_patch(&remove, 100).is_ok());
    }
}
