//! The two processes cairn runs, composed side by side: [`serve`] (the API, and workers when
//! `workers.count > 0`) and [`work`] (workers only, for `cairn worker`). Both open the ledger
//! the same way ([`open_ledger`]) and stop on the same signal ([`shutdown_signal`]).

use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use receipts::auth::NewToken;
use receipts::{Backend, Ledger, Scope, SqliteLedger, SystemClock, Tokens};

use crate::app::app_with_graph;
use crate::config::{self, Config};
use crate::{datadir, projection, server};

/// Opens the ledger of a configuration: PostgreSQL when a ledger URL is configured (running
/// its migrations, on the database's clock), else the embedded SQLite ledger.
pub async fn open_ledger(config: &Config) -> anyhow::Result<Arc<dyn Ledger>> {
    let ledger: Arc<dyn Ledger> = match &config.ledger.url {
        Some(url) => Arc::new(
            receipts::PostgresLedger::open(config.postgres_options(url))
                .await
                .with_context(|| format!("opening the ledger ({})", config.ledger_description()))?,
        ),
        None => Arc::new(
            SqliteLedger::open(config.ledger_options(), Arc::new(SystemClock))
                .await
                .with_context(|| format!("opening the ledger ({})", config.ledger_description()))?,
        ),
    };
    Ok(ledger)
}

/// Creates the admin token when the ledger has no token yet; returns where it was written.
pub async fn ensure_admin_token(
    ledger: &dyn Tokens,
    data_dir: &Path,
) -> anyhow::Result<Option<std::path::PathBuf>> {
    if ledger.token_count().await? > 0 {
        return Ok(None);
    }
    let created = ledger
        .create_token(NewToken {
            name: "admin".to_owned(),
            scopes: vec![Scope::Admin],
            datasets: None,
            identity: None,
            created_by: "cairn:bootstrap".to_owned(),
            expires_at: None,
        })
        .await?;
    let path = config::admin_token_path(data_dir);
    write_secret_file(&path, &created.secret)?;
    Ok(Some(path))
}

