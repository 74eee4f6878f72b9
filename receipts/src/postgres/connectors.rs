//! Connectors on PostgreSQL: changes through [`crate::connectors::plan`] in one transaction
//! (the connector's row locked), a run's fenced progress, and the reads. Scheduling runs inside
//! every claim (`cairn_schedule_runs`, migration 14).

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::leases::lease_lost;
use super::{job_from_row, parse_enum, PostgresLedger, WORK_CHANNEL};
use crate::clock::Micros;
use crate::connectors::{self, QueuedRun, RunStep};
use crate::error::{LedgerError, Result};
use crate::ids;
use crate::ledger::Connectors;
use crate::model::{
    Connector, ConnectorChange, ConnectorChanged, ConnectorCommand, ConnectorFile, Job, JobKind,
    LeaseToken, SyncProgress, SyncReport, SyncRun,
};

fn connector_from_row(row: &PgRow) -> Result<Connector> {
    let globs = |column: &str| -> Result<Vec<String>> {
        serde_json::from_value(row.try_get::<serde_json::Value, _>(column)?)
            .map_err(|error| LedgerError::Corrupt(format!("connector {column}: {error}")))
    };
    Ok(Connector {
        id: row.try_get("id")?,
        dataset: row.try_get("dataset")?,
        kind: parse_enum(&row.try_get::<String, _>("kind")?)?,
        location: row.try_get("location")?,
        git_ref: row.try_get("git_ref")?,
        include: globs("include")?,
        exclude: globs("exclude")?,
        max_file_bytes: row.try_get("max_file_bytes")?,
        interval_ms: row.try_get("interval_ms")?,
        access: serde_json::from_value(row.try_get::<serde_json::Value, _>("access")?)
            .map_err(|error| LedgerError::Corrupt(format!("connector access: {error}")))?,
        credentials: row.try_get("credentials")?,
        state: parse_enum(&row.try_get::<String, _>("state")?)?,
        removal: row
            .try_get::<Option<String>, _>("removal")?
            .as_deref()
            .map(parse_enum)
            .transpose()?,
        created_by: row.try_get("created_by")?,
        reason: row.try_get("reason")?,
        created_at: row.try_get("created_at")?,
        changed_by: row.try_get("changed_by")?,
        change_cause: row.try_get("change_cause")?,
        changed_at: row.try_get("changed_at")?,
    })
}

async fn load(connection: &mut PgConnection, id: Uuid, lock: bool) -> Result<Connector> {
    let sql = if lock {
        "SELECT * FROM connectors WHERE id = $1 FOR UPDATE"
    } else {
        "SELECT * FROM connectors WHERE id = $1"
    };
    sqlx::query(sql)
        .bind(id)
        .fetch_optional(&mut *connection)
        .await?
        .as_ref()
        .map(connector_from_row)
        .transpose()?
        .ok_or_else(|| {
            LedgerError::invalid("connector_not_found", format!("connector {id} not found"))
        })
}

async fn open_run(connection: &mut PgConnection, id: Uuid) -> Result<Option<Job>> {
    sqlx::query(
        "SELECT * FROM jobs WHERE connector_id = $1 AND state IN ('pending', 'running', 'retry_wait')",
    )
    .bind(id)
    .fetch_optional(&mut *connection)
    .await?
    .as_ref()
    .map(job_from_row)
    .transpose()
}

async fn queue(
    connection: &mut PgConnection,
    connector: &Connector,
    queued: &QueuedRun<'_>,
    now: Micros,
) -> Result<()> {
    sqlx::query(&format!(
        "WITH queued AS ( \
           INSERT INTO jobs (id, revision_id, connector_id, dataset, source_key, kind, state, \
             priority, max_attempts, run_at, run_at_rule, created_at, changed_by, change_cause, \
             changed_at) \
           VALUES ($1, NULL, $2, $3, '', 'sync', 'pending', $9, $4, $5, $6, $5, $7, $8, $5) \
           RETURNING id) \
         SELECT pg_notify('{WORK_CHANNEL}', '') FROM queued"
    ))
    .bind(ids::new_v7())
    .bind(connector.id)
    .bind(&connector.dataset)
    .bind(queued.max_attempts)
    .bind(now)
    .bind(queued.rule)
    .bind(queued.actor)
    .bind(queued.cause)
    .bind(connectors::SYNC_PRIORITY)
    .execute(&mut *connection)
    .await?;
    Ok(())
}

