//! Verify on PostgreSQL: the ledger side of one bucket (one repeatable-read snapshot), pass
//! changes with the pass's row locked, and repairs' projection jobs. Buckets are filled by
//! `cairn_bucket` (schema 15).

use std::collections::BTreeMap;

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::{job_from_row, parse_enum, PostgresLedger, WORK_CHANNEL};
use crate::error::{LedgerError, Result};
use crate::ids;
use crate::ledger::{Backups, Verifications};
use crate::model::{DriftRecord, Job, LedgerBucket, PassChange, VerifyPass};
use crate::verify::{self, advance, check_finish, not_live, HeadRow};

fn head_row(row: &PgRow) -> Result<HeadRow> {
    let receipt = |state: &str, evidence: &str| -> Result<Option<(String, serde_json::Value)>> {
        let Some(state) = row.try_get::<Option<String>, _>(state)? else {
            return Ok(None);
        };
        let evidence = row
            .try_get::<Option<serde_json::Value>, _>(evidence)?
            .unwrap_or(serde_json::Value::Null);
        Ok(Some((state, evidence)))
    };
    let job = match row.try_get::<Option<Uuid>, _>("job_id")? {
        Some(id) => Some((id, row.try_get::<i64, _>("head_at")?)),
        None => None,
    };
    Ok(HeadRow {
        dataset: row.try_get("dataset")?,
        source_key: row.try_get("source_key")?,
        revision_id: row.try_get("head_revision_id")?,
        tombstone: row.try_get("tombstone")?,
        content_sha256: row.try_get("content_sha256")?,
        open: row.try_get("open")?,
        job,
        vector: receipt("vector_state", "vector_evidence")?,
        relational: receipt("relational_state", "relational_evidence")?,
    })
}

fn pass_from_row(row: &PgRow) -> Result<VerifyPass> {
    let drift: BTreeMap<String, i64> =
        serde_json::from_value(row.try_get::<serde_json::Value, _>("drift")?)
            .map_err(|error| LedgerError::Corrupt(format!("verify pass drift: {error}")))?;
    Ok(VerifyPass {
        id: row.try_get("id")?,
        tier: parse_enum(&row.try_get::<String, _>("tier")?)?,
        generation: row.try_get("generation")?,
        repair: row.try_get("repair")?,
        state: parse_enum(&row.try_get::<String, _>("state")?)?,
        cursor: row.try_get("cursor")?,
        buckets_checked: row.try_get("buckets_checked")?,
        skipped: row.try_get("skipped")?,
        drift,
        created_by: row.try_get("created_by")?,
        reason: row.try_get("reason")?,
        started_at: row.try_get("started_at")?,
        changed_by: row.try_get("changed_by")?,
        change_cause: row.try_get("change_cause")?,
        changed_at: row.try_get("changed_at")?,
    })
}

fn drift_from_row(row: &PgRow) -> Result<DriftRecord> {
    Ok(DriftRecord {
        id: row.try_get("id")?,
        pass_id: row.try_get("pass_id")?,
        kind: parse_enum(&row.try_get::<String, _>("kind")?)?,
        store: row.try_get("store")?,
        generation: row.try_get("generation")?,
        dataset: row.try_get("dataset")?,
        source_key: row.try_get("source_key")?,
        revision_id: row.try_get("revision_id")?,
        evidence: row.try_get("evidence")?,
        state: parse_enum(&row.try_get::<String, _>("state")?)?,
        repair: row.try_get("repair")?,
        found_at: row.try_get("found_at")?,
        changed_at: row.try_get("changed_at")?,
    })
}

