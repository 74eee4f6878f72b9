//! Webhook subscriptions and their deliveries: the outbox's events, pushed to receivers as
//! leased jobs.
//!
//! ## Model
//! - A [`Webhook`] is a subscription: a URL, the event types and datasets it wants, and its
//!   signing secret, stored sealed (the ledger never holds the secret in clear; the process
//!   that signs holds the key). Its state is `active`, `paused`, `disabled` (its receiver
//!   answered 410 Gone) or `deleted`. Every change goes through [`Webhooks::change_webhook`]
//!   and is recorded in `history` (entity `webhook`) by the store.
//! - Each subscription keeps a **cursor** in the outbox. A claim first *fans out*: the events
//!   after the cursor that the subscription wants become its [`Delivery`] rows, and the cursor
//!   moves, in one transaction. An event is in the outbox from the commit of its change, so a
//!   delivery can be neither lost nor invented: rows come only from events, and the cursor
//!   moves only with the rows.
//! - A delivery is a leased job: `pending` → `delivering` (an owner, a lease, a fencing
//!   number) → `delivered`, back to `pending` with a later `next_at` (a failed attempt), or
//!   `dead` (its retry span is spent). An operator can retry or discard dead deliveries, and
//!   replay every event from a sequence number.
//! - **Order per source.** Deliveries share a *lane* when they are about the same source
//!   (events about no source share one lane). A delivery is claimable only when no earlier
//!   delivery of its lane is still `pending` or `delivering`: a source's events arrive in
//!   order, different sources in parallel. A dead delivery no longer holds its lane.
//!
//! ## Invariants
//! - A finished attempt counts only with the fencing number of its claim; a stale one
//!   changes nothing.
//! - Retention of the outbox removes the deliveries of the events it removes.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::events::{Event, EventType};

/// The most subscriptions a ledger holds (deleted ones do not count).
pub const MAX_WEBHOOKS: i64 = 100;
/// The longest URL accepted.
pub const MAX_URL_CHARS: usize = 2_048;
/// The longest description accepted.
pub const MAX_DESCRIPTION_CHARS: usize = 1_000;
/// The most events one claim fans out per subscription.
pub const FAN_OUT_PER_CLAIM: i64 = 1_000;
/// The most deliveries one claim takes.
pub const MAX_CLAIM: u32 = 256;

/// A subscription's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WebhookState {
    /// Its events are delivered.
    Active,
    /// Its events wait (fanned out at resume, while retention keeps them).
    Paused,
    /// Its receiver answered 410 Gone; nothing is delivered until it is resumed.
    Disabled,
    /// Removed for good; its pending deliveries were discarded.
    Deleted,
}

impl WebhookState {
    /// Its stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookState::Active => "active",
            WebhookState::Paused => "paused",
            WebhookState::Disabled => "disabled",
            WebhookState::Deleted => "deleted",
        }
    }
}

impl std::fmt::Display for WebhookState {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl std::str::FromStr for WebhookState {
    type Err = String;
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        [
            WebhookState::Active,
            WebhookState::Paused,
            WebhookState::Disabled,
            WebhookState::Deleted,
        ]
        .into_iter()
        .find(|state| state.as_str() == text)
        .ok_or_else(|| format!("unknown webhook state `{text}`"))
    }
}

/// A subscription, as stored (its secrets sealed).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Webhook {
    /// Its id.
    pub id: Uuid,
    /// Where deliveries go.
    pub url: String,
    /// The types it wants (empty: every type).
    pub events: Vec<EventType>,
    /// The datasets it wants (`None`: every dataset, and events about none).
    pub datasets: Option<Vec<String>>,
    /// What it is for.
    pub description: String,
    /// Its state.
    pub state: WebhookState,
    /// Why it is disabled, when it is.
    pub disabled_reason: Option<String>,
    /// The signing secret, sealed by the process that signs.
    #[serde(skip)]
    pub sealed_secret: String,
    /// The secret before the last rotation, sealed, while it still signs.
    #[serde(skip)]
    pub previous_sealed_secret: Option<String>,
    /// Until when the previous secret signs too.
    pub previous_secret_until: Option<Micros>,
    /// The last outbox event fanned out to it.
    pub cursor: i64,
    /// Who created it.
    pub created_by: String,
    /// When.
    pub created_at: Micros,
    /// Who changed it last.
    pub changed_by: String,
    /// Why.
    pub change_cause: String,
    /// When.
    pub changed_at: Micros,
}

