//! `POST /v1/search`: validation, permissions and typed errors around [`Searcher::search`].
//!
//! Order of checks: bearer token (401), `search` scope and dataset allowlist (403), body (413,
//! 415, 422 with a stable code per field), admission (429 `overloaded` with `Retry-After`).

use receipts::validity::At;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRef, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use receipts::http::{read_json, ApiError, ApiErrors, Auth};
use receipts::{validate, Principal, Scope, SearchLedger, Tokens};
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;

use crate::{Mode, Query, SearchError, Searcher, DEFAULT_TOP_K, MAX_QUERY_CHARS, MAX_TOP_K};

/// The smallest budget a request may ask for: below it a search could not even embed its
/// query, so the answer would always be a timeout.
pub const MIN_BUDGET_MS: i64 = 50;

/// Largest search request body.
const MAX_BODY_BYTES: usize = 64 * 1024;

/// State of the search routes.
#[derive(Clone)]
struct SearchState {
    ledger: Arc<dyn SearchLedger>,
    searcher: Arc<Searcher>,
}

impl FromRef<SearchState> for Arc<dyn Tokens> {
    fn from_ref(state: &SearchState) -> Self {
        state.ledger.clone()
    }
}

/// The search API's routes with their OpenAPI description (registered from the handler's
/// `#[utoipa::path]`).
pub fn routes(ledger: Arc<dyn SearchLedger>, searcher: Arc<Searcher>) -> OpenApiRouter {
    let graph = crate::graph::GraphState {
        ledger: ledger.clone(),
        graph: searcher.graph().cloned(),
    };
    OpenApiRouter::new()
        .routes(utoipa_axum::routes!(search))
        .routes(utoipa_axum::routes!(dataset_facets))
        .with_state(SearchState { ledger, searcher })
        .merge(
            OpenApiRouter::new()
                .routes(utoipa_axum::routes!(crate::graph::graph_sources))
                .with_state(graph),
        )
}

/// The search API's routes, ready to merge into cairn's router.
pub fn router(ledger: Arc<dyn SearchLedger>, searcher: Arc<Searcher>) -> Router {
    routes(ledger, searcher).split_for_parts().0
}

/// The request body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchBody {
    /// 1 to 2,000 characters, not only whitespace.
    #[schema(schema_with = query_schema)]
    pub query: String,
    /// Datasets to search (default: every dataset the token may read); at least one when
    /// given.
    #[schema(schema_with = receipts::http::optional_datasets)]
    pub datasets: Option<Vec<String>>,
    /// 1 to 100 (default 10).
    #[schema(minimum = 1, maximum = 100)]
    pub top_k: Option<i64>,
    /// 50 to the server's maximum, `search.max_budget_ms` (default 2,000).
    #[schema(minimum = 50, maximum = 30000)]
    pub budget_ms: Option<i64>,
    /// `auto` (default), `vector` or `lexical`.
    #[schema(pattern = "^(auto|vector|lexical)$")]
    pub mode: Option<String>,
    /// One result per source (default true).
    pub group_by_source: Option<bool>,
    /// `links`: add each result's linked current sources (needs a graph store).
    #[schema(pattern = "^links$")]
    pub expand: Option<String>,
    /// Search as it held at this valid time (epoch microseconds or RFC 3339 with an offset),
    /// as known at `as_of` (default: now).
    #[schema(schema_with = receipts::http::instant_schema)]
    pub valid_at: Option<serde_json::Value>,
    /// Search as the ledger believed at this record time, about `valid_at` (default: the same
    /// instant). At least `AS_OF_SETTLED` (5 s) in the past, so that the answer can be
    /// reproduced: a commit in flight could still land before a later instant.
    #[schema(schema_with = receipts::http::instant_schema)]
    pub as_of: Option<serde_json::Value>,
    /// Only sources whose revision matches (the current one, or the one held at `valid_at`):
    /// a group `{"must": [...], "should": [...], "must_not": [...]}` or a condition
    /// `{"field": ..., <operator>: ...}`. Fields and operators: `tags` (`any`, `all`, `none`:
    /// lists of strings), `media_type` (`eq`, `in`), `source_key` (`eq`, `in`, `prefix`,
    /// `glob` with `*` and `?`), `accepted_at` (`gt`, `gte`, `lt`, `lte`: RFC 3339 or epoch
    /// microseconds), `metadata.<name>` (`eq`, `in`: strings, numbers, booleans; `exists`;
    /// `gt`, `gte`, `lt`, `lte`: numbers). Connectors set `metadata.path`,
    /// `metadata.commit`, `metadata.author` and `metadata.commit_time` (epoch seconds).
    #[schema(value_type = Object, example = json!({"must": [
        {"field": "tags", "any": ["async"]},
        {"field": "source_key", "prefix": "src/appendix"},
        {"field": "accepted_at", "gte": "2026-12-01T00:00:00Z"}
    ], "must_not": [{"field": "metadata.draft", "eq": true}]}))]
    pub filter: Option<serde_json::Value>,
    /// Fields to count over every source the datasets and the filter select (not the page):
    /// `tags`, `media_type`, `metadata.<name>`; at most 8.
    #[schema(example = json!(["tags", "media_type", "metadata.author"]))]
    pub facets: Option<Vec<String>>,
    /// Values listed per facet, most frequent first: 1 to 100 (default 20).
    #[schema(minimum = 1, maximum = 100)]
    pub facet_values: Option<i64>,
}

