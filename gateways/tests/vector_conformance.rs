//! One conformance suite for the [`VectorStore`] trait, run against both implementations:
//! qdrant-edge in a temporary directory, a real Qdrant server (v1.18.3, started per test on
//! free loopback ports) through `qdrant-client`, and a real three-node Qdrant cluster (6
//! shards, replication factor 3, write consistency factor 2). Same calls, same expectations.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use gateways::vectors::{point_id, INDEXED_FIELDS};
use gateways::{
    CurrentChange, EdgeVectorStore, GatewayError, ServerOptions, ServerVectorStore, VectorPoint,
    VectorStore,
};
use testkit::qdrant::{QdrantCluster, QdrantServer};
use uuid::Uuid;

const DIMENSION: usize = 8;

/// Opens a generation's store on one backend.
#[async_trait]
trait Backend: Send + Sync {
    async fn open(&self, generation: &str) -> Arc<dyn VectorStore>;
    /// Whether its collections are replicated (a three-node cluster).
    fn replicated(&self) -> bool {
        false
    }
}

struct Edge(tempfile::TempDir);

#[async_trait]
impl Backend for Edge {
    async fn open(&self, generation: &str) -> Arc<dyn VectorStore> {
        Arc::new(EdgeVectorStore::open(&self.0.path().join(generation), DIMENSION).expect("open"))
    }
}

fn edge() -> Edge {
    Edge(tempfile::tempdir().expect("tempdir"))
}

struct Server(QdrantServer);

#[async_trait]
impl Backend for Server {
    async fn open(&self, generation: &str) -> Arc<dyn VectorStore> {
        Arc::new(
            ServerVectorStore::open(
                &ServerOptions::new(&self.0.grpc_url()),
                generation,
                DIMENSION,
            )
            .await
            .expect("open"),
        )
    }
}

fn server() -> Server {
    Server(QdrantServer::start().expect("start qdrant"))
}

/// A three-node cluster; each check gets its own collection prefix, so one cluster serves
/// the whole suite.
struct Cluster {
    nodes: Arc<QdrantCluster>,
    prefix: String,
}

#[async_trait]
impl Backend for Cluster {
    fn replicated(&self) -> bool {
        true
    }

    async fn open(&self, generation: &str) -> Arc<dyn VectorStore> {
        let urls = self.nodes.grpc_urls();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let mut options = ServerOptions::cluster(&urls);
        options.layout = gateways::CollectionLayout {
            shards: Some(6),
            replication_factor: Some(3),
            write_consistency: Some(2),
        };
        options.collection_prefix = self.prefix.clone();
        Arc::new(
            ServerVectorStore::open(&options, generation, DIMENSION)
                .await
                .expect("open"),
        )
    }
}

fn unit(seed: u32) -> Vec<f32> {
    let raw: Vec<f32> = (0..DIMENSION as u32)
        .map(|i| ((seed * 31 + i * 17) % 13) as f32 + 0.5)
        .collect();
    let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
    raw.iter().map(|x| x / norm).collect()
}

fn points(dataset: &str, key: &str, revision: Uuid, count: u32, head_at: i64) -> Vec<VectorPoint> {
    (0..count)
        .map(|index| VectorPoint {
            dataset: dataset.to_owned(),
            source_key: key.to_owned(),
            revision_id: revision,
            chunk_index: index,
            head_at,
            vector: unit(u32::try_from(head_at).expect("small") * 7 + index),
            facts: None,
        })
        .collect()
}

/// Writes a revision's points and makes it the source's current one, as projection does.
async fn project(
    store: &dyn VectorStore,
    dataset: &str,
    key: &str,
    revision: Uuid,
    count: u32,
    head_at: i64,
) {
    store
        .upsert(points(dataset, key, revision, count, head_at))
        .await
        .expect("upsert");
    store
        .set_current(dataset, key, Some(revision), head_at)
        .await
        .expect("set current");
}

mod checks {
    use super::*;

    /// A unit's calls: `set_current_many` flips several sources in one write exactly as
    /// `set_current` flips each, `revisions_points` reads several revisions back in order, and
    /// `vectors` answers an id asked twice twice.
    pub(super) async fn a_units_calls_match_the_single_ones(backend: &dyn Backend) {
        let store = backend.open("g-unit").await;
        let (a1, a2, b1, c1) = (
            Uuid::now_v7(),
            Uuid::now_v7(),
            Uuid::now_v7(),
            Uuid::now_v7(),
        );
        project(store.as_ref(), "docs", "a", a1, 2, 1).await;
        let mut written = points("docs", "a", a2, 3, 2);
        written.extend(points("docs", "b", b1, 1, 3));
        written.extend(points("misc", "c", c1, 2, 4));
        store.upsert_visible(written).await.expect("one upsert");
        let change = |dataset: &str, key: &str, keep: Uuid, head_at: i64| CurrentChange {
            dataset: dataset.to_owned(),
            source_key: key.to_owned(),
            keep,
            head_at,
        };
        store
            .set_current_many(&[
                change("docs", "a", a2, 2),
                change("docs", "b", b1, 3),
                change("misc", "c", c1, 4),
            ])
            .await
            .expect("set current many");
        let held = store
            .revisions_points(&[c1, a1, Uuid::now_v7(), a2, b1])
            .await
            .expect("read back");
        let summary: Vec<(usize, usize, usize)> = held
            .iter()
            .map(|points| (points.count, points.with_dimension, points.current))
            .collect();
        assert_eq!(
            summary,
            [(2, 2, 2), (2, 2, 0), (0, 0, 0), (3, 3, 3), (1, 1, 1)],
            "each revision in the asked order; the older revision of a retired"
        );
        assert_eq!(store.source_current("docs", "a").await.expect("a"), 3);
        let id = gateways::vectors::point_id(b1, 0);
        let twice = store.vectors(&[id, id]).await.expect("vectors");
        assert_eq!(twice.len(), 2);
        assert!(twice[0].is_some() && twice[0] == twice[1], "{twice:?}");
    }

