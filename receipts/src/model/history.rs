//! History: the append-only record the store keeps of every state change.

use serde::{Deserialize, Serialize};

use crate::clock::Micros;

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
