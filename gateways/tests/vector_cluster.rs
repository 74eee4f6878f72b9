//! The Qdrant store on a real three-node cluster (v1.18.3 in distributed mode, on loopback):
//! a collection of 6 shards with 3 replicas each and a write consistency factor of 2, reached
//! through every node's URL. Under node loss the store must fail over within its retry
//! budget, read back what a majority of replicas hold, and after the node returns every
//! replica of every shard must hold the same points with the same `is_current` (read replica by
//! replica from shard snapshots; a stale replica injected behind the cluster's back is told
//! apart). A collection laid out otherwise is refused.

use std::time::{Duration, Instant};

use gateways::{
    CollectionLayout, GatewayError, ServerOptions, ServerVectorStore, VectorPoint, VectorStore,
};
use testkit::qdrant::{QdrantCluster, QdrantServer};
use uuid::Uuid;

const DIMENSION: usize = 4;

const LAYOUT: CollectionLayout = CollectionLayout {
    shards: Some(6),
    replication_factor: Some(3),
    write_consistency: Some(2),
};

fn points(source: usize, revision: Uuid, count: u32) -> Vec<VectorPoint> {
    (0..count)
        .map(|index| VectorPoint {
            dataset: "docs".to_owned(),
            source_key: format!("s-{source}"),
            revision_id: revision,
            chunk_index: index,
            head_at: 1,
            vector: vec![1.0, index as f32 + 1.0, source as f32 * 0.1, 0.25],
            facts: None,
        })
        .collect()
}

/// Every node's URL, the cluster's layout, and bounds a test can wait out.
fn options(cluster: &QdrantCluster) -> ServerOptions {
    let urls = cluster.grpc_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut options = ServerOptions::cluster(&urls);
    options.layout = LAYOUT;
    options.timeout = Duration::from_secs(2);
    options.connect_timeout = Duration::from_millis(500);
    options.retry_budget = Duration::from_secs(8);
    options
}

