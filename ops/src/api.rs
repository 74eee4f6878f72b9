//! The operations JSON API: reads (`ops:read`) and actions (`ops:write`). Every action goes
//! through the ledger's one audited path ([`receipts::Leases`]) with the token's identity as
//! the actor, so the history says who requeued, cancelled or paused what, and why.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use receipts::http::{page_newest_first, read_json, ApiError, ApiErrors, Auth, PageParams};
use receipts::{
    HistoryEntry, Job, JobFilter, JobOrder, JobState, LedgerError, Micros, Principal, Scope,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::OpsState;

/// Largest action body.
pub(crate) const MAX_BODY_BYTES: usize = 64 * 1024;
/// Default page size.
const DEFAULT_LIMIT: u32 = 50;
/// Most jobs one bulk action touches.
pub const MAX_BULK: usize = 10_000;

/// Query parameters of the job listings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Comma-separated states (the listing's own states when absent).
    state: Option<String>,
    /// Only this dataset.
    dataset: Option<String>,
    /// Source key substring, or a job or revision id.
    q: Option<String>,
    /// Only jobs whose last error has this code.
    error_code: Option<String>,
    /// Jobs per page (1-500, default 50).
    limit: Option<u32>,
    /// Jobs skipped.
    offset: Option<u32>,
}

/// A comma-separated list of `states`, each trimmed; empty parts are ignored.
fn states_schema(states: &[JobState]) -> utoipa::openapi::schema::Object {
    let names: Vec<&str> = states.iter().map(|state| state.as_str()).collect();
    let space = receipts::http::WHITESPACE;
    let one = format!("[{space}]*(?:{})?[{space}]*", names.join("|"));
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .pattern(Some(format!("^{one}(?:,{one})*$")))
        .description(Some(format!(
            "Comma-separated states among: {} (default: all of them)",
            names.join(", ")
        )))
        .build()
}

/// A dataset name, or empty (meaning: no dataset filter).
pub(crate) fn dataset_or_empty() -> utoipa::openapi::schema::Object {
    let mut schema = receipts::http::dataset_schema();
    schema.min_length = None;
    schema.pattern = schema.pattern.map(|pattern| format!("^$|{pattern}"));
    schema
}

fn error_code_schema() -> utoipa::openapi::schema::Object {
    receipts::http::text_schema(128, "Only jobs whose last error has this code.")
}

fn q_schema() -> utoipa::openapi::schema::Object {
    receipts::http::text_schema(1024, "Source key text, or a job or revision id.")
}

/// The query parameters of one listing, for the document: the same fields as
/// [`ListParams`], with the states that listing shows.
macro_rules! listing_params {
    ($name:ident, $states:expr) => {
        #[derive(utoipa::IntoParams)]
        #[into_params(parameter_in = Query)]
        #[allow(dead_code)]
        struct $name {
            #[param(schema_with = $states)]
            state: Option<String>,
            #[param(schema_with = dataset_or_empty)]
            dataset: Option<String>,
            #[param(schema_with = q_schema)]
            q: Option<String>,
            #[param(schema_with = error_code_schema)]
            error_code: Option<String>,
            /// Jobs per page (1-500, default 50).
            #[param(minimum = 1, maximum = 500)]
            limit: Option<u32>,
            /// Jobs skipped.
            #[param(value_type = Option<u64>, minimum = 0, maximum = 4294967295_u64)]
            offset: Option<u32>,
        }
    };
}

fn leases_states() -> utoipa::openapi::schema::Object {
    states_schema(Listing::Leases.states())
}
fn retries_states() -> utoipa::openapi::schema::Object {
    states_schema(Listing::Retries.states())
}
fn dead_states() -> utoipa::openapi::schema::Object {
    states_schema(Listing::Dead.states())
}
fn all_states() -> utoipa::openapi::schema::Object {
    states_schema(JobState::ALL)
}
listing_params!(LeasesParams, leases_states);
listing_params!(RetriesParams, retries_states);
listing_params!(DeadParams, dead_states);
listing_params!(JobsParams, all_states);

/// A job as operators see it: the row plus what the dashboard computes from it.
#[derive(Debug, Serialize)]
pub struct JobView {
    #[serde(flatten)]
    job: Job,
    /// Milliseconds until the lease runs out (negative: already expired, awaiting rescue).
    lease_expires_in_ms: Option<i64>,
    /// Milliseconds since the last heartbeat.
    heartbeat_age_ms: Option<i64>,
    /// The last heartbeat is older than a third of the lease (the heartbeat period): the
    /// worker is late.
    heartbeat_late: bool,
    /// Milliseconds until the run's hard deadline.
    deadline_in_ms: Option<i64>,
    /// Milliseconds the current run has been going.
    running_for_ms: Option<i64>,
    /// Milliseconds until a waiting job becomes due (negative: overdue).
    due_in_ms: Option<i64>,
    /// The worker's host (lease owners are `host:pid:name`).
    worker_host: Option<String>,
    /// For listings that ask for it: every run of the job that ended in an error, oldest
    /// first (from history).
    #[serde(skip_serializing_if = "Option::is_none")]
    attempts: Option<Vec<HistoryEntry>>,
}

