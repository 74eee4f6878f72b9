//! The SQLite ledger.
//!
//! One writer task owns the only write connection. Callers hand it operations over a channel;
//! it drains whatever is queued (up to [`SqliteOptions::max_group`] submissions), runs them in
//! one `BEGIN IMMEDIATE` transaction, each inside its own `SAVEPOINT` so that a refused or
//! failed item rolls back alone, commits once (WAL, `synchronous=FULL`: the commit is on disk
//! when `COMMIT` returns) and only then answers every caller. Concurrent acceptances therefore
//! share one fsync (group commit). Reads use a separate pool and never block the writer (WAL).
//!
//! One file per role: this one opens the ledger (migrations, connections, the checkpointer) and
//! decodes rows; `writer` runs the writer task, group commit and acceptance waves;
//! `acceptance` prepares submissions; `reads` serves reads, the lexical index and binding;
//! `leases`, `projection`, `operations` and `tokens` hold their SQL and trait implementations.

mod acceptance;
mod erasure;
mod generations;
mod leases;
mod operations;
mod projection;
mod reads;
mod tokens;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection, Row};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use self::leases::{JobAnswer, JobCommand};
use self::projection::ProjectCommand;
use self::writer::{steps, WriteOp, Writer};
use crate::clock::Clock;
use crate::error::{LedgerError, Result};
use crate::faults::{FaultInjector, NoFaults};
use crate::model::{
    Backend, Heartbeat, HistoryEntry, Job, LeaseToken, ProjectionReceipt, ReceiptState, Revision,
};
use crate::policy;

/// How to open a SQLite ledger.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// The database file (created with its directory when missing).
    pub path: PathBuf,
    /// Backends that get a projection receipt per job.
    pub backends: Vec<Backend>,
    /// Most submissions committed in one transaction.
    pub max_group: usize,
    /// Connections in the read pool.
    pub read_connections: u32,
    /// How long a statement waits for another process's write lock.
    pub busy_timeout: Duration,
    /// Lease, retry and quarantine policy of each job kind.
    pub job_policies: crate::policy::JobPolicies,
}

impl SqliteOptions {
    /// Defaults for a database at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            backends: policy::DEFAULT_BACKENDS.to_vec(),
            max_group: policy::DEFAULT_MAX_GROUP,
            read_connections: 4,
            busy_timeout: Duration::from_secs(10),
            job_policies: crate::policy::JobPolicies::default(),
        }
    }
}

/// How much of the database file each read connection maps: more than SQLite's build limit
/// (`SQLITE_MAX_MMAP_SIZE`, 2 GiB on 64-bit Linux), which then applies.
const READ_MMAP_BYTES: &str = "1099511627776";

/// The SQLite implementation of [`crate::Ledger`].
#[derive(Debug, Clone)]
pub struct SqliteLedger {
    reads: SqlitePool,
    /// Fault injection for reads (tests); the writer holds the same injector.
    faults: Arc<dyn FaultInjector>,
    work_signal: Arc<tokio::sync::Notify>,
    writer: mpsc::Sender<WriteOp>,
    clock: Arc<dyn Clock>,
    options: Arc<SqliteOptions>,
}

impl SqliteLedger {
    /// Opens (creating and migrating when needed) the ledger at `options.path`.
    pub async fn open(options: SqliteOptions, clock: Arc<dyn Clock>) -> Result<Self> {
        Self::open_with_faults(options, clock, Arc::new(NoFaults)).await
    }

