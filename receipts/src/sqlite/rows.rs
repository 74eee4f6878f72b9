//! Row decoding shared by every SQLite file: ids, enums and JSON as stored, and the revision,
//! job and history rows.

use sqlx::sqlite::SqliteRow;
use sqlx::Row;
use uuid::Uuid;

use crate::error::{LedgerError, Result};
use crate::model::{HistoryEntry, Job, Revision};

pub(crate) fn json_text<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

pub(crate) fn parse_uuid(text: &str) -> Result<Uuid> {
    Uuid::parse_str(text)
        .map_err(|error| LedgerError::Corrupt(format!("bad uuid `{text}`: {error}")))
}

pub(crate) fn optional_uuid(text: Option<String>) -> Result<Option<Uuid>> {
    text.as_deref().map(parse_uuid).transpose()
}

pub(crate) fn parse_enum<T: std::str::FromStr>(text: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    text.parse::<T>()
        .map_err(|error| LedgerError::Corrupt(error.to_string()))
}

pub(crate) const REVISION_COLUMNS: &str =
    "id, dataset, source_key, content_sha256, byte_length, media_type, \
    tags, metadata, tombstone, previous_revision_id, actor, reason, accepted_at";

pub(crate) fn revision_from_row(row: &SqliteRow) -> Result<Revision> {
    let tags: String = row.try_get("tags")?;
    let metadata: String = row.try_get("metadata")?;
    Ok(Revision {
        id: parse_uuid(&row.try_get::<String, _>("id")?)?,
        dataset: row.try_get("dataset")?,
        source_key: row.try_get("source_key")?,
        content_sha256: row.try_get("content_sha256")?,
        byte_length: row.try_get("byte_length")?,
        media_type: row.try_get("media_type")?,
        tags: serde_json::from_str(&tags)
            .map_err(|error| LedgerError::Corrupt(error.to_string()))?,
        metadata: serde_json::from_str(&metadata)
            .map_err(|error| LedgerError::Corrupt(error.to_string()))?,
        tombstone: row.try_get::<i64, _>("tombstone")? == 1,
        previous_revision_id: optional_uuid(row.try_get("previous_revision_id")?)?,
        actor: row.try_get("actor")?,
        reason: row.try_get("reason")?,
        accepted_at: row.try_get("accepted_at")?,
    })
}

pub(crate) fn job_from_row(row: &SqliteRow) -> Result<Job> {
    Ok(Job {
        id: parse_uuid(&row.try_get::<String, _>("id")?)?,
        revision_id: optional_uuid(row.try_get("revision_id")?)?,
        connector_id: optional_uuid(row.try_get("connector_id")?)?,
        dataset: row.try_get("dataset")?,
        source_key: row.try_get("source_key")?,
        kind: parse_enum(&row.try_get::<String, _>("kind")?)?,
        state: parse_enum(&row.try_get::<String, _>("state")?)?,
        priority: row.try_get("priority")?,
        attempt: row.try_get("attempt")?,
        max_attempts: row.try_get("max_attempts")?,
        crashes: row.try_get("crashes")?,
        run_at: row.try_get("run_at")?,
        lease_id: row.try_get("lease_id")?,
        lease_owner: row.try_get("lease_owner")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        heartbeat_at: row.try_get("heartbeat_at")?,
        deadline_at: row.try_get("deadline_at")?,
        started_at: row.try_get("started_at")?,
        cancel_requested: row.try_get::<i64, _>("cancel_requested")? == 1,
        stage: row.try_get("stage")?,
        stage_at: row.try_get("stage_at")?,
        run_at_rule: row.try_get("run_at_rule")?,
        last_error_code: row.try_get("last_error_code")?,
        last_error_message: row.try_get("last_error_message")?,
        created_at: row.try_get("created_at")?,
        changed_at: row.try_get("changed_at")?,
        changed_by: row.try_get("changed_by")?,
        change_cause: row.try_get("change_cause")?,
        generation: row.try_get("generation")?,
    })
}

pub(crate) fn history_from_row(row: &SqliteRow) -> Result<HistoryEntry> {
    Ok(HistoryEntry {
        seq: row.try_get("seq")?,
        at: row.try_get("at")?,
        entity: row.try_get("entity")?,
        entity_id: row.try_get("entity_id")?,
        event: row.try_get("event")?,
        from: row.try_get("from_state")?,
        to: row.try_get("to_state")?,
        actor: row.try_get("actor")?,
        cause: row.try_get("cause")?,
        error_code: row.try_get("error_code")?,
        error_message: row.try_get("error_message")?,
        stage: row.try_get("stage")?,
    })
}
