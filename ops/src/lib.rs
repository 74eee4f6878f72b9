//! # ops: what operators see and do
//!
//! Four questions at a glance: is work flowing, what is running right now and is its lease
//! healthy, what is retrying and why, what is dead and what do I do about it.
//!
//! - `GET /ops`: the dashboard, one HTML page with a little JavaScript that polls the JSON API
//!   every 2 seconds with the operator's bearer token (kept in the tab's `sessionStorage`).
//! - `GET /v1/status`, `/v1/ops/summary`, `/v1/ops/leases`, `/v1/ops/retries`, `/v1/ops/dead`,
//!   `/v1/ops/jobs`, `/v1/ops/jobs/{id}`: reads (`ops:read`).
//! - `POST /v1/ops/jobs/{id}/requeue|cancel`, `/v1/ops/requeue`, `/v1/ops/cancel` (bulk by
//!   filter, `dry_run` lists the exact candidates), `/v1/ops/pause`, `/v1/ops/resume`: actions
//!   (`ops:write`; a dry run needs only `ops:read`).
//! - `GET /v1/ops/generations` (`ops:read`), `POST /v1/ops/generations`,
//!   `/v1/ops/generations/{id}/switch|retire` (`admin`): projection generations built side by
//!   side, switched, rolled back and retired (see [`generations`]).
//! - `GET /metrics`: Prometheus text (`ops:read`), see [`metrics`].
//!
//! ## Invariants
//! - Reads need `ops:read` (or `admin`); nothing here writes without `ops:write`. A token's
//!   dataset allowlist narrows every listing and refuses actions on other datasets.
//! - Every action goes through the ledger's audited operations ([`receipts::Leases`]) with
//!   `token:<name>` as the actor and the operator's reason as the cause: no action skips the
//!   history.
//! - The "why" comes from the ledger, not from logs: a retry's rule (`run_at_rule`), each
//!   failed attempt's error (history rows carry the run's error code, message and stage), a
//!   dead job's cause.
//! - Nothing here reads another crate's internals: everything comes through
//!   [`receipts::Ledger`].

pub mod api;
pub mod generations;
pub mod metrics;
pub mod tokens;

use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use axum::response::{Html, IntoResponse, Response};

use axum::{Json, Router};
use receipts::http::{ApiError, ApiErrors, Auth};
use receipts::{OpsLedger, Scope, Tokens};
use serde_json::{json, Value};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Shared state of the operations routes.
#[derive(Clone)]
pub struct OpsState {
    ledger: Arc<dyn OpsLedger>,
    started_at: std::time::Instant,
    cursor: Arc<metrics::EventCursor>,
    generations: Option<Arc<dyn generations::GenerationSetup>>,
}

impl std::fmt::Debug for OpsState {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("OpsState")
            .field("ledger", &self.ledger)
            .field("generations", &self.generations.is_some())
            .finish()
    }
}

impl FromRef<OpsState> for Arc<dyn Tokens> {
    fn from_ref(state: &OpsState) -> Self {
        state.ledger.clone()
    }
}

/// The operations routes with their OpenAPI description (each registered from its handler's
/// `#[utoipa::path]`): status, dashboard, ops API, generations, tokens, metrics. Installs the
/// process's Prometheus recorder on first use. `generations` is the serving process's
/// projection setup (`None` where it runs no projection: generation changes are refused).
pub fn routes(
    ledger: Arc<dyn OpsLedger>,
    generations: Option<Arc<dyn generations::GenerationSetup>>,
) -> OpenApiRouter {
    metrics::recorder();
    let state = OpsState {
        ledger,
        started_at: std::time::Instant::now(),
        cursor: Arc::default(),
        generations,
    };
    OpenApiRouter::new()
        .routes(routes!(status))
        .routes(routes!(dashboard))
        .routes(routes!(prometheus))
        .routes(routes!(api::summary))
        .routes(routes!(api::leases))
        .routes(routes!(api::retries))
        .routes(routes!(api::dead))
        .routes(routes!(api::jobs))
        .routes(routes!(api::job_detail))
        .routes(routes!(api::requeue_one))
        .routes(routes!(api::cancel_one))
        .routes(routes!(api::requeue_bulk))
        .routes(routes!(api::cancel_bulk))
        .routes(routes!(api::pause))
        .routes(routes!(api::resume))
        .routes(routes!(generations::list, generations::create))
        .routes(routes!(generations::switch))
        .routes(routes!(generations::retire))
        .routes(routes!(tokens::list, tokens::create))
        .routes(routes!(tokens::own))
        .routes(routes!(tokens::revoke))
        .routes(routes!(tokens::rotate))
        .with_state(state)
}