fn ms(micros: Micros) -> i64 {
    micros / 1000
}

impl JobView {
    fn of(job: Job, now: Micros) -> Self {
        let lease_expires_in_ms = job.lease_expires_at.map(|at| ms(at - now));
        let heartbeat_age_ms = job.heartbeat_at.map(|at| ms(now - at));
        // The lease the last heartbeat granted; workers beat every third of it.
        let heartbeat_late = match (job.heartbeat_at, job.lease_expires_at) {
            (Some(beat), Some(expiry)) => (now - beat) > (expiry - beat).max(0) / 3,
            _ => false,
        };
        let waiting = matches!(job.state, JobState::Pending | JobState::RetryWait);
        Self {
            lease_expires_in_ms,
            heartbeat_age_ms,
            heartbeat_late,
            deadline_in_ms: job.deadline_at.map(|at| ms(at - now)),
            running_for_ms: (job.state == JobState::Running)
                .then_some(job.started_at)
                .flatten()
                .map(|at| ms(now - at)),
            due_in_ms: waiting.then_some(ms(job.run_at - now)),
            worker_host: job
                .lease_owner
                .as_deref()
                .and_then(|owner| owner.split(':').next())
                .map(str::to_owned),
            attempts: None,
            job,
        }
    }
}

fn invalid(code: &str, message: impl Into<String>) -> ApiError {
    ApiError::unprocessable(code, message)
}

fn parse_states(text: &str) -> Result<Vec<JobState>, ApiError> {
    text.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| {
            part.parse::<JobState>()
                .map_err(|error| invalid("invalid_state", error.to_string()))
        })
        .collect()
}

fn parse_dataset(dataset: Option<String>) -> Result<Option<String>, ApiError> {
    match dataset.filter(|dataset| !dataset.is_empty()) {
        Some(dataset) => {
            receipts::validate::dataset(&dataset)?;
            Ok(Some(dataset))
        }
        None => Ok(None),
    }
}

/// An optional free-text parameter: empty means absent; at most `max` bytes, no control
/// characters.
fn bounded_text(
    value: Option<String>,
    max: usize,
    code: &str,
    message: &str,
) -> Result<Option<String>, ApiError> {
    match value.filter(|value| !value.is_empty()) {
        Some(value) if value.chars().count() > max || value.chars().any(char::is_control) => {
            Err(invalid(code, message))
        }
        other => Ok(other),
    }
}

fn parse_error_code(code: Option<String>) -> Result<Option<String>, ApiError> {
    bounded_text(
        code,
        128,
        "invalid_error_code",
        "an error code is at most 128 printable characters",
    )
}

fn parse_text(text: Option<String>) -> Result<Option<String>, ApiError> {
    bounded_text(
        text,
        1024,
        "invalid_query",
        "`q` is at most 1024 printable characters",
    )
}

/// The states asked for, each one of `allowed` (`allowed` empty: any state); none asked: all
/// of `allowed`. `what` starts the refusal's message ("this listing shows").
fn states_within(
    requested: Vec<JobState>,
    allowed: &[JobState],
    what: &str,
) -> Result<Vec<JobState>, ApiError> {
    if let Some(outside) = requested
        .iter()
        .find(|state| !allowed.is_empty() && !allowed.contains(state))
    {
        let names: Vec<&str> = allowed.iter().map(|state| state.as_str()).collect();
        return Err(invalid(
            "invalid_state",
            format!(
                "{what} {}; `{outside}` is not one of them",
                names.join(", ")
            ),
        ));
    }
    Ok(if requested.is_empty() {
        allowed.to_vec()
    } else {
        requested
    })
}

/// A dataset filter, refused when it is outside the token's allowlist.
fn dataset_for(dataset: Option<String>, principal: &Principal) -> Result<Option<String>, ApiError> {
    let dataset = parse_dataset(dataset)?;
    if let Some(dataset) = &dataset {
        principal.require_dataset(dataset)?;
    }
    Ok(dataset)
}