    pub(super) async fn erasure_deletes_a_source_or_a_revision(backend: &dyn Backend) {
        let store = backend.open("g-erase").await;
        let (old, new, other) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        project(store.as_ref(), "docs", "a", old, 2, 1).await;
        project(store.as_ref(), "docs", "a", new, 3, 2).await;
        project(store.as_ref(), "docs", "b", other, 2, 3).await;
        // The same key in another dataset is another source.
        project(store.as_ref(), "misc", "a", Uuid::now_v7(), 1, 4).await;
        let source = |dataset: &str, key: &str| gateways::PointSelector::Source {
            dataset: dataset.to_owned(),
            source_key: key.to_owned(),
            head_before: 10,
        };
        let count = |selector| {
            let store = store.clone();
            async move { store.count_points(selector).await.expect("count") }
        };
        assert_eq!(count(source("docs", "a")).await, 5, "current or not");
        // Search finds current points only; `search_any` the superseded revision's too (the
        // candidates of a search at a past time), in the datasets asked.
        let docs = ["docs".to_owned()];
        let current = store
            .search(unit(7), &docs, None, 20)
            .await
            .expect("search");
        assert!(
            current.iter().all(|hit| hit.revision_id != old),
            "{current:?}"
        );
        let any = store
            .search_any(unit(7), &docs, None, 20)
            .await
            .expect("search_any");
        assert!(any.iter().any(|hit| hit.revision_id == old), "{any:?}");
        assert!(any.iter().any(|hit| hit.revision_id == new), "{any:?}");
        assert!(any.iter().all(|hit| hit.dataset == "docs"), "{any:?}");
        // A revision that became head after the erasure is spared.
        let later = Uuid::now_v7();
        project(store.as_ref(), "docs", "a", later, 1, 11).await;
        store
            .delete_points(source("docs", "a"))
            .await
            .expect("delete");
        assert_eq!(count(source("docs", "a")).await, 0);
        assert_eq!(store.revision_points(later).await.expect("later").count, 1);
        assert_eq!(store.revision_points(old).await.expect("old").count, 0);
        assert_eq!(store.revision_points(new).await.expect("new").count, 0);
        assert_eq!(count(source("docs", "b")).await, 2);
        assert_eq!(count(source("misc", "a")).await, 1);
        store
            .delete_points(gateways::PointSelector::Revision(other))
            .await
            .expect("delete revision");
        assert_eq!(count(gateways::PointSelector::Revision(other)).await, 0);
        assert_eq!(count(source("misc", "a")).await, 1);
        let hits = store
            .search(unit(7), &["docs".to_owned()], None, 10)
            .await
            .expect("search");
        assert!(hits.iter().all(|hit| hit.revision_id == later), "{hits:?}");
    }

    pub(super) async fn upsert_reads_back_by_count_dimension_and_ids(backend: &dyn Backend) {
        let store = backend.open("g-one").await;
        assert_eq!(store.dimension(), DIMENSION);
        let revision = Uuid::now_v7();
        store
            .upsert(points("docs", "a", revision, 3, 1))
            .await
            .expect("upsert");
        let stored = store.revision_points(revision).await.expect("read back");
        assert_eq!(
            (stored.count, stored.with_dimension, stored.current),
            (3, 3, 3)
        );
        let unknown = store
            .revision_points(Uuid::now_v7())
            .await
            .expect("read back");
        assert_eq!((unknown.count, unknown.with_dimension), (0, 0));
        // The ids are the derived ones: searching with a point's own vector finds that chunk.
        let hits = store
            .search(unit(7 + 2), &["docs".to_owned()], None, 1)
            .await
            .expect("search");
        assert_eq!(hits.len(), 1);
        assert_eq!((hits[0].revision_id, hits[0].chunk_index), (revision, 2));
        assert_ne!(point_id(revision, 1), point_id(revision, 2));
    }

