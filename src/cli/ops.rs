//! `cairn ops ...`: the operations API as readable tables (or `--json`).

use anyhow::bail;
use serde_json::{json, Value};

use crate::cli::client::{ok_or_error, Client};

/// A filter for listings and bulk actions.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Dataset.
    pub dataset: Option<String>,
    /// Error code.
    pub error_code: Option<String>,
    /// States (comma-separated).
    pub state: Option<String>,
    /// Source key text, job id or revision id.
    pub q: Option<String>,
}

impl Filter {
    fn query(&self, limit: u32) -> String {
        let mut parts = vec![format!("limit={limit}")];
        for (key, value) in [
            ("dataset", &self.dataset),
            ("error_code", &self.error_code),
            ("state", &self.state),
            ("q", &self.q),
        ] {
            if let Some(value) = value {
                parts.push(format!("{key}={}", encode(value)));
            }
        }
        format!("?{}", parts.join("&"))
    }

    fn body(&self) -> Value {
        json!({
            "dataset": self.dataset,
            "error_code": self.error_code,
            "q": self.q,
            "states": self.state.as_ref().map(|states| {
                states.split(',').map(|state| state.trim().to_owned()).collect::<Vec<_>>()
            }),
        })
    }
}

/// Percent-encodes a query parameter value.
pub(crate) fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

pub(crate) fn text(value: &Value, key: &str) -> String {
    match value.get(key) {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Null) | None => "-".to_owned(),
        Some(other) => other.to_string(),
    }
}

/// A signed duration for a table: `12.5s`, `3m05s`, `26h10m`, `-` when absent.
pub(crate) fn duration(ms: Option<i64>) -> String {
    let Some(ms) = ms else {
        return "-".to_owned();
    };
    let sign = if ms < 0 { "-" } else { "" };
    let seconds = ms.unsigned_abs() as f64 / 1000.0;
    if seconds < 60.0 {
        format!("{sign}{seconds:.1}s")
    } else if seconds < 3600.0 {
        format!(
            "{sign}{}m{:02}s",
            (seconds / 60.0) as u64,
            (seconds % 60.0) as u64
        )
    } else {
        format!(
            "{sign}{}h{:02}m",
            (seconds / 3600.0) as u64,
            ((seconds % 3600.0) / 60.0) as u64
        )
    }
}

fn clip(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_owned()
    } else {
        let mut clipped: String = text.chars().take(width.saturating_sub(1)).collect();
        clipped.push('…');
        clipped
    }
}

/// Prints rows under headers, each column as wide as its widest cell.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|header| header.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.iter().map(|header| (*header).to_owned()).collect());
    for row in rows {
        line(row.clone());
    }
}