    /// Opens the ledger with a fault injector (tests).
    pub async fn open_with_faults(
        options: SqliteOptions,
        clock: Arc<dyn Clock>,
        faults: Arc<dyn FaultInjector>,
    ) -> Result<Self> {
        if let Some(parent) = options
            .path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
        {
            std::fs::create_dir_all(parent).map_err(|error| {
                LedgerError::Unavailable(format!("cannot create {}: {error}", parent.display()))
            })?;
        }
        let connect = connect_options(&options.path, options.busy_timeout);
        let mut write_connection = connect
            .clone()
            .create_if_missing(true)
            // The writer keeps a large page cache and checkpoints the WAL in bigger steps, so
            // that group commits of thousands of documents do not checkpoint on every commit.
            .pragma("cache_size", "-16384")
            .pragma("temp_store", "MEMORY")
            // Checkpoints run on a read connection in the background (see `checkpointer`), so a
            // commit never waits for one.
            .pragma("wal_autocheckpoint", "0")
            // Freed cells and pages are overwritten with zeros, so that no deleted byte (an
            // erased document above all) lingers in free space once the WAL is checkpointed.
            .pragma("secure_delete", "ON")
            .connect()
            .await?;
        let failed = |error| {
            LedgerError::Unavailable(format!("migrating {}: {error}", options.path.display()))
        };
        let migrator = crate::migrations::sqlite().await.map_err(failed)?;
        migrator.run(&mut write_connection).await.map_err(failed)?;
        sqlx::raw_sql(steps::TABLES)
            .execute(&mut write_connection)
            .await?;
        let trigger = steps::trigger();
        sqlx::raw_sql(&trigger)
            .execute(&mut write_connection)
            .await?;
        for (kind, policy) in options.job_policies.all() {
            policy.check().map_err(|problem| {
                LedgerError::Unavailable(format!("job policy of {kind} jobs: {problem}"))
            })?;
            sqlx::query(
                "INSERT OR REPLACE INTO job_policies (kind, max_attempts, lease_micros, max_run_micros, \
                 quarantine_after_crashes) VALUES (?, ?, ?, ?, ?)",
            )
            .bind(kind.as_str())
            .bind(policy.max_attempts)
            .bind(policy.lease_micros)
            .bind(policy.max_run_micros)
            .bind(policy.quarantine_after_crashes)
            .execute(&mut write_connection)
            .await?;
        }
        // No ping before handing out a connection: it is a round trip to the connection's
        // thread on every read (an embedded file does not drop connections like a server).
        let reads = SqlitePoolOptions::new()
            .max_connections(options.read_connections.max(1))
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(10))
            // Reads (search binding, lexical ranking) touch pages all over the tables: a larger
            // cache and memory-mapped reads keep them off `pread`. The map covers the whole
            // file up to SQLite's build limit (2 GiB): with 256 MB of a 400 MB ledger mapped,
            // binding 11 random hits took (p50) 0.54 ms warm and 2.88 ms with the file out of
            // the page cache (one `pread` per page, no readahead); mapped whole, 0.44 and 0.61.
            .connect_with(
                connect
                    .pragma("cache_size", "-16384")
                    .pragma("mmap_size", READ_MMAP_BYTES),
            )
            .await?;
        let (sender, receiver) = mpsc::channel(4096);
        let options = Arc::new(options);
        let work_signal = Arc::new(tokio::sync::Notify::new());
        let writer = Writer {
            work_signal: work_signal.clone(),
            in_transaction: false,
            connection: write_connection,
            clock: clock.clone(),
            faults: faults.clone(),
            options: options.clone(),
        };
        tokio::spawn(writer.run(receiver));
        tokio::spawn(checkpointer(
            reads.clone(),
            sender.downgrade(),
            options.busy_timeout,
        ));
        Ok(Self {
            reads,
            faults,
            work_signal,
            writer: sender,
            clock,
            options,
        })
    }

    /// The read pool, for SQL that later crates run against the same database.
    pub fn read_pool(&self) -> &SqlitePool {
        &self.reads
    }

    /// The clock the ledger stamps its writes with.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The path of the database file.
    pub fn path(&self) -> &Path {
        &self.options.path
    }

    async fn beat(&self, lease: &LeaseToken, stage: Option<String>) -> Result<Heartbeat> {
        match self
            .job_command(JobCommand::Heartbeat(lease.clone(), stage))
            .await?
        {
            JobAnswer::Heartbeat(heartbeat) => Ok(heartbeat),
            other => Err(LedgerError::Internal(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    async fn submit<T>(&self, op: impl FnOnce(oneshot::Sender<T>) -> WriteOp) -> Result<T> {
        let (reply, answer) = oneshot::channel();
        self.writer
            .send(op(reply))
            .await
            .map_err(|_| LedgerError::Unavailable("the ledger writer has stopped".to_owned()))?;
        answer
            .await
            .map_err(|_| LedgerError::Unavailable("the ledger writer stopped mid-write".to_owned()))
    }
}

/// How often the background checkpointer copies the WAL into the database file.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(500);

/// WAL size (in 4 KiB frames, about 64 MiB) above which a fully copied WAL is truncated.
const WAL_TRUNCATE_FRAMES: i64 = 16_384;

/// How long a truncating checkpoint may wait for readers (and hold up the writer) before it
/// gives up until the next tick.
const WAL_TRUNCATE_WAIT: Duration = Duration::from_millis(100);

/// Copies committed WAL frames into the database file off the writer's path (`PASSIVE`: it
/// never blocks the writer or readers). Stops when the ledger is dropped.
///
/// Under a steady stream of writes a passive checkpoint never finds a moment when the WAL can
/// start over, so the WAL (and its index, which every read consults) keeps growing: a bulk
/// load of 100k documents left a 1.5 GB WAL and doubled the cost of search binding. So once
/// the WAL holds more than [`WAL_TRUNCATE_FRAMES`] frames and all of them are copied, the
/// checkpointer truncates it (`TRUNCATE`), waiting at most [`WAL_TRUNCATE_WAIT`] for readers.
async fn checkpointer(
    reads: SqlitePool,
    writer: mpsc::WeakSender<WriteOp>,
    busy_timeout: Duration,
) {
    let mut ticker = tokio::time::interval(CHECKPOINT_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if writer.upgrade().is_none() {
            break;
        }
        match sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&reads)
            .await
        {
            Ok((0, log, copied)) if log >= WAL_TRUNCATE_FRAMES && copied == log => {
                if let Err(error) = truncate_wal(&reads, busy_timeout).await {
                    tracing::debug!(%error, frames = log, "WAL truncation deferred");
                }
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "WAL checkpoint failed; it will be retried"),
        }
    }
}

/// A `TRUNCATE` checkpoint with a short busy timeout.
async fn truncate_wal(reads: &SqlitePool, busy_timeout: Duration) -> Result<()> {
    let mut connection = reads.acquire().await?;
    let wait = format!("PRAGMA busy_timeout = {}", WAL_TRUNCATE_WAIT.as_millis());
    sqlx::query(&wait).execute(&mut *connection).await?;
    let result = sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(TRUNCATE)")
        .fetch_one(&mut *connection)
        .await;
    // Back to the pool's own timeout whatever happened.
    let restore = format!("PRAGMA busy_timeout = {}", busy_timeout.as_millis());
    sqlx::query(&restore).execute(&mut *connection).await?;
    match result? {
        (0, _, _) => {
            tracing::debug!("WAL truncated");
            Ok(())
        }
        _ => Err(LedgerError::Unavailable(
            "readers kept the WAL busy".to_owned(),
        )),
    }
}

/// Applies the ledger's migrations to the database file at `path` (created when missing) and
/// says what it did.
pub async fn migrate(path: &Path) -> Result<crate::MigrationReport> {
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent).map_err(|error| {
            LedgerError::Unavailable(format!("cannot create {}: {error}", parent.display()))
        })?;
    }
    let mut connection = connect_options(path, Duration::from_secs(10))
        .create_if_missing(true)
        .connect()
        .await?;
    // Absent before the first migration: then nothing was applied.
    let before: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(&mut connection)
            .await
            .unwrap_or_default();
    let failed = |error| LedgerError::Unavailable(format!("migrating {}: {error}", path.display()));
    let migrator = crate::migrations::sqlite().await.map_err(failed)?;
    migrator.run(&mut connection).await.map_err(failed)?;
    let applied = migrator
        .iter()
        .filter(|migration| !before.contains(&migration.version))
        .map(|migration| format!("{} {}", migration.version, migration.description))
        .collect();
    let _ = connection.close().await;
    Ok(crate::MigrationReport {
        applied,
        already: before.len(),
    })
}

