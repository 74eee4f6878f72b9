//! The writer task: the one write connection, group commit (everything queued runs in one
//! transaction, each operation in its own savepoint, one fsync for all), and acceptance in
//! waves (set-based statements over the submissions that touch distinct sources).

use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::Connection;
use sqlx::Row;

use super::connectors;
use super::connectors::ConnectorAnswer;
use super::connectors::ConnectorOp;
use super::erasure;
use super::generations;
use super::leases;
use super::leases::JobAnswer;
use super::leases::JobCommand;
use super::options::SqliteOptions;
use super::projection;
use super::projection::ProjectCommand;
use super::rows::json_text;
use super::rows::optional_uuid;
use super::rows::parse_uuid;
use super::tokens;
use super::verify;
use super::verify::VerifyAnswer;
use super::verify::VerifyOp;
use crate::acceptance::classify;
use crate::acceptance::Decision;
use crate::acceptance::Outcome;
use crate::acceptance::Prepared;
use crate::acceptance::PreparedChange;
use crate::acceptance::ValidityRows;
use crate::auth::TokenChange;
use crate::auth::TokenChanged;
use crate::clock::Clock;
use crate::clock::Micros;
use crate::error::LedgerError;
use crate::error::Result;
use crate::faults::FaultInjector;
use crate::faults::FaultPoint;
use crate::ids;
use crate::model::AcceptStatus;
use crate::model::Acceptance;
use crate::model::Backend;
use crate::model::ContentBlock;
use crate::model::ErasureRequest;
use crate::model::GenerationChanged;
use crate::model::GenerationCommand;
use crate::model::JobKind;
use std::collections::HashMap;
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::sync::oneshot;

pub(super) enum WriteOp {
    Accept(Vec<Prepared>, oneshot::Sender<Vec<Result<Acceptance>>>),
    Job(JobCommand, oneshot::Sender<Result<JobAnswer>>),
    Project(ProjectCommand, oneshot::Sender<Result<()>>),
    /// A unit's writes: one savepoint per job, one result per job.
    ProjectMany(
        Vec<crate::model::UnitWrite>,
        oneshot::Sender<Vec<Result<()>>>,
    ),
    Block(ContentBlock, oneshot::Sender<Result<()>>),
    Token(TokenChange, oneshot::Sender<Result<TokenChanged>>),
    Access(crate::access::AccessChange, oneshot::Sender<Result<()>>),
    Generation(
        GenerationCommand,
        oneshot::Sender<Result<GenerationChanged>>,
    ),
    Erase(ErasureRequest, oneshot::Sender<Result<Acceptance>>),
    Connector(ConnectorOp, oneshot::Sender<Result<ConnectorAnswer>>),
    Verify(VerifyOp, oneshot::Sender<Result<VerifyAnswer>>),
    /// The outbox: retention, webhooks and their deliveries.
    Outbox(
        super::webhooks::OutboxOp,
        oneshot::Sender<Result<super::webhooks::OutboxAnswer>>,
    ),
}

impl WriteOp {
    fn weight(&self) -> usize {
        match self {
            WriteOp::Accept(items, _) => items.len().max(1),
            WriteOp::ProjectMany(writes, _) => writes.len().max(1),
            WriteOp::Block(..)
            | WriteOp::Token(..)
            | WriteOp::Access(..)
            | WriteOp::Outbox(..)
            | WriteOp::Job(..)
            | WriteOp::Project(..)
            | WriteOp::Generation(..)
            | WriteOp::Connector(..)
            | WriteOp::Verify(..)
            | WriteOp::Erase(..) => 1,
        }
    }
}

/// An operation's results, held until the commit decides their fate.
pub(super) enum Done {
    Accept(
        Vec<Result<Acceptance>>,
        oneshot::Sender<Vec<Result<Acceptance>>>,
    ),
    Block(Result<()>, oneshot::Sender<Result<()>>),
    Project(Result<()>, oneshot::Sender<Result<()>>),
    ProjectMany(Vec<Result<()>>, oneshot::Sender<Vec<Result<()>>>),
    Token(Result<TokenChanged>, oneshot::Sender<Result<TokenChanged>>),
    Access(Result<()>, oneshot::Sender<Result<()>>),
    Generation(
        Result<GenerationChanged>,
        oneshot::Sender<Result<GenerationChanged>>,
    ),
    Erase(Result<Acceptance>, oneshot::Sender<Result<Acceptance>>),
    Job(Result<JobAnswer>, oneshot::Sender<Result<JobAnswer>>),
    Connector(
        Result<ConnectorAnswer>,
        oneshot::Sender<Result<ConnectorAnswer>>,
    ),
    Verify(Result<VerifyAnswer>, oneshot::Sender<Result<VerifyAnswer>>),
    Outbox(
        Result<super::webhooks::OutboxAnswer>,
        oneshot::Sender<Result<super::webhooks::OutboxAnswer>>,
    ),
}

