//! `cairn status`: server health and counts.

use std::collections::HashMap;
use std::process::ExitCode;

use super::ClientArgs;

/// Server health and counts.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl StatusArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let StatusArgs { json, client } = self;
        let api = client.connect()?;
        crate::cli::client::status(&api, json).await?;

        Ok(ExitCode::SUCCESS)
    }
}
