//! The verify API: start a pass (or find the running one), list passes, show one with its
//! drift, abandon one. Starting and abandoning need `ops:write` and a token without a dataset
//! allowlist: a pass covers (and with `repair` changes) every dataset, so a token limited to
//! some datasets may neither start nor stop one. Reading needs `ops:read`; a token with a
//! dataset allowlist sees only its datasets' drift.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRef, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use receipts::http::{from_object, read_json_body, reason, ApiError, ApiErrors, Auth};
use receipts::model::{DriftRecord, PassChange, PassState, VerifyPass, VerifyTier};
use receipts::{Scope, Tokens};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use uuid::Uuid;

use crate::pass::{Verifier, VerifyError};

/// Largest request body the verify API reads.
const MAX_BODY_BYTES: usize = 16 * 1024;

/// State of the verify handlers.
#[derive(Debug, Clone)]
pub struct VerifyState {
    verifier: Arc<Verifier>,
}

impl FromRef<VerifyState> for Arc<dyn Tokens> {
    fn from_ref(state: &VerifyState) -> Self {
        state.verifier.ledger.clone()
    }
}

/// The verify routes with their OpenAPI description.
pub fn routes(verifier: Arc<Verifier>) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(utoipa_axum::routes!(start_pass, list_passes))
        .routes(utoipa_axum::routes!(get_pass))
        .routes(utoipa_axum::routes!(abandon_pass))
        .with_state(VerifyState { verifier })
}

/// A pass to start.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartPass {
    /// `counts` (default), `scrub` or `deep`.
    #[serde(default)]
    pub tier: Option<VerifyTier>,
    /// The generation to verify (`g-` and 16 hex digits); the active one when left out.
    #[serde(default)]
    #[schema(pattern = "^g-[0-9a-f]{16}$", nullable)]
    pub generation: Option<String>,
    /// Repair what the pass confirms, through the normal paths.
    #[serde(default)]
    pub repair: bool,
    /// This pass's rate limit in points read per second (a store request counts as 100),
    /// instead of `verify.points_per_second`; a pass resumed after a restart goes back to the
    /// configured limit.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 4294967295_u64, nullable)]
    pub rate: Option<u32>,
    /// Why (recorded in history); at most 500 printable characters.
    #[serde(default)]
    #[schema(max_length = 500, nullable)]
    pub reason: Option<String>,
}

/// A pass with the drift it confirmed.
#[derive(Debug, Serialize, ToSchema)]
pub struct PassDetail {
    /// The pass.
    pub pass: VerifyPass,
    /// Its drift, in the order found (only the datasets the token may read).
    pub drift: Vec<DriftRecord>,
}

/// Passes, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct PassList {
    /// The passes.
    pub passes: Vec<VerifyPass>,
}

/// How many passes to list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// At most this many (1 to 100, default 20).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
}

/// Why a pass is abandoned.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AbandonQuery {
    /// Why (recorded in history); at most 500 printable characters.
    #[param(max_length = 500)]
    pub reason: Option<String>,
}

fn answer(error: VerifyError) -> ApiError {
    match error {
        VerifyError::Ledger(error) => error.into(),
        VerifyError::Store(error) => {
            tracing::warn!(%error, "verify could not reach its store");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "the vector store did not answer; see the server log",
            )
        }
    }
}

fn pass_id(id: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(id).map_err(|_| {
        ApiError::unprocessable(
            "invalid_id",
            format!(
                "`{}` is not a pass id (a UUID)",
                id.chars().take(64).collect::<String>()
            ),
        )
    })
}

fn generation_id(generation: &str) -> Result<(), ApiError> {
    let hex = generation.strip_prefix("g-").unwrap_or_default();
    if hex.len() == 16
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Ok(());
    }
    Err(ApiError::unprocessable(
        "invalid_generation",
        "a generation id is `g-` and 16 lowercase hex digits (see GET /v1/generations)",
    ))
}

/// `POST /v1/verify`: starts a pass, or answers the running pass of the same tier and
/// generation; it runs in the background (follow it at `GET /v1/verify/passes/{id}`).
#[utoipa::path(post, path = "/v1/verify", tag = "verify", security(("bearer" = [])),
    request_body(content = StartPass, content_type = "application/json"),
    responses((status = 202, description = "The pass, running.", body = VerifyPass), ApiErrors))]
