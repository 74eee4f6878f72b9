//! The HTTP server loop: cairn's own accept loop over hyper, so that every connection is
//! bounded in number and in time, and shutdown ends within a grace period whatever the
//! clients do.
//!
//! ## Invariants
//! - At most `max_connections` connections are served by the application. Past the cap, up to
//!   [`OVERFLOW_CONNECTIONS`] more are served by a small overflow service that answers
//!   `/healthz` (so health checks work at the cap) and `503 overloaded` with
//!   `Connection: close` to everything else; beyond those, a connection is closed at once.
//!   Open sockets are therefore bounded by `max_connections + OVERFLOW_CONNECTIONS`.
//! - A connection that has not sent a complete request head within `header_read_timeout` is
//!   closed. hyper arms that timer whenever the connection waits for a head, so it is also the
//!   keep-alive idle timeout.
//! - `accept` errors (such as running out of file descriptors) never stop the loop: they are
//!   logged at most once a second with how many happened, and the loop backs off briefly.
//! - On shutdown the listener closes at once, every connection is told to finish its
//!   in-flight request and close, and after `shutdown_grace` whatever is still open is
//!   dropped.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::header::CONNECTION;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

/// Connections served past the cap by the overflow service (health checks, 503s).
pub const OVERFLOW_CONNECTIONS: usize = 32;

/// Limits of the HTTP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpSettings {
    /// Connections served at once by the application.
    pub max_connections: usize,
    /// Time a connection gets to send a complete request head (also the keep-alive idle
    /// timeout).
    pub header_read_timeout: Duration,
    /// Time one request may take, body and handler together, whatever its route (searches
    /// have their own, smaller budget inside it).
    pub request_timeout: Duration,
    /// Time in-flight requests get to finish after a shutdown signal.
    pub shutdown_grace: Duration,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            max_connections: 512,
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// What happened to the connections while the server ran.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ServeReport {
    /// Connections served by the application.
    pub served: u64,
    /// Connections past the cap given to the overflow service.
    pub overflowed: u64,
    /// Connections closed at once (past the cap and the overflow).
    pub refused: u64,
    /// Connections still open when the grace period ended, dropped.
    pub dropped_at_shutdown: u64,
}

/// The service for connections past the cap: `/healthz` answers, everything else is 503.
fn overflow_router() -> Router {
    Router::new()
        .route("/healthz", get(acceptor::healthz))
        .fallback(|| async { overloaded() })
        .layer(axum::middleware::map_response(close_connection))
}

fn overloaded() -> Response {
    let mut error = receipts::http::ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        "the server is at its connection limit; retry shortly",
    );
    error.retry_after = Some(1);
    error.into_response()
}

async fn close_connection(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains (see the module docs).
pub async fn run(
    listener: TcpListener,
    app: Router,
    settings: HttpSettings,
    shutdown: impl Future<Output = ()> + Send,
) -> ServeReport {
    let permits = Arc::new(Semaphore::new(settings.max_connections.max(1)));
    let overflow_permits = Arc::new(Semaphore::new(OVERFLOW_CONNECTIONS));
    let overflow = overflow_router();
    let (drain, draining) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut report = ServeReport::default();
    let accept_errors = AcceptErrors::default();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _peer)) => stream,
                    Err(error) => {
                        accept_errors.record(&error);
                        // Out of descriptors (or another transient error): let connections
                        // close before trying again instead of spinning.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (service, permit, keep_alive, label) =
                    if let Ok(permit) = permits.clone().try_acquire_owned() {
                        report.served += 1;
                        (app.clone(), permit, true, "app")
                    } else if let Ok(permit) = overflow_permits.clone().try_acquire_owned() {
                        report.overflowed += 1;
                        (overflow.clone(), permit, false, "overflow")
                    } else {
                        report.refused += 1;
                        metrics::counter!("cairn_http_connections_refused_total").increment(1);
                        drop(stream);
                        continue;
                    };
                let open = metrics::gauge!("cairn_http_connections_open", "service" => label);
                open.increment(1.0);
                let permit = OpenConnection { _permit: permit, open };
                connections.spawn(connection(
                    stream,
                    service,
                    settings.header_read_timeout,
                    keep_alive,
                    draining.clone(),
                    permit,
                ));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let open = connections.len();
    tracing::info!(
        open,
        grace_ms = settings.shutdown_grace.as_millis() as u64,
        "HTTP: listener closed; draining connections"
    );
    let _ = drain.send(true);
    let deadline = tokio::time::sleep(settings.shutdown_grace);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => {
                report.dropped_at_shutdown = connections.len() as u64;
                tracing::warn!(
                    open = connections.len(),
                    "HTTP: grace period over; closing the connections still open"
                );
                connections.abort_all();
                while connections.join_next().await.is_some() {}
                break;
            }
            next = connections.join_next() => if next.is_none() { break },
        }
    }
    report
}

