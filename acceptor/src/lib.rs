//! # acceptor: cairn's ingest API
//!
//! HTTP (axum) in front of the ledger's [`receipts::Acceptor`]. A request is admitted in this
//! order: bearer token (401), scope and dataset allowlist (403), body size (413), JSON shape
//! with unknown fields refused (422), names, content decoding, credential scan and field
//! limits (422). Only then does it reach the ledger, which answers with a durable receipt.
//!
//! ## Invariants
//! - A refused request writes nothing: every check runs before the ledger is called, and the
//!   ledger re-validates names at its own boundary.
//! - A `202` receipt means the bytes, revision, head move and job are committed to disk
//!   (`synchronous=FULL`). It does **not** mean the revision is indexed: `status` is
//!   `queued_not_confirmed` until workers project and read back every backend.
//! - No panic is reachable from input; every error is `{code, message, details?}` with a
//!   stable `code` (see [`receipts::http::ApiError`]). Credentials found in content are named
//!   by kind and byte offset, never echoed.
//! - Batch items are independent: one refused item does not fail the others, and results come
//!   back in request order.

mod batch;
mod secrets;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRef, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use receipts::http::{
    invalid_json, page_newest_first, read_json, read_json_body, ApiError, Auth, PageParams,
};
use receipts::{
    policy, validate, Change, ContentBlock, Document, Ledger, LedgerError, Scope, Submission,
};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use uuid::Uuid;

pub use secrets::{scan as scan_for_secrets, Finding};

/// Limits of the ingest API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptorConfig {
    /// Largest body of a single-source request, in bytes.
    pub max_body_bytes: usize,
    /// Largest body of a batch request, in bytes.
    pub max_batch_body_bytes: usize,
    /// Most items in one batch.
    pub max_batch_items: usize,
    /// Bytes of ingest bodies read and admitted at once, across all requests. A request
    /// reserves its declared length (its limit when it declares none) before reading a byte,
    /// and waits while the reservation does not fit; so memory stays bounded whatever the
    /// number of clients. At least the larger of the two body limits.
    pub max_body_bytes_in_flight: usize,
}

impl Default for AcceptorConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: policy::DEFAULT_MAX_BODY_BYTES,
            max_batch_body_bytes: policy::DEFAULT_MAX_BATCH_BODY_BYTES,
            max_batch_items: policy::DEFAULT_MAX_BATCH_ITEMS,
            max_body_bytes_in_flight: policy::DEFAULT_MAX_BATCH_BODY_BYTES,
        }
    }
}

/// State shared by the acceptor's handlers.
#[derive(Debug, Clone)]
pub struct AcceptorState {
    ledger: Arc<dyn Ledger>,
    config: Arc<AcceptorConfig>,
    /// The in-flight body budget, in KiB.
    budget: Arc<tokio::sync::Semaphore>,
}

impl AcceptorState {
    /// Reserves room for a body of at most `limit` bytes in the in-flight budget. A body
    /// declared larger than its limit reserves nothing: it is refused (413) before it is read.
    async fn reserve(
        &self,
        headers: &HeaderMap,
        limit: usize,
    ) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, ApiError> {
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<usize>().ok());
        if declared.is_some_and(|length| length > limit) {
            return Ok(None);
        }
        let bytes = declared
            .unwrap_or(limit)
            .min(self.config.max_body_bytes_in_flight);
        let kib = u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        self.budget
            .clone()
            .acquire_many_owned(kib)
            .await
            .map(Some)
            .map_err(|_| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "shutting_down",
                    "the server is stopping",
                )
            })
    }
}

impl FromRef<AcceptorState> for Arc<dyn Ledger> {
    fn from_ref(state: &AcceptorState) -> Self {
        state.ledger.clone()
    }
}

/// The ingest API's routes, ready to merge into cairn's router.
pub fn router(ledger: Arc<dyn Ledger>, config: AcceptorConfig) -> Router {
    let budget_kib = config.max_body_bytes_in_flight.div_ceil(1024).max(1);
    let state = AcceptorState {
        ledger,
        budget: Arc::new(tokio::sync::Semaphore::new(budget_kib)),
        config: Arc::new(config),
    };
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route(
            "/v1/sources",
            post(put_source).delete(delete_source).get(get_source),
        )
        .route("/v1/sources/batch", post(put_batch))
        .route("/v1/revisions/{id}", get(get_revision))
        .route("/v1/revisions/{id}/content", get(get_content))
        .route("/v1/blocks", post(block_content))
        .with_state(state)
}

