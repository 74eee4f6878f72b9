//! Projection generations: build one beside the active one, watch it, switch, roll back,
//! retire (`/v1/ops/generations`).
//!
//! Reads need `ops:read`; every change needs `admin` and goes through the ledger's one path
//! for generation changes ([`receipts::Projections::change_generation`]) with `token:<name>`
//! as the actor and the operator's reason as the cause. Retiring deletes the generation's
//! vectors through the serving process ([`GenerationSetup`]) and records what was read back
//! as gone; a retire that stops half-way (a store outage, a crash) stays `retiring` and is
//! finished by asking again.

use std::sync::Arc;

use async_trait::async_trait;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use receipts::http::{ApiError, ApiErrors, Auth};
use receipts::{
    Backend, Generation, GenerationChange, GenerationChanged, GenerationCommand, GenerationView,
    Scope,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::{optional_body, reason};
use crate::OpsState;

/// What the generation endpoints need from the process that serves them.
#[async_trait]
pub trait GenerationSetup: Send + Sync {
    /// The generation a create request describes (unset fields from the process's
    /// configuration), or why it cannot be built here.
    fn describe(&self, request: &CreateGeneration) -> Result<Generation, String>;
    /// Deletes a generation's vectors (its shard directory or collection) and reads back that
    /// they are gone: the evidence recorded with the retirement.
    async fn delete_vectors(&self, generation: &Generation) -> Result<Value, String>;
}

/// `POST /v1/ops/generations`: the settings of the generation to build.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateGeneration {
    /// Most tokens per chunk (default: the server's configuration).
    pub max_tokens: Option<usize>,
    /// Tokens shared by neighbouring chunks (default: the server's configuration).
    pub overlap_tokens: Option<usize>,
    /// Embedding model: a local model's id, a remote model's id, or `remote` for the
    /// configured embedding server's (default: the server's own model).
    pub model: Option<String>,
    /// Backends (default: the server's).
    pub backends: Option<Vec<Backend>>,
    /// Priority of the rebuild jobs (default -10: fresh ingest, at 0, goes first).
    pub priority: Option<i64>,
    /// Why (history).
    pub reason: Option<String>,
}

/// `POST /v1/ops/generations/{id}/switch`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SwitchGeneration {
    /// Switch even though some current heads are not verified in it (they are named).
    #[serde(default)]
    pub force: bool,
    /// Why (history).
    pub reason: Option<String>,
}

/// `POST /v1/ops/generations/{id}/retire`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetireGeneration {
    /// Why (history).
    pub reason: Option<String>,
}

fn setup(state: &OpsState) -> Result<&Arc<dyn GenerationSetup>, ApiError> {
    state.generations.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "generations_unavailable",
            "this server runs no projection (workers.count = 0 with the embedded vector store): \
             manage generations on the process that owns the vector store",
        )
    })
}

async fn change(
    state: &OpsState,
    actor: String,
    reason: String,
    change: GenerationChange,
) -> Result<GenerationChanged, ApiError> {
    Ok(state
        .ledger
        .change_generation(GenerationCommand {
            change,
            actor,
            reason,
        })
        .await?)
}

fn answer(changed: &GenerationChanged) -> Json<Value> {
    Json(json!({ "generation": changed.generation, "change": changed }))
}

/// `GET /v1/ops/generations`: every generation, newest first, with progress.
#[utoipa::path(get, path = "/v1/ops/generations", tag = "ops", security(("bearer" = [])),
    responses((status = 200, description = "Generations with their state and progress (verified heads out of the total, rate, ETA, failures).", body = Object), ApiErrors))]
pub async fn list(State(state): State<OpsState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    auth.require(Scope::OpsRead)?;
    let generations: Vec<GenerationView> = state.ledger.generations().await?;
    Ok(Json(json!({ "generations": generations })))
}

/// `POST /v1/ops/generations`: records a `building` generation and queues one rebuild job
/// per current head; new acceptances are projected into it too.
#[utoipa::path(post, path = "/v1/ops/generations", tag = "ops", security(("bearer" = [])),
    request_body(content = Option<CreateGeneration>, content_type = "application/json", description = "Settings; unset ones come from the server's configuration."),
    responses((status = 200, description = "The generation being built and the rebuild jobs queued.", body = Object), ApiErrors))]
