//! The vector backend: one [`VectorStore`] trait free of vendor types, and its two
//! implementations: [`EdgeVectorStore`] (qdrant-edge, the in-process engine, persisted under
//! the data directory; the embedded default) and [`ServerVectorStore`] (a Qdrant server or
//! cluster through the official `qdrant-client`, over gRPC).
//!
//! ## Model
//! A store holds one projection generation: a shard directory per generation (edge), a
//! collection per generation (server). A process that projects or searches several
//! generations reaches their stores through one [`VectorStores`] registry, which opens each
//! store once (an embedded shard has one owner). A point is one chunk of one revision, with the payload
//! `dataset`, `source_key`, `revision_id`, `chunk_index`, `head_at`, `is_current` and `bucket`
//! (the source's verify bucket, [`receipts::verify::bucket`], so that verify reads one bucket
//! of points without a full scroll), and, written by a projection, its revision's facts
//! (`facts`, `tags`, `media_type`, `metadata`, `accepted_at`, `key_prefixes`: [`PointFacts`])
//! that a search filter is pushed down to ([`pushdown`]).
//!
//! ## Invariants (both implementations; `tests/vector_conformance.rs` runs one suite on both)
//! - Point ids are derived from (revision id, chunk index): projecting twice overwrites, never
//!   duplicates.
//! - Payload indexes on the filtered fields ([`INDEXED_FIELDS`]) exist before the first point
//!   is written.
//! - [`VectorStore::upsert`] returns once the write is durable and visible to reads, so a
//!   read-back checks what the store holds; [`VectorStore::upsert_visible`] once it is visible,
//!   durable with the next durable write. Every other write is durable when it returns.
//! - `is_current` flips are ordered by `head_at`: a late write of an older head never retires a
//!   newer one.
//! - Search filters by dataset and `is_current = true` inside the store, and by the pushed-down
//!   search filter, which passes a superset of the matching points (every point without
//!   facts among them); the caller still binds every hit to the ledger's current head.

mod edge;
mod payload;
mod server;

pub use edge::{EdgeVectorStore, OptimizePolicy, OptimizerStats};
pub use payload::{
    digest, key_prefixes, pushdown, readers_digest, readers_payload, PayloadFilter, PointFacts,
    Pushed, FACTS_VERSION, MAX_PAYLOAD_METADATA_BYTES,
};
pub use server::{CollectionLayout, ServerOptions, ServerVectorStore};

use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

use crate::GatewayError;
pub use receipts::verify::Held;

/// How a payload field is indexed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// Exact-match strings.
    Keyword,
    /// Integers (matches and ranges).
    Integer,
    /// Numbers (ranges).
    Float,
    /// Booleans.
    Bool,
}

impl FieldKind {
    /// The kind a filterable metadata field is declared with (`keyword`, `number`, `bool`: the
    /// words of `datasets.<d>.filterable` and `POST /v1/filterable`).
    pub fn of_setting(word: &str) -> Option<FieldKind> {
        match word {
            "keyword" => Some(FieldKind::Keyword),
            "number" => Some(FieldKind::Float),
            "bool" => Some(FieldKind::Bool),
            _ => None,
        }
    }
}

/// The payload fields search and projection filter by, indexed before any point is written.
/// The last six carry a revision's facts ([`PointFacts`]) and its source's readers, which a
/// search filter is pushed down to.
pub const INDEXED_FIELDS: [(&str, FieldKind); 13] = [
    ("head_at", FieldKind::Integer),
    ("dataset", FieldKind::Keyword),
    ("source_key", FieldKind::Keyword),
    ("revision_id", FieldKind::Keyword),
    ("is_current", FieldKind::Bool),
    ("chunk_index", FieldKind::Integer),
    ("bucket", FieldKind::Integer),
    ("facts", FieldKind::Integer),
    ("tags", FieldKind::Keyword),
    ("media_type", FieldKind::Keyword),
    ("key_prefixes", FieldKind::Keyword),
    ("accepted_at", FieldKind::Integer),
    ("readers", FieldKind::Keyword),
];