/// How far in the past an `as_of` must lie: acceptance transactions commit within it, so no
/// later commit can change what was believed at that instant.
pub const AS_OF_SETTLED: receipts::Micros = 5_000_000;

/// The point in both times a body asks for, if any; an `as_of` that has not settled is
/// refused.
fn point_in_time(body: &SearchBody) -> Result<Option<At>, ApiError> {
    let now = receipts::Clock::now_micros(&receipts::SystemClock);
    let at = receipts::validity::point_in_time(body.valid_at.as_ref(), body.as_of.as_ref(), now)?;
    let asked = body.as_of.as_ref().is_some_and(|as_of| !as_of.is_null());
    if let Some(at) = at.filter(|_| asked) {
        if at.as_of > now - AS_OF_SETTLED {
            return Err(ApiError::unprocessable(
                "as_of_unsettled",
                format!(
                    "as_of {} is less than {} s before now ({}): commits in flight could still \
                     change what was believed then; ask about an earlier instant, or leave \
                     as_of out to search as known now",
                    receipts::validity::format_instant(at.as_of),
                    AS_OF_SETTLED / 1_000_000,
                    receipts::validity::format_instant(now)
                ),
            ));
        }
    }
    Ok(at)
}

fn query_schema() -> utoipa::openapi::schema::Object {
    receipts::http::not_blank_schema(
        MAX_QUERY_CHARS,
        true,
        "1 to 2,000 characters, not only whitespace.",
    )
}

/// Validates a body for `principal` into a [`Query`].
pub fn parse(
    body: SearchBody,
    principal: &Principal,
    searcher: &Searcher,
) -> Result<Query, ApiError> {
    let settings = searcher.settings();
    let at = point_in_time(&body)?;
    let text = body.query.trim();
    let chars = text.chars().count();
    if chars == 0 || chars > MAX_QUERY_CHARS {
        return Err(ApiError::unprocessable(
            "invalid_query",
            format!("`query` must have 1 to {MAX_QUERY_CHARS} characters (got {chars})"),
        ));
    }
    let top_k = body.top_k.unwrap_or(DEFAULT_TOP_K as i64);
    if !(1..=MAX_TOP_K as i64).contains(&top_k) {
        return Err(ApiError::unprocessable(
            "invalid_top_k",
            format!("`top_k` must be between 1 and {MAX_TOP_K} (got {top_k})"),
        ));
    }
    let max_budget = i64::try_from(settings.max_budget.as_millis()).unwrap_or(i64::MAX);
    let budget_ms = body
        .budget_ms
        .unwrap_or(i64::try_from(settings.default_budget.as_millis()).unwrap_or(i64::MAX));
    if !(MIN_BUDGET_MS..=max_budget).contains(&budget_ms) {
        return Err(ApiError::unprocessable(
            "invalid_budget",
            format!(
                "`budget_ms` must be between {MIN_BUDGET_MS} and {max_budget} (got {budget_ms})"
            ),
        ));
    }
    let mode: Mode = match body.mode.as_deref() {
        None => Mode::Auto,
        Some(text) => text
            .parse()
            .map_err(|message: String| ApiError::unprocessable("invalid_mode", message))?,
    };
    let datasets = match body.datasets {
        Some(datasets) => {
            if datasets.is_empty() {
                return Err(ApiError::unprocessable(
                    "invalid_datasets",
                    "`datasets` must name at least one dataset (omit it to search every \
                     dataset the token may read)",
                ));
            }
            for dataset in &datasets {
                validate::dataset(dataset).map_err(ApiError::from)?;
                principal.require_dataset(dataset)?;
            }
            datasets
        }
        // Every dataset the token may read; an empty list in the query means "all", so a
        // token whose allowlist is empty reads nothing rather than everything.
        None => match &principal.datasets {
            None => Vec::new(),
            Some(allowed) if allowed.is_empty() => {
                return Err(ApiError::from(receipts::auth::Denied::Dataset(
                    "(any)".to_owned(),
                )))
            }
            Some(allowed) => allowed.clone(),
        },
    };
    let filter = body
        .filter
        .as_ref()
        .map(|filter| receipts::filter::Filter::parse(filter, settings.filter_limits))
        .transpose()
        .map_err(filter_refused)?;
    let filter = readable(filter, principal);
    let facets = body
        .facets
        .as_deref()
        .map(|fields| facet_request(fields, body.facet_values))
        .transpose()?;
    Ok(Query {
        facets,
        text: text.to_owned(),
        datasets,
        top_k: usize::try_from(top_k).unwrap_or(DEFAULT_TOP_K),
        budget: Duration::from_millis(u64::try_from(budget_ms).unwrap_or(1)),
        mode,
        group_by_source: body.group_by_source.unwrap_or(true),
        at,
        filter,
    })
}

