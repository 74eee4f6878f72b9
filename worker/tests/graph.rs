//! Graph jobs end to end, in process: a real SQLite ledger with the graph backend, the real
//! embedding model, qdrant-edge on disk, a real Bolt server (ArcadeDB with its Bolt plugin,
//! started per test) and leased workers. Links, tags and URLs reach the graph; a supersede
//! replaces them; a tombstone removes them with their orphans; and a graph outage never holds
//! up search: the graph job retries on its own and verifies after the restart.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gateways::embedder::{LocalEmbedder, ModelFiles, MODEL_DIMENSION, MODEL_ID};
use gateways::graph::links::LinkExtractor;
use gateways::{BoltGraphStore, Chunker, ChunkerSettings, EdgeVectorStore, GraphStore};
use receipts::policy::{JobPolicies, JobPolicy};
use receipts::{
    Backend, Generation, JobKind, JobState, Ledger, ReceiptState, SqliteLedger, SqliteOptions,
    Submission, SystemClock,
};
use testkit::conformance::{delete, put};
use testkit::graph::GraphServer;
use uuid::Uuid;
use worker::{GraphStage, Projector, Worker, WorkerConfig};

fn models_dir() -> PathBuf {
    std::env::var_os("CAIRN_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")))
}

struct World {
    ledger: Arc<dyn Ledger>,
    projector: Arc<Projector>,
    graph: Arc<BoltGraphStore>,
    stage: Arc<GraphStage>,
    _directory: tempfile::TempDir,
}

async fn world(server: &GraphServer) -> World {
    let directory = tempfile::tempdir().expect("tempdir");
    let mut options = SqliteOptions::new(directory.path().join("ledger.db"));
    options.backends = vec![Backend::Relational, Backend::Vector, Backend::Graph];
    options.job_policies = JobPolicies::uniform(JobPolicy {
        max_attempts: 50,
        backoff_base_micros: 100_000,
        backoff_cap_micros: 500_000,
        lease_micros: 10_000_000,
        ..JobPolicy::default()
    });
    let ledger: Arc<dyn Ledger> = Arc::new(
        SqliteLedger::open(options, Arc::new(SystemClock))
            .await
            .expect("ledger"),
    );
    let generation = Generation::new(
        MODEL_ID,
        MODEL_DIMENSION as i64,
        &ChunkerSettings::default().fingerprint(),
        &[Backend::Relational, Backend::Vector, Backend::Graph],
    );
    assert!(
        !generation.backends.contains(&Backend::Graph),
        "the graph is not in a generation"
    );
    ledger
        .activate_generation(&generation, "test")
        .await
        .expect("generation");
    let files = ModelFiles::locate(&models_dir()).expect("model files");
    let embedder = Arc::new(LocalEmbedder::load(&files, 1, Some(2)).expect("model"));
    let chunker = Arc::new(
        Chunker::new(
            files.tokenizer().expect("tokenizer"),
            ChunkerSettings::default(),
        )
        .expect("chunker"),
    );
    let vectors = Arc::new(
        EdgeVectorStore::open(&directory.path().join("vectors"), MODEL_DIMENSION)
            .expect("vector store"),
    );
    let mut graph_options = server.options();
    graph_options.timeout = Duration::from_secs(3);
    graph_options.retry_budget = Duration::from_millis(500);
    let graph = Arc::new(BoltGraphStore::open(&graph_options).await.expect("graph"));
    let projector = Projector::new(
        ledger.clone(),
        embedder,
        chunker.clone(),
        Some(vectors),
        generation.clone(),
    )
    .expect("projector")
    .with_graph(GraphStage::new(
        ledger.clone(),
        chunker.clone(),
        graph.clone(),
        vec![Arc::new(LinkExtractor)],
        &generation.id,
    ));
    let stage = Arc::new(GraphStage::new(
        ledger.clone(),
        chunker,
        graph.clone(),
        vec![Arc::new(LinkExtractor)],
        &generation.id,
    ));
    World {
        ledger,
        projector: Arc::new(projector),
        graph,
        stage,
        _directory: directory,
    }
}

fn tagged(key: &str, text: &str, tags: &[&str]) -> Submission {
    let mut submission = put("docs", key, text);
    if let receipts::Change::Put(document) = &mut submission.change {
        document.tags = tags.iter().map(|tag| (*tag).to_owned()).collect();
        document.media_type = "text/markdown".to_owned();
    }
    submission
}

impl World {
    async fn accept(&self, submissions: Vec<Submission>) -> Vec<Uuid> {
        self.ledger
            .accept(submissions)
            .await
            .into_iter()
            .map(|result| result.expect("accepted").source_revision_id)
            .collect()
    }

    /// The revision's receipt for `backend`.
    async fn receipt(&self, revision: Uuid, backend: Backend) -> Option<ReceiptState> {
        let detail = self.ledger.revision(revision).await.expect("read")?;
        detail
            .receipts
            .iter()
            .find(|receipt| receipt.backend == backend)
            .map(|receipt| receipt.state)
    }