/// Writes a secret to `path` with mode 0600, durably (temp file, fsync, rename, fsync dir).
pub fn write_secret_file(path: &Path, secret: &str) -> anyhow::Result<()> {
    let directory = path.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(directory)?;
    let temporary = path.with_extension("tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(&temporary)
        .with_context(|| format!("creating {}", temporary.display()))?;
    file.write_all(secret.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)?;
    std::fs::File::open(directory)?.sync_all()?;
    Ok(())
}

/// Records each configured dataset's default access (`datasets.<d>.default_access`) through
/// the ledger's one path for access changes; one the ledger already holds writes nothing.
async fn apply_default_access(ledger: &dyn Ledger, config: &Config) -> anyhow::Result<()> {
    for (dataset, default) in &config.default_access {
        ledger
            .change_access(receipts::access::AccessChange::Dataset {
                dataset: dataset.clone(),
                default: *default,
                actor: "config".to_owned(),
                reason: format!("datasets.{dataset}.default_access in the configuration"),
            })
            .await
            .with_context(|| format!("recording datasets.{dataset}.default_access"))?;
        tracing::info!(%dataset, default = default.as_str(), "dataset default access from the configuration");
    }
    Ok(())
}

/// Runs `cairn serve` until `shutdown` resolves. Prints `listening on http://ADDR` on stdout
/// once the socket is bound.
pub async fn serve(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    datadir::prepare(&config.data_dir)?;
    // Held while serving: a restore refuses to replace files under this process.
    let _in_use = datadir::hold(&config.data_dir)?;
    let ledger = open_ledger(&config).await?;
    if let Some(path) = ensure_admin_token(ledger.as_ref(), &config.data_dir).await? {
        println!(
            "created the admin token; it is in {} (mode 0600)",
            path.display()
        );
    }
    apply_default_access(ledger.as_ref(), &config).await?;
    // The process that runs the workers owns the embedded vector shard, so vector search
    // lives there too; with `workers.count = 0` (workers in another process) search is lexical
    // on the embedded store, and hybrid on a Qdrant server (which every process shares).
    let projection = if config.workers.count > 0 {
        Some(projection::open_projection(&config, ledger.clone()).await?)
    } else {
        None
    };
    let stores = match &projection {
        Some(projection) => projection.stores.clone(),
        None if config.backends.contains(&Backend::Vector) && config.vectors.is_some() => {
            Some(projection::GenerationStores::new(
                &config,
                Some(ledger.clone() as Arc<dyn receipts::Projections>),
            ))
        }
        None => {
            if config.backends.contains(&Backend::Vector) {
                println!(
                    "workers.count is 0: the vector shard belongs to the worker process, so \
                     search here is lexical only (a Qdrant server, vectors.url, is shared)"
                );
            }
            None
        }
    };
    let models = match &projection {
        Some(projection) => projection.models.clone(),
        None => projection::model_catalog(&config),
    };
    let vector = match &stores {
        Some(stores) => {
            // The active generation's query model, loaded now so the first query does not wait.
            if let Some(active) = ledger.active_generation().await? {
                if let Err(error) = gateways::Embedders::embedder(
                    models.as_ref(),
                    &active.model,
                    gateways::EmbedRole::Query,
                )
                .await
                {
                    tracing::warn!(model = %active.model, %error, "the active generation's query model is not available: search falls back to lexical");
                }
            }
            Some(search::VectorSide {
                embedders: models.clone(),
                stores: stores.clone(),
            })
        }
        None => None,
    };
    let generations: Arc<dyn ops::generations::GenerationSetup> = Arc::new(
        projection::OpsGenerations::new(&config, stores.clone(), models.clone()),
    );
    let workers = start_workers(&config, ledger.clone(), projection.as_ref()).await?;
    let stop_workers = workers.stop.clone();
    // Descriptors for every connection the server may hold, plus the ledger's and the
    // vector store's files.
    let needed = (config.http.max_connections + server::OVERFLOW_CONNECTIONS) as u64 + 1024;
    if let Some(limit) = server::ensure_open_files(needed) {
        if limit < needed {
            tracing::warn!(
                open_file_limit = limit,
                needed,
                max_connections = config.http.max_connections,
                "the open-file limit is below what http.max_connections may need; lower \
                 http.max_connections or raise `ulimit -n`"
            );
        }
    }
    let listener = tokio::net::TcpListener::bind(config.bind)
        .await
        .with_context(|| format!("binding {}", config.bind))?;
    let address = listener.local_addr()?;
    println!("listening on http://{address}");
    let _ = std::io::stdout().flush();
    tracing::info!(%address, data_dir = %config.data_dir.display(), ledger = %config.ledger_description(), vectors = %config.vectors_description(), graph = %config.graph_description(), backends = ?config.backends, "cairn serving");
    // The graph is read by every process that serves the API (workers write it).
    let graph: Option<Arc<dyn gateways::GraphStore>> = match &config.graph {
        Some(options) => Some(Arc::new(
            gateways::BoltGraphStore::open(options)
                .await
                .with_context(|| format!("opening the graph at {}", options.url))?,
        )),
        None => None,
    };
    // Verify runs where the vector stores are open (with the workers, or on a shared server).
    let verifier = verify::Verifier::with_embedders(
        ledger.clone(),
        vector.as_ref().map(|side| side.stores.clone()),
        vector.as_ref().map(|side| side.embedders.clone()),
        config.verify.clone(),
    );
    let schedule = verifier.spawn_schedule();
    let retention = tokio::spawn(events::retention::run(
        ledger.clone(),
        config.events_retention,
    ));
    let (stop_deliveries, deliveries_stopped) = tokio::sync::watch::channel(false);
    let deliveries = match config.webhooks.sealer() {
        Some(sealer) => match events::dispatch::Dispatcher::new(
            ledger.clone(),
            sealer,
            config.webhooks.policy(),
            config.webhooks.dispatch.clone(),
        ) {
            Ok(dispatcher) => Some(tokio::spawn(
                std::sync::Arc::new(dispatcher).run(deliveries_stopped),
            )),
            Err(error) => {
                tracing::error!(%error, "webhook deliveries cannot start");
                None
            }
        },
        None => None,
    };
    let application = app_with_graph(
        ledger,
        &config,
        vector,
        graph,
        Some(generations),
        Some(verifier),
    );
    let http = server::run(listener, application, config.http, async {
        shutdown.await;
        // Workers stop on their own clock, independently of the HTTP drain: they release
        // their leases without charge while connections finish.
        let _ = stop_workers.send(true);
    });
    let (report, ()) = tokio::join!(http, workers.stopped());
    // A pass in progress stays `running` in the ledger; the next start resumes it.
    schedule.abort();
    retention.abort();
    let _ = stop_deliveries.send(true);
    if let Some(deliveries) = deliveries {
        // Attempts in flight keep their leases; another start delivers them again.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), deliveries).await;
    }
    tracing::info!(
        connections = report.served,
        overflowed = report.overflowed,
        refused = report.refused,
        dropped_at_shutdown = report.dropped_at_shutdown,
        "HTTP stopped"
    );
    if let Some(projection) = projection {
        projection.close().await?;
    }
    tracing::info!("cairn stopped");
    Ok(())
}

/// What `cairn worker` runs beyond the configuration.
#[derive(Debug, Clone, Default)]
pub struct WorkOptions {
    /// Jobs run at once (at least 1).
    pub concurrency: usize,
    /// Lease owner name (default: `host:pid:worker`).
    pub owner: Option<String>,
    /// Fault injection for tests of the job lifecycle: every job sleeps this long and
    /// completes instead of projecting.
    pub simulate_work: Option<std::time::Duration>,
}

/// Runs `cairn worker` until `shutdown` resolves: projection workers on the configured ledger
/// and stores, in a process of their own. Prints `worker OWNER running (...)` on stdout once
/// it claims.
pub async fn work(
    config: Config,
    options: WorkOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    datadir::prepare(&config.data_dir)?;
    let _in_use = datadir::hold(&config.data_dir)?;
    let ledger = open_ledger(&config).await?;
    let owner = options.owner.unwrap_or_else(|| worker_owner("worker"));
    let mut worker_config = worker::WorkerConfig::new(owner.clone());
    worker_config.concurrency = options.concurrency.max(1);
    worker_config.unit_jobs = config.workers.unit_jobs;
    let mut opened = None;
    let (work, what): (Arc<dyn worker::Work>, String) = match options.simulate_work {
        Some(delay) => (
            Arc::new(SimulatedWork(delay)),
            format!("simulated work of {} ms per job", delay.as_millis()),
        ),
        None => {
            let projection = projection::open_projection(&config, ledger.clone()).await?;
            let work = every_kind(projection.work.clone(), ledger.clone(), &config);
            opened = Some(projection);
            (
                work,
                format!(
                    "projection, generation {}",
                    projection::generation(&config).id
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
    let _ = std::io::stdout().flush();
    worker::Worker::new(ledger, work, worker_config)
        .run(shutdown)
        .await;
    if let Some(projection) = opened {
        projection.close().await?;
    }
    Ok(())
}

/// The name a worker records as lease owner: `host:pid:name`.
pub fn worker_owner(name: &str) -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|host| host.trim().to_owned())
        .unwrap_or_else(|_| "host".to_owned());
    format!("{host}:{}:{name}", std::process::id())
}

/// Workers running in this process, stopped together.
struct RunningWorkers {
    stop: tokio::sync::watch::Sender<bool>,
    handles: Vec<tokio::task::JoinHandle<()>>,
}

impl RunningWorkers {
    /// Waits for the stop signal (`stop`), then for every worker to stop claiming, let its
    /// running jobs finish within the worker's grace period and release the rest.
    async fn stopped(self) {
        let mut stopping = self.stop.subscribe();
        let _ = stopping.wait_for(|stop| *stop).await;
        for handle in self.handles {
            let _ = handle.await;
        }
    }
}

/// The work of every job kind: connector runs by the connectors' runner (acceptance and the
/// connector's index through `ledger`), everything else by `projection`.
fn every_kind(
    projection: Arc<dyn worker::Work>,
    ledger: Arc<dyn Ledger>,
    config: &Config,
) -> Arc<dyn worker::Work> {
    let runner: Arc<dyn worker::Work> = Arc::new(connectors::Runner::new(
        ledger,
        config.connectors.roots(),
        config.connectors.remote.clone(),
    ));
    Arc::new(worker::ByKind::new(runner, projection))
}

/// Starts `workers.count` projection workers (none when the count is 0).
async fn start_workers(
    config: &Config,
    ledger: Arc<dyn Ledger>,
    projection: Option<&projection::Projection>,
) -> anyhow::Result<RunningWorkers> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut handles = Vec::new();
    if let Some(projection) = projection {
        let work = every_kind(projection.work.clone(), ledger.clone(), config);
        for index in 0..config.workers.count {
            let mut worker_config =
                worker::WorkerConfig::new(worker_owner(&format!("serve-{index}")));
            worker_config.concurrency = config.workers.concurrency;
            worker_config.unit_jobs = config.workers.unit_jobs;
            let runner = worker::Worker::new(ledger.clone(), work.clone(), worker_config);
            let mut stopped = stopped.clone();
            handles.push(tokio::spawn(runner.run(async move {
                let _ = stopped.changed().await;
            })));
        }
        println!(
            "projecting with {} worker(s) x {} jobs, generation {}",
            config.workers.count,
            config.workers.concurrency,
            projection::generation(config).id
        );
    }
    Ok(RunningWorkers { stop, handles })
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called, not when
/// the future is first polled, so a signal that arrives while the caller is still starting up
/// is not lost to the default action (which would end the process without a graceful stop).
/// Must be called inside the tokio runtime.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let (mut terminate, mut interrupt) = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let terminate = async {
                match terminate.as_mut() {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let interrupt = async {
                match interrupt.as_mut() {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = interrupt => tracing::info!("SIGINT: shutting down"),
                () = terminate => tracing::info!("SIGTERM: shutting down"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("interrupted: shutting down");
        }
    }
}

/// Fault-injection work for tests of the job lifecycle (`cairn worker --simulate-work-ms`):
/// every job sleeps for the given time, then completes. Not projection. A claim's jobs run as
/// units (one key for all), so the lifecycle tests cover units' leases and heartbeats too.
#[derive(Debug, Clone, Copy)]
pub struct SimulatedWork(pub std::time::Duration);

#[async_trait::async_trait]
impl worker::Work for SimulatedWork {
    async fn run(&self, _job: &receipts::Job) -> Result<(), receipts::Failure> {
        tokio::time::sleep(self.0).await;
        Ok(())
    }

    fn unit_key(&self, _job: &receipts::Job) -> Option<String> {
        Some("simulated".to_owned())
    }
}