    pub(super) async fn a_wrong_dimension_is_refused_and_writes_nothing(backend: &dyn Backend) {
        let store = backend.open("g-one").await;
        let revision = Uuid::now_v7();
        let mut bad = points("docs", "a", revision, 2, 1);
        bad[1].vector.push(0.5);
        let error = store.upsert(bad).await.expect_err("refused");
        assert!(matches!(error, GatewayError::Config(_)), "{error:?}");
        assert_eq!(
            store.revision_points(revision).await.expect("read").count,
            0
        );
    }

    pub(super) async fn reprojection_is_idempotent(backend: &dyn Backend) {
        let store = backend.open("g-one").await;
        let revision = Uuid::now_v7();
        project(store.as_ref(), "docs", "a", revision, 4, 5).await;
        project(store.as_ref(), "docs", "a", revision, 4, 5).await;
        let stored = store.revision_points(revision).await.expect("read back");
        assert_eq!(
            (stored.count, stored.with_dimension, stored.current),
            (4, 4, 4)
        );
        assert_eq!(store.source_current("docs", "a").await.expect("count"), 4);
    }

    pub(super) async fn reconcile_sees_what_a_crashed_run_left(backend: &dyn Backend) {
        // A run that wrote its points and died before its receipt: the next run's read-back
        // finds them complete (projection then records `reconciled: true` and writes nothing).
        let revision = Uuid::now_v7();
        {
            let store = backend.open("g-one").await;
            store
                .upsert(points("docs", "a", revision, 3, 9))
                .await
                .expect("upsert");
        }
        let store = backend.open("g-one").await;
        let stored = store.revision_points(revision).await.expect("read back");
        assert_eq!((stored.count, stored.with_dimension), (3, 3));
        // A partial write (fewer points than chunks) does not pass as complete.
        let partial = Uuid::now_v7();
        store
            .upsert(points("docs", "b", partial, 2, 9))
            .await
            .expect("upsert");
        assert_eq!(store.revision_points(partial).await.expect("read").count, 2);
    }

    pub(super) async fn current_flips_are_ordered_by_head_time(backend: &dyn Backend) {
        let store = backend.open("g-one").await;
        let (old, new) = (Uuid::now_v7(), Uuid::now_v7());
        project(store.as_ref(), "docs", "a", old, 3, 100).await;
        project(store.as_ref(), "docs", "a", new, 2, 200).await;
        assert_eq!(store.revision_points(old).await.expect("read").current, 0);
        assert_eq!(store.revision_points(new).await.expect("read").current, 2);
        // A late write of the older head (a slow run) never retires the newer one.
        project(store.as_ref(), "docs", "a", old, 3, 100).await;
        assert_eq!(store.revision_points(new).await.expect("read").current, 2);
        // Other sources are never touched.
        let other = Uuid::now_v7();
        project(store.as_ref(), "docs", "b", other, 1, 50).await;
        project(store.as_ref(), "docs", "a", new, 2, 200).await;
        assert_eq!(store.revision_points(other).await.expect("read").current, 1);
        assert_eq!(store.revision_points(old).await.expect("read").current, 0);
    }

    pub(super) async fn retire_and_exclude(backend: &dyn Backend) {
        let store = backend.open("g-one").await;
        let (first, second) = (Uuid::now_v7(), Uuid::now_v7());
        project(store.as_ref(), "docs", "a", first, 2, 10).await;
        project(store.as_ref(), "docs", "b", second, 2, 11).await;
        // A stale run retiring its own revision.
        store.retire_revision(first).await.expect("retire");
        assert_eq!(store.revision_points(first).await.expect("read").current, 0);
        assert_eq!(store.revision_points(first).await.expect("read").count, 2);
        // A tombstone: nothing of the source stays current, and search never returns it.
        store
            .set_current("docs", "b", None, 12)
            .await
            .expect("exclude");
        assert_eq!(store.source_current("docs", "b").await.expect("count"), 0);
        // A tombstone older than the head it meets leaves that head alone.
        let third = Uuid::now_v7();
        project(store.as_ref(), "docs", "c", third, 1, 30).await;
        store
            .set_current("docs", "c", None, 20)
            .await
            .expect("old tombstone");
        assert_eq!(store.source_current("docs", "c").await.expect("count"), 1);
        let hits = store
            .search(unit(11 * 7), &["docs".to_owned()], None, 10)
            .await
            .expect("search");
        assert!(
            hits.iter()
                .all(|hit| hit.revision_id != first && hit.revision_id != second),
            "{hits:?}"
        );
    }