/// Points a bucket scroll reads per request.
const SCROLL_PAGE: usize = 1000;

/// One chunk's vector and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct VectorPoint {
    /// Dataset of the source.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// The revision the chunk belongs to.
    pub revision_id: Uuid,
    /// The chunk's position in the revision.
    pub chunk_index: u32,
    /// When the revision became head (the job's creation, epoch microseconds): orders the
    /// source's revisions, so a late write of an older head can never retire a newer one.
    pub head_at: i64,
    /// The embedding.
    pub vector: Vec<f32>,
    /// The revision's facts that a search filter tests, written as payload (`None`: unknown;
    /// such a point passes every pushed-down filter and is judged at binding).
    pub facts: Option<Arc<PointFacts>>,
}

/// A nearest-neighbour hit.
#[derive(Debug, Clone, PartialEq)]
pub struct VectorHit {
    /// Dataset of the source.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// The revision the point belongs to.
    pub revision_id: Uuid,
    /// The chunk's position in the revision.
    pub chunk_index: u32,
    /// Cosine similarity.
    pub score: f32,
}

/// What the store holds for a revision (the read-back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RevisionPoints {
    /// Points stored for the revision.
    pub count: usize,
    /// Of those, points whose vector has the store's dimension.
    pub with_dimension: usize,
    /// Of those, points marked current.
    pub current: usize,
}

/// One source's [`VectorStore::set_current`], as a unit of projections asks for it in
/// [`VectorStore::set_current_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentChange {
    /// Dataset.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// The revision whose points turn current.
    pub keep: Uuid,
    /// When it became head (epoch microseconds).
    pub head_at: i64,
}

/// A point as the store holds it: the portable dump's line.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoredPoint {
    /// The point id.
    pub id: Uuid,
    /// Its vector.
    pub vector: Vec<f32>,
    /// Its payload, every field (`dataset`, `source_key`, `revision_id`, `chunk_index`,
    /// `head_at`, `is_current`, `bucket`).
    pub payload: serde_json::Map<String, serde_json::Value>,
}

/// One file a store backup wrote.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BackupFile {
    /// Its path inside the store's backup folder, `/`-separated.
    pub path: String,
    /// Its size.
    pub bytes: u64,
    /// Its SHA-256, hex.
    pub sha256: String,
}

/// What a store backup wrote.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoreBackup {
    /// The files, in path order.
    pub files: Vec<BackupFile>,
    /// Points in the store when it was copied.
    pub points: usize,
    /// How long writes (projection) and searches waited on the store while it was copied,
    /// in milliseconds.
    pub held_ms: f64,
}

/// The SHA-256 and size of a file, read in blocks.
pub fn file_sha256(path: &std::path::Path) -> std::io::Result<(String, u64)> {
    use sha2::Digest;
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
        bytes += read as u64;
    }
    Ok((hex::encode(hasher.finalize()), bytes))
}

/// Which points an erasure deletes and counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PointSelector {
    /// Every point of a source's revisions that became head before `head_before`, current or
    /// not (an erasure spares revisions ingested after it).
    Source {
        /// Dataset.
        dataset: String,
        /// Source key.
        source_key: String,
        /// Epoch microseconds; later heads are not selected.
        head_before: i64,
    },
    /// Every point of one revision.
    Revision(Uuid),
}

