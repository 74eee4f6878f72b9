//! A bounded cache of what was learnt about a token, keyed by the token's SHA-256 (the token
//! itself is never held), each entry with its own deadline. Used for verified JWTs and for
//! introspection answers.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most entries held; past it, expired entries go first, then the cache starts over.
const MAX_ENTRIES: usize = 10_000;

/// Entries by token digest, each until its deadline.
pub(crate) struct TokenCache<V> {
    entries: Mutex<HashMap<String, (Instant, V)>>,
}

impl<V: Clone> TokenCache<V> {
    pub(crate) fn new() -> TokenCache<V> {
        TokenCache {
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The key a token is held under.
    pub(crate) fn digest(token: &str) -> String {
        receipts::ids::sha256_hex(token.as_bytes())
    }

    /// The entry for `digest`, while its deadline has not passed.
    pub(crate) fn get(&self, digest: &str) -> Option<V> {
        let entries = match self.entries.lock() {
            Ok(entries) => entries,
            Err(poisoned) => poisoned.into_inner(),
        };
        entries
            .get(digest)
            .filter(|(until, _)| *until > Instant::now())
            .map(|(_, value)| value.clone())
    }

    /// Holds `value` for `lifetime` (nothing when it is zero).
    pub(crate) fn insert(&self, digest: String, lifetime: Duration, value: V) {
        if lifetime.is_zero() {
            return;
        }
        let mut entries = match self.entries.lock() {
            Ok(entries) => entries,
            Err(poisoned) => poisoned.into_inner(),
        };
        if entries.len() >= MAX_ENTRIES {
            let now = Instant::now();
            entries.retain(|_, (until, _)| *until > now);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(digest, (Instant::now() + lifetime, value));
    }
}

/// Seconds since the epoch.
pub(crate) fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

/// From now until `expires_at` (seconds since the epoch), at most `limit`.
pub(crate) fn until(expires_at: i64, limit: Duration) -> Duration {
    let left = u64::try_from(expires_at - now()).unwrap_or(0);
    limit.min(Duration::from_secs(left))
}
