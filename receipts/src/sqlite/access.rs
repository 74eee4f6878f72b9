//! Who may read which document, in the SQLite ledger: access changes (run by the writer task,
//! inside its transaction) and reads. Each change is one INSERT or UPDATE whose history row is
//! written by a trigger (schema 19) with the actor and reason carried on the row.

use sqlx::sqlite::SqliteConnection;
use sqlx::{Row, SqlitePool};

use super::rows::json_text;
use crate::access::{AccessChange, AccessRecord, DefaultAccess};
use crate::clock::Micros;
use crate::error::{LedgerError, Result};

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
