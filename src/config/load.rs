//! Loading: each section of [`Config`] from its sources, strongest first: command-line flags,
//! environment variables, the file, defaults. One function per section; every environment
//! variable is read through [`Env`], which records the names asked for (the configuration
//! table's test reads that record).

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use receipts::{policy, Backend};

use super::file::{read_file, FileConfig, FilePolicy};
use super::{
    redact_url, Config, EmbeddingServer, LedgerSettings, Overrides, ProjectionSettings,
    WorkerSettings, DEFAULT_BIND, DEFAULT_DATA_DIR, DEFAULT_LEDGER_COMMITTERS,
    DEFAULT_LEDGER_PEER_TIMEOUT_MS, DEFAULT_LEDGER_POOL_SIZE, DEFAULT_LEDGER_TOKEN_CACHE_MS,
    DEFAULT_MODELS_DIR, DEFAULT_REMOTE_BATCH, DEFAULT_REMOTE_PARALLEL, DEFAULT_REMOTE_TIMEOUT_MS,
    DEFAULT_WORKERS, DEFAULT_WORKER_CONCURRENCY,
};

/// The process environment as the loader sees it: a map (so tests control it) and the names
/// looked up so far.
pub(super) struct Env<'a> {
    map: &'a HashMap<String, String>,
    read: RefCell<BTreeSet<String>>,
}

impl<'a> Env<'a> {
    pub(super) fn new(map: &'a HashMap<String, String>) -> Env<'a> {
        Env {
            map,
            read: RefCell::new(BTreeSet::new()),
        }
    }

    /// The variable's text, if set.
    pub(super) fn get(&self, name: &str) -> Option<&'a String> {
        self.read.borrow_mut().insert(name.to_owned());
        self.map.get(name)
    }

    /// The variable's text, if set, owned.
    fn text(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }

    /// The variable as a number, if set; a value that is not one is an error naming it.
    pub(super) fn number<T: std::str::FromStr>(&self, name: &str) -> anyhow::Result<Option<T>> {
        match self.get(name) {
            None => Ok(None),
            Some(text) => text.trim().parse::<T>().map(Some).map_err(|_| {
                anyhow::anyhow!("environment variable {name}=`{text}` is not a valid number")
            }),
        }
    }

    /// Every name looked up so far.
    #[cfg(test)]
    pub(super) fn names_read(&self) -> BTreeSet<String> {
        self.read.borrow().clone()
    }
}

impl Config {
    /// Builds the configuration from flags, environment and file.
    pub fn load(overrides: &Overrides, env: &HashMap<String, String>) -> anyhow::Result<Config> {
        Config::load_from(overrides, &Env::new(env))
    }

    pub(super) fn load_from(overrides: &Overrides, env: &Env<'_>) -> anyhow::Result<Config> {
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
            .or(file.data_dir.clone())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        let bind_text = overrides
            .bind
            .clone()
            .or_else(|| env.text("CAIRN_BIND"))
            .or(file.bind.clone())
            .unwrap_or_else(|| DEFAULT_BIND.to_owned());
        let bind: SocketAddr = bind_text.parse().with_context(|| {
            format!("bind address `{bind_text}` is not IP:PORT (e.g. {DEFAULT_BIND})")
        })?;
        let graph = graph(env, &file);
        let mut backends = backends(env, &file)?;
        // A configured graph is a backend: its jobs and receipts follow.
        if graph.is_some() && !backends.contains(&Backend::Graph) {
            backends.push(Backend::Graph);
        }
        let embeddings = embeddings(env, &file)?;
        let config = Config {
            default_access: default_access(&file)?,
            filterable: filterable(&file)?,
            oauth: oauth_settings(&file, env)?,
            mcp: mcp(env, &file, bind, &acceptor(env, &file)?),
            connectors: connector_settings(env, &file, &data_dir)?,
            verify: verify_settings(env, &file)?,
            events_retention: events_retention(env, &file)?,
            webhooks: webhooks(env, &file, &data_dir, events_retention(env, &file)?)?,
            backup_dir: env
                .get("CAIRN_BACKUP_DIR")
                .map(PathBuf::from)
                .or(file.backup.dir.clone()),
            pg_bin: env
                .get("CAIRN_PG_BIN")
                .map(PathBuf::from)
                .or(file.backup.pg_bin.clone())
                .or_else(newest_postgres_bin),
            graph,
            projection: projection(env, &file, embeddings.as_ref())?,
            embeddings,
            vectors: vectors(overrides, env, &file)?,
            http: http(env, &file)?,
            search: search(env, &file)?,
            job_policies: job_policies(env, &file)?,
            workers: workers(env, &file)?,
            data_dir,
            bind,
            acceptor: acceptor(env, &file)?,
            backends,
            ledger: ledger(overrides, env, &file)?,
        };
        config.validate()?;
        Ok(config)
    }
}

