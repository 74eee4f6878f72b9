//! The injected clock. Every time the ledger records comes from a [`Clock`], in integer epoch
//! microseconds (UTC), so that tests control time and ordering never depends on string formats.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Epoch microseconds, UTC.
pub type Micros = i64;

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time in epoch microseconds (UTC).
    fn now_micros(&self) -> Micros;
}

/// The operating system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> Micros {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(elapsed) => i64::try_from(elapsed.as_micros()).unwrap_or(i64::MAX),
            Err(_) => 0,
        }
    }
}

/// A clock that only moves when told to: for tests that step through time.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    /// A manual clock that starts at `start` epoch microseconds.
    pub fn new(start: Micros) -> Self {
        Self {
            now: AtomicI64::new(start),
        }
    }

    /// Moves the clock forward by `delta` microseconds.
    pub fn advance(&self, delta: Micros) {
        self.now.fetch_add(delta, Ordering::SeqCst);
    }

    /// Sets the clock to `micros`.
    pub fn set(&self, micros: Micros) {
        self.now.store(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> Micros {
        self.now.load(Ordering::SeqCst)
    }
}
