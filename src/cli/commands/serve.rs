//! `cairn serve`: the API, and workers when `workers.count > 0`.

use std::collections::HashMap;
use std::process::ExitCode;

use super::NodeArgs;

/// Run the API (and, with workers.count > 0, the workers) on the embedded SQLite ledger in
/// --data-dir, or on a PostgreSQL ledger with --ledger.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// Address to listen on.
    #[arg(long)]
    bind: Option<String>,
}

impl ServeArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let config = self.node.load(self.bind, env)?;
        let shutdown = crate::shutdown_signal();
        crate::serve(config, shutdown).await?;
        Ok(ExitCode::SUCCESS)
    }
}
