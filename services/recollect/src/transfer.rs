//! `recollect export` and `recollect import`: a tenant's turns out as JSONL and back in, and
//! conversations from other tools in (ChatGPT's export, ShareGPT, LoCoMo, LongMemEval). Every
//! imported turn gets a deterministic `turn_id`, so importing a file twice stores nothing new;
//! a whole file is parsed and checked before anything is stored.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use chrono::{DateTime, TimeZone, Utc};
use clap::{Args, ValueEnum};
use recollect_config::Settings;
use recollect_model::{request, TenantId, TurnInput};
use serde_json::{Map, Value};

use crate::app::App;
use crate::cli::{client, store_batches};

#[derive(Args)]
pub struct ExportArgs {
    /// Only these conversations (repeatable; default: every conversation of the tenant).
    #[arg(long = "conversation")]
    pub conversations: Vec<String>,
    /// Only this end user's turns (data dir) or conversations (--server: the listing by user).
    #[arg(long)]
    pub user: Option<String>,
    /// Write here instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A running server to read from, e.g. http://127.0.0.1:8080 (default: the data dir directly).
    #[arg(long)]
    pub server: Option<String>,
    #[arg(long, env = "RECOLLECT_API_KEY")]
    pub api_key: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Told apart by the content.
    Auto,
    /// `recollect export` lines (also what `recollect ingest` reads).
    Recollect,
    /// OpenAI ChatGPT data export, `conversations.json`.
    Chatgpt,
    /// ShareGPT: `[{"id", "conversations": [{"from", "value"}]}]`.
    Sharegpt,
    /// LoCoMo samples (`conversation` with `session_N` and `session_N_date_time`).
    Locomo,
    /// LongMemEval instances (`haystack_sessions`, `haystack_session_ids`, `haystack_dates`).
    Longmemeval,
}

#[derive(Args)]
pub struct ImportArgs {
    pub file: PathBuf,
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    pub format: Format,
    /// Put before every conversation id (e.g. "chatgpt-").
    #[arg(long, default_value = "")]
    pub conversation_prefix: String,
    /// A running server to send to (default: the data dir directly).
    #[arg(long)]
    pub server: Option<String>,
    #[arg(long, env = "RECOLLECT_API_KEY")]
    pub api_key: Option<String>,
}

/// Fields of an exported line that the server derives: dropped on import.
const DERIVED: [&str; 12] = [
    "format",
    "conversation_id",
    "memory_id",
    "tenant",
    "position",
    "recorded_at",
    "extraction",
    "fragments",
    "version",
    "first_recorded_at",
    "expired_at",
    "history",
];

/// One exported line: the turn as stored (its current version), tagged with the format; an
/// edited turn carries its earlier versions, oldest first, under `history`.
fn export_line(mut turn: Map<String, Value>, history: Vec<Value>) -> Value {
    for k in ["tenant", "extraction", "fragments"] {
        turn.remove(k);
    }
    let mut line = Map::new();
    line.insert("format".into(), Value::String("recollect.v1".into()));
    line.extend(turn);
    if !history.is_empty() {
        let history = history
            .into_iter()
            .map(|mut v| {
                if let Some(o) = v.as_object_mut() {
                    for k in ["tenant", "extraction", "fragments"] {
                        o.remove(k);
                    }
                }
                v
            })
            .collect();
        line.insert("history".into(), Value::Array(history));
    }
    Value::Object(line)
}

/// The edits a line's versions make, in order: after its first version is stored, each later
/// version (the line itself last) is applied as an edit.
#[derive(Debug, Clone)]
pub struct VersionEdits {
    pub conversation: String,
    /// The first version as stored again (a no-op that answers with the memory id).
    pub first: TurnInput,
    pub edits: Vec<recollect_model::TurnPatch>,
}

/// The text fields a version sets, as an edit.
fn as_patch(v: &Map<String, Value>) -> recollect_model::TurnPatch {
    recollect_model::TurnPatch {
        user: v.get("user").and_then(Value::as_str).map(String::from),
        assistant: Some(
            v.get("assistant")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        ),
        metadata: Some(
            v.get("metadata")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
        ),
        wait: Some(false),
    }
}

