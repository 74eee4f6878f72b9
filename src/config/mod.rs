//! Configuration: typed, unknown keys refused, validated once. Sources, strongest first:
//! command-line flags, environment variables (`CAIRN_*`), the TOML file, defaults from
//! [`receipts::policy`]. The environment is passed in as a map so that tests control it.
//!
//! - `file.rs`: the file's schema (every section and key);
//! - `load.rs`: each section from its sources ([`Config::load`]);
//! - `validate.rs`: settings that cannot work together, refused at start.
//!
//! Every setting, its environment variable and its default are listed in
//! `docs/configuration.md`; a test keeps that table equal to what the code reads.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use receipts::{policy, Backend};

mod file;
mod load;
mod validate;

#[cfg(test)]
mod tests;

/// The default address of `cairn serve`.
pub const DEFAULT_BIND: &str = "127.0.0.1:7171";
/// The default data directory.
pub const DEFAULT_DATA_DIR: &str = "./cairn-data";

/// How revisions are projected: where the model is, how text is cut, how the model runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectionSettings {
    /// The directory `scripts/setup-model` fills.
    pub models_dir: PathBuf,
    /// The model of this process's own generation (`projection.model`, `CAIRN_MODEL`): a
    /// local model's id, or the remote server's (`remote` in the file resolves to it).
    pub model: String,
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

/// `[embeddings]`: an OpenAI-compatible embedding server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddingServer {
    /// Where it is, its model, dimension, key, batch and time limit.
    pub options: gateways::RemoteOptions,
    /// Calls in flight to it at once, for projection.
    pub parallel: usize,
}

/// Default texts per call to the embedding server.
pub const DEFAULT_REMOTE_BATCH: usize = 32;
/// Default time limit of one call to the embedding server.
pub const DEFAULT_REMOTE_TIMEOUT_MS: u64 = 30_000;
/// Default calls in flight to the embedding server.
pub const DEFAULT_REMOTE_PARALLEL: usize = 4;

/// Default directory of the model files (relative to the working directory).
pub const DEFAULT_MODELS_DIR: &str = "./models";

/// Workers that `cairn serve` runs in its own process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerSettings {
    /// Claim loops (0: none; run `cairn worker` beside it instead).
    pub count: usize,
    /// Runs each one has at once (a lone job, or a unit of up to `unit_jobs` jobs).
    pub concurrency: usize,
    /// Most jobs of a claim projected together as one unit (1: each alone).
    pub unit_jobs: usize,
    /// Largest document (bytes) projected in a unit's shared batch; larger ones take the
    /// lone path.
    pub unit_max_bytes: usize,
}

/// Default number of in-process workers of `cairn serve`.
pub const DEFAULT_WORKERS: usize = 1;
/// Default runs per worker at once (a lone job, or a unit of small jobs). Enough that the
/// embedding batcher holds a window of chunks to sort by length (up to 128): measured on
/// SciFact before units, 8 jobs reach 0.70x of the raw embedder sorted by length, 32 jobs
/// 0.91x.
pub const DEFAULT_WORKER_CONCURRENCY: usize = 32;
/// Default `workers.unit_jobs`: 1, units off. Units (32 is the measured setting) stay opt-in
/// until a read-back that found no point in the three-node test topology is explained
/// (docs/benchmarks.md, "Small documents: units").
pub const DEFAULT_UNIT_JOBS: usize = 1;

