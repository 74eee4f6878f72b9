//! `cairn webhook`: subscriptions to events and their deliveries, through the server's
//! webhooks API.

use std::process::ExitCode;

use clap::Subcommand;
use serde_json::{json, Value};

use super::{with_query, ClientArgs};
use crate::cli::client::{ok_or_error, Client};

#[derive(Debug, Subcommand)]
enum WebhookCommand {
    /// Subscribe a URL to events; prints its signing secret, once.
    Create {
        /// Where deliveries go (https, or http to a host in webhooks.allow_hosts).
        url: String,
        /// An event type to deliver (repeatable; default every type).
        #[arg(long = "event", value_name = "TYPE")]
        events: Vec<String>,
        /// A dataset whose events to deliver (repeatable; default every dataset the token
        /// may read).
        #[arg(long = "dataset")]
        datasets: Vec<String>,
        /// What it is for.
        #[arg(long, default_value = "")]
        description: String,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Every subscription the token may see, with its deliveries counted.
    List,
    /// One subscription, its deliveries counted, and its history.
    Show {
        /// Webhook id.
        id: String,
    },
    /// Stop delivering; events wait and go when resumed.
    Pause {
        /// Webhook id.
        id: String,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Deliver again (after a pause, or a 410 that disabled it).
    Resume {
        /// Webhook id.
        id: String,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// A new signing secret, printed once; the old one signs too for the grace period.
    RotateSecret {
        /// Webhook id.
        id: String,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Delete for good; waiting deliveries are discarded.
    Delete {
        /// Webhook id.
        id: String,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// A subscription's deliveries, oldest first.
    Deliveries {
        /// Webhook id.
        id: String,
        /// Only this state (pending, delivering, delivered, dead, discarded).
        #[arg(long)]
        state: Option<String>,
        /// After this sequence number.
        #[arg(long, default_value_t = 0)]
        after: i64,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Dead deliveries pending again (one with --seq, else all), with a fresh retry span.
    Retry {
        /// Webhook id.
        id: String,
        /// One event's delivery.
        #[arg(long)]
        seq: Option<i64>,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Dead deliveries dropped (one with --seq, else all).
    Discard {
        /// Webhook id.
        id: String,
        /// One event's delivery.
        #[arg(long)]
        seq: Option<i64>,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Deliver again every event from a sequence number on.
    Replay {
        /// Webhook id.
        id: String,
        /// The first event's sequence number.
        #[arg(long)]
        from: i64,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// Webhooks: subscriptions to cairn's events, signed (Standard Webhooks) and delivered at
/// least once, in order per source.
#[derive(Debug, clap::Args)]
pub struct WebhookArgs {
    #[command(subcommand)]
    command: WebhookCommand,
    /// Print the server's JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

fn line(entry: &Value) -> String {
    let webhook = &entry["webhook"];
    let counts = &entry["deliveries"];
    let events = match webhook["events"].as_array() {
        Some(list) if !list.is_empty() => list
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(","),
        _ => "every event".to_owned(),
    };
    let datasets = match webhook["datasets"].as_array() {
        Some(list) => list
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(","),
        None => "every dataset".to_owned(),
    };
    let mut text = format!(
        "{}  {:<8} {}  [{events}] [{datasets}]",
        webhook["id"].as_str().unwrap_or("?"),
        webhook["state"].as_str().unwrap_or("?"),
        webhook["url"].as_str().unwrap_or("?"),
    );
    if counts.is_object() {
        text.push_str(&format!(
            "\n  deliveries: {} pending, {} delivering, {} delivered, {} dead, {} discarded",
            counts["pending"],
            counts["delivering"],
            counts["delivered"],
            counts["dead"],
            counts["discarded"]
        ));
    }
    if let Some(reason) = webhook["disabled_reason"].as_str() {
        text.push_str(&format!("\n  disabled: {reason}"));
    }
    text
}

async fn post(api: &Client, path: String, body: &Value) -> anyhow::Result<Value> {
    let (status, answer) = api.post(&path, body).await?;
    ok_or_error(status, answer)
}

impl WebhookArgs {
    /// Runs the command.
    pub async fn run(self) -> anyhow::Result<ExitCode> {
        let WebhookArgs {
            command,
            json,
            client,
        } = self;
        let api = client.connect()?;
        let answer = match command {
            WebhookCommand::Create {
                url,
                events,
                datasets,
                description,
                reason,
            } => {
                let mut body = json!({"url": url, "events": events, "description": description});
                if !datasets.is_empty() {
                    body["datasets"] = json!(datasets);
                }
                if let Some(reason) = reason {
                    body["reason"] = json!(reason);
                }
                let answer = post(&api, "/v1/webhooks".to_owned(), &body).await?;
                if !json {
                    println!("created: {}", line(&answer));
                    println!(
                        "signing secret (shown once; configure it in the receiver): {}",
                        answer["secret"].as_str().unwrap_or("?")
                    );
                    return Ok(ExitCode::SUCCESS);
                }
                answer
            }
            WebhookCommand::List => {
                let answer = api.get("/v1/webhooks").await?;
                if !json {
                    let all = answer["webhooks"].as_array().cloned().unwrap_or_default();
                    if all.is_empty() {
                        println!("no webhooks");
                    }
                    for entry in &all {
                        println!("{}", line(entry));
                    }
                    return Ok(ExitCode::SUCCESS);
                }
                answer
            }
            WebhookCommand::Show { id } => {
                let answer = api.get(&format!("/v1/webhooks/{id}")).await?;
                if !json {
                    println!("{}", line(&answer));
                    for entry in answer["history"].as_array().into_iter().flatten() {
                        println!(
                            "  {} {} -> {} by {}: {}",
                            entry["event"].as_str().unwrap_or("?"),
                            entry["from"].as_str().unwrap_or("-"),
                            entry["to"].as_str().unwrap_or("-"),
                            entry["actor"].as_str().unwrap_or("?"),
                            entry["cause"].as_str().unwrap_or(""),
                        );
                    }
                    return Ok(ExitCode::SUCCESS);
                }
                answer
            }
            WebhookCommand::Pause { id, reason } => {
                let path = with_query(
                    &format!("/v1/webhooks/{id}/pause"),
                    reason.as_deref(),
                    false,
                )?;
                post(&api, path, &Value::Null).await?
            }
            WebhookCommand::Resume { id, reason } => {
                let path = with_query(
                    &format!("/v1/webhooks/{id}/resume"),
                    reason.as_deref(),
                    false,
                )?;
                post(&api, path, &Value::Null).await?
            }
            WebhookCommand::RotateSecret { id, reason } => {
                let path = with_query(
                    &format!("/v1/webhooks/{id}/rotate-secret"),
                    reason.as_deref(),
                    false,
                )?;
                let answer = post(&api, path, &Value::Null).await?;
                if !json {
                    println!("rotated: {}", line(&answer));
                    println!(
                        "new signing secret (shown once): {}",
                        answer["secret"].as_str().unwrap_or("?")
                    );
                    return Ok(ExitCode::SUCCESS);
                }
                answer
            }
            WebhookCommand::Delete { id, reason } => {
                let path = with_query(&format!("/v1/webhooks/{id}"), reason.as_deref(), false)?;
                let (status, answer) = api.delete(&path).await?;
                ok_or_error(status, answer)?
            }
            WebhookCommand::Deliveries {
                id,
                state,
                after,
                limit,
            } => {
                let mut path = format!("/v1/webhooks/{id}/deliveries?after={after}&limit={limit}");
                if let Some(state) = state {
                    path.push_str(&format!("&state={state}"));
                }
                let answer = api.get(&path).await?;
                if !json {
                    for delivery in answer["deliveries"].as_array().into_iter().flatten() {
                        println!(
                            "{:>8}  {:<10} attempt {}  last status {}  {}",
                            delivery["seq"],
                            delivery["state"].as_str().unwrap_or("?"),
                            delivery["attempt"],
                            delivery["last_status"],
                            delivery["last_error"].as_str().unwrap_or(""),
                        );
                    }
                    return Ok(ExitCode::SUCCESS);
                }
                answer
            }
            WebhookCommand::Retry { id, seq, reason } => {
                post(
                    &api,
                    format!("/v1/webhooks/{id}/deliveries/retry"),
                    &json!({"seq": seq, "reason": reason}),
                )
                .await?
            }
            WebhookCommand::Discard { id, seq, reason } => {
                post(
                    &api,
                    format!("/v1/webhooks/{id}/deliveries/discard"),
                    &json!({"seq": seq, "reason": reason}),
                )
                .await?
            }
            WebhookCommand::Replay { id, from, reason } => {
                post(
                    &api,
                    format!("/v1/webhooks/{id}/replay"),
                    &json!({"from": from, "reason": reason}),
                )
                .await?
            }
        };
        if json {
            println!("{}", serde_json::to_string_pretty(&answer)?);
        } else {
            println!("{}", line(&answer));
            if let Some(count) = answer["deliveries"].as_u64() {
                println!("  deliveries touched: {count}");
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}
