//! Shared helpers: a real SQLite ledger in a temporary directory (or a PostgreSQL ledger on a
//! real server), the assembled app driven
//! without a socket, tokens with chosen scopes.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use cairn::config::{Config, Overrides};
use http_body_util::BodyExt;
use receipts::auth::NewToken;
use receipts::{Ledger, Scope};
use serde_json::Value;
use tower::ServiceExt;

pub(crate) struct TestApp {
    pub(crate) app: Router,
    pub(crate) ledger: Arc<dyn Ledger>,
    pub(crate) admin: String,
    _directory: tempfile::TempDir,
    _server: Option<testkit::postgres::PostgresServer>,
}

/// The ledger engine an end-to-end test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    /// The embedded SQLite ledger in the test's data directory.
    Sqlite,
    /// A PostgreSQL ledger on a real server started for the test.
    Postgres,
}

pub(crate) async fn app_with(env: &[(&str, &str)]) -> TestApp {
    app_on(Engine::Sqlite, env).await
}

/// The app on `engine`, with environment settings.
pub(crate) async fn app_on(engine: Engine, env: &[(&str, &str)]) -> TestApp {
    let directory = tempfile::tempdir().expect("tempdir");
    let (server, ledger_url) = match engine {
        Engine::Sqlite => (None, None),
        Engine::Postgres => {
            let server = testkit::postgres::PostgresServer::start().expect("start PostgreSQL");
            let url = server.create_database("ledger").expect("database");
            (Some(server), Some(url))
        }
    };
    let overrides = Overrides {
        data_dir: Some(directory.path().to_path_buf()),
        ledger_url,
        ..Overrides::default()
    };
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let config = Config::load(&overrides, &env).expect("config");
    let ledger: Arc<dyn Ledger> = cairn::open_ledger(&config).await.expect("ledger");
    let path = cairn::ensure_admin_token(ledger.as_ref(), &config.data_dir)
        .await
        .expect("admin")
        .expect("created");
    let admin = std::fs::read_to_string(path)
        .expect("token")
        .trim()
        .to_owned();
    TestApp {
        app: cairn::app(ledger.clone(), &config, None),
        ledger,
        admin,
        _directory: directory,
        _server: server,
    }
}

pub(crate) async fn app() -> TestApp {
    app_with(&[]).await
}

impl TestApp {
    pub(crate) async fn token(
        &self,
        name: &str,
        scopes: &[Scope],
        datasets: Option<&[&str]>,
    ) -> String {
        self.ledger
            .create_token(NewToken {
                name: name.to_owned(),
                scopes: scopes.to_vec(),
                datasets: datasets.map(|list| list.iter().map(|d| d.to_string()).collect()),
                identity: None,
                created_by: "test".to_owned(),
                expires_at: None,
            })
            .await
            .expect("token")
            .secret
    }

    pub(crate) async fn raw(
        &self,
        request: Request<Body>,
    ) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
        let response = self.app.clone().oneshot(request).await.expect("response");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
            .to_vec();
        (status, headers, bytes)
    }

    pub(crate) async fn call(
        &self,
        method: &str,
        uri: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut builder = Request::builder().method(method).uri(uri);
        if let Some(token) = token {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        let body = match body {
            Some(value) => {
                builder = builder.header("content-type", "application/json");
                Body::from(value.to_string())
            }
            None => Body::empty(),
        };
        let (status, _, bytes) = self.raw(builder.body(body).expect("request")).await;
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, value)
    }

    pub(crate) async fn put(&self, token: &str, body: Value) -> (StatusCode, Value) {
        self.call("POST", "/v1/sources", Some(token), Some(body))
            .await
    }

    /// Serves the app on a local port (for a browser or the CLI); returns its base URL and
    /// the server task (abort it to stop).
    pub(crate) async fn listen(&self) -> (String, tokio::task::JoinHandle<std::io::Result<()>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listener");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let server = tokio::spawn(std::future::IntoFuture::into_future(axum::serve(
            listener,
            self.app.clone(),
        )));
        (base, server)
    }

    pub(crate) async fn counts(&self) -> receipts::LedgerCounts {
        self.ledger.counts().await.expect("counts")
    }
}

/// Asserts a typed error: status and code.
pub(crate) fn assert_error(result: &(StatusCode, Value), status: u16, code: &str) {
    assert_eq!(
        result.0.as_u16(),
        status,
        "unexpected status; body: {}",
        result.1
    );
    assert_eq!(
        result.1["code"], code,
        "unexpected code; body: {}",
        result.1
    );
    assert!(
        result.1["message"].as_str().is_some_and(|m| !m.is_empty()),
        "no message: {}",
        result.1
    );
}

/// A Prometheus text exposition's value of `name` summed over the series that carry every
/// given label (in any order); `None` when no such series exists.
pub(crate) fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            if metric != name {
                return None;
            }
            labels
                .iter()
                .all(|(key, value)| rest.contains(&format!("{key}=\"{value}\"")))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// [`metric_value`] of a series that must exist: a metric that vanished fails the test
/// instead of reading as 0.
pub(crate) fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(text, name, labels)
        .unwrap_or_else(|| panic!("no series {name} with labels {labels:?} in:\n{text}"))
}

/// The source keys of a search answer's results, sorted (not deduplicated); every result must
/// name one.
pub(crate) fn hit_keys(answer: &Value) -> Vec<String> {
    let mut keys: Vec<String> = answer["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results in {answer}"))
        .iter()
        .map(|hit| {
            hit["source_key"]
                .as_str()
                .unwrap_or_else(|| panic!("a result without its source key: {hit}"))
                .to_owned()
        })
        .collect();
    keys.sort();
    keys
}

/// The metrics a served cairn exposes at `base`, read with `token` (the scrape must succeed).
pub(crate) async fn scrape(base: &str, token: &str) -> String {
    let response = reqwest::Client::new()
        .get(format!("{base}/metrics"))
        .bearer_auth(token)
        .send()
        .await
        .expect("scrape");
    assert_eq!(response.status(), 200);
    response.text().await.expect("text")
}

/// The admin token a `cairn serve` wrote into its data directory.
pub(crate) fn admin_token(data_dir: &std::path::Path) -> String {
    std::fs::read_to_string(data_dir.join("admin.token"))
        .expect("admin token")
        .trim()
        .to_owned()
}

/// Runs a `cairn` client command against `base` with `--json` and returns its JSON (the
/// command must succeed).
pub(crate) fn cairn_json(data_dir: &std::path::Path, base: &str, args: &[&str]) -> Value {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .args(["--json", "--server", base, "--data-dir"])
        .arg(data_dir)
        .output()
        .expect("run cairn");
    assert!(
        output.status.success(),
        "cairn {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("json")
}

/// `POST /v1/sources` with `body`; the new revision's id.
pub(crate) async fn post_source(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    body: &Value,
) -> String {
    let response = http
        .post(format!("{base}/v1/sources"))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .expect("POST /v1/sources");
    let status = response.status();
    let receipt: Value = response.json().await.expect("receipt");
    assert_eq!(status.as_u16(), 202, "{receipt}");
    receipt["source_revision_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no revision in {receipt}"))
        .to_owned()
}
