//! `cairn serve` embedding through a real OpenAI-compatible server (llama.cpp's, serving the same
//! MiniLM weights; `scripts/setup-embedding-server`), reached through the fault injector so a
//! test can script 429s. An outage mid-projection loses nothing: jobs retry until the server is
//! back. The server's model, identity and dimension are the generation's: a wrong dimension
//! stops cairn at start, and another server is refused unless it gets a new generation.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::embedding::{EmbeddingServer, Fault, FaultyEmbeddingProxy, SERVED_MODEL};

use crate::common::{admin_token, post_source};
use crate::crash::spawn_serve_with;
use crate::projection::{revision, wait_for_job};

fn remote_env(url: &str, dimensions: &str) -> Vec<(String, String)> {
    [
        ("CAIRN_EMBEDDINGS_URL", url),
        ("CAIRN_EMBEDDINGS_MODEL", SERVED_MODEL),
        ("CAIRN_EMBEDDINGS_DIMENSIONS", dimensions),
        ("CAIRN_EMBEDDINGS_BATCH", "8"),
        ("CAIRN_MODEL", "remote"),
        ("CAIRN_BACKOFF_BASE_MS", "200"),
        ("CAIRN_BACKOFF_CAP_MS", "1000"),
        ("CAIRN_MAX_ATTEMPTS", "50"),
    ]
    .iter()
    .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
    .collect()
}

async fn post(http: &reqwest::Client, base: &str, token: &str, key: &str, text: &str) -> String {
    let body = json!({ "dataset": "docs", "source_key": key, "content": text });
    post_source(http, base, token, &body).await
}

fn text(index: usize) -> String {
    format!(
        "Note {index}: the remote embedding server turns this paragraph into a vector; \
         topic {} is about {}.",
        index % 3,
        [
            "glaciers and granite valleys",
            "copper kettles and bread",
            "cranes in wetlands"
        ][index % 3]
    )
}

/// `cairn serve` with `envs`, expected to refuse to start; returns what it printed.
fn refused_start(data: &Path, envs: &[(String, String)]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["serve", "--bind", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .envs(envs.iter().map(|(name, value)| (name, value)))
        .env(
            "CAIRN_MODELS_DIR",
            concat!(env!("CARGO_MANIFEST_DIR"), "/models"),
        )
        .env("CAIRN_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run cairn serve");
    assert!(!output.status.success(), "cairn serve started");
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_embedder_projects_rides_out_an_outage_and_a_429_and_is_the_generations_model() {
    let mut server = EmbeddingServer::start().expect("start the embedding server");
    let proxy = FaultyEmbeddingProxy::start(server.port()).expect("fault injector");
    let data = tempfile::tempdir().expect("tempdir");
    let envs = remote_env(&proxy.url(), "384");
    let pairs: Vec<(&str, &str)> = envs
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect();
    let (mut cairn, base) =
        spawn_serve_with(data.path(), &[], &pairs, "warn", Stdio::inherit()).await;
    let token = admin_token(data.path());
    let http = reqwest::Client::new();

    // A clean job, then one that meets two 429s: the snoozes cost no attempt.
    let clean = post(&http, &base, &token, "clean", &text(0)).await;
    let clean = wait_for_job(&http, &base, &token, &clean, "completed").await;
    proxy.inject([
        Fault::RateLimited(Some("1".to_owned())),
        Fault::RateLimited(Some("1".to_owned())),
    ]);
    let limited = post(&http, &base, &token, "limited", &text(1)).await;
    let limited = wait_for_job(&http, &base, &token, &limited, "completed").await;
    assert_eq!(proxy.injected(), 2);
    assert_eq!(
        limited["job"]["attempt"], clean["job"]["attempt"],
        "{limited}"
    );
    let vector = |detail: &Value| {
        detail["receipts"]
            .as_array()
            .expect("receipts")
            .iter()
            .find(|receipt| receipt["backend"] == "vector")
            .cloned()
            .expect("vector receipt")
    };
    let remote_id = gateways::embedder::remote_model_id(&proxy.url(), SERVED_MODEL);
    assert_eq!(vector(&limited)["state"], "verified");
    assert_eq!(vector(&limited)["evidence"]["model"], remote_id.as_str());

    // The server dies mid-projection: jobs fail as `embedder_unavailable` and retry; once it
    // is back every one of them completes, verified. Nothing is lost.
    let mut revisions = Vec::new();
    for index in 0..12 {
        revisions.push(post(&http, &base, &token, &format!("doc-{index}"), &text(index)).await);
    }
    server.kill();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut retried = false;
    while !retried {
        for id in &revisions {
            let detail = revision(&http, &base, &token, id).await;
            if detail["job"]["last_error_code"] == "embedder_unavailable" {
                retried = true;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no job failed as embedder_unavailable while the server was down"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.start_again().expect("start the server again");
    for id in &revisions {
        let detail = wait_for_job(&http, &base, &token, id, "completed").await;
        assert_eq!(vector(&detail)["state"], "verified", "{detail}");
    }

    // Queries are embedded by the same server: an exact-text query finds its document with
    // cosine 1.
    let answer: Value = http
        .post(format!("{base}/v1/search"))
        .bearer_auth(&token)
        .json(&json!({ "query": text(7), "mode": "vector", "top_k": 3, "datasets": ["docs"] }))
        .send()
        .await
        .expect("search")
        .json()
        .await
        .expect("json");
    assert_eq!(answer["generation"].as_str().map(str::len), Some(18));
    let top = &answer["results"][0];
    assert!(top["score"].as_f64().expect("score") > 0.9999, "{answer}");
    assert_eq!(top["text"].as_str().map(str::trim), Some(text(7).trim()));
    cairn.kill().await.expect("stop");
    let _ = cairn.wait().await;

    // The generation records the server: pointed at another server (the same one without the
    // proxy), cairn refuses to start instead of mixing vectors into the old generation.
    let moved = refused_start(data.path(), &remote_env(&server.url(), "384"));
    assert!(
        moved.contains("differs from the active generation"),
        "{moved}"
    );
    // And a dimension the server does not answer with is found at start.
    let fresh = tempfile::tempdir().expect("tempdir");
    let wrong = refused_start(fresh.path(), &remote_env(&server.url(), "768"));
    assert!(wrong.contains("768") && wrong.contains("384"), "{wrong}");
}
