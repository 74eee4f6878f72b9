//! `cairn bench accept`: durable receipts per second through the HTTP API (1 and 16
//! concurrent clients, and the batch endpoint), and in the same run the raw limit: the same
//! documents inserted by a minimal sqlx loop with the same durability (WAL,
//! `synchronous=FULL`), one transaction per document and one per 1000. Writes JSON.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use sqlx::{ConnectOptions, Connection};

use crate::config::{Config, Overrides};

/// Size of each benchmark document.
pub const DOCUMENT_BYTES: usize = 2048;

const WORDS: &[&str] = &[
    "ledger",
    "receipt",
    "durable",
    "projection",
    "vector",
    "lexical",
    "worker",
    "lease",
    "revision",
    "source",
    "dataset",
    "commit",
    "fsync",
    "journal",
    "search",
    "budget",
    "fusion",
    "tombstone",
    "history",
    "heartbeat",
    "quarantine",
    "backoff",
    "jitter",
    "retry",
    "embedding",
    "passage",
    "chunk",
    "qdrant",
    "sqlite",
    "operator",
    "protein",
    "membrane",
    "receptor",
    "cell",
    "gene",
    "expression",
    "cohort",
    "trial",
    "dose",
    "signal",
];

/// A 2 KiB text document of random words (distinct per `index`).
pub fn document(rng: &mut rand::rngs::StdRng, index: usize) -> String {
    let mut text = format!("document {index}. ");
    while text.len() < DOCUMENT_BYTES {
        let word = WORDS[rng.random_range(0..WORDS.len())];
        text.push_str(word);
        text.push(if rng.random_range(0..12) == 0 {
            '.'
        } else {
            ' '
        });
    }
    text.truncate(DOCUMENT_BYTES);
    text
}

fn result(documents: usize, started: Instant) -> Value {
    let seconds = started.elapsed().as_secs_f64();
    json!({ "documents": documents, "seconds": seconds, "per_second": documents as f64 / seconds })
}

fn per_second(value: &Value) -> f64 {
    value
        .get("per_second")
        .and_then(Value::as_f64)
        .unwrap_or(0.0)
}

