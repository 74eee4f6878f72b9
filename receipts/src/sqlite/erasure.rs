//! Erasure on SQLite: one writer operation deletes every trace of a source's revisions and
//! queues the jobs that erase the stores (see [`crate::Acceptor::erase`]).
//!
//! The writer runs with `secure_delete` on, so freed cells and pages are overwritten with
//! zeros in the same transaction (the lexical index deletes for good through FTS5
//! `secure-delete`): once the WAL is checkpointed, no erased byte is left in the database file.

use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::Row;
use uuid::Uuid;

use super::generations::SQL_UUID;
use super::rows::json_text;
use super::rows::parse_uuid;
use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::model::{AcceptStatus, Acceptance, Backend, Erasure, ErasureRemaining, ErasureRequest};

/// Erases the source; `backends` are the ledger's (a graph job when it includes the graph).
pub(crate) async fn erase(
    connection: &mut SqliteConnection,
    request: &ErasureRequest,
    backends: &[Backend],
    max_attempts: (i64, i64),
    now: Micros,
) -> Result<Acceptance> {
    let exists: Option<String> = sqlx::query_scalar(
        "SELECT head_revision_id FROM sources WHERE dataset = ? AND source_key = ?",
    )
    .bind(&request.dataset)
    .bind(&request.source_key)
    .fetch_optional(&mut *connection)
    .await?;
    if exists.is_none() {
        return Err(LedgerError::SourceNotFound {
            dataset: request.dataset.clone(),
            source_key: request.source_key.clone(),
        });
    }
    erase_rows(connection, request, backends, max_attempts, now).await
}

