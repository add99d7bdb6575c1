//! `recollect bench`: synthesises realistic conversations (names, places, dates, pronouns,
//! varied vocabulary), ingests them end to end through the embedded pipeline, then measures
//! recall latency with a realistic mix of queries. Prints figures; asserts nothing.

use std::time::Instant;

use anyhow::Context;
use chrono::{Duration, TimeZone, Utc};
use clap::Args;
use recollect_config::Settings;
use recollect_gateway::StoreRequest;
use recollect_model::{TenantId, TurnInput};
use recollect_recall::RecallRequest;

use crate::app::App;

#[derive(Args)]
pub struct BenchArgs {
    /// Turns to ingest.
    #[arg(long, default_value_t = 10_000)]
    pub turns: usize,
    #[arg(long, default_value_t = 100)]
    pub conversations: usize,
    #[arg(long, default_value_t = 10)]
    pub tenants: usize,
    #[arg(long, default_value_t = 1000)]
    pub queries: usize,
    /// Keep the data here (reused: ingestion is skipped when it already holds the turns).
    #[arg(long)]
    pub keep: Option<std::path::PathBuf>,
}

/// xorshift64*: reproducible synthetic data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn pick<'a>(&mut self, xs: &'a [&'a str]) -> &'a str {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

const NAMES: &[&str] = &[
    "Alice", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Jade", "Kofi",
    "Lena", "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera",
    "Wei", "Ximena", "Yusuf", "Zoe",
];
const PLACES: &[&str] = &[
    "Lisbon",
    "the beach",
    "Kyoto",
    "the gym",
    "Toronto",
    "the museum",
    "Nairobi",
    "the lake",
    "Berlin",
    "the library",
    "Chicago",
    "the park",
    "Seoul",
    "the office",
    "Madrid",
    "the mountains",
    "Oslo",
    "the hospital",
    "Lima",
    "the cafe",
];
const ACTIVITIES: &[&str] = &[
    "painting",
    "running a half marathon",
    "learning the violin",
    "adopting a puppy",
    "baking sourdough",
    "volunteering at the shelter",
    "a pottery class",
    "hiking",
    "a job interview",
    "a camping trip",
    "writing a novel",
    "planting tomatoes",
    "a chess tournament",
    "fixing the old bike",
    "a salsa lesson",
    "studying for the exam",
    "a road trip",
    "the charity gala",
    "knitting a scarf",
    "a birthday party",
];
const TIMES: &[&str] = &[
    "yesterday",
    "last week",
    "last Friday",
    "two weeks ago",
    "this morning",
    "last month",
    "next month",
    "on Saturday",
    "last summer",
    "a few days ago",
];
const FEELINGS: &[&str] = &[
    "it was amazing",
    "it was harder than expected",
    "I felt so proud",
    "honestly it was exhausting",
    "it made me really happy",
    "I was nervous at first",
    "it went better than I hoped",
    "I learned a lot",
];

