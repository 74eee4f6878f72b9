//! The PostgreSQL ledger: the same traits, model and invariants as [`crate::sqlite`], for
//! deployments past one machine (`cairn serve` and any number of `cairn worker` processes on
//! one PostgreSQL).
//!
//! One file per role, as for SQLite: this one opens the ledger (migrations, the pool, the
//! clock, the wake-up listener) and decodes rows; `acceptance` writes acceptance waves;
//! `reads` serves reads, the lexical index (`tsvector` under GIN) and binding; `leases`,
//! `projection`, `operations` and `tokens` hold their SQL and trait implementations.
//!
//! ## Concurrency
//! There is no single writer: every operation is a transaction on a pooled connection, and
//! PostgreSQL's row locks order them. Concurrent acceptances of a process are handed to a few
//! committer tasks that commit whatever is queued in one transaction (group commit), and
//! concurrent completions to one completer that ends them with one fenced `UPDATE`. An
//! acceptance transaction first takes an advisory lock per source (in one sorted statement, so
//! two groups never deadlock), then decides and writes in waves like SQLite. A claim is one
//! call of `cairn_claim` (rescue, then one `UPDATE ... FOR UPDATE SKIP LOCKED`), so
//! concurrent workers in any number of processes never wait for each other's rows. Commits
//! are durable (`synchronous_commit = on`).
//!
//! ## Clock
//! Lease writes are fenced inside the statement that writes (`lease_expires_at > now`), with
//! `now` read from **the database's clock** (`clock_timestamp()`) at the start of each
//! operation: in its transaction, or inside the claim function and the grouped completion
//! statement ([`LedgerClock::Database`], the default): every process on every
//! machine fences against one clock, so a worker machine's clock skew cannot stretch or cut a
//! lease. Tests inject a manual clock ([`LedgerClock::Injected`]) to move time.
//!
//! ## Partitions
//! Every connection has a peer timeout (`postgres::peer`, 2 s by default): a server that
//! stays silent that long (unacknowledged data, unanswered keepalive probes) aborts the
//! connection, and its operation fails `ledger_unavailable`, instead of waiting for the kernel
//! to give up (minutes). PostgreSQL drops a silent cairn connection the same way, releasing
//! its locks. A `COMMIT` whose answer was lost may have committed: resending the same document
//! is a `duplicate`.
//!
//! ## Wake-ups
//! Every commit that makes work claimable sends `NOTIFY cairn_work` in its transaction
//! (delivered only on commit). Each ledger listens on its own connection and wakes its
//! process's workers through [`crate::Leases::work_signal`]; when the listener's connection
//! drops it reconnects, and workers keep polling as the fallback.

mod acceptance;
mod access;
mod connectors;
mod erasure;
mod events;
mod generations;
mod leases;
mod operations;
mod peer;
mod projection;
mod reads;
mod tokens;
mod tsvector;
mod validity;
mod verify;
mod webhooks;

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{ConnectOptions, Row};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::clock::{Clock, Micros};
use crate::error::{LedgerError, Result};
use crate::faults::{FaultInjector, FaultPoint, NoFaults};
use crate::ledger::MigrationReport;
use crate::model::{Backend, HistoryEntry, Job, ProjectionReceipt, ReceiptState, Revision};
use crate::policy::{self, JobPolicies};

/// The channel that carries wake-ups between processes.
pub const WORK_CHANNEL: &str = "cairn_work";

/// The channel on which every change of `tokens` is announced (the `tokens_changed` trigger):
/// each process then forgets the tokens it authenticated.
const TOKENS_CHANNEL: &str = "cairn_tokens";

/// Where the ledger's `now` comes from.
#[derive(Debug, Clone)]
pub enum LedgerClock {
    /// The database server's clock, read in each operation's transaction (production).
    Database,
    /// An injected clock (tests).
    Injected(Arc<dyn Clock>),
}

