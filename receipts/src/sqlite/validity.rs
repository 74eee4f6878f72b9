//! Validity on SQLite: a source's timeline and what held at (T, R), and the crossing of a
//! scheduled boundary ([`cross`]). The other writes are part of acceptance
//! (`queries/accept_validity.sql`) and erasure.

use sqlx::sqlite::{SqliteConnection, SqlitePool, SqliteRow};
use sqlx::Row;

use super::rows::parse_uuid;
use crate::clock::Micros;
use crate::error::Result;
use crate::model::LeaseToken;
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

/// Moves a source's head to the revision of the leased job when that revision is scheduled
/// (held from a boundary that has come) and is not the head yet: the same head move,
/// supersession and swap of lexical passages as acceptance makes, recorded by the same
/// triggers with cause `validity_boundary`. Nothing happens when the revision is the head
/// already, or is an erasure's. When the ledger no longer believes the revision holds now (a
/// later assertion overrode it), the job itself is superseded (`validity_overridden`) and the
/// answer is `false`: the worker stops without writing.
pub(crate) async fn cross(
    connection: &mut SqliteConnection,
    token: &LeaseToken,
    now: Micros,
) -> Result<bool> {
    let job = super::leases::fence(connection, token, now).await?;
    let Some(revision) = job.revision_id.map(|id| id.to_string()) else {
        return Ok(true);
    };
    let head: Option<String> = sqlx::query_scalar(
        "SELECT head_revision_id FROM sources WHERE dataset = ?1 AND source_key = ?2",
    )
    .bind(&job.dataset)
    .bind(&job.source_key)
    .fetch_optional(&mut *connection)
    .await?;
    if head.as_deref() == Some(revision.as_str()) {
        return Ok(true);
    }
    let held: Option<String> = sqlx::query_scalar(
        "SELECT revision_id FROM validity WHERE dataset = ?1 AND source_key = ?2 \
           AND recorded_to = ?3 AND valid_from <= ?4 AND valid_to > ?4",
    )
    .bind(&job.dataset)
    .bind(&job.source_key)
    .bind(crate::validity::OPEN)
    .bind(now)
    .fetch_optional(&mut *connection)
    .await?;
    if held.as_deref() != Some(revision.as_str()) {
        // An erasure's job runs whatever holds.
        let erased: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM erasures WHERE revision_id = ?1)")
                .bind(&revision)
                .fetch_one(&mut *connection)
                .await?;
        if erased {
            return Ok(true);
        }
        // A later assertion overrode the revision over this instant: the job has nothing to
        // project, and ends superseded (its receipts too).
        supersede(
            connection,
            &[job.id.to_string()],
            &token.owner,
            "validity_overridden",
            now,
        )
        .await?;
        return Ok(false);
    }
    let cause = format!("superseded_by:{revision}");
    sqlx::query(
        "UPDATE sources SET head_revision_id = ?3, changed_by = ?4, \
           change_cause = 'validity_boundary', changed_at = ?5, change_seq = change_seq + 1 \
         WHERE dataset = ?1 AND source_key = ?2",
    )
    .bind(&job.dataset)
    .bind(&job.source_key)
    .bind(&revision)
    .bind(&token.owner)
    .bind(now)
    .execute(&mut *connection)
    .await?;
    // The former head's unfinished work (running, waiting for a retry, or due) is superseded;
    // jobs scheduled for later boundaries stay, the former head's return among them. An
    // erasure's jobs always run.
    let gone: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM jobs WHERE dataset = ?1 AND source_key = ?2 \
           AND state IN ('pending', 'running', 'retry_wait') AND revision_id <> ?3 \
           AND (state <> 'pending' OR run_at <= ?5) AND ?4 IS NOT ?3 \
           AND NOT EXISTS (SELECT 1 FROM erasures AS erased \
                           WHERE erased.revision_id = jobs.revision_id)",
    )
    .bind(&job.dataset)
    .bind(&job.source_key)
    .bind(&revision)
    .bind(&head)
    .bind(now)
    .fetch_all(&mut *connection)
    .await?;
    supersede(connection, &gone, &token.owner, &cause, now).await?;
    // The lexical index follows the head: the former head's passages are archived by their
    // delete trigger, and the new head's come back from the archive acceptance put them in.
    sqlx::query("DELETE FROM passages WHERE dataset = ?1 AND source_key = ?2")
        .bind(&job.dataset)
        .bind(&job.source_key)
        .execute(&mut *connection)
        .await?;
    sqlx::query(
        "INSERT INTO passages (dataset, source_key, revision_id, passage_index, byte_start, \
           byte_end, text, section, page) \
         SELECT dataset, source_key, revision_id, passage_index, byte_start, byte_end, text, \
           section, page \
         FROM past_passages WHERE revision_id = ?1",
    )
    .bind(&revision)
    .execute(&mut *connection)
    .await?;
    sqlx::query(
        "INSERT INTO passages_fts (rowid, text) \
         SELECT indexed.id, coalesce(indexed.text, CAST(substr(content.bytes, \
           indexed.byte_start + 1, indexed.byte_end - indexed.byte_start) AS TEXT)) \
         FROM passages AS indexed \
         JOIN revisions AS revision ON revision.id = indexed.revision_id \
         JOIN contents AS content ON content.sha256 = revision.content_sha256 \
         WHERE indexed.revision_id = ?1",
    )
    .bind(&revision)
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

