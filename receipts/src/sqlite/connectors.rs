//! Connectors on SQLite, what the writer executes: changes through
//! [`crate::connectors::plan`], a run's fenced progress, and the scheduling rule run with every
//! claim. The trait's reads are in `ledger.rs`.

use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::Row;
use uuid::Uuid;

use super::leases;
use super::rows::{job_from_row, json_text, parse_enum, parse_uuid};
use crate::clock::Micros;
use crate::connectors::{self, QueuedRun, RunStep};
use crate::error::{LedgerError, Result};
use crate::ids;
use crate::model::{
    Connector, ConnectorChange, ConnectorChanged, ConnectorCommand, Job, JobKind, LeaseToken,
    SyncProgress, SyncReport,
};
use crate::policy::JobPolicies;

/// A connector write, run by the writer.
#[derive(Debug)]
pub(crate) enum ConnectorOp {
    Change(ConnectorCommand),
    Record(LeaseToken, Box<SyncProgress>),
}

/// The writer's answer to a [`ConnectorOp`].
#[derive(Debug)]
pub(crate) enum ConnectorAnswer {
    Changed(Box<ConnectorChanged>),
    Recorded,
}

pub(crate) async fn run(
    connection: &mut SqliteConnection,
    op: ConnectorOp,
    now: Micros,
    policies: &JobPolicies,
) -> Result<ConnectorAnswer> {
    match op {
        ConnectorOp::Change(command) => change(connection, command, now, policies)
            .await
            .map(|changed| ConnectorAnswer::Changed(Box::new(changed))),
        ConnectorOp::Record(token, progress) => record(connection, &token, *progress, now)
            .await
            .map(|()| ConnectorAnswer::Recorded),
    }
}

