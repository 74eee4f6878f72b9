//! The query path over real parts: a SQLite ledger, the real embedding model, qdrant-edge on
//! disk and the real projection job. Faults are injected by wrappers named `Slow*`/`Failing*`
//! around the real stores, and by the ledger's `SlowLexical` fault point.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use gateways::embedder::{LocalEmbedder, ModelFiles, MODEL_DIMENSION, MODEL_ID};
use gateways::{
    Chunker, ChunkerSettings, EdgeVectorStore, Embedder, GatewayError, RevisionPoints,
    ServerOptions, ServerVectorStore, VectorHit, VectorPoint, VectorStore,
};
use receipts::faults::{FaultPlan, FaultPoint};
use receipts::{Backend, Generation, JobState, Ledger, SqliteLedger, SqliteOptions, SystemClock};
use search::{Answered, Mode, Query, SearchError, SearchSettings, Searcher, VectorSide};
use testkit::conformance::{delete, put};
use testkit::qdrant::QdrantServer;
use tokio::sync::OnceCell;
use uuid::Uuid;
use worker::{Projector, Worker, WorkerConfig};

fn models_dir() -> PathBuf {
    std::env::var_os("CAIRN_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")))
}

fn files() -> ModelFiles {
    match ModelFiles::locate(&models_dir()) {
        Ok(files) => files,
        Err(error) => panic!("{error}"),
    }
}

/// The model loads once per test binary.
async fn model() -> Arc<dyn Embedder> {
    static MODEL: OnceCell<Arc<LocalEmbedder>> = OnceCell::const_new();
    MODEL
        .get_or_init(|| async {
            Arc::new(LocalEmbedder::load(&files(), 1, Some(2)).expect("load the model"))
        })
        .await
        .clone()
}

struct World {
    ledger: Arc<dyn Ledger>,
    faults: Arc<FaultPlan>,
    vectors: Arc<dyn VectorStore>,
    projector: Arc<Projector>,
    _directory: tempfile::TempDir,
}

async fn world() -> World {
    world_on(None).await
}

/// A world whose vectors live on `server` (a real Qdrant server), or in qdrant-edge.
async fn world_on(server: Option<&QdrantServer>) -> World {
    let directory = tempfile::tempdir().expect("tempdir");
    let faults = Arc::new(FaultPlan::default());
    let ledger: Arc<dyn Ledger> = Arc::new(
        SqliteLedger::open_with_faults(
            SqliteOptions::new(directory.path().join("ledger.db")),
            Arc::new(SystemClock),
            faults.clone(),
        )
        .await
        .expect("ledger"),
    );
    let generation = Generation::new(
        MODEL_ID,
        MODEL_DIMENSION as i64,
        &ChunkerSettings::default().fingerprint(),
        &[Backend::Relational, Backend::Vector],
    );
    ledger
        .activate_generation(&generation, "test")
        .await
        .expect("generation");
    let vectors: Arc<dyn VectorStore> = match server {
        Some(server) => Arc::new(
            ServerVectorStore::open(
                &ServerOptions::new(&server.grpc_url()),
                &generation.id,
                MODEL_DIMENSION,
            )
            .await
            .expect("vector collection"),
        ),
        None => Arc::new(
            EdgeVectorStore::open(&directory.path().join("vectors"), MODEL_DIMENSION)
                .expect("vector store"),
        ),
    };
    let chunker = Arc::new(
        Chunker::new(
            files().tokenizer().expect("tokenizer"),
            ChunkerSettings::default(),
        )
        .expect("chunker"),
    );
    let projector = Arc::new(
        Projector::new(
            ledger.clone(),
            model().await,
            chunker,
            Some(vectors.clone()),
            generation,
        )
        .expect("projector"),
    );
    World {
        ledger,
        faults,
        vectors,
        projector,
        _directory: directory,
    }
}

impl World {
    /// The store of the world's one generation.
    fn stores(&self, store: Arc<dyn VectorStore>) -> Arc<dyn gateways::VectorStores> {
        Arc::new(gateways::OneStore::new(
            &self.projector.generation().id,
            store,
        ))
    }

    fn searcher(&self, embedder: Arc<dyn Embedder>, max_in_flight: usize) -> Searcher {
        self.searcher_with(embedder, self.vectors.clone(), max_in_flight)
    }

    fn searcher_with(
        &self,
        embedder: Arc<dyn Embedder>,
        store: Arc<dyn VectorStore>,
        max_in_flight: usize,
    ) -> Searcher {
        Searcher::new(
            self.ledger.clone(),
            Some(VectorSide {
                embedders: Arc::new(gateways::OneModel(embedder)),
                stores: self.stores(store),
            }),
            SearchSettings {
                max_in_flight,
                ..SearchSettings::default()
            },
        )
    }

    /// A searcher with an admission queue of `max_queued`.
    fn searcher_queued(
        &self,
        embedder: Arc<dyn Embedder>,
        max_in_flight: usize,
        max_queued: usize,
    ) -> Searcher {
        Searcher::new(
            self.ledger.clone(),
            Some(VectorSide {
                embedders: Arc::new(gateways::OneModel(embedder)),
                stores: self.stores(self.vectors.clone()),
            }),
            SearchSettings {
                max_in_flight,
                max_queued,
                ..SearchSettings::default()
            },
        )
    }

    /// A running worker; stops when the returned sender is dropped or sent `true`.
    fn start_worker(
        &self,
    ) -> (
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    ) {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let mut config = WorkerConfig::new("search-test");
        config.poll_interval = Duration::from_millis(20);
        let handle = tokio::spawn(
            Worker::new(self.ledger.clone(), self.projector.clone(), config).run(async move {
                let _ = stopped.changed().await;
            }),
        );
        (stop, handle)
    }

    async fn accept(&self, submissions: Vec<receipts::Submission>) -> Vec<receipts::Acceptance> {
        self.ledger
            .accept(submissions)
            .await
            .into_iter()
            .map(|result| result.expect("accepted"))
            .collect()
    }

