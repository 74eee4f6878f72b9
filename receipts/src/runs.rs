//! How a run ends, decided once for every ledger engine: the job's next state, its attempt
//! charge, when it may run again and why, from the failure's class and the job's policy.
//! Engines apply an [`Ending`] with one fenced write.

use crate::clock::Micros;
use crate::error::LedgerError;
use crate::model::{Failure, FailureClass, Job, JobKind, JobState, LeaseToken};
use crate::policy::JobPolicy;

/// How a run ends: the job's next state and why.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ending {
    pub(crate) state: JobState,
    /// Failures charged by this run (0 or 1).
    pub(crate) attempt_delta: i64,
    pub(crate) run_at: Micros,
    /// Why `run_at` holds its value.
    pub(crate) rule: String,
    /// The history cause.
    pub(crate) cause: String,
    /// The error to record as the job's last error, as `(code, message)`.
    pub(crate) error: Option<(String, String)>,
}

impl Ending {
    pub(crate) fn new(
        state: JobState,
        run_at: Micros,
        rule: impl Into<String>,
        cause: impl Into<String>,
    ) -> Self {
        Self {
            state,
            attempt_delta: 0,
            run_at,
            rule: rule.into(),
            cause: cause.into(),
            error: None,
        }
    }
}

/// A run given back without charge (graceful shutdown), or cancelled when a cancel was asked.
pub(crate) fn release_ending(job: &Job, owner: &str, now: Micros) -> Ending {
    if job.cancel_requested {
        Ending::new(
            JobState::Cancelled,
            now,
            "cancelled",
            "cancelled: released after a cancel request",
        )
    } else {
        let rule = format!("released by {owner} without charge");
        Ending::new(
            JobState::Pending,
            now,
            rule,
            "released: worker shutting down",
        )
    }
}

/// How a failed run ends, by the failure's class: cancelled (also whenever a cancel was
/// requested), dead (permanent, or attempts exhausted), or waiting for a retry set by the
/// error's retry-after (no attempt charged) or by exponential backoff (one attempt charged).
pub(crate) fn failure_ending(
    job: &Job,
    failure: &Failure,
    now: Micros,
    policy: &JobPolicy,
    unit: f64,
) -> Ending {
    let code = &failure.code;
    let class = if job.cancel_requested {
        FailureClass::Cancelled
    } else {
        failure.class
    };
    let mut ending = match class {
        FailureClass::Cancelled => Ending::new(
            JobState::Cancelled,
            now,
            "cancelled",
            format!("cancelled ({code})"),
        ),
        FailureClass::Permanent => Ending {
            attempt_delta: 1,
            ..Ending::new(
                JobState::Dead,
                now,
                "dead",
                format!("dead: permanent error {code}"),
            )
        },
        FailureClass::Retryable {
            retry_after_micros: Some(delay),
        } => {
            let delay = delay.max(0);
            Ending::new(
                JobState::RetryWait,
                now.saturating_add(delay),
                format!(
                    "retry-after {} ms from error {code} (snooze: no attempt charged)",
                    delay / 1000
                ),
                format!("snoozed: {code} asked to retry after {} ms", delay / 1000),
            )
        }
        FailureClass::Retryable {
            retry_after_micros: None,
        } => {
            let attempt = job.attempt + 1;
            if attempt >= job.max_attempts {
                let cause = format!(
                    "dead: attempts exhausted ({attempt} of {}) after {code}",
                    job.max_attempts
                );
                Ending {
                    attempt_delta: 1,
                    ..Ending::new(JobState::Dead, now, "dead", cause)
                }
            } else {
                let delay = policy.backoff_micros(attempt, unit);
                let rule = format!(
                    "backoff after attempt {attempt}: {} ms = {} ms x 2^{} (cap {} ms) with jitter",
                    delay / 1000,
                    policy.backoff_base_micros / 1000,
                    attempt - 1,
                    policy.backoff_cap_micros / 1000
                );
                let cause = format!(
                    "retry scheduled after {code} (attempt {attempt} of {})",
                    job.max_attempts
                );
                Ending {
                    attempt_delta: 1,
                    ..Ending::new(JobState::RetryWait, now.saturating_add(delay), rule, cause)
                }
            }
        }
    };
    ending.error = Some((failure.code.clone(), failure.message.clone()));
    ending
}

/// Why a fenced write by `token` found no row, from the job as it is now. A lease never runs
/// past its run's deadline (heartbeats stop at it), so an unexpired lease is within its
/// deadline: expiry is the last reason to check.
pub(crate) fn lease_lost(job: &Job, token: &LeaseToken, now: Micros) -> LedgerError {
    let reason = match (&job.lease_id, job.lease_expires_at) {
        _ if job.state != JobState::Running => format!("the job is {}", job.state),
        (Some(lease), _) if *lease != token.lease_id => "another lease holds the job".to_owned(),
        (_, Some(expiry)) if expiry <= now => format!("the lease expired at {expiry}"),
        _ => "the lease does not match".to_owned(),
    };
    LedgerError::LeaseLost {
        job_id: token.job_id,
        reason,
    }
}

/// What an operator's cancel does to a job, by its state: a waiting job is cancelled, a
/// running one is asked to stop (once; asking again changes nothing), any other is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelStep {
    /// Pending or waiting to retry: cancelled now.
    Cancel,
    /// Running: asked to stop at its next heartbeat.
    RequestStop,
    /// Running and already asked to stop.
    AlreadyRequested,
}

/// The [`CancelStep`] for `job`, or `invalid_transition`.
pub(crate) fn cancel_step(job: &Job) -> Result<CancelStep, LedgerError> {
    match job.state {
        JobState::Pending | JobState::RetryWait => Ok(CancelStep::Cancel),
        JobState::Running if !job.cancel_requested => Ok(CancelStep::RequestStop),
        JobState::Running => Ok(CancelStep::AlreadyRequested),
        other => Err(LedgerError::InvalidTransition {
            job_id: job.id,
            state: other.to_string(),
            action: "cancel",
        }),
    }
}

/// Whether an operator may requeue `job`: it must have ended (dead, cancelled, quarantined)
/// and still be current (`is_current`, read by the engine): its revision is still its
/// source's head or, for a sync run, its connector is active with no other open run, or, for
/// an access job, its source still exists.
pub(crate) fn check_requeue(job: &Job, is_current: bool) -> Result<(), LedgerError> {
    let state = if !matches!(
        job.state,
        JobState::Dead | JobState::Cancelled | JobState::Quarantined
    ) {
        job.state.to_string()
    } else if !is_current && job.kind == JobKind::Sync {
        format!(
            "{} (its connector is not active, or another run of it is open)",
            job.state
        )
    } else if !is_current {
        format!("{} (its revision is no longer head)", job.state)
    } else {
        return Ok(());
    };
    Err(LedgerError::InvalidTransition {
        job_id: job.id,
        state,
        action: "requeue",
    })
}
