//! What operators read: jobs by filter, the last hour's activity, and the stream of job events
//! that metrics are derived from. Everything here is read from the ledger (jobs and the
//! append-only history), so workers in other processes show up like local ones, and every
//! number can be traced back to history rows.
//!
//! ## Definitions (one place, used by the dashboard and the metrics alike)
//! - **Queue depth**: jobs `pending` or `retry_wait`; **due**: those whose `run_at` has come.
//! - **Enqueue to start**: a job's first claim minus its creation (acceptance) time.
//! - **Accepted to searchable**: a `project` job's completion (every backend verified) minus
//!   its creation, the moment its receipt was issued (for a revert, when the earlier revision
//!   became head again).
//! - **Retry**: a run ending in `retry_wait`; **failure**: a run ending in an error (its code
//!   is in the history row); **rescue**: a run whose lease expired, ended by the rescuer.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::clock::Micros;
use crate::error::Result;
use crate::model::{Job, JobKind, JobState};

/// Most jobs in one page.
pub const MAX_PAGE: u32 = 500;

/// The order of a job listing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobOrder {
    /// Most recently changed first.
    #[default]
    RecentlyChanged,
    /// Soonest `run_at` first (the retry schedule).
    RunAt,
    /// Soonest lease expiry first (running jobs).
    LeaseExpiry,
}

/// Which jobs an operator asks for. Every field narrows the listing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobFilter {
    /// Only these states (empty: every state).
    pub states: Vec<JobState>,
    /// Only this dataset.
    pub dataset: Option<String>,
    /// Only these datasets (a token's allowlist); `None`: every dataset.
    pub allowed_datasets: Option<Vec<String>>,
    /// Jobs whose source key contains this text, or whose job or revision id equals it.
    pub text: Option<String>,
    /// Only jobs whose last error has this code.
    pub error_code: Option<String>,
    /// Order of the listing.
    pub order: JobOrder,
    /// At most this many jobs (clamped to 1..=[`MAX_PAGE`]).
    pub limit: u32,
    /// Skip this many.
    pub offset: u32,
    /// Only jobs of sources a caller reading as these names may read
    /// ([`crate::access::Identity::names`]); `None`: every job (a token without an identity).
    pub readable_by: Option<Vec<String>>,
}

/// One page of jobs and how many match in all.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobPage {
    /// Jobs matching the filter.
    pub total: i64,
    /// This page, in the filter's order.
    pub jobs: Vec<Job>,
}

/// A pause of claiming.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct Pause {
    /// The paused dataset; `None`: every dataset.
    pub dataset: Option<String>,
    /// Why.
    pub reason: String,
    /// Who paused it.
    pub actor: String,
    /// Since when.
    pub since: Micros,
}

/// Percentiles of a set of latencies.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// How many were measured.
    pub count: usize,
    /// Median, in milliseconds.
    pub p50_ms: Option<f64>,
    /// 95th percentile, in milliseconds.
    pub p95_ms: Option<f64>,
    /// 99th percentile, in milliseconds.
    pub p99_ms: Option<f64>,
}

impl LatencySummary {
    /// Nearest-rank percentiles of `micros`.
    pub fn of(mut micros: Vec<Micros>) -> Self {
        micros.sort_unstable();
        let rank = |q: f64| -> Option<f64> {
            if micros.is_empty() {
                return None;
            }
            let index = ((q * micros.len() as f64).ceil() as usize).clamp(1, micros.len()) - 1;
            micros.get(index).map(|value| *value as f64 / 1000.0)
        };
        Self {
            count: micros.len(),
            p50_ms: rank(0.50),
            p95_ms: rank(0.95),
            p99_ms: rank(0.99),
        }
    }
}

/// Job events of one minute.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MinuteActivity {
    /// Start of the minute.
    pub start: Micros,
    /// Runs started.
    pub claimed: i64,
    /// Jobs completed.
    pub completed: i64,
    /// Runs that ended in `retry_wait`.
    pub retried: i64,
    /// Jobs that went `dead` or `quarantined`.
    pub failed: i64,
    /// Queue depth at the end of the minute.
    pub queue_depth: i64,
}

