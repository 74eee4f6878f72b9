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

mod access;
mod batch;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRef, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use base64::Engine;
use receipts::http::{
    invalid_json, page_newest_first, read_json, read_json_body, ApiError, ApiErrors, Auth,
    PageParams,
};
use receipts::{
    policy, validate, AcceptLedger, Change, ContentBlock, Document, LedgerError, Scope, Submission,
    Tokens,
};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use uuid::Uuid;

use receipts::secrets;
pub use receipts::secrets::{scan as scan_for_secrets, Finding};

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
    ledger: Arc<dyn AcceptLedger>,
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

impl FromRef<AcceptorState> for Arc<dyn Tokens> {
    fn from_ref(state: &AcceptorState) -> Self {
        state.ledger.clone()
    }
}

/// The ingest API's routes with their OpenAPI description: each route is registered from
/// its handler's `#[utoipa::path]`, so the document cannot drift from the router.
pub fn routes(ledger: Arc<dyn AcceptLedger>, config: AcceptorConfig) -> OpenApiRouter {
    let budget_kib = config.max_body_bytes_in_flight.div_ceil(1024).max(1);
    let state = AcceptorState {
        ledger,
        budget: Arc::new(tokio::sync::Semaphore::new(budget_kib)),
        config: Arc::new(config),
    };
    let mut router = OpenApiRouter::new()
        .routes(utoipa_axum::routes!(healthz))
        .routes(utoipa_axum::routes!(readyz))
        .routes(utoipa_axum::routes!(put_source, delete_source, get_source))
        .routes(utoipa_axum::routes!(put_batch))
        .routes(utoipa_axum::routes!(list_sources))
        .routes(utoipa_axum::routes!(get_timeline))
        .routes(utoipa_axum::routes!(get_revision))
        .routes(utoipa_axum::routes!(get_content))
        .routes(utoipa_axum::routes!(block_content))
        .routes(utoipa_axum::routes!(access::get_access, access::put_access))
        .routes(utoipa_axum::routes!(access::put_dataset_access));
    exactly_one_content(router.get_openapi_mut());
    router.with_state(state)
}

/// States in the document what `admit` enforces: exactly one of `content` and
/// `content_base64` is a string (the other absent or null).
fn exactly_one_content(document: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
    let Some(components) = document.components.as_mut() else {
        return;
    };
    let Some(request) = components.schemas.remove("SourceRequest") else {
        return;
    };
    // Base64 of at least one byte (standard alphabet, padded).
    let base64 = ObjectBuilder::new().schema_type(Type::String).pattern(Some(
        "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2}==)$",
    ));
    let text = ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1));
    let branch = |name: &str, schema: ObjectBuilder, other: &str| {
        ObjectBuilder::new()
            .property(name, schema)
            .property(other, ObjectBuilder::new().schema_type(Type::Null))
            .required(name)
    };
    let combined = AllOfBuilder::new()
        .item(request)
        .item(
            OneOfBuilder::new()
                .item(branch("content", text, "content_base64"))
                .item(branch("content_base64", base64, "content")),
        )
        .description(Some(
            "One source: its text as `content`, or its bytes as `content_base64` (exactly one \
             of the two is a string).",
        ))
        .build();
    components
        .schemas
        .insert("SourceRequest".to_owned(), Schema::AllOf(combined).into());
}

/// The ingest API's routes, ready to merge into cairn's router.
pub fn router(ledger: Arc<dyn AcceptLedger>, config: AcceptorConfig) -> Router {
    routes(ledger, config).split_for_parts().0
}

fn tags_schema() -> utoipa::openapi::schema::Array {
    receipts::http::optional_names(receipts::http::tag_schema(), 0, Some(validate::MAX_TAGS))
}

