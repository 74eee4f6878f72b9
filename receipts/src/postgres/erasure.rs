//! Erasure on PostgreSQL, with the semantics of `sqlite::erasure`: one transaction, holding
//! the source's advisory lock (the one acceptance takes), deletes every trace of the source's
//! revisions and queues the jobs that erase the stores.
//!
//! Deleted rows stay in the table files as dead tuples until `VACUUM` reclaims them
//! (autovacuum, or `VACUUM (FULL)` for a legal deadline): PostgreSQL's storage, not cairn's
//! choice; the README says so.

use sqlx::Row;
use uuid::Uuid;

use super::acceptance::source_lock;
use super::{PostgresLedger, WORK_CHANNEL};
use crate::error::{LedgerError, Result};
use crate::model::{AcceptStatus, Acceptance, Backend, Erasure, ErasureRemaining, ErasureRequest};

impl PostgresLedger {
    /// [`crate::Acceptor::erase`].
    pub(crate) async fn erase_source(&self, request: ErasureRequest) -> Result<Acceptance> {
        crate::validate::erasure_request(&request)?;
        // Journalled before it is committed: a restore from an older backup makes it again.
        self.journal(|now| Some(crate::journal::JournalEntry::erasure(&request, now)))
            .await?;
        let (dataset, key) = (&request.dataset, &request.source_key);
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(source_lock(dataset, key))
            .execute(&mut *tx)
            .await?;
        let now = self.now(&mut tx).await?;
        let exists: Option<Uuid> = sqlx::query_scalar(
            "SELECT head_revision_id FROM sources WHERE dataset = $1 AND source_key = $2 \
             FOR UPDATE",
        )
        .bind(dataset)
        .bind(key)
        .fetch_optional(&mut *tx)
        .await?;
        if exists.is_none() {
            return Err(LedgerError::SourceNotFound {
                dataset: dataset.clone(),
                source_key: key.clone(),
            });
        }
        let hashes: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT content_sha256 FROM revisions \
             WHERE dataset = $1 AND source_key = $2 AND content_sha256 IS NOT NULL ORDER BY 1",
        )
        .bind(dataset)
        .bind(key)
        .fetch_all(&mut *tx)
        .await?;
        let revision = Uuid::now_v7();
        sqlx::query(
            "INSERT INTO revisions (id, dataset, source_key, content_sha256, byte_length, \
               media_type, tags, metadata, tombstone, previous_revision_id, actor, reason, \
               accepted_at) \
             VALUES ($1, $2, $3, NULL, 0, 'text/plain', '[]', '{}', true, NULL, $4, $5, $6)",
        )
        .bind(revision)
        .bind(dataset)
        .bind(key)
        .bind(&request.actor)
        .bind(&request.reason)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE sources SET head_revision_id = $3, changed_by = $4, change_cause = $5, \
               changed_at = GREATEST($6, changed_at), change_seq = change_seq + 1 \
             WHERE dataset = $1 AND source_key = $2",
        )
        .bind(dataset)
        .bind(key)
        .bind(revision)
        .bind(&request.actor)
        .bind(format!("erased: {}", request.reason))
        .bind(now)
        .execute(&mut *tx)
        .await?;
        // Earlier erasures stay: each keeps its record and its jobs.
        let earlier = "SELECT id FROM revisions WHERE dataset = $1 AND source_key = $2 \
                       AND id <> $3 AND id NOT IN (SELECT revision_id FROM erasures)";
        sqlx::query(&format!(
            "DELETE FROM projection_receipts WHERE job_id IN \
               (SELECT id FROM jobs WHERE revision_id IN ({earlier}))"
        ))
        .bind(dataset)
        .bind(key)
        .bind(revision)
        .execute(&mut *tx)
        .await?;
        sqlx::query(&format!(
            "DELETE FROM jobs WHERE revision_id IN ({earlier})"
        ))
        .bind(dataset)
        .bind(key)
        .bind(revision)
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM passages WHERE dataset = $1 AND source_key = $2")
            .bind(dataset)
            .bind(key)
            .execute(&mut *tx)
            .await?;
        let chunk_rows = sqlx::query(&format!(
            "DELETE FROM chunks WHERE revision_id IN ({earlier})"
        ))
        .bind(dataset)
        .bind(key)
        .bind(revision)
        .execute(&mut *tx)
        .await?
        .rows_affected() as i64;
        sqlx::query(&format!(
            "DELETE FROM searchable_revisions WHERE revision_id IN ({earlier})"
        ))
        .bind(dataset)
        .bind(key)
        .bind(revision)
        .execute(&mut *tx)
        .await?;
        let revisions = sqlx::query(&format!("DELETE FROM revisions WHERE id IN ({earlier})"))
            .bind(dataset)
            .bind(key)
            .bind(revision)
            .execute(&mut *tx)
            .await?
            .rows_affected() as i64;
        assert_erasure(&mut tx, &request, revision, now).await?;
        let contents = sqlx::query(
            "DELETE FROM contents c WHERE c.sha256 = ANY($1) \
               AND NOT EXISTS (SELECT 1 FROM revisions r WHERE r.content_sha256 = c.sha256)",
        )
        .bind(&hashes)
        .execute(&mut *tx)
        .await?
        .rows_affected() as i64;
        sqlx::query(
            "INSERT INTO erasures (revision_id, dataset, source_key, revisions_erased, \
               content_sha256, contents_deleted, chunk_rows_deleted, actor, reason, erased_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(revision)
        .bind(dataset)
        .bind(key)
        .bind(revisions)
        .bind(serde_json::json!(hashes))
        .bind(contents)
        .bind(chunk_rows)
        .bind(&request.actor)
        .bind(&request.reason)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let cause = format!("erase: {}", request.reason);
        let own: Vec<String> = self
            .options
            .backends
            .iter()
            .filter(|backend| **backend != Backend::Graph)
            .map(|backend| backend.as_str().to_owned())
            .collect();
        let policies = &self.options.job_policies;
        let job: Uuid = sqlx::query_scalar(
            "WITH targets AS ( \
               SELECT id, state, backends FROM generations \
               WHERE state IN ('building', 'active', 'standby') \
               UNION ALL SELECT NULL, 'active', NULL WHERE NOT EXISTS \
                 (SELECT 1 FROM generations WHERE state = 'active')), \
             queued AS ( \
               INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, attempt, \
                 max_attempts, run_at, created_at, changed_by, change_cause, changed_at, \
                 generation) \
               SELECT gen_random_uuid(), $1, $2, $3, 'tombstone', 'pending', 0, $4, $5, $5, \
                 $6, $7, $5, t.id FROM targets t \
               RETURNING id, generation), \
             receipts AS ( \
               INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, \
                 change_cause, changed_at) \
               SELECT q.id, b.value, 'pending', $5, $6, $7, $5 \
               FROM queued q LEFT JOIN generations g ON g.id = q.generation \
               CROSS JOIN jsonb_array_elements_text(coalesce(g.backends, $8::jsonb)) \
                 AS b(value) \
               WHERE b.value <> 'graph') \
             SELECT q.id FROM queued q LEFT JOIN generations g ON g.id = q.generation \
             ORDER BY (g.state IS NOT DISTINCT FROM 'active') DESC LIMIT 1",
        )
        .bind(revision)
        .bind(dataset)
        .bind(key)
        .bind(policies.tombstone.max_attempts)
        .bind(now)
        .bind(&request.actor)
        .bind(&cause)
        .bind(serde_json::json!(own))
        .fetch_one(&mut *tx)
        .await?;
        if self.options.backends.contains(&Backend::Graph) {
            sqlx::query(
                "WITH queued AS ( \
                   INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, attempt, \
                     max_attempts, run_at, created_at, changed_by, change_cause, changed_at) \
                   VALUES (gen_random_uuid(), $1, $2, $3, 'graph', 'pending', 0, $4, $5, $5, \
                     $6, $7, $5) RETURNING id) \
                 INSERT INTO projection_receipts (job_id, backend, state, updated_at, \
                   changed_by, change_cause, changed_at) \
                 SELECT id, 'graph', 'pending', $5, $6, $7, $5 FROM queued",
            )
            .bind(revision)
            .bind(dataset)
            .bind(key)
            .bind(policies.graph.max_attempts)
            .bind(now)
            .bind(&request.actor)
            .bind(&cause)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(WORK_CHANNEL)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Acceptance {
            accepted: true,
            status: AcceptStatus::QueuedNotConfirmed,
            dataset: dataset.clone(),
            source_key: key.clone(),
            source_revision_id: revision,
            projection_job_id: job,
            content_sha256: None,
            byte_length: 0,
            accepted_at: now,
            previous_revision_id: None,
            tombstone: true,
        })
    }

    /// [`crate::Reader::erasure`].
    pub(crate) async fn read_erasure(&self, revision_id: Uuid) -> Result<Option<Erasure>> {
        let Some(row) = sqlx::query("SELECT * FROM erasures WHERE revision_id = $1")
            .bind(revision_id)
            .fetch_optional(&self.pool)
            .await?
        else {
            return Ok(None);
        };
        let hashes: serde_json::Value = row.try_get("content_sha256")?;
        let content_sha256: Vec<String> = serde_json::from_value(hashes)
            .map_err(|error| LedgerError::Corrupt(format!("erasure hashes: {error}")))?;
        let dataset: String = row.try_get("dataset")?;
        let source_key: String = row.try_get("source_key")?;
        let erased_at: i64 = row.try_get("erased_at")?;
        let remaining = sqlx::query(
            "WITH earlier AS (SELECT id FROM revisions WHERE dataset = $1 AND source_key = $2 \
                                AND accepted_at < $3 \
                                AND id NOT IN (SELECT revision_id FROM erasures)) \
             SELECT (SELECT count(*) FROM earlier) AS revisions, \
               (SELECT count(*) FROM chunks WHERE revision_id IN (SELECT id FROM earlier)) \
                 AS chunk_rows, \
               (SELECT count(*) FROM passages WHERE revision_id IN (SELECT id FROM earlier)) \
                 AS passages, \
               (SELECT count(*) FROM contents c WHERE c.sha256 = ANY($4) \
                  AND NOT EXISTS (SELECT 1 FROM revisions r WHERE r.content_sha256 = c.sha256)) \
                 AS contents",
        )
        .bind(&dataset)
        .bind(&source_key)
        .bind(erased_at)
        .bind(&content_sha256)
        .fetch_one(&self.pool)
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
}