/// Serves one connection until it ends, or until draining starts and its in-flight request
/// is answered.
async fn connection(
    stream: TcpStream,
    service: Router,
    header_read_timeout: Duration,
    keep_alive: bool,
    mut draining: watch::Receiver<bool>,
    _permit: OpenConnection,
) {
    let _ = stream.set_nodelay(true);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .keep_alive(keep_alive);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
    tokio::pin!(conn);
    let drained = async move {
        // The watch guard is dropped here, before anything else is awaited.
        let _ = draining.wait_for(|draining| *draining).await.map(|_| ());
    };
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = drained => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(error) = result {
        // Timeouts and clients that go away are normal for a server on a network.
        tracing::debug!(%error, "HTTP connection ended with an error");
    }
}

/// A connection's place under the cap, counted in `cairn_http_connections_open` while held.
struct OpenConnection {
    _permit: OwnedSemaphorePermit,
    open: metrics::Gauge,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.open.decrement(1.0);
    }
}

/// Accept errors, logged at most once a second with a count.
#[derive(Debug)]
struct AcceptErrors {
    since_log: AtomicU64,
    last_log: std::sync::Mutex<Option<Instant>>,
}

impl Default for AcceptErrors {
    fn default() -> Self {
        Self {
            since_log: AtomicU64::new(0),
            last_log: std::sync::Mutex::new(None),
        }
    }
}

impl AcceptErrors {
    fn record(&self, error: &std::io::Error) {
        let count = self.since_log.fetch_add(1, Ordering::Relaxed) + 1;
        let Ok(mut last) = self.last_log.lock() else {
            return;
        };
        if last.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
            return;
        }
        *last = Some(Instant::now());
        self.since_log.store(0, Ordering::Relaxed);
        tracing::warn!(
            %error,
            errors = count,
            "HTTP: accept failed (out of file descriptors? see http.max_connections and \
             `ulimit -n`); retrying"
        );
    }
}

/// Raises the soft limit on open files towards the hard limit when `needed` descriptors may
/// be open at once; returns the soft limit in force afterwards (`None` where it cannot be
/// read).
pub fn ensure_open_files(needed: u64) -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    let current = limit.current?;
    if current >= needed {
        return Some(current);
    }
    let raised = limit.maximum.map_or(needed, |maximum| needed.min(maximum));
    if raised <= current {
        return Some(current);
    }
    let wanted = rustix::process::Rlimit {
        current: Some(raised),
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, wanted) {
        Ok(()) => {
            tracing::info!(from = current, to = raised, "raised the open-file limit");
            Some(raised)
        }
        Err(error) => {
            tracing::warn!(%error, current, needed, "could not raise the open-file limit");
            Some(current)
        }
    }
}

/// Applies the per-request timeout: a request still running after `limit` is answered
/// `503 request_timeout` (its handler is dropped; a receipt already committed stays valid,
/// and resending the same document is a `duplicate`).
pub async fn request_deadline(
    axum::extract::State(limit): axum::extract::State<Duration>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            let mut error = receipts::http::ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "request_timeout",
                format!(
                    "the request took longer than the server's limit of {} ms",
                    limit.as_millis()
                ),
            );
            error.retry_after = Some(1);
            error.into_response()
        }
    }
}