fn jobs(page: &Value) -> Vec<Value> {
    page.get("jobs")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn footer(page: &Value, shown: usize) {
    let total = page.get("total").and_then(Value::as_i64).unwrap_or(0);
    if total as usize > shown {
        println!("{shown} of {total} shown (use --limit, or filters)");
    } else {
        println!("{total} job(s)");
    }
}

pub(crate) fn print(value: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// `cairn ops status`.
pub async fn status(client: &Client, as_json: bool) -> anyhow::Result<()> {
    let summary = client.get("/v1/ops/summary").await?;
    if as_json {
        return print(&summary);
    }
    let number = |key: &str| summary.get(key).and_then(Value::as_i64).unwrap_or(0);
    println!(
        "queued {} (due {}), running {}, completions/min {:.1}, retries/min {:.1} (last hour)",
        number("queue_depth"),
        number("due"),
        number("running"),
        summary
            .get("completions_per_minute")
            .and_then(Value::as_f64)
            .unwrap_or(0.0),
        summary
            .get("retries_per_minute")
            .and_then(Value::as_f64)
            .unwrap_or(0.0),
    );
    println!(
        "oldest lease {}, max heartbeat age {}",
        duration(summary.get("oldest_lease_age_ms").and_then(Value::as_i64)),
        duration(summary.get("max_heartbeat_age_ms").and_then(Value::as_i64)),
    );
    let mut rows = Vec::new();
    for name in ["enqueue_to_start", "accepted_to_searchable"] {
        let latency = summary.get(name).cloned().unwrap_or(Value::Null);
        let at = |key: &str| {
            duration(
                latency
                    .get(key)
                    .and_then(Value::as_f64)
                    .map(|value| value as i64),
            )
        };
        rows.push(vec![
            name.replace('_', " "),
            text(&latency, "count"),
            at("p50_ms"),
            at("p95_ms"),
            at("p99_ms"),
        ]);
    }
    table(
        &["latency (last hour)", "count", "p50", "p95", "p99"],
        &rows,
    );
    let states: Vec<String> = summary
        .get("jobs")
        .and_then(Value::as_object)
        .map(|map| {
            map.iter()
                .map(|(state, n)| format!("{state} {n}"))
                .collect()
        })
        .unwrap_or_default();
    println!("jobs: {}", states.join(", "));
    let pauses = summary
        .get("pauses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if pauses.is_empty() {
        println!("claiming: running");
    }
    for pause in pauses {
        println!(
            "claiming PAUSED for {} by {}: {}",
            pause
                .get("dataset")
                .and_then(Value::as_str)
                .unwrap_or("every dataset"),
            text(&pause, "actor"),
            text(&pause, "reason"),
        );
    }
    Ok(())
}

/// A job listing: the page as JSON, or a table of `columns` with one row per job.
async fn listing(
    client: &Client,
    path: &str,
    filter: &Filter,
    limit: u32,
    as_json: bool,
    columns: &[&str],
    row: fn(&Value) -> Vec<String>,
) -> anyhow::Result<()> {
    let page = client
        .get(&format!("/v1/ops/{path}{}", filter.query(limit)))
        .await?;
    if as_json {
        return print(&page);
    }
    let list = jobs(&page);
    let rows: Vec<Vec<String>> = list.iter().map(row).collect();
    table(columns, &rows);
    footer(&page, list.len());
    Ok(())
}

fn error_of(job: &Value) -> String {
    format!(
        "{}: {}",
        text(job, "last_error_code"),
        clip(&text(job, "last_error_message"), 60)
    )
}

fn ms_of(job: &Value, key: &str) -> String {
    duration(job.get(key).and_then(Value::as_i64))
}

/// `cairn ops leases`.
pub async fn leases(
    client: &Client,
    filter: &Filter,
    limit: u32,
    as_json: bool,
) -> anyhow::Result<()> {
    let columns = [
        "job",
        "dataset",
        "source",
        "worker",
        "stage",
        "attempt",
        "lease left",
        "heartbeat age",
        "deadline in",
    ];
    listing(client, "leases", filter, limit, as_json, &columns, |job| {
        let late = job.get("heartbeat_late").and_then(Value::as_bool) == Some(true);
        vec![
            text(job, "id"),
            text(job, "dataset"),
            clip(&text(job, "source_key"), 32),
            text(job, "lease_owner"),
            text(job, "stage"),
            format!(
                "{} of {}",
                job.get("attempt").and_then(Value::as_i64).unwrap_or(0) + 1,
                text(job, "max_attempts")
            ),
            ms_of(job, "lease_expires_in_ms"),
            format!(
                "{}{}",
                ms_of(job, "heartbeat_age_ms"),
                if late { " LATE" } else { "" }
            ),
            ms_of(job, "deadline_in_ms"),
        ]
    })
    .await
}

/// `cairn ops retries`.
pub async fn retries(
    client: &Client,
    filter: &Filter,
    limit: u32,
    as_json: bool,
) -> anyhow::Result<()> {
    let columns = [
        "job",
        "dataset",
        "source",
        "next run in",
        "rule",
        "last error",
        "errors so far",
    ];
    listing(client, "retries", filter, limit, as_json, &columns, |job| {
        let attempts = job
            .get("attempts")
            .and_then(Value::as_array)
            .map(|attempts| {
                attempts
                    .iter()
                    .map(|attempt| text(attempt, "error_code"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        vec![
            text(job, "id"),
            text(job, "dataset"),
            clip(&text(job, "source_key"), 32),
            ms_of(job, "due_in_ms"),
            clip(&text(job, "run_at_rule"), 60),
            error_of(job),
            attempts,
        ]
    })
    .await
}

/// `cairn ops dead`.
pub async fn dead(
    client: &Client,
    filter: &Filter,
    limit: u32,
    as_json: bool,
) -> anyhow::Result<()> {
    let columns = [
        "job",
        "state",
        "dataset",
        "source",
        "why (by)",
        "last error",
        "attempts",
        "lost leases",
    ];
    listing(client, "dead", filter, limit, as_json, &columns, |job| {
        vec![
            text(job, "id"),
            text(job, "state"),
            text(job, "dataset"),
            clip(&text(job, "source_key"), 32),
            format!(
                "{} ({})",
                clip(&text(job, "change_cause"), 50),
                text(job, "changed_by")
            ),
            error_of(job),
            format!("{} of {}", text(job, "attempt"), text(job, "max_attempts")),
            text(job, "crashes"),
        ]
    })
    .await
}

/// `cairn ops job ID`: the job, its history, receipts and revision chain.
pub async fn job(client: &Client, id: &str, as_json: bool) -> anyhow::Result<()> {
    let detail = client.get(&format!("/v1/ops/jobs/{}", encode(id))).await?;
    if as_json {
        return print(&detail);
    }
    let job = detail.get("job").cloned().unwrap_or(Value::Null);
    println!(
        "job {}: {} {} of {}/{} (revision {})",
        text(&job, "id"),
        text(&job, "state"),
        text(&job, "kind"),
        text(&job, "dataset"),
        text(&job, "source_key"),
        text(&job, "revision_id")
    );
    println!(
        "attempt {} of {}, {} lost lease(s); run_at rule: {}",
        text(&job, "attempt"),
        text(&job, "max_attempts"),
        text(&job, "crashes"),
        text(&job, "run_at_rule")
    );
    if job.get("lease_owner").is_some_and(|owner| !owner.is_null()) {
        println!(
            "running on {} at stage {}, lease left {}, heartbeat {} ago",
            text(&job, "lease_owner"),
            text(&job, "stage"),
            duration(job.get("lease_expires_in_ms").and_then(Value::as_i64)),
            duration(job.get("heartbeat_age_ms").and_then(Value::as_i64)),
        );
    }
    println!("history:");
    let rows: Vec<Vec<String>> = detail
        .get("history")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|entry| {
            let error = match entry.get("error_code").and_then(Value::as_str) {
                Some(code) => format!(" [{code}: {}]", text(entry, "error_message")),
                None => String::new(),
            };
            vec![
                text(entry, "at"),
                format!("{} -> {}", text(entry, "from"), text(entry, "to")),
                text(entry, "actor"),
                format!("{}{error}", text(entry, "cause")),
            ]
        })
        .collect();
    table(&["at (µs)", "transition", "actor", "cause"], &rows);
    println!("receipts:");
    let rows: Vec<Vec<String>> = detail
        .get("receipts")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|entry| {
            let receipt = entry.get("receipt").cloned().unwrap_or(Value::Null);
            vec![
                text(&receipt, "backend"),
                text(&receipt, "state"),
                clip(
                    &receipt
                        .get("evidence")
                        .map(Value::to_string)
                        .unwrap_or_default(),
                    100,
                ),
            ]
        })
        .collect();
    table(&["backend", "state", "read-back evidence"], &rows);
    if let Some(source) = detail.get("source").filter(|source| !source.is_null()) {
        let head = text(source, "head_revision_id");
        println!("revision chain (newest first):");
        for revision in source
            .get("revisions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
        {
            let id = text(&revision, "id");
            println!(
                "  {id}{} accepted {} by {}",
                if id == head { " (head)" } else { "" },
                text(&revision, "accepted_at"),
                text(&revision, "actor")
            );
        }
    }
    Ok(())
}

/// What `cairn ops requeue|cancel` acts on.
#[derive(Debug, Clone)]
pub enum Target {
    /// One job.
    Job(String),
    /// Every job matching a filter.
    Matching(Filter),
}

/// `cairn ops requeue|cancel`: one job, or every job matching a filter. A bulk action without
/// `yes` is a dry run that lists the candidates.
pub async fn act(
    client: &Client,
    action: &str,
    target: Target,
    reason: Option<String>,
    yes: bool,
    as_json: bool,
) -> anyhow::Result<()> {
    match target {
        Target::Job(id) => {
            let (status, answer) = client
                .post(
                    &format!("/v1/ops/jobs/{}/{action}", encode(&id)),
                    &json!({ "reason": reason }),
                )
                .await?;
            let answer = ok_or_error(status, answer)?;
            if as_json {
                return print(&answer);
            }
            let job = answer.get("job").cloned().unwrap_or(Value::Null);
            println!(
                "{action}: job {} is now {}{}",
                text(&job, "id"),
                text(&job, "state"),
                if job.get("cancel_requested").and_then(Value::as_bool) == Some(true) {
                    " (asked to stop at its next heartbeat)"
                } else {
                    ""
                }
            );
        }
        Target::Matching(filter) => {
            if filter.dataset.is_none()
                && filter.error_code.is_none()
                && filter.q.is_none()
                && filter.state.is_none()
                && yes
            {
                bail!("a bulk {action} needs at least one filter (--dataset, --error-code, --state or --query)");
            }
            let mut body = filter.body();
            body["dry_run"] = json!(!yes);
            body["reason"] = json!(reason);
            let (status, answer) = client.post(&format!("/v1/ops/{action}"), &body).await?;
            let answer = ok_or_error(status, answer)?;
            if as_json {
                return print(&answer);
            }
            let candidates = answer
                .get("candidates")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let rows: Vec<Vec<String>> = candidates
                .iter()
                .map(|job| {
                    vec![
                        text(job, "id"),
                        text(job, "state"),
                        text(job, "dataset"),
                        clip(&text(job, "source_key"), 40),
                        text(job, "last_error_code"),
                    ]
                })
                .collect();
            table(&["job", "state", "dataset", "source", "last error"], &rows);
            if yes {
                let done = answer
                    .get("done")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                let failed = answer
                    .get("failed")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                println!("{action}: {done} done, {} refused", failed.len());
                for failure in failed {
                    println!(
                        "  {}: {} {}",
                        text(&failure, "id"),
                        text(&failure, "code"),
                        text(&failure, "message")
                    );
                }
            } else {
                println!(
                    "dry run: {} job(s) match; run again with --yes to {action} them",
                    text(&answer, "matched")
                );
            }
        }
    }
    Ok(())
}

/// `cairn ops pause|resume [--dataset D]`.
pub async fn pause(
    client: &Client,
    action: &str,
    dataset: Option<String>,
    reason: Option<String>,
    as_json: bool,
) -> anyhow::Result<()> {
    let (status, answer) = client
        .post(
            &format!("/v1/ops/{action}"),
            &json!({ "dataset": dataset, "reason": reason }),
        )
        .await?;
    let answer = ok_or_error(status, answer)?;
    if as_json {
        return print(&answer);
    }
    let pauses = answer
        .get("pauses")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if pauses.is_empty() {
        println!("claiming runs for every dataset");
    }
    for (dataset, pause) in pauses {
        println!(
            "paused: {} (by {}: {})",
            if dataset == "*" {
                "every dataset"
            } else {
                &dataset
            },
            text(&pause, "actor"),
            text(&pause, "reason")
        );
    }
    Ok(())
}
