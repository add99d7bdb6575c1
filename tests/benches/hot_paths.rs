//! Criterion micro-benchmarks of the per-turn and per-query hot pieces (`make bench-micro`):
//! tokenise + sparse encode (document and query), time parsing, rule extraction with the
//! reference state machine, query analysis, SoftTF-IDF scoring. Whole recalls (retrieval,
//! scoring and fusion over a store) are measured by `recollect bench`.

use std::collections::HashMap;
use std::hint::black_box;

use chrono::{TimeZone, Utc};
use criterion::{criterion_group, criterion_main, Criterion};
use recollect_extract::{analyse_query, parse_times, RuleExtractor};
use recollect_model::{MemoryId, ReferenceState, TenantId, Turn};

fn turn() -> Turn {
    Turn {
        memory_id: MemoryId::nil(),
        tenant: TenantId("bench".into()),
        conversation_id: "c".into(),
        turn_id: "7".into(),
        position: 7,
        user: "Guess what! I went to Lisbon for a pottery class last Friday with Nadia, and it \
               was harder than expected. She wants to go back there next month."
            .into(),
        assistant: "That's great, Caroline! Did she enjoy the pottery? I'm thinking about \
                    learning the violin with Omar two weeks from now."
            .into(),
        user_speaker: Some("Caroline".into()),
        assistant_speaker: Some("Melanie".into()),
        timestamp: Utc.with_ymd_and_hms(2023, 5, 8, 13, 56, 0).unwrap(),
        recorded_at: Utc::now(),
        metadata: Default::default(),
        user_id: None,
        agent_id: None,
        version: 1,
        first_recorded_at: None,
        expired_at: None,
    }
}

const QUERY: &str = "When did Caroline go to the pottery class in Lisbon with Nadia?";

fn store_side(c: &mut Criterion) {
    let t = turn();
    c.bench_function(
        "lexical: document sparse vector (tokenise, stem, BM25 tf)",
        |b| b.iter(|| recollect_embedder::lexical_document_vector(black_box(&t))),
    );
    c.bench_function("time: parse expressions of one turn field", |b| {
        b.iter(|| parse_times(black_box(&t.user), t.timestamp))
    });
    let x = RuleExtractor::new();
    // A state that has seen a few turns, as mid-conversation.
    let mut warm = ReferenceState::default();
    for _ in 0..5 {
        x.extract_sync(&t, &mut warm);
    }
    c.bench_function("extract: rules + reference resolution, one turn", |b| {
        b.iter(|| {
            let mut st = warm.clone();
            x.extract_sync(black_box(&t), &mut st)
        })
    });
}

fn query_side(c: &mut Criterion) {
    c.bench_function("lexical: query sparse vector", |b| {
        b.iter(|| recollect_extract::bm25::query(black_box(QUERY)))
    });
    let now = Utc.with_ymd_and_hms(2023, 9, 1, 0, 0, 0).unwrap();
    c.bench_function(
        "query: analysis (keywords, entities, time hint, type)",
        |b| b.iter(|| analyse_query(black_box(QUERY), Some(now), None)),
    );
    // Five query keywords with 30 neighbours each, against a fragment of 40 keywords: Path C's
    // scoring of one candidate fragment.
    let neighbours: Vec<HashMap<String, f32>> = (0..5)
        .map(|q| {
            (0..30)
                .map(|n| (format!("kw{}", q * 17 + n), 0.45 + n as f32 / 100.0))
                .collect()
        })
        .collect();
    let set: Vec<String> = (0..40).map(|i| format!("kw{}", i * 3)).collect();
    let idf: HashMap<String, f32> = (0..200)
        .map(|i| (format!("kw{i}"), recollect_recall_idf(i)))
        .collect();
    c.bench_function("score: SoftTF-IDF of one fragment", |b| {
        b.iter(|| recollect_recall::softtfidf::score(black_box(&neighbours), &set, &idf))
    });
}

fn recollect_recall_idf(i: u64) -> f32 {
    recollect_recall::softtfidf::idf(10_000, 1 + i * 7)
}

criterion_group!(benches, store_side, query_side);
criterion_main!(benches);
