//! `cairn migrate`: the ledger's migrations, applied and reported.

use std::collections::HashMap;
use std::process::ExitCode;

use super::StoreArgs;

/// Apply the ledger's migrations and say what was done (`serve` and `worker` also run
/// them at start).
#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    store: StoreArgs,
}

impl MigrateArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let config = self.store.load(env)?;
        crate::cli::migrate(&config).await?;

        Ok(ExitCode::SUCCESS)
    }
}
