//! The SQLite ledger itself: opening (migrations, the writer task, the read pool, the
//! checkpointer), handing operations to the writer, and the trait implementations that go
//! through it ([`crate::Leases`], [`crate::Projections`], [`crate::Tokens`],
//! [`crate::Connectors`]). What each
//! operation executes lives in the file of its role (`leases.rs`, `projection.rs`,
//! `tokens.rs`), which never imports this one.

use super::connectors::{connector_from_row, report_from, ConnectorAnswer, ConnectorOp};
use super::generations;
use super::leases::JobAnswer;
use super::leases::JobCommand;
use super::options::SqliteOptions;
use super::projection::ProjectCommand;
use super::rows::job_from_row;
use super::rows::parse_enum;
use super::tokens;
use super::verify::{drift_from_row, pass_from_row, VerifyAnswer, VerifyOp};
use super::writer::steps;
use super::writer::WriteOp;
use super::writer::Writer;
use crate::auth;
use crate::auth::Principal;
use crate::auth::TokenChange;
use crate::auth::TokenChanged;
use crate::auth::TokenInfo;
use crate::clock::Clock;
use crate::error::LedgerError;
use crate::error::Result;
use crate::faults::FaultInjector;
use crate::faults::NoFaults;
use crate::ledger::Backups;
use crate::ledger::Connectors;
use crate::ledger::Leases;
use crate::ledger::Projections;
use crate::ledger::Tokens;
use crate::ledger::Verifications;
use crate::ledger::CANDIDATES_PER_HASH;
use crate::model::Backend;
use crate::model::ChunkRef;
use crate::model::ChunkRow;
use crate::model::ChunkSummary;
use crate::model::Connector;
use crate::model::ConnectorChanged;
use crate::model::ConnectorCommand;
use crate::model::ConnectorFile;
use crate::model::Failure;
use crate::model::Generation;
use crate::model::GenerationChanged;
use crate::model::GenerationCommand;
use crate::model::GenerationView;
use crate::model::Heartbeat;
use crate::model::Job;
use crate::model::LeaseToken;
use crate::model::ProjectionReceipt;
use crate::model::ReceiptState;
use crate::model::ReceiptUpdate;
use crate::model::SyncProgress;
use crate::model::SyncRun;
use crate::model::{DriftRecord, LedgerBucket, PassChange, VerifyPass};
use crate::validate;
use async_trait::async_trait;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::sqlite::SqliteJournalMode;
use sqlx::sqlite::SqlitePool;
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::sqlite::SqliteSynchronous;
use sqlx::ConnectOptions;
use sqlx::Connection;
use sqlx::Row;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::sync::oneshot;
use uuid::Uuid;

/// How much of the database file each read connection maps: more than SQLite's build limit
/// (`SQLITE_MAX_MMAP_SIZE`, 2 GiB on 64-bit Linux), which then applies.
const READ_MMAP_BYTES: &str = "1099511627776";

