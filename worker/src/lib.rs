//! # worker: leased workers
//!
//! A [`Worker`] claims due jobs from the ledger ([`receipts::Leases`]), runs each one's
//! [`Work`] under its lease, heartbeats every third of the lease, and ends the run with
//! `complete`, `fail` (classified by the work's [`Failure`]) or, on shutdown, `release`.
//! The heartbeat period is a third of the lease the claim granted, so each job kind's lease
//! policy (in the ledger) sets it; workers have no lease setting of their own.
//!
//! ## Tasks
//! One claim loop per worker: it wakes on the ledger's work signal (new acceptances, requeues,
//! releases) or at the poll interval, and claims as many jobs as it has free slots
//! (`concurrency`). Each claimed job, or unit of jobs, runs in its own task and takes one
//! slot; the task races the work against its heartbeats and the shutdown signal. A claim that
//! filled its slots while units left some free is followed by the next claim at once, so
//! several units are in flight and one unit's ledger and store writes overlap another's
//! embedding. A worker holds at most `concurrency × unit_jobs` jobs.
//!
//! ## Units
//! A claim's jobs that share a [`Work::unit_key`] (small projection jobs of one generation)
//! run together as one [`Unit`] of at most `unit_jobs`, one job per source, through
//! [`Work::run_unit`]: the projector writes their chunk rows in one ledger transaction, embeds
//! them in one call, upserts, reads back and flags them current once. Each member keeps its own
//! lease, heartbeat and outcome: a member whose heartbeat answers `lease_lost` or a cancel is
//! taken out ([`Unit::held`]) before the unit's next write, and the ledger fences every
//! member's writes one by one ([`receipts::Projections::project_many`]), so a stale member never
//! fences out its neighbours. A member that fails (extraction, embedding) fails alone.
//!
//! ## Invariants
//! - A run never outlives its lease: when a heartbeat answers `lease_lost` (expired, rescued,
//!   superseded), or cannot reach the ledger at all (a partition: the lease cannot be known
//!   to hold), the work future is dropped at once and nothing more is written for it; the
//!   ledger fences any late write anyway, and an unreachable run's job is taken again when
//!   its lease runs out on the ledger's clock.
//! - A heartbeat that reports a cancel request drops the work and records the run as
//!   cancelled.
//! - Shutdown stops claiming, lets running jobs finish within the grace period, then drops the
//!   rest and releases their leases without charging an attempt.
//! - Errors are classified by the work itself ([`FailureClass`]), never by message text.

pub mod access;
pub mod generations;
pub mod graph;
mod job;
pub mod projection;
pub mod unit;

pub use generations::GenerationRouter;
pub use graph::{GraphStage, Reconciled};
pub use job::{permanent, retryable};
pub use projection::{Projector, UnitSettings};
pub use unit::{Member, Unit};

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use receipts::{Failure, FailureClass, Job, LeaseToken, LedgerError, WorkLedger};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

/// The work a job stands for. Implementations classify their own errors.
#[async_trait]
pub trait Work: Send + Sync + 'static {
    /// Does the job's work. Dropping the future must stop it (cancellation).
    async fn run(&self, job: &Job) -> Result<(), Failure>;

    /// The key of the units `job` may join (jobs of one claim with the same key run together
    /// through [`Work::run_unit`]); `None`, the default: it runs alone.
    fn unit_key(&self, job: &Job) -> Option<String> {
        let _ = job;
        None
    }

    /// Runs a unit, reporting each member's outcome with [`Unit::report`] as soon as it is
    /// known. The default runs each member's [`Work::run`] concurrently.
    async fn run_unit(&self, unit: &Unit) {
        futures::future::join_all(unit.members().iter().enumerate().map(
            |(index, member)| async move {
                let outcome = self.run(&member.job).await;
                unit.report(index, outcome);
            },
        ))
        .await;
    }
}

