//! qdrant-edge: the in-process Qdrant engine, persisted under the data directory, one shard
//! per projection generation, owned by one process (a file lock).
//!
//! ## Invariants
//! - [`VectorStore::upsert`] returns after the write is flushed to disk (group flush).
//! - Index building (HNSW) runs on a background thread under an [`OptimizePolicy`], never on
//!   the write or search path; a flush that meets the optimiser mid-swap is retried, not fatal.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use qdrant_edge::{
    Condition, CountRequest, Distance, EdgeConfigBuilder, EdgeShard, EdgeVectorParamsBuilder,
    FieldCondition, Filter, JsonPath, Match, PayloadFieldSchema, PayloadSchemaType, PointId,
    PointStruct, ScrollRequest, SearchRequest, ValueVariants, WithPayloadInterface, WithVector,
    DEFAULT_VECTOR_NAME,
};
use uuid::Uuid;

use super::{
    check_dimensions, fold_points, point_id, BackupFile, CurrentChange, FieldKind, Held,
    PayloadFilter, PointSelector, RevisionPoints, ScrolledPoint, StoreBackup, StoredPoint,
    VectorHit, VectorPoint, VectorStore, INDEXED_FIELDS, SCROLL_PAGE,
};
use crate::GatewayError;

fn unavailable(error: impl std::fmt::Display) -> GatewayError {
    GatewayError::Unavailable {
        store: "qdrant-edge",
        message: error.to_string(),
    }
}

/// The payload fields, parsed once.
#[derive(Debug, Clone)]
struct Fields {
    dataset: JsonPath,
    source_key: JsonPath,
    revision_id: JsonPath,
    is_current: JsonPath,
    head_at: JsonPath,
    bucket: JsonPath,
}

fn payload_path(key: &str) -> Result<JsonPath, GatewayError> {
    key.parse()
        .map_err(|()| GatewayError::Config(format!("invalid payload path {key}")))
}

impl Fields {
    fn new() -> Result<Fields, GatewayError> {
        Ok(Fields {
            dataset: payload_path("dataset")?,
            source_key: payload_path("source_key")?,
            revision_id: payload_path("revision_id")?,
            is_current: payload_path("is_current")?,
            head_at: payload_path("head_at")?,
            bucket: payload_path("bucket")?,
        })
    }
}

fn keyword(key: &JsonPath, value: &str) -> Condition {
    Condition::Field(FieldCondition::new_match(
        key.clone(),
        Match::new_value(ValueVariants::String(value.to_owned())),
    ))
}

fn integer_is(key: &JsonPath, value: i64) -> Condition {
    Condition::Field(FieldCondition::new_match(
        key.clone(),
        Match::new_value(ValueVariants::Integer(value)),
    ))
}

fn flag(key: &JsonPath, value: bool) -> Condition {
    Condition::Field(FieldCondition::new_match(
        key.clone(),
        Match::new_value(ValueVariants::Bool(value)),
    ))
}

fn all_of(conditions: Vec<Condition>) -> Filter {
    Filter {
        must: Some(conditions),
        ..Filter::default()
    }
}

fn schema(kind: FieldKind) -> PayloadSchemaType {
    match kind {
        FieldKind::Keyword => PayloadSchemaType::Keyword,
        FieldKind::Integer => PayloadSchemaType::Integer,
        FieldKind::Bool => PayloadSchemaType::Bool,
        FieldKind::Float => PayloadSchemaType::Float,
    }
}

/// A pushed-down search filter as the engine reads it (Qdrant's JSON form).
fn pushed_condition(filter: &PayloadFilter) -> Result<Condition, GatewayError> {
    let filter: Filter = serde_json::from_value(match filter.to_qdrant_json() {
        // A bare condition becomes a filter of one.
        condition if condition.get("key").is_some() || condition.get("is_empty").is_some() => {
            serde_json::json!({ "must": [condition] })
        }
        nested => nested,
    })
    .map_err(|error| {
        GatewayError::Config(format!("a search filter the store cannot read: {error}"))
    })?;
    Ok(Condition::Filter(filter))
}

/// Creates the payload indexes among `fields` that the shard lacks; answers whether it
/// created any.
fn create_missing<'a>(
    shard: &EdgeShard,
    fields: impl IntoIterator<Item = (&'a str, FieldKind)>,
) -> Result<bool, GatewayError> {
    let indexed: Vec<String> = shard
        .info()
        .payload_schema
        .keys()
        .map(|key| key.to_string())
        .collect();
    let mut created = false;
    for (field, kind) in fields {
        if indexed.iter().any(|name| name == field) {
            continue;
        }
        shard
            .update(qdrant_edge::UpdateOperation::FieldIndexOperation(
                qdrant_edge::FieldIndexOperations::CreateIndex(qdrant_edge::CreateIndex {
                    field_name: payload_path(field)?,
                    field_schema: Some(PayloadFieldSchema::FieldType(schema(kind))),
                }),
            ))
            .map_err(unavailable)?;
        created = true;
    }
    Ok(created)
}

struct Shard {
    /// The engine; `None` once the shard is closed for good ([`EdgeVectorStore::destroy`]) or
    /// being dropped (see `Drop for Shard`): every later call answers `unavailable`.
    shard: RwLock<Option<EdgeShard>>,
    /// Points written since the store opened, and when the last write happened
    /// (milliseconds since `opened`): the optimiser's policy inputs.
    points_written: AtomicU64,
    last_write_ms: AtomicU64,
    opened: Instant,
    optimizer: std::sync::Mutex<OptimizerStats>,
    /// Held while the shard is open: one process owns an embedded shard.
    _owner: std::fs::File,
    /// Writes (and flushes) exclusive, reads shared: the engine's flush expects no
    /// concurrent writer.
    lock: RwLock<()>,
    /// Writes applied so far (a sequence number, bumped under the write lock).
    written: std::sync::atomic::AtomicU64,
    /// Writes known to be on disk. Held while flushing, so concurrent callers share one
    /// flush (group flush): a write that happened before a flush began is covered by it.
    flushed: std::sync::Mutex<u64>,
}

/// How long a flush waits before it takes the shard, so that the writes of concurrent jobs
/// that are about to happen join it. A flush holds the shard exclusively: without the wait each
/// of N concurrent writers pays a flush in turn, with it one flush serves them all
/// (`bench project --edits`: 0.21x -> 0.14x of the first projection, the first projection
/// faster too). A durable write therefore returns at least this late.
const FLUSH_WINDOW: Duration = Duration::from_millis(8);

