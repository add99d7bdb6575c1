//! The rule extractor and query analysis over a short conversation of arbitrary turns,
//! carrying the reference state from turn to turn as the pipeline does.
#![no_main]

use chrono::{TimeZone, Utc};
use libfuzzer_sys::fuzz_target;
use recollect_extract::{analyse_query, RuleExtractor};
use recollect_model::{MemoryId, ReferenceState, TenantId, Turn};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let tenant = TenantId::default_tenant();
    let anchor = Utc.with_ymd_and_hms(2023, 5, 8, 13, 56, 0).unwrap();
    let x = RuleExtractor::new();
    let mut state = ReferenceState::default();
    for (i, part) in text.split('|').take(8).enumerate() {
        let (user, assistant) = part.split_once('#').unwrap_or((part, ""));
        let turn = Turn {
            memory_id: MemoryId::derive(&tenant, "c", &i.to_string()),
            tenant: tenant.clone(),
            conversation_id: "c".into(),
            turn_id: i.to_string(),
            position: i as u64,
            user: user.into(),
            assistant: assistant.into(),
            user_speaker: Some("Ana".into()),
            assistant_speaker: Some("Bo".into()),
            timestamp: anchor,
            recorded_at: anchor,
            metadata: Default::default(),
            user_id: None,
            agent_id: None,
        };
        let ex = x.extract_sync(&turn, &mut state);
        assert!(ex.times.iter().all(|t| t.start <= t.end));
    }
    let q = analyse_query(&text, Some(anchor), Some(&state));
    assert!(q.time_hint.is_none_or(|h| h.start <= h.end));
});
