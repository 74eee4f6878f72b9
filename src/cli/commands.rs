//! The commands of the `cairn` binary: each one's flags (a clap `Args` struct) and what it
//! does (`run`). `main.rs` lists them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;

use crate::config::{Config, Overrides, DEFAULT_BIND, DEFAULT_DATA_DIR};

/// Where the client finds the server and its token.
#[derive(Debug, clap::Args)]
struct ClientArgs {
    /// Base URL of the cairn server.
    #[arg(long, global = true, env = "CAIRN_SERVER", default_value_t = format!("http://{DEFAULT_BIND}"))]
    server: String,
    /// Bearer token (default: the admin token in --data-dir).
    #[arg(long, global = true, env = "CAIRN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The server's data directory, to read its admin.token.
    #[arg(long, global = true, env = "CAIRN_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
}

impl ClientArgs {
    /// A client of the server, with the given token or the admin token in the data directory.
    fn connect(self) -> anyhow::Result<crate::cli::client::Client> {
        let token = crate::cli::client::resolve_token(self.token, &self.data_dir)?;
        crate::cli::client::Client::new(&self.server, token)
    }
}

/// Filters shared by the ops listings and bulk actions.
#[derive(Debug, Clone, clap::Args)]
struct OpsFilter {
    /// Only this dataset.
    #[arg(long)]
    dataset: Option<String>,
    /// Only jobs whose last error has this code.
    #[arg(long)]
    error_code: Option<String>,
    /// Only these states (comma-separated).
    #[arg(long)]
    state: Option<String>,
    /// Source key text, or a job or revision id.
    #[arg(long)]
    query: Option<String>,
}

impl From<OpsFilter> for crate::cli::ops::Filter {
    fn from(filter: OpsFilter) -> Self {
        Self {
            dataset: filter.dataset,
            error_code: filter.error_code,
            state: filter.state,
            q: filter.query,
        }
    }
}

/// One job by id, or every job matching the filters.
#[derive(Debug, Clone, clap::Args)]
struct OpsAction {
    /// Job id (omit to act by filter).
    id: Option<String>,
    #[command(flatten)]
    filter: OpsFilter,
    /// Why (recorded in history).
    #[arg(long)]
    reason: Option<String>,
    /// Act on every match (without it a bulk action only lists the candidates).
    #[arg(long)]
    yes: bool,
}

