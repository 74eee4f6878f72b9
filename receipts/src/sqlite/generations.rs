//! Generations on SQLite: the one path for their state changes ([`change`], run by the writer
//! in its transaction, so a change and the jobs it queues or cancels commit together) and
//! their progress. History is written by the `generations` triggers.

use async_trait::async_trait;
use sqlx::sqlite::SqliteConnection;
use sqlx::Row;

use super::rows::json_text;
use super::rows::parse_enum;
use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::generations::{GenerationWrites, MISSING_SAMPLE};
use crate::model::{
    Generation, GenerationChanged, GenerationCommand, GenerationProgress, GenerationState,
    GenerationView,
};

/// A random version-4 UUID in SQL (job ids of jobs queued by a statement).
pub(crate) const SQL_UUID: &str = "lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' \
     || substr(hex(randomblob(2)), 2) || '-' || substr('89ab', 1 + abs(random() % 4), 1) \
     || substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(6)))";

/// Heads (current, not deleted) of every dataset, as `head` rows with `dataset`, `source_key`
/// and `revision_id`; and whether one is verified in generation `?1` for every backend it holds.
const HEADS: &str = "WITH head AS ( \
       SELECT s.dataset, s.source_key, s.head_revision_id AS revision_id \
       FROM sources s JOIN revisions r ON r.id = s.head_revision_id WHERE r.tombstone = 0), \
     covered AS ( \
       SELECT head.*, NOT EXISTS ( \
         SELECT 1 FROM generations g, json_each(g.backends) AS b \
         WHERE g.id = ?1 AND b.value <> 'graph' AND NOT EXISTS ( \
           SELECT 1 FROM jobs j JOIN projection_receipts p ON p.job_id = j.id \
           WHERE j.revision_id = head.revision_id AND p.backend = b.value \
             AND p.state = 'verified' AND p.generation = ?1)) AS verified \
       FROM head) ";

async fn state_of(connection: &mut SqliteConnection, id: &str) -> Result<Option<GenerationState>> {
    let state: Option<String> = sqlx::query_scalar("SELECT state FROM generations WHERE id = ?")
        .bind(id)
        .fetch_optional(&mut *connection)
        .await?;
    state.as_deref().map(parse_enum).transpose()
}

async fn set_state(
    connection: &mut SqliteConnection,
    id: &str,
    state: GenerationState,
    actor: &str,
    cause: &str,
    now: Micros,
) -> Result<()> {
    sqlx::query(
        "UPDATE generations SET state = ?2, changed_by = ?3, change_cause = ?4, changed_at = ?5, \
           change_seq = change_seq + 1 WHERE id = ?1",
    )
    .bind(id)
    .bind(state.as_str())
    .bind(actor)
    .bind(cause)
    .bind(now)
    .execute(&mut *connection)
    .await?;
    Ok(())
}

/// Applies one generation change: the domain's state machine
/// ([`crate::generations::change`]) over this connection's writes.
pub(crate) async fn change(
    connection: &mut SqliteConnection,
    command: GenerationCommand,
    now: Micros,
) -> Result<GenerationChanged> {
    crate::generations::change(&mut Writes(connection), command, now).await
}

/// A generation change's reads and writes on SQLite, in the writer's transaction.
struct Writes<'c>(&'c mut SqliteConnection);

