//! Units: several jobs of one claim run as one piece of work, each under its own lease.
//!
//! A worker groups the jobs of a claim that its [`crate::Work`] says may run together (the
//! same [`crate::Work::unit_key`]: small projections of one generation) into a [`Unit`] of at
//! most [`crate::WorkerConfig::unit_jobs`] jobs, and runs it with
//! [`crate::Work::run_unit`]. The work shares what it can (one ledger transaction for the
//! chunk rows, one upsert, one read-back, one `set_current`); the lease, the fencing and the
//! outcome stay per job.
//!
//! ## Invariants
//! - Every member keeps its own lease: the unit's heartbeat extends each one, and a member
//!   whose lease is lost (expired, rescued, superseded), or whose heartbeat cannot reach the
//!   ledger, is taken out of the unit at once ([`Unit::held`] turns false): nothing more is
//!   written for it, and the others go on. The ledger fences any late write anyway, one job
//!   at a time, so a stale member can never fence out its neighbours.
//! - A cancel request ends that member alone, recorded as cancelled.
//! - Each member's outcome is reported on its own ([`Unit::report`]) and ends its run at once
//!   (complete, or fail with its own classification and retry); a member the work ends
//!   without reporting fails for now (`unit_incomplete`) and is retried.
//! - Shutdown releases every member still running, without charging an attempt.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use receipts::{Failure, FailureClass, Job, LeaseToken, LedgerError, WorkLedger};
use tokio::sync::{mpsc, watch};

use crate::{Work, WorkerStats};

/// A member's outcome, by its index in the unit.
type Outcome = (usize, Result<(), Failure>);

/// One job of a unit, with its lease.
#[derive(Debug)]
pub struct Member {
    /// The job, as claimed.
    pub job: Job,
    /// Its lease.
    pub token: LeaseToken,
    /// Out of the unit: its lease was lost or it was cancelled; write nothing more for it.
    out: AtomicBool,
}

/// Jobs run together, each under its own lease (see the module documentation).
#[derive(Debug)]
pub struct Unit {
    members: Vec<Member>,
    outcomes: mpsc::UnboundedSender<Outcome>,
    /// The stage the unit has reached, reported with its members' heartbeats.
    stage: Mutex<Option<&'static str>>,
}

impl Unit {
    /// A unit of `jobs` (each must carry its lease) and the receiver of its outcomes.
    fn new(jobs: Vec<Job>) -> (Unit, mpsc::UnboundedReceiver<Outcome>) {
        let (outcomes, receiver) = mpsc::unbounded_channel();
        let members = jobs
            .into_iter()
            .filter_map(|job| {
                LeaseToken::of(&job).map(|token| Member {
                    job,
                    token,
                    out: AtomicBool::new(false),
                })
            })
            .collect();
        let unit = Unit {
            members,
            outcomes,
            stage: Mutex::new(None),
        };
        (unit, receiver)
    }