#[derive(Debug, Subcommand)]
enum OpsCommand {
    /// Queue depth, throughput, latency percentiles, lease health, pauses.
    Status,
    /// Running jobs with their worker, stage, lease and heartbeat.
    Leases {
        #[command(flatten)]
        filter: OpsFilter,
        /// Most rows.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Jobs waiting to retry: when, the rule that set it, every error so far.
    Retries {
        #[command(flatten)]
        filter: OpsFilter,
        /// Most rows.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Dead, quarantined and cancelled jobs with the reason.
    Dead {
        #[command(flatten)]
        filter: OpsFilter,
        /// Most rows.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// One job: history, receipts with read-back evidence, the revision chain.
    Job {
        /// Job id.
        id: String,
    },
    /// Requeue one job, or (without an id) every dead/quarantined/cancelled job matching the
    /// filters: a dry run unless --yes.
    Requeue(OpsAction),
    /// Cancel one job, or (without an id) every waiting or running job matching the filters:
    /// a dry run unless --yes.
    Cancel(OpsAction),
    /// Stop claiming (one dataset, or all).
    Pause {
        /// Dataset (default: every dataset).
        #[arg(long)]
        dataset: Option<String>,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Claim again.
    Resume {
        /// Dataset (default: the pause of every dataset).
        #[arg(long)]
        dataset: Option<String>,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Create a token and print its secret (shown once).
    Create {
        /// Name, recorded as the actor `token:<name>`.
        #[arg(long)]
        name: String,
        /// Scopes: ingest, search, ops:read, ops:write, admin.
        #[arg(long = "scope", required = true)]
        scopes: Vec<String>,
        /// Limit the token to these datasets (repeatable).
        #[arg(long = "dataset")]
        datasets: Vec<String>,
        /// Lifetime: 90d, 12h, 30m, 45s (default: no expiry).
        #[arg(long)]
        expires_in: Option<String>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List tokens: id, name, state, scopes, datasets, expiry (never a secret).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Revoke a token: it stops working at once, in every process.
    Revoke {
        /// Token id (`cairn token list`).
        id: String,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Replace a token's secret (same name, scopes, datasets); print the new one (shown once).
    Rotate {
        /// Token id (`cairn token list`).
        id: String,
        /// Why (recorded in history).
        #[arg(long)]
        reason: Option<String>,
        /// The new token's lifetime (default: the old one's, counted from now).
        #[arg(long)]
        expires_in: Option<String>,
        #[command(flatten)]
        store: StoreArgs,
    },
}

/// Where the ledger is, for commands that open it directly.
#[derive(Debug, Clone, clap::Args)]
struct StoreArgs {
    /// Data directory (the embedded SQLite ledger, and the admin token).
    #[arg(long, env = "CAIRN_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// PostgreSQL ledger URL (`postgres://user@host:port/db`; also `CAIRN_LEDGER_URL`).
    #[arg(long)]
    ledger: Option<String>,
}

impl TokenCommand {
    fn store(&self) -> &StoreArgs {
        match self {
            TokenCommand::Create { store, .. }
            | TokenCommand::List { store, .. }
            | TokenCommand::Revoke { store, .. }
            | TokenCommand::Rotate { store, .. } => store,
        }
    }
}

#[derive(Debug, Subcommand)]
enum EvalCommand {
    /// nDCG@10 and recall@100 of every mode on a BEIR data set, on a temporary cairn.
    Beir {
        /// The data set's directory (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv).
        directory: PathBuf,
        /// The qrels split.
        #[arg(long, default_value = "train")]
        split: String,
        /// Use only the first N documents (0: all); keeps the queries they fully cover.
        #[arg(long, default_value_t = 0)]
        limit_docs: usize,
        /// Then supersede 20% and delete 10% of the documents and evaluate again.
        #[arg(long)]
        churn: bool,
        /// Budget per search in milliseconds.
        #[arg(long, default_value_t = 10_000)]
        budget_ms: u64,
        /// Modes to evaluate (comma-separated); `lexical` alone skips projection.
        #[arg(long, value_delimiter = ',', default_values_t = ["vector".to_owned(), "lexical".to_owned(), "auto".to_owned()])]
        modes: Vec<String>,
        /// Keep the data in this directory (and reuse an earlier run's) instead of a
        /// temporary one.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Qdrant server gRPC URL (also `CAIRN_VECTORS_URL`): measure the networked store, in a
        /// collection of this run's own.
        #[arg(long)]
        vectors: Option<String>,
        /// TOML configuration file (projection and search settings).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to write the JSON report.
        #[arg(long, default_value = "eval-beir.json")]
        out: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// No-op jobs claimed and completed per second with 1, 2, 4 and 8 workers, and
    /// enqueue-to-start latency.
    Queue {
        /// Jobs per throughput scenario.
        #[arg(long, default_value_t = 5000)]
        jobs: usize,
        /// Jobs accepted one by one for the latency scenario.
        #[arg(long, default_value_t = 300)]
        latency_jobs: usize,
        /// Jobs each worker runs at once.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        /// Worker counts to measure (comma-separated). Each side's best count is compared: apalis
        /// (tasks in one process) gains up to 8, so 8 is measured too.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8])]
        workers: Vec<usize>,
        /// Measure a PostgreSQL ledger, with workers as separate `cairn worker` processes.
        #[arg(long)]
        ledger: Option<String>,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-queue.json")]
        out: PathBuf,
    },
    /// Projection throughput (accepted to verified) against the raw embedder on the same
    /// chunks, qdrant-edge upsert rate and peak RSS.
    Project {
        /// A BEIR corpus.jsonl.
        #[arg(long, default_value = "../shared/eval/scifact/corpus.jsonl")]
        corpus: PathBuf,
        /// Documents to project (from the start of the corpus).
        #[arg(long, default_value_t = 400)]
        docs: usize,
        /// Workers.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Jobs each worker runs at once.
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Also run the pipeline with this graph (a Bolt URL; user, password and database
        /// from CAIRN_GRAPH_USER, CAIRN_GRAPH_PASSWORD, CAIRN_GRAPH_DATABASE).
        #[arg(long)]
        graph: Option<String>,
        /// Then project a new revision of every document (one in eight with changed text, the
        /// rest with a new tag) and compare with the first projection (chunk reuse).
        #[arg(long)]
        edits: bool,
        /// Project the PDFs of this folder that have a text layer (at most `--docs`) instead
        /// of the corpus, e.g. pdf.js's `test/pdfs`: the pipeline extracts them again.
        #[arg(long)]
        pdfs: Option<PathBuf>,
        /// With `--pdfs`: only the PDFs whose text makes at least this many chunks (pdf.js's
        /// corpus is mostly one-line test files; documents people have are longer).
        #[arg(long, default_value_t = 1)]
        min_chunks: usize,
        /// Qdrant server gRPC URL (also `CAIRN_VECTORS_URL`): measure the networked store, in a
        /// collection of this run's own.
        #[arg(long)]
        vectors: Option<String>,
        /// TOML configuration file (projection settings).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-project.json")]
        out: PathBuf,
    },
    /// Search latency per mode at each corpus size, against the raw embedder plus a bare
    /// qdrant-edge search.
    Search {
        /// Corpus sizes in chunks (comma-separated).
        #[arg(long, value_delimiter = ',', default_values_t = [10_000usize, 100_000])]
        sizes: Vec<usize>,
        /// Queries per mode (the overhead is a difference of two p50s of ~13 ms series, so
        /// it needs several hundred samples; it still moves by about 0.25 ms between runs).
        #[arg(long, default_value_t = 500)]
        queries: usize,
        /// Results per query.
        #[arg(long, default_value_t = 10)]
        top_k: usize,
        /// Keep each loaded corpus under DIR/SIZE and reuse it on the next run (default: a
        /// temporary directory per size).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Qdrant server gRPC URL (also `CAIRN_VECTORS_URL`): measure the networked store, in a
        /// collection of this run's own.
        #[arg(long)]
        vectors: Option<String>,
        /// TOML configuration file (model and search settings).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-search.json")]
        out: PathBuf,
    },
    /// Extraction throughput per format (PDF, DOCX, HTML, Markdown) on the files of the
    /// given folders, one document at a time.
    Extract {
        /// Folders to read (recursively); files are chosen by extension.
        #[arg(long = "dir", default_value = "extract/tests/fixtures")]
        dirs: Vec<PathBuf>,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-extract.json")]
        out: PathBuf,
    },
    /// Durable receipts per second through the API against a raw sqlx loop.
    Accept {
        /// Measure a PostgreSQL ledger (a database of its own) instead of SQLite.
        #[arg(long)]
        ledger: Option<String>,
        /// Documents per round for the single-document scenarios.
        #[arg(long, default_value_t = 1000)]
        docs: usize,
        /// Documents per round for the batch scenarios (multiple of 1000).
        #[arg(long, default_value_t = 5000)]
        batch_docs: usize,
        /// Rounds; every scenario runs once per round and reports its median.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-accept.json")]
        out: PathBuf,
    },
}

/// Run the API (and, with workers.count > 0, the workers) on the embedded SQLite ledger in
/// --data-dir, or on a PostgreSQL ledger with --ledger.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Data directory (SQLite ledger, vector shard, admin token).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// PostgreSQL ledger URL (also `CAIRN_LEDGER_URL`, `ledger.url`).
    #[arg(long)]
    ledger: Option<String>,
    /// Qdrant server gRPC URL (also `CAIRN_VECTORS_URL`, `vectors.url`; the API key comes from
    /// `CAIRN_VECTORS_API_KEY`). Unset: the embedded qdrant-edge store.
    #[arg(long)]
    vectors: Option<String>,
    /// Address to listen on.
    #[arg(long)]
    bind: Option<String>,
    /// TOML configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
}

impl ServeArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let ServeArgs {
            data_dir,
            ledger,
            vectors,
            bind,
            config,
        } = self;
        let config = Config::load(
            &Overrides {
                data_dir,
                bind,
                config_file: config,
                ledger_url: ledger,
                vectors_url: vectors,
            },
            env,
        )?;
        let shutdown = crate::shutdown_signal();
        crate::serve(config, shutdown).await?;

        Ok(ExitCode::SUCCESS)
    }
}

/// Run projection workers on the data directory in a process of their own (for a data
/// directory whose `cairn serve` runs with workers.count = 0, or none running: one process
/// owns the embedded vector store).
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// Data directory (the server's, with the embedded ledger; the vector shard).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// PostgreSQL ledger URL: workers on any machine share it (also `CAIRN_LEDGER_URL`).
    #[arg(long)]
    ledger: Option<String>,
    /// Qdrant server gRPC URL: workers on any machine share it (also `CAIRN_VECTORS_URL`; the
    /// API key comes from `CAIRN_VECTORS_API_KEY`). Unset: the embedded qdrant-edge store.
    #[arg(long)]
    vectors: Option<String>,
    /// TOML configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Jobs run at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Lease owner name (default: host-pid).
    #[arg(long)]
    owner: Option<String>,
    /// Fault-injection setting for tests of the job lifecycle: instead of projecting, every
    /// job sleeps this many milliseconds and completes.
    #[arg(long, hide = true)]
    simulate_work_ms: Option<u64>,
}

impl WorkerArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let WorkerArgs {
            data_dir,
            ledger,
            vectors,
            config,
            concurrency,
            owner,
            simulate_work_ms,
        } = self;
        let config = Config::load(
            &Overrides {
                data_dir,
                bind: None,
                config_file: config,
                ledger_url: ledger,
                vectors_url: vectors,
            },
            env,
        )?;
        // Signals are handled from here on, through the model's loading.
        let shutdown = crate::shutdown_signal();
        crate::datadir::prepare(&config.data_dir)?;
        let ledger = crate::open_ledger(&config).await?;
        let owner = owner.unwrap_or_else(|| crate::worker_owner("worker"));
        let mut worker_config = worker::WorkerConfig::new(owner.clone());
        worker_config.concurrency = concurrency.max(1);
        let mut projection = None;
        let (work, what): (std::sync::Arc<dyn worker::Work>, String) = match simulate_work_ms {
            Some(delay) => (
                std::sync::Arc::new(crate::SimulatedWork(std::time::Duration::from_millis(
                    delay,
                ))),
                format!("simulated work of {delay} ms per job"),
            ),
            None => {
                let opened = crate::projection::open_projection(&config, ledger.clone()).await?;
                let work = opened.work.clone();
                projection = Some(opened);
                (
                    work,
                    format!(
                        "projection, generation {}",
                        crate::projection::generation(&config).id
                    ),
                )
            }
        };
        println!(
            "worker {owner} running ({what}) on the ledger {}, vectors {}, graph {}, backends {}",
            config.ledger_description(),
            config.vectors_description(),
            config.graph_description(),
            config
                .backends
                .iter()
                .map(|backend| backend.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        worker::Worker::new(ledger, work, worker_config)
            .run(shutdown)
            .await;
        if let Some(projection) = projection {
            projection.close().await?;
        }

        Ok(ExitCode::SUCCESS)
    }
}

/// Send files and folders to cairn through the batch API.
#[derive(Debug, clap::Args)]
pub struct IngestArgs {
    /// Files or folders (walked recursively; the source key is the path inside the folder).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Dataset to ingest into.
    #[arg(long)]
    dataset: String,
    /// Items per batch request.
    #[arg(long, default_value_t = 200)]
    batch_size: usize,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl IngestArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let IngestArgs {
            paths,
            dataset,
            batch_size,
            quiet,
            client,
        } = self;
        let api = client.connect()?;
        let summary = crate::cli::client::ingest(&api, &paths, &dataset, batch_size, quiet).await?;
        crate::cli::client::print_summary(&summary);
        if !summary.rejected.is_empty() {
            return Ok(ExitCode::from(2));
        }

        Ok(ExitCode::SUCCESS)
    }
}

/// Search current revisions (vector and lexical, fused) and print a table.
#[derive(Debug, clap::Args)]
pub struct SearchArgs {
    /// The query text.
    query: String,
    /// Datasets to search (repeat; default: every dataset the token may read).
    #[arg(long = "dataset")]
    datasets: Vec<String>,
    /// Results wanted (1-100).
    #[arg(long, default_value_t = 10)]
    top_k: u32,
    /// Time budget in milliseconds (default: the server's).
    #[arg(long)]
    budget_ms: Option<u64>,
    /// auto, vector or lexical.
    #[arg(long, default_value = "auto")]
    mode: String,
    /// One result per passage instead of one per source.
    #[arg(long)]
    all_passages: bool,
    /// Print the server's JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl SearchArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let SearchArgs {
            query,
            datasets,
            top_k,
            budget_ms,
            mode,
            all_passages,
            json,
            client,
        } = self;
        let api = client.connect()?;
        let mut body = serde_json::json!({
            "query": query,
            "top_k": top_k,
            "mode": mode,
            "group_by_source": !all_passages,
        });
        if !datasets.is_empty() {
            body["datasets"] = serde_json::json!(datasets);
        }
        if let Some(budget_ms) = budget_ms {
            body["budget_ms"] = serde_json::json!(budget_ms);
        }
        crate::cli::client::search(&api, &body, json).await?;

        Ok(ExitCode::SUCCESS)
    }
}

/// The sources linked to a source in the graph, and their tags (bound to current revisions).
#[derive(Debug, clap::Args)]
pub struct GraphArgs {
    /// The source key.
    source_key: String,
    /// Its dataset.
    #[arg(long)]
    dataset: String,
    /// out (the sources it links to), in (those linking to it) or both.
    #[arg(long, default_value = "both")]
    direction: String,
    /// Most links (1-100).
    #[arg(long, default_value_t = 100)]
    limit: u32,
    /// Print the server's JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl GraphArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        use crate::cli::ops::encode;
        let api = self.client.connect()?;
        let answer = api
            .get(&format!(
                "/v1/graph/sources?dataset={}&source_key={}&direction={}&limit={}",
                encode(&self.dataset),
                encode(&self.source_key),
                encode(&self.direction),
                self.limit
            ))
            .await?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&answer)?);
            return Ok(ExitCode::SUCCESS);
        }
        let text = |value: &serde_json::Value| value.as_str().unwrap_or("-").to_owned();
        println!(
            "{}/{} (head {})",
            text(&answer["dataset"]),
            text(&answer["source_key"]),
            text(&answer["head_revision_id"])
        );
        let links = answer["links"].as_array().cloned().unwrap_or_default();
        if links.is_empty() {
            println!("no linked current sources");
        }
        for link in links {
            let arrow = if link["direction"] == "in" {
                "<-"
            } else {
                "->"
            };
            let tags: Vec<String> = link["tags"]
                .as_array()
                .map(|tags| tags.iter().map(text).collect())
                .unwrap_or_default();
            println!(
                "  {arrow} {}  (head {}){}",
                text(&link["source_key"]),
                text(&link["head_revision_id"]),
                if tags.is_empty() {
                    String::new()
                } else {
                    format!("  tags: {}", tags.join(", "))
                }
            );
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Find drift between the ledger and the graph for a dataset (current heads missing from the
/// graph, graph revisions the ledger does not know or retired), and with --repair fix it.
/// Works on the ledger and the graph directly, like a worker.
#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    /// The dataset.
    #[arg(long)]
    dataset: String,
    /// Repair what is found (default: report only).
    #[arg(long)]
    repair: bool,
    /// Data directory (the embedded ledger).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// PostgreSQL ledger URL (also `CAIRN_LEDGER_URL`).
    #[arg(long)]
    ledger: Option<String>,
    /// TOML configuration file (graph settings; the password from CAIRN_GRAPH_PASSWORD).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

impl ReconcileArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let config = Config::load(
            &Overrides {
                data_dir: self.data_dir,
                config_file: self.config,
                ledger_url: self.ledger,
                ..Overrides::default()
            },
            env,
        )?;
        receipts::validate::dataset(&self.dataset)?;
        let Some(options) = &config.graph else {
            anyhow::bail!("no graph is configured: set graph.url (or CAIRN_GRAPH_URL)");
        };
        let ledger = crate::open_ledger(&config).await?;
        let files = gateways::ModelFiles::locate(&config.projection.models_dir)?;
        let chunker = std::sync::Arc::new(gateways::Chunker::new(
            files.tokenizer()?,
            config.projection.chunker,
        )?);
        let store = gateways::BoltGraphStore::open(options)
            .await
            .with_context(|| format!("opening the graph at {}", options.url))?;
        let stage = worker::GraphStage::new(
            ledger,
            chunker,
            std::sync::Arc::new(store),
            vec![std::sync::Arc::new(gateways::graph::links::LinkExtractor)],
            &crate::projection::generation(&config).id,
        );
        let report = stage
            .reconcile(&self.dataset, self.repair)
            .await
            .map_err(|failure| anyhow::anyhow!("{}: {}", failure.code, failure.message))?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            println!(
                "{} current heads checked in {}; {} missing from the graph, {} graph revisions \
                 unknown to the ledger, {} stale HEADs; {} repaired",
                report.checked,
                self.dataset,
                report.missing.len(),
                report.unknown.len(),
                report.stale_heads.len(),
                report.repaired
            );
            for (what, items) in [
                ("missing", &report.missing),
                ("unknown", &report.unknown),
                ("stale HEAD", &report.stale_heads),
            ] {
                for item in items {
                    println!("  {what}: {item}");
                }
            }
        }
        let clean =
            report.missing.is_empty() && report.unknown.is_empty() && report.stale_heads.is_empty();
        Ok(if clean || self.repair {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(3)
        })
    }
}