#[async_trait]
impl GenerationWrites for Writes<'_> {
    async fn state_of(&mut self, id: &str) -> Result<Option<GenerationState>> {
        state_of(self.0, id).await
    }

    async fn in_state(&mut self, state: GenerationState) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT id FROM generations WHERE state = ?")
                .bind(state.as_str())
                .fetch_optional(&mut *self.0)
                .await?,
        )
    }

    async fn missing_heads(&mut self, id: &str) -> Result<(i64, Vec<String>)> {
        missing(self.0, id).await
    }

    async fn set_state(
        &mut self,
        id: &str,
        state: GenerationState,
        actor: &str,
        cause: &str,
        now: Micros,
    ) -> Result<()> {
        set_state(self.0, id, state, actor, cause, now).await
    }

    async fn insert(
        &mut self,
        generation: &Generation,
        state: GenerationState,
        actor: &str,
        cause: &str,
        now: Micros,
    ) -> Result<()> {
        insert(self.0, generation, state, actor, cause, now).await
    }

    async fn clear_retired_evidence(&mut self, id: &str) -> Result<()> {
        sqlx::query("UPDATE generations SET retired_evidence = NULL WHERE id = ?")
            .bind(id)
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn queue_rebuild(
        &mut self,
        generation: &Generation,
        priority: i64,
        actor: &str,
        cause: &str,
        now: Micros,
    ) -> Result<i64> {
        let queued = sqlx::query(&format!(
            "INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, priority, \
               attempt, max_attempts, run_at, created_at, changed_by, change_cause, changed_at, \
               generation) \
             SELECT {SQL_UUID}, s.head_revision_id, s.dataset, s.source_key, 'project', \
               'pending', ?2, 0, (SELECT max_attempts FROM job_policies WHERE kind = 'project'), \
               ?3, ?3, ?4, ?5, ?3, ?1 \
             FROM sources s JOIN revisions r ON r.id = s.head_revision_id WHERE r.tombstone = 0"
        ))
        .bind(&generation.id)
        .bind(priority)
        .bind(now)
        .bind(actor)
        .bind(cause)
        .execute(&mut *self.0)
        .await?
        .rows_affected() as i64;
        sqlx::query(
            "INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, \
               change_cause, changed_at) \
             SELECT j.id, b.value, 'pending', ?2, j.changed_by, j.change_cause, ?2 \
             FROM jobs j JOIN generations g ON g.id = j.generation, json_each(g.backends) AS b \
             WHERE j.generation = ?1 AND j.state = 'pending' AND b.value <> 'graph' \
               AND NOT EXISTS (SELECT 1 FROM projection_receipts p WHERE p.job_id = j.id)",
        )
        .bind(&generation.id)
        .bind(now)
        .execute(&mut *self.0)
        .await?;
        // The writer wakes the workers after its commit.
        Ok(queued)
    }

    async fn stop_work(
        &mut self,
        id: &str,
        actor: &str,
        cause: &str,
        now: Micros,
    ) -> Result<(i64, i64)> {
        sqlx::query(
            "UPDATE projection_receipts SET state = 'superseded', updated_at = ?2, \
               changed_by = ?3, change_cause = ?4, changed_at = ?2, change_seq = change_seq + 1 \
             WHERE state IN ('pending', 'running', 'written', 'verified', 'excluded') \
               AND job_id IN (SELECT id FROM jobs WHERE generation = ?1)",
        )
        .bind(id)
        .bind(now)
        .bind(actor)
        .bind(cause)
        .execute(&mut *self.0)
        .await?;
        let jobs = sqlx::query(
            "UPDATE jobs SET state = 'cancelled', lease_id = NULL, lease_owner = NULL, \
               lease_expires_at = NULL, changed_by = ?3, change_cause = ?4, changed_at = ?2, \
               change_seq = change_seq + 1 \
             WHERE generation = ?1 AND state IN ('pending', 'running', 'retry_wait')",
        )
        .bind(id)
        .bind(now)
        .bind(actor)
        .bind(cause)
        .execute(&mut *self.0)
        .await?
        .rows_affected() as i64;
        let rows = sqlx::query("DELETE FROM chunks WHERE generation = ?")
            .bind(id)
            .execute(&mut *self.0)
            .await?
            .rows_affected() as i64;
        sqlx::query("DELETE FROM searchable_revisions WHERE generation = ?")
            .bind(id)
            .execute(&mut *self.0)
            .await?;
        Ok((jobs, rows))
    }

    async fn chunk_rows(&mut self, id: &str) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM chunks WHERE generation = ?")
                .bind(id)
                .fetch_one(&mut *self.0)
                .await?,
        )
    }

    async fn record_retired(&mut self, id: &str, evidence: &serde_json::Value) -> Result<()> {
        sqlx::query("UPDATE generations SET retired_evidence = ?2 WHERE id = ?1")
            .bind(id)
            .bind(json_text(evidence))
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }

    async fn view(&mut self, id: &str, now: Micros) -> Result<GenerationView> {
        view(self.0, id, now).await
    }
}

/// Records a generation row (a new build, or the first generation of a new ledger).
pub(crate) async fn insert(
    connection: &mut SqliteConnection,
    generation: &Generation,
    state: GenerationState,
    actor: &str,
    cause: &str,
    now: Micros,
) -> Result<()> {
    let backends: Vec<&str> = generation.backends.iter().map(|b| b.as_str()).collect();
    sqlx::query(
        "INSERT INTO generations (id, model, dimension, chunker, backends, state, created_at, \
           created_by, changed_by, change_cause, changed_at, vector_layout) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?9, ?7, ?10)",
    )
    .bind(&generation.id)
    .bind(&generation.model)
    .bind(generation.dimension)
    .bind(&generation.chunker)
    .bind(json_text(&backends))
    .bind(state.as_str())
    .bind(now)
    .bind(actor)
    .bind(cause)
    .bind(&generation.vector_layout)
    .execute(&mut *connection)
    .await?;
    Ok(())
}

