//! Generations on PostgreSQL: the one path for their state changes, with the semantics of
//! `sqlite::generations`, and their progress. History is written by the `generations`
//! trigger.
//!
//! ## Concurrency
//! A change locks `generations` (one change at a time, whichever process asks). Create and
//! retire also take `sources` in SHARE mode: acceptances in flight (which hold it in ROW
//! EXCLUSIVE mode from their head move on) commit first, later ones wait for this change. An
//! acceptance's job statement runs after its head move, so it sees the generations as this
//! change left them: no acceptance can miss a generation being built, or queue work for one
//! being retired.

use async_trait::async_trait;
use sqlx::{PgConnection, Row};

use super::{parse_enum, PostgresLedger, WORK_CHANNEL};
use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::generations::{GenerationWrites, MISSING_SAMPLE};
use crate::model::{
    Backend, Generation, GenerationChange, GenerationChanged, GenerationCommand,
    GenerationProgress, GenerationState, GenerationView,
};

/// Heads (current, not deleted) as `covered` rows with `dataset`, `source_key`, `revision_id`
/// and whether the head is verified in generation `$1` for every backend it holds.
const HEADS: &str = "WITH head AS ( \
       SELECT s.dataset, s.source_key, s.head_revision_id AS revision_id \
       FROM sources s JOIN revisions r ON r.id = s.head_revision_id WHERE NOT r.tombstone), \
     covered AS ( \
       SELECT head.*, NOT EXISTS ( \
         SELECT 1 FROM generations g, jsonb_array_elements_text(g.backends) AS b(value) \
         WHERE g.id = $1 AND b.value <> 'graph' AND NOT EXISTS ( \
           SELECT 1 FROM jobs j JOIN projection_receipts p ON p.job_id = j.id \
           WHERE j.revision_id = head.revision_id AND p.backend = b.value \
             AND p.state = 'verified' AND p.generation = $1)) AS verified \
       FROM head) ";

