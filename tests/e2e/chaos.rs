//! Chaos test: `cairn worker` processes run 1,000 deliberately slow jobs (the hidden
//! `--simulate-work-ms` fault-injection setting) and are killed with SIGKILL at 20 moments.
//! On SQLite one worker runs at a time (it owns the data directory's ledger file with the
//! API); on PostgreSQL `cairn serve` runs the API alone and 3 worker processes share the
//! ledger, one of them killed and replaced at each moment.
//!
//! What is checked comes from the claims, not from the final state (a terminal `completed`
//! appears once in history by construction):
//! - each doomed worker is frozen (SIGSTOP) before it is killed, and the jobs it held at that
//!   moment are read; afterwards every one of them has a `lease_expired` rescue;
//! - per job, the claims (`-> running` in history) number 1 + its crashes: no claim was lost
//!   and none was made twice;
//! - no job was ever held by two leases at once: in history every claim follows the end of the
//!   previous run, in time order, and the completion is written by the worker that holds the
//!   last claim.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use cairn::config::{Config, Overrides};
use rand::{Rng, SeedableRng};
use receipts::JobState;
use testkit::conformance::put;
use tokio::process::{Child, Command};

const JOBS: usize = 1000;
const KILLS: usize = 20;

async fn start_worker(data_dir: &std::path::Path, ledger: Option<&str>, name: &str) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cairn"));
    command.arg("worker");
    if let Some(url) = ledger {
        command.args(["--ledger", url]);
    }
    command
        .args([
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
        .env("CAIRN_LOG", "error");
    spawn_worker(command, "running").await
}

/// Spawns a `cairn worker` command and returns once it has said it is running (its first
/// stdout line, which must contain `expect`); its stdout is drained from then on.
pub(crate) async fn spawn_worker(mut command: Command, expect: &str) -> Child {
    let mut child = command
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn cairn worker");
    // Its first line says it runs, and on what.
    let first = crate::crash::await_line(&mut child, Duration::from_secs(60), |line| {
        Some(line.to_owned())
    })
    .await;
    assert!(
        first
            .as_deref()
            .is_some_and(|line| line.contains("running") && line.contains(expect)),
        "worker did not start: {first:?}"
    );
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_workers_complete_every_job_exactly_once() {
    let directory = tempfile::tempdir().expect("tempdir");
    chaos(directory.path(), None, 1).await;
}

/// The same on PostgreSQL: `cairn serve` with no workers answers the API, and 3 worker
/// processes share the ledger while they are killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_worker_processes_on_postgres_complete_every_job_exactly_once() {
    let server = testkit::postgres::PostgresServer::start().expect("start PostgreSQL");
    let url = server.create_database("chaos").expect("database");
    let directory = tempfile::tempdir().expect("tempdir");
    let api_dir = directory.path().join("api");
    let (mut api, base) = crate::crash::spawn_serve_with(
        &api_dir,
        &["--ledger", &url],
        &[("CAIRN_WORKERS", "0")],
        "warn",
        Stdio::inherit(),
    )
    .await;
    chaos(&directory.path().join("workers"), Some(&url), 3).await;
    // The API served from the same ledger throughout.
    let token = std::fs::read_to_string(api_dir.join("admin.token")).expect("admin token");
    let status: serde_json::Value = reqwest::Client::new()
        .get(format!("{base}/v1/status"))
        .bearer_auth(token.trim())
        .send()
        .await
        .expect("status")
        .json()
        .await
        .expect("json");
    assert_eq!(
        status["counts"]["jobs"]["completed"].as_i64(),
        Some(JOBS as i64),
        "{status}"
    );
    api.start_kill().expect("stop the API");
    let _ = api.wait().await;
}

async fn chaos(data_dir: &std::path::Path, ledger_url: Option<&str>, at_once: usize) {
    let overrides = Overrides {
        data_dir: Some(data_dir.to_path_buf()),
        ledger_url: ledger_url.map(str::to_owned),
        ..Overrides::default()
    };
    let config = Config::load(&overrides, &HashMap::new()).expect("config");
    let ledger = cairn::open_ledger(&config).await.expect("ledger");
    let ledger = ledger.as_ref();
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
        for result in receipts::Acceptor::accept(ledger, submissions).await {
            jobs.push(result.expect("accepted").projection_job_id);
        }
    }

    let mut rng = rand::rngs::StdRng::seed_from_u64(20261129);
    // (job, when the doomed worker was frozen holding it)
    let mut stranded: Vec<(uuid::Uuid, i64, String)> = Vec::new();
    // The first `at_once - 1` workers run throughout the kills (replaced when killed); the
    // doomed one is chosen at random among all of them.
    let mut crew: Vec<(String, Child)> = Vec::new();
    for index in 0..at_once.saturating_sub(1) {
        let owner = format!("crew-{index}");
        crew.push((
            owner.clone(),
            start_worker(data_dir, ledger_url, &owner).await,
        ));
    }
    for kill in 0..KILLS {
        let owner = format!("doomed-{kill}");
        crew.push((
            owner.clone(),
            start_worker(data_dir, ledger_url, &owner).await,
        ));
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..400))).await;
        let (owner, mut worker) = crew.swap_remove(rng.random_range(0..crew.len()));
        // Frozen first, so that what it holds cannot change between the snapshot and the kill.
        let pid = worker.id().expect("pid").to_string();
        assert!(std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .expect("kill -STOP")
            .success());
        // A statement it sent just before it stopped still runs on the server (a batch of
        // completions, say): let those land before the snapshot. A stopped process sends
        // nothing new.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let frozen_at = receipts::Operations::clock_now(ledger);
        let running = receipts::Operations::find_jobs(
            ledger,
            &receipts::JobFilter {
                states: vec![JobState::Running],
                dataset: None,
                allowed_datasets: None,
                text: None,
                error_code: None,
                order: receipts::JobOrder::LeaseExpiry,
                limit: 500,
                offset: 0,
                readable_by: None,
            },
        )
        .await
        .expect("running jobs");
        for job in running.jobs {
            if job.lease_owner.as_deref() == Some(owner.as_str()) {
                stranded.push((job.id, frozen_at, owner.clone()));
            }
        }
        worker.start_kill().expect("SIGKILL");
        worker.wait().await.expect("reap");
    }
    assert!(
        !stranded.is_empty(),
        "no doomed worker held a job when it was killed"
    );

    crew.push((
        "survivor".to_owned(),
        start_worker(data_dir, ledger_url, "survivor").await,
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let counts = receipts::Reader::counts(ledger).await.expect("counts");
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
    for (owner, mut worker) in crew {
        let pid = worker.id().expect("pid").to_string();
        assert!(std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success());
        let exit = tokio::time::timeout(Duration::from_secs(30), worker.wait())
            .await
            .expect("stops")
            .expect("wait");
        assert!(exit.success(), "graceful stop of {owner}, got {exit:?}");
    }

    let mut crashes = 0;
    let mut histories = HashMap::new();
    for id in &jobs {
        let job = receipts::Leases::job(ledger, *id)
            .await
            .expect("read")
            .expect("job");
        assert_eq!(job.state, JobState::Completed);
        let history = receipts::Reader::history(ledger, "job", &id.to_string())
            .await
            .expect("history");
        let states: Vec<_> = history.iter().filter(|h| h.event == "state").collect();
        // Claims: one per run; a run ends either in the completion or in a rescue.
        let claims = states
            .iter()
            .filter(|h| h.to.as_deref() == Some("running"))
            .count();
        assert_eq!(
            claims as i64,
            1 + job.crashes,
            "job {id}: {claims} claims for {} crashes",
            job.crashes
        );
        assert_one_lease_at_a_time(*id, &states);
        crashes += job.crashes;
        histories.insert(*id, history);
    }
    // Every job a doomed worker held when it was frozen was rescued after that moment, from
    // that worker.
    for (id, frozen_at, owner) in &stranded {
        let history = &histories[id];
        let rescue = history.iter().find(|h| {
            h.at >= *frozen_at
                && h.from.as_deref() == Some("running")
                && h.error_code.as_deref() == Some("lease_expired")
        });
        let rescue = rescue.unwrap_or_else(|| {
            panic!("job {id}, held by {owner} when it was killed, has no lease_expired rescue: {history:#?}")
        });
        assert!(
            rescue
                .error_message
                .as_deref()
                .is_some_and(|m| m.contains(owner.as_str())),
            "the rescue of {id} does not name {owner}: {rescue:?}"
        );
    }
    assert!(
        crashes >= stranded.len() as i64,
        "{crashes} crashes for {} stranded leases",
        stranded.len()
    );
    eprintln!(
        "{JOBS} jobs completed once each across {KILLS} SIGKILLs ({at_once} workers at once); \
         {} leases stranded by the kills, each rescued; {crashes} crashes in all",
        stranded.len()
    );
}

/// A job's state history (oldest first) shows one lease at a time: every claim starts after
/// the previous run ended, every run ends, and a completion is written by the worker that
/// holds the last claim.
pub(crate) fn assert_one_lease_at_a_time(id: uuid::Uuid, states: &[&receipts::HistoryEntry]) {
    let mut holder: Option<(&str, i64)> = None;
    for entry in states {
        if entry.from.as_deref() == Some("running") {
            let (owner, claimed_at) = holder
                .take()
                .unwrap_or_else(|| panic!("job {id}: a run ended that never started"));
            assert!(
                entry.at >= claimed_at,
                "job {id}: a run ended before it began"
            );
            if entry.to.as_deref() == Some("completed") {
                assert_eq!(
                    entry.actor, owner,
                    "job {id} was completed by a worker that did not hold it"
                );
            }
        }
        if entry.to.as_deref() == Some("running") {
            assert!(
                holder.is_none(),
                "job {id} was claimed while another lease held it: {states:#?}"
            );
            holder = Some((entry.actor.as_str(), entry.at));
        }
    }
    assert!(holder.is_none(), "job {id} ends still held");
}
