//! The delivery loop: claims each active subscription's due deliveries (the ledger fans the
//! outbox out to them first), sends each signed to its receiver, and records how it went,
//! fenced by its claim.
//!
//! - **Fair and bounded.** Each subscription has at most `concurrency` attempts in flight, so
//!   a slow or silent receiver holds up only its own deliveries; every attempt is bounded in
//!   time (`attempt_timeout`) and in the bytes read back.
//! - **Retries** back off exponentially from `backoff_base` to `backoff_max`, with full
//!   jitter over the upper half of each step, until `retry_for` has passed since the delivery's
//!   span began; the last attempt falls at the end of the span, and a failure then makes the
//!   delivery `dead`.
//! - **Cheap when idle.** A subscription is claimed only when the outbox has events past its
//!   cursor, when one of its attempts just ended (a lane may have opened), when a retry this
//!   process scheduled falls due, or on a sweep every few seconds (for leases other
//!   processes left behind).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use receipts::events::EVENTS_VERSION;
use receipts::webhooks::{Attempted, Claimed, DeliveryClaim, DeliveryFinished, Webhook};
use receipts::{EventsLedger, Micros};
use ring::rand::{SecureRandom, SystemRandom};
use tokio::sync::watch;

use crate::sealing::Sealer;
use crate::signing::Secret;
use crate::target::{deliver, Outcome, TargetPolicy};

/// How deliveries are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatchSettings {
    /// How long a delivery is retried before it is dead (24 hours by default).
    pub retry_for: Duration,
    /// The first retry's delay (doubling each attempt).
    pub backoff_base: Duration,
    /// The longest delay between attempts.
    pub backoff_max: Duration,
    /// The most time one attempt may take.
    pub attempt_timeout: Duration,
    /// Attempts in flight per subscription.
    pub concurrency: usize,
    /// How often the loop looks for work.
    pub poll: Duration,
    /// This process's name on its claims.
    pub owner: String,
}

impl Default for DispatchSettings {
    fn default() -> Self {
        DispatchSettings {
            retry_for: Duration::from_secs(24 * 3600),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(3600),
            attempt_timeout: Duration::from_secs(10),
            concurrency: 16,
            poll: Duration::from_millis(50),
            owner: format!("{}:webhooks", std::process::id()),
        }
    }
}

/// A sweep claims every active subscription at least this often.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// How often the subscriptions are read again.
const LIST_EVERY: Duration = Duration::from_millis(250);
/// How often the gauges are read from the ledger.
const GAUGES_EVERY: Duration = Duration::from_secs(10);

/// What the loop knows of one subscription.
#[derive(Debug, Default)]
struct Lane {
    in_flight: Arc<AtomicUsize>,
    /// An attempt ended, or a retry is due: claim at the next tick.
    due_at: Option<Instant>,
    swept_at: Option<Instant>,
}

/// The delivery loop of one process.
pub struct Dispatcher {
    ledger: Arc<dyn EventsLedger>,
    sealer: Arc<Sealer>,
    client: reqwest::Client,
    policy: Arc<TargetPolicy>,
    settings: DispatchSettings,
    woken: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Dispatcher")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// A dispatcher delivering through `policy`'s checked client.
    pub fn new(
        ledger: Arc<dyn EventsLedger>,
        sealer: Arc<Sealer>,
        policy: Arc<TargetPolicy>,
        settings: DispatchSettings,
    ) -> Result<Dispatcher, String> {
        let client = policy.client(settings.attempt_timeout)?;
        Ok(Dispatcher {
            ledger,
            sealer,
            client,
            policy,
            settings,
            woken: Arc::new(tokio::sync::Notify::new()),
        })
    }

