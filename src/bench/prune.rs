//! `cairn bench prune`: keeping a dataset equal to a folder of many files with
//! `cairn ingest DIR --prune`'s own code, against a served cairn on a real socket: the first
//! run (every file sent), a run with no change, and a run after `changes` edits (a third of
//! them changed files, a third deleted, a third new). The goals: a no-change run over
//! 10,000 files within 1 s, and a run after 30 changes within the time to accept those 30
//! plus 1 s.

use std::time::Instant;

use anyhow::Context;
use receipts::Scope;
use serde_json::{json, Value};

use super::search_latency::Random;
use crate::config::Config;

/// How the prune benchmark runs.
#[derive(Debug, Clone)]
pub struct PruneBench {
    /// Files in the folder.
    pub files: usize,
    /// Edits before the last run (split between changed, deleted and new files).
    pub changes: usize,
}

/// Runs the benchmark and returns its JSON report.
pub async fn prune(config: &Config, bench: PruneBench) -> anyhow::Result<Value> {
    let folder = tempfile::tempdir().context("temporary folder")?;
    let served = super::served::served(config, Scope::Ingest).await?;
    let mut random = Random(11);
    let path = |n: usize| folder.path().join(format!("d{:02}/file-{n}.md", n % 50));
    for n in 0..bench.files {
        let file = path(n);
        std::fs::create_dir_all(file.parent().context("a parent")?)?;
        std::fs::write(&file, format!("# File {n}\n\n{}", random.text(60)))?;
    }
    // The router alone: no workers, so the benchmark measures the comparison, not projection.
    let client = crate::cli::client::Client::new(&served.base, served.token.clone())?;
    let selection = connectors::Selection::default();
    let run = |label: &'static str| {
        let (client, selection, root) = (&client, &selection, folder.path().to_path_buf());
        async move {
            let started = Instant::now();
            let summary =
                crate::cli::client::prune(client, &root, "bench", "", selection, 200, true, false)
                    .await?;
            let seconds = started.elapsed().as_secs_f64();
            eprintln!("prune bench: {label}: {seconds:.3} s");
            anyhow::Ok(json!({
                "seconds": seconds,
                "added": summary.difference.added.len(),
                "changed": summary.difference.changed.len(),
                "unchanged": summary.difference.unchanged.len(),
                "removed": summary.removed,
                "accepted": summary.sent.accepted,
                "rejected": summary.sent.rejected.len(),
            }))
        }
    };
    let first = run("first run").await?;
    let no_change = run("no change").await?;
    let listing_started = Instant::now();
    let heads = crate::cli::client::list_heads(&client, "bench", "").await?;
    let listing_seconds = listing_started.elapsed().as_secs_f64();
    // The edits: a third changed, a third deleted, a third new.
    let third = bench.changes / 3;
    for n in 0..third {
        std::fs::write(path(n), format!("# File {n}\n\nedited {}", random.text(60)))?;
        std::fs::remove_file(path(third + n))?;
        let new = bench.files + n;
        std::fs::write(path(new), format!("# File {new}\n\n{}", random.text(60)))?;
    }
    let edited = run("after the edits").await?;
    Ok(json!({
        "benchmark": "prune",
        "files": bench.files,
        "changes": third * 3,
        "first_run": first,
        "no_change_run": no_change,
        "listing": {"heads": heads.len(), "seconds": listing_seconds},
        "run_after_changes": edited,
        "goals": {
            "no_change_run_seconds_at_most": 1.0,
        },
        "machine": {"cpus": std::thread::available_parallelism().map_or(0, usize::from)},
    }))
}
