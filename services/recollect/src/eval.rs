//! `recollect eval locomo`: retrieval quality on LoCoMo, following ../shared/EVAL.md to the
//! letter (rounds as memory units, cleaned evidence, recall/hit/mrr at K per category), through
//! the real embedded pipeline in a temporary data directory.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Subcommand;
use recollect_config::Settings;
use recollect_embed::{CachedEmbedder, Embedder};
use recollect_gateway::StoreRequest;
use recollect_model::{MemoryId, ScoreParts, TenantId, TurnInput};
use recollect_recall::{Ablation, Component, Recall, RecallConfig, RecallRequest};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::app::App;

mod bootstrap;

#[derive(Subcommand)]
pub enum EvalCommand {
    /// LoCoMo retrieval: recall@K, hit@K, mrr@K per category.
    Locomo {
        /// Path to locomo JSON (e.g. ../shared/data/locomo-dev.json).
        #[arg(long)]
        data: PathBuf,
        #[arg(long, default_value = "10,30")]
        k: String,
        /// Write rankings in the exchange format of locomo_baseline.py --score-rankings.
        #[arg(long)]
        dump_rankings: Option<PathBuf>,
        /// Switch one component off (path-b, path-c, graph, scoring, dense, lexical, fields), or `all`
        /// to run the full configuration and then every ablation on one ingestion.
        #[arg(long)]
        ablate: Option<String>,
        /// Only the first N conversations (quick runs).
        #[arg(long)]
        conversations: Option<usize>,
        /// Keep the ingested data here and reuse it on the next run (default: a temporary dir).
        #[arg(long)]
        keep: Option<PathBuf>,
        /// Override a recall constant, e.g. --set lexical_weight=0.4 (repeatable).
        #[arg(long = "set")]
        set: Vec<String>,
        /// Also write every figure (round and session level, per category, latency) as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Rankings an earlier run wrote with --dump-rankings (same data): every run's headline
        /// figures are compared with them question by question (paired bootstrap, 95%).
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
}

/// The session-level cut-offs (session recall@1/5/10).
const SESSION_KS: [usize; 3] = [1, 5, 10];

/// A LoCoMo round: up to two utterances of one session, and the dia_ids it covers.
pub(crate) struct Round {
    pub(crate) dia_ids: Vec<String>,
    pub(crate) input: TurnInput,
}

struct Question {
    sample: String,
    qa_index: usize,
    category: u8,
    question: String,
    gold: Vec<String>,
}

/// `evidence_ids()` of tools/locomo_baseline.py: split packed ids, fix `D:11:26` and zero padding.
pub fn clean_evidence(raw: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    for e in raw.iter().filter_map(Value::as_str) {
        for part in e
            .split(|c: char| c == ';' || c.is_whitespace())
            .filter(|p| !p.is_empty())
        {
            let p = part.strip_prefix('D').unwrap_or("");
            let p = p.strip_prefix(':').unwrap_or(p);
            let Some((s, t)) = p.split_once(':') else {
                continue;
            };
            if s.is_empty()
                || t.is_empty()
                || !s.bytes().all(|b| b.is_ascii_digit())
                || !t.bytes().all(|b| b.is_ascii_digit())
            {
                continue;
            }
            let (Ok(s), Ok(t)) = (s.parse::<u64>(), t.parse::<u64>()) else {
                continue;
            };
            out.push(format!("D{s}:{t}"));
        }
    }
    out
}

fn utterance_text(t: &Value) -> String {
    let mut s = t["text"].as_str().unwrap_or("").to_string();
    if let Some(c) = t["blip_caption"].as_str() {
        s.push_str(&format!(" [image: {c}]"));
    }
    s
}

/// A LoCoMo sample's rounds (also what `recollect import --format locomo` stores).
pub(crate) fn rounds_of(conv: &Value) -> anyhow::Result<Vec<Round>> {
    let c = conv["conversation"]
        .as_object()
        .context("sample without conversation")?;
    let mut sessions: Vec<(u64, &String)> = c
        .keys()
        .filter_map(|k| {
            k.strip_prefix("session_")
                .and_then(|n| n.parse::<u64>().ok())
                .map(|n| (n, k))
        })
        .collect();
    sessions.sort();
    let mut out = Vec::new();
    for (n, key) in sessions {
        let Some(turns) = c[key].as_array() else {
            continue;
        };
        let stamp = c
            .get(&format!("session_{n}_date_time"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let ts = recollect_extract::time::parse_date_time(stamp)
            .with_context(|| format!("session_{n}_date_time {stamp:?} is not a date"))?;
        for pair in turns.chunks(2) {
            let first = &pair[0];
            let second = pair.get(1);
            let text = utterance_text(first);
            if text.trim().is_empty() {
                continue;
            }
            out.push(Round {
                dia_ids: pair
                    .iter()
                    .filter_map(|t| t["dia_id"].as_str().map(String::from))
                    .collect(),
                input: TurnInput {
                    turn_id: Some(
                        pair.iter()
                            .filter_map(|t| t["dia_id"].as_str())
                            .collect::<Vec<_>>()
                            .join("+"),
                    ),
                    user: text,
                    assistant: second.map(utterance_text).filter(|s| !s.trim().is_empty()),
                    user_speaker: first["speaker"].as_str().map(String::from),
                    assistant_speaker: second.and_then(|t| t["speaker"].as_str()).map(String::from),
                    timestamp: ts,
                    metadata: Default::default(),
                    user_id: None,
                    agent_id: None,
                },
            });
        }
    }
    Ok(out)
}

#[derive(Serialize, Deserialize)]
struct Ranking {
    sample_id: String,
    qa_index: usize,
    ranked: Vec<Vec<String>>,
    /// Each result's fused score, in rank order (the reference tool ignores it; offline
    /// rescoring experiments read it).
    scores: Vec<f32>,
    /// Each result's score parts and sources, in rank order (offline fusion experiments).
    parts: Vec<ScoreParts>,
    sources: Vec<Vec<String>>,
}

#[derive(Default, Debug)]
struct Scores {
    /// category → metric → values
    by_cat: BTreeMap<u8, BTreeMap<String, Vec<f64>>>,
}

impl Scores {
    fn add(&mut self, cat: u8, ks: &[usize], ranked: &[Vec<String>], gold: &[String]) {
        let m = self.by_cat.entry(cat).or_default();
        for &k in ks {
            let top: HashSet<&String> = ranked.iter().take(k).flatten().collect();
            let covered = gold.iter().filter(|g| top.contains(g)).count();
            m.entry(format!("recall@{k}"))
                .or_default()
                .push(covered as f64 / gold.len() as f64);
            m.entry(format!("hit@{k}"))
                .or_default()
                .push(if covered > 0 { 1.0 } else { 0.0 });
            let first = ranked
                .iter()
                .take(k)
                .position(|ids| ids.iter().any(|d| gold.contains(d)));
            m.entry(format!("mrr@{k}"))
                .or_default()
                .push(first.map(|r| 1.0 / (r as f64 + 1.0)).unwrap_or(0.0));
        }
    }

    /// A question's round-level and session-level figures: what a run and a `--baseline` file
    /// are both scored by, so the two pair up.
    fn add_question(&mut self, q: &Question, ks: &[usize], ranked: &[Vec<String>]) {
        self.add(q.category, ks, ranked, &q.gold);
        self.add_sessions(q.category, ranked, &q.gold);
    }

    /// recall@k for every k from 1 to `kmax` (`curve@k`), for the recall@k plot.
    fn add_curve(&mut self, cat: u8, kmax: usize, ranked: &[Vec<String>], gold: &[String]) {
        let m = self.by_cat.entry(cat).or_default();
        let mut covered: HashSet<&String> = HashSet::new();
        for k in 1..=kmax {
            if let Some(ids) = ranked.get(k - 1) {
                covered.extend(ids.iter().filter(|d| gold.contains(d)));
            }
            m.entry(format!("curve@{k}"))
                .or_default()
                .push(covered.len() as f64 / gold.len() as f64);
        }
    }

    /// Session-level figures, as session-granularity systems report them: the ranking becomes
    /// the distinct sessions of its rounds in first-seen order (a LoCoMo dia id `D3:12` is in
    /// session `D3`), and the gold is the set of sessions holding the evidence. Relevance is
    /// binary, so NDCG@5 = DCG / ideal DCG with gains 1/log2(rank + 1).
    fn add_sessions(&mut self, cat: u8, ranked: &[Vec<String>], gold: &[String]) {
        let session = |d: &String| d.split(':').next().unwrap_or(d).to_string();
        let mut order: Vec<String> = Vec::new();
        for d in ranked.iter().flatten() {
            let s = session(d);
            if !order.contains(&s) {
                order.push(s);
            }
        }
        let gold: HashSet<String> = gold.iter().map(session).collect();
        let m = self.by_cat.entry(cat).or_default();
        for k in SESSION_KS {
            let covered = order.iter().take(k).filter(|s| gold.contains(*s)).count();
            m.entry(format!("s.recall@{k}"))
                .or_default()
                .push(covered as f64 / gold.len() as f64);
        }
        let hit1 = order.first().is_some_and(|s| gold.contains(s));
        m.entry("s.hit@1".into())
            .or_default()
            .push(if hit1 { 1.0 } else { 0.0 });
        let gain = |rank: usize| 1.0 / ((rank + 2) as f64).log2();
        let dcg: f64 = order
            .iter()
            .take(5)
            .enumerate()
            .filter(|(_, s)| gold.contains(*s))
            .map(|(r, _)| gain(r))
            .sum();
        let ideal: f64 = (0..gold.len().min(5)).map(gain).sum();
        m.entry("s.ndcg@5".into()).or_default().push(dcg / ideal);
    }

    fn table(&self, ks: &[usize]) -> String {
        let mut metrics = Vec::new();
        for m in ["hit", "mrr", "recall"] {
            for k in ks {
                metrics.push(format!("{m}@{k}"));
            }
        }
        self.table_of(&metrics)
    }

    fn session_table(&self) -> String {
        let mut metrics = vec!["s.hit@1".to_string()];
        metrics.extend(SESSION_KS.iter().map(|k| format!("s.recall@{k}")));
        metrics.push("s.ndcg@5".into());
        self.table_of(&metrics)
    }

    /// The mean of every metric per category, per categories 1-4 and over all.
    fn means(&self) -> BTreeMap<String, BTreeMap<String, f64>> {
        let mut out = BTreeMap::new();
        for (label, cats) in self.rows() {
            let mut row = BTreeMap::new();
            let names: HashSet<&String> = self.by_cat.values().flat_map(|m| m.keys()).collect();
            for name in names {
                let (mean, n) = self.mean(&cats, name);
                if n > 0 {
                    row.insert(name.clone(), mean);
                }
            }
            out.insert(label, row);
        }
        out
    }

    /// The mean of `metric` over the questions of `cats`, and how many there are (0.0 for none).
    fn mean(&self, cats: &[u8], metric: &str) -> (f64, usize) {
        let vals = self.values(cats, metric);
        if vals.is_empty() {
            return (0.0, 0);
        }
        (vals.iter().sum::<f64>() / vals.len() as f64, vals.len())
    }

    /// The per-question values of `metric` over `cats`, in a fixed order (category, then the
    /// order questions were asked), so two runs over the same questions pair up.
    fn values(&self, cats: &[u8], metric: &str) -> Vec<f64> {
        cats.iter()
            .filter_map(|c| self.by_cat.get(c))
            .flat_map(|x| x.get(metric).cloned().unwrap_or_default())
            .collect()
    }

    /// Each headline figure with its 95% interval over questions.
    fn intervals(&self, headline: &[Headline]) -> Vec<(String, bootstrap::Interval)> {
        headline
            .iter()
            .filter_map(|h| {
                bootstrap::interval(&self.values(h.cats, &h.metric)).map(|i| (h.label(), i))
            })
            .collect()
    }

    /// Each headline figure's difference from `other` on the same questions, 95% paired.
    fn differences(
        &self,
        other: &Scores,
        headline: &[Headline],
    ) -> Vec<(String, bootstrap::Interval)> {
        headline
            .iter()
            .filter_map(|h| {
                bootstrap::difference(
                    &self.values(h.cats, &h.metric),
                    &other.values(h.cats, &h.metric),
                )
                .map(|i| (h.label(), i))
            })
            .collect()
    }

    fn rows(&self) -> Vec<(String, Vec<u8>)> {
        let names = [
            (1, "multi-hop"),
            (2, "temporal"),
            (3, "open-domain"),
            (4, "single-hop"),
            (5, "adversarial"),
        ];
        let mut rows: Vec<(String, Vec<u8>)> = names
            .iter()
            .filter(|(c, _)| self.by_cat.contains_key(c))
            .map(|(c, n)| (format!("{c} {n}"), vec![*c]))
            .collect();
        rows.push(("1-4".into(), vec![1, 2, 3, 4]));
        rows.push(("all".into(), vec![1, 2, 3, 4, 5]));
        rows
    }

    fn table_of(&self, metrics: &[String]) -> String {
        let width = |m: &str| (m.len() + 2).max(10);
        let mut s = format!("{:<15}", "category");
        for m in metrics {
            s.push_str(&format!("{m:>w$}", w = width(m)));
        }
        s.push_str(&format!("{:>7}\n", "n"));
        for (label, cats) in self.rows() {
            s.push_str(&format!("{label:<15}"));
            let mut n = 0;
            for m in metrics {
                let (mean, count) = self.mean(&cats, m);
                n = count;
                s.push_str(&format!("{mean:>w$.3}", w = width(m)));
            }
            s.push_str(&format!("{n:>7}\n"));
        }
        s
    }
}

/// A figure the issue's targets name: a metric over a group of categories.
struct Headline {
    group: &'static str,
    cats: &'static [u8],
    metric: String,
}

impl Headline {
    /// recall@K for every K asked, hit and MRR at 30 (or the largest K), multi-hop recall at
    /// that K, session hit@1 and recall@10: what the README's targets are stated in.
    fn of(ks: &[usize]) -> Vec<Headline> {
        const ALL: &[u8] = &[1, 2, 3, 4, 5];
        let main = if ks.contains(&30) {
            30
        } else {
            ks.iter().copied().max().unwrap_or(30)
        };
        let all = |metric: String| Headline {
            group: "all",
            cats: ALL,
            metric,
        };
        let mut out = vec![
            all(format!("recall@{main}")),
            all(format!("hit@{main}")),
            all(format!("mrr@{main}")),
        ];
        out.extend(
            ks.iter()
                .filter(|k| **k != main)
                .map(|k| all(format!("recall@{k}"))),
        );
        out.push(Headline {
            group: "multi-hop",
            cats: &[1],
            metric: format!("recall@{main}"),
        });
        out.push(all("s.hit@1".into()));
        out.push(all("s.recall@10".into()));
        out
    }

    fn label(&self) -> String {
        format!("{} {}", self.group, self.metric)
    }
}

/// `label 0.942 [0.931, 0.952]` per figure; differences signed, `*` where the interval leaves
/// out zero.
fn interval_lines(figures: &[(String, bootstrap::Interval)], signed: bool) -> String {
    figures
        .iter()
        .map(|(label, i)| {
            if signed {
                let mark = if i.excludes_zero() { "*" } else { "" };
                format!(
                    "  {label:<22} {:+.3} [{:+.3}, {:+.3}]{mark}\n",
                    i.mean, i.low, i.high
                )
            } else {
                format!(
                    "  {label:<22} {:.3} [{:.3}, {:.3}]\n",
                    i.mean, i.low, i.high
                )
            }
        })
        .collect()
}

/// Each question's ranking in a file an earlier `--dump-rankings` wrote, read before the ingest
/// so a wrong file is refused before minutes of work.
type DumpedRankings = std::collections::HashMap<(String, usize), Vec<Vec<String>>>;

fn read_dump(path: &std::path::Path) -> anyhow::Result<DumpedRankings> {
    #[derive(Deserialize)]
    struct Dumped {
        sample_id: String,
        qa_index: usize,
        ranked: Vec<Vec<String>>,
    }
    let raw = std::fs::read(path).with_context(|| format!("--baseline {}", path.display()))?;
    let dumped: Vec<Dumped> = serde_json::from_slice(&raw).with_context(|| {
        format!(
            "--baseline {}: not a --dump-rankings file (a list of {{sample_id, qa_index, ranked}})",
            path.display()
        )
    })?;
    Ok(dumped
        .into_iter()
        .map(|d| ((d.sample_id, d.qa_index), d.ranked))
        .collect())
}

/// Scores dumped rankings over the same questions as the run (a question the file lacks counts
/// as an empty ranking, as in the reference tool).
fn scores_of_dump(
    name: &str,
    dumped: &DumpedRankings,
    questions: &[Question],
    ks: &[usize],
) -> anyhow::Result<Scores> {
    let matched = questions
        .iter()
        .any(|q| dumped.contains_key(&(q.sample.clone(), q.qa_index)));
    anyhow::ensure!(
        matched,
        "--baseline {name}: none of its rankings is for a question of this data set"
    );
    let mut scores = Scores::default();
    let empty = Vec::new();
    for q in questions {
        let ranked = dumped
            .get(&(q.sample.clone(), q.qa_index))
            .unwrap_or(&empty);
        scores.add_question(q, ks, ranked);
    }
    Ok(scores)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn apply_sets(cfg: RecallConfig, sets: &[String]) -> anyhow::Result<RecallConfig> {
    let mut v = serde_json::to_value(&cfg)?;
    for s in sets {
        let (k, val) = s
            .split_once('=')
            .with_context(|| format!("--set {s}: expected key=value"))?;
        let parsed: Value =
            serde_json::from_str(val).with_context(|| format!("--set {s}: value is not JSON"))?;
        // The cross-encoder is loaded once, at start, from the settings.
        if k == "rerank_model" || k == "rerank_model_dir" {
            bail!(
                "--set {k}: the cross-encoder is loaded at start; set RECOLLECT__RECALL__{} instead",
                k.to_uppercase()
            );
        }
        match v.get_mut(k) {
            Some(slot) => *slot = parsed,
            None => bail!("--set {k}: no such recall constant"),
        }
    }
    let cfg: RecallConfig = serde_json::from_value(v)?;
    cfg.validate().context("--set")?;
    Ok(cfg)
}

pub async fn run(mut settings: Settings, cmd: EvalCommand) -> anyhow::Result<()> {
    let EvalCommand::Locomo {
        data,
        k,
        dump_rankings,
        ablate,
        conversations,
        keep,
        set,
        json,
        baseline,
    } = cmd;
    let ks: Vec<usize> = k
        .split(',')
        .map(|x| x.trim().parse())
        .collect::<Result<_, _>>()
        .context("--k: numbers like 10,30")?;
    let kmax = *ks.iter().max().context("--k is empty")?;
    let baseline = baseline
        .map(|p| read_dump(&p).map(|d| (p.display().to_string(), d)))
        .transpose()?;
    let raw = std::fs::read(&data).with_context(|| {
        format!(
            "reading {} (LoCoMo data lives in ../shared/data; it is not part of the repo)",
            data.display()
        )
    })?;
    let samples: Vec<Value> =
        serde_json::from_slice(&raw).context("LoCoMo file is not a JSON list")?;
    let samples = &samples[..conversations.unwrap_or(samples.len()).min(samples.len())];

    let tmp;
    let dir = match keep {
        Some(d) => d,
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    settings.storage.data_dir = dir.clone();
    let app = App::open(settings.clone()).await?;
    let tenant = TenantId::default_tenant();

    // Ingest: every conversation its own memory space.
    let mut dia_of: BTreeMap<MemoryId, Vec<String>> = BTreeMap::new();
    let mut questions = Vec::new();
    let mut rounds_total = 0usize;
    // Each conversation's rounds, to wait for its fragments.
    let mut sizes: Vec<(String, u64)> = Vec::new();
    let known: HashSet<String> = app
        .graph
        .conversations(&tenant)
        .await?
        .into_iter()
        .collect();
    let started = Instant::now();
    let mut ingested = 0usize;
    for s in samples {
        let sample = s["sample_id"]
            .as_str()
            .context("sample without sample_id")?
            .to_string();
        let rounds = rounds_of(s)?;
        rounds_total += rounds.len();
        sizes.push((sample.clone(), rounds.len() as u64));
        let valid: HashSet<String> = rounds
            .iter()
            .flat_map(|r| r.dia_ids.iter().cloned())
            .collect();
        for r in &rounds {
            // Both forms: a store kept from before ids were grouped by conversation has the
            // hashed ones.
            let turn_id = r.input.turn_id.as_deref().unwrap_or("");
            for id in MemoryId::forms_of_turn(&tenant, &sample, turn_id) {
                dia_of.insert(id, r.dia_ids.clone());
            }
        }
        if !known.contains(&sample) {
            ingested += rounds.len();
            for chunk in rounds.chunks(200) {
                let turns = chunk.iter().map(|r| r.input.clone()).collect();
                app.gateway
                    .store(
                        &tenant,
                        &sample,
                        StoreRequest {
                            turns,
                            wait: Some(false),
                        },
                        "eval",
                    )
                    .await?;
            }
        }
        for (qi, qa) in s["qa"].as_array().into_iter().flatten().enumerate() {
            let gold: Vec<String> =
                clean_evidence(qa["evidence"].as_array().map(Vec::as_slice).unwrap_or(&[]))
                    .into_iter()
                    .filter(|g| valid.contains(g))
                    .collect();
            if gold.is_empty() {
                continue;
            }
            questions.push(Question {
                sample: sample.clone(),
                qa_index: qi,
                category: qa["category"].as_u64().unwrap_or(0) as u8,
                question: qa["question"].as_str().unwrap_or("").to_string(),
                gold,
            });
        }
    }
    app.wait_enriched().await?;
    // The fragments too: the consolidator runs behind the graph writer, and questions asked
    // before it caught up were scored without the last windows' fragments (how far behind
    // depended on its speed).
    let window = settings.consolidation.window.max(1) as u64;
    let deadline = Instant::now() + std::time::Duration::from_secs(600);
    for (conversation, rounds) in &sizes {
        let complete = rounds / window * window;
        loop {
            let state = app.graph.conversation_state(&tenant, conversation).await?;
            if state.consolidated_until >= complete {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "conversation {conversation}: consolidated up to round {} of {complete} after 10 minutes; see the consolidator's log",
                state.consolidated_until
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    let ingest_secs = started.elapsed().as_secs_f64();
    if ingested > 0 {
        println!(
            "ingested {ingested} rounds in {ingest_secs:.1}s ({:.1} turns/s end to end)",
            ingested as f64 / ingest_secs
        );
    } else {
        println!("reusing {rounds_total} rounds already in {}", dir.display());
    }

    let base_cfg = apply_sets(app.recall.config().clone(), &set)?;
    let embedder: Arc<dyn Embedder> = Arc::new(CachedEmbedder::new(app.embedder.clone()));
    let recall = Recall::new(
        app.graph.clone(),
        app.vectors.clone(),
        embedder,
        base_cfg.clone(),
        *app.recall.limits(),
    )
    .with_reranker(app.recall.reranker().cloned())
    .with_token_embedder(app.recall.token_embedder().cloned());
    // A component the configuration leaves off (Path C by default) is measured the other way
    // round: a run with it switched on.
    let run_of = |n: &str| -> anyhow::Result<(String, Ablation, RecallConfig)> {
        let ablation = Ablation::parse(n).with_context(|| {
            let names: Vec<&str> = Ablation::names().collect();
            format!("--ablate {n}: one of {names:?} or all")
        })?;
        if ablation.without(Component::PathC) && !base_cfg.path_c {
            let on = RecallConfig {
                path_c: true,
                ..base_cfg.clone()
            };
            return Ok((format!("with {n}"), Ablation::default(), on));
        }
        if ablation.without(Component::LateScan) && base_cfg.late_candidates == 0 {
            // As many as late interaction re-scores.
            let on = RecallConfig {
                late_candidates: base_cfg.late_depth,
                ..base_cfg.clone()
            };
            return Ok((format!("with {n}"), Ablation::default(), on));
        }
        Ok((format!("without {n}"), ablation, base_cfg.clone()))
    };
    let full = || ("full".to_string(), Ablation::default(), base_cfg.clone());
    let runs: Vec<(String, Ablation, RecallConfig)> = match ablate.as_deref() {
        None | Some("none") => vec![full()],
        Some("all") => std::iter::once(Ok(full()))
            .chain(Ablation::names().map(run_of))
            .collect::<anyhow::Result<_>>()?,
        Some(n) => vec![run_of(n)?],
    };
    println!(
        "configuration: embedder={} runtime={} extractor=rules k={kmax} conversations={} questions={} recall={}",
        app.embedder.model_name(),
        app.embedder.runtime(),
        samples.len(),
        questions.len(),
        serde_json::to_string(&base_cfg)?
    );
    let headline = Headline::of(&ks);
    let baseline = baseline
        .map(|(name, d)| scores_of_dump(&name, &d, &questions, &ks).map(|s| (name, s)))
        .transpose()?;
    let mut full_scores: Option<Scores> = None;
    let mut report = serde_json::Map::new();
    for (label, ablation, cfg) in runs {
        let recall = recall.with_config(cfg);
        let mut scores = Scores::default();
        let mut latencies = Vec::with_capacity(questions.len());
        let mut rankings = Vec::new();
        let bar = crate::progress::bar(questions.len() as u64, &format!("recall ({label})"));
        let totals0 = crate::bench::RecallTotals::now();
        for q in &questions {
            bar.inc(1);
            let req = RecallRequest {
                query: q.question.clone(),
                conversation_ids: Some(vec![q.sample.clone()]),
                k: Some(kmax as i64),
                ..Default::default()
            };
            let t = Instant::now();
            let mems = recall.recall_with(&tenant, &req, &ablation).await?;
            latencies.push(t.elapsed().as_secs_f64() * 1000.0);
            let ranked: Vec<Vec<String>> = mems
                .iter()
                .map(|m| dia_of.get(&m.memory_id).cloned().unwrap_or_default())
                .collect();
            scores.add_question(q, &ks, &ranked);
            scores.add_curve(q.category, kmax, &ranked, &q.gold);
            rankings.push(Ranking {
                sample_id: q.sample.clone(),
                qa_index: q.qa_index,
                ranked,
                scores: mems.iter().map(|m| m.score).collect(),
                parts: mems.iter().map(|m| m.score_parts.clone()).collect(),
                sources: mems.iter().map(|m| m.sources.clone()).collect(),
            });
        }
        bar.finish_and_clear();
        latencies.sort_by(f64::total_cmp);
        println!("\n== {label} ==");
        print!("{}", scores.table(&ks));
        println!("sessions (distinct sessions of the ranking in first-seen order):");
        print!("{}", scores.session_table());
        let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
        println!(
            "recall latency: p50 {p50:.1} ms, p99 {p99:.1} ms over {} queries",
            latencies.len()
        );
        println!(
            "{}",
            crate::bench::RecallTotals::now().means_since(&totals0)
        );
        let intervals = scores.intervals(&headline);
        print!(
            "95% intervals (bootstrap over questions, {} resamples):\n{}",
            bootstrap::RESAMPLES,
            interval_lines(&intervals, false)
        );
        let mut against = serde_json::Map::new();
        let mut compare = |name: &str, other: &Scores| {
            let d = scores.differences(other, &headline);
            print!(
                "against {name}, paired (95%; * the interval leaves out 0):\n{}",
                interval_lines(&d, true)
            );
            against.insert(name.to_string(), serde_json::json!(d));
        };
        if let Some(full) = &full_scores {
            compare("full", full);
        }
        if let Some((name, base)) = &baseline {
            compare(name, base);
        }
        report.insert(
            label.clone(),
            serde_json::json!({
                "metrics": scores.means(),
                "intervals_95": intervals,
                "differences_95": against,
                "latency_ms": {"p50": p50, "p99": p99, "queries": latencies.len()},
            }),
        );
        if let Some(path) = &dump_rankings {
            if label == "full" || ablate.as_deref() != Some("all") {
                std::fs::write(path, serde_json::to_vec(&rankings)?)?;
                println!("rankings written to {}", path.display());
            }
        }
        if label == "full" {
            full_scores = Some(scores);
        }
    }
    if let Some(path) = &json {
        let doc = serde_json::json!({
            "embedder": app.embedder.model_name(),
            "embedder_runtime": app.embedder.runtime(),
            "conversations": samples.len(),
            "questions": questions.len(),
            "k": ks,
            "recall_config": base_cfg,
            "runs": report,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("figures written to {}", path.display());
    }
    app.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_overrides_recall_constants_but_not_the_cross_encoder() {
        let base = RecallConfig::default();
        let cfg = apply_sets(base.clone(), &["rerank_depth=40".into()]).unwrap();
        assert_eq!(cfg.rerank_depth, 40);
        let e = apply_sets(base.clone(), &["rerank_model=\"x\"".into()]).unwrap_err();
        assert!(
            e.to_string().contains("RECOLLECT__RECALL__RERANK_MODEL"),
            "{e}"
        );
        let e = apply_sets(base.clone(), &["rerank_model_dir=\"/x\"".into()]).unwrap_err();
        assert!(
            e.to_string()
                .contains("RECOLLECT__RECALL__RERANK_MODEL_DIR"),
            "{e}"
        );
        let cfg = apply_sets(base.clone(), &["rerank_gap=0.2".into()]).unwrap();
        assert_eq!(cfg.rerank_gap, 0.2);
        assert!(apply_sets(base, &["rerank_depth=0".into()]).is_err());
    }

    #[test]
    fn evidence_is_cleaned_like_the_reference_tool() {
        let raw: Vec<Value> = ["D8:6; D9:17", "D:11:26", "D30:05", "D", "D1:3"]
            .iter()
            .map(|s| Value::from(*s))
            .collect();
        assert_eq!(
            clean_evidence(&raw),
            vec!["D8:6", "D9:17", "D11:26", "D30:5", "D1:3"]
        );
    }

    #[test]
    fn metrics_follow_the_definitions() {
        let mut s = Scores::default();
        let ranked = vec![
            vec!["D1:1".to_string(), "D1:2".to_string()],
            vec!["D2:1".to_string()],
        ];
        s.add(
            1,
            &[1, 2],
            &ranked,
            &["D2:1".to_string(), "D9:9".to_string()],
        );
        let m = &s.by_cat[&1];
        assert_eq!(m["recall@1"], vec![0.0]);
        assert_eq!(m["recall@2"], vec![0.5]);
        assert_eq!(m["hit@2"], vec![1.0]);
        assert_eq!(m["mrr@2"], vec![0.5]);
        assert_eq!(m["mrr@1"], vec![0.0]);
    }

    #[test]
    fn session_metrics_rank_distinct_sessions_in_first_seen_order() {
        let mut s = Scores::default();
        let d = |x: &str| x.to_string();
        // Rounds from sessions D1, D1, D3, D2: the session ranking is D1, D3, D2.
        let ranked = vec![
            vec![d("D1:1"), d("D1:2")],
            vec![d("D1:5")],
            vec![d("D3:4")],
            vec![d("D2:7")],
        ];
        // Evidence in D2 and D3 (two rounds of D3 count once).
        s.add_sessions(1, &ranked, &[d("D3:1"), d("D3:9"), d("D2:7")]);
        let m = &s.by_cat[&1];
        assert_eq!(m["s.hit@1"], vec![0.0]);
        assert_eq!(m["s.recall@1"], vec![0.0]);
        assert_eq!(m["s.recall@5"], vec![1.0]);
        // DCG = 1/log2(3) + 1/log2(4); ideal = 1 + 1/log2(3).
        let want = (1.0 / 3f64.log2() + 0.5) / (1.0 + 1.0 / 3f64.log2());
        assert!((m["s.ndcg@5"][0] - want).abs() < 1e-12);
        let means = s.means();
        assert_eq!(means["all"]["s.recall@10"], 1.0);
    }

    fn question(sample: &str, qa_index: usize, category: u8, gold: &[&str]) -> Question {
        Question {
            sample: sample.into(),
            qa_index,
            category,
            question: String::new(),
            gold: gold.iter().map(|g| g.to_string()).collect(),
        }
    }

    #[test]
    fn a_baseline_file_scores_like_the_run_that_wrote_it_and_bad_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let qs = vec![
            question("conv-1", 0, 1, &["D1:1"]),
            question("conv-1", 2, 4, &["D2:3"]),
            question("conv-2", 0, 1, &["D1:4"]),
        ];
        let ranked = |ids: &[&str]| -> Vec<Vec<String>> {
            ids.iter().map(|d| vec![d.to_string()]).collect()
        };
        let runs = [ranked(&["D1:1", "D1:2"]), ranked(&["D1:2", "D2:3"])];
        // The run itself, as `run` scores it; conv-2's question is missing from the file.
        let mut direct = Scores::default();
        for (q, r) in qs
            .iter()
            .zip(runs.iter().chain(std::iter::once(&Vec::new())))
        {
            direct.add_question(q, &[1, 30], r);
        }
        let dumped: Vec<Value> = qs
            .iter()
            .zip(&runs)
            .map(|(q, r)| {
                serde_json::json!({"sample_id": q.sample, "qa_index": q.qa_index, "ranked": r})
            })
            .collect();
        let path = dir.path().join("base.json");
        std::fs::write(&path, serde_json::to_vec(&dumped).unwrap()).unwrap();
        let scored = scores_of_dump("base", &read_dump(&path).unwrap(), &qs, &[1, 30]).unwrap();
        assert_eq!(scored.by_cat, direct.by_cat);
        let headline = Headline::of(&[1, 30]);
        let d = scored.differences(&direct, &headline);
        assert!(d.iter().any(|(l, _)| l == "multi-hop recall@30"));
        assert!(d.iter().all(|(_, i)| i.mean == 0.0 && !i.excludes_zero()));
        // multi-hop recall@30 over its two questions: one found, one missing.
        let iv = scored.intervals(&headline);
        let mh = iv
            .iter()
            .find(|(l, _)| l == "multi-hop recall@30")
            .unwrap()
            .1;
        assert_eq!(mh.mean, 0.5);

        std::fs::write(&path, b"{\"not\": \"a list\"}").unwrap();
        let e = read_dump(&path).unwrap_err();
        assert!(
            format!("{e:#}").contains("not a --dump-rankings file"),
            "{e:#}"
        );
        std::fs::write(
            &path,
            br#"[{"sample_id": "other", "qa_index": 0, "ranked": []}]"#,
        )
        .unwrap();
        let e = scores_of_dump("base", &read_dump(&path).unwrap(), &qs, &[30]).unwrap_err();
        assert!(format!("{e:#}").contains("none of its rankings"), "{e:#}");
    }
}