async fn load_pass(connection: &mut PgConnection, id: Uuid) -> Result<VerifyPass> {
    let row = sqlx::query("SELECT * FROM verify_passes WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *connection)
        .await?
        .ok_or_else(|| {
            LedgerError::invalid(
                "verify_pass_not_found",
                format!("verify pass {id} not found"),
            )
        })?;
    pass_from_row(&row)
}

impl PostgresLedger {
    async fn change_pass_in_tx(
        &self,
        connection: &mut PgConnection,
        change: PassChange,
        now: i64,
    ) -> Result<VerifyPass> {
        match change {
            PassChange::Start {
                tier,
                generation,
                repair,
                actor,
                reason,
            } => {
                let live: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM generations WHERE id = $1 \
                       AND state IN ('active', 'building', 'standby'))",
                )
                .bind(&generation)
                .fetch_one(&mut *connection)
                .await?;
                if !live {
                    return Err(not_live(&generation));
                }
                // Two starters meet the one-running index: the second answers the first's pass.
                let inserted: Option<Uuid> = sqlx::query_scalar(
                    "INSERT INTO verify_passes (id, tier, generation, repair, state, cursor, \
                       created_by, reason, started_at, changed_by, change_cause, changed_at) \
                     VALUES ($1, $2, $3, $4, 'running', 0, $5, $6, $7, $5, $6, $7) \
                     ON CONFLICT (tier, generation) WHERE state = 'running' DO NOTHING \
                     RETURNING id",
                )
                .bind(ids::new_v7())
                .bind(tier.as_str())
                .bind(&generation)
                .bind(repair)
                .bind(&actor)
                .bind(&reason)
                .bind(now)
                .fetch_optional(&mut *connection)
                .await?;
                let id = match inserted {
                    Some(id) => id,
                    None => {
                        sqlx::query_scalar(
                            "SELECT id FROM verify_passes WHERE tier = $1 AND generation = $2 \
                         AND state = 'running'",
                        )
                        .bind(tier.as_str())
                        .bind(&generation)
                        .fetch_one(&mut *connection)
                        .await?
                    }
                };
                load_pass(connection, id).await
            }
            PassChange::Advance {
                pass_id,
                bucket,
                skipped,
                drift,
            } => {
                let pass = load_pass(connection, pass_id).await?;
                let counts = advance(&pass, bucket, &drift)?;
                for record in &drift {
                    sqlx::query(
                        "INSERT INTO verify_drift (id, pass_id, kind, store, generation, dataset, \
                           source_key, revision_id, evidence, state, repair, found_at, \
                           changed_by, change_cause, changed_at) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $12)",
                    )
                    .bind(record.id)
                    .bind(pass_id)
                    .bind(record.kind.as_str())
                    .bind(&record.store)
                    .bind(&pass.generation)
                    .bind(&record.dataset)
                    .bind(&record.source_key)
                    .bind(record.revision_id)
                    .bind(&record.evidence)
                    .bind(record.state.as_str())
                    .bind(&record.repair)
                    .bind(now)
                    .bind(&pass.created_by)
                    .bind(format!(
                        "confirmed by a second look in {} pass {pass_id}",
                        pass.tier
                    ))
                    .execute(&mut *connection)
                    .await?;
                }
                let counts = serde_json::to_value(&counts)
                    .map_err(|error| LedgerError::Internal(format!("drift counts: {error}")))?;
                sqlx::query(
                    "UPDATE verify_passes SET cursor = $2, buckets_checked = buckets_checked + 1, \
                       skipped = skipped + $3, drift = $4 WHERE id = $1",
                )
                .bind(pass_id)
                .bind(bucket + 1)
                .bind(skipped)
                .bind(counts)
                .execute(&mut *connection)
                .await?;
                load_pass(connection, pass_id).await
            }
            PassChange::Finish {
                pass_id,
                state,
                actor,
                reason,
            } => {
                let pass = load_pass(connection, pass_id).await?;
                check_finish(&pass, state)?;
                sqlx::query(
                    "UPDATE verify_passes SET state = $2, changed_by = $3, change_cause = $4, \
                       changed_at = $5, change_seq = change_seq + 1 WHERE id = $1",
                )
                .bind(pass_id)
                .bind(state.as_str())
                .bind(&actor)
                .bind(&reason)
                .bind(now)
                .execute(&mut *connection)
                .await?;
                load_pass(connection, pass_id).await
            }
            PassChange::Repair {
                drift_id,
                state,
                repair,
                actor,
            } => {
                let pass_id: Uuid = sqlx::query_scalar(
                    "UPDATE verify_drift SET state = $2, repair = $3, changed_by = $4, \
                       change_cause = $3, changed_at = $5, change_seq = change_seq + 1 \
                     WHERE id = $1 RETURNING pass_id",
                )
                .bind(drift_id)
                .bind(state.as_str())
                .bind(&repair)
                .bind(&actor)
                .bind(now)
                .fetch_optional(&mut *connection)
                .await?
                .ok_or_else(|| {
                    LedgerError::invalid("drift_not_found", format!("drift {drift_id} not found"))
                })?;
                load_pass(connection, pass_id).await
            }
        }
    }
}

