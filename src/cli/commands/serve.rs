//! `cairn serve`: the API, and workers when `workers.count > 0`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{Config, Overrides};

/// Run the API (and, with workers.count > 0, the workers) on the embedded SQLite ledger in
/// --data-dir, or on a PostgreSQL ledger with --ledger.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Data directory (SQLite ledger, vector shard, admin token).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// PostgreSQL ledger URL (also `CAIRN_LEDGER_URL`, `ledger.url`).
    #[arg(long)]
    ledger: Option<String>,
    /// Qdrant server gRPC URL (also `CAIRN_VECTORS_URL`, `vectors.url`; the API key comes from
    /// `CAIRN_VECTORS_API_KEY`). Unset: the embedded qdrant-edge store.
    #[arg(long)]
    vectors: Option<String>,
    /// Address to listen on.
    #[arg(long)]
    bind: Option<String>,
    /// TOML configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
}

impl ServeArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let ServeArgs {
            data_dir,
            ledger,
            vectors,
            bind,
            config,
        } = self;
        let config = Config::load(
            &Overrides {
                data_dir,
                bind,
                config_file: config,
                ledger_url: ledger,
                vectors_url: vectors,
            },
            env,
        )?;
        let shutdown = crate::shutdown_signal();
        crate::serve(config, shutdown).await?;

        Ok(ExitCode::SUCCESS)
    }
}