pub async fn export(settings: Settings, a: ExportArgs) -> anyhow::Result<()> {
    let mut out: Box<dyn Write> = match &a.out {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout())),
    };
    let bar = crate::progress::bar(0, "export");
    let mut n = 0u64;
    match &a.server {
        Some(url) => {
            let c = client(&a.api_key)?;
            let get = |path: String| {
                let c = c.clone();
                async move {
                    let r = c.get(path).send().await?;
                    crate::cli::check(r).await
                }
            };
            let mut convs = a.conversations.clone();
            if convs.is_empty() {
                let mut cursor: Option<String> = None;
                loop {
                    let mut path = format!("{url}/v1/conversations?limit=500");
                    if let Some(u) = &a.user {
                        path.push_str(&format!("&user_id={u}"));
                    }
                    if let Some(cur) = &cursor {
                        path.push_str(&format!("&cursor={cur}"));
                    }
                    let page = get(path).await?;
                    for c in page["conversations"].as_array().into_iter().flatten() {
                        convs.extend(c.as_str().map(String::from));
                    }
                    cursor = page["next_cursor"].as_str().map(String::from);
                    if cursor.is_none() {
                        break;
                    }
                }
            }
            for conv in convs {
                let mut cursor: Option<String> = None;
                loop {
                    let mut path = format!("{url}/v1/conversations/{conv}/turns?limit=500");
                    if let Some(cur) = &cursor {
                        path.push_str(&format!("&cursor={cur}"));
                    }
                    let page = get(path).await?;
                    for t in page["turns"].as_array().into_iter().flatten() {
                        let Value::Object(m) = t.clone() else {
                            bail!("the server answered a turn that is not an object: {t}");
                        };
                        let mut history = Vec::new();
                        if m.get("version").and_then(Value::as_u64).unwrap_or(1) > 1 {
                            let id = m
                                .get("memory_id")
                                .and_then(Value::as_str)
                                .unwrap_or_default();
                            let h = get(format!("{url}/v1/memories/{id}/history")).await?;
                            history = h["versions"].as_array().cloned().unwrap_or_default();
                            history.pop();
                        }
                        serde_json::to_writer(&mut out, &export_line(m, history))?;
                        out.write_all(b"\n")?;
                        n += 1;
                        bar.inc(1);
                    }
                    cursor = page["next_cursor"].as_str().map(String::from);
                    if cursor.is_none() {
                        break;
                    }
                }
            }
        }
        None => {
            let app = App::open(settings).await?;
            let tenant = TenantId::default_tenant();
            let raw = app.raw.clone();
            let mut convs = a.conversations.clone();
            if convs.is_empty() {
                convs = match &a.user {
                    // The participant index lives in the graph.
                    Some(u) => {
                        app.graph
                            .conversations_of(&tenant, std::slice::from_ref(u), &[])
                            .await?
                    }
                    None => raw.conversations(&tenant)?,
                };
                convs.sort();
            }
            let user = a.user.clone();
            for conv in convs {
                let turns = raw.conversation_turns(&tenant, &conv)?;
                if turns.is_empty() && !a.conversations.is_empty() {
                    bail!("conversation {conv:?} not found");
                }
                for t in turns {
                    if user.is_some() && t.user_id != user {
                        continue;
                    }
                    let mut history = Vec::new();
                    if t.is_edit() {
                        let mut versions = raw.versions(&tenant, t.memory_id)?;
                        versions.pop();
                        for v in versions {
                            history.push(serde_json::to_value(v)?);
                        }
                    }
                    let Value::Object(m) = serde_json::to_value(&t)? else {
                        unreachable!("a turn serialises to an object");
                    };
                    serde_json::to_writer(&mut out, &export_line(m, history))?;
                    out.write_all(b"\n")?;
                    n += 1;
                    bar.inc(1);
                }
            }
            app.shutdown().await;
        }
    }
    out.flush()?;
    bar.finish_and_clear();
    eprintln!("exported {n} turns");
    Ok(())
}

pub async fn import(settings: Settings, a: ImportArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let format = match a.format {
        Format::Auto => detect(&text)
            .with_context(|| format!("{}: cannot tell the format", a.file.display()))?,
        f => f,
    };
    let turns = parse(format, &text, &a.conversation_prefix)
        .with_context(|| format!("{} ({format:?})", a.file.display()))?;
    check_all(&turns).with_context(|| format!("{} ({format:?})", a.file.display()))?;
    let edits = match format {
        Format::Recollect => {
            edits_of(&text, &turns).with_context(|| format!("{} ({format:?})", a.file.display()))?
        }
        _ => Vec::new(),
    };
    let convs: BTreeSet<&str> = turns.iter().map(|(c, _)| c.as_str()).collect();
    eprintln!(
        "importing {} turns of {} conversations ({format:?}), {} of them edited",
        turns.len(),
        convs.len(),
        edits.len()
    );
    store_batches(settings.clone(), &a.server, &a.api_key, batches(turns)).await?;
    if !edits.is_empty() {
        replay_edits(settings, &a.server, &a.api_key, edits).await?;
    }
    Ok(())
}