/// A subscription to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewWebhook {
    /// Its id, chosen by the caller (the sealed secret is bound to it).
    pub id: Uuid,
    /// Where deliveries go (checked by the caller's target policy).
    pub url: String,
    /// The types it wants (empty: every type).
    pub events: Vec<EventType>,
    /// The datasets it wants (`None`: every dataset).
    pub datasets: Option<Vec<String>>,
    /// What it is for.
    pub description: String,
    /// The signing secret, sealed.
    pub sealed_secret: String,
}

/// A change to a subscription or to its deliveries.
#[derive(Debug, Clone, PartialEq)]
pub enum WebhookChange {
    /// A new subscription; it receives the events committed from now on.
    Create(NewWebhook),
    /// Deliveries stop; events wait.
    Pause(Uuid),
    /// Active again (from paused or disabled).
    Resume(Uuid),
    /// A new secret; the current one keeps signing until `previous_until`.
    RotateSecret {
        /// The subscription.
        id: Uuid,
        /// The new secret, sealed.
        sealed_secret: String,
        /// Until when the one it replaces still signs.
        previous_until: Micros,
    },
    /// Removed for good; its waiting deliveries are discarded.
    Delete(Uuid),
    /// Its receiver answered 410 Gone.
    Disable {
        /// The subscription.
        id: Uuid,
        /// Why.
        reason: String,
    },
    /// Dead deliveries (one, or all) are pending again, with a fresh retry span.
    RetryDead {
        /// The subscription.
        id: Uuid,
        /// One event's delivery, or every dead one.
        seq: Option<i64>,
    },
    /// Dead deliveries (one, or all) are discarded.
    DiscardDead {
        /// The subscription.
        id: Uuid,
        /// One event's delivery, or every dead one.
        seq: Option<i64>,
    },
    /// Every event from `from` on that the subscription wants is delivered again.
    Replay {
        /// The subscription.
        id: Uuid,
        /// The first sequence number to deliver again.
        from: i64,
    },
}

impl WebhookChange {
    /// The subscription it changes (for a creation, the new one).
    pub fn id(&self) -> Uuid {
        match self {
            WebhookChange::Create(new) => new.id,
            WebhookChange::Pause(id) | WebhookChange::Resume(id) | WebhookChange::Delete(id) => *id,
            WebhookChange::RotateSecret { id, .. }
            | WebhookChange::Disable { id, .. }
            | WebhookChange::RetryDead { id, .. }
            | WebhookChange::DiscardDead { id, .. }
            | WebhookChange::Replay { id, .. } => *id,
        }
    }

    /// Its name in history.
    pub fn action(&self) -> &'static str {
        match self {
            WebhookChange::Create(_) => "create",
            WebhookChange::Pause(_) => "pause",
            WebhookChange::Resume(_) => "resume",
            WebhookChange::RotateSecret { .. } => "rotate_secret",
            WebhookChange::Delete(_) => "delete",
            WebhookChange::Disable { .. } => "disable",
            WebhookChange::RetryDead { .. } => "retry_dead",
            WebhookChange::DiscardDead { .. } => "discard_dead",
            WebhookChange::Replay { .. } => "replay",
        }
    }
}

/// A change with who asks and why.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookCommand {
    /// The change.
    pub change: WebhookChange,
    /// Who (recorded in history).
    pub actor: String,
    /// Why (recorded in history).
    pub reason: String,
}

/// What a change did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WebhookChanged {
    /// The subscription after it.
    pub webhook: Webhook,
    /// Deliveries it touched (retried, discarded, replayed).
    pub deliveries: u64,
}

/// The state the store moves a subscription to, or the refusal, for `change` on `current`.
/// Both engines call this, so they refuse the same changes the same way.
pub fn next_state(current: &Webhook, change: &WebhookChange) -> Result<WebhookState> {
    let state = current.state;
    if state == WebhookState::Deleted {
        return Err(LedgerError::invalid(
            "webhook_state",
            format!("webhook {} is deleted", current.id),
        ));
    }
    Ok(match change {
        WebhookChange::Create(_) => {
            return Err(LedgerError::invalid(
                "webhook_state",
                format!("webhook {} exists", current.id),
            ))
        }
        WebhookChange::Pause(_) => match state {
            WebhookState::Active | WebhookState::Paused => WebhookState::Paused,
            other => {
                return Err(LedgerError::invalid(
                    "webhook_state",
                    format!("webhook {} is {other}; resume it instead", current.id),
                ))
            }
        },
        WebhookChange::Resume(_) => WebhookState::Active,
        WebhookChange::Delete(_) => WebhookState::Deleted,
        WebhookChange::Disable { .. } => WebhookState::Disabled,
        WebhookChange::RotateSecret { .. }
        | WebhookChange::RetryDead { .. }
        | WebhookChange::DiscardDead { .. }
        | WebhookChange::Replay { .. } => state,
    })
}

