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
            .search(unit(1), &["docs".to_owned()], 10)
            .await
            .expect("search");
        assert!(!hits.is_empty());
        assert!(hits
            .iter()
            .all(|hit| hit.revision_id == new && hit.dataset == "docs"));
        let hits = store
            .search(unit(3), &["notes".to_owned()], 10)
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
            .search(unit(7), &["docs".to_owned()], 10)
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