impl Done {
    /// Replaces every success with `error()`: the commit failed, nothing was kept.
    fn fail(self, error: &dyn Fn() -> LedgerError) -> Done {
        fn fail_one<T>(result: Result<T>, error: &dyn Fn() -> LedgerError) -> Result<T> {
            result.and_then(|_| Err(error()))
        }
        match self {
            Done::Accept(results, reply) => Done::Accept(
                results.into_iter().map(|r| fail_one(r, error)).collect(),
                reply,
            ),
            Done::Block(result, reply) => Done::Block(fail_one(result, error), reply),
            Done::Project(result, reply) => Done::Project(fail_one(result, error), reply),
            Done::ProjectMany(results, reply) => Done::ProjectMany(
                results.into_iter().map(|r| fail_one(r, error)).collect(),
                reply,
            ),
            Done::Job(result, reply) => Done::Job(fail_one(result, error), reply),
            Done::Token(result, reply) => Done::Token(fail_one(result, error), reply),
            Done::Access(result, reply) => Done::Access(fail_one(result, error), reply),
            Done::Generation(result, reply) => Done::Generation(fail_one(result, error), reply),
            Done::Erase(result, reply) => Done::Erase(fail_one(result, error), reply),
            Done::Connector(result, reply) => Done::Connector(fail_one(result, error), reply),
            Done::Verify(result, reply) => Done::Verify(fail_one(result, error), reply),
            Done::Outbox(result, reply) => Done::Outbox(fail_one(result, error), reply),
        }
    }

    /// Whether this operation, once committed, may have made a job claimable.
    fn makes_work(&self) -> bool {
        match self {
            Done::Accept(results, _) => results
                .iter()
                .any(|result| matches!(result, Ok(acceptance) if acceptance.status == AcceptStatus::QueuedNotConfirmed)),
            Done::Job(Ok(JobAnswer::Job(job)), _) => job.state == crate::model::JobState::Pending,
            Done::Generation(Ok(changed), _) => changed.jobs > 0,
            Done::Erase(result, _) => result.is_ok(),
            Done::Connector(Ok(ConnectorAnswer::Changed(changed)), _) => changed
                .run
                .as_ref()
                .is_some_and(|run| run.state == crate::model::JobState::Pending),
            Done::Verify(Ok(VerifyAnswer::Job(_)), _) => true,
            Done::Verify(..)
            | Done::Connector(..)
            | Done::Job(..)
            | Done::Block(..)
            | Done::Token(..)
            | Done::Access(..)
            | Done::Outbox(..)
            | Done::Project(..)
            | Done::ProjectMany(..)
            | Done::Generation(..) => false,
        }
    }

    fn send(self) {
        // A caller that went away no longer needs its answer; its writes are committed anyway.
        match self {
            Done::Accept(results, reply) => drop(reply.send(results)),
            Done::Block(result, reply) => drop(reply.send(result)),
            Done::Project(result, reply) => drop(reply.send(result)),
            Done::ProjectMany(results, reply) => drop(reply.send(results)),
            Done::Job(result, reply) => drop(reply.send(result)),
            Done::Token(result, reply) => drop(reply.send(result)),
            Done::Access(result, reply) => drop(reply.send(result)),
            Done::Generation(result, reply) => drop(reply.send(result)),
            Done::Erase(result, reply) => drop(reply.send(result)),
            Done::Connector(result, reply) => drop(reply.send(result)),
            Done::Verify(result, reply) => drop(reply.send(result)),
            Done::Outbox(result, reply) => drop(reply.send(result)),
        }
    }
}

pub(super) struct Writer {
    /// Woken after a commit that made work claimable.
    pub(super) work_signal: Arc<tokio::sync::Notify>,
    pub(super) connection: SqliteConnection,
    /// Whether the group's transaction has been begun.
    pub(super) in_transaction: bool,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) faults: Arc<dyn FaultInjector>,
    pub(super) options: Arc<SqliteOptions>,
}

impl Writer {
    pub(super) async fn run(mut self, mut receiver: mpsc::Receiver<WriteOp>) {
        while let Some(first) = receiver.recv().await {
            let mut weight = first.weight();
            let mut group = vec![first];
            // Take whatever else is queued: it shares this group's commit.
            while weight < self.options.max_group {
                match receiver.try_recv() {
                    Ok(op) => {
                        weight += op.weight();
                        group.push(op);
                    }
                    Err(_) => break,
                }
            }
            self.commit_group(group).await;
        }
        let _ = self.connection.close().await;
    }

