//! Job leases: claim, heartbeat, complete, fail, release, cancel, requeue, pause, resume.
//!
//! Every function here runs inside the writer's transaction (see [`crate::sqlite`]) and is the
//! only code that changes `jobs.state` after acceptance. Each write names its actor and cause;
//! the triggers turn that into history.
//!
//! ## Lease invariants
//! - A job holds at most one lease: claiming sets a new random `lease_id` (the fencing token)
//!   and only a `running` job holds one (a CHECK constraint).
//! - A lease counts only while `lease_expires_at > now` at the time of the write; every
//!   heartbeat, completion, failure and release checks the token and the expiry in the same
//!   `UPDATE`. A fenced-out write changes nothing and returns `lease_lost`.
//! - Heartbeats extend the lease to at most `deadline_at` (claim time + max run): no lease is
//!   renewed forever.
//! - Expired leases are rescued before every claim: the job returns to `pending` charged a
//!   `crash` (not an attempt), or goes to `quarantined` once its crashes reach the limit.
//! - `attempt` counts failures the job caused; a snooze (retry-after) and a release cost none;
//!   at `max_attempts` a retryable failure makes the job `dead`.

use sqlx::sqlite::SqliteConnection;
use sqlx::Row;
use uuid::Uuid;

use super::rows::job_from_row;
use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::model::{Failure, Heartbeat, Job, LeaseToken};
use crate::policy::JobPolicies;
use crate::runs::{self, Ending};

/// A request to the writer about jobs.
#[derive(Debug)]
pub(crate) enum JobCommand {
    Claim {
        owner: String,
        limit: u32,
    },
    /// A heartbeat, with the stage the run has reached when it reports one.
    Heartbeat(LeaseToken, Option<String>),
    Complete(LeaseToken),
    Fail(LeaseToken, Failure),
    Release(LeaseToken),
    Cancel {
        job_id: Uuid,
        actor: String,
        reason: String,
    },
    Requeue {
        job_id: Uuid,
        actor: String,
        reason: String,
    },
    Pause {
        dataset: Option<String>,
        actor: String,
        reason: String,
    },
    Resume {
        dataset: Option<String>,
        actor: String,
        reason: String,
    },
}

/// The writer's answer to a [`JobCommand`].
#[derive(Debug)]
pub(crate) enum JobAnswer {
    Claimed(Vec<Job>),
    Heartbeat(Heartbeat),
    Job(Box<Job>),
    Done,
}

fn answer(result: Result<Job>) -> Result<JobAnswer> {
    result.map(|job| JobAnswer::Job(Box::new(job)))
}

/// Runs one command. `unit` is a uniform sample in `[0, 1)` for backoff jitter.
pub(crate) async fn run(
    connection: &mut SqliteConnection,
    command: JobCommand,
    now: Micros,
    policies: &JobPolicies,
    unit: f64,
) -> Result<JobAnswer> {
    match command {
        JobCommand::Claim { owner, limit } => claim(connection, &owner, limit, now)
            .await
            .map(JobAnswer::Claimed),
        JobCommand::Heartbeat(token, stage) => heartbeat(connection, &token, stage.as_deref(), now)
            .await
            .map(JobAnswer::Heartbeat),
        JobCommand::Complete(token) => complete_many(connection, std::slice::from_ref(&token), now)
            .await
            .pop()
            .unwrap_or_else(|| Err(LedgerError::Internal("no completion result".to_owned())))
            .map(|job| JobAnswer::Job(Box::new(job))),
        JobCommand::Fail(token, failure) => {
            answer(fail(connection, &token, &failure, now, policies, unit).await)
        }
        JobCommand::Release(token) => answer(release(connection, &token, now).await),
        JobCommand::Cancel {
            job_id,
            actor,
            reason,
        } => answer(cancel(connection, job_id, &actor, &reason, now).await),
        JobCommand::Requeue {
            job_id,
            actor,
            reason,
        } => answer(requeue(connection, job_id, &actor, &reason, now).await),
        JobCommand::Pause {
            dataset,
            actor,
            reason,
        } => pause(connection, dataset.as_deref(), &actor, &reason, now)
            .await
            .map(|()| JobAnswer::Done),
        JobCommand::Resume {
            dataset,
            actor,
            reason,
        } => resume(connection, dataset.as_deref(), &actor, &reason, now)
            .await
            .map(|()| JobAnswer::Done),
    }
}