/// `[ledger]`: where the ledger is and how a process uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerSettings {
    /// The PostgreSQL ledger's URL (`--ledger`, `CAIRN_LEDGER_URL`, `ledger.url`); `None`:
    /// the embedded SQLite ledger in the data directory.
    pub url: Option<String>,
    /// Most submissions per group commit (`ledger.max_group`).
    pub max_group: usize,
    /// Connections in the PostgreSQL ledger's pool.
    pub pool_size: u32,
    /// Tasks committing acceptances on the PostgreSQL ledger (`ledger.committers`,
    /// `CAIRN_LEDGER_COMMITTERS`): each commits whatever is queued in one transaction.
    pub committers: usize,
    /// How long a PostgreSQL ledger process keeps an authenticated token's answer at most
    /// (`ledger.token_cache_ms`, `CAIRN_LEDGER_TOKEN_CACHE_MS`; 0: never); any change of the
    /// tokens, in any process, clears it sooner.
    pub token_cache: std::time::Duration,
    /// How long a PostgreSQL connection waits on a silent server before its operation fails
    /// `ledger_unavailable` (`ledger.peer_timeout_ms`, `CAIRN_LEDGER_PEER_TIMEOUT_MS`; 0: the
    /// kernel's defaults, minutes under a partition).
    pub peer_timeout: std::time::Duration,
}

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
    /// The ledger: which engine, and how this process uses it.
    pub ledger: LedgerSettings,
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
    /// The MCP endpoint's `Host` and `Origin` checks and body limit.
    pub mcp: agents::McpSettings,
    /// The folders connectors may read (`connectors.folder_roots`,
    /// `CAIRN_CONNECTOR_FOLDER_ROOTS`); none by default.
    pub connectors: connectors::api::ConnectorSettings,
    /// The scheduled verify pass (`[verify]`, `CAIRN_VERIFY_*`).
    pub verify: verify::VerifySettings,
    /// Where backups are written (`backup.dir`, `CAIRN_BACKUP_DIR`; `None`: `backups/` in the
    /// data directory).
    pub backup_dir: Option<PathBuf>,
    /// How long the events outbox keeps events for the change feed (`events.retention_hours`,
    /// `CAIRN_EVENTS_RETENTION_HOURS`; 168 by default).
    pub events_retention: std::time::Duration,
    /// Webhook deliveries (`[webhooks]`, `CAIRN_WEBHOOKS_*`).
    pub webhooks: events::WebhookSettings,
    /// The folder holding PostgreSQL's `pg_dump` and `pg_restore` (`backup.pg_bin`,
    /// `CAIRN_PG_BIN`; `None`: the newest `/usr/lib/postgresql/*/bin`, else `PATH`).
    pub pg_bin: Option<PathBuf>,
    /// The Qdrant server or cluster (`--vectors`, `CAIRN_VECTORS_URL`: one URL or a
    /// comma-separated list; `vectors.url` or `vectors.urls`; the layout from
    /// `vectors.shards`, `vectors.replication_factor`, `vectors.write_consistency_factor`;
    /// the API key from `CAIRN_VECTORS_API_KEY`); `None`: the embedded qdrant-edge shard in
    /// the data directory.
    pub vectors: Option<gateways::ServerOptions>,
    /// The remote embedding server (`[embeddings]`, `CAIRN_EMBEDDINGS_*`, with the key from
    /// `CAIRN_EMBEDDINGS_KEY`); `None`: local models only.
    pub embeddings: Option<EmbeddingServer>,
    /// The graph store (`CAIRN_GRAPH_URL`, `graph.url`, with the password from
    /// `CAIRN_GRAPH_PASSWORD`); `None`: no graph backend.
    pub graph: Option<gateways::BoltOptions>,
    /// Each configured dataset's default access (`datasets.<d>.default_access`), recorded in
    /// the ledger at every start (a default the file names wins over one set through the API
    /// since the last start).
    pub default_access: std::collections::BTreeMap<String, receipts::access::DefaultAccess>,
    /// The metadata fields the vector store indexes for search filters
    /// (`datasets.<d>.filterable`, as `metadata.<name>` and its index type), created in every
    /// generation's store when this process opens it.
    pub filterable: Vec<(String, gateways::FieldKind)>,
    /// cairn as an OAuth 2.1 resource server (`[oauth]`): the resource and its issuers, and
    /// whether cairn's own tokens still work; `None`: cairn's own tokens only.
    pub oauth: Option<OAuthSettings>,
}

/// `[oauth]`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct OAuthSettings {
    /// The resource and the issuers it trusts.
    pub resource: oauth::Resource,
    /// Whether a bearer token that is not a JWT is looked up among cairn's own tokens.
    pub cairn_tokens: bool,
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

impl Config {
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
        match &self.ledger.url {
            Some(url) => format!("PostgreSQL at {}", redact_url(url)),
            None => format!("SQLite at {}", self.ledger_path().display()),
        }
    }

    /// Where the vectors are, for logs and messages (never the API key).
    pub fn vectors_description(&self) -> String {
        match &self.vectors {
            Some(options) => format!(
                "Qdrant {} at {}{}",
                if options.urls.len() > 1 {
                    "cluster"
                } else {
                    "server"
                },
                options.urls.join(", "),
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
        options.max_wave = self.ledger.max_group;
        options.job_policies = self.job_policies;
        options.max_connections = self.ledger.pool_size;
        options.committers = self.ledger.committers;
        options.token_cache = self.ledger.token_cache;
        options.peer_timeout =
            (!self.ledger.peer_timeout.is_zero()).then_some(self.ledger.peer_timeout);
        options.journal = Some(self.journal_path());
        options.pg_bin = self.pg_bin.clone();
        options
    }

    /// The erasure journal of this data directory (`receipts::journal`): erasures and token
    /// revocations, replayed by a restore.
    pub fn journal_path(&self) -> PathBuf {
        receipts::journal::Journal::beside(&self.data_dir)
    }

    /// Where `cairn backup` writes (`backups/` in the data directory unless configured).
    pub fn backup_dir(&self) -> PathBuf {
        self.backup_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("backups"))
    }

    /// SQLite ledger options derived from this configuration.
    pub fn ledger_options(&self) -> receipts::SqliteOptions {
        let mut options = receipts::SqliteOptions::new(self.ledger_path());
        options.journal = Some(self.journal_path());
        options.backends = self.backends.clone();
        options.max_group = self.ledger.max_group;
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
/// How long a PostgreSQL connection waits on a silent server, by default (ms).
pub const DEFAULT_LEDGER_PEER_TIMEOUT_MS: u64 = 2000;

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