    async fn commit_group(&mut self, group: Vec<WriteOp>) {
        let started = std::time::Instant::now();
        let operations = group.len();
        // `BEGIN IMMEDIATE` is sent with the group's first statement (one round trip less).
        self.in_transaction = false;
        // Blocks and tokens first, then every acceptance of the group together, so that the
        // acceptances share waves; any order of concurrent requests is a valid serialisation.
        let mut done = Vec::with_capacity(group.len());
        let mut acceptances = Vec::new();
        let mut completions = Vec::new();
        for op in group {
            match op {
                WriteOp::Accept(items, reply) => acceptances.push((items, reply)),
                WriteOp::Job(JobCommand::Complete(token), reply) => {
                    completions.push((token, reply))
                }
                other => done.push(self.apply(other).await),
            }
        }
        // Completions of the group share one statement.
        if !completions.is_empty() {
            let (tokens, replies): (Vec<_>, Vec<_>) = completions.into_iter().unzip();
            let now = self.clock.now_micros();
            let results = match self.ensure_transaction().await {
                Ok(()) => leases::complete_many(&mut self.connection, &tokens, now).await,
                Err(error) => tokens.iter().map(|_| Err(error.replicate())).collect(),
            };
            for (result, reply) in results.into_iter().zip(replies) {
                done.push(Done::Job(
                    result.map(|job| JobAnswer::Job(Box::new(job))),
                    reply,
                ));
            }
        }
        let mut shapes = Vec::with_capacity(acceptances.len());
        let mut items = Vec::new();
        for (op_items, reply) in acceptances {
            shapes.push((op_items.len(), reply));
            items.extend(op_items);
        }
        let began_us = started.elapsed().as_micros() as u64;
        let submissions = items.len();
        let mut results = self.accept_all(items).await.into_iter();
        for (count, reply) in shapes {
            done.push(Done::Accept(results.by_ref().take(count).collect(), reply));
        }
        let written_us = started.elapsed().as_micros() as u64;
        let outcome = if self.faults.fire(FaultPoint::BeforeCommit) {
            Err(LedgerError::Injected(FaultPoint::BeforeCommit))
        } else {
            sqlx::query("COMMIT")
                .execute(&mut self.connection)
                .await
                .map(|_| ())
                .map_err(LedgerError::from)
        };
        tracing::debug!(
            operations,
            submissions,
            began_us,
            written_us,
            elapsed_us = started.elapsed().as_micros() as u64,
            committed = outcome.is_ok(),
            "ledger group commit"
        );
        match outcome {
            Ok(()) => {
                if done.iter().any(Done::makes_work) {
                    self.work_signal.notify_waiters();
                }
                done.into_iter().for_each(Done::send);
            }
            Err(error) => {
                if let Err(rollback) = sqlx::query("ROLLBACK").execute(&mut self.connection).await {
                    // SQLite rolls back by itself when a COMMIT fails for a full disk or an
                    // I/O error; then there is nothing left to roll back, and that is fine.
                    if rollback.to_string().contains("no transaction is active") {
                        tracing::debug!("ledger transaction already rolled back by SQLite");
                    } else {
                        tracing::error!(error = %rollback, "ledger rollback failed");
                    }
                }
                tracing::error!(%error, "ledger commit failed; the whole group was rolled back");
                let message = error.to_string();
                let make = || match &error {
                    LedgerError::Injected(point) => LedgerError::Injected(*point),
                    _ => LedgerError::Unavailable(format!("commit failed: {message}")),
                };
                done.into_iter().for_each(|item| item.fail(&make).send());
            }
        }
    }