pub(crate) fn connector_from_row(row: &SqliteRow) -> Result<Connector> {
    let globs = |column: &str| -> Result<Vec<String>> {
        serde_json::from_str(&row.try_get::<String, _>(column)?)
            .map_err(|error| LedgerError::Corrupt(format!("connector {column}: {error}")))
    };
    Ok(Connector {
        id: parse_uuid(&row.try_get::<String, _>("id")?)?,
        dataset: row.try_get("dataset")?,
        kind: parse_enum(&row.try_get::<String, _>("kind")?)?,
        location: row.try_get("location")?,
        git_ref: row.try_get("git_ref")?,
        include: globs("include")?,
        exclude: globs("exclude")?,
        max_file_bytes: row.try_get("max_file_bytes")?,
        interval_ms: row.try_get("interval_ms")?,
        access: serde_json::from_str(&row.try_get::<String, _>("access")?)
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

fn not_found(id: Uuid) -> LedgerError {
    LedgerError::invalid("connector_not_found", format!("connector {id} not found"))
}

const OPEN: &str = "state IN ('pending', 'running', 'retry_wait')";

async fn open_run(connection: &mut SqliteConnection, id: Uuid) -> Result<Option<Job>> {
    sqlx::query(&format!(
        "SELECT * FROM jobs WHERE connector_id = ? AND {OPEN}"
    ))
    .bind(id.to_string())
    .fetch_optional(&mut *connection)
    .await?
    .as_ref()
    .map(job_from_row)
    .transpose()
}

/// Inserts a run of `connector` due at `run_at`.
async fn queue(
    connection: &mut SqliteConnection,
    connector: &Connector,
    run_at: Micros,
    queued: &QueuedRun<'_>,
    now: Micros,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO jobs (id, revision_id, connector_id, dataset, source_key, kind, state, \
           priority, max_attempts, run_at, run_at_rule, created_at, changed_by, change_cause, \
           changed_at) \
         VALUES (?1, NULL, ?2, ?3, '', 'sync', 'pending', ?10, ?4, ?5, ?6, ?7, ?8, ?9, ?7)",
    )
    .bind(ids::new_v7().to_string())
    .bind(connector.id.to_string())
    .bind(&connector.dataset)
    .bind(queued.max_attempts)
    .bind(run_at)
    .bind(queued.rule)
    .bind(now)
    .bind(queued.actor)
    .bind(queued.cause)
    .bind(connectors::SYNC_PRIORITY)
    .execute(&mut *connection)
    .await?;
    Ok(())
}

async fn change(
    connection: &mut SqliteConnection,
    command: ConnectorCommand,
    now: Micros,
    policies: &JobPolicies,
) -> Result<ConnectorChanged> {
    let ConnectorCommand {
        change,
        actor,
        reason,
    } = command;
    let id = match (&change, connectors::target(&change)) {
        (ConnectorChange::Create(new), _) => {
            connectors::validate(new)?;
            let id = ids::new_v7();
            sqlx::query(
                "INSERT INTO connectors (id, dataset, kind, location, git_ref, include, exclude, \
                   max_file_bytes, interval_ms, state, created_by, reason, created_at, \
                   changed_by, change_cause, changed_at, access, credentials) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'active', ?10, ?11, ?12, ?10, \
                   'created: ' || ?11, ?12, ?13, ?14)",
            )
            .bind(id.to_string())
            .bind(&new.dataset)
            .bind(new.kind.as_str())
            .bind(&new.location)
            .bind(&new.git_ref)
            .bind(json_text(&new.include))
            .bind(json_text(&new.exclude))
            .bind(new.max_file_bytes)
            .bind(new.interval_ms)
            .bind(&actor)
            .bind(&reason)
            .bind(now)
            .bind(json_text(&new.access))
            .bind(&new.credentials)
            .execute(&mut *connection)
            .await?;
            let connector = load(connection, id).await?;
            let queued = QueuedRun {
                rule: "first run",
                actor: &actor,
                cause: "created",
                max_attempts: policies.of(JobKind::Sync).max_attempts,
            };
            queue(connection, &connector, now, &queued, now).await?;
            return answer(connection, connector, 0).await;
        }
        (_, Some(id)) => id,
        (_, None) => return Err(LedgerError::Internal("a change names no connector".into())),
    };
    let connector = load(connection, id).await?;
    let open = open_run(connection, id).await?;
    let plan = connectors::plan(&connector, open.as_ref(), &change)?;
    let cause = format!("{}: {reason}", plan.cause);
    if let Some(delivery) = connectors::delivery(&change)? {
        sqlx::query(
            "DELETE FROM connector_deliveries WHERE connector_id = ?1 AND received_at < ?2",
        )
        .bind(id.to_string())
        .bind(now - connectors::DELIVERY_RETENTION_MICROS)
        .execute(&mut *connection)
        .await?;
        let recorded = sqlx::query(
            "INSERT INTO connector_deliveries (connector_id, delivery_id, received_at, actor, \
               cause) VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
        )
        .bind(id.to_string())
        .bind(delivery)
        .bind(now)
        .bind(&actor)
        .bind(&cause)
        .execute(&mut *connection)
        .await?
        .rows_affected();
        if recorded == 0 {
            return Err(connectors::duplicate_delivery(delivery));
        }
    }
    if let Some((state, removal)) = plan.state {
        sqlx::query(
            "UPDATE connectors SET state = ?2, removal = ?3, changed_by = ?4, change_cause = ?5, \
               changed_at = ?6, change_seq = change_seq + 1 WHERE id = ?1",
        )
        .bind(id.to_string())
        .bind(state.as_str())
        .bind(removal.map(|removal| removal.as_str()))
        .bind(&actor)
        .bind(&cause)
        .bind(now)
        .execute(&mut *connection)
        .await?;
    }
    let connector = load(connection, id).await?;
    let mut cancelled = 0;
    match plan.run {
        RunStep::Keep => {}
        RunStep::Queue => {
            let rule = format!("{} by {actor}", plan.cause);
            let queued = QueuedRun {
                rule: &rule,
                actor: &actor,
                cause: &cause,
                max_attempts: policies.of(JobKind::Sync).max_attempts,
            };
            queue(connection, &connector, now, &queued, now).await?
        }
        RunStep::MakeDue => {
            sqlx::query(
                "UPDATE jobs SET run_at = ?2, run_at_rule = ?3, changed_by = ?4, \
                   change_cause = ?5, changed_at = ?2, change_seq = change_seq + 1 \
                 WHERE connector_id = ?1 AND state IN ('pending', 'retry_wait')",
            )
            .bind(id.to_string())
            .bind(now)
            .bind(format!("{} by {actor}", plan.cause))
            .bind(&actor)
            .bind(&cause)
            .execute(&mut *connection)
            .await?;
        }
        RunStep::Stop => {
            cancelled = sqlx::query(
                "UPDATE jobs SET state = 'cancelled', changed_by = ?2, change_cause = ?3, \
                   changed_at = ?4, change_seq = change_seq + 1 \
                 WHERE connector_id = ?1 AND state IN ('pending', 'retry_wait')",
            )
            .bind(id.to_string())
            .bind(&actor)
            .bind(format!("cancelled: connector {cause}"))
            .bind(now)
            .execute(&mut *connection)
            .await?
            .rows_affected() as i64;
            sqlx::query(
                "UPDATE jobs SET cancel_requested = 1, changed_by = ?2, change_cause = ?3, \
                   changed_at = ?4, change_seq = change_seq + 1 \
                 WHERE connector_id = ?1 AND state = 'running' AND cancel_requested = 0",
            )
            .bind(id.to_string())
            .bind(&actor)
            .bind(format!("cancel requested: connector {cause}"))
            .bind(now)
            .execute(&mut *connection)
            .await?;
        }
    }
    answer(connection, connector, cancelled).await
}

async fn load(connection: &mut SqliteConnection, id: Uuid) -> Result<Connector> {
    sqlx::query("SELECT * FROM connectors WHERE id = ?")
        .bind(id.to_string())
        .fetch_optional(&mut *connection)
        .await?
        .as_ref()
        .map(connector_from_row)
        .transpose()?
        .ok_or_else(|| not_found(id))
}

async fn answer(
    connection: &mut SqliteConnection,
    connector: Connector,
    cancelled_runs: i64,
) -> Result<ConnectorChanged> {
    let run = open_run(connection, connector.id).await?;
    Ok(ConnectorChanged {
        connector,
        run,
        cancelled_runs,
    })
}

/// A run's progress, fenced by its lease.
async fn record(
    connection: &mut SqliteConnection,
    token: &LeaseToken,
    progress: SyncProgress,
    now: Micros,
) -> Result<()> {
    let connector: Option<String> = sqlx::query_scalar(
        "SELECT connector_id FROM jobs WHERE id = ?1 AND state = 'running' AND lease_id = ?2 \
           AND lease_expires_at > ?3 AND kind = 'sync'",
    )
    .bind(token.job_id.to_string())
    .bind(&token.lease_id)
    .bind(now)
    .fetch_optional(&mut *connection)
    .await?
    .flatten();
    let Some(connector) = connector else {
        return Err(leases::lease_lost(connection, token, now).await);
    };
    if !progress.files.is_empty() {
        sqlx::query(
            "INSERT INTO connector_files (connector_id, source_key, fingerprint, sha256) \
             SELECT ?1, value ->> 'source_key', value ->> 'fingerprint', value ->> 'sha256' \
             FROM json_each(?2) WHERE TRUE \
             ON CONFLICT (connector_id, source_key) DO UPDATE SET \
               fingerprint = excluded.fingerprint, sha256 = excluded.sha256",
        )
        .bind(&connector)
        .bind(json_text(&progress.files))
        .execute(&mut *connection)
        .await?;
    }
    if !progress.forgotten.is_empty() {
        sqlx::query(
            "DELETE FROM connector_files WHERE connector_id = ?1 \
               AND source_key IN (SELECT value FROM json_each(?2))",
        )
        .bind(&connector)
        .bind(json_text(&progress.forgotten))
        .execute(&mut *connection)
        .await?;
    }
    sqlx::query(
        "INSERT INTO sync_reports (job_id, connector_id, report, updated_at) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (job_id) DO UPDATE SET report = excluded.report, updated_at = excluded.updated_at",
    )
    .bind(token.job_id.to_string())
    .bind(&connector)
    .bind(json_text(&progress.report))
    .bind(now)
    .execute(&mut *connection)
    .await?;
    Ok(())
}

/// The scheduling rule ([`crate::connectors`]), run with every claim: every active connector
/// without an open run gets one, due one interval after its last run changed state (now if
/// it never ran, or if a push-hook delivery arrived after its last run started, which may
/// have fetched before the push); a removed connector whose removal tombstones gets one now
/// while it still owns a live source.
pub(crate) async fn schedule(
    connection: &mut SqliteConnection,
    now: Micros,
    policies: &JobPolicies,
) -> Result<()> {
    let due = sqlx::query(
        "SELECT c.*, \
           EXISTS (SELECT 1 FROM connector_deliveries AS d WHERE d.connector_id = c.id \
             AND d.received_at > (SELECT coalesce(last.started_at, last.created_at) \
               FROM jobs AS last WHERE last.connector_id = c.id \
               ORDER BY last.created_at DESC LIMIT 1)) AS pushed, \
           CASE WHEN c.state = 'removed' THEN ?1 \
                WHEN EXISTS (SELECT 1 FROM connector_deliveries AS d WHERE d.connector_id = c.id \
                  AND d.received_at > (SELECT coalesce(last.started_at, last.created_at) \
                    FROM jobs AS last WHERE last.connector_id = c.id \
                    ORDER BY last.created_at DESC LIMIT 1)) THEN ?1 \
                ELSE max(?1, coalesce((SELECT last.changed_at FROM jobs AS last \
                  WHERE last.connector_id = c.id ORDER BY last.created_at DESC LIMIT 1) \
                  + c.interval_ms * 1000, ?1)) END AS due_at \
         FROM connectors AS c \
         WHERE (c.state = 'active' \
                OR (c.state = 'removed' AND c.removal = 'tombstone' AND EXISTS ( \
                  SELECT 1 FROM sources AS s JOIN revisions AS head ON head.id = s.head_revision_id \
                  WHERE s.owner = 'connector:' || c.id AND head.tombstone = 0))) \
           AND NOT EXISTS (SELECT 1 FROM jobs AS open WHERE open.connector_id = c.id \
                           AND open.state IN ('pending', 'running', 'retry_wait'))",
    )
    .bind(now)
    .fetch_all(&mut *connection)
    .await?;
    for row in &due {
        let connector = connector_from_row(row)?;
        let due_at: Micros = row.try_get("due_at")?;
        let pushed: bool = row.try_get("pushed")?;
        let rule = if connector.state == crate::model::ConnectorState::Removed {
            "last run: tombstone what the removed connector created".to_owned()
        } else if pushed {
            "a push hook arrived while the last run ran".to_owned()
        } else {
            format!(
                "every {} s after the last run",
                connector.interval_ms / 1000
            )
        };
        let queued = QueuedRun {
            rule: &rule,
            actor: "cairn:scheduler",
            cause: "scheduled",
            max_attempts: policies.of(JobKind::Sync).max_attempts,
        };
        queue(connection, &connector, due_at, &queued, now).await?;
    }
    Ok(())
}

pub(crate) fn report_from(text: Option<String>) -> Result<Option<SyncReport>> {
    text.map(|text| {
        serde_json::from_str(&text)
            .map_err(|error| LedgerError::Corrupt(format!("sync report: {error}")))
    })
    .transpose()
}