async fn erase_rows(
    connection: &mut SqliteConnection,
    request: &ErasureRequest,
    backends: &[Backend],
    (project_attempts, graph_attempts): (i64, i64),
    now: Micros,
) -> Result<Acceptance> {
    let (dataset, key) = (&request.dataset, &request.source_key);
    let hashes: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT content_sha256 FROM revisions \
         WHERE dataset = ? AND source_key = ? AND content_sha256 IS NOT NULL ORDER BY 1",
    )
    .bind(dataset)
    .bind(key)
    .fetch_all(&mut *connection)
    .await?;
    let revision = Uuid::now_v7();
    let id = revision.to_string();
    sqlx::query(
        "INSERT INTO revisions (id, dataset, source_key, content_sha256, byte_length, media_type, \
           tags, metadata, tombstone, previous_revision_id, actor, reason, accepted_at) \
         VALUES (?1, ?2, ?3, NULL, 0, 'text/plain', '[]', '{}', 1, NULL, ?4, ?5, ?6)",
    )
    .bind(&id)
    .bind(dataset)
    .bind(key)
    .bind(&request.actor)
    .bind(&request.reason)
    .bind(now)
    .execute(&mut *connection)
    .await?;
    sqlx::query(
        "UPDATE sources SET head_revision_id = ?3, changed_by = ?4, change_cause = ?5, \
           changed_at = ?6, change_seq = change_seq + 1 WHERE dataset = ?1 AND source_key = ?2",
    )
    .bind(dataset)
    .bind(key)
    .bind(&id)
    .bind(&request.actor)
    .bind(format!("erased: {}", request.reason))
    .bind(now)
    .execute(&mut *connection)
    .await?;
    // Everything of the earlier revisions, children first.
    // Earlier erasures stay: each keeps its record and its jobs.
    let earlier = "SELECT id FROM revisions WHERE dataset = ?1 AND source_key = ?2 AND id <> ?3 \
                   AND id NOT IN (SELECT revision_id FROM erasures)";
    sqlx::query(&format!(
        "DELETE FROM projection_receipts WHERE job_id IN \
           (SELECT id FROM jobs WHERE revision_id IN ({earlier}))"
    ))
    .bind(dataset)
    .bind(key)
    .bind(&id)
    .execute(&mut *connection)
    .await?;
    sqlx::query(&format!(
        "DELETE FROM jobs WHERE revision_id IN ({earlier})"
    ))
    .bind(dataset)
    .bind(key)
    .bind(&id)
    .execute(&mut *connection)
    .await?;
    sqlx::query("DELETE FROM passages WHERE dataset = ?1 AND source_key = ?2")
        .bind(dataset)
        .bind(key)
        .execute(&mut *connection)
        .await?;
    let chunk_rows = sqlx::query(&format!(
        "DELETE FROM chunks WHERE revision_id IN ({earlier})"
    ))
    .bind(dataset)
    .bind(key)
    .bind(&id)
    .execute(&mut *connection)
    .await?
    .rows_affected() as i64;
    sqlx::query(&format!(
        "DELETE FROM searchable_revisions WHERE revision_id IN ({earlier})"
    ))
    .bind(dataset)
    .bind(key)
    .bind(&id)
    .execute(&mut *connection)
    .await?;
    let revisions = sqlx::query(&format!("DELETE FROM revisions WHERE id IN ({earlier})"))
        .bind(dataset)
        .bind(key)
        .bind(&id)
        .execute(&mut *connection)
        .await?
        .rows_affected() as i64;
    assert_erasure(connection, request, &id, now).await?;
    let contents = sqlx::query(
        "DELETE FROM contents WHERE sha256 IN (SELECT value FROM json_each(?1)) \
           AND NOT EXISTS (SELECT 1 FROM revisions r WHERE r.content_sha256 = contents.sha256)",
    )
    .bind(json_text(&hashes))
    .execute(&mut *connection)
    .await?
    .rows_affected() as i64;
    sqlx::query(
        "INSERT INTO erasures (revision_id, dataset, source_key, revisions_erased, content_sha256, \
           contents_deleted, chunk_rows_deleted, actor, reason, erased_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )
    .bind(&id)
    .bind(dataset)
    .bind(key)
    .bind(revisions)
    .bind(json_text(&hashes))
    .bind(contents)
    .bind(chunk_rows)
    .bind(&request.actor)
    .bind(&request.reason)
    .bind(now)
    .execute(&mut *connection)
    .await?;
    // The stores: one tombstone job per live generation (the active one's is the receipt's),
    // or one for the ledger's backends before any generation exists; and a graph job.
    let cause = format!("erase: {}", request.reason);
    sqlx::query(&format!(
        "INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, attempt, \
           max_attempts, run_at, created_at, changed_by, change_cause, changed_at, generation) \
         SELECT {SQL_UUID}, ?1, ?2, ?3, 'tombstone', 'pending', 0, ?4, ?5, ?5, ?6, ?7, ?5, g.id \
         FROM (SELECT id FROM generations WHERE state IN ('building', 'active', 'standby') \
               UNION ALL SELECT NULL WHERE NOT EXISTS \
                 (SELECT 1 FROM generations WHERE state = 'active')) AS g"
    ))
    .bind(&id)
    .bind(dataset)
    .bind(key)
    .bind(project_attempts)
    .bind(now)
    .bind(&request.actor)
    .bind(&cause)
    .execute(&mut *connection)
    .await?;
    let own: Vec<&str> = backends
        .iter()
        .filter(|backend| **backend != Backend::Graph)
        .map(|backend| backend.as_str())
        .collect();
    sqlx::query(
        "INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, \
           change_cause, changed_at) \
         SELECT j.id, b.value, 'pending', ?2, j.changed_by, j.change_cause, ?2 \
         FROM jobs j LEFT JOIN generations g ON g.id = j.generation, \
           json_each(coalesce(g.backends, ?3)) AS b \
         WHERE j.revision_id = ?1 AND b.value <> 'graph'",
    )
    .bind(&id)
    .bind(now)
    .bind(json_text(&own))
    .execute(&mut *connection)
    .await?;
    if backends.contains(&Backend::Graph) {
        sqlx::query(&format!(
            "INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, attempt, \
               max_attempts, run_at, created_at, changed_by, change_cause, changed_at) \
             VALUES ({SQL_UUID}, ?1, ?2, ?3, 'graph', 'pending', 0, ?4, ?5, ?5, ?6, ?7, ?5)"
        ))
        .bind(&id)
        .bind(dataset)
        .bind(key)
        .bind(graph_attempts)
        .bind(now)
        .bind(&request.actor)
        .bind(&cause)
        .execute(&mut *connection)
        .await?;
        sqlx::query(
            "INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, \
               change_cause, changed_at) \
             SELECT id, 'graph', 'pending', ?2, changed_by, change_cause, ?2 FROM jobs \
             WHERE revision_id = ?1 AND kind = 'graph'",
        )
        .bind(&id)
        .bind(now)
        .execute(&mut *connection)
        .await?;
    }
    let job: String = sqlx::query_scalar(
        "SELECT id FROM jobs WHERE revision_id = ?1 AND kind = 'tombstone' \
         ORDER BY generation IS (SELECT id FROM generations WHERE state = 'active') DESC LIMIT 1",
    )
    .bind(&id)
    .fetch_one(&mut *connection)
    .await?;
    Ok(Acceptance {
        accepted: true,
        status: AcceptStatus::QueuedNotConfirmed,
        dataset: dataset.clone(),
        source_key: key.clone(),
        source_revision_id: revision,
        projection_job_id: parse_uuid(&job)?,
        content_sha256: None,
        byte_length: 0,
        accepted_at: now,
        previous_revision_id: None,
        tombstone: true,
    })
}

