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
use receipts::http::{ApiError, Auth};
use receipts::Scope;
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::api::{optional_body, reason};
use crate::OpsState;

/// Longest lifetime a token may be given: ten years.
const MAX_EXPIRES_IN_SECONDS: u64 = 10 * 365 * 24 * 3600;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    name: String,
    scopes: Vec<String>,
    datasets: Option<Vec<String>>,
    expires_in_seconds: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChangeBody {
    reason: Option<String>,
    expires_in_seconds: Option<u64>,
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
    let Some(seconds) = seconds else {
        return Ok(None);
    };
    if seconds == 0 || seconds > MAX_EXPIRES_IN_SECONDS {
        return Err(ApiError::unprocessable(
            "invalid_expiry",
            format!("expires_in_seconds is between 1 and {MAX_EXPIRES_IN_SECONDS}"),
        ));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_micros() as i64)
        .unwrap_or(0);
    Ok(Some(now.saturating_add(seconds as i64 * 1_000_000)))
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
pub async fn list(State(state): State<OpsState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    auth.require(Scope::Admin)?;
    let tokens = state.ledger.tokens().await?;
    Ok(Json(json!({ "tokens": tokens })))
}

/// `POST /v1/tokens`: a new token; its secret is in this answer only.
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
    let token = NewToken {
        name: body.name,
        scopes,
        datasets: body.datasets,
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
pub async fn revoke(
    State(state): State<OpsState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::Admin)?;
    let id = token_id(&id)?;
    let body: ChangeBody = optional_body(&headers, body).await?;
    if body.expires_in_seconds.is_some() {
        return Err(ApiError::unprocessable(
            "invalid_json",
            "expires_in_seconds applies to rotation only",
        ));
    }
    let reason = reason(body.reason, "revoked through the token API")?;
    let revoked = state
        .ledger
        .change_token(TokenChange::Revoke {
            id,
            actor: principal.actor(),
            reason: Some(reason),
        })
        .await?;
    Ok(changed(StatusCode::OK, revoked))
}

/// `POST /v1/tokens/{id}/rotate`: a new secret for the same name, scopes and datasets; the old
/// one stops working in the same transaction.
pub async fn rotate(
    State(state): State<OpsState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::Admin)?;
    let id = token_id(&id)?;
    let body: ChangeBody = optional_body(&headers, body).await?;
    let reason = reason(body.reason, "rotated through the token API")?;
    let rotated = state
        .ledger
        .change_token(TokenChange::Rotate {
            id,
            actor: principal.actor(),
            reason: Some(reason),
            expires_at: expiry(body.expires_in_seconds)?,
        })
        .await?;
    Ok(changed(StatusCode::CREATED, rotated))
}
