//! # agents: cairn as a search client's tool, over the Model Context Protocol
//!
//! An MCP server ([`router`], mounted at `/mcp` on cairn's own listener) built on the official
//! Rust SDK, `rmcp`. It offers six tools (`search`, `read_document`, `get_source`,
//! `list_datasets`, `ingest`, `delete_source`) and two resource templates
//! (`cairn://revision/{revision_id}`, `cairn://source/{dataset}/{+source_key}`), over the
//! same ledger, searcher and acceptance path as the HTTP API.
//!
//! ## Model
//! - **Transport**: Streamable HTTP, stateless, JSON responses: every request stands alone,
//!   so any replica answers it. The current protocol (2026-07-28: no handshake, the version
//!   in each request) and the legacy `initialize` handshake are both spoken. `Host` is checked
//!   against [`McpSettings::allowed_hosts`] and any `Origin` against
//!   [`McpSettings::allowed_origins`] (none by default: a browser page cannot call it).
//! - **Auth**: cairn's bearer tokens, verified by the HTTP API's own extractor before the SDK
//!   sees the request; a missing or bad token gets 401 with `WWW-Authenticate`. The
//!   principal travels with the request; `tools/list` shows only the tools its scopes allow,
//!   and every call checks the scope and the dataset allowlist again.
//! - **Answers**: every answer opens with `trust: "untrusted"` and [`text::UNTRUSTED_NOTICE`]
//!   inside `structuredContent` (the text block carries the same JSON), and names what it
//!   searched and where each quoted text comes from (dataset, source key, revision,
//!   generation, section, page, chunk or passage, receipt state, accepted when and by whom).
//! - **Subscriptions**: `subscriptions/listen` (2026-07-28) for source resources, followed
//!   from the events outbox (`subscriptions`): a source's change is announced with
//!   `notifications/resources/updated` on the listen's own stream, within the principal's
//!   reads.
//!
//! ## Invariants
//! - A hit is a current revision: the tools reach the index only through
//!   [`search::Searcher`], which binds every hit to its source's head, and documents only
//!   through the ledger's reads.
//! - Quoted text holds no control, ANSI or bidirectional characters, and no credential the
//!   scan finds ([`text`]).
//! - No answer is over [`MAX_ANSWER_CHARS`] characters of JSON, whatever the arguments; every
//!   cut says what it cut (`truncated`, `omitted`, `next_offset`).
//! - Bad arguments, overload and timeouts are tool errors (`isError`) with a stable `code` and
//!   the fix; internal details are logged, never sent.
//! - Erasure, operations and token management are not offered.

mod catalog;
mod documents;
mod envelope;
mod framing;
mod handler;
mod querying;
mod subscriptions;
pub mod text;
mod writes;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use receipts::{AcceptLedger, Tokens};
use tokio_util::sync::CancellationToken;

pub use envelope::MAX_ANSWER_CHARS;

/// Where and how the MCP endpoint answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpSettings {
    /// `Host` values accepted (`name` or `name:port`); requests naming another host are
    /// refused (DNS rebinding). Loopback names by default.
    pub allowed_hosts: Vec<String>,
    /// Browser origins accepted (`scheme://host:port`, `:*` for any port). Empty: a request
    /// that carries any `Origin` is refused.
    pub allowed_origins: Vec<String>,
    /// Largest request body, in bytes: the ingest limit, so `ingest` takes what
    /// `POST /v1/sources` takes.
    pub max_body_bytes: usize,
}

impl Default for McpSettings {
    fn default() -> Self {
        McpSettings {
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            allowed_origins: Vec::new(),
            max_body_bytes: receipts::policy::DEFAULT_MAX_BODY_BYTES,
        }
    }
}

/// What the tools work on.
pub(crate) struct Shared {
    pub(crate) ledger: Arc<dyn AcceptLedger>,
    /// The events outbox, which `subscriptions/listen` follows.
    pub(crate) events: Arc<dyn receipts::events::Events>,
    pub(crate) searcher: Arc<search::Searcher>,
    /// The datasets that hold sources, as last read, and when.
    datasets: std::sync::Mutex<Option<(std::time::Instant, Arc<Vec<receipts::DatasetSummary>>)>>,
    /// Calls in flight, by token and JSON-RPC id, so that a `notifications/cancelled` posted
    /// on its own request (the transport is stateless) reaches the call it names.
    calls: std::sync::Mutex<HashMap<(uuid::Uuid, String), CancellationToken>>,
}

/// A call's place in [`Shared::calls`], left when the call ends.
pub(crate) struct InFlight<'a> {
    shared: &'a Shared,
    key: (uuid::Uuid, String),
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.shared
            .calls
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&self.key);
    }
}

/// How long a read of the datasets serves `search` answers (which name the datasets they
/// searched); `list_datasets` always reads afresh.
const DATASETS_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(1);

