//! The token API (scope `admin`): list, create, revoke, rotate.
//!
//! A secret appears once, in the answer that created it (creation or rotation); listings
//! never carry one. Every change goes through [`receipts::Tokens::change_token`], so history
//! records who made it and why.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use receipts::auth::{NewToken, TokenChange, TokenChanged};
use receipts::http::{ApiError, ApiErrors, Auth};
use receipts::Scope;
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::api::{optional_body, reason};
use crate::OpsState;

/// A token to create.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    /// 1-128 printable characters, not only spaces; the actor in history is `token:<name>`.
    #[schema(schema_with = token_name)]
    name: String,
    /// At least one of `ingest`, `search`, `ops:read`, `ops:write`, `admin`.
    #[schema(min_items = 1, value_type = Vec<receipts::Scope>)]
    scopes: Vec<String>,
    /// Limit the token to these datasets (absent: every dataset; empty: none).
    #[schema(schema_with = token_datasets)]
    datasets: Option<Vec<String>>,
    /// Lifetime in seconds (1 to ten years; absent: no expiry).
    #[schema(minimum = 1, maximum = 315360000)]
    expires_in_seconds: Option<u64>,
    /// The identity it reads as: `user:<name>` or `service:<name>` (absent: it reads every
    /// document of its datasets).
    #[schema(max_length = 200)]
    principal: Option<String>,
    /// Its groups (`eng` or `group:eng`), with `principal` only; at most 64.
    #[schema(max_items = 64)]
    groups: Option<Vec<String>>,
}

fn token_name() -> utoipa::openapi::schema::Object {
    receipts::http::not_blank_schema(128, false, "1-128 characters, no control characters.")
}

fn token_datasets() -> utoipa::openapi::schema::Array {
    receipts::http::optional_names(receipts::http::dataset_schema(), 0, None)
}

/// A revocation or rotation.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ChangeBody {
    /// Why (recorded in history); at most 500 printable characters.
    #[schema(schema_with = crate::api::nullable_reason)]
    reason: Option<String>,
    /// Rotation only: the new token's lifetime in seconds (default: the old one's).
    #[schema(minimum = 1, maximum = 315360000)]
    expires_in_seconds: Option<u64>,
}

/// A revocation.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RevokeBody {
    /// Why (recorded in history); at most 500 printable characters.
    #[schema(schema_with = crate::api::nullable_reason)]
    reason: Option<String>,
}

/// A token change's answer: the token, and its new secret when one was made.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)]
struct TokenAnswer {
    token: receipts::auth::TokenInfo,
    /// The new secret, shown once (creation and rotation).
    secret: Option<String>,
    /// A reminder that the secret is not shown again.
    note: Option<String>,
}

/// Every token.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)]
struct TokenList {
    tokens: Vec<receipts::auth::TokenInfo>,
}

/// A token may not revoke or rotate itself over the API: that would lock its caller out in
/// the middle of its own session. Another admin token, or `cairn token` on the data
/// directory, can.
fn not_self(principal: &receipts::Principal, id: Uuid) -> Result<(), ApiError> {
    if principal.token_id == id {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "own_token",
            "a token cannot revoke or rotate itself over the API; use another admin token, or \
             `cairn token revoke|rotate` on the data directory",
        ));
    }
    Ok(())
}

fn token_id(text: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(text).map_err(|_| {
        ApiError::unprocessable(
            "invalid_token_id",
            format!("`{text}` is not a token id (UUID)"),
        )
    })
}

/// Microseconds since the epoch, `seconds` from now.
fn expiry(seconds: Option<u64>) -> Result<Option<i64>, ApiError> {
    seconds
        .map(receipts::auth::expiry_after)
        .transpose()
        .map_err(|message| {
            ApiError::unprocessable("invalid_expiry", format!("expires_in_seconds: {message}"))
        })
}

fn changed(status: StatusCode, changed: TokenChanged) -> Response {
    let mut body = json!({ "token": changed.token });
    if let Some(secret) = changed.secret {
        body["secret"] = json!(secret);
        body["note"] = json!("the secret is shown once; store it now");
    }
    (status, Json(body)).into_response()
}

/// `GET /v1/tokens`: every token, newest first, without secrets.
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", security(("bearer" = [])), responses((status = 200, description = "Every token, newest first; never a secret.", body = TokenList), ApiErrors))]
pub async fn list(State(state): State<OpsState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    auth.require(Scope::Admin)?;
    let tokens = state.ledger.tokens().await?;
    Ok(Json(json!({ "tokens": tokens })))
}