/// One source: its text as `content`, or its bytes as `content_base64`: exactly one of the
/// two is a string.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct SourceRequest {
    #[schema(schema_with = receipts::http::dataset_schema)]
    dataset: String,
    #[schema(schema_with = receipts::http::source_key_schema)]
    source_key: String,
    /// The document's text (UTF-8; not empty).
    #[schema(min_length = 1)]
    content: Option<String>,
    /// The document's bytes in standard base64; they must be UTF-8 text.
    content_base64: Option<String>,
    /// `type/subtype` (default `text/plain`).
    #[schema(
        max_length = 255,
        pattern = r"^[^\x00-\x1f\x7f-\x9f /;]+/[^\x00-\x1f\x7f-\x9f /;]+$"
    )]
    media_type: Option<String>,
    /// At most 64 tags.
    #[schema(schema_with = tags_schema)]
    tags: Option<Vec<String>>,
    /// Any JSON object, at most 64 KiB serialised.
    #[schema(value_type = Option<Object>)]
    metadata: Option<Map<String, Value>>,
    /// Validity time: when this revision starts to hold. Epoch microseconds or RFC 3339 with
    /// an offset (`2026-03-01T00:00:00Z`); absent: from its acceptance. Earlier than now is a
    /// correction that reaches back; later than now schedules the revision: the head moves to
    /// it at that instant.
    #[schema(schema_with = receipts::http::instant_schema)]
    valid_from: Option<Value>,
    /// When it stops holding (absent: never). At that instant the revision that holds after
    /// it takes the head back; a period that ended before now is history only (not
    /// projected).
    #[schema(schema_with = receipts::http::instant_schema)]
    valid_to: Option<Value>,
    /// Who may read the source (`{"readers": ["user:alice", "group:eng"]}`); absent: the
    /// readers it has, else its dataset's default. Readers belong to the source, not the
    /// revision: `PUT /v1/sources/access` changes them without a new revision.
    access: Option<receipts::access::SourceAccess>,
}

/// A submission's validity from its wire fields (typed refusals for bad instants).
fn validity_of(
    valid_from: Option<&Value>,
    valid_to: Option<&Value>,
) -> Result<receipts::validity::Validity, ApiError> {
    Ok(receipts::validity::Validity {
        valid_from: receipts::validity::optional_instant("valid_from", valid_from)?,
        valid_to: receipts::validity::optional_instant("valid_to", valid_to)?,
    })
}

/// The batch body: up to `limits.max_batch_items` (1000) items. Each item should be a
/// `SourceRequest`; an item that is not one fails alone, with its error in the answer, and the
/// others are accepted.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct BatchRequest {
    #[schema(min_items = 1, max_items = 1000, value_type = Vec<serde_json::Value>)]
    items: Vec<Value>,
}

/// The batch answer: one entry per item, in request order: a receipt with its `index`, or
/// `{index, accepted: false, http_status, code, message, details?}`.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
struct BatchResponse {
    #[schema(value_type = Vec<Object>)]
    results: Vec<Value>,
}

/// Which source.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceQuery {
    dataset: String,
    source_key: String,
    reason: Option<String>,
    erase: Option<bool>,
    /// Deletes: when the source stops existing (validity time; absent: now).
    valid_from: Option<String>,
    limit: Option<u32>,
    offset: Option<u32>,
}

impl IntoParams for SourceQuery {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
        use utoipa::openapi::Required;
        let parameter = |name: &str, required: bool, schema, description: &str| {
            ParameterBuilder::new()
                .name(name)
                .parameter_in(ParameterIn::Query)
                .required(if required {
                    Required::True
                } else {
                    Required::False
                })
                .schema(Some(schema))
                .description(Some(description))
                .build()
        };
        let number = |minimum: f64, maximum: f64| {
            utoipa::openapi::schema::ObjectBuilder::new()
                .schema_type(utoipa::openapi::schema::Type::Integer)
                .minimum(Some(minimum))
                .maximum(Some(maximum))
                .build()
        };
        vec![
            parameter(
                "dataset",
                true,
                receipts::http::dataset_schema(),
                "The dataset.",
            ),
            parameter(
                "source_key",
                true,
                receipts::http::source_key_schema(),
                "The source key.",
            ),
            parameter(
                "reason",
                false,
                receipts::http::reason_schema(),
                "Deletes: why (recorded in history).",
            ),
            parameter(
                "erase",
                false,
                utoipa::openapi::schema::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::Boolean)
                    .build(),
                "Deletes: erase every trace of every revision instead of a tombstone (scope \
                 `erase`; `reason` required).",
            ),
            parameter(
                "valid_from",
                false,
                utoipa::openapi::schema::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .build(),
                "Deletes: the instant from which the source no longer exists (validity time): \
                 epoch microseconds or RFC 3339 with an offset; absent: now.",
            ),
            parameter(
                "limit",
                false,
                number(1.0, 500.0),
                "Reads: revisions and head moves per page, newest first (default 50).",
            ),
            parameter(
                "offset",
                false,
                number(0.0, 4_294_967_295.0),
                "Reads: entries skipped.",
            ),
        ]
    }
}

