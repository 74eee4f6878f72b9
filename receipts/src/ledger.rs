//! The ledger's capability traits, one per role: [`Acceptor`] (acceptance, blocks, erasure),
//! [`Reader`] (reads, lexical search, binding), [`Tokens`], [`Leases`] (the job lifecycle),
//! [`Projections`] (chunk rows, receipts, generations), [`Connectors`], [`Verifications`]
//! and [`Operations`]. [`Ledger`] is all
//! of them, for the code that composes a process; each role's crate holds only the bounds it
//! uses. The SQLite and PostgreSQL ledgers implement every trait and pass one conformance
//! suite (the dev-only `testkit` crate).

use async_trait::async_trait;
use uuid::Uuid;

use crate::auth::{CreatedToken, NewToken, Principal, TokenChange, TokenChanged, TokenInfo};
use crate::clock::Micros;
use crate::error::Result;
use crate::filter::{Filter, RevisionFacts};
use crate::model::{
    Acceptance, BoundHit, ChunkRef, ChunkRow, ChunkSummary, Connector, ConnectorChanged,
    ConnectorCommand, ConnectorFile, ContentBlock, DatasetSummary, DriftRecord, Erasure,
    ErasureRequest, Failure, Generation, GenerationChanged, GenerationCommand, GenerationView,
    Heartbeat, HistoryEntry, HitRef, Job, LeaseToken, LedgerBackup, LedgerBucket, LedgerCounts,
    LexicalHit, PassChange, ProjectionReceipt, ReceiptUpdate, RestoreRecord, RevisionDetail,
    SourceListing, SourceView, Submission, SyncProgress, SyncRun, UnitWrite, VerifyPass,
};
use crate::operations::Operations;
use crate::validity::{At, Held, Period, Timeline};

/// Most reuse candidates [`Projections::chunks_with_hashes`] returns per text hash.
pub const CANDIDATES_PER_HASH: usize = 4;

/// Durable acceptance: every method returns only after its writes are on disk.
#[async_trait]
pub trait Acceptor: Send + Sync {
    /// Accepts submissions. Each result is independent: one refused item does not fail the
    /// others. Concurrent calls are grouped into shared transactions.
    async fn accept(&self, submissions: Vec<Submission>) -> Vec<Result<Acceptance>>;

    /// Blocks exact content in a dataset; later submissions of those bytes are refused.
    async fn block_content(&self, block: ContentBlock) -> Result<()>;

    /// Erases a source, in one transaction: a tombstone (the erasure) becomes its head; every
    /// earlier revision is deleted with its jobs, receipts, chunk rows (every generation),
    /// lexical passages and retained bytes (unless another source's revision holds the same
    /// content); history keeps who, why, when and the content hashes, never content. One
    /// `tombstone` job per live generation (and a graph job) then erases the stores and
    /// records `erased` receipts. The answer is the erasure's receipt. An erased source can be
    /// ingested again, as new.
    async fn erase(&self, request: ErasureRequest) -> Result<Acceptance>;

    /// The one path for every change of who may read ([`crate::access`]): a source's readers
    /// or a dataset's default, in one transaction, recorded in history with its actor and
    /// reason. A change to what is already held writes nothing. Not a new revision: nothing
    /// is chunked or embedded again, and search applies it from the next query on.
    async fn change_access(&self, change: crate::access::AccessChange) -> Result<()>;
}

/// Reads of sources, revisions, content and the lexical index.
#[async_trait]
pub trait Reader: Send + Sync {
    /// A source with its head and revision chain.
    async fn source(&self, dataset: &str, source_key: &str) -> Result<Option<SourceView>>;

    /// A revision with its latest job, receipts and history.
    async fn revision(&self, id: Uuid) -> Result<Option<RevisionDetail>>;

    /// Retained bytes by SHA-256.
    async fn content(&self, sha256: &str) -> Result<Option<Vec<u8>>>;