/// `[ledger]`: where the ledger is and how a process uses it.
fn ledger(
    overrides: &Overrides,
    env: &Env<'_>,
    file: &FileConfig,
) -> anyhow::Result<LedgerSettings> {
    let url = overrides
        .ledger_url
        .clone()
        .or_else(|| env.text("CAIRN_LEDGER_URL"))
        .or(file.ledger.url.clone())
        .filter(|url| !url.trim().is_empty());
    if let Some(url) = &url {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            bail!(
                "ledger URL `{}` is not a PostgreSQL URL (postgres://user@host:port/database); \
                 leave it unset for the embedded SQLite ledger in the data directory",
                redact_url(url)
            );
        }
    }
    Ok(LedgerSettings {
        url,
        max_group: file.ledger.max_group.unwrap_or(policy::DEFAULT_MAX_GROUP),
        pool_size: env
            .number("CAIRN_LEDGER_POOL_SIZE")?
            .or(file.ledger.pool_size)
            .unwrap_or(DEFAULT_LEDGER_POOL_SIZE),
        committers: env
            .number("CAIRN_LEDGER_COMMITTERS")?
            .or(file.ledger.committers)
            .unwrap_or(DEFAULT_LEDGER_COMMITTERS),
        token_cache: Duration::from_millis(
            env.number("CAIRN_LEDGER_TOKEN_CACHE_MS")?
                .or(file.ledger.token_cache_ms)
                .unwrap_or(DEFAULT_LEDGER_TOKEN_CACHE_MS),
        ),
        peer_timeout: Duration::from_millis(
            env.number("CAIRN_LEDGER_PEER_TIMEOUT_MS")?
                .or(file.ledger.peer_timeout_ms)
                .unwrap_or(DEFAULT_LEDGER_PEER_TIMEOUT_MS),
        ),
    })
}

/// `[limits]`: ingest limits.
fn acceptor(env: &Env<'_>, file: &FileConfig) -> anyhow::Result<acceptor::AcceptorConfig> {
    let defaults = acceptor::AcceptorConfig::default();
    let max_body_bytes = env
        .number("CAIRN_MAX_BODY_BYTES")?
        .or(file.limits.max_body_bytes)
        .unwrap_or(defaults.max_body_bytes);
    let max_batch_body_bytes = env
        .number("CAIRN_MAX_BATCH_BODY_BYTES")?
        .or(file.limits.max_batch_body_bytes)
        .unwrap_or(defaults.max_batch_body_bytes);
    Ok(acceptor::AcceptorConfig {
        max_body_bytes,
        max_batch_body_bytes,
        max_batch_items: env
            .number("CAIRN_MAX_BATCH_ITEMS")?
            .or(file.limits.max_batch_items)
            .unwrap_or(defaults.max_batch_items),
        // Unless set, room for the larger of the two body limits (the default: one maximal
        // batch at a time).
        max_body_bytes_in_flight: env
            .number("CAIRN_MAX_BODY_BYTES_IN_FLIGHT")?
            .or(file.limits.max_body_bytes_in_flight)
            .unwrap_or(
                defaults
                    .max_body_bytes_in_flight
                    .max(max_body_bytes)
                    .max(max_batch_body_bytes),
            ),
    })
}

/// `ledger.backends` (`CAIRN_BACKENDS`): the backends that get a receipt per job.
fn backends(env: &Env<'_>, file: &FileConfig) -> anyhow::Result<Vec<Backend>> {
    let names: Option<Vec<String>> = env
        .get("CAIRN_BACKENDS")
        .map(|text| {
            text.split(',')
                .map(|name| name.trim().to_owned())
                .filter(|name| !name.is_empty())
                .collect()
        })
        .or(file.ledger.backends.clone());
    match names {
        None => Ok(policy::DEFAULT_BACKENDS.to_vec()),
        Some(names) => names
            .iter()
            .map(|name| {
                name.parse::<Backend>()
                    .map_err(|error| anyhow::anyhow!("backends: {error}"))
            })
            .collect(),
    }
}

