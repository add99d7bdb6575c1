//! The command-line tools: against the data directory directly, or a running server (`--server`).

use std::io::BufRead;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use recollect_config::Settings;
use recollect_gateway::StoreRequest;
use recollect_model::{TenantId, TurnInput};
use recollect_recall::RecallRequest;
use serde::Deserialize;

use crate::app::App;

#[derive(Args)]
pub struct IngestArgs {
    /// JSONL file of turns.
    pub file: PathBuf,
    /// A running server to send to, e.g. http://127.0.0.1:8080 (default: the data dir directly).
    #[arg(long)]
    pub server: Option<String>,
    #[arg(long, env = "RECOLLECT_API_KEY")]
    pub api_key: Option<String>,
}

#[derive(Args)]
pub struct RecallArgs {
    pub query: String,
    /// Limit to these conversations (repeatable).
    #[arg(long = "conversation")]
    pub conversations: Vec<String>,
    /// Only turns of this end user (repeatable: any of them).
    #[arg(long = "user")]
    pub users: Vec<String>,
    /// Only turns of this agent (repeatable).
    #[arg(long = "agent")]
    pub agents: Vec<String>,
    /// Only turns at or after this RFC 3339 time.
    #[arg(long)]
    pub from: Option<chrono::DateTime<chrono::Utc>>,
    /// Only turns before this RFC 3339 time.
    #[arg(long)]
    pub to: Option<chrono::DateTime<chrono::Utc>>,
    /// Only turns where this speaker spoke (repeatable).
    #[arg(long = "speaker")]
    pub speakers: Vec<String>,
    /// Only turns whose metadata has KEY equal to VALUE (a JSON number, true/false, or text).
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = meta_pair)]
    pub metadata: Vec<(String, serde_json::Value)>,
    /// Recall what was held at this RFC 3339 time (before later edits).
    #[arg(long)]
    pub as_of: Option<chrono::DateTime<chrono::Utc>>,
    #[arg(long, default_value_t = 10)]
    pub k: i64,
    #[arg(long)]
    pub server: Option<String>,
    #[arg(long, env = "RECOLLECT_API_KEY")]
    pub api_key: Option<String>,
    /// Print the raw JSON response.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct DeleteArgs {
    /// The conversation to erase (with --memory: the memory id of one turn).
    pub conversation: String,
    /// Erase one memory (turn) by its id instead of a whole conversation.
    #[arg(long)]
    pub memory: bool,
    #[arg(long)]
    pub server: Option<String>,
    #[arg(long, env = "RECOLLECT_API_KEY")]
    pub api_key: Option<String>,
}

#[derive(Args)]
pub struct EditArgs {
    /// The memory id of the turn to edit.
    pub memory: String,
    /// The corrected user text.
    #[arg(long)]
    pub user: Option<String>,
    /// The corrected assistant text ("" removes it).
    #[arg(long)]
    pub assistant: Option<String>,
    /// The turn's new metadata, a JSON object (replaces the old one).
    #[arg(long, value_parser = json_object)]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    #[arg(long)]
    pub server: Option<String>,
    #[arg(long, env = "RECOLLECT_API_KEY")]
    pub api_key: Option<String>,
}

#[derive(Args)]
pub struct ReindexArgs {
    /// A running server to reindex (recall goes on meanwhile); default: the data dir directly.
    #[arg(long)]
    pub server: Option<String>,
    #[arg(long, env = "RECOLLECT_API_KEY")]
    pub api_key: Option<String>,
}

#[derive(Args)]
pub struct BackupArgs {
    /// Where to write the copy: an absolute path, absent or an empty directory (with --server:
    /// on the server's machine).
    #[arg(long)]
    pub to: PathBuf,
    /// A running server to back up while it serves; default: the data dir directly.
    #[arg(long)]
    pub server: Option<String>,
    /// The server's `server.admin_key`.
    #[arg(long, env = "RECOLLECT_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: Option<String>,
}

#[derive(Args)]
pub struct RestoreArgs {
    /// A directory `recollect backup` wrote; copied into the data dir, which must be absent or
    /// empty. The first start then finishes whatever the backup caught half-way.
    pub from: PathBuf,
}

#[derive(Args)]
pub struct HistoryArgs {
    /// The memory id.
    pub memory: String,
    #[arg(long)]
    pub server: Option<String>,
    #[arg(long, env = "RECOLLECT_API_KEY")]
    pub api_key: Option<String>,
}

