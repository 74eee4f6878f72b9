//! # receipts: cairn's ledger
//!
//! The ledger is cairn's durable state and its domain model. Every other crate depends on it;
//! it depends on none of them.
//!
//! ## Model
//! - A **source** is `(dataset, source_key)`. Its **head** is the revision that is current.
//! - A **revision** is one accepted state of a source: content (retained once per SHA-256 in
//!   `contents`, however many revisions share it) plus media type, tags and metadata, or a
//!   **tombstone** that deletes the source.
//! - Accepting a revision queues one **projection job**, with one **projection receipt** per
//!   configured backend (`relational`, `vector`, `graph`). A receipt becomes `verified` only
//!   after a worker reads its write back (chunk rows by count and checksum, vectors by count,
//!   dimension and model, graph presence).
//! - **History** is append-only and written by the store itself (SQLite triggers, PL/pgSQL
//!   triggers on PostgreSQL), for every
//!   head move, job state change, receipt state change and content block, whoever issued the
//!   statement. cairn attributes its own writes (actor, cause, time); anything else is recorded
//!   as `unattributed`. A job run that ends in an error carries the error's code and message
//!   and the stage the run had reached in its history row, so the trail holds every attempt.
//! - A revision is **vector-searchable** in a generation when its relational and vector
//!   receipts are verified there; triggers on the receipts keep that answer in
//!   `searchable_revisions` (one lookup per search hit), in the receipt's own transaction.
//! - A **generation** is the identity of a projection (model, dimension, chunker settings,
//!   backends). Several can be live: one `active` (search answers from it), one `building`
//!   beside it, former active ones on `standby` for rollback. Every acceptance queues one job
//!   per live generation; jobs, chunk rows and receipts name theirs. Their changes (create,
//!   switch, retire) go through one path ([`Projections::change_generation`], rules in
//!   [`generations`]).
//! - An **erasure** ([`Acceptor::erase`]) deletes every earlier revision of a source with all
//!   it left in the ledger, keeps who, why, when and the content hashes, and queues the jobs
//!   that erase the stores.
//! - **Verify** ([`verify`]) compares what the receipts promise each derived store holds with
//!   what it answers, one bucket of sources at a time (a stable hash of the source, an
//!   order-free digest per bucket), and names each drift with its evidence.
//! - A running job reports its **stage** (`reading`, `chunking`, `embedding`, ...) with a
//!   fenced heartbeat ([`Leases::progress`]); operators read jobs, activity and the job event
//!   stream through [`Operations`].
//!
//! ## Invariants
//! 1. A receipt ([`Acceptance`]) is returned only after the transaction that holds its bytes,
//!    revision, head move, job and receipts has committed durably (SQLite: `synchronous=FULL`
//!    under WAL; PostgreSQL: `synchronous_commit = on`): an acknowledged submission survives a
//!    crash.
//! 2. Acceptance is all or nothing per submission: bytes, revision, head move, superseding of
//!    the previous head's unfinished job and receipts, the new job and receipts, and the
//!    lexical index rows are written in one transaction (each submission in its own savepoint
//!    inside a group commit). A failure at any step leaves no partial rows.
//! 3. A source has exactly one head. At most one unfinished job exists per source and live
//!    generation: accepting a new head marks the previous unfinished jobs and receipts
//!    `superseded` (an erasure's jobs excepted: they erase the stores whatever comes next).
//! 4. The lexical index (FTS5 on SQLite, a `tsvector` per passage under a GIN index on
//!    PostgreSQL) holds the passages of current, non-deleted heads only; it is
//!    updated in the same transaction as the head move, so lexical search never waits for a
//!    worker and never returns a superseded or deleted revision.
//! 5. Submitting bytes equal to the current head creates nothing (`duplicate`). Submitting the
//!    content of an earlier revision makes that revision head again (a recorded head move).
//! 6. Content blocked in a dataset is refused (`content_blocked`) before anything is written.
//! 7. Every state column has a CHECK constraint; a running job holds a whole lease, nothing
//!    else holds one. Lease invariants (fencing, expiry, deadlines, rescue, attempts and
//!    crashes) are stated in `sqlite::leases` and hold for every [`Leases`] write.
//! 8. Times are integer epoch microseconds from an injected [`Clock`] (on PostgreSQL in
//!    production, the database's clock: [`LedgerClock`]).
//!
//! ## Engines
//! The domain (model, traits, policy, auth, validation, ids, errors, the acceptance and
//! run-ending rules, the generation rules) imports no engine; [`sqlite`] and [`postgres`]
//! implement the traits and import each other in no way. Both pass the ledger conformance
//! suite and the lease model (the dev-only `testkit` crate).
//!
//! [`PostgresLedger`] runs each operation as a transaction on a pool (row locks, `SKIP
//! LOCKED` claims, advisory locks per source for acceptance), groups concurrent acceptances
//! and completions into shared transactions, and wakes workers in every process with
//! `LISTEN/NOTIFY` (see [`postgres`]).
//!
//! [`SqliteLedger`] runs one writer task that owns the only write connection and commits
//! queued operations (acceptances, lease operations, blocks, tokens) in groups (see
//! [`sqlite`]); reads use a pool of other connections, and a background task checkpoints the
//! WAL every 500 ms so that no commit waits for a checkpoint, truncating it once it is large
//! and fully copied.
//!
//! Ids are described in [`ids`].

