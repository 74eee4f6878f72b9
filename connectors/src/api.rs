//! The connectors' API: create, list, show, run now, pause, resume and remove, every change
//! through [`receipts::Connectors::change_connector`] (so history records who and why).
//!
//! ## Who may do what
//! - Creating a connector for a dataset needs what ingesting into it needs: scope `ingest`
//!   and the dataset in the token's allowlist.
//! - Changing one (run, pause, resume, remove) needs `ingest` or `ops:write`, reading one
//!   `ingest` or `ops:read`, with its dataset in the allowlist; listings show only the
//!   datasets the token may read.
//! - A folder or a local repository is read only inside the configured roots
//!   ([`ConnectorSettings::folder_roots`], none by default): no token, admin included, can
//!   make cairn read a file elsewhere. A remote repository is fetched only from a host in
//!   `connectors.remote_hosts` ([`crate::remote`]), none by default.

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRef, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use receipts::auth::Principal;
use receipts::http::{read_json, reason, ApiError, ApiErrors, Auth};
use receipts::model::{
    Connector, ConnectorAccess, ConnectorChange, ConnectorChanged, ConnectorCommand, ConnectorKind,
    NewConnector, Removal, SyncRun,
};
use receipts::{Scope, SyncLedger, Tokens};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use uuid::Uuid;

use crate::confine::Roots;
use crate::Selection;

/// Largest request body the connectors' API reads.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// Default size limit per file.
pub const DEFAULT_MAX_FILE_BYTES: i64 = 10 << 20;
/// Default interval between runs (10 minutes).
pub const DEFAULT_INTERVAL_MS: i64 = 600_000;
/// Runs `GET /v1/connectors/{id}` shows.
const RECENT_RUNS: u32 = 10;

/// What the connectors' API allows beyond the tokens' scopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorSettings {
    /// Folders connectors may read, as absolute paths: a connector's folder or repository
    /// must be one of them or inside one. Empty: every connector is refused.
    pub folder_roots: Vec<PathBuf>,
    /// Remote repositories: the hosts they may be fetched from (none by default), where
    /// mirrors and credentials are kept, and each fetch's limits.
    pub remote: crate::remote::RemoteSettings,
}

impl ConnectorSettings {
    /// The roots, as the API and the runner check them.
    pub fn roots(&self) -> Roots {
        Roots::new(self.folder_roots.clone())
    }
}

/// State of the connectors' handlers.
#[derive(Debug, Clone)]
pub struct ConnectorsState {
    ledger: Arc<dyn SyncLedger>,
    settings: Arc<ConnectorSettings>,
}

impl FromRef<ConnectorsState> for Arc<dyn Tokens> {
    fn from_ref(state: &ConnectorsState) -> Self {
        state.ledger.clone()
    }
}

/// The connectors' routes with their OpenAPI description.
pub fn routes(ledger: Arc<dyn SyncLedger>, settings: ConnectorSettings) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(utoipa_axum::routes!(list_connectors, create_connector))
        .routes(utoipa_axum::routes!(get_connector, remove_connector))
        .routes(utoipa_axum::routes!(run_connector))
        .routes(utoipa_axum::routes!(pause_connector))
        .routes(utoipa_axum::routes!(resume_connector))
        .routes(utoipa_axum::routes!(hook_connector))
        .with_state(ConnectorsState {
            ledger,
            settings: Arc::new(settings),
        })
}

