//! # ops: what operators see and do
//!
//! For now: `GET /v1/status`, the ledger's counts (sources, revisions, retained bytes, jobs per
//! state, receipts per backend and state) for `cairn status`. The dashboard, Prometheus metrics
//! and operator actions arrive with the operations issue.
//!
//! ## Invariants
//! - Reads need `ops:read` (or `admin`); nothing here writes without `ops:write`.
//! - Nothing here reads another crate's internals: everything comes through
//!   [`receipts::Ledger`].

use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::routing::get;
use axum::{Json, Router};
use receipts::http::{ApiError, Auth};
use receipts::{Ledger, Scope};
use serde_json::{json, Value};

#[derive(Debug, Clone)]
struct OpsState {
    ledger: Arc<dyn Ledger>,
    started_at: std::time::Instant,
}

impl FromRef<OpsState> for Arc<dyn Ledger> {
    fn from_ref(state: &OpsState) -> Self {
        state.ledger.clone()
    }
}

/// The operations routes.
pub fn router(ledger: Arc<dyn Ledger>) -> Router {
    let state = OpsState {
        ledger,
        started_at: std::time::Instant::now(),
    };
    Router::new()
        .route("/v1/status", get(status))
        .with_state(state)
}

async fn status(State(state): State<OpsState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    auth.require(Scope::OpsRead)?;
    let counts = state.ledger.counts().await?;
    Ok(Json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_seconds": state.started_at.elapsed().as_secs(),
        "counts": counts,
    })))
}