impl Drop for Shard {
    /// qdrant-edge's own `Drop` flushes and panics when the flush fails (a full disk, say).
    /// The last flush normally happened in [`VectorStore::close`]; this one is contained, so
    /// dropping a store can never take the process down.
    fn drop(&mut self) {
        let engine = match self.shard.get_mut() {
            Ok(engine) => engine.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(engine) = engine {
            if let Err(message) = catching(move || drop(engine)) {
                tracing::error!(%message, "qdrant-edge failed its final flush while closing");
            }
        }
    }
}

impl Shard {
    /// Runs `f` on the engine (shared with other calls; only closing the shard for good
    /// waits for them).
    fn with_engine<T>(
        &self,
        f: impl FnOnce(&EdgeShard) -> Result<T, GatewayError>,
    ) -> Result<T, GatewayError> {
        let engine = self
            .shard
            .read()
            .map_err(|_| unavailable("the engine lock is poisoned"))?;
        match engine.as_ref() {
            Some(engine) => f(engine),
            None => Err(unavailable("the vector store is closed")),
        }
    }

    /// Returns once write number `seq` is on disk, flushing unless a flush already covered it.
    fn sync(&self, seq: u64) -> Result<(), GatewayError> {
        let mut flushed = self
            .flushed
            .lock()
            .map_err(|_| unavailable("the flush lock is poisoned"))?;
        if *flushed >= seq {
            return Ok(());
        }
        // Let writes that are about to happen join this flush (the flush holds the shard).
        std::thread::sleep(FLUSH_WINDOW);
        let _guard = self
            .lock
            .write()
            .map_err(|_| unavailable("the shard lock is poisoned"))?;
        let target = self.written.load(Ordering::SeqCst);
        self.with_engine(flush)?;
        *flushed = target;
        Ok(())
    }

    fn stats(&self) -> OptimizerStats {
        self.optimizer
            .lock()
            .map(|stats| stats.clone())
            .unwrap_or_default()
    }

    fn update_stats(&self, change: impl FnOnce(&mut OptimizerStats)) {
        if let Ok(mut stats) = self.optimizer.lock() {
            change(&mut stats);
        }
    }
}

std::thread_local! {
    /// Set while this thread runs engine code whose panics cairn catches and retries.
    static CAUGHT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic into an error. qdrant-edge 0.7's `flush` asserts that it gets its
/// locks at once (`try_lock().expect(..)`), which fails while the background optimiser swaps
/// segments; catching it keeps that race from killing a projection. The panic hook stays quiet
/// for panics caught here (they are logged as warnings with their message instead).
fn catching<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !CAUGHT.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    CAUGHT.with(|caught| caught.set(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CAUGHT.with(|caught| caught.set(false));
    result.map_err(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|text| (*text).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned());
        // qdrant-edge's errors carry their whole backtrace in their Debug text: an operator
        // needs the description (the file and the OS error), not 50 frames.
        match message.split_once(", backtrace:") {
            Some((head, _)) => format!("{head} }}"),
            None => message,
        }
    })
}

/// Whether a failed flush met the optimiser holding a lock (worth retrying) rather than a
/// storage error such as a full disk (not worth retrying).
fn contended(message: &str) -> bool {
    message.contains("lock acquired")
}

/// Flushes the shard (WAL and segments) to disk, retrying while the optimiser holds the
/// segment lock.
/// Bytes under `path` (0 when it is gone).
fn directory_bytes(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => directory_bytes(&entry.path()),
            _ => entry.metadata().map(|meta| meta.len()).unwrap_or(0),
        })
        .sum()
}

fn flush(shard: &EdgeShard) -> Result<(), GatewayError> {
    const ATTEMPTS: u32 = 200;
    let mut last = String::new();
    for attempt in 1..=ATTEMPTS {
        match catching(|| shard.flush()) {
            Ok(()) => return Ok(()),
            Err(message) if contended(&message) => {
                if attempt == 1 {
                    tracing::debug!(%message, "qdrant-edge flush contended; retrying");
                }
                last = message;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(message) => {
                tracing::error!(%message, "qdrant-edge flush failed");
                return Err(unavailable(format!("flush failed: {message}")));
            }
        }
    }
    tracing::warn!(message = %last, attempts = ATTEMPTS, "qdrant-edge flush kept failing");
    Err(unavailable(format!(
        "flush failed {ATTEMPTS} times (last: {last})"
    )))
}

/// When the background optimiser asks qdrant-edge to build its indexes (HNSW, segment
/// merges). The engine decides what is worth indexing (segments above its indexing threshold,
/// about 6,500 points of 384 dimensions); this decides when to ask, so that bursts of
/// projection finish first and search stays on the brute-force path only while it is cheap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptimizePolicy {
    /// Points written since the last run before a run is considered.
    pub min_new_points: u64,
    /// Writes must have been quiet this long...
    pub quiet: Duration,
    /// ...unless this many points have been written since the last run.
    pub max_new_points: u64,
    /// How often the policy is checked.
    pub check_every: Duration,
}

impl Default for OptimizePolicy {
    fn default() -> Self {
        Self {
            min_new_points: 5_000,
            quiet: Duration::from_secs(10),
            max_new_points: 50_000,
            check_every: Duration::from_secs(2),
        }
    }
}

impl OptimizePolicy {
    /// Whether to run now, `new_points` after the last run and `quiet` after the last write.
    pub fn due(&self, new_points: u64, quiet: Duration) -> bool {
        new_points >= self.max_new_points
            || (new_points >= self.min_new_points && new_points > 0 && quiet >= self.quiet)
    }
}

/// What the background optimiser has done (for logs, metrics and benchmarks).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct OptimizerStats {
    /// Runs finished.
    pub runs: u64,
    /// Runs that failed (the engine's error or panic message is in `last_error`).
    pub failures: u64,
    /// Whether a run is in progress.
    pub running: bool,
    /// Points written when the last run started.
    pub points_at_last_run: u64,
    /// Milliseconds the last run took.
    pub last_run_ms: Option<u64>,
    /// Whether the last run changed anything (built an index, merged segments).
    pub last_run_changed: Option<bool>,
    /// The last failure.
    pub last_error: Option<String>,
}

