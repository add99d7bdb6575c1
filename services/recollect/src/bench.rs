//! `recollect bench`: synthesises realistic conversations (names, places, dates, pronouns,
//! varied vocabulary), ingests them end to end through the embedded pipeline, then measures
//! recall latency with a realistic mix of queries. Prints figures; asserts nothing.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use chrono::{Duration, TimeZone, Utc};
use clap::Args;
use recollect_config::Settings;
use recollect_embed::{Embedder, HashEmbedder, TokenEmbedder};
use recollect_embedder::field_text;
use recollect_extract::RuleExtractor;
use recollect_gateway::StoreRequest;
use recollect_model::{MemoryId, ReferenceState, TenantId, TokenVectors, Turn, TurnInput};
use recollect_recall::RecallRequest;

use crate::app::App;

#[derive(Args)]
pub struct BenchArgs {
    /// Store sizes in turns, comma-separated; each is built fresh and measured.
    #[arg(long, value_delimiter = ',', default_value = "10000")]
    pub turns: Vec<usize>,
    /// Conversations per store (fewer when a size would give under 10 turns each).
    #[arg(long, default_value_t = 1000)]
    pub conversations: usize,
    #[arg(long, default_value_t = 10)]
    pub tenants: usize,
    /// Recall queries per size.
    #[arg(long, default_value_t = 10_000)]
    pub queries: usize,
    /// Turns first ingested end to end with the configured model (nothing precomputed); 0 skips.
    #[arg(long, default_value_t = 1000)]
    pub e2e_sample: usize,
    /// Distinct synthetic turns embedded before the clock starts; the stores draw from them.
    #[arg(long, default_value_t = 2000)]
    pub pool: usize,
    /// Concurrent clients asking new questions after the one-at-a-time phase; 0 skips it.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Keep each store under DIR/<turns> (reused when it already holds the turns).
    #[arg(long)]
    pub keep: Option<std::path::PathBuf>,
    /// Also write every figure as JSON, with the latency distribution of each size (for plots).
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Write the first size's workload as JSONL (turns, single-conversation queries, a few
    /// reference vectors of the configured model) and exit: `make bench-peers` runs it through
    /// Recollect's HTTP API and through a peer system.
    #[arg(long)]
    pub workload_out: Option<std::path::PathBuf>,
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

/// Bytes the files under `p` take on disk: blocks allocated, not apparent lengths, because
/// redb grows its file by doubling and the part not yet written holds no blocks.
fn dir_bytes(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// Speaker pairs of the synthetic conversations; each pair has its own slice of the pool.
const PAIRS: usize = 20;

fn pair(p: usize) -> (&'static str, &'static str) {
    (NAMES[p % NAMES.len()], NAMES[(p * 7 + 3) % NAMES.len()])
}

/// Vectors computed before the clock starts, by text; anything else (the questions) goes to
/// the model every time, so recall latency includes the real query embedding.
struct Precomputed {
    table: HashMap<String, Vec<f32>>,
    model: Arc<dyn Embedder>,
}

impl Embedder for Precomputed {
    fn model_name(&self) -> &str {
        self.model.model_name()
    }

    fn runtime(&self) -> &str {
        self.model.runtime()
    }

    fn dim(&self) -> usize {
        self.model.dim()
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, recollect_embed::EmbedError> {
        from_table(&self.table, texts, |missing| self.model.embed(missing))
    }

    // Questions are never precomputed: always the model's query embedding.
    fn embed_queries(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, recollect_embed::EmbedError> {
        self.model.embed_queries(texts)
    }

    fn is_asymmetric(&self) -> bool {
        self.model.is_asymmetric()
    }

    fn cosine_scale(&self) -> recollect_embed::CosineScale {
        self.model.cosine_scale()
    }
}

/// Token vectors computed before the clock starts, by text; the questions' go to the model.
struct PrecomputedTokens {
    table: HashMap<String, TokenVectors>,
    model: Arc<dyn TokenEmbedder>,
}

impl TokenEmbedder for PrecomputedTokens {
    fn model_name(&self) -> &str {
        self.model.model_name()
    }

    fn dim(&self) -> usize {
        self.model.dim()
    }

    fn embed_tokens(
        &self,
        texts: &[&str],
    ) -> Result<Vec<TokenVectors>, recollect_embed::EmbedError> {
        from_table(&self.table, texts, |missing| {
            self.model.embed_tokens(missing)
        })
    }
}

/// Each text's entry of `table`, the missing ones computed by `compute` in one call.
fn from_table<T: Clone + Default>(
    table: &HashMap<String, T>,
    texts: &[&str],
    compute: impl FnOnce(&[&str]) -> Result<Vec<T>, recollect_embed::EmbedError>,
) -> Result<Vec<T>, recollect_embed::EmbedError> {
    let missing: Vec<&str> = texts
        .iter()
        .copied()
        .filter(|t| !table.contains_key(*t))
        .collect();
    let mut computed = if missing.is_empty() {
        Vec::new().into_iter()
    } else {
        compute(&missing)?.into_iter()
    };
    Ok(texts
        .iter()
        .map(|t| match table.get(*t) {
            Some(v) => v.clone(),
            None => computed.next().unwrap_or_default(),
        })
        .collect())
}

fn file_bytes_on_disk(file: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(file)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}

/// Where the bytes beyond the vector index go: each redb file's tables per turn, largest
/// first, and what its file holds beyond them (free pages, page slack).
/// Blocks on disk of the vector engine's write-ahead logs (one per shard).
fn vector_log_bytes(dir: &Path) -> u64 {
    ["turns", "keywords", "tokens"]
        .iter()
        .map(|shard| dir_bytes(&dir.join("vectors").join(shard).join("wal")))
        .sum()
}

fn print_footprint(dir: &Path, turns: u64) -> anyhow::Result<()> {
    let per_turn = |b: u64| b as f64 / turns.max(1) as f64;
    for file in ["raw.redb", "graph.redb"] {
        let f = recollect_storage::footprint::redb_footprint(&dir.join(file))?;
        let in_tables: u64 = f
            .tables
            .iter()
            .map(|t| t.stored_bytes + t.overhead_bytes)
            .sum();
        let tables: Vec<String> = f
            .tables
            .iter()
            .filter(|t| t.entries > 0)
            .map(|t| {
                format!(
                    "{} {:.0} B ({:.1} entries, {:.0} B stored)",
                    t.name,
                    per_turn(t.stored_bytes + t.overhead_bytes),
                    t.entries as f64 / turns.max(1) as f64,
                    per_turn(t.stored_bytes),
                )
            })
            .collect();
        println!(
            "  {file}: {:.0} B/turn on disk ({:.0} B/turn long): {}; free or not yet written {:.0} B",
            per_turn(file_bytes_on_disk(&dir.join(file))),
            per_turn(f.file_bytes),
            tables.join(", "),
            per_turn(f.file_bytes.saturating_sub(in_tables)),
        );
    }
    Ok(())
}

/// Recall under load: `clients` callers at once, each asking its own new questions (the query
/// cache emptied before each, as in the one-at-a-time phase), `total` recalls in all. Returns
/// recalls per second over the whole phase and the sorted latencies.
async fn concurrent_recall(
    app: &App,
    tenants: &[TenantId],
    conversations: usize,
    clients: usize,
    total: usize,
) -> anyhow::Result<(f64, Vec<f64>)> {
    let per_client = total.div_ceil(clients.max(1));
    let started = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let (recall, cache) = (app.recall.clone(), app.query_caches.clone());
            let tenants = tenants.to_vec();
            tokio::spawn(async move {
                let mut r = Rng(0x0c11_e475 ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9));
                let mut lat = Vec::with_capacity(per_client);
                for q in 0..per_client {
                    let (c, req) = query(&mut r, q, conversations, tenants.len());
                    cache.clear();
                    let t = Instant::now();
                    recall.recall(&tenants[c % tenants.len()], &req).await?;
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                Ok::<_, anyhow::Error>(lat)
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(per_client * clients);
    for h in handles {
        lat.extend(h.await??);
    }
    let rate = lat.len() as f64 / started.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    Ok((rate, lat))
}

/// Recall with several clients at once.
#[derive(serde::Serialize)]
struct Concurrent {
    clients: usize,
    recalls_per_s: f64,
    p50: f64,
    p99: f64,
}

/// One measured store size.
#[derive(serde::Serialize)]
struct Row {
    turns: usize,
    durable_per_s: f64,
    e2e_per_s: f64,
    ingest_cpu_ms_per_turn: f64,
    /// Seconds from the end of the ingest until the vector index had built its graphs.
    index_settle_s: f64,
    p50: f64,
    p95: f64,
    p99: f64,
    cpu_ms_per_recall: f64,
    cached_p50: f64,
    cached_p99: f64,
    cached_cpu_ms: f64,
    bytes_per_turn: f64,
    bytes_beyond_vectors: f64,
    concurrent: Option<Concurrent>,
    rss_mib: f64,
    reopen_s: f64,
    /// A lone one-turn store with `wait` (answered once recallable), p50.
    wait_store_p50_ms: f64,
    /// Recall latency of new questions at percentiles 0, 1, …, 100 (the CDF).
    latency_percentiles_ms: Vec<f64>,
}

fn turn_input(i: usize, c: usize, user: &str, assistant: &str, p: usize) -> TurnInput {
    let (s1, s2) = pair(p);
    let start_day = Utc.with_ymd_and_hms(2023, 1, 1, 9, 0, 0).unwrap();
    TurnInput {
        turn_id: Some(format!("{i}")),
        user: user.to_string(),
        assistant: Some(assistant.to_string()),
        user_speaker: Some(s1.into()),
        assistant_speaker: Some(s2.into()),
        timestamp: start_day + Duration::hours((i * 7) as i64) + Duration::minutes(c as i64),
        metadata: Default::default(),
        user_id: None,
        agent_id: None,
    }
}

/// A speaker pair's next texts, drawn from its part of the precomputed pool.
fn pool_texts(
    pool: &[Vec<(String, String)>],
    mut r: Rng,
) -> impl FnMut(usize) -> (String, String) + '_ {
    move |p| {
        let items = &pool[p];
        items[(r.next() % items.len() as u64) as usize].clone()
    }
}

/// Lone one-turn stores with `wait` timed after each size's recall phases.
const WAITED_STORES: usize = 30;

/// The synthetic conversations: `turns` spread over `conversations` (`conv-<index>`, the last
/// ones shorter), each with its speaker pair's texts from `text(pair)`, in order.
fn synthetic_conversations(
    conversations: usize,
    turns: usize,
    mut text: impl FnMut(usize) -> (String, String),
) -> Vec<Vec<TurnInput>> {
    let per_conv = turns.div_ceil(conversations);
    let mut left = turns;
    (0..conversations)
        .map(|c| {
            let n = per_conv.min(left);
            left -= n;
            let p = c % PAIRS;
            (0..n)
                .map(|i| {
                    let (u, a) = text(p);
                    turn_input(i, c, &u, &a, p)
                })
                .collect()
        })
        .collect()
}

/// Stores `turns` through the gateway (batches of 250, as a client would send them), then
/// waits until every turn is enriched and recallable. Returns (durable s, end-to-end s).
async fn ingest(
    app: &App,
    tenants: &[TenantId],
    conversations: usize,
    turns: usize,
    text: impl FnMut(usize) -> (String, String),
) -> anyhow::Result<(f64, f64)> {
    let started = Instant::now();
    for (c, batch) in synthetic_conversations(conversations, turns, text)
        .into_iter()
        .enumerate()
    {
        for chunk in batch.chunks(250) {
            app.gateway
                .store(
                    &tenants[c % tenants.len()],
                    &format!("conv-{c}"),
                    StoreRequest {
                        turns: chunk.to_vec(),
                        wait: Some(false),
                    },
                    "bench",
                )
                .await?;
        }
    }
    let durable = started.elapsed().as_secs_f64();
    app.wait_enriched()
        .await
        .context("waiting for enrichment")?;
    Ok((durable, started.elapsed().as_secs_f64()))
}

/// The query mix: 70 % one conversation, 20 % three of the tenant's conversations, 10 % with
/// a time hint; names, activities and places vary, so query texts rarely repeat.
fn query(r: &mut Rng, q: usize, conversations: usize, tenants: usize) -> (usize, RecallRequest) {
    let c = (r.next() % conversations as u64) as usize;
    let (s1, s2) = pair(c % PAIRS);
    let roll = q % 10;
    let convs: Vec<String> = if roll < 7 {
        vec![format!("conv-{c}")]
    } else {
        (0..3)
            .map(|k| format!("conv-{}", (c + k * tenants) % conversations))
            .collect()
    };
    let text = match (roll, r.next() % 4) {
        (9, _) => format!(
            "What did {s1} do at {} in {} 2023?",
            r.pick(PLACES),
            r.pick(&["January", "February", "March", "April", "May", "June"])
        ),
        (7 | 8, _) => format!(
            "Has anyone talked about {} at {}?",
            r.pick(ACTIVITIES),
            r.pick(PLACES)
        ),
        (_, 0) => format!("When did {s1} go {}?", r.pick(ACTIVITIES)),
        (_, 1) => format!("What did {s2} say about {}?", r.pick(ACTIVITIES)),
        (_, 2) => format!("Who went to {} with {s1}?", r.pick(PLACES)),
        _ => format!(
            "How did {s1} feel about {} {}?",
            r.pick(ACTIVITIES),
            r.pick(TIMES)
        ),
    };
    (
        c,
        RecallRequest {
            query: text,
            conversation_ids: Some(convs),
            k: Some(30),
            ..Default::default()
        },
    )
}

/// `--workload-out`: the first size's conversations (layout, speakers, timestamps as in the
/// size phase, but every turn new text from the generator, as in the end-to-end sample, so no
/// text repeats) and the size phase's query sequence without the queries that span several
/// conversations (a peer scopes a search to one) or repeat an earlier question (so every recall
/// embeds a new question, as in the size phase). Each query lists as `relevant` the turns of its
/// conversation that mention the activity or place it asks about.
fn write_workload(path: &Path, a: &BenchArgs, model: &dyn Embedder) -> anyhow::Result<()> {
    use std::io::Write;
    let size = a.turns.first().copied().unwrap_or(10_000);
    let conversations = a.conversations.min(size / 10).max(1);
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    let mut line = |v: serde_json::Value| -> anyhow::Result<()> {
        serde_json::to_writer(&mut out, &v)?;
        Ok(out.write_all(b"\n")?)
    };
    line(
        serde_json::json!({"type": "meta", "turns": size, "conversations": conversations,
        "embedder": model.model_name()}),
    )?;
    let mut r = Rng(0x5eed_0000_0000_0001);
    let turns = synthetic_conversations(conversations, size, |p| {
        let (s1, s2) = pair(p);
        turn_text(&mut r, s1, s2)
    });
    let mut fields = Vec::new();
    for (c, conv) in turns.iter().enumerate() {
        for t in conv {
            line(
                serde_json::json!({"type": "turn", "conversation_id": format!("conv-{c}"),
                "turn_id": t.turn_id, "user": t.user, "assistant": t.assistant,
                "user_speaker": t.user_speaker, "assistant_speaker": t.assistant_speaker,
                "timestamp": t.timestamp}),
            )?;
            if fields.len() < 6 {
                fields.push(field_text(t.user_speaker.as_deref(), &t.user));
            }
        }
    }
    let (mut r, mut q, mut written, mut questions) = (Rng(0xabad_1dea), 0, 0, Vec::new());
    let mut seen = std::collections::HashSet::new();
    while written < a.queries && q < a.queries.saturating_mul(10) {
        let (c, req) = query(&mut r, q, conversations, a.tenants.max(1));
        q += 1;
        if req
            .conversation_ids
            .as_ref()
            .is_none_or(|ids| ids.len() != 1)
            || !seen.insert(req.query.clone())
        {
            continue;
        }
        let asked: Vec<&str> = ACTIVITIES
            .iter()
            .chain(PLACES)
            .copied()
            .filter(|p| req.query.contains(p))
            .collect();
        let relevant: Vec<String> = (turns[c].iter().enumerate())
            .filter(|(_, t)| {
                let assistant = t.assistant.as_deref().unwrap_or_default();
                asked
                    .iter()
                    .any(|p| t.user.contains(p) || assistant.contains(p))
            })
            .map(|(i, _)| i.to_string())
            .collect();
        line(serde_json::json!({"type": "query", "query": req.query,
            "conversation_ids": req.conversation_ids, "k": req.k, "relevant": relevant}))?;
        if questions.len() < 6 {
            questions.push(req.query.clone());
        }
        written += 1;
    }
    // The configured model's vectors of a few texts, for a peer to check it embeds the same.
    let refs: Vec<&str> = fields.iter().map(String::as_str).collect();
    let qrefs: Vec<&str> = questions.iter().map(String::as_str).collect();
    for (text, v) in refs.iter().zip(model.embed(&refs)?) {
        line(serde_json::json!({"type": "reference_vector", "text": text, "vector": v}))?;
    }
    for (text, v) in qrefs.iter().zip(model.embed_queries(&qrefs)?) {
        line(serde_json::json!({"type": "reference_vector", "text": text, "vector": v}))?;
    }
    out.flush()?;
    println!(
        "workload: {size} turns in {conversations} conversations, {written} distinct \
         single-conversation queries (of the first {q} of the size phase) written to {}",
        path.display()
    );
    Ok(())
}

pub async fn run(settings: Settings, a: BenchArgs) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let t = Instant::now();
    let model = crate::app::load_embedder(&settings)?;
    let model_load_s = t.elapsed().as_secs_f64();
    println!(
        "machine: {cores} cores; embedder {} on {} (loaded in {model_load_s:.2} s); sizes {:?}; \
         {} conversations over {} tenants; {} queries per size",
        model.model_name(),
        model.runtime(),
        a.turns,
        a.conversations,
        a.tenants,
        a.queries
    );
    if let Some(path) = &a.workload_out {
        return write_workload(path, &a, model.as_ref());
    }
    let tenants: Vec<TenantId> = (0..a.tenants.max(1))
        .map(|t| TenantId(format!("tenant-{t}")))
        .collect();

    // 1. End to end with the model itself: every field text and new keyword embedded live.
    let mut e2e_model = None;
    if a.e2e_sample > 0 {
        let dir = tempfile::tempdir()?;
        let mut s = settings.clone();
        s.storage.data_dir = dir.path().to_path_buf();
        let app = App::open_with(s, model.clone()).await?;
        let mut r = Rng(0x5eed_0000_0000_0001);
        let convs = (a.e2e_sample / 100).max(1);
        let (durable, e2e) = ingest(&app, &tenants, convs, a.e2e_sample, |p| {
            let (s1, s2) = pair(p);
            turn_text(&mut r, s1, s2)
        })
        .await?;
        let rate = a.e2e_sample as f64 / e2e;
        println!(
            "end to end with {}: {} turns durable in {durable:.1} s, enriched in {e2e:.1} s = {rate:.1} turns/s",
            model.model_name(),
            a.e2e_sample
        );
        e2e_model = Some(rate);
        app.shutdown().await;
    }

    // 2. The pool, embedded before any clock starts: field texts and their keywords.
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let per_pair = (a.pool / PAIRS).max(1);
    let pool: Vec<Vec<(String, String)>> = (0..PAIRS)
        .map(|p| {
            let (s1, s2) = pair(p);
            (0..per_pair).map(|_| turn_text(&mut r, s1, s2)).collect()
        })
        .collect();
    let mut table: HashMap<String, Vec<f32>> = HashMap::new();
    let t = Instant::now();
    let mut texts: Vec<String> = Vec::new();
    let mut field_texts: Vec<String> = Vec::new();
    let rules = RuleExtractor::new();
    for (p, items) in pool.iter().enumerate() {
        let (s1, s2) = pair(p);
        for (u, asst) in items {
            field_texts.push(field_text(Some(s1), u));
            field_texts.push(field_text(Some(s2), asst));
            let turn = Turn {
                memory_id: MemoryId::nil(),
                tenant: TenantId("pool".into()),
                conversation_id: "pool".into(),
                turn_id: "0".into(),
                position: 0,
                user: u.clone(),
                assistant: asst.clone(),
                user_speaker: Some(s1.into()),
                assistant_speaker: Some(s2.into()),
                timestamp: Utc::now(),
                recorded_at: Utc::now(),
                metadata: Default::default(),
                user_id: None,
                agent_id: None,
                version: 1,
                first_recorded_at: None,
                expired_at: None,
            };
            let ex = rules.extract_sync(&turn, &mut ReferenceState::default());
            texts.extend(ex.keywords.into_iter().map(|k| k.text));
        }
    }
    field_texts.sort();
    field_texts.dedup();
    texts.extend(field_texts.iter().cloned());
    texts.sort();
    texts.dedup();
    for chunk in texts.chunks(64) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        table.extend(chunk.iter().cloned().zip(model.embed(&refs)?));
    }
    // The late-interaction model's token vectors of the pool's field texts too, when it is on.
    let token_model = recollect_runtime::load_token_embedder(&settings)?;
    let mut token_table: HashMap<String, TokenVectors> = HashMap::new();
    if let Some(m) = &token_model {
        for chunk in field_texts.chunks(64) {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            token_table.extend(chunk.iter().cloned().zip(m.embed_tokens(&refs)?));
        }
    }
    println!(
        "precomputed: {} distinct texts ({} turns of the pool and their keywords) embedded in {:.1} s, not counted below",
        texts.len(),
        PAIRS * per_pair,
        t.elapsed().as_secs_f64()
    );

    let precomputed = Arc::new(Precomputed {
        table,
        model: model.clone(),
    });
    let precomputed_tokens: Option<Arc<dyn TokenEmbedder>> = token_model.map(|model| {
        Arc::new(PrecomputedTokens {
            table: token_table,
            model,
        }) as Arc<dyn TokenEmbedder>
    });

    // Query embedding on its own: the model, one question at a time, uncached.
    let mut qr = Rng(0x0123_4567_89ab_cdef);
    let mut qlat: Vec<f64> = (0..30)
        .map(|q| {
            let (_, req) = query(&mut qr, q, a.conversations.max(1), a.tenants.max(1));
            let t = Instant::now();
            let _ = model.embed_queries(&[req.query.as_str()]);
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    qlat.sort_by(f64::total_cmp);
    let query_embed_p50 = percentile(&qlat, 0.5);
    println!("query embedding alone (model, uncached, one question): p50 {query_embed_p50:.1} ms");

    // 3. Each size: ingest from the pool, recall, disk, reopen.
    let mut rows = Vec::new();
    for &size in &a.turns {
        let tmp;
        let dir = match &a.keep {
            Some(d) => d.join(size.to_string()),
            None => {
                tmp = tempfile::tempdir()?;
                tmp.path().to_path_buf()
            }
        };
        let mut s = settings.clone();
        s.storage.data_dir = dir.clone();
        let embedder: Arc<dyn Embedder> = precomputed.clone();
        let app = App::open_with_models(s.clone(), embedder, precomputed_tokens.clone()).await?;
        let conversations = a.conversations.min(size / 10).max(1);
        let existing = app.raw.count()? as usize;
        let cpu0 = cpu_seconds();
        let batches0 = stage_batches();
        let (durable, e2e) = if existing < size {
            let r = Rng(0xfeed_f00d ^ size as u64);
            ingest(&app, &tenants, conversations, size, pool_texts(&pool, r)).await?
        } else {
            app.wait_enriched().await?;
            println!("{size}: reusing the {existing} turns in {}", dir.display());
            (f64::NAN, f64::NAN)
        };
        let ingest_cpu = cpu_seconds() - cpu0;
        if existing < size {
            println!(
                "{size}: ingest {:.0} turns/s durable, {:.0} turns/s end to end (precomputed embeddings), {:.2} ms CPU per turn",
                size as f64 / durable,
                size as f64 / e2e,
                ingest_cpu / size as f64 * 1000.0
            );
            println!(
                "{size}: ingest batches, mean messages / ms per batch: {}",
                stage_batches_since(&batches0)
            );
        }
        // Recall is timed on a settled index: the background optimiser builds HNSW graphs for
        // up to a minute after a bulk ingest at 100k, and recall overlapping it measured the
        // build (and how many queries the phase ran), not recall.
        let t = Instant::now();
        app.vectors.optimize().await?;
        let settle_s = t.elapsed().as_secs_f64();
        println!("{size}: vector index settled {settle_s:.1} s after the ingest (background HNSW build; recall below is timed after it)");

        // New questions: the query cache is emptied before each, so every recall embeds its
        // question and keywords with the model, as a chat platform's (rarely repeated) questions do.
        let mut lat = Vec::with_capacity(a.queries);
        let totals0 = RecallTotals::now();
        let cpu0 = cpu_seconds();
        let mut r = Rng(0xabad_1dea);
        let bar = crate::progress::bar(a.queries as u64, &format!("{size}: recall"));
        for q in 0..a.queries {
            bar.inc(1);
            let (c, req) = query(&mut r, q, conversations, tenants.len());
            app.query_caches.clear();
            let t = Instant::now();
            let _ = app.recall.recall(&tenants[c % tenants.len()], &req).await?;
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        bar.finish_and_clear();
        let cpu = (cpu_seconds() - cpu0) / a.queries.max(1) as f64 * 1000.0;
        println!("{size}: {}", RecallTotals::now().means_since(&totals0));
        lat.sort_by(f64::total_cmp);
        // Repeated questions (embeddings cached): everything but the model, on a subset.
        let repeats = a.queries.min(2000);
        let mut lat_cached = Vec::with_capacity(repeats);
        let mut cpu_cached = 0.0;
        let mut r = Rng(0xabad_1dea);
        for q in 0..repeats {
            let (c, req) = query(&mut r, q, conversations, tenants.len());
            let tenant = &tenants[c % tenants.len()];
            let _ = app.recall.recall(tenant, &req).await?;
            // Clock-tick resolution per call; the sum over the calls is what counts.
            let c0 = cpu_seconds();
            let t = Instant::now();
            let _ = app.recall.recall(tenant, &req).await?;
            lat_cached.push(t.elapsed().as_secs_f64() * 1000.0);
            cpu_cached += cpu_seconds() - c0;
        }
        let cpu_cached = cpu_cached / repeats.max(1) as f64 * 1000.0;
        lat_cached.sort_by(f64::total_cmp);
        let concurrent = if a.clients > 0 {
            let (rate, lat) = concurrent_recall(
                &app,
                &tenants,
                conversations,
                a.clients,
                a.queries.min(2000),
            )
            .await?;
            println!(
                "{size}: {} concurrent clients, new questions: {rate:.1} recalls/s, p50 {:.1} ms, p99 {:.1} ms",
                a.clients,
                percentile(&lat, 0.5),
                percentile(&lat, 0.99)
            );
            Some(Concurrent {
                clients: a.clients,
                recalls_per_s: rate,
                p50: percentile(&lat, 0.5),
                p99: percentile(&lat, 0.99),
            })
        } else {
            None
        };
        // A lone store with `wait` on the settled store: answered once its turn is
        // recallable, i.e. the whole pipeline's latency for one turn when nothing else runs.
        let r = Rng(0x5eed_fa17 ^ size as u64);
        let lone = synthetic_conversations(WAITED_STORES, WAITED_STORES, pool_texts(&pool, r));
        let mut waited = Vec::with_capacity(lone.len());
        for (i, turns) in lone.into_iter().enumerate() {
            let t = Instant::now();
            app.gateway
                .store(
                    &tenants[i % tenants.len()],
                    &format!("waited-{i}"),
                    StoreRequest {
                        turns,
                        wait: Some(true),
                    },
                    "bench",
                )
                .await?;
            waited.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        waited.sort_by(f64::total_cmp);
        let wait_store_p50 = percentile(&waited, 0.5);
        println!(
            "{size}: a lone store with `wait` (one turn, answered once recallable): p50 {wait_store_p50:.1} ms, max {:.1} ms ({} stores)",
            waited.last().copied().unwrap_or(f64::NAN),
            waited.len()
        );
        let n = app.raw.count()?.max(1);
        app.shutdown().await;
        let log_before = vector_log_bytes(&dir);
        print_footprint(&dir, n)?;
        // Reopen: the stores alone (the model is loaded once per process; see above).
        let t = Instant::now();
        let reopened = App::open_with(s, Arc::new(HashEmbedder::new(model.dim()))).await?;
        let reopen_s = t.elapsed().as_secs_f64();
        reopened.shutdown().await;
        // Disk at rest, as a restarted store holds it: opening removes the vector engine's
        // write-ahead log, which grows while a process runs (`prune_write_ahead_log`).
        let total = dir_bytes(&dir);
        let vectors = dir_bytes(&dir.join("vectors"));
        println!(
            "{size}: the vector engine's write-ahead log had grown to {:.0} B/turn since the store was opened; {:.0} B/turn after the reopen",
            log_before as f64 / n as f64,
            vector_log_bytes(&dir) as f64 / n as f64
        );
        // Which conversations say which keyword forms: the vector index's own bookkeeping,
        // as the keyword points' conversation payloads and their index were before it.
        println!(
            "{size}: of the vector index, which conversations say which keyword forms (keyword_forms.redb): {:.0} B/turn",
            std::fs::metadata(dir.join("vectors").join("keyword_forms.redb"))
                .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
                .unwrap_or(0) as f64
                / n as f64
        );
        let row = Row {
            turns: size,
            durable_per_s: size as f64 / durable,
            e2e_per_s: size as f64 / e2e,
            ingest_cpu_ms_per_turn: ingest_cpu / size as f64 * 1000.0,
            index_settle_s: settle_s,
            p50: percentile(&lat, 0.5),
            p95: percentile(&lat, 0.95),
            p99: percentile(&lat, 0.99),
            cpu_ms_per_recall: cpu,
            cached_p50: percentile(&lat_cached, 0.5),
            cached_p99: percentile(&lat_cached, 0.99),
            cached_cpu_ms: cpu_cached,
            bytes_per_turn: total as f64 / n as f64,
            bytes_beyond_vectors: total.saturating_sub(vectors) as f64 / n as f64,
            concurrent,
            rss_mib: peak_rss_mib(),
            reopen_s,
            wait_store_p50_ms: wait_store_p50,
            latency_percentiles_ms: (0..=100)
                .map(|p| percentile(&lat, p as f64 / 100.0))
                .collect(),
        };
        println!(
            "{size}: recall of new questions p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms, {:.1} ms CPU; \
             repeated (embeddings cached) p50 {:.1} ms, p99 {:.1} ms, {:.1} ms CPU; \
             disk {:.0} B/turn ({:.0} B/turn beyond the vector index); peak RSS {:.0} MiB; reopen {:.2} s",
            row.p50, row.p95, row.p99, row.cpu_ms_per_recall, row.cached_p50, row.cached_p99, row.cached_cpu_ms,
            row.bytes_per_turn, row.bytes_beyond_vectors, row.rss_mib, row.reopen_s
        );
        rows.push(row);
    }

    println!();
    println!(
        "| turns | ingest durable | ingest end to end, precomputed embeddings | ingest CPU/turn | recall p50 | p95 | p99 | CPU/recall | cached-embedding recall p50 / p99 / CPU | concurrent clients: recalls/s, p50 / p99 | disk/turn | beyond vectors | peak RSS | reopen |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let concurrent = r.concurrent.as_ref().map_or("-".to_string(), |c| {
            format!(
                "{}: {:.1}/s, {:.1} / {:.1} ms",
                c.clients, c.recalls_per_s, c.p50, c.p99
            )
        });
        // A reused store was not ingested here: no rates.
        let rate = |v: f64| {
            if v.is_finite() {
                format!("{v:.0}/s")
            } else {
                "-".into()
            }
        };
        println!(
            "| {} | {} | {} | {:.2} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} / {:.1} / {:.1} ms | {concurrent} | {:.0} B | {:.0} B | {:.0} MiB | {:.2} s |",
            r.turns, rate(r.durable_per_s), rate(r.e2e_per_s), r.ingest_cpu_ms_per_turn, r.p50, r.p95, r.p99,
            r.cpu_ms_per_recall, r.cached_p50, r.cached_p99, r.cached_cpu_ms, r.bytes_per_turn,
            r.bytes_beyond_vectors, r.rss_mib, r.reopen_s
        );
    }
    if let Some(rate) = e2e_model {
        println!(
            "end to end with the model embedding every turn: {rate:.1} turns/s ({} turns); model load {model_load_s:.2} s; \
             query embedding alone p50 {query_embed_p50:.1} ms",
            a.e2e_sample
        );
    }
    if let Some(path) = &a.json {
        let doc = serde_json::json!({
            "cores": cores,
            "embedder": model.model_name(),
            "embedder_runtime": model.runtime(),
            "model_load_s": model_load_s,
            "query_embedding_p50_ms": query_embed_p50,
            "end_to_end_with_model_turns_per_s": e2e_model,
            "queries_per_size": a.queries,
            "sizes": rows,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)?;
        println!("figures written to {}", path.display());
    }
    Ok(())
}

/// The pipeline's stages, in the order a turn meets them.
const STAGES: [&str; 4] = ["extractor", "embedder", "graph-writer", "consolidator"];

/// Each stage's batch totals `(messages, batches, seconds)` at one moment.
fn stage_batches() -> Vec<(f64, u64, f64)> {
    STAGES
        .iter()
        .map(|s| recollect_telemetry::stage_batch_totals(s))
        .collect()
}

/// Each stage's mean batch since `before`: how many turns share one round of its writes.
fn stage_batches_since(before: &[(f64, u64, f64)]) -> String {
    STAGES
        .iter()
        .zip(stage_batches().iter().zip(before))
        .filter(|(_, ((_, n1, _), (_, n0, _)))| n1 > n0)
        .map(|(stage, ((m1, n1, t1), (m0, n0, t0)))| {
            let n = (n1 - n0) as f64;
            format!(
                "{stage} {:.1} / {:.1} ms",
                (m1 - m0) / n,
                (t1 - t0) / n * 1000.0
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Recall's phases in order, the retrievers inside `retrieve` (they overlap), and the paths
/// that report candidate turns: the labels of the recall histograms.
const PHASES: [&str; 5] = ["analyse", "retrieve", "rank", "late", "rerank"];
const RETRIEVERS: [&str; 5] = ["path_b", "path_c", "dense", "lexical", "late_scan"];
const CANDIDATE_PATHS: [&str; 6] = ["reached", "path_b", "path_c", "dense", "lexical", "late"];

/// The recall histograms' `(sum, count)` per label at one moment, read before and after a run.
pub(crate) struct RecallTotals {
    duration: Vec<(f64, u64)>,
    candidates: Vec<(f64, u64)>,
    reranks: Vec<u64>,
}

/// What the cross-encoder did (`recollect_recall_reranks_total`'s outcomes).
const RERANK_OUTCOMES: [&str; 3] = ["reread", "skipped", "failed"];

impl RecallTotals {
    pub(crate) fn now() -> Self {
        let duration = PHASES
            .iter()
            .chain(&RETRIEVERS)
            .map(|p| recollect_telemetry::recall_duration_totals(p))
            .collect();
        let candidates = CANDIDATE_PATHS
            .iter()
            .map(|p| recollect_telemetry::recall_candidates_totals(p))
            .collect();
        let reranks = RERANK_OUTCOMES
            .iter()
            .map(|o| recollect_telemetry::recall_reranks_total(o))
            .collect();
        Self {
            duration,
            candidates,
            reranks,
        }
    }

    /// Where the recalls since `before` spent their time, and how many candidates each path
    /// gave: means over those recalls.
    pub(crate) fn means_since(&self, before: &Self) -> String {
        let list = |labels: &[&str], now: &[(f64, u64)], then: &[(f64, u64)], scale, unit| {
            labels
                .iter()
                .zip(now.iter().zip(then))
                .filter(|(_, ((_, c1), (_, c0)))| c1 > c0)
                .map(|(l, ((s1, c1), (s0, c0)))| {
                    format!("{l} {:.1}{unit}", (s1 - s0) / (c1 - c0) as f64 * scale)
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (phases, retrievers) = self.duration.split_at(PHASES.len());
        let (phases0, retrievers0) = before.duration.split_at(PHASES.len());
        let mut out = format!(
            "recall phases, mean: {}; inside retrieve, overlapping: {}; candidate turns, mean: {}",
            list(&PHASES, phases, phases0, 1000.0, " ms"),
            list(&RETRIEVERS, retrievers, retrievers0, 1000.0, " ms"),
            list(
                &CANDIDATE_PATHS,
                &self.candidates,
                &before.candidates,
                1.0,
                ""
            ),
        );
        let reranks: Vec<String> = RERANK_OUTCOMES
            .iter()
            .zip(self.reranks.iter().zip(&before.reranks))
            .filter(|(_, (n1, n0))| n1 > n0)
            .map(|(o, (n1, n0))| format!("{o} {}", n1 - n0))
            .collect();
        if !reranks.is_empty() {
            // The rerank phase's mean above is over the recalls it re-read.
            out.push_str(&format!("; cross-encoder, recalls: {}", reranks.join(", ")));
        }
        out
    }
}