/// Runs the acceptance benchmark and returns its JSON report: on the embedded SQLite ledger,
/// or with `ledger_url` on that PostgreSQL database (the raw loops then write a table of their
/// own in the same database; every key carries this run's id, so runs never collide).
pub async fn accept(
    documents: usize,
    batch_documents: usize,
    rounds: usize,
    ledger_url: Option<String>,
) -> anyhow::Result<Value> {
    let directory = tempfile::tempdir().context("creating a temporary directory")?;
    let run = receipts::ids::new_v7().simple().to_string();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let corpus: Vec<String> = (0..documents.max(batch_documents))
        .map(|index| document(&mut rng, index))
        .collect();

    // The API, in process, on loopback.
    let overrides = Overrides {
        data_dir: Some(directory.path().join("api")),
        bind: Some("127.0.0.1:0".to_owned()),
        ledger_url: ledger_url.clone(),
        ..Overrides::default()
    };
    // The environment's settings apply (`CAIRN_LEDGER_POOL_SIZE`, `CAIRN_LEDGER_COMMITTERS`...),
    // so a run measures the configuration it names; the data directory and address are its own.
    let config = Config::load(&overrides, &std::env::vars().collect())?;
    std::fs::create_dir_all(&config.data_dir)?;
    let ledger: Arc<dyn receipts::Ledger> = crate::open_ledger(&config).await?;
    crate::ensure_admin_token(ledger.as_ref(), &config.data_dir).await?;
    let token = crate::cli::client::resolve_token(None, &config.data_dir)?;
    let listener = tokio::net::TcpListener::bind(config.bind).await?;
    let base = format!("http://{}", listener.local_addr()?);
    let application = crate::app(ledger, &config, None);
    let server = tokio::spawn(async move { axum::serve(listener, application).await });
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;

    let put_url = format!("{base}/v1/sources");
    let put_token = token.clone();
    let put = move |http: reqwest::Client, dataset: String, key: String, text: String| {
        let url = put_url.clone();
        let token = put_token.clone();
        async move {
            let response = http
                .post(url)
                .bearer_auth(token)
                .json(&json!({ "dataset": dataset, "source_key": key, "content": text }))
                .send()
                .await?;
            anyhow::ensure!(
                response.status().as_u16() == 202,
                "HTTP {}",
                response.status()
            );
            Ok::<(), anyhow::Error>(())
        }
    };

    // Rounds interleave every scenario, so that a slow phase of the machine (its disk's fsync
    // time varies a lot) hits all of them alike; each scenario reports its median round.
    let mut scenarios: Vec<(&str, Vec<Value>)> = [
        "http_1_client",
        "http_16_clients",
        "http_batch_1000",
        "raw_sqlx_tx_per_document",
        "raw_sqlx_tx_per_1000",
    ]
    .into_iter()
    .map(|name| (name, Vec::new()))
    .collect();
    for round in 0..rounds.max(1) {
        eprintln!(
            "round {}/{}: http, 1 client: {documents} documents",
            round + 1,
            rounds.max(1)
        );
        let started = Instant::now();
        for (index, text) in corpus.iter().take(documents).enumerate() {
            put(
                http.clone(),
                "one".to_owned(),
                format!("{run}-r{round}-doc-{index}"),
                text.clone(),
            )
            .await?;
        }
        scenarios[0].1.push(result(documents, started));

        eprintln!(
            "round {}/{}: http, 16 clients: {documents} documents",
            round + 1,
            rounds.max(1)
        );
        let started = Instant::now();
        let mut tasks = Vec::new();
        for client in 0..16 {
            let texts: Vec<(usize, String)> = corpus
                .iter()
                .take(documents)
                .enumerate()
                .filter(|(index, _)| index % 16 == client)
                .map(|(index, text)| (index, text.clone()))
                .collect();
            let put = put.clone();
            let http = http.clone();
            let run = run.clone();
            tasks.push(tokio::spawn(async move {
                for (index, text) in texts {
                    put(
                        http.clone(),
                        "sixteen".to_owned(),
                        format!("{run}-r{round}-doc-{index}"),
                        text,
                    )
                    .await?;
                }
                Ok::<(), anyhow::Error>(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        scenarios[1].1.push(result(documents, started));

        eprintln!(
            "round {}/{}: http, batch endpoint: {batch_documents} documents",
            round + 1,
            rounds.max(1)
        );
        let started = Instant::now();
        for (batch_index, chunk) in corpus[..batch_documents].chunks(1000).enumerate() {
            let items: Vec<Value> = chunk
                .iter()
                .enumerate()
                .map(|(index, text)| {
                    json!({ "dataset": "batch", "source_key": format!("{run}-r{round}-doc-{batch_index}-{index}"), "content": text })
                })
                .collect();
            let response = http
                .post(format!("{base}/v1/sources/batch"))
                .bearer_auth(&token)
                .json(&json!({ "items": items }))
                .send()
                .await?;
            anyhow::ensure!(
                response.status().as_u16() == 200,
                "batch answered HTTP {}",
                response.status()
            );
            let body: Value = response.json().await?;
            let accepted = body["results"].as_array().map(|results| {
                results
                    .iter()
                    .filter(|result| result["accepted"] == true)
                    .count()
            });
            anyhow::ensure!(
                accepted == Some(chunk.len()),
                "batch accepted {accepted:?} of {}",
                chunk.len()
            );
        }
        scenarios[2].1.push(result(batch_documents, started));

        eprintln!("round {}/{}: raw sqlx loops", round + 1, rounds.max(1));
        let (single, batched) = match &ledger_url {
            None => (
                raw_loop(
                    &directory.path().join("raw-single.db"),
                    &corpus[..documents],
                    1,
                    round,
                )
                .await?,
                raw_loop(
                    &directory.path().join("raw-batched.db"),
                    &corpus[..batch_documents],
                    1000,
                    round,
                )
                .await?,
            ),
            Some(url) => (
                raw_postgres_loop(
                    url,
                    &corpus[..documents],
                    1,
                    &format!("{run}-{round}-single"),
                )
                .await?,
                raw_postgres_loop(
                    url,
                    &corpus[..batch_documents],
                    1000,
                    &format!("{run}-{round}-batched"),
                )
                .await?,
            ),
        };
        scenarios[3].1.push(single);
        scenarios[4].1.push(batched);
    }
    server.abort();

    let mut results = serde_json::Map::new();
    let mut medians = std::collections::HashMap::new();
    for (name, rounds) in &scenarios {
        let mut rates: Vec<f64> = rounds.iter().map(per_second).collect();
        rates.sort_by(f64::total_cmp);
        let median = rates.get(rates.len() / 2).copied().unwrap_or(0.0);
        medians.insert(*name, median);
        results.insert(
            (*name).to_owned(),
            json!({ "median_per_second": median, "rounds": rounds }),
        );
    }
    let median = |name: &str| medians.get(name).copied().unwrap_or(0.0);
    let http_16_ratio =
        median("http_16_clients") / median("raw_sqlx_tx_per_document").max(f64::MIN_POSITIVE);
    let batch_ratio =
        median("http_batch_1000") / median("raw_sqlx_tx_per_1000").max(f64::MIN_POSITIVE);
    Ok(json!({
        "benchmark": "accept",
        "document_bytes": DOCUMENT_BYTES,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "ledger": config.ledger_description(),
        "durability": if ledger_url.is_some() {
            "PostgreSQL, synchronous_commit = on (the server's fsync settings apply)"
        } else {
            "WAL, synchronous=FULL (fsync on every commit)"
        },
        "note": "the raw sqlx loops run one client; cairn's http_16_clients runs 16, whose \
                 acceptances share commits (group commit): the ratio compares the service under \
                 concurrency with a single-writer loop, not like with like",
        "rounds": rounds.max(1),
        "results": results,
        "ratios": {
            "http_16_clients_over_raw_tx_per_document": http_16_ratio,
            "http_batch_over_raw_tx_per_1000": batch_ratio,
        },
        "goals": {
            "http_16_clients_beats_raw_tx_per_document": http_16_ratio > 1.0,
            "http_batch_at_least_half_raw_tx_per_1000": batch_ratio >= 0.5,
        },
    }))
}

/// Inserts `texts` with a minimal sqlx loop, `per_transaction` documents per commit.
async fn raw_loop(
    path: &Path,
    texts: &[String],
    per_transaction: usize,
    round: usize,
) -> anyhow::Result<Value> {
    let mut connection =
        receipts::sqlite::connect_options(path, std::time::Duration::from_secs(10))
            .create_if_missing(true)
            .connect()
            .await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS documents (id INTEGER PRIMARY KEY, source_key TEXT NOT NULL UNIQUE, sha256 TEXT NOT NULL, bytes BLOB NOT NULL)")
        .execute(&mut connection)
        .await?;
    let started = Instant::now();
    for (chunk_index, chunk) in texts.chunks(per_transaction).enumerate() {
        let mut transaction = connection.begin().await?;
        for (index, text) in chunk.iter().enumerate() {
            sqlx::query("INSERT INTO documents (source_key, sha256, bytes) VALUES (?, ?, ?)")
                .bind(format!("r{round}-doc-{chunk_index}-{index}"))
                .bind(receipts::ids::sha256_hex(text.as_bytes()))
                .bind(text.as_bytes())
                .execute(&mut *transaction)
                .await?;
        }
        transaction.commit().await?;
    }
    let report = result(texts.len(), started);
    connection.close().await?;
    Ok(report)
}

/// The same loop on PostgreSQL: one connection, `synchronous_commit = on`, a table of its own.
async fn raw_postgres_loop(
    url: &str,
    texts: &[String],
    per_transaction: usize,
    prefix: &str,
) -> anyhow::Result<Value> {
    use sqlx::{ConnectOptions as _, Connection as _};
    let options: sqlx::postgres::PgConnectOptions = url.parse()?;
    let mut connection = options
        .options([("synchronous_commit", "on")])
        .connect()
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_raw_documents (id bigserial PRIMARY KEY, \
         source_key text NOT NULL UNIQUE, sha256 text NOT NULL, bytes bytea NOT NULL)",
    )
    .execute(&mut connection)
    .await?;
    let started = Instant::now();
    for (chunk_index, chunk) in texts.chunks(per_transaction).enumerate() {
        let mut transaction = connection.begin().await?;
        for (index, text) in chunk.iter().enumerate() {
            sqlx::query(
                "INSERT INTO bench_raw_documents (source_key, sha256, bytes) VALUES ($1, $2, $3)",
            )
            .bind(format!("{prefix}-{chunk_index}-{index}"))
            .bind(receipts::ids::sha256_hex(text.as_bytes()))
            .bind(text.as_bytes())
            .execute(&mut *transaction)
            .await?;
        }
        transaction.commit().await?;
    }
    let report = result(texts.len(), started);
    connection.close().await?;
    Ok(report)
}

/// No-op work for the queue benchmark: completes at once.
#[derive(Debug, Clone, Copy)]
struct NoOp;

#[async_trait::async_trait]
impl worker::Work for NoOp {
    async fn run(&self, _job: &receipts::Job) -> Result<(), receipts::Failure> {
        Ok(())
    }
}

#[cfg(feature = "peer-apalis")]
mod apalis_peer;

mod extraction;
pub use extraction::extract;
mod corpus;
mod project;
pub use project::{project, project_runs, ProjectBench};
mod raw;
pub use raw::models;

mod database;
mod queue_postgres;

mod search_latency;
pub use search_latency::{search, SearchBench};

mod temporal;
pub use temporal::{temporal, TemporalBench};
mod access;
mod filters;
pub use access::access;
pub use filters::{filters, FilterBench};

mod served;

mod mcp;
pub use mcp::{mcp, McpBench};
mod oauth;
pub use oauth::{oauth, OAuthBench};

mod connector;
mod prune;
mod push_hook;
pub use connector::{connector, ConnectorBench};
pub use prune::{prune, PruneBench};
pub use push_hook::{push_hook, PushHookBench};
mod verify;
pub use verify::{verify, VerifyBench};
mod webhooks;
pub use webhooks::{webhooks, WebhooksBench};

/// The machine a report was measured on.
pub(crate) fn machine() -> Value {
    json!({"cpus": std::thread::available_parallelism().map_or(0, usize::from)})
}

/// The value at `fraction` (0..=1) of sorted samples (0 when there are none).
pub(crate) fn percentile_f64(sorted: &[f64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() - 1) as f64 * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// The peer's throughput on the same workload, when it is built in.
async fn peer_throughput(
    directory: &Path,
    jobs: usize,
    workers: usize,
    concurrency: usize,
) -> anyhow::Result<Option<Value>> {
    #[cfg(feature = "peer-apalis")]
    {
        eprintln!("queue: the same {jobs} jobs on apalis with {workers} worker(s)");
        let poll = std::time::Duration::from_millis(10);
        apalis_peer::throughput(directory, jobs, workers, concurrency, poll)
            .await
            .map(Some)
    }
    #[cfg(not(feature = "peer-apalis"))]
    {
        let _ = (directory, jobs, workers, concurrency);
        Ok(None)
    }
}

fn percentile(sorted: &[i64], fraction: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let index = ((sorted.len() - 1) as f64 * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

async fn queue_ledger(directory: &Path, name: &str) -> anyhow::Result<Arc<dyn receipts::Ledger>> {
    let options = receipts::SqliteOptions::new(directory.join(format!("{name}.db")));
    Ok(Arc::new(
        receipts::SqliteLedger::open(options, Arc::new(receipts::SystemClock)).await?,
    ))
}

/// How the queue benchmark runs.
#[derive(Debug, Clone)]
pub struct QueueBench {
    /// A PostgreSQL ledger to measure (workers then run as separate processes); `None`: a
    /// temporary SQLite ledger per scenario, workers as tasks.
    pub ledger_url: Option<String>,
    /// Worker counts to measure.
    pub worker_counts: Vec<usize>,
    /// Jobs per throughput scenario.
    pub jobs: usize,
    /// Jobs accepted one by one for the latency scenario.
    pub latency_jobs: usize,
    /// Jobs each worker runs at once (cairn and the peer alike).
    pub concurrency: usize,
}

/// `cairn bench queue`: no-op jobs claimed and completed per second with 1, 2, 4 and 8 workers,
/// and enqueue-to-start latency of jobs accepted one by one while a worker waits. Built with
/// the `peer-apalis` feature, the same run measures apalis (SQLite) on the same workload.
pub async fn queue(bench: QueueBench) -> anyhow::Result<Value> {
    if let Some(url) = &bench.ledger_url {
        return queue_postgres::queue(&bench, url).await;
    }
    let QueueBench {
        jobs,
        latency_jobs,
        concurrency,
        ..
    } = bench;
    let directory = tempfile::tempdir().context("creating a temporary directory")?;
    let mut throughput = serde_json::Map::new();
    let mut peer = serde_json::Map::new();
    let mut ratios = serde_json::Map::new();
    for workers in bench.worker_counts.iter().copied() {
        let ledger = queue_ledger(directory.path(), &format!("throughput-{workers}")).await?;
        for chunk in (0..jobs).collect::<Vec<_>>().chunks(1000) {
            let submissions = chunk
                .iter()
                .map(|index| {
                    receipts::Submission::text(
                        &format!("d{}", index % 4),
                        &format!("k{index}"),
                        "bench",
                        &format!("job {index}"),
                    )
                })
                .collect();
            for result in ledger.accept(submissions).await {
                result?;
            }
        }
        eprintln!("queue: {jobs} no-op jobs with {workers} worker(s)");
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let started = Instant::now();
        let mut handles = Vec::new();
        let mut stats = Vec::new();
        for index in 0..workers {
            let mut config = worker::WorkerConfig::new(format!("bench-{index}"));
            config.concurrency = concurrency;
            config.poll_interval = std::time::Duration::from_millis(20);
            let runner = worker::Worker::new(ledger.clone(), Arc::new(NoOp), config);
            stats.push(runner.stats());
            let mut stopped = stopped.clone();
            handles.push(tokio::spawn(runner.run(async move {
                let _ = stopped.changed().await;
            })));
        }
        // A run counts once `complete` returned: its completion is committed.
        while stats
            .iter()
            .map(|stats| stats.completed.load(std::sync::atomic::Ordering::Relaxed))
            .sum::<u64>()
            < jobs as u64
        {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        let seconds = started.elapsed().as_secs_f64();
        let report =
            json!({ "jobs": jobs, "seconds": seconds, "per_second": jobs as f64 / seconds });
        let _ = stop.send(true);
        for handle in handles {
            handle.await?;
        }
        let completed = ledger.counts().await?.jobs.get("completed").copied();
        anyhow::ensure!(
            completed == Some(jobs as i64),
            "the ledger counts {completed:?} completed jobs, not {jobs}"
        );
        if let Some(apalis) = peer_throughput(directory.path(), jobs, workers, concurrency).await? {
            ratios.insert(
                format!("{workers}_workers"),
                json!(per_second(&report) / per_second(&apalis)),
            );
            peer.insert(format!("{workers}_workers"), apalis);
            // The peer fetches at most `concurrency` jobs per worker per poll (10 ms): its
            // ceiling, reported beside the ratio so the ratio is not read as engine speed alone.
            peer.insert(
                format!("{workers}_workers_poll_ceiling_jobs_per_second"),
                json!((workers * concurrency) as f64 / 0.010),
            );
        }
        throughput.insert(format!("{workers}_workers"), report);
    }

    eprintln!("queue: enqueue-to-start latency over {latency_jobs} jobs accepted one by one");
    let ledger = queue_ledger(directory.path(), "latency").await?;
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let mut config = worker::WorkerConfig::new("latency");
    config.poll_interval = std::time::Duration::from_millis(500);
    let runner = worker::Worker::new(ledger.clone(), Arc::new(NoOp), config);
    let handle = tokio::spawn(runner.run(async move {
        let _ = stopped.changed().await;
    }));
    let mut ids = Vec::new();
    for index in 0..latency_jobs {
        let submission = receipts::Submission::text(
            "latency",
            &format!("k{index}"),
            "bench",
            &format!("latency {index}"),
        );
        let receipt = ledger
            .accept(vec![submission])
            .await
            .pop()
            .context("no result")??;
        ids.push(receipt.projection_job_id);
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    let mut latencies = Vec::new();
    for id in ids {
        loop {
            let job = ledger.job(id).await?.context("job vanished")?;
            if job.state == receipts::JobState::Completed {
                latencies.push(job.started_at.unwrap_or(job.run_at) - job.created_at);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    let _ = stop.send(true);
    handle.await?;
    latencies.sort_unstable();
    Ok(json!({
        "benchmark": "queue",
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "jobs": jobs,
        "concurrency_per_worker": concurrency,
        "work": "no-op; claim and completion are durable (WAL, synchronous=FULL)",
        "throughput": throughput,
        "enqueue_to_start_ms": {
            "jobs": latencies.len(),
            "p50": percentile(&latencies, 0.5) as f64 / 1000.0,
            "p99": percentile(&latencies, 0.99) as f64 / 1000.0,
            "max": latencies.last().copied().unwrap_or(0) as f64 / 1000.0,
        },
        "peer": if cfg!(feature = "peer-apalis") {
            json!({
                "name": "apalis 0.7.4 + apalis-sql 0.7.3 (SQLite, WAL, synchronous=FULL), poll 10 ms, buffer = concurrency",
                "throughput": peer,
                "cairn_over_peer": ratios,
            })
        } else {
            json!("not measured: build with --features peer-apalis")
        },
    }))
}

/// CPU seconds (user and system) of the whole process, threads that have ended included
/// (`/proc/self/stat`; 0 elsewhere).
pub(crate) fn process_cpu() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let Some(close) = stat.rfind(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let field = |index: usize| {
        fields
            .get(index)
            .and_then(|field| field.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat; 12 and 13 after the name.
    (field(11) + field(12)) / 100.0
}
