//! HTTP glue shared by every crate that serves part of cairn's API: the typed error body, the
//! bearer-token extractor and a bounded JSON body reader. Errors become responses here and
//! only here; internal details are logged, never sent.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRef, FromRequestParts};
use axum::http::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::auth::{Denied, Principal, Scope};
use crate::error::LedgerError;
use crate::ledger::Tokens;

/// A typed API error: `{code, message, details?}` with an HTTP status.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: String,
    /// Human-readable explanation (never echoes secrets).
    pub message: String,
    /// Extra structured fields (boxed: errors stay small on the success path).
    pub details: Option<Box<serde_json::Value>>,
    /// Seconds after which a retry may succeed (`Retry-After`).
    pub retry_after: Option<u64>,
}

/// The JSON body of an error.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    /// Stable code.
    pub code: &'a str,
    /// Explanation.
    pub message: &'a str,
    /// Extra fields.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<&'a serde_json::Value>,
}

/// The schema of every error body, for the API document.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Error)]
pub struct ErrorSchema {
    /// Stable machine-readable code (the README's error table lists them all).
    pub code: String,
    /// Human-readable explanation; never echoes a secret or an internal detail.
    pub message: String,
    /// Extra structured fields, per code (a limit, the field at fault, a dataset).
    #[schema(value_type = Option<Object>)]
    pub details: Option<serde_json::Value>,
}

impl ApiError {
    /// An error with a status, code and message.
    pub fn new(status: StatusCode, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status,
            code: code.into(),
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// Adds structured details.
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = Some(Box::new(details));
        self
    }

    /// 422 with `code`.
    pub fn unprocessable(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    /// 404 with `code`.
    pub fn not_found(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            code: &self.code,
            message: &self.message,
            details: self.details.as_deref(),
        }
    }
}

impl From<LedgerError> for ApiError {
    fn from(error: LedgerError) -> Self {
        let status =
            StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::error!(error = %error, code = error.code(), "ledger error");
        }
        let details = match &error {
            LedgerError::ContentBlocked {
                dataset, sha256, ..
            } => Some(serde_json::json!({ "dataset": dataset, "content_sha256": sha256 })),
            _ => None,
        };
        let mut api = ApiError::new(status, error.code(), error.public_message());
        api.details = details.map(Box::new);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            api.retry_after = Some(1);
        }
        api
    }
}

impl From<Denied> for ApiError {
    fn from(denied: Denied) -> Self {
        let details = match &denied {
            Denied::Scope(scope) => serde_json::json!({ "missing_scope": scope.as_str() }),
            Denied::Dataset(dataset) => serde_json::json!({ "dataset": dataset }),
            Denied::AllDatasets(_) => serde_json::json!({ "needs": "every_dataset" }),
        };
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", denied.to_string()).with_details(details)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            // RFC 6750: a 401 names the scheme it wants.
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"cairn\""),
            );
        }
        if let Some(seconds) = self.retry_after {
            if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert(RETRY_AFTER, value);
            }
        }
        if let Some(scope) = self
            .details
            .as_ref()
            .and_then(|details| details.get("missing_scope"))
            .and_then(serde_json::Value::as_str)
            .and_then(|scope| scope.parse::<Scope>().ok())
        {
            response.extensions_mut().insert(MissingScope(scope));
        }
        response
    }
}

/// On a 403 response: the scope the call needed, for a layer that names it in a challenge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingScope(pub Scope);

/// A principal that a layer in front of the routes has already authenticated (an OAuth
/// access token, verified against its issuer): [`Auth`] takes it as it is, instead of
/// looking the bearer token up among cairn's own.
#[derive(Debug, Clone)]
pub struct Authenticated(pub Principal);

/// The principal of the request's bearer token. Rejects with 401 `unauthenticated`.
#[derive(Debug, Clone)]
pub struct Auth(pub Principal);

