//! # search: the query path
//!
//! A query runs under **one deadline** (its budget). Two phases run side by side:
//! - **vector**: embed the query, ask the vector store for the nearest points that are marked
//!   current in the requested datasets, then **bind** every hit to the ledger (the revision is
//!   its source's head, not deleted, and vector-searchable in the generation searched: the
//!   one active when the query starts, whose store the query searches). It gets
//!   [`VECTOR_SHARE`] of the budget and is cancelled by cairn when that runs out.
//! - **lexical**: BM25 over the ledger's FTS5 index of current heads (maintained at
//!   acceptance, so a document is findable as soon as its receipt is issued), interrupted by
//!   SQLite itself at the deadline.
//!
//! Their ranked lists are fused by reciprocal rank ([`fusion`]). When the vector phase times
//! out or fails the answer comes from lexical alone, flagged `lexical_fallback` and
//! `degraded`; when nothing can answer within the budget the error is `search_timeout` (504).
//!
//! ## Invariants
//! - No result points at a superseded revision or a deleted source: vector hits are filtered
//!   by `is_current` in the store and checked against the ledger; lexical hits come from
//!   current heads; and the final page is checked against the ledger once more just before it
//!   is returned (in vector mode the binding itself is that last check). Every hit dropped by a check is counted (`stale_dropped`), and the pages are
//!   refilled from further candidates, so drops never silently shorten an answer.
//! - Dataset permissions apply to every phase: the store's filter, the ledger query and the
//!   binding all use the same dataset list.
//! - A search filter is pushed down to the store as a prefilter over the points' payload
//!   ([`gateways::vectors::pushdown`]) that passes a superset of the matching points, and
//!   binding checks every hit against the ledger's current revision: the prefilter only
//!   makes a selective filter fast, it never decides what may be returned.
//! - Admission is bounded: `max_in_flight` searches run, up to `max_queued` more wait for a
//!   slot, and the wait counts against each request's budget. A request gets `overloaded`
//!   (429) when the queue is full or a slot would leave its vector phase less than
//!   [`MIN_VECTOR_TIME`]; never a timeout. A timeout is never reported as overload.
//! - No work outlives the budget by more than one bounded step: the lexical query is
//!   interrupted inside SQLite; the vector phase is dropped at its deadline, leaving at most the
//!   embedding of one query (at most 256 tokens) or one store search to finish on the blocking
//!   pool.

pub mod api;
pub mod facets;
pub mod fusion;
pub mod graph;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateways::{EmbedRole, Embedders, GatewayError, VectorHit, VectorStores};
use receipts::filter::{Filter, FilterLimits};
use receipts::validity::At;
use receipts::{BoundHit, HitRef, LedgerError, LexicalHit, SearchLedger};
use serde::Serialize;
use uuid::Uuid;

pub use api::{router, routes};

/// The generation named when none is active (nothing is vector-searchable in it).
const NO_GENERATION: &str = "";

/// Share of the budget the vector phase (embed, search, bind) may use in `auto` mode.
pub const VECTOR_SHARE: f64 = 0.75;

/// The least time a queued search must have left for its vector phase when it gets a slot
/// (a search takes about 5 ms idle and 11 ms under projection); a slot that would come later
/// is refused with 429 instead.
pub const MIN_VECTOR_TIME: Duration = Duration::from_millis(25);

/// Counts a request out of the admission queue when it leaves (admitted, refused or dropped).
struct QueuedGuard<'a>(&'a AtomicUsize);

impl Drop for QueuedGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
/// Longest query, in characters.
pub const MAX_QUERY_CHARS: usize = 2000;
/// Most results per request.
pub const MAX_TOP_K: usize = 100;
/// Results when the request does not say.
pub const DEFAULT_TOP_K: usize = 10;
/// Most vector hits fetched while refilling after stale drops.
pub const MAX_VECTOR_FETCH: usize = 2000;

/// Limits of the search API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchSettings {
    /// Searches running at once; more wait in the admission queue.
    pub max_in_flight: usize,
    /// Searches waiting for a slot; more are refused with 429 at once.
    pub max_queued: usize,
    /// Budget when the request does not give one.
    pub default_budget: Duration,
    /// Largest budget a request may ask for.
    pub max_budget: Duration,
    /// Bounds on a request's filter (`search.filter_max_*`).
    pub filter_limits: FilterLimits,
    /// Most revisions a filtered vector search is narrowed to (searched exactly among their
    /// points); a filter that selects more searches the index and keeps the hits that match.
    pub filter_max_narrowing: usize,
}

impl Default for SearchSettings {
    fn default() -> Self {
        Self {
            max_in_flight: 32,
            max_queued: 256,
            default_budget: Duration::from_millis(2000),
            max_budget: Duration::from_millis(30_000),
            filter_limits: FilterLimits::default(),
            filter_max_narrowing: 20_000,
        }
    }
}

/// Which phases a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Both, fused; lexical alone when the vector phase cannot answer in time.
    Auto,
    /// Nearest neighbours only.
    Vector,
    /// BM25 only.
    Lexical,
}

impl Mode {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Vector => "vector",
            Mode::Lexical => "lexical",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(Mode::Auto),
            "vector" => Ok(Mode::Vector),
            "lexical" => Ok(Mode::Lexical),
            other => Err(format!(
                "unknown mode `{other}`; valid modes: auto, vector, lexical"
            )),
        }
    }
}

/// Which phases answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Answered {
    /// Vector and lexical, fused by rank.
    Hybrid,
    /// Vector only.
    Vector,
    /// Lexical only, as asked (or no vector store is configured).
    Lexical,
    /// Lexical only because the vector phase timed out or failed.
    LexicalFallback,
}

impl Answered {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Answered::Hybrid => "hybrid",
            Answered::Vector => "vector",
            Answered::Lexical => "lexical",
            Answered::LexicalFallback => "lexical_fallback",
        }
    }
}

