//! `cairn block`: exact content (by SHA-256) blocked in a dataset.

use std::collections::HashMap;
use std::process::ExitCode;

use super::ClientArgs;

/// Block exact content (by SHA-256) in a dataset.
#[derive(Debug, clap::Args)]
pub struct BlockArgs {
    /// Dataset.
    #[arg(long)]
    dataset: String,
    /// SHA-256 of the content, 64 hex digits.
    #[arg(long)]
    sha256: String,
    /// Why (recorded in history).
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    client: ClientArgs,
}

impl BlockArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let BlockArgs {
            dataset,
            sha256,
            reason,
            client,
        } = self;
        let api = client.connect()?;
        let body =
            serde_json::json!({ "dataset": dataset, "content_sha256": sha256, "reason": reason });
        let (status, answer) = api.post("/v1/blocks", &body).await?;
        if status != 201 {
            anyhow::bail!("HTTP {status}: {answer}");
        }
        println!("blocked {sha256} in dataset {dataset}");

        Ok(ExitCode::SUCCESS)
    }
}
