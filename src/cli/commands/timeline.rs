//! `cairn timeline`: a source's validity time, through the API: which revision was asserted
//! over which period and when, and which revision held when, as known now.

use std::collections::HashMap;
use std::process::ExitCode;

use receipts::validity::{format_instant, Timeline, OPEN};

use super::ClientArgs;

/// A source's validity timeline: its assertions, and which revision held when as cairn
/// believes now (and believed before).
#[derive(Debug, clap::Args)]
pub struct TimelineArgs {
    /// Dataset.
    #[arg(long)]
    dataset: String,
    /// Source key.
    #[arg(long)]
    source_key: String,
    /// Print the server's JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl TimelineArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        use crate::cli::ops::encode;
        let api = self.client.connect()?;
        let answer = api
            .get(&format!(
                "/v1/sources/timeline?dataset={}&source_key={}",
                encode(&self.dataset),
                encode(&self.source_key)
            ))
            .await?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&answer)?);
            return Ok(ExitCode::SUCCESS);
        }
        let timeline: Timeline = serde_json::from_value(answer)?;
        print!("{}", render(&timeline));
        Ok(ExitCode::SUCCESS)
    }
}

/// The timeline as text: the assertions in ledger order, then what is believed now.
fn render(timeline: &Timeline) -> String {
    let revision = |id: &uuid::Uuid| {
        if timeline.tombstones.contains(id) {
            format!("{} (deleted)", short(id))
        } else {
            short(id)
        }
    };
    let mut out = String::from("assertions (ledger order):\n");
    for assertion in &timeline.assertions {
        out.push_str(&format!(
            "  #{:<3} recorded {}  {} valid [{}, {})  by {} ({})\n",
            assertion.seq,
            format_instant(assertion.recorded_at),
            revision(&assertion.revision_id),
            format_instant(assertion.valid.from),
            format_instant(assertion.valid.to),
            assertion.actor,
            assertion.cause
        ));
    }
    out.push_str("held, as known now:\n");
    let mut believed: Vec<_> = timeline
        .rectangles
        .iter()
        .filter(|rectangle| rectangle.recorded_to == OPEN)
        .collect();
    believed.sort_by_key(|rectangle| rectangle.valid.from);
    for rectangle in believed {
        out.push_str(&format!(
            "  [{}, {})  {}  (believed since {})\n",
            format_instant(rectangle.valid.from),
            format_instant(rectangle.valid.to),
            revision(&rectangle.revision_id),
            format_instant(rectangle.recorded_from)
        ));
    }
    out
}

/// The first 8 hex digits of an id.
fn short(id: &uuid::Uuid) -> String {
    id.simple().to_string()[..8].to_owned()
}
