//! Configuration: typed, unknown keys refused, validated once. Sources, strongest first:
//! command-line flags, environment variables (`CAIRN_*`), the TOML file, defaults from
//! [`receipts::policy`]. The environment is passed in as a map so that tests control it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use receipts::{policy, Backend};
use serde::Deserialize;

/// The default address of `cairn serve`.
pub const DEFAULT_BIND: &str = "127.0.0.1:7171";
/// The default data directory.
pub const DEFAULT_DATA_DIR: &str = "./cairn-data";

/// The configuration file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    data_dir: Option<PathBuf>,
    bind: Option<String>,
    #[serde(default)]
    limits: FileLimits,
    #[serde(default)]
    ledger: FileLedger,
    #[serde(default)]
    jobs: FileJobs,
    #[serde(default)]
    workers: FileWorkers,
    #[serde(default)]
    projection: FileProjection,
    #[serde(default)]
    search: FileSearch,
    #[serde(default)]
    http: FileHttp,
    #[serde(default)]
    vectors: FileVectors,
    #[serde(default)]
    graph: FileGraph,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileGraph {
    url: Option<String>,
    user: Option<String>,
    database: Option<String>,
    timeout_ms: Option<u64>,
    retry_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileVectors {
    url: Option<String>,
    timeout_ms: Option<u64>,
    connect_timeout_ms: Option<u64>,
    retry_ms: Option<u64>,
    collection_prefix: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileHttp {
    max_connections: Option<usize>,
    header_read_timeout_ms: Option<u64>,
    request_timeout_ms: Option<u64>,
    shutdown_grace_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSearch {
    max_in_flight: Option<usize>,
    max_queued: Option<usize>,
    default_budget_ms: Option<u64>,
    max_budget_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileProjection {
    models_dir: Option<PathBuf>,
    chunk_max_tokens: Option<usize>,
    chunk_overlap_tokens: Option<usize>,
    embed_batch: Option<usize>,
    embed_sessions: Option<usize>,
    embed_threads: Option<usize>,
    optimize_min_new_points: Option<u64>,
    optimize_max_new_points: Option<u64>,
    optimize_quiet_ms: Option<u64>,
}

/// How revisions are projected: where the model is, how text is cut, how the model runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectionSettings {
    /// The directory `scripts/setup-model` fills.
    pub models_dir: PathBuf,
    /// Chunk size and overlap, in tokens.
    pub chunker: gateways::ChunkerSettings,
    /// Texts per ONNX Runtime call.
    pub embed_batch: usize,
    /// ONNX Runtime intra-op threads (`None`: every core).
    pub embed_threads: Option<usize>,
    /// Model sessions that embed batches in parallel.
    pub embed_sessions: usize,
    /// When the vector store's background optimiser builds indexes.
    pub optimize: gateways::OptimizePolicy,
}

/// Default directory of the model files (relative to the working directory).
pub const DEFAULT_MODELS_DIR: &str = "./models";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLimits {
    max_body_bytes: Option<usize>,
    max_batch_body_bytes: Option<usize>,
    max_batch_items: Option<usize>,
    max_body_bytes_in_flight: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLedger {
    url: Option<String>,
    pool_size: Option<u32>,
    committers: Option<usize>,
    token_cache_ms: Option<u64>,
    backends: Option<Vec<String>>,
    max_group: Option<usize>,
}

/// One job kind's policy as written; every field is optional.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePolicy {
    max_attempts: Option<i64>,
    lease_ms: Option<i64>,
    max_run_ms: Option<i64>,
    quarantine_after_crashes: Option<i64>,
    backoff_base_ms: Option<i64>,
    backoff_cap_ms: Option<i64>,
}

impl FilePolicy {
    /// Fields set here win over `under`'s.
    fn over(self, under: FilePolicy) -> FilePolicy {
        FilePolicy {
            max_attempts: self.max_attempts.or(under.max_attempts),
            lease_ms: self.lease_ms.or(under.lease_ms),
            max_run_ms: self.max_run_ms.or(under.max_run_ms),
            quarantine_after_crashes: self
                .quarantine_after_crashes
                .or(under.quarantine_after_crashes),
            backoff_base_ms: self.backoff_base_ms.or(under.backoff_base_ms),
            backoff_cap_ms: self.backoff_cap_ms.or(under.backoff_cap_ms),
        }
    }

    fn resolve(self) -> policy::JobPolicy {
        let defaults = policy::JobPolicy::default();
        let micros =
            |ms: Option<i64>, default: i64| ms.map_or(default, |ms| ms.saturating_mul(1000));
        policy::JobPolicy {
            max_attempts: self.max_attempts.unwrap_or(defaults.max_attempts),
            lease_micros: micros(self.lease_ms, defaults.lease_micros),
            max_run_micros: micros(self.max_run_ms, defaults.max_run_micros),
            quarantine_after_crashes: self
                .quarantine_after_crashes
                .unwrap_or(defaults.quarantine_after_crashes),
            backoff_base_micros: micros(self.backoff_base_ms, defaults.backoff_base_micros),
            backoff_cap_micros: micros(self.backoff_cap_ms, defaults.backoff_cap_micros),
        }
    }
}

/// `[jobs]`: a policy for every kind, and `[jobs.project]` / `[jobs.tombstone]` per kind.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileJobs {
    max_attempts: Option<i64>,
    lease_ms: Option<i64>,
    max_run_ms: Option<i64>,
    quarantine_after_crashes: Option<i64>,
    backoff_base_ms: Option<i64>,
    backoff_cap_ms: Option<i64>,
    #[serde(default)]
    project: FilePolicy,
    #[serde(default)]
    tombstone: FilePolicy,
    #[serde(default)]
    graph: FilePolicy,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileWorkers {
    count: Option<usize>,
    concurrency: Option<usize>,
}

/// Workers that `cairn serve` runs in its own process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerSettings {
    /// Claim loops (0: none; run `cairn worker` beside it instead).
    pub count: usize,
    /// Jobs each one runs at once.
    pub concurrency: usize,
}

/// Default number of in-process workers of `cairn serve`.
pub const DEFAULT_WORKERS: usize = 1;
/// Default jobs per worker at once.
pub const DEFAULT_WORKER_CONCURRENCY: usize = 4;

/// Validated configuration of a cairn node.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where the ledger and the admin token live.
    pub data_dir: PathBuf,
    /// Address of the HTTP API.
    pub bind: SocketAddr,
    /// Ingest limits.
    pub acceptor: acceptor::AcceptorConfig,
    /// Backends that get a projection receipt per job.
    pub backends: Vec<Backend>,
    /// Most submissions per group commit.
    pub max_group: usize,
    /// The PostgreSQL ledger's URL (`--ledger`, `CAIRN_LEDGER_URL`, `ledger.url`); `None`:
    /// the embedded SQLite ledger in the data directory.
    pub ledger_url: Option<String>,
    /// Connections in the PostgreSQL ledger's pool.
    pub ledger_pool_size: u32,
    /// Tasks committing acceptances on the PostgreSQL ledger (`ledger.committers`,
    /// `CAIRN_LEDGER_COMMITTERS`): each commits whatever is queued in one transaction.
    pub ledger_committers: usize,
    /// How long a PostgreSQL ledger process keeps an authenticated token's answer at most
    /// (`ledger.token_cache_ms`, `CAIRN_LEDGER_TOKEN_CACHE_MS`; 0: never); any change of the
    /// tokens, in any process, clears it sooner.
    pub ledger_token_cache: std::time::Duration,
    /// Attempts, lease, deadline, retry and quarantine policy of each job kind.
    pub job_policies: policy::JobPolicies,
    /// Workers inside `cairn serve`.
    pub workers: WorkerSettings,
    /// Chunking and embedding.
    pub projection: ProjectionSettings,
    /// Search admission and budgets.
    pub search: search::SearchSettings,
    /// Connection cap and timeouts of the HTTP server.
    pub http: crate::server::HttpSettings,
    /// The Qdrant server (`--vectors`, `CAIRN_VECTORS_URL`, `vectors.url`, with the API key
    /// from `CAIRN_VECTORS_API_KEY`); `None`: the embedded qdrant-edge shard in the data
    /// directory.
    pub vectors: Option<gateways::ServerOptions>,
    /// The graph store (`CAIRN_GRAPH_URL`, `graph.url`, with the password from
    /// `CAIRN_GRAPH_PASSWORD`); `None`: no graph backend.
    pub graph: Option<gateways::BoltOptions>,
}

/// Flags that override the file and the environment.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--bind`.
    pub bind: Option<String>,
    /// `--config`.
    pub config_file: Option<PathBuf>,
    /// `--ledger`.
    pub ledger_url: Option<String>,
    /// `--vectors`.
    pub vectors_url: Option<String>,
}

