//! The worker runtime against a real SQLite ledger with a short lease, driven by scripted
//! work (a test double for a job's work: it sleeps, succeeds, fails or hangs on command).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use receipts::policy::JobPolicy;
use receipts::{
    Failure, FailureClass, Job, JobState, Ledger, SqliteLedger, SqliteOptions, SystemClock,
};
use testkit::conformance::put;
use worker::{Work, Worker, WorkerConfig};

/// What the scripted work does on a job's n-th run (0-based).
#[derive(Debug, Clone, Copy)]
enum Script {
    Succeed(Duration),
    FailOnceThenSucceed,
    Hang,
}

/// Test double for a job's work (not projection): the worker runtime's contract (claim,
/// heartbeats, cancel, lost-lease stop, release, retry) is about when and how work runs, not
/// what it computes, and scripting it is the only way to make a run hang, fail once or take
/// exactly as long as a lease. Tests about projection use the real projection job
/// (`worker/tests/projection.rs`).
struct ScriptedWork {
    script: Script,
    runs: Mutex<HashMap<uuid::Uuid, u32>>,
    finished: Mutex<HashMap<uuid::Uuid, u32>>,
}

impl ScriptedWork {
    fn new(script: Script) -> Arc<Self> {
        Arc::new(Self {
            script,
            runs: Mutex::default(),
            finished: Mutex::default(),
        })
    }
}

#[async_trait]
impl Work for ScriptedWork {
    async fn run(&self, job: &Job) -> Result<(), Failure> {
        let run = {
            let mut runs = self.runs.lock().expect("lock");
            let count = runs.entry(job.id).or_insert(0);
            *count += 1;
            *count - 1
        };
        match self.script {
            Script::Succeed(duration) => tokio::time::sleep(duration).await,
            Script::FailOnceThenSucceed if run == 0 => {
                return Err(Failure {
                    class: FailureClass::Retryable {
                        retry_after_micros: None,
                    },
                    code: "transient".to_owned(),
                    message: "first run fails".to_owned(),
                })
            }
            Script::FailOnceThenSucceed => {}
            Script::Hang => std::future::pending::<()>().await,
        }
        *self
            .finished
            .lock()
            .expect("lock")
            .entry(job.id)
            .or_insert(0) += 1;
        Ok(())
    }
}

fn policy() -> JobPolicy {
    JobPolicy {
        lease_micros: 600_000,
        max_run_micros: 20_000_000,
        backoff_base_micros: 50_000,
        ..JobPolicy::default()
    }
}

async fn ledger(directory: &tempfile::TempDir) -> Arc<dyn Ledger> {
    let mut options = SqliteOptions::new(directory.path().join("ledger.db"));
    options.job_policies = receipts::policy::JobPolicies::uniform(policy());
    Arc::new(
        SqliteLedger::open(options, Arc::new(SystemClock))
            .await
            .expect("open"),
    )
}

fn config(owner: &str) -> WorkerConfig {
    let mut config = WorkerConfig::new(owner);
    config.poll_interval = Duration::from_millis(50);
    config.shutdown_grace = Duration::from_millis(200);
    config
}

async fn accept(ledger: &Arc<dyn Ledger>, count: usize) -> Vec<uuid::Uuid> {
    let submissions = (0..count)
        .map(|index| {
            put(
                &format!("d{}", index % 3),
                &format!("k{index}"),
                &format!("text {index}"),
            )
        })
        .collect();
    ledger
        .accept(submissions)
        .await
        .into_iter()
        .map(|result| result.expect("accepted").projection_job_id)
        .collect()
}

