//! The events outbox on PostgreSQL: written by the triggers of schema 23 and numbered at
//! commit; read here in one snapshot (numbered rows only), pruned in one transaction.

use async_trait::async_trait;
use sqlx::{Postgres, QueryBuilder, Row};

use super::PostgresLedger;
use crate::clock::Micros;
use crate::error::Result;
use crate::events::{page_limit, Event, EventPage, EventQuery, Events};

#[async_trait]
impl Events for PostgresLedger {
    async fn events(&self, query: &EventQuery) -> Result<EventPage> {
        let limit = page_limit(query.limit);
        let mut transaction = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *transaction)
            .await?;
        let newest: i64 = sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM events")
            .fetch_one(&mut *transaction)
            .await?;
        let pruned_through: i64 =
            sqlx::query_scalar("SELECT through FROM events_pruned WHERE id = 1")
                .fetch_one(&mut *transaction)
                .await?;
        let mut select = QueryBuilder::<Postgres>::new(
            "SELECT seq, type, at, dataset, source_key, revision_id, data FROM events \
             WHERE seq IS NOT NULL AND seq > ",
        );
        select.push_bind(query.after);
        select.push(" AND seq <= ").push_bind(newest);
        if let Some(datasets) = &query.datasets {
            select
                .push(" AND dataset = ANY(")
                .push_bind(datasets.clone())
                .push(")");
        }
        if let Some(types) = &query.types {
            let names: Vec<String> = types.iter().map(|kind| kind.as_str().to_owned()).collect();
            select.push(" AND type = ANY(").push_bind(names).push(")");
        }
        select.push(" ORDER BY seq LIMIT ").push_bind(limit);
        let rows = select.build().fetch_all(&mut *transaction).await?;
        transaction.commit().await?;
        let events = rows
            .iter()
            .map(|row| {
                Event::read(
                    row.try_get("seq")?,
                    row.try_get("type")?,
                    row.try_get("at")?,
                    [
                        row.try_get("dataset")?,
                        row.try_get("source_key")?,
                        row.try_get("revision_id")?,
                    ],
                    row.try_get("data")?,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(EventPage::of(events, query, newest, pruned_through))
    }

    async fn prune_events(&self, before: Micros) -> Result<u64> {
        let mut transaction = self.pool.begin().await?;
        let through: Option<i64> =
            sqlx::query_scalar("SELECT max(seq) FROM events WHERE seq IS NOT NULL AND at < $1")
                .bind(before)
                .fetch_one(&mut *transaction)
                .await?;
        let Some(through) = through else {
            return Ok(0);
        };
        // An event's deliveries go with it.
        sqlx::query("DELETE FROM deliveries WHERE seq <= $1")
            .bind(through)
            .execute(&mut *transaction)
            .await?;
        let removed = sqlx::query("DELETE FROM events WHERE seq <= $1")
            .bind(through)
            .execute(&mut *transaction)
            .await?
            .rows_affected();
        sqlx::query("UPDATE events_pruned SET through = greatest(through, $1) WHERE id = 1")
            .bind(through)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(removed)
    }
}