/// Applies each edited turn's later versions in order, from the first one the store does not
/// have yet: a second import of the same file, or one resumed after a kill, adds nothing twice.
/// The versions get this store's transaction times (the import's), in the file's order.
async fn replay_edits(
    settings: Settings,
    server: &Option<String>,
    api_key: &Option<String>,
    edits: Vec<VersionEdits>,
) -> anyhow::Result<()> {
    let total: usize = edits.iter().map(|e| e.edits.len()).sum();
    let bar = crate::progress::bar(total as u64, "edits");
    let mut applied = 0;
    match server {
        Some(url) => {
            let c = client(api_key)?;
            for e in edits {
                // Storing the first version again is a no-op that names the memory.
                let r = crate::cli::check(
                    c.post(format!("{url}/v1/conversations/{}/turns", e.conversation))
                        .json(&serde_json::json!({"turns": [e.first], "wait": true}))
                        .send()
                        .await?,
                )
                .await?;
                let id = r["memory_ids"][0].as_str().unwrap_or_default().to_string();
                let current =
                    crate::cli::check(c.get(format!("{url}/v1/memories/{id}")).send().await?)
                        .await?;
                let have = current["version"].as_u64().unwrap_or(1) as usize;
                for p in e.edits.iter().skip(have.saturating_sub(1)) {
                    let mut p = p.clone();
                    p.wait = Some(true);
                    crate::cli::check(
                        c.patch(format!("{url}/v1/memories/{id}"))
                            .json(&p)
                            .send()
                            .await?,
                    )
                    .await?;
                    applied += 1;
                }
                bar.inc(e.edits.len() as u64);
            }
        }
        None => {
            let app = App::open(settings).await?;
            let tenant = TenantId::default_tenant();
            for e in edits {
                let turn_id = e.first.turn_id.clone().unwrap_or_default();
                // The turn under either id form (one stored before ids were grouped keeps its
                // hashed id).
                let forms =
                    recollect_model::MemoryId::forms_of_turn(&tenant, &e.conversation, &turn_id);
                let stored = forms
                    .iter()
                    .find_map(|id| app.raw.get(*id).transpose())
                    .transpose()?;
                let id = stored.as_ref().map_or(forms[0], |t| t.memory_id);
                let have = stored.map_or(1, |t| t.version) as usize;
                for p in e.edits.iter().skip(have.saturating_sub(1)) {
                    app.gateway
                        .edit(&tenant, &id.to_string(), p.clone(), "import")
                        .await?;
                    applied += 1;
                }
                bar.inc(e.edits.len() as u64);
            }
            app.wait_enriched().await?;
            app.shutdown().await;
        }
    }
    bar.finish_and_clear();
    eprintln!("applied {applied} edits");
    Ok(())
}

/// Consecutive turns of one conversation in requests of up to 256.
fn batches(turns: Vec<(String, TurnInput)>) -> Vec<(String, Vec<TurnInput>)> {
    let mut out: Vec<(String, Vec<TurnInput>)> = Vec::new();
    for (c, t) in turns {
        match out.last_mut() {
            Some((last, v)) if *last == c && v.len() < 256 => v.push(t),
            _ => out.push((c, vec![t])),
        }
    }
    out
}

/// Every conversation and batch as the server will check it, so a bad file stores nothing.
fn check_all(turns: &[(String, TurnInput)]) -> anyhow::Result<()> {
    let limits = recollect_gateway::Limits::default();
    let mut seen = BTreeSet::new();
    for (c, t) in turns {
        if let Some(id) = &t.turn_id {
            if !seen.insert((c.as_str(), id.as_str())) {
                bail!("conversation {c:?}: turn_id {id:?} appears twice");
            }
        }
    }
    for (c, batch) in batches(turns.to_vec()) {
        request::validate_store(&c, &batch, 256, limits.max_text_bytes)
            .map_err(|r| anyhow::anyhow!("conversation {c:?}: {}", r.message))?;
    }
    Ok(())
}