pub(crate) fn generation_from_row(row: &sqlx::postgres::PgRow) -> Result<Generation> {
    let names: Vec<String> = serde_json::from_value(row.try_get("backends")?)
        .map_err(|error| LedgerError::Corrupt(format!("generation backends: {error}")))?;
    let backends = names
        .iter()
        .map(|name| parse_enum::<Backend>(name))
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

async fn state_of(connection: &mut PgConnection, id: &str) -> Result<Option<GenerationState>> {
    let state: Option<String> = sqlx::query_scalar("SELECT state FROM generations WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut *connection)
        .await?;
    state.as_deref().map(parse_enum).transpose()
}

async fn set_state(
    connection: &mut PgConnection,
    id: &str,
    state: GenerationState,
    actor: &str,
    cause: &str,
    now: Micros,
) -> Result<()> {
    sqlx::query(
        "UPDATE generations SET state = $2, changed_by = $3, change_cause = $4, changed_at = $5, \
           change_seq = change_seq + 1 WHERE id = $1",
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

/// Records a generation row (a new build, or the first generation of a new ledger).
pub(crate) async fn insert(
    connection: &mut PgConnection,
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
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $9, $7, $10)",
    )
    .bind(&generation.id)
    .bind(&generation.model)
    .bind(generation.dimension)
    .bind(&generation.chunker)
    .bind(serde_json::json!(backends))
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
async fn missing(connection: &mut PgConnection, id: &str) -> Result<(i64, Vec<String>)> {
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
    connection: &mut PgConnection,
    id: &str,
    now: Micros,
) -> Result<GenerationProgress> {
    let row = sqlx::query(&format!(
        "{HEADS} SELECT count(*) AS heads, count(*) FILTER (WHERE verified) AS verified, \
           (SELECT count(DISTINCT j.revision_id) FROM jobs j \
              JOIN sources s ON s.head_revision_id = j.revision_id \
              WHERE j.generation = $1 AND j.state IN ('dead', 'quarantined') \
                AND NOT EXISTS (SELECT 1 FROM covered c WHERE c.revision_id = j.revision_id \
                                AND c.verified)) AS failed, \
           (SELECT count(*) FROM jobs WHERE generation = $1 \
              AND state IN ('pending', 'running', 'retry_wait')) AS open_jobs, \
           (SELECT count(*) FROM jobs WHERE generation = $1 AND state = 'completed' \
              AND changed_at > $2) AS recent \
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

async fn view(connection: &mut PgConnection, id: &str, now: Micros) -> Result<GenerationView> {
    let row = sqlx::query("SELECT * FROM generations WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut *connection)
        .await?
        .ok_or_else(|| LedgerError::GenerationNotFound(id.to_owned()))?;
    let generation = generation_from_row(&row)?;
    let state: GenerationState = parse_enum(&row.try_get::<String, _>("state")?)?;
    let progress = if state.is_live() {
        progress(connection, id, now).await?
    } else {
        GenerationProgress::default()
    };
    Ok(GenerationView {
        id: generation.id,
        model: generation.model,
        dimension: generation.dimension,
        chunker: generation.chunker,
        backends: generation.backends,
        vector_layout: generation.vector_layout,
        state,
        created_at: row.try_get("created_at")?,
        created_by: row.try_get("created_by")?,
        changed_at: row.try_get("changed_at")?,
        changed_by: row.try_get("changed_by")?,
        change_cause: row.try_get("change_cause")?,
        progress,
        retired_evidence: row.try_get("retired_evidence")?,
    })
}

impl PostgresLedger {
    /// The first generation of a new ledger, or a check that `generation` is live.
    pub(crate) async fn activate(&self, generation: &Generation, actor: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        // One generation change at a time, whichever process asks.
        sqlx::query("LOCK TABLE generations IN SHARE ROW EXCLUSIVE MODE")
            .execute(&mut *tx)
            .await?;
        if state_of(&mut tx, &generation.id)
            .await?
            .is_some_and(GenerationState::is_live)
        {
            return Ok(());
        }
        let known = state_of(&mut tx, &generation.id).await?.is_some();
        let active: Option<String> =
            sqlx::query_scalar("SELECT id FROM generations WHERE state = 'active'")
                .fetch_optional(&mut *tx)
                .await?;
        if known || active.is_some() {
            return Err(LedgerError::GenerationMismatch {
                active: active.unwrap_or_else(|| "(none)".to_owned()),
                requested: generation.id.clone(),
            });
        }
        let now = self.now(&mut tx).await?;
        insert(
            &mut tx,
            generation,
            GenerationState::Active,
            actor,
            "first generation",
            now,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Every generation, newest first.
    pub(crate) async fn list_generations(&self) -> Result<Vec<GenerationView>> {
        let mut connection = self.pool.acquire().await?;
        let now = self.now(&mut connection).await?;
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT id FROM generations ORDER BY created_at DESC, id")
                .fetch_all(&mut *connection)
                .await?;
        let mut views = Vec::with_capacity(ids.len());
        for id in ids {
            views.push(view(&mut connection, &id, now).await?);
        }
        Ok(views)
    }

    /// Applies one generation change in one transaction.
    pub(crate) async fn change(&self, command: GenerationCommand) -> Result<GenerationChanged> {
        let GenerationCommand {
            change,
            actor,
            reason,
        } = command;
        let mut tx = self.pool.begin().await?;
        sqlx::query("LOCK TABLE generations IN SHARE ROW EXCLUSIVE MODE")
            .execute(&mut *tx)
            .await?;
        if matches!(
            change,
            GenerationChange::Create { .. } | GenerationChange::Retire { .. }
        ) {
            sqlx::query("LOCK TABLE sources IN SHARE MODE")
                .execute(&mut *tx)
                .await?;
        }
        let now = self.now(&mut tx).await?;
        let max_attempts = self.options.job_policies.project.max_attempts;
        let changed = crate::generations::change(
            &mut Writes {
                connection: &mut tx,
                max_attempts,
            },
            GenerationCommand {
                change,
                actor,
                reason,
            },
            now,
        )
        .await?;
        tx.commit().await?;
        Ok(changed)
    }
}

/// A generation change's reads and writes on PostgreSQL, in the change's transaction.
struct Writes<'c> {
    connection: &'c mut PgConnection,
    /// Attempts of the `project` jobs a rebuild queues.
    max_attempts: i64,
}

#[async_trait]
impl GenerationWrites for Writes<'_> {
    async fn state_of(&mut self, id: &str) -> Result<Option<GenerationState>> {
        state_of(self.connection, id).await
    }

    async fn in_state(&mut self, state: GenerationState) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT id FROM generations WHERE state = $1")
                .bind(state.as_str())
                .fetch_optional(&mut *self.connection)
                .await?,
        )
    }

    async fn missing_heads(&mut self, id: &str) -> Result<(i64, Vec<String>)> {
        missing(self.connection, id).await
    }

    async fn set_state(
        &mut self,
        id: &str,
        state: GenerationState,
        actor: &str,
        cause: &str,
        now: Micros,
    ) -> Result<()> {
        set_state(self.connection, id, state, actor, cause, now).await
    }

    async fn insert(
        &mut self,
        generation: &Generation,
        state: GenerationState,
        actor: &str,
        cause: &str,
        now: Micros,
    ) -> Result<()> {
        insert(self.connection, generation, state, actor, cause, now).await
    }

    async fn clear_retired_evidence(&mut self, id: &str) -> Result<()> {
        sqlx::query("UPDATE generations SET retired_evidence = NULL WHERE id = $1")
            .bind(id)
            .execute(&mut *self.connection)
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
        let queued = sqlx::query(
            "WITH queued AS ( \
               INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, priority, \
                 attempt, max_attempts, run_at, created_at, changed_by, change_cause, changed_at, \
                 generation) \
               SELECT gen_random_uuid(), s.head_revision_id, s.dataset, s.source_key, 'project', \
                 'pending', $2, 0, $6, $3, $3, $4, $5, $3, $1 \
               FROM sources s JOIN revisions r ON r.id = s.head_revision_id WHERE NOT r.tombstone \
               RETURNING id), \
             receipts AS ( \
               INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, \
                 change_cause, changed_at) \
               SELECT q.id, b.value, 'pending', $3, $4, $5, $3 \
               FROM queued q, generations g, jsonb_array_elements_text(g.backends) AS b(value) \
               WHERE g.id = $1 AND b.value <> 'graph') \
             SELECT count(*) FROM queued",
        )
        .bind(&generation.id)
        .bind(priority)
        .bind(now)
        .bind(actor)
        .bind(cause)
        .bind(self.max_attempts)
        .fetch_one(&mut *self.connection)
        .await?
        .try_get::<i64, _>(0)?;
        if queued > 0 {
            sqlx::query("SELECT pg_notify($1, '')")
                .bind(WORK_CHANNEL)
                .execute(&mut *self.connection)
                .await?;
        }
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
            "UPDATE projection_receipts SET state = 'superseded', updated_at = $2, \
               changed_by = $3, change_cause = $4, changed_at = $2, \
               change_seq = change_seq + 1 \
             WHERE state IN ('pending', 'running', 'written', 'verified', 'excluded') \
               AND job_id IN (SELECT id FROM jobs WHERE generation = $1)",
        )
        .bind(id)
        .bind(now)
        .bind(actor)
        .bind(cause)
        .execute(&mut *self.connection)
        .await?;
        let jobs = sqlx::query(
            "UPDATE jobs SET state = 'cancelled', lease_id = NULL, lease_owner = NULL, \
               lease_expires_at = NULL, changed_by = $3, change_cause = $4, \
               changed_at = GREATEST($2, changed_at), change_seq = change_seq + 1 \
             WHERE generation = $1 AND state IN ('pending', 'running', 'retry_wait')",
        )
        .bind(id)
        .bind(now)
        .bind(actor)
        .bind(cause)
        .execute(&mut *self.connection)
        .await?
        .rows_affected() as i64;
        let rows = sqlx::query("DELETE FROM chunks WHERE generation = $1")
            .bind(id)
            .execute(&mut *self.connection)
            .await?
            .rows_affected() as i64;
        sqlx::query("DELETE FROM searchable_revisions WHERE generation = $1")
            .bind(id)
            .execute(&mut *self.connection)
            .await?;
        Ok((jobs, rows))
    }

    async fn chunk_rows(&mut self, id: &str) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM chunks WHERE generation = $1")
                .bind(id)
                .fetch_one(&mut *self.connection)
                .await?,
        )
    }

    async fn record_retired(&mut self, id: &str, evidence: &serde_json::Value) -> Result<()> {
        sqlx::query("UPDATE generations SET retired_evidence = $2 WHERE id = $1")
            .bind(id)
            .bind(evidence)
            .execute(&mut *self.connection)
            .await?;
        Ok(())
    }

    async fn view(&mut self, id: &str, now: Micros) -> Result<GenerationView> {
        view(self.connection, id, now).await
    }
}