/// `[jobs]` and `[jobs.KIND]`: per kind, the environment (every kind), then `[jobs.KIND]`,
/// then `[jobs]`, then the defaults.
fn job_policies(env: &Env<'_>, file: &FileConfig) -> anyhow::Result<policy::JobPolicies> {
    let from_env = FilePolicy {
        max_attempts: env.number("CAIRN_MAX_ATTEMPTS")?,
        lease_ms: env.number("CAIRN_LEASE_MS")?,
        max_run_ms: env.number("CAIRN_MAX_RUN_MS")?,
        quarantine_after_crashes: env.number("CAIRN_QUARANTINE_AFTER_CRASHES")?,
        backoff_base_ms: env.number("CAIRN_BACKOFF_BASE_MS")?,
        backoff_cap_ms: env.number("CAIRN_BACKOFF_CAP_MS")?,
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
    Ok(policy::JobPolicies {
        project: from_env.over(jobs.project.over(every_kind)).resolve(),
        tombstone: from_env.over(jobs.tombstone.over(every_kind)).resolve(),
        graph: from_env.over(jobs.graph.over(every_kind)).resolve(),
        sync: from_env.over(jobs.sync.over(every_kind)).resolve(),
        access: from_env.over(jobs.access.over(every_kind)).resolve(),
    })
}

/// `[workers]`: the workers inside `cairn serve`.
fn workers(env: &Env<'_>, file: &FileConfig) -> anyhow::Result<WorkerSettings> {
    Ok(WorkerSettings {
        count: env
            .number("CAIRN_WORKERS")?
            .or(file.workers.count)
            .unwrap_or(DEFAULT_WORKERS),
        concurrency: env
            .number("CAIRN_WORKER_CONCURRENCY")?
            .or(file.workers.concurrency)
            .unwrap_or(DEFAULT_WORKER_CONCURRENCY),
        unit_jobs: env
            .number("CAIRN_WORKER_UNIT_JOBS")?
            .or(file.workers.unit_jobs)
            .unwrap_or(super::DEFAULT_UNIT_JOBS),
        unit_max_bytes: env
            .number("CAIRN_WORKER_UNIT_MAX_BYTES")?
            .or(file.workers.unit_max_bytes)
            .unwrap_or(worker::UnitSettings::default().max_bytes),
    })
}

/// `[projection]`: the model, the chunker and the vector store's optimiser.
fn projection(
    env: &Env<'_>,
    file: &FileConfig,
    server: Option<&EmbeddingServer>,
) -> anyhow::Result<ProjectionSettings> {
    let chunker_defaults = gateways::ChunkerSettings::default();
    let optimize_defaults = gateways::OptimizePolicy::default();
    let projection = &file.projection;
    Ok(ProjectionSettings {
        models_dir: env
            .get("CAIRN_MODELS_DIR")
            .map(PathBuf::from)
            .or(projection.models_dir.clone())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_MODELS_DIR)),
        model: match env.text("CAIRN_MODEL").or(projection.model.clone()) {
            None => gateways::embedder::MODEL_ID.to_owned(),
            Some(model) if model == "remote" => match server {
                Some(server) => {
                    gateways::embedder::remote_model_id(&server.options.url, &server.options.model)
                }
                None => anyhow::bail!(
                    "projection.model is `remote` but no embedding server is configured: set \
                     embeddings.url (or CAIRN_EMBEDDINGS_URL)"
                ),
            },
            Some(model) => model,
        },
        chunker: gateways::ChunkerSettings {
            max_tokens: projection
                .chunk_max_tokens
                .unwrap_or(chunker_defaults.max_tokens),
            overlap_tokens: projection
                .chunk_overlap_tokens
                .unwrap_or(chunker_defaults.overlap_tokens),
        },
        embed_batch: env
            .number("CAIRN_EMBED_BATCH")?
            .or(projection.embed_batch)
            .unwrap_or(gateways::embedder::DEFAULT_EMBED_BATCH),
        embed_sessions: env
            .number("CAIRN_EMBED_SESSIONS")?
            .or(projection.embed_sessions)
            .unwrap_or(1),
        embed_threads: env
            .number("CAIRN_EMBED_THREADS")?
            .or(projection.embed_threads),
        optimize: gateways::OptimizePolicy {
            min_new_points: projection
                .optimize_min_new_points
                .unwrap_or(optimize_defaults.min_new_points),
            max_new_points: projection
                .optimize_max_new_points
                .unwrap_or(optimize_defaults.max_new_points),
            quiet: projection
                .optimize_quiet_ms
                .map_or(optimize_defaults.quiet, Duration::from_millis),
            check_every: optimize_defaults.check_every,
        },
    })
}