/// The format of a file, from its first value.
pub fn detect(text: &str) -> anyhow::Result<Format> {
    let t = text.trim_start();
    if !t.starts_with('[') {
        return Ok(Format::Recollect);
    }
    let v: Value = serde_json::from_str(t).context("not JSON")?;
    let first = v
        .as_array()
        .and_then(|a| a.first())
        .context("an empty array")?;
    Ok(if first.get("mapping").is_some() {
        Format::Chatgpt
    } else if first.get("haystack_sessions").is_some() {
        Format::Longmemeval
    } else if first["conversation"].get("speaker_a").is_some() {
        Format::Locomo
    } else if first.get("conversations").is_some_and(Value::is_array) {
        Format::Sharegpt
    } else {
        bail!("an array of objects none of the known formats has (mapping, haystack_sessions, conversation.speaker_a, conversations)")
    })
}

/// Ids from other tools, made into conversation ids (letters, digits, _ - . : @).
fn conversation_id(prefix: &str, raw: &str) -> String {
    let clean: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '@') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{prefix}{clean}")
}

fn turn(
    turn_id: String,
    user: String,
    assistant: Option<String>,
    speakers: (Option<&str>, Option<&str>),
    timestamp: DateTime<Utc>,
) -> TurnInput {
    TurnInput {
        turn_id: Some(turn_id),
        user,
        assistant: assistant.filter(|a| !a.trim().is_empty()),
        user_speaker: speakers.0.map(String::from),
        assistant_speaker: speakers.1.map(String::from),
        timestamp,
        metadata: Default::default(),
        user_id: None,
        agent_id: None,
    }
}

/// Messages (role, text, time) paired into turns: a user message and the assistant's answer
/// after it; an assistant message with no user message before it is a turn of its own.
fn pair(
    conv: &str,
    messages: Vec<(bool, String, DateTime<Utc>, String)>,
) -> Vec<(String, TurnInput)> {
    let mut out = Vec::new();
    let mut it = messages.into_iter().peekable();
    while let Some((is_user, text, at, id)) = it.next() {
        if is_user {
            let answer = match it.peek() {
                Some((false, _, _, _)) => it.next().map(|m| m.1),
                _ => None,
            };
            out.push((
                conv.to_string(),
                turn(id, text, answer, (Some("user"), Some("assistant")), at),
            ));
        } else {
            out.push((
                conv.to_string(),
                turn(id, text, None, (Some("assistant"), None), at),
            ));
        }
    }
    out
}

/// Parses a whole file; errors name the line or record and the field.
pub fn parse(format: Format, text: &str, prefix: &str) -> anyhow::Result<Vec<(String, TurnInput)>> {
    match format {
        Format::Auto => parse(detect(text)?, text, prefix),
        Format::Recollect => parse_recollect(text, prefix),
        Format::Chatgpt => parse_chatgpt(text, prefix),
        Format::Sharegpt => parse_sharegpt(text, prefix),
        Format::Locomo => parse_locomo(text, prefix),
        Format::Longmemeval => parse_longmemeval(text, prefix),
    }
}

fn parse_recollect(text: &str, prefix: &str) -> anyhow::Result<Vec<(String, TurnInput)>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("line {}", n + 1);
        let v: Value = serde_json::from_str(line).with_context(|| format!("{}: not JSON", at()))?;
        let Value::Object(mut m) = v else {
            bail!("{}: not a JSON object", at());
        };
        let conv = m
            .get("conversation_id")
            .and_then(Value::as_str)
            .with_context(|| format!("{}: conversation_id is missing", at()))?
            .to_string();
        // An edited turn is stored as its first version; `edits_of` replays the rest.
        if let Some(Value::Object(first)) = m.get("history").and_then(|h| h.get(0)).cloned() {
            for k in ["user", "assistant", "metadata"] {
                match first.get(k) {
                    Some(v) => m.insert(k.to_string(), v.clone()),
                    None => m.remove(k),
                };
            }
        }
        for k in DERIVED {
            m.remove(k);
        }
        // A stored turn without an answer exports "assistant": "".
        if m.get("assistant").and_then(Value::as_str) == Some("") {
            m.remove("assistant");
        }
        let t: TurnInput = serde_json::from_value(Value::Object(m))
            .with_context(|| format!("{}: not a turn", at()))?;
        out.push((format!("{prefix}{conv}"), t));
    }
    Ok(out)
}

