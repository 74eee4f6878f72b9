//! Webhooks on SQLite (schema 23): what the writer executes (changes, claims with their
//! fan-out, finished attempts, the outbox's retention) and the rows' decoding. The
//! [`crate::webhooks::Webhooks`] implementation that submits and reads them is in `outbox.rs`.

use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::{Row, SqliteExecutor};
use uuid::Uuid;

use super::rows::{json_text, parse_enum, parse_uuid};
use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::events::{Event, EventType};
use crate::webhooks::{
    self, Attempted, Claimed, Delivery, DeliveryClaim, DeliveryCounts, DeliveryFinished,
    DeliveryState, Webhook, WebhookChange, WebhookChanged, WebhookCommand, WebhookState,
    FAN_OUT_PER_CLAIM, MAX_CLAIM, MAX_WEBHOOKS,
};

/// An outbox write, run by the writer.
#[derive(Debug)]
pub(crate) enum OutboxOp {
    /// Retention: removes the events (and their deliveries) that happened before the time.
    Prune(Micros),
    Change(WebhookCommand),
    Claim(DeliveryClaim),
    Finish(DeliveryFinished),
}

/// The writer's answer to an [`OutboxOp`].
#[derive(Debug)]
pub(crate) enum OutboxAnswer {
    Pruned(u64),
    Changed(Box<WebhookChanged>),
    Claimed(Vec<Claimed>),
    Finished(bool),
}

pub(crate) async fn run(
    connection: &mut SqliteConnection,
    op: OutboxOp,
    now: Micros,
) -> Result<OutboxAnswer> {
    match op {
        OutboxOp::Prune(before) => super::events::prune(connection, before)
            .await
            .map(OutboxAnswer::Pruned),
        OutboxOp::Change(command) => change(connection, command, now)
            .await
            .map(|changed| OutboxAnswer::Changed(Box::new(changed))),
        OutboxOp::Claim(claim) => claim_due(connection, &claim, now)
            .await
            .map(OutboxAnswer::Claimed),
        OutboxOp::Finish(finished) => finish(connection, &finished, now)
            .await
            .map(OutboxAnswer::Finished),
    }
}

pub(super) const DELIVERY_COLUMNS: &str =
    "webhook_id, seq, lane, state, attempt, next_at, first_at, fence, \
                                last_status, last_error, delivered_at";