impl Shared {
    /// Records a call of `token` with JSON-RPC `id` (as JSON text) until the guard drops.
    pub(crate) fn in_flight(
        &self,
        token: uuid::Uuid,
        id: String,
        cancel: CancellationToken,
    ) -> InFlight<'_> {
        let key = (token, id);
        self.calls
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(key.clone(), cancel);
        InFlight { shared: self, key }
    }

    /// Cancels the call of `token` with JSON-RPC `id`, if it is in flight here.
    fn cancel(&self, token: uuid::Uuid, id: &str) -> bool {
        let cancel = self
            .calls
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&(token, id.to_owned()))
            .cloned();
        cancel.map(|cancel| cancel.cancel()).is_some()
    }

    /// The datasets that hold sources, read at most [`DATASETS_FRESH_FOR`] ago.
    pub(crate) async fn recent_datasets(
        &self,
    ) -> Result<Arc<Vec<receipts::DatasetSummary>>, receipts::LedgerError> {
        let cached = self
            .datasets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        if let Some((read_at, datasets)) = cached {
            if read_at.elapsed() < DATASETS_FRESH_FOR {
                return Ok(datasets);
            }
        }
        let datasets = Arc::new(self.ledger.datasets().await?);
        *self
            .datasets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) =
            Some((std::time::Instant::now(), datasets.clone()));
        Ok(datasets)
    }
}

#[derive(Clone)]
struct AuthState {
    tokens: Arc<dyn Tokens>,
    shared: Arc<Shared>,
    max_body_bytes: usize,
}

impl FromRef<AuthState> for Arc<dyn Tokens> {
    fn from_ref(state: &AuthState) -> Self {
        state.tokens.clone()
    }
}

/// The `/mcp` route: authentication in front of the SDK's stateless Streamable HTTP service.
pub fn router(
    ledger: Arc<dyn AcceptLedger>,
    events: Arc<dyn receipts::events::Events>,
    searcher: Arc<search::Searcher>,
    settings: &McpSettings,
) -> Router {
    let tokens: Arc<dyn Tokens> = ledger.clone();
    let shared = Arc::new(Shared {
        ledger,
        events,
        searcher,
        datasets: std::sync::Mutex::new(None),
        calls: std::sync::Mutex::new(HashMap::new()),
    });
    let auth = AuthState {
        tokens,
        shared: shared.clone(),
        max_body_bytes: settings.max_body_bytes,
    };
    let config = rmcp::transport::streamable_http_server::StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_allowed_hosts(settings.allowed_hosts.clone())
        .with_allowed_origins(settings.allowed_origins.clone())
        .enforce_origin_validation()
        .with_max_request_body_bytes(settings.max_body_bytes);
    let service = rmcp::transport::streamable_http_server::StreamableHttpService::new(
        move || Ok(handler::CairnMcp::new(shared.clone())),
        Arc::new(
            rmcp::transport::streamable_http_server::session::never::NeverSessionManager::default(),
        ),
        config,
    );
    Router::new()
        .route_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(auth, authenticate))
}

/// Bodies at most this long are looked at for a cancellation before the SDK sees them.
const CANCELLATION_BYTES: usize = 4096;

/// Verifies the bearer token with the HTTP API's own extractor and hands the principal to
/// the handler through the request's extensions.
///
/// The SDK's stateless transport drops notifications, so a `notifications/cancelled` (a small
/// body) is acted on here: it cancels the call it names, made with the same token, if that
/// call runs on this server.
async fn authenticate(State(state): State<AuthState>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let principal = match receipts::http::Auth::from_request_parts(&mut parts, &state).await {
        Ok(receipts::http::Auth(principal)) => principal,
        Err(error) => return error.into_response(),
    };
    // A POST body is read here, within the same bound the SDK applies, so that JSON the SDK
    // cannot take as a message is answered as JSON-RPC says ([`framing`]), not with 415.
    let body = if parts.method == axum::http::Method::POST {
        let bytes = match axum::body::to_bytes(body, state.max_body_bytes).await {
            Ok(bytes) => bytes,
            Err(error) => {
                let too_large = std::error::Error::source(&error)
                    .is_some_and(|source| source.is::<http_body_util::LengthLimitError>());
                return if too_large {
                    receipts::http::ApiError::new(
                        axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                        "payload_too_large",
                        format!("the request body is over {} bytes", state.max_body_bytes),
                    )
                } else {
                    receipts::http::ApiError::new(
                        axum::http::StatusCode::BAD_REQUEST,
                        "invalid_body",
                        "the request body could not be read",
                    )
                }
                .into_response();
            }
        };
        if let Some((code, id, message)) = framing::refusal(&bytes) {
            tracing::debug!(code, %message, "mcp message refused");
            return framing::answer(code, id, message);
        }
        if bytes.len() <= CANCELLATION_BYTES {
            if let Some(id) = cancelled_request(&bytes) {
                let cancelled = state.shared.cancel(principal.token_id, &id);
                tracing::debug!(request = %id, cancelled, "mcp cancellation");
            }
        }
        axum::body::Body::from(bytes)
    } else {
        body
    };
    parts.extensions.insert(principal);
    next.run(Request::from_parts(parts, body)).await
}

/// The request id a `notifications/cancelled` body names (as JSON text), if it is one.
fn cancelled_request(body: &[u8]) -> Option<String> {
    if !body
        .windows(b"notifications/cancelled".len())
        .any(|window| window == b"notifications/cancelled")
    {
        return None;
    }
    let message: serde_json::Value = serde_json::from_slice(body).ok()?;
    if message.get("method")?.as_str()? != "notifications/cancelled" || message.get("id").is_some()
    {
        return None;
    }
    Some(message.pointer("/params/requestId")?.to_string())
}
