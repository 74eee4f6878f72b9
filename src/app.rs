//! The HTTP application: the union of each crate's router (acceptor, search, connectors,
//! verify, ops, graph,
//! the MCP endpoint, the OpenAPI document) over one ledger, with request logging, route labels for metrics and a
//! typed answer to a panic.

use std::sync::Arc;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use receipts::Ledger;

use crate::config::Config;
use crate::{openapi, server};

/// The whole HTTP application over one ledger. Search is lexical-only unless `vector` (the
/// query embedder and the vector store) is given.
pub fn app(ledger: Arc<dyn Ledger>, config: &Config, vector: Option<search::VectorSide>) -> Router {
    app_with_graph(ledger, config, vector, None, None, None)
}

/// [`app`], reading links from `graph` (`GET /v1/graph/sources`, search's `"expand":
/// "links"`).
pub fn app_with_graph(
    ledger: Arc<dyn Ledger>,
    config: &Config,
    vector: Option<search::VectorSide>,
    graph: Option<Arc<dyn gateways::GraphStore>>,
    generations: Option<Arc<dyn ops::generations::GenerationSetup>>,
    verifier: Option<Arc<verify::Verifier>>,
) -> Router {
    let verifier = verifier.unwrap_or_else(|| {
        verify::Verifier::new(
            ledger.clone(),
            vector.as_ref().map(|side| side.stores.clone()),
            config.verify.clone(),
        )
    });
    let stores = vector.as_ref().map(|side| side.stores.clone());
    let mut searcher = search::Searcher::new(ledger.clone(), vector, config.search);
    if let Some(graph) = graph {
        searcher = searcher.with_graph(graph);
    }
    let searcher = Arc::new(searcher);
    let mcp = agents::router(
        ledger.clone(),
        ledger.clone(),
        searcher.clone(),
        &config.mcp,
    );
    let (routes, document) = utoipa_axum::router::OpenApiRouter::new()
        .merge(acceptor::routes(ledger.clone(), config.acceptor.clone()))
        .merge(search::routes(ledger.clone(), searcher))
        .merge(connectors::api::routes(
            ledger.clone(),
            config.connectors.clone(),
        ))
        .merge(verify::api::routes(verifier))
        .merge(crate::backup::api::routes(
            ledger.clone(),
            stores.clone(),
            config.backup_dir(),
        ))
        .merge(crate::filterable::routes(ledger.clone(), stores))
        .merge(events::routes(
            ledger.clone(),
            &config.webhooks,
            config.webhooks.sealer(),
        ))
        .merge(ops::routes(ledger, generations))
        .split_for_parts();
    let document = Arc::new(openapi::complete(document));
    let routes = routes.merge(openapi::router(document)).merge(mcp);
    let routes = match &config.oauth {
        None => routes
            .route_layer(middleware::from_fn(note_route))
            .fallback(receipts::http::not_found),
        Some(settings) => match oauth::Guard::new(&settings.resource, settings.cairn_tokens) {
            Ok(guard) => routes
                .merge(guard.routes())
                .route_layer(middleware::from_fn(note_route))
                .fallback(receipts::http::not_found)
                .layer(middleware::from_fn_with_state(guard, oauth::guard)),
            Err(error) => {
                // The configuration was checked when it was loaded; fail closed if it still
                // cannot be used.
                tracing::error!(%error, "the [oauth] settings cannot be used; every request is refused");
                routes
                    .fallback(receipts::http::not_found)
                    .layer(middleware::from_fn(refuse_misconfigured))
            }
        },
    };
    routes
        .layer(middleware::map_response(receipts::http::typed_errors))
        .layer(middleware::from_fn_with_state(
            config.http.request_timeout,
            server::request_deadline,
        ))
        .layer(middleware::from_fn(log_request))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            panic_response,
        ))
}

/// Every request, while the `[oauth]` settings cannot be used: 503, so that nothing is
/// answered without the checks the operator configured.
async fn refuse_misconfigured(_request: Request, _next: Next) -> Response {
    receipts::http::ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "auth_unavailable",
        "authentication is misconfigured on this server; the detail is in its log",
    )
    .into_response()
}

/// A panic in a handler is a bug: answer 500 `internal_error` (and log it) instead of
/// dropping the connection.
fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let detail = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic");
    tracing::error!(panic = detail, "request handler panicked");
    axum::response::IntoResponse::into_response(receipts::http::ApiError::new(
        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
        "internal_error",
        "internal error; see the server log",
    ))
}

/// The route template that matched a request (`/v1/revisions/{id}`), for metric labels that
/// stay few whatever the paths clients send.
#[derive(Debug, Clone)]
struct Route(String);

/// Runs on matched routes only: passes the matched route out with the response.
async fn note_route(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|path| path.as_str().to_owned());
    let mut response = next.run(request).await;
    if let Some(route) = route {
        response.extensions_mut().insert(Route(route));
    }
    response
}

async fn log_request(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16();
    let elapsed = started.elapsed();
    let elapsed_ms = elapsed.as_secs_f64() * 1000.0;
    let route = response
        .extensions()
        .get::<Route>()
        .map_or_else(|| "unmatched".to_owned(), |route| route.0.clone());
    let method_label = method.as_str().to_owned();
    metrics::counter!(
        "cairn_http_requests_total",
        "route" => route.clone(),
        "method" => method_label.clone(),
        "status" => status.to_string(),
    )
    .increment(1);
    metrics::histogram!(
        "cairn_http_request_duration_seconds",
        "route" => route,
        "method" => method_label,
    )
    .record(elapsed.as_secs_f64());
    if status == 504 {
        // A search whose client-chosen budget ran out: the client's choice, not a fault.
        tracing::info!(%method, %path, status, elapsed_ms, "request ran out of its budget");
    } else if status >= 500 {
        tracing::error!(%method, %path, status, elapsed_ms, "request failed");
    } else if status >= 400 {
        tracing::info!(%method, %path, status, elapsed_ms, "request refused");
    } else {
        tracing::debug!(%method, %path, status, elapsed_ms, "request");
    }
    response
}
