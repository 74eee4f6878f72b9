//! `cairn ingest`: files and folders sent through the batch API; with `--prune`, a dataset
//! kept equal to a folder (only new and changed files sent, removed ones tombstoned).

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
    /// Keep the dataset equal to the one folder given: send only files that are new or
    /// changed, and tombstone sources under `--prefix` that the folder no longer has.
    #[arg(long)]
    prune: bool,
    /// With `--prune`: the key prefix the folder's files go under, and the only keys pruned
    /// (e.g. `docs/`; default: the whole dataset).
    #[arg(long, default_value = "", requires = "prune")]
    prefix: String,
    /// With `--prune`: print the difference and change nothing.
    #[arg(long, requires = "prune")]
    dry_run: bool,
    /// With `--prune`: only files whose key matches one of these globs (repeat; `**` crosses
    /// folders; default: every file).
    #[arg(long = "include", requires = "prune")]
    include: Vec<String>,
    /// With `--prune`: leave out files whose key matches one of these globs (repeat).
    #[arg(long = "exclude", requires = "prune")]
    exclude: Vec<String>,
    /// With `--prune`: largest file sent, in bytes (default: the ingest limit).
    #[arg(long, requires = "prune")]
    max_file_bytes: Option<u64>,
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
            prune,
            prefix,
            dry_run,
            include,
            exclude,
            max_file_bytes,
            client,
        } = self;
        let api = client.connect()?;
        if prune {
            let [root] = paths.as_slice() else {
                anyhow::bail!("--prune keeps a dataset equal to one folder: give exactly one");
            };
            let mut selection = connectors::Selection::new(&include, &exclude, u64::MAX)?;
            selection.max_file_bytes =
                max_file_bytes.unwrap_or(receipts::policy::DEFAULT_MAX_BODY_BYTES as u64);
            let summary = crate::cli::client::prune(
                &api, root, &dataset, &prefix, &selection, batch_size, quiet, dry_run,
            )
            .await?;
            crate::cli::client::print_prune(&summary, dry_run);
            let failed = !summary.sent.rejected.is_empty() || !summary.refused.is_empty();
            return Ok(if failed {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            });
        }
        let summary = crate::cli::client::ingest(&api, &paths, &dataset, batch_size, quiet).await?;
        crate::cli::client::print_summary(&summary);
        if !summary.rejected.is_empty() {
            return Ok(ExitCode::from(2));
        }

        Ok(ExitCode::SUCCESS)
    }
}
