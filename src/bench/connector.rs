//! `cairn bench connector [--git | --remote]`: a folder (or git) connector's runs over many
//! files (50 folders), through the runner a worker uses ([`connectors::Runner`]) on a real
//! SQLite ledger: the first run (every file accepted), a run with no change, and a run after
//! `changes` edits (a third changed, a third deleted, a third new). The goals: a no-change run
//! over 10,000 files within 1 s, and a run after 30 changes within the time to accept those 30
//! plus 1 s. With `--remote` the repository is served by a real `git daemon` on loopback and
//! each run starts by fetching it into the connector's mirror: the goal is then a no-change
//! run within 1 s beyond the fetch's own time.

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
    /// Serve that repository with `git daemon` and read it as a remote (implies `git`).
    pub remote: bool,
}

/// A `git daemon` serving one folder's repositories on a loopback port, stopped on drop.
pub(super) struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `git daemon` over `base` and answers it with its port once it accepts connections.
pub(super) fn daemon(base: &std::path::Path) -> anyhow::Result<(Daemon, u16)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = std::process::Command::new("git")
        .arg("daemon")
        .arg("--export-all")
        .arg("--reuseaddr")
        .arg("--listen=127.0.0.1")
        .arg(format!("--port={port}"))
        .arg(format!("--base-path={}", base.display()))
        .arg(base)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting git daemon (Debian's git package)")?;
    let daemon = Daemon(child);
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        anyhow::ensure!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "git daemon did not listen on port {port} within 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok((daemon, port))
}

/// Runs `git ARGS` in `repository`.
pub(super) fn git(repository: &std::path::Path, args: &[&str]) -> anyhow::Result<()> {
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

pub(super) fn commit(repository: &std::path::Path, message: &str) -> anyhow::Result<()> {
    git(repository, &["add", "--all"])?;
    git(repository, &["commit", "--quiet", "-m", message])
}

/// Claims the connector's run (runs are claimed first: `SYNC_PRIORITY`), runs it and
/// completes it; answers the run's seconds and report.
async fn run(
    ledger: &Arc<dyn Ledger>,
    runner: &connectors::Runner,
    label: &str,
) -> anyhow::Result<Value> {
    let jobs = ledger.claim("bench", 1).await?;
    let job = jobs
        .into_iter()
        .find(|job| job.kind == JobKind::Sync)
        .context("the connector's run was not due")?;
    let token = LeaseToken::of(&job).context("a lease")?;
    let started = Instant::now();
    runner
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
        "fetch_seconds": report.fetch_ms as f64 / 1000.0,
        "fetched_bytes": report.fetched_bytes,
    }))
}

/// Runs the benchmark and returns its JSON report.
pub async fn connector(mut bench: ConnectorBench) -> anyhow::Result<Value> {
    bench.git |= bench.remote;
    let served = tempfile::tempdir().context("temporary folder")?;
    let folder = tempfile::TempDir::new_in(served.path()).context("temporary folder")?;
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
    let mut remote = connectors::remote::RemoteSettings::none(data.path());
    let mut location = folder.path().to_string_lossy().into_owned();
    let _daemon = if bench.remote {
        let (daemon, port) = daemon(served.path())?;
        remote.hosts = vec!["127.0.0.1".to_owned()];
        let name = folder
            .path()
            .file_name()
            .context("a folder name")?
            .to_string_lossy();
        location = format!("git://127.0.0.1:{port}/{name}");
        Some(daemon)
    } else {
        None
    };
    let runner = connectors::Runner::new(ledger.clone(), roots.clone(), remote);
    let created = ledger
        .change_connector(ConnectorCommand {
            change: ConnectorChange::Create(NewConnector {
                dataset: "bench".to_owned(),
                kind: if bench.git {
                    ConnectorKind::Git
                } else {
                    ConnectorKind::Folder
                },
                location,
                git_ref: bench.git.then(|| "main".to_owned()),
                include: vec![],
                exclude: vec![],
                max_file_bytes: 1 << 20,
                interval_ms: 1_000,
                access: Default::default(),
                credentials: None,
            }),
            actor: "cairn:bench".to_owned(),
            reason: "connector benchmark".to_owned(),
        })
        .await?;
    let id = created.connector.id;
    let run_now = || async {
        ledger
            .change_connector(ConnectorCommand {
                change: ConnectorChange::RunNow { id, delivery: None },
                actor: "cairn:bench".to_owned(),
                reason: "next measured run".to_owned(),
            })
            .await
    };
    let first = run(&ledger, &runner, "first run").await?;
    run_now().await?;
    let no_change = run(&ledger, &runner, "no change").await?;
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
    let edited = run(&ledger, &runner, "after the edits").await?;
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
    let beyond_fetch = no_change["seconds"].as_f64().unwrap_or(0.0)
        - no_change["fetch_seconds"].as_f64().unwrap_or(0.0);
    Ok(json!({
        "benchmark": "connector",
        "source": if bench.remote { "git://" } else if bench.git { "git" } else { "folder" },
        "folders": 50,
        "files": bench.files,
        "changes": third * 3,
        "first_run": first,
        "no_change_run": no_change,
        "run_after_changes": edited,
        "accepting_the_changed_files_alone_seconds": accept_seconds,
        "run_after_changes_beyond_acceptance_seconds": over,
        "no_change_run_beyond_fetch_seconds": beyond_fetch,
        "goals": {
            "no_change_run_seconds_at_most": 1.0,
            "run_after_changes_beyond_acceptance_seconds_at_most": 1.0,
        },
        "machine": super::machine(),
    }))
}