    pub(super) async fn search_filters_by_dataset_and_current(backend: &dyn Backend) {
        let store = backend.open("g-one").await;
        let (docs, notes, old) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        project(store.as_ref(), "docs", "a", old, 2, 1).await;
        project(store.as_ref(), "docs", "a", docs, 2, 2).await;
        project(store.as_ref(), "notes", "b", notes, 2, 3).await;
        let only_docs = store
            .search(unit(3 * 7), &["docs".to_owned()], None, 10)
            .await
            .expect("search");
        assert!(!only_docs.is_empty());
        assert!(
            only_docs
                .iter()
                .all(|hit| hit.dataset == "docs" && hit.revision_id == docs),
            "{only_docs:?}"
        );
        let both = store
            .search(
                unit(3 * 7),
                &["docs".to_owned(), "notes".to_owned()],
                None,
                10,
            )
            .await
            .expect("search");
        let everywhere = store
            .search(unit(3 * 7), &[], None, 10)
            .await
            .expect("search");
        for hits in [&both, &everywhere] {
            assert_eq!(hits.len(), 4, "{hits:?}");
            assert!(hits.iter().all(|hit| hit.revision_id != old));
            assert!(hits.windows(2).all(|pair| pair[0].score >= pair[1].score));
        }
        assert_eq!(everywhere[0].revision_id, notes, "the best match first");
        let none = store
            .search(unit(1), &["elsewhere".to_owned()], None, 10)
            .await
            .expect("search");
        assert!(none.is_empty());
    }

    /// A search narrowed to a few revisions finds every point of them (and only them), in
    /// score order, whatever else the store holds; current only unless any revision is asked.
    pub(super) async fn search_within_finds_every_point_of_its_revisions(backend: &dyn Backend) {
        let store = backend.open("g-one").await;
        let mut revisions = Vec::new();
        for source in 0..120 {
            let revision = Uuid::now_v7();
            project(
                store.as_ref(),
                "docs",
                &format!("s{source}"),
                revision,
                2,
                1,
            )
            .await;
            revisions.push(revision);
        }
        let old = revisions[7];
        let newer = Uuid::now_v7();
        project(store.as_ref(), "docs", "s7", newer, 2, 2).await;
        let narrow = [revisions[3], old, newer, revisions[90]];
        let hits = store
            .search_within(unit(5), &["docs".to_owned()], &narrow, false, 20)
            .await
            .expect("narrowed search");
        let mut found: Vec<(Uuid, u32)> = hits
            .iter()
            .map(|hit| (hit.revision_id, hit.chunk_index))
            .collect();
        found.sort_unstable();
        let mut expected: Vec<(Uuid, u32)> = [revisions[3], newer, revisions[90]]
            .iter()
            .flat_map(|revision| [(*revision, 0), (*revision, 1)])
            .collect();
        expected.sort_unstable();
        assert_eq!(
            found, expected,
            "every current point of the narrowed revisions"
        );
        assert!(hits.windows(2).all(|pair| pair[0].score >= pair[1].score));
        let any = store
            .search_within(unit(5), &["docs".to_owned()], &narrow, true, 20)
            .await
            .expect("narrowed search of any revision");
        assert_eq!(
            any.len(),
            8,
            "the superseded revision's points too: {any:?}"
        );
        let elsewhere = store
            .search_within(unit(5), &["notes".to_owned()], &narrow, false, 20)
            .await
            .expect("narrowed search");
        assert!(elsewhere.is_empty());
        let limited = store
            .search_within(unit(5), &[], &narrow, false, 2)
            .await
            .expect("narrowed search");
        assert_eq!(limited.len(), 2);
        assert_eq!(
            (limited[0].revision_id, limited[0].chunk_index),
            (hits[0].revision_id, hits[0].chunk_index),
            "the best point first"
        );
    }

    pub(super) async fn one_collection_per_generation(backend: &dyn Backend) {
        let first = backend.open("g-one").await;
        let second = backend.open("g-two").await;
        assert_ne!(first.location(), second.location());
        let revision = Uuid::now_v7();
        project(first.as_ref(), "docs", "a", revision, 3, 1).await;
        assert_eq!(
            second.revision_points(revision).await.expect("read").count,
            0
        );
        assert!(second
            .search(unit(7), &[], None, 10)
            .await
            .expect("search")
            .is_empty());
        project(second.as_ref(), "docs", "a", revision, 3, 1).await;
        second.retire_revision(revision).await.expect("retire");
        assert_eq!(
            first.revision_points(revision).await.expect("read").current,
            3,
            "a write to one generation never touches another"
        );
    }

