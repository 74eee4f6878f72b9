//! Acceptance on PostgreSQL. Callers hand their prepared submissions to a few committer tasks;
//! each takes whatever is queued (up to `max_wave` submissions) and commits it in one
//! transaction (group commit: concurrent requests share the transaction's statements and its
//! WAL flush), then answers every caller. A transaction locks the submissions' sources
//! (transaction-scoped advisory locks, taken in key order in one statement, so concurrent
//! batches never deadlock and a later submission for a source sees the earlier one's head),
//! then decides and writes in waves in which no two items share a source, each wave inside a
//! savepoint. The receipt is returned only after `COMMIT` (with `synchronous_commit = on`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{PgConnection, Row};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::tsvector::TsVector;
use super::PostgresLedger;
use crate::acceptance::{
    self, classify, Believed, BelievedRow, Decision, Outcome, Prepared, PreparedChange,
    ValidityRows, Write,
};
use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::faults::FaultPoint;
use crate::ids;
use crate::ledger::Acceptor;
use crate::model::{AcceptStatus, Acceptance, Backend, ContentBlock, JobKind, Submission};
use crate::validate;

/// The advisory lock key of a source: the first 8 bytes of the SHA-256 of `dataset/key`.
pub(super) fn source_lock(dataset: &str, source_key: &str) -> i64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{dataset}/{source_key}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(bytes)
}

/// Items per part when a large submission is committed in parts, side by side, and the size
/// at which a committer stops adding queued requests to its group.
const PARALLEL_PART: usize = 256;

/// Prepared submissions and where their answers go.
pub(super) type AcceptRequest = (
    Vec<Prepared>,
    oneshot::Sender<Result<Vec<Result<Acceptance>>>>,
);

/// The acceptance groups in flight, shared by the committers.
#[derive(Default)]
pub(super) struct Flight {
    /// Submissions in groups being written now.
    items: std::sync::atomic::AtomicUsize,
    /// Signalled whenever a group ends.
    ended: tokio::sync::Notify,
}

/// The longest a committer holds a group back to let it grow (see [`commit_acceptances`]).
/// Measured with `cairn bench accept --ledger postgres://...` (16 clients): 2 ms gave 1.06x
/// the groups' old rate, 5 ms 1.1x to 1.2x, 10 ms no more than 5 ms.
const MAX_GATHER: std::time::Duration = std::time::Duration::from_millis(5);

/// A committer: takes everything queued (up to `max_wave` submissions), commits it in one
/// transaction and answers each caller with its own items' results. Stops when every sender
/// is gone.
///
/// While another group is being written, a group smaller than that one waits (up to
/// [`MAX_GATHER`]) for more requests, or for that group to end: groups of many concurrent
/// single-document requests then come out about half the requests in flight each, two at a
/// time, instead of one or two documents each, and every group pays the fixed cost of a
/// transaction (five round trips, statement start-ups, triggers, the commit) once for more
/// documents. A lone request, with nothing being written, goes at once.
pub(super) async fn commit_acceptances(
    ledger: PostgresLedger,
    receiver: Arc<tokio::sync::Mutex<mpsc::Receiver<AcceptRequest>>>,
    flight: Arc<Flight>,
) {
    use std::sync::atomic::Ordering;
    // A group stops growing at a part's worth of items, so under a heavy load (or a large
    // batch cut into parts) the next committer takes the rest and commits beside this one.
    let limit = ledger.options.max_wave.clamp(1, PARALLEL_PART);
    loop {
        let (group, weight) = {
            let mut receiver = receiver.lock().await;
            let Some(first) = receiver.recv().await else {
                break;
            };
            let deadline = tokio::time::Instant::now() + MAX_GATHER;
            let mut weight = first.0.len();
            let mut group = vec![first];
            let mut open = true;
            loop {
                while weight < limit {
                    match receiver.try_recv() {
                        Ok(request) => {
                            weight += request.0.len();
                            group.push(request);
                        }
                        Err(_) => break,
                    }
                }
                let ended = flight.ended.notified();
                tokio::pin!(ended);
                ended.as_mut().enable();
                let writing = flight.items.load(Ordering::Acquire);
                if !open || weight >= limit || weight >= writing {
                    break;
                }
                tokio::select! {
                    request = receiver.recv() => match request {
                        Some(request) => {
                            weight += request.0.len();
                            group.push(request);
                        }
                        None => open = false,
                    },
                    () = &mut ended => {}
                    () = tokio::time::sleep_until(deadline) => break,
                }
            }
            flight.items.fetch_add(weight, Ordering::AcqRel);
            (group, weight)
        };
        let mut items = Vec::new();
        let mut shapes = Vec::with_capacity(group.len());
        for (prepared, reply) in group {
            shapes.push((prepared.len(), reply));
            items.extend(prepared);
        }
        let submissions = items.len();
        let requests = shapes.len();
        let started = std::time::Instant::now();
        match ledger.accept_prepared(items).await {
            Ok(results) => {
                let mut results = results.into_iter();
                for (count, reply) in shapes {
                    let _ = reply.send(Ok(results.by_ref().take(count).collect()));
                }
            }
            Err(error) => {
                for (_, reply) in shapes {
                    let _ = reply.send(Err(error.replicate()));
                }
            }
        }
        flight.items.fetch_sub(weight, Ordering::AcqRel);
        flight.ended.notify_waiters();
        tracing::debug!(
            requests,
            submissions,
            elapsed_us = started.elapsed().as_micros() as u64,
            "ledger group commit"
        );
    }
}