/// A connector to create.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    /// The dataset it keeps (the token must be allowed to ingest into it).
    #[schema(min_length = 1, max_length = 128)]
    dataset: String,
    /// `folder`, or `git` (a repository on the workers' machines, read without a work tree,
    /// or a remote one, fetched into a mirror at every run).
    kind: ConnectorKind,
    /// The folder's or the repository's absolute path, inside a configured root; or a remote
    /// repository's URL (`https://`, `http://`, `ssh://`, `user@host:path`, `git://`) on a
    /// host in `connectors.remote_hosts`, without credentials.
    #[schema(min_length = 1, max_length = 4096)]
    location: String,
    /// A remote repository's credentials: the name of a file in the workers'
    /// `connectors.credentials_dir` (a token, basic credentials, or an SSH key with its
    /// `known_hosts`). Absent: the workers' `CAIRN_GIT_*` environment, or none.
    #[schema(max_length = 255)]
    credentials: Option<String>,
    /// The git ref (a branch, a tag or a commit id): required for git, refused for a folder.
    #[serde(rename = "ref")]
    git_ref: Option<String>,
    /// Globs over the key a file must match (absent or empty: every file).
    #[serde(default)]
    #[schema(max_items = 64)]
    include: Vec<String>,
    /// Globs over the key that leave a file out.
    #[serde(default)]
    #[schema(max_items = 64)]
    exclude: Vec<String>,
    /// Largest file read, in bytes (default 10 MiB).
    #[schema(minimum = 1, maximum = 1073741824)]
    max_file_bytes: Option<i64>,
    /// Time between runs in milliseconds (1 s to 366 days; default 10 minutes).
    #[schema(minimum = 1000, maximum = 31622400000_i64)]
    interval_ms: Option<i64>,
    /// Who may read the files it keeps, computed at every run apart from their content:
    /// `readers` for every file, `from: posix` (a folder: owner, group, mode bits and ACL),
    /// `file` (git: a rules file in the repository). Absent: the connector leaves access alone.
    #[serde(default)]
    access: ConnectorAccess,
    /// Why (recorded in history).
    #[schema(max_length = 500)]
    reason: Option<String>,
}

/// A connector with its open run and latest runs.
#[derive(Debug, Serialize, ToSchema)]
struct ConnectorView {
    connector: Connector,
    /// The latest runs, newest first, with their reports.
    runs: Vec<SyncRun>,
    /// Its state changes, oldest first: who, why, when.
    history: Vec<receipts::HistoryEntry>,
}

/// A connector with its open run and its last ended run.
#[derive(Debug, Serialize, ToSchema)]
struct ConnectorSummary {
    connector: Connector,
    /// The run waiting or running now (`run_at` is when the next one starts).
    open_run: Option<receipts::Job>,
    /// The last run that ended, with its report.
    last_run: Option<SyncRun>,
}

/// Every connector the token may read.
#[derive(Debug, Serialize, ToSchema)]
struct ConnectorList {
    connectors: Vec<ConnectorSummary>,
}

/// `reason` for a change; `tombstone` for a removal.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct ChangeQuery {
    /// Why (recorded in history); at most 500 characters.
    #[param(max_length = 500)]
    reason: Option<String>,
    /// Removal only: tombstone every source the connector created (default: keep them).
    tombstone: Option<bool>,
}

fn connector_id(text: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(text).map_err(|_| {
        ApiError::not_found(
            "connector_not_found",
            format!("no connector has id `{text}`"),
        )
    })
}

fn change_query(
    query: Result<Query<ChangeQuery>, QueryRejection>,
) -> Result<ChangeQuery, ApiError> {
    let Query(query) = query
        .map_err(|rejection| ApiError::unprocessable("invalid_query", rejection.body_text()))?;
    Ok(query)
}

/// Whether a connector of `kind` may read `location`: inside a root, and for a repository that
/// exists here, every place it reads from inside the roots too ([`crate::git::open`]). A
/// location that does not exist here is admitted: every run checks it again when it opens it.
async fn admit(
    settings: &ConnectorSettings,
    kind: ConnectorKind,
    location: &str,
) -> Result<(), ApiError> {
    let refused = |message: String| ApiError::unprocessable("location_refused", message);
    if crate::remote::is_remote(location) {
        if kind != ConnectorKind::Git {
            return Err(refused(format!(
                "a {kind} connector reads a local path; `{location}` is a URL"
            )));
        }
        let url = crate::remote::RemoteUrl::parse(location)
            .map_err(|error| refused(error.to_string()))?;
        if !url.admitted_by(&settings.remote.hosts) {
            return Err(refused(format!(
                "the host `{}` is not in connectors.remote_hosts",
                url.host()
            )));
        }
        return Ok(());
    }
    let roots = &settings.roots();
    roots
        .admit(location)
        .map_err(|refusal| refused(refusal.to_string()))?;
    if kind != ConnectorKind::Git {
        return Ok(());
    }
    let (roots, location) = (roots.clone(), location.to_owned());
    let opened = tokio::task::spawn_blocking(move || crate::git::open(&roots, &location))
        .await
        .map_err(|error| {
            tracing::error!(%error, "checking a repository panicked");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                "internal error; see the server log",
            )
        })?;
    match opened {
        Err(error @ crate::git::GitError::Refused { .. }) => Err(refused(error.to_string())),
        _ => Ok(()),
    }
}