/// `[search]`: admission and budgets.
fn search(env: &Env<'_>, file: &FileConfig) -> anyhow::Result<search::SearchSettings> {
    let defaults = search::SearchSettings::default();
    Ok(search::SearchSettings {
        max_in_flight: env
            .number("CAIRN_SEARCH_MAX_IN_FLIGHT")?
            .or(file.search.max_in_flight)
            .unwrap_or(defaults.max_in_flight),
        max_queued: env
            .number("CAIRN_SEARCH_MAX_QUEUED")?
            .or(file.search.max_queued)
            .unwrap_or(defaults.max_queued),
        default_budget: env
            .number("CAIRN_SEARCH_BUDGET_MS")?
            .or(file.search.default_budget_ms)
            .map_or(defaults.default_budget, Duration::from_millis),
        max_budget: file
            .search
            .max_budget_ms
            .map_or(defaults.max_budget, Duration::from_millis),
        filter_limits: receipts::filter::FilterLimits {
            max_conditions: file
                .search
                .filter_max_conditions
                .unwrap_or(defaults.filter_limits.max_conditions),
            max_depth: file
                .search
                .filter_max_depth
                .unwrap_or(defaults.filter_limits.max_depth),
            max_values: file
                .search
                .filter_max_values
                .unwrap_or(defaults.filter_limits.max_values),
        },
        filter_max_narrowing: file
            .search
            .filter_max_narrowing
            .unwrap_or(defaults.filter_max_narrowing),
    })
}

/// `[http]`: the server's connection cap and timeouts.
fn http(env: &Env<'_>, file: &FileConfig) -> anyhow::Result<crate::server::HttpSettings> {
    let defaults = crate::server::HttpSettings::default();
    Ok(crate::server::HttpSettings {
        max_connections: env
            .number("CAIRN_HTTP_MAX_CONNECTIONS")?
            .or(file.http.max_connections)
            .unwrap_or(defaults.max_connections),
        header_read_timeout: env
            .number("CAIRN_HTTP_HEADER_READ_TIMEOUT_MS")?
            .or(file.http.header_read_timeout_ms)
            .map_or(defaults.header_read_timeout, Duration::from_millis),
        request_timeout: env
            .number("CAIRN_HTTP_REQUEST_TIMEOUT_MS")?
            .or(file.http.request_timeout_ms)
            .map_or(defaults.request_timeout, Duration::from_millis),
        shutdown_grace: env
            .number("CAIRN_HTTP_SHUTDOWN_GRACE_MS")?
            .or(file.http.shutdown_grace_ms)
            .map_or(defaults.shutdown_grace, Duration::from_millis),
    })
}

/// `[vectors]`: a Qdrant server or cluster, or `None` for the embedded qdrant-edge shard.
/// `--vectors` and `CAIRN_VECTORS_URL` take one URL or a comma-separated list of a
/// cluster's nodes; the file takes `url` or `urls`, not both.
fn vectors(
    overrides: &Overrides,
    env: &Env<'_>,
    file: &FileConfig,
) -> anyhow::Result<Option<gateways::ServerOptions>> {
    let section = &file.vectors;
    if section.url.is_some() && section.urls.is_some() {
        anyhow::bail!(
            "vectors.url and vectors.urls are both set: give one URL in url, or every node \
             of a cluster in urls"
        );
    }
    let listed = overrides
        .vectors_url
        .clone()
        .or_else(|| env.text("CAIRN_VECTORS_URL"))
        .map(|text| text.split(',').map(str::to_owned).collect::<Vec<_>>())
        .or(section.url.clone().map(|url| vec![url]))
        .or(section.urls.clone())
        .unwrap_or_default();
    let urls: Vec<&str> = listed
        .iter()
        .map(|url| url.trim())
        .filter(|url| !url.is_empty())
        .collect();
    if urls.is_empty() {
        if section.shards.is_some()
            || section.replication_factor.is_some()
            || section.write_consistency_factor.is_some()
        {
            anyhow::bail!(
                "vectors.shards, vectors.replication_factor and vectors.write_consistency_factor \
                 lay out a Qdrant server's collection, but no server is configured (vectors.url \
                 or vectors.urls); the embedded qdrant-edge store has one shard"
            );
        }
        return Ok(None);
    }
    let mut options = gateways::ServerOptions::cluster(&urls);
    options.layout = gateways::CollectionLayout {
        shards: section.shards,
        replication_factor: section.replication_factor,
        write_consistency: section.write_consistency_factor,
    };
    options.api_key = env
        .get("CAIRN_VECTORS_API_KEY")
        .filter(|key| !key.is_empty())
        .cloned();
    if let Some(ms) = file.vectors.timeout_ms {
        options.timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = file.vectors.connect_timeout_ms {
        options.connect_timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = file.vectors.retry_ms {
        options.retry_budget = Duration::from_millis(ms);
    }
    if let Some(prefix) = &file.vectors.collection_prefix {
        options.collection_prefix = prefix.clone();
    }
    Ok(Some(options))
}

/// `[embeddings]`: the remote embedding server, when `embeddings.url` is set.
fn embeddings(env: &Env<'_>, file: &FileConfig) -> anyhow::Result<Option<EmbeddingServer>> {
    let section = &file.embeddings;
    let Some(url) = env
        .text("CAIRN_EMBEDDINGS_URL")
        .or(section.url.clone())
        .filter(|url| !url.trim().is_empty())
    else {
        return Ok(None);
    };
    let model = env
        .text("CAIRN_EMBEDDINGS_MODEL")
        .or(section.model.clone())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "embeddings.url is set but embeddings.model is not: name the model the server \
                 serves (CAIRN_EMBEDDINGS_MODEL)"
            )
        })?;
    let dimension = env
        .number("CAIRN_EMBEDDINGS_DIMENSIONS")?
        .or(section.dimensions)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "embeddings.url is set but embeddings.dimensions is not: give the model's \
                 vector dimension (CAIRN_EMBEDDINGS_DIMENSIONS)"
            )
        })?;
    Ok(Some(EmbeddingServer {
        options: gateways::RemoteOptions {
            url: url.trim().trim_end_matches('/').to_owned(),
            model,
            dimension,
            key: env
                .get("CAIRN_EMBEDDINGS_KEY")
                .filter(|key| !key.is_empty())
                .cloned(),
            batch: env
                .number("CAIRN_EMBEDDINGS_BATCH")?
                .or(section.batch)
                .unwrap_or(DEFAULT_REMOTE_BATCH),
            timeout: Duration::from_millis(
                env.number("CAIRN_EMBEDDINGS_TIMEOUT_MS")?
                    .or(section.timeout_ms)
                    .unwrap_or(DEFAULT_REMOTE_TIMEOUT_MS),
            ),
        },
        parallel: env
            .number("CAIRN_EMBEDDINGS_PARALLEL")?
            .or(section.parallel)
            .unwrap_or(DEFAULT_REMOTE_PARALLEL),
    }))
}