pub async fn create(
    State(state): State<OpsState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let principal = auth.require(Scope::Admin)?;
    let request: CreateGeneration = optional_body(&headers, body).await?;
    let reason = reason(request.reason.clone(), "new generation from the ops API")?;
    let generation = setup(&state)?.describe(&request).map_err(|message| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_generation",
            message,
        )
    })?;
    let priority = request
        .priority
        .unwrap_or(receipts::generations::REBUILD_PRIORITY);
    let changed = change(
        &state,
        principal.actor(),
        reason,
        GenerationChange::Create {
            generation,
            priority,
        },
    )
    .await?;
    tracing::info!(generation = %changed.generation.id, jobs = changed.jobs, actor = %principal.actor(), "generation build started");
    Ok(answer(&changed))
}

/// `POST /v1/ops/generations/{id}/switch`: makes it the active generation in one ledger
/// transaction (search answers from it from the next query on); refused while a current head
/// is not verified in it, unless `force`.
#[utoipa::path(post, path = "/v1/ops/generations/{id}/switch", tag = "ops", security(("bearer" = [])),
    params(("id" = String, Path, description = "Generation id")),
    request_body(content = Option<SwitchGeneration>, content_type = "application/json", description = "May be left out."),
    responses((status = 200, description = "The new active generation and the previous one.", body = Object), ApiErrors))]
pub async fn switch(
    State(state): State<OpsState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let principal = auth.require(Scope::Admin)?;
    let request: SwitchGeneration = optional_body(&headers, body).await?;
    let reason = reason(request.reason, "switch from the ops API")?;
    let changed = change(
        &state,
        principal.actor(),
        reason,
        GenerationChange::Switch {
            id,
            force: request.force,
        },
    )
    .await?;
    tracing::info!(generation = %changed.generation.id, previous = ?changed.previous, missing = changed.missing, actor = %principal.actor(), "generation switched");
    Ok(answer(&changed))
}

/// `POST /v1/ops/generations/{id}/retire`: stops its work, deletes its chunk rows and
/// vectors, reads back that they are gone and records the evidence.
#[utoipa::path(post, path = "/v1/ops/generations/{id}/retire", tag = "ops", security(("bearer" = [])),
    params(("id" = String, Path, description = "Generation id")),
    request_body(content = Option<RetireGeneration>, content_type = "application/json", description = "May be left out."),
    responses((status = 200, description = "The retired generation with its evidence.", body = Object), ApiErrors))]
pub async fn retire(
    State(state): State<OpsState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let principal = auth.require(Scope::Admin)?;
    let request: RetireGeneration = optional_body(&headers, body).await?;
    let reason = reason(request.reason, "retire from the ops API")?;
    let started = change(
        &state,
        principal.actor(),
        reason.clone(),
        GenerationChange::Retire { id: id.clone() },
    )
    .await?;
    let generation = started.generation.generation();
    let mut evidence = json!({
        "chunk_rows_deleted": started.chunk_rows_deleted,
        "jobs_cancelled": started.jobs,
    });
    if generation.backends.contains(&Backend::Vector) {
        let deleted = setup(&state)?
            .delete_vectors(&generation)
            .await
            .map_err(|message| {
                tracing::warn!(generation = %id, %message, "retiring: the vectors could not be deleted");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "vector_unavailable",
                    format!(
                        "generation {id} is retiring (no more work, chunk rows deleted), but its \
                         vectors could not be deleted: {message}; retire it again to finish"
                    ),
                )
            })?;
        evidence["vectors"] = deleted;
    }
    let finished = change(
        &state,
        principal.actor(),
        reason,
        GenerationChange::Retired {
            id: id.clone(),
            evidence,
        },
    )
    .await?;
    tracing::info!(generation = %id, evidence = ?finished.generation.retired_evidence, actor = %principal.actor(), "generation retired");
    Ok(answer(&GenerationChanged {
        jobs: started.jobs,
        chunk_rows_deleted: started.chunk_rows_deleted,
        ..finished
    }))
}