fn env_number<T: std::str::FromStr>(
    env: &HashMap<String, String>,
    name: &str,
) -> anyhow::Result<Option<T>> {
    match env.get(name) {
        None => Ok(None),
        Some(text) => text.trim().parse::<T>().map(Some).map_err(|_| {
            anyhow::anyhow!("environment variable {name}=`{text}` is not a valid number")
        }),
    }
}

impl Config {
    /// Builds the configuration from flags, environment and file.
    pub fn load(overrides: &Overrides, env: &HashMap<String, String>) -> anyhow::Result<Config> {
        let file_path = overrides
            .config_file
            .clone()
            .or_else(|| env.get("CAIRN_CONFIG").map(PathBuf::from));
        let file = match &file_path {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        let data_dir = overrides
            .data_dir
            .clone()
            .or_else(|| env.get("CAIRN_DATA_DIR").map(PathBuf::from))
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        let bind_text = overrides
            .bind
            .clone()
            .or_else(|| env.get("CAIRN_BIND").cloned())
            .or(file.bind)
            .unwrap_or_else(|| DEFAULT_BIND.to_owned());
        let ledger_url = overrides
            .ledger_url
            .clone()
            .or_else(|| env.get("CAIRN_LEDGER_URL").cloned())
            .or(file.ledger.url.clone())
            .filter(|url| !url.trim().is_empty());
        if let Some(url) = &ledger_url {
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                bail!(
                    "ledger URL `{}` is not a PostgreSQL URL (postgres://user@host:port/database); \
                     leave it unset for the embedded SQLite ledger in the data directory",
                    redact_url(url)
                );
            }
        }
        let bind: SocketAddr = bind_text.parse().with_context(|| {
            format!("bind address `{bind_text}` is not IP:PORT (e.g. {DEFAULT_BIND})")
        })?;
        let defaults = acceptor::AcceptorConfig::default();
        let acceptor = acceptor::AcceptorConfig {
            max_body_bytes: env_number(env, "CAIRN_MAX_BODY_BYTES")?
                .or(file.limits.max_body_bytes)
                .unwrap_or(defaults.max_body_bytes),
            max_batch_body_bytes: env_number(env, "CAIRN_MAX_BATCH_BODY_BYTES")?
                .or(file.limits.max_batch_body_bytes)
                .unwrap_or(defaults.max_batch_body_bytes),
            max_batch_items: env_number(env, "CAIRN_MAX_BATCH_ITEMS")?
                .or(file.limits.max_batch_items)
                .unwrap_or(defaults.max_batch_items),
            max_body_bytes_in_flight: 0,
        };
        // Unless set, room for the larger of the two body limits (the default: one maximal
        // batch at a time).
        let acceptor = acceptor::AcceptorConfig {
            max_body_bytes_in_flight: env_number(env, "CAIRN_MAX_BODY_BYTES_IN_FLIGHT")?
                .or(file.limits.max_body_bytes_in_flight)
                .unwrap_or(
                    defaults
                        .max_body_bytes_in_flight
                        .max(acceptor.max_body_bytes)
                        .max(acceptor.max_batch_body_bytes),
                ),
            ..acceptor
        };
        let backend_names: Option<Vec<String>> = env
            .get("CAIRN_BACKENDS")
            .map(|text| {
                text.split(',')
                    .map(|name| name.trim().to_owned())
                    .filter(|name| !name.is_empty())
                    .collect()
            })
            .or(file.ledger.backends);
        let backends = match backend_names {
            None => policy::DEFAULT_BACKENDS.to_vec(),
            Some(names) => names
                .iter()
                .map(|name| {
                    name.parse::<Backend>()
                        .map_err(|error| anyhow::anyhow!("backends: {error}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?,
        };
        // Per kind: environment (every kind), then `[jobs.KIND]`, then `[jobs]`, then defaults.
        let from_env = FilePolicy {
            max_attempts: env_number(env, "CAIRN_MAX_ATTEMPTS")?,
            lease_ms: env_number(env, "CAIRN_LEASE_MS")?,
            max_run_ms: env_number(env, "CAIRN_MAX_RUN_MS")?,
            quarantine_after_crashes: env_number(env, "CAIRN_QUARANTINE_AFTER_CRASHES")?,
            backoff_base_ms: env_number(env, "CAIRN_BACKOFF_BASE_MS")?,
            backoff_cap_ms: env_number(env, "CAIRN_BACKOFF_CAP_MS")?,
        };
        let jobs = &file.jobs;
        let every_kind = FilePolicy {
            max_attempts: jobs.max_attempts,
            lease_ms: jobs.lease_ms,
            max_run_ms: jobs.max_run_ms,
            quarantine_after_crashes: jobs.quarantine_after_crashes,
            backoff_base_ms: jobs.backoff_base_ms,
            backoff_cap_ms: jobs.backoff_cap_ms,
        };
        let job_policies = policy::JobPolicies {
            project: from_env.over(jobs.project.over(every_kind)).resolve(),
            tombstone: from_env.over(jobs.tombstone.over(every_kind)).resolve(),
            graph: from_env.over(jobs.graph.over(every_kind)).resolve(),
        };
        let workers = WorkerSettings {
            count: env_number(env, "CAIRN_WORKERS")?
                .or(file.workers.count)
                .unwrap_or(DEFAULT_WORKERS),
            concurrency: env_number(env, "CAIRN_WORKER_CONCURRENCY")?
                .or(file.workers.concurrency)
                .unwrap_or(DEFAULT_WORKER_CONCURRENCY),
        };
        let chunker_defaults = gateways::ChunkerSettings::default();
        let projection = ProjectionSettings {
            models_dir: env
                .get("CAIRN_MODELS_DIR")
                .map(PathBuf::from)
                .or(file.projection.models_dir)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_MODELS_DIR)),
            chunker: gateways::ChunkerSettings {
                max_tokens: file
                    .projection
                    .chunk_max_tokens
                    .unwrap_or(chunker_defaults.max_tokens),
                overlap_tokens: file
                    .projection
                    .chunk_overlap_tokens
                    .unwrap_or(chunker_defaults.overlap_tokens),
            },
            embed_batch: env_number(env, "CAIRN_EMBED_BATCH")?
                .or(file.projection.embed_batch)
                .unwrap_or(gateways::embedder::DEFAULT_EMBED_BATCH),
            embed_sessions: env_number(env, "CAIRN_EMBED_SESSIONS")?
                .or(file.projection.embed_sessions)
                .unwrap_or(1),
            embed_threads: env_number(env, "CAIRN_EMBED_THREADS")?
                .or(file.projection.embed_threads),
            optimize: {
                let defaults = gateways::OptimizePolicy::default();
                gateways::OptimizePolicy {
                    min_new_points: file
                        .projection
                        .optimize_min_new_points
                        .unwrap_or(defaults.min_new_points),
                    max_new_points: file
                        .projection
                        .optimize_max_new_points
                        .unwrap_or(defaults.max_new_points),
                    quiet: file
                        .projection
                        .optimize_quiet_ms
                        .map_or(defaults.quiet, std::time::Duration::from_millis),
                    check_every: defaults.check_every,
                }
            },
        };
        let search_defaults = search::SearchSettings::default();
        let search = search::SearchSettings {
            max_in_flight: env_number(env, "CAIRN_SEARCH_MAX_IN_FLIGHT")?
                .or(file.search.max_in_flight)
                .unwrap_or(search_defaults.max_in_flight),
            max_queued: env_number(env, "CAIRN_SEARCH_MAX_QUEUED")?
                .or(file.search.max_queued)
                .unwrap_or(search_defaults.max_queued),
            default_budget: env_number(env, "CAIRN_SEARCH_BUDGET_MS")?
                .or(file.search.default_budget_ms)
                .map_or(
                    search_defaults.default_budget,
                    std::time::Duration::from_millis,
                ),
            max_budget: file
                .search
                .max_budget_ms
                .map_or(search_defaults.max_budget, std::time::Duration::from_millis),
        };
        let http_defaults = crate::server::HttpSettings::default();
        let millis = std::time::Duration::from_millis;
        let http = crate::server::HttpSettings {
            max_connections: env_number(env, "CAIRN_HTTP_MAX_CONNECTIONS")?
                .or(file.http.max_connections)
                .unwrap_or(http_defaults.max_connections),
            header_read_timeout: env_number(env, "CAIRN_HTTP_HEADER_READ_TIMEOUT_MS")?
                .or(file.http.header_read_timeout_ms)
                .map_or(http_defaults.header_read_timeout, millis),
            request_timeout: env_number(env, "CAIRN_HTTP_REQUEST_TIMEOUT_MS")?
                .or(file.http.request_timeout_ms)
                .map_or(http_defaults.request_timeout, millis),
            shutdown_grace: env_number(env, "CAIRN_HTTP_SHUTDOWN_GRACE_MS")?
                .or(file.http.shutdown_grace_ms)
                .map_or(http_defaults.shutdown_grace, millis),
        };
        let vectors = overrides
            .vectors_url
            .clone()
            .or_else(|| env.get("CAIRN_VECTORS_URL").cloned())
            .or(file.vectors.url.clone())
            .filter(|url| !url.trim().is_empty())
            .map(|url| {
                let mut options = gateways::ServerOptions::new(url.trim());
                options.api_key = env
                    .get("CAIRN_VECTORS_API_KEY")
                    .filter(|key| !key.is_empty())
                    .cloned();
                if let Some(ms) = file.vectors.timeout_ms {
                    options.timeout = millis(ms);
                }
                if let Some(ms) = file.vectors.connect_timeout_ms {
                    options.connect_timeout = millis(ms);
                }
                if let Some(ms) = file.vectors.retry_ms {
                    options.retry_budget = millis(ms);
                }
                if let Some(prefix) = &file.vectors.collection_prefix {
                    options.collection_prefix = prefix.clone();
                }
                options
            });
        let graph = env
            .get("CAIRN_GRAPH_URL")
            .cloned()
            .or(file.graph.url.clone())
            .filter(|url| !url.trim().is_empty())
            .map(|url| {
                let mut options = gateways::BoltOptions::new(
                    url.trim(),
                    env.get("CAIRN_GRAPH_USER")
                        .or(file.graph.user.as_ref())
                        .map_or("neo4j", String::as_str),
                    env.get("CAIRN_GRAPH_PASSWORD").map_or("", String::as_str),
                    env.get("CAIRN_GRAPH_DATABASE")
                        .or(file.graph.database.as_ref())
                        .map_or("neo4j", String::as_str),
                );
                if let Some(ms) = file.graph.timeout_ms {
                    options.timeout = millis(ms);
                }
                if let Some(ms) = file.graph.retry_ms {
                    options.retry_budget = millis(ms);
                }
                options
            });
        let mut backends = backends;
        // A configured graph is a backend: its jobs and receipts follow.
        if graph.is_some() && !backends.contains(&Backend::Graph) {
            backends.push(Backend::Graph);
        }
        let config = Config {
            graph,
            vectors,
            http,
            search,
            projection,
            job_policies,
            workers,
            data_dir,
            bind,
            acceptor,
            backends,
            max_group: file.ledger.max_group.unwrap_or(policy::DEFAULT_MAX_GROUP),
            ledger_url,
            ledger_pool_size: env_number(env, "CAIRN_LEDGER_POOL_SIZE")?
                .or(file.ledger.pool_size)
                .unwrap_or(DEFAULT_LEDGER_POOL_SIZE),
            ledger_committers: env_number(env, "CAIRN_LEDGER_COMMITTERS")?
                .or(file.ledger.committers)
                .unwrap_or(DEFAULT_LEDGER_COMMITTERS),
            ledger_token_cache: std::time::Duration::from_millis(
                env_number(env, "CAIRN_LEDGER_TOKEN_CACHE_MS")?
                    .or(file.ledger.token_cache_ms)
                    .unwrap_or(DEFAULT_LEDGER_TOKEN_CACHE_MS),
            ),
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.backends.is_empty() {
            bail!("at least one backend must be configured");
        }
        if self.acceptor.max_body_bytes < 1024 {
            bail!("limits.max_body_bytes must be at least 1024");
        }
        let largest = self
            .acceptor
            .max_body_bytes
            .max(self.acceptor.max_batch_body_bytes);
        if self.acceptor.max_body_bytes_in_flight < largest {
            bail!(
                "limits.max_body_bytes_in_flight ({}) must be at least the largest body limit \
                 ({largest}), or a request of that size could never be read",
                self.acceptor.max_body_bytes_in_flight
            );
        }
        if self.acceptor.max_batch_items == 0 || self.acceptor.max_batch_items > 100_000 {
            bail!("limits.max_batch_items must be between 1 and 100000");
        }
        if self.ledger_pool_size < 2 || self.ledger_pool_size > 1000 {
            bail!("ledger.pool_size must be between 2 and 1000");
        }
        if self.ledger_committers == 0
            || self.ledger_committers as u64 >= u64::from(self.ledger_pool_size)
        {
            bail!(
                "ledger.committers must be at least 1 and below ledger.pool_size ({}): each \
                 holds a connection while it commits",
                self.ledger_pool_size
            );
        }
        if self.max_group == 0 {
            bail!("ledger.max_group must be at least 1");
        }
        for (kind, policy) in self.job_policies.all() {
            if let Err(problem) = policy.check() {
                bail!("jobs.{kind}: {problem}");
            }
        }
        if self.workers.concurrency == 0 || self.workers.concurrency > 1024 {
            bail!("workers.concurrency must be between 1 and 1024");
        }
        if self.workers.count > 64 {
            bail!("workers.count must be at most 64");
        }
        let chunker = &self.projection.chunker;
        let window = gateways::embedder::MODEL_MAX_TOKENS - 2;
        if chunker.max_tokens == 0 || chunker.max_tokens > window {
            bail!("projection.chunk_max_tokens must be between 1 and {window}");
        }
        if chunker.overlap_tokens >= chunker.max_tokens {
            bail!("projection.chunk_overlap_tokens must be below chunk_max_tokens");
        }
        if self.search.max_in_flight == 0 {
            bail!("search.max_in_flight must be at least 1");
        }
        if self.search.max_queued > 100_000 {
            bail!("search.max_queued must be at most 100000");
        }
        if self.search.default_budget.is_zero()
            || self.search.default_budget > self.search.max_budget
        {
            bail!("search.default_budget_ms must be between 1 and search.max_budget_ms");
        }
        if self.projection.optimize.min_new_points > self.projection.optimize.max_new_points {
            bail!("projection.optimize_min_new_points must not exceed optimize_max_new_points");
        }
        if self.projection.embed_sessions == 0 || self.projection.embed_sessions > 16 {
            bail!("projection.embed_sessions must be between 1 and 16");
        }
        let http = &self.http;
        if http.max_connections == 0 || http.max_connections > 1_000_000 {
            bail!("http.max_connections must be between 1 and 1000000");
        }
        if http.header_read_timeout.is_zero() {
            bail!("http.header_read_timeout_ms must be at least 1");
        }
        if http.request_timeout <= self.search.max_budget {
            bail!(
                "http.request_timeout_ms ({}) must be above search.max_budget_ms ({}): a search \
                 within its budget must not be cut off",
                http.request_timeout.as_millis(),
                self.search.max_budget.as_millis()
            );
        }
        if self.projection.embed_batch == 0 || self.projection.embed_batch > 512 {
            bail!("projection.embed_batch must be between 1 and 512");
        }
        match &self.graph {
            None if self.backends.contains(&Backend::Graph) => bail!(
                "the graph backend is listed but no graph is configured: set graph.url (or \
                 CAIRN_GRAPH_URL), or remove `graph` from backends"
            ),
            Some(graph) => {
                if graph.timeout.is_zero() {
                    bail!("graph.timeout_ms must be at least 1");
                }
                self.check_retry_budget("graph.retry_ms", graph.retry_budget)?;
            }
            None => {}
        }
        if let Some(vectors) = &self.vectors {
            if !(vectors.url.starts_with("http://") || vectors.url.starts_with("https://")) {
                bail!(
                    "vectors.url `{}` is not a Qdrant gRPC URL (http://host:6334, or https:// \
                     for TLS); leave it unset for the embedded qdrant-edge store",
                    vectors.url
                );
            }
            if vectors.timeout.is_zero() || vectors.connect_timeout.is_zero() {
                bail!("vectors.timeout_ms and vectors.connect_timeout_ms must be at least 1");
            }
            let valid_prefix = vectors
                .collection_prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !valid_prefix || vectors.collection_prefix.len() > 64 {
                bail!("vectors.collection_prefix may hold only letters, digits, `-` and `_` (at most 64)");
            }
            self.check_retry_budget("vectors.retry_ms", vectors.retry_budget)?;
        }
        Ok(())
    }

    /// In-process retries of a store call must end well inside the lease (at most half the
    /// shortest), so a retrying worker never outlives its own lease.
    fn check_retry_budget(&self, setting: &str, budget: std::time::Duration) -> anyhow::Result<()> {
        let lease_ms = self.job_policies.shortest_lease_micros() / 1000;
        let retry_ms = i64::try_from(budget.as_millis()).unwrap_or(i64::MAX);
        if retry_ms.saturating_mul(2) > lease_ms {
            bail!(
                "{setting} ({retry_ms}) must be at most half the shortest job lease \
                 ({lease_ms} ms): in-process retries are bounded by the lease"
            );
        }
        Ok(())
    }

    /// The ledger database file.
    pub fn ledger_path(&self) -> PathBuf {
        self.data_dir.join("ledger.db")
    }

    /// The admin token file.
    pub fn admin_token_path(&self) -> PathBuf {
        admin_token_path(&self.data_dir)
    }

    /// Where the ledger is, for logs and messages (never a password).
    pub fn ledger_description(&self) -> String {
        match &self.ledger_url {
            Some(url) => format!("PostgreSQL at {}", redact_url(url)),
            None => format!("SQLite at {}", self.ledger_path().display()),
        }
    }

    /// Where the vectors are, for logs and messages (never the API key).
    pub fn vectors_description(&self) -> String {
        match &self.vectors {
            Some(options) => format!(
                "Qdrant server at {}{}",
                options.url,
                if options.api_key.is_some() {
                    " (with an API key)"
                } else {
                    ""
                }
            ),
            None => format!(
                "qdrant-edge under {}",
                self.data_dir.join("vectors").display()
            ),
        }
    }

    /// Where the graph is, for logs and messages (never the password).
    pub fn graph_description(&self) -> String {
        match &self.graph {
            Some(options) => format!(
                "Bolt server at {} (database {}, user {})",
                options.url, options.database, options.user
            ),
            None => "none".to_owned(),
        }
    }

    /// PostgreSQL ledger options derived from this configuration (with a ledger URL).
    pub fn postgres_options(&self, url: &str) -> receipts::PostgresOptions {
        let mut options = receipts::PostgresOptions::new(url);
        options.backends = self.backends.clone();
        options.max_wave = self.max_group;
        options.job_policies = self.job_policies;
        options.max_connections = self.ledger_pool_size;
        options.committers = self.ledger_committers;
        options.token_cache = self.ledger_token_cache;
        options
    }

    /// SQLite ledger options derived from this configuration.
    pub fn ledger_options(&self) -> receipts::SqliteOptions {
        let mut options = receipts::SqliteOptions::new(self.ledger_path());
        options.backends = self.backends.clone();
        options.max_group = self.max_group;
        options.job_policies = self.job_policies;
        options
    }
}

/// Connections in the PostgreSQL ledger's pool by default.
pub const DEFAULT_LEDGER_POOL_SIZE: u32 = 16;

/// Acceptance committers per process on the PostgreSQL ledger.
pub const DEFAULT_LEDGER_COMMITTERS: usize = 4;

/// Milliseconds a PostgreSQL ledger process keeps an authenticated token's answer at most.
pub const DEFAULT_LEDGER_TOKEN_CACHE_MS: u64 = 1000;

/// A database URL without its password: `postgres://user:secret@host/db` becomes
/// `postgres://user:***@host/db`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((credentials, host)) => {
            let user = credentials.split(':').next().unwrap_or("");
            let hidden = if credentials.contains(':') {
                ":***"
            } else {
                ""
            };
            format!("{scheme}://{user}{hidden}@{host}")
        }
        None => url.to_owned(),
    }
}

