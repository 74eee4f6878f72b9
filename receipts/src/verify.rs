//! Verify: what the ledger's receipts promise each derived store holds, compared with what the
//! store answers, one bucket of sources at a time. Engine- and store-free: the callers read
//! both sides; these functions decide what differs and why (the design is in
//! `docs/journal/verify-backup-design.md`).
//!
//! ## Model
//! - Sources fall into [`BUCKETS`] buckets by a stable hash of `(dataset, source_key)`
//!   ([`bucket`]), the same on every engine and in every store's payload.
//! - Each side of a bucket folds into an order-free [`Digest`] (XOR of one hash per revision
//!   and count), so two sides read in any order and page by page compare in one step; only a
//!   bucket whose digests differ is compared revision by revision ([`compare`]).
//! - A [`Promise`] is a settled head in one generation (no open job, its receipts verified):
//!   its chunk count and checksum, its identity, the generation's dimension. A [`Held`] is
//!   what the store answers for one revision.
//!
//! ## Invariants
//! - Points of a superseded revision the ledger still holds are not drift while they are not
//!   current (projection reuses their vectors); points of a revision the ledger does not hold
//!   are `extra`.
//! - Every drift carries its evidence: what was expected and what was found.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use uuid::Uuid;

pub use crate::model::DriftKind;

/// Buckets sources fall into.
pub const BUCKETS: u16 = 1024;

/// The bucket of `(dataset, source_key)`: the first two bytes of the SHA-256 of the dataset, a
/// zero byte and the key, modulo [`BUCKETS`]. Stable across versions and engines.
pub fn bucket(dataset: &str, source_key: &str) -> u16 {
    let mut hasher = Sha256::new();
    hasher.update(dataset.as_bytes());
    hasher.update([0u8]);
    hasher.update(source_key.as_bytes());
    let hash = hasher.finalize();
    u16::from_be_bytes([hash[0], hash[1]]) % BUCKETS
}

/// An order-free digest of a bucket's `(revision, count)` pairs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Digest([u8; 32]);

impl Digest {
    /// Folds one revision with its count in (any order gives the same digest).
    pub fn add(&mut self, revision_id: Uuid, count: u32) {
        let mut hasher = Sha256::new();
        hasher.update(revision_id.as_bytes());
        hasher.update(count.to_be_bytes());
        for (byte, other) in self.0.iter_mut().zip(hasher.finalize()) {
            *byte ^= other;
        }
    }

    /// The digest of `items`.
    pub fn of(items: impl IntoIterator<Item = (Uuid, u32)>) -> Digest {
        let mut digest = Digest::default();
        for (revision_id, count) in items {
            digest.add(revision_id, count);
        }
        digest
    }

    /// As lowercase hex.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// What the ledger promises for one settled head in one generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promise {
    /// Dataset.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// The head.
    pub revision_id: Uuid,
    /// Chunks (rows, and points) its verified receipts promise.
    pub chunks: u32,
    /// The generation's vector dimension.
    pub dimension: u32,
}

/// What a store answers for one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The revision its points name.
    pub revision_id: Uuid,
    /// The dataset its payloads name.
    pub dataset: String,
    /// The source key its payloads name.
    pub source_key: String,
    /// Points.
    pub points: u32,
    /// Points flagged current.
    pub current: u32,
    /// The dimension of its vectors, when they were read (the deep tier).
    pub dimension: Option<u32>,
}

/// One difference, with its evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Drift {
    /// What kind.
    pub kind: DriftKind,
    /// Dataset.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// The revision.
    pub revision_id: Uuid,
    /// What was expected and what was found.
    pub evidence: serde_json::Value,
}

