//! Hits: lexical hits, and vector hits bound to the current revision of their source.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

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
    /// When the revision was accepted (record time).
    pub accepted_at: crate::Micros,
    /// Who submitted it (`token:<name>`), as history records it.
    pub actor: String,
}