/// A validated query.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    /// The text.
    pub text: String,
    /// Datasets to search (empty: every dataset).
    pub datasets: Vec<String>,
    /// Results wanted.
    pub top_k: usize,
    /// Time from admission to answer.
    pub budget: Duration,
    /// Phases asked for.
    pub mode: Mode,
    /// One result per source (its best passage) instead of one per passage.
    pub group_by_source: bool,
    /// Search as it held at a valid time, as the ledger believed at a record time (`None`:
    /// the current revisions, as today).
    pub at: Option<At>,
    /// Only sources whose revision (the current one, or the one held at `at`) matches.
    pub filter: Option<Filter>,
    /// Facet counts to return beside the results, over every source the datasets and the
    /// filter select.
    pub facets: Option<facets::FacetRequest>,
}

/// One result.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SearchResult {
    /// 1-based.
    pub rank: usize,
    /// Dataset of the source.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// The revision the text comes from (the source's head at answer time).
    pub source_revision_id: Uuid,
    /// The vector chunk the text is (when the result's text is a chunk).
    pub chunk_index: Option<u32>,
    /// The lexical passage the text is (when it is a passage).
    pub passage_index: Option<i64>,
    /// The chunk's or passage's text.
    pub text: String,
    /// The section the chunk starts in (`# A > ## B`), when its document has headings.
    pub section: Option<String>,
    /// The chunk's first page, when its document has pages.
    pub page: Option<i64>,
    /// The score, of the kind in `score_kind`.
    pub score: f64,
    /// `rrf`, `cosine` or `bm25`.
    pub score_kind: &'static str,
    /// Phases that found it (`vector`, `lexical`).
    pub retrieval: Vec<&'static str>,
    /// `searchable` (vector-searchable) or `pending` (accepted, not yet projected).
    pub projection_state: &'static str,
    /// When the revision was accepted (microseconds since the Unix epoch).
    pub accepted_at: receipts::Micros,
    /// Who submitted it (`token:<name>`).
    pub accepted_by: String,
    /// Validity time: when the revision holds, as the ledger believes at the point searched
    /// (now by default): from this instant (microseconds since the Unix epoch)...
    pub valid_from: Option<receipts::Micros>,
    /// ...until this one (absent: open).
    pub valid_to: Option<receipts::Micros>,
    /// With `"expand": "links"`: the current sources this result's source links to (bound
    /// to the ledger like every result).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub links: Option<Vec<graph::LinkView>>,
}

/// Milliseconds spent per phase (absent: the phase did not run).
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Phases {
    /// Waiting in the admission queue for a slot (absent when one was free).
    pub admission: Option<f64>,
    /// Embedding the query.
    pub embed: Option<f64>,
    /// The store's nearest-neighbour search.
    pub vector: Option<f64>,
    /// Ledger checks of hits.
    pub bind: Option<f64>,
    /// The lexical query.
    pub lexical: Option<f64>,
    /// Fusion, grouping and the final check.
    pub fuse: Option<f64>,
}

/// An answer.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SearchResponse {
    /// Best first.
    pub results: Vec<SearchResult>,
    /// Which phases answered.
    pub mode: Answered,
    /// Whether the answer is less complete than asked.
    pub degraded: bool,
    /// Why: `vector_timeout`, `vector_error`, `embed_error`, `lexical_timeout`,
    /// `lexical_error`, `stale_dropped`, `facets_partial`.
    pub degradations: Vec<String>,
    /// Hits removed because their revision was no longer current (or not yet searchable).
    pub stale_dropped: usize,
    /// Time from admission to answer.
    pub took_ms: f64,
    /// Time per phase.
    pub phases: Phases,
    /// The budget the request ran under.
    pub budget_ms: u64,
    /// The projection generation the query searched (the one active when it started); `None`
    /// without a vector store or before any generation exists.
    pub generation: Option<String>,
    /// The valid time searched (absent: now, the current revisions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valid_at: Option<receipts::Micros>,
    /// The record time searched (absent: now).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_of: Option<receipts::Micros>,
    /// For a search at a point in time: whether some revision that held then cannot be
    /// returned by the phases that answered (it has no vectors in the generation searched, or
    /// no passages). Absent for the default search, whose current revisions are all indexed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_partial: Option<bool>,
    /// Which indexes miss some of that history: `vector`, `lexical`.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub history_gaps: Vec<String>,
    /// The facet counts asked for, in the order asked: exact, over every source the datasets
    /// and the filter select (not the page).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub facets: Vec<receipts::filter::facets::FacetCounts>,
    /// Facets asked for but left out: their count could not finish within the budget (never
    /// a count of part of the set).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub facets_partial: Vec<String>,
    /// Metadata fields the filter names that the vector store holds no payload index for
    /// (`metadata.<name>`): the answer is as exact, found more slowly. Declare a field in
    /// `datasets.<d>.filterable` to index it.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub filter_unindexed: Vec<String>,
}

/// Why a search has no answer.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// Too many searches in flight, and the queue is full or the wait for a slot would leave
    /// the vector phase no time.
    #[error("too many searches in flight (limit {limit}, {queued} queued); retry shortly")]
    Overloaded {
        /// The limit.
        limit: usize,
        /// Searches waiting when this one was refused.
        queued: usize,
    },
    /// The budget ran out with nothing to return.
    #[error("no phase answered within the budget of {budget_ms} ms ({})", degradations.join(", "))]
    Timeout {
        /// The budget.
        budget_ms: u64,
        /// What went wrong per phase.
        degradations: Vec<String>,
    },
    /// The request cannot be served by this server (e.g. vector mode with no vector store).
    #[error("{message}")]
    Unsupported {
        /// Stable code.
        code: &'static str,
        /// Explanation.
        message: String,
    },
    /// The ledger failed (unreachable: 503).
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// The vector side: the query embedders and the generations' stores.
#[derive(Clone)]
pub struct VectorSide {
    /// Embeds queries with the model of the generation searched (each model's query role: its
    /// own session, so queries never wait behind projection batches).
    pub embedders: Arc<dyn Embedders>,
    /// The stores of chunk vectors, by generation: each query searches the store of the
    /// generation active when it starts.
    pub stores: Arc<dyn VectorStores>,
}

