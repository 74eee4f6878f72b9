//! The backup API (scope `admin`: a backup holds every document and token hash):
//! - `POST /v1/backups` starts a backup into the configured backup folder, in the background;
//! - `GET /v1/backups` lists this process's backups, with each manifest once written.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{FromRef, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gateways::VectorStores;
use receipts::http::{from_object, read_json_body, reason, ApiError, ApiErrors, Auth};
use receipts::{Ledger, Scope, Tokens};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;

/// A backup's state in this process.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BackupView {
    /// The backup's id (its folder's name).
    pub id: String,
    /// Where it is written.
    pub folder: String,
    /// `running`, `completed` or `failed`.
    pub state: String,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The manifest, once written.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub manifest: Option<serde_json::Value>,
}

/// Backups listed.
#[derive(Debug, Serialize, ToSchema)]
pub struct BackupList {
    /// This process's backups, newest first.
    pub backups: Vec<BackupView>,
}

/// A backup to take.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartBackup {
    /// Why (kept in the manifest); at most 500 printable characters.
    #[serde(default)]
    #[schema(max_length = 500, nullable)]
    pub reason: Option<String>,
    /// Write each generation's vectors as the portable dump (loadable into qdrant-edge or a
    /// Qdrant server) instead of copying the embedded shard; a Qdrant server's are always
    /// dumped.
    #[serde(default)]
    pub portable: bool,
}

/// State of the backup handlers.
#[derive(Clone)]
pub struct BackupState {
    ledger: Arc<dyn Ledger>,
    stores: Option<Arc<dyn VectorStores>>,
    root: PathBuf,
    backups: Arc<Mutex<BTreeMap<String, BackupView>>>,
}

impl FromRef<BackupState> for Arc<dyn Tokens> {
    fn from_ref(state: &BackupState) -> Self {
        state.ledger.clone()
    }
}

/// The backup routes.
pub fn routes(
    ledger: Arc<dyn Ledger>,
    stores: Option<Arc<dyn VectorStores>>,
    root: PathBuf,
) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(utoipa_axum::routes!(start_backup, list_backups))
        .with_state(BackupState {
            ledger,
            stores,
            root,
            backups: Arc::default(),
        })
}

fn record(state: &BackupState, view: BackupView) {
    if let Ok(mut backups) = state.backups.lock() {
        backups.insert(view.id.clone(), view);
    }
}

/// `POST /v1/backups`: takes a backup in the background.
#[utoipa::path(post, path = "/v1/backups", tag = "backups", security(("bearer" = [])),
    request_body(content = StartBackup, content_type = "application/json"),
    responses((status = 202, description = "The backup, running; follow it at GET /v1/backups.", body = BackupView), ApiErrors))]
async fn start_backup(
    State(state): State<BackupState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::Admin)?;
    let bytes = read_json_body(&headers, body, 16 * 1024).await?;
    let start: StartBackup = from_object(&bytes)?;
    let reason = reason(start.reason, "backup through the API")?;
    let portable = start.portable;
    let running = state
        .backups
        .lock()
        .map(|backups| backups.values().any(|b| b.state == "running"))
        .unwrap_or(false);
    if running {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "backup_running",
            "a backup is already running in this process; wait for it (GET /v1/backups)",
        ));
    }
    let id = super::new_id();
    let view = BackupView {
        id: id.clone(),
        folder: state.root.join(&id).display().to_string(),
        state: "running".to_owned(),
        error: None,
        manifest: None,
    };
    record(&state, view.clone());
    let actor = principal.actor();
    let task = state.clone();
    let task_view = view.clone();
    tokio::spawn(async move {
        let taken = super::take(
            &task.ledger,
            task.stores.as_ref(),
            &task.root,
            &task_view.id,
            portable,
            &actor,
            &reason,
        )
        .await;
        let mut view = task_view;
        match taken {
            Ok((manifest, _)) => {
                view.state = "completed".to_owned();
                view.manifest = serde_json::to_value(manifest).ok();
            }
            Err(error) => {
                tracing::error!(backup = %view.id, error = %format!("{error:#}"), "backup failed");
                view.state = "failed".to_owned();
                view.error = Some(format!("{error:#}"));
            }
        }
        record(&task, view);
    });
    Ok((StatusCode::ACCEPTED, Json(view)).into_response())
}

/// `GET /v1/backups`: this process's backups.
#[utoipa::path(get, path = "/v1/backups", tag = "backups", security(("bearer" = [])),
    responses((status = 200, description = "This process's backups, newest first.", body = BackupList), ApiErrors))]
async fn list_backups(
    State(state): State<BackupState>,
    auth: Auth,
) -> Result<Json<BackupList>, ApiError> {
    auth.require(Scope::Admin)?;
    let backups = state
        .backups
        .lock()
        .map(|backups| backups.values().rev().cloned().collect())
        .unwrap_or_default();
    Ok(Json(BackupList { backups }))
}