/// qdrant-edge, in process, persisted at a directory.
#[derive(Clone)]
pub struct EdgeVectorStore {
    inner: Arc<Shard>,
    fields: Fields,
    dimension: usize,
    path: PathBuf,
}

impl std::fmt::Debug for EdgeVectorStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("EdgeVectorStore")
            .field("path", &self.path)
            .field("dimension", &self.dimension)
            .finish()
    }
}

impl EdgeVectorStore {
    /// The nearest points in `datasets` (empty: every dataset), current ones only or any.
    async fn nearest(
        &self,
        vector: Vec<f32>,
        datasets: &[String],
        limit: usize,
        current_only: bool,
        within: Option<&[Uuid]>,
        pushed: Option<&PayloadFilter>,
    ) -> Result<Vec<VectorHit>, GatewayError> {
        let mut must = Vec::new();
        if current_only {
            must.push(flag(&self.fields.is_current, true));
        }
        if let Some(pushed) = pushed {
            must.push(pushed_condition(pushed)?);
        }
        if let Some(revisions) = within {
            let ids: Vec<String> = revisions.iter().map(Uuid::to_string).collect();
            must.push(Condition::Field(FieldCondition::new_match(
                self.fields.revision_id.clone(),
                Match::from(ids),
            )));
        }
        // No datasets: every dataset (an empty `should` would match nothing).
        let filter = Filter {
            should: (!datasets.is_empty()).then(|| {
                datasets
                    .iter()
                    .map(|d| keyword(&self.fields.dataset, d))
                    .collect()
            }),
            must: (!must.is_empty()).then_some(must),
            ..Filter::default()
        };
        // A narrowed search is exact: the payload index selects the points, every one of
        // them is scored, and nothing that matches is missed by the graph walk.
        let params = within.map(|_| qdrant_edge::SearchParams {
            exact: true,
            ..Default::default()
        });
        self.with_shard(false, move |shard| {
            let points = shard
                .search(SearchRequest {
                    query: qdrant_edge::QueryEnum::Nearest(qdrant_edge::NamedQuery::default_dense(
                        vector,
                    )),
                    filter: Some(filter),
                    params,
                    limit,
                    offset: 0,
                    with_payload: Some(WithPayloadInterface::Bool(true)),
                    with_vector: None,
                    score_threshold: None,
                })
                .map_err(unavailable)?;
            Ok(points
                .into_iter()
                .filter_map(|point| {
                    let revision_id = payload_text(&point.payload, "revision_id")?.parse().ok()?;
                    let chunk_index = point
                        .payload
                        .as_ref()?
                        .0
                        .get("chunk_index")?
                        .as_u64()
                        .and_then(|index| u32::try_from(index).ok())?;
                    Some(VectorHit {
                        dataset: payload_text(&point.payload, "dataset")?,
                        source_key: payload_text(&point.payload, "source_key")?,
                        revision_id,
                        chunk_index,
                        score: point.score,
                    })
                })
                .collect())
        })
        .await
    }

    /// Unpacks a shard snapshot that a Qdrant server streamed (`GET
    /// /collections/{collection}/shards/{shard}/snapshot`) into `directory` (which must not
    /// hold a shard yet) and opens it, as [`EdgeVectorStore::open`] does: a private copy of
    /// what that one replica held, to read with [`VectorStore::scroll_all`]. Qdrant has no read
    /// of a single replica, so this is how replicas of one shard are compared point by point.
    pub fn open_snapshot(
        snapshot: &Path,
        directory: &Path,
        dimension: usize,
    ) -> Result<EdgeVectorStore, GatewayError> {
        if directory.join("segments").exists() || directory.join("edge_config.json").exists() {
            return Err(GatewayError::Config(format!(
                "{} already holds a shard; unpack a snapshot into an empty folder",
                directory.display()
            )));
        }
        EdgeShard::unpack_snapshot(snapshot, directory).map_err(|error| {
            unavailable(format!(
                "unpacking the shard snapshot {}: {error}",
                snapshot.display()
            ))
        })?;
        Self::open(directory, dimension)
    }

