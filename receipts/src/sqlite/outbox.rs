//! [`Events`] on SQLite: pages read from a pooled connection in one read transaction,
//! retention submitted to the writer.

use async_trait::async_trait;

use super::events::read;
use super::webhooks::{OutboxAnswer, OutboxOp};
use super::SqliteLedger;
use crate::clock::Micros;
use crate::error::Result;
use crate::events::{page_limit, EventPage, EventQuery, Events};

#[async_trait]
impl Events for SqliteLedger {
    async fn events(&self, query: &EventQuery) -> Result<EventPage> {
        let limit = page_limit(query.limit);
        let mut connection = self.read_pool().acquire().await?;
        // One read transaction: the newest number and the page come from one snapshot.
        sqlx::query("BEGIN").execute(&mut *connection).await?;
        let result = read(&mut connection, query, limit).await;
        let _ = sqlx::query("COMMIT").execute(&mut *connection).await;
        result
    }

    async fn prune_events(&self, before: Micros) -> Result<u64> {
        match self.outbox_op(OutboxOp::Prune(before)).await? {
            OutboxAnswer::Pruned(removed) => Ok(removed),
            other => Err(crate::error::LedgerError::Internal(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }
}
