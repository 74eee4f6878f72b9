//! `cairn backup` (through a running cairn: its API takes the backup while it serves) and
//! `cairn restore` (on the data directory, with cairn stopped).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{json, Value};

use super::{whoami, ClientArgs, StoreArgs};
use crate::cli::client::ok_or_error;

/// Takes a consistent backup of the ledger and every live generation's vectors while cairn
/// runs (into `backup.dir`); prints its manifest.
#[derive(Debug, clap::Args)]
pub struct BackupArgs {
    /// Why (kept in the manifest).
    #[arg(long)]
    reason: Option<String>,
    /// Write the vectors as the portable dump (JSON lines with a trailing hash), which
    /// restores into qdrant-edge or a Qdrant server alike.
    #[arg(long)]
    portable: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl BackupArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let api = self.client.connect()?;
        let (status, answer) = api
            .post(
                "/v1/backups",
                &json!({"reason": self.reason, "portable": self.portable}),
            )
            .await?;
        let started = ok_or_error(status, answer)?;
        let id = started["id"].as_str().unwrap_or_default().to_owned();
        eprintln!(
            "backup {id} into {}",
            started["folder"].as_str().unwrap_or("?")
        );
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let listed = api.get("/v1/backups").await?;
            let Some(view) = listed["backups"]
                .as_array()
                .and_then(|all| all.iter().find(|b| b["id"] == id.as_str()))
                .cloned()
            else {
                anyhow::bail!("the server no longer lists backup {id} (did it restart?)");
            };
            match view["state"].as_str() {
                Some("running") => continue,
                Some("completed") => {
                    println!("{}", serde_json::to_string_pretty(&view["manifest"])?);
                    summary(&view["manifest"]);
                    return Ok(ExitCode::SUCCESS);
                }
                _ => {
                    eprintln!(
                        "error: backup {id} failed: {}",
                        view["error"].as_str().unwrap_or("?")
                    );
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
    }
}

fn summary(manifest: &Value) {
    let ledger = &manifest["ledger"];
    eprintln!(
        "backup {}: ledger {} bytes (history at {}, {} sources), {} generation(s), in {:.2} s",
        manifest["id"].as_str().unwrap_or("?"),
        ledger["file"]["bytes"],
        ledger["history_seq"],
        ledger["sources"],
        manifest["generations"].as_array().map_or(0, Vec::len),
        manifest["seconds"].as_f64().unwrap_or(0.0)
    );
}

/// Restores a backup into the data directory, with cairn stopped: checks every file's hash,
/// moves the current ledger aside (never deletes it), voids every lease, replays erasures and
/// revocations made since, loads the vectors and ends with a full verify. One JSON line per
/// step on stdout.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The backup's folder (holding manifest.json).
    #[arg(long)]
    from: PathBuf,
    /// Restore even without an erasure journal: erasures and revocations made after the
    /// backup come back.
    #[arg(long)]
    accept_resurrection: bool,
    #[command(flatten)]
    store: StoreArgs,
}

impl RestoreArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let config = self.store.load(env)?;
        let options = crate::backup::restore::RestoreOptions {
            from: self.from,
            accept_resurrection: self.accept_resurrection,
            actor: format!("cli:{}", whoami()),
        };
        match crate::backup::restore::restore(&config, &options).await {
            Ok(report) => {
                eprintln!("restored: {report}");
                Ok(ExitCode::SUCCESS)
            }
            Err(error) => {
                eprintln!("error: the restore stopped: {error:#}");
                Ok(ExitCode::FAILURE)
            }
        }
    }
}