/// Claims up to `limit` due jobs: highest priority first; within a priority, datasets take
/// turns (the n-th oldest job of every dataset before the (n+1)-th of any), so a busy dataset
/// cannot starve a quiet one. Datasets with due work are found by a skip scan of
/// `jobs_claim_by_dataset`, and each contributes at most `limit` candidates, so the cost is
/// O(datasets x limit), not O(pending jobs).
async fn claim(
    connection: &mut SqliteConnection,
    owner: &str,
    limit: u32,
    now: Micros,
) -> Result<Vec<Job>> {
    // One call: rescue expired leases, then claim (both statements number their parameters
    // without gaps, as sqlx binds multi-statement queries per statement).
    let rows = sqlx::query(concat!(
        include_str!("queries/rescue_expired.sql"),
        "UPDATE jobs SET state = 'running', lease_id = lower(hex(randomblob(16))), lease_owner = ?2, \
           lease_expires_at = ?1 + min(policy.lease_micros, policy.max_run_micros), heartbeat_at = ?1, \
           deadline_at = ?1 + policy.max_run_micros, \
           started_at = ?1, first_started_at = coalesce(first_started_at, ?1), \
           stage = 'claimed', stage_at = ?1, changed_by = ?2, \
           change_cause = 'claimed (failures so far ' || jobs.attempt || ' of ' || jobs.max_attempts || ', crashes ' || jobs.crashes || ')', \
           changed_at = ?1, change_seq = change_seq + 1 \
         FROM job_policies AS policy \
         WHERE policy.kind = jobs.kind AND jobs.id IN ( \
           WITH RECURSIVE due(dataset) AS ( \
             SELECT (SELECT min(dataset) FROM jobs INDEXED BY jobs_claim_by_dataset \
                     WHERE state IN ('pending', 'retry_wait')) \
             UNION ALL \
             SELECT (SELECT min(next.dataset) FROM jobs AS next INDEXED BY jobs_claim_by_dataset \
                     WHERE next.state IN ('pending', 'retry_wait') AND next.dataset > due.dataset) \
             FROM due WHERE due.dataset IS NOT NULL), \
           candidates AS ( \
             SELECT job.id, job.dataset, job.priority, job.run_at FROM due JOIN jobs AS job \
             WHERE due.dataset IS NOT NULL \
               AND NOT EXISTS (SELECT 1 FROM claim_pauses AS pause \
                               WHERE pause.dataset = '*' OR pause.dataset = due.dataset) \
               AND job.id IN (SELECT first.id FROM jobs AS first INDEXED BY jobs_claim_by_dataset \
                              WHERE first.state IN ('pending', 'retry_wait') \
                                AND first.dataset = due.dataset AND first.run_at <= ?1 \
                              ORDER BY first.priority DESC, first.run_at LIMIT ?3)) \
           SELECT id FROM ( \
             SELECT id, priority, run_at, \
               row_number() OVER (PARTITION BY priority, dataset ORDER BY run_at, id) AS turn \
             FROM candidates) \
           ORDER BY priority DESC, turn, run_at, id LIMIT ?3) \
         RETURNING *"
    ))
    .bind(now)
    .bind(owner)
    .bind(i64::from(limit))
    .fetch_all(&mut *connection)
    .await?;
    let mut jobs = rows.iter().map(job_from_row).collect::<Result<Vec<_>>>()?;
    jobs.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.run_at.cmp(&b.run_at)));
    Ok(jobs)
}

/// Why a fenced write found no row.
pub(crate) async fn lease_lost(
    connection: &mut SqliteConnection,
    token: &LeaseToken,
    now: Micros,
) -> LedgerError {
    match load(connection, token.job_id).await {
        Ok(job) => runs::lease_lost(&job, token, now),
        Err(error) => error,
    }
}

async fn load(connection: &mut SqliteConnection, job_id: Uuid) -> Result<Job> {
    let row = sqlx::query("SELECT * FROM jobs WHERE id = ?")
        .bind(job_id.to_string())
        .fetch_optional(&mut *connection)
        .await?;
    match row {
        Some(row) => job_from_row(&row),
        None => Err(LedgerError::JobNotFound(job_id)),
    }
}

async fn heartbeat(
    connection: &mut SqliteConnection,
    token: &LeaseToken,
    stage: Option<&str>,
    now: Micros,
) -> Result<Heartbeat> {
    let row = sqlx::query(
        "UPDATE jobs SET lease_expires_at = min(?1 + policy.lease_micros, deadline_at), heartbeat_at = ?1, \
           stage = coalesce(?4, stage), stage_at = CASE WHEN ?4 IS NULL THEN stage_at ELSE ?1 END \
         FROM job_policies AS policy \
         WHERE policy.kind = jobs.kind AND id = ?2 AND lease_id = ?3 AND state = 'running' \
           AND lease_expires_at > ?1 AND deadline_at > ?1 \
         RETURNING lease_expires_at, cancel_requested",
    )
    .bind(now)
    .bind(token.job_id.to_string())
    .bind(&token.lease_id)
    .bind(stage)
    .fetch_optional(&mut *connection)
    .await?;
    match row {
        Some(row) => Ok(Heartbeat {
            lease_expires_at: row.try_get("lease_expires_at")?,
            cancel_requested: row.try_get::<i64, _>("cancel_requested")? == 1,
        }),
        None => Err(lease_lost(connection, token, now).await),
    }
}