/// A comma-separated list from the environment.
fn list(text: &str) -> Vec<String> {
    text.split(',')
        .map(|item| item.trim().to_owned())
        .filter(|item| !item.is_empty())
        .collect()
}

/// `[mcp]`: which `Host` and `Origin` values `/mcp` accepts. The hosts default to the
/// loopback names and the bind address; the request body limit is the ingest limit.
fn mcp(
    env: &Env<'_>,
    file: &FileConfig,
    bind: SocketAddr,
    acceptor: &acceptor::AcceptorConfig,
) -> agents::McpSettings {
    let mut defaults = agents::McpSettings::default();
    if !bind.ip().is_unspecified() && !bind.ip().is_loopback() {
        defaults.allowed_hosts.push(bind.ip().to_string());
    }
    agents::McpSettings {
        allowed_hosts: env
            .get("CAIRN_MCP_ALLOWED_HOSTS")
            .map(|text| list(text))
            .or(file.mcp.allowed_hosts.clone())
            .unwrap_or(defaults.allowed_hosts),
        allowed_origins: env
            .get("CAIRN_MCP_ALLOWED_ORIGINS")
            .map(|text| list(text))
            .or(file.mcp.allowed_origins.clone())
            .unwrap_or(defaults.allowed_origins),
        max_body_bytes: acceptor.max_body_bytes,
    }
}

/// `[connectors]`: the folders connectors may read, each an absolute path (comma-separated in
/// the variable). None by default: a folder connector is refused until an operator names them.
/// `datasets.<d>.default_access`, each dataset name and value checked.
fn default_access(
    file: &FileConfig,
) -> anyhow::Result<std::collections::BTreeMap<String, receipts::access::DefaultAccess>> {
    let mut defaults = std::collections::BTreeMap::new();
    for (dataset, settings) in &file.datasets {
        receipts::validate::dataset(dataset)
            .map_err(|error| anyhow::anyhow!("[datasets.{dataset}]: {error}"))?;
        if let Some(text) = &settings.default_access {
            let default = text.parse().map_err(|error: String| {
                anyhow::anyhow!("datasets.{dataset}.default_access: {error}")
            })?;
            defaults.insert(dataset.clone(), default);
        }
    }
    Ok(defaults)
}

/// `datasets.<d>.filterable`: the metadata fields the vector store indexes, each name and
/// type checked, over every dataset (a collection holds them all, so one field has one type).
/// `events.retention_hours` (or `CAIRN_EVENTS_RETENTION_HOURS`): at least one hour.
fn events_retention(env: &Env, file: &FileConfig) -> anyhow::Result<Duration> {
    let hours = match env.number::<u64>("CAIRN_EVENTS_RETENTION_HOURS")? {
        Some(hours) => Some(hours),
        None => file.events.retention_hours,
    };
    match hours {
        None => Ok(events::retention::DEFAULT_RETENTION),
        Some(0) => bail!(
            "events.retention_hours: at least 1 (the change feed's consumers need time to read)"
        ),
        Some(hours) => Ok(Duration::from_secs(hours.saturating_mul(3600))),
    }
}