/// Operations: what is running, retrying, dead; requeue, cancel, pause, resume.
#[derive(Debug, clap::Args)]
pub struct OpsArgs {
    #[command(subcommand)]
    command: OpsCommand,
    /// Print the server's JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl OpsArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let OpsArgs {
            command,
            json,
            client,
        } = self;
        let api = client.connect()?;
        run_ops(&api, command, json).await?;

        Ok(ExitCode::SUCCESS)
    }
}

/// Projection generations: build one beside the active one, follow it, switch, roll back,
/// retire (through the ops API; changes need an admin token).
#[derive(Debug, clap::Args)]
pub struct GenerationArgs {
    #[command(subcommand)]
    command: GenerationCommand,
    /// Print the server's JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Subcommand)]
enum GenerationCommand {
    /// Every generation with its state and progress (verified heads, rate, ETA, failures).
    Status,
    /// Build a new generation beside the active one: one low-priority rebuild job per current
    /// head; new documents are projected into both. Unset settings come from the server.
    Create {
        /// Most tokens per chunk.
        #[arg(long)]
        max_tokens: Option<usize>,
        /// Tokens shared by neighbouring chunks.
        #[arg(long)]
        overlap_tokens: Option<usize>,
        /// Backends, comma-separated (relational,vector).
        #[arg(long, value_delimiter = ',')]
        backends: Option<Vec<String>>,
        /// Priority of the rebuild jobs (default -10: fresh ingest goes first).
        #[arg(long, allow_hyphen_values = true)]
        priority: Option<i64>,
        /// Why (history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Make a generation the active one in one step (refused while heads are missing in it).
    Switch {
        /// The generation id (`g-...`).
        id: String,
        /// Switch even with heads not yet verified in it (they are named).
        #[arg(long)]
        force: bool,
        /// Why (history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Retire a generation that is not active: cancel its work, delete its chunk rows and
    /// vectors, read back that they are gone.
    Retire {
        /// The generation id (`g-...`).
        id: String,
        /// Why (history).
        #[arg(long)]
        reason: Option<String>,
    },
}

impl GenerationArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let GenerationArgs {
            command,
            json,
            client,
        } = self;
        let api = client.connect()?;
        use crate::cli::generations as generation;
        match command {
            GenerationCommand::Status => generation::status(&api, json).await?,
            GenerationCommand::Create {
                max_tokens,
                overlap_tokens,
                backends,
                priority,
                reason,
            } => {
                let settings = generation::Settings {
                    max_tokens,
                    overlap_tokens,
                    backends,
                    priority,
                };
                generation::create(&api, settings, reason, json).await?
            }
            GenerationCommand::Switch { id, force, reason } => {
                generation::act(&api, "switch", &id, force, reason, json).await?
            }
            GenerationCommand::Retire { id, reason } => {
                generation::act(&api, "retire", &id, false, reason, json).await?
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Server health and counts.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl StatusArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let StatusArgs { json, client } = self;
        let api = client.connect()?;
        crate::cli::client::status(&api, json).await?;

        Ok(ExitCode::SUCCESS)
    }
}

/// Block exact content (by SHA-256) in a dataset.
#[derive(Debug, clap::Args)]
pub struct BlockArgs {
    /// Dataset.
    #[arg(long)]
    dataset: String,
    /// SHA-256 of the content, 64 hex digits.
    #[arg(long)]
    sha256: String,
    /// Why (recorded in history).
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    client: ClientArgs,
}

impl BlockArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let BlockArgs {
            dataset,
            sha256,
            reason,
            client,
        } = self;
        let api = client.connect()?;
        let body =
            serde_json::json!({ "dataset": dataset, "content_sha256": sha256, "reason": reason });
        let (status, answer) = api.post("/v1/blocks", &body).await?;
        if status != 201 {
            anyhow::bail!("HTTP {status}: {answer}");
        }
        println!("blocked {sha256} in dataset {dataset}");

        Ok(ExitCode::SUCCESS)
    }
}

/// Erase a source: every trace of every revision, in every store (needs a token with the
/// `erase` scope; the admin token has it).
#[derive(Debug, clap::Args)]
pub struct EraseArgs {
    /// Dataset.
    #[arg(long)]
    dataset: String,
    /// Source key.
    #[arg(long)]
    source_key: String,
    /// Why (recorded in history, e.g. the request's reference).
    #[arg(long)]
    reason: String,
    /// Wait until every store reports the source erased (its receipts `erased`).
    #[arg(long)]
    wait: bool,
    /// Print the server's JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl EraseArgs {
    /// Runs the command.
    pub async fn run(self, _env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        use crate::cli::ops::encode;
        let EraseArgs {
            dataset,
            source_key,
            reason,
            wait,
            json,
            client,
        } = self;
        let api = client.connect()?;
        let (status, answer) = api
            .delete(&format!(
                "/v1/sources?dataset={}&source_key={}&erase=true&reason={}",
                encode(&dataset),
                encode(&source_key),
                encode(&reason)
            ))
            .await?;
        let receipt = crate::cli::client::ok_or_error(status, answer)?;
        let revision = receipt
            .get("source_revision_id")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let mut detail = receipt.clone();
        if wait {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
            loop {
                detail = api.get(&format!("/v1/revisions/{revision}")).await?;
                let state = detail["job"]["state"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if state == "completed" {
                    break;
                }
                if matches!(state.as_str(), "dead" | "quarantined" | "cancelled") {
                    anyhow::bail!(
                        "the erasure's job of {revision} is {state}: see `cairn ops job {}`",
                        detail["job"]["id"].as_str().unwrap_or_default()
                    );
                }
                if std::time::Instant::now() > deadline {
                    anyhow::bail!("the erasure of {revision} is still {state} after 300 s");
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
        if json {
            println!("{}", serde_json::to_string_pretty(&detail)?);
        } else if wait {
            println!("erased {dataset}/{source_key} (erasure {revision}):");
            for receipt in detail["receipts"].as_array().cloned().unwrap_or_default() {
                println!(
                    "  {:<10} {:<8} {}",
                    receipt["backend"].as_str().unwrap_or_default(),
                    receipt["state"].as_str().unwrap_or_default(),
                    receipt["evidence"]
                );
            }
        } else {
            println!(
                "erased {dataset}/{source_key} from the ledger (erasure {revision}); its jobs \
                 erase the stores (`--wait` waits for them)"
            );
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Manage API tokens (works on the data directory directly).
#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

impl TokenArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let TokenArgs { command } = self;
        let overrides = Overrides {
            data_dir: Some(command.store().data_dir.clone()),
            ledger_url: command.store().ledger.clone(),
            ..Overrides::default()
        };
        let config = Config::load(&overrides, env)?;
        let ledger = crate::open_ledger(&config).await?;
        let actor = format!("cli:{}", whoami());
        match command {
            TokenCommand::Create {
                name,
                scopes,
                datasets,
                expires_in,
                ..
            } => {
                crate::cli::tokens::create(
                    ledger.as_ref(),
                    actor,
                    name,
                    &scopes,
                    datasets,
                    expires_in.as_deref(),
                )
                .await?
            }
            TokenCommand::List { json, .. } => {
                crate::cli::tokens::list(ledger.as_ref(), json).await?
            }
            TokenCommand::Revoke { id, reason, .. } => {
                crate::cli::tokens::revoke(ledger.as_ref(), actor, &id, reason).await?
            }
            TokenCommand::Rotate {
                id,
                reason,
                expires_in,
                ..
            } => {
                crate::cli::tokens::rotate(
                    ledger.as_ref(),
                    actor,
                    &id,
                    reason,
                    expires_in.as_deref(),
                )
                .await?
            }
        }

        Ok(ExitCode::SUCCESS)
    }
}

/// Retrieval quality through the API.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    #[command(subcommand)]
    command: EvalCommand,
}

impl EvalArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let EvalArgs {
            command:
                EvalCommand::Beir {
                    directory,
                    split,
                    limit_docs,
                    churn,
                    budget_ms,
                    modes,
                    data_dir,
                    vectors,
                    config,
                    out,
                },
        } = self;
        let config = file_config(config, vectors, env)?;
        let report = crate::eval::beir(
            &config,
            crate::eval::BeirEval {
                directory,
                split,
                limit_docs,
                churn,
                budget_ms,
                modes,
                data_dir,
            },
        )
        .await?;
        write_report(&out, &report)?;

        Ok(ExitCode::SUCCESS)
    }
}

/// Apply the ledger's migrations and say what was done (`serve` and `worker` also run
/// them at start).
#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    store: StoreArgs,
}

impl MigrateArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        let MigrateArgs { store } = self;
        let overrides = Overrides {
            data_dir: Some(store.data_dir),
            ledger_url: store.ledger,
            ..Overrides::default()
        };
        let config = Config::load(&overrides, env)?;
        crate::cli::migrate(&config).await?;

