//! `cairn hook`: hooks for coding hosts. `prompt-submit` reads the host's hook payload (JSON
//! on stdin with the user's `prompt`), searches cairn for it and prints the hits as
//! untrusted context on stdout. `session-end` reads a session-end payload, distils the
//! transcript it names (only under an allowed folder) and stores the note in a dataset. A
//! hook never blocks or breaks its host: the whole run has one deadline, and any failure
//! exits 0 with a one-line reason on stderr.

use std::collections::HashMap;
use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;

use super::ClientArgs;

/// Most bytes of hook payload read from stdin.
const MAX_PAYLOAD_BYTES: u64 = 1 << 20;

/// Hooks for coding hosts (they never fail the host: exit 0, a reason on stderr).
#[derive(Debug, clap::Args)]
pub struct HookArgs {
    #[command(subcommand)]
    command: HookCommand,
}

#[derive(Debug, Subcommand)]
enum HookCommand {
    /// Read a prompt-submit payload on stdin and print cairn's hits for it as untrusted
    /// context.
    PromptSubmit {
        /// Datasets to search (repeat; default: every dataset the token may read).
        #[arg(long = "dataset")]
        datasets: Vec<String>,
        /// Only documents that match this filter (JSON, as `POST /v1/search` takes it).
        #[arg(long, value_parser = super::search::parse_filter)]
        filter: Option<serde_json::Value>,
        /// The whole run's deadline, in milliseconds.
        #[arg(long, default_value_t = 3000)]
        deadline_ms: u64,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Read a session-end payload on stdin, distil the transcript it names (requests,
    /// answers, files; no model) and store it as a note.
    SessionEnd {
        /// The dataset the note goes to.
        #[arg(long, default_value = "sessions")]
        dataset: String,
        /// A folder transcripts may come from (repeat; default: ~/.claude/projects).
        #[arg(long = "allow")]
        allowed: Vec<std::path::PathBuf>,
        /// The whole run's deadline, in milliseconds.
        #[arg(long, default_value_t = 5000)]
        deadline_ms: u64,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// Largest transcript read, in bytes.
const MAX_TRANSCRIPT_BYTES: u64 = 16 << 20;

impl HookArgs {
    /// Runs the command: always exit 0.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        match self.command {
            HookCommand::PromptSubmit {
                datasets,
                filter,
                deadline_ms,
                client,
            } => {
                let deadline = Duration::from_millis(deadline_ms.max(100));
                let outcome = tokio::time::timeout(
                    deadline,
                    prompt_submit(datasets, filter, deadline, client),
                )
                .await;
                match outcome {
                    Ok(Ok(Some(context))) => print!("{context}"),
                    Ok(Ok(None)) => {}
                    Ok(Err(error)) => eprintln!("cairn hook: no context ({error:#})"),
                    Err(_) => eprintln!(
                        "cairn hook: no context (cairn did not answer within {deadline_ms} ms)"
                    ),
                }
            }
            HookCommand::SessionEnd {
                dataset,
                allowed,
                deadline_ms,
                client,
            } => {
                let deadline = Duration::from_millis(deadline_ms.max(100));
                let allowed = if allowed.is_empty() {
                    env.get("HOME")
                        .map(|home| vec![std::path::Path::new(home).join(".claude/projects")])
                        .unwrap_or_default()
                } else {
                    allowed
                };
                let outcome =
                    tokio::time::timeout(deadline, session_end(dataset, allowed, client)).await;
                match outcome {
                    Ok(Ok(report)) => eprintln!("cairn hook: {report}"),
                    Ok(Err(error)) => eprintln!("cairn hook: note refused ({error:#})"),
                    Err(_) => eprintln!(
                        "cairn hook: note unconfirmed (cairn did not answer within {deadline_ms}                          ms; it may still have been stored)"
                    ),
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Reads the hook payload from stdin (bounded) as JSON.
async fn payload() -> anyhow::Result<serde_json::Value> {
    let payload = tokio::task::spawn_blocking(|| {
        let mut text = String::new();
        std::io::stdin()
            .take(MAX_PAYLOAD_BYTES)
            .read_to_string(&mut text)
            .map(|_| text)
    })
    .await??;
    serde_json::from_str(&payload)
        .map_err(|error| anyhow::anyhow!("the hook payload is not JSON: {error}"))
}

async fn session_end(
    dataset: String,
    allowed: Vec<std::path::PathBuf>,
    client: ClientArgs,
) -> anyhow::Result<String> {
    let payload = payload().await?;
    let Some(path) = payload
        .get("transcript_path")
        .and_then(|path| path.as_str())
    else {
        anyhow::bail!("the hook payload has no `transcript_path`");
    };
    let session = payload
        .get("session_id")
        .and_then(|id| id.as_str())
        .unwrap_or("unknown");
    // Only a transcript under an allowed folder, after every link is resolved.
    let real = std::fs::canonicalize(path)
        .map_err(|error| anyhow::anyhow!("the transcript cannot be read: {error}"))?;
    let inside = allowed
        .iter()
        .any(|folder| std::fs::canonicalize(folder).is_ok_and(|folder| real.starts_with(folder)));
    if !inside {
        anyhow::bail!(
            "the transcript is outside the allowed folders ({}); pass --allow FOLDER",
            allowed
                .iter()
                .map(|folder| folder.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let transcript = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        std::fs::File::open(&real)?
            .take(MAX_TRANSCRIPT_BYTES)
            .read_to_string(&mut text)
            .map(|_| text)
    })
    .await??;
    let Some(note) = crate::hook::distil_transcript(&transcript, session) else {
        return Ok("no note (the transcript holds no request)".to_owned());
    };
    let session_key: String = session
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(128)
        .collect();
    let session_key = if session_key.is_empty() {
        "unknown".to_owned()
    } else {
        session_key
    };
    let source_key = format!("session/{session_key}");
    let api = client.connect()?;
    let body = serde_json::json!({
        "dataset": dataset,
        "source_key": source_key,
        "content": note,
        "media_type": "text/markdown",
        "tags": ["session-note"],
    });
    let (status, answer) = api.post("/v1/sources", &body).await?;
    let text = |key: &str| {
        answer
            .get(key)
            .and_then(|value| value.as_str())
            .unwrap_or("-")
            .to_owned()
    };
    if (200..300).contains(&status) {
        Ok(format!(
            "note accepted ({dataset}/{source_key}, revision {}, {} characters)",
            text("source_revision_id"),
            note.chars().count()
        ))
    } else {
        anyhow::bail!(
            "cairn answered {status} {}: {}",
            text("code"),
            text("message")
        )
    }
}

async fn prompt_submit(
    datasets: Vec<String>,
    filter: Option<serde_json::Value>,
    deadline: Duration,
    client: ClientArgs,
) -> anyhow::Result<Option<String>> {
    let payload = payload().await?;
    let Some(prompt) = payload.get("prompt").and_then(|prompt| prompt.as_str()) else {
        anyhow::bail!("the hook payload has no `prompt`");
    };
    let Some(query) = crate::hook::query_from_prompt(prompt) else {
        return Ok(None);
    };
    let api = client.connect()?;
    // Search gets most of the deadline; the rest is for starting and printing.
    let budget = (deadline.as_millis() as u64).saturating_mul(3) / 4;
    let mut body = serde_json::json!({
        "query": query,
        "top_k": crate::hook::MAX_HITS,
        "budget_ms": budget.clamp(50, 30_000),
    });
    if !datasets.is_empty() {
        body["datasets"] = serde_json::json!(datasets);
    }
    if let Some(filter) = filter {
        body["filter"] = filter;
    }
    let (status, answer) = api.post("/v1/search", &body).await?;
    if !(200..300).contains(&status) {
        let code = answer
            .get("code")
            .and_then(|code| code.as_str())
            .unwrap_or("error");
        anyhow::bail!("search answered {status} {code}");
    }
    Ok(crate::hook::render_context(&answer))
}