    async fn apply(&mut self, op: WriteOp) -> Done {
        match op {
            WriteOp::Accept(items, reply) => {
                let results = self.accept_all(items).await;
                Done::Accept(results, reply)
            }
            WriteOp::Job(command, reply) => {
                // No savepoint: every lease operation's writes are single statements, each
                // atomic on its own, so a failed operation leaves nothing partial behind.
                let now = self.clock.now_micros();
                let unit: f64 = rand::random();
                let claims = matches!(command, JobCommand::Claim { .. });
                let mut result = self.ensure_transaction().await;
                if claims && result.is_ok() {
                    // Connectors without an open run get one before the claim sees the jobs.
                    result =
                        connectors::schedule(&mut self.connection, now, &self.options.job_policies)
                            .await;
                }
                let result = match result {
                    Ok(()) => {
                        leases::run(
                            &mut self.connection,
                            command,
                            now,
                            &self.options.job_policies,
                            unit,
                        )
                        .await
                    }
                    Err(error) => Err(error),
                };
                Done::Job(result, reply)
            }
            WriteOp::Project(command, reply) => {
                // A savepoint: a chunk write is two statements, kept or undone together.
                let now = self.clock.now_micros();
                let chunk_write = match &command {
                    ProjectCommand::WriteChunks { token, .. } => Some(token.job_id),
                    _ => None,
                };
                let fault = chunk_write.is_some() && self.faults.fire(FaultPoint::BeforeChunkWrite);
                let mut result = match self.begin_item().await {
                    Ok(()) if fault => Err(LedgerError::Injected(FaultPoint::BeforeChunkWrite)),
                    Ok(()) => projection::run(&mut self.connection, command, now).await,
                    Err(error) => Err(error),
                };
                if let (Ok(()), Some(job_id)) = (&result, chunk_write) {
                    if self.faults.fire(FaultPoint::ChunkRowLost) {
                        result = projection::lose_last_chunk(&mut self.connection, job_id).await;
                    }
                }
                Done::Project(self.end_item(result).await, reply)
            }
            WriteOp::ProjectMany(writes, reply) => {
                let mut results = Vec::with_capacity(writes.len());
                for write in writes {
                    let result = match self.begin_item().await {
                        Ok(()) => self.unit_write(write).await,
                        Err(error) => Err(error),
                    };
                    results.push(self.end_item(result).await);
                }
                Done::ProjectMany(results, reply)
            }
            WriteOp::Block(block, reply) => {
                let result = match self.begin_item().await {
                    Ok(()) => self.block(block).await,
                    Err(error) => Err(error),
                };
                Done::Block(self.end_item(result).await, reply)
            }
            WriteOp::Token(change, reply) => {
                let now = self.clock.now_micros();
                let result = match self.begin_item().await {
                    Ok(()) => tokens::change(&mut self.connection, change, now).await,
                    Err(error) => Err(error),
                };
                Done::Token(self.end_item(result).await, reply)
            }
            WriteOp::Outbox(op, reply) => {
                let now = self.clock.now_micros();
                let result = match self.begin_item().await {
                    Ok(()) => super::webhooks::run(&mut self.connection, op, now).await,
                    Err(error) => Err(error),
                };
                Done::Outbox(self.end_item(result).await, reply)
            }
            WriteOp::Access(change, reply) => {
                let now = self.clock.now_micros();
                if super::access::one_statement(&change) {
                    // One statement is atomic on its own (a failed one leaves the transaction
                    // as it was): no savepoint, two round trips fewer per change.
                    let result = match self.ensure_transaction().await {
                        Ok(()) => super::access::change(&mut self.connection, change, now).await,
                        Err(error) => Err(error),
                    };
                    return Done::Access(result, reply);
                }
                let result = match self.begin_item().await {
                    Ok(()) => super::access::change(&mut self.connection, change, now).await,
                    Err(error) => Err(error),
                };
                Done::Access(self.end_item(result).await, reply)
            }
            WriteOp::Generation(command, reply) => {
                let now = self.clock.now_micros();
                let result = match self.begin_item().await {
                    Ok(()) => generations::change(&mut self.connection, command, now).await,
                    Err(error) => Err(error),
                };
                Done::Generation(self.end_item(result).await, reply)
            }
            WriteOp::Connector(op, reply) => {
                let now = self.clock.now_micros();
                let result = match self.begin_item().await {
                    Ok(()) => {
                        connectors::run(&mut self.connection, op, now, &self.options.job_policies)
                            .await
                    }
                    Err(error) => Err(error),
                };
                Done::Connector(self.end_item(result).await, reply)
            }
            WriteOp::Verify(op, reply) => {
                let now = self.clock.now_micros();
                let result = match self.begin_item().await {
                    Ok(()) => verify::run(&mut self.connection, op, now).await,
                    Err(error) => Err(error),
                };
                Done::Verify(self.end_item(result).await, reply)
            }
            WriteOp::Erase(request, reply) => {
                let now = self.clock.now_micros();
                let policies = &self.options.job_policies;
                let attempts = (policies.tombstone.max_attempts, policies.graph.max_attempts);
                let result = match self.begin_item().await {
                    Ok(()) => {
                        erasure::erase(
                            &mut self.connection,
                            &request,
                            &self.options.backends,
                            attempts,
                            now,
                        )
                        .await
                    }
                    Err(error) => Err(error),
                };
                Done::Erase(self.end_item(result).await, reply)
            }
        }
    }

    async fn ensure_transaction(&mut self) -> Result<()> {
        if !self.in_transaction {
            self.in_transaction = true;
            sqlx::query("BEGIN IMMEDIATE")
                .execute(&mut self.connection)
                .await?;
        }
        Ok(())
    }

