//! Named fault points in the acceptance transaction. Tests arm a point with a
//! [`FaultInjector`]; production code uses [`NoFaults`]. Each point is checked at a fixed step,
//! so a test can prove that a failure at that step leaves no partial rows behind.

use std::fmt;
use std::sync::Mutex;

/// A step of acceptance at which a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// The bytes are retained; no revision yet.
    AfterBytes,
    /// The revision row exists; the head has not moved.
    AfterRevision,
    /// The head has moved; the job, receipts and lexical rows are not written.
    AfterHeadMove,
    /// Every row of the group is written; the commit has not run.
    BeforeCommit,
    /// A projection run is about to write its chunk rows (the relational backend's write).
    /// Not an acceptance step, so not in [`FaultPoint::ALL`].
    BeforeChunkWrite,
    /// A projection run's chunk rows are written, then the last one is lost before the run
    /// reads them back (the relational read-back must notice). Not an acceptance step.
    ChunkRowLost,
    /// A lexical search runs a long SQLite computation (minutes) under its deadline instead
    /// of the index query: the deadline, not the work, must end it. Not an acceptance step.
    SlowLexical,
}

impl FaultPoint {
    /// Every fault point, in the order acceptance reaches them.
    pub const ALL: [FaultPoint; 4] = [
        FaultPoint::AfterBytes,
        FaultPoint::AfterRevision,
        FaultPoint::AfterHeadMove,
        FaultPoint::BeforeCommit,
    ];
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            FaultPoint::AfterBytes => "after_bytes",
            FaultPoint::AfterRevision => "after_revision",
            FaultPoint::AfterHeadMove => "after_head_move",
            FaultPoint::BeforeCommit => "before_commit",
            FaultPoint::BeforeChunkWrite => "before_chunk_write",
            FaultPoint::ChunkRowLost => "chunk_row_lost",
            FaultPoint::SlowLexical => "slow_lexical",
        };
        f.write_str(name)
    }
}

/// Decides whether a fault fires at a point.
pub trait FaultInjector: Send + Sync + fmt::Debug {
    /// Returns `true` when the step must fail.
    fn fire(&self, point: FaultPoint) -> bool;

    /// Whether any point may fire. When none can, the ledger may run steps together.
    fn armed(&self) -> bool {
        true
    }
}

/// Production: no fault ever fires.
#[derive(Debug, Default)]
pub struct NoFaults;

impl FaultInjector for NoFaults {
    fn fire(&self, _point: FaultPoint) -> bool {
        false
    }

    fn armed(&self) -> bool {
        false
    }
}

/// Test fault injector: fires once at each armed point, then disarms it.
#[derive(Debug, Default)]
pub struct FaultPlan {
    armed: Mutex<Vec<FaultPoint>>,
}

impl FaultPlan {
    /// Arms `point` to fire the next time it is reached.
    pub fn arm(&self, point: FaultPoint) {
        if let Ok(mut armed) = self.armed.lock() {
            armed.push(point);
        }
    }
}

impl FaultInjector for FaultPlan {
    fn armed(&self) -> bool {
        self.armed
            .lock()
            .map(|armed| !armed.is_empty())
            .unwrap_or(true)
    }

    fn fire(&self, point: FaultPoint) -> bool {
        let Ok(mut armed) = self.armed.lock() else {
            return false;
        };
        match armed.iter().position(|candidate| *candidate == point) {
            Some(index) => {
                armed.remove(index);
                true
            }
            None => false,
        }
    }
}
