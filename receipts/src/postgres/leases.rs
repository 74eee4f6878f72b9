//! Job leases on PostgreSQL: claim, heartbeat, complete, fail, release, cancel, requeue,
//! pause, resume. Each operation is one transaction, and the same lease invariants hold as
//! on SQLite (see `sqlite::leases`): a random fencing token per claim, every fenced write
//! checks token and expiry in the statement that writes, heartbeats stop at the run's
//! deadline, expired leases are rescued (`lease_expired`) before every claim, and how a run
//! ends is decided once for both engines ([`crate::runs`]).
//!
//! A claim is one `UPDATE` whose candidates are locked `FOR UPDATE SKIP LOCKED`: concurrent
//! workers in any number of processes take disjoint jobs without waiting on each other.

use async_trait::async_trait;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::{job_from_row, PostgresLedger};
use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::ledger::Leases;
use crate::model::{Failure, Heartbeat, Job, JobState, LeaseToken};
use crate::runs::{self, Ending};
use crate::validate;

/// The job policies (`$policies`, JSON) as a relation named `policy`.
const POLICY: &str = "jsonb_to_recordset(CAST($__ AS jsonb)) AS policy(kind text, \
    max_attempts bigint, lease_micros bigint, max_run_micros bigint, \
    quarantine_after_crashes bigint)";

fn policy_at(parameter: usize) -> String {
    POLICY.replace("$__", &format!("${parameter}"))
}

/// Why a fenced write found no row.
pub(crate) async fn lease_lost(
    connection: &mut PgConnection,
    token: &LeaseToken,
    now: Micros,
) -> LedgerError {
    match load(connection, token.job_id).await {
        Ok(job) => runs::lease_lost(&job, token, now),
        Err(error) => error,
    }
}

async fn load(connection: &mut PgConnection, job_id: Uuid) -> Result<Job> {
    let row = sqlx::query("SELECT * FROM jobs WHERE id = $1")
        .bind(job_id)
        .fetch_optional(&mut *connection)
        .await?;
    match row {
        Some(row) => job_from_row(&row),
        None => Err(LedgerError::JobNotFound(job_id)),
    }
}

impl PostgresLedger {
    async fn beat(&self, token: &LeaseToken, stage: Option<&str>) -> Result<Heartbeat> {
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        let row = sqlx::query(&format!(
            "UPDATE jobs SET lease_expires_at = least($1 + policy.lease_micros, deadline_at), \
               heartbeat_at = $1, stage = coalesce($4, stage), \
               stage_at = CASE WHEN $4::text IS NULL THEN stage_at ELSE $1 END \
             FROM {policy} \
             WHERE policy.kind = jobs.kind AND id = $2 AND lease_id = $3 AND state = 'running' \
               AND lease_expires_at > $1 AND deadline_at > $1 \
             RETURNING lease_expires_at, cancel_requested",
            policy = policy_at(5),
        ))
        .bind(now)
        .bind(token.job_id)
        .bind(&token.lease_id)
        .bind(stage)
        .bind(&*self.policies_json)
        .fetch_optional(&mut *tx)
        .await?;
        let answer = match row {
            Some(row) => Heartbeat {
                lease_expires_at: row.try_get("lease_expires_at")?,
                cancel_requested: row.try_get("cancel_requested")?,
            },
            None => return Err(lease_lost(&mut tx, token, now).await),
        };
        tx.commit().await?;
        Ok(answer)
    }