/// `[webhooks]` (and `CAIRN_WEBHOOKS_*`): each bound checked; a delivery is retried for at
/// most as long as the outbox keeps its event.
fn webhooks(
    env: &Env,
    file: &FileConfig,
    data_dir: &std::path::Path,
    retention: Duration,
) -> anyhow::Result<events::WebhookSettings> {
    let written = &file.webhooks;
    let mut settings = events::WebhookSettings::with_data_dir(data_dir);
    if let Some(hosts) = env
        .get("CAIRN_WEBHOOKS_ALLOW_HOSTS")
        .map(|text| list(text))
        .or(written.allow_hosts.clone())
    {
        settings.allow_hosts = hosts;
    }
    if let Some(path) = env
        .get("CAIRN_WEBHOOKS_SECRET_KEY_FILE")
        .map(PathBuf::from)
        .or(written.secret_key_file.clone())
    {
        settings.secret_key_file = path;
    }
    if let Some(hours) = written.rotation_grace_hours {
        if hours > 24 * 30 {
            bail!("webhooks.rotation_grace_hours: at most 720 (30 days)");
        }
        settings.rotation_grace = Duration::from_secs(hours * 3600);
    }
    let dispatch = &mut settings.dispatch;
    if let Some(seconds) = env
        .number::<u64>("CAIRN_WEBHOOKS_RETRY_FOR_SECONDS")?
        .or(written.retry_for_seconds)
    {
        if seconds == 0 || Duration::from_secs(seconds) > retention {
            bail!(
                "webhooks.retry_for_seconds: 1 to events.retention_hours ({} s): a delivery is retried only while the outbox keeps its event",
                retention.as_secs()
            );
        }
        dispatch.retry_for = Duration::from_secs(seconds);
    } else if dispatch.retry_for > retention {
        dispatch.retry_for = retention;
    }
    if let Some(ms) = env
        .number::<u64>("CAIRN_WEBHOOKS_BACKOFF_BASE_MS")?
        .or(written.backoff_base_ms)
    {
        if !(10..=3_600_000).contains(&ms) {
            bail!("webhooks.backoff_base_ms: 10 to 3600000");
        }
        dispatch.backoff_base = Duration::from_millis(ms);
    }
    if let Some(seconds) = written.backoff_max_seconds {
        if !(1..=86_400).contains(&seconds) {
            bail!("webhooks.backoff_max_seconds: 1 to 86400");
        }
        dispatch.backoff_max = Duration::from_secs(seconds);
    }
    if let Some(ms) = env
        .number::<u64>("CAIRN_WEBHOOKS_ATTEMPT_TIMEOUT_MS")?
        .or(written.attempt_timeout_ms)
    {
        if !(100..=60_000).contains(&ms) {
            bail!("webhooks.attempt_timeout_ms: 100 to 60000");
        }
        dispatch.attempt_timeout = Duration::from_millis(ms);
    }
    if let Some(concurrency) = env
        .number::<usize>("CAIRN_WEBHOOKS_CONCURRENCY")?
        .or(written.concurrency)
    {
        if !(1..=64).contains(&concurrency) {
            bail!("webhooks.concurrency: 1 to 64");
        }
        dispatch.concurrency = concurrency;
    }
    Ok(settings)
}

/// `[oauth.issuers.introspection]`, its secret read from the file or the variable it names.
fn introspection(
    at: &str,
    written: &super::file::FileIntrospection,
    env: &Env,
) -> anyhow::Result<oauth::Introspection> {
    let secret = match (&written.client_secret_file, &written.client_secret_env) {
        (Some(path), None) => std::fs::read_to_string(path)
            .map_err(|error| {
                anyhow::anyhow!(
                    "{at}.introspection.client_secret_file {}: {error}",
                    path.display()
                )
            })?
            .trim()
            .to_owned(),
        (None, Some(name)) => env
            .text(name)
            .map(|value| value.trim().to_owned())
            .ok_or_else(|| {
                anyhow::anyhow!("{at}.introspection.client_secret_env: ${name} is not set")
            })?,
        _ => anyhow::bail!(
            "{at}.introspection: name the client secret's source, client_secret_file or client_secret_env (one of them)"
        ),
    };
    Ok(oauth::Introspection {
        endpoint: written.endpoint.clone(),
        client_id: written.client_id.clone(),
        client_secret: oauth::Secret(secret),
        cache: std::time::Duration::from_secs(written.cache_seconds.unwrap_or(30)),
        jwts: written.jwts.unwrap_or(false),
    })
}

