//! Small hand-made candidates for the unit tests of the pure steps.

use chrono::{TimeZone, Utc};
use recollect_model::{MemoryId, RecalledMemory, SparseVector, TenantId, Turn};
use recollect_storage::vector::{FieldVectors, TurnPoint};

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

/// `t` as a vector index point with these field vectors (no lexical or token vectors).
pub fn point(t: &Turn, user: Vec<f32>, assistant: Option<Vec<f32>>) -> TurnPoint {
    TurnPoint {
        memory_id: t.memory_id,
        tenant: t.tenant.clone(),
        conversation_id: t.conversation_id.clone(),
        turn_id: t.turn_id.clone(),
        position: t.position,
        timestamp: t.timestamp,
        user_speaker: t.user_speaker.clone(),
        assistant_speaker: t.assistant_speaker.clone(),
        user,
        assistant,
        lexical: SparseVector::default(),
        user_id: None,
        agent_id: None,
        metadata: Default::default(),
        recorded_at: t.recorded_at,
        late: None,
    }
}

/// A candidate of conversation "a" at `position`, found by nobody, with no keywords or vectors.
pub fn candidate(position: u64) -> Candidate {
    Candidate {
        turn: turn("a", position),
        keywords: vec![],
        keyword_texts: vec![],
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

/// A recalled memory of conversation "a" at `position`, scored `score` (fused the same).
pub fn memory(position: u64, user: &str, score: f32) -> RecalledMemory {
    let t = turn("a", position);
    RecalledMemory {
        memory_id: t.memory_id,
        conversation_id: t.conversation_id,
        turn_id: t.turn_id,
        user: user.into(),
        assistant: "ok".into(),
        user_speaker: Some("Ann".into()),
        assistant_speaker: None,
        timestamp: t.timestamp,
        user_id: None,
        agent_id: None,
        metadata: Default::default(),
        score,
        sources: vec!["lexical".into()],
        score_parts: recollect_model::ScoreParts {
            fused: score,
            ..Default::default()
        },
    }
}