    /// BM25 search over the passages of current, non-deleted heads (`datasets` empty: every
    /// dataset). With a deadline the query is interrupted when it passes
    /// ([`crate::LedgerError::DeadlineExceeded`]): no work outlives the caller's budget.
    async fn lexical_search(
        &self,
        query: &str,
        datasets: &[String],
        limit: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<Vec<LexicalHit>>;

    /// [`Reader::lexical_search`] (or, with `at`, [`Reader::lexical_search_at`]) over the
    /// passages whose revision matches `filter`, applied inside the query before its `limit`
    /// (never to a cut list).
    async fn lexical_search_where(
        &self,
        query: &str,
        datasets: &[String],
        filter: &Filter,
        limit: u32,
        deadline: Option<std::time::Instant>,
        at: Option<At>,
    ) -> Result<Vec<LexicalHit>>;

    /// The revisions `filter` selects in `datasets` (empty: every dataset), at most `limit`:
    /// the current heads that are not deleted, or with `at` the revisions held then (no
    /// tombstone). A filtered vector search runs among these only.
    async fn filter_revisions(
        &self,
        datasets: &[String],
        filter: &Filter,
        at: Option<At>,
        limit: u32,
    ) -> Result<Vec<Uuid>>;

    /// Counts `field`'s values over the sources that `filter` (none: every source) selects in
    /// `datasets`, as [`Reader::filter_revisions`] selects them, listing at most `max_values`
    /// values ([`crate::filter::facets`]). Exact, or `DeadlineExceeded` once `deadline`
    /// passes: never a count of part of the set.
    async fn facet_counts(
        &self,
        datasets: &[String],
        filter: Option<&Filter>,
        at: Option<At>,
        field: &crate::filter::facets::FacetField,
        max_values: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<crate::filter::facets::FacetCounts>;

    /// Who may read a source now: its own readers, and its dataset's default (whether or not
    /// the source exists).
    async fn access_of(
        &self,
        dataset: &str,
        source_key: &str,
    ) -> Result<crate::access::AccessRecord>;

    /// The sources of `dataset` that name their readers, by key in byte order after `after`,
    /// at most `limit` (capped at [`crate::model::MAX_LISTING_PAGE`]) with their readers: what
    /// a connector's run compares its files' readers with. A source not listed follows its
    /// dataset's default.
    async fn named_readers(
        &self,
        dataset: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<(String, Vec<String>)>>;

    /// Whether a caller reading as `names` ([`crate::access::Identity::names`]) may read the
    /// source; `None` (a token without an identity) reads every source. The check every read
    /// of one source or revision makes; a source it may not read is answered as absent.
    async fn may_read(
        &self,
        names: Option<&[String]>,
        dataset: &str,
        source_key: &str,
    ) -> Result<bool> {
        let Some(names) = names else { return Ok(true) };
        let record = self.access_of(dataset, source_key).await?;
        Ok(crate::access::admits(record.effective().as_deref(), names))
    }

    /// What a filter sees of each of these revisions ([`Filter::matches`]), in no particular
    /// order; unknown revisions are left out.
    async fn revision_facts(&self, revision_ids: &[Uuid]) -> Result<Vec<RevisionFacts>>;

    /// Checks hits against the current state: whether each revision is its source's head (and
    /// not deleted), whether it is vector-searchable in `generation` (the one searched), and a
    /// vector hit's chunk text in that generation. Answers in the order asked; unknown
    /// revisions are left out.
    async fn bind_hits(&self, hits: &[HitRef], generation: &str) -> Result<Vec<BoundHit>>;

    /// [`Reader::lexical_search`] at a point in both times: the passages of the revisions held
    /// at `at.valid_at` as believed at `at.as_of` (current heads' passages and past ones).
    async fn lexical_search_at(
        &self,
        query: &str,
        datasets: &[String],
        limit: u32,
        deadline: Option<std::time::Instant>,
        at: At,
    ) -> Result<Vec<LexicalHit>>;

    /// [`Reader::bind_hits`] at a point in both times: `current` says the revision held at
    /// `at.valid_at` as believed at `at.as_of` (and is no tombstone); `vector_searchable` that
    /// it was projected in the generation (it has chunk rows there).
    async fn bind_hits_at(
        &self,
        hits: &[HitRef],
        generation: &str,
        at: At,
    ) -> Result<Vec<BoundHit>>;

    /// The erasure a tombstone revision stands for, with a fresh read-back of what the ledger
    /// still holds of the erased revisions (`None`: the revision is not an erasure).
    async fn erasure(&self, revision_id: Uuid) -> Result<Option<Erasure>>;

    /// The block on content in a dataset, if any.
    async fn content_block(&self, dataset: &str, sha256: &str) -> Result<Option<ContentBlock>>;

    /// History of one entity (`source` with `dataset/source_key`, `job`, `receipt` with
    /// `job_id/backend`, `block` with `dataset/sha256`, `token`), oldest first.
    async fn history(&self, entity: &str, entity_id: &str) -> Result<Vec<HistoryEntry>>;

    /// A source's validity: its assertions and rectangles ([`crate::validity`]).
    async fn timeline(&self, dataset: &str, source_key: &str) -> Result<Timeline>;

    /// What held at `valid_at` as the ledger believed at `as_of`, if anything (a tombstone
    /// says the source did not exist then).
    async fn held_at(
        &self,
        dataset: &str,
        source_key: &str,
        valid_at: Micros,
        as_of: Micros,
    ) -> Result<Option<Held>>;

    /// The valid period each of these revisions holds over at `at` (valid time, as believed
    /// at the record time), for those a believed rectangle holds then: a search page's
    /// periods, read once for the page.
    async fn periods(&self, revisions: &[Uuid], at: At) -> Result<Vec<(Uuid, Period)>>;

    /// Whether some revision of `datasets` (empty: every dataset) that held at `at` cannot be
    /// found: it has no vectors in `generation` (`None`: no vector search), or no passages.
    /// Reads the gaps the ledger recorded as they arose, never the whole history.
    async fn history_gaps(
        &self,
        datasets: &[String],
        generation: Option<&str>,
        at: At,
    ) -> Result<crate::validity::HistoryGaps>;

    /// Ledger-wide counts.
    async fn counts(&self) -> Result<LedgerCounts>;

    /// Every dataset that holds a source, by name, with its counts.
    async fn datasets(&self) -> Result<Vec<DatasetSummary>>;

    /// The heads of `dataset`'s sources whose keys start with `prefix` and sort after `after`,
    /// by key in byte order (the same on every engine), at most `limit` (capped at
    /// [`crate::MAX_LISTING_PAGE`]). Tombstoned heads are listed, marked.
    async fn list_sources(
        &self,
        dataset: &str,
        prefix: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<SourceListing>>;

    /// Succeeds when the ledger answers a query.
    async fn ping(&self) -> Result<()>;
}

/// API tokens.
#[async_trait]
pub trait Tokens: Send + Sync {
    /// The one path for every token change (create, revoke, rotate): applied in one
    /// transaction and recorded in history with its actor and reason. A new secret is in the
    /// answer, shown once; only its hash is stored.
    async fn change_token(&self, change: TokenChange) -> Result<TokenChanged>;

    /// Creates a token and returns its secret (shown once): [`Tokens::change_token`] with
    /// [`TokenChange::Create`].
    async fn create_token(&self, token: NewToken) -> Result<CreatedToken> {
        let changed = self.change_token(TokenChange::Create(token)).await?;
        let secret = changed.secret.ok_or_else(|| {
            crate::LedgerError::Internal("a created token came back without its secret".into())
        })?;
        Ok(CreatedToken {
            id: changed.token.id,
            secret,
        })
    }

    /// The principal of a token that is neither revoked nor expired. SQLite checks the ledger
    /// on every call; a PostgreSQL process keeps an answer for at most
    /// `ledger.token_cache_ms` (1 s) and never past the token's expiry, and any change of the
    /// tokens, in any process, clears it at once: a revocation takes effect at the next
    /// request everywhere.
    async fn authenticate(&self, secret: &str) -> Result<Option<Principal>>;

    /// Number of tokens that authenticate now.
    async fn token_count(&self) -> Result<i64>;

    /// Every token (never a secret), newest first.
    async fn tokens(&self) -> Result<Vec<TokenInfo>>;
}

/// Job leases for workers, and the operator actions on jobs. Every write that presents a
/// [`LeaseToken`] is fenced: it changes nothing and fails with `lease_lost` unless the token
/// still holds the job at the time of the write.
#[async_trait]
pub trait Leases: Send + Sync {
    /// Rescues expired leases, then claims up to `limit` due jobs for `owner`.
    async fn claim(&self, owner: &str, limit: u32) -> Result<Vec<Job>>;

    /// Extends a lease (up to the run's deadline).
    async fn heartbeat(&self, lease: &LeaseToken) -> Result<Heartbeat>;

    /// A heartbeat that also records the stage the run has reached (`chunking`, `embedding`,
    /// ...; 1-64 characters of `a-z`, `0-9`, `_`, `-`, space), shown on the dashboard.
    async fn progress(&self, lease: &LeaseToken, stage: &str) -> Result<Heartbeat>;

    /// Marks the job completed.
    async fn complete(&self, lease: &LeaseToken) -> Result<Job>;

    /// Records a failed run: retry (backoff or retry-after), dead, or cancelled.
    async fn fail(&self, lease: &LeaseToken, failure: Failure) -> Result<Job>;

    /// Gives the job back without charging an attempt (graceful shutdown).
    async fn release(&self, lease: &LeaseToken) -> Result<Job>;

    /// Cancels a pending or retry-waiting job; asks a running one to stop.
    async fn cancel(&self, job_id: Uuid, actor: &str, reason: &str) -> Result<Job>;

    /// Requeues a dead, cancelled or quarantined job whose revision is still head.
    async fn requeue(&self, job_id: Uuid, actor: &str, reason: &str) -> Result<Job>;

    /// Pauses claiming for a dataset (`None`: all).
    async fn pause(&self, dataset: Option<&str>, actor: &str, reason: &str) -> Result<()>;

    /// Resumes claiming for a dataset (`None`: the global pause).
    async fn resume(&self, dataset: Option<&str>, actor: &str, reason: &str) -> Result<()>;

    /// A job by id.
    async fn job(&self, id: Uuid) -> Result<Option<Job>>;

    /// Notified whenever claimable work may have appeared (acceptance, requeue, release), so
    /// that workers in the same process wake at once instead of at their next poll.
    fn work_signal(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        None
    }
}

/// Projection state: the active generation, the relational backend's chunk rows, and the
/// per-backend receipts. Writes are fenced by the run's lease like every lease operation.
#[async_trait]
pub trait Projections: Send + Sync {
    /// Makes `generation` the active one when no generation exists yet (a new ledger), or
    /// confirms that it is live (active, building or standby); refuses
    /// (`generation_mismatch`) otherwise: a process configured for settings the ledger does not
    /// project never mixes them in. Changing settings goes through
    /// [`Projections::change_generation`].
    async fn activate_generation(&self, generation: &Generation, actor: &str) -> Result<()>;

    /// The active generation, if one was activated.
    async fn active_generation(&self) -> Result<Option<Generation>>;

    /// The one path for every generation state change (create, switch, retire): one
    /// transaction, recorded in history with its actor and reason.
    async fn change_generation(&self, command: GenerationCommand) -> Result<GenerationChanged>;

    /// Every generation (retired ones too), newest first, with its progress.
    async fn generations(&self) -> Result<Vec<GenerationView>>;

    /// Replaces the chunk rows of the lease's revision in `generation`.
    async fn write_chunks(
        &self,
        lease: &LeaseToken,
        generation: &str,
        chunks: Vec<ChunkRow>,
    ) -> Result<()>;

    /// What the relational backend holds for a revision in a generation (its read-back).
    async fn chunk_summary(&self, revision_id: Uuid, generation: &str) -> Result<ChunkSummary>;

    /// [`Projections::chunk_summary`] of several revisions in one read, in the same order.
    async fn chunk_summaries(
        &self,
        revision_ids: &[Uuid],
        generation: &str,
    ) -> Result<Vec<ChunkSummary>>;

    /// A unit's ledger write: several jobs' chunk rows and receipts in one transaction. Each
    /// job's part is fenced by its own lease and kept or undone on its own (a savepoint each):
    /// a job whose lease no longer holds gets `lease_lost` and changes nothing, and never
    /// fences out its neighbours. Answers one result per write, in order; an error of the
    /// whole call (the ledger unreachable) answers it for every write.
    async fn project_many(&self, writes: Vec<UnitWrite>) -> Vec<Result<()>>;

    /// A revision's chunk rows in a generation, in order.
    async fn chunks(&self, revision_id: Uuid, generation: &str) -> Result<Vec<ChunkRow>>;

    /// Chunks of other revisions of `dataset` whose text hash is one of `hashes`, in
    /// revisions whose vector receipt in `generation` was verified (and may since have been
    /// superseded by a newer head), at most [`CANDIDATES_PER_HASH`] per hash, newest first:
    /// where a projection finds a vector to reuse instead of embedding the same text again
    /// (the vector store's answer is the proof). Never crosses datasets.
    async fn chunks_with_hashes(
        &self,
        dataset: &str,
        generation: &str,
        hashes: &[String],
        except_revision: Uuid,
    ) -> Result<Vec<ChunkRef>>;

    /// Records a receipt state of the lease's job; a verified or excluded receipt supersedes
    /// the same backend's verified receipts of the source's other revisions in the same
    /// generation.
    async fn record_receipt(&self, lease: &LeaseToken, update: ReceiptUpdate) -> Result<()>;

    /// A job's receipts, by backend.
    async fn receipts(&self, job_id: Uuid) -> Result<Vec<ProjectionReceipt>>;

    /// Crosses a validity boundary for the lease's job: when its revision was scheduled (it
    /// holds from an instant that has come) and is not its source's head yet, moves the head
    /// to it, supersedes the former head's unfinished jobs and swaps the lexical passages, as
    /// acceptance does for a revision that holds at once (cause `validity_boundary`). Does
    /// nothing when the revision is the head already, or is an erasure's. Answers whether the
    /// job goes on: `false` when a later assertion overrode its revision at this instant, and
    /// the job was superseded (`validity_overridden`). A job that waited runs it before its
    /// first store write, so a store's current flag never moves ahead of the ledger's head.
    async fn cross_boundary(&self, lease: &LeaseToken) -> Result<bool>;
}

/// Connectors and their runs. Every change goes through [`Connectors::change_connector`]; a
/// run's writes are fenced by its lease like every lease operation.
#[async_trait]
pub trait Connectors: Send + Sync {
    /// The one path for every connector change (create, pause, resume, run now, remove): one
    /// transaction, its rules in [`crate::connectors::plan`], recorded in history with its
    /// actor and reason by the store's triggers.
    async fn change_connector(&self, command: ConnectorCommand) -> Result<ConnectorChanged>;

    /// A connector by id.
    async fn connector(&self, id: Uuid) -> Result<Option<Connector>>;

    /// Every connector (removed ones too), newest first.
    async fn connectors(&self) -> Result<Vec<Connector>>;

    /// What the connector's runs last saw of each file, by key in byte order.
    async fn connector_files(&self, id: Uuid) -> Result<Vec<ConnectorFile>>;

    /// Records a run's progress in one transaction, fenced by its lease: index rows written
    /// and dropped, and the report so far (kept with the job).
    async fn record_sync(&self, lease: &LeaseToken, progress: SyncProgress) -> Result<()>;

    /// The connector's runs, newest first (created later, then due later), at most `limit`
    /// (capped at 100), with their reports.
    async fn sync_runs(&self, id: Uuid, limit: u32) -> Result<Vec<SyncRun>>;
}

/// Verify passes and their drift ([`crate::verify`]): the ledger side of one bucket, and the
/// one path for every change of a pass, of its drift and of a repair's projection job.
#[async_trait]
pub trait Verifications: Send + Sync {
    /// What the ledger holds for `bucket` in `generation` (one consistent read).
    async fn verify_bucket(&self, generation: &str, bucket: u16) -> Result<LedgerBucket>;

    /// The one path for every change of a pass and its drift, recorded in history (entity
    /// `verify` for a pass, `drift` for a drift) with its actor and reason.
    async fn change_pass(&self, change: PassChange) -> Result<VerifyPass>;

    /// A pass.
    async fn verify_pass(&self, id: Uuid) -> Result<Option<VerifyPass>>;

    /// The newest passes, newest first (at most `limit`, at most 100).
    async fn verify_passes(&self, limit: u32) -> Result<Vec<VerifyPass>>;

    /// The drift a pass confirmed, in the order it was found.
    async fn pass_drift(&self, pass_id: Uuid) -> Result<Vec<DriftRecord>>;

    /// Queues a projection of the source's head in `generation` again (a repair): refused
    /// (`conflict`) when `revision_id` is no longer the head or a job for the source is open,
    /// so a repair never races the work it would duplicate.
    async fn reproject(
        &self,
        dataset: &str,
        source_key: &str,
        revision_id: Uuid,
        generation: &str,
        actor: &str,
        reason: &str,
    ) -> Result<Job>;
}

/// The whole ledger, for the code that composes a process. Each role's crate holds a
/// narrower bound: [`WorkLedger`], [`SearchLedger`], [`AcceptLedger`], [`OpsLedger`]; an
/// `Arc<dyn Ledger>` converts to any of them (they are its supertraits).
pub trait Ledger:
    Acceptor
    + Reader
    + Tokens
    + Leases
    + Projections
    + Operations
    + Connectors
    + Verifications
    + Backups
    + WorkLedger
    + SearchLedger
    + AcceptLedger
    + OpsLedger
    + SyncLedger
    + VerifyLedger
    + EventsLedger
    + std::fmt::Debug
    + 'static
{
}

/// What a projection worker may do: hold leases, write projections, read revisions and jobs
/// ([`Operations`] is read-only; the graph's reconcile pages through completed jobs). It
/// cannot accept, erase, block or change tokens.
pub trait WorkLedger:
    Leases + Projections + Reader + Operations + std::fmt::Debug + 'static
{
}

impl<T: Leases + Projections + Reader + Operations + std::fmt::Debug + 'static> WorkLedger for T {}

/// What search may do: read and bind revisions, read generations, authenticate tokens. It
/// cannot write anything.
pub trait SearchLedger: Reader + Projections + Tokens + std::fmt::Debug + 'static {}

impl<T: Reader + Projections + Tokens + std::fmt::Debug + 'static> SearchLedger for T {}

/// What the change feed and webhooks may do: read the events outbox, keep subscriptions and
/// their deliveries, check who may read a source, read history, and authenticate tokens.
pub trait EventsLedger:
    crate::events::Events + crate::webhooks::Webhooks + Reader + Tokens + std::fmt::Debug + 'static
{
}

impl<
        T: crate::events::Events
            + crate::webhooks::Webhooks
            + Reader
            + Tokens
            + std::fmt::Debug
            + 'static,
    > EventsLedger for T
{
}

/// What the ingest API may do: accept, erase and block, read what it accepted, authenticate
/// tokens. It cannot touch leases or projections.
pub trait AcceptLedger: Acceptor + Reader + Tokens + std::fmt::Debug + 'static {}

impl<T: Acceptor + Reader + Tokens + std::fmt::Debug + 'static> AcceptLedger for T {}

/// What operators may do: read jobs, activity and history, cancel and requeue, change
/// generations and tokens. It cannot accept content.
pub trait OpsLedger:
    Operations + Leases + Reader + Projections + Tokens + std::fmt::Debug + 'static
{
}

impl<T: Operations + Leases + Reader + Projections + Tokens + std::fmt::Debug + 'static> OpsLedger
    for T
{
}

/// What a connector's run may do: hold its lease, read what the dataset holds, accept and
/// tombstone through the same path as the API, and record its index and report. Also what the
/// connectors' API needs (it authenticates tokens).
pub trait SyncLedger:
    Acceptor + Reader + Leases + Connectors + Tokens + std::fmt::Debug + 'static
{
}

impl<T: Acceptor + Reader + Leases + Connectors + Tokens + std::fmt::Debug + 'static> SyncLedger
    for T
{
}

/// Backups and restores of the ledger itself; the stores are the caller's.
#[async_trait]
pub trait Backups: Send + Sync {
    /// Writes a consistent copy of the whole ledger, as it stood at one point of its history,
    /// to the new file `path`, on disk when this returns: SQLite's `VACUUM INTO` (then an
    /// integrity check), or `pg_dump` of a snapshot exported by the transaction that reads
    /// the history position.
    async fn backup_ledger(&self, path: &std::path::Path) -> Result<LedgerBackup>;

    /// Records a restore in a ledger just restored: voids every lease (running jobs back to
    /// pending, their lease cleared, so no worker from before the restore completes work
    /// against rolled-back state) and writes the `restore` entry in history. Answers the
    /// leases voided.
    async fn record_restore(&self, restore: &RestoreRecord) -> Result<i64>;
}

/// What verify may do: read a bucket's ledger side and the retained bytes, record passes and
/// drift, queue a repair's projection, read generations, and authenticate its API's tokens.
/// It cannot accept, erase or hold leases.
pub trait VerifyLedger:
    Verifications + Reader + Projections + Tokens + std::fmt::Debug + 'static
{
}

impl<T: Verifications + Reader + Projections + Tokens + std::fmt::Debug + 'static> VerifyLedger
    for T
{
}

impl<
        T: Acceptor
            + Reader
            + Tokens
            + Leases
            + Projections
            + Operations
            + Connectors
            + Verifications
            + Backups
            + crate::events::Events
            + crate::webhooks::Webhooks
            + std::fmt::Debug
            + 'static,
    > Ledger for T
{
}

/// What a ledger's migrations did (`cairn migrate`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Migrations applied now, as `version description`.
    pub applied: Vec<String>,
    /// Migrations that were already in place.
    pub already: usize,
}
