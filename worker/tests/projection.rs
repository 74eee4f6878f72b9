//! The projection job end to end, in process: a real SQLite ledger, the real embedding model
//! (fastembed, files from `scripts/setup-model`), real qdrant-edge on disk, leased workers.
//! Fault injection uses wrappers named `Faulty*` around the real stores.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use gateways::embedder::{LocalEmbedder, ModelFiles, MODEL_DIMENSION, MODEL_ID};
use gateways::{
    Chunker, ChunkerSettings, EdgeVectorStore, Embedder, GatewayError, RevisionPoints, VectorHit,
    VectorPoint, VectorStore,
};
use receipts::policy::{JobPolicies, JobPolicy};
use receipts::{
    Backend, Generation, JobState, Ledger, ReceiptState, SqliteLedger, SqliteOptions, SystemClock,
};
use testkit::conformance::{delete, put};
use tokio::sync::OnceCell;
use uuid::Uuid;
use worker::{Projector, Worker, WorkerConfig};

fn models_dir() -> PathBuf {
    std::env::var_os("CAIRN_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")))
}

/// The model loads once per test binary (a second or two).
async fn embedder() -> Arc<dyn Embedder> {
    static MODEL: OnceCell<Arc<LocalEmbedder>> = OnceCell::const_new();
    MODEL
        .get_or_init(|| async {
            let files = match ModelFiles::locate(&models_dir()) {
                Ok(files) => files,
                Err(error) => panic!("{error}"),
            };
            Arc::new(LocalEmbedder::load(&files, 1, Some(2)).expect("load the model"))
        })
        .await
        .clone()
}

fn chunker() -> Arc<Chunker> {
    let files = ModelFiles::locate(&models_dir()).expect("model files");
    Arc::new(
        Chunker::new(
            files.tokenizer().expect("tokenizer"),
            ChunkerSettings::default(),
        )
        .expect("chunker"),
    )
}

struct World {
    ledger: Arc<dyn Ledger>,
    vectors: Arc<EdgeVectorStore>,
    generation: Generation,
    directory: tempfile::TempDir,
}

async fn world_at(directory: tempfile::TempDir) -> World {
    world_with_faults(directory, Arc::new(receipts::faults::NoFaults)).await
}