/// The filter a search runs for `principal`: its own, and for a token that reads as an
/// identity, only the sources that identity may read ([`receipts::access`]). Every mode, the
/// facet counts and binding then apply it; binding reads the ledger's current access, so a
/// revoked reader loses a document at the next query.
pub fn readable(
    filter: Option<receipts::filter::Filter>,
    principal: &Principal,
) -> Option<receipts::filter::Filter> {
    match principal.reads_as() {
        None => filter,
        Some(names) => Some(receipts::access::restrict(filter, names)),
    }
}

/// The facets a request names, checked: known fields, no repeats, bounded counts.
pub fn facet_request(
    fields: &[String],
    values: Option<i64>,
) -> Result<crate::facets::FacetRequest, ApiError> {
    use crate::facets::{DEFAULT_FACET_VALUES, MAX_FACETS, MAX_FACET_VALUES};
    if fields.is_empty() || fields.len() > MAX_FACETS {
        return Err(ApiError::unprocessable(
            "invalid_facets",
            format!(
                "`facets` names 1 to {MAX_FACETS} fields (got {}); omit it for no counts",
                fields.len()
            ),
        ));
    }
    let mut parsed = Vec::with_capacity(fields.len());
    for field in fields {
        let field = receipts::filter::facets::FacetField::parse(field)
            .map_err(|error| ApiError::unprocessable(error.code, error.message))?;
        if parsed.contains(&field) {
            return Err(ApiError::unprocessable(
                "invalid_facets",
                format!("`facets` names {} twice", field.name()),
            ));
        }
        parsed.push(field);
    }
    let values = values.unwrap_or(i64::from(DEFAULT_FACET_VALUES));
    let values = u32::try_from(values)
        .ok()
        .filter(|values| (1..=MAX_FACET_VALUES).contains(values))
        .ok_or_else(|| {
            ApiError::unprocessable(
                "invalid_facets",
                format!("`facet_values` must be between 1 and {MAX_FACET_VALUES} (got {values})"),
            )
        })?;
    Ok(crate::facets::FacetRequest {
        fields: parsed,
        values,
    })
}

/// Removes credentials from counted values, as from result texts.
fn redact_facets(facets: &mut [receipts::filter::facets::FacetCounts]) {
    for counts in facets {
        for count in &mut counts.values {
            if let receipts::filter::facets::FacetValue::Text(text) = &mut count.value {
                let (redacted, found) = receipts::secrets::redact(text);
                if found > 0 {
                    tracing::warn!(field = %counts.field, "credentials redacted from a facet value");
                    *text = redacted;
                }
            }
        }
    }
}

/// A refused filter: 422 with its stable code, the part at fault in the message and in
/// `details.at`.
pub fn filter_refused(error: receipts::filter::FilterError) -> ApiError {
    ApiError::unprocessable(error.code, error.to_string())
        .with_details(serde_json::json!({ "at": error.at }))
}