/// `[oauth]` and `[[oauth.issuers]]`: none unless a resource is named.
fn oauth_settings(file: &FileConfig, env: &Env) -> anyhow::Result<Option<super::OAuthSettings>> {
    let settings = &file.oauth;
    let Some(resource) = settings.resource.clone() else {
        if settings
            .issuers
            .as_ref()
            .is_some_and(|issuers| !issuers.is_empty())
        {
            anyhow::bail!("oauth.issuers needs oauth.resource (cairn's public URL, the audience)");
        }
        return Ok(None);
    };
    let mut issuers = Vec::new();
    for (index, written) in settings.issuers.iter().flatten().enumerate() {
        let at = format!("oauth.issuers[{index}]");
        let mut issuer = oauth::IssuerConfig::new(&written.issuer);
        issuer.jwks_uri = written.jwks_uri.clone();
        if let Some(algorithms) = &written.algorithms {
            issuer.algorithms = algorithms.clone();
        }
        for (name, granted) in written.scopes.iter().flatten() {
            let scopes = granted
                .iter()
                .map(|scope| scope.parse::<receipts::Scope>())
                .collect::<Result<Vec<_>, String>>()
                .map_err(|error| anyhow::anyhow!("{at}.scopes.{name}: {error}"))?;
            issuer.scopes.insert(name.clone(), scopes);
        }
        if let Some(claim) = &written.principal_claim {
            issuer.principal_claim = claim.clone();
        }
        issuer.groups_claim = written.groups_claim.clone();
        issuer.datasets_claim = written.datasets_claim.clone();
        issuer.datasets = written.datasets.clone();
        if let Some(seconds) = written.skew_seconds {
            issuer.skew = std::time::Duration::from_secs(seconds);
        }
        if let Some(seconds) = written.refetch_interval_seconds {
            if seconds == 0 {
                anyhow::bail!("{at}.refetch_interval_seconds: at least 1, so that unknown keys cannot make cairn fetch at every request");
            }
            issuer.refetch_interval = std::time::Duration::from_secs(seconds);
        }
        if let Some(written) = &written.introspection {
            issuer.introspection = Some(introspection(&at, written, env)?);
        }
        issuers.push(issuer);
    }
    let resource = oauth::Resource { resource, issuers };
    resource
        .check()
        .map_err(|error| anyhow::anyhow!("[oauth]: {error}"))?;
    Ok(Some(super::OAuthSettings {
        resource,
        cairn_tokens: settings.cairn_tokens.unwrap_or(true),
    }))
}

fn filterable(file: &FileConfig) -> anyhow::Result<Vec<(String, gateways::FieldKind)>> {
    let mut fields: std::collections::BTreeMap<String, (gateways::FieldKind, String)> =
        std::collections::BTreeMap::new();
    for (dataset, settings) in &file.datasets {
        for (name, kind) in settings.filterable.iter().flatten() {
            let at = format!("datasets.{dataset}.filterable.{name}");
            if receipts::filter::metadata_name(&format!("metadata.{name}")).is_none() {
                anyhow::bail!(
                    "{at}: a metadata field name is 1 to 64 letters, digits, `_` or `-` (the \
                     names a filter's `metadata.<name>` accepts)"
                );
            }
            let Some(kind) = gateways::FieldKind::of_setting(kind) else {
                anyhow::bail!(
                    "{at}: `{kind}` is not a field type; use `keyword` (strings), `number` or \
                     `bool`"
                );
            };
            match fields.get(name) {
                Some((known, first)) if *known != kind => anyhow::bail!(
                    "{at}: metadata.{name} is declared with another type in {first}; one vector \
                     collection holds every dataset, so a field has one type"
                ),
                Some(_) => {}
                None => {
                    fields.insert(name.clone(), (kind, at));
                }
            }
        }
    }
    Ok(fields
        .into_iter()
        .map(|(name, (kind, _))| (format!("metadata.{name}"), kind))
        .collect())
}

