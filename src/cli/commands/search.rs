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
    /// Search what held at this instant (RFC 3339 with an offset, or epoch microseconds).
    #[arg(long)]
    valid_at: Option<String>,
    /// Search what cairn believed at this instant (at least 5 s ago), about --valid-at.
    #[arg(long)]
    as_of: Option<String>,
    /// Only documents that match this filter (JSON, as `POST /v1/search` takes it), e.g.
    /// '{"field": "source_key", "prefix": "src/appendix"}'.
    #[arg(long, value_parser = parse_filter)]
    filter: Option<serde_json::Value>,
    /// Count a field's values over every matching source (repeat): `tags`, `media_type`,
    /// `metadata.<name>`.
    #[arg(long = "facet")]
    facets: Vec<String>,
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
            valid_at,
            as_of,
            filter,
            facets,
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
        // Digits are epoch microseconds; anything else goes as RFC 3339 for the server to read.
        let instant = |text: String| {
            text.parse::<i64>().map_or_else(
                |_| serde_json::json!(text),
                |micros| serde_json::json!(micros),
            )
        };
        if let Some(valid_at) = valid_at {
            body["valid_at"] = instant(valid_at);
        }
        if let Some(as_of) = as_of {
            body["as_of"] = instant(as_of);
        }
        if let Some(filter) = filter {
            body["filter"] = filter;
        }
        if !facets.is_empty() {
            body["facets"] = serde_json::json!(facets);
        }
        crate::cli::client::search(&api, &body, json).await?;

        Ok(ExitCode::SUCCESS)
    }
}

/// A `--filter` argument: JSON text (its meaning is the server's to check).
pub(crate) fn parse_filter(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|error| {
        format!("not JSON ({error}); a filter looks like '{{\"field\": \"tags\", \"any\": [\"async\"]}}'")
    })
}
