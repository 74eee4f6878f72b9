//! `cairn bench connector [--git]`: a folder (or git) connector's runs over many files (50
//! folders), through the runner a worker uses ([`connectors::Runner`]) on a real SQLite ledger: the first run (every
//! file accepted), a run with no change, and a run after `changes` edits (a third changed, a
//! third deleted, a third new). The goals: a no-change run over 10,000 files within
//! 1 s, and a run after 30 changes within the time to accept those 30 plus 1 s.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use receipts::model::{ConnectorChange, ConnectorCommand, ConnectorKind, JobKind, NewConnector};
use receipts::{LeaseToken, Ledger, SqliteLedger, SqliteOptions, SystemClock};
use serde_json::{json, Value};
use worker::Work;

use super::search_latency::Random;

/// How the connector benchmark runs.
#[derive(Debug, Clone)]
pub struct ConnectorBench {
    /// Files in the folder.
    pub files: usize,
    /// Edits before the last run (split between changed, deleted and new files).
    pub changes: usize,
    /// Read the files as a git repository (committed with the `git` binary) instead of a
    /// folder.
    pub git: bool,
}

/// Runs `git ARGS` in `repository`.
fn git(repository: &std::path::Path, args: &[&str]) -> anyhow::Result<()> {
    let output = std::process::Command::new("git")
        .arg("-C")
        .arg(repository)
        .args(args)
        .env("GIT_AUTHOR_NAME", "cairn bench")
        .env("GIT_AUTHOR_EMAIL", "bench@cairn.invalid")
        .env("GIT_COMMITTER_NAME", "cairn bench")
        .env("GIT_COMMITTER_EMAIL", "bench@cairn.invalid")
        .output()
        .context("running git (the git benchmark needs the git binary)")?;
    anyhow::ensure!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

fn commit(repository: &std::path::Path, message: &str) -> anyhow::Result<()> {
    git(repository, &["add", "--all"])?;
    git(repository, &["commit", "--quiet", "-m", message])
}

/// Claims the connector's run (runs are claimed first: `SYNC_PRIORITY`), runs it and
/// completes it; answers the run's seconds and report.
async fn run(
    ledger: &Arc<dyn Ledger>,
    roots: &connectors::confine::Roots,
    label: &str,
) -> anyhow::Result<Value> {
    let jobs = ledger.claim("bench", 1).await?;
    let job = jobs
        .into_iter()
        .find(|job| job.kind == JobKind::Sync)
        .context("the connector's run was not due")?;
    let token = LeaseToken::of(&job).context("a lease")?;
    let started = Instant::now();
    connectors::Runner::new(ledger.clone(), roots.clone())
        .run(&job)
        .await
        .map_err(|failure| anyhow::anyhow!("{}: {}", failure.code, failure.message))?;
    let seconds = started.elapsed().as_secs_f64();
    ledger.complete(&token).await?;
    let report = ledger
        .sync_runs(job.connector_id.context("a connector")?, 1)
        .await?
        .into_iter()
        .next()
        .and_then(|run| run.report)
        .context("a report")?;
    eprintln!("connector bench: {label}: {seconds:.3} s");
    Ok(json!({
        "seconds": seconds,
        "added": report.added,
        "changed": report.changed,
        "unchanged": report.unchanged,
        "removed": report.removed,
        "hashed": report.hashed,
        "trees_read": report.trees_read,
        "failed": report.failed,
    }))
}

/// Runs the benchmark and returns its JSON report.
pub async fn connector(bench: ConnectorBench) -> anyhow::Result<Value> {
    let folder = tempfile::tempdir().context("temporary folder")?;
    let data = tempfile::tempdir().context("temporary ledger")?;
    let roots = connectors::confine::Roots::new(vec![folder.path().to_path_buf()]);
    let ledger: Arc<dyn Ledger> = Arc::new(
        SqliteLedger::open(
            SqliteOptions::new(data.path().join("ledger.db")),
            Arc::new(SystemClock),
        )
        .await?,
    );
    let mut random = Random(11);
    let path = |n: usize| folder.path().join(format!("d{:02}/file-{n}.md", n % 50));
    for n in 0..bench.files {
        let file = path(n);
        std::fs::create_dir_all(file.parent().context("a parent")?)?;
        std::fs::write(&file, format!("# File {n}\n\n{}", random.text(60)))?;
    }
    if bench.git {
        git(folder.path(), &["init", "--quiet", "--initial-branch=main"])?;
        commit(folder.path(), "the files")?;
    }
    let created = ledger
        .change_connector(ConnectorCommand {
            change: ConnectorChange::Create(NewConnector {
                dataset: "bench".to_owned(),
                kind: if bench.git {
                    ConnectorKind::Git
                } else {
                    ConnectorKind::Folder
                },
                location: folder.path().to_string_lossy().into_owned(),
                git_ref: bench.git.then(|| "main".to_owned()),
                include: vec![],
                exclude: vec![],
                max_file_bytes: 1 << 20,
                interval_ms: 1_000,
                access: Default::default(),
            }),
            actor: "cairn:bench".to_owned(),
            reason: "connector benchmark".to_owned(),
        })
        .await?;
    let id = created.connector.id;
    let run_now = || async {
        ledger
            .change_connector(ConnectorCommand {
                change: ConnectorChange::RunNow { id },
                actor: "cairn:bench".to_owned(),
                reason: "next measured run".to_owned(),
            })
            .await
    };
    let first = run(&ledger, &roots, "first run").await?;
    run_now().await?;
    let no_change = run(&ledger, &roots, "no change").await?;
    // The edits: a third changed, a third deleted, a third new.
    let third = bench.changes / 3;
    for n in 0..third {
        std::fs::write(path(n), format!("# File {n}\n\nedited {}", random.text(60)))?;
        std::fs::remove_file(path(third + n))?;
        let new = bench.files + n;
        std::fs::write(path(new), format!("# File {new}\n\n{}", random.text(60)))?;
    }
    if bench.git {
        commit(folder.path(), "the edits")?;
    }
    run_now().await?;
    let edited = run(&ledger, &roots, "after the edits").await?;
    // What accepting those changes costs alone: the same number of new documents, accepted
    // in one call as the run does.
    let submissions = (0..third * 2)
        .map(|n| {
            receipts::Submission::text(
                "bench-accept",
                &format!("file-{n}.md"),
                "cairn:bench",
                &random.text(60),
            )
        })
        .collect();
    let accept_started = Instant::now();
    let accepted = ledger.accept(submissions).await;
    let accept_seconds = accept_started.elapsed().as_secs_f64();
    anyhow::ensure!(
        accepted.iter().all(Result::is_ok),
        "the acceptance probe failed"
    );
    let over = edited["seconds"].as_f64().unwrap_or(0.0) - accept_seconds;
    Ok(json!({
        "benchmark": "connector",
        "source": if bench.git { "git" } else { "folder" },
        "folders": 50,
        "files": bench.files,
        "changes": third * 3,
        "first_run": first,
        "no_change_run": no_change,
        "run_after_changes": edited,
        "accepting_the_changed_files_alone_seconds": accept_seconds,
        "run_after_changes_beyond_acceptance_seconds": over,
        "goals": {
            "no_change_run_seconds_at_most": 1.0,
            "run_after_changes_beyond_acceptance_seconds_at_most": 1.0,
        },
        "machine": super::machine(),
    }))
}
