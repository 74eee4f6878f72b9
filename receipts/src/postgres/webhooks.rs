//! Webhooks on PostgreSQL (schema 24): each change, claim and finished attempt in one
//! transaction with its subscription's row locked, so that processes sharing the ledger fan
//! out and claim one subscription at a time; the reads from one snapshot.

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::{parse_enum, PostgresLedger};
use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::events::{Event, EventType};
use crate::webhooks::{
    self, Attempted, Claimed, Delivery, DeliveryClaim, DeliveryCounts, DeliveryFinished,
    DeliveryState, Webhook, WebhookChange, WebhookChanged, WebhookCommand, WebhookState, Webhooks,
    FAN_OUT_PER_CLAIM, MAX_CLAIM, MAX_WEBHOOKS,
};

const DELIVERY_COLUMNS: &str = "webhook_id, seq, lane, state, attempt, next_at, first_at, fence, \
                                last_status, last_error, delivered_at";

fn webhook_from_row(row: &PgRow) -> Result<Webhook> {
    let events: Vec<String> = serde_json::from_value(row.try_get("events")?)
        .map_err(|error| LedgerError::Corrupt(format!("webhook events: {error}")))?;
    let datasets: Option<serde_json::Value> = row.try_get("datasets")?;
    Ok(Webhook {
        id: row.try_get("id")?,
        url: row.try_get("url")?,
        events: events
            .iter()
            .map(|name| parse_enum::<EventType>(name))
            .collect::<Result<_>>()?,
        datasets: datasets
            .map(serde_json::from_value)
            .transpose()
            .map_err(|error| LedgerError::Corrupt(format!("webhook datasets: {error}")))?,
        description: row.try_get("description")?,
        state: parse_enum(&row.try_get::<String, _>("state")?)?,
        disabled_reason: row.try_get("disabled_reason")?,
        sealed_secret: row.try_get("sealed_secret")?,
        previous_sealed_secret: row.try_get("previous_sealed_secret")?,
        previous_secret_until: row.try_get("previous_secret_until")?,
        cursor: row.try_get("cursor")?,
        created_by: row.try_get("created_by")?,
        created_at: row.try_get("created_at")?,
        changed_by: row.try_get("changed_by")?,
        change_cause: row.try_get("change_cause")?,
        changed_at: row.try_get("changed_at")?,
    })
}

fn delivery_from_row(row: &PgRow) -> Result<Delivery> {
    Ok(Delivery {
        webhook_id: row.try_get("webhook_id")?,
        seq: row.try_get("seq")?,
        lane: row.try_get("lane")?,
        state: parse_enum(&row.try_get::<String, _>("state")?)?,
        attempt: row.try_get("attempt")?,
        next_at: row.try_get("next_at")?,
        first_at: row.try_get("first_at")?,
        fence: row.try_get("fence")?,
        last_status: row.try_get("last_status")?,
        last_error: row.try_get("last_error")?,
        delivered_at: row.try_get("delivered_at")?,
    })
}

/// The subscription, its row locked until the transaction ends.
async fn locked(connection: &mut PgConnection, id: Uuid) -> Result<Webhook> {
    sqlx::query("SELECT * FROM webhooks WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *connection)
        .await?
        .as_ref()
        .map(webhook_from_row)
        .transpose()?
        .ok_or_else(|| webhooks::not_found(id))
}

fn type_names(webhook_events: &[EventType]) -> serde_json::Value {
    serde_json::Value::from(
        webhook_events
            .iter()
            .map(|kind| kind.as_str())
            .collect::<Vec<_>>(),
    )
}

/// Deliveries for the numbered events in `(after, through]` that `webhook` wants (those it
/// already has are kept); how many were added.
async fn fan_out(
    connection: &mut PgConnection,
    webhook: &Webhook,
    after: i64,
    through: i64,
    now: Micros,
) -> Result<u64> {
    let datasets = webhook
        .datasets
        .as_ref()
        .map(|names| serde_json::Value::from(names.clone()));
    Ok(sqlx::query(
        "INSERT INTO deliveries (webhook_id, seq, lane, state, next_at, first_at) \
         SELECT $1, e.seq, \
                CASE WHEN e.dataset IS NOT NULL AND e.source_key IS NOT NULL \
                     THEN e.dataset || chr(10) || e.source_key ELSE '' END, \
                'pending', $2, $2 \
         FROM events e WHERE e.seq IS NOT NULL AND e.seq > $3 AND e.seq <= $4 \
           AND ($5::jsonb = '[]'::jsonb OR $5::jsonb ? e.type) \
           AND ($6::jsonb IS NULL OR $6::jsonb ? e.dataset) \
         ORDER BY e.seq \
         ON CONFLICT (webhook_id, seq) DO NOTHING",
    )
    .bind(webhook.id)
    .bind(now)
    .bind(after)
    .bind(through)
    .bind(type_names(&webhook.events))
    .bind(datasets)
    .execute(&mut *connection)
    .await?
    .rows_affected())
}

async fn newest_event(connection: &mut PgConnection) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM events WHERE seq IS NOT NULL")
            .fetch_one(&mut *connection)
            .await?,
    )
}

