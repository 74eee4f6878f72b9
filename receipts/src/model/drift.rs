//! Drift: how a derived store can differ from what the ledger promises ([`crate::verify`]).

closed_enum! {
    /// How a store differs from what the ledger promises.
    DriftKind {
        /// Fewer points or rows than the receipt promised (none at all included).
        Missing => "missing",
        /// Points or rows the ledger does not account for.
        Extra => "extra",
        /// `is_current` disagrees with the ledger's head.
        StaleCurrent => "stale_current",
        /// Vectors of another dimension than the generation's.
        WrongDims => "wrong_dims",
        /// Bytes or rows whose checksum differs.
        Checksum => "checksum",
        /// A payload that names another dataset or source.
        Payload => "payload",
        /// Replicas of one shard that answer differently (a cluster).
        ReplicaDivergence => "replica_divergence",
    }
}

closed_enum! {
    /// How deep a verify pass reads.
    VerifyTier {
        /// Current points per bucket counted; a bucket whose count differs is read point by
        /// point (the cheapest pass).
        Counts => "counts",
        /// Every bucket's payloads scrolled without vectors, compared revision by revision.
        Scrub => "scrub",
        /// The scrub, and retained bytes hashed again against their content hash.
        Deep => "deep",
    }
}

closed_enum! {
    /// Where a verify pass stands.
    PassState {
        /// Going through its buckets (its cursor says where it is).
        Running => "running",
        /// Every bucket checked.
        Completed => "completed",
        /// Stopped by an operator, or given up after an error it names.
        Abandoned => "abandoned",
    }
}

closed_enum! {
    /// Where a confirmed drift stands.
    DriftState {
        /// Found, not repaired (a pass without `--repair`).
        Open => "open",
        /// Its repair is on its way (a projection job it names).
        Repairing => "repairing",
        /// Repaired directly in the store and read back.
        Repaired => "repaired",
        /// Retained bytes whose hash differs: corruption, never repaired by cairn (restore the
        /// bytes from a backup).
        Corrupt => "corrupt",
        /// The repair itself failed (the reason is in history).
        Failed => "failed",
    }
}

/// Which store a drift was found in.
pub mod stores {
    /// Points in the vector store.
    pub const VECTOR: &str = "vector";
    /// Chunk rows in the relational backend.
    pub const RELATIONAL: &str = "relational";
    /// Retained bytes in the ledger.
    pub const BYTES: &str = "bytes";
}

/// A verify pass: one tier over every bucket of one generation, resumable at its cursor.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct VerifyPass {
    /// Its id.
    pub id: uuid::Uuid,
    /// How deep it reads.
    pub tier: VerifyTier,
    /// The generation it checks.
    pub generation: String,
    /// Whether it repairs what it confirms.
    pub repair: bool,
    /// Where it stands.
    pub state: PassState,
    /// The next bucket to check.
    pub cursor: i64,
    /// Buckets checked so far.
    pub buckets_checked: i64,
    /// Sources skipped because work was in flight for them.
    pub skipped: i64,
    /// Confirmed drift so far, by kind.
    pub drift: std::collections::BTreeMap<String, i64>,
    /// Who started it.
    pub created_by: String,
    /// Why.
    pub reason: String,
    /// When it started (epoch microseconds).
    pub started_at: i64,
    /// Who changed it last, and why.
    pub changed_by: String,
    /// The last change's cause.
    pub change_cause: String,
    /// When it changed last.
    pub changed_at: i64,
}

impl VerifyPass {
    /// Confirmed drift, all kinds together.
    pub fn drift_total(&self) -> i64 {
        self.drift.values().sum()
    }
}

/// One confirmed drift, as the ledger keeps it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct DriftRecord {
    /// Its id.
    pub id: uuid::Uuid,
    /// The pass that found it.
    pub pass_id: uuid::Uuid,
    /// What kind.
    pub kind: DriftKind,
    /// Which store (`vector`, `relational`, `bytes`).
    pub store: String,
    /// The generation.
    pub generation: String,
    /// Dataset.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// The revision.
    pub revision_id: uuid::Uuid,
    /// What was expected and what was found.
    #[cfg_attr(feature = "http", schema(value_type = Object))]
    pub evidence: serde_json::Value,
    /// Where it stands.
    pub state: DriftState,
    /// What the repair did (a job it queued, points it retired), when one ran.
    pub repair: Option<String>,
    /// When it was confirmed.
    pub found_at: i64,
    /// When it changed last.
    pub changed_at: i64,
}