mod acceptance;
pub mod access;
pub mod auth;
pub mod clock;
pub mod connectors;
mod error;
pub mod events;
pub mod faults;
pub mod filter;
pub mod generations;
#[cfg(feature = "http")]
pub mod http;
pub mod ids;
pub mod journal;
mod ledger;
mod migrations;
pub mod model;
pub mod operations;
pub mod passages;
pub mod policy;
pub mod postgres;
mod runs;
pub mod secrets;
pub mod sqlite;
pub mod sync;
pub mod validate;
pub mod validity;
pub mod verify;
pub mod webhooks;

pub use auth::{Principal, Scope};
pub use clock::{Clock, ManualClock, Micros, SystemClock};
pub use error::{LedgerError, Result};
pub use ledger::{
    AcceptLedger, Acceptor, Backups, Connectors, EventsLedger, Leases, Ledger, MigrationReport,
    OpsLedger, Projections, Reader, SearchLedger, SyncLedger, Tokens, Verifications, VerifyLedger,
    WorkLedger, CANDIDATES_PER_HASH,
};
pub use migrations::{postgres_schema_version, sqlite_schema_version};
pub use model::{
    owner_of, AcceptStatus, Acceptance, Backend, BoundHit, Change, ChunkRef, ChunkRow,
    ChunkSummary, Connector, ConnectorChange, ConnectorChanged, ConnectorCommand, ConnectorFile,
    ConnectorKind, ConnectorState, ContentBlock, DatasetSummary, Document, Erasure,
    ErasureRemaining, ErasureRequest, Failure, FailureClass, Generation, GenerationChange,
    GenerationChanged, GenerationCommand, GenerationProgress, GenerationState, GenerationView,
    Heartbeat, HistoryEntry, HitRef, Job, JobKind, JobState, LeaseToken, LedgerCounts, LexicalHit,
    NewConnector, ProjectionReceipt, ReceiptState, ReceiptUpdate, Removal, Revision,
    RevisionDetail, SourceListing, SourceView, Submission, SyncFile, SyncProgress, SyncReport,
    SyncRun, UnitWrite, MAX_LISTING_PAGE,
};
pub use model::{
    DriftKind, DriftRecord, DriftState, LedgerBucket, PassChange, PassState, SettledHead,
    VerifyPass, VerifyTier,
};
pub use operations::{
    Activity, JobEvent, JobFilter, JobOrder, JobPage, LatencySummary, Operations, Pause,
};
pub use postgres::{LedgerClock, PostgresLedger, PostgresOptions};
pub use sqlite::{SqliteLedger, SqliteOptions};