/// Ends a run: sets the job's state and clears its lease, only while the lease holds.
async fn end_run(
    connection: &mut SqliteConnection,
    token: &LeaseToken,
    now: Micros,
    ending: &Ending,
) -> Result<Job> {
    let row = sqlx::query(
        "UPDATE jobs SET state = ?4, attempt = attempt + ?5, run_at = ?6, run_at_rule = ?7, \
           last_error_code = coalesce(?8, last_error_code), last_error_message = coalesce(?9, last_error_message), \
           lease_id = NULL, lease_owner = NULL, lease_expires_at = NULL, heartbeat_at = NULL, deadline_at = NULL, \
           stage = NULL, stage_at = NULL, \
           changed_by = ?10, change_cause = ?11, changed_at = ?1, change_seq = change_seq + 1 \
         WHERE id = ?2 AND lease_id = ?3 AND state = 'running' AND lease_expires_at > ?1 \
         RETURNING *",
    )
    .bind(now)
    .bind(token.job_id.to_string())
    .bind(&token.lease_id)
    .bind(ending.state.as_str())
    .bind(ending.attempt_delta)
    .bind(ending.run_at)
    .bind(&ending.rule)
    .bind(ending.error.as_ref().map(|(code, _)| code.as_str()))
    .bind(ending.error.as_ref().map(|(_, message)| message.as_str()))
    .bind(&token.owner)
    .bind(&ending.cause)
    .fetch_optional(&mut *connection)
    .await?;
    match row {
        Some(row) => job_from_row(&row),
        None => Err(lease_lost(connection, token, now).await),
    }
}

/// Completes many runs in one statement (the writer batches the completions of a group).
/// Each result is the completed job, or `lease_lost` for a token that no longer holds its job.
pub(crate) async fn complete_many(
    connection: &mut SqliteConnection,
    tokens: &[LeaseToken],
    now: Micros,
) -> Vec<Result<Job>> {
    let leases: Vec<serde_json::Value> = tokens
        .iter()
        .map(|token| serde_json::json!({ "id": token.job_id.to_string(), "lease": token.lease_id }))
        .collect();
    let leases = serde_json::Value::from(leases).to_string();
    let rows = sqlx::query(
        "UPDATE jobs SET state = 'completed', run_at = ?1, run_at_rule = 'completed', \
           lease_id = NULL, lease_owner = NULL, lease_expires_at = NULL, heartbeat_at = NULL, deadline_at = NULL, \
           stage = NULL, stage_at = NULL, \
           changed_by = lease_owner, change_cause = 'completed', changed_at = ?1, change_seq = change_seq + 1 \
         WHERE state = 'running' AND lease_expires_at > ?1 \
           AND (id, lease_id) IN (SELECT value ->> 'id', value ->> 'lease' FROM json_each(?2)) \
         RETURNING *",
    )
    .bind(now)
    .bind(&leases)
    .fetch_all(&mut *connection)
    .await;
    let mut completed = std::collections::HashMap::new();
    match rows {
        Ok(rows) => {
            for row in rows {
                match job_from_row(&row) {
                    Ok(job) => {
                        completed.insert(job.id, job);
                    }
                    Err(error) => return tokens.iter().map(|_| Err(error.replicate())).collect(),
                }
            }
        }
        Err(error) => {
            let error = LedgerError::from(error);
            return tokens.iter().map(|_| Err(error.replicate())).collect();
        }
    }
    let mut results = Vec::with_capacity(tokens.len());
    for token in tokens {
        results.push(match completed.remove(&token.job_id) {
            Some(job) => Ok(job),
            None => Err(lease_lost(connection, token, now).await),
        });
    }
    results
}

async fn release(
    connection: &mut SqliteConnection,
    token: &LeaseToken,
    now: Micros,
) -> Result<Job> {
    let job = load(connection, token.job_id).await?;
    let ending = runs::release_ending(&job, &token.owner, now);
    end_run(connection, token, now, &ending).await
}

async fn fail(
    connection: &mut SqliteConnection,
    token: &LeaseToken,
    failure: &Failure,
    now: Micros,
    policies: &JobPolicies,
    unit: f64,
) -> Result<Job> {
    let job = load(connection, token.job_id).await?;
    let ending = runs::failure_ending(&job, failure, now, policies.of(job.kind), unit);
    end_run(connection, token, now, &ending).await
}