impl PostgresLedger {
    async fn create_webhook(
        &self,
        connection: &mut PgConnection,
        command: &WebhookCommand,
        new: &webhooks::NewWebhook,
        now: Micros,
    ) -> Result<Webhook> {
        // Creations take the table's lock, so two cannot both pass the count.
        sqlx::query("LOCK TABLE webhooks IN SHARE ROW EXCLUSIVE MODE")
            .execute(&mut *connection)
            .await?;
        let live: i64 =
            sqlx::query_scalar("SELECT count(*) FROM webhooks WHERE state <> 'deleted'")
                .fetch_one(&mut *connection)
                .await?;
        if live >= MAX_WEBHOOKS {
            return Err(LedgerError::invalid(
                "too_many_webhooks",
                format!("at most {MAX_WEBHOOKS} webhooks; delete one first"),
            ));
        }
        let cursor = newest_event(&mut *connection).await?;
        sqlx::query(
            "INSERT INTO webhooks (id, url, events, datasets, description, state, sealed_secret, \
             cursor, created_by, created_at, changed_by, change_cause, changed_at, last_action) \
             VALUES ($1, $2, $3, $4, $5, 'active', $6, $7, $8, $9, $8, $10, $9, 'create')",
        )
        .bind(new.id)
        .bind(&new.url)
        .bind(type_names(&new.events))
        .bind(
            new.datasets
                .as_ref()
                .map(|names| serde_json::Value::from(names.clone())),
        )
        .bind(&new.description)
        .bind(&new.sealed_secret)
        .bind(cursor)
        .bind(&command.actor)
        .bind(now)
        .bind(&command.reason)
        .execute(&mut *connection)
        .await?;
        locked(connection, new.id).await
    }
}

async fn change(
    connection: &mut PgConnection,
    command: &WebhookCommand,
    current: Webhook,
    now: Micros,
) -> Result<WebhookChanged> {
    let id = current.id;
    let state = webhooks::next_state(&current, &command.change)?;
    let mut deliveries = 0;
    let mut disabled_reason = match state {
        WebhookState::Disabled => current.disabled_reason.clone(),
        _ => None,
    };
    let mut secrets = (
        current.sealed_secret.clone(),
        current.previous_sealed_secret.clone(),
        current.previous_secret_until,
    );
    match &command.change {
        WebhookChange::Create(_) | WebhookChange::Pause(_) | WebhookChange::Resume(_) => {}
        WebhookChange::Disable { reason, .. } => disabled_reason = Some(reason.clone()),
        WebhookChange::Delete(_) => {
            deliveries = sqlx::query(
                "UPDATE deliveries SET state = 'discarded', lease_owner = NULL, \
                 lease_until = NULL WHERE webhook_id = $1 \
                 AND state IN ('pending', 'delivering', 'dead')",
            )
            .bind(id)
            .execute(&mut *connection)
            .await?
            .rows_affected();
        }
        WebhookChange::RotateSecret {
            sealed_secret,
            previous_until,
            ..
        } => {
            secrets = (
                sealed_secret.clone(),
                Some(current.sealed_secret.clone()),
                Some(*previous_until),
            );
        }
        WebhookChange::RetryDead { seq, .. } | WebhookChange::DiscardDead { seq, .. } => {
            let retry = matches!(command.change, WebhookChange::RetryDead { .. });
            let set = if retry {
                "state = 'pending', attempt = 0, next_at = $1, first_at = $1, last_error = NULL"
            } else {
                "state = 'discarded'"
            };
            deliveries = sqlx::query(&format!(
                "UPDATE deliveries SET {set} WHERE webhook_id = $2 AND state = 'dead' \
                 AND ($3::bigint IS NULL OR seq = $3)"
            ))
            .bind(now)
            .bind(id)
            .bind(*seq)
            .execute(&mut *connection)
            .await?
            .rows_affected();
            if let (Some(seq), 0) = (seq, deliveries) {
                return Err(webhooks::no_dead_delivery(id, *seq));
            }
        }
        WebhookChange::Replay { from, .. } => {
            let pruned: i64 = sqlx::query_scalar("SELECT through FROM events_pruned WHERE id = 1")
                .fetch_one(&mut *connection)
                .await?;
            webhooks::check_replay(*from, pruned)?;
            sqlx::query(
                "DELETE FROM deliveries WHERE webhook_id = $1 AND seq >= $2 \
                 AND state <> 'delivering'",
            )
            .bind(id)
            .bind(*from)
            .execute(&mut *connection)
            .await?;
            deliveries = fan_out(&mut *connection, &current, from - 1, current.cursor, now).await?;
        }
    }
    sqlx::query(
        "UPDATE webhooks SET state = $1, disabled_reason = $2, sealed_secret = $3, \
         previous_sealed_secret = $4, previous_secret_until = $5, changed_by = $6, \
         change_cause = $7, changed_at = $8, last_action = $9, change_seq = change_seq + 1 \
         WHERE id = $10",
    )
    .bind(state.as_str())
    .bind(disabled_reason)
    .bind(&secrets.0)
    .bind(&secrets.1)
    .bind(secrets.2)
    .bind(&command.actor)
    .bind(&command.reason)
    .bind(now)
    .bind(command.change.action())
    .bind(id)
    .execute(&mut *connection)
    .await?;
    Ok(WebhookChanged {
        webhook: locked(connection, id).await?,
        deliveries,
    })
}