fn json_object(s: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str(s) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        _ => Err("a JSON object, e.g. '{\"source\": \"crm\"}'".into()),
    }
}

/// One JSONL line: a turn plus its conversation.
#[derive(Deserialize)]
struct Line {
    conversation_id: String,
    #[serde(flatten)]
    turn: TurnInput,
}

pub(crate) fn client(api_key: &Option<String>) -> anyhow::Result<reqwest::Client> {
    let mut h = reqwest::header::HeaderMap::new();
    if let Some(k) = api_key {
        h.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {k}").parse()?,
        );
    }
    Ok(reqwest::Client::builder().default_headers(h).build()?)
}

pub(crate) async fn check(resp: reqwest::Response) -> anyhow::Result<serde_json::Value> {
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.unwrap_or(serde_json::Value::Null);
    if !status.is_success() {
        bail!("server answered {status}: {body}");
    }
    Ok(body)
}

pub async fn ingest(settings: Settings, a: IngestArgs) -> anyhow::Result<()> {
    let f =
        std::fs::File::open(&a.file).with_context(|| format!("opening {}", a.file.display()))?;
    let mut batches: Vec<(String, Vec<TurnInput>)> = Vec::new();
    for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: not a turn", a.file.display(), n + 1))?;
        match batches.last_mut() {
            Some((c, v)) if *c == l.conversation_id && v.len() < 256 => v.push(l.turn),
            _ => batches.push((l.conversation_id, vec![l.turn])),
        }
    }
    store_batches(settings, &a.server, &a.api_key, batches).await
}

