//! Model-based property test of leases: random interleavings of claim, heartbeat, complete,
//! fail, time advance, crash, cancel and requeue against the SQLite ledger, with the lease
//! invariants checked after every step.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use receipts::conformance::{put, START};
use receipts::{
    Acceptor, Clock, Failure, FailureClass, Job, JobState, LeaseToken, Leases, LedgerError,
    ManualClock, Reader, SqliteLedger, SqliteOptions,
};

const JOBS: usize = 3;
const WORKERS: usize = 2;

#[derive(Debug, Clone)]
enum Step {
    Claim {
        worker: usize,
        limit: u32,
    },
    Heartbeat {
        worker: usize,
        job: usize,
    },
    Complete {
        worker: usize,
        job: usize,
    },
    Fail {
        worker: usize,
        job: usize,
        class: u8,
    },
    Release {
        worker: usize,
        job: usize,
    },
    Advance {
        seconds: i64,
    },
    Crash {
        worker: usize,
    },
    Cancel {
        job: usize,
    },
    Requeue {
        job: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let worker = 0..WORKERS;
    let job = 0..JOBS;
    prop_oneof![
        3 => (worker.clone(), 1..3u32).prop_map(|(worker, limit)| Step::Claim { worker, limit }),
        3 => (worker.clone(), job.clone()).prop_map(|(worker, job)| Step::Heartbeat { worker, job }),
        2 => (worker.clone(), job.clone()).prop_map(|(worker, job)| Step::Complete { worker, job }),
        3 => (worker.clone(), job.clone(), 0..4u8).prop_map(|(worker, job, class)| Step::Fail { worker, job, class }),
        1 => (worker.clone(), job.clone()).prop_map(|(worker, job)| Step::Release { worker, job }),
        3 => prop_oneof![1..12i64, 25..45i64].prop_map(|seconds| Step::Advance { seconds }),
        1 => worker.prop_map(|worker| Step::Crash { worker }),
        1 => job.clone().prop_map(|job| Step::Cancel { job }),
        1 => job.prop_map(|job| Step::Requeue { job }),
    ]
}

fn failure(class: u8) -> Failure {
    let class = match class {
        0 => FailureClass::Retryable {
            retry_after_micros: None,
        },
        1 => FailureClass::Retryable {
            retry_after_micros: Some(3_000_000),
        },
        2 => FailureClass::Permanent,
        _ => FailureClass::Cancelled,
    };
    Failure {
        class,
        code: "model_failure".to_owned(),
        message: "injected by the model".to_owned(),
    }
}

struct World {
    ledger: SqliteLedger,
    clock: Arc<ManualClock>,
    jobs: Vec<uuid::Uuid>,
    /// The last token each worker was given for each job (it may be stale).
    tokens: Vec<HashMap<usize, LeaseToken>>,
    _directory: tempfile::TempDir,
}

impl World {
    async fn new() -> World {
        let directory = tempfile::tempdir().expect("tempdir");
        let clock = Arc::new(ManualClock::new(START));
        let ledger = SqliteLedger::open(
            SqliteOptions::new(directory.path().join("ledger.db")),
            clock.clone(),
        )
        .await
        .expect("open");
        let mut jobs = Vec::new();
        for index in 0..JOBS {
            let mut results = ledger
                .accept(vec![put(
                    &format!("d{}", index % 2),
                    &format!("k{index}"),
                    &format!("text {index}"),
                )])
                .await;
            jobs.push(
                results
                    .pop()
                    .expect("result")
                    .expect("accepted")
                    .projection_job_id,
            );
        }
        World {
            ledger,
            clock,
            jobs,
            tokens: vec![HashMap::new(); WORKERS],
            _directory: directory,
        }
    }

    async fn snapshot(&self) -> Vec<Job> {
        let mut jobs = Vec::new();
        for id in &self.jobs {
            jobs.push(self.ledger.job(*id).await.expect("read").expect("exists"));
        }
        jobs
    }