#[async_trait]
impl Acceptor for PostgresLedger {
    async fn accept(&self, submissions: Vec<Submission>) -> Vec<Result<Acceptance>> {
        acceptance::accept_with(submissions, |prepared| async move {
            let Some(sender) = &self.accepts else {
                return self.accept_prepared(prepared).await;
            };
            // A large submission is cut into parts by source (every item of a source in one
            // part, in order), and the parts commit side by side on different committers:
            // PostgreSQL then writes a batch with more than one backend. Items are independent
            // receipts, so nothing but per-source order is owed, and that is kept.
            let parts = (prepared.len() / PARALLEL_PART)
                .min(self.options.committers)
                .max(1);
            let count = prepared.len();
            let mut split: Vec<(Vec<usize>, Vec<Prepared>)> =
                (0..parts).map(|_| (Vec::new(), Vec::new())).collect();
            for (position, item) in prepared.into_iter().enumerate() {
                let part =
                    source_lock(&item.dataset, &item.source_key).unsigned_abs() as usize % parts;
                split[part].0.push(position);
                split[part].1.push(item);
            }
            let mut answers = Vec::with_capacity(parts);
            for (positions, items) in split {
                let (reply, answer) = oneshot::channel();
                sender.send((items, reply)).await.map_err(|_| {
                    LedgerError::Unavailable("the ledger's committers stopped".into())
                })?;
                answers.push((positions, answer));
            }
            let mut results: Vec<Option<Result<Acceptance>>> = (0..count).map(|_| None).collect();
            for (positions, answer) in answers {
                let written = answer.await.map_err(|_| {
                    LedgerError::Unavailable("the ledger's committer stopped mid-write".into())
                })??;
                for (position, result) in positions.into_iter().zip(written) {
                    results[position] = Some(result);
                }
            }
            Ok(acceptance::filled(results))
        })
        .await
    }

    async fn erase(&self, request: crate::model::ErasureRequest) -> Result<Acceptance> {
        self.erase_source(request).await
    }

    async fn block_content(&self, block: ContentBlock) -> Result<()> {
        validate::content_block(&block)?;
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        sqlx::query(
            "INSERT INTO content_blocks (dataset, sha256, reason, actor, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (dataset, sha256) DO NOTHING",
        )
        .bind(&block.dataset)
        .bind(&block.sha256)
        .bind(&block.reason)
        .bind(&block.actor)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn change_access(&self, change: crate::access::AccessChange) -> Result<()> {
        let started = std::time::Instant::now();
        let observed = change.clone();
        let result = async {
            // Journalled before it is committed: a restore from an older backup makes it
            // again.
            if let Some(writer) = self.journal_writer() {
                let now = self.now_outside().await?;
                writer
                    .append(crate::journal::JournalEntry::access(&change, now))
                    .await?;
            }
            let mut tx = self.pool.begin().await?;
            let now = self.now(&mut tx).await?;
            let attempts = self.options.job_policies.access.max_attempts;
            super::access::change(&mut tx, change, now, attempts).await?;
            tx.commit().await?;
            Ok(())
        }
        .await;
        crate::access::observe(&observed, started, result.is_ok());
        result
    }
}

impl PostgresLedger {
    async fn accept_prepared(&self, items: Vec<Prepared>) -> Result<Vec<Result<Acceptance>>> {
        let mut tx = self.pool.begin().await?;
        let mut locks: Vec<i64> = items
            .iter()
            .map(|item| source_lock(&item.dataset, &item.source_key))
            .collect();
        locks.sort_unstable();
        locks.dedup();
        // The locks, then the clock, in one round trip: the clock is read once every lock is
        // held (the subquery runs first).
        let now: Micros = sqlx::query_scalar(
            "SELECT COALESCE($2, cairn_db_now()) FROM \
               (SELECT count(pg_advisory_xact_lock(k)) FROM unnest($1::bigint[]) AS k) AS locked",
        )
        .bind(&locks)
        .bind(self.injected_now())
        .fetch_one(&mut *tx)
        .await?;

        let mut results: Vec<Option<Result<Acceptance>>> = (0..items.len()).map(|_| None).collect();
        let mut pending: Vec<(usize, Prepared)> = items.into_iter().enumerate().collect();
        let mut queued = false;
        while !pending.is_empty() {
            let mut sources = HashSet::new();
            let mut wave = Vec::new();
            let mut later = Vec::new();
            for (position, item) in pending {
                if wave.len() < self.options.max_wave.max(1)
                    && sources.insert((item.dataset.clone(), item.source_key.clone()))
                {
                    wave.push((position, item));
                } else {
                    later.push((position, item));
                }
            }
            let (positions, wave): (Vec<usize>, Vec<Prepared>) = wave.into_iter().unzip();
            // A wave that is the whole transaction needs no savepoint (two round trips): if it
            // fails, the transaction is rolled back and every item gets the error.
            let whole = later.is_empty() && results.iter().all(Option::is_none);
            if !whole {
                sqlx::query("SAVEPOINT wave").execute(&mut *tx).await?;
            }
            let outcome = self.accept_wave(&mut tx, &wave, now).await;
            let outcomes = match outcome {
                Ok(outcomes) => {
                    if !whole {
                        sqlx::query("RELEASE SAVEPOINT wave")
                            .execute(&mut *tx)
                            .await?;
                    }
                    outcomes
                }
                Err(error) if whole => {
                    tx.rollback().await?;
                    tracing::error!(%error, items = wave.len(), "acceptance failed; its writes were rolled back");
                    return Ok(wave.iter().map(|_| Err(error.replicate())).collect());
                }
                Err(error) => {
                    sqlx::query("ROLLBACK TO SAVEPOINT wave")
                        .execute(&mut *tx)
                        .await?;
                    tracing::error!(%error, items = wave.len(), "acceptance wave failed; its writes were rolled back");
                    wave.iter().map(|_| Err(error.replicate())).collect()
                }
            };
            for (position, outcome) in positions.into_iter().zip(outcomes) {
                queued |= matches!(&outcome, Ok(acceptance) if acceptance.status == AcceptStatus::QueuedNotConfirmed);
                results[position] = Some(outcome);
            }
            pending = later;
        }
        // Every wave that queued a job notified `cairn_work` in its write statement ([`WRITE`]):
        // delivered to every listening process when (and only if) this commits.
        if self.faults.fire(FaultPoint::BeforeCommit) {
            tx.rollback().await?;
            return Err(LedgerError::Injected(FaultPoint::BeforeCommit));
        }
        if let Err(error) = tx.commit().await {
            tracing::error!(%error, "ledger commit failed; the whole acceptance was rolled back");
            return Err(LedgerError::Unavailable(format!("commit failed: {error}")));
        }
        if queued {
            self.work_signal.notify_waiters();
        }
        Ok(acceptance::filled(results))
    }

