//! The events outbox on SQLite, written by the triggers of schema 22: a page read in one
//! snapshot, and retention inside the writer's transaction. The [`crate::events::Events`]
//! implementation that calls them is in `outbox.rs`.

use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection};

use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::events::{Event, EventPage, EventQuery};

pub(super) async fn read(
    connection: &mut SqliteConnection,
    query: &EventQuery,
    limit: i64,
) -> Result<EventPage> {
    let newest: i64 = sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM events")
        .fetch_one(&mut *connection)
        .await?;
    let pruned_through: i64 = sqlx::query_scalar("SELECT through FROM events_pruned WHERE id = 1")
        .fetch_one(&mut *connection)
        .await?;
    let mut select = QueryBuilder::<Sqlite>::new(
        "SELECT seq, type, at, dataset, source_key, revision_id, data FROM events WHERE seq > ",
    );
    select.push_bind(query.after);
    select.push(" AND seq <= ").push_bind(newest);
    if let Some(datasets) = &query.datasets {
        select.push(" AND dataset IN (");
        let mut list = select.separated(", ");
        for dataset in datasets {
            list.push_bind(dataset.as_str());
        }
        list.push_unseparated(")");
        if datasets.is_empty() {
            select.push(" AND 0");
        }
    }
    if let Some(types) = &query.types {
        select.push(" AND type IN (");
        let mut list = select.separated(", ");
        for kind in types {
            list.push_bind(kind.as_str());
        }
        list.push_unseparated(")");
        if types.is_empty() {
            select.push(" AND 0");
        }
    }
    select.push(" ORDER BY seq LIMIT ").push_bind(limit);
    let rows = select.build().fetch_all(&mut *connection).await?;
    let events = rows
        .iter()
        .map(|row| {
            let seq: i64 = row.try_get("seq")?;
            let data: String = row.try_get("data")?;
            let data = serde_json::from_str(&data).map_err(|error| {
                LedgerError::Corrupt(format!("event {seq}'s data does not parse: {error}"))
            })?;
            Event::read(
                seq,
                row.try_get("type")?,
                row.try_get("at")?,
                [
                    row.try_get("dataset")?,
                    row.try_get("source_key")?,
                    row.try_get("revision_id")?,
                ],
                data,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(EventPage::of(events, query, newest, pruned_through))
}

/// Removes the events before `before` (a prefix of the outbox: through the newest event that
/// happened before it) and records how far retention went. Inside the writer's transaction.
pub(super) async fn prune(connection: &mut SqliteConnection, before: Micros) -> Result<u64> {
    let through: Option<i64> = sqlx::query_scalar("SELECT max(seq) FROM events WHERE at < ?")
        .bind(before)
        .fetch_one(&mut *connection)
        .await?;
    let Some(through) = through else {
        return Ok(0);
    };
    // An event's deliveries go with it.
    sqlx::query("DELETE FROM deliveries WHERE seq <= ?")
        .bind(through)
        .execute(&mut *connection)
        .await?;
    let removed = sqlx::query("DELETE FROM events WHERE seq <= ?")
        .bind(through)
        .execute(&mut *connection)
        .await?
        .rows_affected();
    sqlx::query("UPDATE events_pruned SET through = max(through, ?) WHERE id = 1")
        .bind(through)
        .execute(&mut *connection)
        .await?;
    Ok(removed)
}