/// Validity after an erasure, as on SQLite (`sqlite::erasure::assert_erasure`): the erased
/// revisions' assertions, rectangles and past passages go, and the erasure is asserted over all of valid time.
async fn assert_erasure(
    tx: &mut sqlx::PgConnection,
    request: &crate::model::ErasureRequest,
    erasure_revision: Uuid,
    now: crate::clock::Micros,
) -> Result<()> {
    let (dataset, key) = (&request.dataset, &request.source_key);
    for table in ["validity", "assertions", "past_passages", "history_gaps"] {
        sqlx::query(&format!(
            "DELETE FROM {table} WHERE dataset = $1 AND source_key = $2 AND revision_id NOT IN \
               (SELECT id FROM revisions WHERE dataset = $1 AND source_key = $2)"
        ))
        .bind(dataset)
        .bind(key)
        .execute(&mut *tx)
        .await?;
    }
    let row = sqlx::query(
        "SELECT coalesce(max(seq), 0) AS seq, max(recorded_at) AS last FROM assertions \
         WHERE dataset = $1 AND source_key = $2",
    )
    .bind(dataset)
    .bind(key)
    .fetch_one(&mut *tx)
    .await?;
    let recorded_at = crate::validity::record_time(now, row.try_get("last")?);
    let seq: i64 = row.try_get("seq")?;
    sqlx::query(
        "UPDATE validity SET recorded_to = $3 WHERE dataset = $1 AND source_key = $2 \
           AND recorded_to = $4",
    )
    .bind(dataset)
    .bind(key)
    .bind(recorded_at)
    .bind(crate::validity::OPEN)
    .execute(&mut *tx)
    .await?;
    let assertion = crate::ids::new_v7();
    sqlx::query(
        "INSERT INTO assertions (id, dataset, source_key, seq, revision_id, valid_from, \
           valid_to, recorded_at, actor, cause) VALUES ($1, $2, $3, $4, $5, 0, $6, $7, $8, 'erased')",
    )
    .bind(assertion)
    .bind(dataset)
    .bind(key)
    .bind(seq + 1)
    .bind(erasure_revision)
    .bind(crate::validity::OPEN)
    .bind(recorded_at)
    .bind(&request.actor)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO validity (id, dataset, source_key, revision_id, assertion_id, valid_from, \
           valid_to, recorded_from) VALUES ($1, $2, $3, $4, $5, 0, $6, $7)",
    )
    .bind(crate::ids::new_v7())
    .bind(dataset)
    .bind(key)
    .bind(erasure_revision)
    .bind(assertion)
    .bind(crate::validity::OPEN)
    .bind(recorded_at)
    .execute(&mut *tx)
    .await?;
    Ok(())
}
