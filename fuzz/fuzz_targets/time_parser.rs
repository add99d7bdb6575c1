//! Time expressions: arbitrary text against an anchor taken from the input's first bytes.
#![no_main]

use chrono::{TimeZone, Utc};
use libfuzzer_sys::fuzz_target;
use recollect_extract::{parse_date_time, parse_times};

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let secs = i64::from_le_bytes(data[..8].try_into().unwrap()) % 8_000_000_000_000;
    let anchor = Utc.timestamp_opt(secs, 0).single().unwrap_or_default();
    let text = String::from_utf8_lossy(&data[8..]);
    for t in parse_times(&text, anchor) {
        assert!(t.start <= t.end, "{t:?}");
    }
    let _ = parse_date_time(&text);
});
