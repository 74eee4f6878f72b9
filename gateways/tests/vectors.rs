//! qdrant-edge as cairn's vector store, on disk in a temporary directory.

use gateways::vectors::point_id;
use gateways::{EdgeVectorStore, VectorPoint, VectorStore};
use uuid::Uuid;

const DIMENSION: usize = 8;

fn unit(seed: u32) -> Vec<f32> {
    let raw: Vec<f32> = (0..DIMENSION as u32)
        .map(|i| ((seed * 31 + i * 17) % 13) as f32 + 0.5)
        .collect();
    let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
    raw.iter().map(|x| x / norm).collect()
}

fn points(dataset: &str, key: &str, revision: Uuid, count: u32, seed: u32) -> Vec<VectorPoint> {
    (0..count)
        .map(|index| VectorPoint {
            dataset: dataset.to_owned(),
            source_key: key.to_owned(),
            revision_id: revision,
            chunk_index: index,
            head_at: i64::from(seed),
            vector: unit(seed + index),
            facts: None,
        })
        .collect()
}

#[tokio::test]
async fn points_are_idempotent_current_only_and_survive_reopen() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("shard");
    let old = Uuid::now_v7();
    let new = Uuid::now_v7();
    let other = Uuid::now_v7();
    {
        let store = EdgeVectorStore::open(&path, DIMENSION).expect("open");
        store
            .upsert(points("docs", "a", old, 3, 1))
            .await
            .expect("upsert");
        store
            .upsert(points("docs", "a", old, 3, 1))
            .await
            .expect("upsert again");
        store
            .upsert(points("docs", "a", new, 2, 7))
            .await
            .expect("upsert new");
        store
            .upsert(points("notes", "b", other, 1, 3))
            .await
            .expect("upsert other");
        assert_eq!(
            store.total_points().await.expect("count"),
            6,
            "no duplicates"
        );
        store
            .set_current("docs", "a", Some(new), 7)
            .await
            .expect("set current");
        // A late write of the older head (head since 1) cannot retire the newer one.
        store
            .set_current("docs", "a", Some(old), 1)
            .await
            .expect("late older write");
        assert_eq!(store.revision_points(new).await.expect("read").current, 2);
        store
            .retire_revision(old)
            .await
            .expect("the stale run retires itself");
        let old_points = store.revision_points(old).await.expect("read back");
        assert_eq!(
            (
                old_points.count,
                old_points.with_dimension,
                old_points.current
            ),
            (3, 3, 0)
        );
        let new_points = store.revision_points(new).await.expect("read back");
        assert_eq!(
            (
                new_points.count,
                new_points.with_dimension,
                new_points.current
            ),
            (2, 2, 2)
        );
        // The exact vector of an old chunk finds only current points of the dataset.
        let hits = store
            .search(unit(1), &["docs".to_owned()], None, 10)
            .await
            .expect("search");
        assert!(!hits.is_empty());
        assert!(hits
            .iter()
            .all(|hit| hit.revision_id == new && hit.dataset == "docs"));
        let hits = store
            .search(unit(3), &["notes".to_owned()], None, 10)
            .await
            .expect("search");
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].revision_id, other);
        assert!(
            (hits[0].score - 1.0).abs() < 1e-4,
            "score {}",
            hits[0].score
        );
        // A tombstone retires the whole source.
        store
            .set_current("docs", "a", None, 9)
            .await
            .expect("tombstone");
        assert!(store
            .search(unit(7), &["docs".to_owned()], None, 10)
            .await
            .expect("search")
            .is_empty());
    }
    let store = EdgeVectorStore::open(&path, DIMENSION).expect("reopen");
    let second = EdgeVectorStore::open(&path, DIMENSION).expect_err("one owner at a time");
    assert!(
        second.to_string().contains("another cairn process"),
        "{second}"
    );
    assert_eq!(store.total_points().await.expect("count"), 6);
    assert_eq!(store.revision_points(other).await.expect("read").current, 1);
    assert_eq!(store.revision_points(new).await.expect("read").current, 0);
    assert_ne!(point_id(new, 0), point_id(new, 1));
    assert!(
        EdgeVectorStore::open(&path, DIMENSION + 1).is_err(),
        "dimension is checked"
    );
}