/// The refusal for a subscription that does not exist.
pub fn not_found(id: Uuid) -> LedgerError {
    LedgerError::invalid("webhook_not_found", format!("webhook {id} not found"))
}

/// A delivery's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Waiting for its `next_at` (and for the earlier deliveries of its lane).
    Pending,
    /// Claimed: an attempt is under way.
    Delivering,
    /// The receiver answered 2xx.
    Delivered,
    /// Its retry span is spent; an operator may retry or discard it.
    Dead,
    /// Dropped by an operator (or its subscription's deletion).
    Discarded,
}

impl DeliveryState {
    /// Every state.
    pub const ALL: [DeliveryState; 5] = [
        DeliveryState::Pending,
        DeliveryState::Delivering,
        DeliveryState::Delivered,
        DeliveryState::Dead,
        DeliveryState::Discarded,
    ];

    /// Its stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivering => "delivering",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Dead => "dead",
            DeliveryState::Discarded => "discarded",
        }
    }
}

impl std::str::FromStr for DeliveryState {
    type Err = String;
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        DeliveryState::ALL
            .into_iter()
            .find(|state| state.as_str() == text)
            .ok_or_else(|| {
                format!(
                    "unknown delivery state `{}`; one of {}",
                    text.chars().take(32).collect::<String>(),
                    DeliveryState::ALL.map(DeliveryState::as_str).join(", ")
                )
            })
    }
}

/// One event's delivery to one subscription.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Delivery {
    /// The subscription.
    pub webhook_id: Uuid,
    /// The event's sequence number.
    pub seq: i64,
    /// Its lane: deliveries of one lane go in sequence order.
    pub lane: String,
    /// Its state.
    pub state: DeliveryState,
    /// Attempts so far.
    pub attempt: i64,
    /// When it may be tried next.
    pub next_at: Micros,
    /// When its retry span began (fan-out, or the operator's retry).
    pub first_at: Micros,
    /// The fencing number of its latest claim.
    pub fence: i64,
    /// The receiver's last HTTP status, if it answered.
    pub last_status: Option<i64>,
    /// What went wrong last, if anything did.
    pub last_error: Option<String>,
    /// When the receiver answered 2xx.
    pub delivered_at: Option<Micros>,
}

/// A claimed delivery with its event.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    /// The delivery (its `fence` is the claim's).
    pub delivery: Delivery,
    /// The event to deliver.
    pub event: Event,
}

/// What to claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryClaim {
    /// The subscription.
    pub webhook_id: Uuid,
    /// Who claims (a process's name).
    pub owner: String,
    /// How long the claim holds.
    pub lease_ms: i64,
    /// At most this many.
    pub limit: u32,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempted {
    /// The receiver answered 2xx.
    Delivered {
        /// Its status.
        status: u16,
    },
    /// It did not; try again at `retry_at`, or, with `None`, the delivery is dead.
    Failed {
        /// The receiver's status, if it answered.
        status: Option<u16>,
        /// What went wrong (no secret, no body).
        error: String,
        /// When to try again.
        retry_at: Option<Micros>,
    },
    /// The receiver answered 410 Gone: the delivery waits, and the subscription is disabled.
    Gone,
}

/// What an attempt's end writes on its delivery row (both engines write exactly this).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishRow {
    /// The delivery's next state.
    pub state: DeliveryState,
    /// Its next `next_at` (`None`: unchanged).
    pub next_at: Option<Micros>,
    /// The receiver's status, if it answered.
    pub status: Option<i64>,
    /// What went wrong, if anything did.
    pub error: Option<String>,
    /// When it was delivered.
    pub delivered_at: Option<Micros>,
}

impl Attempted {
    /// The row an attempt ending this way at `now` leaves: delivered; pending again at the
    /// retry time (or at once after a 410, waiting for the disabled webhook's resumption);
    /// dead when no retry time is left.
    pub fn row(&self, now: Micros) -> FinishRow {
        match self {
            Attempted::Delivered { status } => FinishRow {
                state: DeliveryState::Delivered,
                next_at: None,
                status: Some(i64::from(*status)),
                error: None,
                delivered_at: Some(now),
            },
            Attempted::Failed {
                status,
                error,
                retry_at,
            } => FinishRow {
                state: if retry_at.is_some() {
                    DeliveryState::Pending
                } else {
                    DeliveryState::Dead
                },
                next_at: *retry_at,
                status: status.map(i64::from),
                error: Some(error.clone()),
                delivered_at: None,
            },
            Attempted::Gone => FinishRow {
                state: DeliveryState::Pending,
                next_at: Some(now),
                status: Some(410),
                error: Some("the receiver answered 410 Gone".to_owned()),
                delivered_at: None,
            },
        }
    }
}

