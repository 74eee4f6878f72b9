//! Verify on SQLite: the buckets of sources filled in after schema 15, the ledger side of one
//! bucket (one read transaction), and what the writer executes for [`crate::Verifications`]:
//! pass changes and repairs' projection jobs. The trait itself is in `ledger.rs`.

use std::collections::BTreeMap;

use sqlx::sqlite::{SqliteConnection, SqlitePool, SqliteRow};
use sqlx::Row;
use uuid::Uuid;

use super::rows::{job_from_row, json_text, parse_enum, parse_uuid};
use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::ids;
use crate::model::{DriftRecord, Job, LedgerBucket, PassChange, VerifyPass};
use crate::verify::{self, advance, check_finish, not_live, HeadRow};

/// A verify write, run by the writer.
#[derive(Debug)]
pub(crate) enum VerifyOp {
    Change(PassChange),
    Restored(crate::model::RestoreRecord),
    Reproject {
        dataset: String,
        source_key: String,
        revision_id: Uuid,
        generation: String,
        actor: String,
        reason: String,
    },
}

/// The writer's answer to a [`VerifyOp`].
#[derive(Debug)]
pub(crate) enum VerifyAnswer {
    Pass(Box<VerifyPass>),
    Job(Box<Job>),
    Voided(i64),
}

/// Fills `sources.bucket` where schema 15 left it NULL (SQLite computes no SHA-256), a
/// thousand rows per statement; does nothing once every source has one.
pub(crate) async fn fill_buckets(connection: &mut SqliteConnection) -> Result<()> {
    loop {
        let rows =
            sqlx::query("SELECT dataset, source_key FROM sources WHERE bucket IS NULL LIMIT 1000")
                .fetch_all(&mut *connection)
                .await?;
        if rows.is_empty() {
            return Ok(());
        }
        let filled: Vec<serde_json::Value> = rows
            .iter()
            .map(|row| {
                let dataset: String = row.try_get("dataset")?;
                let key: String = row.try_get("source_key")?;
                let bucket = verify::bucket(&dataset, &key);
                Ok(serde_json::json!([dataset, key, bucket]))
            })
            .collect::<Result<_>>()?;
        sqlx::query(
            "UPDATE sources SET bucket = f.value ->> 2 \
             FROM json_each(?1) AS f \
             WHERE sources.dataset = f.value ->> 0 AND sources.source_key = f.value ->> 1",
        )
        .bind(json_text(&filled))
        .execute(&mut *connection)
        .await?;
    }
}

/// The ledger side of `bucket` in `generation`, read in one snapshot.
pub(crate) async fn bucket(
    reads: &SqlitePool,
    generation: &str,
    bucket: u16,
) -> Result<LedgerBucket> {
    let mut tx = reads.begin().await?;
    let heads = sqlx::query(
        "WITH h AS ( \
           SELECT s.dataset, s.source_key, s.head_revision_id, r.tombstone, r.content_sha256, \
             EXISTS (SELECT 1 FROM jobs o WHERE o.dataset = s.dataset \
               AND o.source_key = s.source_key \
               AND o.state IN ('pending', 'running', 'retry_wait')) AS open, \
             (SELECT j.id FROM jobs j WHERE j.revision_id = s.head_revision_id \
               AND j.generation = ?1 AND j.kind IN ('project', 'tombstone') \
               AND j.state = 'completed' ORDER BY j.created_at DESC, j.id DESC LIMIT 1) AS job_id \
           FROM sources s JOIN revisions r ON r.id = s.head_revision_id WHERE s.bucket = ?2) \
         SELECT h.*, j.created_at AS head_at, \
           v.state AS vector_state, v.evidence AS vector_evidence, \
           l.state AS relational_state, l.evidence AS relational_evidence \
         FROM h LEFT JOIN jobs j ON j.id = h.job_id \
           LEFT JOIN projection_receipts v ON v.job_id = h.job_id AND v.backend = 'vector' \
           LEFT JOIN projection_receipts l ON l.job_id = h.job_id AND l.backend = 'relational'",
    )
    .bind(generation)
    .bind(i64::from(bucket))
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(head_row)
    .collect::<Result<Vec<_>>>()?;
    let chunks = sqlx::query(
        "SELECT c.revision_id, c.sha256 FROM sources s \
         JOIN chunks c ON c.revision_id = s.head_revision_id AND c.generation = ?1 \
         WHERE s.bucket = ?2 ORDER BY c.revision_id, c.chunk_index",
    )
    .bind(generation)
    .bind(i64::from(bucket))
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(|row| Ok((parse_uuid(&row.try_get::<String, _>(0)?)?, row.try_get(1)?)))
    .collect::<Result<Vec<_>>>()?;
    let known = sqlx::query(
        "SELECT r.id, r.dataset, r.source_key FROM sources s \
         JOIN revisions r ON r.dataset = s.dataset AND r.source_key = s.source_key \
         WHERE s.bucket = ?1",
    )
    .bind(i64::from(bucket))
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(|row| {
        Ok((
            parse_uuid(&row.try_get::<String, _>(0)?)?,
            row.try_get(1)?,
            row.try_get(2)?,
        ))
    })
    .collect::<Result<Vec<_>>>()?;
    tx.commit().await?;
    Ok(verify::assemble(heads, chunks, known))
}

