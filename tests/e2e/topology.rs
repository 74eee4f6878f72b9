//! The multi-machine topology under chaos, every part real and in its own process: a
//! PostgreSQL ledger, a Qdrant server, `cairn serve` with no workers (the API and hybrid
//! search), and 3 `cairn worker` processes that project with the real model into both stores.
//!
//! 500 documents are ingested, then 100 of them superseded and 50 deleted, while a client
//! searches throughout. Workers are SIGKILLed 10 times (each replaced), and the Qdrant server
//! is restarted once mid-projection. At the end:
//! - every current head is verified in both backends, and its points are current in Qdrant;
//! - every tombstone is `excluded`, and nothing of its source is current in Qdrant;
//! - no job is lost (each ends `completed` or `superseded`) or done twice (one lease at a
//!   time, one completion, by the worker holding the lease);
//! - no search returned a revision whose successor (or tombstone) was acknowledged before the
//!   search was sent;
//! - no response was a 5xx other than a typed 503.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn::config::{Config, Overrides};
use gateways::{ServerOptions, ServerVectorStore, VectorStore};
use rand::{Rng, SeedableRng};
use receipts::{JobState, ReceiptState};
use serde_json::{json, Value};
use testkit::qdrant::QdrantServer;
use tokio::process::{Child, Command};
use uuid::Uuid;

const DOCS: usize = 500;
const SUPERSEDED: usize = 100;
const DELETED: usize = 50;
const KILLS: usize = 10;
const DATASET: &str = "fleet";
const TOPICS: [&str; 10] = [
    "volcano",
    "harbour",
    "orchard",
    "glacier",
    "bakery",
    "railway",
    "library",
    "meadow",
    "lighthouse",
    "vineyard",
];

fn text(index: usize, version: usize) -> String {
    let a = TOPICS[index % TOPICS.len()];
    let b = TOPICS[(index / TOPICS.len()) % TOPICS.len()];
    format!(
        "Report {index}, edition {version}: the {a} near the {b} was surveyed in season \
         {version}. Notes on the {a} mention walkers, weather and old maps of the {b}."
    )
}

struct Paths {
    ledger: String,
    vectors: String,
    config: std::path::PathBuf,
}

fn worker_env() -> [(&'static str, &'static str); 4] {
    [
        ("CAIRN_LEASE_MS", "4000"),
        ("CAIRN_QUARANTINE_AFTER_CRASHES", "1000"),
        ("CAIRN_BACKOFF_BASE_MS", "200"),
        ("CAIRN_BACKOFF_CAP_MS", "1000"),
    ]
}

async fn start_worker(paths: &Paths, data_dir: &std::path::Path, name: &str) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cairn"));
    command
        .args([
            "worker",
            "--ledger",
            &paths.ledger,
            "--vectors",
            &paths.vectors,
        ])
        .arg("--config")
        .arg(&paths.config)
        .args(["--concurrency", "4", "--owner", name, "--data-dir"])
        .arg(data_dir)
        .envs(worker_env())
        .env(
            "CAIRN_MODELS_DIR",
            concat!(env!("CARGO_MANIFEST_DIR"), "/models"),
        )
        .env("CAIRN_EMBED_THREADS", "1")
        .env("CAIRN_LOG", "error");
    crate::chaos::spawn_worker(command, "Qdrant server").await
}

/// What the client was told: per source key, its revisions in order with the moment each
/// receipt arrived, and whether the last one is a tombstone.
#[derive(Default)]
struct Acknowledged {
    revisions: HashMap<String, Vec<(Uuid, Instant)>>,
    jobs: Vec<Uuid>,
    deleted: Vec<String>,
}

/// Every response must be a success or a typed 503.
pub(crate) fn check_status(what: &str, status: reqwest::StatusCode, body: &Value) {
    if status.is_server_error() {
        assert_eq!(status.as_u16(), 503, "{what}: a 5xx other than 503: {body}");
        assert!(
            body["code"].as_str().is_some_and(|code| !code.is_empty()),
            "{what}: an untyped 503: {body}"
        );
    }
}