/// Waits until every replica of all 6 shards of `collection` is active on a running node
/// and the replicas of each shard hold the same number of points.
fn await_converged(
    cluster: &QdrantCluster,
    collection: &str,
    limit: Duration,
) -> Vec<(usize, u64, u64, String)> {
    cluster
        .await_converged(collection, 6, 3, limit)
        .unwrap_or_else(|error| panic!("{error}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_fails_over_from_a_killed_node_and_the_replicas_converge_after_it_returns() {
    let mut cluster = QdrantCluster::start(3).expect("start a three-node cluster");
    let store = ServerVectorStore::open(&options(&cluster), "g-failover", DIMENSION)
        .await
        .expect("open the collection on the cluster");
    let first_url = store.url().to_owned();
    assert_eq!(
        first_url,
        cluster.grpc_urls()[0],
        "calls start at the first node"
    );
    let mut written = Vec::new();
    for source in 0..20 {
        let revision = Uuid::now_v7();
        store
            .upsert(points(source, revision, 3))
            .await
            .expect("upsert");
        written.push(revision);
    }
    let replicas = await_converged(&cluster, store.collection(), Duration::from_secs(60));
    let held: u64 = replicas.iter().map(|(_, _, points, _)| points).sum();
    assert_eq!(held, 3 * 60, "every point on three replicas: {replicas:?}");

    // Kill the node the store talks to: the next call moves to another node.
    cluster.node(0).kill();
    let killed = Instant::now();
    let hits = store
        .search(vec![1.0, 2.0, 0.5, 0.25], &[], None, 5)
        .await
        .expect("a search after the node died fails over");
    let detected = killed.elapsed();
    assert_eq!(hits.len(), 5);
    assert_ne!(store.url(), first_url, "the store moved to another node");
    let written_at = Instant::now();
    let revision = Uuid::now_v7();
    store
        .upsert(points(20, revision, 3))
        .await
        .expect("a write after the node died");
    written.push(revision);
    eprintln!(
        "failover: the first search after the node was killed answered in {} ms; the first \
         write took {} ms (the cluster marking the dead replicas)",
        detected.as_millis(),
        written_at.elapsed().as_millis()
    );
    // Writes go on with one node of three down (2 replicas of each shard, the write
    // consistency factor), and each reads back from a majority.
    for source in 21..30 {
        let revision = Uuid::now_v7();
        store
            .upsert(points(source, revision, 3))
            .await
            .expect("upsert with a node down");
        let read = store.revision_points(revision).await.expect("read back");
        assert_eq!((read.count, read.with_dimension), (3, 3));
        written.push(revision);
    }
    for revision in &written {
        assert_eq!(
            store
                .revision_points(*revision)
                .await
                .expect("read back")
                .count,
            3
        );
    }
    let hits = store
        .search(vec![1.0, 2.0, 0.5, 0.25], &[], None, 5)
        .await
        .expect("search with a node down");
    assert_eq!(hits.len(), 5);

    // The node returns: it catches up, and every replica holds the same points.
    cluster.node(0).start_again().expect("restart the node");
    cluster
        .await_peers(Duration::from_secs(60))
        .expect("the node rejoins");
    let replicas = await_converged(&cluster, store.collection(), Duration::from_secs(90));
    let held: u64 = replicas.iter().map(|(_, _, points, _)| points).sum();
    assert_eq!(held, 3 * 3 * written.len() as u64, "{replicas:?}");
}

/// The replica comparison sees a replica that holds every point but a stale `is_current`,
/// which equal point counts cannot. The fault is injected behind the cluster's back: node 1's
/// replicas of the shards holding one revision are recovered, unsynced, from snapshots taken
/// before that revision was retired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_a_stale_current_flag_does_not_pass_as_converged() {
    let cluster = QdrantCluster::start(3).expect("start a three-node cluster");
    let store = ServerVectorStore::open(&options(&cluster), "g-stale", DIMENSION)
        .await
        .expect("open");
    let collection = store.collection().to_owned();
    let mut revisions = Vec::new();
    for source in 0..8 {
        let revision = Uuid::now_v7();
        store
            .upsert(points(source, revision, 2))
            .await
            .expect("upsert");
        revisions.push(revision);
    }
    tokio::task::block_in_place(|| {
        await_converged(&cluster, &collection, Duration::from_secs(60));
    });
    let retired: Vec<Uuid> = (0..2)
        .map(|index| gateways::vectors::point_id(revisions[0], index))
        .collect();
    let before = tokio::task::block_in_place(|| cluster.replica_contents(&collection))
        .expect("read every replica");
    assert_eq!(before.len(), 18, "6 shards x 3 replicas: {before:?}");
    for node in 0..3 {
        let held: usize = before
            .iter()
            .filter(|copy| copy.node == node)
            .map(|copy| copy.points.len())
            .sum();
        assert_eq!(held, 16, "node {node} holds every point once");
    }
    let stale_shards: Vec<u64> = before
        .iter()
        .filter(|copy| copy.node == 1 && retired.iter().any(|id| copy.points.contains_key(id)))
        .map(|copy| copy.shard)
        .collect();
    assert!(!stale_shards.is_empty());
    let mut snapshots = Vec::new();
    for shard in &stale_shards {
        snapshots.push(
            cluster.nodes()[1]
                .shard_snapshot(&collection, *shard)
                .await
                .expect("snapshot node 1's replica"),
        );
    }

    store
        .retire_revision(revisions[0])
        .await
        .expect("retire the first revision");
    for (shard, snapshot) in stale_shards.iter().zip(&snapshots) {
        cluster.nodes()[1]
            .recover_shard_unsynced(&collection, *shard, snapshot)
            .await
            .expect("fault injection: recover node 1's replica from the old snapshot");
    }

    let refused = tokio::task::block_in_place(|| {
        cluster.await_converged(&collection, 6, 3, Duration::from_secs(15))
    })
    .expect_err("a replica with a stale is_current passed as converged");
    let told = refused.to_string();
    for id in &retired {
        assert!(told.contains(&id.to_string()), "{id} not named: {told}");
    }
    let after = tokio::task::block_in_place(|| cluster.replica_contents(&collection))
        .expect("read every replica");
    let counts = |contents: &[testkit::qdrant::ReplicaContent]| {
        let mut counts: Vec<(usize, u64, usize)> = contents
            .iter()
            .map(|copy| (copy.node, copy.shard, copy.points.len()))
            .collect();
        counts.sort_unstable();
        counts
    };
    assert_eq!(counts(&after), counts(&before), "the counts alone agree");
    for copy in after
        .iter()
        .filter(|copy| stale_shards.contains(&copy.shard))
    {
        for id in &retired {
            if let Some((current, _)) = copy.points.get(id) {
                assert_eq!(
                    *current,
                    Some(copy.node == 1),
                    "node {} shard {}: {id}",
                    copy.node,
                    copy.shard
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_times_out_and_search_moves_to_the_next_one() {
    let cluster = QdrantCluster::start(3).expect("start a three-node cluster");
    let store = ServerVectorStore::open(&options(&cluster), "g-paused", DIMENSION)
        .await
        .expect("open");
    let mut revisions = Vec::new();
    for source in 0..10 {
        let revision = Uuid::now_v7();
        store
            .upsert(points(source, revision, 2))
            .await
            .expect("upsert");
        revisions.push(revision);
    }
    await_converged(&cluster, store.collection(), Duration::from_secs(60));
    cluster.nodes()[0].pause();
    // A search whose caller gives up first (its budget spent) still moves the store off the
    // hung node, so the next search does not wait there too.
    let abandoned = tokio::time::timeout(
        Duration::from_millis(800),
        store.search(vec![1.0, 2.0, 0.5, 0.25], &[], None, 5),
    )
    .await;
    assert!(abandoned.is_err(), "the hung node answered: {abandoned:?}");
    assert_eq!(
        store.url(),
        cluster.grpc_urls()[1],
        "an abandoned search moved the store"
    );
    let answered = tokio::time::timeout(
        Duration::from_millis(800),
        store.search(vec![1.0, 2.0, 0.5, 0.25], &[], None, 5),
    )
    .await;
    assert_eq!(
        answered
            .expect("the next search answers at once")
            .expect("hits")
            .len(),
        5
    );
    // Quorum read-backs through a healthy node do not wait on the hung node's replicas: a
    // read it has not answered within the fan-out delay (100 ms; a read-back is three reads)
    // goes to the third replica. Without it each waited for two call timeouts.
    let started = Instant::now();
    for revision in &revisions {
        let held = store.revision_points(*revision).await.expect("read-back");
        assert_eq!(held.count, 2, "{revision}");
    }
    let took = started.elapsed();
    eprintln!(
        "10 quorum read-backs with one node hung: {} ms",
        took.as_millis()
    );
    assert!(
        took < Duration::from_secs(5),
        "read-backs waited on the hung node: {took:?}"
    );

    // A node that hangs while the store talks to it: the call times out and moves on.
    cluster.nodes()[0].resume();
    cluster.nodes()[1].pause();
    let started = Instant::now();
    let hits = store.search(vec![1.0, 2.0, 0.5, 0.25], &[], None, 5).await;
    let took = started.elapsed();
    cluster.nodes()[1].resume();
    let hits = hits.expect("search answers from another node");
    assert_eq!(hits.len(), 5);
    // Two call timeouts (2 s each: qdrant-client retries a cancelled call once on a new
    // connection) on the hung node, then one answer from the next.
    eprintln!(
        "failover from a hung node: search answered in {} ms",
        took.as_millis()
    );
    assert!(
        took < Duration::from_millis(5500),
        "search took {took:?} with one node hung"
    );
    assert_eq!(store.url(), cluster.grpc_urls()[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_laid_out_otherwise_is_refused() {
    let server = QdrantServer::start().expect("start");
    let mut two = ServerOptions::new(&server.grpc_url());
    two.layout.shards = Some(2);
    let store = ServerVectorStore::open(&two, "g-layout", DIMENSION)
        .await
        .expect("create with 2 shards");
    store
        .upsert(points(0, Uuid::now_v7(), 1))
        .await
        .expect("upsert");
    let mut three = two.clone();
    three.layout.shards = Some(3);
    let error = ServerVectorStore::open(&three, "g-layout", DIMENSION)
        .await
        .expect_err("another shard count");
    let GatewayError::Config(message) = &error else {
        panic!("not a configuration error: {error:?}");
    };
    assert!(
        message.contains("shard count 2 (configured: 3)"),
        "{message}"
    );
    // A layout left to the server's defaults takes the collection as it is.
    ServerVectorStore::open(
        &ServerOptions::new(&server.grpc_url()),
        "g-layout",
        DIMENSION,
    )
    .await
    .expect("no layout configured");
}

/// The same cluster on three test hosts (network namespaces on a bridge; the test sits on the
/// bridge as the client). One node is cut off from its peers while the store talks to it,
/// then the node the store moved to is taken off the network altogether.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_move_the_store_and_the_replicas_heal() {
    let network = testkit::netns::Network::create(&["q1", "q2", "q3"])
        .expect("make three test hosts (network namespaces need root, as CI has)");
    let cluster =
        QdrantCluster::start_on(&network, &["q1", "q2", "q3"]).expect("a cluster on three hosts");
    // A write through a node cut off from its peers fails after about 2.5 s (the peers' 1 s
    // connection timeouts); a write through a healthy node waits up to about 4.5 s until the
    // cluster marks the cut-off replicas dead. The call timeout must outlast that, and the
    // retry budget both.
    let mut options = options(&cluster);
    options.timeout = Duration::from_secs(6);
    options.retry_budget = Duration::from_secs(20);
    let store = ServerVectorStore::open(&options, "g-partition", DIMENSION)
        .await
        .expect("open on the cluster");
    let mut heads = Vec::new();
    for source in 0..12 {
        let revision = Uuid::now_v7();
        store
            .upsert(points(source, revision, 2))
            .await
            .expect("upsert");
        store
            .set_current("docs", &format!("s-{source}"), Some(revision), 1)
            .await
            .expect("current");
        heads.push(revision);
    }
    await_converged(&cluster, store.collection(), Duration::from_secs(60));

    // q1, the node the store talks to, loses its peers; the harness still reaches it.
    network
        .separate("q1", &["q2", "q3"])
        .expect("blackhole q1's routes to its peers");
    let cut = Instant::now();
    for (source, head) in heads.iter_mut().enumerate().take(4) {
        let revision = Uuid::now_v7();
        store
            .upsert(points(source, revision, 2))
            .await
            .expect("a write while q1 is cut off goes to another node");
        store
            .set_current("docs", &format!("s-{source}"), Some(revision), 2)
            .await
            .expect("supersede while q1 is cut off");
        let read = store.revision_points(revision).await.expect("read back");
        assert_eq!((read.count, read.current), (2, 2));
        *head = revision;
    }
    eprintln!(
        "partition: four supersessions with q1 cut off from its peers took {} ms; the store \
         talks to {}",
        cut.elapsed().as_millis(),
        store.url()
    );
    assert_ne!(store.url(), cluster.grpc_urls()[0]);
    for (source, head) in heads.iter().enumerate() {
        assert_eq!(
            store
                .source_current("docs", &format!("s-{source}"))
                .await
                .expect("count"),
            2,
            "s-{source}"
        );
        assert_eq!(
            store.revision_points(*head).await.expect("read").current,
            2,
            "s-{source}: its head is current"
        );
    }
    network
        .reconnect("q1", &["q2", "q3"])
        .expect("heal the partition");
    await_converged(&cluster, store.collection(), Duration::from_secs(120));

    // The node the store talks to now leaves the network altogether.
    let active = cluster
        .grpc_urls()
        .iter()
        .position(|url| url == store.url())
        .expect("an active node");
    let name = ["q1", "q2", "q3"][active];
    network.isolate(name).expect("take the active host off");
    let isolated = Instant::now();
    let hits = store
        .search(vec![1.0, 2.0, 0.5, 0.25], &[], None, 5)
        .await
        .expect("search fails over from an unreachable host");
    assert_eq!(hits.len(), 5);
    eprintln!(
        "isolation: search answered {} ms after {name} left the network, from {}",
        isolated.elapsed().as_millis(),
        store.url()
    );
    network.rejoin(name).expect("rejoin");
    cluster
        .await_peers(Duration::from_secs(60))
        .expect("the host rejoins");
    let replicas = await_converged(&cluster, store.collection(), Duration::from_secs(120));
    let held: u64 = replicas.iter().map(|(_, _, points, _)| points).sum();
    assert_eq!(held, 3 * 2 * 16, "{replicas:?}");
}
