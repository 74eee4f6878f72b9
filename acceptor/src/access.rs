//! Who may read which document, over HTTP ([`receipts::access`]): a source's readers read and
//! changed without a new revision, and a dataset's default.

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use receipts::access::{AccessChange, AccessRecord, DefaultAccess, SourceAccess};
use receipts::http::{read_json, ApiError, ApiErrors, Auth};
use receipts::{validate, Scope};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::AcceptorState;

/// Largest body of an access change, in bytes.
const MAX_ACCESS_BODY_BYTES: usize = 64 * 1024;

/// Which source's access to read.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct AccessQuery {
    /// The dataset.
    #[param(max_length = 128)]
    dataset: String,
    /// The source's key.
    #[param(max_length = 1024)]
    source_key: String,
}

/// A change of a source's readers.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AccessRequest {
    #[schema(schema_with = receipts::http::dataset_schema)]
    dataset: String,
    #[schema(schema_with = receipts::http::source_key_schema)]
    source_key: String,
    /// The readers (`user:<name>`, `service:<name>`, `group:<name>`; at most 256); `null`:
    /// back to the dataset's default.
    #[schema(value_type = Option<Vec<String>>)]
    readers: Option<Vec<String>>,
    /// Why (recorded in history).
    #[schema(schema_with = receipts::http::reason_schema)]
    #[serde(default, deserialize_with = "present")]
    reason: Option<String>,
}

/// A change of a dataset's default.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DefaultRequest {
    /// `everyone` (who may read the dataset) or `nobody` (until a document names readers).
    default: DefaultAccess,
    /// Why (recorded in history).
    #[schema(schema_with = receipts::http::reason_schema)]
    #[serde(default, deserialize_with = "present")]
    reason: Option<String>,
}

/// A dataset's default, as set.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DatasetAccess {
    dataset: String,
    default: DefaultAccess,
}

/// An optional string that, when given, is a string (`null` is refused, as the schema says).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    String::deserialize(deserializer).map(Some)
}

/// The reason a change gives, checked as every reason is (1-500 printable characters, not
/// only spaces), or `default` when it gives none.
fn given_reason(reason: Option<String>, default: &str) -> Result<String, ApiError> {
    match reason {
        Some(reason) => {
            validate::reason(&reason)?;
            Ok(reason.trim().to_owned())
        }
        None => Ok(default.to_owned()),
    }
}

/// Who may read a source now: the readers it names (`null`: its dataset's default) and that
/// default. A source the token may not read is answered as absent.
#[utoipa::path(get, path = "/v1/sources/access", tag = "ingest", security(("bearer" = [])),
    params(AccessQuery),
    responses((status = 200, description = "The source's readers and its dataset's default.", body = AccessRecord), ApiErrors))]
pub(crate) async fn get_access(
    State(state): State<AcceptorState>,
    auth: Auth,
    query: Result<Query<AccessQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let principal = auth.require_any(&[Scope::Ingest, Scope::OpsRead])?;
    let Query(query) = query
        .map_err(|rejection| ApiError::unprocessable("invalid_query", rejection.body_text()))?;
    validate::dataset(&query.dataset)?;
    validate::source_key(&query.source_key)?;
    principal.require_dataset(&query.dataset)?;
    crate::readable(&state, principal, &query.dataset, &query.source_key).await?;
    let record = state
        .ledger
        .access_of(&query.dataset, &query.source_key)
        .await?;
    Ok(Json(record).into_response())
}

/// Changes who may read a source, without a new revision: one ledger transaction, recorded
/// in history with the token and the reason. Search applies it from the next query on.
#[utoipa::path(put, path = "/v1/sources/access", tag = "ingest", security(("bearer" = [])),
    request_body(content = AccessRequest, content_type = "application/json"),
    responses((status = 200, description = "The source's readers as they now are.", body = AccessRecord), ApiErrors))]
pub(crate) async fn put_access(
    State(state): State<AcceptorState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::Ingest)?;
    let request: AccessRequest = read_json(&headers, body, MAX_ACCESS_BODY_BYTES).await?;
    validate::dataset(&request.dataset)?;
    validate::source_key(&request.source_key)?;
    principal.require_dataset(&request.dataset)?;
    let reason = given_reason(request.reason, "access changed")?;
    let readers = request
        .readers
        .map(|readers| SourceAccess { readers }.checked())
        .transpose()?;
    // A token that reads as an identity changes only what it may read, and learns nothing
    // of the rest.
    crate::readable(&state, principal, &request.dataset, &request.source_key).await?;
    state
        .ledger
        .change_access(AccessChange::Source {
            dataset: request.dataset.clone(),
            source_key: request.source_key.clone(),
            readers,
            actor: principal.actor(),
            reason,
        })
        .await?;
    tracing::info!(dataset = %request.dataset, source_key = %request.source_key, actor = %principal.actor(), "access changed");
    let record = state
        .ledger
        .access_of(&request.dataset, &request.source_key)
        .await?;
    Ok(Json(record).into_response())
}

/// Sets a dataset's default for the sources that name no readers (scope `admin`).
#[utoipa::path(put, path = "/v1/datasets/{dataset}/access", tag = "ingest", security(("bearer" = [])),
    params(("dataset" = String, Path, description = "The dataset.")),
    request_body(content = DefaultRequest, content_type = "application/json"),
    responses((status = 200, description = "The dataset's default as it now is.", body = DatasetAccess), ApiErrors))]
pub(crate) async fn put_dataset_access(
    State(state): State<AcceptorState>,
    auth: Auth,
    Path(dataset): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::Admin)?;
    validate::dataset(&dataset)?;
    principal.require_dataset(&dataset)?;
    let request: DefaultRequest = read_json(&headers, body, MAX_ACCESS_BODY_BYTES).await?;
    let reason = given_reason(request.reason, "dataset default access changed")?;
    state
        .ledger
        .change_access(AccessChange::Dataset {
            dataset: dataset.clone(),
            default: request.default,
            actor: principal.actor(),
            reason,
        })
        .await?;
    tracing::info!(%dataset, default = request.default.as_str(), actor = %principal.actor(), "dataset default access changed");
    Ok(Json(DatasetAccess {
        dataset,
        default: request.default,
    })
    .into_response())
}
