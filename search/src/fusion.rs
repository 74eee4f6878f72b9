//! Reciprocal rank fusion: the one place its constants live.
//!
//! Each phase (vector, lexical) returns a ranked list. Fusion scores an item by
//! `sum over phases of 1 / (RRF_K + rank)` (rank from 1), over the first [`CANDIDATE_WINDOW`]
//! items of each phase. Ranks, not raw scores, are fused: cosine similarity and BM25 live on
//! scales that cannot be compared.

use std::collections::HashMap;
use std::hash::Hash;

/// The `k` of reciprocal rank fusion (Cormack et al. 2009 use 60; so does the reference run
/// the issue compares against). Larger `k` flattens the head of each list.
pub const RRF_K: f64 = 60.0;

/// Candidates taken from each phase before fusion (and the most a phase is asked for).
pub const CANDIDATE_WINDOW: usize = 100;

/// One phase's contribution to a fused item.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PhaseRank {
    /// Which phase (index into the lists given to [`fuse`]).
    pub phase: usize,
    /// 1-based rank in that phase.
    pub rank: usize,
}

/// A fused item: its key, its RRF score and where each phase ranked it.
#[derive(Debug, Clone, PartialEq)]
pub struct Fused<K> {
    /// The item.
    pub key: K,
    /// Sum of `1 / (RRF_K + rank)` over the phases that found it.
    pub score: f64,
    /// The phases that found it, in phase order.
    pub ranks: Vec<PhaseRank>,
}

/// Fuses ranked lists of keys (best first; a key repeated within a list counts at its best
/// rank). Ties keep the order of first appearance, phase by phase.
pub fn fuse<K: Clone + Eq + Hash>(lists: &[Vec<K>]) -> Vec<Fused<K>> {
    let mut order: Vec<K> = Vec::new();
    let mut fused: HashMap<K, Fused<K>> = HashMap::new();
    for (phase, list) in lists.iter().enumerate() {
        for (position, key) in list.iter().take(CANDIDATE_WINDOW).enumerate() {
            let entry = fused.entry(key.clone()).or_insert_with(|| {
                order.push(key.clone());
                Fused {
                    key: key.clone(),
                    score: 0.0,
                    ranks: Vec::new(),
                }
            });
            if entry.ranks.iter().any(|rank| rank.phase == phase) {
                continue;
            }
            let rank = position + 1;
            entry.score += 1.0 / (RRF_K + rank as f64);
            entry.ranks.push(PhaseRank { phase, rank });
        }
    }
    let mut items: Vec<Fused<K>> = order
        .into_iter()
        .filter_map(|key| fused.remove(&key))
        .collect();
    // Stable: equal scores keep first-appearance order.
    items.sort_by(|a, b| b.score.total_cmp(&a.score));
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_found_by_both_phases_rise() {
        let fused = fuse(&[vec!["a", "b", "c"], vec!["c", "d", "a"]]);
        let keys: Vec<_> = fused.iter().map(|item| item.key).collect();
        // a: 1/61 + 1/63, c: 1/63 + 1/61 (tie, a first), b: 1/62, d: 1/62.
        assert_eq!(keys, ["a", "c", "b", "d"]);
        assert!((fused[0].score - (1.0 / 61.0 + 1.0 / 63.0)).abs() < 1e-12);
        assert_eq!(
            fused[1].ranks,
            [
                PhaseRank { phase: 0, rank: 3 },
                PhaseRank { phase: 1, rank: 1 }
            ]
        );
    }

    #[test]
    fn a_repeated_key_counts_once_per_phase_and_the_window_is_respected() {
        let long: Vec<usize> = (0..CANDIDATE_WINDOW + 50).collect();
        let fused = fuse(&[vec![7, 7, 8], long]);
        let seven = fused.iter().find(|item| item.key == 7).expect("seven");
        assert_eq!(seven.ranks.len(), 2);
        assert_eq!(seven.ranks[0].rank, 1);
        assert_eq!(fused.len(), CANDIDATE_WINDOW);
        assert!(fused.iter().all(|item| item.key < CANDIDATE_WINDOW));
    }
}