async fn event_at(connection: &mut PgConnection, seq: i64) -> Result<Event> {
    let row = sqlx::query(
        "SELECT seq, type, at, dataset, source_key, revision_id, data FROM events WHERE seq = $1",
    )
    .bind(seq)
    .fetch_optional(&mut *connection)
    .await?
    .ok_or_else(|| LedgerError::Corrupt(format!("a delivery names event {seq}, which is gone")))?;
    Event::read(
        seq,
        row.try_get("type")?,
        row.try_get("at")?,
        [
            row.try_get("dataset")?,
            row.try_get("source_key")?,
            row.try_get("revision_id")?,
        ],
        row.try_get("data")?,
    )
}

#[async_trait]
impl Webhooks for PostgresLedger {
    async fn change_webhook(&self, command: WebhookCommand) -> Result<WebhookChanged> {
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        let changed = if let WebhookChange::Create(new) = &command.change {
            WebhookChanged {
                webhook: self.create_webhook(&mut tx, &command, new, now).await?,
                deliveries: 0,
            }
        } else {
            let current = locked(&mut tx, command.change.id()).await?;
            change(&mut tx, &command, current, now).await?
        };
        tx.commit().await?;
        Ok(changed)
    }

    async fn webhooks(&self) -> Result<Vec<Webhook>> {
        sqlx::query("SELECT * FROM webhooks ORDER BY created_at DESC, id DESC")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(webhook_from_row)
            .collect()
    }