impl Auth {
    /// Requires a scope, or answers 403 naming it.
    pub fn require(&self, scope: Scope) -> Result<&Principal, ApiError> {
        self.0.require(scope)?;
        Ok(&self.0)
    }

    /// Requires any one of `scopes`, or answers 403 naming the first.
    pub fn require_any(&self, scopes: &[Scope]) -> Result<&Principal, ApiError> {
        if scopes.iter().any(|scope| self.0.has(*scope)) {
            return Ok(&self.0);
        }
        let first = scopes.first().copied().unwrap_or(Scope::Admin);
        Err(Denied::Scope(first).into())
    }
}

impl<S> FromRequestParts<S> for Auth
where
    Arc<dyn Tokens>: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        if let Some(Authenticated(principal)) = parts.extensions.get::<Authenticated>() {
            return Ok(Auth(principal.clone()));
        }
        let unauthenticated = |message: &str| {
            let mut error = ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", message);
            error.details = Some(Box::new(serde_json::json!({ "scheme": "Bearer" })));
            error
        };
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .ok_or_else(|| unauthenticated("missing `Authorization: Bearer <token>` header"))?;
        let text = header
            .to_str()
            .map_err(|_| unauthenticated("the Authorization header is not ASCII"))?;
        let secret = text
            .strip_prefix("Bearer ")
            .map(str::trim)
            .filter(|secret| !secret.is_empty())
            .ok_or_else(|| unauthenticated("the Authorization header must be `Bearer <token>`"))?;
        let ledger = <Arc<dyn Tokens>>::from_ref(state);
        match ledger.authenticate(secret).await? {
            Some(principal) => Ok(Auth(principal)),
            None => Err(unauthenticated("unknown or revoked token")),
        }
    }
}

/// Reads a JSON body of at most `limit` bytes into `T`. Answers 413 `payload_too_large`,
/// 415 `unsupported_media_type` or 422 `invalid_json` (unknown fields named by serde).
pub async fn read_json<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = read_json_body(headers, body, limit).await?;
    from_object(&bytes)
}

/// Parses a body that must be a JSON object (serde would also read a struct from an array).
pub fn from_object<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().find(|byte| !byte.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::unprocessable(
            "invalid_json",
            "the request body must be a JSON object",
        ));
    }
    serde_json::from_slice(bytes).map_err(invalid_json)
}

/// The reason an operator gave for a change, trimmed, or `default` when none (or only spaces)
/// was given; refused (`invalid_reason`) when over 500 characters or with control characters.
pub fn reason(text: Option<String>, default: &str) -> Result<String, ApiError> {
    let text = text
        .map(|text| text.trim().to_owned())
        .filter(|text| !text.is_empty())
        .unwrap_or_else(|| default.to_owned());
    crate::validate::reason(&text)?;
    Ok(text)
}

/// 422 `invalid_json` for a body serde refused.
pub fn invalid_json(error: serde_json::Error) -> ApiError {
    ApiError::unprocessable("invalid_json", format!("invalid request body: {error}"))
}

/// Reads the bytes of a JSON body, checked but not parsed: the media type (415), at most
/// `limit` bytes (413: a `Content-Length` over the limit is refused before any byte is read,
/// and a streamed body is refused as soon as it passes the limit, so no more than `limit`
/// bytes are ever buffered) and UTF-8 (422 `invalid_utf8`).
pub async fn read_json_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<axum::body::Bytes, ApiError> {
    if let Some(content_type) = headers.get(CONTENT_TYPE) {
        let text = content_type
            .to_str()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let essence = text.split(';').next().unwrap_or_default().trim().to_owned();
        if essence != "application/json" && !essence.ends_with("+json") {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("request bodies are JSON; got Content-Type `{essence}`"),
            ));
        }
    }
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body is over the limit of {limit} bytes"),
        )
        .with_details(serde_json::json!({ "limit_bytes": limit }))
    };
    if let Some(length) = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok())
    {
        if length > limit {
            return Err(too_large());
        }
    }
    let bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| too_large())?;
    if let Err(error) = std::str::from_utf8(&bytes) {
        return Err(ApiError::unprocessable(
            "invalid_utf8",
            format!(
                "the request body is not UTF-8 (invalid byte at offset {}); send binary content as `content_base64`",
                error.valid_up_to()
            ),
        )
        .with_details(serde_json::json!({ "offset": error.valid_up_to() })));
    }
    Ok(bytes)
}

