//! Chunks: the rows projection writes for a revision, and what the ledger keeps of them for reuse.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

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

    /// The summaries of `revisions`, in their order, from `(revision, sha256)` rows in chunk
    /// order (each revision's rows together, in any revision order): what both engines'
    /// [`crate::Projections::chunk_summaries`] compute from one read.
    pub fn by_revision<R, K: PartialEq<R>>(
        revisions: &[K],
        rows: &[(R, String)],
    ) -> Vec<ChunkSummary> {
        revisions
            .iter()
            .map(|revision| {
                ChunkSummary::of(
                    rows.iter()
                        .filter(|(of, _)| revision == of)
                        .map(|(_, hash)| hash.as_str()),
                )
            })
            .collect()
    }
}