/// How to open a PostgreSQL ledger.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// `postgres://user:password@host:port/database` (any libpq-style URL sqlx accepts).
    pub url: String,
    /// Backends that get a projection receipt per job.
    pub backends: Vec<Backend>,
    /// Connections in the pool (serve: API requests; worker: claims and writes).
    pub max_connections: u32,
    /// How long an operation waits for a pooled connection before `ledger_unavailable`.
    pub acquire_timeout: Duration,
    /// How long a connection waits on a silent server (unacknowledged data, unanswered
    /// keepalive probes) before it is aborted and its operation fails `ledger_unavailable`
    /// (`postgres::peer`); `None` leaves the kernel's defaults (minutes).
    pub peer_timeout: Option<Duration>,
    /// Lease, retry and quarantine policy of each job kind.
    pub job_policies: JobPolicies,
    /// Most submissions written in one acceptance wave, and in one group commit.
    pub max_wave: usize,
    /// Tasks that commit acceptances: each takes whatever acceptances are queued and commits
    /// them in one transaction (group commit) while the others gather the next group.
    pub committers: usize,
    /// How long an authenticated token's answer is kept at most (`Duration::ZERO`: never).
    /// Any change of `tokens`, in any process, clears it sooner (`postgres::tokens`).
    pub token_cache: Duration,
    /// The erasure journal ([`crate::journal`]) this process appends to (none by default:
    /// `cairn serve` keeps one in its data directory).
    pub journal: Option<std::path::PathBuf>,
    /// The folder holding `pg_dump` (a backup); `None`: whatever `PATH` finds.
    pub pg_bin: Option<std::path::PathBuf>,
}

impl PostgresOptions {
    /// Defaults for a database at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            backends: policy::DEFAULT_BACKENDS.to_vec(),
            max_connections: 16,
            acquire_timeout: Duration::from_millis(2500),
            peer_timeout: Some(Duration::from_secs(2)),
            job_policies: JobPolicies::default(),
            max_wave: policy::DEFAULT_MAX_GROUP,
            committers: 4,
            token_cache: Duration::from_secs(1),
            journal: None,
            pg_bin: None,
        }
    }
}

/// The PostgreSQL implementation of [`crate::Ledger`].
#[derive(Debug, Clone)]
pub struct PostgresLedger {
    pool: PgPool,
    clock: LedgerClock,
    faults: Arc<dyn FaultInjector>,
    work_signal: Arc<tokio::sync::Notify>,
    options: Arc<PostgresOptions>,
    /// The job policies as the JSON the SQL reads (`jsonb_to_recordset`).
    policies_json: Arc<str>,
    /// Hands acceptances to the committers (`None` in a committer's own copy).
    accepts: Option<mpsc::Sender<acceptance::AcceptRequest>>,
    /// Hands completions to the completer (`None` in the completer's own copy).
    completions: Option<mpsc::Sender<leases::CompleteRequest>>,
    /// Recently authenticated tokens (`postgres::tokens`).
    token_cache: Arc<tokens::TokenCache>,
    /// Stops the listener when the last clone of the ledger is dropped.
    _listener: Arc<ListenerGuard>,
    /// Appends access changes to this process's erasure journal in groups (`None`: none).
    journal_writer: Option<Arc<crate::journal::JournalWriter>>,
}

/// Applies the ledger's migrations to the database at `url` and says what it did. Safe to run
/// from several processes at once (sqlx takes an advisory lock).
pub async fn migrate(url: &str) -> Result<MigrationReport> {
    let mut connection = connect_options(url, None)?
        .connect()
        .await
        .map_err(|error| unreachable_error(url, error))?;
    // Absent before the first migration: then nothing was applied.
    let before: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(&mut connection)
            .await
            .unwrap_or_default();
    let failed = |error| LedgerError::Unavailable(format!("migrating the ledger: {error}"));
    let migrator = crate::migrations::postgres().await.map_err(failed)?;
    migrator.run(&mut connection).await.map_err(failed)?;
    let applied = migrator
        .iter()
        .filter(|migration| !before.contains(&migration.version))
        .map(|migration| format!("{} {}", migration.version, migration.description))
        .collect();
    Ok(MigrationReport {
        applied,
        already: before.len(),
    })
}

