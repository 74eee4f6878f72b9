//! Validity on PostgreSQL: a source's timeline, what held at (T, R) and the crossing of a
//! scheduled boundary, as on SQLite (`sqlite::validity`). The other writes are part of
//! acceptance and erasure.

use sqlx::postgres::{PgConnection, PgPool, PgRow};
use sqlx::Row;

use crate::clock::Micros;
use crate::error::Result;
use crate::model::{Job, LeaseToken};
use crate::validity::{Assertion, Held, Period, Rectangle, Timeline};

const RECTANGLE_COLUMNS: &str = "v.id, v.assertion_id, v.revision_id, v.valid_from, v.valid_to, \
     v.recorded_from, v.recorded_to, coalesce(r.tombstone, false) AS tombstone";

fn rectangle(row: &PgRow) -> Result<(Rectangle, bool)> {
    Ok((
        Rectangle {
            id: row.try_get("id")?,
            assertion_id: row.try_get("assertion_id")?,
            revision_id: row.try_get("revision_id")?,
            valid: Period {
                from: row.try_get("valid_from")?,
                to: row.try_get("valid_to")?,
            },
            recorded_from: row.try_get("recorded_from")?,
            recorded_to: row.try_get("recorded_to")?,
        },
        row.try_get("tombstone")?,
    ))
}