/// Supersedes the unfinished jobs `ids` and their open receipts, by `actor` for `cause`.
async fn supersede(
    connection: &mut SqliteConnection,
    ids: &[String],
    actor: &str,
    cause: &str,
    now: Micros,
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let ids = serde_json::to_string(ids).map_err(|error| {
        crate::error::LedgerError::Internal(format!("job ids as JSON: {error}"))
    })?;
    sqlx::query(
        "UPDATE projection_receipts SET state = 'superseded', updated_at = ?2, changed_by = ?3, \
           change_cause = ?4, changed_at = ?2, change_seq = change_seq + 1 \
         WHERE job_id IN (SELECT value FROM json_each(?1)) \
           AND state IN ('pending', 'running', 'written')",
    )
    .bind(&ids)
    .bind(now)
    .bind(actor)
    .bind(cause)
    .execute(&mut *connection)
    .await?;
    sqlx::query(
        "UPDATE jobs SET state = 'superseded', lease_id = NULL, lease_owner = NULL, \
           lease_expires_at = NULL, changed_by = ?3, change_cause = ?4, changed_at = ?2, \
           change_seq = change_seq + 1 \
         WHERE id IN (SELECT value FROM json_each(?1)) \
           AND state IN ('pending', 'running', 'retry_wait')",
    )
    .bind(&ids)
    .bind(now)
    .bind(actor)
    .bind(cause)
    .execute(&mut *connection)
    .await?;
    Ok(())
}

/// Whether a revision that held at `at` is missing from the vectors of `generation` or from
/// the passages (`Reader::history_gaps`): probes the recorded gaps of `datasets` only, each
/// against the validity rectangles and the index it lacks (a gap closed later, by a revert
/// that projected the revision, no longer counts).
pub(crate) async fn history_gaps(
    pool: &SqlitePool,
    datasets: &[String],
    generation: Option<&str>,
    at: crate::validity::At,
) -> Result<crate::validity::HistoryGaps> {
    const HELD: &str = "EXISTS (SELECT 1 FROM validity v WHERE v.revision_id = g.revision_id \
           AND v.valid_from <= ?3 AND ?3 < v.valid_to \
           AND v.recorded_from <= ?4 AND ?4 < v.recorded_to)";
    const IN_DATASETS: &str =
        "(json_array_length(?2) = 0 OR g.dataset IN (SELECT value FROM json_each(?2)))";
    let row = sqlx::query(&format!(
        "SELECT \
           ?1 IS NOT NULL AND EXISTS (SELECT 1 FROM history_gaps g \
             WHERE g.index_kind = 'vector' AND g.generation = ?1 AND {IN_DATASETS} AND {HELD} \
               AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.revision_id = g.revision_id \
                               AND c.generation = ?1)) AS vector, \
           EXISTS (SELECT 1 FROM history_gaps g \
             WHERE g.index_kind = 'lexical' AND g.generation = '' AND {IN_DATASETS} AND {HELD} \
               AND NOT EXISTS (SELECT 1 FROM past_passages p WHERE p.revision_id = g.revision_id) \
               AND NOT EXISTS (SELECT 1 FROM passages p WHERE p.revision_id = g.revision_id)) \
             AS lexical"
    ))
    .bind(generation)
    .bind(serde_json::to_string(datasets).map_err(|error| {
        crate::error::LedgerError::Internal(format!("datasets as JSON: {error}"))
    })?)
    .bind(at.valid_at)
    .bind(at.as_of)
    .fetch_one(pool)
    .await?;
    Ok(crate::validity::HistoryGaps {
        vector: row.try_get::<i64, _>("vector")? == 1,
        lexical: row.try_get::<i64, _>("lexical")? == 1,
    })
}