    /// One job's part of a unit ([`crate::Projections::project_many`]), inside its savepoint:
    /// the same statements, and the same injected faults, as a lone chunk write and its
    /// receipts.
    async fn unit_write(&mut self, write: crate::model::UnitWrite) -> Result<()> {
        let now = self.clock.now_micros();
        let job_id = write.lease.job_id;
        if let Some((generation, chunks)) = write.chunks {
            if self.faults.fire(FaultPoint::BeforeChunkWrite) {
                return Err(LedgerError::Injected(FaultPoint::BeforeChunkWrite));
            }
            let command = ProjectCommand::WriteChunks {
                token: write.lease.clone(),
                generation,
                chunks,
            };
            projection::run(&mut self.connection, command, now).await?;
            if self.faults.fire(FaultPoint::ChunkRowLost) {
                projection::lose_last_chunk(&mut self.connection, job_id).await?;
            }
        }
        for update in write.receipts {
            let command = ProjectCommand::Receipt {
                token: write.lease.clone(),
                update,
            };
            projection::run(&mut self.connection, command, now).await?;
        }
        Ok(())
    }

    async fn begin_item(&mut self) -> Result<()> {
        let statement = if self.in_transaction {
            "SAVEPOINT item"
        } else {
            "BEGIN IMMEDIATE; SAVEPOINT item"
        };
        // Once sent, count the transaction as begun even if the call failed midway: the
        // group then ends with a ROLLBACK, which is harmless when nothing was begun.
        self.in_transaction = true;
        sqlx::query(statement).execute(&mut self.connection).await?;
        Ok(())
    }