/// A store of chunk vectors.
#[async_trait]
pub trait VectorStore: Send + Sync + 'static {
    /// The store's name for receipts and logs (`qdrant-edge`, `qdrant-server`).
    fn name(&self) -> &'static str;
    /// Where this generation's points live (a shard directory, or a collection at a server),
    /// for receipts and logs; never a secret.
    fn location(&self) -> String;
    /// The vectors' dimension.
    fn dimension(&self) -> usize;
    /// Writes points (marked current) durably, replacing points with the same identity.
    async fn upsert(&self, points: Vec<VectorPoint>) -> Result<(), GatewayError>;
    /// [`VectorStore::upsert`], returning once the points are visible to reads; they reach
    /// the disk with the next durable write (a projection's [`VectorStore::set_current`]), so
    /// a caller verifies nothing before that write returns. The default waits for durability.
    async fn upsert_visible(&self, points: Vec<VectorPoint>) -> Result<(), GatewayError> {
        self.upsert(points).await
    }
    /// Reads back what is stored for a revision.
    async fn revision_points(&self, revision_id: Uuid) -> Result<RevisionPoints, GatewayError>;
    /// Makes the revision that became head at `head_at` the source's current one: points of
    /// revisions that became head earlier turn not current, `keep`'s points turn current (and
    /// take `head_at`). `keep = None` (a tombstone) retires everything older than `head_at`.
    /// Points of a revision that became head later are never touched.
    async fn set_current(
        &self,
        dataset: &str,
        source_key: &str,
        keep: Option<Uuid>,
        head_at: i64,
    ) -> Result<(), GatewayError>;
    /// [`VectorStore::set_current`] for several sources (distinct ones), durably in one write
    /// where the store can: a unit of projections makes its revisions current together.
    async fn set_current_many(&self, changes: &[CurrentChange]) -> Result<(), GatewayError> {
        for change in changes {
            self.set_current(
                &change.dataset,
                &change.source_key,
                Some(change.keep),
                change.head_at,
            )
            .await?;
        }
        Ok(())
    }
    /// [`VectorStore::revision_points`] of several revisions, in their order (a unit's
    /// read-back).
    async fn revisions_points(
        &self,
        revision_ids: &[Uuid],
    ) -> Result<Vec<RevisionPoints>, GatewayError> {
        let mut out = Vec::with_capacity(revision_ids.len());
        for revision_id in revision_ids {
            out.push(self.revision_points(*revision_id).await?);
        }
        Ok(out)
    }
    /// Points of a source marked current (a tombstone's read-back expects none).
    async fn source_current(&self, dataset: &str, source_key: &str) -> Result<usize, GatewayError>;
    /// Writes a source's readers (empty: it names none) onto every point of the source, of
    /// every revision, durably before it returns: an access job's write.
    async fn set_readers(
        &self,
        dataset: &str,
        source_key: &str,
        readers: &[String],
    ) -> Result<(), GatewayError>;
    /// The source's points, and how many of them carry exactly `readers` (by digest): an
    /// access job's read-back.
    async fn readers_held(
        &self,
        dataset: &str,
        source_key: &str,
        readers: &[String],
    ) -> Result<(usize, usize), GatewayError>;
    /// Marks a revision's points not current (a stale run undoing its own write).
    async fn retire_revision(&self, revision_id: Uuid) -> Result<(), GatewayError>;
    /// Deletes the selected points, durably before it returns (erasure).
    async fn delete_points(&self, selector: PointSelector) -> Result<(), GatewayError>;
    /// The selected points, current or not (erasure's read-back expects none).
    async fn count_points(&self, selector: PointSelector) -> Result<usize, GatewayError>;
    /// Nearest current points in `datasets` (empty: every dataset) that pass `filter` (a
    /// search filter pushed down, [`pushdown`]), best first. The store's planner picks the
    /// index walk or an exact search by how many points the filter selects.
    async fn search(
        &self,
        vector: Vec<f32>,
        datasets: &[String],
        filter: Option<&PayloadFilter>,
        limit: usize,
    ) -> Result<Vec<VectorHit>, GatewayError>;
    /// Nearest points of any revision, current or not, in `datasets`, that pass `filter`,
    /// best first: the candidates of a search at a past valid or record time, which binding
    /// then narrows to the revisions held then.
    async fn search_any(
        &self,
        vector: Vec<f32>,
        datasets: &[String],
        filter: Option<&PayloadFilter>,
        limit: usize,
    ) -> Result<Vec<VectorHit>, GatewayError>;
    /// [`VectorStore::search`] (or, with `any_revision`, [`VectorStore::search_any`])
    /// among the points of `revisions` only, searched exactly (no approximation, so nothing
    /// that matches is missed): the narrowing a search filter computed in the ledger.
    async fn search_within(
        &self,
        vector: Vec<f32>,
        datasets: &[String],
        revisions: &[Uuid],
        any_revision: bool,
        limit: usize,
    ) -> Result<Vec<VectorHit>, GatewayError>;
    /// The stored vectors of these point ids, in order (`None` where a point is missing or
    /// has another dimension): where a projection reuses the vector of an unchanged chunk.
    async fn vectors(&self, ids: &[Uuid]) -> Result<Vec<Option<Vec<f32>>>, GatewayError>;
    /// The payload fields the store holds an index for (read from the store itself).
    async fn indexed_fields(&self) -> Result<Vec<String>, GatewayError>;
    /// Creates the payload indexes among `fields` that the store lacks (metadata fields a
    /// dataset declares filterable, `metadata.<name>`); the store indexes its existing points
    /// as it creates each. Idempotent.
    async fn ensure_indexes(&self, fields: &[(String, FieldKind)]) -> Result<(), GatewayError>;
    /// Every point of a verify bucket, by revision and the source its payload names, read
    /// without vectors; with `vectors`, each point's vector is read as well and checked
    /// against the store's dimension (the deep tier).
    async fn bucket_points(&self, bucket: u16, vectors: bool) -> Result<Vec<Held>, GatewayError>;
    /// Points of a verify bucket flagged current (the counts tier).
    async fn bucket_current(&self, bucket: u16) -> Result<usize, GatewayError>;
    /// Every point counted per verify bucket, current or not; a bucket that holds none is
    /// absent: what lets a verify pass settle an empty bucket from the ledger without reading
    /// it. One request on a server (a facet count of the indexed `bucket` field), exact counts
    /// of the in-process index on the embedded store. On a replicated collection the facet sums
    /// the replicas its quorum read consulted, so a count may be higher than the points held,
    /// never lower, and a bucket it leaves out holds none.
    async fn bucket_counts(&self) -> Result<std::collections::HashMap<u16, usize>, GatewayError>;
    /// Whether the store's container (a shard, a collection) exists; with `create`, a missing
    /// one is created first, with its payload indexes (verify's repair of a dropped
    /// collection), and the answer is true.
    async fn ensure_present(&self, create: bool) -> Result<bool, GatewayError>;
    /// One page of every point, by point id from `after` (exclusive), with vectors and
    /// payloads: the portable dump. Answers the page and the id to continue after.
    async fn scroll_all(
        &self,
        after: Option<Uuid>,
        limit: usize,
    ) -> Result<(Vec<StoredPoint>, Option<Uuid>), GatewayError>;
    /// Writes points exactly as given, payload included, durably (loading a portable dump).
    async fn put_points(&self, points: Vec<StoredPoint>) -> Result<(), GatewayError>;
    /// Copies the store's data into the new folder `target` for a backup, consistent at one
    /// moment: writes wait while it copies (the answer says how long). A Qdrant server
    /// answers `Config` (its snapshot API is not driven yet).
    async fn backup_to(&self, target: &std::path::Path) -> Result<StoreBackup, GatewayError>;
    /// Puts everything written on disk before the process stops, and reports what failed (a
    /// full disk, say) instead of failing later where nobody can handle it. Called once, at
    /// shutdown.
    async fn close(&self) -> Result<(), GatewayError>;
}

