//! # verify: fsck for every projection
//!
//! The ledger is the single truth; every derived store is checked against it. A pass walks the
//! [`receipts::verify::BUCKETS`] buckets of one generation in order. For each bucket it reads
//! the ledger's side ([`receipts::Verifications::verify_bucket`]: settled heads and what their
//! receipts promise) and the store's side (points by revision, from the bucket's indexed
//! payload field), and compares them ([`receipts::verify`]).
//!
//! ## Tiers
//! - `counts`: one count of the bucket's current points. Only a bucket whose count differs
//!   from the promises, or that has work in flight, is read point by point.
//! - `scrub`: every bucket's payloads are scrolled without vectors. The order-free digests of
//!   both sides are compared, and any difference is compared revision by revision.
//! - `deep`: the scrub with vectors, so each dimension and length is checked; every settled
//!   head's retained bytes hashed again against their content hash; and one chunk per bucket
//!   embedded again with the generation's model and compared with its stored vector
//!   (cosine at least 0.999), to catch a wrong model.
//!
//! Chunk rows (count and checksum) are checked in every tier: they are in the ledger, so they
//! cost nothing more.
//!
//! ## Invariants
//! - **Work in flight is never drift.** A source with an open job, or a head not yet settled,
//!   is skipped.
//! - **Drift is recorded only when a second look confirms it.** Both sides are read again,
//!   with the ledger last, and only drift found both times, for a source whose head did not
//!   move, is recorded.
//! - **A pass is resumable and single.** Its cursor moves in the ledger in one transaction with
//!   the bucket's drift. There is one running pass per tier and generation, whichever process
//!   or operator starts it.
//! - **Repairs use the normal paths only** ([`repair`]), and each is recorded with its drift:
//!   - a projection job for the head;
//!   - a retire before a delete for points the ledger does not hold;
//!   - the ordered `set_current` for flags.
//!
//!   Bytes whose hash differs are corruption. They are reported, never repaired.
//! - Passes are paced by the work they do, not by buckets: each store request counts as
//!   [`REQUEST_POINTS`] points, and each point counted or read as one (or, when more, each
//!   point the ledger's heads promise, for the ledger's side of the check), at most
//!   [`VerifySettings::points_per_second`] (or a pass's own rate). A bucket for which the
//!   ledger holds no settled head and no open work, and for which the store's one bucketed
//!   count at the pass's start ([`gateways::VectorStore::bucket_counts`]) holds no point, is
//!   settled without a store request: empty buckets cost nothing, so a pass costs what the
//!   data costs. Points written into an empty bucket after that count belong to work in
//!   flight, which is never drift; anything else is found by the next pass.

pub mod api;
mod pass;
pub mod repair;

pub use pass::{BucketOutcome, Verifier, VerifyError};

use std::time::Duration;

use receipts::model::VerifyTier;

/// How `cairn serve` runs verify.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifySettings {
    /// How often a scheduled pass starts (`None`: only by hand).
    pub interval: Option<Duration>,
    /// The tier of scheduled passes.
    pub tier: VerifyTier,
    /// Whether scheduled passes repair what they confirm.
    pub repair: bool,
    /// A pass's rate limit: points read per second, each store request counting as
    /// [`REQUEST_POINTS`] points.
    pub points_per_second: u32,
}

impl Default for VerifySettings {
    fn default() -> Self {
        VerifySettings {
            interval: Some(Duration::from_secs(6 * 3600)),
            tier: VerifyTier::Scrub,
            repair: false,
            points_per_second: DEFAULT_POINTS_PER_SECOND,
        }
    }
}

/// What one store request costs a pass's rate limit, in points: about what reading a hundred
/// points costs a store beside the request itself.
pub const REQUEST_POINTS: u64 = 100;

/// Default rate limit: the pace the earlier limit of 10 buckets a second kept at 1,000,000
/// points (about 977 points and one or two requests a bucket), where a pass on 2 cores leaves
/// search its headroom (`cairn bench verify`: unthrottled passes run 18 to 44 buckets a second
/// and lift search p99 from about 1 ms to 6 to 10 ms). A smaller store is verified faster in
/// proportion, and its empty buckets cost nothing.
pub const DEFAULT_POINTS_PER_SECOND: u32 = 12_000;