pub(super) fn webhook_from_row(row: &SqliteRow) -> Result<Webhook> {
    let events: Vec<String> = serde_json::from_str(&row.try_get::<String, _>("events")?)
        .map_err(|error| LedgerError::Corrupt(format!("webhook events: {error}")))?;
    let datasets: Option<String> = row.try_get("datasets")?;
    Ok(Webhook {
        id: parse_uuid(&row.try_get::<String, _>("id")?)?,
        url: row.try_get("url")?,
        events: events
            .iter()
            .map(|name| parse_enum::<EventType>(name))
            .collect::<Result<_>>()?,
        datasets: datasets
            .map(|text| serde_json::from_str(&text))
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

pub(super) fn delivery_from_row(row: &SqliteRow) -> Result<Delivery> {
    Ok(Delivery {
        webhook_id: parse_uuid(&row.try_get::<String, _>("webhook_id")?)?,
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

pub(super) async fn load<'e>(
    executor: impl SqliteExecutor<'e>,
    id: Uuid,
) -> Result<Option<Webhook>> {
    sqlx::query("SELECT * FROM webhooks WHERE id = ?")
        .bind(id.to_string())
        .fetch_optional(executor)
        .await?
        .as_ref()
        .map(webhook_from_row)
        .transpose()
}

/// Deliveries for the events in `(after, through]` that `webhook` wants (those it already
/// has are kept as they are); how many were added.
async fn fan_out(
    connection: &mut SqliteConnection,
    webhook: &Webhook,
    after: i64,
    through: i64,
    now: Micros,
) -> Result<u64> {
    let events: Vec<&str> = webhook.events.iter().map(|kind| kind.as_str()).collect();
    let added = sqlx::query(
        "INSERT OR IGNORE INTO deliveries (webhook_id, seq, lane, state, next_at, first_at) \
         SELECT ?1, e.seq, \
                CASE WHEN e.dataset IS NOT NULL AND e.source_key IS NOT NULL \
                     THEN e.dataset || char(10) || e.source_key ELSE '' END, \
                'pending', ?2, ?2 \
         FROM events e WHERE e.seq > ?3 AND e.seq <= ?4 \
           AND (?5 = '[]' OR e.type IN (SELECT value FROM json_each(?5))) \
           AND (?6 IS NULL OR e.dataset IN (SELECT value FROM json_each(?6)))",
    )
    .bind(webhook.id.to_string())
    .bind(now)
    .bind(after)
    .bind(through)
    .bind(json_text(&events))
    .bind(webhook.datasets.as_ref().map(json_text))
    .execute(&mut *connection)
    .await?
    .rows_affected();
    Ok(added)
}

async fn newest_event<'e>(executor: impl SqliteExecutor<'e>) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM events")
            .fetch_one(executor)
            .await?,
    )
}

async fn change(
    connection: &mut SqliteConnection,
    command: WebhookCommand,
    now: Micros,
) -> Result<WebhookChanged> {
    let id = command.change.id();
    let action = command.change.action();
    if let WebhookChange::Create(new) = &command.change {
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
        let events: Vec<&str> = new.events.iter().map(|kind| kind.as_str()).collect();
        sqlx::query(
            "INSERT INTO webhooks (id, url, events, datasets, description, state, sealed_secret, \
             cursor, created_by, created_at, changed_by, change_cause, changed_at, last_action) \
             VALUES (?, ?, ?, ?, ?, 'active', ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(id.to_string())
        .bind(&new.url)
        .bind(json_text(&events))
        .bind(new.datasets.as_ref().map(json_text))
        .bind(&new.description)
        .bind(&new.sealed_secret)
        .bind(cursor)
        .bind(&command.actor)
        .bind(now)
        .bind(&command.actor)
        .bind(&command.reason)
        .bind(now)
        .bind(action)
        .execute(&mut *connection)
        .await?;
        let webhook = load(&mut *connection, id)
            .await?
            .ok_or_else(|| webhooks::not_found(id))?;
        return Ok(WebhookChanged {
            webhook,
            deliveries: 0,
        });
    }
    let current = load(&mut *connection, id)
        .await?
        .ok_or_else(|| webhooks::not_found(id))?;
    let state = webhooks::next_state(&current, &command.change)?;
    let key = id.to_string();
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
    let cursor = current.cursor;
    match &command.change {
        WebhookChange::Create(_) | WebhookChange::Pause(_) | WebhookChange::Resume(_) => {}
        WebhookChange::Disable { reason, .. } => disabled_reason = Some(reason.clone()),
        WebhookChange::Delete(_) => {
            deliveries = sqlx::query(
                "UPDATE deliveries SET state = 'discarded', lease_owner = NULL, \
                 lease_until = NULL WHERE webhook_id = ? \
                 AND state IN ('pending', 'delivering', 'dead')",
            )
            .bind(&key)
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
                "state = 'pending', attempt = 0, next_at = ?1, first_at = ?1, last_error = NULL"
            } else {
                "state = 'discarded'"
            };
            deliveries = sqlx::query(&format!(
                "UPDATE deliveries SET {set} WHERE webhook_id = ?2 AND state = 'dead' \
                 AND (?3 IS NULL OR seq = ?3)"
            ))
            .bind(now)
            .bind(&key)
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
            // Every delivery from `from` on goes again, except one being attempted now (it
            // keeps its claim); events not yet fanned out are fanned out by the next claim.
            sqlx::query(
                "DELETE FROM deliveries WHERE webhook_id = ? AND seq >= ? \
                 AND state <> 'delivering'",
            )
            .bind(&key)
            .bind(*from)
            .execute(&mut *connection)
            .await?;
            deliveries = fan_out(&mut *connection, &current, from - 1, cursor, now).await?;
        }
    }
    sqlx::query(
        "UPDATE webhooks SET state = ?, disabled_reason = ?, sealed_secret = ?, \
         previous_sealed_secret = ?, previous_secret_until = ?, cursor = ?, changed_by = ?, \
         change_cause = ?, changed_at = ?, last_action = ?, change_seq = change_seq + 1 \
         WHERE id = ?",
    )
    .bind(state.as_str())
    .bind(disabled_reason)
    .bind(&secrets.0)
    .bind(&secrets.1)
    .bind(secrets.2)
    .bind(cursor)
    .bind(&command.actor)
    .bind(&command.reason)
    .bind(now)
    .bind(action)
    .bind(&key)
    .execute(&mut *connection)
    .await?;
    let webhook = load(&mut *connection, id)
        .await?
        .ok_or_else(|| webhooks::not_found(id))?;
    Ok(WebhookChanged {
        webhook,
        deliveries,
    })
}

async fn claim_due(
    connection: &mut SqliteConnection,
    claim: &DeliveryClaim,
    now: Micros,
) -> Result<Vec<Claimed>> {
    let Some(webhook) = load(&mut *connection, claim.webhook_id).await? else {
        return Err(webhooks::not_found(claim.webhook_id));
    };
    if webhook.state != WebhookState::Active {
        return Ok(Vec::new());
    }
    let key = webhook.id.to_string();
    let newest = newest_event(&mut *connection).await?;
    let through = newest.min(webhook.cursor + FAN_OUT_PER_CLAIM);
    if through > webhook.cursor {
        fan_out(&mut *connection, &webhook, webhook.cursor, through, now).await?;
        sqlx::query("UPDATE webhooks SET cursor = ? WHERE id = ?")
            .bind(through)
            .bind(&key)
            .execute(&mut *connection)
            .await?;
    }
    let rows = sqlx::query(&format!(
        "UPDATE deliveries SET state = 'delivering', attempt = attempt + 1, fence = fence + 1, \
         lease_owner = ?1, lease_until = ?2 \
         WHERE webhook_id = ?3 AND seq IN ( \
           SELECT d.seq FROM deliveries d WHERE d.webhook_id = ?3 \
             AND d.state IN ('pending', 'delivering') \
             AND ((d.state = 'pending' AND d.next_at <= ?4) \
                  OR (d.state = 'delivering' AND d.lease_until < ?4)) \
             AND NOT EXISTS (SELECT 1 FROM deliveries e WHERE e.webhook_id = d.webhook_id \
                             AND e.lane = d.lane AND e.seq < d.seq \
                             AND e.state IN ('pending', 'delivering')) \
             ORDER BY d.seq LIMIT ?5) \
         RETURNING {DELIVERY_COLUMNS}"
    ))
    .bind(&claim.owner)
    .bind(now.saturating_add(claim.lease_ms.saturating_mul(1000)))
    .bind(&key)
    .bind(now)
    .bind(i64::from(claim.limit.clamp(1, MAX_CLAIM)))
    .fetch_all(&mut *connection)
    .await?;
    let mut claimed = Vec::with_capacity(rows.len());
    for row in &rows {
        let delivery = delivery_from_row(row)?;
        let event = event_at(&mut *connection, delivery.seq).await?;
        claimed.push(Claimed { delivery, event });
    }
    claimed.sort_by_key(|claimed| claimed.delivery.seq);
    Ok(claimed)
}

async fn event_at(connection: &mut SqliteConnection, seq: i64) -> Result<Event> {
    let row = sqlx::query(
        "SELECT seq, type, at, dataset, source_key, revision_id, data FROM events WHERE seq = ?",
    )
    .bind(seq)
    .fetch_optional(&mut *connection)
    .await?
    .ok_or_else(|| LedgerError::Corrupt(format!("a delivery names event {seq}, which is gone")))?;
    let data: String = row.try_get("data")?;
    let data = serde_json::from_str(&data)
        .map_err(|error| LedgerError::Corrupt(format!("event {seq}'s data: {error}")))?;
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
}

async fn finish(
    connection: &mut SqliteConnection,
    finished: &DeliveryFinished,
    now: Micros,
) -> Result<bool> {
    let row = finished.outcome.row(now);
    let key = finished.webhook_id.to_string();
    let changed = sqlx::query(
        "UPDATE deliveries SET state = ?, next_at = coalesce(?, next_at), last_status = ?, \
         last_error = ?, delivered_at = ?, lease_owner = NULL, lease_until = NULL \
         WHERE webhook_id = ? AND seq = ? AND fence = ? AND state = 'delivering'",
    )
    .bind(row.state.as_str())
    .bind(row.next_at)
    .bind(row.status)
    .bind(row.error)
    .bind(row.delivered_at)
    .bind(&key)
    .bind(finished.seq)
    .bind(finished.fence)
    .execute(&mut *connection)
    .await?
    .rows_affected();
    if changed == 0 {
        return Ok(false);
    }
    if finished.outcome == Attempted::Gone {
        let current = load(&mut *connection, finished.webhook_id).await?;
        if current.is_some_and(|webhook| webhook.state == WebhookState::Active) {
            change(
                connection,
                webhooks::disabled_by_gone(finished.webhook_id, finished.seq),
                now,
            )
            .await?;
        }
    }
    Ok(true)
}

/// Every subscription's counts, from one snapshot.
pub(super) async fn counts(
    connection: &mut SqliteConnection,
) -> Result<Vec<(Uuid, DeliveryCounts)>> {
    let mut all: Vec<(Uuid, DeliveryCounts)> = Vec::new();
    let hooks = sqlx::query(
        "SELECT w.id, (SELECT count(*) FROM events e WHERE e.seq > w.cursor) AS behind, \
                (SELECT min(e.at) FROM deliveries d JOIN events e ON e.seq = d.seq \
                 WHERE d.webhook_id = w.id AND d.state IN ('pending', 'delivering')) AS oldest \
         FROM webhooks w ORDER BY w.created_at, w.id",
    )
    .fetch_all(&mut *connection)
    .await?;
    for row in &hooks {
        all.push((
            parse_uuid(&row.try_get::<String, _>("id")?)?,
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
    .fetch_all(&mut *connection)
    .await?;
    for row in &rows {
        let id = parse_uuid(&row.try_get::<String, _>("webhook_id")?)?;
        let state: DeliveryState = parse_enum(&row.try_get::<String, _>("state")?)?;
        if let Some((_, counts)) = all.iter_mut().find(|(each, _)| *each == id) {
            counts.add(state, row.try_get("n")?);
        }
    }
    Ok(all)
}