#[async_trait]
impl Verifications for PostgresLedger {
    async fn verify_bucket(&self, generation: &str, bucket: u16) -> Result<LedgerBucket> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        let bucket = i32::from(bucket);
        let heads = sqlx::query(
            "WITH h AS ( \
               SELECT s.dataset, s.source_key, s.head_revision_id, r.tombstone, r.content_sha256, \
                 EXISTS (SELECT 1 FROM jobs o WHERE o.dataset = s.dataset \
                   AND o.source_key = s.source_key \
                   AND o.state IN ('pending', 'running', 'retry_wait')) AS open, \
                 (SELECT j.id FROM jobs j WHERE j.revision_id = s.head_revision_id \
                   AND j.generation = $1 AND j.kind IN ('project', 'tombstone') \
                   AND j.state = 'completed' ORDER BY j.created_at DESC, j.id DESC LIMIT 1) \
                   AS job_id \
               FROM sources s JOIN revisions r ON r.id = s.head_revision_id WHERE s.bucket = $2) \
             SELECT h.*, j.created_at AS head_at, \
               v.state AS vector_state, v.evidence AS vector_evidence, \
               l.state AS relational_state, l.evidence AS relational_evidence \
             FROM h LEFT JOIN jobs j ON j.id = h.job_id \
               LEFT JOIN projection_receipts v ON v.job_id = h.job_id AND v.backend = 'vector' \
               LEFT JOIN projection_receipts l ON l.job_id = h.job_id \
                 AND l.backend = 'relational'",
        )
        .bind(generation)
        .bind(bucket)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(head_row)
        .collect::<Result<Vec<_>>>()?;
        let chunks = sqlx::query(
            "SELECT c.revision_id, c.sha256 FROM sources s \
             JOIN chunks c ON c.revision_id = s.head_revision_id AND c.generation = $1 \
             WHERE s.bucket = $2 ORDER BY c.revision_id, c.chunk_index",
        )
        .bind(generation)
        .bind(bucket)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<Vec<_>>>()?;
        let known = sqlx::query(
            "SELECT r.id, r.dataset, r.source_key FROM sources s \
             JOIN revisions r ON r.dataset = s.dataset AND r.source_key = s.source_key \
             WHERE s.bucket = $1",
        )
        .bind(bucket)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
        .collect::<Result<Vec<_>>>()?;
        tx.commit().await?;
        Ok(verify::assemble(heads, chunks, known))
    }

    async fn change_pass(&self, change: PassChange) -> Result<VerifyPass> {
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        let pass = self.change_pass_in_tx(&mut tx, change, now).await?;
        tx.commit().await?;
        Ok(pass)
    }

    async fn verify_pass(&self, id: Uuid) -> Result<Option<VerifyPass>> {
        sqlx::query("SELECT * FROM verify_passes WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(pass_from_row)
            .transpose()
    }

    async fn verify_passes(&self, limit: u32) -> Result<Vec<VerifyPass>> {
        sqlx::query("SELECT * FROM verify_passes ORDER BY started_at DESC, id DESC LIMIT $1")
            .bind(i64::from(limit.clamp(1, 100)))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(pass_from_row)
            .collect()
    }

    async fn pass_drift(&self, pass_id: Uuid) -> Result<Vec<DriftRecord>> {
        sqlx::query("SELECT * FROM verify_drift WHERE pass_id = $1 ORDER BY found_at, id")
            .bind(pass_id)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(drift_from_row)
            .collect()
    }

    async fn reproject(
        &self,
        dataset: &str,
        source_key: &str,
        revision_id: Uuid,
        generation: &str,
        actor: &str,
        reason: &str,
    ) -> Result<Job> {
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        // The source's row stays locked: acceptance cannot move the head meanwhile.
        let state: Option<(bool, bool)> = sqlx::query_as(
            "SELECT s.head_revision_id = $3, EXISTS (SELECT 1 FROM jobs o WHERE o.dataset = $1 \
               AND o.source_key = $2 AND o.state IN ('pending', 'running', 'retry_wait')) \
             FROM sources s WHERE s.dataset = $1 AND s.source_key = $2 FOR UPDATE",
        )
        .bind(dataset)
        .bind(source_key)
        .bind(revision_id)
        .fetch_optional(&mut *tx)
        .await?;
        match state {
            Some((true, false)) => {}
            Some((false, _)) | None => {
                return Err(LedgerError::invalid(
                    "repair_refused",
                    format!(
                        "revision {revision_id} is no longer the head of {dataset}/{source_key}"
                    ),
                ))
            }
            Some((true, true)) => {
                return Err(LedgerError::invalid(
                    "repair_refused",
                    format!("{dataset}/{source_key} has a job in flight; it will project the head"),
                ))
            }
        }
        let cause = format!("verify repair: {reason}");
        let row = sqlx::query(
            "INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, priority, \
               attempt, max_attempts, run_at, created_at, changed_by, change_cause, changed_at, \
               generation) \
             SELECT $1, $2, $3, $4, 'project', 'pending', 0, 0, $5, $6, $6, $7, $8, $6, g.id \
             FROM generations g WHERE g.id = $9 AND g.state IN ('active', 'building', 'standby') \
             RETURNING *",
        )
        .bind(ids::new_v7())
        .bind(revision_id)
        .bind(dataset)
        .bind(source_key)
        .bind(self.options.job_policies.project.max_attempts)
        .bind(now)
        .bind(actor)
        .bind(&cause)
        .bind(generation)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| not_live(generation))?;
        let job = job_from_row(&row)?;
        sqlx::query(
            "INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, \
               change_cause, changed_at) \
             SELECT $1, b.value, 'pending', $2, $3, $4, $2 \
             FROM generations g, jsonb_array_elements_text(g.backends) AS b(value) \
             WHERE g.id = $5 AND b.value <> 'graph'",
        )
        .bind(job.id)
        .bind(now)
        .bind(actor)
        .bind(&cause)
        .bind(generation)
        .execute(&mut *tx)
        .await?;
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(WORK_CHANNEL)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(job)
    }
}