impl From<SearchError> for ApiError {
    fn from(error: SearchError) -> Self {
        match error {
            SearchError::Overloaded { limit, queued } => {
                let mut api = ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "overloaded",
                    format!(
                        "{limit} searches are running and {queued} waiting; no slot could start \
                         this one within its budget; retry after a second"
                    ),
                )
                .with_details(serde_json::json!({ "max_in_flight": limit, "queued": queued }));
                api.retry_after = Some(1);
                api
            }
            SearchError::Timeout {
                budget_ms,
                degradations,
            } => ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "search_timeout",
                format!(
                    "no phase answered within the budget of {budget_ms} ms; retry with a larger \
                     `budget_ms` or mode `lexical`"
                ),
            )
            .with_details(serde_json::json!({
                "budget_ms": budget_ms,
                "degradations": degradations,
            })),
            SearchError::Unsupported { code, message } => ApiError::unprocessable(code, message),
            SearchError::Ledger(error) => error.into(),
        }
    }
}

/// Searches current revisions: vector and lexical phases under one budget, fused; every hit
/// bound to its source's current revision.
#[utoipa::path(post, path = "/v1/search", tag = "search", security(("bearer" = [])),
    request_body(content = SearchBody, content_type = "application/json"),
    responses((status = 200, description = "Results, best first, with what answered and how long each phase took.", body = crate::SearchResponse), ApiErrors))]
async fn search(
    State(state): State<SearchState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::Search)?;
    let body: SearchBody = read_json(&headers, body, MAX_BODY_BYTES).await?;
    let expand = match body.expand.as_deref() {
        None => false,
        Some("links") if state.searcher.graph().is_some() => true,
        Some("links") => {
            return Err(ApiError::unprocessable(
                "graph_unconfigured",
                "`expand: links` needs a graph store (graph.url)",
            ))
        }
        Some(other) => {
            return Err(ApiError::unprocessable(
                "invalid_expand",
                format!("`expand` may only be `links` (got `{other}`)"),
            ))
        }
    };
    let reads_as = principal.reads_as();
    let query = parse(body, principal, &state.searcher)?;
    let mode = query.mode;
    let budget = query.budget;
    let started = std::time::Instant::now();
    let mut outcome = state.searcher.search(query).await;
    if let (true, Ok(response), Some(graph)) = (expand, outcome.as_mut(), state.searcher.graph()) {
        expand_links(
            &state.ledger,
            graph,
            reads_as.as_deref(),
            response,
            started + budget,
        )
        .await;
    }
    // Ingest refuses credentials; one stored another way (an older release, a restored
    // backup) still never leaves in an answer.
    if let Ok(response) = outcome.as_mut() {
        redact_facets(&mut response.facets);
        for result in &mut response.results {
            let (text, found) = receipts::secrets::redact(&result.text);
            if found > 0 {
                tracing::warn!(dataset = %result.dataset, source_key = %result.source_key, revision = %result.source_revision_id, found, "credentials redacted from a search answer");
                result.text = text;
            }
        }
    }
    record_metrics(mode, &outcome, started.elapsed());
    match &outcome {
        Ok(response) if response.degraded => tracing::info!(
            ?mode,
            answered = ?response.mode,
            degradations = ?response.degradations,
            stale_dropped = response.stale_dropped,
            took_ms = response.took_ms,
            "search degraded"
        ),
        Err(error) => tracing::info!(?mode, %error, "search refused"),
        Ok(_) => {}
    }
    Ok(Json(outcome?).into_response())
}

/// Most links added per result with `"expand": "links"`.
const LINKS_PER_RESULT: usize = 20;

/// Adds each result's linked current sources, within what is left of the budget; a graph that
/// is slow or down leaves the links out and says so (`graph_timeout`, `graph_error`).
async fn expand_links(
    ledger: &Arc<dyn SearchLedger>,
    graph: &Arc<dyn gateways::GraphStore>,
    reads_as: Option<&[String]>,
    response: &mut crate::SearchResponse,
    deadline: std::time::Instant,
) {
    let work = async {
        let mut all = Vec::with_capacity(response.results.len());
        for result in &response.results {
            all.push(
                crate::graph::bound_links(
                    ledger.as_ref(),
                    graph.as_ref(),
                    reads_as,
                    &result.dataset,
                    &result.source_key,
                    result.source_revision_id,
                    gateways::graph::Direction::Out,
                    LINKS_PER_RESULT,
                )
                .await?,
            );
        }
        Ok::<_, ApiError>(all)
    };
    match tokio::time::timeout_at(deadline.into(), work).await {
        Ok(Ok(all)) => {
            for (result, links) in response.results.iter_mut().zip(all) {
                result.links = Some(links);
            }
        }
        Ok(Err(_)) => {
            response.degraded = true;
            response.degradations.push("graph_error".to_owned());
        }
        Err(_) => {
            response.degraded = true;
            response.degradations.push("graph_timeout".to_owned());
        }
    }
}