/// The connector `id`, if the token may see its dataset.
async fn visible(
    state: &ConnectorsState,
    principal: &Principal,
    id: &str,
) -> Result<Connector, ApiError> {
    let id = connector_id(id)?;
    let absent = || ApiError::not_found("connector_not_found", format!("connector {id} not found"));
    let connector = state.ledger.connector(id).await?.ok_or_else(absent)?;
    // A connector of a dataset the token may not read is answered as absent, as revisions
    // and jobs are: the answer names no dataset the token cannot see.
    if principal.require_dataset(&connector.dataset).is_err() {
        return Err(absent());
    }
    Ok(connector)
}

fn changed(status: StatusCode, changed: ConnectorChanged) -> Response {
    (status, Json(changed)).into_response()
}

/// `GET /v1/connectors`: every connector the token may read, newest first.
#[utoipa::path(get, path = "/v1/connectors", tag = "connectors", security(("bearer" = [])),
    responses((status = 200, description = "Connectors, removed ones too, newest first, each with its open run and its last ended run.", body = ConnectorList), ApiErrors))]
async fn list_connectors(
    State(state): State<ConnectorsState>,
    auth: Auth,
) -> Result<Response, ApiError> {
    let principal = auth.require_any(&[Scope::Ingest, Scope::OpsRead])?;
    let mut connectors = Vec::new();
    for connector in state.ledger.connectors().await? {
        if principal.require_dataset(&connector.dataset).is_err() {
            continue;
        }
        // At most one run is open, so the two newest hold it and the last that ended.
        let runs = state.ledger.sync_runs(connector.id, 2).await?;
        let (open, ended): (Vec<SyncRun>, Vec<SyncRun>) = runs
            .into_iter()
            .partition(|run| !run.job.state.is_terminal());
        connectors.push(ConnectorSummary {
            connector,
            open_run: open.into_iter().next().map(|run| run.job),
            last_run: ended.into_iter().next(),
        });
    }
    Ok(Json(ConnectorList { connectors }).into_response())
}

/// `POST /v1/connectors`: a connector, active at once; its first run is queued now.
#[utoipa::path(post, path = "/v1/connectors", tag = "connectors", security(("bearer" = [])),
    request_body(content = CreateBody, content_type = "application/json"),
    responses((status = 201, description = "Created; `run` is its first run.", body = ConnectorChanged), ApiErrors))]
async fn create_connector(
    State(state): State<ConnectorsState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::Ingest)?;
    let body: CreateBody = read_json(&headers, body, MAX_BODY_BYTES).await?;
    receipts::validate::dataset(&body.dataset)?;
    principal.require_dataset(&body.dataset)?;
    // The roots are checked here and again, beneath the root, at every read of every run.
    admit(&state.settings, body.kind, &body.location).await?;
    // Globs compile with the code that runs them: a bad one is refused now, not at each run.
    let limit = body.max_file_bytes.unwrap_or(DEFAULT_MAX_FILE_BYTES).max(0) as u64;
    if let Err(error) = Selection::new(&body.include, &body.exclude, limit) {
        return Err(ApiError::unprocessable(
            "invalid_connector",
            error.to_string(),
        ));
    }
    let reason = reason(body.reason, "created through the API")?;
    let created = state
        .ledger
        .change_connector(ConnectorCommand {
            change: ConnectorChange::Create(NewConnector {
                dataset: body.dataset,
                kind: body.kind,
                location: body.location,
                git_ref: body.git_ref,
                include: body.include,
                exclude: body.exclude,
                max_file_bytes: body.max_file_bytes.unwrap_or(DEFAULT_MAX_FILE_BYTES),
                interval_ms: body.interval_ms.unwrap_or(DEFAULT_INTERVAL_MS),
                access: body.access,
                credentials: body.credentials,
            }),
            actor: principal.actor(),
            reason,
        })
        .await?;
    tracing::info!(connector = %created.connector.id, dataset = %created.connector.dataset, location = %created.connector.location, actor = %principal.actor(), "connector created");
    Ok(changed(StatusCode::CREATED, created))
}