/// One source in a request body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceRequest {
    dataset: String,
    source_key: String,
    content: Option<String>,
    content_base64: Option<String>,
    media_type: Option<String>,
    tags: Option<Vec<String>>,
    metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceQuery {
    dataset: String,
    source_key: String,
    reason: Option<String>,
    /// Reads: revisions and head moves per page (newest first).
    limit: Option<u32>,
    /// Reads: entries skipped.
    offset: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BlockRequest {
    dataset: String,
    content_sha256: String,
    reason: String,
}

/// Liveness: always `{"status": "ok"}`, without a token (also served past the connection cap).
pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// Readiness: the ledger answers. Any valid token may ask (only `/healthz` is open).
async fn readyz(State(state): State<AcceptorState>, _auth: Auth) -> Result<Json<Value>, ApiError> {
    state.ledger.ping().await?;
    Ok(Json(json!({ "status": "ready", "ledger": "reachable" })))
}

/// Checks a request item and turns it into a submission. Everything that can refuse the
/// request runs here, before the ledger sees it.
fn admit(auth: &Auth, request: SourceRequest) -> Result<Submission, ApiError> {
    let principal = auth.require(Scope::Ingest)?;
    validate::dataset(&request.dataset)?;
    validate::source_key(&request.source_key)?;
    principal.require_dataset(&request.dataset)?;
    let bytes = match (request.content, request.content_base64) {
        (Some(_), Some(_)) => {
            return Err(ApiError::unprocessable(
                "conflicting_content",
                "give either `content` or `content_base64`, not both",
            ))
        }
        (None, None) => {
            return Err(ApiError::unprocessable(
                "missing_content",
                "give `content` or `content_base64`",
            ))
        }
        (Some(text), None) => text.into_bytes(),
        (None, Some(encoded)) => base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|error| {
                ApiError::unprocessable(
                    "invalid_base64",
                    format!("content_base64 is not valid base64: {error}"),
                )
            })?,
    };
    validate::content(&bytes)?;
    let media_type = request
        .media_type
        .unwrap_or_else(|| "text/plain".to_owned());
    validate::media_type(&media_type)?;
    if let Err(error) = std::str::from_utf8(&bytes) {
        // Projection reads text; no binary format is extracted yet, so bytes that are not
        // UTF-8 would be accepted only to fail later. Refuse them now.
        return Err(ApiError::unprocessable(
            "not_text",
            format!(
                "content is not UTF-8 text (invalid byte at offset {}); cairn indexes text \
                 documents",
                error.valid_up_to()
            ),
        )
        .with_details(json!({ "offset": error.valid_up_to(), "media_type": media_type })));
    }
    // Credentials are refused wherever they would be stored: the content, the source key,
    // the tags and the metadata (its JSON text, keys and values).
    let metadata_text = request
        .metadata
        .as_ref()
        .map(|metadata| serde_json::to_string(metadata).unwrap_or_default());
    let tags_text = request.tags.as_ref().map(|tags| tags.join("\n"));
    let fields: [(&str, &[u8]); 4] = [
        ("content", &bytes),
        ("source_key", request.source_key.as_bytes()),
        ("tags", tags_text.as_deref().unwrap_or_default().as_bytes()),
        (
            "metadata",
            metadata_text.as_deref().unwrap_or_default().as_bytes(),
        ),
    ];
    for (field, text) in fields {
        if let Some(finding) = secrets::scan(text) {
            return Err(ApiError::unprocessable(
                "secret_detected",
                format!(
                    "{field} carries a credential ({}) at byte offset {}; remove it and resubmit",
                    finding.kind, finding.offset
                ),
            )
            .with_details(
                json!({ "field": field, "kind": finding.kind, "offset": finding.offset }),
            ));
        }
    }
    let document = Document {
        bytes,
        media_type,
        tags: request.tags.unwrap_or_default(),
        metadata: request.metadata.unwrap_or_default(),
    };
    validate::tags(&document.tags)?;
    validate::metadata(&document.metadata)?;
    Ok(Submission {
        dataset: request.dataset,
        source_key: request.source_key,
        actor: principal.actor(),
        change: Change::Put(document),
    })
}

