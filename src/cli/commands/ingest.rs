//! `cairn ingest`: files and folders sent through the batch API.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use super::ClientArgs;

/// Send files and folders to cairn through the batch API.
#[derive(Debug, clap::Args)]
pub struct IngestArgs {
    /// Files or folders (walked recursively; the source key is the path inside the folder).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Dataset to ingest into.
    #[arg(long)]
    dataset: String,
    /// Items per batch request.
    #[arg(long, default_value_t = 200)]
    batch_size: usize,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl IngestArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let IngestArgs {
            paths,
            dataset,
            batch_size,
            quiet,
            client,
        } = self;
        let api = client.connect()?;
        let summary = crate::cli::client::ingest(&api, &paths, &dataset, batch_size, quiet).await?;
        crate::cli::client::print_summary(&summary);
        if !summary.rejected.is_empty() {
            return Ok(ExitCode::from(2));
        }

        Ok(ExitCode::SUCCESS)
    }
}