/// The operations routes, ready to merge into cairn's router.
pub fn router(
    ledger: Arc<dyn OpsLedger>,
    generations: Option<Arc<dyn generations::GenerationSetup>>,
) -> Router {
    routes(ledger, generations).split_for_parts().0
}

/// Health and counts (a token with a dataset allowlist sees its datasets' jobs only).
#[utoipa::path(get, path = "/v1/status", tag = "ops", security(("bearer" = [])),
    responses((status = 200, description = "Version, uptime and counts.", body = Object), ApiErrors))]
async fn status(State(state): State<OpsState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    let principal = auth.require(Scope::OpsRead)?;
    if let Some(datasets) = &principal.datasets {
        // Ledger-wide counts would describe other datasets: only this token's jobs.
        return Ok(Json(json!({
            "status": "ok",
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_seconds": state.started_at.elapsed().as_secs(),
            "scope": { "datasets": datasets },
            "counts": { "jobs": api::jobs_by_state(&state, datasets).await? },
        })));
    }
    let counts = state.ledger.counts().await?;
    Ok(Json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_seconds": state.started_at.elapsed().as_secs(),
        "counts": counts,
    })))
}

/// The dashboard page. It carries no data (the data needs the bearer token), so it is served
/// without authentication.
#[utoipa::path(get, path = "/ops", tag = "ops",
    responses((status = 200, description = "The operations dashboard (HTML; its data needs a token).", content_type = "text/html", body = String)))]
async fn dashboard() -> Response {
    (
        [
            (CACHE_CONTROL, "no-store"),
            (CONTENT_SECURITY_POLICY, dashboard_policy()),
            (X_FRAME_OPTIONS, "DENY"),
            (X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (REFERRER_POLICY, "no-referrer"),
        ],
        Html(DASHBOARD),
    )
        .into_response()
}

const DASHBOARD: &str = include_str!("dashboard.html");

/// The dashboard's Content-Security-Policy: its one inline script is allowed by its hash and
/// nothing else runs; it talks only to this origin, cannot be framed, and submits no forms
/// elsewhere. Inline style attributes are allowed (styles cannot run code).
fn dashboard_policy() -> &'static str {
    static POLICY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    POLICY.get_or_init(|| {
        use base64::Engine;
        use sha2::Digest;
        let script = DASHBOARD
            .split_once("<script>")
            .and_then(|(_, rest)| rest.split_once("</script>"))
            .map_or("", |(script, _)| script);
        let hash = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(script));
        format!(
            "default-src 'none'; script-src 'sha256-{hash}'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'"
        )
    })
}

/// Prometheus text exposition (needs an `ops:read` token without a dataset allowlist).
#[utoipa::path(get, path = "/metrics", tag = "ops", security(("bearer" = [])),
    responses((status = 200, description = "Metrics in the Prometheus text format.", content_type = "text/plain", body = String), ApiErrors))]
async fn prometheus(State(state): State<OpsState>, auth: Auth) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::OpsRead)?;
    if principal.datasets.is_some() {
        // Series carry every dataset's name and ledger-wide counts.
        return Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "forbidden",
            "metrics name every dataset: scrape with an ops:read token that has no dataset \
             allowlist",
        )
        .with_details(json!({ "reason": "dataset_allowlist" })));
    }
    let text = metrics::render(state.ledger.as_ref(), &state.cursor).await?;
    Ok((
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response())
}