fn connect_options(url: &str, peer_timeout: Option<Duration>) -> Result<PgConnectOptions> {
    let options: PgConnectOptions = url.parse().map_err(|error| {
        LedgerError::invalid(
            "invalid_ledger_url",
            format!("not a PostgreSQL URL ({error})"),
        )
    })?;
    // No JIT: a ledger's statements are index probes that run in well under a millisecond,
    // and compiling one costs 100-300 ms (schema 19 tells how a plan once crossed the
    // threshold on every acceptance).
    let mut settings = vec![
        ("synchronous_commit", "on".to_owned()),
        ("jit", "off".to_owned()),
    ];
    settings.extend(peer_timeout.map(peer::server_settings).unwrap_or_default());
    Ok(options
        .application_name("cairn")
        // Acceptance answers only after a durable COMMIT, whatever the server's default; a
        // client that went silent is dropped by the server too (`peer`).
        .options(settings)
        .disable_statement_logging())
}

fn unreachable_error(url: &str, error: sqlx::Error) -> LedgerError {
    let target = url.rsplit('@').next().unwrap_or("the database").to_owned();
    LedgerError::Unavailable(format!("cannot reach PostgreSQL at {target}: {error}"))
}

impl PostgresLedger {
    /// Opens the ledger at `options.url`, running migrations first, on the database's clock.
    pub async fn open(options: PostgresOptions) -> Result<Self> {
        Self::open_with(options, LedgerClock::Database, Arc::new(NoFaults)).await
    }

    /// Opens the ledger with a clock and a fault injector (tests).
    pub async fn open_with(
        options: PostgresOptions,
        clock: LedgerClock,
        faults: Arc<dyn FaultInjector>,
    ) -> Result<Self> {
        for (kind, policy) in options.job_policies.all() {
            policy.check().map_err(|problem| {
                LedgerError::Unavailable(format!("job policy of {kind} jobs: {problem}"))
            })?;
        }
        migrate(&options.url).await?;
        let peer_timeout = options.peer_timeout;
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(2))
            .acquire_timeout(options.acquire_timeout)
            // A server restart drops every connection: test each one before use, so the
            // first request after a restart does not fail on a dead socket.
            .test_before_acquire(true)
            // A partition leaves connections open: bound how long one waits on silence.
            .after_connect(move |connection, _| {
                Box::pin(async move {
                    match peer_timeout {
                        Some(timeout) => peer::bound(connection, timeout).await,
                        None => Ok(()),
                    }
                })
            })
            .connect_with(connect_options(&options.url, peer_timeout)?)
            .await
            .map_err(|error| unreachable_error(&options.url, error))?;
        let policies: Vec<serde_json::Value> = options
            .job_policies
            .all()
            .into_iter()
            .map(|(kind, policy)| {
                serde_json::json!({
                    "kind": kind.as_str(),
                    "max_attempts": policy.max_attempts,
                    "lease_micros": policy.lease_micros,
                    "max_run_micros": policy.max_run_micros,
                    "quarantine_after_crashes": policy.quarantine_after_crashes,
                })
            })
            .collect();
        let work_signal = Arc::new(tokio::sync::Notify::new());
        let token_cache = Arc::new(tokens::TokenCache::default());
        let listener = tokio::spawn(listen(
            pool.clone(),
            work_signal.clone(),
            token_cache.clone(),
        ));
        let committers = options.committers.max(1);
        let journal_writer = crate::journal::JournalWriter::for_ledger(options.journal.as_deref())?;
        let mut ledger = Self {
            journal_writer,
            pool,
            clock,
            faults,
            work_signal,
            token_cache,
            policies_json: serde_json::Value::from(policies).to_string().into(),
            options: Arc::new(options),
            accepts: None,
            completions: None,
            _listener: Arc::new(ListenerGuard(listener)),
        };
        // The committers hold copies without a sender: when the last caller's copy is
        // dropped the channel closes and they stop.
        let (sender, receiver) = mpsc::channel(4096);
        let receiver = Arc::new(tokio::sync::Mutex::new(receiver));
        let flight = Arc::new(acceptance::Flight::default());
        for _ in 0..committers {
            tokio::spawn(acceptance::commit_acceptances(
                ledger.clone(),
                receiver.clone(),
                flight.clone(),
            ));
        }
        let (completions, completing) = mpsc::channel(4096);
        tokio::spawn(leases::complete_queued(ledger.clone(), completing));
        ledger.accepts = Some(sender);
        ledger.completions = Some(completions);
        Ok(ledger)
    }

    /// The connection pool, for SQL that tests and tools run against the same database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The ledger's `now` for a write: the injected clock, or the database's clock read on
    /// `connection` (inside the operation's transaction).
    async fn now(&self, connection: &mut sqlx::PgConnection) -> Result<Micros> {
        match &self.clock {
            LedgerClock::Injected(clock) => Ok(clock.now_micros()),
            LedgerClock::Database => Ok(sqlx::query_scalar("SELECT cairn_db_now()")
                .fetch_one(connection)
                .await?),
        }
    }

    /// The ledger's `now` outside a transaction (the erasure journal's time).
    pub(crate) async fn now_outside(&self) -> Result<Micros> {
        let mut connection = self.pool.acquire().await?;
        self.now(&mut connection).await
    }

    /// The writer of this process's erasure journal, if it keeps one.
    pub(crate) fn journal_writer(&self) -> Option<&crate::journal::JournalWriter> {
        self.journal_writer.as_deref()
    }

    /// Appends `entry` to this process's erasure journal, if it keeps one.
    pub(crate) async fn journal(
        &self,
        entry: impl FnOnce(Micros) -> Option<crate::journal::JournalEntry>,
    ) -> Result<()> {
        let Some(path) = self.options.journal.as_deref() else {
            return Ok(());
        };
        let now = self.now_outside().await?;
        crate::journal::record(Some(path), entry(now))
    }

    /// The injected clock's `now`, or `None` for SQL that reads the database's clock itself.
    fn injected_now(&self) -> Option<Micros> {
        match &self.clock {
            LedgerClock::Injected(clock) => Some(clock.now_micros()),
            LedgerClock::Database => None,
        }
    }

    /// The ledger's `now` for a read.
    async fn read_now(&self) -> Result<Micros> {
        match &self.clock {
            LedgerClock::Injected(clock) => Ok(clock.now_micros()),
            LedgerClock::Database => Ok(sqlx::query_scalar("SELECT cairn_db_now()")
                .fetch_one(&self.pool)
                .await?),
        }
    }

    fn fault(&self, point: FaultPoint) -> Result<()> {
        if self.faults.fire(point) {
            Err(LedgerError::Injected(point))
        } else {
            Ok(())
        }
    }
}