/// Builds a filter from listing parameters; `states` are the listing's own when the request
/// names none. A dataset outside the token's allowlist is refused; the allowlist applies to
/// every listing.
fn filter(
    params: ListParams,
    principal: &Principal,
    states: &[JobState],
    order: JobOrder,
) -> Result<JobFilter, ApiError> {
    let requested = match params.state.as_deref() {
        Some(text) => parse_states(text)?,
        None => Vec::new(),
    };
    let states = states_within(requested, states, "this listing shows")?;
    let dataset = dataset_for(params.dataset, principal)?;
    let limit = params.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 || limit > receipts::operations::MAX_PAGE {
        return Err(invalid(
            "invalid_limit",
            format!("`limit` is 1-{}", receipts::operations::MAX_PAGE),
        ));
    }
    Ok(JobFilter {
        states,
        dataset,
        allowed_datasets: principal.datasets.clone(),
        text: parse_text(params.q)?,
        error_code: parse_error_code(params.error_code)?,
        order,
        limit,
        offset: params.offset.unwrap_or(0),
        readable_by: principal.reads_as(),
    })
}

async fn list(
    state: &OpsState,
    filter: JobFilter,
    with_attempts: bool,
) -> Result<Json<Value>, ApiError> {
    let page = state.ledger.find_jobs(&filter).await?;
    let now = state.ledger.clock_now();
    let mut jobs = Vec::with_capacity(page.jobs.len());
    for job in page.jobs {
        let id = job.id;
        let mut view = JobView::of(job, now);
        if with_attempts {
            let history = state.ledger.history("job", &id.to_string()).await?;
            view.attempts = Some(
                history
                    .into_iter()
                    .filter(|entry| entry.error_code.is_some())
                    .collect(),
            );
        }
        jobs.push(view);
    }
    Ok(Json(json!({
        "now": now,
        "total": page.total,
        "limit": filter.limit,
        "offset": filter.offset,
        "jobs": jobs,
    })))
}

/// `GET /v1/ops/summary`: counts, the last hour's activity, lease health, pauses.
#[utoipa::path(get, path = "/v1/ops/summary", tag = "ops", security(("bearer" = [])), responses((status = 200, description = "Is work flowing: jobs by state, queue depth, per-minute activity, latency percentiles, lease health, pauses.", body = Object), ApiErrors))]
pub async fn summary(State(state): State<OpsState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    let principal = auth.require(Scope::OpsRead)?;
    if let Some(datasets) = &principal.datasets {
        return Ok(Json(scoped_summary(&state, datasets).await?));
    }
    let counts = state.ledger.counts().await?;
    let activity = state.ledger.activity(Duration::from_secs(3600)).await?;
    let per_minute = |pick: fn(&receipts::operations::MinuteActivity) -> i64| -> f64 {
        let total: i64 = activity.minutes.iter().map(pick).sum();
        total as f64 / activity.minutes.len().max(1) as f64
    };
    Ok(Json(json!({
        "graph": graph_lag(&counts.receipts),
        "now": activity.now,
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_seconds": state.started_at.elapsed().as_secs(),
        "jobs": counts.jobs,
        "receipts": counts.receipts,
        "sources": counts.sources,
        "deleted_sources": counts.deleted_sources,
        "revisions": counts.revisions,
        "queue_depth": activity.queue_depth,
        "due": activity.due,
        "running": activity.running,
        "oldest_lease_age_ms": activity.oldest_lease_age_micros.map(ms),
        "max_heartbeat_age_ms": activity.max_heartbeat_age_micros.map(ms),
        "completions_per_minute": per_minute(|minute| minute.completed),
        "retries_per_minute": per_minute(|minute| minute.retried),
        "enqueue_to_start": activity.enqueue_to_start,
        "accepted_to_searchable": activity.accepted_to_searchable,
        "minutes": activity.minutes,
        "pauses": activity.pauses,
    })))
}

/// The graph's progress from the receipt counts: verified or excluded, lagging (pending,
/// running or written: accepted, not yet in the graph), failed; `null` without graph receipts.
fn graph_lag(receipts: &std::collections::BTreeMap<String, i64>) -> Value {
    let count = |state: &str| {
        receipts
            .get(&format!("graph/{state}"))
            .copied()
            .unwrap_or(0)
    };
    let any = receipts.keys().any(|key| key.starts_with("graph/"));
    if !any {
        return Value::Null;
    }
    json!({
        "verified": count("verified") + count("excluded"),
        "lag": count("pending") + count("running") + count("written"),
        "failed": count("failed"),
    })
}

