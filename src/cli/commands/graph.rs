//! `cairn graph`: the sources linked to a source, and their tags.

use std::collections::HashMap;
use std::process::ExitCode;

use super::ClientArgs;

/// The sources linked to a source in the graph, and their tags (bound to current revisions).
#[derive(Debug, clap::Args)]
pub struct GraphArgs {
    /// The source key.
    source_key: String,
    /// Its dataset.
    #[arg(long)]
    dataset: String,
    /// out (the sources it links to), in (those linking to it) or both.
    #[arg(long, default_value = "both")]
    direction: String,
    /// Most links (1-100).
    #[arg(long, default_value_t = 100)]
    limit: u32,
    /// Print the server's JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl GraphArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        use crate::cli::ops::encode;
        let api = self.client.connect()?;
        let answer = api
            .get(&format!(
                "/v1/graph/sources?dataset={}&source_key={}&direction={}&limit={}",
                encode(&self.dataset),
                encode(&self.source_key),
                encode(&self.direction),
                self.limit
            ))
            .await?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&answer)?);
            return Ok(ExitCode::SUCCESS);
        }
        let text = |value: &serde_json::Value| value.as_str().unwrap_or("-").to_owned();
        println!(
            "{}/{} (head {})",
            text(&answer["dataset"]),
            text(&answer["source_key"]),
            text(&answer["head_revision_id"])
        );
        let links = answer["links"].as_array().cloned().unwrap_or_default();
        if links.is_empty() {
            println!("no linked current sources");
        }
        for link in links {
            let arrow = if link["direction"] == "in" {
                "<-"
            } else {
                "->"
            };
            let tags: Vec<String> = link["tags"]
                .as_array()
                .map(|tags| tags.iter().map(text).collect())
                .unwrap_or_default();
            println!(
                "  {arrow} {}  (head {}){}",
                text(&link["source_key"]),
                text(&link["head_revision_id"]),
                if tags.is_empty() {
                    String::new()
                } else {
                    format!("  tags: {}", tags.join(", "))
                }
            );
        }
        Ok(ExitCode::SUCCESS)
    }
}
