//! A Qdrant server (or cluster) through the official `qdrant-client` crate, over gRPC. One
//! collection per projection generation (`{prefix}{generation}`), created with its payload
//! indexes when the store opens; any number of processes on any machines share it.
//!
//! ## A cluster
//! [`ServerOptions::urls`] lists the nodes cairn may talk to. Calls go to one node at a time
//! (the active one); a call that fails with a retryable error (unavailable, timed out) moves
//! the store to the next node, and the retry goes there, within the same retry budget. A
//! [`CollectionLayout`] (shard count, replication factor, write consistency factor) is set when
//! the collection is created, is part of the generation's identity, and a collection laid out
//! otherwise is refused.
//!
//! ## Invariants
//! - Every write is sent with `wait = true` and `medium` write ordering: when it returns, the
//!   points are durable in the WAL of as many replicas as the write consistency factor asks,
//!   and replicas apply one source's updates in one order (through the shard's leader).
//! - Every read that decides something (the read-back that turns a receipt `verified`, counts,
//!   scrolls, vectors) asks for `quorum` read consistency: half plus one of each shard's
//!   replicas answer, and only what all of them hold counts, so what is read back is on a
//!   majority, never one stale replica's view. Search does not (binding in the ledger has the
//!   last word), so it stays one fast request.
//! - A hung node costs a call up to two timeouts: `qdrant-client` retries a cancelled call
//!   once on a fresh connection before cairn sees the error and moves on.
//! - Every call runs under the configured timeout. Transient failures (unavailable, deadline,
//!   resource exhausted, aborted, a broken connection) are retried in process with exponential
//!   backoff (`backoff`), within [`ServerOptions::retry_budget`], which configuration keeps
//!   below the job lease; search makes one attempt (its deadline is the search budget).
//! - Errors are classified by gRPC status into [`GatewayError`] variants: retryable
//!   (`Unavailable`, `Timeout`) or permanent (`Rejected`, a bad request).
//! - The API key is sent as the `api-key` header and never logged or shown (`Debug` hides it).
//! - Vendor types stay inside this file.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use qdrant_client::qdrant::{
    points_update_operation, read_consistency, value::Kind, vectors_config, vectors_output,
    CollectionParamsDiffBuilder, Condition, CountPointsBuilder, CreateCollectionBuilder,
    CreateFieldIndexCollectionBuilder, DeletePointsBuilder, Distance, FacetCountsBuilder,
    FieldType, Filter, GetPointsBuilder, PointId, PointStruct, PointsUpdateOperation, Range,
    ReadConsistencyType, ScrollPointsBuilder, SearchParamsBuilder, SearchPointsBuilder,
    SetPayloadPointsBuilder, UpdateBatchPointsBuilder, UpdateCollectionBuilder,
    UpsertPointsBuilder, Value, VectorParamsBuilder, WriteOrdering, WriteOrderingType,
};
use qdrant_client::{Qdrant, QdrantError};
use uuid::Uuid;

use super::{
    check_dimensions, fold_points, point_id, CurrentChange, FieldKind, Held, PayloadFilter,
    PointSelector, RevisionPoints, ScrolledPoint, VectorHit, VectorPoint, VectorStore,
    INDEXED_FIELDS, SCROLL_PAGE,
};
use crate::GatewayError;

const STORE: &str = "qdrant-server";

/// Replicated collections hedge their reads (Qdrant's delayed fan-out): a read that one
/// replica has not answered within this time goes to another replica too, and the first
/// answer counts. A hung node (SIGSTOP, a half-open connection) fails nothing, so without it
/// every read that picked its replica, the quorum read-backs included, waited until the call
/// timed out, on whichever node cairn talked to. Healthy replicas answer in milliseconds, so
/// the hedge costs almost nothing.
const READ_FAN_OUT_DELAY_MS: u64 = 100;

/// The filter of a selector.
fn selected(selector: &PointSelector) -> Filter {
    match selector {
        PointSelector::Source {
            dataset,
            source_key,
            head_before,
        } => Filter::must([
            keyword("dataset", dataset),
            keyword("source_key", source_key),
            Condition::range(
                "head_at",
                Range {
                    lt: Some(*head_before as f64),
                    ..Range::default()
                },
            ),
        ]),
        PointSelector::Revision(revision_id) => {
            Filter::must([keyword("revision_id", &revision_id.to_string())])
        }
    }
}

/// Reads that decide something ask a majority of each shard's replicas (half plus one) and
/// count only what all of them hold: a point read back is on a majority. (Qdrant's own
/// `majority` needs every replica to answer, so one dead node would stop every read-back.)
fn quorum() -> read_consistency::Value {
    read_consistency::Value::Type(ReadConsistencyType::Quorum as i32)
}

/// Writes to one shard are ordered through its leader.
fn ordered() -> WriteOrdering {
    WriteOrdering {
        r#type: WriteOrderingType::Medium as i32,
    }
}

/// How a generation's collection is laid out on a cluster; `None` leaves a setting to the
/// server's default (one shard, one replica, write consistency 1 on a single node).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CollectionLayout {
    /// Shards (`shard_number`).
    pub shards: Option<u32>,
    /// Copies of each shard on distinct nodes (`replication_factor`).
    pub replication_factor: Option<u32>,
    /// Replicas that must apply a write before it is acknowledged
    /// (`write_consistency_factor`).
    pub write_consistency: Option<u32>,
}