/// Fallback for unknown routes: 404 `not_found`.
pub async fn not_found() -> ApiError {
    ApiError::not_found("not_found", "no such endpoint")
}

/// Turns every error response that is not already typed JSON into `{code, message}`: the
/// rejections of axum's extractors (a bad query string, an undecodable path, a wrong method)
/// answer in plain text otherwise. Query-string errors become 422 (`invalid_limit` or
/// `invalid_offset` when they name that parameter, else `invalid_query`), path errors 422
/// `invalid_path`; other statuses keep their status with a code named after it. A 405 keeps
/// its `Allow` header.
pub async fn typed_errors(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"));
    if is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    // Extractor rejections are short sentences; anything longer is cut.
    let text = axum::body::to_bytes(body, 4096)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_owned())
        .unwrap_or_default();
    let error = if let Some(detail) = text.strip_prefix("Failed to deserialize query string:") {
        // serde_urlencoded names the parameter first (`limit: invalid digit ...`) or as a
        // duplicate (``duplicate field `limit` ``).
        let about = |field: &str| {
            let detail = detail.trim();
            detail.starts_with(&format!("{field}:"))
                || detail.contains(&format!("duplicate field `{field}`"))
        };
        let code = if about("limit") {
            "invalid_limit"
        } else if about("offset") {
            "invalid_offset"
        } else {
            "invalid_query"
        };
        ApiError::unprocessable(code, text)
    } else if status == StatusCode::BAD_REQUEST
        && (text.contains("Invalid URL") || text.contains("path"))
    {
        ApiError::unprocessable("invalid_path", format!("the path is not valid: {text}"))
    } else {
        let (code, message) = match status {
            StatusCode::METHOD_NOT_ALLOWED => (
                "method_not_allowed",
                "this endpoint does not take that method; see the Allow header",
            ),
            StatusCode::NOT_FOUND => ("not_found", "no such endpoint"),
            StatusCode::PAYLOAD_TOO_LARGE => ("payload_too_large", "the request body is too large"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => (
                "unsupported_media_type",
                "request bodies are JSON (Content-Type: application/json)",
            ),
            StatusCode::REQUEST_TIMEOUT => ("request_timeout", "the request took too long"),
            status if status.is_server_error() => {
                tracing::error!(status = status.as_u16(), body = %text, "untyped server error");
                ("internal_error", "internal error; see the server log")
            }
            _ => ("bad_request", "the request could not be read"),
        };
        let message = if text.is_empty() || status.is_server_error() {
            message.to_owned()
        } else {
            text
        };
        ApiError::new(status, code, message)
    };
    let mut typed = error.into_response();
    if let Some(allow) = parts.headers.get(axum::http::header::ALLOW) {
        typed
            .headers_mut()
            .insert(axum::http::header::ALLOW, allow.clone());
    }
    typed
}

/// Query parameters of responses that hold lists without a bound (history, revisions).
#[derive(Debug, Clone, Copy, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Entries per list, newest first (1-500, default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// Entries skipped.
    #[param(value_type = Option<u64>, minimum = 0, maximum = 4294967295_u64)]
    pub offset: Option<u32>,
}

/// Default entries per list.
pub const DEFAULT_PAGE: u32 = 50;
/// Most entries per list.
pub const MAX_PAGE: u32 = 500;

