//! `cairn hook`: hooks for coding hosts. `prompt-submit` reads the host's hook payload (JSON
//! on stdin with the user's `prompt`), searches cairn for it and prints the hits as
//! untrusted context on stdout. A hook never blocks or breaks its host: the whole run has one
//! deadline, and any failure exits 0 with a one-line reason on stderr.

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
        /// The whole run's deadline, in milliseconds.
        #[arg(long, default_value_t = 3000)]
        deadline_ms: u64,
        #[command(flatten)]
        client: ClientArgs,
    },
}

impl HookArgs {
    /// Runs the command: always exit 0.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let HookCommand::PromptSubmit {
            datasets,
            deadline_ms,
            client,
        } = self.command;
        let deadline = Duration::from_millis(deadline_ms.max(100));
        let outcome =
            tokio::time::timeout(deadline, prompt_submit(datasets, deadline, client)).await;
        match outcome {
            Ok(Ok(Some(context))) => print!("{context}"),
            Ok(Ok(None)) => {}
            Ok(Err(error)) => eprintln!("cairn hook: no context ({error:#})"),
            Err(_) => {
                eprintln!("cairn hook: no context (cairn did not answer within {deadline_ms} ms)")
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

async fn prompt_submit(
    datasets: Vec<String>,
    deadline: Duration,
    client: ClientArgs,
) -> anyhow::Result<Option<String>> {
    let payload = tokio::task::spawn_blocking(|| {
        let mut text = String::new();
        std::io::stdin()
            .take(MAX_PAYLOAD_BYTES)
            .read_to_string(&mut text)
            .map(|_| text)
    })
    .await??;
    let payload: serde_json::Value = serde_json::from_str(&payload)
        .map_err(|error| anyhow::anyhow!("the hook payload is not JSON: {error}"))?;
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
