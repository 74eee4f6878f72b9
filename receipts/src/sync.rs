//! Keeping a dataset equal to another copy of it (a folder, a repository): the difference
//! between what the copy holds now and what the ledger holds, computed once for every client
//! of it (`cairn ingest DIR --prune`, and the connectors' runs).
//!
//! ## Model
//! Both sides are sets of `(source key, SHA-256 of the bytes)`. A ledger head that is a
//! tombstone counts as absent. A key is *added* when only the copy has it, *changed* when both
//! have it with different bytes, *unchanged* when the bytes match, and *removed* when only the
//! ledger has it (a live head). Nothing else is compared: a media type or a tag that changed
//! alone is not a change of content.
//!
//! ## Invariants
//! - Every key of either side lands in exactly one list (tombstoned heads the copy lacks in
//!   none: they are already gone); each list is sorted by key, byte order.
//! - Applying the difference (submit added and changed, tombstone removed) makes the ledger's
//!   live heads equal to the copy; applying it twice changes nothing more.

use std::collections::BTreeMap;

use crate::model::SourceListing;

/// What differs between a copy and the ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Difference {
    /// Keys only the copy has (or whose ledger head is a tombstone).
    pub added: Vec<String>,
    /// Keys whose bytes differ.
    pub changed: Vec<String>,
    /// Keys whose bytes match.
    pub unchanged: Vec<String>,
    /// Keys with a live head in the ledger that the copy no longer has.
    pub removed: Vec<String>,
}

impl Difference {
    /// Whether the copy and the ledger already agree.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

/// The difference between `copy` (key and SHA-256 of each item the copy holds) and `heads`
/// (the ledger's listing of the same keys).
pub fn difference<'a>(
    copy: impl IntoIterator<Item = (&'a str, &'a str)>,
    heads: impl IntoIterator<Item = &'a SourceListing>,
) -> Difference {
    let live: BTreeMap<&str, &str> = heads
        .into_iter()
        .filter_map(|head| {
            head.content_sha256
                .as_deref()
                .filter(|_| !head.tombstone)
                .map(|sha256| (head.source_key.as_str(), sha256))
        })
        .collect();
    let copy: BTreeMap<&str, &str> = copy.into_iter().collect();
    let mut difference = Difference::default();
    for (key, sha256) in &copy {
        match live.get(key) {
            None => difference.added.push((*key).to_owned()),
            Some(head) if head.eq_ignore_ascii_case(sha256) => {
                difference.unchanged.push((*key).to_owned())
            }
            Some(_) => difference.changed.push((*key).to_owned()),
        }
    }
    difference.removed = live
        .keys()
        .filter(|key| !copy.contains_key(*key))
        .map(|key| (*key).to_owned())
        .collect();
    difference
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(key: &str, sha256: Option<&str>) -> SourceListing {
        SourceListing {
            source_key: key.to_owned(),
            head_revision_id: uuid::Uuid::nil(),
            content_sha256: sha256.map(str::to_owned),
            byte_length: 1,
            tombstone: sha256.is_none(),
            accepted_at: 0,
            owner: None,
        }
    }

    #[test]
    fn every_key_lands_in_one_list() {
        let heads = [
            head("same", Some("aa")),
            head("edited", Some("bb")),
            head("gone", Some("cc")),
            head("deleted-before", None),
            head("back-again", None),
        ];
        let copy = [
            ("same", "AA"),
            ("edited", "b2"),
            ("new", "dd"),
            ("back-again", "ee"),
        ];
        assert_eq!(
            difference(copy, &heads),
            Difference {
                added: vec!["back-again".into(), "new".into()],
                changed: vec!["edited".into()],
                unchanged: vec!["same".into()],
                removed: vec!["gone".into()],
            }
        );
    }

    #[test]
    fn equal_sides_differ_in_nothing() {
        let heads = [head("a", Some("11"))];
        let difference = difference([("a", "11")], &heads);
        assert!(difference.is_empty());
        assert_eq!(difference.unchanged, vec!["a".to_owned()]);
        assert!(super::difference([], []).is_empty());
    }
}
