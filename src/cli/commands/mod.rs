//! The commands of the `cairn` binary, one file each: its flags (a clap `Args` struct) and
//! what it does (`run`). `main.rs` lists them; the processes `serve` and `worker` start are
//! composed in `crate::process`. What several commands share is here.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context;

use crate::config::{Config, Overrides, DEFAULT_BIND, DEFAULT_DATA_DIR};

mod access;
mod auth;
mod backup;
mod bench;
mod block;
mod connector;
mod erase;
mod eval;
mod generation;
mod graph;
mod hook;
mod ingest;
mod mcp;
mod migrate;
mod ops;
mod reconcile;
mod search;
mod serve;
mod status;
mod timeline;
mod token;
mod verify;
mod webhook;
mod worker;

pub use access::AccessArgs;
pub use auth::AuthArgs;
pub use backup::{BackupArgs, RestoreArgs};
pub use bench::BenchArgs;
pub use block::BlockArgs;
pub use connector::ConnectorArgs;
pub use erase::EraseArgs;
pub use eval::EvalArgs;
pub use generation::GenerationArgs;
pub use graph::GraphArgs;
pub use hook::HookArgs;
pub use ingest::IngestArgs;
pub use mcp::McpArgs;
pub use migrate::MigrateArgs;
pub use ops::OpsArgs;
pub use reconcile::ReconcileArgs;
pub use search::SearchArgs;
pub use serve::ServeArgs;
pub use status::StatusArgs;
pub use timeline::TimelineArgs;
pub use token::TokenArgs;
pub use verify::VerifyArgs;
pub use webhook::WebhookArgs;
pub use worker::WorkerArgs;

/// `path` with `reason` (and `tombstone`) as query parameters, encoded.
fn with_query(path: &str, reason: Option<&str>, tombstone: bool) -> anyhow::Result<String> {
    let mut url = reqwest::Url::parse("http://cairn.invalid")?.join(path)?;
    {
        let mut query = url.query_pairs_mut();
        if let Some(reason) = reason {
            query.append_pair("reason", reason);
        }
        if tombstone {
            query.append_pair("tombstone", "true");
        }
    }
    Ok(match url.query() {
        Some(query) if !query.is_empty() => format!("{}?{query}", url.path()),
        _ => url.path().to_owned(),
    })
}

/// Where the client finds the server and its token.
#[derive(Debug, clap::Args)]
struct ClientArgs {
    /// Base URL of the cairn server.
    #[arg(long, global = true, env = "CAIRN_SERVER", default_value_t = format!("http://{DEFAULT_BIND}"))]
    server: String,
    /// Bearer token (default: the admin token in --data-dir).
    #[arg(long, global = true, env = "CAIRN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The server's data directory, to read its admin.token.
    #[arg(long, global = true, env = "CAIRN_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
}

impl ClientArgs {
    /// A client of the server, with the given token or the admin token in the data directory.
    fn connect(self) -> anyhow::Result<crate::cli::client::Client> {
        let token = crate::cli::client::resolve_token(self.token, &self.data_dir)?;
        crate::cli::client::Client::new(&self.server, token)
    }
}

/// Writes a benchmark's JSON report to `out` and prints it.
/// The configuration of a command that takes only `--config` (benchmarks, evaluation).
fn file_config(
    config_file: Option<PathBuf>,
    vectors_url: Option<String>,
    env: &HashMap<String, String>,
) -> anyhow::Result<Config> {
    Config::load(
        &Overrides {
            config_file,
            vectors_url,
            ..Overrides::default()
        },
        env,
    )
}

fn write_report(out: &std::path::Path, report: &serde_json::Value) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?;
    println!("{text}");
    eprintln!("written to {}", out.display());
    Ok(())
}

fn whoami() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Where the ledger is, for commands that open it directly.
#[derive(Debug, Clone, clap::Args)]
struct StoreArgs {
    /// Data directory (the embedded SQLite ledger, and the admin token).
    #[arg(long, env = "CAIRN_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// PostgreSQL ledger URL (`postgres://user@host:port/db`; also `CAIRN_LEDGER_URL`).
    #[arg(long)]
    ledger: Option<String>,
}

impl StoreArgs {
    /// The configuration of a command that opens the ledger directly.
    fn load(&self, env: &HashMap<String, String>) -> anyhow::Result<Config> {
        Config::load(
            &Overrides {
                data_dir: Some(self.data_dir.clone()),
                ledger_url: self.ledger.clone(),
                ..Overrides::default()
            },
            env,
        )
    }
}

/// The flags of the two processes, `cairn serve` and `cairn worker`: where the data, the
/// ledger, the vectors and the configuration file are.
#[derive(Debug, clap::Args)]
struct NodeArgs {
    /// Data directory (the embedded SQLite ledger, the embedded vector shards, the admin
    /// token).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// PostgreSQL ledger URL, shared by processes on any machine (also `CAIRN_LEDGER_URL`,
    /// `ledger.url`). Unset: the embedded SQLite ledger.
    #[arg(long)]
    ledger: Option<String>,
    /// Qdrant server gRPC URL, or a cluster's nodes separated by commas, shared by processes
    /// on any machine (also `CAIRN_VECTORS_URL`, `vectors.url`, `vectors.urls`; the API key
    /// comes from `CAIRN_VECTORS_API_KEY`). Unset: the embedded qdrant-edge store.
    #[arg(long)]
    vectors: Option<String>,
    /// TOML configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
}

impl NodeArgs {
    /// The process's configuration, listening on `bind` when given.
    fn load(self, bind: Option<String>, env: &HashMap<String, String>) -> anyhow::Result<Config> {
        Config::load(
            &Overrides {
                data_dir: self.data_dir,
                bind,
                config_file: self.config,
                ledger_url: self.ledger,
                vectors_url: self.vectors,
            },
            env,
        )
    }
}
