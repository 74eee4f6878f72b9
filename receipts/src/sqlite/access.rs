//! Who may read which document, in the SQLite ledger: access changes (run by the writer task,
//! inside its transaction) and reads. Each change is one INSERT or UPDATE whose history row is
//! written by a trigger (schema 19) with the actor and reason carried on the row.

use sqlx::sqlite::SqliteConnection;
use sqlx::{Row, SqlitePool};

use super::rows::json_text;
use crate::access::{AccessChange, AccessRecord, DefaultAccess};
use crate::clock::Micros;
use crate::error::{LedgerError, Result};

/// The statement that queues access jobs for one source (see [`crate::access`]): one per live
/// generation holding vectors, unless one is already pending there or that generation's
/// projection of the source waits to run (it reads the readers when it runs; a running one reads
/// them again once its points are current, and a change after that queues a job). Each argument is
/// an SQL expression: the dataset, the key, the time and the job's cause.
fn queue_statement(dataset: &str, key: &str, at: &str, cause: &str) -> String {
    format!(
        "INSERT INTO jobs (id, revision_id, connector_id, dataset, source_key, kind, state, \
           priority, max_attempts, run_at, run_at_rule, created_at, changed_by, change_cause, \
           changed_at, generation) \
         SELECT {uuid}, NULL, NULL, {dataset}, {key}, 'access', 'pending', {priority}, \
           (SELECT max_attempts FROM job_policies WHERE kind = 'access'), {at}, \
           'access changed', {at}, '{queuer}', {cause}, {at}, g.id \
         FROM generations AS g \
         WHERE g.state IN ('building', 'active', 'standby') \
           AND EXISTS (SELECT 1 FROM json_each(g.backends) AS b WHERE b.value = 'vector') \
           AND EXISTS (SELECT 1 FROM sources AS s WHERE s.dataset = {dataset} \
                       AND s.source_key = {key}) \
           AND NOT EXISTS (SELECT 1 FROM jobs AS j INDEXED BY jobs_pending_access \
             WHERE j.kind = 'access' AND j.state = 'pending' AND j.dataset = {dataset} \
               AND j.source_key = {key} AND j.generation = g.id) \
           AND NOT EXISTS (SELECT 1 FROM sources AS s JOIN jobs AS p INDEXED BY jobs_by_revision \
               ON p.revision_id = s.head_revision_id \
             WHERE s.dataset = {dataset} AND s.source_key = {key} \
               AND p.generation = g.id AND p.kind IN ('project', 'tombstone') \
               AND p.state IN ('pending', 'retry_wait'))",
        uuid = super::generations::SQL_UUID,
        priority = crate::access::ACCESS_PRIORITY,
        queuer = crate::access::ACCESS_QUEUER,
    )
}

/// The writer's triggers that queue access jobs when a source's readers are set or changed
/// ([`queue_statement`]). Temporary: they read the writer's `job_policies`, and naming
/// readers stays one statement.
pub(crate) fn queue_triggers() -> String {
    ["insert", "update"]
        .iter()
        .map(|event| {
            let cause = "'readers set: ' || NEW.change_cause";
            format!(
                "CREATE TEMP TRIGGER IF NOT EXISTS access_queue_{event} AFTER {upper} ON \
                 main.source_access BEGIN {statement}; END;",
                upper = event.to_uppercase(),
                statement =
                    queue_statement("NEW.dataset", "NEW.source_key", "NEW.changed_at", cause),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether [`change`] writes `change` with one statement (naming readers, a dataset's
/// default; the access jobs it queues are written by triggers inside it), which is atomic
/// without a savepoint; handing a source back to its default takes three.
pub(crate) fn one_statement(change: &AccessChange) -> bool {
    !matches!(change, AccessChange::Source { readers: None, .. })
}

/// Applies one change (inside the writer's transaction).
pub(crate) async fn change(
    connection: &mut SqliteConnection,
    change: AccessChange,
    now: Micros,
) -> Result<()> {
    match change {
        AccessChange::Source {
            dataset,
            source_key,
            readers: Some(readers),
            actor,
            reason,
        } => {
            let readers = json_text(&readers);
            sqlx::query(
                "INSERT INTO source_access (dataset, source_key, readers, version, changed_by, \
                 change_cause, changed_at) VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6) \
                 ON CONFLICT (dataset, source_key) DO UPDATE SET readers = excluded.readers, \
                 version = version + 1, changed_by = excluded.changed_by, \
                 change_cause = excluded.change_cause, changed_at = excluded.changed_at \
                 WHERE readers <> excluded.readers",
            )
            .bind(&dataset)
            .bind(&source_key)
            .bind(readers)
            .bind(&actor)
            .bind(&reason)
            .bind(now)
            .execute(&mut *connection)
            .await?;
        }
        AccessChange::Source {
            dataset,
            source_key,
            readers: None,
            actor,
            reason,
        } => {
            // Back to the dataset's default: recorded like a change to an empty list would
            // be, then the row goes (history keeps the readers it had).
            let had: Option<String> = sqlx::query_scalar(
                "SELECT readers FROM source_access WHERE dataset = ?1 AND source_key = ?2",
            )
            .bind(&dataset)
            .bind(&source_key)
            .fetch_optional(&mut *connection)
            .await?;
            if let Some(had) = had {
                sqlx::query(
                    "INSERT INTO history (at, entity, entity_id, event, from_state, to_state, \
                     actor, cause) VALUES (?1, 'access', ?2, 'readers', ?3, 'default', ?4, ?5)",
                )
                .bind(now)
                .bind(format!("{dataset}/{source_key}"))
                .bind(had)
                .bind(&actor)
                .bind(&reason)
                .execute(&mut *connection)
                .await?;
                sqlx::query("DELETE FROM source_access WHERE dataset = ?1 AND source_key = ?2")
                    .bind(&dataset)
                    .bind(&source_key)
                    .execute(&mut *connection)
                    .await?;
                sqlx::query(&queue_statement("?1", "?2", "?3", "?4"))
                    .bind(&dataset)
                    .bind(&source_key)
                    .bind(now)
                    .bind(format!(
                        "readers handed back to the dataset default: {reason}"
                    ))
                    .execute(&mut *connection)
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
                 changed_at) VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (dataset) DO UPDATE SET default_access = excluded.default_access, \
                 changed_by = excluded.changed_by, change_cause = excluded.change_cause, \
                 changed_at = excluded.changed_at \
                 WHERE default_access <> excluded.default_access",
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
pub(crate) async fn of(
    reads: &SqlitePool,
    dataset: &str,
    source_key: &str,
) -> Result<AccessRecord> {
    let row = sqlx::query(
        "SELECT (SELECT default_access FROM dataset_access WHERE dataset = ?1) AS default_access, \
         a.readers, a.version, a.changed_by, a.changed_at \
         FROM (SELECT 1) LEFT JOIN source_access a ON a.dataset = ?1 AND a.source_key = ?2",
    )
    .bind(dataset)
    .bind(source_key)
    .fetch_one(reads)
    .await?;
    let default = match row.try_get::<Option<String>, _>("default_access")? {
        None => DefaultAccess::Everyone,
        Some(text) => text.parse().map_err(LedgerError::Corrupt)?,
    };
    let readers = row
        .try_get::<Option<String>, _>("readers")?
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
