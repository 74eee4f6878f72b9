//! Validity reads on SQLite: a source's timeline and what held at (T, R). The writes are part
//! of acceptance (`queries/accept_validity.sql`) and erasure.

use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::Row;

use super::rows::parse_uuid;
use crate::clock::Micros;
use crate::error::Result;
use crate::validity::{Assertion, Held, Period, Rectangle, Timeline};

const RECTANGLE_COLUMNS: &str = "v.id, v.assertion_id, v.revision_id, v.valid_from, v.valid_to, \
     v.recorded_from, v.recorded_to, coalesce(r.tombstone, 0) AS tombstone";

fn rectangle(row: &SqliteRow) -> Result<(Rectangle, bool)> {
    Ok((
        Rectangle {
            id: parse_uuid(row.try_get("id")?)?,
            assertion_id: parse_uuid(row.try_get("assertion_id")?)?,
            revision_id: parse_uuid(row.try_get("revision_id")?)?,
            valid: Period {
                from: row.try_get("valid_from")?,
                to: row.try_get("valid_to")?,
            },
            recorded_from: row.try_get("recorded_from")?,
            recorded_to: row.try_get("recorded_to")?,
        },
        row.try_get::<i64, _>("tombstone")? == 1,
    ))
}

/// Every assertion and rectangle of a source.
pub(crate) async fn timeline(pool: &SqlitePool, dataset: &str, key: &str) -> Result<Timeline> {
    let assertions = sqlx::query(
        "SELECT id, seq, revision_id, valid_from, valid_to, recorded_at, actor, cause \
         FROM assertions WHERE dataset = ?1 AND source_key = ?2 ORDER BY seq",
    )
    .bind(dataset)
    .bind(key)
    .fetch_all(pool)
    .await?
    .iter()
    .map(|row| {
        Ok(Assertion {
            id: parse_uuid(row.try_get("id")?)?,
            seq: row.try_get("seq")?,
            revision_id: parse_uuid(row.try_get("revision_id")?)?,
            valid: Period {
                from: row.try_get("valid_from")?,
                to: row.try_get("valid_to")?,
            },
            recorded_at: row.try_get("recorded_at")?,
            actor: row.try_get("actor")?,
            cause: row.try_get("cause")?,
        })
    })
    .collect::<Result<Vec<_>>>()?;
    let rectangles = sqlx::query(&format!(
        "SELECT {RECTANGLE_COLUMNS} FROM validity v LEFT JOIN revisions r ON r.id = v.revision_id \
         WHERE v.dataset = ?1 AND v.source_key = ?2 ORDER BY v.recorded_from, v.valid_from"
    ))
    .bind(dataset)
    .bind(key)
    .fetch_all(pool)
    .await?
    .iter()
    .map(rectangle)
    .collect::<Result<Vec<_>>>()?;
    Ok(Timeline::assemble(assertions, rectangles))
}

/// The rectangle that holds `valid_at` as believed at `as_of`.
pub(crate) async fn held_at(
    pool: &SqlitePool,
    dataset: &str,
    key: &str,
    valid_at: Micros,
    as_of: Micros,
) -> Result<Option<Held>> {
    let row = sqlx::query(&format!(
        "SELECT {RECTANGLE_COLUMNS} FROM validity v LEFT JOIN revisions r ON r.id = v.revision_id \
         WHERE v.dataset = ?1 AND v.source_key = ?2 AND v.valid_from <= ?3 AND ?3 < v.valid_to \
           AND v.recorded_from <= ?4 AND ?4 < v.recorded_to"
    ))
    .bind(dataset)
    .bind(key)
    .bind(valid_at)
    .bind(as_of)
    .fetch_optional(pool)
    .await?;
    row.map(|row| {
        rectangle(&row).map(|(rectangle, tombstone)| Held {
            rectangle,
            tombstone,
        })
    })
    .transpose()
}