/// `GET /v1/connectors/{id}`: a connector and its latest runs with their reports.
#[utoipa::path(get, path = "/v1/connectors/{id}", tag = "connectors", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Connector id")),
    responses((status = 200, description = "The connector, its latest runs (newest first) and its state changes.", body = ConnectorView), ApiErrors))]
async fn get_connector(
    State(state): State<ConnectorsState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let principal = auth.require_any(&[Scope::Ingest, Scope::OpsRead])?;
    let connector = visible(&state, principal, &id).await?;
    let runs = state.ledger.sync_runs(connector.id, RECENT_RUNS).await?;
    let history = state
        .ledger
        .history("connector", &connector.id.to_string())
        .await?;
    Ok(Json(ConnectorView {
        connector,
        runs,
        history,
    })
    .into_response())
}

/// The change `make` builds for a connector the token may change.
async fn change(
    state: &ConnectorsState,
    auth: &Auth,
    id: &str,
    query: Result<Query<ChangeQuery>, QueryRejection>,
    make: impl FnOnce(Uuid, &ChangeQuery) -> Result<ConnectorChange, ApiError>,
    default_reason: &str,
) -> Result<Response, ApiError> {
    let principal = auth.require_any(&[Scope::Ingest, Scope::OpsWrite])?;
    let query = change_query(query)?;
    let connector = visible(state, principal, id).await?;
    let change = make(connector.id, &query)?;
    let done = state
        .ledger
        .change_connector(ConnectorCommand {
            change,
            actor: principal.actor(),
            reason: reason(query.reason, default_reason)?,
        })
        .await?;
    tracing::info!(connector = %done.connector.id, state = %done.connector.state, actor = %principal.actor(), "connector changed");
    Ok(changed(StatusCode::OK, done))
}

fn no_tombstone(query: &ChangeQuery) -> Result<(), ApiError> {
    if query.tombstone.is_some() {
        return Err(ApiError::unprocessable(
            "invalid_query",
            "`tombstone` applies to a removal only",
        ));
    }
    Ok(())
}

/// `POST /v1/connectors/{id}/run`: run now (its waiting run becomes due, or one is queued).
#[utoipa::path(post, path = "/v1/connectors/{id}/run", tag = "connectors", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Connector id"), ChangeQuery),
    responses((status = 200, description = "`run` is the run that is now due (or running).", body = ConnectorChanged), ApiErrors))]
async fn run_connector(
    State(state): State<ConnectorsState>,
    auth: Auth,
    Path(id): Path<String>,
    query: Result<Query<ChangeQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    change(
        &state,
        &auth,
        &id,
        query,
        |id, query| no_tombstone(query).map(|()| ConnectorChange::RunNow { id, delivery: None }),
        "run now through the API",
    )
    .await
}

/// `POST /v1/connectors/{id}/pause`: no more runs until resumed (a waiting run is cancelled,
/// a running one asked to stop).
#[utoipa::path(post, path = "/v1/connectors/{id}/pause", tag = "connectors", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Connector id"), ChangeQuery),
    responses((status = 200, description = "Paused.", body = ConnectorChanged), ApiErrors))]
async fn pause_connector(
    State(state): State<ConnectorsState>,
    auth: Auth,
    Path(id): Path<String>,
    query: Result<Query<ChangeQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    change(
        &state,
        &auth,
        &id,
        query,
        |id, query| no_tombstone(query).map(|()| ConnectorChange::Pause { id }),
        "paused through the API",
    )
    .await
}