/// The SQLite implementation of [`crate::Ledger`].
#[derive(Debug, Clone)]
pub struct SqliteLedger {
    pub(super) reads: SqlitePool,
    /// Fault injection for reads (tests); the writer holds the same injector.
    pub(super) faults: Arc<dyn FaultInjector>,
    pub(super) work_signal: Arc<tokio::sync::Notify>,
    pub(super) writer: mpsc::Sender<WriteOp>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) options: Arc<SqliteOptions>,
    /// Appends access changes to the erasure journal in groups (`None`: no journal).
    pub(super) journal_writer: Option<Arc<crate::journal::JournalWriter>>,
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
        let writer_options = connect
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
            .pragma("secure_delete", "ON");
        let mut write_connection = writer_options.clone().connect().await?;
        let failed = |error| {
            LedgerError::Unavailable(format!("migrating {}: {error}", options.path.display()))
        };
        let migrator = crate::migrations::sqlite().await.map_err(failed)?;
        migrator.run(&mut write_connection).await.map_err(failed)?;
        // A fresh connection parses the schema the migrations left: a migration that edits a
        // table's checks in place (`writable_schema`) is then in force for the writer too.
        write_connection.close().await?;
        let mut write_connection = writer_options.connect().await?;
        super::verify::fill_buckets(&mut write_connection).await?;
        sqlx::raw_sql(steps::TABLES)
            .execute(&mut write_connection)
            .await?;
        let trigger = steps::trigger();
        sqlx::raw_sql(&trigger)
            .execute(&mut write_connection)
            .await?;
        sqlx::raw_sql(&super::access::queue_triggers())
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
        let journal_writer = crate::journal::JournalWriter::for_ledger(options.journal.as_deref())?;
        Ok(Self {
            reads,
            faults,
            work_signal,
            writer: sender,
            clock,
            options,
            journal_writer,
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

    async fn verify_op(&self, op: VerifyOp) -> Result<VerifyAnswer> {
        self.submit(|reply| WriteOp::Verify(op, reply)).await?
    }

    pub(super) async fn connector_op(&self, op: ConnectorOp) -> Result<ConnectorAnswer> {
        self.submit(|reply| WriteOp::Connector(op, reply)).await?
    }

    pub(super) async fn submit<T>(
        &self,
        op: impl FnOnce(oneshot::Sender<T>) -> WriteOp,
    ) -> Result<T> {
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
    super::verify::fill_buckets(&mut connection).await?;
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

impl SqliteLedger {
    pub(super) async fn load_receipts(&self, job_id: Uuid) -> Result<Vec<ProjectionReceipt>> {
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

    pub(super) async fn project_command(&self, command: ProjectCommand) -> Result<()> {
        self.submit(|reply| WriteOp::Project(command, reply))
            .await?
    }

    pub(super) async fn job_command(&self, command: JobCommand) -> Result<JobAnswer> {
        self.submit(|reply| WriteOp::Job(command, reply)).await?
    }

    pub(super) async fn job_answer(&self, command: JobCommand) -> Result<Job> {
        match self.job_command(command).await? {
            JobAnswer::Job(job) => Ok(*job),
            other => Err(LedgerError::Internal(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }
}

#[async_trait]
impl Leases for SqliteLedger {
    async fn claim(&self, owner: &str, limit: u32) -> Result<Vec<Job>> {
        if owner.trim().is_empty() || owner.len() > 256 || owner.chars().any(char::is_control) {
            return Err(LedgerError::invalid(
                "invalid_owner",
                "a worker id is 1-256 printable characters",
            ));
        }
        let command = JobCommand::Claim {
            owner: owner.to_owned(),
            limit: limit.clamp(1, 10_000),
        };
        match self.job_command(command).await? {
            JobAnswer::Claimed(jobs) => Ok(jobs),
            other => Err(LedgerError::Internal(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    async fn heartbeat(&self, lease: &LeaseToken) -> Result<Heartbeat> {
        self.beat(lease, None).await
    }

    async fn progress(&self, lease: &LeaseToken, stage: &str) -> Result<Heartbeat> {
        crate::validate::stage(stage)?;
        self.beat(lease, Some(stage.to_owned())).await
    }

    async fn complete(&self, lease: &LeaseToken) -> Result<Job> {
        self.job_answer(JobCommand::Complete(lease.clone())).await
    }

    async fn fail(&self, lease: &LeaseToken, failure: Failure) -> Result<Job> {
        self.job_answer(JobCommand::Fail(lease.clone(), failure))
            .await
    }

    async fn release(&self, lease: &LeaseToken) -> Result<Job> {
        self.job_answer(JobCommand::Release(lease.clone())).await
    }

    async fn cancel(&self, job_id: Uuid, actor: &str, reason: &str) -> Result<Job> {
        self.job_answer(JobCommand::Cancel {
            job_id,
            actor: actor.to_owned(),
            reason: reason.to_owned(),
        })
        .await
    }

    async fn requeue(&self, job_id: Uuid, actor: &str, reason: &str) -> Result<Job> {
        self.job_answer(JobCommand::Requeue {
            job_id,
            actor: actor.to_owned(),
            reason: reason.to_owned(),
        })
        .await
    }

    async fn pause(&self, dataset: Option<&str>, actor: &str, reason: &str) -> Result<()> {
        if let Some(dataset) = dataset {
            validate::dataset(dataset)?;
        }
        let command = JobCommand::Pause {
            dataset: dataset.map(str::to_owned),
            actor: actor.to_owned(),
            reason: reason.to_owned(),
        };
        self.job_command(command).await.map(|_| ())
    }

    async fn resume(&self, dataset: Option<&str>, actor: &str, reason: &str) -> Result<()> {
        let command = JobCommand::Resume {
            dataset: dataset.map(str::to_owned),
            actor: actor.to_owned(),
            reason: reason.to_owned(),
        };
        self.job_command(command).await.map(|_| ())
    }

    fn work_signal(&self) -> Option<Arc<tokio::sync::Notify>> {
        Some(self.work_signal.clone())
    }

    async fn job(&self, id: Uuid) -> Result<Option<Job>> {
        sqlx::query("SELECT * FROM jobs WHERE id = ?")
            .bind(id.to_string())
            .fetch_optional(&self.reads)
            .await?
            .as_ref()
            .map(job_from_row)
            .transpose()
    }
}

#[async_trait]
impl Projections for SqliteLedger {
    async fn activate_generation(&self, generation: &Generation, actor: &str) -> Result<()> {
        self.project_command(ProjectCommand::Activate {
            generation: generation.clone(),
            actor: actor.to_owned(),
        })
        .await
    }

    async fn active_generation(&self) -> Result<Option<Generation>> {
        sqlx::query("SELECT * FROM generations WHERE state = 'active'")
            .fetch_optional(&self.reads)
            .await?
            .as_ref()
            .map(generations::generation_from_row)
            .transpose()
    }

    async fn change_generation(&self, command: GenerationCommand) -> Result<GenerationChanged> {
        self.submit(|reply| WriteOp::Generation(command, reply))
            .await?
    }

    async fn generations(&self) -> Result<Vec<GenerationView>> {
        let mut connection = self.reads.acquire().await?;
        super::generations::list(&mut connection, self.clock.now_micros()).await
    }

    async fn write_chunks(
        &self,
        lease: &LeaseToken,
        generation: &str,
        chunks: Vec<ChunkRow>,
    ) -> Result<()> {
        self.project_command(ProjectCommand::WriteChunks {
            token: lease.clone(),
            generation: generation.to_owned(),
            chunks,
        })
        .await
    }

    async fn chunk_summary(&self, revision_id: Uuid, generation: &str) -> Result<ChunkSummary> {
        let hashes: Vec<String> = sqlx::query_scalar(
            "SELECT sha256 FROM chunks WHERE revision_id = ? AND generation = ? ORDER BY chunk_index",
        )
        .bind(revision_id.to_string())
        .bind(generation)
        .fetch_all(&self.reads)
        .await?;
        Ok(ChunkSummary::of(hashes.iter().map(String::as_str)))
    }

    async fn chunk_summaries(
        &self,
        revision_ids: &[Uuid],
        generation: &str,
    ) -> Result<Vec<ChunkSummary>> {
        let ids: Vec<String> = revision_ids.iter().map(Uuid::to_string).collect();
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT revision_id, sha256 FROM chunks \
             WHERE revision_id IN (SELECT value FROM json_each(?1)) AND generation = ?2 \
             ORDER BY revision_id, chunk_index",
        )
        .bind(serde_json::Value::from(ids.clone()).to_string())
        .bind(generation)
        .fetch_all(&self.reads)
        .await?;
        Ok(crate::model::ChunkSummary::by_revision(&ids, &rows))
    }

    async fn project_many(&self, writes: Vec<crate::model::UnitWrite>) -> Vec<Result<()>> {
        let count = writes.len();
        match self
            .submit(|reply| WriteOp::ProjectMany(writes, reply))
            .await
        {
            Ok(results) => results,
            Err(error) => (0..count).map(|_| Err(error.replicate())).collect(),
        }
    }

    async fn chunks(&self, revision_id: Uuid, generation: &str) -> Result<Vec<ChunkRow>> {
        let rows = sqlx::query(
            "SELECT chunk_index, text, byte_start, byte_end, token_count, sha256, section, page \
             FROM chunks WHERE revision_id = ? AND generation = ? ORDER BY chunk_index",
        )
        .bind(revision_id.to_string())
        .bind(generation)
        .fetch_all(&self.reads)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ChunkRow {
                    chunk_index: row.try_get("chunk_index")?,
                    text: row.try_get("text")?,
                    byte_start: row.try_get("byte_start")?,
                    byte_end: row.try_get("byte_end")?,
                    token_count: row.try_get("token_count")?,
                    sha256: row.try_get("sha256")?,
                    section: row.try_get("section")?,
                    page: row.try_get("page")?,
                })
            })
            .collect()
    }

    async fn chunks_with_hashes(
        &self,
        dataset: &str,
        generation: &str,
        hashes: &[String],
        except_revision: Uuid,
    ) -> Result<Vec<ChunkRef>> {
        if hashes.is_empty() {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(
            "SELECT c.sha256, c.revision_id, MIN(c.chunk_index) AS chunk_index \
             FROM chunks AS c JOIN revisions AS r ON r.id = c.revision_id \
             WHERE c.sha256 IN (SELECT value FROM json_each(?1)) AND c.generation = ?2 \
               AND r.dataset = ?3 AND c.revision_id <> ?4 \
               AND EXISTS (SELECT 1 FROM jobs AS j JOIN projection_receipts AS p ON p.job_id = j.id \
                           WHERE j.revision_id = c.revision_id AND p.backend = 'vector' \
                             AND p.generation = ?2 AND p.state IN ('verified', 'superseded')) \
             GROUP BY c.sha256, c.revision_id \
             ORDER BY c.sha256, MAX(r.accepted_at) DESC, c.revision_id \
             LIMIT ?5",
        )
        .bind(serde_json::Value::from(hashes.to_vec()).to_string())
        .bind(generation)
        .bind(dataset)
        .bind(except_revision.to_string())
        .bind(i64::try_from(hashes.len().saturating_mul(CANDIDATES_PER_HASH)).unwrap_or(i64::MAX))
        .fetch_all(&self.reads)
        .await?;
        let mut found: Vec<ChunkRef> = Vec::new();
        for row in &rows {
            let sha256: String = row.try_get("sha256")?;
            let same = found
                .iter()
                .rev()
                .take_while(|known| known.sha256 == sha256)
                .count();
            if same >= CANDIDATES_PER_HASH {
                continue;
            }
            found.push(ChunkRef {
                sha256,
                revision_id: super::rows::parse_uuid(&row.try_get::<String, _>("revision_id")?)?,
                chunk_index: u32::try_from(row.try_get::<i64, _>("chunk_index")?)
                    .map_err(|_| LedgerError::Corrupt("a negative chunk index".to_owned()))?,
            });
        }
        Ok(found)
    }

    async fn record_receipt(&self, lease: &LeaseToken, update: ReceiptUpdate) -> Result<()> {
        self.project_command(ProjectCommand::Receipt {
            token: lease.clone(),
            update,
        })
        .await
    }

    async fn receipts(&self, job_id: Uuid) -> Result<Vec<ProjectionReceipt>> {
        self.load_receipts(job_id).await
    }

    async fn cross_boundary(&self, lease: &LeaseToken) -> Result<bool> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.project_command(ProjectCommand::Cross {
            token: lease.clone(),
            reply,
        })
        .await?;
        answer
            .await
            .map_err(|_| LedgerError::Unavailable("the ledger writer stopped mid-write".to_owned()))
    }
}

#[async_trait]
impl Tokens for SqliteLedger {
    async fn change_token(&self, change: TokenChange) -> Result<TokenChanged> {
        if let TokenChange::Create(token) = &change {
            auth::check_new(token, self.clock.now_micros())?;
        }
        crate::journal::record(
            self.options.journal.as_deref(),
            crate::journal::JournalEntry::token(&change, self.clock.now_micros()),
        )?;
        self.submit(|reply| WriteOp::Token(change, reply)).await?
    }

    async fn authenticate(&self, secret: &str) -> Result<Option<Principal>> {
        tokens::authenticate(&self.reads, secret, self.clock.now_micros()).await
    }

    async fn token_count(&self) -> Result<i64> {
        tokens::active_count(&self.reads, self.clock.now_micros()).await
    }

    async fn tokens(&self) -> Result<Vec<TokenInfo>> {
        tokens::list(&self.reads, self.clock.now_micros()).await
    }
}

#[async_trait]
impl Connectors for SqliteLedger {
    async fn change_connector(&self, command: ConnectorCommand) -> Result<ConnectorChanged> {
        match self.connector_op(ConnectorOp::Change(command)).await? {
            ConnectorAnswer::Changed(changed) => Ok(*changed),
            other => Err(LedgerError::Internal(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    async fn connector(&self, id: Uuid) -> Result<Option<Connector>> {
        sqlx::query("SELECT * FROM connectors WHERE id = ?")
            .bind(id.to_string())
            .fetch_optional(&self.reads)
            .await?
            .as_ref()
            .map(connector_from_row)
            .transpose()
    }

    async fn connectors(&self) -> Result<Vec<Connector>> {
        sqlx::query("SELECT * FROM connectors ORDER BY created_at DESC, id DESC")
            .fetch_all(&self.reads)
            .await?
            .iter()
            .map(connector_from_row)
            .collect()
    }

    async fn connector_files(&self, id: Uuid) -> Result<Vec<ConnectorFile>> {
        let rows = sqlx::query(
            "SELECT source_key, fingerprint, sha256 FROM connector_files \
             WHERE connector_id = ? ORDER BY source_key",
        )
        .bind(id.to_string())
        .fetch_all(&self.reads)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ConnectorFile {
                    source_key: row.try_get("source_key")?,
                    fingerprint: row.try_get("fingerprint")?,
                    sha256: row.try_get("sha256")?,
                })
            })
            .collect()
    }

    async fn record_sync(&self, lease: &LeaseToken, progress: SyncProgress) -> Result<()> {
        self.connector_op(ConnectorOp::Record(lease.clone(), Box::new(progress)))
            .await
            .map(|_| ())
    }

    async fn sync_runs(&self, id: Uuid, limit: u32) -> Result<Vec<SyncRun>> {
        let rows = sqlx::query(
            "SELECT jobs.*, report.report AS sync_report FROM jobs \
             LEFT JOIN sync_reports AS report ON report.job_id = jobs.id \
             WHERE jobs.connector_id = ? ORDER BY jobs.created_at DESC, jobs.run_at DESC, jobs.id DESC LIMIT ?",
        )
        .bind(id.to_string())
        .bind(i64::from(limit.clamp(1, 100)))
        .fetch_all(&self.reads)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(SyncRun {
                    job: job_from_row(row)?,
                    report: report_from(row.try_get("sync_report")?)?,
                })
            })
            .collect()
    }
}

#[async_trait]
impl Verifications for SqliteLedger {
    async fn verify_bucket(&self, generation: &str, bucket: u16) -> Result<LedgerBucket> {
        super::verify::bucket(&self.reads, generation, bucket).await
    }

    async fn change_pass(&self, change: PassChange) -> Result<VerifyPass> {
        match self.verify_op(VerifyOp::Change(change)).await? {
            VerifyAnswer::Pass(pass) => Ok(*pass),
            other => Err(LedgerError::Internal(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }

    async fn verify_pass(&self, id: Uuid) -> Result<Option<VerifyPass>> {
        sqlx::query("SELECT * FROM verify_passes WHERE id = ?")
            .bind(id.to_string())
            .fetch_optional(&self.reads)
            .await?
            .as_ref()
            .map(pass_from_row)
            .transpose()
    }

    async fn verify_passes(&self, limit: u32) -> Result<Vec<VerifyPass>> {
        sqlx::query("SELECT * FROM verify_passes ORDER BY started_at DESC, id DESC LIMIT ?")
            .bind(i64::from(limit.clamp(1, 100)))
            .fetch_all(&self.reads)
            .await?
            .iter()
            .map(pass_from_row)
            .collect()
    }

    async fn pass_drift(&self, pass_id: Uuid) -> Result<Vec<DriftRecord>> {
        sqlx::query("SELECT * FROM verify_drift WHERE pass_id = ? ORDER BY found_at, id")
            .bind(pass_id.to_string())
            .fetch_all(&self.reads)
            .await?
            .iter()
            .map(drift_from_row)
            .collect()
    }

    async fn reproject(
        &self,
        dataset: &str,
        source_key: &str,
        revision_id: Uuid,
        generation: &str,
        actor: &str,
        reason: &str,
    ) -> Result<Job> {
        let op = VerifyOp::Reproject {
            dataset: dataset.to_owned(),
            source_key: source_key.to_owned(),
            revision_id,
            generation: generation.to_owned(),
            actor: actor.to_owned(),
            reason: reason.to_owned(),
        };
        match self.verify_op(op).await? {
            VerifyAnswer::Job(job) => Ok(*job),
            other => Err(LedgerError::Internal(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }
}

#[async_trait]
impl Backups for SqliteLedger {
    async fn backup_ledger(&self, path: &std::path::Path) -> Result<crate::model::LedgerBackup> {
        super::verify::backup_into(&self.reads, path).await
    }

    async fn record_restore(&self, restore: &crate::model::RestoreRecord) -> Result<i64> {
        match self.verify_op(VerifyOp::Restored(restore.clone())).await? {
            VerifyAnswer::Voided(voided) => Ok(voided),
            other => Err(LedgerError::Internal(format!(
                "unexpected answer {other:?}"
            ))),
        }
    }
}