    /// Keeps the item's writes on success, undoes them on failure.
    async fn end_item<T>(&mut self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            if let Err(error) = sqlx::query("ROLLBACK TO item")
                .execute(&mut self.connection)
                .await
            {
                tracing::error!(%error, "ledger savepoint could not be rolled back");
                return Err(LedgerError::from(error));
            }
        }
        match sqlx::query("RELEASE item")
            .execute(&mut self.connection)
            .await
        {
            Ok(_) => result,
            Err(error) => {
                tracing::error!(%error, "ledger savepoint could not be released");
                Err(LedgerError::from(error))
            }
        }
    }

    fn fault(&self, point: FaultPoint) -> Result<()> {
        if self.faults.fire(point) {
            Err(LedgerError::Injected(point))
        } else {
            Ok(())
        }
    }

    /// Accepts items in arrival order. Items are processed in waves in which no two items
    /// share a source (a later item for the same source waits for the next wave and sees the
    /// earlier one's head). Each wave is a handful of set-based statements inside one savepoint,
    /// so its cost barely grows with its size.
    async fn accept_all(&mut self, items: Vec<Prepared>) -> Vec<Result<Acceptance>> {
        let mut results: Vec<Option<Result<Acceptance>>> = (0..items.len()).map(|_| None).collect();
        let mut pending: Vec<(usize, Prepared)> = items.into_iter().enumerate().collect();
        while !pending.is_empty() {
            let mut sources = HashSet::new();
            let mut wave = Vec::new();
            let mut later = Vec::new();
            for (position, item) in pending {
                if sources.insert((item.dataset.clone(), item.source_key.clone())) {
                    wave.push((position, item));
                } else {
                    later.push((position, item));
                }
            }
            let (positions, items): (Vec<usize>, Vec<Prepared>) = wave.into_iter().unzip();
            let outcomes = match self.accept_wave(&items).await {
                Ok(outcomes) => outcomes,
                Err(error) => {
                    tracing::error!(%error, items = items.len(), "acceptance wave failed; its writes were rolled back");
                    items.iter().map(|_| Err(error.replicate())).collect()
                }
            };
            for (position, outcome) in positions.into_iter().zip(outcomes) {
                results[position] = Some(outcome);
            }
            pending = later;
        }
        crate::acceptance::filled(results)
    }

    /// One wave: decide, then write every accepted item in four set-based steps with a fault
    /// point between each. On error the wave's savepoint is rolled back and the error returned.
    async fn accept_wave(&mut self, wave: &[Prepared]) -> Result<Vec<Result<Acceptance>>> {
        let now = self.clock.now_micros();
        let decisions = self.decide(wave).await?;
        let mut outcomes: Vec<Outcome> = Vec::with_capacity(wave.len());
        for (item, decision) in wave.iter().zip(decisions) {
            outcomes.push(classify(item, decision, now));
        }

        let duplicates: Vec<String> = outcomes
            .iter()
            .filter_map(|outcome| match outcome {
                Outcome::Duplicate(id, _) => Some(id.to_string()),
                _ => None,
            })
            .collect();
        let mut duplicate_receipts = HashMap::new();
        if !duplicates.is_empty() {
            for row in sqlx::query(include_str!("queries/accept_duplicates.sql"))
                .bind(json_text(&duplicates))
                .fetch_all(&mut self.connection)
                .await?
            {
                let receipt = duplicate_from_row(&row)?;
                duplicate_receipts.insert(receipt.source_revision_id, receipt);
            }
        }

        let mut staged = Staged::default();
        for (position, (item, outcome)) in wave.iter().zip(&outcomes).enumerate() {
            if let Outcome::Write(write) = outcome {
                staged.add(
                    position,
                    item,
                    write,
                    self.options.backends.contains(&Backend::Graph),
                );
            }
        }
        let rows = staged.rows;
        let validity = ValidityRows::of(wave, &outcomes);
        if !rows.is_empty() || !validity.is_empty() {
            self.write_wave(
                &rows,
                &staged.passages,
                &staged.contents,
                &staged.bytes,
                &validity,
                now,
            )
            .await?;
        }
        // The readers an accepted put names, in the same transaction: a refused put changes
        // nobody's access.
        for (item, outcome) in wave.iter().zip(&outcomes) {
            if matches!(outcome, Outcome::Refused(_)) {
                continue;
            }
            if let Some(change) = item.access_change() {
                super::access::change(&mut self.connection, change, now).await?;
            }
        }

        Ok(wave
            .iter()
            .zip(outcomes)
            .map(|(item, outcome)| crate::acceptance::answer(item, outcome, &duplicate_receipts))
            .collect())
    }

    /// What the ledger holds for each item of a wave, in wave order.
    async fn decide(&mut self, wave: &[Prepared]) -> Result<Vec<Decision>> {
        let probe: Vec<serde_json::Value> = wave
            .iter()
            .map(|item| {
                let (sha256, revision_id) = match &item.change {
                    PreparedChange::Put {
                        sha256,
                        revision_id,
                        ..
                    } => (Some(sha256.as_str()), Some(revision_id.to_string())),
                    PreparedChange::Delete { .. } => (None, None),
                };
                serde_json::json!({
                    "dataset": item.dataset,
                    "source_key": item.source_key,
                    "sha256": sha256,
                    "revision_id": revision_id,
                })
            })
            .collect();
        const DECIDE: &str = include_str!("queries/accept_decide.sql");
        const BEGIN_AND_DECIDE: &str = concat!(
            "BEGIN IMMEDIATE;\n",
            include_str!("queries/accept_decide.sql")
        );
        let statement = if self.in_transaction {
            DECIDE
        } else {
            BEGIN_AND_DECIDE
        };
        self.in_transaction = true;
        let rows = sqlx::query(statement)
            .bind(json_text(&probe))
            .fetch_all(&mut self.connection)
            .await?;
        if rows.len() != wave.len() {
            return Err(LedgerError::Internal(format!(
                "decided {} of {} items",
                rows.len(),
                wave.len()
            )));
        }
        rows.iter()
            .map(|row| {
                Ok(Decision {
                    head: optional_uuid(row.try_get("head")?)?,
                    head_tombstone: row.try_get::<Option<i64>, _>("head_tombstone")? == Some(1),
                    blocked_reason: row.try_get("blocked_reason")?,
                    existing_accepted_at: row.try_get("existing_accepted_at")?,
                    owner: row.try_get("owner")?,
                    owner_removed: row.try_get::<i64, _>("owner_removed")? == 1,
                    assertions: believed(row)?,
                })
            })
            .collect()
    }

    /// Writes the accepted items of a wave inside `SAVEPOINT wave`: retain bytes, revisions,
    /// heads, then supersession, jobs, receipts and lexical passages. With a fault injector
    /// armed the four steps run as separate calls with a fault point after each; otherwise the
    /// same statements run as one call (one round trip to SQLite's thread).
    async fn write_wave(
        &mut self,
        rows: &[serde_json::Value],
        passages: &[serde_json::Value],
        contents: &[(String, usize, usize)],
        bytes: &[u8],
        validity: &ValidityRows,
        now: Micros,
    ) -> Result<()> {
        let backends: Vec<&str> = self
            .options
            .backends
            .iter()
            .filter(|backend| **backend != Backend::Graph)
            .map(|backend| backend.as_str())
            .collect();
        let parameters = WaveParameters {
            now,
            rows: json_text(rows),
            passages: json_text(passages),
            contents: json_text(contents),
            bytes,
            backends: json_text(&backends),
            validity: json_text(validity),
        };
        if !self.faults.armed() {
            parameters
                .bind(sqlx::query(steps::PARAMS), true)
                .execute(&mut self.connection)
                .await?;
            return Ok(());
        }
        sqlx::query("SAVEPOINT wave")
            .execute(&mut self.connection)
            .await?;
        let result = self.write_wave_step_by_step(&parameters).await;
        let resolution: &[&str] = if result.is_ok() {
            &["RELEASE wave"]
        } else {
            &["ROLLBACK TO wave", "RELEASE wave"]
        };
        for statement in resolution {
            if let Err(error) = sqlx::query(statement).execute(&mut self.connection).await {
                tracing::error!(%error, statement, "ledger savepoint could not be resolved");
                return Err(LedgerError::from(error));
            }
        }
        result
    }

    /// The same steps as the `accept_wave` trigger, one call each, with the fault points.
    async fn write_wave_step_by_step(&mut self, parameters: &WaveParameters<'_>) -> Result<()> {
        parameters
            .bind(sqlx::query(steps::PARAMS), false)
            .execute(&mut self.connection)
            .await?;
        let staged = [
            (steps::RETAIN, Some(FaultPoint::AfterBytes)),
            (steps::REVISIONS, Some(FaultPoint::AfterRevision)),
            (steps::HEADS, Some(FaultPoint::AfterHeadMove)),
            (steps::QUEUE, None),
            (steps::VALIDITY, None),
        ];
        for (step, point) in staged {
            sqlx::query(step).execute(&mut self.connection).await?;
            if let Some(point) = point {
                self.fault(point)?;
            }
        }
        Ok(())
    }

    async fn block(&mut self, block: ContentBlock) -> Result<()> {
        let now = self.clock.now_micros();
        sqlx::query(
            "INSERT INTO content_blocks (dataset, sha256, reason, actor, created_at) VALUES (?, ?, ?, ?, ?) \
             ON CONFLICT (dataset, sha256) DO NOTHING",
        )
        .bind(&block.dataset)
        .bind(&block.sha256)
        .bind(&block.reason)
        .bind(&block.actor)
        .bind(now)
        .execute(&mut self.connection)
        .await?;
        Ok(())
    }
}