/// The erasure `revision_id` stands for, with a fresh read-back.
pub(crate) async fn read(pool: &SqlitePool, revision_id: Uuid) -> Result<Option<Erasure>> {
    let Some(row) = sqlx::query("SELECT * FROM erasures WHERE revision_id = ?")
        .bind(revision_id.to_string())
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    let hashes: String = row.try_get("content_sha256")?;
    let content_sha256: Vec<String> = serde_json::from_str(&hashes)
        .map_err(|error| LedgerError::Corrupt(format!("erasure hashes: {error}")))?;
    let dataset: String = row.try_get("dataset")?;
    let source_key: String = row.try_get("source_key")?;
    let erased_at: i64 = row.try_get("erased_at")?;
    // Earlier revisions: accepted before the erasure (later ones are new ingests).
    let remaining = sqlx::query(
        "WITH earlier AS (SELECT id FROM revisions WHERE dataset = ?1 AND source_key = ?2 \
                            AND accepted_at < ?3 \
                            AND id NOT IN (SELECT revision_id FROM erasures)) \
         SELECT (SELECT count(*) FROM earlier) AS revisions, \
           (SELECT count(*) FROM chunks WHERE revision_id IN (SELECT id FROM earlier)) AS chunk_rows, \
           (SELECT count(*) FROM passages WHERE revision_id IN (SELECT id FROM earlier)) AS passages, \
           (SELECT count(*) FROM contents c WHERE c.sha256 IN (SELECT value FROM json_each(?4)) \
              AND NOT EXISTS (SELECT 1 FROM revisions r WHERE r.content_sha256 = c.sha256)) AS contents",
    )
    .bind(&dataset)
    .bind(&source_key)
    .bind(erased_at)
    .bind(&hashes)
    .fetch_one(pool)
    .await?;
    Ok(Some(Erasure {
        revision_id,
        dataset,
        source_key,
        revisions_erased: row.try_get("revisions_erased")?,
        content_sha256,
        contents_deleted: row.try_get("contents_deleted")?,
        chunk_rows_deleted: row.try_get("chunk_rows_deleted")?,
        actor: row.try_get("actor")?,
        reason: row.try_get("reason")?,
        erased_at,
        remaining: ErasureRemaining {
            revisions: remaining.try_get("revisions")?,
            chunk_rows: remaining.try_get("chunk_rows")?,
            passages: remaining.try_get("passages")?,
            contents: remaining.try_get("contents")?,
        },
    }))
}

/// Validity after an erasure: the erased revisions' assertions, rectangles and past passages go (their
/// revisions are deleted already, which the tables' guards require), and the erasure is
/// asserted over all of valid time, so that as known from now on the source held nothing at
/// any time, and as known before now nothing of the erased revisions is left to find.
async fn assert_erasure(
    connection: &mut SqliteConnection,
    request: &ErasureRequest,
    erasure_revision: &str,
    now: Micros,
) -> Result<()> {
    let (dataset, key) = (&request.dataset, &request.source_key);
    for table in ["validity", "assertions", "past_passages", "history_gaps"] {
        sqlx::query(&format!(
            "DELETE FROM {table} WHERE dataset = ?1 AND source_key = ?2 AND revision_id NOT IN \
               (SELECT id FROM revisions WHERE dataset = ?1 AND source_key = ?2)"
        ))
        .bind(dataset)
        .bind(key)
        .execute(&mut *connection)
        .await?;
    }
    let row = sqlx::query(
        "SELECT coalesce(max(seq), 0) AS seq, max(recorded_at) AS last FROM assertions \
         WHERE dataset = ?1 AND source_key = ?2",
    )
    .bind(dataset)
    .bind(key)
    .fetch_one(&mut *connection)
    .await?;
    let recorded_at = crate::validity::record_time(now, row.try_get("last")?);
    let seq: i64 = row.try_get("seq")?;
    sqlx::query(
        "UPDATE validity SET recorded_to = ?3 WHERE dataset = ?1 AND source_key = ?2 \
           AND recorded_to = ?4",
    )
    .bind(dataset)
    .bind(key)
    .bind(recorded_at)
    .bind(crate::validity::OPEN)
    .execute(&mut *connection)
    .await?;
    let assertion = crate::ids::new_v7().to_string();
    sqlx::query(
        "INSERT INTO assertions (id, dataset, source_key, seq, revision_id, valid_from, \
           valid_to, recorded_at, actor, cause) VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, ?7, ?8, 'erased')",
    )
    .bind(&assertion)
    .bind(dataset)
    .bind(key)
    .bind(seq + 1)
    .bind(erasure_revision)
    .bind(crate::validity::OPEN)
    .bind(recorded_at)
    .bind(&request.actor)
    .execute(&mut *connection)
    .await?;
    sqlx::query(
        "INSERT INTO validity (id, dataset, source_key, revision_id, assertion_id, valid_from, \
           valid_to, recorded_from) VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, ?7)",
    )
    .bind(crate::ids::new_v7().to_string())
    .bind(dataset)
    .bind(key)
    .bind(erasure_revision)
    .bind(&assertion)
    .bind(crate::validity::OPEN)
    .bind(recorded_at)
    .execute(&mut *connection)
    .await?;
    Ok(())
}