/// The edited turns of a `recollect export` file: each with its first version and the edits
/// that lead to its last.
pub fn edits_of(text: &str, turns: &[(String, TurnInput)]) -> anyhow::Result<Vec<VersionEdits>> {
    let mut out = Vec::new();
    let lines = text.lines().filter(|l| !l.trim().is_empty());
    for (line, (conv, first)) in lines.zip(turns) {
        let v: Value = serde_json::from_str(line)?;
        let Some(history) = v.get("history").and_then(Value::as_array) else {
            continue;
        };
        let mut edits: Vec<recollect_model::TurnPatch> = history
            .iter()
            .skip(1)
            .filter_map(Value::as_object)
            .map(as_patch)
            .collect();
        if let Some(current) = v.as_object() {
            edits.push(as_patch(current));
        }
        for e in &edits {
            request::validate_patch(e, recollect_gateway::Limits::default().max_text_bytes)
                .map_err(|r| anyhow::anyhow!("conversation {conv:?}: {}", r.message))?;
        }
        if first.turn_id.is_none() {
            bail!("conversation {conv:?}: an edited turn needs its turn_id to be replayed");
        }
        out.push(VersionEdits {
            conversation: conv.clone(),
            first: first.clone(),
            edits,
        });
    }
    Ok(out)
}

fn parse_chatgpt(text: &str, prefix: &str) -> anyhow::Result<Vec<(String, TurnInput)>> {
    let v: Value = serde_json::from_str(text).context("not JSON")?;
    let convs = v.as_array().context("not an array of conversations")?;
    let mut out = Vec::new();
    for (i, c) in convs.iter().enumerate() {
        let at = |f: &str| format!("conversation [{i}].{f}");
        let id = c
            .get("conversation_id")
            .or_else(|| c.get("id"))
            .and_then(Value::as_str)
            .with_context(|| at("id is missing"))?;
        let mapping = c
            .get("mapping")
            .and_then(Value::as_object)
            .with_context(|| at("mapping is missing"))?;
        let started = c.get("create_time").and_then(Value::as_f64).unwrap_or(0.0);
        // The visible branch: from current_node back to the root, then forwards.
        let mut node = c
            .get("current_node")
            .and_then(Value::as_str)
            .with_context(|| at("current_node is missing"))?
            .to_string();
        let mut chain = Vec::new();
        let mut guard = 0;
        loop {
            let n = mapping
                .get(&node)
                .with_context(|| at(&format!("mapping has no node {node:?}")))?;
            chain.push(n);
            guard += 1;
            if guard > mapping.len() {
                bail!("{}", at("mapping has a cycle"));
            }
            match n.get("parent").and_then(Value::as_str) {
                Some(p) => node = p.to_string(),
                None => break,
            }
        }
        chain.reverse();
        let mut messages = Vec::new();
        for n in chain {
            let Some(m) = n.get("message").filter(|m| !m.is_null()) else {
                continue;
            };
            let is_user = match m["author"]["role"].as_str() {
                Some("user") => true,
                Some("assistant") => false,
                _ => continue,
            };
            let text: String = m["content"]["parts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("\n");
            if text.trim().is_empty() {
                continue;
            }
            let secs = m["create_time"].as_f64().unwrap_or(started);
            let ts = DateTime::from_timestamp_millis((secs * 1000.0) as i64)
                .with_context(|| at("create_time is out of range"))?;
            let mid = m["id"].as_str().or(n["id"].as_str()).unwrap_or_default();
            messages.push((is_user, text, ts, mid.to_string()));
        }
        out.extend(pair(&conversation_id(prefix, id), messages));
    }
    Ok(out)
}

/// ShareGPT has no times: 2000-01-01T00:00:00Z plus one second per message.
fn parse_sharegpt(text: &str, prefix: &str) -> anyhow::Result<Vec<(String, TurnInput)>> {
    let v: Value = serde_json::from_str(text).context("not JSON")?;
    let convs = v.as_array().context("not an array of conversations")?;
    let base = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).unwrap();
    let mut out = Vec::new();
    for (i, c) in convs.iter().enumerate() {
        let at = |f: &str| format!("conversation [{i}].{f}");
        let id = match &c["id"] {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => i.to_string(),
        };
        let msgs = c["conversations"]
            .as_array()
            .with_context(|| at("conversations is missing"))?;
        let mut messages = Vec::new();
        for (j, m) in msgs.iter().enumerate() {
            let is_user = match m["from"].as_str() {
                Some("human" | "user") => true,
                Some("gpt" | "assistant" | "chatgpt" | "bard" | "bing" | "model") => false,
                Some("system") => continue,
                other => bail!(
                    "{}",
                    at(&format!(
                        "conversations[{j}].from {other:?} is not a known role"
                    ))
                ),
            };
            let text = m["value"]
                .as_str()
                .with_context(|| at(&format!("conversations[{j}].value is missing")))?;
            if text.trim().is_empty() {
                continue;
            }
            messages.push((
                is_user,
                text.to_string(),
                base + chrono::Duration::seconds(j as i64),
                j.to_string(),
            ));
        }
        out.extend(pair(&conversation_id(prefix, &id), messages));
    }
    Ok(out)
}