    /// Ends a run: sets the job's state and clears its lease, only while the lease holds.
    async fn end_run(
        &self,
        tx: &mut PgConnection,
        token: &LeaseToken,
        now: Micros,
        ending: &Ending,
    ) -> Result<Job> {
        let row = sqlx::query(
            "UPDATE jobs SET state = $4, attempt = attempt + $5, run_at = $6, run_at_rule = $7, \
               last_error_code = coalesce($8, last_error_code), \
               last_error_message = coalesce($9, last_error_message), \
               lease_id = NULL, lease_owner = NULL, lease_expires_at = NULL, heartbeat_at = NULL, \
               deadline_at = NULL, stage = NULL, stage_at = NULL, \
               changed_by = $10, change_cause = $11, changed_at = $1, change_seq = change_seq + 1 \
             WHERE id = $2 AND lease_id = $3 AND state = 'running' AND lease_expires_at > $1 \
             RETURNING *",
        )
        .bind(now)
        .bind(token.job_id)
        .bind(&token.lease_id)
        .bind(ending.state.as_str())
        .bind(ending.attempt_delta)
        .bind(ending.run_at)
        .bind(&ending.rule)
        .bind(ending.error.as_ref().map(|(code, _)| code.as_str()))
        .bind(ending.error.as_ref().map(|(_, message)| message.as_str()))
        .bind(&token.owner)
        .bind(&ending.cause)
        .fetch_optional(&mut *tx)
        .await?;
        match row {
            Some(row) => job_from_row(&row),
            None => Err(lease_lost(tx, token, now).await),
        }
    }

    /// Runs `ending` for the lease's job in its own transaction; a job that went back to
    /// `pending` wakes the workers of every process.
    async fn finish(
        &self,
        token: &LeaseToken,
        ending: impl FnOnce(&Job, Micros) -> Ending,
    ) -> Result<Job> {
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        let job = load(&mut tx, token.job_id).await?;
        let ending = ending(&job, now);
        let job = self.end_run(&mut tx, token, now, &ending).await?;
        self.commit_job(tx, job).await
    }