/// The vector stores of the generations a process uses, each opened on first use and shared
/// by its workers and its search.
#[async_trait]
pub trait VectorStores: Send + Sync {
    /// The store holding `generation`'s points.
    async fn store(&self, generation: &str) -> Result<Arc<dyn VectorStore>, GatewayError>;
}

/// A registry of one store, for one generation (a process that never changes generation,
/// such as a benchmark).
#[derive(Clone)]
pub struct OneStore {
    generation: String,
    store: Arc<dyn VectorStore>,
}

impl OneStore {
    /// `store` holds `generation`.
    pub fn new(generation: &str, store: Arc<dyn VectorStore>) -> OneStore {
        OneStore {
            generation: generation.to_owned(),
            store,
        }
    }
}

#[async_trait]
impl VectorStores for OneStore {
    async fn store(&self, generation: &str) -> Result<Arc<dyn VectorStore>, GatewayError> {
        if generation == self.generation {
            Ok(self.store.clone())
        } else {
            Err(GatewayError::Config(format!(
                "this process holds the vectors of generation {} only, not {generation}",
                self.generation
            )))
        }
    }
}

/// The point id of a chunk: UUID v5 of the chunk index in the revision's namespace.
pub fn point_id(revision_id: Uuid, chunk_index: u32) -> Uuid {
    Uuid::new_v5(&revision_id, chunk_index.to_string().as_bytes())
}

