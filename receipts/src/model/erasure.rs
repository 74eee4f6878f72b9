//! Erasure: a request to delete every earlier revision of a source, and what it did.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::clock::Micros;

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