async fn world_with_faults(
    directory: tempfile::TempDir,
    faults: Arc<dyn receipts::faults::FaultInjector>,
) -> World {
    let mut options = SqliteOptions::new(directory.path().join("ledger.db"));
    options.job_policies = JobPolicies::uniform(JobPolicy {
        max_attempts: 2,
        backoff_base_micros: 20_000,
        lease_micros: 5_000_000,
        ..JobPolicy::default()
    });
    let ledger: Arc<dyn Ledger> = Arc::new(
        SqliteLedger::open_with_faults(options, Arc::new(SystemClock), faults)
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
    let vectors = Arc::new(
        EdgeVectorStore::open(
            &directory.path().join("vectors").join(&generation.id),
            MODEL_DIMENSION,
        )
        .expect("vector store"),
    );
    World {
        ledger,
        vectors,
        generation,
        directory,
    }
}

impl World {
    fn projector(
        &self,
        embedder: Arc<dyn Embedder>,
        vectors: Arc<dyn VectorStore>,
    ) -> Arc<Projector> {
        Arc::new(
            Projector::new(
                self.ledger.clone(),
                embedder,
                chunker(),
                Some(vectors),
                self.generation.clone(),
            )
            .expect("projector"),
        )
    }

    /// Runs a worker until `done` holds (or 60 s pass).
    async fn run_until(&self, projector: Arc<Projector>, done: impl AsyncCheck) {
        let mut config = WorkerConfig::new("projection-test");
        config.poll_interval = Duration::from_millis(20);
        self.run_worker(projector, config, Duration::from_secs(60), done)
            .await;
    }

    /// Runs a worker of `work` with `config` until `done` holds (or `limit` passes).
    async fn run_worker(
        &self,
        work: Arc<dyn worker::Work>,
        config: WorkerConfig,
        limit: Duration,
        done: impl AsyncCheck,
    ) {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let handle = tokio::spawn(
            Worker::new(self.ledger.clone(), work, config).run(async move {
                let _ = stopped.changed().await;
            }),
        );
        let deadline = tokio::time::Instant::now() + limit;
        while !done.check(&self.ledger).await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "projection did not finish in time"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stop.send(true);
        handle.await.expect("worker");
    }
}

#[async_trait]
trait AsyncCheck: Send + Sync {
    async fn check(&self, ledger: &Arc<dyn Ledger>) -> bool;
}

/// Every listed job has reached `state`.
struct JobsIn(Vec<Uuid>, JobState);

#[async_trait]
impl AsyncCheck for JobsIn {
    async fn check(&self, ledger: &Arc<dyn Ledger>) -> bool {
        for id in &self.0 {
            match ledger.job(*id).await {
                Ok(Some(job)) if job.state == self.1 => {}
                _ => return false,
            }
        }
        true
    }
}

async fn accept(
    ledger: &Arc<dyn Ledger>,
    submissions: Vec<receipts::Submission>,
) -> Vec<(Uuid, Uuid)> {
    ledger
        .accept(submissions)
        .await
        .into_iter()
        .map(|result| {
            let acceptance = result.expect("accepted");
            (acceptance.source_revision_id, acceptance.projection_job_id)
        })
        .collect()
}

const GUITAR: &str = "A man is playing a guitar on a small stage while people listen.";
const TAXES: &str = "Quarterly tax filings are due at the end of the month.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projects_reads_back_supersedes_and_excludes() {
    let world = world_at(tempfile::tempdir().expect("tempdir")).await;
    let embedder = embedder().await;
    let projector = world.projector(embedder.clone(), world.vectors.clone());
    let long = "Leased workers project each revision into every store. ".repeat(60);
    let accepted = accept(
        &world.ledger,
        vec![
            put("docs", "guitar", GUITAR),
            put("docs", "taxes", TAXES),
            put("docs", "long", &long),
        ],
    )
    .await;
    let jobs: Vec<Uuid> = accepted.iter().map(|(_, job)| *job).collect();
    world
        .run_until(projector.clone(), JobsIn(jobs.clone(), JobState::Completed))
        .await;

    for (revision, job) in &accepted {
        let receipts = world.ledger.receipts(*job).await.expect("receipts");
        assert_eq!(receipts.len(), 2);
        for receipt in &receipts {
            assert_eq!(receipt.state, ReceiptState::Verified, "{receipt:?}");
        }
        let rows = world
            .ledger
            .chunk_summary(*revision, &world.generation.id)
            .await
            .expect("rows");
        let points = world
            .vectors
            .revision_points(*revision)
            .await
            .expect("points");
        assert!(rows.count >= 1);
        assert_eq!(
            points,
            RevisionPoints {
                count: rows.count as usize,
                with_dimension: rows.count as usize,
                current: rows.count as usize
            }
        );
    }
    let long_rows = world
        .ledger
        .chunk_summary(accepted[2].0, &world.generation.id)
        .await
        .expect("rows");
    assert!(
        long_rows.count >= 2,
        "a long text is cut into several chunks"
    );

    // The real model finds the right document.
    let query = embedder
        .embed(vec!["someone performing music".to_owned()])
        .await
        .expect("embed");
    let hits = world
        .vectors
        .search(query[0].clone(), &["docs".to_owned()], None, 3)
        .await
        .expect("search");
    assert_eq!(hits[0].source_key, "guitar", "{hits:?}");

    // Supersede: a new revision of "guitar" becomes the only current one.
    let newer = accept(
        &world.ledger,
        vec![put("docs", "guitar", "A violinist plays in the orchestra.")],
    )
    .await;
    world
        .run_until(
            projector.clone(),
            JobsIn(vec![newer[0].1], JobState::Completed),
        )
        .await;
    assert_eq!(
        world
            .vectors
            .revision_points(accepted[0].0)
            .await
            .expect("old")
            .current,
        0
    );
    assert!(
        world
            .vectors
            .revision_points(newer[0].0)
            .await
            .expect("new")
            .current
            >= 1
    );
    let old_receipts = world
        .ledger
        .receipts(accepted[0].1)
        .await
        .expect("receipts");
    assert!(
        old_receipts
            .iter()
            .all(|r| r.state == ReceiptState::Superseded),
        "{old_receipts:?}"
    );

    // Tombstone: nothing of "taxes" stays current; receipts say excluded.
    let deleted = accept(&world.ledger, vec![delete("docs", "taxes")]).await;
    world
        .run_until(
            projector.clone(),
            JobsIn(vec![deleted[0].1], JobState::Completed),
        )
        .await;
    assert_eq!(
        world
            .vectors
            .source_current("docs", "taxes")
            .await
            .expect("count"),
        0
    );
    let receipts = world.ledger.receipts(deleted[0].1).await.expect("receipts");
    assert!(
        receipts.iter().all(|r| r.state == ReceiptState::Excluded),
        "{receipts:?}"
    );
    let query = embedder.embed(vec![TAXES.to_owned()]).await.expect("embed");
    let hits = world
        .vectors
        .search(query[0].clone(), &["docs".to_owned()], None, 10)
        .await
        .expect("search");
    assert!(hits.iter().all(|hit| hit.source_key != "taxes"), "{hits:?}");

    // Restart: reopen the store and the points are there.
    let total = world.vectors.total_points().await.expect("total");
    let World {
        directory,
        generation,
        vectors,
        ledger,
        ..
    } = world;
    // Every handle on the shard closes before it is reopened (one process, one owner).
    drop(projector);
    drop(vectors);
    drop(ledger);
    let reopened = EdgeVectorStore::open(
        &directory.path().join("vectors").join(&generation.id),
        MODEL_DIMENSION,
    )
    .expect("reopen");
    assert_eq!(reopened.total_points().await.expect("total"), total);
    assert_eq!(
        reopened
            .revision_points(accepted[2].0)
            .await
            .expect("long")
            .current,
        long_rows.count as usize
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projecting_twice_leaves_one_set_and_reconciles() {
    let world = world_at(tempfile::tempdir().expect("tempdir")).await;
    let projector = world.projector(embedder().await, world.vectors.clone());
    let accepted = accept(&world.ledger, vec![put("docs", "a", GUITAR)]).await;
    let claimed = world
        .ledger
        .claim("twice", 1)
        .await
        .expect("claim")
        .pop()
        .expect("job");
    use worker::Work;
    projector.run(&claimed).await.expect("first run");
    let points = world.vectors.total_points().await.expect("points");
    let rows = world
        .ledger
        .chunk_summary(accepted[0].0, &world.generation.id)
        .await
        .expect("rows");
    projector.run(&claimed).await.expect("second run");
    assert_eq!(world.vectors.total_points().await.expect("points"), points);
    assert_eq!(
        world
            .ledger
            .chunk_summary(accepted[0].0, &world.generation.id)
            .await
            .expect("rows"),
        rows
    );
    let receipts = world.ledger.receipts(claimed.id).await.expect("receipts");
    assert!(
        receipts
            .iter()
            .all(|r| r.evidence.as_ref().is_some_and(|e| e["reconciled"] == true)),
        "{receipts:?}"
    );
}

/// Fault injection: an embedder that always fails.
struct FaultyEmbedder;

#[async_trait]
impl Embedder for FaultyEmbedder {
    fn model_id(&self) -> &str {
        MODEL_ID
    }
    fn dimension(&self) -> usize {
        MODEL_DIMENSION
    }
    async fn embed(&self, _texts: Vec<String>) -> Result<Vec<Vec<f32>>, GatewayError> {
        Err(GatewayError::Embedder("injected fault".to_owned()))
    }
}

/// Fault injection around the real store: writes fail, reads back one point short, or the
/// first `set_current` waits at a gate (so a test can let a newer revision project completely
/// while an older run is about to mark itself current).
struct FaultyVectors {
    real: Arc<EdgeVectorStore>,
    fail_writes: bool,
    short_reads: bool,
    gate: Option<(Arc<tokio::sync::Notify>, Arc<tokio::sync::Semaphore>)>,
    gated_once: std::sync::atomic::AtomicBool,
}

impl FaultyVectors {
    fn new(real: Arc<EdgeVectorStore>) -> FaultyVectors {
        FaultyVectors {
            real,
            fail_writes: false,
            short_reads: false,
            gate: None,
            gated_once: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

#[async_trait]
impl VectorStore for FaultyVectors {
    fn name(&self) -> &'static str {
        "faulty"
    }
    async fn close(&self) -> Result<(), GatewayError> {
        self.real.close().await
    }
    fn dimension(&self) -> usize {
        self.real.dimension()
    }
    fn location(&self) -> String {
        self.real.location()
    }
    async fn indexed_fields(&self) -> Result<Vec<String>, GatewayError> {
        self.real.indexed_fields().await
    }
    async fn ensure_indexes(
        &self,
        fields: &[(String, gateways::FieldKind)],
    ) -> Result<(), GatewayError> {
        self.real.ensure_indexes(fields).await
    }
    async fn bucket_points(
        &self,
        bucket: u16,
        vectors: bool,
    ) -> Result<Vec<gateways::vectors::Held>, GatewayError> {
        self.real.bucket_points(bucket, vectors).await
    }
    async fn bucket_current(&self, bucket: u16) -> Result<usize, GatewayError> {
        self.real.bucket_current(bucket).await
    }
    async fn bucket_counts(&self) -> Result<std::collections::HashMap<u16, usize>, GatewayError> {
        self.real.bucket_counts().await
    }
    async fn ensure_present(&self, create: bool) -> Result<bool, GatewayError> {
        self.real.ensure_present(create).await
    }
    async fn backup_to(
        &self,
        target: &std::path::Path,
    ) -> Result<gateways::vectors::StoreBackup, GatewayError> {
        self.real.backup_to(target).await
    }
    async fn scroll_all(
        &self,
        after: Option<Uuid>,
        limit: usize,
    ) -> Result<(Vec<gateways::vectors::StoredPoint>, Option<Uuid>), GatewayError> {
        self.real.scroll_all(after, limit).await
    }
    async fn put_points(
        &self,
        points: Vec<gateways::vectors::StoredPoint>,
    ) -> Result<(), GatewayError> {
        self.real.put_points(points).await
    }
    async fn vectors(&self, ids: &[Uuid]) -> Result<Vec<Option<Vec<f32>>>, GatewayError> {
        self.real.vectors(ids).await
    }
    async fn upsert(&self, points: Vec<VectorPoint>) -> Result<(), GatewayError> {
        if self.fail_writes {
            return Err(GatewayError::Unavailable {
                store: "faulty",
                message: "injected fault".to_owned(),
            });
        }
        self.real.upsert(points).await
    }
    async fn revision_points(&self, revision_id: Uuid) -> Result<RevisionPoints, GatewayError> {
        let mut points = self.real.revision_points(revision_id).await?;
        if self.short_reads {
            points.count = points.count.saturating_sub(1);
        }
        Ok(points)
    }
    async fn set_current(
        &self,
        dataset: &str,
        key: &str,
        keep: Option<Uuid>,
        head_at: i64,
    ) -> Result<(), GatewayError> {
        if let Some((entered, gate)) = &self.gate {
            if !self.gated_once.swap(true, Ordering::SeqCst) {
                entered.notify_one();
                let _permit = gate.acquire().await;
            }
        }
        self.real.set_current(dataset, key, keep, head_at).await
    }
    async fn source_current(&self, dataset: &str, key: &str) -> Result<usize, GatewayError> {
        self.real.source_current(dataset, key).await
    }
    async fn set_readers(
        &self,
        dataset: &str,
        source_key: &str,
        readers: &[String],
    ) -> Result<(), GatewayError> {
        self.real.set_readers(dataset, source_key, readers).await
    }
    async fn readers_held(
        &self,
        dataset: &str,
        source_key: &str,
        readers: &[String],
    ) -> Result<(usize, usize), GatewayError> {
        self.real.readers_held(dataset, source_key, readers).await
    }
    async fn retire_revision(&self, revision_id: Uuid) -> Result<(), GatewayError> {
        self.real.retire_revision(revision_id).await
    }
    async fn delete_points(&self, selector: gateways::PointSelector) -> Result<(), GatewayError> {
        self.real.delete_points(selector).await
    }
    async fn count_points(&self, selector: gateways::PointSelector) -> Result<usize, GatewayError> {
        self.real.count_points(selector).await
    }
    async fn search(
        &self,
        vector: Vec<f32>,
        datasets: &[String],
        filter: Option<&gateways::PayloadFilter>,
        limit: usize,
    ) -> Result<Vec<VectorHit>, GatewayError> {
        self.real.search(vector, datasets, filter, limit).await
    }
    async fn search_any(
        &self,
        vector: Vec<f32>,
        datasets: &[String],
        filter: Option<&gateways::PayloadFilter>,
        limit: usize,
    ) -> Result<Vec<VectorHit>, GatewayError> {
        self.real.search_any(vector, datasets, filter, limit).await
    }
    async fn search_within(
        &self,
        vector: Vec<f32>,
        datasets: &[String],
        revisions: &[Uuid],
        any_revision: bool,
        limit: usize,
    ) -> Result<Vec<VectorHit>, GatewayError> {
        self.real
            .search_within(vector, datasets, revisions, any_revision, limit)
            .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_relational_write_retries_then_dies() {
    let plan = Arc::new(receipts::faults::FaultPlan::default());
    let world = world_with_faults(tempfile::tempdir().expect("tempdir"), plan.clone()).await;
    plan.arm(receipts::faults::FaultPoint::BeforeChunkWrite);
    plan.arm(receipts::faults::FaultPoint::BeforeChunkWrite);
    let projector = world.projector(embedder().await, world.vectors.clone());
    dies_with(
        &world,
        projector,
        "relational_unavailable",
        (ReceiptState::Pending, ReceiptState::Pending),
    )
    .await;
    assert_eq!(
        world.vectors.total_points().await.expect("points"),
        0,
        "nothing reached the vector store"
    );
}

/// Runs one job to `dead` and checks its last error code, its attempts and the exact state each
/// receipt was left in, as `(relational, vector)`.
async fn dies_with(
    world: &World,
    projector: Arc<Projector>,
    code: &str,
    expected: (ReceiptState, ReceiptState),
) {
    let accepted = accept(
        &world.ledger,
        vec![put("docs", &format!("fault-{code}"), TAXES)],
    )
    .await;
    let job_id = accepted[0].1;
    world
        .run_until(projector, JobsIn(vec![job_id], JobState::Dead))
        .await;
    let job = world
        .ledger
        .job(job_id)
        .await
        .expect("job")
        .expect("exists");
    assert_eq!(job.last_error_code.as_deref(), Some(code), "{job:?}");
    assert_eq!(job.attempt, 2, "retried per the policy before dying");
    let receipts = world.ledger.receipts(job_id).await.expect("receipts");
    let vector = receipts
        .iter()
        .find(|r| r.backend == Backend::Vector)
        .expect("vector receipt");
    let relational = receipts
        .iter()
        .find(|r| r.backend == Backend::Relational)
        .expect("relational receipt");
    assert_eq!(
        (relational.state, vector.state),
        expected,
        "receipts after {code}: {receipts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_row_lost_after_the_write_fails_the_relational_read_back() {
    let plan = Arc::new(receipts::faults::FaultPlan::default());
    let world = world_with_faults(tempfile::tempdir().expect("tempdir"), plan.clone()).await;
    // Both attempts write their rows, then lose the last one before reading them back.
    plan.arm(receipts::faults::FaultPoint::ChunkRowLost);
    plan.arm(receipts::faults::FaultPoint::ChunkRowLost);
    let projector = world.projector(embedder().await, world.vectors.clone());
    dies_with(
        &world,
        projector,
        "readback_mismatch",
        (ReceiptState::Pending, ReceiptState::Pending),
    )
    .await;
    assert_eq!(
        world.vectors.total_points().await.expect("points"),
        0,
        "a revision whose rows did not read back never reached the vector store"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_faults_retry_then_die_with_a_specific_code() {
    let world = world_at(tempfile::tempdir().expect("tempdir")).await;
    let faulty = |fail_writes, short_reads| -> Arc<dyn VectorStore> {
        Arc::new(FaultyVectors {
            fail_writes,
            short_reads,
            ..FaultyVectors::new(world.vectors.clone())
        })
    };
    dies_with(
        &world,
        world.projector(Arc::new(FaultyEmbedder), world.vectors.clone()),
        "embed_error",
        (ReceiptState::Verified, ReceiptState::Pending),
    )
    .await;
    dies_with(
        &world,
        world.projector(embedder().await, faulty(true, false)),
        "vector_unavailable",
        (ReceiptState::Verified, ReceiptState::Pending),
    )
    .await;
    dies_with(
        &world,
        world.projector(embedder().await, faulty(false, true)),
        "readback_mismatch",
        (ReceiptState::Verified, ReceiptState::Written),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_run_never_leaves_its_revision_current() {
    use worker::Work;
    let world = world_at(tempfile::tempdir().expect("tempdir")).await;
    let entered = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let gated: Arc<dyn VectorStore> = Arc::new(FaultyVectors {
        gate: Some((entered.clone(), gate.clone())),
        ..FaultyVectors::new(world.vectors.clone())
    });
    let slow = world.projector(embedder().await, gated);
    let fast = world.projector(embedder().await, world.vectors.clone());
    let old = accept(&world.ledger, vec![put("docs", "race", GUITAR)]).await[0];
    let old_job = world
        .ledger
        .claim("slow", 1)
        .await
        .expect("claim")
        .pop()
        .expect("job");
    let slow_run = tokio::spawn(async move { slow.run(&old_job).await });
    // The old run has written and read back its points and is about to mark them current.
    tokio::time::timeout(Duration::from_secs(60), entered.notified())
        .await
        .expect("the old run reached set_current");
    assert_eq!(
        world
            .vectors
            .revision_points(old.0)
            .await
            .expect("old")
            .count,
        1
    );
    // Meanwhile a newer revision is accepted and projected completely.
    let new = accept(&world.ledger, vec![put("docs", "race", TAXES)]).await[0];
    let new_job = world
        .ledger
        .claim("fast", 1)
        .await
        .expect("claim")
        .pop()
        .expect("job");
    assert_eq!(new_job.revision_id, Some(new.0));
    fast.run(&new_job).await.expect("the new run");
    world
        .ledger
        .complete(&receipts::LeaseToken::of(&new_job).expect("lease"))
        .await
        .expect("complete");
    // Now the old run goes on: its late set_current cannot retire the newer revision, and its
    // fenced-out receipt makes it retire its own points.
    gate.add_permits(1);
    let outcome = slow_run.await.expect("old run task");
    let failure = outcome.expect_err("the old run is fenced out");
    assert_eq!(failure.code, "lease_lost");
    let newer = world.vectors.revision_points(new.0).await.expect("new");
    assert_eq!(
        newer.current, newer.count,
        "the newer revision stays current"
    );
    assert_eq!(
        world
            .vectors
            .revision_points(old.0)
            .await
            .expect("old")
            .current,
        0
    );
    assert_eq!(
        world
            .vectors
            .source_current("docs", "race")
            .await
            .expect("count"),
        newer.count
    );
    let old_receipts = world.ledger.receipts(old.1).await.expect("receipts");
    let vector = old_receipts
        .iter()
        .find(|r| r.backend == Backend::Vector)
        .expect("receipt");
    assert_ne!(vector.state, ReceiptState::Verified, "{old_receipts:?}");
}

/// The vector receipt's evidence of a revision.
async fn vector_evidence(ledger: &Arc<dyn Ledger>, revision: Uuid) -> serde_json::Value {
    ledger
        .revision(revision)
        .await
        .expect("read")
        .expect("revision")
        .receipts
        .into_iter()
        .find(|receipt| receipt.backend == Backend::Vector)
        .and_then(|receipt| receipt.evidence)
        .expect("vector evidence")
}

/// Unchanged chunks are never embedded twice: a new revision that changes one paragraph, and
/// the same text in another source of the dataset, reuse the stored vectors (copied under the
/// new point ids, read back like any other); another dataset does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_chunks_reuse_their_vectors_within_a_dataset() {
    let world = world_at(tempfile::tempdir().expect("tempdir")).await;
    let projector = world.projector(embedder().await, world.vectors.clone());
    // Paragraphs long enough to be chunks of their own (254 tokens at most each).
    let paragraph = |topic: &str| format!("{topic}. ").repeat(120);
    let original = [
        paragraph("Volcanoes erupt"),
        paragraph("Rivers flood"),
        paragraph("Glaciers melt"),
    ]
    .join("\n\n");
    let first = accept(&world.ledger, vec![put("docs", "a", &original)]).await;
    world
        .run_until(
            projector.clone(),
            JobsIn(vec![first[0].1], JobState::Completed),
        )
        .await;
    let evidence = vector_evidence(&world.ledger, first[0].0).await;
    let points = evidence["points"].as_u64().expect("points");
    assert!(points >= 3, "{evidence}");
    assert_eq!(evidence["reused"], 0, "{evidence}");

    let edited = [
        paragraph("Volcanoes erupt"),
        paragraph("Deserts spread"),
        paragraph("Glaciers melt"),
    ]
    .join("\n\n");
    let copies = accept(
        &world.ledger,
        vec![
            put("docs", "a", &edited),
            put("docs", "b", &original),
            put("notes", "c", &original),
        ],
    )
    .await;
    world
        .run_until(
            projector.clone(),
            JobsIn(
                copies.iter().map(|(_, job)| *job).collect(),
                JobState::Completed,
            ),
        )
        .await;
    let edit = vector_evidence(&world.ledger, copies[0].0).await;
    let reused = edit["reused"].as_u64().expect("reused");
    let embedded = edit["embedded"].as_u64().expect("embedded");
    assert!(
        reused >= 1 && embedded >= 1,
        "one paragraph changed: {edit}"
    );
    assert_eq!(reused + embedded, edit["points"].as_u64().expect("points"));
    let same = vector_evidence(&world.ledger, copies[1].0).await;
    assert_eq!(
        same["reused"], same["points"],
        "the same text in another source: {same}"
    );
    let other = vector_evidence(&world.ledger, copies[2].0).await;
    assert_eq!(other["reused"], 0, "never across datasets: {other}");
    // The copies are real points: read back, and found by search like any other.
    let stored = world
        .vectors
        .revision_points(copies[1].0)
        .await
        .expect("points");
    assert_eq!(stored.count as u64, points);
}

/// A revision whose bytes equal its predecessor's (new tags only) is not chunked again: its
/// chunk rows are copied from the predecessor's (the same rows the chunker would cut), and its
/// vectors are reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tags_only_revision_copies_its_predecessors_chunks() {
    let world = world_at(tempfile::tempdir().expect("tempdir")).await;
    let projector = world.projector(embedder().await, world.vectors.clone());
    let text = format!(
        "{}\n\n{}",
        "Tides rise. ".repeat(150),
        "Stars fade. ".repeat(150)
    );
    let first = accept(&world.ledger, vec![put("docs", "a", &text)]).await;
    world
        .run_until(
            projector.clone(),
            JobsIn(vec![first[0].1], JobState::Completed),
        )
        .await;
    let mut retagged = put("docs", "a", &text);
    if let receipts::Change::Put(document) = &mut retagged.change {
        document.tags = vec!["reviewed".to_owned()];
    }
    let second = accept(&world.ledger, vec![retagged]).await;
    world
        .run_until(
            projector.clone(),
            JobsIn(vec![second[0].1], JobState::Completed),
        )
        .await;
    let relational = |revision| {
        let ledger = world.ledger.clone();
        async move {
            ledger
                .revision(revision)
                .await
                .expect("read")
                .expect("revision")
                .receipts
                .into_iter()
                .find(|receipt| receipt.backend == Backend::Relational)
                .and_then(|receipt| receipt.evidence)
                .expect("relational evidence")
        }
    };
    assert_eq!(relational(first[0].0).await["chunks_from"], "chunker");
    assert_eq!(relational(second[0].0).await["chunks_from"], "predecessor");
    let rows = |revision| {
        let ledger = world.ledger.clone();
        let generation = world.generation.id.clone();
        async move { ledger.chunks(revision, &generation).await.expect("rows") }
    };
    let (before, after) = (rows(first[0].0).await, rows(second[0].0).await);
    assert!(before.len() >= 2);
    assert_eq!(
        before, after,
        "the copied rows are the rows the chunker cut"
    );
    let vectors = vector_evidence(&world.ledger, second[0].0).await;
    assert_eq!(vectors["reused"], vectors["points"], "{vectors}");
}

/// Accepts one document, runs the projector until its job completes, and returns its chunk
/// rows in the world's generation.
async fn project_one(
    world: &World,
    projector: &Arc<Projector>,
    submission: receipts::Submission,
) -> Vec<receipts::ChunkRow> {
    let accepted = accept(&world.ledger, vec![submission]).await;
    world
        .run_until(
            projector.clone(),
            JobsIn(vec![accepted[0].1], JobState::Completed),
        )
        .await;
    world
        .ledger
        .chunks(accepted[0].0, &world.generation.id)
        .await
        .expect("rows")
}

/// Markdown is chunked at its own structure: every chunk row records the heading path it
/// starts in, and a code block that fits stays whole in one chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markdown_chunks_carry_their_section_paths() {
    let world = world_at(tempfile::tempdir().expect("tempdir")).await;
    let projector = world.projector(embedder().await, world.vectors.clone());
    let code = "```sh\ncairn serve --data-dir ./cairn-data --bind 127.0.0.1:7171\n```";
    let text = format!(
        "# Guide\n\n{}\n\n## Install\n\n{}\n\n{code}\n\n## Use\n\n{}\n",
        "The guide explains what cairn keeps. ".repeat(40),
        "Install the binary and its model files first. ".repeat(40),
        "Send documents and search them by meaning. ".repeat(40),
    );
    let submission = receipts::Submission::document(
        "docs",
        "guide.md",
        "test",
        text.into_bytes(),
        "text/markdown",
    );
    let rows = project_one(&world, &projector, submission).await;
    assert!(rows.len() >= 3, "{rows:?}");
    let sections: Vec<Option<&str>> = rows.iter().map(|row| row.section.as_deref()).collect();
    assert_eq!(sections.first(), Some(&Some("# Guide")), "{sections:?}");
    assert!(
        sections.contains(&Some("# Guide > ## Install")),
        "{sections:?}"
    );
    assert_eq!(
        sections.last(),
        Some(&Some("# Guide > ## Use")),
        "{sections:?}"
    );
    assert!(
        rows.iter().any(|row| row.text.contains(code)),
        "the code block is split: {rows:?}"
    );
    assert!(rows.iter().all(|row| row.page.is_none()));
}

/// A real five-page PDF (pdf.js's test corpus): every chunk row names the page it lies on,
/// and its text is on that page as poppler reads the page alone.
#[tokio::test]
async fn pdf_chunks_lie_on_the_page_they_name() {
    let world = world_at(tempfile::tempdir().expect("tempdir")).await;
    let projector = world.projector(embedder().await, world.vectors.clone());
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../extract/tests/fixtures/pdfjs/file_pdfjs_test.pdf");
    let bytes = std::fs::read(&path).expect("fixture");
    let submission =
        receipts::Submission::document("docs", "testing.pdf", "test", bytes, "application/pdf");
    let rows = project_one(&world, &projector, submission).await;
    let pages: Vec<i64> = rows.iter().filter_map(|row| row.page).collect();
    assert_eq!(pages.len(), rows.len(), "a row without a page: {rows:?}");
    assert!(pages.windows(2).all(|pair| pair[0] <= pair[1]), "{pages:?}");
    assert_eq!(pages.first(), Some(&1));
    assert_eq!(pages.last(), Some(&5));
    let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    for row in &rows {
        let page = row.page.expect("page").to_string();
        let output = std::process::Command::new("pdftotext")
            .args(["-q", "-f", &page, "-l", &page])
            .arg(&path)
            .arg("-")
            .output()
            .expect("pdftotext");
        let alone = words(&String::from_utf8_lossy(&output.stdout));
        assert!(
            alone.contains(&words(&row.text)),
            "chunk {} is not on page {page}: {:?}",
            row.chunk_index,
            row.text
        );
    }
}

/// The readers of a source, as its points in the store carry them, are `readers`.
struct ReadersHeld {
    store: Arc<EdgeVectorStore>,
    key: &'static str,
    readers: Vec<String>,
}

#[async_trait]
impl AsyncCheck for ReadersHeld {
    async fn check(&self, _ledger: &Arc<dyn Ledger>) -> bool {
        matches!(
            self.store.readers_held("docs", self.key, &self.readers).await,
            Ok((points, carrying)) if points > 0 && points == carrying
        )
    }
}

/// A put's readers are written with the points; an access change reaches them through an
/// access job (nothing embedded again), and the store's readers prefilter follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_changes_reach_the_points_through_access_jobs() {
    use receipts::access::AccessChange;
    use receipts::filter::{Condition, Filter};
    let world = world_at(tempfile::tempdir().expect("tempdir")).await;
    let embedder = embedder().await;
    let projector = world.projector(embedder.clone(), world.vectors.clone());
    let names = |list: &[&str]| -> Vec<String> { list.iter().map(|n| (*n).to_owned()).collect() };
    let accepted = accept(
        &world.ledger,
        vec![
            put("docs", "guitar", GUITAR).read_by(names(&["group:music"])),
            put("docs", "taxes", TAXES),
        ],
    )
    .await;
    let jobs: Vec<Uuid> = accepted.iter().map(|(_, job)| *job).collect();
    world
        .run_until(projector.clone(), JobsIn(jobs, JobState::Completed))
        .await;
    let held = |key: &'static str, readers: &[&str]| ReadersHeld {
        store: world.vectors.clone(),
        key,
        readers: names(readers),
    };
    assert!(held("guitar", &["group:music"]).check(&world.ledger).await);
    assert!(held("taxes", &[]).check(&world.ledger).await);
    let embedded_before = vector_evidence(&world.ledger, accepted[0].0).await;

    world
        .ledger
        .change_access(AccessChange::Source {
            dataset: "docs".to_owned(),
            source_key: "guitar".to_owned(),
            readers: Some(names(&["user:ann"])),
            actor: "test".to_owned(),
            reason: "moved to ann".to_owned(),
        })
        .await
        .expect("change access");
    world
        .run_until(projector.clone(), held("guitar", &["user:ann"]))
        .await;
    // Nothing was embedded again: the revision's vector receipt is the projection's.
    assert_eq!(
        vector_evidence(&world.ledger, accepted[0].0).await,
        embedded_before
    );

    let query = embedder
        .embed(vec!["someone performing music".to_owned()])
        .await
        .expect("embed");
    let finds = |reader: &str| {
        let filter = Filter::Condition(Condition::Readable(vec![reader.to_owned()]));
        let store = world.vectors.clone();
        let vector = query[0].clone();
        async move {
            let pushed = gateways::vectors::pushdown(&filter, true);
            store
                .search(vector, &["docs".to_owned()], pushed.filter.as_ref(), 10)
                .await
                .expect("search")
                .into_iter()
                .map(|hit| hit.source_key)
                .collect::<Vec<_>>()
        }
    };
    let for_ann = finds("user:ann").await;
    assert!(for_ann.contains(&"guitar".to_owned()), "{for_ann:?}");
    // taxes names nobody: the dataset's default, decided at binding, so it passes.
    assert!(for_ann.contains(&"taxes".to_owned()), "{for_ann:?}");
    let for_music = finds("group:music").await;
    assert!(!for_music.contains(&"guitar".to_owned()), "{for_music:?}");
}

/// Fault injection around the real model: a call whose texts include `marker` is refused as a
/// whole (as a server refuses a batch with one bad input); every other call embeds.
struct PoisonedEmbedder {
    real: Arc<dyn Embedder>,
    marker: &'static str,
    calls: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl Embedder for PoisonedEmbedder {
    fn model_id(&self) -> &str {
        self.real.model_id()
    }
    fn dimension(&self) -> usize {
        self.real.dimension()
    }
    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, GatewayError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if texts.iter().any(|text| text.contains(self.marker)) {
            return Err(GatewayError::Rejected {
                store: "embedder",
                message: "injected fault: a poisoned text".to_owned(),
            });
        }
        self.real.embed(texts).await
    }
}

/// Runs a worker that claims up to 32 jobs at once (so a claim makes one unit) until `done`
/// holds (or 90 s pass).
async fn run_units_until(world: &World, work: Arc<dyn worker::Work>, done: impl AsyncCheck) {
    let mut config = WorkerConfig::new("unit-test");
    config.concurrency = 32;
    config.poll_interval = Duration::from_millis(20);
    world
        .run_worker(work, config, Duration::from_secs(90), done)
        .await;
}

/// Every listed job has ended (completed or dead).
struct JobsEnded(Vec<Uuid>);

#[async_trait]
impl AsyncCheck for JobsEnded {
    async fn check(&self, ledger: &Arc<dyn Ledger>) -> bool {
        for id in &self.0 {
            match ledger.job(*id).await {
                Ok(Some(job)) if matches!(job.state, JobState::Completed | JobState::Dead) => {}
                _ => return false,
            }
        }
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_projects_small_documents_together_and_a_poisoned_one_fails_alone() {
    let world = world_at(tempfile::tempdir().expect("tempdir")).await;
    let poisoned = Arc::new(PoisonedEmbedder {
        real: embedder().await,
        marker: "POISON",
        calls: std::sync::atomic::AtomicUsize::new(0),
    });
    let projector = world.projector(poisoned.clone(), world.vectors.clone());
    let mut submissions: Vec<receipts::Submission> = (0..12)
        .map(|index| {
            put(
                "small",
                &format!("note-{index}"),
                &format!("note {index}: {GUITAR}"),
            )
        })
        .collect();
    submissions.push(put("small", "bad", "this one is POISON to the model"));
    let accepted = accept(&world.ledger, submissions).await;
    let jobs: Vec<Uuid> = accepted.iter().map(|(_, job)| *job).collect();
    run_units_until(&world, projector, JobsEnded(jobs.clone())).await;
    let (bad_revision, bad_job) = accepted[12];
    for (revision, job) in &accepted[..12] {
        let job = world.ledger.job(*job).await.expect("read").expect("job");
        assert_eq!(job.state, JobState::Completed, "{job:?}");
        assert_eq!(
            job.attempt, 0,
            "a neighbour of the poisoned document never failed"
        );
        let evidence = vector_evidence(&world.ledger, *revision).await;
        assert_eq!(evidence["unit"], true, "{evidence}");
        let points = world
            .vectors
            .revision_points(*revision)
            .await
            .expect("points");
        assert_eq!((points.count, points.current), (1, 1));
    }
    let bad = world.ledger.job(bad_job).await.expect("read").expect("job");
    assert_eq!(bad.state, JobState::Dead, "{bad:?}");
    assert_eq!(bad.last_error_code.as_deref(), Some("embedder_rejected"));
    assert_eq!(
        world
            .vectors
            .revision_points(bad_revision)
            .await
            .expect("points")
            .count,
        0,
        "nothing of the poisoned document was written"
    );
    // One shared call, then one call per member of that unit: bounded, not per chunk.
    let calls = poisoned.calls.load(Ordering::SeqCst);
    assert!(calls <= 1 + 13 + 2, "{calls} embedding calls");
}

/// Fault injection around a projector: the first unit it runs loses two members' leases before
/// its work starts (one member's source gets a newer revision, which supersedes its job; the
/// other's lease is released, as a rescue would take it). What was done to whom is recorded.
struct FaultyUnitStart {
    inner: Arc<Projector>,
    ledger: Arc<dyn Ledger>,
    done: std::sync::atomic::AtomicBool,
    /// (superseded revision, its newer revision's job, released job)
    record: std::sync::Mutex<Option<(Uuid, Uuid, Uuid)>>,
}

#[async_trait]
impl worker::Work for FaultyUnitStart {
    async fn run(&self, job: &receipts::Job) -> Result<(), receipts::Failure> {
        self.inner.run(job).await
    }
    fn unit_key(&self, job: &receipts::Job) -> Option<String> {
        self.inner.unit_key(job)
    }
    async fn run_unit(&self, unit: &worker::Unit) {
        if unit.members().len() >= 3 && !self.done.swap(true, Ordering::SeqCst) {
            let superseded = &unit.members()[0];
            let newer = accept(
                &self.ledger,
                vec![put("small", &superseded.job.source_key, TAXES)],
            )
            .await[0];
            let released = &unit.members()[1];
            self.ledger.release(&released.token).await.expect("release");
            *self.record.lock().expect("lock") = Some((
                superseded.job.revision_id.expect("revision"),
                newer.1,
                released.job.id,
            ));
        }
        self.inner.run_unit(unit).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_that_lose_their_lease_mid_unit_are_taken_out_and_the_rest_complete() {
    use worker::Work;
    let world = world_at(tempfile::tempdir().expect("tempdir")).await;
    let projector = world.projector(embedder().await, world.vectors.clone());
    let accepted = accept(
        &world.ledger,
        (0..6)
            .map(|index| {
                put(
                    "small",
                    &format!("doc-{index}"),
                    &format!("{index} {GUITAR}"),
                )
            })
            .collect(),
    )
    .await;
    let faulty = Arc::new(FaultyUnitStart {
        inner: projector,
        ledger: world.ledger.clone(),
        done: std::sync::atomic::AtomicBool::new(false),
        record: std::sync::Mutex::new(None),
    });
    assert!(faulty
        .unit_key(&receipts::Job {
            kind: receipts::JobKind::Sync,
            ..world
                .ledger
                .job(accepted[0].1)
                .await
                .expect("read")
                .expect("job")
        })
        .is_none());
    // Every job of the first acceptance ends, the superseded one by supersession.
    struct Settled(Vec<Uuid>, Arc<FaultyUnitStart>);
    #[async_trait]
    impl AsyncCheck for Settled {
        async fn check(&self, ledger: &Arc<dyn Ledger>) -> bool {
            let Some((_, newer_job, _)) = *self.1.record.lock().expect("lock") else {
                return false;
            };
            for id in self.0.iter().chain([&newer_job]) {
                match ledger.job(*id).await {
                    Ok(Some(job)) if job.state.is_terminal() => {}
                    _ => return false,
                }
            }
            true
        }
    }
    let jobs: Vec<Uuid> = accepted.iter().map(|(_, job)| *job).collect();
    run_units_until(&world, faulty.clone(), Settled(jobs, faulty.clone())).await;
    let (superseded_revision, newer_job, released_job) =
        faulty.record.lock().expect("lock").expect("the fault ran");
    for (revision, job) in &accepted {
        let job = world.ledger.job(*job).await.expect("read").expect("job");
        if *revision == superseded_revision {
            assert_ne!(job.state, JobState::Completed, "{job:?}");
            let points = world
                .vectors
                .revision_points(*revision)
                .await
                .expect("points");
            assert_eq!(
                points.current, 0,
                "a superseded member's points are not current"
            );
            continue;
        }
        assert_eq!(job.state, JobState::Completed, "{job:?}");
        let points = world
            .vectors
            .revision_points(*revision)
            .await
            .expect("points");
        assert_eq!((points.count, points.current), (1, 1), "{revision}");
        let rows = world
            .ledger
            .chunks(*revision, &world.generation.id)
            .await
            .expect("rows");
        assert_eq!(rows.len(), 1, "one set of rows, written once");
    }
    // The released member ran again on its own claim, and ended verified once.
    let released = world
        .ledger
        .job(released_job)
        .await
        .expect("read")
        .expect("job");
    assert_eq!(released.state, JobState::Completed);
    let newer = world
        .ledger
        .job(newer_job)
        .await
        .expect("read")
        .expect("job");
    assert_eq!(newer.state, JobState::Completed);
    let newer_revision = newer.revision_id.expect("revision");
    let points = world
        .vectors
        .revision_points(newer_revision)
        .await
        .expect("points");
    assert_eq!((points.count, points.current), (1, 1));
    assert_eq!(
        world
            .vectors
            .source_current("small", &newer.source_key)
            .await
            .expect("current"),
        1,
        "only the head's points are current"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_a_units_upsert_and_its_set_current_loses_nothing() {
    let world = world_at(tempfile::tempdir().expect("tempdir")).await;
    let entered = Arc::new(tokio::sync::Notify::new());
    let never = Arc::new(tokio::sync::Semaphore::new(0));
    let gated: Arc<dyn VectorStore> = Arc::new(FaultyVectors {
        gate: Some((entered.clone(), never)),
        ..FaultyVectors::new(world.vectors.clone())
    });
    let accepted = accept(
        &world.ledger,
        (0..8)
            .map(|index| {
                put(
                    "small",
                    &format!("doc-{index}"),
                    &format!("{index} {TAXES}"),
                )
            })
            .collect(),
    )
    .await;
    // The first worker's unit upserts its points and stops at set_current; then the worker
    // is gone without releasing anything (as a SIGKILL leaves it).
    let mut config = WorkerConfig::new("doomed");
    config.concurrency = 32;
    config.poll_interval = Duration::from_millis(20);
    let doomed = tokio::spawn(
        Worker::new(
            world.ledger.clone(),
            world.projector(embedder().await, gated),
            config,
        )
        .run(std::future::pending()),
    );
    tokio::time::timeout(Duration::from_secs(60), entered.notified())
        .await
        .expect("the unit reached set_current");
    doomed.abort();
    let _ = doomed.await;
    for (revision, _) in &accepted {
        let points = world
            .vectors
            .revision_points(*revision)
            .await
            .expect("points");
        assert_eq!(points.count, 1, "upserted before the crash");
    }
    // Another worker takes the jobs once their leases run out, and reconciles.
    let projector = world.projector(embedder().await, world.vectors.clone());
    let jobs: Vec<Uuid> = accepted.iter().map(|(_, job)| *job).collect();
    run_units_until(&world, projector, JobsIn(jobs, JobState::Completed)).await;
    for (revision, job) in &accepted {
        let job = world.ledger.job(*job).await.expect("read").expect("job");
        // A lease the aborted worker held ran out (a crash), or its run was released as the
        // task was torn down; either way no attempt failed and nothing is lost.
        assert!(job.crashes <= 1 && job.attempt == 0, "{job:?}");
        let evidence = vector_evidence(&world.ledger, *revision).await;
        assert_eq!(evidence["reconciled"], true, "{evidence}");
        assert_eq!(
            evidence["embedded"], 0,
            "nothing embedded twice: {evidence}"
        );
        let points = world
            .vectors
            .revision_points(*revision)
            .await
            .expect("points");
        assert_eq!((points.count, points.current), (1, 1));
        let rows = world
            .ledger
            .chunks(*revision, &world.generation.id)
            .await
            .expect("rows");
        assert_eq!(rows.len(), 1);
    }
}