        Ok(ExitCode::SUCCESS)
    }
}

/// Benchmarks that write JSON.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

impl BenchArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        match self.command {
            BenchCommand::Queue {
                jobs,
                latency_jobs,
                concurrency,
                workers,
                ledger,
                out,
            } => {
                let report = crate::bench::queue(crate::bench::QueueBench {
                    jobs,
                    latency_jobs,
                    concurrency: concurrency.max(1),
                    worker_counts: workers,
                    ledger_url: ledger.or_else(|| env.get("CAIRN_LEDGER_URL").cloned()),
                })
                .await?;
                write_report(&out, &report)?;
            }
            BenchCommand::Search {
                sizes,
                queries,
                top_k,
                data_dir,
                vectors,
                config,
                out,
            } => {
                let config = file_config(config, vectors, env)?;
                let report = crate::bench::search(
                    &config,
                    crate::bench::SearchBench {
                        sizes,
                        queries: queries.max(1),
                        top_k: top_k.clamp(1, search::MAX_TOP_K),
                        data_dir,
                    },
                )
                .await?;
                write_report(&out, &report)?;
            }
            BenchCommand::Project {
                corpus,
                docs,
                workers,
                concurrency,
                graph,
                edits,
                pdfs,
                min_chunks,
                vectors,
                config,
                out,
            } => {
                let config = file_config(config, vectors, env)?;
                let graph = graph.map(|url| {
                    let variable = |name: &str, default: &str| {
                        env.get(name).cloned().unwrap_or_else(|| default.to_owned())
                    };
                    gateways::BoltOptions::new(
                        &url,
                        &variable("CAIRN_GRAPH_USER", "neo4j"),
                        &variable("CAIRN_GRAPH_PASSWORD", ""),
                        &variable("CAIRN_GRAPH_DATABASE", "neo4j"),
                    )
                });
                let report = crate::bench::project(
                    &config,
                    crate::bench::ProjectBench {
                        corpus,
                        docs,
                        workers: workers.max(1),
                        concurrency: concurrency.max(1),
                        graph,
                        edits,
                        pdfs,
                        min_chunks,
                    },
                )
                .await?;
                write_report(&out, &report)?;
            }
            BenchCommand::Extract { dirs, out } => {
                let report = tokio::task::spawn_blocking(move || crate::bench::extract(&dirs))
                    .await
                    .context("the extraction benchmark")??;
                write_report(&out, &report)?;
            }
            BenchCommand::Accept {
                docs,
                batch_docs,
                rounds,
                ledger,
                out,
            } => {
                let ledger = ledger.or_else(|| env.get("CAIRN_LEDGER_URL").cloned());
                let report = crate::bench::accept(docs, batch_docs, rounds, ledger).await?;
                write_report(&out, &report)?;
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Writes a benchmark's JSON report to `out` and prints it.
/// The configuration of a command that takes only `--config` (benchmarks, evaluation).
fn file_config(
    config_file: Option<PathBuf>,
    vectors_url: Option<String>,
    env: &HashMap<String, String>,
) -> anyhow::Result<Config> {
    Config::load(
        &Overrides {
            config_file,
            vectors_url,
            ..Overrides::default()
        },
        env,
    )
}

fn write_report(out: &std::path::Path, report: &serde_json::Value) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?;
    println!("{text}");
    eprintln!("written to {}", out.display());
    Ok(())
}

fn whoami() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".to_owned())
}

