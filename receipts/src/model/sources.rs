//! Sources and revisions: what a client submits, what acceptance answers, and what the ledger holds
//! of a source.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::history::HistoryEntry;
use super::jobs::Job;
use super::projection::ProjectionReceipt;
use crate::clock::Micros;

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
    /// The connector that submits it, which then owns the source (`None`: API ingest). A
    /// live source that another owner holds is refused (`owned_by_connector`,
    /// `owned_by_another`); see [`crate::connectors::ownership`].
    pub connector: Option<uuid::Uuid>,
    /// When the change holds (validity time); none given: from its record time on, which
    /// is what an acceptance meant before validity existed. See [`crate::validity`].
    pub validity: crate::validity::Validity,
    /// The change itself.
    pub change: Change,
    /// The readers a put names ([`crate::access`], checked); `None`: the source's readers
    /// stay as they are. Recorded in the acceptance's own transaction, and only when the put
    /// is accepted (a duplicate included): a refused put changes nobody's access.
    pub readers: Option<Vec<String>>,
}

impl Submission {
    /// The same submission, naming its readers.
    pub fn read_by(mut self, readers: Vec<String>) -> Submission {
        self.readers = Some(readers);
        self
    }

    /// The same submission, holding over `validity`.
    pub fn valid(mut self, validity: crate::validity::Validity) -> Submission {
        self.validity = validity;
        self
    }

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
            connector: None,
            validity: Default::default(),
            change: Change::Put(Document {
                bytes,
                media_type: media_type.to_owned(),
                tags: Vec::new(),
                metadata: serde_json::Map::new(),
            }),
            readers: None,
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

/// A source's head as a listing shows it: enough to compare the dataset with another copy
/// (a folder, a repository) without reading any content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct SourceListing {
    /// Source key.
    pub source_key: String,
    /// The head revision.
    pub head_revision_id: Uuid,
    /// SHA-256 of the head's bytes; `None` when the head is a tombstone.
    pub content_sha256: Option<String>,
    /// Byte length of the head's bytes.
    pub byte_length: i64,
    /// Whether the head deletes the source.
    pub tombstone: bool,
    /// When the head was accepted.
    pub accepted_at: Micros,
    /// Who keeps the source: `connector:<id>`, or `None` when API ingest created it.
    #[serde(default)]
    pub owner: Option<String>,
}

/// Most sources one listing page holds.
pub const MAX_LISTING_PAGE: u32 = 1000;

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