    /// Runs until `stop` turns true; attempts in flight finish or their leases lapse.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut lanes: HashMap<uuid::Uuid, Lane> = HashMap::new();
        let mut listed = None;
        let mut gauges_at = Instant::now();
        tracing::info!(owner = %self.settings.owner, "webhook deliveries running");
        loop {
            if *stop.borrow() {
                break;
            }
            if let Err(error) = self.tick(&mut lanes, &mut listed).await {
                tracing::warn!(%error, "webhook deliveries: a pass failed; trying again");
            }
            if gauges_at.elapsed() >= GAUGES_EVERY {
                gauges_at = Instant::now();
                if let Err(error) = self.gauges().await {
                    tracing::warn!(%error, "webhook gauges could not be read");
                }
            }
            tokio::select! {
                _ = stop.changed() => {}
                () = self.woken.notified() => {}
                () = tokio::time::sleep(self.settings.poll) => {}
            }
        }
    }

    /// One pass: claims what each active subscription may take, and starts the attempts.
    async fn tick(
        self: &Arc<Self>,
        lanes: &mut HashMap<uuid::Uuid, Lane>,
        listed: &mut Option<(Instant, Vec<Webhook>)>,
    ) -> receipts::Result<()> {
        // The subscriptions, read again at most every LIST_EVERY (a claim refuses one that
        // stopped being active meanwhile, so a stale list costs an empty claim at most).
        let fresh = listed
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < LIST_EVERY);
        if !fresh {
            *listed = Some((Instant::now(), self.ledger.webhooks().await?));
        }
        let active: Vec<Webhook> = listed
            .as_ref()
            .map(|(_, webhooks)| webhooks.as_slice())
            .unwrap_or_default()
            .iter()
            .filter(|webhook| webhook.state == receipts::webhooks::WebhookState::Active)
            .cloned()
            .collect();
        lanes.retain(|id, _| active.iter().any(|webhook| webhook.id == *id));
        if active.is_empty() {
            return Ok(());
        }
        let newest = self.ledger.newest_event().await?;
        let now = Instant::now();
        // Which subscriptions to claim for, and how many each may take.
        let mut wanted = Vec::new();
        for webhook in active {
            let lane = lanes.entry(webhook.id).or_default();
            let in_flight = lane.in_flight.load(Ordering::Acquire);
            let room = self.settings.concurrency.saturating_sub(in_flight);
            // Claim in batches: wait until a quarter of the slots are free, unless none is
            // busy (so one claim serves several attempts, and a lone event goes at once).
            let batch = (self.settings.concurrency / 4).max(1);
            if in_flight > 0 && room < batch {
                continue;
            }
            let behind = newest > webhook.cursor;
            let due = lane.due_at.is_some_and(|at| at <= now);
            let sweep = lane
                .swept_at
                .is_none_or(|at| now.duration_since(at) >= SWEEP_EVERY);
            if room == 0 || !(behind || due || sweep) {
                continue;
            }
            if sweep {
                lane.swept_at = Some(now);
            }
            lane.due_at = None;
            wanted.push((webhook, room));
        }
        // The claims run at once, so the ledger commits them together.
        let requests: Vec<DeliveryClaim> = wanted
            .iter()
            .map(|(webhook, room)| DeliveryClaim {
                webhook_id: webhook.id,
                owner: self.settings.owner.clone(),
                lease_ms: lease(&self.settings).as_millis() as i64,
                limit: *room as u32,
            })
            .collect();
        let claims = futures::future::join_all(
            requests
                .iter()
                .map(|request| self.ledger.claim_deliveries(request)),
        )
        .await;
        for ((webhook, room), claimed) in wanted.into_iter().zip(claims) {
            let claimed = claimed?;
            let lane = lanes.entry(webhook.id).or_default();
            if claimed.len() == room {
                // Full: there may be more once a slot frees.
                lane.due_at = Some(now);
            }
            for delivery in claimed {
                lane.in_flight.fetch_add(1, Ordering::AcqRel);
                let this = self.clone();
                let webhook = webhook.clone();
                let in_flight = lane.in_flight.clone();
                tokio::spawn(async move {
                    this.attempt(&webhook, delivery).await;
                    in_flight.fetch_sub(1, Ordering::AcqRel);
                    // Its lane may have opened: look again now.
                    this.woken.notify_one();
                });
            }
        }
        Ok(())
    }

    /// One attempt of one delivery, recorded.
    async fn attempt(&self, webhook: &Webhook, claimed: Claimed) {
        let now_micros = receipts::Clock::now_micros(&receipts::SystemClock);
        let outcome = match self.send(webhook, &claimed, now_micros).await {
            Ok(outcome) => outcome,
            Err(error) => Outcome::Failed {
                status: None,
                reason: error,
            },
        };
        let delivery = &claimed.delivery;
        let (attempted, label) = match &outcome {
            Outcome::Delivered(status) => {
                let lag = (now_micros - claimed.event.at).max(0) as f64 / 1e6;
                metrics::histogram!("cairn_webhook_delivery_lag_seconds").record(lag);
                (Attempted::Delivered { status: *status }, "delivered")
            }
            Outcome::Gone => (Attempted::Gone, "gone"),
            Outcome::Failed { status, reason } => {
                let retry_at = retry_at(
                    &self.settings,
                    delivery.first_at,
                    delivery.attempt,
                    now_micros,
                );
                let label = if retry_at.is_some() { "failed" } else { "dead" };
                (
                    Attempted::Failed {
                        status: *status,
                        error: reason.clone(),
                        retry_at,
                    },
                    label,
                )
            }
        };
        match &attempted {
            Attempted::Delivered { .. } => {}
            Attempted::Gone => {
                tracing::warn!(webhook = %webhook.id, event = delivery.seq, url = %webhook.url, "the receiver answered 410 Gone: the webhook is disabled")
            }
            Attempted::Failed {
                error, retry_at, ..
            } => match retry_at {
                Some(at) => {
                    tracing::info!(webhook = %webhook.id, event = delivery.seq, attempt = delivery.attempt, %error, retry_in_ms = (at - now_micros) / 1000, "webhook delivery failed; retrying")
                }
                None => {
                    tracing::warn!(webhook = %webhook.id, event = delivery.seq, attempt = delivery.attempt, %error, "webhook delivery is dead: its retry span is spent (retry or replay it)")
                }
            },
        }
        let finished = DeliveryFinished {
            webhook_id: webhook.id,
            seq: delivery.seq,
            fence: delivery.fence,
            outcome: attempted,
        };
        let label = match self.ledger.finish_delivery(&finished).await {
            Ok(true) => label,
            Ok(false) => "stale",
            Err(error) => {
                tracing::warn!(webhook = %webhook.id, event = delivery.seq, %error, "a delivery's end could not be recorded; its lease will lapse and it goes again");
                "unrecorded"
            }
        };
        metrics::counter!("cairn_webhook_deliveries_total", "outcome" => label).increment(1);
    }

    async fn send(
        &self,
        webhook: &Webhook,
        claimed: &Claimed,
        now_micros: Micros,
    ) -> Result<Outcome, String> {
        let url = self
            .policy
            .check(&webhook.url)
            .map_err(|refused| refused.0)?;
        let secrets = self.secrets(webhook, now_micros)?;
        let body = body(&claimed.event)?;
        Ok(deliver(
            &self.client,
            &url,
            &secrets,
            &claimed.event.id,
            now_micros / 1_000_000,
            &body,
        )
        .await)
    }

    /// The secrets that sign now: the current one, and the previous one during its grace.
    fn secrets(&self, webhook: &Webhook, now: Micros) -> Result<Vec<Secret>, String> {
        let owner = webhook.id.to_string();
        let mut secrets = vec![self.sealer.open(&owner, &webhook.sealed_secret)?];
        if let (Some(previous), Some(until)) = (
            &webhook.previous_sealed_secret,
            webhook.previous_secret_until,
        ) {
            if until > now {
                secrets.push(self.sealer.open(&owner, previous)?);
            }
        }
        Ok(secrets)
    }

    /// Sets the per-subscription gauges from the ledger's counts.
    async fn gauges(&self) -> receipts::Result<()> {
        let now = receipts::Clock::now_micros(&receipts::SystemClock);
        for (id, counts) in self.ledger.delivery_counts().await? {
            let id = id.to_string();
            for (state, count) in [
                ("pending", counts.pending),
                ("delivering", counts.delivering),
                ("dead", counts.dead),
            ] {
                metrics::gauge!("cairn_webhook_deliveries", "webhook" => id.clone(), "state" => state)
                    .set(count as f64);
            }
            let oldest = counts
                .oldest_undelivered_at
                .map(|at| (now - at).max(0) as f64 / 1e6)
                .unwrap_or(0.0);
            metrics::gauge!("cairn_webhook_oldest_undelivered_seconds", "webhook" => id.clone())
                .set(oldest);
            metrics::gauge!("cairn_webhook_events_behind", "webhook" => id)
                .set(counts.behind as f64);
        }
        Ok(())
    }
}