/// The one path for every change of a verify pass and its drift ([`crate::Verifications`]).
#[derive(Debug, Clone, PartialEq)]
pub enum PassChange {
    /// Starts a pass, or answers the running pass of the same tier and generation (resumed
    /// at its cursor).
    Start {
        /// How deep.
        tier: VerifyTier,
        /// Which generation.
        generation: String,
        /// Whether to repair.
        repair: bool,
        /// Who.
        actor: String,
        /// Why.
        reason: String,
    },
    /// Records one checked bucket: the cursor moves past it, with its confirmed drift, in one
    /// transaction.
    Advance {
        /// The pass.
        pass_id: uuid::Uuid,
        /// The bucket checked (the cursor moves to the next one).
        bucket: i64,
        /// Sources skipped in it because work was in flight.
        skipped: i64,
        /// Its confirmed drift (ids assigned by the caller).
        drift: Vec<DriftRecord>,
    },
    /// Ends a pass.
    Finish {
        /// The pass.
        pass_id: uuid::Uuid,
        /// `completed` or `abandoned`.
        state: PassState,
        /// Who.
        actor: String,
        /// Why.
        reason: String,
    },
    /// Records what a repair did to one drift.
    Repair {
        /// The drift.
        drift_id: uuid::Uuid,
        /// Its new state.
        state: DriftState,
        /// What was done.
        repair: String,
        /// Who.
        actor: String,
    },
}

/// What the ledger holds for one bucket of one generation: the promises a store is compared
/// with, and what makes a source's difference not drift.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LedgerBucket {
    /// Settled heads: no open job for their source, a completed projection in the
    /// generation with verified receipts.
    pub heads: Vec<SettledHead>,
    /// Every revision the ledger holds of the bucket's sources, with its source.
    pub known: std::collections::HashMap<uuid::Uuid, (String, String)>,
    /// Sources with work in flight (an open job, or a head not projected yet in the
    /// generation): never drift in this pass.
    pub unsettled: std::collections::HashSet<(String, String)>,
}

/// One settled head and what its receipts promise.
#[derive(Debug, Clone, PartialEq)]
pub struct SettledHead {
    /// Dataset.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// The head revision.
    pub revision_id: uuid::Uuid,
    /// When it became head for the vector store (its projection job's creation).
    pub head_at: i64,
    /// Its content hash (retained bytes).
    pub content_sha256: String,
    /// Points the verified vector receipt promises (`None`: no vector backend).
    pub points: Option<u32>,
    /// Rows and checksum the verified relational receipt promises (`None`: no relational
    /// backend).
    pub rows: Option<ChunkPromise>,
    /// The chunk rows the ledger holds now for the head in the generation.
    pub rows_found: crate::model::ChunkSummary,
}

/// Rows and checksum a relational receipt promises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkPromise {
    /// Rows.
    pub count: i64,
    /// Checksum over their hashes.
    pub checksum: String,
}

/// What a ledger backup holds: where in its history it was taken.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LedgerBackup {
    /// `sqlite` or `postgres`.
    pub engine: String,
    /// The newest migration applied (the schema version).
    pub schema_version: i64,
    /// The newest history entry in the copy.
    pub history_seq: i64,
    /// When the newest history entry was written (epoch microseconds): a restore refuses a
    /// clock behind it.
    pub newest_at: i64,
    /// Sources in the copy.
    pub sources: i64,
    /// Revisions in the copy.
    pub revisions: i64,
    /// Retained contents in the copy.
    pub contents: i64,
}

/// A restore, as history records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreRecord {
    /// The backup's id (its directory's name).
    pub backup_id: String,
    /// Who restored.
    pub actor: String,
    /// What the restore did (steps, counts, where the ledger it replaced was moved).
    pub cause: String,
}
