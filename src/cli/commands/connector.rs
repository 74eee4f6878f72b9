//! `cairn connector`: keep a dataset equal to a folder, through the server's connectors API.

use std::collections::HashMap;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use serde_json::{json, Value};

use super::{with_query, ClientArgs};
use crate::cli::client::{ok_or_error, Client};

#[derive(Debug, Subcommand)]
enum ConnectorCommand {
    /// Create a connector: `add folder PATH --dataset D`, `add git REPO --ref main --dataset
    /// D`, or `add git https://host/org/repo.git --ref main --dataset D [--credentials NAME]`.
    /// Its first run starts at once.
    Add(Box<AddArgs>),
    /// Every connector the token may read.
    List,
    /// One connector with its latest runs.
    Show {
        /// Connector id.
        id: String,
    },
    /// A connector's latest runs with their reports (counts, skipped and failed files).
    Runs {
        /// Connector id.
        id: String,
    },
    /// Run now.
    Run {
        /// Connector id.
        id: String,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// No more runs until resumed.
    Pause {
        /// Connector id.
        id: String,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Active again; runs now.
    Resume {
        /// Connector id.
        id: String,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Remove for good; its sources stay unless --tombstone.
    Remove {
        /// Connector id.
        id: String,
        /// Tombstone every source the connector created (a last run does it).
        #[arg(long)]
        tombstone: bool,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// What `cairn connector add` takes.
#[derive(Debug, clap::Args)]
struct AddArgs {
    /// `folder` or `git`.
    kind: String,
    /// The folder or the repository: a local path inside the server's
    /// connectors.folder_roots, or a remote repository's URL (`https://…`, `ssh://…`,
    /// `git@host:org/repo`, `git://…`) on a host in connectors.remote_hosts.
    location: String,
    /// The dataset it keeps.
    #[arg(long)]
    dataset: String,
    /// Time between runs: `30s`, `10m`, `2h`, `1d` (default 10m).
    #[arg(long)]
    every: Option<String>,
    /// Only files matching this glob over the key (repeatable).
    #[arg(long)]
    include: Vec<String>,
    /// Leave out files matching this glob (repeatable).
    #[arg(long)]
    exclude: Vec<String>,
    /// Largest file read, in bytes (default 10 MiB).
    #[arg(long)]
    max_file_bytes: Option<i64>,
    /// The git ref (git connectors).
    #[arg(long = "ref")]
    git_ref: Option<String>,
    /// Readers of every file nothing else names (`user:alice`, `group:eng`; repeatable).
    #[arg(long = "access", value_name = "READER")]
    access: Vec<String>,
    /// A folder's readers from each file's owner, group, mode bits and ACL (`posix`).
    #[arg(long = "access-from", value_name = "SOURCE")]
    access_from: Option<String>,
    /// A git repository's access rules file, a path inside the repository
    /// (docs/operations.md, "Connectors", gives its format).
    #[arg(long = "access-file", value_name = "PATH")]
    access_file: Option<String>,
    /// A remote repository's credentials: a file name in the workers'
    /// connectors.credentials_dir (a token, basic credentials, or an SSH key with its
    /// known_hosts). Without it the workers' CAIRN_GIT_* variables are used.
    #[arg(long, value_name = "NAME")]
    credentials: Option<String>,
    /// Why (recorded in history).
    #[arg(long)]
    reason: Option<String>,
}

/// Connectors: keep a dataset equal to a folder or a git repository, deletions included.
#[derive(Debug, clap::Args)]
pub struct ConnectorArgs {
    #[command(subcommand)]
    command: ConnectorCommand,
    /// Print the server's JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

/// `30s`, `10m`, `2h` or `1d` as milliseconds.
fn interval_ms(text: &str) -> anyhow::Result<i64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: i64 = number
        .parse()
        .with_context(|| format!("`{text}` is not a duration such as 30s, 10m, 2h or 1d"))?;
    let scale = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => anyhow::bail!("`{text}`: the unit must be s, m, h or d"),
    };
    number
        .checked_mul(scale)
        .context("the interval is too long")
}

fn line(connector: &Value) -> String {
    let every = connector["interval_ms"].as_i64().unwrap_or(0) / 1000;
    format!(
        "{}  {:<8} {:<7} {} -> {}  every {every} s",
        connector["id"].as_str().unwrap_or("?"),
        connector["state"].as_str().unwrap_or("?"),
        connector["kind"].as_str().unwrap_or("?"),
        connector["location"].as_str().unwrap_or("?"),
        connector["dataset"].as_str().unwrap_or("?"),
    )
}

fn print_runs(runs: &[Value]) {
    for run in runs {
        let job = &run["job"];
        let report = &run["report"];
        println!(
            "  run {}  {:<10} {}",
            job["id"].as_str().unwrap_or("?"),
            job["state"].as_str().unwrap_or("?"),
            job["last_error_message"].as_str().unwrap_or(""),
        );
        if report.is_object() {
            println!(
                "    {}: added {}, changed {}, unchanged {}, removed {}, skipped {}, failed {}, \
                 conflicts {}; access changed {} ({} hashed, {} ms)",
                report["stage"].as_str().unwrap_or("?"),
                report["added"],
                report["changed"],
                report["unchanged"],
                report["removed"],
                report["skipped"],
                report["failed"],
                report["conflicts"],
                report["access_changed"],
                report["hashed"],
                report["elapsed_ms"],
            );
            for file in report["files"].as_array().into_iter().flatten() {
                println!(
                    "      {} {} ({}): {}",
                    file["outcome"].as_str().unwrap_or("?"),
                    file["path"].as_str().unwrap_or("?"),
                    file["code"].as_str().unwrap_or("?"),
                    file["detail"].as_str().unwrap_or(""),
                );
            }
        }
    }
}

fn print_changed(what: &str, answer: &Value) {
    println!("{what}: {}", line(&answer["connector"]));
    if let Some(run) = answer["run"].as_object() {
        println!(
            "  run {} {} ({})",
            run.get("id").and_then(Value::as_str).unwrap_or("?"),
            run.get("state").and_then(Value::as_str).unwrap_or("?"),
            run.get("run_at_rule").and_then(Value::as_str).unwrap_or(""),
        );
    }
}

async fn change(
    api: &Client,
    what: &str,
    call: (reqwest::Method, String),
    json: bool,
) -> anyhow::Result<()> {
    let (method, path) = call;
    let (status, answer) = if method == reqwest::Method::DELETE {
        api.delete(&path).await?
    } else {
        api.post(&path, &Value::Null).await?
    };
    let answer = ok_or_error(status, answer)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        print_changed(what, &answer);
    }
    Ok(())
}

impl ConnectorArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let ConnectorArgs {
            command,
            json,
            client,
        } = self;
        let api = client.connect()?;
        let print = |value: &Value| -> anyhow::Result<()> {
            println!("{}", serde_json::to_string_pretty(value)?);
            Ok(())
        };
        match command {
            ConnectorCommand::Add(add) => {
                let AddArgs {
                    kind,
                    location,
                    dataset,
                    every,
                    include,
                    exclude,
                    max_file_bytes,
                    git_ref,
                    access,
                    access_from,
                    access_file,
                    credentials,
                    reason,
                } = *add;
                // A relative path is resolved here, where the operator typed it; a URL is sent
                // as typed.
                let remote = connectors::remote::is_remote(&location);
                let location = if (kind == "folder" || kind == "git") && !remote {
                    std::path::absolute(&location)
                        .with_context(|| format!("resolving {location}"))?
                        .to_string_lossy()
                        .into_owned()
                } else {
                    location
                };
                let mut body = json!({
                    "dataset": dataset,
                    "kind": kind,
                    "location": location,
                    "include": include,
                    "exclude": exclude,
                });
                if let Some(every) = every {
                    body["interval_ms"] = json!(interval_ms(&every)?);
                }
                if let Some(bytes) = max_file_bytes {
                    body["max_file_bytes"] = json!(bytes);
                }
                if let Some(git_ref) = git_ref {
                    body["ref"] = json!(git_ref);
                }
                let mut readers = json!({});
                if !access.is_empty() {
                    readers["readers"] = json!(access);
                }
                if let Some(from) = access_from {
                    readers["from"] = json!(from);
                }
                if let Some(file) = access_file {
                    readers["file"] = json!(file);
                }
                body["access"] = readers;
                if let Some(credentials) = credentials {
                    body["credentials"] = json!(credentials);
                }
                if let Some(reason) = reason {
                    body["reason"] = json!(reason);
                }
                let (status, answer) = api.post("/v1/connectors", &body).await?;
                let answer = ok_or_error(status, answer)?;
                if json {
                    print(&answer)?;
                } else {
                    print_changed("created", &answer);
                }
            }
            ConnectorCommand::List => {
                let answer = api.get("/v1/connectors").await?;
                if json {
                    print(&answer)?;
                } else {
                    let connectors = answer["connectors"].as_array().cloned().unwrap_or_default();
                    if connectors.is_empty() {
                        println!("no connectors");
                    }
                    for entry in &connectors {
                        println!("{}", line(&entry["connector"]));
                        if let Some(run) = entry["last_run"].as_object() {
                            print_runs(&[Value::Object(run.clone())]);
                        }
                    }
                }
            }
            ConnectorCommand::Show { id } | ConnectorCommand::Runs { id } => {
                let answer = api.get(&format!("/v1/connectors/{id}")).await?;
                if json {
                    print(&answer)?;
                } else {
                    println!("{}", line(&answer["connector"]));
                    let runs = answer["runs"].as_array().cloned().unwrap_or_default();
                    print_runs(&runs);
                }
            }
            ConnectorCommand::Run { id, reason } => {
                let path = with_query(
                    &format!("/v1/connectors/{id}/run"),
                    reason.as_deref(),
                    false,
                )?;
                change(&api, "run", (reqwest::Method::POST, path), json).await?;
            }
            ConnectorCommand::Pause { id, reason } => {
                let path = with_query(
                    &format!("/v1/connectors/{id}/pause"),
                    reason.as_deref(),
                    false,
                )?;
                change(&api, "paused", (reqwest::Method::POST, path), json).await?;
            }
            ConnectorCommand::Resume { id, reason } => {
                let path = with_query(
                    &format!("/v1/connectors/{id}/resume"),
                    reason.as_deref(),
                    false,
                )?;
                change(&api, "resumed", (reqwest::Method::POST, path), json).await?;
            }
            ConnectorCommand::Remove {
                id,
                tombstone,
                reason,
            } => {
                let path = with_query(
                    &format!("/v1/connectors/{id}"),
                    reason.as_deref(),
                    tombstone,
                )?;
                change(&api, "removed", (reqwest::Method::DELETE, path), json).await?;
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_read_as_operators_write_them() {
        assert_eq!(interval_ms("30s").ok(), Some(30_000));
        assert_eq!(interval_ms("10m").ok(), Some(600_000));
        assert_eq!(interval_ms("1d").ok(), Some(86_400_000));
        assert!(interval_ms("10").is_err());
        assert!(interval_ms("m").is_err());
        assert!(interval_ms("5w").is_err());
    }

    #[test]
    fn reasons_are_encoded_in_the_query() {
        assert_eq!(
            with_query("/v1/connectors/x", Some("a b&c"), true)
                .ok()
                .as_deref(),
            Some("/v1/connectors/x?reason=a+b%26c&tombstone=true")
        );
        assert_eq!(
            with_query("/v1/connectors/x/run", None, false)
                .ok()
                .as_deref(),
            Some("/v1/connectors/x/run")
        );
    }
}
