//! # events: what cairn tells clients happened
//!
//! ## Model
//! - The ledger's store writes an event in the transaction of every change a client may want
//!   to hear about (`receipts::events`): receipts verified or failed, dead jobs, heads that
//!   moved, deletions, erasures, access changes, connector runs, verify's findings,
//!   generation switches. Events name identities and never content.
//! - **The change feed** (`GET /v1/changes`, [`feed`]) reads them after a cursor, in sequence
//!   order, filtered by dataset and type, long-polled up to a bound. A consumer that keeps
//!   `next_after` misses nothing and sees nothing twice.
//! - **Retention** ([`retention`]) removes events older than the configured age; a cursor
//!   below what it removed is answered `410 cursor_expired`, never with a silent gap.
//! - **Webhooks** (`/v1/webhooks`, [`subscriptions`]): a subscription names a URL, event
//!   types and datasets; its signing secret is answered once and kept sealed ([`sealing`]).
//!   The ledger fans the outbox out to each subscription as leased delivery jobs
//!   (`receipts::webhooks`), and [`dispatch`] sends them: signed the Standard Webhooks way,
//!   with the current secret and, during a rotation's grace, the one before ([`signing`]);
//!   only to a target the policy allows, checked when given and again at every connection,
//!   without following redirects, bounded in time and bytes ([`target`]); retried with
//!   backoff for a span, then dead until an operator retries, discards or replays.
//!
//! ## Invariants
//! - An event exists if and only if its change committed (the store writes both, in one
//!   transaction).
//! - A caller sees only its token's datasets, and, when its token reads as an identity, only
//!   events about sources that identity may read (events about no source need `ops:read`).
//! - A long poll holds no ledger connection while it waits, and waits at most
//!   [`feed::MAX_WAIT`].
//! - A delivery never connects to an address the policy refuses, whatever a name resolves
//!   to at that moment, and never follows a redirect.
//! - A source's events reach a subscription in sequence order (a delivery waits for the
//!   earlier ones of its source); each is delivered at least once, with the event's id as
//!   `webhook-id`, so a receiver deduplicates by it.

pub mod dispatch;
pub mod feed;
pub mod retention;
pub mod sealing;
pub mod signing;
pub mod subscriptions;
pub mod target;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use receipts::EventsLedger;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The `[webhooks]` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSettings {
    /// Hosts deliveries may reach over plain `http` and at private addresses.
    pub allow_hosts: Vec<String>,
    /// The key that seals signing secrets (created, 0600, when missing).
    pub secret_key_file: PathBuf,
    /// How long a rotated secret keeps signing beside the new one.
    pub rotation_grace: Duration,
    /// How deliveries are made.
    pub dispatch: dispatch::DispatchSettings,
}

impl WebhookSettings {
    /// The defaults, with the key in `data_dir`.
    pub fn with_data_dir(data_dir: &std::path::Path) -> WebhookSettings {
        WebhookSettings {
            allow_hosts: Vec::new(),
            secret_key_file: data_dir.join("webhooks.key"),
            rotation_grace: Duration::from_secs(24 * 3600),
            dispatch: dispatch::DispatchSettings::default(),
        }
    }

    /// The sealer of the configured key, or `None` (logged) when it cannot be opened.
    pub fn sealer(&self) -> Option<Arc<sealing::Sealer>> {
        match sealing::Sealer::open_or_create(&self.secret_key_file) {
            Ok(sealer) => Some(Arc::new(sealer)),
            Err(error) => {
                tracing::error!(%error, "webhooks: the secrets key cannot be used; creating and delivering webhooks is unavailable");
                None
            }
        }
    }

    /// The target policy.
    pub fn policy(&self) -> Arc<target::TargetPolicy> {
        Arc::new(target::TargetPolicy::new(&self.allow_hosts))
    }
}

/// The change feed's and the webhooks' routes with their OpenAPI description.
pub fn routes(
    ledger: Arc<dyn EventsLedger>,
    settings: &WebhookSettings,
    sealer: Option<Arc<sealing::Sealer>>,
) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(feed::changes))
        .with_state(feed::FeedState {
            ledger: ledger.clone(),
        })
        .merge(subscriptions::routes(subscriptions::SubscriptionsState {
            ledger,
            sealer,
            policy: settings.policy(),
            rotation_grace: settings.rotation_grace,
        }))
}
