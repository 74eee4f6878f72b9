//! `subscriptions/listen` (MCP 2026-07-28) for `cairn://source/{dataset}/{+source_key}`
//! resources, fed from the events outbox: a listening client gets
//! `notifications/resources/updated` for a source when its head moves (a new revision, a
//! deletion), when its revisions are erased, when its readers change, and when its current
//! revision is verified in every store.
//!
//! - Only source URIs are accepted (at most [`MAX_URIS`]); a source the caller may not read
//!   (its dataset outside the token's allowlist, or its readers not naming the token's
//!   identity) is acknowledged but never reported, as a read of it answers "not found".
//! - The stream starts at the outbox's newest event: no replay (the client reads the
//!   resource when it starts listening). It looks for events every [`POLL_EVERY`], holds no
//!   ledger connection between looks, and ends on its own after [`MAX_LISTEN`] (the client
//!   listens again).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use receipts::events::{EventQuery, EventType, MAX_EVENTS_PER_PAGE};
use receipts::Principal;
use rmcp::model::SubscriptionFilter;
use rmcp::service::SubscriptionContext;
use rmcp::ErrorData;

use crate::documents::source_of;
use crate::Shared;

/// The most resources one listen follows.
pub(crate) const MAX_URIS: usize = 100;
/// How often a listen looks at the outbox.
const POLL_EVERY: Duration = Duration::from_millis(500);
/// How long one listen lasts before it ends gracefully.
const MAX_LISTEN: Duration = Duration::from_secs(600);

/// The events that change what a source resource reads as.
const TYPES: [EventType; 5] = [
    EventType::SourceSuperseded,
    EventType::SourceTombstoned,
    EventType::SourceErased,
    EventType::AccessChanged,
    EventType::ReceiptVerified,
];

/// The part of `requested` cairn serves: source URIs, at most [`MAX_URIS`].
pub(crate) fn accepted(requested: &SubscriptionFilter) -> SubscriptionFilter {
    let uris: Vec<String> = requested
        .resource_subscriptions
        .iter()
        .flatten()
        .filter(|uri| source_of(uri).is_some())
        .take(MAX_URIS)
        .cloned()
        .collect();
    let mut filter = SubscriptionFilter::new();
    if !uris.is_empty() {
        filter.resource_subscriptions = Some(uris);
    }
    filter
}

/// Runs one listen for `principal` until the client cancels it or [`MAX_LISTEN`] passes.
pub(crate) async fn listen(
    shared: &Shared,
    principal: &Principal,
    context: SubscriptionContext,
) -> Result<(), ErrorData> {
    let names = principal.reads_as();
    // Each readable source, by (dataset, key), with the URI the client named.
    let mut followed: BTreeMap<(String, String), String> = BTreeMap::new();
    for uri in context.accepted().resource_subscriptions.iter().flatten() {
        let Some((dataset, key)) = source_of(uri) else {
            continue;
        };
        if principal.require_dataset(&dataset).is_err() {
            continue;
        }
        let readable = shared
            .ledger
            .may_read(names.as_deref(), &dataset, &key)
            .await
            .map_err(internal)?;
        if readable {
            followed.insert((dataset, key), uri.clone());
        }
    }
    let datasets: BTreeSet<String> = followed
        .keys()
        .map(|(dataset, _)| dataset.clone())
        .collect();
    let mut cursor = shared.events.newest_event().await.map_err(internal)?;
    let ends = Instant::now() + MAX_LISTEN;
    tracing::info!(principal = %principal.actor(), sources = followed.len(), "mcp listen started");
    loop {
        tokio::select! {
            () = context.cancelled() => return Ok(()),
            () = tokio::time::sleep(POLL_EVERY) => {}
        }
        if Instant::now() >= ends {
            return Ok(());
        }
        if followed.is_empty() {
            continue;
        }
        loop {
            let page = shared
                .events
                .events(&EventQuery {
                    after: cursor,
                    datasets: Some(datasets.iter().cloned().collect()),
                    types: Some(TYPES.to_vec()),
                    limit: MAX_EVENTS_PER_PAGE,
                })
                .await
                .map_err(internal)?;
            // In event order, each once.
            let mut updated: Vec<&String> = Vec::new();
            for event in &page.events {
                if event.event_type == EventType::ReceiptVerified && event.data["backend"] != "all"
                {
                    continue;
                }
                if let (Some(dataset), Some(key)) = (&event.dataset, &event.source_key) {
                    if let Some(uri) = followed.get(&(dataset.clone(), key.clone())) {
                        if !updated.contains(&uri) {
                            updated.push(uri);
                        }
                    }
                }
            }
            for uri in updated {
                if context
                    .sink()
                    .notify_resource_updated(uri.clone())
                    .await
                    .is_err()
                {
                    // The client went away.
                    return Ok(());
                }
            }
            let full = page.events.len() as u32 >= MAX_EVENTS_PER_PAGE;
            cursor = page.next_after;
            if !full {
                break;
            }
        }
    }
}

fn internal(error: receipts::LedgerError) -> ErrorData {
    tracing::error!(%error, "mcp listen: the outbox could not be read");
    ErrorData::internal_error("the events could not be read; see the server log", None)
}
