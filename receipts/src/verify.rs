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
//! - The ledger side of a bucket is a [`LedgerBucket`]: its settled heads (no open job, a
//!   completed projection with verified receipts) with what their receipts promise, every
//!   revision it still holds, and the sources with work in flight. A [`Held`] is what the
//!   vector store answers for one revision.
//! - Drift is only what a second look confirms ([`confirmed`]): found twice, for a source
//!   settled both times with the same head.
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
use crate::model::{stores, LedgerBucket, SettledHead};

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

/// What a store answers for one revision, as its payloads name it (a revision whose points
/// disagree on their source comes back once per source they name).
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
    /// Points whose vector has another dimension than the store's, when vectors were read.
    pub wrong_dimension: u32,
    /// Points whose vector is not of unit length (a cosine store keeps them normalised), when
    /// vectors were read: damaged vectors.
    pub bad_norm: u32,
}

/// One difference, with its evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Drift {
    /// What kind.
    pub kind: DriftKind,
    /// Which store ([`crate::model::stores`]).
    pub store: String,
    /// Dataset.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// The revision.
    pub revision_id: Uuid,
    /// What was expected and what was found.
    pub evidence: serde_json::Value,
}

impl Drift {
    /// The identity a second look confirms: the same kind, store and revision.
    pub fn key(&self) -> (DriftKind, &str, Uuid) {
        (self.kind, self.store.as_str(), self.revision_id)
    }
}

fn drift(
    kind: DriftKind,
    store: &str,
    (dataset, source_key): (&str, &str),
    revision_id: Uuid,
    evidence: serde_json::Value,
) -> Drift {
    Drift {
        kind,
        store: store.to_owned(),
        dataset: dataset.to_owned(),
        source_key: source_key.to_owned(),
        revision_id,
        evidence,
    }
}

/// The digest of what the ledger promises the vector store holds current in a bucket.
pub fn promised_digest(bucket: &LedgerBucket) -> Digest {
    Digest::of(
        bucket
            .heads
            .iter()
            .filter_map(|head| head.points.map(|points| (head.revision_id, points))),
    )
}

/// The digest of what a store holds current for the bucket's settled sources, in the same
/// form as [`promised_digest`].
pub fn held_digest(bucket: &LedgerBucket, held: &[Held]) -> Digest {
    let mut current: HashMap<Uuid, u32> = HashMap::new();
    for found in held.iter().filter(|found| found.current > 0) {
        if !unsettled(bucket, found) {
            *current.entry(found.revision_id).or_default() += found.current;
        }
    }
    Digest::of(current)
}

fn unsettled(bucket: &LedgerBucket, found: &Held) -> bool {
    let named = (found.dataset.clone(), found.source_key.clone());
    bucket.unsettled.contains(&named)
        || bucket
            .known
            .get(&found.revision_id)
            .is_some_and(|source| bucket.unsettled.contains(source))
}