    /// Opens the shard at `path`, creating it (cosine distance, `dimension`, payload indexes)
    /// when it does not exist yet.
    pub fn open(path: &Path, dimension: usize) -> Result<EdgeVectorStore, GatewayError> {
        std::fs::create_dir_all(path)
            .map_err(|error| unavailable(format!("creating {}: {error}", path.display())))?;
        let lock_path = path.join("cairn.lock");
        let owner = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|error| unavailable(format!("opening {}: {error}", lock_path.display())))?;
        match owner.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(GatewayError::Config(format!(
                    "the vector store at {} is open in another cairn process (one process owns \
                     an embedded qdrant-edge shard: run projection inside `cairn serve` with \
                     workers.count, or stop the other process)",
                    path.display()
                )))
            }
            Err(std::fs::TryLockError::Error(error)) => {
                return Err(unavailable(format!(
                    "locking {}: {error}",
                    lock_path.display()
                )))
            }
        }
        // A shard snapshot unpacked here has segments but no edge configuration yet: it is
        // loaded (its configuration inferred from the segments), never created over.
        let existing = path.join("edge_config.json").is_file() || path.join("segments").is_dir();
        let shard = if existing {
            EdgeShard::load(path, None).map_err(unavailable)?
        } else {
            let config = EdgeConfigBuilder::new()
                .vector(
                    DEFAULT_VECTOR_NAME,
                    EdgeVectorParamsBuilder::new(dimension, Distance::Cosine).build(),
                )
                .build();
            EdgeShard::new(path, config).map_err(unavailable)?
        };
        // Every index exists before a point is written; a shard made by an older build gains
        // the ones it lacks (the `bucket` field of schema 15, the facts fields) here.
        let created = create_missing(&shard, INDEXED_FIELDS)? || !existing;
        if created {
            flush(&shard)?;
        }
        let configured = shard
            .config()
            .vectors
            .get(DEFAULT_VECTOR_NAME)
            .map(|params| params.size);
        if configured != Some(dimension) {
            return Err(GatewayError::Config(format!(
                "the vector shard at {} has dimension {configured:?}, the model {dimension}; \
                 start a new generation",
                path.display()
            )));
        }
        Ok(EdgeVectorStore {
            inner: Arc::new(Shard {
                shard: RwLock::new(Some(shard)),
                points_written: AtomicU64::new(0),
                last_write_ms: AtomicU64::new(0),
                opened: Instant::now(),
                optimizer: std::sync::Mutex::new(OptimizerStats::default()),
                _owner: owner,
                written: AtomicU64::new(0),
                flushed: std::sync::Mutex::new(0),
                lock: RwLock::new(()),
            }),
            fields: Fields::new()?,
            dimension,
            path: path.to_owned(),
        })
    }

    /// Runs `f` on the blocking pool with the shard's read or write lock; a write returns once
    /// it is on disk (group flush).
    async fn with_shard<T: Send + 'static>(
        &self,
        write: bool,
        f: impl FnOnce(&EdgeShard) -> Result<T, GatewayError> + Send + 'static,
    ) -> Result<T, GatewayError> {
        if write {
            self.with_shard_durable(true, f).await
        } else {
            self.with_shard_read(f).await
        }
    }

    /// A write; `durable`: returns once it is on disk (group flush), else once it is visible.
    async fn with_shard_durable<T: Send + 'static>(
        &self,
        durable: bool,
        f: impl FnOnce(&EdgeShard) -> Result<T, GatewayError> + Send + 'static,
    ) -> Result<T, GatewayError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let (result, seq) = {
                let _guard = inner
                    .lock
                    .write()
                    .map_err(|_| unavailable("the shard lock is poisoned"))?;
                let result = inner.with_engine(f);
                let seq = inner.written.fetch_add(1, Ordering::SeqCst) + 1;
                inner.last_write_ms.store(
                    u64::try_from(inner.opened.elapsed().as_millis()).unwrap_or(u64::MAX),
                    Ordering::SeqCst,
                );
                (result, seq)
            };
            let value = result?;
            if durable {
                inner.sync(seq)?;
            }
            Ok(value)
        })
        .await
        .map_err(|error| unavailable(format!("vector task failed: {error}")))?
    }

    /// A read, beside other reads.
    async fn with_shard_read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&EdgeShard) -> Result<T, GatewayError> + Send + 'static,
    ) -> Result<T, GatewayError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let _guard = inner
                .lock
                .read()
                .map_err(|_| unavailable("the shard lock is poisoned"))?;
            inner.with_engine(f)
        })
        .await
        .map_err(|error| unavailable(format!("vector task failed: {error}")))?
    }

    /// The payload changes of one source's `set_current`: `keep`'s points turn current (and
    /// take `head_at`), points of revisions that became head earlier turn not current.
    fn current_changes(
        &self,
        dataset: &str,
        source_key: &str,
        keep: Option<Uuid>,
        head_at: i64,
    ) -> Vec<(Filter, qdrant_edge::UpdateOperation)> {
        let fields = &self.fields;
        let source = vec![
            keyword(&fields.dataset, dataset),
            keyword(&fields.source_key, source_key),
        ];
        // Points written before payloads carried `bucket` gain it with their next projection.
        let bucket = Some(receipts::verify::bucket(dataset, source_key));
        let mut older = source.clone();
        older.push(before(&fields.head_at, head_at));
        let mut older = all_of(older);
        let mut changes = Vec::new();
        if let Some(keep) = keep {
            older.must_not = Some(vec![keyword(&fields.revision_id, &keep.to_string())]);
            let mut mine = source;
            mine.push(keyword(&fields.revision_id, &keep.to_string()));
            let mine = all_of(mine);
            let operation = set_payload(mine.clone(), true, Some(head_at), bucket);
            changes.push((mine, operation));
        }
        let operation = set_payload(older.clone(), false, None, bucket);
        changes.push((older, operation));
        changes
    }

    /// Changes the payload of the points `filter` selects. qdrant-edge moves a point whose
    /// payload changes out of an indexed segment into the appendable one (copy on write), where
    /// search is brute force: so the moved points count as written, and the optimiser's policy
    /// indexes them again after a burst of access changes or retirements.
    async fn rewrite_payload(
        &self,
        changes: Vec<(Filter, qdrant_edge::UpdateOperation)>,
    ) -> Result<(), GatewayError> {
        let moved = self
            .with_shard(true, move |shard| {
                let mut moved = 0;
                for (filter, operation) in changes {
                    moved += shard
                        .count(CountRequest {
                            filter: Some(filter),
                            exact: true,
                        })
                        .map_err(unavailable)?;
                    shard.update(operation).map_err(unavailable)?;
                }
                Ok(moved)
            })
            .await?;
        self.inner
            .points_written
            .fetch_add(moved as u64, Ordering::SeqCst);
        Ok(())
    }

    /// Starts the background optimiser: a thread that checks `policy` and runs qdrant-edge's
    /// optimisers while projection and search go on. It holds the shard only while a run is in
    /// progress and ends when the store is dropped; returns a flag that stops it sooner.
    pub fn spawn_optimizer(&self, policy: OptimizePolicy) -> Result<Arc<AtomicBool>, GatewayError> {
        let shard: Weak<Shard> = Arc::downgrade(&self.inner);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let path = self.path.clone();
        std::thread::Builder::new()
            .name("qdrant-optimizer".to_owned())
            .spawn(move || loop {
                std::thread::sleep(policy.check_every);
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Some(shard) = shard.upgrade() else {
                    return;
                };
                let written = shard.points_written.load(Ordering::SeqCst);
                let since = written.saturating_sub(shard.stats().points_at_last_run);
                let now_ms = u64::try_from(shard.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
                let quiet = Duration::from_millis(
                    now_ms.saturating_sub(shard.last_write_ms.load(Ordering::SeqCst)),
                );
                if !policy.due(since, quiet) {
                    continue;
                }
                shard.update_stats(|stats| stats.running = true);
                tracing::info!(path = %path.display(), new_points = since, "vector index optimisation started");
                let started = Instant::now();
                let Ok(outcome) = shard.with_engine(|engine| Ok(catching(|| engine.optimize())))
                else {
                    return;
                };
                let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                let outcome = match outcome {
                    Ok(Ok(changed)) => Ok(changed),
                    Ok(Err(error)) => Err(error.to_string()),
                    Err(panic) => Err(panic),
                };
                match &outcome {
                    Ok(changed) => tracing::info!(
                        path = %path.display(), ms = elapsed, changed,
                        "vector index optimisation finished"
                    ),
                    Err(message) => tracing::warn!(
                        path = %path.display(), ms = elapsed, %message,
                        "vector index optimisation failed; retried at the next policy check"
                    ),
                }
                shard.update_stats(|stats| {
                    stats.running = false;
                    stats.last_run_ms = Some(elapsed);
                    match outcome {
                        Ok(changed) => {
                            stats.runs += 1;
                            stats.points_at_last_run = written;
                            stats.last_run_changed = Some(changed);
                        }
                        Err(message) => {
                            stats.failures += 1;
                            stats.last_error = Some(message);
                        }
                    }
                });
            })
            .map_err(|error| unavailable(format!("starting the optimiser thread: {error}")))?;
        Ok(stop)
    }

    /// Upserts points; `durable`: returns once they are on disk, else once they are visible
    /// (the next durable write puts them on disk).
    async fn write_points(
        &self,
        points: Vec<VectorPoint>,
        durable: bool,
    ) -> Result<(), GatewayError> {
        if points.is_empty() {
            return Ok(());
        }
        check_dimensions(&points, self.dimension)?;
        let points: Vec<qdrant_edge::PointStructPersisted> = points
            .into_iter()
            .map(|point| {
                let bucket = receipts::verify::bucket(&point.dataset, &point.source_key);
                let mut payload = serde_json::json!({
                    "bucket": bucket,
                    "dataset": point.dataset,
                    "source_key": point.source_key,
                    "revision_id": point.revision_id.to_string(),
                    "chunk_index": point.chunk_index,
                    "head_at": point.head_at,
                    "is_current": true,
                });
                if let (Some(facts), Some(fields)) = (&point.facts, payload.as_object_mut()) {
                    fields.extend(facts.payload(&point.source_key));
                }
                PointStruct::new(
                    PointId::Uuid(point_id(point.revision_id, point.chunk_index)),
                    point.vector,
                    payload,
                )
                .into()
            })
            .collect();
        let count = points.len() as u64;
        self.inner.points_written.fetch_add(count, Ordering::SeqCst);
        self.with_shard_durable(durable, move |shard| {
            shard
                .update(qdrant_edge::UpdateOperation::PointOperation(
                    qdrant_edge::PointOperations::UpsertPoints(
                        qdrant_edge::PointInsertOperations::PointsList(points),
                    ),
                ))
                .map_err(unavailable)
        })
        .await
    }

    /// The filter of a selector.
    fn selected(&self, selector: &PointSelector) -> Filter {
        match selector {
            PointSelector::Source {
                dataset,
                source_key,
                head_before,
            } => all_of(vec![
                keyword(&self.fields.dataset, dataset),
                keyword(&self.fields.source_key, source_key),
                before(&self.fields.head_at, *head_before),
            ]),
            PointSelector::Revision(revision_id) => all_of(vec![keyword(
                &self.fields.revision_id,
                &revision_id.to_string(),
            )]),
        }
    }

    /// Closes the shard for good and deletes its directory (a retired generation): waits for
    /// calls in progress, drops the engine (every later call, through any handle, answers
    /// `unavailable`), removes the directory and reads back that it is gone. Returns the bytes
    /// freed.
    pub async fn destroy(&self) -> Result<u64, GatewayError> {
        let inner = self.inner.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let _guard = inner
                .lock
                .write()
                .map_err(|_| unavailable("the shard lock is poisoned"))?;
            let engine = inner
                .shard
                .write()
                .map_err(|_| unavailable("the engine lock is poisoned"))?
                .take();
            if let Some(engine) = engine {
                if let Err(message) = catching(move || drop(engine)) {
                    tracing::warn!(%message, "qdrant-edge failed its last flush before deletion");
                }
            }
            let bytes = directory_bytes(&path);
            match std::fs::remove_dir_all(&path) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    return Err(unavailable(format!("removing {}: {error}", path.display())))
                }
                _ => {}
            }
            if path.exists() {
                return Err(GatewayError::ReadbackMismatch {
                    store: "vector",
                    message: format!("{} still exists after it was removed", path.display()),
                });
            }
            Ok(bytes)
        })
        .await
        .map_err(|error| unavailable(format!("vector task failed: {error}")))?
    }

    /// What the background optimiser has done so far.
    pub fn optimizer_stats(&self) -> OptimizerStats {
        self.inner.stats()
    }

    /// Runs qdrant-edge's optimisers now, on the blocking pool, alongside writes and searches
    /// (benchmarks and tests; the server relies on [`EdgeVectorStore::spawn_optimizer`]).
    pub async fn optimize_now(&self) -> Result<bool, GatewayError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            inner.with_engine(|engine| {
                catching(|| engine.optimize())
                    .map_err(unavailable)?
                    .map_err(unavailable)
            })
        })
        .await
        .map_err(|error| unavailable(format!("optimiser task failed: {error}")))?
    }

    /// Points in the shard (all revisions).
    pub async fn total_points(&self) -> Result<usize, GatewayError> {
        self.with_shard(false, |shard| {
            shard
                .count(CountRequest {
                    filter: None,
                    exact: true,
                })
                .map_err(unavailable)
        })
        .await
    }
}

