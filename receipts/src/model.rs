//! Domain types: states, revisions, jobs, projection receipts, history, acceptance receipts.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::clock::Micros;

/// Declares a closed string enum with `Display`, `FromStr` (whose error lists the valid
/// values) and serde in snake_case. One macro so that every state type behaves the same way.
macro_rules! closed_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The stable text form stored in the ledger and sent over the wire.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownValue;
            fn from_str(text: &str) -> Result<Self, Self::Err> {
                match text {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownValue {
                        kind: stringify!($name),
                        value: text.to_owned(),
                        valid: &[$($text,)+],
                    }),
                }
            }
        }
    };
}

/// A text value that is not one of a closed enum's values.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown {kind} `{value}`; valid values: {}", valid.join(", "))]
pub struct UnknownValue {
    /// The enum's name.
    pub kind: &'static str,
    /// The value that was given.
    pub value: String,
    /// The values that would have been accepted.
    pub valid: &'static [&'static str],
}

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
    /// The state of one backend's projection receipt for one job.
    ReceiptState {
        /// Not started.
        Pending => "pending",
        /// A worker is writing to the backend.
        Running => "running",
        /// Written, not yet read back.
        Written => "written",
        /// Read back and matched: the revision is searchable in this backend.
        Verified => "verified",
        /// A tombstone's exclusion is in place for this backend.
        Excluded => "excluded",
        /// The backend write failed for good.
        Failed => "failed",
        /// The job was superseded before this backend finished.
        Superseded => "superseded",
        /// The source was erased: nothing of any of its revisions is left in this backend
        /// (read back).
        Erased => "erased",
    }
}

closed_enum! {
    /// A projection backend.
    Backend {
        /// Chunk rows in a relational store.
        Relational => "relational",
        /// Embedding points in a vector store.
        Vector => "vector",
        /// Nodes and edges in a graph store.
        Graph => "graph",
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
    }
}

closed_enum! {
    /// What acceptance did with a submission.
    AcceptStatus {
        /// A new head was recorded and a projection job queued; nothing is indexed yet.
        QueuedNotConfirmed => "queued_not_confirmed",
        /// The submission equals the current head: nothing was created.
        Duplicate => "duplicate",
    }
}

/// One change to a source, as submitted for acceptance.
#[derive(Debug, Clone)]
pub struct Submission {
    /// Dataset name (validated by [`crate::validate`]).
    pub dataset: String,
    /// Key of the source within its dataset.
    pub source_key: String,
    /// Who asks for the change (e.g. `token:ingest-bot`).
    pub actor: String,
    /// The change itself.
    pub change: Change,
}

impl Submission {
    /// New UTF-8 text content for a source, as `text/plain` without tags or metadata.
    pub fn text(dataset: &str, source_key: &str, actor: &str, text: &str) -> Submission {
        Submission::document(
            dataset,
            source_key,
            actor,
            text.as_bytes().to_vec(),
            "text/plain",
        )
    }

    /// A put of `bytes` of `media_type`, without tags or metadata.
    pub fn document(
        dataset: &str,
        source_key: &str,
        actor: &str,
        bytes: Vec<u8>,
        media_type: &str,
    ) -> Submission {
        Submission {
            dataset: dataset.to_owned(),
            source_key: source_key.to_owned(),
            actor: actor.to_owned(),
            change: Change::Put(Document {
                bytes,
                media_type: media_type.to_owned(),
                tags: Vec::new(),
                metadata: serde_json::Map::new(),
            }),
        }
    }
}

/// A new revision's content, or a deletion.
#[derive(Debug, Clone)]
pub enum Change {
    /// New content for the source.
    Put(Document),
    /// Delete the source: a tombstone revision becomes head.
    Delete {
        /// Why the source is deleted, recorded on the tombstone and in history.
        reason: Option<String>,
    },
}

/// A request to erase a source: every trace of every revision, in every store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErasureRequest {
    /// Dataset.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// Who asks (history).
    pub actor: String,
    /// Why, e.g. the legal request's reference (history).
    pub reason: String,
}