/// Connection settings shared by the writer and the read pool: WAL, `synchronous=FULL`,
/// foreign keys on, a busy timeout for other processes' writes.
pub fn connect_options(path: &Path, busy_timeout: Duration) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(busy_timeout)
        .disable_statement_logging()
}

pub(crate) fn json_text<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

pub(crate) fn parse_uuid(text: &str) -> Result<Uuid> {
    Uuid::parse_str(text)
        .map_err(|error| LedgerError::Corrupt(format!("bad uuid `{text}`: {error}")))
}

fn optional_uuid(text: Option<String>) -> Result<Option<Uuid>> {
    text.as_deref().map(parse_uuid).transpose()
}

pub(crate) fn parse_enum<T: std::str::FromStr>(text: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    text.parse::<T>()
        .map_err(|error| LedgerError::Corrupt(error.to_string()))
}

// ---------------------------------------------------------------------------------------------
// Reads.

const REVISION_COLUMNS: &str = "id, dataset, source_key, content_sha256, byte_length, media_type, \
    tags, metadata, tombstone, previous_revision_id, actor, reason, accepted_at";

fn revision_from_row(row: &SqliteRow) -> Result<Revision> {
    let tags: String = row.try_get("tags")?;
    let metadata: String = row.try_get("metadata")?;
    Ok(Revision {
        id: parse_uuid(&row.try_get::<String, _>("id")?)?,
        dataset: row.try_get("dataset")?,
        source_key: row.try_get("source_key")?,
        content_sha256: row.try_get("content_sha256")?,
        byte_length: row.try_get("byte_length")?,
        media_type: row.try_get("media_type")?,
        tags: serde_json::from_str(&tags)
            .map_err(|error| LedgerError::Corrupt(error.to_string()))?,
        metadata: serde_json::from_str(&metadata)
            .map_err(|error| LedgerError::Corrupt(error.to_string()))?,
        tombstone: row.try_get::<i64, _>("tombstone")? == 1,
        previous_revision_id: optional_uuid(row.try_get("previous_revision_id")?)?,
        actor: row.try_get("actor")?,
        reason: row.try_get("reason")?,
        accepted_at: row.try_get("accepted_at")?,
    })
}

