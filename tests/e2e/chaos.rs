//! Chaos test: `cairn worker` processes run 1,000 deliberately slow jobs (the hidden
//! `--simulate-work-ms` fault-injection setting) and are killed with SIGKILL at 20 moments.
//! At the end every job is completed exactly once, none is lost or stuck, and history explains
//! every rescue.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use cairn::config::{Config, Overrides};
use rand::{Rng, SeedableRng};
use receipts::conformance::put;
use receipts::JobState;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const JOBS: usize = 1000;
const KILLS: usize = 20;

async fn start_worker(data_dir: &std::path::Path, name: &str) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "worker",
            "--simulate-work-ms",
            "20",
            "--concurrency",
            "8",
            "--owner",
            name,
            "--data-dir",
        ])
        .arg(data_dir)
        .env("CAIRN_LEASE_MS", "1000")
        .env("CAIRN_QUARANTINE_AFTER_CRASHES", "1000")
        .env("CAIRN_LOG", "error")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn cairn worker");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
    assert!(
        matches!(ready, Ok(Ok(Some(ref line))) if line.contains("running")),
        "worker did not start: {ready:?}"
    );
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_workers_complete_every_job_exactly_once() {
    let directory = tempfile::tempdir().expect("tempdir");
    let overrides = Overrides {
        data_dir: Some(directory.path().to_path_buf()),
        ..Overrides::default()
    };
    let config = Config::load(&overrides, &HashMap::new()).expect("config");
    let ledger = cairn::open_ledger(&config).await.expect("ledger");
    let mut jobs = Vec::new();
    for chunk in 0..4 {
        let submissions = (0..JOBS / 4)
            .map(|index| {
                put(
                    &format!("d{}", index % 5),
                    &format!("{chunk}/{index}"),
                    &format!("chaos {chunk} {index}"),
                )
            })
            .collect();
        for result in receipts::Acceptor::accept(&ledger, submissions).await {
            jobs.push(result.expect("accepted").projection_job_id);
        }
    }

    let mut rng = rand::rngs::StdRng::seed_from_u64(20261129);
    for kill in 0..KILLS {
        let mut worker = start_worker(directory.path(), &format!("doomed-{kill}")).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..400))).await;
        worker.start_kill().expect("SIGKILL");
        worker.wait().await.expect("reap");
    }

    let mut survivor = start_worker(directory.path(), "survivor").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let counts = receipts::Reader::counts(&ledger).await.expect("counts");
        if counts.jobs.get("completed").copied().unwrap_or(0) == JOBS as i64 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "jobs still unfinished: {:?}",
            counts.jobs
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = survivor.id().expect("pid").to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let exit = tokio::time::timeout(Duration::from_secs(30), survivor.wait())
        .await
        .expect("stops")
        .expect("wait");
    assert!(exit.success(), "graceful stop, got {exit:?}");

    let mut crashes = 0;
    let mut rescues = 0;
    for id in &jobs {
        let job = receipts::Leases::job(&ledger, *id)
            .await
            .expect("read")
            .expect("job");
        assert_eq!(job.state, JobState::Completed);
        let history = receipts::Reader::history(&ledger, "job", &id.to_string())
            .await
            .expect("history");
        let completions = history
            .iter()
            .filter(|h| h.to.as_deref() == Some("completed"))
            .count();
        assert_eq!(completions, 1, "job {id} completed {completions} times");
        let rescued = history
            .iter()
            .filter(|h| h.cause.starts_with("lease_expired"))
            .count();
        assert_eq!(
            rescued as i64, job.crashes,
            "every lost lease of {id} is explained in history"
        );
        crashes += job.crashes;
        rescues += rescued;
    }
    assert!(
        crashes > 0,
        "the kills stranded leases that had to be rescued"
    );
    eprintln!("{JOBS} jobs completed exactly once across {KILLS} SIGKILLs; {rescues} rescues, all in history");
}