/// A claim's lease: the attempt's bound and a margin to record it.
fn lease(settings: &DispatchSettings) -> Duration {
    settings.attempt_timeout + Duration::from_secs(30)
}

/// The body of an event's delivery: the event as the change feed gives it, with the version
/// of its shape.
pub fn body(event: &receipts::events::Event) -> Result<Vec<u8>, String> {
    let mut value =
        serde_json::to_value(event).map_err(|error| format!("the event's body: {error}"))?;
    if let Some(object) = value.as_object_mut() {
        object.insert("version".to_owned(), EVENTS_VERSION.into());
    }
    serde_json::to_vec(&value).map_err(|error| format!("the event's body: {error}"))
}

/// When to try a delivery again after its `attempt`th attempt failed at `now`, or `None` when
/// its span (from `first_at`) is spent: exponential from the base, capped, jittered over the
/// upper half, and never past the span's end (the last attempt falls there).
pub fn retry_at(
    settings: &DispatchSettings,
    first_at: Micros,
    attempt: i64,
    now: Micros,
) -> Option<Micros> {
    let end = first_at.saturating_add(settings.retry_for.as_micros() as i64);
    if now >= end {
        return None;
    }
    let exponent = attempt.clamp(1, 40) - 1;
    let step = (settings.backoff_base.as_micros() as i64)
        .saturating_mul(1i64 << exponent.min(40))
        .min(settings.backoff_max.as_micros() as i64)
        .max(1);
    let mut bytes = [0u8; 8];
    let jitter = match SystemRandom::new().fill(&mut bytes) {
        Ok(()) => (u64::from_le_bytes(bytes) % (step as u64 / 2 + 1)) as i64,
        Err(_) => 0,
    };
    Some(now.saturating_add(step - jitter).min(end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_within_their_span() {
        let settings = DispatchSettings {
            retry_for: Duration::from_secs(60),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(16),
            ..DispatchSettings::default()
        };
        let second = 1_000_000;
        for attempt in 1..=8 {
            let step = (1i64 << (attempt - 1)).min(16) * second;
            for _ in 0..50 {
                let at = retry_at(&settings, 0, attempt, 10 * second).expect("within the span");
                let delay = at - 10 * second;
                assert!(
                    delay >= step / 2 && delay <= step,
                    "attempt {attempt}: {delay} outside [{}, {step}]",
                    step / 2
                );
            }
        }
        // Near the end, the last attempt falls at the end; after it, dead.
        assert_eq!(retry_at(&settings, 0, 8, 59 * second), Some(60 * second));
        assert_eq!(retry_at(&settings, 0, 9, 60 * second), None);
    }
}