/// Content to block in a dataset.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct BlockRequest {
    #[schema(schema_with = receipts::http::dataset_schema)]
    dataset: String,
    /// SHA-256 of the exact bytes, 64 hex digits.
    #[schema(pattern = "^[0-9a-fA-F]{64}$")]
    content_sha256: String,
    /// Why (recorded in history); 1-500 printable characters, not only spaces.
    #[schema(schema_with = receipts::http::reason_schema)]
    reason: String,
}

/// Liveness: always `{"status": "ok"}`, without a token (also served past the connection cap).
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "The process answers.", body = Object)))]
pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// Readiness: the ledger answers. Any valid token may ask (only `/healthz` is open).
#[utoipa::path(get, path = "/readyz", tag = "health", security(("bearer" = [])),
    responses((status = 200, description = "The ledger answers.", body = Object), ApiErrors))]
async fn readyz(State(state): State<AcceptorState>, _auth: Auth) -> Result<Json<Value>, ApiError> {
    state.ledger.ping().await?;
    Ok(Json(json!({ "status": "ready", "ledger": "reachable" })))
}

/// Checks a request item and turns it into a submission. Everything that can refuse the
/// request runs here, before the ledger sees it. The readers it names travel with the
/// submission: the ledger records them in the acceptance's own transaction, so a refused put
/// changes nobody's access.
fn admit(auth: &Auth, request: SourceRequest) -> Result<Submission, ApiError> {
    let readers = request
        .access
        .as_ref()
        .map(receipts::access::SourceAccess::checked)
        .transpose()?;
    let mut submission = admit_for(auth.require(Scope::Ingest)?, request)?;
    submission.readers = readers;
    Ok(submission)
}

/// A text document from a client that is not the HTTP API (an agent's MCP `ingest`).
#[derive(Debug, Clone, Default)]
pub struct TextDocument {
    /// The dataset.
    pub dataset: String,
    /// The source key.
    pub source_key: String,
    /// The text (UTF-8, not empty).
    pub content: String,
    /// `type/subtype` (default `text/plain`).
    pub media_type: Option<String>,
    /// Tags.
    pub tags: Option<Vec<String>>,
}

/// Checks a text document exactly as `POST /v1/sources` checks a body (scope `ingest`,
/// allowlist, names, format, credentials, limits) and turns it into a submission for
/// [`receipts::Acceptor::accept`].
pub fn admit_text(
    principal: &receipts::Principal,
    document: TextDocument,
) -> Result<Submission, ApiError> {
    principal.require(Scope::Ingest)?;
    admit_for(
        principal,
        SourceRequest {
            dataset: document.dataset,
            source_key: document.source_key,
            content: Some(document.content),
            content_base64: None,
            media_type: document.media_type,
            tags: document.tags,
            metadata: None,
            valid_from: None,
            valid_to: None,
            access: None,
        },
    )
}