/// Copies every file under `source` (the shard's lock file excepted) to `target` (into the
/// page cache: [`sync_tree`] puts it on disk, after the shard is released), and answers their
/// paths relative to `target`, `/`-separated.
fn copy_tree(source: &Path, target: &Path) -> std::io::Result<Vec<String>> {
    let mut copied = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let directory = target.join(&relative);
        std::fs::create_dir_all(&directory)?;
        for entry in std::fs::read_dir(source.join(&relative))? {
            let entry = entry?;
            let name = entry.file_name();
            let path = relative.join(&name);
            let kind = entry.file_type()?;
            if kind.is_dir() {
                pending.push(path);
            } else if kind.is_file() && name != "cairn.lock" {
                std::fs::copy(entry.path(), target.join(&path))?;
                copied.push(
                    path.components()
                        .map(|part| part.as_os_str().to_string_lossy())
                        .collect::<Vec<_>>()
                        .join("/"),
                );
            }
        }
    }
    Ok(copied)
}

/// Puts the copied files, and the folders that name them, on disk.
fn sync_tree(target: &Path, copied: &[String]) -> std::io::Result<()> {
    let mut folders = std::collections::BTreeSet::new();
    for relative in copied {
        let path = target.join(relative);
        std::fs::File::open(&path)?.sync_all()?;
        let mut folder = path.parent();
        while let Some(parent) = folder.filter(|parent| parent.starts_with(target)) {
            folders.insert(parent.to_owned());
            folder = parent.parent();
        }
    }
    folders.insert(target.to_owned());
    for folder in folders {
        std::fs::File::open(folder)?.sync_all()?;
    }
    Ok(())
}