/// What an erasure removed from the ledger, and what the ledger holds of it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct Erasure {
    /// The erasure's tombstone: the source's head from then on (its jobs erase the stores).
    pub revision_id: Uuid,
    /// Dataset.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// Revisions erased.
    pub revisions_erased: i64,
    /// SHA-256 of each erased content (hashes only: no content, no text).
    pub content_sha256: Vec<String>,
    /// Retained contents deleted (a content another source still holds is kept).
    pub contents_deleted: i64,
    /// Chunk rows deleted, in every generation.
    pub chunk_rows_deleted: i64,
    /// Who erased it.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// When.
    pub erased_at: Micros,
    /// Read back now: what the ledger still holds of the erased revisions (all zero).
    pub remaining: ErasureRemaining,
}

/// What the ledger still holds of an erased source's old revisions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct ErasureRemaining {
    /// Revisions of the source other than the erasure and later ones.
    pub revisions: i64,
    /// Chunk rows of those revisions.
    pub chunk_rows: i64,
    /// Lexical passages of those revisions.
    pub passages: i64,
    /// Erased contents still retained although no revision holds them.
    pub contents: i64,
}

/// The content and descriptive fields of a revision.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// The bytes to retain.
    pub bytes: Vec<u8>,
    /// Media type, e.g. `text/plain`.
    pub media_type: String,
    /// Free-form tags.
    pub tags: Vec<String>,
    /// A JSON object of caller metadata.
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// The receipt for an accepted submission: the bytes are durable, projection is queued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct Acceptance {
    /// Always `true`: a refused submission is an error, not an acceptance.
    pub accepted: bool,
    /// Whether anything was created.
    pub status: AcceptStatus,
    /// Dataset of the source.
    pub dataset: String,
    /// Key of the source.
    pub source_key: String,
    /// The revision that is now head.
    pub source_revision_id: Uuid,
    /// The projection job for that revision.
    pub projection_job_id: Uuid,
    /// SHA-256 of the retained bytes (absent for a tombstone).
    pub content_sha256: Option<String>,
    /// Length of the retained bytes (0 for a tombstone).
    pub byte_length: i64,
    /// When the revision was first accepted.
    pub accepted_at: Micros,
    /// The head this acceptance replaced, if any.
    pub previous_revision_id: Option<Uuid>,
    /// Whether the head is a tombstone.
    pub tombstone: bool,
}

/// A revision as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct Revision {
    /// Revision id (UUID v5 of its identity, or v7 for tombstones).
    pub id: Uuid,
    /// Dataset.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// SHA-256 of the content; `None` for a tombstone.
    pub content_sha256: Option<String>,
    /// Byte length of the content.
    pub byte_length: i64,
    /// Media type.
    pub media_type: String,
    /// Tags.
    pub tags: Vec<String>,
    /// Metadata object.
    pub metadata: serde_json::Value,
    /// Whether this revision deletes the source.
    pub tombstone: bool,
    /// The head this revision replaced when it was first accepted.
    pub previous_revision_id: Option<Uuid>,
    /// Who submitted it.
    pub actor: String,
    /// Why (tombstones).
    pub reason: Option<String>,
    /// When it was first accepted.
    pub accepted_at: Micros,
}

/// A projection job as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct Job {
    /// Job id (UUID v7).
    pub id: Uuid,
    /// The revision it projects.
    pub revision_id: Uuid,
    /// Dataset.
    pub dataset: String,
    /// Source key.
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

/// One backend's projection receipt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct ProjectionReceipt {
    /// The backend.
    pub backend: Backend,
    /// Its state.
    pub state: ReceiptState,
    /// Read-back evidence (JSON), once verified.
    pub evidence: Option<serde_json::Value>,
    /// Last change.
    pub updated_at: Micros,
}