fn admit_for(
    principal: &receipts::Principal,
    request: SourceRequest,
) -> Result<Submission, ApiError> {
    validate::dataset(&request.dataset)?;
    validate::source_key(&request.source_key)?;
    principal.require_dataset(&request.dataset)?;
    let validity = validity_of(request.valid_from.as_ref(), request.valid_to.as_ref())?;
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
    // The format decides how the bytes are read: text must be UTF-8, a binary document must
    // carry its format's signature, and each format has its size limit. Extraction itself
    // (and the credential scan of a binary document's text) runs in the ledger's acceptance.
    let format = extract::Format::of(&media_type);
    if let Err(error) = format.admit(&bytes) {
        let offset = std::str::from_utf8(&bytes)
            .err()
            .map(|error| error.valid_up_to());
        let status = if error.code == "document_too_large" {
            StatusCode::PAYLOAD_TOO_LARGE
        } else {
            StatusCode::UNPROCESSABLE_ENTITY
        };
        let details = match (error.code, offset) {
            ("not_text", Some(offset)) => json!({ "offset": offset, "media_type": media_type }),
            _ => json!({ "format": format.name(), "media_type": media_type, "bytes": bytes.len() }),
        };
        return Err(ApiError::new(status, error.code, error.message).with_details(details));
    }
    // Credentials are refused wherever they would be stored: the content, the source key,
    // the tags and the metadata (its JSON text, keys and values).
    let metadata_text = request
        .metadata
        .as_ref()
        .map(|metadata| serde_json::to_string(metadata).unwrap_or_default());
    let tags_text = request.tags.as_ref().map(|tags| tags.join("\n"));
    // A binary document's bytes are compressed streams: its extracted text is scanned instead.
    let content: &[u8] = if format.binary() { &[] } else { &bytes };
    let fields: [(&str, &[u8]); 4] = [
        ("content", content),
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
        connector: None,
        validity,
        change: Change::Put(document),
        readers: None,
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

/// Accepts one source: the receipt comes back once the bytes are committed to disk; the
/// revision is not indexed yet (`queued_not_confirmed`).
#[utoipa::path(post, path = "/v1/sources", tag = "ingest", security(("bearer" = [])),
    request_body(content = SourceRequest, content_type = "application/json"),
    responses((status = 202, description = "Durably accepted (or a duplicate of the head).", body = receipts::Acceptance), ApiErrors))]
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

/// Accepts up to 1000 sources; each item succeeds or fails alone, answered in order.
#[utoipa::path(post, path = "/v1/sources/batch", tag = "ingest", security(("bearer" = [])),
    request_body(content = BatchRequest, content_type = "application/json"),
    responses((status = 200, description = "One result per item, in request order.", body = BatchResponse), ApiErrors))]
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
    if let Some(reason) = &query.reason {
        validate::reason(reason)?;
    }
    // Paging is checked whichever method the query serves: a bad page is refused, never ignored.
    PageParams {
        limit: query.limit,
        offset: query.offset,
    }
    .resolve()?;
    Ok(query)
}

/// Deletes a source: a tombstone revision becomes its head. With `erase=true` (scope `erase`,
/// a `reason` required) every trace of every revision is erased instead: the ledger's rows
/// and retained bytes at once, the vectors and graph nodes by the erasure's jobs, whose
/// receipts turn `erased` with their read-back evidence.
#[utoipa::path(delete, path = "/v1/sources", tag = "ingest", security(("bearer" = [])),
    params(SourceQuery),
    responses((status = 202, description = "The tombstone's (or the erasure's) receipt.", body = receipts::Acceptance), ApiErrors))]