/// Runs `sync` jobs (connector runs) with one work and every other kind with another, so one
/// worker pool serves both and the runtime has no special case.
pub struct ByKind {
    sync: Arc<dyn Work>,
    other: Arc<dyn Work>,
}

impl ByKind {
    /// `sync` runs connector runs; `other` runs projection, tombstone and graph jobs.
    pub fn new(sync: Arc<dyn Work>, other: Arc<dyn Work>) -> ByKind {
        ByKind { sync, other }
    }
}

#[async_trait]
impl Work for ByKind {
    async fn run(&self, job: &Job) -> Result<(), Failure> {
        match job.kind {
            receipts::JobKind::Sync => self.sync.run(job).await,
            _ => self.other.run(job).await,
        }
    }

    fn unit_key(&self, job: &Job) -> Option<String> {
        match job.kind {
            receipts::JobKind::Sync => None,
            _ => self.other.unit_key(job),
        }
    }

    async fn run_unit(&self, unit: &Unit) {
        // Only `other` gives unit keys.
        self.other.run_unit(unit).await;
    }
}

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The lease owner name recorded in history (e.g. `host:pid:worker-1`).
    pub owner: String,
    /// Runs at once: a lone job, or a unit of up to `unit_jobs` jobs, takes one slot.
    pub concurrency: usize,
    /// Claim at least this often even without a signal.
    pub poll_interval: Duration,
    /// How long running jobs may finish after shutdown is asked before they are released.
    pub shutdown_grace: Duration,
    /// Most jobs of a claim run together as one unit ([`unit`]); 1 runs every job alone.
    pub unit_jobs: usize,
}

impl WorkerConfig {
    /// A configuration for `owner`: 4 jobs at once, polling every 500 ms, 10 s of grace.
    pub fn new(owner: impl Into<String>) -> Self {
        Self {
            owner: owner.into(),
            concurrency: 4,
            poll_interval: Duration::from_millis(500),
            shutdown_grace: Duration::from_secs(10),
            unit_jobs: DEFAULT_UNIT_JOBS,
        }
    }
}

/// Most jobs of a claim in one unit, by default.
pub const DEFAULT_UNIT_JOBS: usize = 32;

/// A run heartbeats every third of the lease its claim granted (the job kind's lease).
pub(crate) fn heartbeat_period(job: &Job) -> Duration {
    let granted = match (job.lease_expires_at, job.heartbeat_at) {
        (Some(expiry), Some(claimed)) => expiry - claimed,
        _ => receipts::policy::DEFAULT_LEASE_MICROS,
    };
    Duration::from_micros(u64::try_from(granted / 3).unwrap_or(0)).max(Duration::from_millis(10))
}

/// What a worker did, for logs and benchmarks.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Runs started.
    pub started: AtomicU64,
    /// Runs completed.
    pub completed: AtomicU64,
    /// Runs that failed (retry, dead or cancelled).
    pub failed: AtomicU64,
    /// Runs stopped because their lease was lost.
    pub lost: AtomicU64,
    /// Runs released on shutdown.
    pub released: AtomicU64,
}

/// A worker over a ledger.
pub struct Worker {
    ledger: Arc<dyn WorkLedger>,
    work: Arc<dyn Work>,
    config: WorkerConfig,
    stats: Arc<WorkerStats>,
}

impl Worker {
    /// A worker that runs `work` for jobs claimed from `ledger`.
    pub fn new(ledger: Arc<dyn WorkLedger>, work: Arc<dyn Work>, config: WorkerConfig) -> Self {
        Self {
            ledger,
            work,
            config,
            stats: Arc::default(),
        }
    }

    /// Counters of this worker's runs.
    pub fn stats(&self) -> Arc<WorkerStats> {
        self.stats.clone()
    }

