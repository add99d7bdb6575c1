//! `recollect`: the all-in-one embedded binary (every worker in one process) and its tools.

mod app;
mod bench;
mod cli;
mod eval;
mod mcp;
mod progress;
mod server;
mod transfer;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use recollect_config::Settings;

#[derive(Parser)]
#[command(
    name = "recollect",
    version,
    about = "Long-term memory for LLM agents: store chat turns, recall them in milliseconds"
)]
struct Cli {
    /// Configuration file (TOML); RECOLLECT__SECTION__KEY variables override it.
    #[arg(long, global = true, env = "RECOLLECT_CONFIG")]
    config: Option<PathBuf>,
    /// Data directory (also RECOLLECT__STORAGE__DATA_DIR).
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// Graph store: embedded, neo4j or remote (also RECOLLECT__GRAPH__KIND; connection in [graph]).
    #[arg(long, global = true)]
    graph: Option<String>,
    /// Vector store: embedded, qdrant or remote (also RECOLLECT__VECTORS__KIND; URL in [vectors]).
    #[arg(long, global = true)]
    vectors: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the embedded server (HTTP API, every worker in-process).
    Serve {
        /// Address to listen on (also RECOLLECT__SERVER__LISTEN).
        #[arg(long)]
        listen: Option<String>,
        /// gRPC address, "" for none (also RECOLLECT__SERVER__GRPC_LISTEN; default 127.0.0.1:50051).
        #[arg(long)]
        grpc_listen: Option<String>,
    },
    /// An MCP server on stdin/stdout (the official SDK, rmcp): memory as agent tools.
    Mcp(mcp::McpArgs),
    /// Store turns from a JSONL file: one {"conversation_id", "user", "assistant"?, "timestamp", ...} per line.
    Ingest(cli::IngestArgs),
    /// Recall memories for a query.
    Recall(cli::RecallArgs),
    /// Write the tenant's turns (or some conversations') as JSONL.
    Export(transfer::ExportArgs),
    /// Store turns from a file: `recollect export` JSONL, ChatGPT's conversations.json,
    /// ShareGPT, LoCoMo or LongMemEval; idempotent.
    Import(transfer::ImportArgs),
    /// Erase a conversation from every store.
    Delete(cli::DeleteArgs),
    /// Edit one memory's text or metadata: a new version, the old one kept in its history.
    Edit(cli::EditArgs),
    /// Every version of one memory, oldest first.
    History(cli::HistoryArgs),
    /// Derive every turn again from the stored turns (after an extractor, rule or model change).
    Reindex(cli::ReindexArgs),
    /// A consistent copy of the data directory, also while the server runs (--server).
    Backup(cli::BackupArgs),
    /// Make a backup the data directory (absent or empty).
    Restore(cli::RestoreArgs),
    /// Synthetic load: ingest turns end to end, then time recall.
    Bench(bench::BenchArgs),
    /// Retrieval evaluation.
    Eval {
        #[command(subcommand)]
        which: eval::EvalCommand,
    },
}

/// A store kind given on the command line: the same names as in the configuration file.
fn kind<T: serde::de::DeserializeOwned>(flag: &str, v: &str) -> anyhow::Result<T> {
    serde_json::from_value(serde_json::Value::String(v.to_string()))
        .map_err(|_| anyhow::anyhow!("--{flag} {v:?}: not one of the kinds in recollect.toml"))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut settings = Settings::load(cli.config.as_deref())?;
    if let Some(d) = cli.data_dir {
        settings.storage.data_dir = d;
    }
    if let Some(g) = &cli.graph {
        settings.graph.kind = kind("graph", g)?;
    }
    if let Some(v) = &cli.vectors {
        settings.vectors.kind = kind("vectors", v)?;
    }
    if let Command::Serve {
        listen,
        grpc_listen,
    } = &cli.command
    {
        if let Some(l) = listen {
            settings.server.listen = l.clone();
        }
        if let Some(g) = grpc_listen {
            settings.server.grpc_listen = g.clone();
        }
    }
    settings.validate()?;
    // Kept to the end of main: dropping it sends the spans still buffered.
    let _telemetry = recollect_runtime::init_tracing(&settings, "recollect")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match cli.command {
            Command::Serve { .. } => server::serve(app::App::open(settings).await?).await,
            Command::Mcp(a) => mcp::run(settings, a).await,
            Command::Ingest(a) => cli::ingest(settings, a).await,
            Command::Recall(a) => cli::recall(settings, a).await,
            Command::Export(a) => transfer::export(settings, a).await,
            Command::Import(a) => transfer::import(settings, a).await,
            Command::Delete(a) => cli::delete(settings, a).await,
            Command::Edit(a) => cli::edit(settings, a).await,
            Command::History(a) => cli::history(settings, a).await,
            Command::Reindex(a) => cli::reindex(settings, a).await,
            Command::Backup(a) => cli::backup(settings, a).await,
            Command::Restore(a) => cli::restore(settings, a).await,
            Command::Eval { which } => eval::run(settings, which).await,
            Command::Bench(a) => bench::run(settings, a).await,
        }
    })
}