async fn delete_source(
    State(state): State<AcceptorState>,
    auth: Auth,
    query: Result<Query<SourceQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let query = source_query(query)?;
    if query.erase == Some(true) {
        let principal = auth.require(Scope::Erase)?;
        principal.require_dataset(&query.dataset)?;
        let reason = query.reason.ok_or_else(|| {
            ApiError::unprocessable(
                "reason_required",
                "an erasure needs a `reason` (recorded in history, e.g. the request's reference)",
            )
        })?;
        let receipt = state
            .ledger
            .erase(receipts::ErasureRequest {
                dataset: query.dataset,
                source_key: query.source_key,
                actor: principal.actor(),
                reason,
            })
            .await?;
        tracing::info!(dataset = %receipt.dataset, source_key = %receipt.source_key, revision_id = %receipt.source_revision_id, actor = %principal.actor(), "source erased in the ledger; its jobs erase the stores");
        return Ok((StatusCode::ACCEPTED, Json(receipt)).into_response());
    }
    let principal = auth.require(Scope::Ingest)?;
    principal.require_dataset(&query.dataset)?;
    // A query string carries text: digits are epoch microseconds, anything else RFC 3339.
    let valid_from = query.valid_from.as_deref().map(|text| {
        text.parse::<i64>()
            .map_or_else(|_| Value::String(text.to_owned()), Value::from)
    });
    let validity = validity_of(valid_from.as_ref(), None)?;
    let submission = Submission {
        dataset: query.dataset,
        source_key: query.source_key,
        actor: principal.actor(),
        connector: None,
        validity,
        change: Change::Delete {
            reason: query.reason,
        },
        readers: None,
    };
    accept_one(&state, submission).await
}

/// A source: its head, its revisions and head moves (newest first, paged).
#[utoipa::path(get, path = "/v1/sources", tag = "ingest", security(("bearer" = [])),
    params(SourceQuery),
    responses((status = 200, description = "The source; `revisions_total` and `head_history_total` count the whole lists.", body = receipts::SourceView), ApiErrors))]
async fn get_source(
    State(state): State<AcceptorState>,
    auth: Auth,
    query: Result<Query<SourceQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let principal = auth.require_any(&[Scope::Ingest, Scope::OpsRead])?;
    let query = source_query(query)?;
    principal.require_dataset(&query.dataset)?;
    readable(&state, principal, &query.dataset, &query.source_key).await?;
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

/// A source's validity timeline: every assertion (which revision was asserted over which
/// period, when, by whom) and every rectangle derived from them (which revision held over a
/// valid period while cairn believed it). Instants are epoch microseconds; an open end is
/// 2^53 - 1.
#[utoipa::path(get, path = "/v1/sources/timeline", tag = "ingest", security(("bearer" = [])),
    params(SourceQuery),
    responses((status = 200, description = "The assertions and rectangles, oldest first.", body = receipts::validity::Timeline), ApiErrors))]
async fn get_timeline(
    State(state): State<AcceptorState>,
    auth: Auth,
    query: Result<Query<SourceQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let principal = auth.require_any(&[Scope::Ingest, Scope::OpsRead])?;
    let query = source_query(query)?;
    principal.require_dataset(&query.dataset)?;
    readable(&state, principal, &query.dataset, &query.source_key).await?;
    let timeline = state
        .ledger
        .timeline(&query.dataset, &query.source_key)
        .await?;
    if timeline.assertions.is_empty() {
        return Err(LedgerError::SourceNotFound {
            dataset: query.dataset,
            source_key: query.source_key,
        }
        .into());
    }
    Ok(Json(timeline).into_response())
}

/// Which heads to list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only keys that start with this (default: every key).
    #[param(max_length = 1024)]
    prefix: Option<String>,
    /// Only keys after this one, in byte order: the previous page's `next_after`.
    #[param(max_length = 1024)]
    after: Option<String>,
    /// Heads per page, 1-1000 (default 500).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// A page of a dataset's heads.
#[derive(Debug, serde::Serialize, ToSchema)]
struct SourcePage {
    dataset: String,
    prefix: String,
    /// By key, in byte order.
    sources: Vec<receipts::SourceListing>,
    /// Pass as `after` for the next page; `null` on the last page.
    next_after: Option<String>,
}

/// A dataset's sources under a key prefix, with each head's hash and size, paged by key: what
/// a client needs to compare the dataset with its own copy (`cairn ingest DIR --prune`).
#[utoipa::path(get, path = "/v1/datasets/{dataset}/sources", tag = "ingest", security(("bearer" = [])),
    params(("dataset" = String, Path, description = "The dataset."), ListQuery),
    responses((status = 200, description = "Heads by key (tombstones marked), and the cursor of the next page.", body = SourcePage), ApiErrors))]
