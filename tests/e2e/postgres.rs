//! PostgreSQL restarted under a running deployment (`cairn serve` with the API only and a
//! `cairn worker` process, both on one PostgreSQL): while the server is down the API answers
//! 503 `ledger_unavailable` with `Retry-After` (never a hang or a panic); once it is back, the
//! API and the worker resume by themselves, every acknowledged receipt is there and every job
//! completes.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::postgres::PostgresServer;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

async fn post(http: &reqwest::Client, base: &str, token: &str, key: &str) -> reqwest::Response {
    let body =
        json!({"dataset": "restart", "source_key": key, "content": format!("document {key}")});
    http.post(format!("{base}/v1/sources"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("the API answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_mid_run_loses_nothing_and_everyone_resumes() {
    let mut server = PostgresServer::start().expect("start PostgreSQL");
    let url = server.create_database("restart").expect("database");
    let directory = tempfile::tempdir().expect("tempdir");
    let (mut api, base) = crate::crash::spawn_serve_with(
        directory.path(),
        &["--ledger", &url],
        &[("CAIRN_WORKERS", "0")],
        "error",
        Stdio::inherit(),
    )
    .await;
    let mut worker = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "worker",
            "--ledger",
            &url,
            "--simulate-work-ms",
            "5",
            "--data-dir",
        ])
        .arg(directory.path().join("worker"))
        .env("CAIRN_LOG", "error")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn worker");
    let mut lines = BufReader::new(worker.stdout.take().expect("stdout")).lines();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let token = std::fs::read_to_string(directory.path().join("admin.token"))
        .expect("admin token")
        .trim()
        .to_owned();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");

    let mut acknowledged = Vec::new();
    for index in 0..50 {
        let response = post(&http, &base, &token, &format!("before/{index}")).await;
        assert_eq!(response.status().as_u16(), 202);
        let receipt: Value = response.json().await.expect("receipt");
        acknowledged.push(
            receipt["source_revision_id"]
                .as_str()
                .expect("id")
                .to_owned(),
        );
    }

    server.stop();
    for index in 0..3 {
        let started = std::time::Instant::now();
        let response = post(&http, &base, &token, &format!("down/{index}")).await;
        assert_eq!(response.status().as_u16(), 503, "while PostgreSQL is down");
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the refusal took {:?}",
            started.elapsed()
        );
        assert!(
            response.headers().get("retry-after").is_some(),
            "503 without Retry-After"
        );
        let body: Value = response.json().await.expect("typed error");
        assert_eq!(body["code"], "ledger_unavailable", "{body}");
    }

    server.start_again().expect("restart PostgreSQL");
    // The API's pool reconnects by itself: the next acceptances succeed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut index = 0;
    while acknowledged.len() < 100 {
        let response = post(&http, &base, &token, &format!("after/{index}")).await;
        index += 1;
        match response.status().as_u16() {
            202 => {
                let receipt: Value = response.json().await.expect("receipt");
                acknowledged.push(
                    receipt["source_revision_id"]
                        .as_str()
                        .expect("id")
                        .to_owned(),
                );
            }
            503 => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the API did not recover"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("unexpected HTTP {other} after the restart"),
        }
    }

    // The worker resumes by itself and finishes everything; every receipt is there.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let status: Value = http
            .get(format!("{base}/v1/status"))
            .bearer_auth(&token)
            .send()
            .await
            .expect("status")
            .json()
            .await
            .expect("json");
        let jobs = &status["counts"]["jobs"];
        if jobs["completed"].as_i64() == Some(100) && jobs.as_object().map(|o| o.len()) == Some(1) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "jobs did not all complete after the restart: {jobs}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for revision in &acknowledged {
        let response = http
            .get(format!("{base}/v1/revisions/{revision}"))
            .bearer_auth(&token)
            .send()
            .await
            .expect("revision");
        assert_eq!(response.status().as_u16(), 200, "receipt {revision} lost");
    }
    for child in [&mut worker, &mut api] {
        child.start_kill().expect("stop");
        let _ = child.wait().await;
    }
}
