//! Projection writes: generations, chunk rows (the relational backend) and receipt states.
//!
//! Every function here runs inside the writer's transaction, like the lease operations. Chunk
//! and receipt writes are fenced: they happen only while the run's lease holds (checked against
//! the current time in the same transaction), so a worker that lost its lease changes nothing.
//!
//! ## Invariants
//! - At most one generation is active. A process may only start on a live generation (or
//!   create the first one); anything else is refused (`generation_mismatch`): a changed model,
//!   dimension, chunker or backend set is built beside the active one
//!   ([`crate::generations`]), never silently mixed in.
//! - A revision's chunk rows in a generation are replaced whole, so a retried run leaves one
//!   set; other generations' rows are untouched.
//! - When a receipt becomes `verified` (or `excluded`), the same backend's verified or
//!   excluded receipts of every other revision of the source in the same generation become
//!   `superseded` (history records it): at most one revision per source is current in each
//!   backend of each generation.

use sqlx::sqlite::SqliteConnection;

use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::model::{ChunkRow, Generation, LeaseToken, ReceiptState, ReceiptUpdate};

/// A projection write, run by the writer.
#[derive(Debug)]
pub(crate) enum ProjectCommand {
    Activate {
        generation: Generation,
        actor: String,
    },
    WriteChunks {
        token: LeaseToken,
        generation: String,
        chunks: Vec<ChunkRow>,
    },
    Receipt {
        token: LeaseToken,
        update: ReceiptUpdate,
    },
    /// A scheduled revision's boundary ([`super::validity::cross`]); `reply` gets whether the
    /// job goes on, once the write is done.
    Cross {
        token: LeaseToken,
        reply: tokio::sync::oneshot::Sender<bool>,
    },
}

/// Runs one projection write.
pub(crate) async fn run(
    connection: &mut SqliteConnection,
    command: ProjectCommand,
    now: Micros,
) -> Result<()> {
    match command {
        ProjectCommand::Activate { generation, actor } => {
            activate(connection, &generation, &actor, now).await
        }
        ProjectCommand::WriteChunks {
            token,
            generation,
            chunks,
        } => write_chunks(connection, &token, &generation, &chunks, now).await,
        ProjectCommand::Receipt { token, update } => {
            receipt(connection, &token, &update, now).await
        }
        ProjectCommand::Cross { token, reply } => {
            let goes_on = super::validity::cross(connection, &token, now).await?;
            // The caller may have gone (its run was cancelled): the write stands either way.
            let _ = reply.send(goes_on);
            Ok(())
        }
    }
}

/// Fault injection ([`crate::faults::FaultPoint::ChunkRowLost`]): deletes the last chunk row
/// the job wrote, as a store that lost a write would.
pub(crate) async fn lose_last_chunk(
    connection: &mut SqliteConnection,
    job_id: uuid::Uuid,
) -> Result<()> {
    sqlx::query(
        "DELETE FROM chunks WHERE (revision_id, generation, chunk_index) IN ( \
           SELECT c.revision_id, c.generation, c.chunk_index FROM chunks c \
           JOIN jobs j ON j.revision_id = c.revision_id \
           WHERE j.id = ? AND c.generation IS coalesce(j.generation, c.generation) \
           ORDER BY c.chunk_index DESC LIMIT 1)",
    )
    .bind(job_id.to_string())
    .execute(&mut *connection)
    .await?;
    Ok(())
}

