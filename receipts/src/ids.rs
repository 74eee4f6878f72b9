//! Identifiers.
//!
//! - **Revisions: UUID v5** over the revision's identity (dataset, source key, content SHA-256,
//!   media type, sorted tags, canonical metadata). Deterministic so that re-accepting the exact
//!   content of an earlier revision finds that revision again (it becomes head again instead of
//!   a look-alike forming under a new id), and so that identical re-ingest is idempotent.
//! - **Tombstones, jobs, tokens: UUID v7**: time-ordered records, each one a new event; sorting
//!   by id sorts by creation time.
//! - **History**: an integer sequence, the order in which the store recorded changes.

use sha2::{Digest, Sha256};
use uuid::Uuid;

/// Namespace for revision ids (a fixed v4 uuid, never change it: ids would change).
const REVISION_NAMESPACE: Uuid = Uuid::from_u128(0x6f0c_0f5b_3c1e_4f8e_9a44_8f61_2a9d_c0de);

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    to_hex(&Sha256::digest(bytes))
}

/// Tags in canonical form: sorted, without duplicates.
pub fn canonical_tags(tags: &[String]) -> Vec<String> {
    let mut sorted = tags.to_vec();
    sorted.sort();
    sorted.dedup();
    sorted
}

/// What a content revision's id is derived from: everything that makes two revisions the same.
#[derive(Debug, Clone, Copy)]
pub struct RevisionIdentity<'a> {
    /// The dataset.
    pub dataset: &'a str,
    /// The source key.
    pub source_key: &'a str,
    /// The content's SHA-256, lowercase hex.
    pub sha256: &'a str,
    /// The media type.
    pub media_type: &'a str,
    /// The tags, in any order.
    pub tags: &'a [String],
    /// The caller's metadata.
    pub metadata: &'a serde_json::Map<String, serde_json::Value>,
}

/// The deterministic id of a content revision.
pub fn revision_id(identity: RevisionIdentity<'_>) -> Uuid {
    let RevisionIdentity {
        dataset,
        source_key,
        sha256,
        media_type,
        tags,
        metadata,
    } = identity;
    // serde_json's map is ordered by key, so the metadata serialises canonically.
    let identity = serde_json::json!([
        dataset,
        source_key,
        sha256,
        media_type,
        canonical_tags(tags),
        metadata,
    ]);
    Uuid::new_v5(&REVISION_NAMESPACE, identity.to_string().as_bytes())
}

/// A new time-ordered id.
pub fn new_v7() -> Uuid {
    Uuid::now_v7()
}

/// Lowercase hex of `bytes` (a table lookup per byte; `hex::encode` goes through `char`s).
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(DIGITS[usize::from(byte >> 4)]);
        out.push(DIGITS[usize::from(byte & 0x0f)]);
    }
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn to_hex_matches_hex_crate() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(super::to_hex(&bytes), hex::encode(&bytes));
    }
}