impl CollectionLayout {
    /// The layout as text for the generation's identity (`shards=6,replication=3,
    /// write_consistency=2`); empty when every setting is the server's default.
    pub fn fingerprint(&self) -> String {
        [
            ("shards", self.shards),
            ("replication", self.replication_factor),
            ("write_consistency", self.write_consistency),
        ]
        .iter()
        .filter_map(|(name, value)| value.map(|value| format!("{name}={value}")))
        .collect::<Vec<_>>()
        .join(",")
    }

    /// The settings a collection has that differ from this layout, as text (`None`: it
    /// matches). A setting left to the server's default matches anything.
    fn differences(&self, shards: u32, replication: u32, write_consistency: u32) -> Option<String> {
        let differing: Vec<String> = [
            ("shard count", self.shards, shards),
            ("replication factor", self.replication_factor, replication),
            (
                "write consistency factor",
                self.write_consistency,
                write_consistency,
            ),
        ]
        .iter()
        .filter_map(|(name, wanted, held)| {
            wanted
                .filter(|wanted| wanted != held)
                .map(|wanted| format!("{name} {held} (configured: {wanted})"))
        })
        .collect();
        (!differing.is_empty()).then(|| differing.join(", "))
    }
}

/// How to reach a Qdrant server or cluster.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerOptions {
    /// The gRPC URLs of the nodes cairn may talk to (`http://host:6334`, or `https://` for
    /// TLS): the first is tried first, the others on failover.
    pub urls: Vec<String>,
    /// The collection's layout on a cluster.
    pub layout: CollectionLayout,
    /// The API key (`QDRANT__SERVICE__API_KEY` on the server), if the server requires one.
    pub api_key: Option<String>,
    /// The limit on one call.
    pub timeout: Duration,
    /// The limit on opening a connection.
    pub connect_timeout: Duration,
    /// How long one operation may keep retrying transient failures (kept below the lease).
    pub retry_budget: Duration,
    /// Collection names are `{prefix}{generation id}`, so several deployments can share a
    /// server.
    pub collection_prefix: String,
}

impl ServerOptions {
    /// Options for `url` with the defaults: 10 s per call, 3 s to connect, 5 s of retries,
    /// collections prefixed `cairn-`, the server's default layout.
    pub fn new(url: &str) -> ServerOptions {
        ServerOptions::cluster(&[url])
    }

    /// Options for the nodes at `urls` (the first tried first), with [`ServerOptions::new`]'s
    /// defaults.
    pub fn cluster(urls: &[&str]) -> ServerOptions {
        ServerOptions {
            urls: urls.iter().map(|url| (*url).to_owned()).collect(),
            layout: CollectionLayout::default(),
            api_key: None,
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            retry_budget: Duration::from_secs(5),
            collection_prefix: "cairn-".to_owned(),
        }
    }
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ServerOptions")
            .field("urls", &self.urls)
            .field("layout", &self.layout)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("retry_budget", &self.retry_budget)
            .field("collection_prefix", &self.collection_prefix)
            .finish()
    }
}

/// One node of a cluster: its URL and its client.
struct Node {
    url: String,
    client: Arc<Qdrant>,
}

/// A generation's collection on a Qdrant server or cluster.
#[derive(Clone)]
pub struct ServerVectorStore {
    nodes: Arc<[Node]>,
    /// The node calls go to (an index into `nodes`), moved on by failures.
    active: Arc<AtomicUsize>,
    collection: String,
    dimension: usize,
    layout: CollectionLayout,
    retry_budget: Duration,
}

impl std::fmt::Debug for ServerVectorStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ServerVectorStore")
            .field("url", &self.url())
            .field("collection", &self.collection)
            .field("dimension", &self.dimension)
            .finish()
    }
}

/// A client error as a gateway error, by gRPC status: what may pass by itself is retryable,
/// a request the server refuses is permanent. Connection failures arrive as `Unavailable` or
/// `Unknown` (tonic's transport errors); both are retryable.
fn classify(error: QdrantError) -> GatewayError {
    use tonic::Code;
    match error {
        QdrantError::ResponseError { status } => {
            let message = format!("{:?}: {}", status.code(), status.message());
            match status.code() {
                Code::DeadlineExceeded => GatewayError::Timeout {
                    store: STORE,
                    message,
                },
                Code::InvalidArgument | Code::OutOfRange | Code::Unimplemented => {
                    GatewayError::Rejected {
                        store: STORE,
                        message,
                    }
                }
                // A wrong or missing API key affects every job alike: retried until an
                // operator fixes the configuration, never a pile of dead jobs.
                Code::Unauthenticated | Code::PermissionDenied => GatewayError::Unavailable {
                    store: STORE,
                    message: format!("{message} (check the vectors API key)"),
                },
                _ => GatewayError::Unavailable {
                    store: STORE,
                    message,
                },
            }
        }
        QdrantError::ResourceExhaustedError {
            status,
            retry_after_seconds,
        } => GatewayError::Unavailable {
            store: STORE,
            message: format!(
                "resource exhausted: {} (retry after {retry_after_seconds} s)",
                status.message()
            ),
        },
        QdrantError::Io(error) => GatewayError::Unavailable {
            store: STORE,
            message: error.to_string(),
        },
        other => GatewayError::Config(format!("{STORE}: {other}")),
    }
}

fn keyword(field: &str, value: &str) -> Condition {
    Condition::matches(field, value.to_owned())
}

fn flag(field: &str, value: bool) -> Condition {
    Condition::matches(field, value)
}