async fn accept_one(state: &AcceptorState, submission: Submission) -> Result<Response, ApiError> {
    let mut results = state.ledger.accept(vec![submission]).await;
    let receipt = results.pop().unwrap_or_else(|| {
        Err(LedgerError::Unavailable(
            "the ledger returned no result".to_owned(),
        ))
    })?;
    Ok((StatusCode::ACCEPTED, Json(receipt)).into_response())
}

async fn put_source(
    State(state): State<AcceptorState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    auth.require(Scope::Ingest)?;
    let _reserved = state.reserve(&headers, state.config.max_body_bytes).await?;
    let request: SourceRequest = read_json(&headers, body, state.config.max_body_bytes).await?;
    let submission = admit(&auth, request)?;
    accept_one(&state, submission).await
}

fn item_error(index: usize, error: ApiError) -> Value {
    let mut value = json!({
        "index": index,
        "accepted": false,
        "http_status": error.status.as_u16(),
        "code": error.code,
        "message": error.message,
    });
    if let (Some(details), Some(object)) = (error.details, value.as_object_mut()) {
        object.insert("details".to_owned(), *details);
    }
    value
}

async fn put_batch(
    State(state): State<AcceptorState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    auth.require(Scope::Ingest)?;
    let _reserved = state
        .reserve(&headers, state.config.max_batch_body_bytes)
        .await?;
    let limit = state.config.max_batch_items;
    let body = read_json_body(&headers, body, state.config.max_batch_body_bytes).await?;
    let items = batch::parse(&body, limit).map_err(|error| match error {
        batch::BatchError::TooMany { limit } => ApiError::unprocessable(
            "batch_too_large",
            format!("more than {limit} items given; the limit is {limit}"),
        )
        .with_details(json!({ "limit": limit })),
        batch::BatchError::Invalid(error) => invalid_json(error),
    })?;
    // The items are parsed: the raw body is not needed any more.
    drop(body);
    if items.is_empty() {
        return Err(ApiError::unprocessable(
            "empty_batch",
            "`items` must hold at least one item",
        ));
    }
    let mut results: Vec<Option<Value>> = vec![None; items.len()];
    let mut admitted = Vec::new();
    let mut slots = Vec::new();
    for (index, item) in items.into_iter().enumerate() {
        let parsed = serde_json::from_value::<SourceRequest>(item)
            .map_err(|error| {
                ApiError::unprocessable("invalid_json", format!("items[{index}]: {error}"))
            })
            .and_then(|request| admit(&auth, request));
        match parsed {
            Ok(submission) => {
                slots.push(index);
                admitted.push(submission);
            }
            Err(error) => results[index] = Some(item_error(index, error)),
        }
    }
    if !admitted.is_empty() {
        let written = state.ledger.accept(admitted).await;
        for (index, result) in slots.into_iter().zip(written) {
            results[index] = Some(match result {
                Ok(receipt) => {
                    let mut value = serde_json::to_value(receipt).unwrap_or(Value::Null);
                    if let Some(object) = value.as_object_mut() {
                        object.insert("index".to_owned(), json!(index));
                    }
                    value
                }
                Err(error) => item_error(index, ApiError::from(error)),
            });
        }
    }
    let results: Vec<Value> = results
        .into_iter()
        .enumerate()
        .map(|(index, result)| {
            result.unwrap_or_else(|| {
                item_error(
                    index,
                    ApiError::from(LedgerError::Unavailable("no result".to_owned())),
                )
            })
        })
        .collect();
    Ok(Json(json!({ "results": results })).into_response())
}

fn source_query(
    query: Result<Query<SourceQuery>, QueryRejection>,
) -> Result<SourceQuery, ApiError> {
    let Query(query) = query
        .map_err(|rejection| ApiError::unprocessable("invalid_query", rejection.body_text()))?;
    validate::dataset(&query.dataset)?;
    validate::source_key(&query.source_key)?;
    Ok(query)
}

async fn delete_source(
    State(state): State<AcceptorState>,
    auth: Auth,
    query: Result<Query<SourceQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::Ingest)?;
    let query = source_query(query)?;
    principal.require_dataset(&query.dataset)?;
    if let Some(reason) = &query.reason {
        validate::reason(reason)?;
    }
    let submission = Submission {
        dataset: query.dataset,
        source_key: query.source_key,
        actor: principal.actor(),
        change: Change::Delete {
            reason: query.reason,
        },
    };
    accept_one(&state, submission).await
}