fn parse_locomo(text: &str, prefix: &str) -> anyhow::Result<Vec<(String, TurnInput)>> {
    let v: Value = serde_json::from_str(text).context("not JSON")?;
    let samples = v.as_array().context("not an array of samples")?;
    let mut out = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        let id = s["sample_id"]
            .as_str()
            .with_context(|| format!("sample [{i}].sample_id is missing"))?;
        let conv = conversation_id(prefix, id);
        for r in crate::eval::rounds_of(s).with_context(|| format!("sample {id:?}"))? {
            out.push((conv.clone(), r.input));
        }
    }
    Ok(out)
}

/// One conversation per haystack session (sessions repeat across instances: kept once), its
/// turns a second apart from the session's date ("2023/05/20 (Sat) 02:21").
fn parse_longmemeval(text: &str, prefix: &str) -> anyhow::Result<Vec<(String, TurnInput)>> {
    let v: Value = serde_json::from_str(text).context("not JSON")?;
    let items = v.as_array().context("not an array of instances")?;
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (i, q) in items.iter().enumerate() {
        let at = |f: &str| format!("instance [{i}].{f}");
        let ids = q["haystack_session_ids"]
            .as_array()
            .with_context(|| at("haystack_session_ids is missing"))?;
        let dates = q["haystack_dates"]
            .as_array()
            .with_context(|| at("haystack_dates is missing"))?;
        let sessions = q["haystack_sessions"]
            .as_array()
            .with_context(|| at("haystack_sessions is missing"))?;
        if ids.len() != sessions.len() || dates.len() != sessions.len() {
            bail!(
                "{}",
                at("haystack_session_ids, haystack_dates and haystack_sessions differ in length")
            );
        }
        for (k, session) in sessions.iter().enumerate() {
            let sid = ids[k]
                .as_str()
                .with_context(|| at(&format!("haystack_session_ids[{k}] is not text")))?;
            if !seen.insert(sid.to_string()) {
                continue;
            }
            let date = dates[k].as_str().unwrap_or_default();
            let start = longmemeval_date(date)
                .with_context(|| at(&format!("haystack_dates[{k}] {date:?} is not a date")))?;
            let mut messages = Vec::new();
            for (j, m) in session
                .as_array()
                .with_context(|| at(&format!("haystack_sessions[{k}] is not a list")))?
                .iter()
                .enumerate()
            {
                let is_user = match m["role"].as_str() {
                    Some("user") => true,
                    Some("assistant") => false,
                    _ => continue,
                };
                let text = m["content"].as_str().unwrap_or_default();
                if text.trim().is_empty() {
                    continue;
                }
                messages.push((
                    is_user,
                    text.to_string(),
                    start + chrono::Duration::seconds(j as i64),
                    j.to_string(),
                ));
            }
            out.extend(pair(&conversation_id(prefix, sid), messages));
        }
    }
    Ok(out)
}