fn kind_of(kind: FieldKind) -> FieldType {
    match kind {
        FieldKind::Keyword => FieldType::Keyword,
        FieldKind::Integer => FieldType::Integer,
        FieldKind::Bool => FieldType::Bool,
        FieldKind::Float => FieldType::Float,
    }
}

/// A pushed-down search filter as a Qdrant condition.
fn pushed_condition(filter: &PayloadFilter) -> Condition {
    let all = |nodes: &[PayloadFilter]| nodes.iter().map(pushed_condition).collect::<Vec<_>>();
    match filter {
        PayloadFilter::All(nodes) => Condition::from(Filter::must(all(nodes))),
        PayloadFilter::Any(nodes) => Condition::from(Filter::should(all(nodes))),
        PayloadFilter::Not(node) => Condition::from(Filter::must_not([pushed_condition(node)])),
        PayloadFilter::Keywords(key, values) => Condition::matches(key.as_str(), values.clone()),
        PayloadFilter::Numbers(key, range) => {
            let mut bounds = Range::default();
            match range.lower {
                Some((lower, true)) => bounds.gte = Some(lower),
                Some((lower, false)) => bounds.gt = Some(lower),
                None => {}
            }
            match range.upper {
                Some((upper, true)) => bounds.lte = Some(upper),
                Some((upper, false)) => bounds.lt = Some(upper),
                None => {}
            }
            Condition::range(key.as_str(), bounds)
        }
        PayloadFilter::Flag(key, value) => Condition::matches(key.as_str(), *value),
        PayloadFilter::Missing(key) => Condition::is_empty(key.as_str()),
    }
}

fn text(payload: &HashMap<String, Value>, key: &str) -> Option<String> {
    match payload.get(key)?.kind.as_ref()? {
        Kind::StringValue(value) => Some(value.clone()),
        _ => None,
    }
}

/// A point's dense vector, if it has one (older servers send it in the deprecated `data`).
fn dense(vectors: Option<qdrant_client::qdrant::VectorsOutput>) -> Option<Vec<f32>> {
    match vectors?.vectors_options? {
        vectors_output::VectorsOptions::Vector(vector) => match vector.vector {
            Some(qdrant_client::qdrant::vector_output::Vector::Dense(dense)) => Some(dense.data),
            #[allow(deprecated)]
            None => Some(vector.data),
            Some(_) => None,
        },
        _ => None,
    }
}

/// A point's id, when it is a UUID (cairn writes no other kind).
fn uuid_of(id: Option<&PointId>) -> Option<Uuid> {
    match id?.point_id_options.as_ref()? {
        qdrant_client::qdrant::point_id::PointIdOptions::Uuid(text) => text.parse().ok(),
        _ => None,
    }
}

fn integer(payload: &HashMap<String, Value>, key: &str) -> Option<i64> {
    match payload.get(key)?.kind.as_ref()? {
        Kind::IntegerValue(value) => Some(*value),
        _ => None,
    }
}

fn current_payload(
    is_current: bool,
    head_at: Option<i64>,
    bucket: Option<u16>,
) -> HashMap<String, Value> {
    let mut payload = HashMap::new();
    payload.insert("is_current".to_owned(), Value::from(is_current));
    if let Some(bucket) = bucket {
        payload.insert("bucket".to_owned(), Value::from(i64::from(bucket)));
    }
    if let Some(head_at) = head_at {
        payload.insert("head_at".to_owned(), Value::from(head_at));
    }
    payload
}

/// The payload changes of one source's `set_current`, in order: `keep`'s points turn current
/// (and take `head_at`), then points of revisions that became head earlier turn not current.
fn current_changes(
    dataset: &str,
    source_key: &str,
    keep: Option<Uuid>,
    head_at: i64,
) -> Vec<(Filter, HashMap<String, Value>)> {
    let source = [
        keyword("dataset", dataset),
        keyword("source_key", source_key),
    ];
    let mut older = source.to_vec();
    older.push(Condition::range(
        "head_at",
        Range {
            lt: Some(head_at as f64),
            ..Range::default()
        },
    ));
    let mut older = Filter::must(older);
    // Points written before payloads carried `bucket` gain it with their next projection.
    let bucket = Some(receipts::verify::bucket(dataset, source_key));
    let mut changes = Vec::new();
    if let Some(keep) = keep {
        older.must_not = vec![keyword("revision_id", &keep.to_string())];
        let mut mine = source.to_vec();
        mine.push(keyword("revision_id", &keep.to_string()));
        changes.push((
            Filter::must(mine),
            current_payload(true, Some(head_at), bucket),
        ));
    }
    changes.push((older, current_payload(false, None, bucket)));
    changes
}

/// How long a search waits on one node before its abandonment (the caller's deadline)
/// counts as that node hanging. A healthy node answers in milliseconds.
const ABANDONED_AFTER: Duration = Duration::from_millis(500);

/// A search waiting on the node at `index`: dropped unanswered after [`ABANDONED_AFTER`] (the
/// search's budget ran out there), it moves the store's calls to the next node, as a timeout
/// would. A hung node (SIGSTOP, a half-open connection) answers no call and fails none, so
/// without this every search would wait on it until its budget ran out.
struct Waiting<'a> {
    store: &'a ServerVectorStore,
    index: usize,
    since: std::time::Instant,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let waited = self.since.elapsed();
        if !self.answered && waited >= ABANDONED_AFTER {
            self.store.fail_over(
                self.index,
                &GatewayError::Timeout {
                    store: STORE,
                    message: format!(
                        "a search waited {} ms without an answer and ran out of its budget",
                        waited.as_millis()
                    ),
                },
            );
        }
    }
}