/// What differs between the promises of a bucket and what a store holds for it. `known` is
/// every revision of the bucket's sources the ledger still holds (heads and superseded ones).
pub fn compare(promises: &[Promise], held: &[Held], known: &HashSet<Uuid>) -> Vec<Drift> {
    let by_revision: HashMap<Uuid, &Held> = held.iter().map(|h| (h.revision_id, h)).collect();
    let mut drift = Vec::new();
    let mut push = |kind, p_dataset: &str, p_key: &str, revision_id, evidence| {
        drift.push(Drift {
            kind,
            dataset: p_dataset.to_owned(),
            source_key: p_key.to_owned(),
            revision_id,
            evidence,
        })
    };
    for promise in promises {
        let (dataset, key, revision) = (
            promise.dataset.as_str(),
            promise.source_key.as_str(),
            promise.revision_id,
        );
        let Some(found) = by_revision.get(&revision) else {
            push(
                DriftKind::Missing,
                dataset,
                key,
                revision,
                serde_json::json!({"expected_points": promise.chunks, "found_points": 0}),
            );
            continue;
        };
        if found.points < promise.chunks {
            push(
                DriftKind::Missing,
                dataset,
                key,
                revision,
                serde_json::json!({"expected_points": promise.chunks, "found_points": found.points}),
            );
        } else if found.points > promise.chunks {
            push(
                DriftKind::Extra,
                dataset,
                key,
                revision,
                serde_json::json!({"expected_points": promise.chunks, "found_points": found.points}),
            );
        }
        if found.current < found.points {
            push(
                DriftKind::StaleCurrent,
                dataset,
                key,
                revision,
                serde_json::json!({"head": true, "points": found.points, "current": found.current}),
            );
        }
        if found.dataset != promise.dataset || found.source_key != promise.source_key {
            push(
                DriftKind::Payload,
                dataset,
                key,
                revision,
                serde_json::json!({
                    "expected": {"dataset": promise.dataset, "source_key": promise.source_key},
                    "found": {"dataset": found.dataset, "source_key": found.source_key},
                }),
            );
        }
        if let Some(dimension) = found.dimension.filter(|d| *d != promise.dimension) {
            push(
                DriftKind::WrongDims,
                dataset,
                key,
                revision,
                serde_json::json!({"expected": promise.dimension, "found": dimension}),
            );
        }
    }
    let heads: HashSet<Uuid> = promises.iter().map(|p| p.revision_id).collect();
    for found in held {
        if heads.contains(&found.revision_id) {
            continue;
        }
        let (dataset, key) = (found.dataset.as_str(), found.source_key.as_str());
        if !known.contains(&found.revision_id) {
            push(
                DriftKind::Extra,
                dataset,
                key,
                found.revision_id,
                serde_json::json!({"reason": "the ledger holds no such revision", "points": found.points}),
            );
        } else if found.current > 0 {
            push(
                DriftKind::StaleCurrent,
                dataset,
                key,
                found.revision_id,
                serde_json::json!({"head": false, "current": found.current}),
            );
        }
    }
    drift
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn promise(key: &str, revision: u128, chunks: u32) -> Promise {
        Promise {
            dataset: "docs".into(),
            source_key: key.into(),
            revision_id: id(revision),
            chunks,
            dimension: 384,
        }
    }

    fn held(key: &str, revision: u128, points: u32, current: u32) -> Held {
        Held {
            revision_id: id(revision),
            dataset: "docs".into(),
            source_key: key.into(),
            points,
            current,
            dimension: Some(384),
        }
    }

    #[test]
    fn buckets_are_stable_and_spread() {
        assert_eq!(bucket("docs", "a.md"), bucket("docs", "a.md"));
        assert_ne!(bucket("docs", "a.md"), bucket("docs2", "a.md"));
        // The zero byte keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(bucket("ab", "c"), bucket("a", "bc"));
        let used: HashSet<u16> = (0..10_000)
            .map(|n| bucket("docs", &format!("file-{n}.md")))
            .collect();
        assert!(used.iter().all(|b| *b < BUCKETS));
        assert!(used.len() > 1000, "{} of 1024 buckets used", used.len());
    }

    #[test]
    fn digests_ignore_order_and_see_every_difference() {
        let one = Digest::of([(id(1), 3), (id(2), 5)]);
        let other = Digest::of([(id(2), 5), (id(1), 3)]);
        assert_eq!(one, other);
        assert_ne!(one, Digest::of([(id(1), 3), (id(2), 4)]));
        assert_ne!(one, Digest::of([(id(1), 3)]));
        assert_eq!(Digest::of([]).hex(), "0".repeat(64));
    }

    #[test]
    fn every_kind_of_drift_is_found_with_its_evidence() {
        let promises = [
            promise("same.md", 1, 3),
            promise("gone.md", 2, 2),
            promise("short.md", 3, 4),
            promise("flag.md", 4, 2),
            promise("moved.md", 5, 1),
            promise("dims.md", 6, 1),
        ];
        let moved = held("other.md", 5, 1, 1);
        let mut dims = held("dims.md", 6, 1, 1);
        dims.dimension = Some(768);
        let store = [
            held("same.md", 1, 3, 3),
            held("short.md", 3, 2, 2),
            held("flag.md", 4, 2, 1),
            moved,
            dims,
            held("same.md", 10, 3, 0),
            held("same.md", 11, 3, 3),
            held("ghost.md", 12, 2, 0),
        ];
        let known: HashSet<Uuid> = [1, 2, 3, 4, 5, 6, 10, 11].into_iter().map(id).collect();
        let found: Vec<(DriftKind, String, Uuid)> = compare(&promises, &store, &known)
            .into_iter()
            .map(|drift| (drift.kind, drift.source_key, drift.revision_id))
            .collect();
        let expected = [
            (DriftKind::Missing, "gone.md", id(2)),
            (DriftKind::Missing, "short.md", id(3)),
            (DriftKind::StaleCurrent, "flag.md", id(4)),
            (DriftKind::Payload, "moved.md", id(5)),
            (DriftKind::WrongDims, "dims.md", id(6)),
            // A superseded revision still flagged current; a superseded one that is not is
            // fine (its vectors are reused); one the ledger does not hold is extra.
            (DriftKind::StaleCurrent, "same.md", id(11)),
            (DriftKind::Extra, "ghost.md", id(12)),
        ]
        .map(|(kind, key, revision)| (kind, key.to_owned(), revision));
        assert_eq!(found, expected.to_vec());
        let drift = compare(&promises, &store, &known);
        assert_eq!(
            drift[1].evidence,
            serde_json::json!({"expected_points": 4, "found_points": 2})
        );
        assert!(compare(&promises[..1], &store[..1], &known).is_empty());
    }
}