fn before(key: &JsonPath, limit: i64) -> Condition {
    Condition::Field(FieldCondition::new_range(
        key.clone(),
        qdrant_edge::Range {
            lt: Some(ordered_float::OrderedFloat(limit as f64)),
            gt: None,
            gte: None,
            lte: None,
        },
    ))
}

fn set_payload(
    filter: Filter,
    is_current: bool,
    head_at: Option<i64>,
    bucket: Option<u16>,
) -> qdrant_edge::UpdateOperation {
    let mut payload = serde_json::Map::new();
    payload.insert("is_current".to_owned(), serde_json::Value::Bool(is_current));
    if let Some(bucket) = bucket {
        payload.insert("bucket".to_owned(), serde_json::Value::from(bucket));
    }
    if let Some(head_at) = head_at {
        payload.insert("head_at".to_owned(), serde_json::Value::from(head_at));
    }
    qdrant_edge::UpdateOperation::PayloadOperation(qdrant_edge::PayloadOps::SetPayload(
        qdrant_edge::SetPayloadOp {
            payload: qdrant_edge::Payload(payload),
            points: None,
            filter: Some(filter),
            key: None,
        },
    ))
}

fn payload_text(payload: &Option<qdrant_edge::Payload>, key: &str) -> Option<String> {
    payload.as_ref()?.0.get(key)?.as_str().map(str::to_owned)
}