impl ServerVectorStore {
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
        let mut filter = if current_only {
            Filter::must([flag("is_current", true)])
        } else {
            Filter::default()
        };
        if let Some(pushed) = pushed {
            filter.must.push(pushed_condition(pushed));
        }
        if let Some(revisions) = within {
            let ids: Vec<String> = revisions.iter().map(Uuid::to_string).collect();
            filter.must.push(Condition::matches("revision_id", ids));
        }
        if !datasets.is_empty() {
            filter.should = datasets
                .iter()
                .map(|dataset| keyword("dataset", dataset))
                .collect();
        }
        // No backoff: the caller's search deadline bounds it. A node that fails moves the
        // search to the next one at once, each node tried at most once. A node that hangs
        // is noticed too: a search abandoned (its budget spent) after waiting on it for
        // [`ABANDONED_AFTER`] moves the next searches off it (`Waiting`).
        let mut request = SearchPointsBuilder::new(self.collection.as_str(), vector, limit as u64)
            .filter(filter)
            .with_payload(true);
        if within.is_some() {
            // A narrowed search is exact, as on qdrant-edge.
            request = request.params(SearchParamsBuilder::default().exact(true));
        }
        let mut attempt = 0;
        let response = loop {
            let (index, client) = self.node();
            let mut waiting = Waiting {
                store: self,
                index,
                since: std::time::Instant::now(),
                answered: false,
            };
            let answer = client.search_points(request.clone()).await;
            waiting.answered = true;
            match answer.map_err(classify) {
                Ok(response) => break response,
                Err(error) if crate::retry::retryable(&error) && attempt + 1 < self.nodes.len() => {
                    self.fail_over(index, &error);
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        };
        Ok(response
            .result
            .into_iter()
            .filter_map(|point| {
                let revision_id = text(&point.payload, "revision_id")?.parse().ok()?;
                let chunk_index = u32::try_from(integer(&point.payload, "chunk_index")?).ok()?;
                Some(VectorHit {
                    dataset: text(&point.payload, "dataset")?,
                    source_key: text(&point.payload, "source_key")?,
                    revision_id,
                    chunk_index,
                    score: point.score,
                })
            })
            .collect())
    }

    /// Connects to the server and makes sure the generation's collection exists (cosine
    /// distance, `dimension`) with its payload indexes; refuses a collection of another
    /// dimension. Concurrent openers (several workers starting at once) are fine.
    pub async fn open(
        options: &ServerOptions,
        generation: &str,
        dimension: usize,
    ) -> Result<ServerVectorStore, GatewayError> {
        if options.urls.is_empty() {
            return Err(GatewayError::Config(
                "no Qdrant URL: set vectors.url or vectors.urls".to_owned(),
            ));
        }
        let mut nodes = Vec::with_capacity(options.urls.len());
        for url in &options.urls {
            let client = Qdrant::from_url(url)
                .api_key(options.api_key.clone())
                .timeout(options.timeout)
                .connect_timeout(options.connect_timeout)
                .skip_compatibility_check()
                .build()
                .map_err(|error| GatewayError::Config(format!("the Qdrant URL {url}: {error}")))?;
            nodes.push(Node {
                url: url.clone(),
                client: Arc::new(client),
            });
        }
        let store = ServerVectorStore {
            nodes: nodes.into(),
            active: Arc::new(AtomicUsize::new(0)),
            collection: format!("{}{generation}", options.collection_prefix),
            dimension,
            layout: options.layout,
            retry_budget: options.retry_budget,
        };
        store.ensure_collection().await?;
        Ok(store)
    }

    /// The collection's name.
    pub fn collection(&self) -> &str {
        &self.collection
    }

    /// The URL of the node calls go to now.
    pub fn url(&self) -> &str {
        &self.node_at(self.active.load(Ordering::Relaxed)).url
    }

    fn node_at(&self, index: usize) -> &Node {
        &self.nodes[index % self.nodes.len()]
    }

    /// The active node's index and client.
    fn node(&self) -> (usize, Arc<Qdrant>) {
        let index = self.active.load(Ordering::Relaxed) % self.nodes.len();
        (index, self.node_at(index).client.clone())
    }

    /// Moves calls from the node at `failed` to the next one (unless another call already
    /// moved them), and logs it: an operator sees which node failed and where cairn went.
    fn fail_over(&self, failed: usize, error: &GatewayError) {
        if self.nodes.len() < 2 {
            return;
        }
        let next = (failed + 1) % self.nodes.len();
        if self
            .active
            .compare_exchange(failed, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::warn!(
                failed = %self.node_at(failed).url,
                next = %self.node_at(next).url,
                collection = %self.collection,
                %error,
                "Qdrant node failed; failing over to the next node"
            );
        }
    }

    /// Runs `call` on the active node, retrying transient failures with exponential backoff
    /// for up to the retry budget; each transient failure moves the store to the next node
    /// first. Every operation here is idempotent (upserts by id, payload sets by filter).
    async fn retrying<T, F, Fut>(&self, what: &'static str, call: F) -> Result<T, GatewayError>
    where
        F: Fn(Arc<Qdrant>) -> Fut,
        Fut: std::future::Future<Output = Result<T, QdrantError>>,
    {
        crate::retry::with_backoff(self.retry_budget, what, &self.location(), || async {
            let (index, client) = self.node();
            let result = call(client).await.map_err(classify);
            if let Err(error) = &result {
                if crate::retry::retryable(error) {
                    self.fail_over(index, error);
                }
            }
            result
        })
        .await
    }

    async fn ensure_collection(&self) -> Result<(), GatewayError> {
        let exists = self
            .retrying("collection_exists", |client| {
                let request = self.collection.as_str();
                async move { client.collection_exists(request).await }
            })
            .await?;
        if !exists {
            let mut request =
                CreateCollectionBuilder::new(self.collection.as_str()).vectors_config(
                    VectorParamsBuilder::new(self.dimension as u64, Distance::Cosine),
                );
            if let Some(shards) = self.layout.shards {
                request = request.shard_number(shards);
            }
            if let Some(replication) = self.layout.replication_factor {
                request = request.replication_factor(replication);
            }
            if let Some(write_consistency) = self.layout.write_consistency {
                request = request.write_consistency_factor(write_consistency);
            }
            let created = self.node().1.create_collection(request).await;
            if let Err(error) = created {
                // Another process may have created it first.
                let exists = self
                    .retrying("collection_exists", |client| {
                        let request = self.collection.as_str();
                        async move { client.collection_exists(request).await }
                    })
                    .await?;
                if !exists {
                    return Err(classify(error));
                }
            } else {
                tracing::info!(url = %self.url(), collection = %self.collection, dimension = self.dimension, layout = %self.layout.fingerprint(), "created the Qdrant collection");
            }
        }
        let info = self
            .retrying("collection_info", |client| {
                let request = self.collection.as_str();
                async move { client.collection_info(request).await }
            })
            .await?;
        let size = info
            .result
            .as_ref()
            .and_then(|info| info.config.as_ref())
            .and_then(|config| config.params.as_ref())
            .and_then(|params| params.vectors_config.as_ref())
            .and_then(|vectors| vectors.config.as_ref())
            .and_then(|config| match config {
                vectors_config::Config::Params(params) => Some(params.size),
                vectors_config::Config::ParamsMap(_) => None,
            });
        if size != Some(self.dimension as u64) {
            return Err(GatewayError::Config(format!(
                "the Qdrant collection {} at {} has vectors of size {size:?}, the model {}; \
                 start a new generation or use another collection prefix",
                self.collection,
                self.url(),
                self.dimension
            )));
        }
        let params = info
            .result
            .as_ref()
            .and_then(|info| info.config.as_ref())
            .and_then(|config| config.params.as_ref());
        if let Some(params) = params {
            let differences = self.layout.differences(
                params.shard_number,
                params.replication_factor.unwrap_or(1),
                params.write_consistency_factor.unwrap_or(1),
            );
            if let Some(differences) = differences {
                return Err(GatewayError::Config(format!(
                    "the Qdrant collection {} at {} is laid out otherwise: {differences}; a \
                     layout is part of the generation, so start a new generation (or use \
                     another collection prefix) instead of reusing this collection",
                    self.collection,
                    self.url()
                )));
            }
            if params.replication_factor.unwrap_or(1) > 1
                && params.read_fan_out_delay_ms != Some(READ_FAN_OUT_DELAY_MS)
            {
                self.retrying("update_collection", |client| {
                    let request = UpdateCollectionBuilder::new(self.collection.as_str()).params(
                        CollectionParamsDiffBuilder::default()
                            .read_fan_out_delay_ms(READ_FAN_OUT_DELAY_MS),
                    );
                    async move { client.update_collection(request).await }
                })
                .await?;
            }
        }
        let indexed: Vec<String> = info
            .result
            .map(|info| info.payload_schema.into_keys().collect())
            .unwrap_or_default();
        self.create_missing(&indexed, INDEXED_FIELDS).await
    }

    /// Creates the payload indexes among `fields` that are not in `indexed`, each waited for.
    async fn create_missing<'a>(
        &self,
        indexed: &[String],
        fields: impl IntoIterator<Item = (&'a str, FieldKind)>,
    ) -> Result<(), GatewayError> {
        for (field, kind) in fields {
            if indexed.iter().any(|name| name == field) {
                continue;
            }
            self.retrying("create_field_index", |client| {
                let request = CreateFieldIndexCollectionBuilder::new(
                    self.collection.as_str(),
                    field,
                    kind_of(kind),
                )
                .wait(true);
                async move { client.create_field_index(request).await }
            })
            .await?;
        }
        Ok(())
    }

    async fn count(&self, filter: Filter) -> Result<usize, GatewayError> {
        let response = self
            .retrying("count", |client| {
                let request = CountPointsBuilder::new(self.collection.as_str())
                    .filter(filter.clone())
                    .exact(true)
                    .read_consistency(quorum());
                async move { client.count(request).await }
            })
            .await?;
        Ok(response
            .result
            .map(|result| usize::try_from(result.count).unwrap_or(usize::MAX))
            .unwrap_or(0))
    }

    async fn set_payload(
        &self,
        filter: Filter,
        is_current: bool,
        head_at: Option<i64>,
        bucket: Option<u16>,
    ) -> Result<(), GatewayError> {
        let payload = current_payload(is_current, head_at, bucket);
        self.retrying("set_payload", |client| {
            let request = SetPayloadPointsBuilder::new(self.collection.as_str(), payload.clone())
                .points_selector(filter.clone())
                .wait(true)
                .ordering(ordered());
            async move { client.set_payload(request).await }
        })
        .await?;
        Ok(())
    }

    /// Waits (up to `limit`) until the server's optimisers have finished with the collection
    /// (status green: indexes built); returns whether they did.
    pub async fn wait_until_optimized(&self, limit: Duration) -> Result<bool, GatewayError> {
        let started = std::time::Instant::now();
        loop {
            let info = self
                .retrying("collection_info", |client| {
                    let request = self.collection.as_str();
                    async move { client.collection_info(request).await }
                })
                .await?;
            let status = info.result.map(|info| info.status);
            if status == Some(qdrant_client::qdrant::CollectionStatus::Green as i32) {
                return Ok(true);
            }
            if started.elapsed() >= limit {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Deletes the collection and everything in it (benchmarks' scratch collections).
    pub async fn delete_collection(&self) -> Result<(), GatewayError> {
        self.retrying("delete_collection", |client| {
            let request = self.collection.as_str();
            async move { client.delete_collection(request).await }
        })
        .await?;
        Ok(())
    }

    /// Whether the collection exists (the read-back of [`ServerVectorStore::delete_collection`]).
    pub async fn exists(&self) -> Result<bool, GatewayError> {
        self.retrying("collection_exists", |client| {
            let request = self.collection.as_str();
            async move { client.collection_exists(request).await }
        })
        .await
    }

    /// Points in the collection (all revisions).
    pub async fn total_points(&self) -> Result<usize, GatewayError> {
        self.count(Filter::default()).await
    }
}

#[async_trait]
impl VectorStore for ServerVectorStore {
    fn name(&self) -> &'static str {
        STORE
    }

    fn location(&self) -> String {
        format!("{} collection {}", self.url(), self.collection)
    }

    fn dimension(&self) -> usize {
        self.dimension
    }

    async fn upsert(&self, points: Vec<VectorPoint>) -> Result<(), GatewayError> {
        if points.is_empty() {
            return Ok(());
        }
        check_dimensions(&points, self.dimension)?;
        let points: Vec<PointStruct> = points
            .into_iter()
            .map(|point| {
                let mut payload: HashMap<String, Value> = HashMap::new();
                payload.insert(
                    "bucket".to_owned(),
                    Value::from(i64::from(receipts::verify::bucket(
                        &point.dataset,
                        &point.source_key,
                    ))),
                );
                payload.insert("dataset".to_owned(), Value::from(point.dataset));
                payload.insert(
                    "source_key".to_owned(),
                    Value::from(point.source_key.clone()),
                );
                payload.insert(
                    "revision_id".to_owned(),
                    Value::from(point.revision_id.to_string()),
                );
                payload.insert(
                    "chunk_index".to_owned(),
                    Value::from(i64::from(point.chunk_index)),
                );
                payload.insert("head_at".to_owned(), Value::from(point.head_at));
                payload.insert("is_current".to_owned(), Value::from(true));
                if let Some(facts) = &point.facts {
                    payload.extend(
                        facts
                            .payload(&point.source_key)
                            .into_iter()
                            .map(|(key, value)| (key, Value::from(value))),
                    );
                }
                PointStruct::new(
                    point_id(point.revision_id, point.chunk_index),
                    point.vector,
                    payload,
                )
            })
            .collect();
        self.retrying("upsert", |client| {
            let request = UpsertPointsBuilder::new(self.collection.as_str(), points.clone())
                .wait(true)
                .ordering(ordered());
            async move { client.upsert_points(request).await }
        })
        .await?;
        Ok(())
    }

    async fn revision_points(&self, revision_id: Uuid) -> Result<RevisionPoints, GatewayError> {
        let revision = keyword("revision_id", &revision_id.to_string());
        let count = self.count(Filter::must([revision.clone()])).await?;
        let current = self
            .count(Filter::must([revision, flag("is_current", true)]))
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
        for (filter, payload) in current_changes(dataset, source_key, keep, head_at) {
            self.retrying("set_payload", |client| {
                let request =
                    SetPayloadPointsBuilder::new(self.collection.as_str(), payload.clone())
                        .points_selector(filter.clone())
                        .wait(true)
                        .ordering(ordered());
                async move { client.set_payload(request).await }
            })
            .await?;
        }
        Ok(())
    }

    async fn set_current_many(&self, changes: &[CurrentChange]) -> Result<(), GatewayError> {
        // One request for the whole unit: the server applies the operations in order.
        let operations: Vec<PointsUpdateOperation> = changes
            .iter()
            .flat_map(|change| {
                current_changes(
                    &change.dataset,
                    &change.source_key,
                    Some(change.keep),
                    change.head_at,
                )
            })
            .map(|(filter, payload)| PointsUpdateOperation {
                operation: Some(points_update_operation::Operation::SetPayload(
                    points_update_operation::SetPayload {
                        payload,
                        points_selector: Some(filter.into()),
                        ..Default::default()
                    },
                )),
            })
            .collect();
        if operations.is_empty() {
            return Ok(());
        }
        self.retrying("update_batch", |client| {
            let request =
                UpdateBatchPointsBuilder::new(self.collection.as_str(), operations.clone())
                    .wait(true)
                    .ordering(ordered());
            async move { client.update_points_batch(request).await }
        })
        .await?;
        Ok(())
    }

    async fn revisions_points(
        &self,
        revision_ids: &[Uuid],
    ) -> Result<Vec<RevisionPoints>, GatewayError> {
        // The revisions' reads in flight together (each is three requests in order).
        futures::future::try_join_all(
            revision_ids
                .iter()
                .map(|revision_id| self.revision_points(*revision_id)),
        )
        .await
    }

    async fn source_current(&self, dataset: &str, source_key: &str) -> Result<usize, GatewayError> {
        self.count(Filter::must([
            keyword("dataset", dataset),
            keyword("source_key", source_key),
            flag("is_current", true),
        ]))
        .await
    }

    async fn set_readers(
        &self,
        dataset: &str,
        source_key: &str,
        readers: &[String],
    ) -> Result<(), GatewayError> {
        let payload: HashMap<String, Value> = super::payload::readers_payload(readers)
            .into_iter()
            .map(|(key, value)| (key, Value::from(value)))
            .collect();
        let filter = Filter::must([
            keyword("dataset", dataset),
            keyword("source_key", source_key),
        ]);
        self.retrying("set_payload", |client| {
            let request = SetPayloadPointsBuilder::new(self.collection.as_str(), payload.clone())
                .points_selector(filter.clone())
                .wait(true)
                .ordering(ordered());
            async move { client.set_payload(request).await }
        })
        .await?;
        Ok(())
    }

    async fn readers_held(
        &self,
        dataset: &str,
        source_key: &str,
        readers: &[String],
    ) -> Result<(usize, usize), GatewayError> {
        let source = [
            keyword("dataset", dataset),
            keyword("source_key", source_key),
        ];
        let total = self.count(Filter::must(source.clone())).await?;
        let digest = keyword("readers_digest", &super::payload::readers_digest(readers));
        let carrying = self
            .count(Filter::must(source.into_iter().chain([digest])))
            .await?;
        Ok((total, carrying))
    }

    async fn retire_revision(&self, revision_id: Uuid) -> Result<(), GatewayError> {
        self.set_payload(
            Filter::must([keyword("revision_id", &revision_id.to_string())]),
            false,
            None,
            None,
        )
        .await
    }

    async fn delete_points(&self, selector: PointSelector) -> Result<(), GatewayError> {
        let filter = selected(&selector);
        self.retrying("delete_points", |client| {
            let request = DeletePointsBuilder::new(self.collection.as_str())
                .points(filter.clone())
                .wait(true)
                .ordering(ordered());
            async move { client.delete_points(request).await }
        })
        .await?;
        Ok(())
    }

    async fn count_points(&self, selector: PointSelector) -> Result<usize, GatewayError> {
        self.count(selected(&selector)).await
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

    async fn vectors(&self, ids: &[Uuid]) -> Result<Vec<Option<Vec<f32>>>, GatewayError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let points: Vec<PointId> = ids.iter().map(|id| PointId::from(*id)).collect();
        let response = self
            .retrying("get_points", |client| {
                let request = GetPointsBuilder::new(self.collection.as_str(), points.clone())
                    .with_payload(false)
                    .with_vectors(true)
                    .read_consistency(quorum());
                async move { client.get_points(request).await }
            })
            .await?;
        let mut found = HashMap::new();
        for point in response.result {
            let id = uuid_of(point.id.as_ref());
            let vector = dense(point.vectors);
            if let (Some(id), Some(vector)) = (id, vector) {
                if vector.len() == self.dimension {
                    found.insert(id, vector);
                }
            }
        }
        // An id asked twice (two jobs of a unit reusing one vector) is answered twice.
        Ok(ids.iter().map(|id| found.get(id).cloned()).collect())
    }

    async fn indexed_fields(&self) -> Result<Vec<String>, GatewayError> {
        let info = self
            .retrying("collection_info", |client| {
                let request = self.collection.as_str();
                async move { client.collection_info(request).await }
            })
            .await?;
        Ok(info
            .result
            .map(|info| info.payload_schema.into_keys().collect())
            .unwrap_or_default())
    }

    async fn ensure_indexes(&self, fields: &[(String, FieldKind)]) -> Result<(), GatewayError> {
        let indexed = self.indexed_fields().await?;
        let wanted: Vec<(&str, FieldKind)> = fields
            .iter()
            .map(|(field, kind)| (field.as_str(), *kind))
            .collect();
        self.create_missing(&indexed, wanted).await
    }

    async fn bucket_points(&self, bucket: u16, vectors: bool) -> Result<Vec<Held>, GatewayError> {
        let filter = Filter::must([Condition::matches("bucket", i64::from(bucket))]);
        let mut points = Vec::new();
        let mut offset: Option<PointId> = None;
        loop {
            let mut request = ScrollPointsBuilder::new(self.collection.as_str())
                .filter(filter.clone())
                .limit(SCROLL_PAGE as u32)
                .with_payload(true)
                .with_vectors(vectors)
                .read_consistency(quorum());
            if let Some(offset) = offset.clone() {
                request = request.offset(offset);
            }
            let response = self
                .retrying("scroll", |client| {
                    let request = request.clone();
                    async move { client.scroll(request).await }
                })
                .await?;
            for point in response.result {
                // A point without a dense vector counts as one of dimension 0 (drift).
                let values: Option<Vec<f32>> = point
                    .vectors
                    .map(|vectors| dense(Some(vectors)).unwrap_or_default());
                let dimension = values.as_ref().map(Vec::len);
                let length = values.as_deref().map(super::norm);
                let is_current = matches!(
                    point
                        .payload
                        .get("is_current")
                        .and_then(|value| value.kind.as_ref()),
                    Some(Kind::BoolValue(true))
                );
                points.push(ScrolledPoint {
                    dataset: text(&point.payload, "dataset"),
                    source_key: text(&point.payload, "source_key"),
                    revision_id: text(&point.payload, "revision_id"),
                    is_current,
                    dimension,
                    norm: length,
                });
            }
            match response.next_page_offset {
                Some(next) => offset = Some(next),
                None => break,
            }
        }
        Ok(fold_points(points, self.dimension))
    }

    async fn bucket_current(&self, bucket: u16) -> Result<usize, GatewayError> {
        self.count(Filter::must([
            Condition::matches("bucket", i64::from(bucket)),
            flag("is_current", true),
        ]))
        .await
    }

    async fn bucket_counts(&self) -> Result<HashMap<u16, usize>, GatewayError> {
        // One exact facet count of the indexed integer field, read with quorum consistency
        // on a replicated collection. Qdrant sums the facet hits of the replicas it consulted,
        // so a replicated bucket may be counted more than once (never less: a quorum of
        // replicas always meets one that holds each point): verify only asks whether a bucket
        // holds any point.
        let response = self
            .retrying("facet", |client| {
                let request = FacetCountsBuilder::new(self.collection.as_str(), "bucket")
                    .exact(true)
                    .limit(u64::from(receipts::verify::BUCKETS))
                    .read_consistency(quorum());
                async move { client.facet(request).await }
            })
            .await?;
        let mut counts = HashMap::new();
        for hit in response.hits {
            let Some(qdrant_client::qdrant::facet_value::Variant::IntegerValue(value)) =
                hit.value.and_then(|value| value.variant)
            else {
                continue;
            };
            if let (Ok(bucket), true) = (u16::try_from(value), hit.count > 0) {
                counts.insert(bucket, usize::try_from(hit.count).unwrap_or(usize::MAX));
            }
        }
        Ok(counts)
    }

    async fn scroll_all(
        &self,
        after: Option<Uuid>,
        limit: usize,
    ) -> Result<(Vec<super::StoredPoint>, Option<Uuid>), GatewayError> {
        let mut request = ScrollPointsBuilder::new(self.collection.as_str())
            .limit(u32::try_from(limit.max(1) + usize::from(after.is_some())).unwrap_or(u32::MAX))
            .with_payload(true)
            .with_vectors(true)
            .read_consistency(quorum());
        if let Some(after) = after {
            request = request.offset(PointId::from(after));
        }
        let response = self
            .retrying("scroll", |client| {
                let request = request.clone();
                async move { client.scroll(request).await }
            })
            .await?;
        let mut points = Vec::with_capacity(response.result.len());
        for point in response.result {
            let id = uuid_of(point.id.as_ref());
            let Some(id) = id else { continue };
            if Some(id) == after {
                continue;
            }
            let vector = dense(point.vectors).unwrap_or_default();
            let payload = point
                .payload
                .into_iter()
                .filter_map(|(key, value)| {
                    let json = match value.kind? {
                        Kind::StringValue(text) => serde_json::Value::from(text),
                        Kind::IntegerValue(number) => serde_json::Value::from(number),
                        Kind::DoubleValue(number) => serde_json::Value::from(number),
                        Kind::BoolValue(flag) => serde_json::Value::from(flag),
                        _ => return None,
                    };
                    Some((key, json))
                })
                .collect();
            points.push(super::StoredPoint {
                id,
                vector,
                payload,
            });
        }
        let next = response
            .next_page_offset
            .and_then(|_| points.last().map(|point| point.id));
        Ok((points, next))
    }

    async fn put_points(&self, points: Vec<super::StoredPoint>) -> Result<(), GatewayError> {
        super::check_stored_dimensions(&points, self.dimension)?;
        if points.is_empty() {
            return Ok(());
        }
        let points: Vec<PointStruct> = points
            .into_iter()
            .map(|point| {
                let payload: HashMap<String, Value> = point
                    .payload
                    .into_iter()
                    .filter_map(|(key, value)| {
                        let value = match value {
                            serde_json::Value::String(text) => Value::from(text),
                            serde_json::Value::Bool(flag) => Value::from(flag),
                            serde_json::Value::Number(number) => match number.as_i64() {
                                Some(integer) => Value::from(integer),
                                None => Value::from(number.as_f64()?),
                            },
                            _ => return None,
                        };
                        Some((key, value))
                    })
                    .collect();
                PointStruct::new(point.id, point.vector, payload)
            })
            .collect();
        self.retrying("upsert", |client| {
            let request = UpsertPointsBuilder::new(self.collection.as_str(), points.clone())
                .wait(true)
                .ordering(ordered());
            async move { client.upsert_points(request).await }
        })
        .await?;
        Ok(())
    }

    async fn backup_to(
        &self,
        _target: &std::path::Path,
    ) -> Result<super::StoreBackup, GatewayError> {
        Err(GatewayError::Config(format!(
            "backing up the Qdrant server at {} through its snapshot API is not built yet: \
             take a snapshot of collection {} with Qdrant's own API",
            self.url(),
            self.collection
        )))
    }

    async fn ensure_present(&self, create: bool) -> Result<bool, GatewayError> {
        if self.exists().await? {
            return Ok(true);
        }
        if !create {
            return Ok(false);
        }
        self.ensure_collection().await?;
        Ok(true)
    }

    async fn close(&self) -> Result<(), GatewayError> {
        // Every write was acknowledged with `wait = true`: nothing is buffered here.
        Ok(())
    }
}