/// Aborts the listener task when dropped.
#[derive(Debug)]
struct ListenerGuard(tokio::task::JoinHandle<()>);

impl Drop for ListenerGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Listens on [`WORK_CHANNEL`] and wakes this process's workers on every notification, and on
/// [`TOKENS_CHANNEL`], clearing the token cache on every notification. Its connection
/// reconnects by itself after a server restart (sqlx's listener); a notification sent while it
/// was away is missed, which the workers' polling covers, and the token cache is cleared each
/// time the connection is (re)established or lost.
async fn listen(pool: PgPool, signal: Arc<tokio::sync::Notify>, tokens: Arc<tokens::TokenCache>) {
    loop {
        let mut listener = match sqlx::postgres::PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::debug!(%error, "work listener cannot connect; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(error) = listener.listen_all([WORK_CHANNEL, TOKENS_CHANNEL]).await {
            tracing::debug!(%error, "LISTEN failed; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        tokens.clear();
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) if notification.channel() == TOKENS_CHANNEL => {
                    tokens.clear();
                }
                Ok(Some(_)) => signal.notify_waiters(),
                // The connection dropped: sqlx reconnects on the next call; wake the
                // workers and forget the tokens, since notifications may have been missed.
                Ok(None) => {
                    tokens.clear();
                    signal.notify_waiters();
                }
                Err(error) => {
                    tracing::debug!(%error, "work listener lost its connection");
                    tokens.clear();
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    break;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Row decoding.

pub(crate) fn parse_enum<T: std::str::FromStr>(text: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    text.parse::<T>()
        .map_err(|error| LedgerError::Corrupt(error.to_string()))
}

const REVISION_COLUMNS: &str = "id, dataset, source_key, content_sha256, byte_length, media_type, \
    tags, metadata, tombstone, previous_revision_id, actor, reason, accepted_at";

fn revision_from_row(row: &PgRow) -> Result<Revision> {
    let tags: serde_json::Value = row.try_get("tags")?;
    Ok(Revision {
        id: row.try_get("id")?,
        dataset: row.try_get("dataset")?,
        source_key: row.try_get("source_key")?,
        content_sha256: row.try_get("content_sha256")?,
        byte_length: row.try_get("byte_length")?,
        media_type: row.try_get("media_type")?,
        tags: serde_json::from_value(tags)
            .map_err(|error| LedgerError::Corrupt(error.to_string()))?,
        metadata: row.try_get("metadata")?,
        tombstone: row.try_get("tombstone")?,
        previous_revision_id: row.try_get("previous_revision_id")?,
        actor: row.try_get("actor")?,
        reason: row.try_get("reason")?,
        accepted_at: row.try_get("accepted_at")?,
    })
}

pub(crate) fn job_from_row(row: &PgRow) -> Result<Job> {
    Ok(Job {
        id: row.try_get("id")?,
        revision_id: row.try_get("revision_id")?,
        connector_id: row.try_get("connector_id")?,
        dataset: row.try_get("dataset")?,
        source_key: row.try_get("source_key")?,
        kind: parse_enum(&row.try_get::<String, _>("kind")?)?,
        state: parse_enum(&row.try_get::<String, _>("state")?)?,
        priority: row.try_get("priority")?,
        attempt: row.try_get("attempt")?,
        max_attempts: row.try_get("max_attempts")?,
        crashes: row.try_get("crashes")?,
        run_at: row.try_get("run_at")?,
        lease_id: row.try_get("lease_id")?,
        lease_owner: row.try_get("lease_owner")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        heartbeat_at: row.try_get("heartbeat_at")?,
        deadline_at: row.try_get("deadline_at")?,
        started_at: row.try_get("started_at")?,
        cancel_requested: row.try_get("cancel_requested")?,
        stage: row.try_get("stage")?,
        stage_at: row.try_get("stage_at")?,
        run_at_rule: row.try_get("run_at_rule")?,
        last_error_code: row.try_get("last_error_code")?,
        last_error_message: row.try_get("last_error_message")?,
        created_at: row.try_get("created_at")?,
        changed_at: row.try_get("changed_at")?,
        changed_by: row.try_get("changed_by")?,
        change_cause: row.try_get("change_cause")?,
        generation: row.try_get("generation")?,
    })
}

fn history_from_row(row: &PgRow) -> Result<HistoryEntry> {
    Ok(HistoryEntry {
        seq: row.try_get("seq")?,
        at: row.try_get("at")?,
        entity: row.try_get("entity")?,
        entity_id: row.try_get("entity_id")?,
        event: row.try_get("event")?,
        from: row.try_get("from_state")?,
        to: row.try_get("to_state")?,
        actor: row.try_get("actor")?,
        cause: row.try_get("cause")?,
        error_code: row.try_get("error_code")?,
        error_message: row.try_get("error_message")?,
        stage: row.try_get("stage")?,
    })
}

impl PostgresLedger {
    async fn load_receipts(&self, job_id: Uuid) -> Result<Vec<ProjectionReceipt>> {
        let rows = sqlx::query(
            "SELECT backend, state, evidence, updated_at FROM projection_receipts \
             WHERE job_id = $1 ORDER BY backend",
        )
        .bind(job_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ProjectionReceipt {
                    backend: parse_enum::<Backend>(&row.try_get::<String, _>("backend")?)?,
                    state: parse_enum::<ReceiptState>(&row.try_get::<String, _>("state")?)?,
                    evidence: row.try_get("evidence")?,
                    updated_at: row.try_get("updated_at")?,
                })
            })
            .collect()
    }
}