    async fn accept_wave(
        &self,
        tx: &mut PgConnection,
        wave: &[Prepared],
        now: Micros,
    ) -> Result<Vec<Result<Acceptance>>> {
        let mut decisions = decide(tx, wave).await?;
        for (decision, believed) in decisions.iter_mut().zip(believed(tx, wave).await?) {
            decision.assertions = believed;
        }
        let outcomes: Vec<Outcome> = wave
            .iter()
            .zip(decisions)
            .map(|(item, decision)| classify(item, decision, now))
            .collect();

        let duplicates: Vec<Uuid> = outcomes
            .iter()
            .filter_map(|outcome| match outcome {
                Outcome::Duplicate(id, _) => Some(*id),
                _ => None,
            })
            .collect();
        let mut duplicate_receipts = HashMap::new();
        if !duplicates.is_empty() {
            let rows = planned(
                "SELECT r.id, r.dataset, r.source_key, r.content_sha256, r.byte_length, \
                   r.accepted_at, r.previous_revision_id, r.tombstone, \
                   (SELECT j.id FROM jobs j WHERE j.revision_id = r.id AND j.kind <> 'graph' \
                     ORDER BY j.created_at DESC, j.id DESC LIMIT 1) AS job_id \
                 FROM revisions r WHERE r.id = ANY($1)",
            )
            .bind(&duplicates)
            .fetch_all(&mut *tx)
            .await?;
            for row in rows {
                let revision_id: Uuid = row.try_get("id")?;
                let job_id: Option<Uuid> = row.try_get("job_id")?;
                let job_id = job_id.ok_or_else(|| {
                    LedgerError::Corrupt(format!("revision {revision_id} has no job"))
                })?;
                duplicate_receipts.insert(
                    revision_id,
                    Acceptance {
                        accepted: true,
                        status: AcceptStatus::Duplicate,
                        dataset: row.try_get("dataset")?,
                        source_key: row.try_get("source_key")?,
                        source_revision_id: revision_id,
                        projection_job_id: job_id,
                        content_sha256: row.try_get("content_sha256")?,
                        byte_length: row.try_get("byte_length")?,
                        accepted_at: row.try_get("accepted_at")?,
                        previous_revision_id: row.try_get("previous_revision_id")?,
                        tombstone: row.try_get("tombstone")?,
                    },
                );
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
        if !staged.wave.position.is_empty() {
            self.write_wave(tx, &staged, now).await?;
        }
        let validity = ValidityRows::of(wave, &outcomes);
        if !validity.is_empty() {
            write_validity(tx, &validity).await?;
        }
        // The readers an accepted put names, in the same transaction: a refused put changes
        // nobody's access.
        for (item, outcome) in wave.iter().zip(&outcomes) {
            if matches!(outcome, Outcome::Refused(_)) {
                continue;
            }
            if let Some(change) = item.access_change() {
                let attempts = self.options.job_policies.access.max_attempts;
                super::access::change(tx, change, now, attempts).await?;
            }
        }

        Ok(wave
            .iter()
            .zip(outcomes)
            .map(|(item, outcome)| crate::acceptance::answer(item, outcome, &duplicate_receipts))
            .collect())
    }

    /// Writes a wave's accepted items. What the previous heads leave goes first (their
    /// unfinished jobs are superseded, their passages deleted: statements planned for the
    /// wave, since they read the tables by its keys); then one statement writes everything
    /// new: bytes, revisions, heads, jobs (graph jobs too) and receipts, passages, and the
    /// wake-up ([`WRITE`]). One statement instead of six saves their round trips, executor
    /// start-ups and trigger queues; the foreign keys between the rows it writes are checked
    /// at its end. The fault points of the first three steps fire after it.
    async fn write_wave(&self, tx: &mut PgConnection, staged: &Staged, now: Micros) -> Result<()> {
        let counted = wave_relation(Some(staged.wave.position.len()));
        // Supersede the previous heads' unfinished jobs and their open receipts. A claim may
        // commit between this transaction's clock read and this statement (the row lock makes
        // it wait): the supersession is then stamped no earlier than the claim, so every job's
        // history runs forward in time, and a job that ended meanwhile is left alone (the state
        // is checked again on the row it waited for). An erasure's jobs are never superseded:
        // they erase the stores whatever comes next.
        if staged.moves_heads {
            bind_wave(&staged.wave, planned(&format!(
                "WITH gone AS ( \
                   SELECT j.id, w.actor, 'superseded_by:' || w.revision_id AS cause \
                   FROM {counted} JOIN jobs j ON j.dataset = w.dataset AND j.source_key = w.source_key \
                   WHERE j.state IN ('pending', 'running', 'retry_wait') \
                     AND CASE WHEN w.moves_head THEN j.state <> 'pending' OR j.run_at < w.valid_to \
                              ELSE j.state = 'pending' AND j.run_at > $20 \
                                   AND j.run_at >= w.valid_from AND j.run_at < w.valid_to END \
                     AND NOT EXISTS (SELECT 1 FROM erasures e WHERE e.revision_id = j.revision_id)), \
                 receipts AS ( \
                   UPDATE projection_receipts r SET state = 'superseded', \
                     updated_at = GREATEST($20, r.changed_at), \
                     changed_by = gone.actor, change_cause = gone.cause, \
                     changed_at = GREATEST($20, r.changed_at), \
                     change_seq = r.change_seq + 1 \
                   FROM gone WHERE r.job_id = gone.id AND r.state IN ('pending', 'running', 'written')) \
                 UPDATE jobs j SET state = 'superseded', lease_id = NULL, lease_owner = NULL, \
                   lease_expires_at = NULL, changed_by = gone.actor, change_cause = gone.cause, \
                   changed_at = GREATEST($20, j.changed_at), change_seq = j.change_seq + 1 \
                 FROM gone WHERE j.id = gone.id \
                   AND j.state IN ('pending', 'running', 'retry_wait')"
            )))
            .bind(now)
            .execute(&mut *tx)
            .await?;
            // The lexical index follows the heads: a source's passages are replaced whole.
            bind_wave(
                &staged.wave,
                planned(&format!(
                    "DELETE FROM passages p USING {counted} \
                     WHERE p.dataset = w.dataset AND p.source_key = w.source_key AND w.moves_head"
                )),
            )
            .execute(&mut *tx)
            .await?;
        }
        let revisions = &staged.revisions;
        bind_wave(&staged.wave, cached(&WRITE))
            .bind(now)
            .bind(&*self.policies_json)
            .bind(
                // A `project` or `tombstone` job's backends; the graph has jobs of its own.
                self.options
                    .backends
                    .iter()
                    .filter(|backend| **backend != Backend::Graph)
                    .map(|backend| backend.as_str().to_owned())
                    .collect::<Vec<_>>(),
            )
            .bind(&staged.content_sha256)
            .bind(&staged.content_lengths)
            .bind(&staged.content_bytes)
            .bind(&revisions.id)
            .bind(&revisions.dataset)
            .bind(&revisions.source_key)
            .bind(&revisions.sha256)
            .bind(&revisions.byte_length)
            .bind(&revisions.media_type)
            .bind(&revisions.tags)
            .bind(&revisions.metadata)
            .bind(&revisions.tombstone)
            .bind(&revisions.previous)
            .bind(&revisions.actor)
            .bind(&revisions.reason)
            .bind(&staged.passage_positions)
            .bind(&staged.passage_indexes)
            .bind(&staged.passage_starts)
            .bind(&staged.passage_ends)
            .bind(&staged.passage_words)
            .bind(&staged.passage_texts)
            .bind(&staged.passage_sections)
            .bind(&staged.passage_pages)
            .bind(&staged.owner_positions)
            .bind(&staged.owners)
            .execute(&mut *tx)
            .await?;
        self.fault(FaultPoint::AfterBytes)?;
        self.fault(FaultPoint::AfterRevision)?;
        self.fault(FaultPoint::AfterHeadMove)?;
        Ok(())
    }
}

/// Everything new a wave writes, in one statement (data-modifying CTEs; all of them run to
/// completion whatever the main query reads): the wave is `$1` to `$19` ([`bind_wave`]), the
/// clock `$20`, the job policies `$21`, a job's backends `$22`, the bytes `$23` to `$25`, the new
/// revisions `$26` to `$37`, the passages `$38` to `$45`, the owners `$46` and `$47`. An item
/// that does not move the head ([`crate::acceptance::Placement`]: scheduled from a later
/// instant, or history only) keeps its passages in `past_passages` until the head moves to it;
/// its jobs wait for its `run_at` (a history-only item's job is superseded at once); a bounded
/// period that holds now or later queues the return of the revision holding after it. The sub-statements share one snapshot,
/// so the supersession and the passage deletion ran before, and none of them reads another's
/// rows except through `RETURNING`; the foreign keys (revision to bytes, head, job and passage
/// to revision, receipt to job) are checked at the statement's end, when every row is there.
/// A job that is the receipt's names the active generation; every other live generation (one
/// being built, or a former active one kept for rollback) gets a job of its own, with a
/// receipt per backend it holds; with the graph as a backend, an item's graph job (its
/// `graph_job_id`, NULL otherwise) has a receipt of its own. The head move takes `sources` in ROW EXCLUSIVE mode before
/// the statement's snapshot is taken, so the jobs see the generations as a concurrent
/// generation change left them (`postgres::generations`). `pg_notify` runs once if any job is
/// queued, and is delivered only if the transaction commits.
static WRITE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let wave = wave_relation(None);
    let channel = super::WORK_CHANNEL;
    format!(
        "WITH policy AS (SELECT * FROM jsonb_to_recordset($21::jsonb) \
                         AS p(kind text, max_attempts bigint)), \
         stored AS ( \
           INSERT INTO contents (sha256, byte_length, bytes, created_at) \
           SELECT c.sha256, c.byte_length, c.bytes, $20 \
           FROM unnest($23::text[], $24::bigint[], $25::bytea[]) AS c(sha256, byte_length, bytes) \
           ON CONFLICT (sha256) DO NOTHING), \
         revised AS ( \
           INSERT INTO revisions (id, dataset, source_key, content_sha256, byte_length, \
             media_type, tags, metadata, tombstone, previous_revision_id, actor, reason, \
             accepted_at) \
           SELECT r.*, $20 \
           FROM unnest($26::uuid[], $27::text[], $28::text[], $29::text[], $30::bigint[], \
                       $31::text[], $32::jsonb[], $33::jsonb[], $34::boolean[], $35::uuid[], \
                       $36::text[], $37::text[]) AS r), \
         moved AS ( \
           INSERT INTO sources AS s (dataset, source_key, head_revision_id, created_at, \
             changed_by, change_cause, changed_at, change_seq, owner) \
           SELECT dataset, source_key, revision_id, $20, actor, cause, $20, 1, \
             (SELECT o.owner FROM unnest($46::bigint[], $47::text[]) AS o(position, owner) \
              WHERE o.position = w.position) FROM {wave} WHERE w.moves_head \
           ON CONFLICT (dataset, source_key) DO UPDATE SET \
             head_revision_id = excluded.head_revision_id, owner = excluded.owner, \
             changed_by = excluded.changed_by, \
             change_cause = excluded.change_cause, changed_at = excluded.changed_at, \
             change_seq = s.change_seq + 1), \
         indexed AS ( \
           INSERT INTO passages (dataset, source_key, revision_id, passage_index, byte_start, \
             byte_end, words, text, section, page) \
           SELECT w.dataset, w.source_key, w.revision_id, p.passage_index, p.byte_start, \
             p.byte_end, p.words, p.text, p.section, p.page \
           FROM unnest($38::bigint[], $39::bigint[], $40::bigint[], $41::bigint[], \
                       $42::tsvector[], $43::text[], $44::text[], $45::bigint[]) \
                  AS p(position, passage_index, byte_start, byte_end, words, text, section, \
                       page) \
           JOIN {wave} ON w.position = p.position \
           WHERE NOT w.tombstone AND w.moves_head), \
         archived AS ( \
           INSERT INTO past_passages (dataset, source_key, revision_id, passage_index, \
             byte_start, byte_end, words, text, section, page) \
           SELECT w.dataset, w.source_key, w.revision_id, p.passage_index, p.byte_start, \
             p.byte_end, p.words, p.text, p.section, p.page \
           FROM unnest($38::bigint[], $39::bigint[], $40::bigint[], $41::bigint[], \
                       $42::tsvector[], $43::text[], $44::text[], $45::bigint[]) \
                  AS p(position, passage_index, byte_start, byte_end, words, text, section, \
                       page) \
           JOIN {wave} ON w.position = p.position \
           WHERE NOT w.tombstone AND NOT w.moves_head \
           ON CONFLICT (revision_id, passage_index) DO NOTHING), \
         queued AS ( \
           INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, attempt, \
             max_attempts, run_at, run_at_rule, created_at, changed_by, change_cause, changed_at, \
             generation) \
           SELECT w.job_id, w.revision_id, w.dataset, w.source_key, w.kind, w.job_state, 0, \
             p.max_attempts, w.run_at, \
             CASE WHEN w.run_at > $20 THEN 'scheduled: its validity starts then' ELSE 'accepted' END, $20, w.actor, w.cause, $20, \
             (SELECT id FROM generations WHERE state = 'active') \
           FROM {wave} JOIN policy p ON p.kind = w.kind \
           RETURNING id, state, changed_by, change_cause), \
         returns_queued AS ( \
           INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, attempt, \
             max_attempts, run_at, run_at_rule, created_at, changed_by, change_cause, changed_at, \
             generation) \
           SELECT w.return_job_id, w.return_revision_id, w.dataset, w.source_key, \
             CASE WHEN r.tombstone THEN 'tombstone' ELSE 'project' END, 'pending', 0, \
             p.max_attempts, w.return_at, 'scheduled: a bounded validity ends then', $20, w.actor, \
             'validity_returns', $20, \
             (SELECT id FROM generations WHERE state = 'active') \
           FROM {wave} JOIN revisions r ON r.id = w.return_revision_id \
           JOIN policy p ON p.kind = CASE WHEN r.tombstone THEN 'tombstone' ELSE 'project' END \
           WHERE w.return_job_id IS NOT NULL \
           RETURNING id, state, changed_by, change_cause), \
         returns_graph AS ( \
           INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, attempt, \
             max_attempts, run_at, run_at_rule, created_at, changed_by, change_cause, changed_at) \
           SELECT w.return_graph_job_id, w.return_revision_id, w.dataset, w.source_key, \
             'graph', 'pending', 0, p.max_attempts, w.return_at, \
             'scheduled: a bounded validity ends then', $20, w.actor, \
             'validity_returns', $20 \
           FROM {wave} JOIN policy p ON p.kind = 'graph' \
           WHERE w.return_graph_job_id IS NOT NULL \
           RETURNING id, changed_by, change_cause), \
         returns_graph_receipts AS ( \
           INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, \
             change_cause, changed_at) \
           SELECT q.id, 'graph', 'pending', $20, q.changed_by, q.change_cause, $20 \
           FROM returns_graph q), \
         beside AS ( \
           INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, attempt, \
             max_attempts, run_at, run_at_rule, created_at, changed_by, change_cause, changed_at, \
             generation) \
           SELECT gen_random_uuid(), w.revision_id, w.dataset, w.source_key, w.kind, \
             'pending', 0, p.max_attempts, w.run_at, \
             CASE WHEN w.run_at > $20 THEN 'scheduled: its validity starts then' ELSE 'accepted' END, $20, w.actor, w.cause, $20, g.id \
           FROM {wave} JOIN policy p ON p.kind = w.kind \
           CROSS JOIN generations g WHERE g.state IN ('building', 'standby') \
             AND w.job_state = 'pending' \
           RETURNING id, changed_by, change_cause, generation), \
         beside_receipts AS ( \
           INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, \
             change_cause, changed_at) \
           SELECT q.id, b.value, 'pending', $20, q.changed_by, q.change_cause, $20 \
           FROM beside q JOIN generations g ON g.id = q.generation \
           CROSS JOIN jsonb_array_elements_text(g.backends) AS b(value) \
           WHERE b.value <> 'graph'), \
         graphed AS ( \
           INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, attempt, \
             max_attempts, run_at, run_at_rule, created_at, changed_by, change_cause, changed_at) \
           SELECT w.graph_job_id, w.revision_id, w.dataset, w.source_key, 'graph', \
             'pending', 0, p.max_attempts, w.run_at, \
             CASE WHEN w.run_at > $20 THEN 'scheduled: its validity starts then' ELSE 'accepted' END, $20, w.actor, w.cause, $20 \
           FROM {wave} JOIN policy p ON p.kind = 'graph' \
           WHERE w.graph_job_id IS NOT NULL \
           RETURNING id, changed_by, change_cause), \
         graph_receipts AS ( \
           INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, \
             change_cause, changed_at) \
           SELECT q.id, 'graph', 'pending', $20, q.changed_by, q.change_cause, $20 \
           FROM graphed q), \
         woken AS (SELECT pg_notify('{channel}', '') FROM (SELECT 1 FROM queued LIMIT 1) AS one) \
         INSERT INTO projection_receipts (job_id, backend, state, updated_at, changed_by, \
           change_cause, changed_at) \
         SELECT q.id, b.backend, q.state, $20, q.changed_by, q.change_cause, $20 \
         FROM (SELECT * FROM queued UNION ALL SELECT * FROM returns_queued) q \
         CROSS JOIN unnest($22::text[]) AS b(backend) \
         WHERE (SELECT count(*) FROM woken) >= 0"
    )
});

/// The wave's rows (the nineteen arrays `$1` to `$19` that [`bind_wave`] binds) as a relation
/// named `w`. Typed arrays arrive in binary and cost the server a copy (a JSON array of row
/// objects was parsed again by every statement). A statement's own parameters start at `$20`.
///
/// With `Some(rows)`, for statements that read the tables by the wave's keys: a `LIMIT` of the
/// exact row count (so it never cuts) is how the planner learns the count. A set-returning
/// function is otherwise assumed to return 100 rows, and for 100 keys a hash join over a whole
/// table (passages, jobs) looked cheaper than 100 index probes; planned with the real count, a
/// wave of a few items probes the indexes. With `None`, for inserts, whose plans do not depend
/// on the count: one text for every wave, so one cached statement.
fn wave_relation(rows: Option<usize>) -> String {
    let limit = rows
        .map(|rows| format!(" LIMIT {rows}"))
        .unwrap_or_default();
    format!(
        "(SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::uuid[], \
         $5::boolean[], $6::text[], $7::text[], $8::uuid[], $9::text[], $10::uuid[], \
         $11::bigint[], $12::boolean[], $13::bigint[], $14::bigint[], $15::text[], \
         $16::uuid[], $17::uuid[], $18::bigint[], $19::uuid[]) \
         AS r(position, dataset, source_key, revision_id, tombstone, actor, cause, job_id, \
         kind, graph_job_id, run_at, moves_head, valid_from, valid_to, job_state, \
         return_job_id, return_revision_id, return_at, return_graph_job_id){limit}) AS w"
    )
}

/// Binds the wave's columns as `$1` to `$19`, in [`wave_relation`]'s order.
fn bind_wave<'q>(
    wave: &'q WaveColumns,
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    query
        .bind(&wave.position)
        .bind(&wave.dataset)
        .bind(&wave.source_key)
        .bind(&wave.revision_id)
        .bind(&wave.tombstone)
        .bind(&wave.actor)
        .bind(&wave.cause)
        .bind(&wave.job_id)
        .bind(&wave.kind)
        .bind(&wave.graph_job_id)
        .bind(&wave.run_at)
        .bind(&wave.moves_head)
        .bind(&wave.valid_from)
        .bind(&wave.valid_to)
        .bind(&wave.job_state)
        .bind(&wave.return_job_id)
        .bind(&wave.return_revision_id)
        .bind(&wave.return_at)
        .bind(&wave.return_graph_job_id)
}