    async fn history_len(&self, job: usize) -> usize {
        self.ledger
            .history("job", &self.jobs[job].to_string())
            .await
            .expect("history")
            .len()
    }
}

/// Whether `token` is the job's current, unexpired lease at `now`.
fn holds(job: &Job, token: &LeaseToken, now: i64) -> bool {
    job.state == JobState::Running
        && job.lease_id.as_deref() == Some(token.lease_id.as_str())
        && job.lease_expires_at.is_some_and(|expiry| expiry > now)
}

/// Checks a fenced write against the model: it succeeds exactly when the token held the job
/// (and `extra_valid`), and a refused write leaves the job and its history untouched.
#[allow(clippy::too_many_arguments)]
async fn check_fenced<T: std::fmt::Debug>(
    world: &World,
    job: usize,
    before: &Job,
    token: &LeaseToken,
    now: i64,
    extra_valid: bool,
    result: Result<T, LedgerError>,
    history_before: usize,
) -> Result<(), TestCaseError> {
    let valid = holds(before, token, now) && extra_valid;
    match result {
        Ok(_) => prop_assert!(
            valid,
            "a write with an invalid lease succeeded: {before:?} {token:?}"
        ),
        Err(LedgerError::LeaseLost { .. }) => {
            prop_assert!(!valid, "a valid lease was refused: {before:?}");
            let after = world
                .ledger
                .job(world.jobs[job])
                .await
                .expect("read")
                .expect("exists");
            prop_assert_eq!(&after, before, "a fenced-out write changed the job");
            prop_assert_eq!(
                world.history_len(job).await,
                history_before,
                "a fenced-out write reached history"
            );
        }
        Err(error) => prop_assert!(false, "unexpected error {error}"),
    }
    Ok(())
}

async fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let mut world = World::new().await;
    for step in steps {
        let before = world.snapshot().await;
        let now = world.clock.now_micros();
        match step.clone() {
            Step::Claim { worker, limit } => {
                let claimed = world
                    .ledger
                    .claim(&format!("w{worker}"), limit)
                    .await
                    .expect("claim");
                prop_assert!(claimed.len() <= limit as usize);
                for job in claimed {
                    let index = world
                        .jobs
                        .iter()
                        .position(|id| *id == job.id)
                        .expect("known job");
                    let old = &before[index];
                    let expired = old.state == JobState::Running
                        && old.lease_expires_at.is_some_and(|e| e <= now);
                    prop_assert!(
                        matches!(old.state, JobState::Pending | JobState::RetryWait)
                            && old.run_at <= now
                            || expired,
                        "claimed a job that was not claimable: {old:?}"
                    );
                    world.tokens[worker].insert(index, LeaseToken::of(&job).expect("lease"));
                }
            }
            Step::Heartbeat { worker, job }
            | Step::Complete { worker, job }
            | Step::Fail { worker, job, .. }
            | Step::Release { worker, job } => {
                let Some(token) = world.tokens[worker].get(&job).cloned() else {
                    continue;
                };
                let history_before = world.history_len(job).await;
                let old = &before[job];
                match step {
                    Step::Heartbeat { .. } => {
                        let deadline_ok = old.deadline_at.is_some_and(|d| d > now);
                        let result = world.ledger.heartbeat(&token).await;
                        if let Ok(beat) = &result {
                            prop_assert!(
                                Some(beat.lease_expires_at) <= old.deadline_at,
                                "lease extended past the deadline"
                            );
                        }
                        check_fenced(
                            &world,
                            job,
                            old,
                            &token,
                            now,
                            deadline_ok,
                            result,
                            history_before,
                        )
                        .await?;
                    }
                    Step::Complete { .. } => {
                        let result = world.ledger.complete(&token).await;
                        check_fenced(&world, job, old, &token, now, true, result, history_before)
                            .await?;
                    }
                    Step::Fail { class, .. } => {
                        let result = world.ledger.fail(&token, failure(class)).await;
                        check_fenced(&world, job, old, &token, now, true, result, history_before)
                            .await?;
                    }
                    _ => {
                        let result = world.ledger.release(&token).await;
                        check_fenced(&world, job, old, &token, now, true, result, history_before)
                            .await?;
                    }
                }
            }
            Step::Advance { seconds } => world.clock.advance(seconds * 1_000_000),
            Step::Crash { worker } => world.tokens[worker].clear(),
            Step::Cancel { job } => {
                let result = world.ledger.cancel(world.jobs[job], "model", "test").await;
                let old = &before[job];
                match result {
                    Ok(_) => prop_assert!(!old.state.is_terminal()),
                    Err(LedgerError::InvalidTransition { .. }) => {
                        prop_assert!(old.state.is_terminal())
                    }
                    Err(error) => prop_assert!(false, "cancel failed: {error}"),
                }
            }
            Step::Requeue { job } => {
                let result = world.ledger.requeue(world.jobs[job], "model", "test").await;
                let old = &before[job];
                let requeueable = matches!(
                    old.state,
                    JobState::Dead | JobState::Cancelled | JobState::Quarantined
                );
                match result {
                    Ok(job) => {
                        prop_assert!(requeueable);
                        prop_assert_eq!(
                            (job.state, job.attempt, job.crashes),
                            (JobState::Pending, 0, 0)
                        );
                    }
                    Err(LedgerError::InvalidTransition { .. }) => prop_assert!(!requeueable),
                    Err(error) => prop_assert!(false, "requeue failed: {error}"),
                }
            }
        }

        // Invariants after every step.
        let after = world.snapshot().await;
        for (index, (old, new)) in before.iter().zip(&after).enumerate() {
            prop_assert!(
                new.attempt <= new.max_attempts,
                "attempts exceed the maximum: {new:?}"
            );
            prop_assert_eq!(new.lease_id.is_some(), new.state == JobState::Running);
            if let (Some(expiry), Some(deadline)) = (new.lease_expires_at, new.deadline_at) {
                prop_assert!(expiry <= deadline, "lease beyond the deadline: {new:?}");
            }
            let requeued = matches!(step, Step::Requeue { job } if job == index);
            if old.state.is_terminal() && !requeued {
                prop_assert_eq!(
                    new.state,
                    old.state,
                    "a terminal state changed: {:?} by {:?}",
                    old,
                    step
                );
            }
            // History is a complete chain of transitions ending in the current state.
            let history = world
                .ledger
                .history("job", &world.jobs[index].to_string())
                .await
                .expect("history");
            let states: Vec<_> = history.iter().filter(|h| h.event == "state").collect();
            for pair in states.windows(2) {
                prop_assert_eq!(&pair[1].from, &pair[0].to, "history has a gap");
            }
            prop_assert_eq!(
                states.last().and_then(|h| h.to.clone()),
                Some(new.state.to_string())
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn leases_keep_their_invariants(steps in proptest::collection::vec(step(), 1..60)) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        runtime.block_on(run(steps))?;
    }
}