/// Runs searches.
pub struct Searcher {
    ledger: Arc<dyn SearchLedger>,
    vector: Option<VectorSide>,
    settings: SearchSettings,
    in_flight: Arc<tokio::sync::Semaphore>,
    /// Requests waiting for a slot.
    queued: Arc<AtomicUsize>,
    overfetch: OverFetch,
    graph: Option<Arc<dyn gateways::GraphStore>>,
}

/// How many vector hits a vector-mode query fetches per result it needs, learned from recent
/// queries: hits that the check drops and further chunks of a source already found both cost
/// a hit. A corpus of one-chunk sources with nothing stale converges to fetching `top_k` (plus
/// a margin), the cost of the bare search; a corpus of many chunks per source to as many as
/// its queries need, without a second round. Starts at 2 per result, follows each query's
/// observation with weight 1/5, stays within 1-8; a margin of a tenth is added.
#[derive(Debug)]
struct OverFetch {
    /// The estimate (an `f64`'s bits).
    estimate: std::sync::atomic::AtomicU64,
}

impl OverFetch {
    const START: f64 = 2.0;
    const WEIGHT: f64 = 0.2;
    const MIN: f64 = 1.0;
    const MAX: f64 = 8.0;

    fn new() -> Self {
        Self {
            estimate: std::sync::atomic::AtomicU64::new(Self::START.to_bits()),
        }
    }