/// The recent activity of the job system.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Activity {
    /// The ledger clock's time of the reading.
    pub now: Micros,
    /// The start of the window.
    pub since: Micros,
    /// One entry per minute of the window, oldest first.
    pub minutes: Vec<MinuteActivity>,
    /// Jobs waiting (`pending` or `retry_wait`).
    pub queue_depth: i64,
    /// Waiting jobs whose `run_at` has come.
    pub due: i64,
    /// Running jobs.
    pub running: i64,
    /// Age of the oldest running lease (since its claim).
    pub oldest_lease_age_micros: Option<Micros>,
    /// The longest time since a running job's last heartbeat.
    pub max_heartbeat_age_micros: Option<Micros>,
    /// First claims in the window: claim minus acceptance.
    pub enqueue_to_start: LatencySummary,
    /// Projections completed in the window: completion minus the job's creation.
    pub accepted_to_searchable: LatencySummary,
    /// Active pauses.
    pub pauses: Vec<Pause>,
}

/// One job history row, with what metrics need to derive latencies from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobEvent {
    /// History position.
    pub seq: i64,
    /// When.
    pub at: Micros,
    /// The job.
    pub job_id: Uuid,
    /// Its dataset.
    pub dataset: String,
    /// Its kind.
    pub kind: JobKind,
    /// State before (`None`: created).
    pub from: Option<JobState>,
    /// State after.
    pub to: JobState,
    /// Who.
    pub actor: String,
    /// The run's error code, for a run that ended in an error.
    pub error_code: Option<String>,
    /// The run's stage when it ended.
    pub stage: Option<String>,
    /// A claim that is the job's first.
    pub first_claim: bool,
    /// The job's creation time (when its receipt was issued).
    pub job_created_at: Micros,
}

/// Operator reads.
#[async_trait]
pub trait Operations: Send + Sync {
    /// Jobs matching `filter`, one page, with the total.
    async fn find_jobs(&self, filter: &JobFilter) -> Result<JobPage>;

    /// The activity of the last `window` (whole minutes, at most 24 hours).
    async fn activity(&self, window: std::time::Duration) -> Result<Activity>;

    /// Job events after history position `after_seq`, oldest first, at most `limit`.
    async fn job_events(&self, after_seq: i64, limit: u32) -> Result<Vec<JobEvent>>;

    /// The latest history position (0 when empty).
    async fn last_history_seq(&self) -> Result<i64>;

    /// The time on the ledger's clock (the clock every ledger write is stamped with).
    fn clock_now(&self) -> Micros;
}

/// The whole clock minutes of an activity window (the last one the current, partial minute),
/// filled from per-minute counts by every engine alike.
#[derive(Debug)]
pub(crate) struct MinuteWindow {
    /// The first minute (epoch minutes).
    pub(crate) first: i64,
    /// The last minute (epoch minutes): the one `now` is in.
    pub(crate) last: i64,
    /// The start of the first minute.
    pub(crate) since: Micros,
    buckets: Vec<MinuteActivity>,
    queued_delta: Vec<i64>,
}

impl MinuteWindow {
    const MINUTE: Micros = 60_000_000;

    /// The minutes of `window` (1 minute to a day) that end with the one `now` is in.
    pub(crate) fn new(now: Micros, window: std::time::Duration) -> Self {
        let minutes = (window.as_secs() / 60).clamp(1, 24 * 60) as i64;
        let last = now.div_euclid(Self::MINUTE);
        let first = last - minutes + 1;
        let since = first * Self::MINUTE;
        let buckets: Vec<MinuteActivity> = (0..minutes)
            .map(|index| MinuteActivity {
                start: since + index * Self::MINUTE,
                ..MinuteActivity::default()
            })
            .collect();
        let queued_delta = vec![0; buckets.len()];
        Self {
            first,
            last,
            since,
            buckets,
            queued_delta,
        }
    }

    /// Adds one minute's counts (`[claimed, completed, retried, failed, queued_delta]`); a
    /// minute outside the window is ignored.
    pub(crate) fn add(&mut self, minute: i64, counts: [i64; 5]) {
        let Some(index) = usize::try_from(minute - self.first)
            .ok()
            .filter(|index| *index < self.buckets.len())
        else {
            return;
        };
        let bucket = &mut self.buckets[index];
        bucket.claimed = counts[0];
        bucket.completed = counts[1];
        bucket.retried = counts[2];
        bucket.failed = counts[3];
        self.queued_delta[index] = counts[4];
    }

    /// The minutes, each with its queue depth at its end: today's depth minus what changed
    /// after it.
    pub(crate) fn finish(mut self, queue_depth: i64) -> Vec<MinuteActivity> {
        let mut depth = queue_depth;
        for (bucket, delta) in self.buckets.iter_mut().zip(&self.queued_delta).rev() {
            bucket.queue_depth = depth.max(0);
            depth -= delta;
        }
        self.buckets
    }
}