/// Refuses a write holding a vector of another dimension than the store's (before anything is
/// sent, so nothing of it is written).
fn check_dimensions(points: &[VectorPoint], dimension: usize) -> Result<(), GatewayError> {
    check_lengths(points.iter().map(|point| point.vector.len()), dimension)
}

/// [`check_dimensions`] for points written as stored (a dump being loaded).
fn check_stored_dimensions(points: &[StoredPoint], dimension: usize) -> Result<(), GatewayError> {
    check_lengths(points.iter().map(|point| point.vector.len()), dimension)
}

fn check_lengths(
    mut lengths: impl Iterator<Item = usize>,
    dimension: usize,
) -> Result<(), GatewayError> {
    match lengths.find(|length| *length != dimension) {
        Some(bad) => Err(GatewayError::Config(format!(
            "a vector of dimension {bad} for a store of dimension {dimension}"
        ))),
        None => Ok(()),
    }
}

/// One point as a bucket scroll reads it: the source and revision its payload names, whether
/// it is current, and its vector's length when vectors were read.
struct ScrolledPoint {
    dataset: Option<String>,
    source_key: Option<String>,
    revision_id: Option<String>,
    is_current: bool,
    dimension: Option<usize>,
    /// Its vector's length, when vectors were read.
    norm: Option<f32>,
}

/// The Euclidean length of a vector.
pub fn norm(values: &[f32]) -> f32 {
    values.iter().map(|x| x * x).sum::<f32>().sqrt()
}

/// Folds scrolled points into one [`Held`] per revision and named source. A point whose
/// revision id is missing or unreadable is held under the nil revision (which the ledger never
/// holds: it is reported `extra`).
fn fold_points(points: Vec<ScrolledPoint>, dimension: usize) -> Vec<Held> {
    let mut held: std::collections::BTreeMap<(Uuid, String, String), Held> =
        std::collections::BTreeMap::new();
    for point in points {
        let revision_id = point
            .revision_id
            .as_deref()
            .and_then(|text| text.parse().ok())
            .unwrap_or_else(Uuid::nil);
        let dataset = point.dataset.unwrap_or_default();
        let source_key = point.source_key.unwrap_or_default();
        let entry = held
            .entry((revision_id, dataset.clone(), source_key.clone()))
            .or_insert_with(|| Held {
                revision_id,
                dataset,
                source_key,
                points: 0,
                current: 0,
                wrong_dimension: 0,
                bad_norm: 0,
            });
        entry.points += 1;
        entry.current += u32::from(point.is_current);
        if point.dimension.is_some_and(|found| found != dimension) {
            entry.wrong_dimension += 1;
        }
        if point.norm.is_some_and(|length| (length - 1.0).abs() > 1e-3) {
            entry.bad_norm += 1;
        }
    }
    held.into_values().collect()
}