/// `POST /v1/connectors/{id}/resume`: active again; a run is queued now.
#[utoipa::path(post, path = "/v1/connectors/{id}/resume", tag = "connectors", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Connector id"), ChangeQuery),
    responses((status = 200, description = "Active again.", body = ConnectorChanged), ApiErrors))]
async fn resume_connector(
    State(state): State<ConnectorsState>,
    auth: Auth,
    Path(id): Path<String>,
    query: Result<Query<ChangeQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    change(
        &state,
        &auth,
        &id,
        query,
        |id, query| no_tombstone(query).map(|()| ConnectorChange::Resume { id }),
        "resumed through the API",
    )
    .await
}

/// `DELETE /v1/connectors/{id}`: removed for good. Its sources stay (owned by nobody), or with
/// `tombstone=true` a last run tombstones every one of them.
#[utoipa::path(delete, path = "/v1/connectors/{id}", tag = "connectors", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Connector id"), ChangeQuery),
    responses((status = 200, description = "Removed; with `tombstone`, `run` is the last run.", body = ConnectorChanged), ApiErrors))]
async fn remove_connector(
    State(state): State<ConnectorsState>,
    auth: Auth,
    Path(id): Path<String>,
    query: Result<Query<ChangeQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    change(
        &state,
        &auth,
        &id,
        query,
        |id, query| {
            Ok(ConnectorChange::Remove {
                id,
                removal: if query.tombstone == Some(true) {
                    Removal::Tombstone
                } else {
                    Removal::Keep
                },
            })
        },
        "removed through the API",
    )
    .await
}

/// What a push hook did.
#[derive(Debug, Serialize, ToSchema)]
struct HookAnswer {
    /// `run_due` (the run is due now, or already running), `ignored` (another ref or event),
    /// or `duplicate` (this delivery was taken already; nothing changed).
    outcome: &'static str,
    /// Why, for `ignored` and `duplicate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// The run that is due, for `run_due`.
    #[serde(skip_serializing_if = "Option::is_none")]
    run: Option<receipts::Job>,
}

fn hook_answer(
    status: StatusCode,
    outcome: &'static str,
    reason: Option<String>,
    run: Option<receipts::Job>,
) -> Response {
    (
        status,
        Json(HookAnswer {
            outcome,
            reason,
            run,
        }),
    )
        .into_response()
}

/// `POST /v1/connectors/{id}/hook`: a push webhook from GitHub (`X-Hub-Signature-256`),
/// GitLab (`X-Gitlab-Token`), Gitea or Forgejo (`X-Gitea-Signature`), verified with the
/// connector's `hook_secret` (in its credentials file). A push to the connector's ref makes its
/// run due now; other refs and events are ignored with the reason; a delivery already taken
/// changes nothing. No bearer token: the signature is the credential.
#[utoipa::path(post, path = "/v1/connectors/{id}/hook", tag = "connectors",
    // No bearer token: the provider's signature (X-Hub-Signature-256, X-Gitea-Signature,
    // X-Forgejo-Signature or X-Gitlab-Token) over the body is the credential.
    security(()),
    params(("id" = uuid::Uuid, Path, description = "Connector id")),
    request_body(content = serde_json::Value, content_type = "application/json", description = "The provider's push payload, as it sent it."),
    responses(
        (status = 202, description = "A push to the connector's ref: its run is due now.", body = HookAnswer),
        (status = 200, description = "Ignored (another ref or event) or a duplicate delivery: nothing changed.", body = HookAnswer),
        ApiErrors))]