/// Jobs by state within `datasets` (a token's allowlist), counted from the job listings.
pub(crate) async fn jobs_by_state(
    state: &OpsState,
    datasets: &[String],
) -> Result<serde_json::Map<String, Value>, ApiError> {
    let mut counts = serde_json::Map::new();
    for job_state in JobState::ALL.iter().copied() {
        let page = state
            .ledger
            .find_jobs(&JobFilter {
                states: vec![job_state],
                dataset: None,
                allowed_datasets: Some(datasets.to_vec()),
                text: None,
                error_code: None,
                order: JobOrder::RecentlyChanged,
                limit: 1,
                offset: 0,
                readable_by: None,
            })
            .await?;
        if page.total > 0 {
            counts.insert(job_state.as_str().to_owned(), json!(page.total));
        }
    }
    Ok(counts)
}

/// The summary for a token limited to some datasets: its datasets' jobs by state and the
/// pauses that apply to them (their own and the pause of every dataset). Ledger-wide figures
/// (sources, receipts, throughput, latency) would describe other datasets, so they are left
/// out; `scope` says so.
async fn scoped_summary(state: &OpsState, datasets: &[String]) -> Result<Value, ApiError> {
    let activity = state.ledger.activity(Duration::from_secs(60)).await?;
    let pauses: Vec<_> = activity
        .pauses
        .into_iter()
        .filter(|pause| {
            pause
                .dataset
                .as_ref()
                .is_none_or(|dataset| datasets.contains(dataset))
        })
        .collect();
    Ok(json!({
        "now": activity.now,
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_seconds": state.started_at.elapsed().as_secs(),
        "scope": { "datasets": datasets, "ledger_wide_figures": "omitted" },
        "jobs": jobs_by_state(state, datasets).await?,
        "pauses": pauses,
    }))
}

/// The states of the "dead" listing.
const DEAD_STATES: [JobState; 3] = [JobState::Dead, JobState::Quarantined, JobState::Cancelled];

/// The job listings: which states each shows, in which order, and whether each job comes
/// with its failed attempts.
#[derive(Debug, Clone, Copy)]
enum Listing {
    Leases,
    Retries,
    Dead,
    Jobs,
}

impl Listing {
    fn states(self) -> &'static [JobState] {
        match self {
            Listing::Leases => &[JobState::Running],
            Listing::Retries => &[JobState::RetryWait],
            Listing::Dead => &DEAD_STATES,
            Listing::Jobs => &[],
        }
    }

    fn order(self) -> JobOrder {
        match self {
            Listing::Leases => JobOrder::LeaseExpiry,
            Listing::Retries => JobOrder::RunAt,
            Listing::Dead | Listing::Jobs => JobOrder::RecentlyChanged,
        }
    }

    fn with_attempts(self) -> bool {
        matches!(self, Listing::Retries | Listing::Dead)
    }

    async fn answer(
        self,
        state: OpsState,
        auth: Auth,
        params: ListParams,
    ) -> Result<Json<Value>, ApiError> {
        let principal = auth.require(Scope::OpsRead)?;
        let filter = filter(params, principal, self.states(), self.order())?;
        list(&state, filter, self.with_attempts()).await
    }
}

/// `GET /v1/ops/leases`: running jobs, soonest lease expiry first.
#[utoipa::path(get, path = "/v1/ops/leases", tag = "ops", security(("bearer" = [])), params(LeasesParams), responses((status = 200, description = "Running jobs with their worker, stage, lease and heartbeat.", body = Object), ApiErrors))]
pub async fn leases(
    State(state): State<OpsState>,
    auth: Auth,
    Query(params): Query<ListParams>,
) -> Result<Json<Value>, ApiError> {
    Listing::Leases.answer(state, auth, params).await
}

/// `GET /v1/ops/retries`: jobs waiting to retry, soonest first, with each failed attempt.
#[utoipa::path(get, path = "/v1/ops/retries", tag = "ops", security(("bearer" = [])), params(RetriesParams), responses((status = 200, description = "Jobs waiting to retry, with every error so far.", body = Object), ApiErrors))]
pub async fn retries(
    State(state): State<OpsState>,
    auth: Auth,
    Query(params): Query<ListParams>,
) -> Result<Json<Value>, ApiError> {
    Listing::Retries.answer(state, auth, params).await
}

/// `GET /v1/ops/dead`: dead, quarantined and cancelled jobs, most recent first, with each
/// failed attempt.
#[utoipa::path(get, path = "/v1/ops/dead", tag = "ops", security(("bearer" = [])), params(DeadParams), responses((status = 200, description = "Dead, quarantined and cancelled jobs with the reason.", body = Object), ApiErrors))]
pub async fn dead(
    State(state): State<OpsState>,
    auth: Auth,
    Query(params): Query<ListParams>,
) -> Result<Json<Value>, ApiError> {
    Listing::Dead.answer(state, auth, params).await
}