/// Search metrics: requests by the mode that answered (the mode asked for when none did) and
/// HTTP status, latency by mode, degradations and stale hits dropped. Every client of the
/// searcher records them (the HTTP route and the MCP `search` tool), so the search
/// dashboards count every search.
pub fn record_metrics(
    asked: Mode,
    outcome: &Result<crate::SearchResponse, SearchError>,
    took: Duration,
) {
    let (mode, status) = match outcome {
        Ok(response) => (response.mode.as_str(), "200"),
        Err(SearchError::Overloaded { .. }) => (asked.as_str(), "429"),
        Err(SearchError::Timeout { .. }) => (asked.as_str(), "504"),
        Err(SearchError::Unsupported { .. }) => (asked.as_str(), "422"),
        Err(SearchError::Ledger(error)) => (
            asked.as_str(),
            if error.http_status() == 503 {
                "503"
            } else {
                "500"
            },
        ),
    };
    metrics::counter!("cairn_search_requests_total", "mode" => mode, "status" => status)
        .increment(1);
    if let Ok(response) = outcome {
        metrics::histogram!("cairn_search_duration_seconds", "mode" => mode)
            .record(took.as_secs_f64());
        metrics::counter!("cairn_search_stale_dropped_total")
            .increment(response.stale_dropped as u64);
        for degradation in &response.degradations {
            metrics::counter!("cairn_search_degraded_total", "reason" => degradation.clone())
                .increment(1);
        }
    }
}

/// The query of `GET /v1/datasets/{dataset}/facets`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FacetParams {
    /// Fields to count, comma-separated: `tags`, `media_type`, `metadata.<name>` (at most 8).
    pub field: String,
    /// Only sources that match this filter (JSON, as `POST /v1/search` takes it).
    pub filter: Option<String>,
    /// Values listed per field, most frequent first: 1 to 100 (default 20).
    pub values: Option<i64>,
}

/// Facet counts of a dataset's current sources, without a query.
#[utoipa::path(get, path = "/v1/datasets/{dataset}/facets", tag = "search", security(("bearer" = [])),
    params(("dataset" = String, Path, description = "The dataset."), FacetParams),
    responses((status = 200, description = "Each field's values with the number of current sources that hold them, exact; fields that could not be counted within the budget are named in `facets_partial`.", body = crate::facets::FacetAnswer), ApiErrors))]
async fn dataset_facets(
    State(state): State<SearchState>,
    auth: Auth,
    axum::extract::Path(dataset): axum::extract::Path<String>,
    params: Result<axum::extract::Query<FacetParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::Search)?;
    validate::dataset(&dataset).map_err(ApiError::from)?;
    principal.require_dataset(&dataset)?;
    let axum::extract::Query(params) = params.map_err(|rejection| {
        ApiError::unprocessable("invalid_query_parameters", rejection.body_text())
    })?;
    let fields: Vec<String> = params
        .field
        .split(',')
        .map(|field| field.trim().to_owned())
        .filter(|field| !field.is_empty())
        .collect();
    let request = facet_request(&fields, params.values)?;
    let settings = state.searcher.settings();
    let filter = match params.filter.as_deref() {
        None => None,
        Some(text) => {
            let value: serde_json::Value = serde_json::from_str(text).map_err(|error| {
                ApiError::unprocessable("filter_shape", format!("`filter` is not JSON ({error})"))
                    .with_details(serde_json::json!({ "at": "filter" }))
            })?;
            Some(
                receipts::filter::Filter::parse(&value, settings.filter_limits)
                    .map_err(filter_refused)?,
            )
        }
    };
    let mut answer = state
        .searcher
        .facets(crate::facets::FacetQuery {
            datasets: vec![dataset],
            filter: readable(filter, principal),
            at: None,
            request,
            budget: settings.default_budget,
        })
        .await
        .map_err(ApiError::from)?;
    redact_facets(&mut answer.facets);
    Ok(Json(answer).into_response())
}
