//! `cairn search`: current revisions, vector and lexical, fused, as a table.

use std::collections::HashMap;
use std::process::ExitCode;

use super::ClientArgs;

/// Search current revisions (vector and lexical, fused) and print a table.
#[derive(Debug, clap::Args)]
pub struct SearchArgs {
    /// The query text.
    query: String,
    /// Datasets to search (repeat; default: every dataset the token may read).
    #[arg(long = "dataset")]
    datasets: Vec<String>,
    /// Results wanted (1-100).
    #[arg(long, default_value_t = 10)]
    top_k: u32,
    /// Time budget in milliseconds (default: the server's).
    #[arg(long)]
    budget_ms: Option<u64>,
    /// auto, vector or lexical.
    #[arg(long, default_value = "auto")]
    mode: String,
    /// One result per passage instead of one per source.
    #[arg(long)]
    all_passages: bool,
    /// Print the server's JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl SearchArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let SearchArgs {
            query,
            datasets,
            top_k,
            budget_ms,
            mode,
            all_passages,
            json,
            client,
        } = self;
        let api = client.connect()?;
        let mut body = serde_json::json!({
            "query": query,
            "top_k": top_k,
            "mode": mode,
            "group_by_source": !all_passages,
        });
        if !datasets.is_empty() {
            body["datasets"] = serde_json::json!(datasets);
        }
        if let Some(budget_ms) = budget_ms {
            body["budget_ms"] = serde_json::json!(budget_ms);
        }
        crate::cli::client::search(&api, &body, json).await?;

        Ok(ExitCode::SUCCESS)
    }
}
