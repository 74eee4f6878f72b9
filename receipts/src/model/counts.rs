//! Counts: how many sources, revisions, jobs and receipts the ledger holds, by state.

use serde::{Deserialize, Serialize};

use super::jobs::JobState;

/// Ledger-wide counts for status pages.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct LedgerCounts {
    /// Sources (including deleted ones).
    pub sources: i64,
    /// Sources whose head is a tombstone.
    pub deleted_sources: i64,
    /// Revisions.
    pub revisions: i64,
    /// Distinct retained contents.
    pub contents: i64,
    /// Bytes retained.
    pub retained_bytes: i64,
    /// Jobs per state.
    pub jobs: std::collections::BTreeMap<String, i64>,
    /// Receipts per backend and state (`backend/state`).
    pub receipts: std::collections::BTreeMap<String, i64>,
    /// History entries.
    pub history: i64,
}

impl LedgerCounts {
    /// Jobs not yet ended: pending, running or waiting to retry.
    pub fn open_jobs(&self) -> i64 {
        [JobState::Pending, JobState::Running, JobState::RetryWait]
            .iter()
            .map(|state| self.jobs.get(state.as_str()).copied().unwrap_or(0))
            .sum()
    }
}

/// One dataset as its readers see it: how many sources it holds and when it last changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct DatasetSummary {
    /// The dataset.
    pub dataset: String,
    /// Sources, deleted ones included.
    pub sources: i64,
    /// Sources whose head is a tombstone.
    pub deleted_sources: i64,
    /// When its newest head was accepted.
    pub last_accepted_at: crate::Micros,
}