impl PageParams {
    /// The page's `(limit, offset)`, or 422 `invalid_limit`.
    pub fn resolve(self) -> Result<(usize, usize), ApiError> {
        let limit = self.limit.unwrap_or(DEFAULT_PAGE);
        if limit == 0 || limit > MAX_PAGE {
            return Err(ApiError::unprocessable(
                "invalid_limit",
                format!("limit is between 1 and {MAX_PAGE}"),
            ));
        }
        Ok((limit as usize, self.offset.unwrap_or(0) as usize))
    }
}

/// Pages the array `value[field]` newest first, and adds `{field}_total` with the whole
/// array's length. History is stored oldest first and is reversed; revision lists already
/// come newest first (`already_newest_first`). Other fields are left as they are.
pub fn page_newest_first(
    value: &mut serde_json::Value,
    field: &str,
    (limit, offset): (usize, usize),
    already_newest_first: bool,
) {
    let Some(object) = value.as_object_mut() else {
        return;
    };
    let Some(serde_json::Value::Array(mut items)) = object.remove(field) else {
        return;
    };
    let total = items.len();
    if !already_newest_first {
        items.reverse();
    }
    let page: Vec<serde_json::Value> = items.into_iter().skip(offset).take(limit).collect();
    object.insert(field.to_owned(), serde_json::Value::Array(page));
    object.insert(format!("{field}_total"), serde_json::json!(total));
}

/// The error answers of the API, for the document: every status an operation may answer
/// besides its successes, each with the [`ErrorSchema`] body. Listed on every operation, so
/// that a client (and schemathesis) finds every status it can meet documented.
#[derive(Debug, Clone, Copy)]
pub struct ApiErrors;

/// Each error status with what it means; the codes are in the README's error table.
pub const ERROR_STATUSES: [(&str, &str); 12] = [
    ("401", "`unauthenticated`: no, malformed, unknown, revoked or expired bearer token"),
    ("403", "`forbidden`: a scope is missing, or the dataset is outside the token's allowlist"),
    ("404", "`*_not_found`: no such source, revision, job, token or endpoint"),
    ("409", "`content_blocked`, `invalid_transition`, `lease_lost`, `token_revoked`, `own_token`"),
    ("410", "`revision_is_tombstone`: a deletion has no content"),
    ("413", "`payload_too_large`: the body is over its limit"),
    ("415", "`unsupported_media_type`: a body that is not JSON"),
    ("422", "`invalid_*`, `empty_*`, `not_text`, `secret_detected`, `batch_too_large`, ...: the request does not validate; the message says how"),
    ("429", "`overloaded`: no search slot within the budget (`Retry-After`)"),
    ("500", "`internal_error`: a bug; the detail is in the server log"),
    ("503", "`ledger_unavailable`, `auth_unavailable` (an OAuth issuer unreachable), `overloaded` (connection cap), `request_timeout`, `shutting_down` (`Retry-After`)"),
    ("504", "`search_timeout`: no search phase answered within the budget"),
];

impl utoipa::IntoResponses for ApiErrors {
    fn responses() -> std::collections::BTreeMap<
        String,
        utoipa::openapi::RefOr<utoipa::openapi::response::Response>,
    > {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        ERROR_STATUSES
            .iter()
            .map(|(status, description)| {
                let response = ResponseBuilder::new()
                    .description(*description)
                    .content(
                        "application/json",
                        ContentBuilder::new()
                            .schema(Some(Ref::from_schema_name("Error")))
                            .build(),
                    )
                    .build();
                ((*status).to_owned(), response.into())
            })
            .collect()
    }
}

/// Control characters (Unicode Cc, what `char::is_control` refuses), as the body of a regex
/// character class. The API document's patterns are built from these classes so that they
/// state exactly the rules of [`crate::validate`].
pub const CONTROL: &str = r"\x00-\x1f\x7f-\x9f";
/// Unicode White_Space outside the controls (the rest of what `str::trim` removes).
pub const SPACE: &str = r" \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000";
/// All of Unicode White_Space, controls included (`char::is_whitespace`).
pub const WHITESPACE: &str = r"\t-\r\x85 \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000";