/// The acceptance write steps. Only `accept_params.sql` takes bound parameters; it stages them
/// in the one row of `wave_params`, which the steps read. With `run_steps = 1` the temp trigger
/// `accept_wave` (the four step files as its body) runs every step inside that one `INSERT`,
/// which SQLite applies atomically: one call, one round trip to SQLite's thread. With
/// `run_steps = 0` the same files run one by one, with a fault point after each.
pub(crate) mod steps {
    pub(crate) const PARAMS: &str = include_str!("queries/accept_params.sql");
    pub(crate) const RETAIN: &str = include_str!("queries/accept_retain.sql");
    pub(crate) const REVISIONS: &str = include_str!("queries/accept_revisions.sql");
    pub(crate) const HEADS: &str = include_str!("queries/accept_move_heads.sql");
    pub(crate) const QUEUE: &str = include_str!("queries/accept_queue.sql");
    pub(crate) const VALIDITY: &str = include_str!("queries/accept_validity.sql");
    pub(crate) const TABLES: &str = include_str!("queries/wave_table.sql");

    /// The `accept_wave` trigger: every step, in order, inside the staging `INSERT`.
    pub(crate) fn trigger() -> String {
        format!(
            "CREATE TEMP TRIGGER IF NOT EXISTS accept_wave AFTER INSERT ON wave_params \
             WHEN NEW.run_steps = 1 BEGIN\n{RETAIN}\n{REVISIONS}\n{HEADS}\n{QUEUE}\n{VALIDITY}\nEND;"
        )
    }
}

/// Parameters of `accept_params.sql`: `?1` now, `?2` wave rows, `?3` passage offsets, `?4`
/// contents as `[sha256, byte_length, offset]`, `?5` backends, `?6` every content's bytes
/// end to end (one blob: no hex, no JSON string to parse), `?7` run every step, `?8` the
/// validity writes.
pub(super) struct WaveParameters<'a> {
    now: Micros,
    rows: String,
    passages: String,
    contents: String,
    backends: String,
    bytes: &'a [u8],
    validity: String,
}

impl WaveParameters<'_> {
    fn bind<'q>(
        &'q self,
        query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
        run_steps: bool,
    ) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
        query
            .bind(self.now)
            .bind(self.rows.as_str())
            .bind(self.passages.as_str())
            .bind(self.contents.as_str())
            .bind(self.backends.as_str())
            .bind(self.bytes)
            .bind(i64::from(run_steps))
            .bind(self.validity.as_str())
    }
}

/// The accepted items of a wave, as the JSON parameters of the write statements.
#[derive(Debug, Default)]
pub(super) struct Staged {
    /// Rows of `temp.wave`.
    rows: Vec<serde_json::Value>,
    /// `[position, passage_index, byte_start, byte_end, text, section, page]` per passage
    /// (`text` only for formats that extract; `null` otherwise).
    passages: Vec<serde_json::Value>,
    /// `(sha256, byte_length, offset in bytes)` per content.
    contents: Vec<(String, usize, usize)>,
    /// Every content's bytes, end to end.
    bytes: Vec<u8>,
}