/// What differs between what the ledger holds for a bucket and what the vector store holds
/// for it (`held`, every point of the bucket, current or not).
pub fn compare_vectors(bucket: &LedgerBucket, held: &[Held]) -> Vec<Drift> {
    let mut by_revision: HashMap<Uuid, Vec<&Held>> = HashMap::new();
    for found in held {
        by_revision
            .entry(found.revision_id)
            .or_default()
            .push(found);
    }
    let mut out = Vec::new();
    let mut heads = HashSet::new();
    for head in &bucket.heads {
        let Some(expected) = head.points else {
            continue;
        };
        heads.insert(head.revision_id);
        let source = (head.dataset.as_str(), head.source_key.as_str());
        let revision = head.revision_id;
        let found = by_revision.get(&revision).map(Vec::as_slice).unwrap_or(&[]);
        let points: u32 = found.iter().map(|h| h.points).sum();
        let current: u32 = found.iter().map(|h| h.current).sum();
        let wrong: u32 = found.iter().map(|h| h.wrong_dimension).sum();
        let bad_norm: u32 = found.iter().map(|h| h.bad_norm).sum();
        let counts = serde_json::json!({"expected_points": expected, "found_points": points});
        if points < expected {
            out.push(drift(
                DriftKind::Missing,
                stores::VECTOR,
                source,
                revision,
                counts,
            ));
        } else if points > expected {
            out.push(drift(
                DriftKind::Extra,
                stores::VECTOR,
                source,
                revision,
                counts,
            ));
        }
        if current < points {
            out.push(drift(
                DriftKind::StaleCurrent,
                stores::VECTOR,
                source,
                revision,
                serde_json::json!({"head": true, "points": points, "current": current}),
            ));
        }
        if let Some(other) = found
            .iter()
            .find(|h| h.dataset != head.dataset || h.source_key != head.source_key)
        {
            out.push(drift(
                DriftKind::Payload,
                stores::VECTOR,
                source,
                revision,
                serde_json::json!({
                    "expected": {"dataset": head.dataset, "source_key": head.source_key},
                    "found": {"dataset": other.dataset, "source_key": other.source_key,
                              "points": other.points},
                }),
            ));
        }
        if wrong > 0 {
            out.push(drift(
                DriftKind::WrongDims,
                stores::VECTOR,
                source,
                revision,
                serde_json::json!({"points": points, "wrong_dimension": wrong}),
            ));
        }
        if bad_norm > 0 {
            out.push(drift(
                DriftKind::Checksum,
                stores::VECTOR,
                source,
                revision,
                serde_json::json!({"points": points, "not_unit_length": bad_norm}),
            ));
        }
    }
    for found in held {
        if heads.contains(&found.revision_id) || unsettled(bucket, found) {
            continue;
        }
        let source = (found.dataset.as_str(), found.source_key.as_str());
        match bucket.known.get(&found.revision_id) {
            None => out.push(drift(
                DriftKind::Extra,
                stores::VECTOR,
                source,
                found.revision_id,
                serde_json::json!({"reason": "the ledger holds no such revision",
                                   "points": found.points}),
            )),
            Some(_) if found.current > 0 => out.push(drift(
                DriftKind::StaleCurrent,
                stores::VECTOR,
                source,
                found.revision_id,
                serde_json::json!({"head": false, "current": found.current}),
            )),
            Some(_) => {}
        }
    }
    out
}

/// What differs between the chunk rows the relational receipts promise and the rows the
/// ledger holds now.
pub fn compare_rows(bucket: &LedgerBucket) -> Vec<Drift> {
    let mut out = Vec::new();
    for head in &bucket.heads {
        let Some(promised) = &head.rows else {
            continue;
        };
        let found = &head.rows_found;
        let evidence = serde_json::json!({
            "expected": {"rows": promised.count, "checksum": promised.checksum},
            "found": {"rows": found.count, "checksum": found.checksum},
        });
        let kind = if found.count < promised.count {
            DriftKind::Missing
        } else if found.count > promised.count {
            DriftKind::Extra
        } else if found.checksum != promised.checksum {
            DriftKind::Checksum
        } else {
            continue;
        };
        out.push(drift(
            kind,
            stores::RELATIONAL,
            (&head.dataset, &head.source_key),
            head.revision_id,
            evidence,
        ));
    }
    out
}

/// The drift of retained bytes whose hash is not their content hash (`found`: the SHA-256 of
/// the bytes read, `None` when they are gone).
pub fn bytes_drift(head: &SettledHead, found: Option<&str>) -> Option<Drift> {
    if found == Some(head.content_sha256.as_str()) {
        return None;
    }
    Some(drift(
        DriftKind::Checksum,
        stores::BYTES,
        (&head.dataset, &head.source_key),
        head.revision_id,
        serde_json::json!({"expected_sha256": head.content_sha256, "found_sha256": found}),
    ))
}

/// The drift of a sampled chunk whose stored vector is not what the generation's model
/// embeds for its text now (`cosine` between the two, below the model's `agreement`: the
/// least cosine its own embeddings of one text have, [`MODEL_AGREEMENT`] for a model whose
/// vectors do not depend on the batch): a wrong or changed model.
pub fn model_drift(
    head: &SettledHead,
    chunk_index: u32,
    cosine: f32,
    agreement: f32,
) -> Option<Drift> {
    if cosine >= agreement {
        return None;
    }
    Some(drift(
        DriftKind::Checksum,
        stores::VECTOR,
        (&head.dataset, &head.source_key),
        head.revision_id,
        serde_json::json!({
            "sampled_chunk": chunk_index,
            "cosine": cosine,
            "expected_at_least": agreement,
            "reason": "the stored vector is not what the generation's model embeds for this chunk",
        }),
    ))
}