/// The change a 410 to event `seq` makes to its webhook, by cairn itself.
pub fn disabled_by_gone(id: Uuid, seq: i64) -> WebhookCommand {
    WebhookCommand {
        change: WebhookChange::Disable {
            id,
            reason: format!("the receiver answered 410 Gone to event {seq}"),
        },
        actor: "cairn:webhooks".to_owned(),
        reason: "the receiver answered 410 Gone".to_owned(),
    }
}

/// Refuses a replay from `from` when retention removed events through `pruned_through`.
pub fn check_replay(from: i64, pruned_through: i64) -> Result<()> {
    if from < 1 || from <= pruned_through {
        return Err(LedgerError::invalid(
            "cursor_expired",
            format!(
                "a replay starts after the events retention removed: from {} or later",
                pruned_through + 1
            ),
        ));
    }
    Ok(())
}

/// The refusal of an action on one dead delivery that is not there.
pub fn no_dead_delivery(id: Uuid, seq: i64) -> LedgerError {
    LedgerError::invalid(
        "delivery_not_found",
        format!("webhook {id} has no dead delivery of event {seq}"),
    )
}

/// An attempt's end, fenced by its claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryFinished {
    /// The subscription.
    pub webhook_id: Uuid,
    /// The event.
    pub seq: i64,
    /// The claim's fencing number.
    pub fence: i64,
    /// How it ended.
    pub outcome: Attempted,
}

/// A subscription's deliveries, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeliveryCounts {
    /// Waiting.
    pub pending: i64,
    /// Being attempted.
    pub delivering: i64,
    /// Delivered.
    pub delivered: i64,
    /// Dead.
    pub dead: i64,
    /// Discarded.
    pub discarded: i64,
    /// When the oldest event still waiting (pending or delivering) happened.
    pub oldest_undelivered_at: Option<Micros>,
    /// Outbox events after the cursor (not yet fanned out), whatever their type.
    pub behind: i64,
}

impl DeliveryCounts {
    /// Adds `count` deliveries in `state`.
    pub fn add(&mut self, state: DeliveryState, count: i64) {
        match state {
            DeliveryState::Pending => self.pending += count,
            DeliveryState::Delivering => self.delivering += count,
            DeliveryState::Delivered => self.delivered += count,
            DeliveryState::Dead => self.dead += count,
            DeliveryState::Discarded => self.discarded += count,
        }
    }
}

/// The lane of an event: its source, or the lane of events about no source.
pub fn lane(event_dataset: Option<&str>, source_key: Option<&str>) -> String {
    match (event_dataset, source_key) {
        (Some(dataset), Some(key)) => format!("{dataset}\n{key}"),
        _ => String::new(),
    }
}

/// Subscriptions and their deliveries.
#[async_trait]
pub trait Webhooks: Send + Sync {
    /// Applies `command` (the one path for every change), recording it in history.
    async fn change_webhook(&self, command: WebhookCommand) -> Result<WebhookChanged>;

    /// Every subscription, deleted ones too, newest first.
    async fn webhooks(&self) -> Result<Vec<Webhook>>;

    /// One subscription.
    async fn webhook(&self, id: Uuid) -> Result<Option<Webhook>>;

    /// Fans out the subscription's new events, then claims up to `claim.limit` deliveries
    /// that are due and first in their lanes. Nothing for a subscription that is not active.
    async fn claim_deliveries(&self, claim: &DeliveryClaim) -> Result<Vec<Claimed>>;

    /// Records an attempt's end; `false` when the claim was stale (nothing changed).
    async fn finish_delivery(&self, finished: &DeliveryFinished) -> Result<bool>;

    /// A subscription's deliveries in sequence order, from `after`, optionally in one state.
    async fn deliveries(
        &self,
        webhook_id: Uuid,
        state: Option<DeliveryState>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Delivery>>;

    /// Each subscription's deliveries, counted.
    async fn delivery_counts(&self) -> Result<Vec<(Uuid, DeliveryCounts)>>;
}