/// Text of at most `max` characters with at least one that is not whitespace (trimmed, it
/// is not empty), and with no control characters unless `controls` allows them.
pub fn not_blank_schema(
    max: usize,
    controls: bool,
    description: &str,
) -> utoipa::openapi::schema::Object {
    let pattern = if controls {
        format!("[^{WHITESPACE}]")
    } else {
        format!("^[^{CONTROL}]*[^{CONTROL}{WHITESPACE}][^{CONTROL}]*$")
    };
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .min_length(Some(1))
        .max_length(Some(max))
        .pattern(Some(pattern))
        .description(Some(description))
        .build()
}

/// Free text: at most `max` characters, no control characters; empty means absent.
pub fn text_schema(max: usize, description: &str) -> utoipa::openapi::schema::Object {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .max_length(Some(max))
        .pattern(Some(format!("^[^{CONTROL}]*$")))
        .description(Some(description))
        .build()
}

/// The pattern of a name (dataset, source key, tag): no control characters, no surrounding
/// whitespace, none of `extra`; the rule of [`crate::validate`] in the API document.
fn name_pattern(extra: &str) -> String {
    format!("^[^{CONTROL}{SPACE}{extra}](?:[^{CONTROL}{extra}]*[^{CONTROL}{SPACE}{extra}])?$")
}

fn name_schema(max: usize, extra: &str, description: &str) -> utoipa::openapi::schema::Object {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .min_length(Some(1))
        .max_length(Some(max))
        .pattern(Some(name_pattern(extra)))
        .description(Some(description))
        .build()
}

/// The schema of a dataset name.
pub fn dataset_schema() -> utoipa::openapi::schema::Object {
    name_schema(
        crate::validate::MAX_DATASET_CHARS,
        "/",
        "Dataset name: 1-128 characters, no `/`, no control characters, no surrounding whitespace.",
    )
}

/// The schema of a source key.
pub fn source_key_schema() -> utoipa::openapi::schema::Object {
    name_schema(
        crate::validate::MAX_SOURCE_KEY_CHARS,
        "",
        "The source's key in its dataset (a path, a URL, an id): 1-1024 characters, no control characters, no surrounding whitespace.",
    )
}

/// The schema of a tag.
pub fn tag_schema() -> utoipa::openapi::schema::Object {
    name_schema(
        crate::validate::MAX_TAG_CHARS,
        "",
        "A tag: 1-128 characters, no control characters, no surrounding whitespace.",
    )
}

/// An optional list of names (`null` or absent: none given).
pub fn optional_names(
    item: utoipa::openapi::schema::Object,
    min_items: usize,
    max_items: Option<usize>,
) -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{SchemaType, Type};
    utoipa::openapi::schema::ArrayBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
        .items(item)
        .min_items(Some(min_items))
        .max_items(max_items)
        .build()
}

/// A reason: 1-500 characters, no control characters, not only whitespace (the rule of
/// [`crate::validate::reason`]).
pub fn reason_schema() -> utoipa::openapi::schema::Object {
    not_blank_schema(
        crate::validate::MAX_REASON_CHARS,
        false,
        "Why (recorded in history): 1-500 characters, no control characters.",
    )
}

/// An optional list of dataset names, at least one when given.
pub fn optional_datasets() -> utoipa::openapi::schema::Array {
    optional_names(dataset_schema(), 1, None)
}

/// An instant on the wire: epoch microseconds or RFC 3339 with an offset.
pub fn instant_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0.0))
                .maximum(Some(9_007_199_254_740_990.0))
                .description(Some("epoch microseconds")),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .format(Some(utoipa::openapi::schema::SchemaFormat::KnownFormat(
                    utoipa::openapi::schema::KnownFormat::DateTime,
                )))
                .description(Some("RFC 3339 with an offset")),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Null)
                .description(Some("absent")),
        )
        .build()
        .into()
}