/// Least cosine between a stored vector and the same text embedded again.
pub const MODEL_AGREEMENT: f32 = 0.999;

/// What a second look confirms: drift found in both looks (same kind, store and revision),
/// for a source settled in both, with its head unchanged. The second look's evidence is kept.
pub fn confirmed(
    first: &[Drift],
    first_bucket: &LedgerBucket,
    second: Vec<Drift>,
    second_bucket: &LedgerBucket,
) -> Vec<Drift> {
    let seen: HashSet<(DriftKind, &str, Uuid)> = first.iter().map(Drift::key).collect();
    let heads = |bucket: &LedgerBucket| -> HashMap<(String, String), Uuid> {
        bucket
            .heads
            .iter()
            .map(|h| ((h.dataset.clone(), h.source_key.clone()), h.revision_id))
            .collect()
    };
    let (before, after) = (heads(first_bucket), heads(second_bucket));
    second
        .into_iter()
        .filter(|d| seen.contains(&d.key()))
        .filter(|d| {
            let source = (d.dataset.clone(), d.source_key.clone());
            !first_bucket.unsettled.contains(&source)
                && !second_bucket.unsettled.contains(&source)
                && before.get(&source) == after.get(&source)
        })
        .collect()
}

/// One source of a bucket as the engines read it (one row), before [`assemble`] decides
/// whether it is settled and what it promises.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeadRow {
    pub dataset: String,
    pub source_key: String,
    pub revision_id: Uuid,
    pub tombstone: bool,
    pub content_sha256: Option<String>,
    /// A job for the source is open (pending, running, waiting to retry).
    pub open: bool,
    /// The head's newest completed projection (or tombstone) job in the generation, with its
    /// creation time.
    pub job: Option<(Uuid, i64)>,
    /// That job's vector and relational receipts: state and evidence.
    pub vector: Option<(String, serde_json::Value)>,
    pub relational: Option<(String, serde_json::Value)>,
}

/// The ledger side of a bucket from the engines' rows: `heads` one per source, `chunks` the
/// `(revision, sha256)` of the heads' chunk rows in the generation in chunk order, `known` every
/// revision of the bucket's sources.
pub(crate) fn assemble(
    heads: Vec<HeadRow>,
    chunks: Vec<(Uuid, String)>,
    known: Vec<(Uuid, String, String)>,
) -> LedgerBucket {
    let mut hashes: HashMap<Uuid, Vec<String>> = HashMap::new();
    for (revision, sha256) in chunks {
        hashes.entry(revision).or_default().push(sha256);
    }
    let mut bucket = LedgerBucket {
        known: known
            .into_iter()
            .map(|(revision, dataset, key)| (revision, (dataset, key)))
            .collect(),
        ..LedgerBucket::default()
    };
    for row in heads {
        let source = (row.dataset.clone(), row.source_key.clone());
        fn verified(
            receipt: &Option<(String, serde_json::Value)>,
        ) -> Option<Option<&serde_json::Value>> {
            receipt.as_ref().map(|(state, evidence)| {
                (state == "verified" || state == "excluded").then_some(evidence)
            })
        }
        let (vector, relational) = (verified(&row.vector), verified(&row.relational));
        let settled = !row.open
            && row.job.is_some()
            && !matches!(vector, Some(None))
            && !matches!(relational, Some(None));
        if !settled {
            bucket.unsettled.insert(source);
            continue;
        }
        if row.tombstone {
            // A settled tombstone promises no current point: any is stale (compare_vectors).
            continue;
        }
        let (Some((_, head_at)), Some(content_sha256)) = (row.job, row.content_sha256) else {
            bucket.unsettled.insert(source);
            continue;
        };
        let number = |evidence: &serde_json::Value, key: &str| {
            evidence.get(key).and_then(serde_json::Value::as_i64)
        };
        let points = vector.flatten().map(|evidence| {
            number(evidence, "points")
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0)
        });
        let rows = relational
            .flatten()
            .map(|evidence| crate::model::ChunkPromise {
                count: number(evidence, "rows").unwrap_or(0),
                checksum: evidence
                    .get("checksum")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            });
        let found = hashes.remove(&row.revision_id).unwrap_or_default();
        bucket.heads.push(SettledHead {
            dataset: row.dataset,
            source_key: row.source_key,
            revision_id: row.revision_id,
            head_at,
            content_sha256,
            points,
            rows,
            rows_found: crate::model::ChunkSummary::of(found.iter().map(String::as_str)),
        });
    }
    bucket
}

