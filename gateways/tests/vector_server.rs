//! The Qdrant server store under faults, against the real server: stopped, paused (`SIGSTOP`),
//! restarted, with an API key, and with a collection of another dimension. Errors must arrive
//! typed (retryable or permanent) and within the configured bounds, never as a hang.

use std::time::{Duration, Instant};

use gateways::{GatewayError, ServerOptions, ServerVectorStore, VectorPoint, VectorStore};
use testkit::qdrant::QdrantServer;
use uuid::Uuid;

const DIMENSION: usize = 4;

fn points(revision: Uuid, count: u32) -> Vec<VectorPoint> {
    (0..count)
        .map(|index| VectorPoint {
            dataset: "docs".to_owned(),
            source_key: "a".to_owned(),
            revision_id: revision,
            chunk_index: index,
            head_at: 1,
            vector: vec![1.0, index as f32 + 1.0, 0.5, 0.25],
            facts: None,
        })
        .collect()
}

/// The defaults: what a deployment runs with. Creating a collection and its payload indexes can
/// take seconds on a loaded machine, so every test that is not about a bound opens with these.
fn options(server: &QdrantServer) -> ServerOptions {
    ServerOptions::new(&server.grpc_url())
}

/// Tight bounds, for the tests that measure them. The collection is created first with the
/// defaults, so only the fault itself meets these.
async fn tight_store(
    server: &QdrantServer,
    generation: &str,
) -> (ServerOptions, ServerVectorStore) {
    ServerVectorStore::open(&options(server), generation, DIMENSION)
        .await
        .expect("create the collection");
    let mut options = options(server);
    options.timeout = Duration::from_millis(800);
    options.connect_timeout = Duration::from_millis(500);
    options.retry_budget = Duration::from_millis(1500);
    let store = ServerVectorStore::open(&options, generation, DIMENSION)
        .await
        .expect("open");
    (options, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_a_restart_and_a_crash() {
    let mut server = QdrantServer::start().expect("start");
    let store = ServerVectorStore::open(&options(&server), "g-r", DIMENSION)
        .await
        .expect("open");
    let revision = Uuid::now_v7();
    store.upsert(points(revision, 3)).await.expect("upsert");
    server.stop();
    server.start_again().expect("restart");
    assert_eq!(
        store.revision_points(revision).await.expect("read").count,
        3
    );
    // wait=true means in the server's WAL: a crash right after the answer loses nothing.
    let second = Uuid::now_v7();
    store.upsert(points(second, 2)).await.expect("upsert");
    server.kill();
    server.start_again().expect("restart after a crash");
    let stored = store.revision_points(second).await.expect("read");
    assert_eq!((stored.count, stored.with_dimension), (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_a_retryable_error_within_the_retry_budget() {
    let mut server = QdrantServer::start().expect("start");
    let (options, store) = tight_store(&server, "g-s").await;
    server.stop();
    let started = Instant::now();
    let error = store
        .upsert(points(Uuid::now_v7(), 1))
        .await
        .expect_err("no server");
    let elapsed = started.elapsed();
    assert!(
        matches!(
            error,
            GatewayError::Unavailable { .. } | GatewayError::Timeout { .. }
        ),
        "{error:?}"
    );
    assert!(
        elapsed < options.retry_budget + options.timeout * 2 + Duration::from_secs(2),
        "bounded by the retry budget: {elapsed:?}"
    );
    // Opening against a dead server fails the same way (a worker's start says why).
    let error = ServerVectorStore::open(&options, "g-s", DIMENSION)
        .await
        .expect_err("no server");
    assert!(
        matches!(
            error,
            GatewayError::Unavailable { .. } | GatewayError::Timeout { .. }
        ),
        "{error:?}"
    );
    // It comes back: the same store works again without being reopened.
    server.start_again().expect("restart");
    store
        .upsert(points(Uuid::now_v7(), 1))
        .await
        .expect("upsert after restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_times_out_instead_of_hanging() {
    let server = QdrantServer::start().expect("start");
    let (options, store) = tight_store(&server, "g-p").await;
    let revision = Uuid::now_v7();
    store.upsert(points(revision, 2)).await.expect("upsert");
    server.pause();
    let started = Instant::now();
    let error = store
        .search(vec![1.0, 1.0, 0.5, 0.25], &[], None, 5)
        .await
        .expect_err("paused");
    assert!(
        matches!(
            error,
            GatewayError::Timeout { .. } | GatewayError::Unavailable { .. }
        ),
        "{error:?}"
    );
    assert!(
        started.elapsed() < options.timeout + Duration::from_secs(2),
        "one attempt, bounded by the call timeout: {:?}",
        started.elapsed()
    );
    server.resume();
    let hits = store
        .search(vec![1.0, 1.0, 0.5, 0.25], &[], None, 5)
        .await
        .expect("search after resume");
    assert_eq!(hits.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_required_sent_and_never_shown() {
    let server = QdrantServer::start_with_key(Some("s3cret-key-for-test")).expect("start");
    let mut options = options(&server);
    let error = ServerVectorStore::open(&options, "g-k", DIMENSION)
        .await
        .expect_err("no key");
    assert!(error.to_string().contains("API key"), "{error}");
    options.api_key = Some("s3cret-key-for-test".to_owned());
    assert!(!format!("{options:?}").contains("s3cret"));
    let store = ServerVectorStore::open(&options, "g-k", DIMENSION)
        .await
        .expect("open with the key");
    assert!(!format!("{store:?}").contains("s3cret"));
    assert!(!store.location().contains("s3cret"));
    store
        .upsert(points(Uuid::now_v7(), 1))
        .await
        .expect("upsert with the key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_of_another_dimension_is_refused() {
    let server = QdrantServer::start().expect("start");
    ServerVectorStore::open(&options(&server), "g-d", DIMENSION)
        .await
        .expect("open");
    let error = ServerVectorStore::open(&options(&server), "g-d", DIMENSION + 1)
        .await
        .expect_err("another dimension");
    assert!(matches!(error, GatewayError::Config(_)), "{error:?}");
    // Concurrent openers of a new generation all succeed (workers starting together).
    let opened = futures_join(&options(&server)).await;
    assert!(opened.iter().all(Result::is_ok), "{opened:?}");
}

async fn futures_join(options: &ServerOptions) -> Vec<Result<ServerVectorStore, GatewayError>> {
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let options = options.clone();
        tasks.push(tokio::spawn(async move {
            ServerVectorStore::open(&options, "g-new", DIMENSION).await
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.expect("task"));
    }
    results
}