    /// Commits an operation on one job, sending a wake-up when the job became claimable.
    async fn commit_job(
        &self,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
        job: Job,
    ) -> Result<Job> {
        let wakes = job.state == JobState::Pending;
        if wakes {
            sqlx::query("SELECT pg_notify($1, '')")
                .bind(super::WORK_CHANNEL)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        if wakes {
            self.work_signal.notify_waiters();
        }
        Ok(job)
    }
}

#[async_trait]
impl Leases for PostgresLedger {
    async fn claim(&self, owner: &str, limit: u32) -> Result<Vec<Job>> {
        if owner.trim().is_empty() || owner.len() > 256 || owner.chars().any(char::is_control) {
            return Err(LedgerError::invalid(
                "invalid_owner",
                "a worker id is 1-256 printable characters",
            ));
        }
        // One call, its own transaction: the rescue, then the claim (`cairn_claim` in the
        // migration holds both statements).
        let rows = sqlx::query("SELECT * FROM cairn_claim($1, $2, $3, $4::jsonb)")
            .bind(self.injected_now())
            .bind(owner)
            .bind(i64::from(limit.clamp(1, 10_000)))
            .bind(&*self.policies_json)
            .fetch_all(&self.pool)
            .await?;
        let mut jobs = rows.iter().map(job_from_row).collect::<Result<Vec<_>>>()?;
        jobs.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.run_at.cmp(&b.run_at)));
        Ok(jobs)
    }

    async fn heartbeat(&self, lease: &LeaseToken) -> Result<Heartbeat> {
        self.beat(lease, None).await
    }

    async fn progress(&self, lease: &LeaseToken, stage: &str) -> Result<Heartbeat> {
        validate::stage(stage)?;
        self.beat(lease, Some(stage)).await
    }

    async fn complete(&self, lease: &LeaseToken) -> Result<Job> {
        let Some(sender) = &self.completions else {
            return complete_many(&self.pool, self, std::slice::from_ref(lease))
                .await
                .pop()
                .unwrap_or_else(|| Err(LedgerError::Internal("no completion result".into())));
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        sender
            .send((lease.clone(), reply))
            .await
            .map_err(|_| LedgerError::Unavailable("the ledger's completer stopped".into()))?;
        answer.await.map_err(|_| {
            LedgerError::Unavailable("the ledger's completer stopped mid-write".into())
        })?
    }

    async fn fail(&self, lease: &LeaseToken, failure: Failure) -> Result<Job> {
        let policies = self.options.job_policies;
        let unit: f64 = rand::random();
        self.finish(lease, |job, now| {
            runs::failure_ending(job, &failure, now, policies.of(job.kind), unit)
        })
        .await
    }

    async fn release(&self, lease: &LeaseToken) -> Result<Job> {
        self.finish(lease, |job, now| {
            runs::release_ending(job, &lease.owner, now)
        })
        .await
    }

    async fn cancel(&self, job_id: Uuid, actor: &str, reason: &str) -> Result<Job> {
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        let job = load(&mut tx, job_id).await?;
        let cause = format!("cancelled: {reason}");
        let sql = match runs::cancel_step(&job)? {
            runs::CancelStep::Cancel => {
                "UPDATE jobs SET state = 'cancelled', changed_by = $2, change_cause = $3, \
                 changed_at = $1, change_seq = change_seq + 1 \
                 WHERE id = $4 AND state IN ('pending', 'retry_wait') RETURNING *"
            }
            runs::CancelStep::RequestStop => {
                "UPDATE jobs SET cancel_requested = true, changed_by = $2, \
                 change_cause = 'cancel requested: ' || $5, changed_at = $1, \
                 change_seq = change_seq + 1 WHERE id = $4 AND state = 'running' RETURNING *"
            }
            runs::CancelStep::AlreadyRequested => return Ok(job),
        };
        let row = sqlx::query(sql)
            .bind(now)
            .bind(actor)
            .bind(&cause)
            .bind(job_id)
            .bind(reason)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else {
            // The job moved on between the read and the write (another process claimed or
            // ended it): report its state now.
            let job = load(&mut tx, job_id).await?;
            return Err(LedgerError::InvalidTransition {
                job_id,
                state: job.state.to_string(),
                action: "cancel",
            });
        };
        let job = job_from_row(&row)?;
        tx.commit().await?;
        Ok(job)
    }

    async fn requeue(&self, job_id: Uuid, actor: &str, reason: &str) -> Result<Job> {
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        let job = load(&mut tx, job_id).await?;
        let is_current: bool = sqlx::query_scalar(
            "SELECT CASE WHEN $3::uuid IS NULL AND $4::uuid IS NULL THEN EXISTS (SELECT 1 \
                 FROM sources WHERE dataset = $1 AND source_key = $2) \
               WHEN $4::uuid IS NULL THEN EXISTS (SELECT 1 FROM sources \
                 WHERE dataset = $1 AND source_key = $2 AND head_revision_id = $3) \
               ELSE EXISTS (SELECT 1 FROM connectors WHERE id = $4 AND state = 'active') \
                 AND NOT EXISTS (SELECT 1 FROM jobs WHERE connector_id = $4 \
                   AND state IN ('pending', 'running', 'retry_wait')) END",
        )
        .bind(&job.dataset)
        .bind(&job.source_key)
        .bind(job.revision_id)
        .bind(job.connector_id)
        .fetch_one(&mut *tx)
        .await?;
        runs::check_requeue(&job, is_current)?;
        let row = sqlx::query(
            "UPDATE jobs SET state = 'pending', attempt = 0, crashes = 0, cancel_requested = false, \
               run_at = $1, run_at_rule = 'requeued by ' || $2, changed_by = $2, \
               change_cause = 'requeued: ' || $3, changed_at = $1, change_seq = change_seq + 1 \
             WHERE id = $4 AND state IN ('dead', 'cancelled', 'quarantined') RETURNING *",
        )
        .bind(now)
        .bind(actor)
        .bind(reason)
        .bind(job_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            let job = load(&mut tx, job_id).await?;
            return Err(LedgerError::InvalidTransition {
                job_id,
                state: job.state.to_string(),
                action: "requeue",
            });
        };
        let job = job_from_row(&row)?;
        self.commit_job(tx, job).await
    }

    async fn pause(&self, dataset: Option<&str>, actor: &str, reason: &str) -> Result<()> {
        if let Some(dataset) = dataset {
            validate::dataset(dataset)?;
        }
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        sqlx::query(
            "INSERT INTO claim_pauses (dataset, reason, actor, created_at, changed_by, \
               change_cause, changed_at) VALUES ($1, $2, $3, $4, $3, $2, $4) \
             ON CONFLICT (dataset) DO NOTHING",
        )
        .bind(dataset.unwrap_or("*"))
        .bind(reason)
        .bind(actor)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn resume(&self, dataset: Option<&str>, actor: &str, reason: &str) -> Result<()> {
        let dataset = dataset.unwrap_or("*");
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        sqlx::query(
            "UPDATE claim_pauses SET changed_by = $2, change_cause = $3, changed_at = $4 \
             WHERE dataset = $1",
        )
        .bind(dataset)
        .bind(actor)
        .bind(reason)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let lifted = sqlx::query("DELETE FROM claim_pauses WHERE dataset = $1")
            .bind(dataset)
            .execute(&mut *tx)
            .await?;
        if lifted.rows_affected() > 0 {
            sqlx::query("SELECT pg_notify($1, '')")
                .bind(super::WORK_CHANNEL)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    fn work_signal(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        Some(self.work_signal.clone())
    }

    async fn job(&self, id: Uuid) -> Result<Option<Job>> {
        sqlx::query("SELECT * FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(job_from_row)
            .transpose()
    }
}

/// A completion waiting for its group, and where its answer goes.
pub(super) type CompleteRequest = (LeaseToken, tokio::sync::oneshot::Sender<Result<Job>>);

/// The completer: takes every completion queued in this process (up to 1,000) and commits
/// them in one transaction, one fenced `UPDATE` for all (group commit: a worker running many
/// jobs at once pays one commit per group, not per job). Stops when every sender is gone.
pub(super) async fn complete_queued(
    ledger: PostgresLedger,
    mut receiver: tokio::sync::mpsc::Receiver<CompleteRequest>,
) {
    while let Some(first) = receiver.recv().await {
        let mut group = vec![first];
        while group.len() < 1000 {
            match receiver.try_recv() {
                Ok(request) => group.push(request),
                Err(_) => break,
            }
        }
        let (tokens, replies): (Vec<LeaseToken>, Vec<_>) = group.into_iter().unzip();
        let results = complete_many(&ledger.pool, &ledger, &tokens).await;
        for (result, reply) in results.into_iter().zip(replies) {
            let _ = reply.send(result);
        }
    }
}

/// Completes many runs in one transaction and one statement; each result is the completed
/// job, or `lease_lost` for a token that no longer holds its job at the time of the write.
async fn complete_many(
    pool: &sqlx::PgPool,
    ledger: &PostgresLedger,
    tokens: &[LeaseToken],
) -> Vec<Result<Job>> {
    let outcome: Result<Vec<Result<Job>>> = async {
        // One statement in its own transaction: every completion of the group, fenced at
        // the time of the write.
        let ids: Vec<Uuid> = tokens.iter().map(|token| token.job_id).collect();
        let leases: Vec<&str> = tokens.iter().map(|token| token.lease_id.as_str()).collect();
        let rows = sqlx::query(
            "WITH clock AS (SELECT coalesce($1, cairn_db_now()) AS now) \
             UPDATE jobs SET state = 'completed', run_at = clock.now, run_at_rule = 'completed', \
               lease_id = NULL, lease_owner = NULL, lease_expires_at = NULL, heartbeat_at = NULL, \
               deadline_at = NULL, stage = NULL, stage_at = NULL, \
               changed_by = jobs.lease_owner, change_cause = 'completed', changed_at = clock.now, \
               change_seq = jobs.change_seq + 1 \
             FROM clock, unnest($2::uuid[], $3::text[]) AS held(id, lease) \
             WHERE jobs.id = held.id AND jobs.lease_id = held.lease \
               AND jobs.state = 'running' AND jobs.lease_expires_at > clock.now \
             RETURNING jobs.*",
        )
        .bind(ledger.injected_now())
        .bind(&ids)
        .bind(&leases)
        .fetch_all(pool)
        .await?;
        let mut completed = std::collections::HashMap::new();
        for row in &rows {
            let job = job_from_row(row)?;
            completed.insert(job.id, job);
        }
        let mut results = Vec::with_capacity(tokens.len());
        for token in tokens {
            results.push(match completed.remove(&token.job_id) {
                Some(job) => Ok(job),
                None => {
                    // Why it was fenced out, read after the write.
                    let now = ledger.read_now().await?;
                    let mut connection = pool.acquire().await?;
                    Err(lease_lost(&mut connection, token, now).await)
                }
            });
        }
        Ok(results)
    }
    .await;
    match outcome {
        Ok(results) => results,
        Err(error) => tokens.iter().map(|_| Err(error.replicate())).collect(),
    }
}