async fn wait_until(ledger: &Arc<dyn Ledger>, jobs: &[uuid::Uuid], state: JobState) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut all = true;
        for id in jobs {
            all &= ledger.job(*id).await.expect("read").expect("job").state == state;
        }
        if all {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "jobs did not reach {state} in time"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_complete_every_job_exactly_once() {
    let directory = tempfile::tempdir().expect("tempdir");
    let ledger = ledger(&directory).await;
    let work = ScriptedWork::new(Script::Succeed(Duration::from_millis(5)));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut handles = Vec::new();
    for index in 0..2 {
        let worker = Worker::new(ledger.clone(), work.clone(), config(&format!("w{index}")));
        let mut stopped = stopped.clone();
        handles.push(tokio::spawn(worker.run(async move {
            let _ = stopped.changed().await;
        })));
    }
    let jobs = accept(&ledger, 60).await;
    wait_until(&ledger, &jobs, JobState::Completed).await;
    let _ = stop.send(true);
    for handle in handles {
        handle.await.expect("worker");
    }
    let finished = work.finished.lock().expect("lock");
    assert_eq!(finished.len(), 60);
    assert!(
        finished.values().all(|count| *count == 1),
        "every job ran to completion exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_slow_job_alive_and_retries_follow_failures() {
    let directory = tempfile::tempdir().expect("tempdir");
    let ledger = ledger(&directory).await;
    let slow = ScriptedWork::new(Script::Succeed(Duration::from_millis(1500)));
    let worker = Worker::new(ledger.clone(), slow.clone(), config("slow"));
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let handle = tokio::spawn(worker.run(async move {
        let _ = stopped.changed().await;
    }));
    let jobs = accept(&ledger, 1).await;
    wait_until(&ledger, &jobs, JobState::Completed).await;
    let job = ledger.job(jobs[0]).await.expect("read").expect("job");
    assert_eq!(
        (job.crashes, job.attempt),
        (0, 0),
        "a run of 2.5 leases survived on heartbeats"
    );
    let _ = stop.send(true);
    handle.await.expect("worker");

    let flaky = ScriptedWork::new(Script::FailOnceThenSucceed);
    let worker = Worker::new(ledger.clone(), flaky.clone(), config("flaky"));
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let handle = tokio::spawn(worker.run(async move {
        let _ = stopped.changed().await;
    }));
    let more = ledger
        .accept(vec![put("d9", "flaky", "flaky text")])
        .await
        .pop()
        .expect("one")
        .expect("accepted");
    wait_until(&ledger, &[more.projection_job_id], JobState::Completed).await;
    let job = ledger
        .job(more.projection_job_id)
        .await
        .expect("read")
        .expect("job");
    assert_eq!(job.attempt, 1, "the failed run was charged one attempt");
    let history = ledger
        .history("job", &job.id.to_string())
        .await
        .expect("history");
    assert!(history
        .iter()
        .any(|h| h.cause.starts_with("retry scheduled after transient")));
    let _ = stop.send(true);
    handle.await.expect("worker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_running_job_and_shutdown_releases_without_charge() {
    let directory = tempfile::tempdir().expect("tempdir");
    let ledger = ledger(&directory).await;
    let hang = ScriptedWork::new(Script::Hang);
    let worker = Worker::new(ledger.clone(), hang.clone(), config("hang"));
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let handle = tokio::spawn(worker.run(async move {
        let _ = stopped.changed().await;
    }));
    let jobs = accept(&ledger, 2).await;
    wait_until(&ledger, &jobs, JobState::Running).await;
    ledger
        .cancel(jobs[0], "token:ops", "stop it")
        .await
        .expect("cancel");
    wait_until(&ledger, &jobs[..1], JobState::Cancelled).await;
    let _ = stop.send(true);
    handle.await.expect("worker");
    let released = ledger.job(jobs[1]).await.expect("read").expect("job");
    assert_eq!(
        (released.state, released.attempt, released.crashes),
        (JobState::Pending, 0, 0)
    );
    let history = ledger
        .history("job", &jobs[1].to_string())
        .await
        .expect("history");
    assert_eq!(
        history.last().map(|h| h.cause.as_str()),
        Some("released: worker shutting down")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_run_is_dropped() {
    let directory = tempfile::tempdir().expect("tempdir");
    let ledger = ledger(&directory).await;
    let hang = ScriptedWork::new(Script::Hang);
    let worker = Worker::new(ledger.clone(), hang.clone(), config("hang"));
    let stats = worker.stats();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let handle = tokio::spawn(worker.run(async move {
        let _ = stopped.changed().await;
    }));
    let first = ledger
        .accept(vec![put("d", "k", "one")])
        .await
        .pop()
        .expect("one")
        .expect("accepted");
    wait_until(&ledger, &[first.projection_job_id], JobState::Running).await;
    ledger
        .accept(vec![put("d", "k", "two")])
        .await
        .pop()
        .expect("one")
        .expect("accepted");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while stats.lost.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the superseded run was not stopped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        ledger
            .job(first.projection_job_id)
            .await
            .expect("read")
            .expect("job")
            .state,
        JobState::Superseded
    );
    let _ = stop.send(true);
    handle.await.expect("worker");
}

/// Test double for a job's work that records the dataset of every finished run, in order: the
/// fairness test asserts the order in which the ledger hands out jobs, which real projection
/// would blur with its own varying run times.
#[derive(Default)]
struct OrderRecorder {
    order: Mutex<Vec<String>>,
}

#[async_trait]
impl Work for OrderRecorder {
    async fn run(&self, job: &Job) -> Result<(), Failure> {
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.order.lock().expect("lock").push(job.dataset.clone());
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_dataset_cannot_starve_a_quiet_one_under_load() {
    const BUSY: usize = 3000;
    const QUIET: usize = 20;
    let directory = tempfile::tempdir().expect("tempdir");
    let ledger = ledger(&directory).await;
    let submissions = (0..BUSY)
        .map(|index| put("busy", &format!("b{index}"), &format!("busy {index}")))
        .collect();
    for result in ledger.accept(submissions).await {
        result.expect("accepted");
    }
    let work = Arc::new(OrderRecorder::default());
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let mut worker_config = config("w");
    worker_config.concurrency = 8;
    let handle = tokio::spawn(
        Worker::new(ledger.clone(), work.clone(), worker_config).run(async move {
            let _ = stopped.changed().await;
        }),
    );
    // Let the busy backlog start draining, then the quiet dataset arrives behind it.
    while work.order.lock().expect("lock").len() < 100 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let submissions = (0..QUIET)
        .map(|index| put("quiet", &format!("q{index}"), &format!("quiet {index}")))
        .collect();
    let quiet: Vec<uuid::Uuid> = ledger
        .accept(submissions)
        .await
        .into_iter()
        .map(|result| result.expect("accepted").projection_job_id)
        .collect();
    let finished_before_quiet = work.order.lock().expect("lock").len();
    wait_until(&ledger, &quiet, JobState::Completed).await;
    let _ = stop.send(true);
    handle.await.expect("worker");
    let order = work.order.lock().expect("lock").clone();
    let last_quiet = order
        .iter()
        .rposition(|dataset| dataset == "quiet")
        .expect("quiet jobs ran");
    let busy_meanwhile = order[finished_before_quiet..=last_quiet]
        .iter()
        .filter(|dataset| *dataset == "busy")
        .count();
    // Datasets take turns within each claim: the quiet jobs interleave with busy ones (plus
    // what was already running), instead of waiting behind the whole busy backlog.
    assert!(
        busy_meanwhile <= 2 * QUIET + 16,
        "{busy_meanwhile} busy jobs finished while {QUIET} quiet ones waited"
    );
    let busy_left = BUSY - order.iter().filter(|dataset| *dataset == "busy").count();
    assert!(
        busy_left > 1000,
        "the quiet jobs finished with {busy_left} busy jobs still queued"
    );
}

/// Test double for a unit's work (not projection): each unit takes 100 ms and counts how many
/// units run at once, which is what the test is about.
#[derive(Default)]
struct CountedUnits {
    running: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    sizes: Mutex<Vec<usize>>,
}

#[async_trait]
impl Work for CountedUnits {
    /// A claim's lone job (a group of one) runs here.
    async fn run(&self, _job: &Job) -> Result<(), Failure> {
        self.sizes.lock().expect("lock").push(1);
        Ok(())
    }

    fn unit_key(&self, _job: &Job) -> Option<String> {
        Some("all".to_owned())
    }

    async fn run_unit(&self, unit: &worker::Unit) {
        use std::sync::atomic::Ordering;
        self.sizes.lock().expect("lock").push(unit.members().len());
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        for index in 0..unit.members().len() {
            unit.report(index, Ok(()));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_takes_one_slot_so_several_run_at_once() {
    let directory = tempfile::tempdir().expect("tempdir");
    let ledger = ledger(&directory).await;
    let work = Arc::new(CountedUnits::default());
    let jobs = accept(&ledger, 24).await;
    // 4 slots and units of up to 4: were a unit to take a slot per job, one unit would fill
    // the worker.
    let mut config = config("w");
    config.concurrency = 4;
    config.unit_jobs = 4;
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let handle = tokio::spawn(
        Worker::new(ledger.clone(), work.clone(), config).run(async move {
            let _ = stopped.changed().await;
        }),
    );
    wait_until(&ledger, &jobs, JobState::Completed).await;
    let _ = stop.send(true);
    handle.await.expect("worker");
    let sizes = work.sizes.lock().expect("lock").clone();
    assert_eq!(
        sizes.iter().sum::<usize>(),
        24,
        "each job ran once: {sizes:?}"
    );
    assert!(sizes.iter().all(|size| *size <= 4), "{sizes:?}");
    let most = work.most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (2..=4).contains(&most),
        "{most} units at once (sizes {sizes:?})"
    );
}
