//! Store-request decoding and validation as the HTTP and gRPC edges run it, and the
//! client-supplied reference state of a recall request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use recollect_model::request::{decode_store, is_forbidden_control};
use recollect_model::ReferenceState;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = decode_store("conv-1", data, 1000, 65536) {
        // Anything accepted satisfies the documented rules.
        assert!(!req.turns.is_empty() && req.turns.len() <= 1000);
        for t in &req.turns {
            assert!(!t.user.trim().is_empty() && t.user.len() <= 65536);
            assert!(!t.user.chars().any(is_forbidden_control));
        }
    }
    if let Ok(s) = serde_json::from_slice::<ReferenceState>(data) {
        let _ = s.check_client_supplied();
    }
});