fn connector_settings(
    env: &Env<'_>,
    file: &FileConfig,
    data_dir: &std::path::Path,
) -> anyhow::Result<connectors::api::ConnectorSettings> {
    let folder_roots: Vec<std::path::PathBuf> = env
        .get("CAIRN_CONNECTOR_FOLDER_ROOTS")
        .map(|text| list(text).into_iter().map(Into::into).collect())
        .or(file.connectors.folder_roots.clone())
        .unwrap_or_default();
    if let Some(relative) = folder_roots.iter().find(|root| !root.is_absolute()) {
        anyhow::bail!(
            "connectors.folder_roots: `{}` is not an absolute path",
            relative.display()
        );
    }
    let written = &file.connectors;
    let mut remote = connectors::remote::RemoteSettings::none(data_dir);
    if let Some(hosts) = env
        .get("CAIRN_CONNECTOR_REMOTE_HOSTS")
        .map(|text| list(text))
        .or(written.remote_hosts.clone())
    {
        remote.hosts = hosts;
    }
    if let Some(dir) = env
        .get("CAIRN_CONNECTOR_CREDENTIALS_DIR")
        .map(PathBuf::from)
        .or(written.credentials_dir.clone())
    {
        if !dir.is_absolute() {
            bail!(
                "connectors.credentials_dir: `{}` is not an absolute path",
                dir.display()
            );
        }
        remote.credentials_dir = dir;
    }
    if let Some(depth) = env
        .number::<u32>("CAIRN_CONNECTOR_GIT_DEPTH")?
        .or(written.git_depth)
    {
        remote.depth = depth;
    }
    if let Some(bytes) = env
        .number::<u64>("CAIRN_CONNECTOR_MAX_FETCH_BYTES")?
        .or(written.max_fetch_bytes)
    {
        if bytes < 1 << 20 {
            bail!("connectors.max_fetch_bytes: at least 1048576 (1 MiB)");
        }
        remote.max_fetch_bytes = bytes;
    }
    if let Some(seconds) = env
        .number::<u64>("CAIRN_CONNECTOR_FETCH_TIMEOUT_S")?
        .or(written.fetch_timeout_s)
    {
        if !(1..=86_400).contains(&seconds) {
            bail!("connectors.fetch_timeout_s: 1 to 86400");
        }
        remote.fetch_timeout = Duration::from_secs(seconds);
    }
    // Credentials for remotes whose connector names no file: the environment only, never the
    // configuration file (which is often committed).
    let secret = |name: &str| env.get(name).filter(|value| !value.is_empty()).cloned();
    remote.environment = connectors::remote::Credentials {
        username: secret("CAIRN_GIT_USERNAME"),
        password: secret("CAIRN_GIT_PASSWORD"),
        token: secret("CAIRN_GIT_TOKEN"),
        bearer: secret("CAIRN_GIT_BEARER"),
        ssh_key: secret("CAIRN_GIT_SSH_KEY").map(PathBuf::from),
        known_hosts: secret("CAIRN_GIT_KNOWN_HOSTS").map(PathBuf::from),
        hook_secret: None,
    };
    Ok(connectors::api::ConnectorSettings {
        folder_roots,
        remote,
    })
}

/// The newest Debian PostgreSQL's programs (`/usr/lib/postgresql/<version>/bin`), where
/// `pg_dump` and `pg_restore` of the server's own version live.
fn newest_postgres_bin() -> Option<PathBuf> {
    std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("pg_dump").exists().then_some((version, bin))
        })
        .max()
        .map(|(_, bin)| bin)
}

/// `[verify]`: the scheduled pass (`interval_ms = 0` turns it off; by hand, passes still run).
fn verify_settings(env: &Env<'_>, file: &FileConfig) -> anyhow::Result<verify::VerifySettings> {
    let defaults = verify::VerifySettings::default();
    let interval = env
        .number::<u64>("CAIRN_VERIFY_INTERVAL_MS")?
        .or(file.verify.interval_ms)
        .map_or(defaults.interval, |ms| {
            (ms > 0).then(|| Duration::from_millis(ms))
        });
    let tier = match env.text("CAIRN_VERIFY_TIER").or(file.verify.tier.clone()) {
        Some(text) => text
            .parse::<receipts::model::VerifyTier>()
            .map_err(|error| anyhow::anyhow!("verify.tier: {error}"))?,
        None => defaults.tier,
    };
    let repair = match env.text("CAIRN_VERIFY_REPAIR") {
        Some(text) => match text.as_str() {
            "true" | "1" => true,
            "false" | "0" => false,
            other => bail!("CAIRN_VERIFY_REPAIR: `{other}` is not true or false"),
        },
        None => file.verify.repair.unwrap_or(defaults.repair),
    };
    let points_per_second = env
        .number::<u32>("CAIRN_VERIFY_POINTS_PER_SECOND")?
        .or(file.verify.points_per_second)
        .unwrap_or(defaults.points_per_second);
    if points_per_second == 0 {
        bail!("verify.points_per_second must be at least 1");
    }
    if interval.is_some_and(|interval| interval < Duration::from_secs(60)) {
        bail!("verify.interval_ms must be 0 (off) or at least 60000 (one minute)");
    }
    Ok(verify::VerifySettings {
        interval,
        tier,
        repair,
        points_per_second,
    })
}

/// `[graph]`: a Bolt server, or `None` for no graph backend.
fn graph(env: &Env<'_>, file: &FileConfig) -> Option<gateways::BoltOptions> {
    let url = env
        .text("CAIRN_GRAPH_URL")
        .or(file.graph.url.clone())
        .filter(|url| !url.trim().is_empty())?;
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
        options.timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = file.graph.retry_ms {
        options.retry_budget = Duration::from_millis(ms);
    }
    Some(options)
}