/// `GET /v1/ops/jobs`: any jobs, by state, dataset, source key or id, error code.
#[utoipa::path(get, path = "/v1/ops/jobs", tag = "ops", security(("bearer" = [])), params(JobsParams), responses((status = 200, description = "Any jobs, by filter.", body = Object), ApiErrors))]
pub async fn jobs(
    State(state): State<OpsState>,
    auth: Auth,
    Query(params): Query<ListParams>,
) -> Result<Json<Value>, ApiError> {
    Listing::Jobs.answer(state, auth, params).await
}

fn parse_job_id(id: &str) -> Result<Uuid, ApiError> {
    id.parse::<Uuid>()
        .map_err(|_| invalid("invalid_job_id", format!("`{id}` is not a job id (a UUID)")))
}

/// The job `id` if the token may see it. A job of a dataset outside the token's allowlist, or
/// of a source a token with an identity may not read, is answered as absent (404), as
/// revisions are, so that ids do not reveal other datasets or documents.
async fn load_job(state: &OpsState, principal: &Principal, id: Uuid) -> Result<Job, ApiError> {
    let not_found = || ApiError::not_found("job_not_found", format!("no job {id}"));
    let job = state.ledger.job(id).await?.ok_or_else(not_found)?;
    principal
        .require_dataset(&job.dataset)
        .map_err(|_| not_found())?;
    // A token that reads as an identity sees the jobs of sources it may read, no others.
    let readable = state
        .ledger
        .may_read(
            principal.reads_as().as_deref(),
            &job.dataset,
            &job.source_key,
        )
        .await?;
    if !readable {
        return Err(not_found());
    }
    Ok(job)
}

/// `GET /v1/ops/jobs/{id}`: the job, its whole history, its receipts with their evidence and
/// history, and the revision chain of its source.
#[utoipa::path(get, path = "/v1/ops/jobs/{id}", tag = "ops", security(("bearer" = [])), params(("id" = uuid::Uuid, Path, description = "Job id"), receipts::http::PageParams), responses((status = 200, description = "One job: history (newest first, paged), receipts with read-back evidence, the revision chain.", body = Object), ApiErrors))]
pub async fn job_detail(
    State(state): State<OpsState>,
    auth: Auth,
    Path(id): Path<String>,
    Query(page): Query<PageParams>,
) -> Result<Json<Value>, ApiError> {
    let principal = auth.require(Scope::OpsRead)?;
    let (limit, offset) = page.resolve()?;
    let id = parse_job_id(&id)?;
    let job = load_job(&state, principal, id).await?;
    let ledger = &state.ledger;
    let history = ledger.history("job", &id.to_string()).await?;
    let mut receipts = Vec::new();
    for receipt in ledger.receipts(id).await? {
        let trail = ledger
            .history("receipt", &format!("{id}/{}", receipt.backend))
            .await?;
        receipts.push(json!({ "receipt": receipt, "history": trail }));
    }
    // A sync run names a connector, not a source or a revision.
    let (source, revision, timeline) = match job.revision_id {
        Some(revision_id) => (
            ledger.source(&job.dataset, &job.source_key).await?,
            ledger.revision(revision_id).await?,
            Some(ledger.timeline(&job.dataset, &job.source_key).await?),
        ),
        None => (None, None, None),
    };
    // Validity time: the assertions, and which revision holds when as believed now.
    let timeline = timeline.map(|timeline| {
        let mut believed: Vec<_> = timeline
            .rectangles
            .iter()
            .filter(|rectangle| rectangle.recorded_to == receipts::validity::OPEN)
            .map(|rectangle| {
                json!({
                    "revision_id": rectangle.revision_id,
                    "tombstone": timeline.tombstones.contains(&rectangle.revision_id),
                    "valid_from": rectangle.valid.from,
                    "valid_to": (rectangle.valid.to != receipts::validity::OPEN)
                        .then_some(rectangle.valid.to),
                    "believed_since": rectangle.recorded_from,
                })
            })
            .collect();
        believed.sort_by_key(|period| period["valid_from"].as_i64());
        json!({ "assertions": timeline.assertions, "held": believed })
    });
    let now = ledger.clock_now();
    let mut detail = json!({
        "now": now,
        "job": JobView::of(job, now),
        "history": history,
        "receipts": receipts,
        "revision": revision.map(|detail| json!({
            "revision": detail.revision,
            "is_head": detail.is_head,
        })),
        "source": source.map(|source| json!({
            "dataset": source.dataset,
            "source_key": source.source_key,
            "head_revision_id": source.head.id,
            "deleted": source.deleted,
            "revisions": source.revisions,
            "head_history": source.head_history,
            "timeline": timeline,
        })),
    });
    // Lists that grow with every retry or revision come newest first, one page at a time.
    page_newest_first(&mut detail, "history", (limit, offset), false);
    if let Some(source) = detail.get_mut("source") {
        page_newest_first(source, "revisions", (limit, offset), true);
        page_newest_first(source, "head_history", (limit, offset), false);
        if let Some(timeline) = source.get_mut("timeline") {
            page_newest_first(timeline, "assertions", (limit, offset), false);
        }
    }
    Ok(Json(detail))
}

