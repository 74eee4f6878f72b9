//! Model-based property test of leases: random interleavings of claim, heartbeat, complete,
//! fail, release, a unit's write, time advance, crash, cancel and requeue against each ledger
//! engine (SQLite, and
//! PostgreSQL on a real server: one server per engine test, a fresh database per case).
//!
//! An independent model keeps, per job, what the contract says it must be: state, attempt,
//! crashes, holder (which lease), lease expiry, deadline, run-at and a pending cancel request.
//! After every step the ledger's rows must equal the model's prediction; `claim` must return
//! exactly `min(limit, claimable)` jobs, the ones the model picks (highest priority, datasets
//! taking turns, then oldest), in the promised order; and the invariants (one lease per job,
//! no lease past its deadline, terminal states stay, history is a complete chain) hold.
//!
//! The only value the model does not predict exactly is a backoff's jitter: a retry's run-at
//! must lie within the policy's jitter band, and the model then adopts it.
//!
//! Mutation check (run by hand; each must make this test fail):
//! - in the completion statement, `SET state = 'completed'` changed to `'dead'`, or the
//!   statement made a no-op that still answers Ok;
//! - `claim` returning `[]` always;
//! - a `Permanent` failure ending in `retry_wait`;
//! - `project_many` skipping every member after a stale one while answering Ok (a stale job
//!   fencing out its neighbours, unseen).
//!
//! `cargo nextest run -p receipts -E 'binary(lease_model)'`

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use receipts::policy::{JobPolicy, BACKOFF_JITTER};
use receipts::{
    Clock, Failure, FailureClass, Job, JobState, LeaseToken, Ledger, LedgerClock, LedgerError,
    ManualClock, Micros, PostgresLedger, PostgresOptions, SqliteLedger, SqliteOptions,
};
use testkit::conformance::{put, START};
use testkit::postgres::PostgresServer;

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
    /// A unit's ledger write ([`receipts::Projections::project_many`]) of every job in `jobs`
    /// (a bit mask) that `worker` holds a token for, stale or not: each member must be fenced
    /// by its own lease alone.
    Unit {
        worker: usize,
        jobs: u8,
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
        1 => worker.clone().prop_map(|worker| Step::Crash { worker }),
        1 => job.clone().prop_map(|job| Step::Cancel { job }),
        1 => job.prop_map(|job| Step::Requeue { job }),
        3 => (worker, 1..(1u8 << JOBS)).prop_map(|(worker, jobs)| Step::Unit { worker, jobs }),
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

/// What the contract says one job must be.
#[derive(Debug, Clone, PartialEq)]
struct ModelJob {
    id: uuid::Uuid,
    dataset: String,
    priority: i64,
    max_attempts: i64,
    state: JobState,
    attempt: i64,
    crashes: i64,
    /// The lease that holds the job (as the ledger issued it at the claim), and its owner.
    lease: Option<(String, String)>,
    lease_expires_at: Option<Micros>,
    deadline_at: Option<Micros>,
    run_at: Micros,
    cancel_requested: bool,
}

impl ModelJob {
    fn of(job: &Job) -> ModelJob {
        ModelJob {
            id: job.id,
            dataset: job.dataset.clone(),
            priority: job.priority,
            max_attempts: job.max_attempts,
            state: job.state,
            attempt: job.attempt,
            crashes: job.crashes,
            lease: None,
            lease_expires_at: None,
            deadline_at: None,
            run_at: job.run_at,
            cancel_requested: job.cancel_requested,
        }
    }

    /// Whether `token` holds the job at `now` for a write that ends or extends the run.
    fn held_by(&self, token: &LeaseToken, now: Micros) -> bool {
        self.state == JobState::Running
            && self.lease.as_ref().map(|(lease, _)| lease.as_str()) == Some(token.lease_id.as_str())
            && self.lease_expires_at.is_some_and(|expiry| expiry > now)
    }

    /// The run ends: the lease is gone.
    fn end(&mut self, state: JobState, run_at: Micros) {
        self.state = state;
        self.run_at = run_at;
        self.lease = None;
        self.lease_expires_at = None;
        self.deadline_at = None;
    }

    /// Compares the ledger's row with the prediction.
    fn check(&self, job: &Job, context: &str) -> Result<(), TestCaseError> {
        prop_assert_eq!(job.state, self.state, "state after {}: {:?}", context, job);
        prop_assert_eq!(
            job.attempt,
            self.attempt,
            "attempt after {}: {:?}",
            context,
            job
        );
        prop_assert_eq!(
            job.crashes,
            self.crashes,
            "crashes after {}: {:?}",
            context,
            job
        );
        prop_assert_eq!(
            job.lease_id.as_deref(),
            self.lease.as_ref().map(|(lease, _)| lease.as_str()),
            "lease after {}",
            context
        );
        prop_assert_eq!(
            job.lease_owner.as_deref(),
            self.lease.as_ref().map(|(_, owner)| owner.as_str()),
            "lease owner after {}",
            context
        );
        prop_assert_eq!(
            job.lease_expires_at,
            self.lease_expires_at,
            "lease expiry after {}",
            context
        );
        prop_assert_eq!(
            job.deadline_at,
            self.deadline_at,
            "deadline after {}",
            context
        );
        prop_assert_eq!(
            job.run_at,
            self.run_at,
            "run_at after {}: {:?}",
            context,
            job
        );
        prop_assert_eq!(
            job.cancel_requested,
            self.cancel_requested,
            "cancel request after {}",
            context
        );
        Ok(())
    }
}

/// The model of the whole queue.
struct Model {
    jobs: Vec<ModelJob>,
    policy: JobPolicy,
}

impl Model {
    /// Expired leases go back to pending charged a crash, to quarantine at the limit, or to
    /// cancelled when a cancel was requested; run before every claim.
    fn rescue(&mut self, now: Micros) {
        let limit = self.policy.quarantine_after_crashes;
        for job in &mut self.jobs {
            if job.state == JobState::Running && job.lease_expires_at.is_some_and(|e| e <= now) {
                job.crashes += 1;
                let state = if job.cancel_requested {
                    JobState::Cancelled
                } else if job.crashes >= limit {
                    JobState::Quarantined
                } else {
                    JobState::Pending
                };
                job.end(state, now);
            }
        }
    }

    /// The jobs a claim of `limit` takes, in the claim's selection order: highest priority,
    /// then each dataset's n-th oldest before any dataset's (n+1)-th, then run-at, then id.
    fn claimable(&self, now: Micros, limit: usize) -> Vec<usize> {
        let due: Vec<usize> = (0..self.jobs.len())
            .filter(|&index| {
                let job = &self.jobs[index];
                matches!(job.state, JobState::Pending | JobState::RetryWait) && job.run_at <= now
            })
            .collect();
        let turn = |index: usize| {
            let job = &self.jobs[index];
            due.iter()
                .filter(|&&other| {
                    let o = &self.jobs[other];
                    o.priority == job.priority
                        && o.dataset == job.dataset
                        && (o.run_at, o.id.to_string()) < (job.run_at, job.id.to_string())
                })
                .count()
        };
        let mut order: Vec<(i64, usize, Micros, String, usize)> = due
            .iter()
            .map(|&index| {
                let job = &self.jobs[index];
                (
                    -job.priority,
                    turn(index),
                    job.run_at,
                    job.id.to_string(),
                    index,
                )
            })
            .collect();
        order.sort();
        order.into_iter().take(limit).map(|entry| entry.4).collect()
    }
}

/// The ledger engine a run is checked against.
enum Engine<'a> {
    Sqlite,
    /// A fresh database per case on this server.
    Postgres(&'a PostgresServer, std::sync::atomic::AtomicUsize),
}

struct World {
    ledger: Arc<dyn Ledger>,
    clock: Arc<ManualClock>,
    jobs: Vec<uuid::Uuid>,
    /// The active projection generation (what a unit's receipts name).
    generation: String,
    /// The last token each worker was given for each job (it may be stale).
    tokens: Vec<HashMap<usize, LeaseToken>>,
    _guard: Box<dyn std::any::Any>,
}

impl World {
    async fn new(engine: &Engine<'_>) -> World {
        let clock = Arc::new(ManualClock::new(START));
        let (ledger, guard): (Arc<dyn Ledger>, Box<dyn std::any::Any>) = match engine {
            Engine::Sqlite => {
                let directory = tempfile::tempdir().expect("tempdir");
                let ledger = SqliteLedger::open(
                    SqliteOptions::new(directory.path().join("ledger.db")),
                    clock.clone(),
                )
                .await
                .expect("open");
                (Arc::new(ledger), Box::new(directory))
            }
            Engine::Postgres(server, cases) => {
                let case = cases.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let url = server
                    .create_database(&format!("case{case}"))
                    .expect("create database");
                let ledger = PostgresLedger::open_with(
                    PostgresOptions::new(url),
                    LedgerClock::Injected(clock.clone()),
                    Arc::new(receipts::faults::NoFaults),
                )
                .await
                .expect("open");
                (Arc::new(ledger), Box::new(()))
            }
        };
        let generation = receipts::Generation::new(
            "model",
            3,
            "model-chunker",
            &[receipts::Backend::Relational, receipts::Backend::Vector],
        );
        ledger
            .activate_generation(&generation, "model")
            .await
            .expect("activate a generation");
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
            generation: generation.id,
            tokens: vec![HashMap::new(); WORKERS],
            _guard: guard,
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

/// Checks a fenced write's answer against the model: it succeeds exactly when the model says
/// the token holds the job (and `extra_valid`), and a refused write leaves the job and its
/// history untouched.
#[allow(clippy::too_many_arguments)]
async fn check_fenced<T: std::fmt::Debug>(
    world: &World,
    job: usize,
    before: &Job,
    (token, now): (&LeaseToken, Micros),
    valid: bool,
    result: &Result<T, LedgerError>,
    history_before: usize,
) -> Result<(), TestCaseError> {
    match result {
        Ok(_) => prop_assert!(valid, "a write with an invalid lease succeeded: {before:?}"),
        Err(LedgerError::LeaseLost { reason, .. }) => {
            prop_assert!(!valid, "a valid lease was refused: {before:?}");
            // The reason names what the operator must know, in the order the ledger checks.
            let expected = if before.state != JobState::Running {
                format!("the job is {}", before.state)
            } else if before.lease_id.as_deref() != Some(token.lease_id.as_str()) {
                "another lease holds the job".to_owned()
            } else if before.lease_expires_at.is_some_and(|expiry| expiry <= now) {
                format!(
                    "the lease expired at {}",
                    before.lease_expires_at.unwrap_or_default()
                )
            } else {
                "the lease does not match".to_owned()
            };
            prop_assert_eq!(reason, &expected);
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

/// How a failed run ends, by the contract: cancelled when a cancel was requested or the error
/// says so; dead for a permanent error or at the last attempt; otherwise waiting, after the
/// error's retry-after (no attempt charged) or the backoff (one attempt charged). Returns the
/// backoff band `(lowest, highest)` of run-at when the jitter decides it.
fn predict_failure(
    job: &mut ModelJob,
    class: FailureClass,
    now: Micros,
    policy: &JobPolicy,
) -> Option<(Micros, Micros)> {
    let class = if job.cancel_requested {
        FailureClass::Cancelled
    } else {
        class
    };
    match class {
        FailureClass::Cancelled => job.end(JobState::Cancelled, now),
        FailureClass::Permanent => {
            job.attempt += 1;
            job.end(JobState::Dead, now);
        }
        FailureClass::Retryable {
            retry_after_micros: Some(delay),
        } => job.end(JobState::RetryWait, now + delay.max(0)),
        FailureClass::Retryable {
            retry_after_micros: None,
        } => {
            job.attempt += 1;
            if job.attempt >= job.max_attempts {
                job.end(JobState::Dead, now);
            } else {
                let exponent = u32::try_from(job.attempt - 1).unwrap_or(0).min(40);
                let raw = policy
                    .backoff_base_micros
                    .saturating_mul(2_i64.saturating_pow(exponent))
                    .min(policy.backoff_cap_micros) as f64;
                let low = now + (raw * (1.0 - BACKOFF_JITTER)).floor() as i64;
                let high = now + (raw * (1.0 + BACKOFF_JITTER)).ceil() as i64;
                job.end(JobState::RetryWait, now);
                return Some((low, high));
            }
        }
    }
    None
}

/// The state and evidence of `job`'s relational receipt.
async fn relational_receipt(
    world: &World,
    job: usize,
) -> Option<(receipts::ReceiptState, Option<serde_json::Value>)> {
    world
        .ledger
        .receipts(world.jobs[job])
        .await
        .expect("receipts")
        .into_iter()
        .find(|receipt| receipt.backend == receipts::Backend::Relational)
        .map(|receipt| (receipt.state, receipt.evidence))
}

async fn run(steps: Vec<Step>, engine: &Engine<'_>) -> Result<(), TestCaseError> {
    let mut world = World::new(engine).await;
    let policy = JobPolicy::default();
    let mut model = Model {
        jobs: world.snapshot().await.iter().map(ModelJob::of).collect(),
        policy,
    };
    for step in steps {
        let before = world.snapshot().await;
        let now = world.clock.now_micros();
        let context = format!("{step:?} at {now}");
        match step.clone() {
            Step::Claim { worker, limit } => {
                let owner = format!("w{worker}");
                model.rescue(now);
                let expected = model.claimable(now, limit as usize);
                let claimed = world.ledger.claim(&owner, limit).await.expect("claim");
                let mut got: Vec<usize> = claimed
                    .iter()
                    .map(|job| {
                        world
                            .jobs
                            .iter()
                            .position(|id| *id == job.id)
                            .expect("known job")
                    })
                    .collect();
                // The promised order: priority first, then run-at.
                let keys: Vec<(i64, Micros)> = claimed
                    .iter()
                    .map(|job| (-job.priority, job.run_at))
                    .collect();
                let mut sorted = keys.clone();
                sorted.sort();
                prop_assert_eq!(keys, sorted, "claim order after {}", &context);
                got.sort_unstable();
                let mut want = expected.clone();
                want.sort_unstable();
                prop_assert_eq!(
                    got,
                    want,
                    "claimed jobs after {} (limit {}, claimable {:?})",
                    &context,
                    limit,
                    model.claimable(now, usize::MAX)
                );
                for job in &claimed {
                    let index = world
                        .jobs
                        .iter()
                        .position(|id| *id == job.id)
                        .expect("known job");
                    let lease = job.lease_id.clone().expect("a claimed job holds a lease");
                    let predicted = &mut model.jobs[index];
                    predicted.state = JobState::Running;
                    predicted.lease = Some((lease, owner.clone()));
                    predicted.lease_expires_at =
                        Some(now + policy.lease_micros.min(policy.max_run_micros));
                    predicted.deadline_at = Some(now + policy.max_run_micros);
                    world.tokens[worker].insert(index, LeaseToken::of(job).expect("lease"));
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
                let predicted = &mut model.jobs[job];
                let holds = predicted.held_by(&token, now);
                match step {
                    Step::Heartbeat { .. } => {
                        let valid = holds && predicted.deadline_at.is_some_and(|d| d > now);
                        let result = world.ledger.heartbeat(&token).await;
                        check_fenced(
                            &world,
                            job,
                            old,
                            (&token, now),
                            valid,
                            &result,
                            history_before,
                        )
                        .await?;
                        if let Ok(beat) = result {
                            let deadline = predicted.deadline_at.unwrap_or(now);
                            let expiry = (now + policy.lease_micros).min(deadline);
                            predicted.lease_expires_at = Some(expiry);
                            prop_assert_eq!(beat.lease_expires_at, expiry);
                            prop_assert_eq!(beat.cancel_requested, predicted.cancel_requested);
                        }
                    }
                    // Complete, fail and release end the run: the same fence, each its own
                    // prediction.
                    ref ending => {
                        let failure = match ending {
                            Step::Fail { class, .. } => Some(failure(*class)),
                            _ => None,
                        };
                        let result = match (&ending, &failure) {
                            (Step::Complete { .. }, _) => world.ledger.complete(&token).await,
                            (_, Some(failure)) => world.ledger.fail(&token, failure.clone()).await,
                            _ => world.ledger.release(&token).await,
                        };
                        check_fenced(
                            &world,
                            job,
                            old,
                            (&token, now),
                            holds,
                            &result,
                            history_before,
                        )
                        .await?;
                        if let Ok(ended) = result {
                            match (ending, failure) {
                                (Step::Complete { .. }, _) => {
                                    predicted.end(JobState::Completed, now)
                                }
                                (_, Some(failure)) => {
                                    if let Some((low, high)) =
                                        predict_failure(predicted, failure.class, now, &policy)
                                    {
                                        prop_assert!(
                                            (low..=high).contains(&ended.run_at),
                                            "backoff run_at {} outside [{}, {}]",
                                            ended.run_at,
                                            low,
                                            high
                                        );
                                        predicted.run_at = ended.run_at;
                                    }
                                }
                                _ => {
                                    let state = if predicted.cancel_requested {
                                        JobState::Cancelled
                                    } else {
                                        JobState::Pending
                                    };
                                    predicted.end(state, now);
                                }
                            }
                        }
                    }
                }
            }
            Step::Unit { worker, jobs } => {
                let members: Vec<(usize, LeaseToken)> = (0..JOBS)
                    .filter(|job| jobs & (1 << job) != 0)
                    .filter_map(|job| Some((job, world.tokens[worker].get(&job)?.clone())))
                    .collect();
                if members.is_empty() {
                    continue;
                }
                let mut receipts_before = Vec::new();
                let mut histories_before = Vec::new();
                for (job, _) in &members {
                    receipts_before.push(relational_receipt(&world, *job).await);
                    histories_before.push(world.history_len(*job).await);
                }
                let writes = members
                    .iter()
                    .map(|(_, token)| receipts::UnitWrite {
                        lease: token.clone(),
                        chunks: None,
                        receipts: vec![receipts::ReceiptUpdate {
                            backend: receipts::Backend::Relational,
                            state: receipts::ReceiptState::Verified,
                            evidence: serde_json::json!({ "lease": token.lease_id }),
                            cause: "verified: unit of the model".to_owned(),
                            generation: world.generation.clone(),
                        }],
                    })
                    .collect();
                let results = world.ledger.project_many(writes).await;
                prop_assert_eq!(results.len(), members.len(), "one result per member");
                for (index, ((job, token), result)) in members.iter().zip(&results).enumerate() {
                    let valid = model.jobs[*job].held_by(token, now);
                    check_fenced(
                        &world,
                        *job,
                        &before[*job],
                        (token, now),
                        valid,
                        result,
                        histories_before[index],
                    )
                    .await?;
                    let receipt = relational_receipt(&world, *job).await;
                    if valid {
                        prop_assert_eq!(
                            receipt,
                            Some((
                                receipts::ReceiptState::Verified,
                                Some(serde_json::json!({ "lease": token.lease_id }))
                            )),
                            "a held member's receipt after {}",
                            &context
                        );
                    } else {
                        prop_assert_eq!(
                            &receipt,
                            &receipts_before[index],
                            "a fenced-out member's receipt changed after {}",
                            &context
                        );
                    }
                }
            }
            Step::Advance { seconds } => world.clock.advance(seconds * 1_000_000),
            Step::Crash { worker } => world.tokens[worker].clear(),
            Step::Cancel { job } => {
                let result = world.ledger.cancel(world.jobs[job], "model", "test").await;
                let predicted = &mut model.jobs[job];
                match result {
                    Ok(_) => {
                        prop_assert!(!predicted.state.is_terminal(), "cancelled a terminal job");
                        if predicted.state == JobState::Running && predicted.cancel_requested {
                            // Asked again: nothing changes, not even who asked.
                            let row = world
                                .ledger
                                .job(world.jobs[job])
                                .await
                                .expect("read")
                                .expect("exists");
                            prop_assert_eq!(
                                &row,
                                &before[job],
                                "a repeated cancel rewrote the job"
                            );
                        } else if predicted.state == JobState::Running {
                            predicted.cancel_requested = true;
                        } else {
                            predicted.state = JobState::Cancelled;
                        }
                    }
                    Err(LedgerError::InvalidTransition { .. }) => {
                        prop_assert!(predicted.state.is_terminal())
                    }
                    Err(error) => prop_assert!(false, "cancel failed: {error}"),
                }
            }
            Step::Requeue { job } => {
                let result = world.ledger.requeue(world.jobs[job], "model", "test").await;
                let predicted = &mut model.jobs[job];
                let requeueable = matches!(
                    predicted.state,
                    JobState::Dead | JobState::Cancelled | JobState::Quarantined
                );
                match result {
                    Ok(_) => {
                        prop_assert!(requeueable, "requeued a {:?} job", predicted.state);
                        predicted.state = JobState::Pending;
                        predicted.attempt = 0;
                        predicted.crashes = 0;
                        predicted.cancel_requested = false;
                        predicted.run_at = now;
                    }
                    Err(LedgerError::InvalidTransition { .. }) => prop_assert!(!requeueable),
                    Err(error) => prop_assert!(false, "requeue failed: {error}"),
                }
            }
        }

        // The ledger equals the model, and the invariants hold, after every step.
        let after = world.snapshot().await;
        for (index, (old, new)) in before.iter().zip(&after).enumerate() {
            model.jobs[index].check(new, &context)?;
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

/// Runs the model against `engine` for 64 generated cases (and the saved regressions first).
fn check(engine: Engine<'_>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 64,
        // Saved failing cases, re-run first (nextest runs in the crate's directory).
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(
                "tests/lease_model.proptest-regressions",
            ),
        )),
        ..ProptestConfig::default()
    });
    let result = runner.run(&proptest::collection::vec(step(), 1..60), |steps| {
        runtime.block_on(run(steps, &engine))
    });
    if let Err(error) = result {
        panic!("{error}");
    }
}

#[test]
fn leases_keep_their_invariants() {
    check(Engine::Sqlite);
}

#[test]
fn leases_keep_their_invariants_on_postgres() {
    let server = PostgresServer::start().expect("start PostgreSQL");
    check(Engine::Postgres(
        &server,
        std::sync::atomic::AtomicUsize::new(0),
    ));
}
