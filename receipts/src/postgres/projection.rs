//! Projection writes on PostgreSQL: generations, chunk rows (the relational backend) and
//! receipt states, with the invariants of `sqlite::projection`. Chunk and receipt writes are
//! fenced: the job row is locked (`FOR UPDATE`) while its lease is checked against `now`, so
//! a concurrent rescue or supersession waits for the write or fences it out.

use async_trait::async_trait;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::{job_from_row, leases::lease_lost, PostgresLedger};
use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::faults::FaultPoint;
use crate::ledger::Projections;
use crate::ledger::CANDIDATES_PER_HASH;
use crate::model::{
    ChunkRef, ChunkRow, ChunkSummary, Generation, GenerationChanged, GenerationCommand,
    GenerationView, Job, LeaseToken, ProjectionReceipt, ReceiptState, ReceiptUpdate, UnitWrite,
};

/// The job, locked, while `token`'s lease holds it at `now`; `lease_lost` otherwise.
async fn fence(connection: &mut PgConnection, token: &LeaseToken, now: Micros) -> Result<Job> {
    let row = sqlx::query(
        "SELECT * FROM jobs WHERE id = $1 AND lease_id = $2 AND state = 'running' \
         AND lease_expires_at > $3 AND deadline_at > $3 FOR UPDATE",
    )
    .bind(token.job_id)
    .bind(&token.lease_id)
    .bind(now)
    .fetch_optional(&mut *connection)
    .await?;
    match row {
        Some(row) => job_from_row(&row),
        None => Err(lease_lost(connection, token, now).await),
    }
}

#[async_trait]
impl Projections for PostgresLedger {
    async fn activate_generation(&self, generation: &Generation, actor: &str) -> Result<()> {
        self.activate(generation, actor).await
    }

    async fn active_generation(&self) -> Result<Option<Generation>> {
        sqlx::query("SELECT * FROM generations WHERE state = 'active'")
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(super::generations::generation_from_row)
            .transpose()
    }

    async fn change_generation(&self, command: GenerationCommand) -> Result<GenerationChanged> {
        self.change(command).await
    }

    async fn generations(&self) -> Result<Vec<GenerationView>> {
        self.list_generations().await
    }

    async fn write_chunks(
        &self,
        lease: &LeaseToken,
        generation: &str,
        chunks: Vec<ChunkRow>,
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        self.chunk_rows(&mut tx, lease, generation, &chunks, now)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn chunk_summaries(
        &self,
        revision_ids: &[Uuid],
        generation: &str,
    ) -> Result<Vec<ChunkSummary>> {
        let rows: Vec<(Uuid, String)> = sqlx::query_as(
            "SELECT revision_id, sha256 FROM chunks WHERE revision_id = ANY($1) \
               AND generation = $2 ORDER BY revision_id, chunk_index",
        )
        .bind(revision_ids)
        .bind(generation)
        .fetch_all(&self.pool)
        .await?;
        Ok(ChunkSummary::by_revision(revision_ids, &rows))
    }

    async fn project_many(&self, writes: Vec<UnitWrite>) -> Vec<Result<()>> {
        let count = writes.len();
        match self.unit(writes).await {
            Ok(results) => results,
            Err(error) => (0..count).map(|_| Err(error.replicate())).collect(),
        }
    }

    async fn chunk_summary(&self, revision_id: Uuid, generation: &str) -> Result<ChunkSummary> {
        let hashes: Vec<String> = sqlx::query_scalar(
            "SELECT sha256 FROM chunks WHERE revision_id = $1 AND generation = $2 \
             ORDER BY chunk_index",
        )
        .bind(revision_id)
        .bind(generation)
        .fetch_all(&self.pool)
        .await?;
        Ok(ChunkSummary::of(hashes.iter().map(String::as_str)))
    }

    async fn chunks(&self, revision_id: Uuid, generation: &str) -> Result<Vec<ChunkRow>> {
        sqlx::query(
            "SELECT chunk_index, text, byte_start, byte_end, token_count, sha256, section, page \
             FROM chunks WHERE revision_id = $1 AND generation = $2 ORDER BY chunk_index",
        )
        .bind(revision_id)
        .bind(generation)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|row| {
            Ok(ChunkRow {
                chunk_index: row.try_get("chunk_index")?,
                text: row.try_get("text")?,
                byte_start: row.try_get("byte_start")?,
                byte_end: row.try_get("byte_end")?,
                token_count: row.try_get("token_count")?,
                sha256: row.try_get("sha256")?,
                section: row.try_get("section")?,
                page: row.try_get("page")?,
            })
        })
        .collect()
    }