fn head_row(row: &SqliteRow) -> Result<HeadRow> {
    let receipt = |state: &str, evidence: &str| -> Result<Option<(String, serde_json::Value)>> {
        let Some(state) = row.try_get::<Option<String>, _>(state)? else {
            return Ok(None);
        };
        let evidence = row
            .try_get::<Option<String>, _>(evidence)?
            .map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(|error| LedgerError::Corrupt(format!("receipt evidence: {error}")))?
            .unwrap_or(serde_json::Value::Null);
        Ok(Some((state, evidence)))
    };
    let job = match row.try_get::<Option<String>, _>("job_id")? {
        Some(id) => Some((parse_uuid(&id)?, row.try_get::<i64, _>("head_at")?)),
        None => None,
    };
    Ok(HeadRow {
        dataset: row.try_get("dataset")?,
        source_key: row.try_get("source_key")?,
        revision_id: parse_uuid(&row.try_get::<String, _>("head_revision_id")?)?,
        tombstone: row.try_get::<i64, _>("tombstone")? == 1,
        content_sha256: row.try_get("content_sha256")?,
        open: row.try_get::<i64, _>("open")? == 1,
        job,
        vector: receipt("vector_state", "vector_evidence")?,
        relational: receipt("relational_state", "relational_evidence")?,
    })
}