#[async_trait]
impl VectorStore for EdgeVectorStore {
    fn name(&self) -> &'static str {
        "qdrant-edge"
    }

    fn location(&self) -> String {
        self.path.display().to_string()
    }

    async fn vectors(&self, ids: &[Uuid]) -> Result<Vec<Option<Vec<f32>>>, GatewayError> {
        let dimension = self.dimension;
        let ids = ids.to_vec();
        self.with_shard(false, move |shard| {
            let points: Vec<PointId> = ids.iter().map(|id| PointId::Uuid(*id)).collect();
            let records = shard
                .retrieve(
                    &points,
                    Some(WithPayloadInterface::Bool(false)),
                    Some(WithVector::Bool(true)),
                )
                .map_err(unavailable)?;
            let mut found = std::collections::HashMap::new();
            for record in records {
                let vector = match record.vector {
                    Some(qdrant_edge::VectorStructInternal::Single(vector)) => Some(vector),
                    Some(qdrant_edge::VectorStructInternal::Named(mut named)) => {
                        match named.remove(DEFAULT_VECTOR_NAME) {
                            Some(qdrant_edge::VectorInternal::Dense(values)) => Some(values),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                if let (PointId::Uuid(id), Some(vector)) = (record.id, vector) {
                    if vector.len() == dimension {
                        found.insert(id, vector);
                    }
                }
            }
            // An id asked twice (two jobs of a unit reusing one vector) is answered twice.
            Ok(ids.iter().map(|id| found.get(id).cloned()).collect())
        })
        .await
    }

    async fn indexed_fields(&self) -> Result<Vec<String>, GatewayError> {
        self.with_shard(false, |shard| {
            Ok(shard
                .info()
                .payload_schema
                .keys()
                .map(|key| key.to_string())
                .collect())
        })
        .await
    }

    async fn ensure_indexes(&self, fields: &[(String, FieldKind)]) -> Result<(), GatewayError> {
        let fields = fields.to_vec();
        self.with_shard(true, move |shard| {
            create_missing(
                shard,
                fields.iter().map(|(field, kind)| (field.as_str(), *kind)),
            )
            .map(|_| ())
        })
        .await
    }

    fn dimension(&self) -> usize {
        self.dimension
    }

    async fn upsert(&self, points: Vec<VectorPoint>) -> Result<(), GatewayError> {
        self.write_points(points, true).await
    }

    async fn upsert_visible(&self, points: Vec<VectorPoint>) -> Result<(), GatewayError> {
        self.write_points(points, false).await
    }

    async fn revision_points(&self, revision_id: Uuid) -> Result<RevisionPoints, GatewayError> {
        let fields = self.fields.clone();
        let (count, current) = self
            .with_shard(false, move |shard| {
                let filter = all_of(vec![keyword(&fields.revision_id, &revision_id.to_string())]);
                let count = shard
                    .count(CountRequest {
                        filter: Some(filter.clone()),
                        exact: true,
                    })
                    .map_err(unavailable)?;
                if count == 0 {
                    // A revision not projected yet (the common case before a first write).
                    return Ok((0, 0));
                }
                let current = shard
                    .count(CountRequest {
                        filter: Some(
                            filter.merge_owned(all_of(vec![flag(&fields.is_current, true)])),
                        ),
                        exact: true,
                    })
                    .map_err(unavailable)?;
                Ok((count, current))
            })
            .await?;
        let ids: Vec<Uuid> = (0..u32::try_from(count).unwrap_or(u32::MAX))
            .map(|index| point_id(revision_id, index))
            .collect();
        let with_dimension = self.vectors(&ids).await?.iter().flatten().count();
        Ok(RevisionPoints {
            count,
            with_dimension,
            current,
        })
    }

    async fn set_current(
        &self,
        dataset: &str,
        source_key: &str,
        keep: Option<Uuid>,
        head_at: i64,
    ) -> Result<(), GatewayError> {
        self.rewrite_payload(self.current_changes(dataset, source_key, keep, head_at))
            .await
    }

    async fn set_current_many(&self, changes: &[CurrentChange]) -> Result<(), GatewayError> {
        // One shard write and one flush for the whole unit.
        let operations = changes
            .iter()
            .flat_map(|change| {
                self.current_changes(
                    &change.dataset,
                    &change.source_key,
                    Some(change.keep),
                    change.head_at,
                )
            })
            .collect();
        self.rewrite_payload(operations).await
    }

    async fn revisions_points(
        &self,
        revision_ids: &[Uuid],
    ) -> Result<Vec<RevisionPoints>, GatewayError> {
        let fields = self.fields.clone();
        let revisions = revision_ids.to_vec();
        // One read of the shard for every revision's counts, one for their vectors.
        let counts = self
            .with_shard(false, move |shard| {
                let mut counts = Vec::with_capacity(revisions.len());
                for revision_id in revisions {
                    let filter =
                        all_of(vec![keyword(&fields.revision_id, &revision_id.to_string())]);
                    let count = shard
                        .count(CountRequest {
                            filter: Some(filter.clone()),
                            exact: true,
                        })
                        .map_err(unavailable)?;
                    let current = if count == 0 {
                        0
                    } else {
                        shard
                            .count(CountRequest {
                                filter: Some(
                                    filter
                                        .merge_owned(all_of(vec![flag(&fields.is_current, true)])),
                                ),
                                exact: true,
                            })
                            .map_err(unavailable)?
                    };
                    counts.push((revision_id, count, current));
                }
                Ok(counts)
            })
            .await?;
        let ids: Vec<Uuid> = counts
            .iter()
            .flat_map(|(revision_id, count, _)| {
                (0..u32::try_from(*count).unwrap_or(u32::MAX))
                    .map(move |index| point_id(*revision_id, index))
            })
            .collect();
        let found = self.vectors(&ids).await?;
        let mut found = found.iter();
        Ok(counts
            .into_iter()
            .map(|(_, count, current)| RevisionPoints {
                count,
                with_dimension: found.by_ref().take(count).flatten().count(),
                current,
            })
            .collect())
    }

    async fn source_current(&self, dataset: &str, source_key: &str) -> Result<usize, GatewayError> {
        let fields = self.fields.clone();
        let filter = all_of(vec![
            keyword(&fields.dataset, dataset),
            keyword(&fields.source_key, source_key),
            flag(&fields.is_current, true),
        ]);
        self.with_shard(false, move |shard| {
            shard
                .count(CountRequest {
                    filter: Some(filter),
                    exact: true,
                })
                .map_err(unavailable)
        })
        .await
    }

    async fn set_readers(
        &self,
        dataset: &str,
        source_key: &str,
        readers: &[String],
    ) -> Result<(), GatewayError> {
        let filter = all_of(vec![
            keyword(&self.fields.dataset, dataset),
            keyword(&self.fields.source_key, source_key),
        ]);
        let payload = super::payload::readers_payload(readers);
        let operation = qdrant_edge::UpdateOperation::PayloadOperation(
            qdrant_edge::PayloadOps::SetPayload(qdrant_edge::SetPayloadOp {
                payload: qdrant_edge::Payload(payload),
                points: None,
                filter: Some(filter.clone()),
                key: None,
            }),
        );
        self.rewrite_payload(vec![(filter, operation)]).await
    }

    async fn readers_held(
        &self,
        dataset: &str,
        source_key: &str,
        readers: &[String],
    ) -> Result<(usize, usize), GatewayError> {
        let source = vec![
            keyword(&self.fields.dataset, dataset),
            keyword(&self.fields.source_key, source_key),
        ];
        let mut carrying = source.clone();
        carrying.push(keyword(
            &payload_path("readers_digest")?,
            &super::payload::readers_digest(readers),
        ));
        self.with_shard(false, move |shard| {
            let count = |filter: Filter| {
                shard
                    .count(CountRequest {
                        filter: Some(filter),
                        exact: true,
                    })
                    .map_err(unavailable)
            };
            Ok((count(all_of(source))?, count(all_of(carrying))?))
        })
        .await
    }

    async fn retire_revision(&self, revision_id: Uuid) -> Result<(), GatewayError> {
        let filter = all_of(vec![keyword(
            &self.fields.revision_id,
            &revision_id.to_string(),
        )]);
        let operation = set_payload(filter.clone(), false, None, None);
        self.rewrite_payload(vec![(filter, operation)]).await
    }

    async fn delete_points(&self, selector: PointSelector) -> Result<(), GatewayError> {
        let filter = self.selected(&selector);
        self.with_shard(true, move |shard| {
            shard
                .update(qdrant_edge::UpdateOperation::PointOperation(
                    qdrant_edge::PointOperations::DeletePointsByFilter(filter),
                ))
                .map_err(unavailable)
        })
        .await
    }

    async fn count_points(&self, selector: PointSelector) -> Result<usize, GatewayError> {
        let filter = self.selected(&selector);
        self.with_shard(false, move |shard| {
            shard
                .count(CountRequest {
                    filter: Some(filter),
                    exact: true,
                })
                .map_err(unavailable)
        })
        .await
    }

    async fn bucket_points(&self, bucket: u16, vectors: bool) -> Result<Vec<Held>, GatewayError> {
        let filter = all_of(vec![integer_is(&self.fields.bucket, i64::from(bucket))]);
        let dimension = self.dimension;
        let mut points = Vec::new();
        let mut offset = None;
        loop {
            let request = ScrollRequest {
                offset,
                limit: Some(SCROLL_PAGE),
                filter: Some(filter.clone()),
                with_payload: Some(WithPayloadInterface::Bool(true)),
                with_vector: WithVector::Bool(vectors),
                order_by: None,
            };
            let (records, next) = self
                .with_shard(false, move |shard| {
                    shard.scroll(request).map_err(unavailable)
                })
                .await?;
            for record in records {
                let values: Option<&[f32]> = record.vector.as_ref().map(|vector| match vector {
                    qdrant_edge::VectorStructInternal::Single(values) => values.as_slice(),
                    qdrant_edge::VectorStructInternal::Named(named) => {
                        match named.get(DEFAULT_VECTOR_NAME) {
                            Some(qdrant_edge::VectorInternal::Dense(values)) => values.as_slice(),
                            _ => &[],
                        }
                    }
                    _ => &[],
                });
                let dimension = values.map(<[f32]>::len);
                let length = values.map(super::norm);
                let is_current = record
                    .payload
                    .as_ref()
                    .and_then(|payload| payload.0.get("is_current"))
                    .and_then(serde_json::Value::as_bool)
                    .unwrap_or(false);
                points.push(ScrolledPoint {
                    dataset: payload_text(&record.payload, "dataset"),
                    source_key: payload_text(&record.payload, "source_key"),
                    revision_id: payload_text(&record.payload, "revision_id"),
                    is_current,
                    dimension,
                    norm: length,
                });
            }
            match next {
                Some(next) => offset = Some(next),
                None => break,
            }
        }
        Ok(fold_points(points, dimension))
    }

    async fn bucket_current(&self, bucket: u16) -> Result<usize, GatewayError> {
        let filter = all_of(vec![
            integer_is(&self.fields.bucket, i64::from(bucket)),
            flag(&self.fields.is_current, true),
        ]);
        self.with_shard(false, move |shard| {
            shard
                .count(CountRequest {
                    filter: Some(filter),
                    exact: true,
                })
                .map_err(unavailable)
        })
        .await
    }

    async fn bucket_counts(&self) -> Result<std::collections::HashMap<u16, usize>, GatewayError> {
        let field = self.fields.bucket.clone();
        self.with_shard(false, move |shard| {
            let mut counts = std::collections::HashMap::new();
            for bucket in 0..receipts::verify::BUCKETS {
                let count = shard
                    .count(CountRequest {
                        filter: Some(all_of(vec![integer_is(&field, i64::from(bucket))])),
                        exact: true,
                    })
                    .map_err(unavailable)?;
                if count > 0 {
                    counts.insert(bucket, count);
                }
            }
            Ok(counts)
        })
        .await
    }

    async fn scroll_all(
        &self,
        after: Option<Uuid>,
        limit: usize,
    ) -> Result<(Vec<StoredPoint>, Option<Uuid>), GatewayError> {
        // Scrolling from an id includes it: start after `after` by asking one more.
        let request = ScrollRequest {
            offset: after.map(PointId::Uuid),
            limit: Some(limit.max(1) + usize::from(after.is_some())),
            filter: None,
            with_payload: Some(WithPayloadInterface::Bool(true)),
            with_vector: WithVector::Bool(true),
            order_by: None,
        };
        let (records, next) = self
            .with_shard(false, move |shard| {
                shard.scroll(request).map_err(unavailable)
            })
            .await?;
        let mut points = Vec::with_capacity(records.len());
        for record in records {
            let PointId::Uuid(id) = record.id else {
                continue;
            };
            if Some(id) == after {
                continue;
            }
            let vector = match record.vector {
                Some(qdrant_edge::VectorStructInternal::Single(values)) => values,
                Some(qdrant_edge::VectorStructInternal::Named(mut named)) => {
                    match named.remove(DEFAULT_VECTOR_NAME) {
                        Some(qdrant_edge::VectorInternal::Dense(values)) => values,
                        _ => Vec::new(),
                    }
                }
                _ => Vec::new(),
            };
            points.push(StoredPoint {
                id,
                vector,
                payload: record.payload.map(|payload| payload.0).unwrap_or_default(),
            });
        }
        let next = match next {
            Some(PointId::Uuid(_)) => points.last().map(|point| point.id),
            _ => None,
        };
        Ok((points, next))
    }

    async fn put_points(&self, points: Vec<StoredPoint>) -> Result<(), GatewayError> {
        super::check_stored_dimensions(&points, self.dimension)?;
        let points: Vec<qdrant_edge::PointStructPersisted> = points
            .into_iter()
            .map(|point| {
                PointStruct::new(
                    PointId::Uuid(point.id),
                    point.vector,
                    serde_json::Value::Object(point.payload),
                )
                .into()
            })
            .collect();
        self.with_shard_durable(true, move |shard| {
            shard
                .update(qdrant_edge::UpdateOperation::PointOperation(
                    qdrant_edge::PointOperations::UpsertPoints(
                        qdrant_edge::PointInsertOperations::PointsList(points),
                    ),
                ))
                .map_err(unavailable)
        })
        .await
    }

    async fn backup_to(&self, target: &Path) -> Result<StoreBackup, GatewayError> {
        if target.exists() {
            return Err(GatewayError::Config(format!(
                "{} exists already; a backup never overwrites",
                target.display()
            )));
        }
        let points = self.total_points().await?;
        let inner = self.inner.clone();
        let (source, target) = (self.path.clone(), target.to_owned());
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let copied = {
                // Writes and reads wait: the files are copied as one flushed state (into the
                // page cache; they reach the disk after the shard is released).
                let _guard = inner
                    .lock
                    .write()
                    .map_err(|_| unavailable("the shard lock is poisoned"))?;
                inner.with_engine(flush)?;
                copy_tree(&source, &target)
            };
            let held_ms = started.elapsed().as_secs_f64() * 1000.0;
            // The disk writes happen here, with the shard serving again.
            let copied = copied
                .map_err(|error| unavailable(format!("copying {}: {error}", source.display())))?;
            sync_tree(&target, &copied)
                .map_err(|error| unavailable(format!("syncing the copy: {error}")))?;
            let mut files = Vec::new();
            for relative in copied {
                let (sha256, bytes) = super::file_sha256(&target.join(&relative))
                    .map_err(|error| unavailable(format!("hashing the copy: {error}")))?;
                files.push(BackupFile {
                    path: relative,
                    bytes,
                    sha256,
                });
            }
            files.sort_by(|a, b| a.path.cmp(&b.path));
            Ok(StoreBackup {
                files,
                points,
                held_ms,
            })
        })
        .await
        .map_err(|error| unavailable(format!("backup task failed: {error}")))?
    }

    async fn ensure_present(&self, _create: bool) -> Result<bool, GatewayError> {
        // The shard is open in this process (its lock is held): it exists until destroyed.
        self.with_shard(false, |_| Ok(true)).await
    }

    async fn close(&self) -> Result<(), GatewayError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let _guard = inner
                .lock
                .write()
                .map_err(|_| unavailable("the shard lock is poisoned"))?;
            inner.with_engine(flush)
        })
        .await
        .map_err(|error| unavailable(format!("vector task failed: {error}")))?
    }

    async fn search(
        &self,
        vector: Vec<f32>,
        datasets: &[String],
        filter: Option<&PayloadFilter>,
        limit: usize,
    ) -> Result<Vec<VectorHit>, GatewayError> {
        self.nearest(vector, datasets, limit, true, None, filter)
            .await
    }

    async fn search_any(
        &self,
        vector: Vec<f32>,
        datasets: &[String],
        filter: Option<&PayloadFilter>,
        limit: usize,
    ) -> Result<Vec<VectorHit>, GatewayError> {
        self.nearest(vector, datasets, limit, false, None, filter)
            .await
    }

    async fn search_within(
        &self,
        vector: Vec<f32>,
        datasets: &[String],
        revisions: &[Uuid],
        any_revision: bool,
        limit: usize,
    ) -> Result<Vec<VectorHit>, GatewayError> {
        self.nearest(
            vector,
            datasets,
            limit,
            !any_revision,
            Some(revisions),
            None,
        )
        .await
    }
}