/// One entry of the append-only history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct HistoryEntry {
    /// Position in the ledger-wide history.
    pub seq: i64,
    /// When it happened.
    pub at: Micros,
    /// `source`, `job`, `receipt`, `block` or `token`.
    pub entity: String,
    /// Which one (e.g. the job id, `dataset/source_key`, `job_id/backend`).
    pub entity_id: String,
    /// What happened (`state`, `head_moved`, `blocked`, ...).
    pub event: String,
    /// The state or head before.
    pub from: Option<String>,
    /// The state or head after.
    pub to: Option<String>,
    /// Who made the change (`unattributed` for writes outside cairn).
    pub actor: String,
    /// Why.
    pub cause: String,
    /// A job run that ended in an error: the error's code.
    pub error_code: Option<String>,
    /// ... and its message.
    pub error_message: Option<String>,
    /// A job run's end: the stage it had reached.
    pub stage: Option<String>,
}

/// A revision with its latest job, that job's receipts and the revision's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct RevisionDetail {
    /// The revision.
    pub revision: Revision,
    /// Whether it is the current head of its source.
    pub is_head: bool,
    /// Its latest projection job.
    pub job: Option<Job>,
    /// That job's receipts per backend.
    pub receipts: Vec<ProjectionReceipt>,
    /// Every transition that touched this revision, its jobs or receipts, oldest first.
    pub history: Vec<HistoryEntry>,
}

/// A source with its head and revision chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct SourceView {
    /// Dataset.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// The current head.
    pub head: Revision,
    /// Whether the head is a tombstone.
    pub deleted: bool,
    /// Every revision of the source, newest first.
    pub revisions: Vec<Revision>,
    /// Head moves, oldest first.
    pub head_history: Vec<HistoryEntry>,
}

/// An operator's block on exact content within a dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct ContentBlock {
    /// Dataset the block applies to.
    pub dataset: String,
    /// SHA-256 (lowercase hex) of the blocked bytes.
    pub sha256: String,
    /// Why it is blocked.
    pub reason: String,
    /// Who blocked it.
    pub actor: String,
}

/// A lexical (FTS5/BM25) hit over current heads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LexicalHit {
    /// Dataset.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// The head revision the passage belongs to.
    pub revision_id: Uuid,
    /// Passage index within the revision.
    pub passage_index: i64,
    /// Passage text.
    pub text: String,
    /// The section the passage starts in, for formats with headings.
    pub section: Option<String>,
    /// The passage's page (1-based), for paged formats.
    pub page: Option<i64>,
    /// BM25 score (higher is better).
    pub score: f64,
}

/// A search hit to check against the ledger: a revision and, for a vector hit, its chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HitRef {
    /// The revision the hit points at.
    pub revision_id: Uuid,
    /// The chunk of a vector hit (its text is read from the chunk rows).
    pub chunk_index: Option<u32>,
}

/// What the ledger says about a hit's revision, at the moment of the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundHit {
    /// The hit as asked.
    pub hit: HitRef,
    /// Dataset of the revision's source.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// The revision is its source's head and the source is not deleted.
    pub current: bool,
    /// Its relational and vector receipts are verified for the active generation.
    pub vector_searchable: bool,
    /// The chunk's text (vector hits whose chunk rows exist).
    pub chunk_text: Option<String>,
    /// The chunk's section, when its format has headings.
    pub section: Option<String>,
    /// The chunk's first page, when its format has pages.
    pub page: Option<i64>,
}

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

/// The identity of a projection: the embedding model, its dimension, the chunker settings and
/// the backends. Receipts and chunk rows record it; changing any part needs a new generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generation {
    /// `g-` and 16 hex digits of the sha256 of the other fields.
    pub id: String,
    /// Embedding model id.
    pub model: String,
    /// Vector dimension.
    pub dimension: i64,
    /// Chunker settings, as text.
    pub chunker: String,
    /// Backends projected into (sorted).
    pub backends: Vec<Backend>,
}

