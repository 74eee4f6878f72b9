//! Generations: the identity of a projection, its state, progress and the changes an operator
//! makes.

use serde::{Deserialize, Serialize};

use super::projection::Backend;
use crate::clock::Micros;

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
    /// The vector collection's layout on a cluster (`shards=6,replication=3,write_consistency=2`),
    /// empty for the store's defaults. Part of the identity only when set, so generations
    /// recorded before layouts existed keep their ids.
    #[serde(default)]
    pub vector_layout: String,
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
            vector_layout: String::new(),
        }
    }

    /// This generation with its vectors laid out as `layout` (empty: the store's defaults):
    /// a layout is part of the identity, so a collection sharded or replicated otherwise is
    /// another generation.
    pub fn with_vector_layout(mut self, layout: &str) -> Generation {
        use sha2::Digest;
        if layout.is_empty() {
            return self;
        }
        let names: Vec<&str> = self
            .backends
            .iter()
            .map(|backend| backend.as_str())
            .collect();
        let identity = format!(
            "{}\n{}\n{}\n{}\n{layout}",
            self.model,
            self.dimension,
            self.chunker,
            names.join(",")
        );
        let digest = sha2::Sha256::digest(identity.as_bytes());
        self.id = format!("g-{}", &crate::ids::to_hex(&digest)[..16]);
        self.vector_layout = layout.to_owned();
        self
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
    /// The vector collection's layout on a cluster; empty for the store's defaults.
    #[serde(default)]
    pub vector_layout: String,
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
            vector_layout: self.vector_layout.clone(),
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