pub(crate) fn pass_from_row(row: &SqliteRow) -> Result<VerifyPass> {
    let drift: BTreeMap<String, i64> = serde_json::from_str(&row.try_get::<String, _>("drift")?)
        .map_err(|error| LedgerError::Corrupt(format!("verify pass drift: {error}")))?;
    Ok(VerifyPass {
        id: parse_uuid(&row.try_get::<String, _>("id")?)?,
        tier: parse_enum(&row.try_get::<String, _>("tier")?)?,
        generation: row.try_get("generation")?,
        repair: row.try_get::<i64, _>("repair")? == 1,
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

pub(crate) fn drift_from_row(row: &SqliteRow) -> Result<DriftRecord> {
    Ok(DriftRecord {
        id: parse_uuid(&row.try_get::<String, _>("id")?)?,
        pass_id: parse_uuid(&row.try_get::<String, _>("pass_id")?)?,
        kind: parse_enum(&row.try_get::<String, _>("kind")?)?,
        store: row.try_get("store")?,
        generation: row.try_get("generation")?,
        dataset: row.try_get("dataset")?,
        source_key: row.try_get("source_key")?,
        revision_id: parse_uuid(&row.try_get::<String, _>("revision_id")?)?,
        evidence: serde_json::from_str(&row.try_get::<String, _>("evidence")?)
            .map_err(|error| LedgerError::Corrupt(format!("drift evidence: {error}")))?,
        state: parse_enum(&row.try_get::<String, _>("state")?)?,
        repair: row.try_get("repair")?,
        found_at: row.try_get("found_at")?,
        changed_at: row.try_get("changed_at")?,
    })
}

async fn load_pass(connection: &mut SqliteConnection, id: Uuid) -> Result<VerifyPass> {
    let row = sqlx::query("SELECT * FROM verify_passes WHERE id = ?")
        .bind(id.to_string())
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

pub(crate) async fn run(
    connection: &mut SqliteConnection,
    op: VerifyOp,
    now: Micros,
) -> Result<VerifyAnswer> {
    match op {
        VerifyOp::Change(change) => change_pass(connection, change, now)
            .await
            .map(|pass| VerifyAnswer::Pass(Box::new(pass))),
        VerifyOp::Restored(restore) => record_restore(connection, &restore, now)
            .await
            .map(VerifyAnswer::Voided),
        VerifyOp::Reproject {
            dataset,
            source_key,
            revision_id,
            generation,
            actor,
            reason,
        } => reproject(
            connection,
            (&dataset, &source_key),
            revision_id,
            &generation,
            (&actor, &reason),
            now,
        )
        .await
        .map(|job| VerifyAnswer::Job(Box::new(job))),
    }
}

async fn change_pass(
    connection: &mut SqliteConnection,
    change: PassChange,
    now: Micros,
) -> Result<VerifyPass> {
    match change {
        PassChange::Start {
            tier,
            generation,
            repair,
            actor,
            reason,
        } => {
            let running = sqlx::query(
                "SELECT id FROM verify_passes WHERE tier = ? AND generation = ? AND state = 'running'",
            )
            .bind(tier.as_str())
            .bind(&generation)
            .fetch_optional(&mut *connection)
            .await?;
            if let Some(row) = running {
                let id = parse_uuid(&row.try_get::<String, _>(0)?)?;
                return load_pass(connection, id).await;
            }
            let live: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM generations WHERE id = ? \
                   AND state IN ('active', 'building', 'standby'))",
            )
            .bind(&generation)
            .fetch_one(&mut *connection)
            .await?;
            if !live {
                return Err(not_live(&generation));
            }
            let id = ids::new_v7();
            sqlx::query(
                "INSERT INTO verify_passes (id, tier, generation, repair, state, cursor, \
                   created_by, reason, started_at, changed_by, change_cause, changed_at) \
                 VALUES (?1, ?2, ?3, ?4, 'running', 0, ?5, ?6, ?7, ?5, ?6, ?7)",
            )
            .bind(id.to_string())
            .bind(tier.as_str())
            .bind(&generation)
            .bind(i64::from(repair))
            .bind(&actor)
            .bind(&reason)
            .bind(now)
            .execute(&mut *connection)
            .await?;
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
                       source_key, revision_id, evidence, state, repair, found_at, changed_by, \
                       change_cause, changed_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?12)",
                )
                .bind(record.id.to_string())
                .bind(pass_id.to_string())
                .bind(record.kind.as_str())
                .bind(&record.store)
                .bind(&pass.generation)
                .bind(&record.dataset)
                .bind(&record.source_key)
                .bind(record.revision_id.to_string())
                .bind(json_text(&record.evidence))
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
            sqlx::query(
                "UPDATE verify_passes SET cursor = ?2, buckets_checked = buckets_checked + 1, \
                   skipped = skipped + ?3, drift = ?4 WHERE id = ?1",
            )
            .bind(pass_id.to_string())
            .bind(bucket + 1)
            .bind(skipped)
            .bind(json_text(&counts))
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
                "UPDATE verify_passes SET state = ?2, changed_by = ?3, change_cause = ?4, \
                   changed_at = ?5, change_seq = change_seq + 1 WHERE id = ?1",
            )
            .bind(pass_id.to_string())
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
            let row = sqlx::query(
                "UPDATE verify_drift SET state = ?2, repair = ?3, changed_by = ?4, \
                   change_cause = ?3, changed_at = ?5, change_seq = change_seq + 1 \
                 WHERE id = ?1 RETURNING pass_id",
            )
            .bind(drift_id.to_string())
            .bind(state.as_str())
            .bind(&repair)
            .bind(&actor)
            .bind(now)
            .fetch_optional(&mut *connection)
            .await?
            .ok_or_else(|| {
                LedgerError::invalid("drift_not_found", format!("drift {drift_id} not found"))
            })?;
            let pass_id = parse_uuid(&row.try_get::<String, _>(0)?)?;
            load_pass(connection, pass_id).await
        }
    }
}

async fn reproject(
    connection: &mut SqliteConnection,
    (dataset, source_key): (&str, &str),
    revision_id: Uuid,
    generation: &str,
    (actor, reason): (&str, &str),
    now: Micros,
) -> Result<Job> {
    let state: Option<(bool, bool)> = sqlx::query_as(
        "SELECT s.head_revision_id = ?3, EXISTS (SELECT 1 FROM jobs o WHERE o.dataset = ?1 \
           AND o.source_key = ?2 AND o.state IN ('pending', 'running', 'retry_wait')) \
         FROM sources s WHERE s.dataset = ?1 AND s.source_key = ?2",
    )
    .bind(dataset)
    .bind(source_key)
    .bind(revision_id.to_string())
    .fetch_optional(&mut *connection)
    .await?;
    match state {
        Some((true, false)) => {}
        Some((false, _)) | None => {
            return Err(LedgerError::invalid(
                "repair_refused",
                format!("revision {revision_id} is no longer the head of {dataset}/{source_key}"),
            ))
        }
        Some((true, true)) => {
            return Err(LedgerError::invalid(
                "repair_refused",
                format!("{dataset}/{source_key} has a job in flight; it will project the head"),
            ))
        }
    }
    let id = ids::new_v7();
    let cause = format!("verify repair: {reason}");
    let row = sqlx::query(
        "INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, priority, attempt, \
           max_attempts, run_at, created_at, changed_by, change_cause, changed_at, generation) \
         SELECT ?1, ?2, ?3, ?4, 'project', 'pending', 0, 0, \
           (SELECT max_attempts FROM job_policies WHERE kind = 'project'), ?5, ?5, ?6, ?7, ?5, g.id \
         FROM generations g WHERE g.id = ?8 AND g.state IN ('active', 'building', 'standby') \
         RETURNING *",
    )
    .bind(id.to_string())
    .bind(revision_id.to_string())
    .bind(dataset)
    .bind(source_key)
    .bind(now)
    .bind(actor)
    .bind(&cause)
    .bind(generation)
    .fetch_optional(&mut *connection)
    .await?
    .ok_or_else(|| not_live(generation))?;
    sqlx::query(
        "INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, \
           change_cause, changed_at) \
         SELECT ?1, b.value, 'pending', ?2, ?3, ?4, ?2 \
         FROM generations g, json_each(g.backends) AS b WHERE g.id = ?5 AND b.value <> 'graph'",
    )
    .bind(id.to_string())
    .bind(now)
    .bind(actor)
    .bind(&cause)
    .bind(generation)
    .execute(&mut *connection)
    .await?;
    job_from_row(&row)
}