impl Generation {
    /// The generation of these settings; its id is derived from them. The graph backend is
    /// not part of a generation (it holds no model output, and has jobs of its own): turning
    /// it on or off never asks for a new generation.
    pub fn new(model: &str, dimension: i64, chunker: &str, backends: &[Backend]) -> Generation {
        use sha2::Digest;
        let mut backends = backends.to_vec();
        backends.retain(|backend| *backend != Backend::Graph);
        backends.sort_by_key(|backend| backend.as_str());
        backends.dedup();
        let names: Vec<&str> = backends.iter().map(|backend| backend.as_str()).collect();
        let identity = format!("{model}\n{dimension}\n{chunker}\n{}", names.join(","));
        let digest = sha2::Sha256::digest(identity.as_bytes());
        Generation {
            id: format!("g-{}", &crate::ids::to_hex(&digest)[..16]),
            model: model.to_owned(),
            dimension,
            chunker: chunker.to_owned(),
            backends,
        }
    }
}

closed_enum! {
    /// Where a projection generation is in its life. Several generations can be live at once:
    /// one `active` (the one search answers from), at most one being built, and former active
    /// ones kept for rollback.
    GenerationState {
        /// Being built beside the active one: one rebuild job per current head, and every new
        /// acceptance is projected into it too. Search does not use it.
        Building => "building",
        /// The generation search answers from (exactly one, once any exists).
        Active => "active",
        /// A former active generation kept intact for rollback; it keeps receiving new
        /// acceptances until it is retired.
        Standby => "standby",
        /// Being retired: no new work; its chunk rows are deleted, its vectors are being
        /// deleted (a retire that stopped here is finished by running it again).
        Retiring => "retiring",
        /// Its data is deleted and read back as gone (the evidence is kept).
        Retired => "retired",
    }
}

impl GenerationState {
    /// Whether new acceptances are projected into it.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            GenerationState::Building | GenerationState::Active | GenerationState::Standby
        )
    }
}

/// How far a generation is: its coverage of the current heads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct GenerationProgress {
    /// Sources whose head is current content (not deleted).
    pub heads: i64,
    /// Of those, heads verified in this generation in every backend it holds.
    pub verified: i64,
    /// Heads whose latest job for this generation is dead or quarantined.
    pub failed: i64,
    /// Jobs for this generation not yet ended (pending, running, waiting to retry).
    pub open_jobs: i64,
    /// Revisions verified in this generation over the last minute, per second.
    pub rate_per_s: f64,
    /// Seconds left at that rate (`None` when nothing is moving or nothing is left).
    pub eta_s: Option<f64>,
}

impl GenerationProgress {
    /// Fills in the ETA from the counts and the rate.
    pub fn with_eta(mut self) -> Self {
        let left = (self.heads - self.verified).max(0);
        self.eta_s = (left > 0 && self.rate_per_s > 0.0).then(|| left as f64 / self.rate_per_s);
        self
    }
}

/// A generation with its state and progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct GenerationView {
    /// `g-` and 16 hex digits of its settings.
    pub id: String,
    /// Embedding model id.
    pub model: String,
    /// Vector dimension.
    pub dimension: i64,
    /// Chunker settings, as text.
    pub chunker: String,
    /// Backends projected into.
    pub backends: Vec<Backend>,
    /// Where it is in its life.
    pub state: GenerationState,
    /// When it was recorded.
    pub created_at: Micros,
    /// Who recorded it.
    pub created_by: String,
    /// Its last state change.
    pub changed_at: Micros,
    /// Who made it.
    pub changed_by: String,
    /// Why.
    pub change_cause: String,
    /// Coverage of the current heads (zero once retired).
    pub progress: GenerationProgress,
    /// What retiring it deleted, read back as gone.
    #[cfg_attr(feature = "http", schema(value_type = Option<Object>))]
    pub retired_evidence: Option<serde_json::Value>,
}

impl GenerationView {
    /// Its identity.
    pub fn generation(&self) -> Generation {
        Generation {
            id: self.id.clone(),
            model: self.model.clone(),
            dimension: self.dimension,
            chunker: self.chunker.clone(),
            backends: self.backends.clone(),
        }
    }
}