impl Staged {
    fn add(
        &mut self,
        position: usize,
        item: &Prepared,
        write: &crate::acceptance::Write,
        graph: bool,
    ) {
        let kind = if write.tombstone {
            JobKind::Tombstone
        } else {
            JobKind::Project
        };
        let placement = &write.placement;
        let returns = placement.returns;
        let (sha256, byte_length, media_type, tags, metadata, reason) = match &item.change {
            PreparedChange::Put {
                document,
                sha256,
                passages,
                extracted,
                ..
            } => {
                for (index, passage) in passages.iter().enumerate() {
                    let text = extracted.as_deref().map(|text| passage.text(text));
                    self.passages.push(serde_json::json!([
                        position,
                        index,
                        passage.byte_start,
                        passage.byte_end,
                        text,
                        passage.section,
                        passage.page
                    ]));
                }
                self.contents
                    .push((sha256.clone(), document.bytes.len(), self.bytes.len()));
                self.bytes.extend_from_slice(&document.bytes);
                (
                    Some(sha256.as_str()),
                    document.bytes.len(),
                    document.media_type.as_str(),
                    json_text(&ids::canonical_tags(&document.tags)),
                    json_text(&document.metadata),
                    None,
                )
            }
            PreparedChange::Delete { reason } => (
                None,
                0,
                "application/x-tombstone",
                "[]".to_owned(),
                "{}".to_owned(),
                reason.as_deref(),
            ),
        };
        self.rows.push(serde_json::json!({
            "position": position,
            "dataset": item.dataset,
            "source_key": item.source_key,
            "revision_id": write.revision_id.to_string(),
            "new_revision": i64::from(write.new_revision),
            "tombstone": i64::from(write.tombstone),
            "sha256": sha256,
            "byte_length": byte_length,
            "media_type": media_type,
            "tags": tags,
            "metadata": metadata,
            "previous_revision_id": write.previous.map(|id| id.to_string()),
            "actor": item.actor,
            "owner": item.owner,
            "bucket": crate::verify::bucket(&item.dataset, &item.source_key),
            "reason": reason,
            "cause": write.cause,
            "job_id": write.job_id.to_string(),
            "kind": kind.as_str(),
            "graph_job_id": (graph && !placement.historical).then(|| ids::new_v7().to_string()),
            "moves_head": i64::from(placement.moves_head),
            "run_at": placement.run_at,
            "valid_from": write.assertion.period.from,
            "valid_to": write.assertion.period.to,
            "job_state": if placement.historical { "superseded" } else { "pending" },
            "return_job_id": returns.map(|back| back.job_id.to_string()),
            "return_revision_id": returns.map(|back| back.revision_id.to_string()),
            "return_at": returns.map(|back| back.at),
            "return_graph_job_id": returns.filter(|_| graph).map(|_| ids::new_v7().to_string()),
        }));
    }
}

pub(super) fn duplicate_from_row(row: &SqliteRow) -> Result<Acceptance> {
    let job_id: Option<String> = row.try_get("job_id")?;
    let revision_id = parse_uuid(&row.try_get::<String, _>("id")?)?;
    let job_id =
        job_id.ok_or_else(|| LedgerError::Corrupt(format!("revision {revision_id} has no job")))?;
    Ok(Acceptance {
        accepted: true,
        status: AcceptStatus::Duplicate,
        dataset: row.try_get("dataset")?,
        source_key: row.try_get("source_key")?,
        source_revision_id: revision_id,
        projection_job_id: parse_uuid(&job_id)?,
        content_sha256: row.try_get("content_sha256")?,
        byte_length: row.try_get("byte_length")?,
        accepted_at: row.try_get("accepted_at")?,
        previous_revision_id: optional_uuid(row.try_get("previous_revision_id")?)?,
        tombstone: row.try_get::<i64, _>("tombstone")? == 1,
    })
}

/// What the decision row says the ledger believes about the item's validity.
fn believed(row: &SqliteRow) -> Result<crate::acceptance::Believed> {
    let rows: Option<String> = row.try_get("believed")?;
    let rows: Vec<crate::acceptance::BelievedRow> = match rows {
        Some(text) => serde_json::from_str(&text).map_err(|error| {
            LedgerError::Corrupt(format!("believed validity rectangles: {error}"))
        })?,
        None => Vec::new(),
    };
    Ok(crate::acceptance::Believed::from_rows(
        row.try_get("last_seq")?,
        row.try_get("last_recorded_at")?,
        rows,
    ))
}
