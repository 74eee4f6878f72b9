//! Jobs and leases: the projection job, its states and kinds, the lease a worker holds, and how a
//! run fails.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::clock::Micros;

closed_enum! {
    /// The state of a projection job.
    JobState {
        /// Waiting to be claimed.
        Pending => "pending",
        /// Held by a worker under a lease.
        Running => "running",
        /// Failed with a retryable error; claimable again at `run_at`.
        RetryWait => "retry_wait",
        /// Terminal: every backend verified (or excluded).
        Completed => "completed",
        /// Terminal: permanent error or attempts exhausted.
        Dead => "dead",
        /// Terminal: cancelled by an operator.
        Cancelled => "cancelled",
        /// Terminal: a newer revision became head before this job finished.
        Superseded => "superseded",
        /// Terminal: its leases kept expiring (it kills or hangs workers).
        Quarantined => "quarantined",
    }
}

impl JobState {
    /// Whether no further transition is allowed except an operator's requeue.
    pub fn is_terminal(self) -> bool {
        !matches!(
            self,
            JobState::Pending | JobState::Running | JobState::RetryWait
        )
    }
}

closed_enum! {
    /// What a projection job does.
    JobKind {
        /// Project a content revision into every configured backend.
        Project => "project",
        /// Exclude a deleted source from every configured backend.
        Tombstone => "tombstone",
        /// Project a revision (content, or a tombstone's exclusion) into the graph store: a job
        /// of its own, queued beside the revision's `project` or `tombstone` job when the graph
        /// backend is configured, with its own retries, dead state and receipt, so the graph
        /// never holds up the other backends.
        Graph => "graph",
        /// Run a connector: list its folder or git tree, accept what is new or changed and
        /// tombstone what is gone. It names its connector and no revision.
        Sync => "sync",
        /// Write a source's readers in force onto its points in one generation's vector store
        /// and read them back: queued by an access change, one per live generation that holds
        /// vectors. It names its source and generation and no revision; nothing is chunked or
        /// embedded again.
        Access => "access",
    }
}

/// A projection job as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct Job {
    /// Job id (UUID v7).
    pub id: Uuid,
    /// The revision it projects (`None` for a sync run, which has none).
    pub revision_id: Option<Uuid>,
    /// The connector a sync run runs (`None` for every other kind).
    pub connector_id: Option<Uuid>,
    /// Dataset.
    pub dataset: String,
    /// Source key (empty for a sync run: no source key is empty).
    pub source_key: String,
    /// What it does.
    pub kind: JobKind,
    /// Its state.
    pub state: JobState,
    /// Claim priority (higher first).
    pub priority: i64,
    /// Failures the job itself caused.
    pub attempt: i64,
    /// Failures allowed before the job is dead.
    pub max_attempts: i64,
    /// Leases lost to crashed or hung workers.
    pub crashes: i64,
    /// Not claimable before this time.
    pub run_at: Micros,
    /// The current lease's fencing token, if running.
    pub lease_id: Option<String>,
    /// The worker holding the lease.
    pub lease_owner: Option<String>,
    /// When the lease runs out.
    pub lease_expires_at: Option<Micros>,
    /// The last heartbeat.
    pub heartbeat_at: Option<Micros>,
    /// The hard deadline of the current run.
    pub deadline_at: Option<Micros>,
    /// When the current run was claimed.
    pub started_at: Option<Micros>,
    /// An operator asked a running job to stop at its next heartbeat.
    pub cancel_requested: bool,
    /// The stage the current run last reported (`claimed`, `chunking`, `embedding`, ...).
    pub stage: Option<String>,
    /// When it reported that stage.
    pub stage_at: Option<Micros>,
    /// Why `run_at` holds its value (`accepted`, `backoff after attempt 2: ...`, ...).
    pub run_at_rule: String,
    /// Code of the last error.
    pub last_error_code: Option<String>,
    /// Message of the last error.
    pub last_error_message: Option<String>,
    /// When the job was created.
    pub created_at: Micros,
    /// When its state last changed.
    pub changed_at: Micros,
    /// Who made the last change.
    pub changed_by: String,
    /// Why (the cause recorded in history).
    pub change_cause: String,
    /// The projection generation a `project` or `tombstone` job writes (`None`: the active
    /// one at the time it runs, for jobs queued before any generation existed; graph jobs).
    pub generation: Option<String>,
}

impl Job {
    /// The revision of a `project`, `tombstone` or `graph` job. The ledger's CHECK constraints
    /// give every such job one; asking a sync run for it is a bug, reported as internal.
    pub fn revision(&self) -> crate::Result<Uuid> {
        self.revision_id.ok_or_else(|| {
            crate::LedgerError::Internal(format!(
                "job {} ({}) names no revision",
                self.id, self.kind
            ))
        })
    }
}

/// What a worker presents to act on a job it claimed: the fencing token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseToken {
    /// The job.
    pub job_id: Uuid,
    /// The lease's fencing token.
    pub lease_id: String,
    /// The worker that holds it.
    pub owner: String,
}

impl LeaseToken {
    /// The token of a job claimed by `owner`, if it holds a lease.
    pub fn of(job: &Job) -> Option<LeaseToken> {
        Some(LeaseToken {
            job_id: job.id,
            lease_id: job.lease_id.clone()?,
            owner: job.lease_owner.clone()?,
        })
    }
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The lease now runs until this time.
    pub lease_expires_at: Micros,
    /// An operator asked the job to stop: the worker should stop and fail it as cancelled.
    pub cancel_requested: bool,
}

/// How a job's run failed. Classified by type at the source of the error, never by message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "class")]
pub enum FailureClass {
    /// Worth retrying. With `retry_after` (e.g. a store's rate-limit reset) the job waits that
    /// long and is not charged an attempt (a snooze); without it, exponential backoff applies
    /// and an attempt is charged.
    Retryable {
        /// Microseconds to wait, when the error says.
        retry_after_micros: Option<i64>,
    },
    /// Retrying cannot help: the job is dead.
    Permanent,
    /// The run stopped because the job was cancelled.
    Cancelled,
}

/// A failed run, as reported by its worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// How to treat it.
    pub class: FailureClass,
    /// Stable error code (e.g. `vector_store_unavailable`).
    pub code: String,
    /// Human-readable message (recorded as the job's last error).
    pub message: String,
}