async fn start_pass(
    State(state): State<VerifyState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::OpsWrite)?;
    principal.require_all_datasets("a verify pass")?;
    let bytes = read_json_body(&headers, body, MAX_BODY_BYTES).await?;
    let start: StartPass = from_object(&bytes)?;
    if let Some(generation) = &start.generation {
        generation_id(generation)?;
    }
    if start.rate == Some(0) {
        return Err(ApiError::unprocessable(
            "invalid_rate",
            "`rate` is points per second, at least 1",
        ));
    }
    let tier = start.tier.unwrap_or(VerifyTier::Counts);
    let reason = reason(start.reason, "started through the API")?;
    let pass = state
        .verifier
        .start(
            tier,
            start.generation,
            start.repair,
            start.rate,
            &principal.actor(),
            &reason,
        )
        .await
        .map_err(answer)?;
    tracing::info!(pass = %pass.id, %tier, generation = %pass.generation, repair = pass.repair, actor = %principal.actor(), "verify pass started");
    Ok((StatusCode::ACCEPTED, Json(pass)).into_response())
}

/// `GET /v1/verify`: the newest passes.
#[utoipa::path(get, path = "/v1/verify", tag = "verify", security(("bearer" = [])),
    params(ListQuery),
    responses((status = 200, description = "Passes, newest first.", body = PassList), ApiErrors))]
async fn list_passes(
    State(state): State<VerifyState>,
    auth: Auth,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<PassList>, ApiError> {
    auth.require(Scope::OpsRead)?;
    let Query(query) =
        query.map_err(|error| ApiError::unprocessable("invalid_query", error.body_text()))?;
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::unprocessable(
            "invalid_limit",
            "`limit` is 1 to 100",
        ));
    }
    let passes = state.verifier.ledger.verify_passes(limit).await?;
    Ok(Json(PassList { passes }))
}

/// `GET /v1/verify/passes/{id}`: one pass and its drift.
#[utoipa::path(get, path = "/v1/verify/passes/{id}", tag = "verify", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Pass id")),
    responses((status = 200, description = "The pass and the drift it confirmed.", body = PassDetail), ApiErrors))]
async fn get_pass(
    State(state): State<VerifyState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<PassDetail>, ApiError> {
    let principal = auth.require(Scope::OpsRead)?;
    let id = pass_id(&id)?;
    let pass = state
        .verifier
        .ledger
        .verify_pass(id)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(
                "verify_pass_not_found",
                format!("verify pass {id} not found"),
            )
        })?;
    let drift = state
        .verifier
        .ledger
        .pass_drift(id)
        .await?
        .into_iter()
        .filter(|drift| principal.require_dataset(&drift.dataset).is_ok());
    // A token that reads as an identity sees the drift of sources it may read, no others.
    let names = principal.reads_as();
    let mut readable = Vec::new();
    for record in drift {
        let may = state
            .verifier
            .ledger
            .may_read(names.as_deref(), &record.dataset, &record.source_key)
            .await?;
        if may {
            readable.push(record);
        }
    }
    let drift = readable;
    Ok(Json(PassDetail { pass, drift }))
}

/// `POST /v1/verify/passes/{id}/abandon`: stops a running pass (its drift stays recorded).
#[utoipa::path(post, path = "/v1/verify/passes/{id}/abandon", tag = "verify", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Pass id"), AbandonQuery),
    responses((status = 200, description = "The pass, abandoned.", body = VerifyPass), ApiErrors))]
async fn abandon_pass(
    State(state): State<VerifyState>,
    auth: Auth,
    Path(id): Path<String>,
    query: Result<Query<AbandonQuery>, QueryRejection>,
) -> Result<Json<VerifyPass>, ApiError> {
    let principal = auth.require(Scope::OpsWrite)?;
    principal.require_all_datasets("a verify pass")?;
    let id = pass_id(&id)?;
    let Query(query) =
        query.map_err(|error| ApiError::unprocessable("invalid_query", error.body_text()))?;
    let reason = reason(query.reason, "abandoned through the API")?;
    let pass = state
        .verifier
        .ledger
        .change_pass(PassChange::Finish {
            pass_id: id,
            state: PassState::Abandoned,
            actor: principal.actor(),
            reason,
        })
        .await?;
    Ok(Json(pass))
}
