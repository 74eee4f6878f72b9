//! Reading the graph: `GET /v1/graph/sources` (the sources linked to one source, and their
//! tags) and the links `POST /v1/search` adds with `"expand": "links"`.
//!
//! ## Invariants
//! - Every link is bound to the ledger exactly as search results are: an edge counts only
//!   when the revision that made it is its source's current head, and the linked source is
//!   current (not deleted); the head reported is the ledger's, and tags are reported only when
//!   the graph's `HEAD` agrees with it. A stale graph can hide a link for a while, never show a
//!   retired one.
//! - Token scopes and dataset allowlists apply as for search: links never leave the dataset of
//!   the asked source, which the token must be allowed to read.

use std::sync::Arc;

use axum::extract::{Query as UrlQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gateways::graph::{Direction, LinkedSource};
use gateways::{GatewayError, GraphStore};
use receipts::http::{ApiError, ApiErrors, Auth};
use receipts::{validate, Scope, SearchLedger};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Most links one answer holds.
pub const MAX_LINKS: usize = 100;

/// One linked source, bound to the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct LinkView {
    /// The linked source's key (same dataset).
    pub source_key: String,
    /// `out`: the asked source links to it; `in`: it links to the asked source.
    pub direction: &'static str,
    /// The revision whose link made the edge (the linking source's current head).
    pub via_revision_id: Uuid,
    /// The linked source's current head revision, per the ledger.
    pub head_revision_id: Uuid,
    /// Its head's tags (present when the graph's `HEAD` agrees with the ledger).
    pub tags: Vec<String>,
}

/// The answer of `GET /v1/graph/sources`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct GraphSources {
    /// Dataset.
    pub dataset: String,
    /// The asked source.
    pub source_key: String,
    /// Its current head revision.
    pub head_revision_id: Uuid,
    /// Linked sources, outgoing first, by key.
    pub links: Vec<LinkView>,
}

/// Query parameters of `GET /v1/graph/sources`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct GraphQuery {
    /// Dataset.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// `out` (default), `in` or `both`.
    pub direction: Option<String>,
    /// 1 to 100 (default 100).
    pub limit: Option<i64>,
}

fn graph_error(error: GatewayError) -> ApiError {
    tracing::warn!(%error, "graph read failed");
    let mut api = ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "graph_unavailable",
        "the graph store did not answer; retry shortly",
    );
    api.retry_after = Some(1);
    api
}

/// The sources linked to `dataset/source_key` (whose current head is `head`), bound to the
/// ledger. Unknown or deleted sources have no links, nor do sources that a caller reading as
/// `reads_as` ([`receipts::Principal::reads_as`]) may not read.
#[allow(clippy::too_many_arguments)]
pub async fn bound_links(
    ledger: &dyn SearchLedger,
    graph: &dyn GraphStore,
    reads_as: Option<&[String]>,
    dataset: &str,
    source_key: &str,
    head: Uuid,
    direction: Direction,
    limit: usize,
) -> Result<Vec<LinkView>, ApiError> {
    let linked = graph
        .linked(dataset, source_key, direction, limit)
        .await
        .map_err(graph_error)?;
    let mut views = Vec::new();
    for LinkedSource {
        source_key: other,
        direction: way,
        via_revision,
        head: graph_head,
        tags,
    } in linked
    {
        let Some(view) = ledger.source(dataset, &other).await? else {
            continue;
        };
        if view.deleted || !ledger.may_read(reads_as, dataset, &other).await? {
            continue;
        }
        // The edge must come from the linking source's current head.
        let linking_head = match way {
            Direction::In => view.head.id,
            _ => head,
        };
        if via_revision != linking_head {
            continue;
        }
        views.push(LinkView {
            source_key: other,
            direction: if way == Direction::In { "in" } else { "out" },
            via_revision_id: via_revision,
            head_revision_id: view.head.id,
            tags: if graph_head == Some(view.head.id) {
                tags
            } else {
                Vec::new()
            },
        });
    }
    Ok(views)
}

/// State of the graph route.
#[derive(Clone)]
pub(crate) struct GraphState {
    pub(crate) ledger: Arc<dyn SearchLedger>,
    pub(crate) graph: Option<Arc<dyn GraphStore>>,
}

impl axum::extract::FromRef<GraphState> for Arc<dyn receipts::Tokens> {
    fn from_ref(state: &GraphState) -> Self {
        state.ledger.clone()
    }
}

/// The sources linked to one source, and their tags, bound to current revisions.
#[utoipa::path(get, path = "/v1/graph/sources", tag = "search", security(("bearer" = [])),
    params(GraphQuery),
    responses((status = 200, description = "Linked current sources.", body = GraphSources), ApiErrors))]
pub(crate) async fn graph_sources(
    State(state): State<GraphState>,
    auth: Auth,
    query: Result<UrlQuery<GraphQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::Search)?;
    let UrlQuery(query) = query
        .map_err(|rejection| ApiError::unprocessable("invalid_query", rejection.body_text()))?;
    validate::dataset(&query.dataset)?;
    validate::source_key(&query.source_key)?;
    principal.require_dataset(&query.dataset)?;
    let direction = match query.direction.as_deref() {
        None | Some("out") => Direction::Out,
        Some("in") => Direction::In,
        Some("both") => Direction::Both,
        Some(other) => {
            return Err(ApiError::unprocessable(
                "invalid_direction",
                format!("`direction` must be out, in or both (got `{other}`)"),
            ))
        }
    };
    let limit = query.limit.unwrap_or(MAX_LINKS as i64);
    if !(1..=MAX_LINKS as i64).contains(&limit) {
        return Err(ApiError::unprocessable(
            "invalid_limit",
            format!("`limit` must be between 1 and {MAX_LINKS} (got {limit})"),
        ));
    }
    let Some(graph) = &state.graph else {
        return Err(ApiError::unprocessable(
            "graph_unconfigured",
            "no graph store is configured (graph.url)",
        ));
    };
    let Some(view) = state
        .ledger
        .source(&query.dataset, &query.source_key)
        .await?
    else {
        return Err(ApiError::not_found(
            "source_not_found",
            format!("no source {}/{}", query.dataset, query.source_key),
        ));
    };
    let reads_as = principal.reads_as();
    if !state
        .ledger
        .may_read(reads_as.as_deref(), &query.dataset, &query.source_key)
        .await?
    {
        // A source the caller may not read is answered as one that does not exist.
        return Err(ApiError::not_found(
            "source_not_found",
            format!("no source {}/{}", query.dataset, query.source_key),
        ));
    }
    if view.deleted {
        return Err(ApiError::not_found(
            "source_not_found",
            format!("{}/{} is deleted", query.dataset, query.source_key),
        ));
    }
    let links = bound_links(
        state.ledger.as_ref(),
        graph.as_ref(),
        reads_as.as_deref(),
        &query.dataset,
        &query.source_key,
        view.head.id,
        direction,
        usize::try_from(limit).unwrap_or(MAX_LINKS),
    )
    .await?;
    Ok(Json(GraphSources {
        dataset: query.dataset,
        source_key: query.source_key,
        head_revision_id: view.head.id,
        links,
    })
    .into_response())
}
