//! [`Events`] and [`Webhooks`] on SQLite: pages and subscriptions read from the read pool
//! (a page in one read transaction), every write submitted to the writer.

use async_trait::async_trait;

use super::events::read;
use uuid::Uuid;

use super::webhooks::{
    counts, delivery_from_row, load, webhook_from_row, OutboxAnswer, OutboxOp, DELIVERY_COLUMNS,
};
use super::writer::WriteOp;
use super::SqliteLedger;
use crate::clock::Micros;
use crate::error::LedgerError;
use crate::error::Result;
use crate::events::{page_limit, EventPage, EventQuery, Events};
use crate::webhooks::{
    Claimed, Delivery, DeliveryClaim, DeliveryCounts, DeliveryFinished, DeliveryState, Webhook,
    WebhookChanged, WebhookCommand, Webhooks,
};

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

impl SqliteLedger {
    pub(super) async fn outbox_op(&self, op: OutboxOp) -> Result<OutboxAnswer> {
        self.submit(|reply| WriteOp::Outbox(op, reply)).await?
    }
}

fn unexpected(answer: OutboxAnswer) -> LedgerError {
    LedgerError::Internal(format!("unexpected answer {answer:?}"))
}

#[async_trait]
impl Webhooks for SqliteLedger {
    async fn change_webhook(&self, command: WebhookCommand) -> Result<WebhookChanged> {
        match self.outbox_op(OutboxOp::Change(command)).await? {
            OutboxAnswer::Changed(changed) => Ok(*changed),
            other => Err(unexpected(other)),
        }
    }

    async fn webhooks(&self) -> Result<Vec<Webhook>> {
        sqlx::query("SELECT * FROM webhooks ORDER BY created_at DESC, id DESC")
            .fetch_all(self.read_pool())
            .await?
            .iter()
            .map(webhook_from_row)
            .collect()
    }

    async fn webhook(&self, id: Uuid) -> Result<Option<Webhook>> {
        load(self.read_pool(), id).await
    }

    async fn claim_deliveries(&self, claim: &DeliveryClaim) -> Result<Vec<Claimed>> {
        match self.outbox_op(OutboxOp::Claim(claim.clone())).await? {
            OutboxAnswer::Claimed(claimed) => Ok(claimed),
            other => Err(unexpected(other)),
        }
    }

    async fn finish_delivery(&self, finished: &DeliveryFinished) -> Result<bool> {
        match self.outbox_op(OutboxOp::Finish(finished.clone())).await? {
            OutboxAnswer::Finished(done) => Ok(done),
            other => Err(unexpected(other)),
        }
    }

    async fn deliveries(
        &self,
        webhook_id: Uuid,
        state: Option<DeliveryState>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Delivery>> {
        sqlx::query(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE webhook_id = ? AND seq > ? \
             AND (? IS NULL OR state = ?) ORDER BY seq LIMIT ?"
        ))
        .bind(webhook_id.to_string())
        .bind(after)
        .bind(state.map(DeliveryState::as_str))
        .bind(state.map(DeliveryState::as_str))
        .bind(i64::from(
            limit.clamp(1, crate::events::MAX_EVENTS_PER_PAGE),
        ))
        .fetch_all(self.read_pool())
        .await?
        .iter()
        .map(delivery_from_row)
        .collect()
    }

    async fn delivery_counts(&self) -> Result<Vec<(Uuid, DeliveryCounts)>> {
        let mut connection = self.read_pool().acquire().await?;
        sqlx::query("BEGIN").execute(&mut *connection).await?;
        let result = counts(&mut connection).await;
        let _ = sqlx::query("COMMIT").execute(&mut *connection).await;
        result
    }
}