/// What the ledger holds for each item of a wave, in wave order.
async fn decide(tx: &mut PgConnection, wave: &[Prepared]) -> Result<Vec<Decision>> {
    let mut datasets = Vec::with_capacity(wave.len());
    let mut keys = Vec::with_capacity(wave.len());
    let mut hashes: Vec<Option<String>> = Vec::with_capacity(wave.len());
    let mut revisions: Vec<Option<Uuid>> = Vec::with_capacity(wave.len());
    for item in wave {
        datasets.push(item.dataset.clone());
        keys.push(item.source_key.clone());
        match &item.change {
            PreparedChange::Put {
                sha256,
                revision_id,
                ..
            } => {
                hashes.push(Some(sha256.clone()));
                revisions.push(Some(*revision_id));
            }
            PreparedChange::Delete { .. } => {
                hashes.push(None);
                revisions.push(None);
            }
        }
    }
    // `cairn_decide` (migration 11) keeps its plan, one that cannot go stale.
    let rows = cached("SELECT * FROM cairn_decide($1, $2, $3, $4)")
        .bind(&datasets)
        .bind(&keys)
        .bind(&hashes)
        .bind(&revisions)
        .fetch_all(&mut *tx)
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
                head: row.try_get("head")?,
                head_tombstone: row.try_get::<Option<bool>, _>("head_tombstone")? == Some(true),
                blocked_reason: row.try_get("blocked_reason")?,
                existing_accepted_at: row.try_get("existing_accepted_at")?,
                owner: row.try_get("owner")?,
                owner_removed: row.try_get::<Option<bool>, _>("owner_removed")? == Some(true),
                assertions: Default::default(),
            })
        })
        .collect()
}