async fn run_ops(
    api: &crate::cli::client::Client,
    command: OpsCommand,
    json: bool,
) -> anyhow::Result<()> {
    use crate::cli::ops::{self as ops_cli, Target};
    async fn act(
        api: &crate::cli::client::Client,
        name: &str,
        action: OpsAction,
        json: bool,
    ) -> anyhow::Result<()> {
        let target = match action.id {
            Some(id) => Target::Job(id),
            None => Target::Matching(action.filter.into()),
        };
        ops_cli::act(api, name, target, action.reason, action.yes, json).await
    }
    match command {
        OpsCommand::Status => ops_cli::status(api, json).await,
        OpsCommand::Leases { filter, limit } => {
            ops_cli::leases(api, &filter.into(), limit, json).await
        }
        OpsCommand::Retries { filter, limit } => {
            ops_cli::retries(api, &filter.into(), limit, json).await
        }
        OpsCommand::Dead { filter, limit } => ops_cli::dead(api, &filter.into(), limit, json).await,
        OpsCommand::Job { id } => ops_cli::job(api, &id, json).await,
        OpsCommand::Requeue(action) => act(api, "requeue", action, json).await,
        OpsCommand::Cancel(action) => act(api, "cancel", action, json).await,
        OpsCommand::Pause { dataset, reason } => {
            ops_cli::pause(api, "pause", dataset, reason, json).await
        }
        OpsCommand::Resume { dataset, reason } => {
            ops_cli::pause(api, "resume", dataset, reason, json).await
        }
    }
}
