//! `GET /v1/changes`: the change feed, read from the ledger's outbox after a cursor.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{FromRef, Query, State};
use axum::http::StatusCode;
use axum::Json;
use receipts::events::{Event, EventQuery, EventType, EVENTS_VERSION, MAX_EVENTS_PER_PAGE};
use receipts::http::{ApiError, ApiErrors, Auth};
use receipts::{EventsLedger, Principal, Scope, Tokens};
use serde::Deserialize;
use serde_json::{json, Value};

/// The longest a long poll waits for an event.
pub const MAX_WAIT: Duration = Duration::from_secs(30);
/// How often a waiting poll looks again.
const POLL_EVERY: Duration = Duration::from_millis(200);
/// Events per page when the caller names no limit.
const DEFAULT_LIMIT: u32 = 100;

/// The feed's state.
#[derive(Clone)]
pub struct FeedState {
    /// The ledger the events are read from.
    pub ledger: Arc<dyn EventsLedger>,
}

impl FromRef<FeedState> for Arc<dyn Tokens> {
    fn from_ref(state: &FeedState) -> Self {
        state.ledger.clone()
    }
}

/// The feed's query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ChangesParams {
    /// The last sequence number seen (`next_after` of the previous answer); 0 from the start.
    after: Option<i64>,
    /// Only these datasets (comma-separated); the token's allowlist bounds them.
    datasets: Option<String>,
    /// Only these event types (comma-separated), e.g. `receipt.verified,source.tombstoned`.
    types: Option<String>,
    /// At most this many events (1 to 1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// Wait up to this long (milliseconds, at most 30000) for an event when there is none.
    #[param(maximum = 30000)]
    wait_ms: Option<u64>,
}

/// `GET /v1/changes`: events after a cursor, oldest first, with `next_after`.
#[utoipa::path(get, path = "/v1/changes", tag = "events", security(("bearer" = [])),
    params(ChangesParams),
    responses((status = 200, description = "Events after the cursor, in sequence order, and the cursor to read from next.", body = Object),
              (status = 410, description = "`cursor_expired`: retention removed events after the cursor; start again from `pruned_through`.", body = Object),
              ApiErrors))]
pub async fn changes(
    State(state): State<FeedState>,
    auth: Auth,
    Query(params): Query<ChangesParams>,
) -> Result<Json<Value>, ApiError> {
    let principal = auth.require_any(&[Scope::Ingest, Scope::OpsRead, Scope::Search])?;
    let mut query = query(principal, &params)?;
    let wait = Duration::from_millis(params.wait_ms.unwrap_or(0));
    if wait > MAX_WAIT {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_wait",
            format!("`wait_ms` is at most {}", MAX_WAIT.as_millis()),
        ));
    }
    let deadline = Instant::now() + wait;
    loop {
        let page = state.ledger.events(&query).await?;
        if query.after < page.pruned_through {
            return Err(ApiError::new(
                StatusCode::GONE,
                "cursor_expired",
                format!(
                    "events after {} were removed by retention; read again from {} (the events \
                     between were missed)",
                    query.after, page.pruned_through
                ),
            )
            .with_details(json!({"pruned_through": page.pruned_through})));
        }
        let events = visible(&state, principal, page.events).await?;
        if !events.is_empty() || Instant::now() >= deadline {
            return Ok(Json(answer(events, page.next_after, page.pruned_through)));
        }
        // Nothing for this caller yet: look again later, after the newest event looked at.
        query.after = page.next_after;
        tokio::time::sleep(POLL_EVERY.min(deadline.saturating_duration_since(Instant::now())))
            .await;
    }
}

/// The ledger query for this caller: its datasets within its token's allowlist, the types it
/// names, the limit bounded.
fn query(principal: &Principal, params: &ChangesParams) -> Result<EventQuery, ApiError> {
    let list = |text: &Option<String>| -> Option<Vec<String>> {
        text.as_ref().map(|text| {
            text.split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(str::to_owned)
                .collect()
        })
    };
    let mut datasets = list(&params.datasets);
    if let Some(named) = &datasets {
        for dataset in named {
            principal.require_dataset(dataset)?;
        }
    } else if let Some(allowed) = &principal.datasets {
        datasets = Some(allowed.clone());
    }
    let types = list(&params.types)
        .map(|names| {
            names
                .iter()
                .map(|name| name.parse::<EventType>())
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    let after = params.after.unwrap_or(0);
    if after < 0 {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_cursor",
            "`after` is a sequence number, 0 or more",
        ));
    }
    let limit = params.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 || limit > MAX_EVENTS_PER_PAGE {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_limit",
            format!("`limit` is 1 to {MAX_EVENTS_PER_PAGE}"),
        ));
    }
    Ok(EventQuery {
        after,
        datasets,
        types,
        limit,
    })
}

/// The events this caller may see: with a token that reads as an identity, only events about
/// sources it may read; events about no source need `ops:read`.
async fn visible(
    state: &FeedState,
    principal: &Principal,
    events: Vec<Event>,
) -> Result<Vec<Event>, ApiError> {
    let names = principal.reads_as();
    let operator = principal.has(Scope::OpsRead);
    let mut kept = Vec::with_capacity(events.len());
    for event in events {
        let admitted = match (&event.dataset, &event.source_key) {
            (Some(dataset), Some(source_key)) => {
                state
                    .ledger
                    .may_read(names.as_deref(), dataset, source_key)
                    .await?
            }
            _ => operator,
        };
        if admitted {
            kept.push(event);
        }
    }
    Ok(kept)
}

/// The answer: the events with the version of their shape, and where to read next.
fn answer(events: Vec<Event>, next_after: i64, pruned_through: i64) -> Value {
    json!({
        "version": EVENTS_VERSION,
        "events": events,
        "next_after": next_after,
        "pruned_through": pruned_through,
    })
}