/// The body of a one-job action.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    /// Why (recorded in history); at most 500 printable characters.
    #[schema(schema_with = nullable_reason)]
    reason: Option<String>,
}

/// `schema`, or `null` (a body field that may be null).
pub(crate) fn nullable(
    mut schema: utoipa::openapi::schema::Object,
) -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{SchemaType, Type};
    schema.schema_type = SchemaType::from_iter([Type::String, Type::Null]);
    schema
}

fn nullable_dataset() -> utoipa::openapi::schema::Object {
    nullable(dataset_or_empty())
}

fn nullable_error_code() -> utoipa::openapi::schema::Object {
    nullable(error_code_schema())
}

fn nullable_q() -> utoipa::openapi::schema::Object {
    nullable(q_schema())
}

/// An optional reason: `null`, or at most 500 printable characters (empty or absent: the
/// action's default reason).
pub(crate) fn nullable_reason() -> utoipa::openapi::schema::Object {
    nullable(receipts::http::text_schema(
        receipts::validate::MAX_REASON_CHARS,
        "Why (recorded in history); at most 500 printable characters.",
    ))
}

pub(crate) use receipts::http::reason;

/// A JSON body that may be left out entirely (no body: every field's default).
pub(crate) async fn optional_body<T: Default + serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
) -> Result<T, ApiError> {
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES + 1)
        .await
        .map_err(|_| invalid("invalid_json", "the request body could not be read"))?;
    // No body, or `null`: every field's default.
    if bytes.iter().all(u8::is_ascii_whitespace) || bytes.trim_ascii() == b"null" {
        return Ok(T::default());
    }
    read_json(headers, Body::from(bytes), MAX_BODY_BYTES).await
}

/// Which action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Put a dead, cancelled or quarantined job back in the queue.
    Requeue,
    /// Cancel a waiting job, or ask a running one to stop.
    Cancel,
}

impl Action {
    fn applies_to(self) -> &'static str {
        match self {
            Action::Requeue => "requeue applies to jobs that are",
            Action::Cancel => "cancel applies to jobs that are",
        }
    }

    fn states(self) -> &'static [JobState] {
        match self {
            Action::Requeue => &DEAD_STATES,
            Action::Cancel => &[JobState::Pending, JobState::RetryWait, JobState::Running],
        }
    }

    async fn apply(
        self,
        state: &OpsState,
        id: Uuid,
        actor: &str,
        reason: &str,
    ) -> Result<Job, LedgerError> {
        match self {
            Action::Requeue => state.ledger.requeue(id, actor, reason).await,
            Action::Cancel => state.ledger.cancel(id, actor, reason).await,
        }
    }
}

async fn one(
    state: OpsState,
    auth: Auth,
    id: String,
    headers: HeaderMap,
    body: Body,
    action: Action,
) -> Result<Json<Value>, ApiError> {
    let principal = auth.require(Scope::OpsWrite)?;
    let id = parse_job_id(&id)?;
    let body: ActionBody = optional_body(&headers, body).await?;
    let reason = reason(body.reason, "operator action from the ops API")?;
    load_job(&state, principal, id).await?;
    let job = action
        .apply(&state, id, &principal.actor(), &reason)
        .await?;
    tracing::info!(job_id = %id, action = ?action, actor = %principal.actor(), %reason, state = %job.state, "operator action");
    Ok(Json(
        json!({ "job": JobView::of(job, state.ledger.clock_now()) }),
    ))
}

/// `POST /v1/ops/jobs/{id}/requeue`.
#[utoipa::path(post, path = "/v1/ops/jobs/{id}/requeue", tag = "ops", security(("bearer" = [])), params(("id" = uuid::Uuid, Path, description = "Job id")), request_body(content = Option<ActionBody>, content_type = "application/json", description = "May be left out."), responses((status = 200, description = "Requeues a dead, quarantined or cancelled job.", body = Object), ApiErrors))]
pub async fn requeue_one(
    State(state): State<OpsState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    one(state, auth, id, headers, body, Action::Requeue).await
}