/// Stores batches of turns (conversation, turns) through a running server or the data dir, with
/// a progress bar; in the data dir, waits until every turn is enriched.
pub(crate) async fn store_batches(
    settings: Settings,
    server: &Option<String>,
    api_key: &Option<String>,
    batches: Vec<(String, Vec<TurnInput>)>,
) -> anyhow::Result<()> {
    let total: usize = batches.iter().map(|b| b.1.len()).sum();
    let bar = crate::progress::bar(total as u64, "turns");
    let started = std::time::Instant::now();
    match server {
        Some(url) => {
            let c = client(api_key)?;
            for (conv, turns) in batches {
                let n = turns.len() as u64;
                let req = StoreRequest {
                    turns,
                    wait: Some(false),
                };
                check(
                    c.post(format!("{url}/v1/conversations/{conv}/turns"))
                        .json(&req)
                        .send()
                        .await?,
                )
                .await?;
                bar.inc(n);
            }
        }
        None => {
            let app = App::open(settings).await?;
            let tenant = TenantId::default_tenant();
            for (conv, turns) in batches {
                let n = turns.len() as u64;
                app.gateway
                    .store(
                        &tenant,
                        &conv,
                        StoreRequest {
                            turns,
                            wait: Some(false),
                        },
                        "cli",
                    )
                    .await?;
                bar.inc(n);
            }
            bar.set_message("enriching");
            app.wait_enriched().await?;
            app.shutdown().await;
        }
    }
    bar.finish();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "stored {total} turns in {secs:.1}s ({:.0} turns/s)",
        total as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// `--meta key=value`: JSON scalars as themselves, anything else as text.
fn meta_pair(s: &str) -> Result<(String, serde_json::Value), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    let v = match serde_json::from_str::<serde_json::Value>(v) {
        Ok(j @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => j,
        _ => serde_json::Value::String(v.to_string()),
    };
    Ok((k.to_string(), v))
}

fn some_if_any<T: Clone>(v: &[T]) -> Option<Vec<T>> {
    (!v.is_empty()).then(|| v.to_vec())
}

pub async fn recall(settings: Settings, a: RecallArgs) -> anyhow::Result<()> {
    let req = RecallRequest {
        query: a.query.clone(),
        conversation_ids: some_if_any(&a.conversations),
        k: Some(a.k),
        user_ids: some_if_any(&a.users),
        agent_ids: some_if_any(&a.agents),
        speakers: some_if_any(&a.speakers),
        from: a.from,
        to: a.to,
        metadata: (!a.metadata.is_empty()).then(|| a.metadata.iter().cloned().collect()),
        as_of: a.as_of,
        ..Default::default()
    };
    let body = match &a.server {
        Some(url) => {
            check(
                client(&a.api_key)?
                    .post(format!("{url}/v1/recall"))
                    .json(&req)
                    .send()
                    .await?,
            )
            .await?
        }
        None => {
            let app = App::open(settings).await?;
            let m = app.recall.recall(&TenantId::default_tenant(), &req).await?;
            app.shutdown().await;
            serde_json::json!({ "memories": m })
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(());
    }
    let empty = vec![];
    let memories = body["memories"].as_array().unwrap_or(&empty);
    if memories.is_empty() {
        println!("no memories");
    }
    for (i, m) in memories.iter().enumerate() {
        let sources: Vec<&str> = m["sources"]
            .as_array()
            .map(|s| s.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        println!(
            "{:>2}. [{:.3}] {} {} ({})",
            i + 1,
            m["score"].as_f64().unwrap_or(0.0),
            m["conversation_id"].as_str().unwrap_or(""),
            m["timestamp"].as_str().unwrap_or(""),
            sources.join(",")
        );
        for (sp, f) in [("user_speaker", "user"), ("assistant_speaker", "assistant")] {
            let text = m[f].as_str().unwrap_or("");
            if !text.is_empty() {
                println!("    {}: {}", m[sp].as_str().unwrap_or(f), text);
            }
        }
    }
    Ok(())
}

pub async fn delete(settings: Settings, a: DeleteArgs) -> anyhow::Result<()> {
    if a.memory {
        return delete_memory(settings, a).await;
    }
    match &a.server {
        Some(url) => {
            let b = check(
                client(&a.api_key)?
                    .delete(format!("{url}/v1/conversations/{}", a.conversation))
                    .send()
                    .await?,
            )
            .await?;
            println!("{b}");
        }
        None => {
            let app = App::open(settings).await?;
            let r = app
                .eraser
                .erase_conversation(&TenantId::default_tenant(), &a.conversation)
                .await?;
            app.shutdown().await;
            match r {
                Some(n) => println!("erased conversation {} ({n} turns)", a.conversation),
                None => bail!("conversation {:?} not found", a.conversation),
            }
        }
    }
    Ok(())
}

/// `recollect delete --memory ID`: one turn, from every store.
async fn delete_memory(settings: Settings, a: DeleteArgs) -> anyhow::Result<()> {
    let id = &a.conversation;
    match &a.server {
        Some(url) => {
            let b = check(
                client(&a.api_key)?
                    .delete(format!("{url}/v1/memories/{id}"))
                    .send()
                    .await?,
            )
            .await?;
            println!("{b}");
        }
        None => {
            let app = App::open(settings).await?;
            let r = recollect_gateway::delete_memory(
                app.eraser.as_ref(),
                &TenantId::default_tenant(),
                id,
            )
            .await;
            app.shutdown().await;
            let r = r?;
            println!(
                "erased memory {id} (turn {} of conversation {})",
                r.turn_id, r.conversation_id
            );
        }
    }
    Ok(())
}

/// `recollect edit ID`: a new version of one memory (the old one kept in its history), printed
/// as JSON once recallable.
pub async fn edit(settings: Settings, a: EditArgs) -> anyhow::Result<()> {
    let patch = recollect_model::TurnPatch {
        user: a.user,
        assistant: a.assistant,
        metadata: a.metadata,
        wait: Some(true),
    };
    let turn = match &a.server {
        Some(url) => {
            check(
                client(&a.api_key)?
                    .patch(format!("{url}/v1/memories/{}", a.memory))
                    .json(&patch)
                    .send()
                    .await?,
            )
            .await?
        }
        None => {
            let app = App::open(settings).await?;
            let r = app
                .gateway
                .edit(&TenantId::default_tenant(), &a.memory, patch, "cli")
                .await;
            app.shutdown().await;
            serde_json::to_value(r?)?
        }
    };
    println!("{}", serde_json::to_string_pretty(&turn)?);
    Ok(())
}

/// `recollect history ID`: every version of one memory, oldest first, as JSON.
pub async fn history(settings: Settings, a: HistoryArgs) -> anyhow::Result<()> {
    let body = match &a.server {
        Some(url) => {
            check(
                client(&a.api_key)?
                    .get(format!("{url}/v1/memories/{}/history", a.memory))
                    .send()
                    .await?,
            )
            .await?
        }
        None => {
            let Some(id) = recollect_model::MemoryId::parse(&a.memory) else {
                bail!("{:?} is not a memory id", a.memory);
            };
            let raw =
                recollect_storage::RawStore::open(&settings.storage.data_dir.join("raw.redb"))?;
            let versions = raw.versions(&TenantId::default_tenant(), id)?;
            if versions.is_empty() {
                bail!("memory {} not found", a.memory);
            }
            serde_json::json!({"memory_id": id, "versions": versions})
        }
    };
    println!("{}", serde_json::to_string_pretty(&body)?);
    Ok(())
}

/// `recollect reindex`: every turn of the tenant (on a data dir: of every tenant) derived again, with a progress bar while the
/// workers go through them. Killed part-way (data dir or embedded server), the rest is done at
/// the next start.
pub async fn reindex(settings: Settings, a: ReindexArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    match &a.server {
        Some(url) => {
            let c = client(&a.api_key)?;
            let r = check(c.post(format!("{url}/v1/reindex")).send().await?).await?;
            let total = r["turns"].as_u64().unwrap_or(0);
            eprintln!(
                "reindexing {total} turns of {} conversations; recall goes on meanwhile",
                r["conversations"]
            );
            // Progress from the conversations' pending counts (a distributed deployment's
            // gateway cannot see the workers' progress: there the bar ends at once).
            let mut convs: Vec<String> = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let mut path = format!("{url}/v1/conversations?limit=500");
                if let Some(cur) = &cursor {
                    path.push_str(&format!("&cursor={cur}"));
                }
                let page = check(c.get(path).send().await?).await?;
                for v in page["conversations"].as_array().into_iter().flatten() {
                    convs.extend(v.as_str().map(String::from));
                }
                cursor = page["next_cursor"].as_str().map(String::from);
                if cursor.is_none() {
                    break;
                }
            }
            let bar = crate::progress::bar(total, "reindex");
            loop {
                let mut pending = 0;
                for conv in &convs {
                    let info = check(
                        c.get(format!("{url}/v1/conversations/{conv}"))
                            .send()
                            .await?,
                    )
                    .await?;
                    pending += info["pending"].as_u64().unwrap_or(0);
                }
                bar.set_position(total.saturating_sub(pending));
                if pending == 0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            bar.finish_and_clear();
        }
        None => {
            // On a data dir: every tenant in it.
            let app = App::open(settings).await?;
            let mut turns = 0;
            for tenant in app.raw.tenants()? {
                turns += app.gateway.reindex(&tenant, "cli").await?.turns;
            }
            let bar = crate::progress::bar(turns, "reindex");
            loop {
                let raw = app.raw.clone();
                let pending = tokio::task::spawn_blocking(move || raw.pending_count()).await??;
                bar.set_position(turns.saturating_sub(pending));
                if pending == 0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            bar.finish_and_clear();
            app.shutdown().await;
        }
    }
    println!("reindexed in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// `recollect backup --to DIR`: a consistent copy of the data directory, from a running server
/// (`--server`, with the admin key) or from the data dir itself.
pub async fn backup(settings: Settings, a: BackupArgs) -> anyhow::Result<()> {
    let to = if a.to.is_absolute() {
        a.to.clone()
    } else {
        std::env::current_dir()?.join(&a.to)
    };
    let done = match &a.server {
        Some(url) => {
            let r = reqwest::Client::new()
                .post(format!("{url}/v1/admin/backup"))
                .bearer_auth(a.admin_key.clone().unwrap_or_default())
                .json(&serde_json::json!({"path": to}))
                .send()
                .await?;
            check(r).await?
        }
        None => {
            let app = App::open(settings).await?;
            let r = recollect_gateway::Backup::backup(app.backup.as_ref(), &to).await;
            app.shutdown().await;
            serde_json::to_value(r?)?
        }
    };
    println!("{}", serde_json::to_string_pretty(&done)?);
    Ok(())
}

/// `recollect restore DIR`: a backup becomes the data dir (absent or empty: nothing is
/// overwritten).
pub async fn restore(settings: Settings, a: RestoreArgs) -> anyhow::Result<()> {
    let dir = &settings.storage.data_dir;
    if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
        bail!(
            "data dir {} is not empty: restore into a new one (--data-dir), nothing was changed",
            dir.display()
        );
    }
    if !a.from.join("raw.redb").is_file() {
        bail!(
            "{} holds no raw.redb: not a recollect backup",
            a.from.display()
        );
    }
    recollect_storage::copy_dir(&a.from, dir)?;
    // Opened once here so a damaged copy is reported now, not at the next start.
    let raw = recollect_storage::RawStore::open(&dir.join("raw.redb"))?;
    println!(
        "restored {} turns into {}; start the server on it",
        raw.count()?,
        dir.display()
    );
    Ok(())
}