pub(crate) fn job_from_row(row: &SqliteRow) -> Result<Job> {
    Ok(Job {
        id: parse_uuid(&row.try_get::<String, _>("id")?)?,
        revision_id: parse_uuid(&row.try_get::<String, _>("revision_id")?)?,
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
        cancel_requested: row.try_get::<i64, _>("cancel_requested")? == 1,
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

fn history_from_row(row: &SqliteRow) -> Result<HistoryEntry> {
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

/// English stop words left out of lexical queries (Lucene's default English set, which BM25
/// baselines use): in an OR query they match nearly every passage and add only noise.
impl SqliteLedger {
    async fn load_receipts(&self, job_id: Uuid) -> Result<Vec<ProjectionReceipt>> {
        let rows = sqlx::query(
            "SELECT backend, state, evidence, updated_at FROM projection_receipts WHERE job_id = ? ORDER BY backend",
        )
        .bind(job_id.to_string())
        .fetch_all(&self.reads)
        .await?;
        let mut receipts = Vec::with_capacity(rows.len());
        for row in rows {
            let evidence: Option<String> = row.try_get("evidence")?;
            receipts.push(ProjectionReceipt {
                backend: parse_enum::<Backend>(&row.try_get::<String, _>("backend")?)?,
                state: parse_enum::<ReceiptState>(&row.try_get::<String, _>("state")?)?,
                evidence: evidence
                    .map(|text| serde_json::from_str(&text))
                    .transpose()
                    .map_err(|error| LedgerError::Corrupt(error.to_string()))?,
                updated_at: row.try_get("updated_at")?,
            });
        }
        Ok(receipts)
    }

    async fn project_command(&self, command: ProjectCommand) -> Result<()> {
        self.submit(|reply| WriteOp::Project(command, reply))
            .await?
    }

    async fn job_command(&self, command: JobCommand) -> Result<JobAnswer> {
        self.submit(|reply| WriteOp::Job(command, reply)).await?
    }

    async fn job_answer(&self, command: JobCommand) -> Result<Job> {
        match self.job_command(command).await? {
            JobAnswer::Job(job) => Ok(*job),
            other => Err(LedgerError::Internal(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }
}