/// What the ledger believes about each item's validity (`receipts::validity`), in wave order:
/// the source's last assertion and its believed rectangles.
async fn believed(tx: &mut PgConnection, wave: &[Prepared]) -> Result<Vec<Believed>> {
    let datasets: Vec<&str> = wave.iter().map(|item| item.dataset.as_str()).collect();
    let keys: Vec<&str> = wave.iter().map(|item| item.source_key.as_str()).collect();
    // `cairn_believed` (migration 19) keeps its plan: no planning per wave.
    let rows = cached("SELECT * FROM cairn_believed($1, $2)")
        .bind(&datasets)
        .bind(&keys)
        .fetch_all(&mut *tx)
        .await?;
    rows.iter()
        .map(|row| {
            let believed: String = row.try_get("believed")?;
            let rectangles: Vec<BelievedRow> =
                serde_json::from_str(&believed).map_err(|error| {
                    LedgerError::Corrupt(format!("believed validity rectangles: {error}"))
                })?;
            Ok(Believed::from_rows(
                row.try_get("last_seq")?,
                row.try_get("last_recorded_at")?,
                rectangles,
            ))
        })
        .collect()
}

/// Writes a wave's validity rows ([`ValidityRows`], in its order), each list as one statement
/// over its JSON.
async fn write_validity(tx: &mut PgConnection, rows: &ValidityRows) -> Result<()> {
    fn json(value: &impl serde::Serialize) -> Result<serde_json::Value> {
        serde_json::to_value(value)
            .map_err(|error| LedgerError::Internal(format!("encoding validity rows: {error}")))
    }
    // Inserts of the wave's own rows: their plans cannot depend on what the tables hold, so
    // they are prepared once per connection (no planning per wave).
    cached(
        "INSERT INTO assertions (id, dataset, source_key, seq, revision_id, valid_from, valid_to, \
           recorded_at, actor, cause) \
         SELECT id, dataset, source_key, seq, revision_id, valid_from, valid_to, recorded_at, \
           actor, cause \
         FROM jsonb_to_recordset($1) AS a(id uuid, dataset text, source_key text, seq bigint, \
           revision_id uuid, valid_from bigint, valid_to bigint, recorded_at bigint, actor text, \
           cause text)",
    )
    .bind(json(&rows.assertions)?)
    .execute(&mut *tx)
    .await?;
    if !rows.close.is_empty() {
        // Two arrays, not a JSON list: planned with the wave's values, `unnest` is estimated
        // at the wave's size, so each rectangle is probed by key. Over `jsonb_array_elements`
        // (estimated at 100 rows) the planner hashed the list and scanned the whole table,
        // once per acceptance that moves a head (found by the plan check in the PostgreSQL
        // tests).
        let (ids, ends): (Vec<Uuid>, Vec<i64>) = rows.close.iter().copied().unzip();
        planned(
            "UPDATE validity v SET recorded_to = c.recorded_to \
             FROM unnest($1::uuid[], $2::bigint[]) AS c(id, recorded_to) \
             WHERE v.id = c.id",
        )
        .bind(ids)
        .bind(ends)
        .execute(&mut *tx)
        .await?;
    }
    cached(
        "INSERT INTO validity (id, dataset, source_key, revision_id, assertion_id, valid_from, \
           valid_to, recorded_from) \
         SELECT id, dataset, source_key, revision_id, assertion_id, valid_from, valid_to, \
           recorded_from \
         FROM jsonb_to_recordset($1) AS r(id uuid, dataset text, source_key text, \
           revision_id uuid, assertion_id uuid, valid_from bigint, valid_to bigint, \
           recorded_from bigint)",
    )
    .bind(json(&rows.insert)?)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// The accepted items of a wave, as the parameters of the write statements.
#[derive(Debug, Default)]
struct Staged {
    /// Every accepted item: what each statement joins on.
    wave: WaveColumns,
    /// The items that make a new revision (a duplicate of the head makes none).
    revisions: RevisionColumns,
    /// Whether any item moves an existing head. A source without a head (never accepted) has
    /// no jobs to supersede and no passages to replace, so a wave of new sources skips both
    /// statements.
    moves_heads: bool,
    content_sha256: Vec<String>,
    content_lengths: Vec<i64>,
    content_bytes: Vec<Vec<u8>>,
    passage_positions: Vec<i64>,
    passage_indexes: Vec<i64>,
    passage_starts: Vec<i64>,
    passage_ends: Vec<i64>,
    /// Each passage's stemmed words, sent as a binary `tsvector`.
    passage_words: Vec<TsVector>,
    /// Each passage's text when it is extracted (HTML); `None` when it is cut from the bytes.
    passage_texts: Vec<Option<String>>,
    /// Each passage's section path and page, when its format has them.
    passage_sections: Vec<Option<String>>,
    passage_pages: Vec<Option<i64>>,
    /// The items a connector submits, by position, and their owner (`connector:<id>`): the
    /// head move stores it (every other head moved is API ingest's, with no owner).
    owner_positions: Vec<i64>,
    owners: Vec<String>,
}

/// One column per field of an accepted item ([`wave_relation`]).
#[derive(Debug, Default)]
struct WaveColumns {
    /// The item's position in the wave.
    position: Vec<i64>,
    dataset: Vec<String>,
    source_key: Vec<String>,
    revision_id: Vec<Uuid>,
    tombstone: Vec<bool>,
    actor: Vec<String>,
    /// The history cause of the head move and the jobs.
    cause: Vec<&'static str>,
    job_id: Vec<Uuid>,
    /// The job's kind (`project` or `tombstone`).
    kind: Vec<&'static str>,
    /// The graph job's id, when the graph is a backend.
    graph_job_id: Vec<Option<Uuid>>,
    /// When its jobs may run (a scheduled item's validity start).
    run_at: Vec<i64>,
    /// Whether the head moves to it now (false: scheduled, or history only).
    moves_head: Vec<bool>,
    /// Its asserted period: which scheduled jobs it overrides.
    valid_from: Vec<i64>,
    valid_to: Vec<i64>,
    /// Its job's first state: `pending`, or `superseded` for history only.
    job_state: Vec<&'static str>,
    /// A bounded period's return: the job, the revision holding after it, when.
    return_job_id: Vec<Option<Uuid>>,
    return_revision_id: Vec<Option<Uuid>>,
    return_at: Vec<Option<i64>>,
    return_graph_job_id: Vec<Option<Uuid>>,
}

/// One column per field of a new revision, in the `revisions` statement's order.
#[derive(Debug, Default)]
struct RevisionColumns {
    id: Vec<Uuid>,
    dataset: Vec<String>,
    source_key: Vec<String>,
    sha256: Vec<Option<String>>,
    byte_length: Vec<i64>,
    media_type: Vec<String>,
    tags: Vec<serde_json::Value>,
    metadata: Vec<serde_json::Value>,
    tombstone: Vec<bool>,
    previous: Vec<Option<Uuid>>,
    actor: Vec<String>,
    reason: Vec<Option<String>>,
}

impl Staged {
    fn add(&mut self, position: usize, item: &Prepared, write: &Write, graph: bool) {
        let kind = if write.tombstone {
            JobKind::Tombstone
        } else {
            JobKind::Project
        };
        self.moves_heads |= write.previous.is_some();
        let (sha256, byte_length, media_type, tags, metadata, reason) = match &item.change {
            PreparedChange::Put {
                document,
                sha256,
                passages,
                extracted,
                ..
            } => {
                let text = match extracted {
                    Some(extracted) => extracted.as_str(),
                    None => std::str::from_utf8(&document.bytes).unwrap_or_default(),
                };
                for (index, passage) in passages.iter().enumerate() {
                    self.passage_positions.push(position as i64);
                    self.passage_indexes.push(index as i64);
                    self.passage_starts.push(passage.byte_start as i64);
                    self.passage_ends.push(passage.byte_end as i64);
                    self.passage_words
                        .push(TsVector(crate::passages::lexemes(passage.text(text))));
                    self.passage_texts
                        .push(extracted.as_ref().map(|_| passage.text(text).to_owned()));
                    self.passage_sections.push(passage.section.clone());
                    self.passage_pages.push(passage.page.map(i64::from));
                }
                if write.new_revision {
                    self.content_sha256.push(sha256.clone());
                    self.content_lengths.push(document.bytes.len() as i64);
                    self.content_bytes.push(document.bytes.clone());
                }
                (
                    Some(sha256.clone()),
                    document.bytes.len(),
                    document.media_type.clone(),
                    serde_json::json!(ids::canonical_tags(&document.tags)),
                    serde_json::Value::Object(document.metadata.clone()),
                    None,
                )
            }
            PreparedChange::Delete { reason } => (
                None,
                0,
                "application/x-tombstone".to_owned(),
                serde_json::json!([]),
                serde_json::json!({}),
                reason.clone(),
            ),
        };
        if let Some(owner) = &item.owner {
            self.owner_positions.push(position as i64);
            self.owners.push(owner.clone());
        }
        let wave = &mut self.wave;
        wave.position.push(position as i64);
        wave.dataset.push(item.dataset.clone());
        wave.source_key.push(item.source_key.clone());
        wave.revision_id.push(write.revision_id);
        wave.tombstone.push(write.tombstone);
        wave.actor.push(item.actor.clone());
        wave.cause.push(write.cause);
        wave.job_id.push(write.job_id);
        wave.kind.push(kind.as_str());
        let placement = &write.placement;
        let returns = placement.returns;
        wave.graph_job_id
            .push((graph && !placement.historical).then(ids::new_v7));
        wave.run_at.push(placement.run_at);
        wave.moves_head.push(placement.moves_head);
        wave.valid_from.push(write.assertion.period.from);
        wave.valid_to.push(write.assertion.period.to);
        wave.job_state.push(if placement.historical {
            "superseded"
        } else {
            "pending"
        });
        wave.return_job_id.push(returns.map(|back| back.job_id));
        wave.return_revision_id
            .push(returns.map(|back| back.revision_id));
        wave.return_at.push(returns.map(|back| back.at));
        wave.return_graph_job_id
            .push(returns.filter(|_| graph).map(|_| ids::new_v7()));
        if write.new_revision {
            let revisions = &mut self.revisions;
            revisions.id.push(write.revision_id);
            revisions.dataset.push(item.dataset.clone());
            revisions.source_key.push(item.source_key.clone());
            revisions.sha256.push(sha256);
            revisions.byte_length.push(byte_length as i64);
            revisions.media_type.push(media_type);
            revisions.tags.push(tags);
            revisions.metadata.push(metadata);
            revisions.tombstone.push(write.tombstone);
            revisions.previous.push(write.previous);
            revisions.actor.push(item.actor.clone());
            revisions.reason.push(reason);
        }
    }
}

/// An acceptance statement, planned for its parameters at every execution: it is sent as
/// PostgreSQL's unnamed statement, which is never cached. A cached generic plan, chosen while
/// the tables were small (a fresh ledger), kept scanning them whole as they grew (single
/// acceptances fell from 374 to 109 per second over three rounds). Only these statements are
/// replanned: the foreign-key checks and history triggers they fire keep their cached plans
/// (forcing custom plans for the whole transaction replanned every one of those, per row).
fn planned(sql: &str) -> sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql).persistent(false)
}

/// An acceptance statement whose plan cannot depend on what the tables hold (an insert of the
/// wave's rows): prepared once per connection and planned generically after PostgreSQL's first
/// few custom plans, so it costs no planning per wave. Planning was about 40% of the server's
/// time for 16 clients' small waves.
fn cached(sql: &str) -> sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql).persistent(true)
}
