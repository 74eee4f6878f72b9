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
use crate::ledger::Ledger;

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
        };
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", denied.to_string()).with_details(details)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert(RETRY_AFTER, value);
            }
        }
        response
    }
}

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
    Arc<dyn Ledger>: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
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
        let ledger = <Arc<dyn Ledger>>::from_ref(state);
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
    serde_json::from_slice(&bytes).map_err(|error| {
        ApiError::unprocessable("invalid_json", format!("invalid request body: {error}"))
    })
}

/// Fallback for unknown routes: 404 `not_found`.
pub async fn not_found() -> ApiError {
    ApiError::not_found("not_found", "no such endpoint")
}