    /// Accepts and projects the documents; returns their acceptances.
    async fn project(&self, submissions: Vec<receipts::Submission>) -> Vec<receipts::Acceptance> {
        let accepted = self.accept(submissions).await;
        let (stop, handle) = self.start_worker();
        let deadline = Instant::now() + Duration::from_secs(120);
        for acceptance in &accepted {
            loop {
                let job = self
                    .ledger
                    .job(acceptance.projection_job_id)
                    .await
                    .expect("job")
                    .expect("job exists");
                if matches!(job.state, JobState::Completed | JobState::Superseded) {
                    break;
                }
                assert!(job.state != JobState::Dead, "projection died: {job:?}");
                assert!(Instant::now() < deadline, "projection did not finish");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let _ = stop.send(true);
        handle.await.expect("worker");
        accepted
    }
}

fn query(text: &str, mode: Mode, budget_ms: u64) -> Query {
    Query {
        text: text.to_owned(),
        datasets: Vec::new(),
        top_k: 5,
        budget: Duration::from_millis(budget_ms),
        mode,
        group_by_source: true,
        at: None,
        filter: None,
        facets: None,
    }
}

const DOCUMENTS: [(&str, &str); 6] = [
    (
        "guitar",
        "A man is playing a guitar on a small stage while people listen.",
    ),
    (
        "taxes",
        "Quarterly tax filings are due at the end of the month.",
    ),
    (
        "cells",
        "Stem cells differentiate into neurons when grown on soft biomaterials.",
    ),
    (
        "trains",
        "The night train to Vienna leaves from platform nine at eleven.",
    ),
    (
        "bread",
        "Sourdough bread rises slowly because wild yeast ferments the dough.",
    ),
    (
        "volcano",
        "Lava from the erupting volcano reached the coastal village overnight.",
    ),
];

fn corpus(dataset: &str) -> Vec<receipts::Submission> {
    DOCUMENTS
        .iter()
        .map(|(key, text)| put(dataset, key, text))
        .collect()
}

/// An embedder that takes `delay` (asynchronously) and counts calls that finished: a fault
/// injector for the budget.
struct SlowEmbedder {
    delay: Duration,
    inner: Arc<dyn Embedder>,
    finished: Arc<AtomicUsize>,
    /// Embeddings whose future was dropped before it finished (cancelled by the searcher).
    dropped: Arc<AtomicUsize>,
}

/// Counts a future dropped before it finished; disarmed when it finishes.
struct DropGuard(Option<Arc<AtomicUsize>>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        if let Some(count) = self.0.take() {
            count.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[async_trait]
impl Embedder for SlowEmbedder {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }
    fn dimension(&self) -> usize {
        self.inner.dimension()
    }
    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, GatewayError> {
        let mut guard = DropGuard(Some(self.dropped.clone()));
        tokio::time::sleep(self.delay).await;
        let vectors = self.inner.embed(texts).await;
        guard.0 = None;
        self.finished.fetch_add(1, Ordering::SeqCst);
        vectors
    }
}

/// The real model behind a 5 s delay; `finished` counts embeddings that completed.
async fn slow_model(finished: Arc<AtomicUsize>) -> Arc<SlowEmbedder> {
    Arc::new(SlowEmbedder {
        delay: Duration::from_secs(5),
        inner: model().await,
        finished,
        dropped: Arc::new(AtomicUsize::new(0)),
    })
}

/// An embedder that always fails (fault injector).
struct FailingEmbedder;

#[async_trait]
impl Embedder for FailingEmbedder {
    fn model_id(&self) -> &str {
        MODEL_ID
    }
    fn dimension(&self) -> usize {
        MODEL_DIMENSION
    }
    async fn embed(&self, _texts: Vec<String>) -> Result<Vec<Vec<f32>>, GatewayError> {
        Err(GatewayError::Embedder(
            "injected embedder failure".to_owned(),
        ))
    }
}

/// A vector store whose searches fail (fault injector); everything else is the real store.
struct FailingSearchVectors(Arc<dyn VectorStore>);

#[async_trait]
impl VectorStore for FailingSearchVectors {
    fn name(&self) -> &'static str {
        "failing-search"
    }
    async fn close(&self) -> Result<(), GatewayError> {
        self.0.close().await
    }
    fn dimension(&self) -> usize {
        self.0.dimension()
    }
    fn location(&self) -> String {
        self.0.location()
    }
    async fn indexed_fields(&self) -> Result<Vec<String>, GatewayError> {
        self.0.indexed_fields().await
    }
    async fn ensure_indexes(
        &self,
        fields: &[(String, gateways::FieldKind)],
    ) -> Result<(), GatewayError> {
        self.0.ensure_indexes(fields).await
    }
    async fn bucket_points(
        &self,
        bucket: u16,
        vectors: bool,
    ) -> Result<Vec<gateways::vectors::Held>, GatewayError> {
        self.0.bucket_points(bucket, vectors).await
    }
    async fn bucket_current(&self, bucket: u16) -> Result<usize, GatewayError> {
        self.0.bucket_current(bucket).await
    }
    async fn bucket_counts(&self) -> Result<std::collections::HashMap<u16, usize>, GatewayError> {
        self.0.bucket_counts().await
    }
    async fn ensure_present(&self, create: bool) -> Result<bool, GatewayError> {
        self.0.ensure_present(create).await
    }
    async fn backup_to(
        &self,
        target: &std::path::Path,
    ) -> Result<gateways::vectors::StoreBackup, GatewayError> {
        self.0.backup_to(target).await
    }
    async fn scroll_all(
        &self,
        after: Option<Uuid>,
        limit: usize,
    ) -> Result<(Vec<gateways::vectors::StoredPoint>, Option<Uuid>), GatewayError> {
        self.0.scroll_all(after, limit).await
    }
    async fn put_points(
        &self,
        points: Vec<gateways::vectors::StoredPoint>,
    ) -> Result<(), GatewayError> {
        self.0.put_points(points).await
    }
    async fn vectors(&self, ids: &[Uuid]) -> Result<Vec<Option<Vec<f32>>>, GatewayError> {
        self.0.vectors(ids).await
    }
    async fn upsert(&self, points: Vec<VectorPoint>) -> Result<(), GatewayError> {
        self.0.upsert(points).await
    }
    async fn revision_points(&self, revision_id: Uuid) -> Result<RevisionPoints, GatewayError> {
        self.0.revision_points(revision_id).await
    }
    async fn set_current(
        &self,
        dataset: &str,
        source_key: &str,
        keep: Option<Uuid>,
        head_at: i64,
    ) -> Result<(), GatewayError> {
        self.0.set_current(dataset, source_key, keep, head_at).await
    }
    async fn source_current(&self, dataset: &str, source_key: &str) -> Result<usize, GatewayError> {
        self.0.source_current(dataset, source_key).await
    }
    async fn set_readers(
        &self,
        dataset: &str,
        source_key: &str,
        readers: &[String],
    ) -> Result<(), GatewayError> {
        self.0.set_readers(dataset, source_key, readers).await
    }
    async fn readers_held(
        &self,
        dataset: &str,
        source_key: &str,
        readers: &[String],
    ) -> Result<(usize, usize), GatewayError> {
        self.0.readers_held(dataset, source_key, readers).await
    }
    async fn retire_revision(&self, revision_id: Uuid) -> Result<(), GatewayError> {
        self.0.retire_revision(revision_id).await
    }
    async fn delete_points(&self, selector: gateways::PointSelector) -> Result<(), GatewayError> {
        self.0.delete_points(selector).await
    }
    async fn count_points(&self, selector: gateways::PointSelector) -> Result<usize, GatewayError> {
        self.0.count_points(selector).await
    }
    async fn search(
        &self,
        _vector: Vec<f32>,
        _datasets: &[String],
        _filter: Option<&gateways::PayloadFilter>,
        _limit: usize,
    ) -> Result<Vec<VectorHit>, GatewayError> {
        Err(GatewayError::Unavailable {
            store: "failing-search",
            message: "injected search failure".to_owned(),
        })
    }
    async fn search_any(
        &self,
        vector: Vec<f32>,
        datasets: &[String],
        filter: Option<&gateways::PayloadFilter>,
        limit: usize,
    ) -> Result<Vec<VectorHit>, GatewayError> {
        self.search(vector, datasets, filter, limit).await
    }
    async fn search_within(
        &self,
        vector: Vec<f32>,
        datasets: &[String],
        _revisions: &[Uuid],
        _any_revision: bool,
        limit: usize,
    ) -> Result<Vec<VectorHit>, GatewayError> {
        self.search(vector, datasets, None, limit).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_search_binds_to_current_revisions_and_finds_pending_ones_lexically() {
    let world = world().await;
    let accepted = world.project(corpus("docs")).await;
    let searcher = world.searcher(model().await, 8);

    let answer = searcher
        .search(query(
            "someone performing music on stage",
            Mode::Auto,
            5_000,
        ))
        .await
        .expect("search");
    assert_eq!(answer.mode, Answered::Hybrid);
    assert!(!answer.degraded, "{answer:?}");
    assert_eq!(answer.results[0].source_key, "guitar", "{answer:?}");
    assert_eq!(answer.results[0].score_kind, "rrf");
    assert_eq!(answer.results[0].projection_state, "searchable");
    assert_eq!(
        answer.results[0].source_revision_id,
        accepted[0].source_revision_id
    );
    assert!(answer.phases.embed.is_some() && answer.phases.lexical.is_some());
    // One result per source: as many distinct sources as results.
    let sources: HashSet<_> = answer.results.iter().map(|r| &r.source_key).collect();
    assert_eq!(sources.len(), answer.results.len(), "{:?}", answer.results);

    let vector = searcher
        .search(query("baking with yeast", Mode::Vector, 5_000))
        .await
        .expect("vector search");
    assert_eq!(vector.mode, Answered::Vector);
    assert_eq!(vector.results[0].source_key, "bread");
    assert_eq!(vector.results[0].score_kind, "cosine");
    assert_eq!(vector.results.len(), 5);
    assert!(vector.results[0].chunk_index.is_some());

    // Superseded: the old revision's text is gone from every mode; the new one is found
    // lexically at once (pending) and by vector after projection.
    let updated = world
        .accept(vec![put(
            "docs",
            "bread",
            "Rye crackers are baked flat and crisp without any rising.",
        )])
        .await;
    for mode in [Mode::Auto, Mode::Vector, Mode::Lexical] {
        let answer = searcher
            .search(query("sourdough wild yeast ferments", mode, 5_000))
            .await
            .expect("search");
        for result in &answer.results {
            assert_ne!(
                result.source_revision_id, accepted[4].source_revision_id,
                "{mode:?} returned a superseded revision"
            );
        }
    }
    let lexical = searcher
        .search(query("rye crackers", Mode::Lexical, 5_000))
        .await
        .expect("lexical");
    assert_eq!(
        lexical.results[0].source_revision_id,
        updated[0].source_revision_id
    );
    assert_eq!(lexical.results[0].projection_state, "pending");
    assert_eq!(lexical.results[0].score_kind, "bm25");

    // Deleted: never again, in any mode.
    world.accept(vec![delete("docs", "guitar")]).await;
    for mode in [Mode::Auto, Mode::Vector, Mode::Lexical] {
        let answer = searcher
            .search(query("a man playing guitar on stage", mode, 5_000))
            .await
            .expect("search");
        assert!(
            answer.results.iter().all(|r| r.source_key != "guitar"),
            "{mode:?} returned a deleted source: {answer:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_failing_vector_phase_falls_back_to_lexical_within_the_budget() {
    let world = world().await;
    world.project(corpus("docs")).await;
    let finished = Arc::new(AtomicUsize::new(0));
    let slow = slow_model(finished.clone()).await;
    let dropped = slow.dropped.clone();
    let searcher = world.searcher(slow, 8);
    let started = Instant::now();
    let answer = searcher
        .search(query("volcano lava village", Mode::Auto, 400))
        .await
        .expect("search");
    let elapsed = started.elapsed();
    assert_eq!(answer.mode, Answered::LexicalFallback);
    assert!(answer.degraded);
    assert_eq!(answer.degradations, ["vector_timeout"]);
    assert_eq!(answer.results[0].source_key, "volcano");
    assert_eq!(answer.results[0].score_kind, "bm25");
    assert!(
        elapsed < Duration::from_millis(400 + 250),
        "answered after {elapsed:?} on a 400 ms budget"
    );
    // The vector phase was cancelled at its deadline: the embedding's future was dropped (a
    // drop guard counts it), long before its 5 s delay could end, and it never finished.
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the slow embedding was not cancelled when the search answered"
    );
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "work outlived the deadline"
    );

    let failing = world.searcher(Arc::new(FailingEmbedder), 8);
    let answer = failing
        .search(query("volcano lava village", Mode::Auto, 2_000))
        .await
        .expect("search");
    assert_eq!(answer.mode, Answered::LexicalFallback);
    assert_eq!(answer.degradations, ["embed_error"]);

    let broken_store = world.searcher_with(
        model().await,
        Arc::new(FailingSearchVectors(world.vectors.clone())),
        8,
    );
    let answer = broken_store
        .search(query("volcano lava village", Mode::Auto, 2_000))
        .await
        .expect("search");
    assert_eq!(answer.mode, Answered::LexicalFallback);
    assert_eq!(answer.degradations, ["vector_error"]);
    assert_eq!(answer.results[0].source_key, "volcano");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_or_stopped_qdrant_server_degrades_to_lexical_within_the_budget() {
    let mut server = QdrantServer::start().expect("start qdrant");
    let world = world_on(Some(&server)).await;
    world.project(corpus("docs")).await;
    let searcher = world.searcher(model().await, 8);
    let answer = searcher
        .search(query("volcano lava village", Mode::Auto, 2_000))
        .await
        .expect("search");
    assert_eq!(answer.mode, Answered::Hybrid, "{answer:?}");
    assert_eq!(answer.results[0].source_key, "volcano");

    // Paused (SIGSTOP): the connection stays open and nothing answers. The vector phase ends
    // at its share of the budget, and lexical answers.
    server.pause();
    for _ in 0..2 {
        let started = Instant::now();
        let answer = searcher
            .search(query("volcano lava village", Mode::Auto, 400))
            .await
            .expect("search");
        let elapsed = started.elapsed();
        assert_eq!(answer.mode, Answered::LexicalFallback, "{answer:?}");
        assert_eq!(answer.degradations, ["vector_timeout"]);
        assert_eq!(answer.results[0].source_key, "volcano");
        assert!(
            elapsed < Duration::from_millis(400 + 250),
            "answered after {elapsed:?} on a 400 ms budget"
        );
    }
    server.resume();
    let answer = searcher
        .search(query("volcano lava village", Mode::Auto, 2_000))
        .await
        .expect("search");
    assert_eq!(answer.mode, Answered::Hybrid, "{answer:?}");

    // Stopped: refused connections are a vector error, answered lexically at once.
    server.stop();
    let started = Instant::now();
    let answer = searcher
        .search(query("volcano lava village", Mode::Auto, 1_000))
        .await
        .expect("search");
    assert_eq!(answer.mode, Answered::LexicalFallback, "{answer:?}");
    assert!(
        answer.degradations == ["vector_error"] || answer.degradations == ["vector_timeout"],
        "{answer:?}"
    );
    assert_eq!(answer.results[0].source_key, "volcano");
    assert!(started.elapsed() < Duration::from_millis(1_000 + 250));
    // And back: the same searcher is hybrid again once the server is.
    server.start_again().expect("restart");
    let answer = searcher
        .search(query("volcano lava village", Mode::Auto, 5_000))
        .await
        .expect("search");
    assert_eq!(answer.mode, Answered::Hybrid, "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_ends_in_search_timeout_when_no_phase_can_answer() {
    let world = world().await;
    world.accept(corpus("docs")).await;
    let finished = Arc::new(AtomicUsize::new(0));
    let slow = slow_model(finished.clone()).await;
    let searcher = world.searcher(slow, 8);
    world.faults.arm(FaultPoint::SlowLexical);
    let started = Instant::now();
    match searcher.search(query("volcano", Mode::Auto, 300)).await {
        Err(SearchError::Timeout {
            budget_ms,
            degradations,
        }) => {
            assert_eq!(budget_ms, 300);
            assert_eq!(degradations, ["vector_timeout", "lexical_timeout"]);
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_millis(300 + 250),
        "answered after {elapsed:?} on a 300 ms budget"
    );
    // The lexical query was interrupted inside SQLite: the ledger answers at once afterwards.
    let again = Instant::now();
    let answer = searcher
        .search(query("volcano", Mode::Lexical, 2_000))
        .await
        .expect("lexical search after the interrupted one");
    assert_eq!(answer.results[0].source_key, "volcano");
    assert!(again.elapsed() < Duration::from_millis(500));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "work outlived the deadline"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn searches_beyond_the_queue_are_refused_at_once_and_queued_ones_when_too_late() {
    let world = world().await;
    world.accept(corpus("docs")).await;
    let slow = slow_model(Arc::new(AtomicUsize::new(0))).await;
    // One slot, two places in the queue; each search holds its slot for 75% of 1 s.
    let searcher = Arc::new(world.searcher_queued(slow, 1, 2));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let searcher = searcher.clone();
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let outcome = searcher.search(query("volcano", Mode::Auto, 1_000)).await;
            (outcome, started.elapsed())
        }));
    }
    let (mut answered, mut refused_at_once, mut refused_after_waiting) = (0, 0, 0);
    for task in tasks {
        match task.await.expect("join") {
            (Ok(answer), _) => {
                assert_eq!(answer.mode, Answered::LexicalFallback);
                answered += 1;
            }
            (Err(SearchError::Overloaded { limit, .. }), elapsed) => {
                assert_eq!(limit, 1);
                if elapsed < Duration::from_millis(100) {
                    refused_at_once += 1;
                } else {
                    // Queued, and refused once a slot could no longer leave the vector phase
                    // its minimum: at 75% of the budget less that minimum, not at the end.
                    assert!(
                        elapsed >= Duration::from_millis(600)
                            && elapsed < Duration::from_millis(900),
                        "refused after {elapsed:?}"
                    );
                    refused_after_waiting += 1;
                }
            }
            (Err(other), _) => panic!("unexpected {other}"),
        }
    }
    assert_eq!(
        (answered, refused_at_once, refused_after_waiting),
        (1, 3, 2)
    );
    // Permits and queue places come back: the next search runs.
    assert!(searcher
        .search(query("volcano", Mode::Lexical, 1_000))
        .await
        .is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_larger_than_the_slots_is_answered_from_the_queue() {
    let world = world().await;
    world.accept(corpus("docs")).await;
    // One slot and room for the whole burst: every search waits its turn and is answered
    // within its budget (without the queue, 31 of 32 would be refused).
    let searcher = Arc::new(world.searcher_queued(model().await, 1, 64));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let searcher = searcher.clone();
        tasks.push(tokio::spawn(async move {
            searcher
                .search(query("volcano", Mode::Lexical, 3_000))
                .await
        }));
    }
    let mut waited = 0;
    for task in tasks {
        let answer = task.await.expect("join").expect("answered from the queue");
        assert_eq!(answer.results[0].source_key, "volcano");
        waited += usize::from(answer.phases.admission.is_some());
    }
    assert!(waited >= 1, "no search waited for a slot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn searches_during_supersedes_and_deletes_never_return_a_retired_revision() {
    let world = world().await;
    let keys: Vec<String> = (0..12).map(|n| format!("doc-{n}")).collect();
    let texts = |round: usize, key: &str| {
        format!(
            "Revision {round} of {key}: volcanic lava and sourdough bread and guitar music \
             with {} extra words",
            round * 7
        )
    };
    let accepted = world
        .project(
            keys.iter()
                .map(|key| put("docs", key, &texts(0, key)))
                .collect(),
        )
        .await;
    // revision -> when it stopped being current (recorded after the acceptance returned).
    let retired: Arc<Mutex<HashMap<Uuid, Instant>>> = Arc::default();
    let (stop_worker, worker) = world.start_worker();
    let updater = {
        let ledger = world.ledger.clone();
        let retired = retired.clone();
        let keys = keys.clone();
        let mut heads: HashMap<String, Uuid> = keys
            .iter()
            .cloned()
            .zip(accepted.iter().map(|a| a.source_revision_id))
            .collect();
        tokio::spawn(async move {
            for round in 1..=6 {
                for (index, key) in keys.iter().enumerate() {
                    let submission = if (index + round) % 5 == 0 {
                        delete("docs", key)
                    } else {
                        put("docs", key, &texts(round, key))
                    };
                    let mut results = ledger.accept(vec![submission]).await;
                    let acceptance = results.pop().expect("one result").expect("accepted");
                    if acceptance.status == receipts::AcceptStatus::QueuedNotConfirmed {
                        let old = heads.insert(key.clone(), acceptance.source_revision_id);
                        if let Some(old) = old {
                            retired.lock().expect("lock").insert(old, Instant::now());
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
            }
        })
    };
    let searcher = Arc::new(world.searcher(model().await, 16));
    let mut checked = 0;
    let mut round = 0;
    // Per mode: results returned, and hits the binding dropped as no longer current.
    let mut results_by_mode: HashMap<&str, usize> = HashMap::new();
    let mut vector_stale_dropped = 0;
    while !updater.is_finished() {
        let mode = [Mode::Auto, Mode::Vector, Mode::Lexical][round % 3];
        round += 1;
        let started = Instant::now();
        let answer = searcher
            .search(Query {
                top_k: 12,
                ..query("volcanic lava sourdough guitar", mode, 5_000)
            })
            .await
            .expect("search");
        *results_by_mode.entry(mode.as_str()).or_default() += answer.results.len();
        if mode == Mode::Vector {
            vector_stale_dropped += answer.stale_dropped;
        }
        let retired = retired.lock().expect("lock").clone();
        for result in &answer.results {
            if let Some(when) = retired.get(&result.source_revision_id) {
                assert!(
                    *when >= started,
                    "{mode:?} returned revision {} of {}, retired before the search began",
                    result.source_revision_id,
                    result.source_key
                );
            }
            checked += 1;
        }
    }
    updater.await.expect("updater");
    let _ = stop_worker.send(true);
    worker.await.expect("worker");
    assert!(round >= 10, "only {round} searches ran");
    assert!(checked > 50, "only {checked} results were checked");
    for mode in ["auto", "vector", "lexical"] {
        assert!(
            results_by_mode.get(mode).copied().unwrap_or(0) > 0,
            "{mode} mode returned nothing during the churn: {results_by_mode:?}"
        );
    }
    // The binding itself was exercised: vector hits of superseded revisions were dropped.
    assert!(
        vector_stale_dropped > 0,
        "no vector hit was dropped as stale: the binding was never tested"
    );
}

async fn call(
    router: &axum::Router,
    token: &str,
    body: serde_json::Value,
) -> (u16, Option<String>, serde_json::Value) {
    use tower::ServiceExt;
    let request = axum::http::Request::post("/v1/search")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .expect("request");
    let response = router.clone().oneshot(request).await.expect("response");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .expect("body")
        .to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, retry_after, value)
}

async fn token(
    ledger: &Arc<dyn Ledger>,
    scopes: Vec<receipts::Scope>,
    datasets: Option<Vec<&str>>,
) -> String {
    ledger
        .create_token(receipts::auth::NewToken {
            name: "search-test".to_owned(),
            scopes,
            datasets: datasets.map(|names| names.into_iter().map(str::to_owned).collect()),
            identity: None,
            created_by: "test".to_owned(),
            expires_at: None,
        })
        .await
        .expect("token")
        .secret
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_checks_tokens_datasets_and_parameters_in_every_mode() {
    use receipts::Scope;
    use serde_json::json;
    let world = world().await;
    let mut documents = corpus("alpha");
    documents.extend(corpus("beta"));
    world.project(documents).await;
    let router = search::router(
        world.ledger.clone(),
        Arc::new(world.searcher(model().await, 8)),
    );
    let alpha_only = token(&world.ledger, vec![Scope::Search], Some(vec!["alpha"])).await;
    let everything = token(&world.ledger, vec![Scope::Search], None).await;
    let ingest_only = token(&world.ledger, vec![Scope::Ingest], None).await;

    for mode in ["auto", "vector", "lexical"] {
        let (status, _, answer) = call(
            &router,
            &alpha_only,
            json!({"query": "lava from a volcano", "mode": mode, "top_k": 20}),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        let results = answer["results"].as_array().expect("results");
        assert!(!results.is_empty(), "{mode}: {answer}");
        assert!(
            results.iter().all(|r| r["dataset"] == "alpha"),
            "{mode} leaked another dataset: {answer}"
        );
        let (status, _, error) = call(
            &router,
            &alpha_only,
            json!({"query": "lava", "mode": mode, "datasets": ["beta"]}),
        )
        .await;
        assert_eq!((status, error["code"].as_str()), (403, Some("forbidden")));
        // The unrestricted token sees both datasets.
        let (_, _, answer) = call(
            &router,
            &everything,
            json!({"query": "lava from a volcano", "mode": mode, "top_k": 20}),
        )
        .await;
        let datasets: std::collections::HashSet<_> = answer["results"]
            .as_array()
            .expect("results")
            .iter()
            .filter_map(|r| r["dataset"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(datasets.len(), 2, "{mode}: {answer}");
    }

    let (status, _, error) = call(&router, &ingest_only, json!({"query": "lava"})).await;
    assert_eq!((status, error["code"].as_str()), (403, Some("forbidden")));
    let (status, _, error) = call(&router, "cairn_wrong", json!({"query": "lava"})).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (401, Some("unauthenticated"))
    );

    for (body, code) in [
        (json!({"query": "   "}), "invalid_query"),
        (json!({"query": "x".repeat(2001)}), "invalid_query"),
        (json!({"query": "lava", "top_k": 0}), "invalid_top_k"),
        (json!({"query": "lava", "top_k": 101}), "invalid_top_k"),
        (json!({"query": "lava", "budget_ms": 0}), "invalid_budget"),
        (
            json!({"query": "lava", "budget_ms": 30_001}),
            "invalid_budget",
        ),
        (json!({"query": "lava", "mode": "fuzzy"}), "invalid_mode"),
        (json!({"query": "lava", "datasets": []}), "invalid_datasets"),
        (json!({"query": "lava", "colour": "red"}), "invalid_json"),
        (json!({"query": 7}), "invalid_json"),
        // Hostile filters: each refused with its own code, naming the part at fault.
        (
            json!({"query": "lava", "filter": {"field": "colour", "eq": "red"}}),
            "filter_unknown_field",
        ),
        (
            json!({"query": "lava", "filter": {"field": "tags", "any": "red"}}),
            "filter_wrong_type",
        ),
        (
            json!({"query": "lava", "filter": {"field": "source_key", "eq": "a\u{0}b"}}),
            "filter_wrong_type",
        ),
        (
            json!({"query": "lava", "filter": {"field": "metadata.n", "gt": 5, "lt": 3}}),
            "filter_empty_range",
        ),
        (
            json!({"query": "lava", "filter": {"field": "accepted_at", "gte": 1e300}}),
            "filter_wrong_type",
        ),
        (json!({"query": "lava", "filter": []}), "filter_shape"),
        (
            json!({"query": "lava", "filter": {"field": "source_key", "in": vec!["k"; 10_000]}}),
            "filter_too_large",
        ),
        (
            json!({"query": "lava", "filter": (0..60).fold(
                json!({"field": "tags", "any": ["x"]}),
                |inner, _| json!({"must": [inner]}),
            )}),
            "filter_too_deep",
        ),
    ] {
        let (status, _, error) = call(&router, &everything, body.clone()).await;
        assert_eq!(
            (status, error["code"].as_str()),
            (422, Some(code)),
            "{body} -> {error}"
        );
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
        if code.starts_with("filter_") {
            assert!(error["details"]["at"].is_string(), "{error}");
        }
    }
    // Facets through the API, beside a search and alone.
    let (status, _, answer) = call(
        &router,
        &everything,
        json!({"query": "lava", "mode": "lexical", "facets": ["media_type", "tags"]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["facets"][0]["field"], "media_type", "{answer}");
    assert_eq!(answer["facets"][0]["sources"], 12, "{answer}");
    assert_eq!(answer["facets"][1]["missing"], 12, "{answer}");
    for (body, code) in [
        (
            json!({"query": "lava", "facets": ["colour"]}),
            "facet_unknown_field",
        ),
        (
            json!({"query": "lava", "facets": ["tags", "tags"]}),
            "invalid_facets",
        ),
        (json!({"query": "lava", "facets": []}), "invalid_facets"),
        (
            json!({"query": "lava", "facets": vec!["tags"; 9]}),
            "invalid_facets",
        ),
        (
            json!({"query": "lava", "facets": ["tags"], "facet_values": 0}),
            "invalid_facets",
        ),
    ] {
        let (status, _, error) = call(&router, &everything, body.clone()).await;
        assert_eq!(
            (status, error["code"].as_str()),
            (422, Some(code)),
            "{body} -> {error}"
        );
    }
    let facets = |token: &str, path: &str| {
        let router = router.clone();
        let request = axum::http::Request::get(path)
            .header("authorization", format!("Bearer {token}"))
            .body(axum::body::Body::empty())
            .expect("request");
        async move {
            use tower::ServiceExt;
            let response = router.oneshot(request).await.expect("response");
            let status = response.status().as_u16();
            let bytes = http_body_util::BodyExt::collect(response.into_body())
                .await
                .expect("body")
                .to_bytes();
            (
                status,
                serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_default(),
            )
        }
    };
    let filter = urlencode(r#"{"field": "source_key", "in": ["volcano", "trains", "nothing"]}"#);
    let (status, answer) = facets(
        &alpha_only,
        &format!("/v1/datasets/alpha/facets?field=media_type,tags&filter={filter}"),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["facets"][0]["values"],
        json!([{"value": "text/plain", "count": 2}]),
        "{answer}"
    );
    assert_eq!(answer["facets"][0]["sources"], 2, "{answer}");
    let (status, error) = facets(&alpha_only, "/v1/datasets/beta/facets?field=tags").await;
    assert_eq!(
        (status, error["code"].as_str()),
        (403, Some("forbidden")),
        "{error}"
    );
    let (status, error) = facets(&everything, "/v1/datasets/alpha/facets?field=colour").await;
    assert_eq!(
        (status, error["code"].as_str()),
        (422, Some("facet_unknown_field")),
        "{error}"
    );
    let (status, error) = facets(
        &everything,
        "/v1/datasets/alpha/facets?field=tags&filter=%7Bnope",
    )
    .await;
    assert_eq!(
        (status, error["code"].as_str()),
        (422, Some("filter_shape")),
        "{error}"
    );
    let (status, error) = facets(&everything, "/v1/datasets/alpha/facets").await;
    assert_eq!(
        (status, error["code"].as_str()),
        (422, Some("invalid_query_parameters")),
        "{error}"
    );

    // The same filter in every mode, through the API.
    for mode in ["auto", "vector", "lexical"] {
        let (status, _, answer) = call(
            &router,
            &everything,
            json!({"query": "lava from a volcano", "mode": mode, "top_k": 20,
                   "filter": {"field": "source_key", "in": ["volcano", "trains"]}}),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        let keys: HashSet<&str> = answer["results"]
            .as_array()
            .expect("results")
            .iter()
            .filter_map(|r| r["source_key"].as_str())
            .collect();
        // Lexically only "volcano" has these words; by vector both are near enough.
        assert!(keys.contains("volcano"), "{mode}: {answer}");
        assert!(
            keys.is_subset(&HashSet::from(["volcano", "trains"])),
            "{mode}: {answer}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overload_and_timeout_have_their_own_statuses() {
    use receipts::Scope;
    use serde_json::json;
    let world = world().await;
    world.accept(corpus("docs")).await;
    let slow = slow_model(Arc::new(AtomicUsize::new(0))).await;
    // No queue: a second search is refused while the first holds the only slot.
    let router = search::router(
        world.ledger.clone(),
        Arc::new(world.searcher_queued(slow, 1, 0)),
    );
    let secret = token(&world.ledger, vec![Scope::Search], None).await;
    let first = {
        let router = router.clone();
        let secret = secret.clone();
        tokio::spawn(async move {
            call(
                &router,
                &secret,
                json!({"query": "volcano", "budget_ms": 800}),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (status, retry_after, error) = call(
        &router,
        &secret,
        json!({"query": "volcano", "budget_ms": 800}),
    )
    .await;
    assert_eq!((status, error["code"].as_str()), (429, Some("overloaded")));
    assert_eq!(retry_after.as_deref(), Some("1"));
    let (status, _, answer) = first.await.expect("join");
    assert_eq!(status, 200);
    assert_eq!(answer["mode"], "lexical_fallback");
    assert_eq!(answer["degraded"], true);
    assert_eq!(answer["degradations"], json!(["vector_timeout"]));
    for key in ["results", "stale_dropped", "took_ms", "phases", "budget_ms"] {
        assert!(answer.get(key).is_some(), "missing {key}: {answer}");
    }

    world.faults.arm(FaultPoint::SlowLexical);
    let (status, retry_after, error) = call(
        &router,
        &secret,
        json!({"query": "volcano", "budget_ms": 300}),
    )
    .await;
    assert_eq!(
        (status, error["code"].as_str()),
        (504, Some("search_timeout")),
        "{error}"
    );
    assert_eq!(retry_after, None);
    assert_eq!(
        error["details"]["degradations"],
        json!(["vector_timeout", "lexical_timeout"])
    );
}

/// A put with tags and metadata.
fn tagged(dataset: &str, key: &str, text: &str, tags: &[&str], n: i64) -> receipts::Submission {
    let mut submission = put(dataset, key, text);
    if let receipts::Change::Put(document) = &mut submission.change {
        document.tags = tags.iter().map(|tag| (*tag).to_owned()).collect();
        document.metadata.insert("n".to_owned(), n.into());
    }
    submission
}

/// The harbour corpus: 24 sources that all mention harbours, under `east/` and `west/`,
/// tagged `even` or `odd`, numbered in `metadata.n`.
fn harbour() -> Vec<(String, Vec<&'static str>, i64, receipts::Submission)> {
    const SHIPS: [&str; 6] = ["ferry", "trawler", "tanker", "yacht", "tug", "schooner"];
    (0..24i64)
        .map(|n| {
            let key = format!("{}/{n:02}", if n < 12 { "east" } else { "west" });
            let tags = vec![if n % 2 == 0 { "even" } else { "odd" }];
            let ship = SHIPS[(n % 6) as usize];
            let text = format!(
                "Harbour log {n}: a {ship} moored in the harbour at dawn and left with the tide."
            );
            let submission = tagged("ports", &key, &text, &tags, n);
            (key, tags, n, submission)
        })
        .collect()
}

/// Which sources of the harbour corpus a filter selects, from their key, tags and number.
type Expected = fn(&str, &[&str], i64) -> bool;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_hold_in_every_mode_and_at_binding_and_fill_the_page() {
    use receipts::filter::{Filter, FilterLimits};
    use serde_json::json;
    let world = world().await;
    let corpus = harbour();
    let accepted = world
        .project(corpus.iter().map(|(.., s)| s.clone()).collect())
        .await;
    let before_edit = receipts::Clock::now_micros(&SystemClock);
    // Narrowed to the filter's revisions and searched exactly, or (bound 0) the index
    // searched and binding left to drop what does not match.
    let narrowing = world.searcher(model().await, 8);
    let binding_only = Searcher::new(
        world.ledger.clone(),
        Some(VectorSide {
            embedders: Arc::new(gateways::OneModel(model().await)),
            stores: world.stores(world.vectors.clone()),
        }),
        SearchSettings {
            filter_max_narrowing: 0,
            ..SearchSettings::default()
        },
    );
    let cases: [(serde_json::Value, Expected); 5] = [
        (
            json!({"field": "source_key", "prefix": "west/"}),
            |key, _, _| key.starts_with("west/"),
        ),
        (json!({"field": "tags", "any": ["even"]}), |_, tags, _| {
            tags.contains(&"even")
        }),
        (
            json!({"must": [{"field": "metadata.n", "gte": 5}, {"field": "metadata.n", "lt": 9}],
                   "must_not": [{"field": "tags", "any": ["odd"]}]}),
            |_, tags, n| (5..9).contains(&n) && !tags.contains(&"odd"),
        ),
        (json!({"field": "metadata.n", "eq": 17}), |_, _, n| n == 17),
        (
            json!({"should": [{"field": "source_key", "glob": "east/0?"},
                              {"field": "metadata.n", "in": [23, 22]}]}),
            |key, _, n| key.starts_with("east/0") || n >= 22,
        ),
    ];
    for (filter, expected) in &cases {
        let parsed = Filter::parse(filter, FilterLimits::default()).expect("filter");
        let matching: HashSet<&str> = corpus
            .iter()
            .filter(|(key, tags, n, _)| expected(key, tags, *n))
            .map(|(key, ..)| key.as_str())
            .collect();
        assert!(
            !matching.is_empty(),
            "{filter}: a case that selects nothing"
        );
        for searcher in [&narrowing, &binding_only] {
            for mode in [Mode::Auto, Mode::Vector, Mode::Lexical] {
                let mut asked = query("a ship moored in the harbour", mode, 10_000);
                asked.filter = Some(parsed.clone());
                let answer = searcher.search(asked).await.expect("search");
                // Narrowed searches drop nothing; the index searched alone leaves binding to
                // drop what does not match, counted as stale.
                let allowed: &[&str] = if std::ptr::eq(searcher, &narrowing) {
                    &[]
                } else {
                    &["stale_dropped"]
                };
                assert!(
                    answer
                        .degradations
                        .iter()
                        .all(|d| allowed.contains(&d.as_str())),
                    "{mode:?} {filter}: {answer:?}"
                );
                let found: HashSet<&str> = answer
                    .results
                    .iter()
                    .map(|r| r.source_key.as_str())
                    .collect();
                assert!(
                    found.is_subset(&matching),
                    "{mode:?} {filter}: {found:?} is not within {matching:?}"
                );
                // Full whenever enough sources match: a filter never costs recall.
                assert_eq!(
                    found.len(),
                    matching.len().min(5),
                    "{mode:?} {filter}: {found:?} of {matching:?}"
                );
            }
        }
    }

    // A metadata field the store holds no index for is named in the answer; once declared
    // (indexed), it is not.
    let on_n = Filter::parse(
        &json!({"field": "metadata.n", "gte": 5}),
        FilterLimits::default(),
    )
    .expect("filter");
    let mut asked = query("a ship moored in the harbour", Mode::Vector, 10_000);
    asked.filter = Some(on_n.clone());
    let answer = narrowing.search(asked.clone()).await.expect("search");
    assert_eq!(answer.filter_unindexed, vec!["metadata.n"], "{answer:?}");
    world
        .vectors
        .ensure_indexes(&[("metadata.n".to_owned(), gateways::FieldKind::Float)])
        .await
        .expect("index metadata.n");
    let answer = narrowing.search(asked).await.expect("search");
    assert!(answer.filter_unindexed.is_empty(), "{answer:?}");
    assert_eq!(answer.results.len(), 5, "{answer:?}");

    // Facets beside a search: over every source the filter selects, not the page of 5.
    let mut asked = query("a ship moored in the harbour", Mode::Auto, 10_000);
    asked.filter = Some(
        Filter::parse(
            &json!({"field": "source_key", "prefix": "west/"}),
            FilterLimits::default(),
        )
        .expect("filter"),
    );
    asked.facets = Some(search::facets::FacetRequest {
        fields: vec![
            receipts::filter::facets::FacetField::Tags,
            receipts::filter::facets::FacetField::Metadata("n".to_owned()),
        ],
        values: 3,
    });
    let answer = narrowing.search(asked).await.expect("search with facets");
    assert_eq!(answer.results.len(), 5);
    assert!(answer.facets_partial.is_empty(), "{answer:?}");
    let counts = serde_json::to_value(&answer.facets).expect("json");
    assert_eq!(
        counts,
        json!([
            {"field": "tags", "sources": 12, "missing": 0, "truncated": false, "exact": true,
             "values": [{"value": "even", "count": 6}, {"value": "odd", "count": 6}]},
            {"field": "metadata.n", "sources": 12, "missing": 0, "truncated": true, "exact": true,
             "values": [{"value": 12.0, "count": 1}, {"value": 13.0, "count": 1},
                        {"value": 14.0, "count": 1}]}
        ]),
        "{counts}"
    );

    // A source whose tags changed: its new revision (pending, not yet projected) no longer
    // matches, and its old points, still in the store, are dropped at binding.
    let edited = world
        .accept(vec![tagged(
            "ports",
            "west/17",
            "Harbour log 17: a tug moored in the harbour at dawn and left with the tide.",
            &["retired"],
            17,
        )])
        .await;
    let seventeen = Filter::parse(
        &json!({"field": "metadata.n", "eq": 17}),
        FilterLimits::default(),
    )
    .expect("filter");
    let odd = Filter::parse(
        &json!({"field": "tags", "any": ["odd"]}),
        FilterLimits::default(),
    )
    .expect("filter");
    for searcher in [&narrowing, &binding_only] {
        for mode in [Mode::Auto, Mode::Vector, Mode::Lexical] {
            let mut asked = query("a tug moored in the harbour", mode, 10_000);
            asked.filter = Some(odd.clone());
            asked.top_k = 20;
            let answer = searcher.search(asked).await.expect("search");
            assert!(
                answer.results.iter().all(|r| r.source_key != "west/17"),
                "{mode:?}: a source that no longer matches: {answer:?}"
            );
            assert_eq!(answer.results.len(), 11, "{mode:?}: {answer:?}");
            // The same source, matched by a field that did not change, is its new revision
            // (lexically, while it is pending) or nothing: never the old one.
            let mut asked = query("a tug moored in the harbour", mode, 10_000);
            asked.filter = Some(seventeen.clone());
            let answer = searcher.search(asked).await.expect("search");
            for result in &answer.results {
                assert_eq!(
                    result.source_revision_id, edited[0].source_revision_id,
                    "{mode:?}: {answer:?}"
                );
            }
            // At a time before the edit, the filter applies to the revision that held then.
            let mut asked = query("a tug moored in the harbour", mode, 10_000);
            asked.filter = Some(odd.clone());
            asked.top_k = 20;
            asked.at = Some(receipts::validity::At {
                valid_at: before_edit,
                as_of: before_edit,
            });
            let answer = searcher.search(asked).await.expect("search at");
            let old = &accepted[17];
            assert!(
                answer
                    .results
                    .iter()
                    .any(|r| r.source_revision_id == old.source_revision_id),
                "{mode:?}: the revision that held is not found: {answer:?}"
            );
            assert_eq!(answer.results.len(), 12, "{mode:?}: {answer:?}");
        }
    }
}

/// Who may read which document: a token that reads as an identity gets, in every mode and
/// from the facet counts, only the sources whose readers name it (or its groups), the page
/// still full; a revocation holds at the next query, before any store changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_holds_in_every_mode_and_a_revocation_at_the_next_query() {
    use receipts::access::{restrict, AccessChange, DefaultAccess};
    let world = world().await;
    let corpus = harbour();
    world
        .project(corpus.iter().map(|(.., s)| s.clone()).collect())
        .await;
    let change = |change: AccessChange| {
        let ledger = world.ledger.clone();
        async move { ledger.change_access(change).await.expect("access change") }
    };
    // A closed dataset: n % 3 == 0 is read by ana, other even n by the crew, the rest by
    // nobody (they name no readers).
    change(AccessChange::Dataset {
        dataset: "ports".to_owned(),
        default: DefaultAccess::Nobody,
        actor: "test".to_owned(),
        reason: "closed".to_owned(),
    })
    .await;
    for (key, _, n, _) in &corpus {
        let readers = if n % 3 == 0 {
            vec!["user:ana".to_owned()]
        } else if n % 2 == 0 {
            vec!["group:crew".to_owned()]
        } else {
            continue;
        };
        change(AccessChange::Source {
            dataset: "ports".to_owned(),
            source_key: key.clone(),
            readers: Some(readers),
            actor: "test".to_owned(),
            reason: "readers".to_owned(),
        })
        .await;
    }
    let narrowing = world.searcher(model().await, 8);
    let binding_only = Searcher::new(
        world.ledger.clone(),
        Some(VectorSide {
            embedders: Arc::new(gateways::OneModel(model().await)),
            stores: world.stores(world.vectors.clone()),
        }),
        SearchSettings {
            filter_max_narrowing: 0,
            ..SearchSettings::default()
        },
    );
    type Readable = fn(i64) -> bool;
    let identities: [(Vec<String>, Readable); 3] = [
        (vec!["user:ana".to_owned()], |n| n % 3 == 0),
        (vec!["user:bob".to_owned(), "group:crew".to_owned()], |n| {
            n % 2 == 0 && n % 3 != 0
        }),
        (vec!["user:eve".to_owned()], |_| false),
    ];
    for (names, may) in &identities {
        let readable: HashSet<&str> = corpus
            .iter()
            .filter(|(_, _, n, _)| may(*n))
            .map(|(key, ..)| key.as_str())
            .collect();
        for searcher in [&narrowing, &binding_only] {
            for mode in [Mode::Auto, Mode::Vector, Mode::Lexical] {
                let mut asked = query("a ship moored in the harbour", mode, 10_000);
                asked.filter = Some(restrict(None, names.clone()));
                asked.facets = Some(search::facets::FacetRequest {
                    fields: vec![receipts::filter::facets::FacetField::Tags],
                    values: 5,
                });
                let answer = searcher.search(asked).await.expect("search");
                let found: HashSet<&str> = answer
                    .results
                    .iter()
                    .map(|r| r.source_key.as_str())
                    .collect();
                assert!(
                    found.is_subset(&readable),
                    "{names:?} {mode:?}: {found:?} is not within {readable:?}"
                );
                assert_eq!(
                    found.len(),
                    readable.len().min(5),
                    "{names:?} {mode:?}: a short page {found:?}"
                );
                assert_eq!(
                    answer.facets.first().map(|facet| facet.sources),
                    Some(readable.len() as u64),
                    "{names:?} {mode:?}: facets count what may be read"
                );
            }
        }
    }
    // Revoked: ana loses east/00 and west/12 at once, though the stores are untouched.
    for key in ["east/00", "west/12"] {
        change(AccessChange::Source {
            dataset: "ports".to_owned(),
            source_key: key.to_owned(),
            readers: Some(vec!["user:bob".to_owned()]),
            actor: "test".to_owned(),
            reason: "revoked".to_owned(),
        })
        .await;
    }
    for searcher in [&narrowing, &binding_only] {
        for mode in [Mode::Auto, Mode::Vector, Mode::Lexical] {
            let mut asked = query("Harbour log 0: a ferry moored", mode, 10_000);
            asked.filter = Some(restrict(None, vec!["user:ana".to_owned()]));
            asked.top_k = 20;
            let answer = searcher.search(asked).await.expect("search");
            let found: HashSet<&str> = answer
                .results
                .iter()
                .map(|r| r.source_key.as_str())
                .collect();
            assert!(
                !found.contains("east/00") && !found.contains("west/12"),
                "{mode:?}: a revoked reader still sees {found:?}"
            );
            assert_eq!(
                found.len(),
                6,
                "{mode:?}: ana keeps the other six: {found:?}"
            );
        }
    }
}

/// One change of a source's readers as the flipper made it: the change took effect at some
/// instant between `before` and `after` (microseconds, the ledger's clock).
#[derive(Debug, Clone)]
struct Flip {
    readers: Vec<String>,
    before: i64,
    after: i64,
}

/// Sets `key`'s readers in the leak race's dataset, bracketed by the clock before and after.
async fn timed_flip(world: &World, key: &str, readers: Vec<String>, reason: &str) -> Flip {
    use receipts::Clock;
    let before = SystemClock.now_micros();
    world
        .ledger
        .change_access(receipts::access::AccessChange::Source {
            dataset: "docks".to_owned(),
            source_key: key.to_owned(),
            readers: Some(readers.clone()),
            actor: "test".to_owned(),
            reason: reason.to_owned(),
        })
        .await
        .expect("access change");
    Flip {
        readers,
        before,
        after: SystemClock.now_micros(),
    }
}

/// Whether some state of `flips` (a source's readers, in order) that admits `names` may
/// have been in force at some instant of `[start, end]`: a state holds from its change (at
/// the earliest, `before`) until the next change (at the latest, its `after`).
fn possibly_readable(flips: &[Flip], names: &[String], start: i64, end: i64) -> bool {
    flips.iter().enumerate().any(|(index, flip)| {
        let from = flip.before;
        let until = flips.get(index + 1).map_or(i64::MAX, |next| next.after);
        receipts::access::admits(Some(&flip.readers), names) && from <= end && until >= start
    })
}

/// The leak race: 16 clients reading as 8 identities search in every mode while a flipper
/// changes the readers of 1,000 documents as fast as the ledger takes it. No answer holds a
/// document that its caller could not read at any moment of its request, checked against
/// every change the flipper made (each bracketed by the clock before and after its call).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_answer_leaks_a_document_while_readers_change() {
    use receipts::access::{restrict, AccessChange, DefaultAccess};
    use receipts::Clock;
    let world = world().await;
    const DOCUMENTS: usize = 1000;
    const CARGO: [&str; 5] = ["timber", "grain", "coal", "salt", "wool"];
    let keys: Vec<String> = (0..DOCUMENTS).map(|n| format!("dock/{n:04}")).collect();
    world
        .project(
            keys.iter()
                .enumerate()
                .map(|(n, key)| {
                    let text = format!(
                        "Dock report {n}: crates of {} unloaded at the quay.",
                        CARGO[n % CARGO.len()]
                    );
                    put("docks", key, &text)
                })
                .collect(),
        )
        .await;
    world
        .ledger
        .change_access(AccessChange::Dataset {
            dataset: "docks".to_owned(),
            default: DefaultAccess::Nobody,
            actor: "test".to_owned(),
            reason: "closed".to_owned(),
        })
        .await
        .expect("close");
    let names: Vec<String> = (0..8)
        .map(|i| format!("user:p{i}"))
        .chain((0..4).map(|g| format!("group:g{g}")))
        .collect();
    let identities: Vec<Vec<String>> = (0..8)
        .map(|i| vec![format!("user:p{i}"), format!("group:g{}", i % 4)])
        .collect();
    let mut seed = 0x00AC_CE55_u64;
    let mut next = move |bound: usize| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        ((seed >> 33) as usize) % bound
    };
    // Up to two of the names, sorted, without repeats.
    fn random_readers(next: &mut impl FnMut(usize) -> usize, names: &[String]) -> Vec<String> {
        let mut readers: Vec<String> = (0..next(3))
            .map(|_| names[next(names.len())].clone())
            .collect();
        readers.sort();
        readers.dedup();
        readers
    }
    let mut flips: HashMap<String, Vec<Flip>> = HashMap::new();
    for key in &keys {
        let readers = random_readers(&mut next, &names);
        let flip = timed_flip(&world, key, readers, "initial").await;
        flips.insert(key.clone(), vec![flip]);
    }
    let searcher = Arc::new(world.searcher(model().await, 16));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for client in 0..16 {
        let searcher = searcher.clone();
        let stop = stop.clone();
        let who = identities[client % identities.len()].clone();
        clients.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            let mut round = 0usize;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let mode = [Mode::Auto, Mode::Vector, Mode::Lexical][(client + round) % 3];
                let text = format!("crates of {} at the quay", CARGO[round % CARGO.len()]);
                let mut asked = query(&text, mode, 10_000);
                asked.filter = Some(restrict(None, who.clone()));
                let start = SystemClock.now_micros();
                let answer = searcher.search(asked).await;
                let end = SystemClock.now_micros();
                let keys: Vec<String> = match answer {
                    Ok(answer) => answer.results.into_iter().map(|r| r.source_key).collect(),
                    Err(SearchError::Overloaded { .. }) => continue,
                    Err(error) => panic!("search failed: {error}"),
                };
                answers.push((who.clone(), start, end, keys));
            }
            answers
        }));
    }
    // The flipper: one change at a time, as fast as the ledger commits them, for 8 s.
    let flipping = Instant::now();
    let mut changes = 0usize;
    while flipping.elapsed() < Duration::from_secs(8) {
        let key = keys[next(keys.len())].clone();
        let readers = random_readers(&mut next, &names);
        let flip = timed_flip(&world, &key, readers, "flip").await;
        flips.entry(key).or_default().push(flip);
        changes += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let mut answered = 0usize;
    let mut returned = 0usize;
    for client in clients {
        for (who, start, end, found) in client.await.expect("client") {
            answered += 1;
            for key in found {
                returned += 1;
                let history = flips.get(&key).map(Vec::as_slice).unwrap_or_default();
                assert!(
                    possibly_readable(history, &who, start, end),
                    "{who:?} was answered {key}, which it could not read during its request \
                     [{start}, {end}]: {history:?}"
                );
            }
        }
    }
    assert!(changes > 500, "the flipper made only {changes} changes");
    assert!(
        answered > 100 && returned > 500,
        "too few answers to mean anything: {answered} answers, {returned} results"
    );
    eprintln!(
        "leak race: {changes} access changes, {answered} answers, {returned} results, no leak"
    );
}

/// Percent-encodes a query parameter's value.
fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}
