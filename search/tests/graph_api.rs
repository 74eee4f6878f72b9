//! Reading the graph over HTTP, against a real Bolt server (ArcadeDB with its Bolt plugin), a
//! real SQLite ledger with the graph backend and the real graph job: `GET /v1/graph/sources`
//! and search's `"expand": "links"` bind links to current revisions, honour scopes and dataset
//! allowlists, and never show a link its source's head no longer makes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gateways::embedder::{LocalEmbedder, ModelFiles, MODEL_DIMENSION, MODEL_ID};
use gateways::graph::links::LinkExtractor;
use gateways::{BoltGraphStore, Chunker, ChunkerSettings};
use receipts::{Backend, Generation, Ledger, Scope, SqliteLedger, SqliteOptions, SystemClock};
use search::{SearchSettings, Searcher};
use serde_json::{json, Value};
use testkit::conformance::put;
use testkit::graph::GraphServer;
use worker::{GraphStage, Projector, Worker, WorkerConfig};

fn models_dir() -> PathBuf {
    std::env::var_os("CAIRN_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")))
}

async fn request(
    router: &axum::Router,
    method: &str,
    uri: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    use tower::ServiceExt;
    let mut builder = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {token}"));
    let body = match body {
        Some(value) => {
            builder = builder.header("content-type", "application/json");
            axum::body::Body::from(value.to_string())
        }
        None => axum::body::Body::empty(),
    };
    let response = router
        .clone()
        .oneshot(builder.body(body).expect("request"))
        .await
        .expect("response");
    let status = response.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .expect("body")
        .to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn token(
    ledger: &Arc<dyn Ledger>,
    scopes: Vec<Scope>,
    datasets: Option<Vec<&str>>,
) -> String {
    ledger
        .create_token(receipts::auth::NewToken {
            name: "graph-test".to_owned(),
            scopes,
            datasets: datasets.map(|names| names.into_iter().map(str::to_owned).collect()),
            identity: None,
            created_by: "test".to_owned(),
            expires_at: None,
        })
        .await
        .expect("token")
        .secret
}

/// Runs a worker until no job is open.
async fn settle(ledger: &Arc<dyn Ledger>, projector: &Arc<Projector>) {
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let mut config = WorkerConfig::new("graph-api-test");
    config.poll_interval = Duration::from_millis(20);
    let handle = tokio::spawn(Worker::new(ledger.clone(), projector.clone(), config).run(
        async move {
            let _ = stopped.changed().await;
        },
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let counts = ledger.counts().await.expect("counts");
        let open = counts.open_jobs();
        if open == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{:?}", counts.jobs);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(true);
    handle.await.expect("worker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graph_reads_are_bound_to_current_heads_and_honour_allowlists() {
    let server = GraphServer::start().expect("start ArcadeDB");
    let directory = tempfile::tempdir().expect("tempdir");
    let mut options = SqliteOptions::new(directory.path().join("ledger.db"));
    options.backends = vec![Backend::Relational, Backend::Graph];
    let ledger: Arc<dyn Ledger> = Arc::new(
        SqliteLedger::open(options, Arc::new(SystemClock))
            .await
            .expect("ledger"),
    );
    let generation = Generation::new(
        MODEL_ID,
        MODEL_DIMENSION as i64,
        &ChunkerSettings::default().fingerprint(),
        &[Backend::Relational],
    );
    ledger
        .activate_generation(&generation, "test")
        .await
        .expect("generation");
    let files = ModelFiles::locate(&models_dir()).expect("model files");
    let chunker = Arc::new(
        Chunker::new(
            files.tokenizer().expect("tokenizer"),
            ChunkerSettings::default(),
        )
        .expect("chunker"),
    );
    let graph = Arc::new(
        BoltGraphStore::open(&server.options())
            .await
            .expect("graph"),
    );
    let projector = Arc::new(
        Projector::new(
            ledger.clone(),
            Arc::new(LocalEmbedder::load(&files, 1, Some(1)).expect("model")),
            chunker.clone(),
            None,
            generation.clone(),
        )
        .expect("projector")
        .with_graph(GraphStage::new(
            ledger.clone(),
            chunker,
            graph.clone(),
            vec![Arc::new(LinkExtractor)],
            &generation.id,
        )),
    );
    for result in ledger
        .accept(vec![
            put("docs", "b.md", "Bravo page about volcanoes."),
            put("docs", "a.md", "Alpha page about volcanoes, see [b](b.md)."),
            put("other", "x.md", "Elsewhere, see [a](a.md)."),
        ])
        .await
    {
        result.expect("accepted");
    }
    settle(&ledger, &projector).await;
    let router = search::api::router(
        ledger.clone(),
        Arc::new(
            Searcher::new(ledger.clone(), None, SearchSettings::default())
                .with_graph(graph.clone()),
        ),
    );
    let reader = token(&ledger, vec![Scope::Search], None).await;
    let a_head = ledger
        .source("docs", "a.md")
        .await
        .expect("a")
        .expect("a")
        .head
        .id;
    let b_head = ledger
        .source("docs", "b.md")
        .await
        .expect("b")
        .expect("b")
        .head
        .id;

    let (status, body) = request(
        &router,
        "GET",
        "/v1/graph/sources?dataset=docs&source_key=a.md",
        &reader,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["head_revision_id"], a_head.to_string());
    assert_eq!(body["links"].as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(body["links"][0]["source_key"], "b.md");
    assert_eq!(body["links"][0]["direction"], "out");
    assert_eq!(body["links"][0]["via_revision_id"], a_head.to_string());
    assert_eq!(body["links"][0]["head_revision_id"], b_head.to_string());
    // The link from another dataset is never shown.
    let (status, body) = request(
        &router,
        "GET",
        "/v1/graph/sources?dataset=docs&source_key=b.md&direction=both",
        &reader,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let links = body["links"].as_array().expect("links");
    assert_eq!(links.len(), 1, "{body}");
    assert_eq!(
        (
            links[0]["source_key"].as_str(),
            links[0]["direction"].as_str()
        ),
        (Some("a.md"), Some("in"))
    );

    // Search with `expand: links` adds the bound links to each result.
    let (status, body) = request(
        &router,
        "POST",
        "/v1/search",
        &reader,
        Some(json!({ "query": "alpha volcanoes", "mode": "lexical", "expand": "links" })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let first = &body["results"][0];
    assert_eq!(first["source_key"], "a.md", "{body}");
    assert_eq!(first["links"][0]["source_key"], "b.md", "{body}");

    // Scopes, allowlists and parameters.
    let elsewhere = token(&ledger, vec![Scope::Search], Some(vec!["other"])).await;
    let (status, body) = request(
        &router,
        "GET",
        "/v1/graph/sources?dataset=docs&source_key=a.md",
        &elsewhere,
        None,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("forbidden")),
        "{body}"
    );
    let ingest_only = token(&ledger, vec![Scope::Ingest], None).await;
    let (status, _) = request(
        &router,
        "GET",
        "/v1/graph/sources?dataset=docs&source_key=a.md",
        &ingest_only,
        None,
    )
    .await;
    assert_eq!(status, 403);
    for (uri, code) in [
        (
            "/v1/graph/sources?dataset=docs&source_key=a.md&direction=up",
            "invalid_direction",
        ),
        (
            "/v1/graph/sources?dataset=docs&source_key=a.md&limit=0",
            "invalid_limit",
        ),
        ("/v1/graph/sources?dataset=docs", "invalid_query"),
    ] {
        let (status, body) = request(&router, "GET", uri, &reader, None).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (422, Some(code)),
            "{uri}: {body}"
        );
    }
    let (status, body) = request(
        &router,
        "GET",
        "/v1/graph/sources?dataset=docs&source_key=none.md",
        &reader,
        None,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("source_not_found"))
    );

    // A new head without links, not yet in the graph: the old head's link is no longer shown.
    for result in ledger
        .accept(vec![put(
            "docs",
            "a.md",
            "Alpha page, rewritten without links.",
        )])
        .await
    {
        result.expect("accepted");
    }
    let (status, body) = request(
        &router,
        "GET",
        "/v1/graph/sources?dataset=docs&source_key=a.md",
        &reader,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["links"], json!([]), "a retired link was shown: {body}");
    settle(&ledger, &projector).await;
    let job_states = ledger.counts().await.expect("counts").jobs;
    assert_eq!(job_states.get("dead"), None, "{job_states:?}");
}
