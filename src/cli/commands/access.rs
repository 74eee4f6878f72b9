//! `cairn access show|set|default`: who may read a source, and a dataset's default, through
//! the API (`/v1/sources/access`, `/v1/datasets/{dataset}/access`).

use std::collections::HashMap;
use std::process::ExitCode;

use clap::Subcommand;
use serde_json::{json, Value};

use super::ClientArgs;

#[derive(Debug, Subcommand)]
enum AccessCommand {
    /// Who may read a source: the readers it names, or its dataset's default.
    Show {
        /// Dataset.
        #[arg(long)]
        dataset: String,
        /// Source key.
        #[arg(long)]
        key: String,
    },
    /// Set a source's readers (no new revision; search applies it at the next query).
    Set {
        /// Dataset.
        #[arg(long)]
        dataset: String,
        /// Source key.
        #[arg(long)]
        key: String,
        /// A reader: `user:<name>`, `service:<name>` or `group:<name>` (repeatable; none:
        /// nobody but tokens that read whole datasets).
        #[arg(long = "reader")]
        readers: Vec<String>,
        /// Hand the source back to its dataset's default instead.
        #[arg(long, conflicts_with = "readers")]
        default: bool,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Set a dataset's default for sources that name no readers: everyone or nobody.
    Default {
        /// Dataset.
        #[arg(long)]
        dataset: String,
        /// `everyone` (who may read the dataset) or `nobody`.
        #[arg(long)]
        to: String,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// Who may read which document.
#[derive(Debug, clap::Args)]
pub struct AccessArgs {
    #[command(subcommand)]
    command: AccessCommand,
    #[command(flatten)]
    client: ClientArgs,
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

fn print(record: &Value) {
    let readers = match record.get("readers") {
        Some(Value::Array(readers)) => readers
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(", "),
        _ => format!(
            "(the dataset's default: {})",
            record["default"].as_str().unwrap_or("everyone")
        ),
    };
    println!(
        "{}/{}: readers {}",
        record["dataset"].as_str().unwrap_or(""),
        record["source_key"].as_str().unwrap_or(""),
        if readers.is_empty() {
            "(nobody)".to_owned()
        } else {
            readers
        }
    );
}

impl AccessArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let api = self.client.connect()?;
        match self.command {
            AccessCommand::Show { dataset, key } => {
                let record = api
                    .get(&format!(
                        "/v1/sources/access?dataset={}&source_key={}",
                        encode(&dataset),
                        encode(&key)
                    ))
                    .await?;
                print(&record);
            }
            AccessCommand::Set {
                dataset,
                key,
                readers,
                default,
                reason,
            } => {
                let readers = if default { Value::Null } else { json!(readers) };
                let body = json!({"dataset": dataset, "source_key": key, "readers": readers, "reason": reason});
                let (status, answer) = api.put("/v1/sources/access", &body).await?;
                let record = crate::cli::client::ok_or_error(status, answer)?;
                print(&record);
            }
            AccessCommand::Default {
                dataset,
                to,
                reason,
            } => {
                let body = json!({"default": to, "reason": reason});
                let (status, answer) = api
                    .put(&format!("/v1/datasets/{}/access", encode(&dataset)), &body)
                    .await?;
                crate::cli::client::ok_or_error(status, answer)?;
                println!("dataset {dataset}: sources that name no readers are read by {to}");
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}