async fn cancel(
    connection: &mut SqliteConnection,
    job_id: Uuid,
    actor: &str,
    reason: &str,
    now: Micros,
) -> Result<Job> {
    let job = load(connection, job_id).await?;
    let cause = format!("cancelled: {reason}");
    let sql = match runs::cancel_step(&job)? {
        runs::CancelStep::Cancel => {
            "UPDATE jobs SET state = 'cancelled', changed_by = ?2, change_cause = ?3, changed_at = ?1, \
             change_seq = change_seq + 1 WHERE id = ?4 RETURNING *"
        }
        runs::CancelStep::RequestStop => {
            "UPDATE jobs SET cancel_requested = 1, changed_by = ?2, change_cause = 'cancel requested: ' || ?5, \
             changed_at = ?1, change_seq = change_seq + 1 WHERE id = ?4 RETURNING *"
        }
        runs::CancelStep::AlreadyRequested => return Ok(job),
    };
    let row = sqlx::query(sql)
        .bind(now)
        .bind(actor)
        .bind(&cause)
        .bind(job_id.to_string())
        .bind(reason)
        .fetch_one(&mut *connection)
        .await?;
    job_from_row(&row)
}

async fn requeue(
    connection: &mut SqliteConnection,
    job_id: Uuid,
    actor: &str,
    reason: &str,
    now: Micros,
) -> Result<Job> {
    let job = load(connection, job_id).await?;
    let is_current: bool = sqlx::query_scalar(
        "SELECT CASE WHEN ?3 IS NULL AND ?4 IS NULL THEN EXISTS (SELECT 1 FROM sources \
             WHERE dataset = ?1 AND source_key = ?2) \
           WHEN ?4 IS NULL THEN EXISTS (SELECT 1 FROM sources \
             WHERE dataset = ?1 AND source_key = ?2 AND head_revision_id = ?3) \
           ELSE EXISTS (SELECT 1 FROM connectors WHERE id = ?4 AND state = 'active') \
             AND NOT EXISTS (SELECT 1 FROM jobs WHERE connector_id = ?4 \
               AND state IN ('pending', 'running', 'retry_wait')) END",
    )
    .bind(&job.dataset)
    .bind(&job.source_key)
    .bind(job.revision_id.map(|id| id.to_string()))
    .bind(job.connector_id.map(|id| id.to_string()))
    .fetch_one(&mut *connection)
    .await?;
    runs::check_requeue(&job, is_current)?;
    let row = sqlx::query(
        "UPDATE jobs SET state = 'pending', attempt = 0, crashes = 0, cancel_requested = 0, run_at = ?1, \
           run_at_rule = 'requeued by ' || ?2, changed_by = ?2, change_cause = 'requeued: ' || ?3, \
           changed_at = ?1, change_seq = change_seq + 1 WHERE id = ?4 RETURNING *",
    )
    .bind(now)
    .bind(actor)
    .bind(reason)
    .bind(job_id.to_string())
    .fetch_one(&mut *connection)
    .await?;
    job_from_row(&row)
}

async fn pause(
    connection: &mut SqliteConnection,
    dataset: Option<&str>,
    actor: &str,
    reason: &str,
    now: Micros,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO claim_pauses (dataset, reason, actor, created_at, changed_by, change_cause, changed_at) \
         VALUES (?1, ?2, ?3, ?4, ?3, ?2, ?4) ON CONFLICT (dataset) DO NOTHING",
    )
    .bind(dataset.unwrap_or("*"))
    .bind(reason)
    .bind(actor)
    .bind(now)
    .execute(&mut *connection)
    .await?;
    Ok(())
}

async fn resume(
    connection: &mut SqliteConnection,
    dataset: Option<&str>,
    actor: &str,
    reason: &str,
    now: Micros,
) -> Result<()> {
    let dataset = dataset.unwrap_or("*");
    sqlx::query("UPDATE claim_pauses SET changed_by = ?2, change_cause = ?3, changed_at = ?4 WHERE dataset = ?1")
        .bind(dataset)
        .bind(actor)
        .bind(reason)
        .bind(now)
        .execute(&mut *connection)
        .await?;
    sqlx::query("DELETE FROM claim_pauses WHERE dataset = ?")
        .bind(dataset)
        .execute(&mut *connection)
        .await?;
    Ok(())
}

/// The job, while `token`'s lease holds it at `now`; `lease_lost` otherwise.
pub(super) async fn fence(
    connection: &mut SqliteConnection,
    token: &LeaseToken,
    now: Micros,
) -> Result<Job> {
    let row = sqlx::query(
        "SELECT * FROM jobs WHERE id = ?1 AND lease_id = ?2 AND state = 'running' \
         AND lease_expires_at > ?3 AND deadline_at > ?3",
    )
    .bind(token.job_id.to_string())
    .bind(&token.lease_id)
    .bind(now)
    .fetch_optional(&mut *connection)
    .await?;
    match row {
        Some(row) => job_from_row(&row),
        None => Err(lease_lost(connection, token, now).await),
    }
}