    /// Runs a worker until no job is open (or 90 s pass).
    async fn settle(&self) {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let mut config = WorkerConfig::new("graph-test");
        config.poll_interval = Duration::from_millis(20);
        let handle = tokio::spawn(
            Worker::new(self.ledger.clone(), self.projector.clone(), config).run(async move {
                let _ = stopped.changed().await;
            }),
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            let counts = self.ledger.counts().await.expect("counts");
            let open = counts.open_jobs();
            if open == 0 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "jobs still open: {:?}",
                counts.jobs
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = stop.send(true);
        handle.await.expect("worker");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_tags_and_urls_follow_heads_and_tombstones() {
    let server = GraphServer::start().expect("start ArcadeDB");
    let world = world(&server).await;
    let revisions = world
        .accept(vec![
            tagged("b.md", "# B\n\nBack to [a](a.md).", &["shared"]),
            tagged("c.md", "# C\n\nA plain page.", &[]),
            tagged(
                "a.md",
                "# A\n\nSee [b](b.md), [[c]], [missing](nowhere.md) and https://example.org/x.",
                &["intro", "shared"],
            ),
        ])
        .await;
    world.settle().await;
    let a = revisions[2];
    assert_eq!(
        world.receipt(a, Backend::Graph).await,
        Some(ReceiptState::Verified)
    );
    assert_eq!(
        world.receipt(a, Backend::Vector).await,
        Some(ReceiptState::Verified)
    );
    let counts = world.graph.revision_counts(a).await.expect("counts");
    assert_eq!(
        (counts.links, counts.urls, counts.tags, counts.is_head),
        (2, 1, 2, true),
        "links to b.md and c.md (nowhere.md is no source), one URL, two tags"
    );
    assert!(counts.chunks >= 1);
    let evidence = world
        .ledger
        .revision(a)
        .await
        .expect("read")
        .expect("a")
        .receipts
        .into_iter()
        .find(|receipt| receipt.backend == Backend::Graph)
        .and_then(|receipt| receipt.evidence)
        .expect("graph evidence");
    assert_eq!(evidence["links"], 2);
    assert_eq!(evidence["head"], true);

    // A new head replaces the references; the URL nothing cites any more is gone.
    let newer = world
        .accept(vec![tagged(
            "a.md",
            "# A\n\nNow only [c](c.md).",
            &["shared"],
        )])
        .await[0];
    world.settle().await;
    let source = world.graph.source("docs", "a.md").await.expect("source");
    assert_eq!(
        (source.head, source.heads, source.links_out),
        (Some(newer), 1, 1)
    );
    assert_eq!(world.graph.orphans().await.expect("orphans"), 0);
    assert_eq!(
        world.receipt(newer, Backend::Graph).await,
        Some(ReceiptState::Verified)
    );

    // A tombstone: no HEAD, no links, no orphans; the receipt says excluded.
    let gone = world.accept(vec![delete("docs", "a.md")]).await[0];
    world.settle().await;
    assert_eq!(
        world.receipt(gone, Backend::Graph).await,
        Some(ReceiptState::Excluded)
    );
    let source = world.graph.source("docs", "a.md").await.expect("source");
    assert_eq!((source.heads, source.links_out), (0, 0));
    assert_eq!(world.graph.orphans().await.expect("orphans"), 0);
    // b.md still carries the tag `shared`, so it stays.
    let b = world.graph.revision_counts(revisions[0]).await.expect("b");
    assert_eq!(b.tags, 1);

    // Erasure: every revision of a.md leaves the graph, the vectors and the ledger; every
    // backend's receipt says `erased`, read back.
    let erased = world
        .ledger
        .erase(receipts::ErasureRequest {
            dataset: "docs".to_owned(),
            source_key: "a.md".to_owned(),
            actor: "test".to_owned(),
            reason: "legal request".to_owned(),
        })
        .await
        .expect("erase")
        .source_revision_id;
    world.settle().await;
    for backend in [Backend::Relational, Backend::Vector, Backend::Graph] {
        assert_eq!(
            world.receipt(erased, backend).await,
            Some(ReceiptState::Erased),
            "{backend}"
        );
    }
    assert!(world
        .graph
        .source_revisions("docs", "a.md", i64::MAX)
        .await
        .expect("graph revisions")
        .is_empty());
    for revision in [a, newer] {
        assert_eq!(
            world
                .graph
                .revision_counts(revision)
                .await
                .expect("a")
                .chunks,
            0
        );
        assert!(world
            .ledger
            .revision(revision)
            .await
            .expect("read")
            .is_none());
    }
    assert_eq!(world.graph.orphans().await.expect("orphans"), 0);
    let b = world.graph.revision_counts(revisions[0]).await.expect("b");
    assert_eq!(b.tags, 1, "b.md keeps its own subgraph");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_outage_never_holds_up_search_and_is_retried_after_the_restart() {
    let mut server = GraphServer::start().expect("start ArcadeDB");
    let world = world(&server).await;
    server.stop();
    let revision = world
        .accept(vec![tagged(
            "a.md",
            "# A\n\nA page with a [link](b.md).",
            &["t"],
        )])
        .await[0];
    // The projection job finishes while the graph is down: the revision is searchable.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let mut config = WorkerConfig::new("graph-outage");
    config.poll_interval = Duration::from_millis(20);
    let handle = tokio::spawn(
        Worker::new(world.ledger.clone(), world.projector.clone(), config).run(async move {
            let _ = stopped.changed().await;
        }),
    );
    loop {
        if world.receipt(revision, Backend::Vector).await == Some(ReceiptState::Verified) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "projection held up by the graph"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let hits = world
        .ledger
        .bind_hits(
            &[receipts::HitRef {
                revision_id: revision,
                chunk_index: Some(0),
            }],
            &world.projector.generation().id,
        )
        .await
        .expect("bind");
    assert_eq!(hits.len(), 1);
    assert!(
        hits[0].current && hits[0].vector_searchable,
        "searchable without the graph: {hits:?}"
    );
    // The graph job meanwhile fails with a retryable graph error, on its own schedule.
    let graph_job = loop {
        let found = world
            .ledger
            .find_jobs(&receipts::JobFilter {
                states: vec![JobState::RetryWait, JobState::Running, JobState::Pending],
                dataset: None,
                allowed_datasets: None,
                text: None,
                error_code: None,
                order: receipts::JobOrder::LeaseExpiry,
                limit: 10,
                offset: 0,
                readable_by: None,
            })
            .await
            .expect("jobs");
        if let Some(job) = found
            .jobs
            .into_iter()
            .find(|job| job.kind == JobKind::Graph && job.last_error_code.is_some())
        {
            break job;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the graph job never failed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        matches!(
            graph_job.last_error_code.as_deref(),
            Some("graph_unavailable" | "graph_timeout")
        ),
        "{graph_job:?}"
    );
    // Back: the same job is retried and verified.
    server.start_again().expect("restart ArcadeDB");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if world.receipt(revision, Backend::Graph).await == Some(ReceiptState::Verified) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the graph job did not recover"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(true);
    handle.await.expect("worker");
    let job = world
        .ledger
        .job(graph_job.id)
        .await
        .expect("job")
        .expect("exists");
    assert_eq!(job.state, JobState::Completed);
    let history = world
        .ledger
        .history("job", &job.id.to_string())
        .await
        .expect("history");
    let states: Vec<_> = history
        .iter()
        .filter(|entry| entry.event == "state")
        .filter_map(|entry| entry.to.clone())
        .collect();
    assert!(
        states.contains(&"retry_wait".to_owned())
            && states.last().map(String::as_str) == Some("completed"),
        "retried, then completed: {states:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_finds_and_repairs_drift_between_the_ledger_and_the_graph() {
    let server = GraphServer::start().expect("start ArcadeDB");
    let world = world(&server).await;
    let revisions = world
        .accept(vec![
            tagged("a.md", "# A\n\nSee [b](b.md).", &["x"]),
            tagged("b.md", "# B\n\nPlain.", &[]),
            tagged("c.md", "# C\n\nSoon deleted.", &[]),
        ])
        .await;
    world.accept(vec![delete("docs", "c.md")]).await;
    world.settle().await;
    let stage = world.stage.clone();
    let clean = stage.reconcile("docs", false).await.expect("reconcile");
    assert_eq!(clean.checked, 3, "{clean:?}");
    assert!(
        clean.missing.is_empty() && clean.unknown.is_empty() && clean.stale_heads.is_empty(),
        "{clean:?}"
    );
    // Drift: a current head lost from the graph, and a revision the ledger never had.
    world
        .graph
        .forget_revision(revisions[0])
        .await
        .expect("forget");
    let mut stranger = gateways::graph::RevisionGraph {
        dataset: "docs".to_owned(),
        source_key: "ghost.md".to_owned(),
        revision_id: Uuid::now_v7(),
        sha256: "0".repeat(64),
        accepted_at: 1,
        head_at: 1,
        generation: "g-x".to_owned(),
        previous_revision_id: None,
        chunks: Vec::new(),
        links: Vec::new(),
        urls: Vec::new(),
        tags: vec!["ghost".to_owned()],
    };
    world.graph.project(&stranger).await.expect("stranger");
    let found = stage.reconcile("docs", false).await.expect("reconcile");
    assert_eq!(found.missing.len(), 1, "{found:?}");
    assert!(found.missing[0].starts_with("a.md"), "{found:?}");
    assert_eq!(
        found.unknown,
        vec![stranger.revision_id.to_string()],
        "{found:?}"
    );
    assert_eq!(found.repaired, 0, "a dry run changes nothing");
    let repaired = stage.reconcile("docs", true).await.expect("repair");
    assert_eq!(repaired.repaired, 2, "{repaired:?}");
    let after = stage.reconcile("docs", false).await.expect("reconcile");
    assert!(
        after.missing.is_empty() && after.unknown.is_empty() && after.stale_heads.is_empty(),
        "{after:?}"
    );
    let counts = world.graph.revision_counts(revisions[0]).await.expect("a");
    assert_eq!((counts.is_head, counts.links, counts.tags), (true, 1, 1));
    stranger.tags.clear();
    assert!(
        !world
            .graph
            .revision_counts(stranger.revision_id)
            .await
            .expect("ghost")
            .exists
    );
}