    /// The members, in claim order; a member's index names it in every other call.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The indexes of the members still held (neither lost nor cancelled nor reported lost).
    pub fn held(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|index| self.is_held(*index))
            .collect()
    }

    /// Whether member `index` is still held.
    pub fn is_held(&self, index: usize) -> bool {
        self.members
            .get(index)
            .is_some_and(|member| !member.out.load(Ordering::SeqCst))
    }

    /// Reports member `index`'s outcome: its run ends now (completed, or failed with its own
    /// classification). A lease the ledger refused (`lease_lost`) takes the member out
    /// instead. Later reports of the same member are ignored.
    pub fn report(&self, index: usize, outcome: Result<(), Failure>) {
        let Some(member) = self.members.get(index) else {
            return;
        };
        // Out from now on: nothing more is written for it.
        if member.out.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = self.outcomes.send((index, outcome));
    }

    /// Takes member `index` out of the unit after the ledger refused its lease: nothing more
    /// is written for it, and its run records nothing (the lease is someone else's now).
    pub fn lose(&self, index: usize, error: &LedgerError) {
        if let Some(member) = self.members.get(index) {
            if !member.out.swap(true, Ordering::SeqCst) {
                // The lone path's words, so one search finds every stopped run.
                if matches!(error, LedgerError::LeaseLost { .. }) {
                    tracing::warn!(job_id = %member.job.id, revision_id = ?member.job.revision_id, %error, "run stopped: its lease no longer holds (a unit's member; the rest of the unit goes on)");
                } else {
                    tracing::warn!(job_id = %member.job.id, revision_id = ?member.job.revision_id, %error, "heartbeat failed: stopping the run before any further store write; the job is taken again when its lease runs out (a unit's member; the rest of the unit goes on)");
                }
                let _ = self.outcomes.send((index, Err(lost_marker())));
            }
        }
    }

    /// Notes the stage the unit has reached (reported with the next heartbeats).
    pub fn note(&self, stage: &'static str) {
        if let Ok(mut current) = self.stage.lock() {
            *current = Some(stage);
        }
    }

    fn stage(&self) -> Option<&'static str> {
        self.stage.lock().ok().and_then(|stage| *stage)
    }

    /// Enters `stage` with a fenced heartbeat for each of `indexes` (before a write the ledger
    /// cannot fence, such as a vector-store write): a member whose lease no longer holds is
    /// taken out, a member with a cancel request is reported cancelled. Answers the members
    /// that go on.
    pub async fn enter(
        &self,
        ledger: &dyn WorkLedger,
        indexes: &[usize],
        stage: &'static str,
    ) -> Vec<usize> {
        self.note(stage);
        let beats = futures::future::join_all(indexes.iter().map(|index| async move {
            (
                *index,
                ledger.progress(&self.members[*index].token, stage).await,
            )
        }))
        .await;
        let mut going = Vec::with_capacity(indexes.len());
        for (index, beat) in beats {
            match beat {
                Ok(beat) if beat.cancel_requested => self.report(index, Err(cancelled(stage))),
                Ok(_) if self.is_held(index) => going.push(index),
                Ok(_) => {}
                Err(error) => self.lose(index, &error),
            }
        }
        going
    }
}

/// The marker a lost member's outcome carries (never recorded: the run records nothing).
fn lost_marker() -> Failure {
    Failure {
        class: FailureClass::Retryable {
            retry_after_micros: None,
        },
        code: LOST.to_owned(),
        message: "the lease no longer holds".to_owned(),
    }
}

const LOST: &str = "unit_member_lost";

fn cancelled(stage: &str) -> Failure {
    Failure {
        class: FailureClass::Cancelled,
        code: "cancelled".to_owned(),
        message: format!("an operator cancelled the job while it ran (stage {stage})"),
    }
}

/// Runs one unit: its work, its members' heartbeats, their outcomes and shutdown.
pub(crate) struct UnitRun {
    pub(crate) ledger: Arc<dyn WorkLedger>,
    pub(crate) work: Arc<dyn Work>,
    pub(crate) stats: Arc<WorkerStats>,
    pub(crate) stop: watch::Receiver<bool>,
}