/// `POST /v1/ops/jobs/{id}/cancel`.
#[utoipa::path(post, path = "/v1/ops/jobs/{id}/cancel", tag = "ops", security(("bearer" = [])), params(("id" = uuid::Uuid, Path, description = "Job id")), request_body(content = Option<ActionBody>, content_type = "application/json", description = "May be left out."), responses((status = 200, description = "Cancels a waiting or running job.", body = Object), ApiErrors))]
pub async fn cancel_one(
    State(state): State<OpsState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    one(state, auth, id, headers, body, Action::Cancel).await
}

/// The body of a bulk action: a filter, a dry-run switch and a reason.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkBody {
    /// States to act on (default: every state the action applies to).
    states: Option<Vec<String>>,
    /// Only this dataset (empty: every dataset the token may touch).
    dataset: Option<String>,
    /// Only jobs whose last error has this code.
    error_code: Option<String>,
    /// Source key text, or a job or revision id.
    q: Option<String>,
    /// Only list the candidates; change nothing.
    #[serde(default)]
    dry_run: bool,
    /// Why (recorded in history); at most 500 printable characters.
    reason: Option<String>,
}

/// `null`, or a list of states among `states`.
fn states_list(states: &[JobState]) -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    let names: Vec<&str> = states.iter().map(|state| state.as_str()).collect();
    utoipa::openapi::schema::ArrayBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(names)),
        )
        .description(Some(
            "States to act on (default: every state the action applies to).",
        ))
        .build()
}

fn requeue_states() -> utoipa::openapi::schema::Array {
    states_list(Action::Requeue.states())
}

fn cancel_states() -> utoipa::openapi::schema::Array {
    states_list(Action::Cancel.states())
}

/// The body of a bulk action, for the document: [`BulkBody`] with the states the action
/// applies to.
macro_rules! bulk_body {
    ($name:ident, $states:expr) => {
        #[derive(Deserialize, utoipa::ToSchema)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct $name {
            #[schema(schema_with = $states)]
            states: Option<Vec<String>>,
            /// Only this dataset (empty: every dataset the token may touch).
            #[schema(schema_with = nullable_dataset)]
            dataset: Option<String>,
            /// Only jobs whose last error has this code.
            #[schema(schema_with = nullable_error_code)]
            error_code: Option<String>,
            /// Source key text, or a job or revision id.
            #[schema(schema_with = nullable_q)]
            q: Option<String>,
            /// Only list the candidates; change nothing (default false).
            #[schema(required = false)]
            dry_run: bool,
            /// Why (recorded in history); at most 500 printable characters.
            #[schema(schema_with = nullable_reason)]
            reason: Option<String>,
        }
    };
}
bulk_body!(RequeueBody, requeue_states);
bulk_body!(CancelBody, cancel_states);

async fn bulk(
    state: OpsState,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
    action: Action,
) -> Result<Json<Value>, ApiError> {
    let body: BulkBody = read_json(&headers, body, MAX_BODY_BYTES).await?;
    // A dry run only reads.
    let principal = if body.dry_run {
        auth.require_any(&[Scope::OpsRead, Scope::OpsWrite])?
    } else {
        auth.require(Scope::OpsWrite)?
    };
    // No states (or an empty list): every state the action applies to.
    let requested = match &body.states {
        Some(names) => parse_states(&names.join(","))?,
        None => Vec::new(),
    };
    let states = states_within(requested, action.states(), action.applies_to())?;
    let dataset = dataset_for(body.dataset, principal)?;
    let mut filter = JobFilter {
        states,
        dataset,
        allowed_datasets: principal.datasets.clone(),
        text: parse_text(body.q)?,
        error_code: parse_error_code(body.error_code)?,
        order: JobOrder::RecentlyChanged,
        limit: receipts::operations::MAX_PAGE,
        offset: 0,
        readable_by: principal.reads_as(),
    };
    let reason = reason(body.reason, "bulk operator action from the ops API")?;
    // The candidates, at most MAX_BULK of them.
    let mut candidates = Vec::new();
    let total = loop {
        let page = state.ledger.find_jobs(&filter).await?;
        let done = page.jobs.len() < filter.limit as usize;
        candidates.extend(page.jobs);
        if done || candidates.len() >= MAX_BULK {
            break page.total;
        }
        filter.offset += filter.limit;
    };
    candidates.truncate(MAX_BULK);
    let listed: Vec<Value> = candidates
        .iter()
        .map(|job| {
            json!({
                "id": job.id,
                "dataset": job.dataset,
                "source_key": job.source_key,
                "state": job.state,
                "last_error_code": job.last_error_code,
            })
        })
        .collect();
    if body.dry_run {
        return Ok(Json(json!({
            "dry_run": true,
            "action": action,
            "matched": total,
            "candidates": listed,
            "truncated": (total as usize) > candidates.len(),
        })));
    }
    let actor = principal.actor();
    let mut done = Vec::new();
    let mut failed = Vec::new();
    for job in &candidates {
        match action.apply(&state, job.id, &actor, &reason).await {
            Ok(changed) => done.push(json!({ "id": changed.id, "state": changed.state })),
            Err(error) => failed.push(json!({
                "id": job.id,
                "code": error.code(),
                "message": error.public_message(),
            })),
        }
    }
    tracing::info!(action = ?action, %actor, %reason, matched = total, done = done.len(), failed = failed.len(), "bulk operator action");
    Ok(Json(json!({
        "dry_run": false,
        "action": action,
        "matched": total,
        "candidates": listed,
        "done": done,
        "failed": failed,
        "truncated": (total as usize) > candidates.len(),
    })))
}