    async fn webhook(&self, id: Uuid) -> Result<Option<Webhook>> {
        sqlx::query("SELECT * FROM webhooks WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(webhook_from_row)
            .transpose()
    }

    async fn claim_deliveries(&self, claim: &DeliveryClaim) -> Result<Vec<Claimed>> {
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        let webhook = locked(&mut tx, claim.webhook_id).await?;
        if webhook.state != WebhookState::Active {
            return Ok(Vec::new());
        }
        let newest = newest_event(&mut tx).await?;
        let through = newest.min(webhook.cursor + FAN_OUT_PER_CLAIM);
        if through > webhook.cursor {
            fan_out(&mut tx, &webhook, webhook.cursor, through, now).await?;
            sqlx::query("UPDATE webhooks SET cursor = $1 WHERE id = $2")
                .bind(through)
                .bind(webhook.id)
                .execute(&mut *tx)
                .await?;
        }
        let rows = sqlx::query(&format!(
            "UPDATE deliveries SET state = 'delivering', attempt = attempt + 1, \
             fence = fence + 1, lease_owner = $1, lease_until = $2 \
             WHERE webhook_id = $3 AND seq IN ( \
               SELECT d.seq FROM deliveries d WHERE d.webhook_id = $3 \
             AND d.state IN ('pending', 'delivering') \
                 AND ((d.state = 'pending' AND d.next_at <= $4) \
                      OR (d.state = 'delivering' AND d.lease_until < $4)) \
                 AND NOT EXISTS (SELECT 1 FROM deliveries e WHERE e.webhook_id = d.webhook_id \
                                 AND e.lane = d.lane AND e.seq < d.seq \
                                 AND e.state IN ('pending', 'delivering')) \
                 ORDER BY d.seq LIMIT $5) \
             RETURNING {DELIVERY_COLUMNS}"
        ))
        .bind(&claim.owner)
        .bind(now.saturating_add(claim.lease_ms.saturating_mul(1000)))
        .bind(webhook.id)
        .bind(now)
        .bind(i64::from(claim.limit.clamp(1, MAX_CLAIM)))
        .fetch_all(&mut *tx)
        .await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in &rows {
            let delivery = delivery_from_row(row)?;
            let event = event_at(&mut tx, delivery.seq).await?;
            claimed.push(Claimed { delivery, event });
        }
        tx.commit().await?;
        claimed.sort_by_key(|claimed| claimed.delivery.seq);
        Ok(claimed)
    }

    async fn finish_delivery(&self, finished: &DeliveryFinished) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        let row = finished.outcome.row(now);
        let changed = sqlx::query(
            "UPDATE deliveries SET state = $1, next_at = coalesce($2, next_at), \
             last_status = $3, last_error = $4, delivered_at = $5, lease_owner = NULL, \
             lease_until = NULL \
             WHERE webhook_id = $6 AND seq = $7 AND fence = $8 AND state = 'delivering'",
        )
        .bind(row.state.as_str())
        .bind(row.next_at)
        .bind(row.status)
        .bind(row.error)
        .bind(row.delivered_at)
        .bind(finished.webhook_id)
        .bind(finished.seq)
        .bind(finished.fence)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if changed == 0 {
            return Ok(false);
        }
        if finished.outcome == Attempted::Gone {
            let current = locked(&mut tx, finished.webhook_id).await?;
            if current.state == WebhookState::Active {
                let command = webhooks::disabled_by_gone(finished.webhook_id, finished.seq);
                change(&mut tx, &command, current, now).await?;
            }
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn deliveries(
        &self,
        webhook_id: Uuid,
        state: Option<DeliveryState>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Delivery>> {
        sqlx::query(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE webhook_id = $1 AND seq > $2 \
             AND ($3::text IS NULL OR state = $3) ORDER BY seq LIMIT $4"
        ))
        .bind(webhook_id)
        .bind(after)
        .bind(state.map(DeliveryState::as_str))
        .bind(i64::from(
            limit.clamp(1, crate::events::MAX_EVENTS_PER_PAGE),
        ))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(delivery_from_row)
        .collect()
    }

    async fn delivery_counts(&self) -> Result<Vec<(Uuid, DeliveryCounts)>> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        let mut all: Vec<(Uuid, DeliveryCounts)> = Vec::new();
        let hooks = sqlx::query(
            "SELECT w.id, \
                    (SELECT count(*) FROM events e WHERE e.seq IS NOT NULL AND e.seq > w.cursor) \
                      AS behind, \
                    (SELECT min(e.at) FROM deliveries d JOIN events e ON e.seq = d.seq \
                     WHERE d.webhook_id = w.id AND d.state IN ('pending', 'delivering')) \
                      AS oldest \
             FROM webhooks w ORDER BY w.created_at, w.id",
        )
        .fetch_all(&mut *tx)
        .await?;
        for row in &hooks {
            all.push((
                row.try_get("id")?,
                DeliveryCounts {
                    behind: row.try_get("behind")?,
                    oldest_undelivered_at: row.try_get("oldest")?,
                    ..DeliveryCounts::default()
                },
            ));
        }
        let rows = sqlx::query(
            "SELECT webhook_id, state, count(*) AS n FROM deliveries GROUP BY webhook_id, state",
        )
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        for row in &rows {
            let id: Uuid = row.try_get("webhook_id")?;
            let state: DeliveryState = parse_enum(&row.try_get::<String, _>("state")?)?;
            if let Some((_, counts)) = all.iter_mut().find(|(each, _)| *each == id) {
                counts.add(state, row.try_get("n")?);
            }
        }
        Ok(all)
    }
}