    async fn chunks_with_hashes(
        &self,
        dataset: &str,
        generation: &str,
        hashes: &[String],
        except_revision: Uuid,
    ) -> Result<Vec<ChunkRef>> {
        if hashes.is_empty() {
            return Ok(Vec::new());
        }
        sqlx::query(
            "SELECT sha256, revision_id, chunk_index FROM ( \
               SELECT c.sha256, c.revision_id, min(c.chunk_index) AS chunk_index, \
                 row_number() OVER (PARTITION BY c.sha256 \
                   ORDER BY max(r.accepted_at) DESC, c.revision_id) AS rank \
               FROM chunks c JOIN revisions r ON r.id = c.revision_id \
               WHERE c.sha256 = ANY($1) AND c.generation = $2 AND r.dataset = $3 \
                 AND c.revision_id <> $4 \
                 AND EXISTS (SELECT 1 FROM jobs j JOIN projection_receipts p ON p.job_id = j.id \
                             WHERE j.revision_id = c.revision_id AND p.backend = 'vector' \
                               AND p.generation = $2 AND p.state IN ('verified', 'superseded')) \
               GROUP BY c.sha256, c.revision_id) ranked \
             WHERE rank <= $5 ORDER BY sha256, rank",
        )
        .bind(hashes)
        .bind(generation)
        .bind(dataset)
        .bind(except_revision)
        .bind(i64::try_from(CANDIDATES_PER_HASH).unwrap_or(1))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|row| {
            Ok(ChunkRef {
                sha256: row.try_get("sha256")?,
                revision_id: row.try_get("revision_id")?,
                chunk_index: u32::try_from(row.try_get::<i64, _>("chunk_index")?)
                    .map_err(|_| LedgerError::Corrupt("a negative chunk index".to_owned()))?,
            })
        })
        .collect()
    }

    async fn record_receipt(&self, lease: &LeaseToken, update: ReceiptUpdate) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        receipt_row(&mut tx, lease, &update, now).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn receipts(&self, job_id: Uuid) -> Result<Vec<ProjectionReceipt>> {
        self.load_receipts(job_id).await
    }

    async fn cross_boundary(&self, lease: &LeaseToken) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        // The source's advisory lock first, as acceptance takes it before any job row: the
        // two never wait on each other in opposite orders.
        let source: Option<(String, String)> =
            sqlx::query_as("SELECT dataset, source_key FROM jobs WHERE id = $1")
                .bind(lease.job_id)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some((dataset, source_key)) = &source {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(super::acceptance::source_lock(dataset, source_key))
                .execute(&mut *tx)
                .await?;
        }
        let now = self.now(&mut tx).await?;
        let job = fence(&mut tx, lease, now).await?;
        let goes_on = super::validity::cross(&mut tx, &job, lease, now).await?;
        tx.commit().await?;
        Ok(goes_on)
    }
}

impl PostgresLedger {
    /// A revision's chunk rows replaced under `lease` (with the injected faults of a chunk
    /// write), inside the caller's transaction.
    async fn chunk_rows(
        &self,
        tx: &mut PgConnection,
        lease: &LeaseToken,
        generation: &str,
        chunks: &[ChunkRow],
        now: Micros,
    ) -> Result<()> {
        self.fault(FaultPoint::BeforeChunkWrite)?;
        let job = fence(&mut *tx, lease, now).await?;
        let revision = job.revision()?;
        sqlx::query("DELETE FROM chunks WHERE revision_id = $1 AND generation = $2")
            .bind(revision)
            .bind(generation)
            .execute(&mut *tx)
            .await?;
        let rows = serde_json::to_value(chunks)
            .map_err(|error| LedgerError::Internal(format!("encoding chunk rows: {error}")))?;
        sqlx::query(
            "INSERT INTO chunks (revision_id, chunk_index, text, byte_start, byte_end, \
               token_count, sha256, generation, section, page) \
             SELECT $1, c.chunk_index, c.text, c.byte_start, c.byte_end, c.token_count, c.sha256, \
               $2, c.section, c.page \
             FROM jsonb_to_recordset($3::jsonb) AS c(chunk_index bigint, text text, \
               byte_start bigint, byte_end bigint, token_count bigint, sha256 text, \
               section text, page bigint)",
        )
        .bind(revision)
        .bind(generation)
        .bind(rows)
        .execute(&mut *tx)
        .await?;
        if self.faults.fire(FaultPoint::ChunkRowLost) {
            // Fault injection: the last row is lost, as by a store that dropped a write.
            sqlx::query(
                "DELETE FROM chunks WHERE revision_id = $1 AND generation = $2 AND chunk_index = \
                   (SELECT max(chunk_index) FROM chunks WHERE revision_id = $1 AND generation = $2)",
            )
            .bind(revision)
            .bind(generation)
            .execute(&mut *tx)
            .await?;
        }
        Ok(())
    }