    fn estimate(&self) -> f64 {
        f64::from_bits(self.estimate.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Hits to fetch for `wanted` results: the estimate's share, rounded, plus a margin of a
    /// tenth (at least one hit).
    fn limit(&self, wanted: usize) -> usize {
        (wanted as f64 * self.estimate()).round() as usize + wanted.div_ceil(10)
    }

    /// Records that the `wanted`-th result came at hit `position` (1-based).
    fn observe(&self, wanted: usize, position: usize) {
        if wanted == 0 {
            return;
        }
        let sample = position as f64 / wanted as f64;
        let next = (self.estimate() * (1.0 - Self::WEIGHT) + sample * Self::WEIGHT)
            .clamp(Self::MIN, Self::MAX);
        self.estimate
            .store(next.to_bits(), std::sync::atomic::Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Searcher {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Searcher")
            .field("vector", &self.vector.is_some())
            .field("settings", &self.settings)
            .finish()
    }
}

/// Where a candidate came from and what it says.
#[derive(Debug, Clone)]
struct Candidate {
    dataset: String,
    source_key: String,
    revision_id: Uuid,
    chunk_index: Option<u32>,
    passage_index: Option<i64>,
    text: String,
    section: Option<String>,
    page: Option<i64>,
    /// The phase's own score (cosine or BM25).
    score: f64,
    vector_searchable: bool,
    accepted_at: receipts::Micros,
    actor: String,
}

impl Candidate {
    fn source(&self) -> (String, String) {
        (self.dataset.clone(), self.source_key.clone())
    }
}

/// The ledger reference of a vector hit.
fn hit_ref(hit: &VectorHit) -> HitRef {
    HitRef {
        revision_id: hit.revision_id,
        chunk_index: Some(hit.chunk_index),
    }
}

/// The identity fusion works on: a source (grouped) or a chunk/passage (not grouped).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ItemKey {
    Source(String, String),
    Chunk(Uuid, u32),
    Passage(Uuid, i64),
}

fn key_of(candidate: &Candidate, grouped: bool) -> ItemKey {
    if grouped {
        return ItemKey::Source(candidate.dataset.clone(), candidate.source_key.clone());
    }
    match (candidate.chunk_index, candidate.passage_index) {
        (Some(chunk), _) => ItemKey::Chunk(candidate.revision_id, chunk),
        (None, Some(passage)) => ItemKey::Passage(candidate.revision_id, passage),
        (None, None) => ItemKey::Chunk(candidate.revision_id, u32::MAX),
    }
}

/// A phase's ranked, checked candidates.
#[derive(Debug, Default)]
struct PhaseOutcome {
    candidates: Vec<Candidate>,
    stale_dropped: usize,
    embed_ms: Option<f64>,
    search_ms: Option<f64>,
    bind_ms: f64,
    /// Metadata fields the filter names that the vector store holds no index for.
    unindexed: Vec<String>,
}

/// The revisions a query's filter admits.
enum Matching {
    /// No filter.
    Everything,
    /// These.
    Only(HashSet<Uuid>),
}

impl Matching {
    fn admits(&self, revision: Uuid) -> bool {
        match self {
            Matching::Everything => true,
            Matching::Only(admitted) => admitted.contains(&revision),
        }
    }
}

/// The ledger's limit for a narrowing of at most `max` revisions: one more, to tell "more
/// than `max`" apart.
fn side_cap(max: usize) -> u32 {
    u32::try_from(max.saturating_add(1)).unwrap_or(u32::MAX)
}

/// Why a phase gave nothing.
#[derive(Debug)]
enum PhaseFailure {
    Timeout,
    Embed(GatewayError),
    Store(GatewayError),
    Ledger(LedgerError),
}

impl PhaseFailure {
    fn degradation(&self, phase: &str) -> String {
        match self {
            PhaseFailure::Timeout => format!("{phase}_timeout"),
            PhaseFailure::Embed(_) => "embed_error".to_owned(),
            PhaseFailure::Store(_) => format!("{phase}_error"),
            PhaseFailure::Ledger(error) if error.code() == "deadline_exceeded" => {
                format!("{phase}_timeout")
            }
            PhaseFailure::Ledger(_) => format!("{phase}_error"),
        }
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

impl Searcher {
    /// A searcher over the ledger's lexical index and, when given, a vector side.
    pub fn new(
        ledger: Arc<dyn SearchLedger>,
        vector: Option<VectorSide>,
        settings: SearchSettings,
    ) -> Searcher {
        Searcher {
            ledger,
            vector,
            in_flight: Arc::new(tokio::sync::Semaphore::new(settings.max_in_flight.max(1))),
            queued: Arc::new(AtomicUsize::new(0)),
            settings,
            overfetch: OverFetch::new(),
            graph: None,
        }
    }

    /// The same searcher, reading links from `graph` (`GET /v1/graph/sources`, `"expand":
    /// "links"`).
    pub fn with_graph(mut self, graph: Arc<dyn gateways::GraphStore>) -> Searcher {
        self.graph = Some(graph);
        self
    }

    /// The graph store links are read from, when one is configured.
    pub fn graph(&self) -> Option<&Arc<dyn gateways::GraphStore>> {
        self.graph.as_ref()
    }

    /// A slot among `max_in_flight`. When none is free the request waits in a bounded queue,
    /// and the wait counts against its budget: it gives up (429) when the queue is full, or
    /// when a slot would come too late to leave the vector phase [`MIN_VECTOR_TIME`].
    async fn admit(
        &self,
        arrived: Instant,
        budget: Duration,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, SearchError> {
        if let Ok(permit) = self.in_flight.clone().try_acquire_owned() {
            return Ok(permit);
        }
        let overloaded = |queued| SearchError::Overloaded {
            limit: self.settings.max_in_flight,
            queued,
        };
        let latest = (arrived + budget.mul_f64(VECTOR_SHARE)).checked_sub(MIN_VECTOR_TIME);
        let Some(latest) = latest.filter(|latest| *latest > Instant::now()) else {
            return Err(overloaded(self.queued.load(Ordering::SeqCst)));
        };
        let queued = self.queued.fetch_add(1, Ordering::SeqCst);
        let _queued = QueuedGuard(&self.queued);
        if queued >= self.settings.max_queued {
            return Err(overloaded(queued));
        }
        let wait = self.in_flight.clone().acquire_owned();
        match tokio::time::timeout_at(latest.into(), wait).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(overloaded(self.queued.load(Ordering::SeqCst))),
        }
    }

    /// The limits it runs under.
    pub fn settings(&self) -> SearchSettings {
        self.settings
    }

    /// Whether vector search is configured.
    pub fn has_vectors(&self) -> bool {
        self.vector.is_some()
    }

    /// Answers `query` within its budget.
    pub async fn search(&self, query: Query) -> Result<SearchResponse, SearchError> {
        let started = Instant::now();
        let _permit = self.admit(started, query.budget).await?;
        let admission_ms = ms(started);
        let deadline = started + query.budget;
        let mode = match (query.mode, &self.vector) {
            (Mode::Vector, None) => {
                return Err(SearchError::Unsupported {
                    code: "vector_unconfigured",
                    message: "this server has no vector store (backends exclude `vector`); \
                              use mode `lexical` or `auto`"
                        .to_owned(),
                })
            }
            (Mode::Auto, None) => Mode::Lexical,
            (mode, _) => mode,
        };
        let vector_deadline = match mode {
            Mode::Auto => started + query.budget.mul_f64(VECTOR_SHARE),
            _ => deadline,
        };
        let run_vector = matches!(mode, Mode::Auto | Mode::Vector);
        let run_lexical = matches!(mode, Mode::Auto | Mode::Lexical);
        // One generation per query, read when it starts: a switch takes effect at the next
        // query, and no query mixes two generations (the store searched and every binding
        // check name the same one).
        let active = match &self.vector {
            Some(_) => self.ledger.active_generation().await?,
            None => None,
        };
        let searched = active.as_ref().map(|generation| generation.id.clone());
        let model = active
            .as_ref()
            .map_or("", |generation| generation.model.as_str());
        let generation = searched.as_deref().unwrap_or(NO_GENERATION);
        let vector_phase = async {
            if !run_vector {
                return None;
            }
            let phase = self.vector_phase(&query, vector_deadline, generation, model);
            Some(
                match tokio::time::timeout_at(vector_deadline.into(), phase).await {
                    Ok(outcome) => outcome,
                    Err(_) => Err(PhaseFailure::Timeout),
                },
            )
        };
        let lexical_phase = async {
            if !run_lexical {
                return None;
            }
            // Not wrapped in a timeout: the query ends itself at the deadline (SQLite
            // interrupts it), and dropping it mid-way would leave its connection armed.
            Some(self.lexical_phase(&query, deadline, generation).await)
        };
        let facet_phase = async {
            match &query.facets {
                None => (Vec::new(), Vec::new()),
                Some(request) => {
                    facets::count(
                        self.ledger.as_ref(),
                        &query.datasets,
                        query.filter.as_ref(),
                        query.at,
                        request,
                        deadline,
                    )
                    .await
                }
            }
        };
        let (vector, lexical, (facets, facets_partial)) =
            tokio::join!(vector_phase, lexical_phase, facet_phase);

        let mut phases = Phases {
            admission: (admission_ms >= 0.01).then_some(admission_ms),
            ..Phases::default()
        };
        let mut degradations = Vec::new();
        let mut stale_dropped = 0;
        let mut lists: Vec<(&'static str, Vec<Candidate>)> = Vec::new();
        let mut failures = Vec::new();
        let mut filter_unindexed = Vec::new();
        for (name, outcome) in [("vector", vector), ("lexical", lexical)] {
            match outcome {
                None => {}
                Some(Ok(outcome)) => {
                    if name == "vector" {
                        phases.embed = outcome.embed_ms;
                        phases.vector = outcome.search_ms;
                    } else {
                        phases.lexical = outcome.search_ms;
                    }
                    *phases.bind.get_or_insert(0.0) += outcome.bind_ms;
                    stale_dropped += outcome.stale_dropped;
                    filter_unindexed.extend(outcome.unindexed);
                    lists.push((name, outcome.candidates));
                }
                Some(Err(failure)) => {
                    if let PhaseFailure::Embed(error) | PhaseFailure::Store(error) = &failure {
                        tracing::warn!(phase = name, %error, "search phase failed");
                    }
                    degradations.push(failure.degradation(name));
                    failures.push(failure);
                }
            }
        }
        if lists.is_empty() {
            // A ledger that failed (not merely ran out of time) is the answer: 503 when it is
            // unreachable. Otherwise the budget ran out.
            let ledger_error = failures.into_iter().find_map(|failure| match failure {
                PhaseFailure::Ledger(error) if error.code() != "deadline_exceeded" => Some(error),
                _ => None,
            });
            if let Some(error) = ledger_error {
                return Err(SearchError::Ledger(error));
            }
            return Err(SearchError::Timeout {
                budget_ms: u64::try_from(query.budget.as_millis()).unwrap_or(u64::MAX),
                degradations,
            });
        }
        let answered = match (mode, lists.len()) {
            (Mode::Auto, 2) => Answered::Hybrid,
            (Mode::Auto, _) if lists[0].0 == "lexical" => Answered::LexicalFallback,
            (_, _) if lists[0].0 == "vector" => Answered::Vector,
            _ => Answered::Lexical,
        };
        let fusing = Instant::now();
        let (mut results, final_drops) =
            self.assemble(&query, &lists, answered, generation).await?;
        self.add_periods(&query, &mut results).await;
        let history_gaps = self.history_gaps(&query, &lists, searched.as_deref()).await;
        stale_dropped += final_drops;
        if results.len() < query.top_k && stale_dropped > 0 {
            degradations.push("stale_dropped".to_owned());
        }
        phases.fuse = Some(ms(fusing));
        if !facets_partial.is_empty() {
            degradations.push("facets_partial".to_owned());
        }
        Ok(SearchResponse {
            results,
            mode: answered,
            degraded: !degradations.is_empty(),
            degradations,
            stale_dropped,
            took_ms: ms(started),
            phases,
            budget_ms: u64::try_from(query.budget.as_millis()).unwrap_or(u64::MAX),
            generation: searched,
            valid_at: query.at.map(|at| at.valid_at),
            as_of: query.at.map(|at| at.as_of),
            history_partial: history_gaps.as_ref().map(|gaps| !gaps.is_empty()),
            history_gaps: history_gaps.unwrap_or_default(),
            facets,
            facets_partial,
            filter_unindexed,
        })
    }

    /// For a search at a point in time, the indexes of the answering phases that miss some
    /// revision held then (`Reader::history_gaps`); `None` for the default search, or when
    /// the ledger could not tell (logged).
    async fn history_gaps(
        &self,
        query: &Query,
        lists: &[(&'static str, Vec<Candidate>)],
        generation: Option<&str>,
    ) -> Option<Vec<String>> {
        let at = query.at?;
        let vector = lists.iter().any(|(name, _)| *name == "vector");
        let lexical = lists.iter().any(|(name, _)| *name == "lexical");
        let generation = generation.filter(|_| vector);
        match self
            .ledger
            .history_gaps(&query.datasets, generation, at)
            .await
        {
            Ok(gaps) => Some(
                [
                    ("vector", vector && gaps.vector),
                    ("lexical", lexical && gaps.lexical),
                ]
                .into_iter()
                .filter(|(_, missing)| *missing)
                .map(|(name, _)| name.to_owned())
                .collect(),
            ),
            Err(error) => {
                tracing::warn!(%error, "search: the history's gaps could not be read");
                None
            }
        }
    }

    /// Each result's validity period at the point searched (now by default), read once for
    /// the page. Without it (the ledger failed) the results are still right, without periods.
    async fn add_periods(&self, query: &Query, results: &mut [SearchResult]) {
        let at = query.at.unwrap_or_else(|| {
            let now = receipts::Clock::now_micros(&receipts::SystemClock);
            At {
                valid_at: now,
                as_of: now,
            }
        });
        let revisions: Vec<Uuid> = results
            .iter()
            .map(|result| result.source_revision_id)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        match self.ledger.periods(&revisions, at).await {
            Ok(periods) => {
                let periods: HashMap<Uuid, receipts::validity::Period> =
                    periods.into_iter().collect();
                for result in results.iter_mut() {
                    if let Some(period) = periods.get(&result.source_revision_id) {
                        result.valid_from = Some(period.from);
                        result.valid_to = (!period.is_open()).then_some(period.to);
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, "search: the page's validity periods could not be read")
            }
        }
    }

    /// Binds hits now, or at the query's point in time.
    async fn bind(
        &self,
        refs: &[HitRef],
        generation: &str,
        at: Option<At>,
    ) -> Result<Vec<BoundHit>, LedgerError> {
        match at {
            None => self.ledger.bind_hits(refs, generation).await,
            Some(at) => self.ledger.bind_hits_at(refs, generation, at).await,
        }
    }

    /// Which of these revisions the query's filter admits, read from the ledger and checked
    /// exactly ([`Filter::matches`]): the last word on a filter, whatever the store or the
    /// lexical index matched.
    async fn matching(
        &self,
        query: &Query,
        revisions: impl Iterator<Item = Uuid>,
    ) -> Result<Matching, PhaseFailure> {
        let Some(filter) = &query.filter else {
            return Ok(Matching::Everything);
        };
        let ids: Vec<Uuid> = revisions.collect::<HashSet<_>>().into_iter().collect();
        let facts = self
            .ledger
            .revision_facts(&ids)
            .await
            .map_err(PhaseFailure::Ledger)?;
        Ok(Matching::Only(
            facts
                .iter()
                .filter(|facts| filter.matches(&facts.facts()))
                .map(|facts| facts.revision_id)
                .collect(),
        ))
    }

    fn allowed(query: &Query, dataset: &str) -> bool {
        query.datasets.is_empty() || query.datasets.iter().any(|name| name == dataset)
    }

    /// Embed, nearest neighbours, bind; fetches further while drops leave too few.
    async fn vector_phase(
        &self,
        query: &Query,
        deadline: Instant,
        generation: &str,
        model: &str,
    ) -> Result<PhaseOutcome, PhaseFailure> {
        let Some(side) = &self.vector else {
            return Ok(PhaseOutcome::default());
        };
        let mut outcome = PhaseOutcome::default();
        let store = side
            .stores
            .store(generation)
            .await
            .map_err(PhaseFailure::Store)?;
        let started = Instant::now();
        let embedder = side
            .embedders
            .embedder(model, EmbedRole::Query)
            .await
            .map_err(PhaseFailure::Embed)?;
        let vector = embedder
            .embed(vec![query.text.clone()])
            .await
            .map_err(PhaseFailure::Embed)?
            .pop()
            .ok_or_else(|| {
                PhaseFailure::Embed(GatewayError::Embedder("no vector for the query".to_owned()))
            })?;
        outcome.embed_ms = Some(ms(started));
        // Alone, the phase needs `top_k` sources (fetching as many hits per source as recent
        // queries needed, see `OverFetch`); fused, it supplies the whole candidate window.
        let needed = match query.mode {
            Mode::Vector => query.top_k,
            _ => query.top_k.max(fusion::CANDIDATE_WINDOW),
        };
        let mut limit = match query.mode {
            Mode::Vector => self
                .overfetch
                .limit(query.top_k)
                .clamp(query.top_k, MAX_VECTOR_FETCH),
            _ => needed,
        };
        let wanted = query.top_k.min(needed);
        // A filter first searches the index as an unfiltered query would, binding keeping the
        // hits that match: a filter that many sources match fills the page there, in hit
        // order, which is the order of the exact filtered search. Only when that leaves the
        // page short does the ledger select the revisions that match, and the store search
        // exactly among their points, so a selective filter never loses recall to the index
        // walk. A selection larger than the narrowing bound goes on searching the index
        // (refilling as for stale hits).
        let mut narrowed: Option<Vec<Uuid>> = None;
        let mut selection_pending = query.filter.is_some();
        // The filter pushed down to the points' payload: the store's indexes select what
        // matches, so even a selective filter fills the page from the store's own search.
        let pushed = query
            .filter
            .as_ref()
            .and_then(|filter| gateways::vectors::pushdown(filter, query.at.is_none()).filter);
        if let Some(filter) = &query.filter {
            let named = filter.metadata_fields();
            if !named.is_empty() {
                let indexed = store.indexed_fields().await.map_err(PhaseFailure::Store)?;
                outcome.unindexed = named
                    .into_iter()
                    .map(|name| format!("metadata.{name}"))
                    .filter(|field| !indexed.contains(field))
                    .collect();
            }
        }
        // What each hit bound to (`None`: dropped by the check). A hit is bound once, however
        // many rounds fetch it.
        let mut bound: HashMap<HitRef, Option<Candidate>> = HashMap::new();
        let mut search_ms = 0.0;
        loop {
            let searching = Instant::now();
            // At a past time the candidates are every revision's points; binding keeps those
            // held then.
            let hits = match (&narrowed, query.at) {
                (Some(revisions), at) => {
                    store
                        .search_within(
                            vector.clone(),
                            &query.datasets,
                            revisions,
                            at.is_some(),
                            limit,
                        )
                        .await
                }
                (None, None) => {
                    store
                        .search(vector.clone(), &query.datasets, pushed.as_ref(), limit)
                        .await
                }
                (None, Some(_)) => {
                    store
                        .search_any(vector.clone(), &query.datasets, pushed.as_ref(), limit)
                        .await
                }
            }
            .map_err(PhaseFailure::Store)?;
            search_ms += ms(searching);
            // Bind only as many hits as the page needs: the first `needed` hits, then the
            // rest of this round's hits only when drops (or several chunks of one source)
            // left too few. Binding is the phase's own cost; one-chunk sources with nothing
            // stale need one bind of `needed` hits.
            let mut first = true;
            loop {
                let unbound: Vec<&VectorHit> = hits
                    .iter()
                    .filter(|hit| !bound.contains_key(&hit_ref(hit)))
                    .take(if first { needed } else { usize::MAX })
                    .collect();
                first = false;
                if unbound.is_empty() {
                    break;
                }
                let binding = Instant::now();
                for (hit, candidate) in self.bind_vector_hits(query, &unbound, generation).await? {
                    bound.insert(hit, candidate);
                }
                outcome.bind_ms += ms(binding);
                if self.distinct(query, &hits, &bound) >= wanted {
                    break;
                }
            }
            let (candidates, dropped) = Self::in_rank_order(&hits, &bound);
            let enough = self.distinct(query, &hits, &bound) >= wanted;
            // Searches at a past time fetch every revision's points, and narrowed ones only
            // the filter's: either would teach the over-fetch for plain searches wrongly.
            if query.mode == Mode::Vector && query.at.is_none() && query.filter.is_none() {
                if let Some(position) = Self::position_of(query, &hits, &bound, wanted) {
                    self.overfetch.observe(wanted, position);
                }
            }
            let exhausted = hits.len() < limit;
            outcome.candidates = candidates;
            outcome.stale_dropped = dropped;
            // Refill: drops (or several chunks of one source) left too few, the store has
            // more, and there is time for another round.
            let remaining = deadline.saturating_duration_since(Instant::now());
            if let (false, true, false, Some(filter)) = (
                enough,
                selection_pending,
                remaining.is_zero(),
                &query.filter,
            ) {
                // The share of this round's hits that matched says how far the index would
                // have to be read: when a wider round would likely fill the page, read it
                // (cheaper than selecting among every head); otherwise select now.
                let kept = bound
                    .values()
                    .filter(|candidate| candidate.is_some())
                    .count();
                let estimate = (wanted * bound.len() * 3 / 2)
                    .checked_div(kept)
                    .unwrap_or(usize::MAX);
                if !exhausted && estimate > limit && estimate <= MAX_VECTOR_FETCH / 2 {
                    limit = estimate;
                    continue;
                }
                selection_pending = false;
                let cap = side_cap(self.settings.filter_max_narrowing);
                let selecting = Instant::now();
                let selected = self
                    .ledger
                    .filter_revisions(&query.datasets, filter, query.at, cap)
                    .await
                    .map_err(PhaseFailure::Ledger)?;
                outcome.bind_ms += ms(selecting);
                if selected.is_empty() {
                    // Nothing matches: binding kept nothing either.
                    break;
                }
                if selected.len() <= self.settings.filter_max_narrowing {
                    narrowed = Some(selected);
                    continue;
                }
            }
            if enough || exhausted || limit >= MAX_VECTOR_FETCH || remaining.is_zero() {
                break;
            }
            limit = (limit * 2).min(MAX_VECTOR_FETCH);
        }
        outcome.search_ms = Some(search_ms);
        Ok(outcome)
    }

    /// Distinct results among the bound hits: sources when grouped, chunks otherwise.
    fn distinct(
        &self,
        query: &Query,
        hits: &[VectorHit],
        bound: &HashMap<HitRef, Option<Candidate>>,
    ) -> usize {
        let current = hits
            .iter()
            .filter_map(|hit| bound.get(&hit_ref(hit)).and_then(Option::as_ref));
        if query.group_by_source {
            current.map(Candidate::source).collect::<HashSet<_>>().len()
        } else {
            current.count()
        }
    }

    /// The 1-based position of the hit that gave the `wanted`-th distinct result, if any.
    fn position_of(
        query: &Query,
        hits: &[VectorHit],
        bound: &HashMap<HitRef, Option<Candidate>>,
        wanted: usize,
    ) -> Option<usize> {
        let mut seen = HashSet::new();
        for (index, hit) in hits.iter().enumerate() {
            if let Some(Some(candidate)) = bound.get(&hit_ref(hit)) {
                let key = if query.group_by_source {
                    ItemKey::Source(candidate.dataset.clone(), candidate.source_key.clone())
                } else {
                    ItemKey::Chunk(hit.revision_id, hit.chunk_index)
                };
                seen.insert(key);
                if seen.len() >= wanted {
                    return Some(index + 1);
                }
            }
        }
        None
    }

    /// This round's hits that bound to current revisions, in rank order, and how many of the
    /// bound ones were dropped.
    fn in_rank_order(
        hits: &[VectorHit],
        bound: &HashMap<HitRef, Option<Candidate>>,
    ) -> (Vec<Candidate>, usize) {
        let mut candidates = Vec::new();
        let mut dropped = 0;
        for hit in hits {
            match bound.get(&hit_ref(hit)) {
                Some(Some(candidate)) => candidates.push(Candidate {
                    score: f64::from(hit.score),
                    ..candidate.clone()
                }),
                Some(None) => dropped += 1,
                None => {}
            }
        }
        (candidates, dropped)
    }

    /// Checks vector hits against the ledger (one query): each hit with its candidate, or
    /// `None` when the check drops it (not head, deleted, not verified in the generation
    /// searched, no chunk row, or a dataset the query may not read).
    async fn bind_vector_hits(
        &self,
        query: &Query,
        hits: &[&VectorHit],
        generation: &str,
    ) -> Result<Vec<(HitRef, Option<Candidate>)>, PhaseFailure> {
        let refs: Vec<HitRef> = hits.iter().map(|hit| hit_ref(hit)).collect();
        let bound = self
            .bind(&refs, generation, query.at)
            .await
            .map_err(PhaseFailure::Ledger)?;
        let by_ref: HashMap<HitRef, &BoundHit> = bound.iter().map(|b| (b.hit, b)).collect();
        let matching = self
            .matching(
                query,
                bound
                    .iter()
                    .filter(|b| b.current)
                    .map(|b| b.hit.revision_id),
            )
            .await?;
        Ok(hits
            .iter()
            .zip(refs)
            .map(|(hit, reference)| {
                let candidate = by_ref.get(&reference).and_then(|bound| {
                    let text = bound.chunk_text.as_ref()?;
                    let keep = bound.current
                        && bound.vector_searchable
                        && Self::allowed(query, &bound.dataset)
                        && matching.admits(hit.revision_id);
                    keep.then(|| Candidate {
                        dataset: bound.dataset.clone(),
                        source_key: bound.source_key.clone(),
                        revision_id: hit.revision_id,
                        chunk_index: Some(hit.chunk_index),
                        passage_index: None,
                        text: text.clone(),
                        section: bound.section.clone(),
                        page: bound.page,
                        score: f64::from(hit.score),
                        vector_searchable: true,
                        accepted_at: bound.accepted_at,
                        actor: bound.actor.clone(),
                    })
                });
                (reference, candidate)
            })
            .collect())
    }

    /// BM25 over current heads, then the projection state of each hit's revision.
    async fn lexical_phase(
        &self,
        query: &Query,
        deadline: Instant,
        generation: &str,
    ) -> Result<PhaseOutcome, PhaseFailure> {
        let started = Instant::now();
        let limit = u32::try_from(query.top_k.max(fusion::CANDIDATE_WINDOW)).unwrap_or(u32::MAX);
        let hits = match (&query.filter, query.at) {
            (Some(filter), at) => {
                self.ledger
                    .lexical_search_where(
                        &query.text,
                        &query.datasets,
                        filter,
                        limit,
                        Some(deadline),
                        at,
                    )
                    .await
            }
            (None, None) => {
                self.ledger
                    .lexical_search(&query.text, &query.datasets, limit, Some(deadline))
                    .await
            }
            (None, Some(at)) => {
                self.ledger
                    .lexical_search_at(&query.text, &query.datasets, limit, Some(deadline), at)
                    .await
            }
        }
        .map_err(PhaseFailure::Ledger)?;
        let search_ms = ms(started);
        let binding = Instant::now();
        let (candidates, dropped) = self.bind_lexical_hits(query, hits, generation).await?;
        Ok(PhaseOutcome {
            candidates,
            stale_dropped: dropped,
            embed_ms: None,
            search_ms: Some(search_ms),
            bind_ms: ms(binding),
            unindexed: Vec::new(),
        })
    }

    async fn bind_lexical_hits(
        &self,
        query: &Query,
        hits: Vec<LexicalHit>,
        generation: &str,
    ) -> Result<(Vec<Candidate>, usize), PhaseFailure> {
        let revisions: Vec<HitRef> = hits
            .iter()
            .map(|hit| HitRef {
                revision_id: hit.revision_id,
                chunk_index: None,
            })
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let bound = self
            .bind(&revisions, generation, query.at)
            .await
            .map_err(PhaseFailure::Ledger)?;
        let by_revision: HashMap<Uuid, &BoundHit> =
            bound.iter().map(|b| (b.hit.revision_id, b)).collect();
        let matching = self
            .matching(
                query,
                bound
                    .iter()
                    .filter(|b| b.current)
                    .map(|b| b.hit.revision_id),
            )
            .await?;
        let total = hits.len();
        let candidates: Vec<Candidate> = hits
            .into_iter()
            .filter_map(|hit| {
                let bound = by_revision.get(&hit.revision_id)?;
                if !bound.current
                    || !Self::allowed(query, &hit.dataset)
                    || !matching.admits(hit.revision_id)
                {
                    return None;
                }
                Some(Candidate {
                    vector_searchable: bound.vector_searchable,
                    accepted_at: bound.accepted_at,
                    actor: bound.actor.clone(),
                    dataset: hit.dataset,
                    source_key: hit.source_key,
                    revision_id: hit.revision_id,
                    chunk_index: None,
                    passage_index: Some(hit.passage_index),
                    text: hit.text,
                    section: hit.section,
                    page: hit.page,
                    score: hit.score,
                })
            })
            .collect();
        let dropped = total - candidates.len();
        Ok((candidates, dropped))
    }

    /// Fuses (or takes the single list), groups, checks the page against the ledger once
    /// more and refills from further candidates. Returns the page and the final drops.
    async fn assemble(
        &self,
        query: &Query,
        lists: &[(&'static str, Vec<Candidate>)],
        answered: Answered,
        generation: &str,
    ) -> Result<(Vec<SearchResult>, usize), SearchError> {
        let grouped = query.group_by_source;
        // Per phase: the best candidate per key, in rank order.
        let mut best: HashMap<ItemKey, Vec<(usize, &Candidate)>> = HashMap::new();
        let ranked: Vec<Vec<ItemKey>> = lists
            .iter()
            .enumerate()
            .map(|(phase, (_, candidates))| {
                let mut seen = HashSet::new();
                candidates
                    .iter()
                    .filter_map(|candidate| {
                        let key = key_of(candidate, grouped);
                        if !seen.insert(key.clone()) {
                            return None;
                        }
                        best.entry(key.clone())
                            .or_default()
                            .push((phase, candidate));
                        Some(key)
                    })
                    .collect()
            })
            .collect();
        let fused = fusion::fuse(&ranked);
        let mut page = Vec::new();
        let mut dropped = 0;
        let mut next = 0;
        while page.len() < query.top_k && next < fused.len() {
            let wanted = query.top_k - page.len();
            let batch: Vec<&fusion::Fused<ItemKey>> = fused[next..].iter().take(wanted).collect();
            next += batch.len();
            let chosen: Vec<(&fusion::Fused<ItemKey>, &Candidate, Vec<&'static str>)> = batch
                .into_iter()
                .filter_map(|item| {
                    let found = best.get(&item.key)?;
                    // The text: the vector chunk when the vector phase found it.
                    let (_, candidate) = found
                        .iter()
                        .find(|(phase, _)| lists[*phase].0 == "vector")
                        .or_else(|| found.first())?;
                    let retrieval = found.iter().map(|(phase, _)| lists[*phase].0).collect();
                    Some((item, *candidate, retrieval))
                })
                .collect();
            // The final check: a revision superseded or deleted while this request ran is
            // dropped here, and the page refills from the next candidates. In vector mode the
            // phase's own binding was the request's last ledger read, moments ago: it stands.
            let current: HashMap<Uuid, bool> = if query.mode == Mode::Vector {
                chosen
                    .iter()
                    .map(|(_, candidate, _)| (candidate.revision_id, true))
                    .collect()
            } else {
                let refs: Vec<HitRef> = chosen
                    .iter()
                    .map(|(_, candidate, _)| HitRef {
                        revision_id: candidate.revision_id,
                        chunk_index: None,
                    })
                    .collect::<HashSet<_>>()
                    .into_iter()
                    .collect();
                self.bind(&refs, generation, query.at)
                    .await?
                    .iter()
                    .map(|b| (b.hit.revision_id, b.current))
                    .collect()
            };
            for (item, candidate, retrieval) in chosen {
                if !current
                    .get(&candidate.revision_id)
                    .copied()
                    .unwrap_or(false)
                {
                    dropped += 1;
                    continue;
                }
                let (score, score_kind) = match answered {
                    Answered::Hybrid => (item.score, "rrf"),
                    Answered::Vector => (candidate.score, "cosine"),
                    Answered::Lexical | Answered::LexicalFallback => (candidate.score, "bm25"),
                };
                page.push(SearchResult {
                    rank: page.len() + 1,
                    dataset: candidate.dataset.clone(),
                    source_key: candidate.source_key.clone(),
                    source_revision_id: candidate.revision_id,
                    chunk_index: candidate.chunk_index,
                    passage_index: candidate.passage_index,
                    text: candidate.text.clone(),
                    section: candidate.section.clone(),
                    page: candidate.page,
                    score,
                    score_kind,
                    retrieval,
                    projection_state: if candidate.vector_searchable {
                        "searchable"
                    } else {
                        "pending"
                    },
                    accepted_at: candidate.accepted_at,
                    accepted_by: candidate.actor.clone(),
                    valid_from: None,
                    valid_to: None,
                    links: None,
                });
            }
        }
        Ok((page, dropped))
    }
}

#[cfg(test)]
mod tests {
    use super::OverFetch;

    #[test]
    fn overfetch_learns_the_hits_each_result_costs() {
        let overfetch = OverFetch::new();
        assert_eq!(
            overfetch.limit(10),
            21,
            "starts at two hits per result, plus the margin"
        );
        // One-chunk sources, nothing stale: the 10th result is the 10th hit.
        for _ in 0..40 {
            overfetch.observe(10, 10);
        }
        assert_eq!(overfetch.limit(10), 11);
        // Three chunks per source: the estimate climbs towards 3.
        for _ in 0..40 {
            overfetch.observe(10, 30);
        }
        assert_eq!(overfetch.limit(10), 31);
        // Bounded both ways.
        for _ in 0..100 {
            overfetch.observe(1, 1000);
        }
        assert_eq!(overfetch.limit(10), 81);
        overfetch.observe(0, 5);
        assert_eq!(overfetch.limit(10), 81, "nothing wanted, nothing learned");
    }
}