    /// Runs until `shutdown` resolves, then stops claiming, waits up to the grace period for
    /// running jobs and releases the rest.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        let slots = Arc::new(Semaphore::new(self.config.concurrency.max(1)));
        let (stop_sender, stop) = watch::channel(false);
        let signal = self.ledger.work_signal();
        let mut running = JoinSet::new();
        tokio::pin!(shutdown);
        // Claims are batched: with work running, wait until half the slots are free.
        let batch = (self.config.concurrency.max(1) / 2).max(1);
        loop {
            let free = slots.available_permits();
            // A claim that filled every free slot while units left slots over (a unit takes
            // one) is followed by the next claim at once, not at the next wake-up.
            let mut claim_again = false;
            if free >= batch || (free > 0 && running.is_empty()) {
                match self
                    .ledger
                    .claim(&self.config.owner, u32::try_from(free).unwrap_or(u32::MAX))
                    .await
                {
                    Ok(jobs) => {
                        let full = jobs.len() >= free;
                        // Each group takes one slot, so the claim's groups never need more
                        // slots than it asked for.
                        for group in self.units(jobs) {
                            let Ok(permit) = slots.clone().try_acquire_owned() else {
                                break;
                            };
                            if group.len() > 1 {
                                let run = unit::UnitRun {
                                    ledger: self.ledger.clone(),
                                    work: self.work.clone(),
                                    stats: self.stats.clone(),
                                    stop: stop.clone(),
                                };
                                let span = tracing::info_span!("unit", jobs = group.len());
                                running.spawn(
                                    async move {
                                        run.execute(group).await;
                                        drop(permit);
                                    }
                                    .instrument(span),
                                );
                                continue;
                            }
                            let Some(job) = group.into_iter().next() else {
                                continue;
                            };
                            let run = Run {
                                ledger: self.ledger.clone(),
                                work: self.work.clone(),
                                stats: self.stats.clone(),
                                stop: stop.clone(),
                            };
                            // Every log line of the run carries the job, its revision and dataset.
                            let span = tracing::info_span!(
                                "job",
                                job_id = %job.id,
                                revision_id = ?job.revision_id,
                                connector_id = ?job.connector_id,
                                dataset = %job.dataset,
                            );
                            running.spawn(
                                async move {
                                    run.execute(job).await;
                                    drop(permit);
                                }
                                .instrument(span),
                            );
                        }
                        claim_again = full && slots.available_permits() >= batch;
                    }
                    Err(error) => {
                        tracing::warn!(owner = %self.config.owner, %error, "claim failed; retrying at the next poll");
                    }
                }
            }
            if claim_again {
                continue;
            }
            let wake = async {
                match &signal {
                    Some(signal) => signal.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut shutdown => break,
                () = wake => {}
                () = tokio::time::sleep(self.config.poll_interval) => {}
                Some(_) = running.join_next(), if !running.is_empty() => {
                    // Runs that ended together (their completions commit in groups) free
                    // their slots together: one claim refills them all.
                    while running.try_join_next().is_some() {}
                }
            }
        }
        tracing::info!(owner = %self.config.owner, running = running.len(), "worker stopping: no new claims");
        let drained = tokio::time::timeout(self.config.shutdown_grace, async {
            while running.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            let _ = stop_sender.send(true);
            while running.join_next().await.is_some() {}
        }
        tracing::info!(owner = %self.config.owner, "worker stopped");
    }
}

impl Worker {
    /// A claim's jobs in the groups they run in: jobs with the same unit key together, at
    /// most `unit_jobs` to a group and one job per source in each; every other job alone.
    fn units(&self, jobs: Vec<Job>) -> Vec<Vec<Job>> {
        let most = self.config.unit_jobs.max(1);
        let mut groups: Vec<(Option<String>, Vec<Job>)> = Vec::new();
        for job in jobs {
            let key = if most > 1 {
                self.work.unit_key(&job)
            } else {
                None
            };
            let open = key.as_ref().and_then(|key| {
                groups.iter_mut().find(|(group_key, members)| {
                    group_key.as_ref() == Some(key)
                        && members.len() < most
                        && !members.iter().any(|member| {
                            member.dataset == job.dataset && member.source_key == job.source_key
                        })
                })
            });
            match open {
                Some((_, members)) => members.push(job),
                None => groups.push((key, vec![job])),
            }
        }
        groups.into_iter().map(|(_, members)| members).collect()
    }
}

struct Run {
    ledger: Arc<dyn WorkLedger>,
    work: Arc<dyn Work>,
    stats: Arc<WorkerStats>,
    stop: watch::Receiver<bool>,
}

impl Run {
    /// Runs `job` under its lease, with the stage its work reaches kept for its heartbeats.
    async fn execute(self, job: Job) {
        job::STAGE
            .scope(std::cell::Cell::new(None), self.execute_in_scope(job))
            .await;
    }