/// Every assertion and rectangle of a source.
pub(crate) async fn timeline(pool: &PgPool, dataset: &str, key: &str) -> Result<Timeline> {
    let assertions = sqlx::query(
        "SELECT id, seq, revision_id, valid_from, valid_to, recorded_at, actor, cause \
         FROM assertions WHERE dataset = $1 AND source_key = $2 ORDER BY seq",
    )
    .bind(dataset)
    .bind(key)
    .fetch_all(pool)
    .await?
    .iter()
    .map(|row| {
        Ok(Assertion {
            id: row.try_get("id")?,
            seq: row.try_get("seq")?,
            revision_id: row.try_get("revision_id")?,
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
         WHERE v.dataset = $1 AND v.source_key = $2 ORDER BY v.recorded_from, v.valid_from"
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
    pool: &PgPool,
    dataset: &str,
    key: &str,
    valid_at: Micros,
    as_of: Micros,
) -> Result<Option<Held>> {
    let row = sqlx::query(&format!(
        "SELECT {RECTANGLE_COLUMNS} FROM validity v LEFT JOIN revisions r ON r.id = v.revision_id \
         WHERE v.dataset = $1 AND v.source_key = $2 AND v.valid_from <= $3 AND $3 < v.valid_to \
           AND v.recorded_from <= $4 AND $4 < v.recorded_to"
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

/// The crossing of `job`'s boundary, inside the caller's transaction (which holds the
/// source's advisory lock and the job's fenced row): see `sqlite::validity::cross`.
pub(super) async fn cross(
    connection: &mut PgConnection,
    job: &Job,
    token: &LeaseToken,
    now: Micros,
) -> Result<bool> {
    let Some(revision) = job.revision_id else {
        return Ok(true);
    };
    let head: Option<uuid::Uuid> = sqlx::query_scalar(
        "SELECT head_revision_id FROM sources WHERE dataset = $1 AND source_key = $2",
    )
    .bind(&job.dataset)
    .bind(&job.source_key)
    .fetch_optional(&mut *connection)
    .await?;
    if head == Some(revision) {
        return Ok(true);
    }
    let held: Option<uuid::Uuid> = sqlx::query_scalar(
        "SELECT revision_id FROM validity WHERE dataset = $1 AND source_key = $2 \
           AND recorded_to = $3 AND valid_from <= $4 AND valid_to > $4",
    )
    .bind(&job.dataset)
    .bind(&job.source_key)
    .bind(crate::validity::OPEN)
    .bind(now)
    .fetch_optional(&mut *connection)
    .await?;
    if held != Some(revision) {
        // An erasure's job runs whatever holds.
        let erased: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM erasures WHERE revision_id = $1)")
                .bind(revision)
                .fetch_one(&mut *connection)
                .await?;
        if erased {
            return Ok(true);
        }
        // A later assertion overrode the revision over this instant: the job has nothing to
        // project, and ends superseded (its receipts too).
        sqlx::query(
            "WITH receipts AS ( \
               UPDATE projection_receipts SET state = 'superseded', \
                 updated_at = GREATEST($2, changed_at), changed_by = $3, \
                 change_cause = 'validity_overridden', changed_at = GREATEST($2, changed_at), \
                 change_seq = change_seq + 1 \
               WHERE job_id = $1 AND state IN ('pending', 'running', 'written')) \
             UPDATE jobs SET state = 'superseded', lease_id = NULL, lease_owner = NULL, \
               lease_expires_at = NULL, changed_by = $3, change_cause = 'validity_overridden', \
               changed_at = GREATEST($2, changed_at), change_seq = change_seq + 1 \
             WHERE id = $1",
        )
        .bind(job.id)
        .bind(now)
        .bind(&token.owner)
        .execute(&mut *connection)
        .await?;
        return Ok(false);
    }
    sqlx::query(
        "UPDATE sources SET head_revision_id = $3, changed_by = $4, \
           change_cause = 'validity_boundary', changed_at = $5, change_seq = change_seq + 1 \
         WHERE dataset = $1 AND source_key = $2",
    )
    .bind(&job.dataset)
    .bind(&job.source_key)
    .bind(revision)
    .bind(&token.owner)
    .bind(now)
    .execute(&mut *connection)
    .await?;
    // The former head's unfinished work (running, waiting for a retry, or due); jobs
    // scheduled for later boundaries stay, the former head's return among them, and an
    // erasure's jobs always run.
    sqlx::query(
        "WITH gone AS ( \
           SELECT j.id FROM jobs j WHERE j.dataset = $1 AND j.source_key = $2 \
             AND j.state IN ('pending', 'running', 'retry_wait') AND j.revision_id <> $3 \
             AND (j.state <> 'pending' OR j.run_at <= $5) AND $4::uuid IS DISTINCT FROM $3 \
             AND NOT EXISTS (SELECT 1 FROM erasures e WHERE e.revision_id = j.revision_id)), \
         receipts AS ( \
           UPDATE projection_receipts r SET state = 'superseded', \
             updated_at = GREATEST($5, r.changed_at), changed_by = $6, change_cause = $7, \
             changed_at = GREATEST($5, r.changed_at), change_seq = r.change_seq + 1 \
           FROM gone WHERE r.job_id = gone.id AND r.state IN ('pending', 'running', 'written')) \
         UPDATE jobs j SET state = 'superseded', lease_id = NULL, lease_owner = NULL, \
           lease_expires_at = NULL, changed_by = $6, change_cause = $7, \
           changed_at = GREATEST($5, j.changed_at), change_seq = j.change_seq + 1 \
         FROM gone WHERE j.id = gone.id",
    )
    .bind(&job.dataset)
    .bind(&job.source_key)
    .bind(revision)
    .bind(head)
    .bind(now)
    .bind(&token.owner)
    .bind(format!("superseded_by:{revision}"))
    .execute(&mut *connection)
    .await?;
    // The lexical index follows the head: the former head's passages are archived by their
    // delete trigger, and the new head's come back from the archive acceptance put them in.
    sqlx::query("DELETE FROM passages WHERE dataset = $1 AND source_key = $2")
        .bind(&job.dataset)
        .bind(&job.source_key)
        .execute(&mut *connection)
        .await?;
    sqlx::query(
        "INSERT INTO passages (dataset, source_key, revision_id, passage_index, byte_start, \
           byte_end, words, text, section, page) \
         SELECT dataset, source_key, revision_id, passage_index, byte_start, byte_end, words, \
           text, section, page \
         FROM past_passages WHERE revision_id = $1",
    )
    .bind(revision)
    .execute(&mut *connection)
    .await?;
    tracing::info!(
        dataset = %job.dataset,
        source_key = %job.source_key,
        revision = %revision,
        former_head = ?head,
        job = %job.id,
        "validity boundary crossed: the head moved to the revision scheduled for now"
    );
    Ok(true)
}

/// As on SQLite (`sqlite::validity::history_gaps`).
pub(super) async fn history_gaps(
    pool: &PgPool,
    datasets: &[String],
    generation: Option<&str>,
    at: crate::validity::At,
) -> Result<crate::validity::HistoryGaps> {
    const HELD: &str = "EXISTS (SELECT 1 FROM validity v WHERE v.revision_id = g.revision_id \
           AND v.valid_from <= $3 AND $3 < v.valid_to \
           AND v.recorded_from <= $4 AND $4 < v.recorded_to)";
    const IN_DATASETS: &str = "(cardinality($2::text[]) = 0 OR g.dataset = ANY($2))";
    let row = sqlx::query(&format!(
        "SELECT \
           $1::text IS NOT NULL AND EXISTS (SELECT 1 FROM history_gaps g \
             WHERE g.index_kind = 'vector' AND g.generation = $1 AND {IN_DATASETS} AND {HELD} \
               AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.revision_id = g.revision_id \
                               AND c.generation = $1)) AS vector, \
           EXISTS (SELECT 1 FROM history_gaps g \
             WHERE g.index_kind = 'lexical' AND g.generation = '' AND {IN_DATASETS} AND {HELD} \
               AND NOT EXISTS (SELECT 1 FROM past_passages p WHERE p.revision_id = g.revision_id) \
               AND NOT EXISTS (SELECT 1 FROM passages p WHERE p.revision_id = g.revision_id)) \
             AS lexical"
    ))
    .bind(generation)
    .bind(datasets)
    .bind(at.valid_at)
    .bind(at.as_of)
    .fetch_one(pool)
    .await?;
    Ok(crate::validity::HistoryGaps {
        vector: row.try_get("vector")?,
        lexical: row.try_get("lexical")?,
    })
}