/// A generation that is not live cannot be verified or repaired.
pub(crate) fn not_live(generation: &str) -> crate::error::LedgerError {
    crate::error::LedgerError::GenerationRefused {
        code: "generation_state",
        message: format!(
            "generation {generation} is not live (only active, building and standby \
             generations are verified and repaired)"
        ),
    }
}

/// A pass moves forward one bucket at a time while it runs; answers its drift counts with
/// the bucket's added.
pub(crate) fn advance(
    pass: &crate::model::VerifyPass,
    bucket: i64,
    drift: &[crate::model::DriftRecord],
) -> Result<std::collections::BTreeMap<String, i64>, crate::error::LedgerError> {
    if pass.state != crate::model::PassState::Running {
        return Err(crate::error::LedgerError::invalid(
            "verify_state",
            format!("verify pass {} is {}, not running", pass.id, pass.state),
        ));
    }
    if bucket != pass.cursor || bucket >= i64::from(BUCKETS) {
        return Err(crate::error::LedgerError::invalid(
            "verify_state",
            format!(
                "verify pass {} is at bucket {}, not {bucket} (another process advanced it)",
                pass.id, pass.cursor
            ),
        ));
    }
    let mut counts = pass.drift.clone();
    for record in drift {
        *counts.entry(record.kind.to_string()).or_default() += 1;
    }
    Ok(counts)
}

