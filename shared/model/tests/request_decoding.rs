//! Request decoding (serde + validation) on arbitrary bytes and on mutated valid bodies: never
//! a panic, and every input is decided within a bounded time.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use recollect_model::request::decode_store;
use recollect_model::ReferenceState;

/// Generous against a loaded 2-core CI machine; real inputs take microseconds.
const PER_INPUT: Duration = Duration::from_secs(2);
const VALID: &str = r#"{"turns":[{"turn_id":"1","user":"I painted a sunrise","assistant":"Lovely","user_speaker":"Mel","assistant_speaker":"Bot","timestamp":"2023-05-08T13:56:00Z","metadata":{"k":[1,{"a":null}]}}],"wait":true}"#;

fn decide(body: &[u8]) -> Duration {
    let t0 = Instant::now();
    let _ = decode_store("conv-1", body, 1000, 65536);
    let _ = serde_json::from_slice::<ReferenceState>(body).map(|s| s.check_client_supplied());
    t0.elapsed()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..2048)) {
        let dt = decide(&body);
        prop_assert!(dt < PER_INPUT, "{dt:?}");
    }

    #[test]
    fn mutated_valid_bodies(edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8)) {
        let mut body = VALID.as_bytes().to_vec();
        for (at, byte, op) in edits {
            let i = at.index(body.len().max(1));
            match op {
                0 if i < body.len() => body[i] = byte,
                1 => body.insert(i.min(body.len()), byte),
                _ if i < body.len() => { body.remove(i); }
                _ => {}
            }
        }
        let dt = decide(&body);
        prop_assert!(dt < PER_INPUT, "{dt:?}");
        // Whatever decodes must also have passed validation: re-validate independently.
        if let Ok(req) = decode_store("conv-1", &body, 1000, 65536) {
            for t in &req.turns {
                prop_assert!(!t.user.trim().is_empty());
                prop_assert!(!t.user.chars().any(recollect_model::request::is_forbidden_control));
            }
        }
    }

    #[test]
    fn json_shaped_text(s in r#"[\[\]{}":,0-9a-z\\ \-.eE+tnuf]{0,400}"#) {
        let dt = decide(s.as_bytes());
        prop_assert!(dt < PER_INPUT, "{dt:?}");
    }
}

#[test]
fn deep_and_huge_inputs_are_decided_fast() {
    let mut inputs: Vec<Vec<u8>> = vec![
        "[".repeat(1_000_000).into_bytes(),
        "{\"a\":".repeat(200_000).into_bytes(),
        format!(
            "{{\"turns\":[{{\"user\":\"{}\",\"timestamp\":\"2023-05-08T13:56:00Z\"}}]}}",
            "x".repeat(4 << 20)
        )
        .into_bytes(),
        format!(
            "{{\"turns\":[{}]}}",
            vec![r#"{"user":"a","timestamp":"2023-05-08T13:56:00Z"}"#; 5000].join(",")
        )
        .into_bytes(),
        format!("{{\"entities\":[{}]}}", vec!["\"e\""; 100_000].join(",")).into_bytes(),
    ];
    inputs.push(vec![0xff; 1 << 20]);
    for body in inputs {
        let dt = decide(&body);
        assert!(dt < PER_INPUT * 5, "{} bytes took {dt:?}", body.len());
        assert!(decode_store("c", &body, 1000, 65536).is_err());
    }
}