impl PostgresLedger {
    async fn change_connector_in_tx(&self, command: ConnectorCommand) -> Result<ConnectorChanged> {
        let ConnectorCommand {
            change,
            actor,
            reason,
        } = command;
        let max_attempts = self.options.job_policies.of(JobKind::Sync).max_attempts;
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        if let ConnectorChange::Create(new) = &change {
            connectors::validate(new)?;
            let id = ids::new_v7();
            sqlx::query(
                "INSERT INTO connectors (id, dataset, kind, location, git_ref, include, exclude, \
                   max_file_bytes, interval_ms, state, created_by, reason, created_at, \
                   changed_by, change_cause, changed_at, access, credentials) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'active', $10, $11, $12, $10, \
                   'created: ' || $11, $12, $13, $14)",
            )
            .bind(id)
            .bind(&new.dataset)
            .bind(new.kind.as_str())
            .bind(&new.location)
            .bind(&new.git_ref)
            .bind(serde_json::json!(new.include))
            .bind(serde_json::json!(new.exclude))
            .bind(new.max_file_bytes)
            .bind(new.interval_ms)
            .bind(&actor)
            .bind(&reason)
            .bind(now)
            .bind(serde_json::json!(new.access))
            .bind(&new.credentials)
            .execute(&mut *tx)
            .await?;
            let connector = load(&mut tx, id, false).await?;
            let queued = QueuedRun {
                rule: "first run",
                actor: &actor,
                cause: "created",
                max_attempts,
            };
            queue(&mut tx, &connector, &queued, now).await?;
            let run = open_run(&mut tx, id).await?;
            tx.commit().await?;
            return Ok(ConnectorChanged {
                connector,
                run,
                cancelled_runs: 0,
            });
        }
        let id = connectors::target(&change)
            .ok_or_else(|| LedgerError::Internal("a change names no connector".into()))?;
        let connector = load(&mut tx, id, true).await?;
        let open = open_run(&mut tx, id).await?;
        let plan = connectors::plan(&connector, open.as_ref(), &change)?;
        let cause = format!("{}: {reason}", plan.cause);
        if let Some(delivery) = connectors::delivery(&change)? {
            sqlx::query(
                "DELETE FROM connector_deliveries WHERE connector_id = $1 AND received_at < $2",
            )
            .bind(id)
            .bind(now - connectors::DELIVERY_RETENTION_MICROS)
            .execute(&mut *tx)
            .await?;
            let recorded = sqlx::query(
                "INSERT INTO connector_deliveries (connector_id, delivery_id, received_at, actor, \
                   cause) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            )
            .bind(id)
            .bind(delivery)
            .bind(now)
            .bind(&actor)
            .bind(&cause)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if recorded == 0 {
                return Err(connectors::duplicate_delivery(delivery));
            }
        }
        if let Some((state, removal)) = plan.state {
            sqlx::query(
                "UPDATE connectors SET state = $2, removal = $3, changed_by = $4, \
                   change_cause = $5, changed_at = $6, change_seq = change_seq + 1 WHERE id = $1",
            )
            .bind(id)
            .bind(state.as_str())
            .bind(removal.map(|removal| removal.as_str()))
            .bind(&actor)
            .bind(&cause)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        let connector = load(&mut tx, id, false).await?;
        let rule = format!("{} by {actor}", plan.cause);
        let mut cancelled_runs = 0;
        match plan.run {
            RunStep::Keep => {}
            RunStep::Queue => {
                let queued = QueuedRun {
                    rule: &rule,
                    actor: &actor,
                    cause: &cause,
                    max_attempts,
                };
                queue(&mut tx, &connector, &queued, now).await?;
            }
            RunStep::MakeDue => {
                sqlx::query(&format!(
                    "WITH due AS ( \
                       UPDATE jobs SET run_at = $2, run_at_rule = $3, changed_by = $4, \
                         change_cause = $5, changed_at = GREATEST($2, changed_at), \
                         change_seq = change_seq + 1 \
                       WHERE connector_id = $1 AND state IN ('pending', 'retry_wait') RETURNING id) \
                     SELECT pg_notify('{WORK_CHANNEL}', '') FROM due"
                ))
                .bind(id)
                .bind(now)
                .bind(&rule)
                .bind(&actor)
                .bind(&cause)
                .execute(&mut *tx)
                .await?;
            }
            RunStep::Stop => {
                cancelled_runs = sqlx::query(
                    "UPDATE jobs SET state = 'cancelled', changed_by = $2, change_cause = $3, \
                       changed_at = GREATEST($4, changed_at), change_seq = change_seq + 1 \
                     WHERE connector_id = $1 AND state IN ('pending', 'retry_wait')",
                )
                .bind(id)
                .bind(&actor)
                .bind(format!("cancelled: connector {cause}"))
                .bind(now)
                .execute(&mut *tx)
                .await?
                .rows_affected() as i64;
                sqlx::query(
                    "UPDATE jobs SET cancel_requested = true, changed_by = $2, change_cause = $3, \
                       changed_at = GREATEST($4, changed_at), change_seq = change_seq + 1 \
                     WHERE connector_id = $1 AND state = 'running' AND NOT cancel_requested",
                )
                .bind(id)
                .bind(&actor)
                .bind(format!("cancel requested: connector {cause}"))
                .bind(now)
                .execute(&mut *tx)
                .await?;
            }
        }
        let run = open_run(&mut tx, id).await?;
        tx.commit().await?;
        Ok(ConnectorChanged {
            connector,
            run,
            cancelled_runs,
        })
    }

    async fn record_sync_in_tx(&self, token: &LeaseToken, progress: SyncProgress) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        // The job's row stays locked to the end: a rescue or a cancel waits for this progress.
        let connector: Option<Uuid> = sqlx::query_scalar(
            "SELECT connector_id FROM jobs WHERE id = $1 AND state = 'running' AND lease_id = $2 \
               AND lease_expires_at > $3 AND kind = 'sync' FOR UPDATE",
        )
        .bind(token.job_id)
        .bind(&token.lease_id)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?
        .flatten();
        let Some(connector) = connector else {
            return Err(lease_lost(&mut tx, token, now).await);
        };
        if !progress.files.is_empty() {
            let keys: Vec<&str> = progress
                .files
                .iter()
                .map(|f| f.source_key.as_str())
                .collect();
            let prints: Vec<&str> = progress
                .files
                .iter()
                .map(|f| f.fingerprint.as_str())
                .collect();
            let hashes: Vec<&str> = progress.files.iter().map(|f| f.sha256.as_str()).collect();
            sqlx::query(
                "INSERT INTO connector_files (connector_id, source_key, fingerprint, sha256) \
                 SELECT $1, f.key, f.print, f.sha256 \
                 FROM unnest($2::text[], $3::text[], $4::text[]) AS f(key, print, sha256) \
                 ON CONFLICT (connector_id, source_key) DO UPDATE SET \
                   fingerprint = excluded.fingerprint, sha256 = excluded.sha256",
            )
            .bind(connector)
            .bind(&keys)
            .bind(&prints)
            .bind(&hashes)
            .execute(&mut *tx)
            .await?;
        }
        if !progress.forgotten.is_empty() {
            sqlx::query(
                "DELETE FROM connector_files WHERE connector_id = $1 AND source_key = ANY($2)",
            )
            .bind(connector)
            .bind(&progress.forgotten)
            .execute(&mut *tx)
            .await?;
        }
        let report = serde_json::to_value(&progress.report)
            .map_err(|error| LedgerError::Internal(format!("sync report: {error}")))?;
        sqlx::query(
            "INSERT INTO sync_reports (job_id, connector_id, report, updated_at) \
             VALUES ($1, $2, $3, $4) \
             ON CONFLICT (job_id) DO UPDATE SET report = excluded.report, \
               updated_at = excluded.updated_at",
        )
        .bind(token.job_id)
        .bind(connector)
        .bind(report)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

#[async_trait]
impl Connectors for PostgresLedger {
    async fn change_connector(&self, command: ConnectorCommand) -> Result<ConnectorChanged> {
        self.change_connector_in_tx(command).await
    }

    async fn connector(&self, id: Uuid) -> Result<Option<Connector>> {
        sqlx::query("SELECT * FROM connectors WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(connector_from_row)
            .transpose()
    }

    async fn connectors(&self) -> Result<Vec<Connector>> {
        sqlx::query("SELECT * FROM connectors ORDER BY created_at DESC, id DESC")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(connector_from_row)
            .collect()
    }

    async fn connector_files(&self, id: Uuid) -> Result<Vec<ConnectorFile>> {
        let rows = sqlx::query(
            "SELECT source_key, fingerprint, sha256 FROM connector_files \
             WHERE connector_id = $1 ORDER BY source_key COLLATE \"C\"",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ConnectorFile {
                    source_key: row.try_get("source_key")?,
                    fingerprint: row.try_get("fingerprint")?,
                    sha256: row.try_get("sha256")?,
                })
            })
            .collect()
    }

    async fn record_sync(&self, lease: &LeaseToken, progress: SyncProgress) -> Result<()> {
        self.record_sync_in_tx(lease, progress).await
    }

    async fn sync_runs(&self, id: Uuid, limit: u32) -> Result<Vec<SyncRun>> {
        let rows = sqlx::query(
            "SELECT jobs.*, report.report AS sync_report FROM jobs \
             LEFT JOIN sync_reports report ON report.job_id = jobs.id \
             WHERE jobs.connector_id = $1 ORDER BY jobs.created_at DESC, jobs.run_at DESC, jobs.id DESC LIMIT $2",
        )
        .bind(id)
        .bind(i64::from(limit.clamp(1, 100)))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let report: Option<serde_json::Value> = row.try_get("sync_report")?;
                Ok(SyncRun {
                    job: job_from_row(row)?,
                    report: report
                        .map(serde_json::from_value::<SyncReport>)
                        .transpose()
                        .map_err(|error| LedgerError::Corrupt(format!("sync report: {error}")))?,
                })
            })
            .collect()
    }
}
