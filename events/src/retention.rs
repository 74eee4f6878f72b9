//! Retention: events older than the configured age are removed from the outbox, a prefix at a
//! time, so that the outbox stays bounded; a cursor below what was removed is then answered
//! `cursor_expired`.

use std::sync::Arc;
use std::time::Duration;

use receipts::events::Events;
use receipts::{Clock, SystemClock};

/// The default retention: seven days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// How often retention runs.
pub const EVERY: Duration = Duration::from_secs(600);

/// Removes the events older than `retention` now; how many went.
pub async fn prune_once(ledger: &dyn Events, retention: Duration) -> receipts::Result<u64> {
    let age = i64::try_from(retention.as_micros()).unwrap_or(i64::MAX);
    let before = SystemClock.now_micros().saturating_sub(age);
    let removed = ledger.prune_events(before).await?;
    if removed > 0 {
        tracing::info!(
            removed,
            retention_hours = retention.as_secs() / 3600,
            "events past retention removed"
        );
    }
    metrics::counter!("cairn_events_pruned_total").increment(removed);
    Ok(removed)
}

/// Runs retention every [`EVERY`] until the task is dropped; a failed run is logged and tried
/// again at the next turn.
pub async fn run(ledger: Arc<dyn Events>, retention: Duration) {
    let mut ticks = tokio::time::interval(EVERY);
    loop {
        ticks.tick().await;
        if let Err(error) = prune_once(ledger.as_ref(), retention).await {
            tracing::warn!(%error, "event retention failed; trying again later");
        }
    }
}