    pub(super) async fn vectors_are_read_back_by_point_id(backend: &dyn Backend) {
        let store = backend.open("g-one").await;
        let revision = Uuid::now_v7();
        let written = points("docs", "a", revision, 2, 4);
        store.upsert(written.clone()).await.expect("upsert");
        let ids = [
            point_id(revision, 1),
            point_id(Uuid::now_v7(), 0),
            point_id(revision, 0),
        ];
        let found = store.vectors(&ids).await.expect("vectors");
        assert_eq!(found.len(), 3);
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5);
        assert!(close(
            found[0].as_deref().expect("chunk 1"),
            &written[1].vector
        ));
        assert!(found[1].is_none(), "a missing point is None");
        assert!(close(
            found[2].as_deref().expect("chunk 0"),
            &written[0].vector
        ));
        assert!(store.vectors(&[]).await.expect("none").is_empty());
    }

    pub(super) async fn payload_indexes_exist_before_any_point(backend: &dyn Backend) {
        let store = backend.open("g-one").await;
        let indexed = store.indexed_fields().await.expect("indexes");
        for (field, _) in INDEXED_FIELDS {
            assert!(
                indexed.iter().any(|name| name == field),
                "{field} in {indexed:?}"
            );
        }
        for required in ["dataset", "is_current", "revision_id", "bucket"] {
            assert!(indexed.iter().any(|name| name == required));
        }
    }

    /// A search filter pushed down to the payload selects at least every point whose
    /// revision matches (exactly the matching ones when every condition is decidable), and
    /// always the points written without facts; declared metadata fields gain an index.
    pub(super) async fn pushed_filters_select_what_matches(backend: &dyn Backend) {
        use gateways::vectors::pushdown;
        use gateways::PointFacts;
        use receipts::filter::{Filter, FilterLimits};

        let store = backend.open("g-push").await;
        let facts = [
            (
                "guides/intro.md",
                vec!["rust", "async"],
                "text/markdown",
                serde_json::json!({"year": 2021, "author": "ann", "draft": false,
                                   "labels": ["x", "y"]}),
                1_000,
                vec!["user:ann"],
            ),
            (
                "guides/deep/ref.md",
                vec!["rust"],
                "text/html",
                serde_json::json!({"year": 2019.5, "author": "bob", "labels": "z"}),
                2_000,
                vec![],
            ),
            (
                "top.md",
                vec![],
                "text/plain",
                serde_json::json!({}),
                3_000,
                vec!["group:eng"],
            ),
        ];
        let mut written = Vec::new();
        for (n, (key, tags, media, metadata, accepted, readers)) in facts.iter().enumerate() {
            let revision = Uuid::now_v7();
            let head_at = i64::try_from(n).expect("small") + 1;
            let mut point = points("docs", key, revision, 1, head_at);
            point[0].facts = Some(Arc::new(PointFacts {
                tags: tags.iter().map(|tag| (*tag).to_owned()).collect(),
                media_type: (*media).to_owned(),
                metadata: metadata.clone(),
                accepted_at: *accepted,
                readers: readers.iter().map(|reader| (*reader).to_owned()).collect(),
            }));
            store.upsert(point).await.expect("upsert");
            store
                .set_current("docs", key, Some(revision), head_at)
                .await
                .expect("current");
            written.push(revision);
        }
        // A point written before payloads carried facts.
        let legacy = Uuid::now_v7();
        project(store.as_ref(), "docs", "legacy.md", legacy, 1, 9).await;

        let cases = [
            (serde_json::json!({"field": "tags", "any": ["async"]}), true),
            (
                serde_json::json!({"field": "tags", "all": ["rust", "async"]}),
                true,
            ),
            (
                serde_json::json!({"field": "tags", "none": ["async"]}),
                true,
            ),
            (
                serde_json::json!({"field": "media_type", "in": ["text/html", "text/plain"]}),
                true,
            ),
            (
                serde_json::json!({"field": "source_key", "prefix": "guides/"}),
                true,
            ),
            (
                serde_json::json!({"field": "source_key", "prefix": "guides/de"}),
                false,
            ),
            (
                serde_json::json!({"field": "source_key", "glob": "guides/*/ref.md"}),
                false,
            ),
            (
                serde_json::json!({"field": "source_key", "in": ["top.md"]}),
                true,
            ),
            (
                serde_json::json!({"field": "accepted_at", "gte": 2_000}),
                true,
            ),
            (
                serde_json::json!({"field": "accepted_at", "gt": 1_000, "lt": 3_000}),
                true,
            ),
            (
                serde_json::json!({"field": "metadata.year", "gte": 2020}),
                true,
            ),
            (
                serde_json::json!({"field": "metadata.year", "eq": 2019.5}),
                true,
            ),
            (
                serde_json::json!({"field": "metadata.author", "in": ["ann", "carol"]}),
                true,
            ),
            (
                serde_json::json!({"field": "metadata.labels", "eq": "y"}),
                true,
            ),
            (
                serde_json::json!({"field": "metadata.draft", "eq": false}),
                true,
            ),
            (
                serde_json::json!({"field": "metadata.author", "exists": true}),
                false,
            ),
            (
                serde_json::json!({"must_not": [{"field": "metadata.author", "exists": true}]}),
                false,
            ),
            (
                serde_json::json!({"should": [
                {"field": "tags", "any": ["async"]},
                {"field": "metadata.year", "lt": 2020}
            ], "must_not": [{"field": "media_type", "eq": "text/plain"}]}),
                true,
            ),
        ];
        // Who may read: the source names the caller, or names nobody (the dataset's default,
        // decided at binding). Never read from the wire, so built here.
        let readable = Filter::Condition(receipts::filter::Condition::Readable(vec![
            "user:ann".to_owned()
        ]));
        let mut parsed: Vec<(String, Filter, bool)> = cases
            .iter()
            .map(|(case, exact)| {
                let filter = Filter::parse(case, FilterLimits::default()).expect("a valid filter");
                (case.to_string(), filter, *exact)
            })
            .collect();
        parsed.push(("readable by user:ann".to_owned(), readable, false));
        for (case, filter, exact) in parsed {
            let pushed = pushdown(&filter, true);
            assert_eq!(pushed.exact, exact, "{case}");
            let matching: Vec<Uuid> = facts
                .iter()
                .zip(&written)
                .filter(|((key, tags, media, metadata, accepted, readers), _)| {
                    let tags: Vec<String> = tags.iter().map(|tag| (*tag).to_owned()).collect();
                    let readers: Vec<String> =
                        readers.iter().map(|reader| (*reader).to_owned()).collect();
                    filter.matches(&receipts::filter::Facts {
                        source_key: key,
                        media_type: media,
                        tags: &tags,
                        metadata,
                        accepted_at: *accepted,
                        readers: (!readers.is_empty()).then_some(readers.as_slice()),
                    })
                })
                .map(|(_, revision)| *revision)
                .collect();
            let docs = ["docs".to_owned()];
            for any_revision in [false, true] {
                let hits = if any_revision {
                    store
                        .search_any(unit(7), &docs, pushed.filter.as_ref(), 10)
                        .await
                } else {
                    store
                        .search(unit(7), &docs, pushed.filter.as_ref(), 10)
                        .await
                }
                .expect("search");
                let found: std::collections::HashSet<Uuid> =
                    hits.iter().map(|hit| hit.revision_id).collect();
                assert!(
                    found.contains(&legacy),
                    "{case}: a point without facts passes"
                );
                for revision in &matching {
                    assert!(
                        found.contains(revision),
                        "{case}: a match is missing: {hits:?}"
                    );
                }
                if exact {
                    assert_eq!(found.len(), matching.len() + 1, "{case}: {hits:?}");
                }
                if case.starts_with("readable") && !any_revision {
                    // group:eng's source is kept out by the store itself.
                    assert!(!found.contains(&written[2]), "{case}: {hits:?}");
                }
            }
        }
        // A field declared filterable gains an index; declaring it again changes nothing.
        let declared = [("metadata.author".to_owned(), gateways::FieldKind::Keyword)];
        store.ensure_indexes(&declared).await.expect("index");
        store.ensure_indexes(&declared).await.expect("again");
        let indexed = store.indexed_fields().await.expect("indexes");
        assert!(
            indexed.iter().any(|field| field == "metadata.author"),
            "{indexed:?}"
        );
    }

    /// An access job's write: a source's readers onto every point of it, every revision, read
    /// back by digest; the readers prefilter follows them.
    pub(super) async fn readers_are_written_onto_every_point_of_a_source(backend: &dyn Backend) {
        use gateways::vectors::pushdown;
        use receipts::filter::{Condition, Filter};

        let store = backend.open("g-readers").await;
        let with_readers = |revision: Uuid, head_at: i64, readers: &[&str]| {
            let mut written = points("docs", "a.md", revision, 2, head_at);
            for point in &mut written {
                point.facts = Some(Arc::new(gateways::PointFacts {
                    readers: readers.iter().map(|reader| (*reader).to_owned()).collect(),
                    ..gateways::PointFacts::default()
                }));
            }
            written
        };
        let (old, new) = (Uuid::now_v7(), Uuid::now_v7());
        for (revision, head_at) in [(old, 1), (new, 2)] {
            store
                .upsert(with_readers(revision, head_at, &["user:x"]))
                .await
                .expect("upsert");
            store
                .set_current("docs", "a.md", Some(revision), head_at)
                .await
                .expect("current");
        }
        project(store.as_ref(), "docs", "other.md", Uuid::now_v7(), 1, 3).await;
        let names =
            |list: &[&str]| -> Vec<String> { list.iter().map(|n| (*n).to_owned()).collect() };
        assert_eq!(
            store
                .readers_held("docs", "a.md", &names(&["user:x"]))
                .await
                .expect("held"),
            (4, 4)
        );
        let finds = |reader: &str| {
            let store = store.clone();
            let filter = Filter::Condition(Condition::Readable(vec![reader.to_owned()]));
            async move {
                let pushed = pushdown(&filter, true);
                store
                    .search(unit(7), &["docs".to_owned()], pushed.filter.as_ref(), 10)
                    .await
                    .expect("search")
                    .iter()
                    .any(|hit| hit.source_key == "a.md")
            }
        };
        assert!(finds("user:x").await);
        assert!(!finds("user:y").await);

        store
            .set_readers("docs", "a.md", &names(&["group:eng", "user:y"]))
            .await
            .expect("set readers");
        assert_eq!(
            store
                .readers_held("docs", "a.md", &names(&["group:eng", "user:y"]))
                .await
                .expect("held"),
            (4, 4),
            "every point of every revision carries them"
        );
        assert_eq!(
            store
                .readers_held("docs", "a.md", &names(&["user:x"]))
                .await
                .expect("held"),
            (4, 0)
        );
        assert!(finds("user:y").await);
        assert!(!finds("user:x").await);
        // Another source is untouched.
        assert_eq!(
            store
                .readers_held("docs", "other.md", &names(&[]))
                .await
                .expect("held"),
            (1, 0)
        );
        // Naming nobody hands the source to the dataset's default: every caller passes the
        // prefilter, binding decides.
        store.set_readers("docs", "a.md", &[]).await.expect("clear");
        assert!(finds("user:x").await);
        assert_eq!(
            store.readers_held("docs", "a.md", &[]).await.expect("held"),
            (4, 4)
        );
    }

    /// Every point, read page by page with its vector and payload, loads into another store
    /// as it was: the portable dump.
    pub(super) async fn every_point_dumps_and_loads_as_it_was(backend: &dyn Backend) {
        let source = backend.open("g-one").await;
        let (old, new) = (Uuid::now_v7(), Uuid::now_v7());
        project(source.as_ref(), "docs", "a.md", old, 3, 10).await;
        project(source.as_ref(), "docs", "a.md", new, 2, 20).await;
        project(source.as_ref(), "notes", "b.md", Uuid::now_v7(), 2, 30).await;
        let mut dumped = Vec::new();
        let mut after = None;
        loop {
            let (page, next) = source.scroll_all(after, 2).await.expect("scroll");
            assert!(page.len() <= 2);
            dumped.extend(page);
            match next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(dumped.len(), 7, "every point once");
        let ids: std::collections::BTreeSet<Uuid> = dumped.iter().map(|p| p.id).collect();
        assert_eq!(ids.len(), 7);
        let target = backend.open("g-two").await;
        let mut wrong = dumped[0].clone();
        wrong.vector.push(0.0);
        assert!(
            target.put_points(vec![wrong]).await.is_err(),
            "another dimension is refused"
        );
        target.put_points(dumped.clone()).await.expect("load");
        let (mut loaded, next) = target.scroll_all(None, 100).await.expect("scroll");
        assert_eq!(next, None);
        dumped.sort_by_key(|p| p.id);
        loaded.sort_by_key(|p| p.id);
        for (a, b) in dumped.iter().zip(&loaded) {
            assert_eq!((a.id, &a.payload), (b.id, &b.payload));
            assert!(a
                .vector
                .iter()
                .zip(&b.vector)
                .all(|(x, y)| (x - y).abs() < 1e-5));
        }
        assert_eq!(loaded.len(), 7);
        let points = target.revision_points(new).await.expect("read back");
        assert_eq!((points.count, points.current), (2, 2));
        assert_eq!(
            target
                .revision_points(old)
                .await
                .expect("read back")
                .current,
            0
        );
        let bucket = receipts::verify::bucket("docs", "a.md");
        assert_eq!(
            target.bucket_points(bucket, false).await.expect("bucket"),
            source.bucket_points(bucket, false).await.expect("bucket")
        );
    }

    /// Keys of `dataset` that all fall into one verify bucket.
    fn keys_in_one_bucket(dataset: &str, count: usize) -> (u16, Vec<String>) {
        let bucket = receipts::verify::bucket(dataset, "key-0");
        let keys = (0..)
            .map(|n| format!("key-{n}"))
            .filter(|key| receipts::verify::bucket(dataset, key) == bucket)
            .take(count)
            .collect();
        (bucket, keys)
    }

    pub(super) async fn a_bucket_is_read_by_revision_without_a_full_scroll(backend: &dyn Backend) {
        let store = backend.open("g-one").await;
        let (bucket, keys) = keys_in_one_bucket("docs", 2);
        let (old, new, other) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        project(store.as_ref(), "docs", &keys[0], old, 3, 10).await;
        project(store.as_ref(), "docs", &keys[0], new, 2, 20).await;
        project(store.as_ref(), "docs", &keys[1], other, 1, 30).await;
        // A source in another bucket is not read.
        let elsewhere = (0..)
            .map(|n| format!("else-{n}"))
            .find(|key| receipts::verify::bucket("docs", key) != bucket)
            .expect("a key elsewhere");
        project(store.as_ref(), "docs", &elsewhere, Uuid::now_v7(), 4, 40).await;

        assert_eq!(store.bucket_current(bucket).await.expect("count"), 3);
        let held = store.bucket_points(bucket, false).await.expect("scroll");
        let by_revision = |revision: Uuid| {
            held.iter()
                .find(|h| h.revision_id == revision)
                .map(|h| (h.source_key.clone(), h.points, h.current, h.wrong_dimension))
        };
        assert_eq!(held.len(), 3, "{held:?}");
        assert_eq!(by_revision(old), Some((keys[0].clone(), 3, 0, 0)));
        assert_eq!(by_revision(new), Some((keys[0].clone(), 2, 2, 0)));
        assert_eq!(by_revision(other), Some((keys[1].clone(), 1, 1, 0)));
        // With vectors: every one has the store's dimension.
        let deep = store
            .bucket_points(bucket, true)
            .await
            .expect("deep scroll");
        assert_eq!(deep, held);
        assert!(store.ensure_present(false).await.expect("present"));

        // Counted per bucket in one call: every occupied bucket with at least its points
        // (exactly on one replica; a replicated collection's facet sums the replicas a quorum
        // read consulted), and a bucket without points never named: what verify relies on
        // to settle a bucket without reading it.
        let else_bucket = receipts::verify::bucket("docs", &elsewhere);
        let counts = store.bucket_counts().await.expect("bucket counts");
        assert_eq!(
            counts.keys().copied().collect::<BTreeSet<u16>>(),
            BTreeSet::from([bucket, else_bucket]),
            "{counts:?}"
        );
        assert!(
            counts[&bucket] >= 6 && counts[&else_bucket] >= 4,
            "{counts:?}"
        );
        if !backend.replicated() {
            assert_eq!(counts[&bucket], 6, "{counts:?}");
            assert_eq!(counts[&else_bucket], 4, "{counts:?}");
        }
        // Every point of a bucket deleted: the bucket is no longer named.
        for revision in [old, new, other] {
            store
                .delete_points(gateways::PointSelector::Revision(revision))
                .await
                .expect("delete a revision's points");
        }
        let counts = store.bucket_counts().await.expect("bucket counts");
        assert_eq!(
            counts.keys().copied().collect::<BTreeSet<u16>>(),
            BTreeSet::from([else_bucket]),
            "{counts:?}"
        );
    }
}