/// `GET /v1/tokens/self`: what the request's own token may do (any valid token may ask), so
/// a client can check its scopes before it acts, as `cairn mcp` does.
#[utoipa::path(get, path = "/v1/tokens/self", tag = "tokens", security(("bearer" = [])), responses((status = 200, description = "The token's id, name, scopes and dataset allowlist (`null`: every dataset).", body = receipts::Principal), ApiErrors))]
pub async fn own(auth: Auth) -> Json<receipts::Principal> {
    Json(auth.0)
}

/// `POST /v1/tokens`: a new token; its secret is in this answer only.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", security(("bearer" = [])), request_body(content = CreateBody, content_type = "application/json"), responses((status = 201, description = "Created; the secret is in this answer only.", body = TokenAnswer), ApiErrors))]
pub async fn create(
    State(state): State<OpsState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::Admin)?;
    let body: CreateBody =
        receipts::http::read_json(&headers, body, crate::api::MAX_BODY_BYTES).await?;
    let scopes = body
        .scopes
        .iter()
        .map(|scope| {
            scope
                .parse::<Scope>()
                .map_err(|message| ApiError::unprocessable("invalid_scopes", message))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let identity = match (&body.principal, &body.groups) {
        (Some(principal), groups) => Some(receipts::access::Identity::new(
            principal,
            groups.as_deref().unwrap_or_default(),
        )?),
        (None, Some(_)) => {
            return Err(ApiError::unprocessable(
                "invalid_groups",
                "`groups` belong to a `principal`: give both, or neither",
            ))
        }
        (None, None) => None,
    };
    let token = NewToken {
        name: body.name,
        scopes,
        datasets: body.datasets,
        identity,
        created_by: principal.actor(),
        expires_at: expiry(body.expires_in_seconds)?,
    };
    let created = state
        .ledger
        .change_token(TokenChange::Create(token))
        .await?;
    Ok(changed(StatusCode::CREATED, created))
}

/// `POST /v1/tokens/{id}/revoke`: the token stops working at once.
#[utoipa::path(post, path = "/v1/tokens/{id}/revoke", tag = "tokens", security(("bearer" = [])), params(("id" = uuid::Uuid, Path, description = "Token id")), request_body(content = Option<RevokeBody>, content_type = "application/json", description = "May be left out."), responses((status = 200, description = "Revoked: it stops working at the next request.", body = TokenAnswer), ApiErrors))]
pub async fn revoke(
    State(state): State<OpsState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (actor, id, body) = change_request(&auth, &id, &headers, body).await?;
    if body.expires_in_seconds.is_some() {
        return Err(ApiError::unprocessable(
            "invalid_json",
            "expires_in_seconds applies to rotation only",
        ));
    }
    let revoked = state
        .ledger
        .change_token(TokenChange::Revoke {
            id,
            actor,
            reason: Some(reason(body.reason, "revoked through the token API")?),
        })
        .await?;
    Ok(changed(StatusCode::OK, revoked))
}

/// What a revocation or rotation starts from: the admin's actor name, the token (never the
/// caller's own) and the optional body.
async fn change_request(
    auth: &Auth,
    id: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<(String, Uuid, ChangeBody), ApiError> {
    let principal = auth.require(Scope::Admin)?;
    let id = token_id(id)?;
    not_self(principal, id)?;
    let body: ChangeBody = optional_body(headers, body).await?;
    Ok((principal.actor(), id, body))
}

/// `POST /v1/tokens/{id}/rotate`: a new secret for the same name, scopes and datasets; the old
/// one stops working in the same transaction.
#[utoipa::path(post, path = "/v1/tokens/{id}/rotate", tag = "tokens", security(("bearer" = [])), params(("id" = uuid::Uuid, Path, description = "Token id")), request_body(content = Option<ChangeBody>, content_type = "application/json", description = "May be left out."), responses((status = 201, description = "Rotated: the new secret is in this answer only; the old one stops working now.", body = TokenAnswer), ApiErrors))]
pub async fn rotate(
    State(state): State<OpsState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (actor, id, body) = change_request(&auth, &id, &headers, body).await?;
    let rotated = state
        .ledger
        .change_token(TokenChange::Rotate {
            id,
            actor,
            reason: Some(reason(body.reason, "rotated through the token API")?),
            expires_at: expiry(body.expires_in_seconds)?,
        })
        .await?;
    Ok(changed(StatusCode::CREATED, rotated))
}
