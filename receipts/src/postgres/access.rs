//! Who may read which document, on PostgreSQL: access changes in one transaction each
//! (history by the triggers of schema 20, with the actor and reason carried on the row), and
//! reads.

use sqlx::{PgConnection, PgPool, Row};

use crate::access::{AccessChange, AccessRecord, DefaultAccess};
use crate::clock::Micros;
use crate::error::{LedgerError, Result};

/// Queues the access jobs of one source's readers change (see [`crate::access`]): one per
/// live generation holding vectors, unless one is already pending there or that generation's
/// projection of the source waits to run (it reads the readers when it runs; a running one reads
/// them again once its points are current, and a change after that queues a job).
async fn queue(
    connection: &mut PgConnection,
    dataset: &str,
    source_key: &str,
    max_attempts: i64,
    now: Micros,
    cause: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO jobs (id, revision_id, connector_id, dataset, source_key, kind, state, \
           priority, attempt, max_attempts, run_at, run_at_rule, created_at, changed_by, \
           change_cause, changed_at, generation) \
         SELECT gen_random_uuid(), NULL, NULL, $1, $2, 'access', 'pending', $3, 0, $4, $5, \
           'access changed', $5, $6, $7, $5, g.id \
         FROM generations g \
         WHERE g.state IN ('building', 'active', 'standby') AND g.backends ? 'vector' \
           AND EXISTS (SELECT 1 FROM sources s WHERE s.dataset = $1 AND s.source_key = $2) \
           AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.kind = 'access' AND j.state = 'pending' \
             AND j.dataset = $1 AND j.source_key = $2 AND j.generation = g.id) \
           AND NOT EXISTS (SELECT 1 FROM sources s JOIN jobs p ON p.revision_id = s.head_revision_id \
             WHERE s.dataset = $1 AND s.source_key = $2 AND p.generation = g.id \
               AND p.kind IN ('project', 'tombstone') \
               AND p.state IN ('pending', 'retry_wait'))",
    )
    .bind(dataset)
    .bind(source_key)
    .bind(crate::access::ACCESS_PRIORITY)
    .bind(max_attempts)
    .bind(now)
    .bind(crate::access::ACCESS_QUEUER)
    .bind(cause)
    .execute(&mut *connection)
    .await?;
    Ok(())
}

/// Applies one change inside the caller's transaction; a change to a source's readers queues
/// its access jobs (`access_attempts`: their attempts).
pub(super) async fn change(
    connection: &mut PgConnection,
    change: AccessChange,
    now: Micros,
    access_attempts: i64,
) -> Result<()> {
    match change {
        AccessChange::Source {
            dataset,
            source_key,
            readers: Some(readers),
            actor,
            reason,
        } => {
            let written = sqlx::query(
                "INSERT INTO source_access (dataset, source_key, readers, version, changed_by, \
                 change_cause, changed_at) VALUES ($1, $2, $3, 1, $4, $5, $6) \
                 ON CONFLICT (dataset, source_key) DO UPDATE SET readers = excluded.readers, \
                 version = source_access.version + 1, changed_by = excluded.changed_by, \
                 change_cause = excluded.change_cause, changed_at = excluded.changed_at \
                 WHERE source_access.readers <> excluded.readers",
            )
            .bind(&dataset)
            .bind(&source_key)
            .bind(serde_json::json!(readers))
            .bind(&actor)
            .bind(&reason)
            .bind(now)
            .execute(&mut *connection)
            .await?;
            if written.rows_affected() > 0 {
                let cause = format!("readers set: {reason}");
                queue(
                    connection,
                    &dataset,
                    &source_key,
                    access_attempts,
                    now,
                    &cause,
                )
                .await?;
            }
        }
        AccessChange::Source {
            dataset,
            source_key,
            readers: None,
            actor,
            reason,
        } => {
            // Back to the dataset's default: history keeps the readers the row had.
            let gone = sqlx::query(
                "WITH gone AS (DELETE FROM source_access WHERE dataset = $1 AND source_key = $2 \
                 RETURNING readers) \
                 SELECT history_add(true, $3, 'access', $1 || '/' || $2, 'readers', \
                 gone.readers::text, 'default', $4, $5) FROM gone",
            )
            .bind(&dataset)
            .bind(&source_key)
            .bind(now)
            .bind(&actor)
            .bind(&reason)
            .execute(&mut *connection)
            .await?;
            if gone.rows_affected() > 0 {
                let cause = format!("readers handed back to the dataset default: {reason}");
                queue(
                    connection,
                    &dataset,
                    &source_key,
                    access_attempts,
                    now,
                    &cause,
                )
                .await?;
            }
        }
        AccessChange::Dataset {
            dataset,
            default,
            actor,
            reason,
        } => {
            sqlx::query(
                "INSERT INTO dataset_access (dataset, default_access, changed_by, change_cause, \
                 changed_at) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (dataset) DO UPDATE SET default_access = excluded.default_access, \
                 changed_by = excluded.changed_by, change_cause = excluded.change_cause, \
                 changed_at = excluded.changed_at \
                 WHERE dataset_access.default_access <> excluded.default_access",
            )
            .bind(&dataset)
            .bind(default.as_str())
            .bind(&actor)
            .bind(&reason)
            .bind(now)
            .execute(&mut *connection)
            .await?;
        }
    }
    Ok(())
}

/// Who may read one source now (whether or not the source exists).
pub(super) async fn of(pool: &PgPool, dataset: &str, source_key: &str) -> Result<AccessRecord> {
    let row = sqlx::query(
        "SELECT (SELECT default_access FROM dataset_access WHERE dataset = $1) AS default_access, \
         a.readers, a.version, a.changed_by, a.changed_at \
         FROM (SELECT 1) one LEFT JOIN source_access a ON a.dataset = $1 AND a.source_key = $2",
    )
    .bind(dataset)
    .bind(source_key)
    .fetch_one(pool)
    .await?;
    let default = match row.try_get::<Option<String>, _>("default_access")? {
        None => DefaultAccess::Everyone,
        Some(text) => text.parse().map_err(LedgerError::Corrupt)?,
    };
    let readers = row
        .try_get::<Option<serde_json::Value>, _>("readers")?
        .map(crate::access::StoredReaders::readers)
        .transpose()?;
    Ok(AccessRecord {
        dataset: dataset.to_owned(),
        source_key: source_key.to_owned(),
        readers,
        default,
        version: row.try_get::<Option<i64>, _>("version")?.unwrap_or(0),
        changed_by: row.try_get("changed_by")?,
        changed_at: row.try_get("changed_at")?,
    })
}