async fn hook_connector(
    State(state): State<ConnectorsState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let id = connector_id(&id)?;
    let absent = || {
        ApiError::not_found(
            "connector_not_found",
            format!("no git connector has id {id}"),
        )
    };
    let connector = state.ledger.connector(id).await?.ok_or_else(absent)?;
    if connector.kind != ConnectorKind::Git {
        return Err(absent());
    }
    let body = receipts::http::read_json_body(&headers, body, crate::hooks::MAX_HOOK_BYTES).await?;
    let unverified = |code: &str, message: String| {
        metrics::counter!("cairn_connector_hooks_total", "outcome" => "refused").increment(1);
        tracing::warn!(connector = %id, code, %message, "push hook refused");
        ApiError::new(StatusCode::UNAUTHORIZED, code, message)
    };
    let settings = state.settings.clone();
    let name = connector.credentials.clone();
    let credentials = tokio::task::spawn_blocking(move || {
        crate::remote::credentials(&settings.remote, name.as_deref())
    })
    .await
    .map_err(|error| {
        tracing::error!(%error, "reading a connector's credentials panicked");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "internal error; see the server log",
        )
    })?;
    let secret = match credentials {
        Ok(credentials) => credentials.hook_secret,
        Err(error) => {
            tracing::warn!(connector = %id, %error, "a push hook's secret cannot be read");
            None
        }
    };
    let Some(secret) = secret.filter(|secret| !secret.is_empty()) else {
        return Err(unverified(
            "hook_not_configured",
            format!(
                "connector {id} holds no hook secret: set hook_secret in the credentials file \
                 it names (connectors.credentials_dir)"
            ),
        ));
    };
    let delivery =
        crate::hooks::verify(&headers, &body, &secret).map_err(|refusal| match refusal {
            crate::hooks::Refusal::NotJson(_) => {
                ApiError::unprocessable("invalid_json", refusal.to_string())
            }
            _ => unverified("hook_signature_invalid", refusal.to_string()),
        })?;
    let provider = delivery.provider.as_str();
    let ignored = |reason: String| {
        metrics::counter!("cairn_connector_hooks_total", "outcome" => "ignored").increment(1);
        tracing::info!(connector = %id, provider, %reason, "push hook ignored");
        Ok(hook_answer(StatusCode::OK, "ignored", Some(reason), None))
    };
    if !delivery.push {
        return ignored(format!(
            "a `{}` event starts no run; only pushes do",
            delivery.event
        ));
    }
    let reference = connector.git_ref.clone().unwrap_or_default();
    let Some(pushed) = delivery.reference.clone() else {
        return ignored("the push names no ref".to_owned());
    };
    if !crate::hooks::moves(&reference, &pushed) {
        return ignored(format!(
            "a push to `{pushed}`; the connector follows `{reference}`"
        ));
    }
    let Some(delivery_id) = delivery.id.clone() else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "hook_delivery_missing",
            "the delivery carries no delivery id (X-GitHub-Delivery, X-Gitlab-Event-UUID, \
             X-Gitea-Delivery): deliveries are deduplicated by it",
        ));
    };
    let after = delivery
        .after
        .as_deref()
        .map(|commit| format!(" (commit {})", commit.chars().take(40).collect::<String>()))
        .unwrap_or_default();
    let changed = state
        .ledger
        .change_connector(ConnectorCommand {
            change: ConnectorChange::RunNow {
                id,
                delivery: Some(format!(
                    "{provider}:{}",
                    delivery_id.chars().take(180).collect::<String>()
                )),
            },
            actor: format!("hook:{provider}"),
            reason: format!(
                "push to {}{after}, delivery {}",
                crate::hooks::shown(&pushed, 200),
                crate::hooks::shown(&delivery_id, 100)
            ),
        })
        .await;
    match changed {
        Ok(changed) => {
            metrics::counter!("cairn_connector_hooks_total", "outcome" => "run_due").increment(1);
            tracing::info!(connector = %id, provider, pushed = %pushed, delivery = %delivery_id, "push hook made the run due");
            Ok(hook_answer(
                StatusCode::ACCEPTED,
                "run_due",
                None,
                changed.run,
            ))
        }
        Err(error) if error.code() == "duplicate_delivery" => {
            metrics::counter!("cairn_connector_hooks_total", "outcome" => "duplicate").increment(1);
            Ok(hook_answer(
                StatusCode::OK,
                "duplicate",
                Some(error.to_string()),
                None,
            ))
        }
        Err(error) => Err(error.into()),
    }
}