macro_rules! vector_conformance {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn upsert_reads_back_by_count_dimension_and_ids() {
                checks::upsert_reads_back_by_count_dimension_and_ids(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_wrong_dimension_is_refused_and_writes_nothing() {
                checks::a_wrong_dimension_is_refused_and_writes_nothing(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn reprojection_is_idempotent() {
                checks::reprojection_is_idempotent(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn reconcile_sees_what_a_crashed_run_left() {
                checks::reconcile_sees_what_a_crashed_run_left(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn current_flips_are_ordered_by_head_time() {
                checks::current_flips_are_ordered_by_head_time(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn retire_and_exclude() {
                checks::retire_and_exclude(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn search_filters_by_dataset_and_current() {
                checks::search_filters_by_dataset_and_current(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn search_within_finds_every_point_of_its_revisions() {
                checks::search_within_finds_every_point_of_its_revisions(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn one_collection_per_generation() {
                checks::one_collection_per_generation(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn vectors_are_read_back_by_point_id() {
                checks::vectors_are_read_back_by_point_id(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn erasure_deletes_a_source_or_a_revision() {
                checks::erasure_deletes_a_source_or_a_revision(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_bucket_is_read_by_revision_without_a_full_scroll() {
                checks::a_bucket_is_read_by_revision_without_a_full_scroll(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn every_point_dumps_and_loads_as_it_was() {
                checks::every_point_dumps_and_loads_as_it_was(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn payload_indexes_exist_before_any_point() {
                checks::payload_indexes_exist_before_any_point(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn pushed_filters_select_what_matches() {
                checks::pushed_filters_select_what_matches(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_units_calls_match_the_single_ones() {
                checks::a_units_calls_match_the_single_ones(&$backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn readers_are_written_onto_every_point_of_a_source() {
                checks::readers_are_written_onto_every_point_of_a_source(&$backend).await;
            }
        }
    };
}

vector_conformance!(edge_store, edge());
vector_conformance!(server_store, server());

/// The whole suite on one three-node cluster (starting a cluster per check would cost more
/// than the checks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_node_cluster_passes_the_suite() {
    let nodes = Arc::new(QdrantCluster::start(3).expect("start a three-node cluster"));
    let on = |check: &str| Cluster {
        nodes: nodes.clone(),
        prefix: format!("c{check}-"),
    };
    checks::upsert_reads_back_by_count_dimension_and_ids(&on("0")).await;
    checks::a_wrong_dimension_is_refused_and_writes_nothing(&on("1")).await;
    checks::reprojection_is_idempotent(&on("2")).await;
    checks::reconcile_sees_what_a_crashed_run_left(&on("3")).await;
    checks::current_flips_are_ordered_by_head_time(&on("4")).await;
    checks::retire_and_exclude(&on("5")).await;
    checks::search_filters_by_dataset_and_current(&on("6")).await;
    checks::search_within_finds_every_point_of_its_revisions(&on("6w")).await;
    checks::one_collection_per_generation(&on("7")).await;
    checks::vectors_are_read_back_by_point_id(&on("8")).await;
    checks::erasure_deletes_a_source_or_a_revision(&on("9")).await;
    checks::a_bucket_is_read_by_revision_without_a_full_scroll(&on("10")).await;
    checks::every_point_dumps_and_loads_as_it_was(&on("11")).await;
    checks::payload_indexes_exist_before_any_point(&on("12")).await;
    checks::pushed_filters_select_what_matches(&on("13")).await;
    checks::readers_are_written_onto_every_point_of_a_source(&on("14")).await;
    checks::a_units_calls_match_the_single_ones(&on("15")).await;
}
