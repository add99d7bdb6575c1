//! Small hand-made candidates for the unit tests of the pure steps.

use chrono::{TimeZone, Utc};
use recollect_model::{MemoryId, TenantId, Turn};
use recollect_storage::vector::FieldVectors;

use crate::fetch::{Candidate, Found};

pub fn turn(conversation: &str, position: u64) -> Turn {
    let tenant = TenantId::default_tenant();
    let id = position.to_string();
    Turn {
        memory_id: MemoryId::derive(&tenant, conversation, &id),
        tenant,
        conversation_id: conversation.into(),
        turn_id: id,
        position,
        user: format!("user text {position}"),
        assistant: format!("assistant text {position}"),
        user_speaker: Some("Ann".into()),
        assistant_speaker: Some("Bob".into()),
        timestamp: Utc.with_ymd_and_hms(2023, 5, 8, 12, 0, 0).unwrap(),
        recorded_at: Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap(),
        metadata: Default::default(),
        user_id: None,
        agent_id: None,
        version: 1,
        first_recorded_at: None,
        expired_at: None,
    }
}

/// A candidate of conversation "a" at `position`, found by nobody, with no keywords or vectors.
pub fn candidate(position: u64) -> Candidate {
    Candidate {
        turn: turn("a", position),
        keywords: vec![],
        times: vec![],
        vectors: None,
        found: Found::default(),
        fragment_score: 0.0,
        lexical: 0.0,
    }
}

pub fn user_vector(v: &[f32]) -> Option<FieldVectors> {
    Some(FieldVectors {
        user: v.to_vec(),
        assistant: None,
    })
}