/// `VACUUM INTO` on a read connection: a consistent copy as of one read transaction, while
/// the writer goes on; then fsynced, integrity-checked, and read for its position.
pub(crate) async fn backup_into(
    reads: &SqlitePool,
    path: &std::path::Path,
) -> Result<crate::model::LedgerBackup> {
    use sqlx::ConnectOptions;
    if path.exists() {
        return Err(LedgerError::invalid(
            "backup_exists",
            format!(
                "{} exists already; a backup never overwrites",
                path.display()
            ),
        ));
    }
    let target = path
        .to_str()
        .ok_or_else(|| LedgerError::invalid("invalid_path", "the backup path is not UTF-8"))?;
    sqlx::query("VACUUM INTO ?")
        .bind(target)
        .execute(reads)
        .await?;
    let unavailable =
        |error: std::io::Error| LedgerError::Unavailable(format!("{}: {error}", path.display()));
    std::fs::File::open(path)
        .and_then(|file| file.sync_all())
        .map_err(unavailable)?;
    if let Some(parent) = path.parent() {
        std::fs::File::open(parent)
            .and_then(|directory| directory.sync_all())
            .map_err(unavailable)?;
    }
    let mut copy = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .disable_statement_logging()
        .connect()
        .await?;
    let check: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&mut copy)
        .await?;
    if check != "ok" {
        return Err(LedgerError::Corrupt(format!(
            "the backup copy failed its integrity check: {check}"
        )));
    }
    let (history_seq, newest_at): (i64, i64) =
        sqlx::query_as("SELECT coalesce(max(seq), 0), coalesce(max(at), 0) FROM history")
            .fetch_one(&mut copy)
            .await?;
    let schema_version: i64 =
        sqlx::query_scalar("SELECT coalesce(max(version), 0) FROM _sqlx_migrations WHERE success")
            .fetch_one(&mut copy)
            .await?;
    let (sources, revisions, contents): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM sources), (SELECT count(*) FROM revisions), \
           (SELECT count(*) FROM contents)",
    )
    .fetch_one(&mut copy)
    .await?;
    let _ = sqlx::Connection::close(copy).await;
    Ok(crate::model::LedgerBackup {
        engine: "sqlite".to_owned(),
        schema_version,
        history_seq,
        newest_at,
        sources,
        revisions,
        contents,
    })
}

/// Voids every lease and records the restore (the writer runs it).
pub(crate) async fn record_restore(
    connection: &mut SqliteConnection,
    restore: &crate::model::RestoreRecord,
    now: Micros,
) -> Result<i64> {
    let voided = sqlx::query(
        "UPDATE jobs SET state = 'pending', lease_id = NULL, lease_owner = NULL, \
           lease_expires_at = NULL, heartbeat_at = NULL, run_at = ?1, \
           run_at_rule = 'lease voided by restore', changed_by = ?2, \
           change_cause = 'lease voided by the restore of backup ' || ?3, changed_at = ?1, \
           change_seq = change_seq + 1 WHERE state = 'running'",
    )
    .bind(now)
    .bind(&restore.actor)
    .bind(&restore.backup_id)
    .execute(&mut *connection)
    .await?
    .rows_affected() as i64;
    sqlx::query(
        "INSERT INTO history (at, entity, entity_id, event, from_state, to_state, actor, cause) \
         VALUES (?1, 'restore', ?2, 'restored', NULL, 'restored', ?3, ?4)",
    )
    .bind(now)
    .bind(&restore.backup_id)
    .bind(&restore.actor)
    .bind(format!("{} ({voided} leases voided)", restore.cause))
    .execute(&mut *connection)
    .await?;
    Ok(voided)
}