/// Where the admin token of a data directory is written.
pub fn admin_token_path(data_dir: &Path) -> PathBuf {
    data_dir.join("admin.token")
}

fn read_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_qdrant_server_from_the_environment_with_its_key_kept_out_of_sight() {
        let config = Config::load(&Overrides::default(), &HashMap::new()).expect("config");
        assert_eq!(config.vectors, None, "qdrant-edge by default");
        let config = Config::load(
            &Overrides::default(),
            &env(&[
                ("CAIRN_VECTORS_URL", "http://10.0.0.5:6334"),
                ("CAIRN_VECTORS_API_KEY", "k3y-never-shown"),
            ]),
        )
        .expect("config");
        let vectors = config.vectors.clone().expect("server");
        assert_eq!(vectors.url, "http://10.0.0.5:6334");
        assert_eq!(vectors.api_key.as_deref(), Some("k3y-never-shown"));
        assert!(!format!("{config:?}").contains("k3y-never-shown"));
        assert!(!config.vectors_description().contains("k3y-never-shown"));
        // The flag beats the environment.
        let config = Config::load(
            &Overrides {
                vectors_url: Some("https://q.example:6334".to_owned()),
                ..Overrides::default()
            },
            &env(&[("CAIRN_VECTORS_URL", "http://10.0.0.5:6334")]),
        )
        .expect("config");
        assert_eq!(
            config.vectors.expect("server").url,
            "https://q.example:6334"
        );
    }

    #[test]
    fn a_graph_from_the_environment_turns_the_graph_backend_on() {
        let config = Config::load(
            &Overrides::default(),
            &env(&[
                ("CAIRN_GRAPH_URL", "bolt://10.0.0.7:7687"),
                ("CAIRN_GRAPH_USER", "root"),
                ("CAIRN_GRAPH_PASSWORD", "gr4ph-secret"),
                ("CAIRN_GRAPH_DATABASE", "cairn"),
            ]),
        )
        .expect("config");
        let graph = config.graph.clone().expect("graph");
        assert_eq!(
            (
                graph.url.as_str(),
                graph.user.as_str(),
                graph.database.as_str()
            ),
            ("bolt://10.0.0.7:7687", "root", "cairn")
        );
        assert!(config.backends.contains(&Backend::Graph));
        assert!(!format!("{config:?}").contains("gr4ph-secret"));
        assert!(!config.graph_description().contains("gr4ph-secret"));
        // The graph backend without a graph cannot work.
        let error = Config::load(
            &Overrides::default(),
            &env(&[("CAIRN_BACKENDS", "relational,vector,graph")]),
        )
        .expect_err("no graph");
        assert!(format!("{error:#}").contains("graph.url"), "{error:#}");
    }

    #[test]
    fn qdrant_settings_that_cannot_work_are_refused() {
        for (url, file, wanted) in [
            ("127.0.0.1:6334", "", "not a Qdrant gRPC URL"),
            (
                "http://q:6334",
                "[vectors]\ncollection_prefix = \"a/b\"\n",
                "collection_prefix",
            ),
            (
                "http://q:6334",
                "[jobs]\nlease_ms = 4000\n[vectors]\nretry_ms = 3000\n",
                "half the shortest job lease",
            ),
            ("http://q:6334", "[vectors]\ntimeout_ms = 0\n", "timeout_ms"),
        ] {
            let directory = tempfile::tempdir().expect("tempdir");
            let path = directory.path().join("cairn.toml");
            std::fs::write(&path, file).expect("write");
            let error = Config::load(
                &Overrides {
                    config_file: Some(path),
                    vectors_url: Some(url.to_owned()),
                    ..Overrides::default()
                },
                &HashMap::new(),
            )
            .expect_err("refused");
            assert!(
                format!("{error:#}").contains(wanted),
                "{url} {file}: {error:#}"
            );
        }
    }

    #[test]
    fn defaults_without_anything() {
        let config = Config::load(&Overrides::default(), &HashMap::new()).expect("config");
        assert_eq!(config.bind.to_string(), DEFAULT_BIND);
        assert_eq!(config.backends, policy::DEFAULT_BACKENDS.to_vec());
        assert_eq!(
            config.acceptor.max_batch_items,
            policy::DEFAULT_MAX_BATCH_ITEMS
        );
    }

    #[test]
    fn flags_beat_env_beat_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("cairn.toml");
        std::fs::write(&file, "bind = \"127.0.0.1:1\"\ndata_dir = \"/file\"\n[limits]\nmax_batch_items = 7\n[ledger]\nbackends = [\"relational\", \"vector\", \"graph\"]\n[graph]\nurl = \"bolt://127.0.0.1:7687\"\n").expect("write");
        let overrides = Overrides {
            config_file: Some(file),
            bind: Some("127.0.0.1:3".into()),
            ..Overrides::default()
        };
        let config = Config::load(
            &overrides,
            &env(&[("CAIRN_BIND", "127.0.0.1:2"), ("CAIRN_DATA_DIR", "/env")]),
        )
        .expect("config");
        assert_eq!(config.bind.port(), 3);
        assert_eq!(config.data_dir, PathBuf::from("/env"));
        assert_eq!(config.acceptor.max_batch_items, 7);
        assert_eq!(config.backends.len(), 3);
    }

    #[test]
    fn job_policy_per_kind_env_beats_kind_beats_every_kind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("cairn.toml");
        std::fs::write(
            &file,
            "[jobs]\nmax_attempts = 7\nlease_ms = 5000\n[jobs.tombstone]\nmax_attempts = 2\nbackoff_base_ms = 10\n",
        )
        .expect("write");
        let overrides = Overrides {
            config_file: Some(file),
            ..Overrides::default()
        };
        let config = Config::load(&overrides, &env(&[("CAIRN_LEASE_MS", "2000")])).expect("config");
        let project = config.job_policies.project;
        let tombstone = config.job_policies.tombstone;
        assert_eq!(project.max_attempts, 7);
        assert_eq!(tombstone.max_attempts, 2);
        assert_eq!(project.lease_micros, 2_000_000);
        assert_eq!(tombstone.lease_micros, 2_000_000);
        assert_eq!(tombstone.backoff_base_micros, 10_000);
        assert_eq!(
            project.backoff_base_micros,
            policy::DEFAULT_BACKOFF_BASE_MICROS
        );
        let error = Config::load(
            &Overrides::default(),
            &env(&[("CAIRN_LEASE_MS", "2000"), ("CAIRN_MAX_RUN_MS", "1000")]),
        )
        .expect_err("max run below lease");
        assert!(format!("{error:#}").contains("jobs.project"), "{error:#}");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("cairn.toml");
        std::fs::write(&file, "bnd = \"x\"\n").expect("write");
        let overrides = Overrides {
            config_file: Some(file),
            ..Overrides::default()
        };
        let error = Config::load(&overrides, &HashMap::new()).expect_err("unknown key");
        assert!(
            format!("{error:#}").contains("unknown field `bnd`"),
            "{error:#}"
        );
        let error = Config::load(
            &Overrides::default(),
            &env(&[("CAIRN_BACKENDS", "vector,elastic")]),
        )
        .expect_err("bad backend");
        assert!(format!("{error:#}").contains("elastic"));
        let error = Config::load(
            &Overrides::default(),
            &env(&[("CAIRN_MAX_BATCH_ITEMS", "lots")]),
        )
        .expect_err("bad number");
        assert!(format!("{error:#}").contains("CAIRN_MAX_BATCH_ITEMS"));
    }
}
