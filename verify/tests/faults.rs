//! Verify by breaking things on purpose, on both ledger engines and both vector stores: a real
//! SQLite file with qdrant-edge in process, and a real PostgreSQL with a real Qdrant server
//! (broken over Qdrant's own REST API and psql-level SQL, behind cairn's back). The real
//! embedding model and leased workers project; verify finds each fault with its kind, a
//! repair converges to zero drift, and work in flight is never reported.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gateways::embedder::{LocalEmbedder, ModelFiles, MODEL_DIMENSION, MODEL_ID};
use gateways::{
    Chunker, ChunkerSettings, EdgeVectorStore, Embedder, OneStore, ServerOptions,
    ServerVectorStore, VectorPoint, VectorStore,
};
use receipts::model::{DriftKind, DriftState, PassState, VerifyPass, VerifyTier};
use receipts::{Backend, Generation, Ledger, SqliteLedger, SqliteOptions, SystemClock};
use testkit::conformance::put;
use tokio::sync::OnceCell;
use uuid::Uuid;
use verify::{Verifier, VerifySettings};
use worker::{Projector, Worker, WorkerConfig};

fn models_dir() -> PathBuf {
    std::env::var_os("CAIRN_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")))
}

async fn embedder() -> Arc<dyn Embedder> {
    static MODEL: OnceCell<Arc<LocalEmbedder>> = OnceCell::const_new();
    MODEL
        .get_or_init(|| async {
            let files =
                ModelFiles::locate(&models_dir()).expect("model files (scripts/setup-model)");
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

fn generation() -> Generation {
    Generation::new(
        MODEL_ID,
        MODEL_DIMENSION as i64,
        &ChunkerSettings::default().fingerprint(),
        &[Backend::Relational, Backend::Vector],
    )
}

/// Where the stores are, and how a test breaks them behind cairn's back.
enum Stores {
    Embedded {
        _directory: tempfile::TempDir,
        ledger_file: PathBuf,
    },
    Servers {
        postgres: testkit::postgres::PostgresServer,
        qdrant: Box<testkit::qdrant::QdrantServer>,
        collection: String,
    },
}

struct World {
    ledger: Arc<dyn Ledger>,
    store: Arc<dyn VectorStore>,
    generation: Generation,
    stores: Stores,
}

async fn embedded() -> World {
    let directory = tempfile::tempdir().expect("tempdir");
    let ledger_file = directory.path().join("ledger.db");
    let ledger: Arc<dyn Ledger> = Arc::new(
        SqliteLedger::open(SqliteOptions::new(&ledger_file), Arc::new(SystemClock))
            .await
            .expect("ledger"),
    );
    let generation = generation();
    ledger
        .activate_generation(&generation, "test")
        .await
        .expect("activate");
    let store: Arc<dyn VectorStore> = Arc::new(
        EdgeVectorStore::open(&directory.path().join("vectors"), MODEL_DIMENSION).expect("edge"),
    );
    World {
        ledger,
        store,
        generation,
        stores: Stores::Embedded {
            _directory: directory,
            ledger_file,
        },
    }
}

async fn servers() -> World {
    let postgres = testkit::postgres::PostgresServer::start().expect("start PostgreSQL");
    let url = postgres.create_database("ledger").expect("database");
    let qdrant = testkit::qdrant::QdrantServer::start().expect("start Qdrant");
    let ledger: Arc<dyn Ledger> = Arc::new(
        receipts::PostgresLedger::open(receipts::PostgresOptions::new(url))
            .await
            .expect("ledger"),
    );
    let generation = generation();
    ledger
        .activate_generation(&generation, "test")
        .await
        .expect("activate");
    let server = ServerVectorStore::open(
        &ServerOptions::new(&qdrant.grpc_url()),
        &generation.id,
        MODEL_DIMENSION,
    )
    .await
    .expect("qdrant store");
    let collection = server.collection().to_owned();
    World {
        ledger,
        store: Arc::new(server),
        generation,
        stores: Stores::Servers {
            postgres,
            qdrant: Box::new(qdrant),
            collection,
        },
    }
}

impl World {
    async fn verifier(&self) -> Arc<Verifier> {
        Verifier::with_embedders(
            self.ledger.clone(),
            Some(Arc::new(OneStore::new(
                &self.generation.id,
                self.store.clone(),
            ))),
            Some(Arc::new(gateways::OneModel(embedder().await))),
            VerifySettings {
                interval: None,
                points_per_second: u32::MAX,
                ..VerifySettings::default()
            },
        )
    }

    /// Runs workers until no job is open.
    async fn project_all(&self) {
        let projector = Arc::new(
            Projector::new(
                self.ledger.clone(),
                embedder().await,
                chunker(),
                Some(self.store.clone()),
                self.generation.clone(),
            )
            .expect("projector"),
        );
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let mut config = WorkerConfig::new("verify-test");
        config.poll_interval = Duration::from_millis(20);
        config.concurrency = 2;
        let handle = tokio::spawn(Worker::new(self.ledger.clone(), projector, config).run(
            async move {
                let _ = stopped.changed().await;
            },
        ));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let counts = self.ledger.counts().await.expect("counts");
            if counts.open_jobs() == 0 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "projection did not finish: {counts:?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let _ = stop.send(true);
        handle.await.expect("worker");
    }

    async fn pass(
        &self,
        tier: VerifyTier,
        repair: bool,
    ) -> (VerifyPass, Vec<receipts::model::DriftRecord>) {
        let (pass, drift, _) = self.pass_counting_calls(tier, repair).await;
        (pass, drift)
    }

    /// [`World::pass`], and the store requests it made.
    async fn pass_counting_calls(
        &self,
        tier: VerifyTier,
        repair: bool,
    ) -> (VerifyPass, Vec<receipts::model::DriftRecord>, u64) {
        let verifier = self.verifier().await;
        let pass = self
            .ledger
            .change_pass(receipts::model::PassChange::Start {
                tier,
                generation: self.generation.id.clone(),
                repair,
                actor: "test:operator".to_owned(),
                reason: "test".to_owned(),
            })
            .await
            .expect("start");
        let ended = verifier.run(pass).await.expect("pass");
        assert_eq!(ended.state, PassState::Completed);
        let drift = self.ledger.pass_drift(ended.id).await.expect("drift");
        (ended, drift, verifier.store_calls())
    }

    async fn sql(&self, statement: &str, value: &str) {
        match &self.stores {
            Stores::Embedded { ledger_file, .. } => {
                use sqlx::ConnectOptions;
                let mut connection =
                    receipts::sqlite::connect_options(ledger_file, Duration::from_secs(5))
                        .connect()
                        .await
                        .expect("connect");
                sqlx::query(statement)
                    .bind(value)
                    .execute(&mut connection)
                    .await
                    .expect("sql");
            }
            Stores::Servers { postgres, .. } => {
                let statement = statement.replace('?', &format!("'{value}'"));
                postgres.psql("ledger", &statement).expect("psql");
            }
        }
    }

    /// Qdrant's own REST API (the server), or the store's calls (qdrant-edge is in process).
    async fn rest(&self, method: reqwest::Method, path: &str, body: serde_json::Value) {
        let Stores::Servers {
            qdrant, collection, ..
        } = &self.stores
        else {
            panic!("REST is for the server");
        };
        let url = format!(
            "http://127.0.0.1:{}/collections/{collection}{path}",
            qdrant.http_port()
        );
        let response = reqwest::Client::new()
            .request(method, url)
            .json(&body)
            .send()
            .await
            .expect("qdrant REST");
        assert!(
            response.status().is_success(),
            "{:?}",
            response.text().await
        );
    }

    async fn delete_points_behind(&self, revision: Uuid) {
        match self.stores {
            Stores::Embedded { .. } => self
                .store
                .delete_points(gateways::PointSelector::Revision(revision))
                .await
                .expect("delete"),
            Stores::Servers { .. } => {
                self.rest(
                    reqwest::Method::POST,
                    "/points/delete?wait=true",
                    serde_json::json!({"filter": {"must": [{"key": "revision_id", "match": {"value": revision.to_string()}}]}}),
                )
                .await
            }
        }
    }

    async fn flag_current_behind(&self, key: &str, revision: Uuid, head_at: i64) {
        match self.stores {
            Stores::Embedded { .. } => self
                .store
                .set_current("docs", key, Some(revision), head_at)
                .await
                .expect("flag"),
            Stores::Servers { .. } => {
                self.rest(
                    reqwest::Method::POST,
                    "/points/payload?wait=true",
                    serde_json::json!({"payload": {"is_current": true}, "filter": {"must": [{"key": "revision_id", "match": {"value": revision.to_string()}}]}}),
                )
                .await
            }
        }
    }

    /// Points of `revision` that name `other` as their source (in the same bucket).
    async fn rename_behind(&self, revision: Uuid, other: &str, points: u32) {
        match self.stores {
            Stores::Embedded { .. } => {
                let ids: Vec<Uuid> = (0..points).map(|i| gateways::vectors::point_id(revision, i)).collect();
                let vectors = self.store.vectors(&ids).await.expect("vectors");
                let rewritten = vectors
                    .into_iter()
                    .enumerate()
                    .map(|(index, vector)| VectorPoint {
                        dataset: "docs".to_owned(),
                        source_key: other.to_owned(),
                        revision_id: revision,
                        chunk_index: index as u32,
                        head_at: 1,
                        vector: vector.expect("vector"),
                        facts: None,
                    })
                    .collect();
                self.store.upsert(rewritten).await.expect("rewrite");
            }
            Stores::Servers { .. } => {
                self.rest(
                    reqwest::Method::POST,
                    "/points/payload?wait=true",
                    serde_json::json!({"payload": {"source_key": other}, "filter": {"must": [{"key": "revision_id", "match": {"value": revision.to_string()}}]}}),
                )
                .await
            }
        }
    }
}

/// A key of `docs` in the same bucket as `key`, other than it.
fn neighbour(key: &str) -> String {
    let bucket = receipts::verify::bucket("docs", key);
    (0..)
        .map(|n| format!("neighbour-{n}.md"))
        .find(|other| receipts::verify::bucket("docs", other) == bucket)
        .expect("a neighbour")
}

fn text(topic: &str) -> String {
    format!("# {topic}\n\nThis note is about {topic}. It says a few plain things about {topic} so that it makes one chunk.\n")
}

async fn accept(world: &World, key: &str, body: &str) -> Uuid {
    let mut results = world.ledger.accept(vec![put("docs", key, body)]).await;
    results
        .pop()
        .expect("one")
        .expect("accepted")
        .source_revision_id
}

fn kinds(drift: &[receipts::model::DriftRecord]) -> BTreeSet<(String, String, String)> {
    drift
        .iter()
        .map(|d| (d.source_key.clone(), d.store.clone(), d.kind.to_string()))
        .collect()
}

async fn faults_are_found_and_repaired(world: World) {
    let mut revisions = std::collections::HashMap::new();
    for key in [
        "gone.md",
        "flag.md",
        "renamed.md",
        "rows.md",
        "bytes.md",
        "clean.md",
    ] {
        revisions.insert(key, accept(&world, key, &text(key)).await);
    }
    world.project_all().await;
    let old_flag = revisions["flag.md"];
    let old_head_at = world
        .ledger
        .revision(old_flag)
        .await
        .expect("read")
        .and_then(|detail| detail.job)
        .expect("job")
        .created_at;
    revisions.insert(
        "flag.md",
        accept(&world, "flag.md", &text("flags, again")).await,
    );
    world.project_all().await;

    let (clean, drift, calls) = world.pass_counting_calls(VerifyTier::Scrub, false).await;
    assert!(
        drift.is_empty(),
        "a freshly projected system has no drift: {drift:?}"
    );
    assert_eq!(clean.buckets_checked, i64::from(receipts::verify::BUCKETS));
    // Empty buckets cost nothing: one bucketed count, then one read per bucket that holds
    // something (six sources here), never one per bucket.
    let occupied: BTreeSet<u16> = revisions
        .keys()
        .map(|key| receipts::verify::bucket("docs", key))
        .collect();
    assert_eq!(
        calls,
        1 + occupied.len() as u64,
        "store requests of a clean pass"
    );

    // Break it.
    world.delete_points_behind(revisions["gone.md"]).await;
    world
        .flag_current_behind("flag.md", old_flag, old_head_at)
        .await;
    world
        .rename_behind(revisions["renamed.md"], &neighbour("renamed.md"), 1)
        .await;
    world
        .sql(
            "DELETE FROM chunks WHERE revision_id = ?",
            &revisions["rows.md"].to_string(),
        )
        .await;
    let sha = world
        .ledger
        .revision(revisions["bytes.md"])
        .await
        .expect("read")
        .expect("revision")
        .revision
        .content_sha256
        .expect("content");
    // Same length (the ledger checks it), other bytes.
    let corrupt = match world.stores {
        Stores::Embedded { .. } => "UPDATE contents SET bytes = zeroblob(length(bytes)) WHERE sha256 = ?",
        Stores::Servers { .. } => "UPDATE contents SET bytes = decode(repeat('00', length(bytes)), 'hex') WHERE sha256 = ?",
    };
    world.sql(corrupt, &sha).await;
    // A vector the generation's model would not produce for its chunk (a wrong model).
    let clean = revisions["clean.md"];
    let clean_head_at = world
        .ledger
        .revision(clean)
        .await
        .expect("read")
        .and_then(|detail| detail.job)
        .expect("job")
        .created_at;
    let foreign: Vec<f32> = (0..MODEL_DIMENSION)
        .map(|i| if i == 7 { 1.0 } else { 0.0 })
        .collect();
    world
        .store
        .upsert(vec![VectorPoint {
            dataset: "docs".to_owned(),
            source_key: "clean.md".to_owned(),
            revision_id: clean,
            chunk_index: 0,
            head_at: clean_head_at,
            vector: foreign,
            facts: None,
        }])
        .await
        .expect("overwrite a vector");

    // Points of a revision the ledger never held, alone in a bucket where the ledger holds
    // nothing: the bucketed count finds them, so the bucket is read.
    let orphan_key = (0..)
        .map(|n| format!("orphan-{n}.md"))
        .find(|key| !occupied.contains(&receipts::verify::bucket("docs", key)))
        .expect("a key in an empty bucket");
    let orphan_vector: Vec<f32> = (0..MODEL_DIMENSION)
        .map(|i| if i == 3 { 1.0 } else { 0.0 })
        .collect();
    world
        .store
        .upsert(vec![VectorPoint {
            dataset: "docs".to_owned(),
            source_key: orphan_key.clone(),
            revision_id: Uuid::now_v7(),
            chunk_index: 0,
            head_at: 1,
            vector: orphan_vector,
            facts: None,
        }])
        .await
        .expect("an orphan point");

    let expected_scrub: BTreeSet<(String, String, String)> = [
        (orphan_key.as_str(), "vector", "extra"),
        ("gone.md", "vector", "missing"),
        ("flag.md", "vector", "stale_current"),
        ("renamed.md", "vector", "payload"),
        ("rows.md", "relational", "missing"),
    ]
    .iter()
    .map(|(k, s, d)| ((*k).to_owned(), (*s).to_owned(), (*d).to_owned()))
    .collect();
    let (_, drift) = world.pass(VerifyTier::Counts, false).await;
    let found = kinds(&drift);
    // The counts tier sees what changes a bucket's current count, and the rows.
    for expected in [
        ("gone.md", "vector", "missing"),
        ("rows.md", "relational", "missing"),
    ] {
        let expected = (
            expected.0.to_owned(),
            expected.1.to_owned(),
            expected.2.to_owned(),
        );
        assert!(found.contains(&expected), "counts found {found:?}");
    }
    let (_, drift) = world.pass(VerifyTier::Scrub, false).await;
    assert_eq!(kinds(&drift), expected_scrub, "{drift:#?}");
    let stale = drift
        .iter()
        .find(|d| d.kind == DriftKind::StaleCurrent)
        .expect("stale");
    assert_eq!(
        stale.revision_id, old_flag,
        "the superseded revision, not the head"
    );
    assert!(drift.iter().all(|d| d.state == DriftState::Open));

    // The deep tier also hashes the bytes, and repairs everything else.
    let (_, drift) = world.pass(VerifyTier::Deep, true).await;
    let mut expected_deep = expected_scrub.clone();
    expected_deep.insert((
        "bytes.md".to_owned(),
        "bytes".to_owned(),
        "checksum".to_owned(),
    ));
    // ... and embeds one chunk per bucket again: clean.md's vector is not the model's.
    expected_deep.insert((
        "clean.md".to_owned(),
        "vector".to_owned(),
        "checksum".to_owned(),
    ));
    assert_eq!(kinds(&drift), expected_deep, "{drift:#?}");
    for record in &drift {
        let expected = match (record.store.as_str(), record.kind) {
            ("bytes", _) => DriftState::Corrupt,
            ("vector", DriftKind::StaleCurrent | DriftKind::Extra) => DriftState::Repaired,
            _ => DriftState::Repairing,
        };
        assert_eq!(record.state, expected, "{record:?}");
        assert!(record.repair.is_some(), "{record:?}");
    }
    world.project_all().await;
    let (_, drift) = world.pass(VerifyTier::Deep, false).await;
    assert_eq!(
        kinds(&drift),
        BTreeSet::from([(
            "bytes.md".to_owned(),
            "bytes".to_owned(),
            "checksum".to_owned()
        )]),
        "after the repairs only the corruption remains (never papered over): {drift:#?}"
    );
    let (_, drift) = world.pass(VerifyTier::Scrub, false).await;
    assert!(drift.is_empty(), "converged: {drift:#?}");
    // History holds each repair with its evidence.
    let history = world
        .ledger
        .history("drift", &drift_id_of(&world, "gone.md").await.to_string())
        .await
        .expect("history");
    assert!(
        history
            .iter()
            .any(|entry| entry.cause.contains("queued projection job")),
        "{history:?}"
    );
}

async fn drift_id_of(world: &World, key: &str) -> Uuid {
    for pass in world.ledger.verify_passes(100).await.expect("passes") {
        if pass.repair {
            let drift = world.ledger.pass_drift(pass.id).await.expect("drift");
            if let Some(found) = drift.iter().find(|d| d.source_key == key) {
                return found.id;
            }
        }
    }
    panic!("no repaired drift for {key}");
}

/// A dropped collection: every promise is missing; the repair creates it again and projects
/// every head (server only: an embedded shard is held open by its one process).
async fn a_dropped_collection_is_found_and_rebuilt(world: World) {
    for n in 0..5 {
        accept(&world, &format!("doc-{n}.md"), &text(&format!("topic {n}"))).await;
    }
    world.project_all().await;
    world
        .rest(reqwest::Method::DELETE, "", serde_json::json!({}))
        .await;
    let (_, drift) = world.pass(VerifyTier::Counts, false).await;
    assert_eq!(drift.len(), 5, "{drift:#?}");
    assert!(drift
        .iter()
        .all(|d| d.kind == DriftKind::Missing && d.store == "vector"));
    let (_, drift) = world.pass(VerifyTier::Counts, true).await;
    assert!(
        drift.iter().all(|d| d.state == DriftState::Repairing),
        "{drift:#?}"
    );
    world.project_all().await;
    let (_, drift) = world.pass(VerifyTier::Scrub, false).await;
    assert!(drift.is_empty(), "{drift:#?}");
}

/// Ingest and supersession while passes run: nothing in flight is reported.
async fn work_in_flight_is_never_drift(world: World) {
    for n in 0..40 {
        accept(&world, &format!("doc-{n}.md"), &text(&format!("topic {n}"))).await;
    }
    let ingest = {
        let ledger = world.ledger.clone();
        tokio::spawn(async move {
            for round in 0..3 {
                for n in 0..40 {
                    let body = text(&format!("topic {n}, round {round}"));
                    let results = ledger
                        .accept(vec![put("docs", &format!("doc-{n}.md"), &body)])
                        .await;
                    assert!(
                        results.iter().all(Result::is_ok),
                        "an acceptance failed: {results:?}"
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let projecting = world.project_all();
    // Passes run until one met work in flight (sources it skipped): a run in which no pass
    // overlapped open work would prove nothing.
    let verifying = async {
        let (mut drift, mut skipped, mut passes) = (Vec::new(), 0, 0);
        for tier in [VerifyTier::Scrub, VerifyTier::Counts]
            .into_iter()
            .cycle()
            .take(12)
        {
            let (pass, found) = world.pass(tier, false).await;
            drift.extend(found);
            skipped += pass.skipped;
            passes += 1;
            if passes >= 3 && skipped > 0 {
                break;
            }
        }
        (drift, skipped)
    };
    let ((), (drift, skipped)) = tokio::join!(projecting, verifying);
    ingest.await.expect("every acceptance succeeded");
    world.project_all().await;
    assert!(
        skipped > 0,
        "no pass met work in flight: the test proved nothing"
    );
    assert!(drift.is_empty(), "work in flight was reported: {drift:#?}");
    let (_, drift) = world.pass(VerifyTier::Scrub, false).await;
    assert!(drift.is_empty(), "{drift:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_and_edge_faults_are_found_and_repaired() {
    faults_are_found_and_repaired(embedded().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_and_server_faults_are_found_and_repaired() {
    faults_are_found_and_repaired(servers().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_and_server_dropped_collection_is_rebuilt() {
    a_dropped_collection_is_found_and_rebuilt(servers().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_and_edge_work_in_flight_is_never_drift() {
    work_in_flight_is_never_drift(embedded().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_and_server_work_in_flight_is_never_drift() {
    work_in_flight_is_never_drift(servers().await).await;
}