async fn list_sources(
    State(state): State<AcceptorState>,
    auth: Auth,
    Path(dataset): Path<String>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let principal = auth.require_any(&[Scope::Ingest, Scope::OpsRead])?;
    let Query(query) = query
        .map_err(|rejection| ApiError::unprocessable("invalid_query", rejection.body_text()))?;
    validate::dataset(&dataset)?;
    principal.require_dataset(&dataset)?;
    let prefix = query.prefix.unwrap_or_default();
    if !prefix.is_empty() {
        validate::source_key(&prefix).map_err(|error| {
            ApiError::unprocessable(
                "invalid_prefix",
                format!("`prefix` must be the start of a valid source key: {error}"),
            )
        })?;
    }
    if let Some(after) = &query.after {
        validate::source_key(after).map_err(|error| {
            ApiError::unprocessable("invalid_after", format!("`after`: {error}"))
        })?;
    }
    let limit = query.limit.unwrap_or(500);
    if !(1..=receipts::MAX_LISTING_PAGE).contains(&limit) {
        return Err(ApiError::unprocessable(
            "invalid_limit",
            format!(
                "`limit` must be between 1 and {} (got {limit})",
                receipts::MAX_LISTING_PAGE
            ),
        ));
    }
    let sources = state
        .ledger
        .list_sources(&dataset, &prefix, query.after.as_deref(), limit)
        .await?;
    let next_after = (sources.len() == limit as usize)
        .then(|| sources.last().map(|head| head.source_key.clone()))
        .flatten();
    // A page keeps its cursor; the sources the caller may not read are left out of it.
    let reads_as = principal.reads_as();
    let mut shown = Vec::with_capacity(sources.len());
    for source in sources {
        if state
            .ledger
            .may_read(reads_as.as_deref(), &dataset, &source.source_key)
            .await?
        {
            shown.push(source);
        }
    }
    let sources = shown;
    Ok(Json(SourcePage {
        dataset,
        prefix,
        sources,
        next_after,
    })
    .into_response())
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
    let reads_as = principal.reads_as();
    let may = state
        .ledger
        .may_read(
            reads_as.as_deref(),
            &detail.revision.dataset,
            &detail.revision.source_key,
        )
        .await?;
    if !may {
        return Err(not_found());
    }
    Ok(detail)
}

/// Answers a source that `principal` may not read ([`receipts::access`]) as one that does
/// not exist, so that its existence does not leak.
async fn readable(
    state: &AcceptorState,
    principal: &receipts::Principal,
    dataset: &str,
    source_key: &str,
) -> Result<(), ApiError> {
    let reads_as = principal.reads_as();
    if state
        .ledger
        .may_read(reads_as.as_deref(), dataset, source_key)
        .await?
    {
        Ok(())
    } else {
        Err(LedgerError::SourceNotFound {
            dataset: dataset.to_owned(),
            source_key: source_key.to_owned(),
        }
        .into())
    }
}

/// A revision: whether it is the head, its job, its receipts, its history (newest first).
#[utoipa::path(get, path = "/v1/revisions/{id}", tag = "ingest", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Revision id"), receipts::http::PageParams),
    responses((status = 200, description = "The revision; `history_total` counts the whole history.", body = receipts::RevisionDetail), ApiErrors))]
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

/// The retained bytes of a revision, as an attachment.
#[utoipa::path(get, path = "/v1/revisions/{id}/content", tag = "ingest", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Revision id")),
    responses((status = 200, description = "The bytes, with the media type they were accepted with.", content_type = "*/*", body = Vec<u8>), ApiErrors))]
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

/// Blocks exact content (by SHA-256) in a dataset: later ingests of it get 409.
#[utoipa::path(post, path = "/v1/blocks", tag = "ingest", security(("bearer" = [])),
    request_body(content = BlockRequest, content_type = "application/json"),
    responses((status = 201, description = "Blocked.", body = receipts::ContentBlock), ApiErrors))]
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
