//! Projection receipts: one per backend and job, the state of its write and read-back.

use serde::{Deserialize, Serialize};

use crate::clock::Micros;

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

/// One job's part of a unit's ledger write ([`crate::Projections::project_many`]): its chunk
/// rows (replacing the revision's rows in `generation`, as
/// [`crate::Projections::write_chunks`] does) and its receipt updates, all fenced by its own
/// lease and kept or undone together, apart from every other job of the unit.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitWrite {
    /// The job's lease.
    pub lease: crate::model::LeaseToken,
    /// Chunk rows to write first, with their generation (`None`: none).
    pub chunks: Option<(String, Vec<crate::model::ChunkRow>)>,
    /// Receipt updates, in order.
    pub receipts: Vec<ReceiptUpdate>,
}