    /// A unit's writes in one transaction, a savepoint per job (in job id order, so two
    /// units never lock the same job rows in opposite orders).
    async fn unit(&self, writes: Vec<UnitWrite>) -> Result<Vec<Result<()>>> {
        let mut order: Vec<usize> = (0..writes.len()).collect();
        order.sort_by_key(|index| writes[*index].lease.job_id);
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        let mut results: Vec<Option<Result<()>>> = writes.iter().map(|_| None).collect();
        for index in order {
            let write = &writes[index];
            sqlx::query("SAVEPOINT item").execute(&mut *tx).await?;
            let mut result = Ok(());
            if let Some((generation, chunks)) = &write.chunks {
                result = self
                    .chunk_rows(&mut tx, &write.lease, generation, chunks, now)
                    .await;
            }
            for update in &write.receipts {
                if result.is_err() {
                    break;
                }
                result = receipt_row(&mut tx, &write.lease, update, now).await;
            }
            let end = if result.is_ok() {
                "RELEASE SAVEPOINT item"
            } else {
                "ROLLBACK TO SAVEPOINT item"
            };
            sqlx::query(end).execute(&mut *tx).await?;
            results[index] = Some(result);
        }
        tx.commit().await?;
        Ok(results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    Err(LedgerError::Internal("a unit write was not run".to_owned()))
                })
            })
            .collect())
    }
}

/// A receipt update under `lease`, inside the caller's transaction: the receipt, and the
/// source's other revisions' receipts superseded when it is verified or excluded.
async fn receipt_row(
    tx: &mut PgConnection,
    lease: &LeaseToken,
    update: &ReceiptUpdate,
    now: Micros,
) -> Result<()> {
    let job = fence(&mut *tx, lease, now).await?;
    sqlx::query(
        "INSERT INTO projection_receipts AS r (job_id, backend, state, evidence, updated_at, \
               changed_by, change_cause, changed_at, generation) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $5, $8) \
             ON CONFLICT (job_id, backend) DO UPDATE SET state = excluded.state, \
               evidence = excluded.evidence, updated_at = excluded.updated_at, \
               changed_by = excluded.changed_by, change_cause = excluded.change_cause, \
               changed_at = excluded.changed_at, generation = excluded.generation, \
               change_seq = r.change_seq + 1",
    )
    .bind(job.id)
    .bind(update.backend.as_str())
    .bind(update.state.as_str())
    .bind(&update.evidence)
    .bind(now)
    .bind(&lease.owner)
    .bind(&update.cause)
    .bind(&update.generation)
    .execute(&mut *tx)
    .await?;
    if matches!(
        update.state,
        ReceiptState::Verified | ReceiptState::Excluded
    ) {
        sqlx::query(
                "UPDATE projection_receipts SET state = 'superseded', updated_at = $1, \
                   changed_by = $2, change_cause = 'superseded_by:' || $3::text, changed_at = $1, \
                   change_seq = change_seq + 1 \
                 WHERE backend = $4 AND state IN ('verified', 'excluded') \
                   AND generation IS NOT DISTINCT FROM $7 AND job_id IN (SELECT id FROM jobs WHERE dataset = $5 AND source_key = $6 \
                                  AND revision_id <> $3)",
            )
            .bind(now)
            .bind(&lease.owner)
            .bind(job.revision()?)
            .bind(update.backend.as_str())
            .bind(&job.dataset)
            .bind(&job.source_key)
            .bind(&update.generation)
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}