/// Current heads not verified in `id`: their count and a sample.
async fn missing(connection: &mut SqliteConnection, id: &str) -> Result<(i64, Vec<String>)> {
    let rows = sqlx::query(&format!(
        "{HEADS} SELECT dataset || '/' || source_key AS name, count(*) OVER () AS missing \
         FROM covered WHERE NOT verified ORDER BY dataset, source_key LIMIT {MISSING_SAMPLE}"
    ))
    .bind(id)
    .fetch_all(&mut *connection)
    .await?;
    let count = match rows.first() {
        Some(row) => row.try_get("missing")?,
        None => 0,
    };
    let sample = rows
        .iter()
        .map(|row| row.try_get("name"))
        .collect::<std::result::Result<_, _>>()?;
    Ok((count, sample))
}

async fn progress(
    connection: &mut SqliteConnection,
    id: &str,
    now: Micros,
) -> Result<GenerationProgress> {
    let row = sqlx::query(&format!(
        "{HEADS} SELECT count(*) AS heads, coalesce(sum(verified), 0) AS verified, \
           (SELECT count(DISTINCT j.revision_id) FROM jobs j \
              JOIN sources s ON s.head_revision_id = j.revision_id \
              WHERE j.generation = ?1 AND j.state IN ('dead', 'quarantined') \
                AND NOT EXISTS (SELECT 1 FROM covered c WHERE c.revision_id = j.revision_id \
                                AND c.verified)) AS failed, \
           (SELECT count(*) FROM jobs WHERE generation = ?1 \
              AND state IN ('pending', 'running', 'retry_wait')) AS open_jobs, \
           (SELECT count(*) FROM jobs WHERE generation = ?1 AND state = 'completed' \
              AND changed_at > ?2) AS recent \
         FROM covered"
    ))
    .bind(id)
    .bind(now - 60_000_000)
    .fetch_one(&mut *connection)
    .await?;
    Ok(GenerationProgress {
        heads: row.try_get("heads")?,
        verified: row.try_get("verified")?,
        failed: row.try_get("failed")?,
        open_jobs: row.try_get("open_jobs")?,
        rate_per_s: row.try_get::<i64, _>("recent")? as f64 / 60.0,
        eta_s: None,
    }
    .with_eta())
}

fn view_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<GenerationView> {
    let generation = generation_from_row(row)?;
    let evidence: Option<String> = row.try_get("retired_evidence")?;
    Ok(GenerationView {
        id: generation.id,
        model: generation.model,
        dimension: generation.dimension,
        chunker: generation.chunker,
        backends: generation.backends,
        vector_layout: generation.vector_layout,
        state: parse_enum(&row.try_get::<String, _>("state")?)?,
        created_at: row.try_get("created_at")?,
        created_by: row.try_get("created_by")?,
        changed_at: row.try_get("changed_at")?,
        changed_by: row.try_get("changed_by")?,
        change_cause: row.try_get("change_cause")?,
        progress: GenerationProgress::default(),
        retired_evidence: evidence
            .map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(|error| LedgerError::Corrupt(format!("retired evidence: {error}")))?,
    })
}

async fn view(connection: &mut SqliteConnection, id: &str, now: Micros) -> Result<GenerationView> {
    let row = sqlx::query("SELECT * FROM generations WHERE id = ?")
        .bind(id)
        .fetch_optional(&mut *connection)
        .await?
        .ok_or_else(|| LedgerError::GenerationNotFound(id.to_owned()))?;
    let mut view = view_from_row(&row)?;
    if view.state.is_live() {
        view.progress = progress(connection, id, now).await?;
    }
    Ok(view)
}

/// Every generation, newest first, with progress for the live ones.
pub(crate) async fn list(
    connection: &mut SqliteConnection,
    now: Micros,
) -> Result<Vec<GenerationView>> {
    let ids: Vec<String> =
        sqlx::query_scalar("SELECT id FROM generations ORDER BY created_at DESC, id")
            .fetch_all(&mut *connection)
            .await?;
    let mut views = Vec::with_capacity(ids.len());
    for id in ids {
        views.push(view(connection, &id, now).await?);
    }
    Ok(views)
}

/// A generation from its `generations` row.
pub(crate) fn generation_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<Generation> {
    let backends: String = row.try_get("backends")?;
    let names: Vec<String> = serde_json::from_str(&backends)
        .map_err(|error| LedgerError::Corrupt(format!("generation backends: {error}")))?;
    let backends = names
        .iter()
        .map(|name| {
            name.parse()
                .map_err(|error| LedgerError::Corrupt(format!("generation backend: {error}")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Generation {
        id: row.try_get("id")?,
        model: row.try_get("model")?,
        dimension: row.try_get("dimension")?,
        chunker: row.try_get("chunker")?,
        backends,
        vector_layout: row.try_get("vector_layout")?,
    })
}