async fn get_source(
    State(state): State<AcceptorState>,
    auth: Auth,
    query: Result<Query<SourceQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let principal = auth.require_any(&[Scope::Ingest, Scope::OpsRead])?;
    let query = source_query(query)?;
    principal.require_dataset(&query.dataset)?;
    match state
        .ledger
        .source(&query.dataset, &query.source_key)
        .await?
    {
        Some(view) => {
            let (limit, offset) = PageParams {
                limit: query.limit,
                offset: query.offset,
            }
            .resolve()?;
            let mut value = serde_json::to_value(view).unwrap_or(Value::Null);
            page_newest_first(&mut value, "revisions", (limit, offset), true);
            page_newest_first(&mut value, "head_history", (limit, offset), false);
            Ok(Json(value).into_response())
        }
        None => Err(LedgerError::SourceNotFound {
            dataset: query.dataset,
            source_key: query.source_key,
        }
        .into()),
    }
}

fn revision_id(text: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(text).map_err(|_| {
        ApiError::unprocessable(
            "invalid_revision_id",
            format!("`{text}` is not a revision id (UUID)"),
        )
    })
}

/// The revision `id` if the token may read it. A revision outside the token's datasets is
/// answered as absent (404), so that ids do not leak what exists.
async fn visible_revision(
    state: &AcceptorState,
    auth: &Auth,
    id: &str,
) -> Result<receipts::RevisionDetail, ApiError> {
    let principal = auth.require_any(&[Scope::Ingest, Scope::OpsRead])?;
    let id = revision_id(id)?;
    let not_found = || ApiError::not_found("revision_not_found", format!("no revision {id}"));
    let detail = state.ledger.revision(id).await?.ok_or_else(not_found)?;
    principal
        .require_dataset(&detail.revision.dataset)
        .map_err(|_| not_found())?;
    Ok(detail)
}

async fn get_revision(
    State(state): State<AcceptorState>,
    auth: Auth,
    Path(id): Path<String>,
    Query(page): Query<PageParams>,
) -> Result<Response, ApiError> {
    let (limit, offset) = page.resolve()?;
    let detail = visible_revision(&state, &auth, &id).await?;
    let mut value = serde_json::to_value(detail).unwrap_or(Value::Null);
    page_newest_first(&mut value, "history", (limit, offset), false);
    Ok(Json(value).into_response())
}

async fn get_content(
    State(state): State<AcceptorState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let detail = visible_revision(&state, &auth, &id).await?;
    let id = detail.revision.id;
    let Some(sha256) = detail.revision.content_sha256 else {
        return Err(ApiError::new(
            StatusCode::GONE,
            "revision_is_tombstone",
            format!("revision {id} deletes its source and has no content"),
        ));
    };
    let bytes =
        state.ledger.content(&sha256).await?.ok_or_else(|| {
            ApiError::from(LedgerError::Corrupt(format!("content {sha256} missing")))
        })?;
    let media_type = detail.revision.media_type;
    // The bytes are the client's, served from the dashboard's origin: never rendered there
    // (attachment, no sniffing, and a policy that runs nothing if a browser renders anyway).
    Ok((
        [
            (header::CONTENT_TYPE, media_type),
            (header::ETAG, format!("\"{sha256}\"")),
            (header::CONTENT_DISPOSITION, "attachment".to_owned()),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; sandbox".to_owned(),
            ),
        ],
        bytes,
    )
        .into_response())
}

async fn block_content(
    State(state): State<AcceptorState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::OpsWrite)?;
    let request: BlockRequest = read_json(&headers, body, state.config.max_body_bytes).await?;
    validate::dataset(&request.dataset)?;
    principal.require_dataset(&request.dataset)?;
    validate::reason(&request.reason)?;
    let block = ContentBlock {
        dataset: request.dataset,
        sha256: request.content_sha256.to_ascii_lowercase(),
        reason: request.reason,
        actor: principal.actor(),
    };
    state.ledger.block_content(block.clone()).await?;
    Ok((StatusCode::CREATED, Json(block)).into_response())
}
