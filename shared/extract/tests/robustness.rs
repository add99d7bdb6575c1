//! Arbitrary input must never panic and must stay fast: turns come from untrusted clients.

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use proptest::prelude::*;
use recollect_extract::{analyse_query, bm25, parse_date_time, parse_times, RuleExtractor};
use recollect_model::{MemoryId, ReferenceState, TenantId, Turn};

fn turn(user: &str, assistant: &str, ts: DateTime<Utc>) -> Turn {
    let tenant = TenantId::default_tenant();
    Turn {
        memory_id: MemoryId::derive(&tenant, "c", "1"),
        tenant,
        conversation_id: "c".into(),
        turn_id: "1".into(),
        position: 1,
        user: user.into(),
        assistant: assistant.into(),
        user_speaker: Some("Ana".into()),
        assistant_speaker: Some("Bo".into()),
        timestamp: ts,
        recorded_at: ts,
        metadata: Default::default(),
        user_id: None,
        agent_id: None,
        version: 1,
        first_recorded_at: None,
        expired_at: None,
    }
}

/// Fragments that exercise every matcher, glued together at random.
const PIECES: &[&str] = &[
    "last",
    "next",
    "this",
    "past",
    "the",
    "day",
    "before",
    "after",
    "yesterday",
    "tomorrow",
    "Friday",
    "May",
    "may",
    "8th",
    "of",
    "2023",
    "-",
    "/",
    ",",
    "05",
    "08",
    "in",
    "a",
    "few",
    "couple",
    "weeks",
    "ago",
    "summer",
    "fall",
    "early",
    "late",
    "9999",
    "0000",
    "31",
    "she",
    "there",
    "then",
    "back",
    "that",
    "time",
    "Caroline's",
    "LGBTQ",
    "New",
    "York",
    "went",
    "to",
    "museum",
    "é",
    "’",
    "'",
    "ß",
    "İ",
    "\n",
    ".",
    "?",
    "🙂",
    "\u{200b}",
    "ǅ",
    "between",
    "and",
    "since",
    "12/25/2021",
    "2023-05-08T13:56",
    "1:56 pm on 8 May, 2023",
    "of the",
];

/// Upper bound per input (parse + extract + analyse), generous for a loaded 2-core machine;
/// typical inputs take well under a millisecond.
const PER_INPUT: Duration = Duration::from_secs(2);

fn glued() -> impl Strategy<Value = String> {
    prop::collection::vec((0..PIECES.len(), prop::bool::ANY), 0..60).prop_map(|v| {
        let mut s = String::new();
        for (i, space) in v {
            s.push_str(PIECES[i]);
            if space {
                s.push(' ');
            }
        }
        s
    })
}

fn anchors() -> impl Strategy<Value = DateTime<Utc>> {
    prop_oneof![
        Just(DateTime::<Utc>::MIN_UTC),
        Just(DateTime::<Utc>::MAX_UTC),
        (-8_000_000_000_000i64..8_000_000_000_000i64)
            .prop_map(|s| Utc.timestamp_opt(s, 0).single().unwrap_or_default()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn nothing_panics_on_arbitrary_text(s in "\\PC{0,300}", a in anchors()) {
        let t0 = Instant::now();
        let _ = parse_times(&s, a);
        let _ = parse_date_time(&s);
        let _ = bm25::terms(&s);
        let _ = analyse_query(&s, Some(a), None);
        let mut st = ReferenceState::default();
        let x = RuleExtractor::new();
        let ex = x.extract_sync(&turn(&s, &s, a), &mut st);
        prop_assert_eq!(ex.extractor.as_str(), "rules");
        let q = analyse_query(&s, None, Some(&st));
        prop_assert!(q.time_hint.is_none_or(|h| h.start <= h.end));
        prop_assert!(t0.elapsed() < PER_INPUT, "{:?}", t0.elapsed());
    }

    #[test]
    fn nothing_panics_on_time_like_text(s in glued(), a in anchors()) {
        let t0 = Instant::now();
        for t in parse_times(&s, a) {
            prop_assert!(t.start <= t.end, "{:?}", t);
            prop_assert!(s.contains(&t.text));
        }
        let _ = parse_date_time(&s);
        let mut st = ReferenceState::default();
        let x = RuleExtractor::new();
        for _ in 0..3 {
            let ex = x.extract_sync(&turn(&s, "she went there back then", a), &mut st);
            prop_assert!(ex.times.iter().all(|t| t.start <= t.end));
        }
        prop_assert!(st.entities.len() <= 10 && st.locations.len() <= 4 && st.times.len() <= 4 && st.events.len() <= 4);
        let _ = analyse_query(&s, None, Some(&st));
        prop_assert!(t0.elapsed() < PER_INPUT, "{:?}", t0.elapsed());
    }

    #[test]
    fn raw_chars_including_controls(v in prop::collection::vec(any::<char>(), 0..500)) {
        let s: String = v.into_iter().collect();
        let t0 = Instant::now();
        let a = Utc.with_ymd_and_hms(2023, 5, 8, 0, 0, 0).unwrap();
        let _ = parse_times(&s, a);
        let _ = analyse_query(&s, None, None);
        let mut st = ReferenceState::default();
        let _ = RuleExtractor::new().extract_sync(&turn(&s, "", a), &mut st);
        prop_assert!(t0.elapsed() < PER_INPUT, "{:?}", t0.elapsed());
    }
}

/// 64 KiB inputs of several shapes finish quickly (linear scanning, no backtracking).
#[test]
fn large_inputs_are_fast() {
    let a = Utc.with_ymd_and_hms(2023, 5, 8, 13, 56, 0).unwrap();
    let limit = 64 * 1024;
    let mut inputs: Vec<String> = Vec::new();
    let mut s = String::new();
    let mut k = 0;
    while s.len() < limit {
        s.push_str(PIECES[k % PIECES.len()]);
        s.push(' ');
        k += 7;
    }
    inputs.push(s);
    inputs.push("a".repeat(limit));
    inputs.push("last ".repeat(limit / 5));
    inputs.push("the 8th of ".repeat(limit / 11));
    inputs.push("-".repeat(limit));
    inputs.push("2023-".repeat(limit / 5));
    inputs.push("É".repeat(limit / 2));
    inputs.push("Caroline went to New York with LGBTQ friends there. ".repeat(limit / 52));
    for input in &inputs {
        let t0 = Instant::now();
        let _ = parse_times(input, a);
        let _ = bm25::terms(input);
        let _ = analyse_query(input, Some(a), None);
        let mut st = ReferenceState::default();
        let ex = RuleExtractor::new().extract_sync(&turn(input, input, a), &mut st);
        let dt = t0.elapsed();
        assert!(
            dt < Duration::from_secs(10),
            "{} bytes took {dt:?}",
            input.len()
        );
        assert!(ex.entities.len() < 100_000);
    }
}
