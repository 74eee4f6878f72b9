//! Filterable metadata fields at run time (scope `admin`):
//! - `GET /v1/filterable` lists, per live generation, the payload fields its vector store
//!   indexes (read from the store itself);
//! - `POST /v1/filterable {field: "metadata.<name>", kind, reason?}` indexes a metadata field in
//!   every live generation's store, as `datasets.<d>.filterable` does at start.
//!
//! No backfill job is needed: every point already carries its revision's metadata as payload,
//! and the store indexes the points it holds as it creates the index. Search reads the
//! indexed fields from the store at each query, so a filter on the field stops being answered
//! `filter_unindexed` at once. One collection holds every dataset, so an index is the
//! collection's, not a dataset's. An index made here stays in the store; a generation created
//! later has only the configured ones, so declare the field in the configuration to keep it.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRef, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gateways::{FieldKind, VectorStores};
use receipts::http::{from_object, read_json_body, reason, ApiError, ApiErrors, Auth};
use receipts::model::{Backend, GenerationState};
use receipts::{Ledger, Scope, Tokens};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;

/// State of the handlers.
#[derive(Clone)]
struct FilterableState {
    ledger: Arc<dyn Ledger>,
    stores: Option<Arc<dyn VectorStores>>,
}

impl FromRef<FilterableState> for Arc<dyn Tokens> {
    fn from_ref(state: &FilterableState) -> Self {
        state.ledger.clone()
    }
}

/// The routes.
pub fn routes(ledger: Arc<dyn Ledger>, stores: Option<Arc<dyn VectorStores>>) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(utoipa_axum::routes!(list_filterable, add_filterable))
        .with_state(FilterableState { ledger, stores })
}

/// A metadata field to index.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct AddField {
    /// `metadata.<name>`: 1 to 64 letters, digits, `_` or `-` after the prefix.
    #[schema(pattern = "^metadata\\.[A-Za-z0-9_-]{1,64}$")]
    field: String,
    /// `keyword` (strings), `number` or `bool`, as in `datasets.<d>.filterable`.
    #[schema(pattern = "^(keyword|number|bool)$")]
    kind: String,
    /// Why (logged); at most 500 printable characters.
    #[serde(default)]
    #[schema(max_length = 500, nullable)]
    reason: Option<String>,
}

/// One live generation's indexed payload fields.
#[derive(Debug, Serialize, ToSchema)]
struct GenerationFields {
    /// The generation.
    generation: String,
    /// The payload fields its store indexes, sorted.
    indexed: Vec<String>,
}

/// The indexed fields of every live generation that has a vector store.
#[derive(Debug, Serialize, ToSchema)]
struct FilterableList {
    /// One entry per live generation.
    generations: Vec<GenerationFields>,
}

/// The kind's index type, or a typed refusal.
fn kind(text: &str) -> Result<FieldKind, ApiError> {
    FieldKind::of_setting(text).ok_or_else(|| {
        ApiError::unprocessable(
            "invalid_field_kind",
            format!(
                "`{}` is not a field type; use `keyword` (strings), `number` or `bool`",
                text.chars().take(32).collect::<String>()
            ),
        )
    })
}

/// The field's name, checked as a filter's `metadata.<name>` is.
fn field(text: &str) -> Result<&str, ApiError> {
    match receipts::filter::metadata_name(text) {
        Some(_) => Ok(text),
        None => Err(ApiError::unprocessable(
            "invalid_field",
            "a filterable field is `metadata.<name>`, the name 1 to 64 letters, digits, `_` or \
             `-` (the names a filter's `metadata.<name>` accepts)",
        )),
    }
}

/// Each live generation that projects into a vector store, with its store.
async fn live_stores(
    state: &FilterableState,
) -> Result<Vec<(String, Arc<dyn gateways::VectorStore>)>, ApiError> {
    let Some(stores) = &state.stores else {
        return Err(ApiError::unprocessable(
            "vector_unconfigured",
            "this process holds no vector store: run this against the process that runs the \
             workers",
        ));
    };
    let mut live = Vec::new();
    for generation in state.ledger.generations().await? {
        if generation.state == GenerationState::Retired
            || !generation.backends.contains(&Backend::Vector)
        {
            continue;
        }
        let store = stores.store(&generation.id).await.map_err(store_error)?;
        live.push((generation.id, store));
    }
    Ok(live)
}

fn store_error(error: gateways::GatewayError) -> ApiError {
    tracing::warn!(%error, "a vector store did not answer an index request");
    ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        "the vector store did not answer; see the server log",
    )
}

async fn listing(state: &FilterableState) -> Result<FilterableList, ApiError> {
    let mut generations = Vec::new();
    for (generation, store) in live_stores(state).await? {
        let mut indexed = store.indexed_fields().await.map_err(store_error)?;
        indexed.sort();
        generations.push(GenerationFields {
            generation,
            indexed,
        });
    }
    Ok(FilterableList { generations })
}

/// `GET /v1/filterable`: each live generation's indexed payload fields.
#[utoipa::path(get, path = "/v1/filterable", tag = "search", security(("bearer" = [])),
    responses((status = 200, description = "Each live generation's indexed payload fields, read from its store.", body = FilterableList), ApiErrors))]
async fn list_filterable(
    State(state): State<FilterableState>,
    auth: Auth,
) -> Result<Json<FilterableList>, ApiError> {
    auth.require(Scope::Admin)?;
    Ok(Json(listing(&state).await?))
}

/// `POST /v1/filterable`: indexes a metadata field in every live generation's store.
#[utoipa::path(post, path = "/v1/filterable", tag = "search", security(("bearer" = [])),
    request_body(content = AddField, content_type = "application/json"),
    responses((status = 200, description = "Indexed in every live generation's store (existing points included); the fields each now indexes.", body = FilterableList), ApiErrors))]
async fn add_filterable(
    State(state): State<FilterableState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::Admin)?;
    let bytes = read_json_body(&headers, body, 16 * 1024).await?;
    let add: AddField = from_object(&bytes)?;
    let name = field(&add.field)?.to_owned();
    let kind = kind(&add.kind)?;
    let reason = reason(add.reason, "indexed through the API")?;
    for (generation, store) in live_stores(&state).await? {
        store
            .ensure_indexes(&[(name.clone(), kind)])
            .await
            .map_err(store_error)?;
        tracing::info!(%generation, field = %name, kind = %add.kind, actor = %principal.actor(), %reason, "metadata field indexed");
    }
    Ok(Json(listing(&state).await?).into_response())
}