    async fn execute_in_scope(mut self, job: Job) {
        let Some(token) = LeaseToken::of(&job) else {
            return;
        };
        self.stats.started.fetch_add(1, Ordering::Relaxed);
        let latency_ms = job
            .started_at
            .map(|started| (started - job.run_at).max(0) / 1000);
        tracing::debug!(job_id = %job.id, revision_id = ?job.revision_id, dataset = %job.dataset, ?latency_ms, "run started");
        let work = self.work.clone();
        let job_for_work = job.clone();
        let mut work = std::pin::pin!(async move { work.run(&job_for_work).await });
        let period = heartbeat_period(&job);
        let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tokio::select! {
                result = &mut work => {
                    let ended = match result {
                        Ok(()) => self.ledger.complete(&token).await.map(|_| &self.stats.completed),
                        Err(failure) => {
                            // The stage it failed in, recorded with the failure (a noted stage
                            // may not have been reported yet).
                            if let Some(stage) = job::STAGE.try_with(std::cell::Cell::get).ok().flatten() {
                                let _ = self.ledger.progress(&token, stage).await;
                            }
                            self.ledger.fail(&token, failure).await.map(|_| &self.stats.failed)
                        }
                    };
                    match ended {
                        Ok(counter) => { counter.fetch_add(1, Ordering::Relaxed); }
                        Err(error) => self.lost(&job, &error),
                    }
                    return;
                }
                _ = heartbeat.tick() => match match job::STAGE.try_with(std::cell::Cell::get).ok().flatten() {
                    Some(stage) => self.ledger.progress(&token, stage).await,
                    None => self.ledger.heartbeat(&token).await,
                } {
                    Ok(beat) if beat.cancel_requested => {
                        tracing::info!(job_id = %job.id, "cancel requested: stopping the run");
                        let failure = Failure {
                            class: FailureClass::Cancelled,
                            code: "cancelled".to_owned(),
                            message: "an operator cancelled the job while it ran".to_owned(),
                        };
                        match self.ledger.fail(&token, failure).await {
                            Ok(_) => { self.stats.failed.fetch_add(1, Ordering::Relaxed); }
                            Err(error) => self.lost(&job, &error),
                        }
                        return;
                    }
                    Ok(_) => {}
                    Err(error @ LedgerError::LeaseLost { .. }) => {
                        self.lost(&job, &error);
                        return;
                    }
                    Err(error) => {
                        // Without the ledger's answer the lease cannot be known to hold:
                        // stop before any further store write. The lease runs out on the
                        // ledger's clock and another worker takes the job; a late write
                        // would be fenced anyway.
                        self.stats.lost.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(job_id = %job.id, revision_id = ?job.revision_id, %error, "heartbeat failed: stopping the run before any further store write; the job is taken again when its lease runs out");
                        return;
                    }
                },
                _ = self.stop.changed() => {
                    match self.ledger.release(&token).await {
                        Ok(_) => { self.stats.released.fetch_add(1, Ordering::Relaxed); }
                        Err(error) => self.lost(&job, &error),
                    }
                    return;
                }
            }
        }
    }

    fn lost(&self, job: &Job, error: &LedgerError) {
        self.stats.lost.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(job_id = %job.id, revision_id = ?job.revision_id, %error, "run stopped: its lease no longer holds");
    }
}