/// Only a running pass ends, as completed (every bucket checked) or abandoned.
pub(crate) fn check_finish(
    pass: &crate::model::VerifyPass,
    state: crate::model::PassState,
) -> Result<(), crate::error::LedgerError> {
    if pass.state != crate::model::PassState::Running {
        return Err(crate::error::LedgerError::invalid(
            "verify_state",
            format!("verify pass {} is already {}", pass.id, pass.state),
        ));
    }
    match state {
        crate::model::PassState::Completed if pass.cursor < i64::from(BUCKETS) => {
            Err(crate::error::LedgerError::invalid(
                "verify_state",
                format!(
                    "verify pass {} has checked {} of {BUCKETS} buckets",
                    pass.id, pass.cursor
                ),
            ))
        }
        crate::model::PassState::Running => Err(crate::error::LedgerError::invalid(
            "verify_state",
            "a pass ends as completed or abandoned".to_owned(),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn head(key: &str, revision: u128, points: u32) -> SettledHead {
        SettledHead {
            dataset: "docs".into(),
            source_key: key.into(),
            revision_id: id(revision),
            head_at: 1,
            content_sha256: "c".repeat(64),
            points: Some(points),
            rows: None,
            rows_found: crate::model::ChunkSummary::of([]),
        }
    }

    fn held(key: &str, revision: u128, points: u32, current: u32) -> Held {
        Held {
            revision_id: id(revision),
            dataset: "docs".into(),
            source_key: key.into(),
            points,
            current,
            wrong_dimension: 0,
            bad_norm: 0,
        }
    }

    fn ledger(heads: Vec<SettledHead>, known: &[(u128, &str)]) -> LedgerBucket {
        LedgerBucket {
            heads,
            known: known
                .iter()
                .map(|(revision, key)| (id(*revision), ("docs".to_owned(), (*key).to_owned())))
                .collect(),
            unsettled: HashSet::new(),
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
        let bucket = ledger(
            vec![
                head("same.md", 1, 3),
                head("gone.md", 2, 2),
                head("short.md", 3, 4),
                head("flag.md", 4, 2),
                head("moved.md", 5, 1),
                head("dims.md", 6, 1),
            ],
            &[
                (1, "same.md"),
                (2, "gone.md"),
                (3, "short.md"),
                (4, "flag.md"),
                (5, "moved.md"),
                (6, "dims.md"),
                (10, "same.md"),
                (11, "same.md"),
            ],
        );
        let mut dims = held("dims.md", 6, 1, 1);
        dims.wrong_dimension = 1;
        let store = [
            held("same.md", 1, 3, 3),
            held("short.md", 3, 2, 2),
            held("flag.md", 4, 2, 1),
            held("other.md", 5, 1, 1),
            dims,
            held("same.md", 10, 3, 0),
            held("same.md", 11, 3, 3),
            held("ghost.md", 12, 2, 0),
        ];
        let found: Vec<(DriftKind, String, Uuid)> = compare_vectors(&bucket, &store)
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
        let drift = compare_vectors(&bucket, &store);
        assert_eq!(
            drift[1].evidence,
            serde_json::json!({"expected_points": 4, "found_points": 2})
        );
        let clean = ledger(vec![head("same.md", 1, 3)], &[(1, "same.md")]);
        assert!(compare_vectors(&clean, &store[..1]).is_empty());
        assert_eq!(promised_digest(&clean), held_digest(&clean, &store[..1]));
        assert_ne!(promised_digest(&bucket), held_digest(&bucket, &store));
    }

    #[test]
    fn work_in_flight_is_never_drift() {
        let mut bucket = ledger(vec![head("a.md", 1, 2)], &[(1, "a.md"), (2, "b.md")]);
        bucket.unsettled.insert(("docs".into(), "b.md".into()));
        // b.md's new revision 3 is being projected: its points exist before the ledger's
        // receipt, and its old revision 2 is still current.
        let store = [
            held("a.md", 1, 2, 2),
            held("b.md", 2, 1, 1),
            held("b.md", 3, 1, 1),
        ];
        assert!(compare_vectors(&bucket, &store).is_empty());
    }

    #[test]
    fn chunk_rows_and_bytes_are_checked_against_their_receipts() {
        let mut row_head = head("a.md", 1, 2);
        row_head.rows = Some(crate::model::ChunkPromise {
            count: 2,
            checksum: crate::model::ChunkSummary::of(["x", "y"]).checksum,
        });
        row_head.rows_found = crate::model::ChunkSummary::of(["x", "z"]);
        let mut bucket = ledger(vec![row_head.clone()], &[(1, "a.md")]);
        let found = compare_rows(&bucket);
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].kind, found[0].store.as_str()),
            (DriftKind::Checksum, "relational")
        );
        bucket.heads[0].rows_found = crate::model::ChunkSummary::of(["x"]);
        assert_eq!(compare_rows(&bucket)[0].kind, DriftKind::Missing);
        bucket.heads[0].rows_found = crate::model::ChunkSummary::of(["x", "y"]);
        assert!(compare_rows(&bucket).is_empty());
        assert!(bytes_drift(&row_head, Some(&"c".repeat(64))).is_none());
        assert_eq!(
            bytes_drift(&row_head, None).map(|d| d.kind),
            Some(DriftKind::Checksum)
        );
    }

    #[test]
    fn a_second_look_confirms_only_what_stayed_put() {
        let first_bucket = ledger(
            vec![head("a.md", 1, 2), head("b.md", 2, 1)],
            &[(1, "a.md"), (2, "b.md")],
        );
        let first = compare_vectors(&first_bucket, &[]);
        assert_eq!(first.len(), 2);
        // b.md moved to revision 3 between the looks.
        let second_bucket = ledger(
            vec![head("a.md", 1, 2), head("b.md", 3, 1)],
            &[(1, "a.md"), (2, "b.md"), (3, "b.md")],
        );
        let second = compare_vectors(&second_bucket, &[]);
        let kept = confirmed(&first, &first_bucket, second, &second_bucket);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].source_key, "a.md");
    }
}