/// `POST /v1/ops/requeue`: requeue by filter (`dry_run: true` lists the exact candidates).
#[utoipa::path(post, path = "/v1/ops/requeue", tag = "ops", security(("bearer" = [])), request_body(content = RequeueBody, content_type = "application/json"), responses((status = 200, description = "Requeues every job matching a filter (or lists them, with dry_run).", body = Object), ApiErrors))]
pub async fn requeue_bulk(
    State(state): State<OpsState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    bulk(state, auth, headers, body, Action::Requeue).await
}

/// `POST /v1/ops/cancel`: cancel by filter (`dry_run: true` lists the exact candidates).
#[utoipa::path(post, path = "/v1/ops/cancel", tag = "ops", security(("bearer" = [])), request_body(content = CancelBody, content_type = "application/json"), responses((status = 200, description = "Cancels every job matching a filter (or lists them, with dry_run).", body = Object), ApiErrors))]
pub async fn cancel_bulk(
    State(state): State<OpsState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    bulk(state, auth, headers, body, Action::Cancel).await
}

/// The body of a pause or resume.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    /// The dataset (absent or empty: every dataset).
    #[schema(schema_with = nullable_dataset)]
    dataset: Option<String>,
    /// Why (recorded in history); at most 500 printable characters.
    #[schema(schema_with = nullable_reason)]
    reason: Option<String>,
}

async fn pause_or_resume(
    state: OpsState,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
    pause: bool,
) -> Result<Json<Value>, ApiError> {
    let principal = auth.require(Scope::OpsWrite)?;
    let body: PauseBody = optional_body(&headers, body).await?;
    let dataset = parse_dataset(body.dataset)?;
    match &dataset {
        Some(dataset) => principal.require_dataset(dataset)?,
        // Every dataset: only a token that may touch every dataset.
        None if principal.datasets.is_some() => {
            return Err(ApiError::from(receipts::auth::Denied::Dataset(
                "*".to_owned(),
            )))
        }
        None => {}
    }
    let actor = principal.actor();
    if pause {
        let reason = reason(body.reason, "paused from the ops API")?;
        state
            .ledger
            .pause(dataset.as_deref(), &actor, &reason)
            .await?;
    } else {
        let reason = reason(body.reason, "resumed from the ops API")?;
        state
            .ledger
            .resume(dataset.as_deref(), &actor, &reason)
            .await?;
    }
    tracing::info!(dataset = dataset.as_deref().unwrap_or("*"), %actor, pause, "claiming paused or resumed");
    let activity = state.ledger.activity(Duration::from_secs(60)).await?;
    let by_dataset: BTreeMap<String, &receipts::Pause> = activity
        .pauses
        .iter()
        .map(|pause| {
            (
                pause.dataset.clone().unwrap_or_else(|| "*".to_owned()),
                pause,
            )
        })
        .collect();
    Ok(Json(json!({ "pauses": by_dataset })))
}

/// `POST /v1/ops/pause`: stop claiming (one dataset or all).
#[utoipa::path(post, path = "/v1/ops/pause", tag = "ops", security(("bearer" = [])), request_body(content = Option<PauseBody>, content_type = "application/json", description = "May be left out."), responses((status = 200, description = "Stops claiming in one dataset, or in all.", body = Object), ApiErrors))]
pub async fn pause(
    State(state): State<OpsState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    pause_or_resume(state, auth, headers, body, true).await
}

/// `POST /v1/ops/resume`: claim again.
#[utoipa::path(post, path = "/v1/ops/resume", tag = "ops", security(("bearer" = [])), request_body(content = Option<PauseBody>, content_type = "application/json", description = "May be left out."), responses((status = 200, description = "Claims again.", body = Object), ApiErrors))]
pub async fn resume(
    State(state): State<OpsState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    pause_or_resume(state, auth, headers, body, false).await
}