fn longmemeval_date(s: &str) -> Option<DateTime<Utc>> {
    // "2023/05/20 (Sat) 02:21": the weekday in parentheses is redundant.
    let cleaned: String = match (s.find('('), s.find(')')) {
        (Some(a), Some(b)) if a < b => format!("{}{}", &s[..a], &s[b + 1..]),
        _ => s.to_string(),
    };
    let cleaned = cleaned.split_whitespace().collect::<Vec<_>>().join(" ");
    chrono::NaiveDateTime::parse_from_str(&cleaned, "%Y/%m/%d %H:%M")
        .ok()
        .map(|t| t.and_utc())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_format_is_detected_and_paired() {
        let chatgpt = json!([{"id": "c-1", "create_time": 1_700_000_000.0, "current_node": "n3",
            "mapping": {
                "root": {"id": "root", "message": null, "parent": null},
                "n1": {"id": "n1", "parent": "root", "message": {"id": "m1", "author": {"role": "user"},
                       "create_time": 1_700_000_010.0, "content": {"content_type": "text", "parts": ["Hi there"]}}},
                "n2": {"id": "n2", "parent": "n1", "message": {"id": "m2", "author": {"role": "assistant"},
                       "create_time": 1_700_000_020.0, "content": {"content_type": "text", "parts": ["Hello!"]}}},
                "x": {"id": "x", "parent": "n2", "message": {"id": "mx", "author": {"role": "user"},
                       "content": {"parts": ["an abandoned branch"]}}},
                "n3": {"id": "n3", "parent": "n2", "message": {"id": "m3", "author": {"role": "user"},
                       "create_time": 1_700_000_030.0, "content": {"content_type": "text", "parts": ["Bye"]}}}
            }}])
        .to_string();
        assert_eq!(detect(&chatgpt).unwrap(), Format::Chatgpt);
        let t = parse(Format::Auto, &chatgpt, "gpt-").unwrap();
        assert_eq!(t.len(), 2, "{t:?}");
        assert_eq!(t[0].0, "gpt-c-1");
        assert_eq!(
            (t[0].1.user.as_str(), t[0].1.assistant.as_deref()),
            ("Hi there", Some("Hello!"))
        );
        assert_eq!(t[0].1.turn_id.as_deref(), Some("m1"));
        assert_eq!(t[1].1.user, "Bye");
        assert_eq!(t[0].1.timestamp.timestamp(), 1_700_000_010);

        let sharegpt = json!([{"id": "s/1", "conversations": [
            {"from": "system", "value": "be nice"}, {"from": "human", "value": "Q1"},
            {"from": "gpt", "value": "A1"}, {"from": "human", "value": "Q2"}]}])
        .to_string();
        assert_eq!(detect(&sharegpt).unwrap(), Format::Sharegpt);
        let t = parse(Format::Auto, &sharegpt, "").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].0, "s_1");
        assert_eq!(t[1].1.assistant, None);

        let lme = json!([{"question_id": "q1", "haystack_session_ids": ["s1", "s2"],
            "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/21 (Sun) 10:00"],
            "haystack_sessions": [[{"role": "user", "content": "I adopted a cat"},
                                   {"role": "assistant", "content": "Congrats"}],
                                  [{"role": "user", "content": "The cat is called Miso"}]]},
            {"question_id": "q2", "haystack_session_ids": ["s1"], "haystack_dates": ["2023/05/20 (Sat) 02:21"],
             "haystack_sessions": [[{"role": "user", "content": "I adopted a cat"}]]}])
        .to_string();
        assert_eq!(detect(&lme).unwrap(), Format::Longmemeval);
        let t = parse(Format::Auto, &lme, "lme-").unwrap();
        assert_eq!(t.len(), 2, "a session shared by two instances is kept once");
        assert_eq!(t[0].1.timestamp.to_rfc3339(), "2023-05-20T02:21:00+00:00");

        assert_eq!(
            detect("{\"conversation_id\": \"c\"}\n").unwrap(),
            Format::Recollect
        );
    }

    #[test]
    fn bad_input_names_the_line_or_field() {
        let e = parse(Format::Recollect, "{\"conversation_id\":\"c\",\"user\":\"a\",\"timestamp\":\"2024-01-01T00:00:00Z\"}\n\n{nope\n", "")
            .unwrap_err();
        assert!(format!("{e:#}").contains("line 3"), "{e:#}");
        let e = parse(Format::Chatgpt, r#"[{"id": "x", "current_node": "a"}]"#, "").unwrap_err();
        assert!(
            format!("{e:#}").contains("conversation [0].mapping"),
            "{e:#}"
        );
        let e = parse(
            Format::Sharegpt,
            r#"[{"id": 1, "conversations": [{"from": "robot", "value": "x"}]}]"#,
            "",
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("conversations[0].from"), "{e:#}");
        let e = check_all(&[(
            "c".into(),
            turn("1".into(), " ".into(), None, (None, None), Utc::now()),
        )])
        .unwrap_err();
        assert!(format!("{e:#}").contains("turns[0].user"), "{e:#}");
    }
}