impl UnitRun {
    pub(crate) async fn execute(mut self, jobs: Vec<Job>) {
        let period = jobs
            .iter()
            .map(crate::heartbeat_period)
            .min()
            .unwrap_or(std::time::Duration::from_secs(1));
        let (unit, mut outcomes) = Unit::new(jobs);
        let unit = Arc::new(unit);
        self.stats
            .started
            .fetch_add(unit.members.len() as u64, Ordering::Relaxed);
        let mut open: HashSet<usize> = (0..unit.members.len()).collect();
        let work = self.work.clone();
        let running = unit.clone();
        let mut work = std::pin::pin!(async move { work.run_unit(&running).await });
        let mut work_done = false;
        let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        while !open.is_empty() {
            tokio::select! {
                Some(first) = outcomes.recv() => {
                    let mut ended = vec![first];
                    while let Ok(next) = outcomes.try_recv() {
                        ended.push(next);
                    }
                    self.finish(&unit, &mut open, ended).await;
                }
                () = &mut work, if !work_done => {
                    work_done = true;
                    let mut ended = Vec::new();
                    while let Ok(next) = outcomes.try_recv() {
                        ended.push(next);
                    }
                    for index in open.iter() {
                        if !ended.iter().any(|(done, _)| done == index) {
                            ended.push((*index, Err(crate::job::retryable(
                                "unit_incomplete",
                                "the unit ended without an outcome for this job",
                            ))));
                        }
                    }
                    self.finish(&unit, &mut open, ended).await;
                }
                _ = heartbeat.tick() => self.beat(&unit, &mut open).await,
                _ = self.stop.changed() => {
                    let releases = open.iter().filter(|index| unit.is_held(**index)).map(|index| {
                        let ledger = self.ledger.clone();
                        let token = unit.members[*index].token.clone();
                        async move { ledger.release(&token).await }
                    });
                    for released in futures::future::join_all(releases).await {
                        match released {
                            Ok(_) => { self.stats.released.fetch_add(1, Ordering::Relaxed); }
                            Err(_) => { self.stats.lost.fetch_add(1, Ordering::Relaxed); }
                        }
                    }
                    return;
                }
            }
        }
    }

    /// Heartbeats every open member (with the unit's stage); takes out the lost ones and
    /// ends the cancelled ones.
    async fn beat(&self, unit: &Unit, open: &mut HashSet<usize>) {
        let stage = unit.stage();
        let beats = futures::future::join_all(open.iter().map(|index| {
            let token = &unit.members[*index].token;
            async move {
                let beat = match stage {
                    Some(stage) => self.ledger.progress(token, stage).await,
                    None => self.ledger.heartbeat(token).await,
                };
                (*index, beat)
            }
        }))
        .await;
        let mut ended = Vec::new();
        for (index, beat) in beats {
            match beat {
                Ok(beat) if beat.cancel_requested => {
                    tracing::info!(job_id = %unit.members[index].job.id, "cancel requested: stopping this job of the unit");
                    ended.push((index, Err(cancelled(stage.unwrap_or("running")))));
                }
                Ok(_) => {}
                Err(error) => {
                    // Lost, or the ledger unreachable: the lease cannot be known to hold, so
                    // nothing more is written for this job; it is taken again when its lease
                    // runs out on the ledger's clock.
                    unit.lose(index, &error);
                }
            }
        }
        if !ended.is_empty() {
            self.finish(unit, open, ended).await;
        }
    }

    /// Ends the runs of `ended` members (each once): complete, fail, or nothing for a lost one.
    async fn finish(&self, unit: &Unit, open: &mut HashSet<usize>, ended: Vec<Outcome>) {
        let mut writes = Vec::new();
        for (index, outcome) in ended {
            if !open.remove(&index) {
                continue;
            }
            let member = &unit.members[index];
            if matches!(&outcome, Err(failure) if failure.code == LOST) {
                self.stats.lost.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            member.out.store(true, Ordering::SeqCst);
            let ledger = self.ledger.clone();
            let token = member.token.clone();
            let stats = self.stats.clone();
            let job_id = member.job.id;
            writes.push(async move {
                let ended = match outcome {
                    Ok(()) => ledger.complete(&token).await.map(|_| &stats.completed),
                    Err(failure) => {
                        tracing::debug!(%job_id, code = %failure.code, "unit member failed");
                        ledger.fail(&token, failure).await.map(|_| &stats.failed)
                    }
                };
                match ended {
                    Ok(counter) => {
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => {
                        stats.lost.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%job_id, %error, "run stopped: its lease no longer holds");
                    }
                }
            });
        }
        // Together, so that the ledger commits them in one group.
        futures::future::join_all(writes).await;
    }
}
