//! The API contract: an OpenAPI 3.1 document generated from the handlers themselves (each
//! crate registers its routes from their `#[utoipa::path]` annotations, so a route cannot exist
//! without its description, nor a description without its route), served at
//! `/openapi.json`, with a small rendered reference at `/docs`.

use std::sync::Arc;

use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::OpenApi;
use utoipa::ToSchema;

/// Adds what no single handler knows: the title and version, the bearer scheme, the error
/// body's schema.
pub fn complete(mut document: OpenApi) -> OpenApi {
    document.info.title = "cairn".to_owned();
    document.info.version = env!("CARGO_PKG_VERSION").to_owned();
    document.info.description = Some(
        "Durable ingest and projection. A receipt (202) means the bytes are on disk; projection \
         into the stores follows. Every error is `{code, message, details?}` with a stable \
         code. Every endpoint but `/healthz`, `/ops`, `/openapi.json` and `/docs` needs \
         `Authorization: Bearer <token>`."
            .to_owned(),
    );
    document.info.license = None;
    let components = document.components.get_or_insert_with(Default::default);
    components.security_schemes.insert(
        "bearer".to_owned(),
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some("A cairn token (`cairn_...`)."))
                .build(),
        ),
    );
    components.schemas.insert(
        receipts::http::ErrorSchema::name().into_owned(),
        <receipts::http::ErrorSchema as utoipa::PartialSchema>::schema(),
    );
    document
}

/// `GET /openapi.json` and `GET /docs`.
pub fn router(document: Arc<OpenApi>) -> Router {
    let json = Arc::new(document.to_json().unwrap_or_else(|error| {
        tracing::error!(%error, "the API document does not serialise");
        "{}".to_owned()
    }));
    Router::new()
        .route(
            "/openapi.json",
            get(move || {
                let json = json.clone();
                async move {
                    (
                        [(CONTENT_TYPE, "application/json")],
                        json.as_str().to_owned(),
                    )
                        .into_response()
                }
            }),
        )
        .route("/docs", get(reference))
}

/// A rendered reference of `/openapi.json`: operations, parameters, bodies and answers, drawn
/// by a small script on this page (nothing is loaded from elsewhere).
async fn reference() -> Response {
    (
        [
            (CACHE_CONTROL, "no-store"),
            (
                CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; frame-ancestors 'none'",
            ),
        ],
        Html(include_str!("docs.html")),
    )
        .into_response()
}
