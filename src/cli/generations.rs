//! `cairn generation ...`: projection generations through the ops API, as readable tables (or
//! `--json`).

use serde_json::{json, Value};

use crate::cli::client::{ok_or_error, Client};
use crate::cli::ops::{encode, print, table, text};

fn number(value: &Value, key: &str) -> i64 {
    value.get(key).and_then(Value::as_i64).unwrap_or(0)
}

/// One generation as a table row.
fn row(generation: &Value) -> Vec<String> {
    let progress = generation.get("progress").cloned().unwrap_or(Value::Null);
    let live = matches!(
        text(generation, "state").as_str(),
        "building" | "active" | "standby"
    );
    let rate = progress
        .get("rate_per_s")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    let eta = progress
        .get("eta_s")
        .and_then(Value::as_f64)
        .map_or("-".to_owned(), |seconds| format!("{seconds:.0}s"));
    let backends = generation
        .get("backends")
        .and_then(Value::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("+")
        })
        .unwrap_or_default();
    // A cluster's collection layout belongs to the vector backend.
    let layout = text(generation, "vector_layout");
    let backends = if layout.is_empty() {
        backends
    } else {
        format!("{backends} ({layout})")
    };
    vec![
        text(generation, "id"),
        text(generation, "state"),
        if live {
            format!(
                "{}/{}",
                number(&progress, "verified"),
                number(&progress, "heads")
            )
        } else {
            "-".to_owned()
        },
        if live {
            format!("{rate:.1}/s")
        } else {
            "-".to_owned()
        },
        if live { eta } else { "-".to_owned() },
        number(&progress, "failed").to_string(),
        number(&progress, "open_jobs").to_string(),
        text(generation, "chunker"),
        backends,
    ]
}

fn show(generations: &[Value]) {
    table(
        &[
            "GENERATION",
            "STATE",
            "VERIFIED",
            "RATE",
            "ETA",
            "FAILED",
            "OPEN JOBS",
            "CHUNKER",
            "BACKENDS",
        ],
        &generations.iter().map(row).collect::<Vec<_>>(),
    );
}

/// `cairn generation status`.
pub async fn status(client: &Client, as_json: bool) -> anyhow::Result<()> {
    let answer = client.get("/v1/ops/generations").await?;
    if as_json {
        return print(&answer);
    }
    let generations = answer
        .get("generations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if generations.is_empty() {
        println!("no generation yet: the first projection worker records one");
        return Ok(());
    }
    show(&generations);
    Ok(())
}

/// What a change answered, for people.
fn changed(answer: &Value, as_json: bool, what: &str) -> anyhow::Result<()> {
    if as_json {
        return print(answer);
    }
    let generation = answer.get("generation").cloned().unwrap_or(Value::Null);
    let change = answer.get("change").cloned().unwrap_or(Value::Null);
    show(std::slice::from_ref(&generation));
    match what {
        "create" => println!(
            "building {}: {} rebuild job(s) queued; new documents are projected into it too. \
             Follow it with `cairn generation status`; switch with `cairn generation switch {}`.",
            text(&generation, "id"),
            number(&change, "jobs"),
            text(&generation, "id")
        ),
        "switch" => {
            println!(
                "{} is active: search answers from it from the next query on; the previous \
                 generation {} is on standby (switch back to roll back).",
                text(&generation, "id"),
                change
                    .get("previous")
                    .and_then(Value::as_str)
                    .unwrap_or("(none)")
            );
            if number(&change, "missing") > 0 {
                println!(
                    "forced: {} head(s) were not verified in it (for example {}); they are \
                     searchable lexically until projected",
                    number(&change, "missing"),
                    change
                        .get("missing_sample")
                        .and_then(Value::as_array)
                        .map(|names| names
                            .iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join(", "))
                        .unwrap_or_default()
                );
            }
        }
        _ => println!(
            "retired {}: {} job(s) cancelled, {} chunk row(s) deleted; evidence: {}",
            text(&generation, "id"),
            number(&change, "jobs"),
            number(&change, "chunk_rows_deleted"),
            generation
                .get("retired_evidence")
                .map(Value::to_string)
                .unwrap_or_default()
        ),
    }
    Ok(())
}

/// The settings of `cairn generation create`.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Embedding model.
    pub model: Option<String>,
    /// Most tokens per chunk.
    pub max_tokens: Option<usize>,
    /// Overlap.
    pub overlap_tokens: Option<usize>,
    /// Backends.
    pub backends: Option<Vec<String>>,
    /// Rebuild priority.
    pub priority: Option<i64>,
}

/// `cairn generation create`.
pub async fn create(
    client: &Client,
    settings: Settings,
    reason: Option<String>,
    as_json: bool,
) -> anyhow::Result<()> {
    let body = json!({
        "model": settings.model,
        "max_tokens": settings.max_tokens,
        "overlap_tokens": settings.overlap_tokens,
        "backends": settings.backends,
        "priority": settings.priority,
        "reason": reason,
    });
    let (status, answer) = client.post("/v1/ops/generations", &body).await?;
    changed(&ok_or_error(status, answer)?, as_json, "create")
}

/// `cairn generation switch` and `retire`.
pub async fn act(
    client: &Client,
    action: &str,
    id: &str,
    force: bool,
    reason: Option<String>,
    as_json: bool,
) -> anyhow::Result<()> {
    let body = if action == "switch" {
        json!({ "force": force, "reason": reason })
    } else {
        json!({ "reason": reason })
    };
    let (status, answer) = client
        .post(
            &format!("/v1/ops/generations/{}/{action}", encode(id)),
            &body,
        )
        .await?;
    changed(&ok_or_error(status, answer)?, as_json, action)
}
