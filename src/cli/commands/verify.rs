//! `cairn verify`: fsck for every projection, through the server's verify API. Starts a pass
//! (or joins the running one of the same tier), follows it to its end, prints each confirmed
//! drift as one JSON line on stdout and a summary on stderr. Exit 0: clean; 1: drift; 2: the
//! pass could not run (a store or the ledger failed, or the server refused).

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{json, Value};

use super::ClientArgs;
use crate::cli::client::{ok_or_error, Client};

/// Checks every store against the ledger's receipts: chunk rows, vectors (counts, payloads,
/// current flags, dimensions) and, in the deep tier, retained bytes.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// `counts` (cheapest), `scrub` (every payload) or `deep` (vectors and bytes too).
    #[arg(long, default_value = "counts")]
    tier: String,
    /// Repair what the pass confirms, through the normal paths (projection jobs, retire then
    /// delete, current flags); corrupt bytes are only reported.
    #[arg(long)]
    repair: bool,
    /// The generation (default: the active one).
    #[arg(long)]
    generation: Option<String>,
    /// Why (recorded in history).
    #[arg(long)]
    reason: Option<String>,
    /// This pass's rate limit, in points read per second (a store request counts as 100),
    /// instead of `verify.points_per_second`.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    rate: Option<u32>,
    /// Start the pass and print it, without following it.
    #[arg(long)]
    no_wait: bool,
    #[command(flatten)]
    client: ClientArgs,
}

const CLEAN: u8 = 0;
const DRIFT: u8 = 1;
const ERROR: u8 = 2;

impl VerifyArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        match self.follow().await {
            Ok(code) => Ok(ExitCode::from(code)),
            Err(error) => {
                eprintln!("error: {error:#}");
                Ok(ExitCode::from(ERROR))
            }
        }
    }

    async fn follow(self) -> anyhow::Result<u8> {
        let api = self.client.connect()?;
        let body = json!({
            "tier": self.tier,
            "repair": self.repair,
            "generation": self.generation,
            "reason": self.reason,
            "rate": self.rate,
        });
        let (status, answer) = api.post("/v1/verify", &body).await?;
        let pass = ok_or_error(status, answer)?;
        let id = pass
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow::anyhow!("the server answered no pass id: {pass}"))?
            .to_owned();
        eprintln!(
            "verify pass {id}: {} over generation {}{}",
            text(&pass, "tier"),
            text(&pass, "generation"),
            if self.repair { ", repairing" } else { "" }
        );
        if self.no_wait {
            println!("{}", serde_json::to_string(&pass)?);
            return Ok(CLEAN);
        }
        let detail = wait(&api, &id).await?;
        let pass = &detail["pass"];
        let mut stdout = std::io::stdout().lock();
        let drift = detail["drift"].as_array().cloned().unwrap_or_default();
        for record in &drift {
            writeln!(stdout, "{}", serde_json::to_string(record)?)?;
        }
        stdout.flush()?;
        let state = text(pass, "state");
        eprintln!(
            "{state}: {} buckets checked, {} sources skipped as in flight, {} drift{}",
            pass["buckets_checked"],
            pass["skipped"],
            drift.len(),
            summary(&drift)
        );
        if state != "completed" {
            eprintln!("the pass did not complete: {}", text(pass, "change_cause"));
            return Ok(ERROR);
        }
        Ok(if drift.is_empty() { CLEAN } else { DRIFT })
    }
}

/// Polls the pass until it is no longer running.
async fn wait(api: &Client, id: &str) -> anyhow::Result<Value> {
    let mut last = -1;
    loop {
        let detail = api.get(&format!("/v1/verify/passes/{id}")).await?;
        let pass = &detail["pass"];
        if text(pass, "state") != "running" {
            return Ok(detail);
        }
        let checked = pass["buckets_checked"].as_i64().unwrap_or(0);
        if checked / 128 != last / 128 {
            eprintln!("  {checked} of 1024 buckets checked");
        }
        last = checked;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("?")
}

/// ` (missing 2, payload 1)`, by kind.
fn summary(drift: &[Value]) -> String {
    let mut kinds: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for record in drift {
        *kinds
            .entry(format!(
                "{} {}",
                text(record, "store"),
                text(record, "kind")
            ))
            .or_default() += 1;
    }
    if kinds.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = kinds
        .iter()
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect();
    format!(" ({})", parts.join(", "))
}