/// A change to the set of generations: the one path for every generation state change.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationChange {
    /// Records a `building` generation and queues one rebuild job (at `priority`) per current
    /// head, for it only. A retired generation with the same settings is built again.
    Create {
        /// Its identity.
        generation: Generation,
        /// Priority of the rebuild jobs (below fresh ingest's 0, so that fresh ingest goes
        /// first).
        priority: i64,
    },
    /// Makes a building or standby generation the active one, in one transaction; the active
    /// one becomes `standby`. Refused (`generation_incomplete`) while a current head is not
    /// verified in it, unless `force`.
    Switch {
        /// The generation.
        id: String,
        /// Switch even with heads missing (the answer names them).
        force: bool,
    },
    /// Starts retiring a building or standby generation: it takes no more work (its open jobs
    /// are cancelled) and its chunk rows are deleted. The caller then deletes its vectors and
    /// records [`GenerationChange::Retired`].
    Retire {
        /// The generation.
        id: String,
    },
    /// Records that a retiring generation's vectors are gone, with the read-back evidence.
    Retired {
        /// The generation.
        id: String,
        /// What was deleted and read back.
        evidence: serde_json::Value,
    },
}

/// A generation change with its actor and reason (history records both).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationCommand {
    /// What to change.
    pub change: GenerationChange,
    /// Who asks.
    pub actor: String,
    /// Why.
    pub reason: String,
}

/// What a generation change did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct GenerationChanged {
    /// The generation after the change.
    pub generation: GenerationView,
    /// Rebuild jobs queued (create) or jobs cancelled (retire).
    pub jobs: i64,
    /// Chunk rows deleted (retire).
    pub chunk_rows_deleted: i64,
    /// The generation that stopped being active (switch).
    pub previous: Option<String>,
    /// Heads not verified in it when a forced switch made it active: their count and up to
    /// 20 of them as `dataset/source_key`.
    pub missing: i64,
    /// Up to 20 of the missing heads.
    pub missing_sample: Vec<String>,
}

/// Where a chunk with a given text hash is stored (a reuse candidate).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    /// SHA-256 of the chunk's text.
    pub sha256: String,
    /// The revision holding it.
    pub revision_id: Uuid,
    /// Its position there.
    pub chunk_index: u32,
}

/// One chunk row of a revision (the relational backend).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRow {
    /// Position in the revision (0-based).
    pub chunk_index: i64,
    /// The chunk's text.
    pub text: String,
    /// Byte offset of its first byte in the revision's text (the extracted text, for formats
    /// that extract such as HTML).
    pub byte_start: i64,
    /// Byte offset after its last byte.
    pub byte_end: i64,
    /// Tokens in it.
    pub token_count: i64,
    /// Hex sha256 of the text.
    pub sha256: String,
    /// The section it starts in (`# A > ## B`), when the format has headings.
    #[serde(default)]
    pub section: Option<String>,
    /// Its first page (1-based), when the format has pages.
    #[serde(default)]
    pub page: Option<i64>,
}

/// What the relational backend holds for a revision: read back after every write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkSummary {
    /// Rows stored.
    pub count: i64,
    /// Hex sha256 over the rows' hashes in chunk order, one per line.
    pub checksum: String,
}

impl ChunkSummary {
    /// The summary of rows with these hashes, in chunk order.
    pub fn of<'a>(hashes: impl IntoIterator<Item = &'a str>) -> ChunkSummary {
        use sha2::Digest;
        let mut hasher = sha2::Sha256::new();
        let mut count = 0;
        for hash in hashes {
            hasher.update(hash.as_bytes());
            hasher.update(b"\n");
            count += 1;
        }
        ChunkSummary {
            count,
            checksum: crate::ids::to_hex(&hasher.finalize()),
        }
    }
}

/// A receipt state change written by a projection run (fenced by its lease).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReceiptUpdate {
    /// The backend.
    pub backend: Backend,
    /// The new state.
    pub state: ReceiptState,
    /// Evidence: counts, checksums, model, dimension, durations.
    pub evidence: serde_json::Value,
    /// Why, for history.
    pub cause: String,
    /// The projection generation.
    pub generation: String,
}
