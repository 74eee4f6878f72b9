//! `cairn erase`: every trace of every revision of a source, in every store.

use std::collections::HashMap;
use std::process::ExitCode;

use super::ClientArgs;

/// Erase a source: every trace of every revision, in every store (needs a token with the
/// `erase` scope; the admin token has it).
#[derive(Debug, clap::Args)]
pub struct EraseArgs {
    /// Dataset.
    #[arg(long)]
    dataset: String,
    /// Source key.
    #[arg(long)]
    source_key: String,
    /// Why (recorded in history, e.g. the request's reference).
    #[arg(long)]
    reason: String,
    /// Wait until every store reports the source erased (its receipts `erased`).
    #[arg(long)]
    wait: bool,
    /// Print the server's JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl EraseArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        use crate::cli::ops::encode;
        let EraseArgs {
            dataset,
            source_key,
            reason,
            wait,
            json,
            client,
        } = self;
        let api = client.connect()?;
        let (status, answer) = api
            .delete(&format!(
                "/v1/sources?dataset={}&source_key={}&erase=true&reason={}",
                encode(&dataset),
                encode(&source_key),
                encode(&reason)
            ))
            .await?;
        let receipt = crate::cli::client::ok_or_error(status, answer)?;
        let revision = receipt
            .get("source_revision_id")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let mut detail = receipt.clone();
        if wait {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
            loop {
                detail = api.get(&format!("/v1/revisions/{revision}")).await?;
                let state = detail["job"]["state"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if state == "completed" {
                    break;
                }
                if matches!(state.as_str(), "dead" | "quarantined" | "cancelled") {
                    anyhow::bail!(
                        "the erasure's job of {revision} is {state}: see `cairn ops job {}`",
                        detail["job"]["id"].as_str().unwrap_or_default()
                    );
                }
                if std::time::Instant::now() > deadline {
                    anyhow::bail!("the erasure of {revision} is still {state} after 300 s");
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
        if json {
            println!("{}", serde_json::to_string_pretty(&detail)?);
        } else if wait {
            println!("erased {dataset}/{source_key} (erasure {revision}):");
            for receipt in detail["receipts"].as_array().cloned().unwrap_or_default() {
                println!(
                    "  {:<10} {:<8} {}",
                    receipt["backend"].as_str().unwrap_or_default(),
                    receipt["state"].as_str().unwrap_or_default(),
                    receipt["evidence"]
                );
            }
        } else {
            println!(
                "erased {dataset}/{source_key} from the ledger (erasure {revision}); its jobs \
                 erase the stores (`--wait` waits for them)"
            );
        }
        Ok(ExitCode::SUCCESS)
    }
}