/// Deterministic pseudo-random unit vectors of the model's size.
fn random_unit(seed: u64, dimension: usize) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let raw: Vec<f32> = (0..dimension)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        })
        .collect();
    let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
    raw.iter().map(|x| x / norm).collect()
}

fn random_points(first: u64, count: u64) -> Vec<VectorPoint> {
    (first..first + count)
        .map(|n| VectorPoint {
            dataset: "bulk".to_owned(),
            source_key: format!("s{n}"),
            revision_id: Uuid::from_u128(u128::from(n) + 1),
            chunk_index: 0,
            head_at: 1,
            vector: random_unit(n, 384),
            facts: None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn index_building_runs_alongside_writes_flushes_and_searches() {
    // Enough points for qdrant-edge to build an HNSW index (its threshold is about 6,500
    // vectors of 384 dimensions), then writes (each flushed) and searches while it builds.
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("shard");
    let store = EdgeVectorStore::open(&path, 384).expect("open");
    for batch in 0..80 {
        store
            .upsert(random_points(batch * 100, 100))
            .await
            .expect("upsert");
    }
    let optimizing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let optimizer = {
        let store = store.clone();
        let optimizing = optimizing.clone();
        tokio::spawn(async move {
            let outcome = store.optimize_now().await;
            optimizing.store(false, std::sync::atomic::Ordering::SeqCst);
            outcome
        })
    };
    let mut writes_during = 0;
    let mut searches_during = 0;
    let mut batch = 80;
    while optimizing.load(std::sync::atomic::Ordering::SeqCst) && batch < 110 {
        store
            .upsert(random_points(batch * 100, 100))
            .await
            .expect("a write while the index builds");
        store
            .set_current("bulk", &format!("s{}", batch * 100), None, 2)
            .await
            .expect("a payload update while the index builds");
        let hits = store
            .search(random_unit(batch, 384), &["bulk".to_owned()], None, 5)
            .await
            .expect("a search while the index builds");
        assert_eq!(hits.len(), 5);
        batch += 1;
        if optimizing.load(std::sync::atomic::Ordering::SeqCst) {
            writes_during += 1;
            searches_during += 1;
        }
    }
    let waited = std::time::Instant::now();
    let changed = optimizer.await.expect("join").expect("optimise");
    eprintln!(
        "{writes_during} writes during the build; waited {:?} after them",
        waited.elapsed()
    );
    assert!(changed, "the optimiser built nothing for 8,000+ points");
    assert!(
        writes_during > 0 && searches_during > 0,
        "nothing overlapped the index build"
    );
    let total = batch as usize * 100;
    assert_eq!(store.total_points().await.expect("count"), total);
    // A point written during the build is found by its own vector after it.
    let probe = (batch - 1) * 100 + 7;
    let hits = store
        .search(random_unit(probe, 384), &["bulk".to_owned()], None, 1)
        .await
        .expect("search");
    assert_eq!(hits[0].revision_id, Uuid::from_u128(u128::from(probe) + 1));
    drop(store);
    let reopened = EdgeVectorStore::open(&path, 384).expect("reopen");
    assert_eq!(reopened.total_points().await.expect("count"), total);
}

#[test]
fn the_optimiser_waits_for_quiet_or_for_a_pile_of_points() {
    use gateways::OptimizePolicy;
    use std::time::Duration;
    let policy = OptimizePolicy {
        min_new_points: 100,
        quiet: Duration::from_secs(10),
        max_new_points: 1_000,
        check_every: Duration::from_secs(1),
    };
    assert!(!policy.due(0, Duration::from_secs(3600)));
    assert!(!policy.due(99, Duration::from_secs(3600)));
    assert!(!policy.due(500, Duration::from_secs(9)));
    assert!(policy.due(500, Duration::from_secs(10)));
    assert!(policy.due(1_000, Duration::ZERO));
}