/// A receipt's source key, revision and projection job.
pub(crate) fn receipt(value: &Value) -> (String, Uuid, Uuid) {
    let key = value["source_key"].as_str().expect("key").to_owned();
    let revision: Uuid = value["source_revision_id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .expect("revision id");
    let job: Uuid = value["projection_job_id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .expect("job id");
    (key, revision, job)
}

async fn ingest(http: reqwest::Client, base: String, token: String) -> Acknowledged {
    let mut acknowledged = Acknowledged::default();
    let record = |value: &Value, acknowledged: &mut Acknowledged| {
        let (key, revision, job) = receipt(value);
        acknowledged
            .revisions
            .entry(key)
            .or_default()
            .push((revision, Instant::now()));
        acknowledged.jobs.push(job);
    };
    let post_batch = |items: Vec<Value>| {
        let http = http.clone();
        let url = format!("{base}/v1/sources/batch");
        let token = token.clone();
        async move {
            loop {
                let response = http
                    .post(&url)
                    .bearer_auth(&token)
                    .json(&json!({ "items": items }))
                    .send()
                    .await
                    .expect("POST batch");
                let status = response.status();
                let body: Value = response.json().await.expect("json");
                check_status("batch", status, &body);
                if status.as_u16() == 503 {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                assert_eq!(status.as_u16(), 200, "{body}");
                return body["results"].as_array().expect("results").clone();
            }
        }
    };
    for first in (0..DOCS).step_by(100) {
        let items = (first..first + 100)
            .map(|index| {
                json!({ "dataset": DATASET, "source_key": format!("doc-{index}"), "content": text(index, 0) })
            })
            .collect();
        for result in post_batch(items).await {
            assert_eq!(result["status"], "queued_not_confirmed", "{result}");
            record(&result, &mut acknowledged);
        }
    }
    // Supersede 100 (every 5th document), in batches of 20, spread over the projection.
    let superseded: Vec<usize> = (0..DOCS).step_by(DOCS / SUPERSEDED).collect();
    for batch in superseded.chunks(20) {
        let items = batch
            .iter()
            .map(|&index| {
                json!({ "dataset": DATASET, "source_key": format!("doc-{index}"), "content": text(index, 1) })
            })
            .collect();
        for result in post_batch(items).await {
            record(&result, &mut acknowledged);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Delete 50: half of them among the superseded ones.
    for n in 0..DELETED {
        let index = if n % 2 == 0 { n * 10 } else { n * 10 + 3 };
        let key = format!("doc-{index}");
        let response = http
            .delete(format!(
                "{base}/v1/sources?dataset={DATASET}&source_key={key}"
            ))
            .bearer_auth(&token)
            .send()
            .await
            .expect("DELETE");
        let status = response.status();
        let body: Value = response.json().await.expect("json");
        check_status("delete", status, &body);
        assert_eq!(status.as_u16(), 202, "{body}");
        record(&body, &mut acknowledged);
        acknowledged.deleted.push(key);
        if n % 10 == 9 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    acknowledged
}

/// One search as the client saw it: when it was sent and what came back.
pub(crate) struct Seen {
    pub(crate) sent: Instant,
    pub(crate) results: Vec<(String, Uuid)>,
}

/// A search answer's hits as `(source key, revision)`.
pub(crate) fn hits(body: &Value) -> Vec<(String, Uuid)> {
    body["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|hit| {
            (
                hit["source_key"].as_str().expect("key").to_owned(),
                hit["source_revision_id"]
                    .as_str()
                    .and_then(|id| id.parse().ok())
                    .expect("revision"),
            )
        })
        .collect()
}

/// Job `id` ended once: completed or superseded, one lease at a time, completed at most once
/// (once exactly when it ended completed). Returns the crashes its history counted.
pub(crate) async fn assert_ended_once(ledger: &dyn receipts::Ledger, id: Uuid) -> i64 {
    let job = ledger.job(id).await.expect("job").expect("exists");
    assert!(
        matches!(job.state, JobState::Completed | JobState::Superseded),
        "job {id} ended {:?}: {job:?}",
        job.state
    );
    let history = ledger
        .history("job", &id.to_string())
        .await
        .expect("history");
    let states: Vec<_> = history.iter().filter(|h| h.event == "state").collect();
    crate::chaos::assert_one_lease_at_a_time(id, &states);
    let completions = states
        .iter()
        .filter(|h| h.to.as_deref() == Some("completed"))
        .count();
    assert_eq!(
        completions,
        usize::from(job.state == JobState::Completed),
        "job {id} completed {completions} times"
    );
    job.crashes
}

/// For every source of `dataset` in `revisions` (per key, the revisions the client was told
/// about, in order), [`assert_head_in_stores`] with its last one.
pub(crate) async fn assert_heads_in_stores(
    ledger: &dyn receipts::Ledger,
    vectors: &dyn VectorStore,
    dataset: &str,
    revisions: &HashMap<String, Vec<(Uuid, Instant)>>,
    deleted: &[String],
) {
    for (key, chain) in revisions {
        let (head, _) = chain.last().expect("a revision");
        assert_head_in_stores(
            ledger,
            vectors,
            (dataset, key),
            *head,
            deleted.contains(key),
        )
        .await;
    }
}

/// The head of `source` is `head`, the last revision the client was told about; its job
/// completed; a live head is verified in both backends and is the source's only current
/// revision in the vector store, every point with its dimension; a tombstone (`deleted`) is
/// excluded in both, and nothing of its source is current in the vector store.
async fn assert_head_in_stores(
    ledger: &dyn receipts::Ledger,
    vectors: &dyn VectorStore,
    (dataset, key): (&str, &str),
    head: Uuid,
    deleted: bool,
) {
    let view = ledger
        .source(dataset, key)
        .await
        .expect("source")
        .expect("exists");
    assert_eq!(
        view.head.id, head,
        "{key}: the head is the last acknowledged"
    );
    assert_eq!(view.deleted, deleted, "{key}: deleted as acknowledged");
    let detail = ledger.revision(head).await.expect("read").expect("head");
    let job = detail.job.as_ref().expect("head job");
    assert_eq!(job.state, JobState::Completed, "{key}: {job:?}");
    let receipts: HashMap<String, ReceiptState> = detail
        .receipts
        .iter()
        .map(|r| (r.backend.as_str().to_owned(), r.state))
        .collect();
    let current = vectors.source_current(dataset, key).await.expect("count");
    if deleted {
        for backend in ["relational", "vector"] {
            assert_eq!(
                receipts.get(backend),
                Some(&ReceiptState::Excluded),
                "{key}: {backend}"
            );
        }
        assert_eq!(
            current, 0,
            "{key}: a deleted source is current in the store"
        );
    } else {
        for backend in ["relational", "vector"] {
            assert_eq!(
                receipts.get(backend),
                Some(&ReceiptState::Verified),
                "{key}: {backend}"
            );
        }
        let points = vectors.revision_points(head).await.expect("points");
        assert!(points.count > 0, "{key}: no points");
        assert_eq!(
            (points.current, points.with_dimension),
            (points.count, points.count),
            "{key}"
        );
        assert_eq!(
            current, points.count,
            "{key}: another revision of the source is still current"
        );
    }
}

/// No search answer held a revision whose successor (or tombstone, for the `deleted` keys)
/// was acknowledged before the search was sent. `revisions` holds, per source key, the
/// revisions the client was told about in order, with the moment each receipt arrived.
/// Returns the hits checked.
pub(crate) fn assert_never_stale(
    seen: &[Seen],
    revisions: &HashMap<String, Vec<(Uuid, Instant)>>,
    deleted: &[String],
) -> usize {
    let mut checked = 0;
    for search in seen {
        for (key, revision) in &search.results {
            let chain = &revisions[key];
            let position = chain
                .iter()
                .position(|(id, _)| id == revision)
                .unwrap_or_else(|| panic!("{key}: search returned unknown revision {revision}"));
            assert!(
                !(deleted.contains(key) && position + 1 == chain.len()),
                "{key}: search returned a tombstone"
            );
            if let Some((successor, acked)) = chain.get(position + 1) {
                assert!(
                    *acked > search.sent,
                    "{key}: search sent after {successor} was acknowledged returned {revision}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 0, "no search returned anything");
    checked
}

async fn search_until(
    http: reqwest::Client,
    base: String,
    token: String,
    stop: Arc<AtomicBool>,
) -> (Vec<Seen>, HashMap<String, usize>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(16);
    let mut seen = Vec::new();
    let mut modes: HashMap<String, usize> = HashMap::new();
    while !stop.load(Ordering::SeqCst) {
        let topic = TOPICS[rng.random_range(0..TOPICS.len())];
        let sent = Instant::now();
        let response = http
            .post(format!("{base}/v1/search"))
            .bearer_auth(&token)
            .json(&json!({ "query": format!("survey of the {topic}"), "top_k": 20, "budget_ms": 1500 }))
            .send()
            .await
            .expect("search");
        let status = response.status();
        let body: Value = response.json().await.expect("json");
        check_status("search", status, &body);
        if status.is_success() {
            *modes
                .entry(body["mode"].as_str().unwrap_or("?").to_owned())
                .or_default() += 1;
            seen.push(Seen {
                sent,
                results: hits(&body),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (seen, modes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_topology_survives_worker_kills_and_a_qdrant_restart() {
    let postgres = testkit::postgres::PostgresServer::start().expect("start PostgreSQL");
    let ledger_url = postgres.create_database("topology").expect("database");
    let mut qdrant = QdrantServer::start().expect("start Qdrant");
    let directory = tempfile::tempdir().expect("tempdir");
    let config_path = directory.path().join("cairn.toml");
    // In-process retries of Qdrant calls stay under half the 4 s lease.
    std::fs::write(&config_path, "[vectors]\nretry_ms = 1500\n").expect("config");
    let paths = Paths {
        ledger: ledger_url.clone(),
        vectors: qdrant.grpc_url(),
        config: config_path.clone(),
    };
    let api_dir = directory.path().join("api");
    let mut serve_env: Vec<(&str, &str)> = worker_env().to_vec();
    serve_env.push(("CAIRN_WORKERS", "0"));
    let config_arg = config_path.to_string_lossy().into_owned();
    let (mut api, base) = crate::crash::spawn_serve_with(
        &api_dir,
        &[
            "--ledger",
            &ledger_url,
            "--vectors",
            &paths.vectors,
            "--config",
            &config_arg,
        ],
        &serve_env,
        "warn",
        Stdio::inherit(),
    )
    .await;
    let token = std::fs::read_to_string(api_dir.join("admin.token"))
        .expect("admin token")
        .trim()
        .to_owned();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");

    let workers_dir = directory.path().join("workers");
    let mut crew: Vec<Child> = Vec::new();
    for index in 0..3 {
        crew.push(start_worker(&paths, &workers_dir, &format!("w-{index}")).await);
    }

    let config = Config::load(
        &Overrides {
            data_dir: Some(directory.path().join("check")),
            ledger_url: Some(ledger_url.clone()),
            ..Overrides::default()
        },
        &HashMap::new(),
    )
    .expect("config");
    let ledger = cairn::open_ledger(&config).await.expect("ledger");
    let stop_searching = Arc::new(AtomicBool::new(false));
    let searcher = tokio::spawn(search_until(
        http.clone(),
        base.clone(),
        token.clone(),
        stop_searching.clone(),
    ));
    let ingestion = tokio::spawn(ingest(http.clone(), base.clone(), token.clone()));

    // Kill a worker at 10 moments (each replaced at once); restart Qdrant after the 2nd.
    let mut rng = rand::rngs::StdRng::seed_from_u64(20261130);
    for kill in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1200))).await;
        let mut doomed = crew.swap_remove(rng.random_range(0..crew.len()));
        doomed.start_kill().expect("SIGKILL");
        doomed.wait().await.expect("reap");
        crew.push(start_worker(&paths, &workers_dir, &format!("r-{kill}")).await);
        if kill == 1 {
            let open = ledger.counts().await.expect("counts").open_jobs();
            assert!(open > 0, "projection ended before the Qdrant restart");
            qdrant.stop();
            tokio::time::sleep(Duration::from_millis(500)).await;
            qdrant.start_again().expect("restart Qdrant");
        }
    }
    let acknowledged = ingestion.await.expect("ingestion");

    // Wait until every job has ended.
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let counts = ledger.counts().await.expect("counts");
        if counts.open_jobs() == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "jobs unfinished: {:?}",
            counts.jobs
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_searching.store(true, Ordering::SeqCst);
    let (seen, modes) = searcher.await.expect("searcher");

    // Jobs: none lost, none done twice.
    let mut crashes = 0;
    for id in &acknowledged.jobs {
        crashes += assert_ended_once(ledger.as_ref(), *id).await;
    }

    assert!(crashes > 0, "no kill hit a worker holding a lease");

    // Stores: every head verified in both backends, every tombstone excluded.
    let vectors = ServerVectorStore::open(
        &ServerOptions::new(&qdrant.grpc_url()),
        &cairn::projection::generation(&config).id,
        gateways::embedder::MODEL_DIMENSION,
    )
    .await
    .expect("the generation's collection");
    assert_heads_in_stores(
        ledger.as_ref(),
        &vectors,
        DATASET,
        &acknowledged.revisions,
        &acknowledged.deleted,
    )
    .await;

    // Search: never a revision already replaced (or deleted) when the search was sent.
    let checked = assert_never_stale(&seen, &acknowledged.revisions, &acknowledged.deleted);
    assert!(
        modes.get("hybrid").copied().unwrap_or(0) > 0,
        "hybrid search never answered: {modes:?}"
    );
    eprintln!(
        "topology: {} jobs ended once each across {KILLS} worker kills ({crashes} leases \
         stranded and rescued) and a Qdrant restart; {} searches ({modes:?}), {checked} results \
         checked",
        acknowledged.jobs.len(),
        seen.len()
    );

    for mut worker in crew {
        worker.start_kill().expect("stop worker");
        let _ = worker.wait().await;
    }
    api.start_kill().expect("stop the API");
    let _ = api.wait().await;
}
