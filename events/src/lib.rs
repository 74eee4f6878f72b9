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
//! - **Webhooks**, in parts so far: a delivery is signed the Standard Webhooks way, with the
//!   current secret and, during a rotation's grace, the one before ([`signing`]); it goes
//!   only to a target the policy allows, checked when given and again at every connection,
//!   without following redirects, bounded in time and bytes ([`target`]). Subscriptions and
//!   the leased delivery jobs that use them are the next part.
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

pub mod feed;
pub mod retention;
pub mod signing;
pub mod target;

use std::sync::Arc;

use receipts::EventsLedger;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The change feed's routes with their OpenAPI description.
pub fn routes(ledger: Arc<dyn EventsLedger>) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(feed::changes))
        .with_state(feed::FeedState { ledger })
}