async fn activate(
    connection: &mut SqliteConnection,
    generation: &Generation,
    actor: &str,
    now: Micros,
) -> Result<()> {
    let state: Option<String> = sqlx::query_scalar("SELECT state FROM generations WHERE id = ?")
        .bind(&generation.id)
        .fetch_optional(&mut *connection)
        .await?;
    let live = state
        .as_deref()
        .map(super::rows::parse_enum::<crate::model::GenerationState>)
        .transpose()?
        .is_some_and(|state| state.is_live());
    if live {
        return Ok(());
    }
    let active: Option<String> =
        sqlx::query_scalar("SELECT id FROM generations WHERE state = 'active'")
            .fetch_optional(&mut *connection)
            .await?;
    match (active, state) {
        (None, None) => {
            super::generations::insert(
                connection,
                generation,
                crate::model::GenerationState::Active,
                actor,
                "first generation",
                now,
            )
            .await
        }
        (active, _) => Err(LedgerError::GenerationMismatch {
            active: active.unwrap_or_else(|| "(none)".to_owned()),
            requested: generation.id.clone(),
        }),
    }
}

async fn write_chunks(
    connection: &mut SqliteConnection,
    token: &LeaseToken,
    generation: &str,
    chunks: &[ChunkRow],
    now: Micros,
) -> Result<()> {
    let job = super::leases::fence(connection, token, now).await?;
    let revision = job.revision()?.to_string();
    sqlx::query("DELETE FROM chunks WHERE revision_id = ? AND generation = ?")
        .bind(&revision)
        .bind(generation)
        .execute(&mut *connection)
        .await?;
    let rows = serde_json::to_string(chunks)
        .map_err(|error| LedgerError::Internal(format!("encoding chunk rows: {error}")))?;
    sqlx::query(
        "INSERT INTO chunks (revision_id, chunk_index, text, byte_start, byte_end, token_count, sha256, generation, \
           section, page) \
         SELECT ?1, value ->> 'chunk_index', value ->> 'text', value ->> 'byte_start', value ->> 'byte_end', \
                value ->> 'token_count', value ->> 'sha256', ?2, value ->> 'section', value ->> 'page' \
         FROM json_each(?3)",
    )
    .bind(&revision)
    .bind(generation)
    .bind(rows)
    .execute(&mut *connection)
    .await?;
    Ok(())
}

async fn receipt(
    connection: &mut SqliteConnection,
    token: &LeaseToken,
    update: &ReceiptUpdate,
    now: Micros,
) -> Result<()> {
    let job = super::leases::fence(connection, token, now).await?;
    let evidence = update.evidence.to_string();
    sqlx::query(
        "INSERT INTO projection_receipts (job_id, backend, state, evidence, updated_at, changed_by, \
           change_cause, changed_at, generation) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?5, ?8) \
         ON CONFLICT (job_id, backend) DO UPDATE SET state = excluded.state, evidence = excluded.evidence, \
           updated_at = excluded.updated_at, changed_by = excluded.changed_by, \
           change_cause = excluded.change_cause, changed_at = excluded.changed_at, \
           generation = excluded.generation, change_seq = change_seq + 1",
    )
    .bind(job.id.to_string())
    .bind(update.backend.as_str())
    .bind(update.state.as_str())
    .bind(&evidence)
    .bind(now)
    .bind(&token.owner)
    .bind(&update.cause)
    .bind(&update.generation)
    .execute(&mut *connection)
    .await?;
    if matches!(
        update.state,
        ReceiptState::Verified | ReceiptState::Excluded
    ) {
        sqlx::query(
            "UPDATE projection_receipts SET state = 'superseded', updated_at = ?1, changed_by = ?2, \
               change_cause = 'superseded_by:' || ?3, changed_at = ?1, change_seq = change_seq + 1 \
             WHERE backend = ?4 AND state IN ('verified', 'excluded') AND generation IS ?7 \
               AND job_id IN (SELECT id FROM jobs WHERE dataset = ?5 AND source_key = ?6 AND revision_id != ?3)",
        )
        .bind(now)
        .bind(&token.owner)
        .bind(job.revision()?.to_string())
        .bind(update.backend.as_str())
        .bind(&job.dataset)
        .bind(&job.source_key)
        .bind(&update.generation)
        .execute(&mut *connection)
        .await?;
    }
    Ok(())
}