#[async_trait]
impl Backups for PostgresLedger {
    async fn backup_ledger(&self, path: &std::path::Path) -> Result<crate::model::LedgerBackup> {
        if path.exists() {
            return Err(LedgerError::invalid(
                "backup_exists",
                format!(
                    "{} exists already; a backup never overwrites",
                    path.display()
                ),
            ));
        }
        // One snapshot: its position in history is read in it, and pg_dump dumps it.
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        let snapshot: String = sqlx::query_scalar("SELECT pg_export_snapshot()")
            .fetch_one(&mut *tx)
            .await?;
        let (history_seq, newest_at): (i64, i64) =
            sqlx::query_as("SELECT coalesce(max(seq), 0), coalesce(max(at), 0) FROM history")
                .fetch_one(&mut *tx)
                .await?;
        let schema_version: i64 = sqlx::query_scalar(
            "SELECT coalesce(max(version), 0) FROM _sqlx_migrations WHERE success",
        )
        .fetch_one(&mut *tx)
        .await?;
        let (sources, revisions, contents): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM sources), (SELECT count(*) FROM revisions), \
               (SELECT count(*) FROM contents)",
        )
        .fetch_one(&mut *tx)
        .await?;
        let program = match &self.options.pg_bin {
            Some(bin) => bin.join("pg_dump"),
            None => std::path::PathBuf::from("pg_dump"),
        };
        let output = tokio::process::Command::new(&program)
            .arg(format!("--snapshot={snapshot}"))
            .args(["--format=custom", "--no-owner", "--no-privileges", "--file"])
            .arg(path)
            .arg("--dbname")
            .arg(&self.options.url)
            .output()
            .await
            .map_err(|error| {
                LedgerError::Unavailable(format!("running {}: {error}", program.display()))
            })?;
        tx.rollback().await?;
        if !output.status.success() {
            tracing::error!(stderr = %String::from_utf8_lossy(&output.stderr), "pg_dump failed");
            return Err(LedgerError::Unavailable(format!(
                "pg_dump failed ({}); see the server log",
                output.status
            )));
        }
        let unavailable = |error: std::io::Error| {
            LedgerError::Unavailable(format!("{}: {error}", path.display()))
        };
        std::fs::File::open(path)
            .and_then(|file| file.sync_all())
            .map_err(unavailable)?;
        if let Some(parent) = path.parent() {
            std::fs::File::open(parent)
                .and_then(|directory| directory.sync_all())
                .map_err(unavailable)?;
        }
        Ok(crate::model::LedgerBackup {
            engine: "postgres".to_owned(),
            schema_version,
            history_seq,
            newest_at,
            sources,
            revisions,
            contents,
        })
    }

    async fn record_restore(&self, restore: &crate::model::RestoreRecord) -> Result<i64> {
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        let voided = sqlx::query(
            "UPDATE jobs SET state = 'pending', lease_id = NULL, lease_owner = NULL, \
               lease_expires_at = NULL, heartbeat_at = NULL, run_at = $1, \
               run_at_rule = 'lease voided by restore', changed_by = $2, \
               change_cause = 'lease voided by the restore of backup ' || $3, changed_at = $1, \
               change_seq = change_seq + 1 WHERE state = 'running'",
        )
        .bind(now)
        .bind(&restore.actor)
        .bind(&restore.backup_id)
        .execute(&mut *tx)
        .await?
        .rows_affected() as i64;
        sqlx::query(
            "SELECT history_add(true, $1, 'restore', $2, 'restored', NULL, 'restored', $3, $4)",
        )
        .bind(now)
        .bind(&restore.backup_id)
        .bind(&restore.actor)
        .bind(format!("{} ({voided} leases voided)", restore.cause))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(voided)
    }
}