fn turn_text(r: &mut Rng, speaker: &str, other: &str) -> (String, String) {
    let user = format!(
        "{} I went to {} for {} {}, and {}. {} came too.",
        r.pick(&["Guess what!", "So,", "Hey,", "Well,", ""]),
        r.pick(PLACES),
        r.pick(ACTIVITIES),
        r.pick(TIMES),
        r.pick(FEELINGS),
        r.pick(NAMES)
    );
    let assistant = format!(
        "That's great, {speaker}! Did she enjoy {}? I'm thinking about {} with {} {}.",
        r.pick(ACTIVITIES),
        r.pick(ACTIVITIES),
        other,
        r.pick(TIMES)
    );
    (user.trim().to_string(), assistant)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// User + system CPU seconds of this process (from /proc; 0 where unavailable).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: f64 = fields
        .get(11)
        .and_then(|u| u.parse::<f64>().ok())
        .unwrap_or(0.0)
        + fields
            .get(12)
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0);
    ticks / 100.0
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(|l| l.to_string())
        })
        .and_then(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

fn dir_bytes(p: &std::path::Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

pub async fn run(mut settings: Settings, a: BenchArgs) -> anyhow::Result<()> {
    let tmp;
    let dir = match &a.keep {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    settings.storage.data_dir = dir.clone();
    let app = App::open(settings.clone()).await?;
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let tenants: Vec<TenantId> = (0..a.tenants.max(1))
        .map(|t| TenantId(format!("tenant-{t}")))
        .collect();
    let per_conv = a.turns.div_ceil(a.conversations.max(1));
    let start_day = Utc.with_ymd_and_hms(2023, 1, 1, 9, 0, 0).unwrap();
    let existing = app.raw.count()? as usize;
    println!(
        "machine: {} cores; embedder {}; {} turns over {} conversations and {} tenants",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        app.embedder.model_name(),
        a.turns,
        a.conversations,
        tenants.len()
    );
    if existing < a.turns {
        let started = Instant::now();
        let mut ids = Vec::new();
        for c in 0..a.conversations {
            let tenant = &tenants[c % tenants.len()];
            let (s1, s2) = (NAMES[c % NAMES.len()], NAMES[(c * 7 + 3) % NAMES.len()]);
            let mut turns = Vec::with_capacity(per_conv);
            for i in 0..per_conv {
                let (user, assistant) = turn_text(&mut r, s1, s2);
                turns.push(TurnInput {
                    turn_id: Some(format!("{i}")),
                    user,
                    assistant: Some(assistant),
                    user_speaker: Some(s1.into()),
                    assistant_speaker: Some(s2.into()),
                    timestamp: start_day + Duration::hours((i * 7) as i64),
                    metadata: Default::default(),
                });
            }
            for chunk in turns.chunks(250) {
                let resp = app
                    .gateway
                    .store(
                        tenant,
                        &format!("conv-{c}"),
                        StoreRequest {
                            turns: chunk.to_vec(),
                            wait: Some(false),
                        },
                        "bench",
                    )
                    .await?;
                ids.extend(resp.memory_ids);
            }
        }
        let accepted = started.elapsed().as_secs_f64();
        app.wait_enriched()
            .await
            .context("waiting for enrichment")?;
        let secs = started.elapsed().as_secs_f64();
        println!(
            "ingest: {} turns accepted in {accepted:.1}s ({:.0} turns/s durable), enriched end to end in {secs:.1}s ({:.1} turns/s)",
            ids.len(),
            ids.len() as f64 / accepted,
            ids.len() as f64 / secs
        );
    } else {
        app.wait_enriched().await?;
        println!("ingest: reusing {existing} turns in {}", dir.display());
    }

    // Recall: one conversation (70%), three conversations (20%), time-hinted (10%).
    let mut lat = Vec::with_capacity(a.queries);
    let cpu0 = cpu_seconds();
    for q in 0..a.queries {
        let c = (r.next() % a.conversations as u64) as usize;
        let tenant = &tenants[c % tenants.len()];
        let roll = q % 10;
        let convs: Vec<String> = if roll < 7 {
            vec![format!("conv-{c}")]
        } else {
            (0..3)
                .map(|k| format!("conv-{}", (c + k * tenants.len()) % a.conversations))
                .collect()
        };
        let query = if roll == 9 {
            format!(
                "What did {} do at {} in March 2023?",
                NAMES[c % NAMES.len()],
                r.pick(PLACES)
            )
        } else {
            format!(
                "When did {} go {}?",
                NAMES[c % NAMES.len()],
                r.pick(ACTIVITIES)
            )
        };
        let req = RecallRequest {
            query,
            conversation_ids: Some(convs),
            k: Some(30),
            ..Default::default()
        };
        let t = Instant::now();
        let _ = app.recall.recall(tenant, &req).await?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let cpu = (cpu_seconds() - cpu0) / a.queries.max(1) as f64 * 1000.0;
    lat.sort_by(f64::total_cmp);
    println!(
        "recall: p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms, CPU {cpu:.1} ms per recall over {} queries",
        percentile(&lat, 0.5),
        percentile(&lat, 0.95),
        percentile(&lat, 0.99),
        lat.len()
    );
    let n = app.raw.count()?.max(1);
    let total = dir_bytes(&dir);
    let vectors = dir_bytes(&dir.join("vectors"));
    println!(
        "disk: {:.1} MiB in all, {:.0} bytes per turn, {:.0} bytes per turn beyond the vector index; peak RSS {:.0} MiB",
        total as f64 / 1048576.0,
        total as f64 / n as f64,
        (total - vectors) as f64 / n as f64,
        peak_rss_mib()
    );
    app.shutdown().await;
    let t = Instant::now();
    let app = App::open_with(
        settings,
        std::sync::Arc::new(recollect_embed::HashEmbedder::new(384)),
    )
    .await?;
    println!(
        "restart: stores reopened in {:.2} s (model load excluded)",
        t.elapsed().as_secs_f64()
    );
    app.shutdown().await;
    Ok(())
}
