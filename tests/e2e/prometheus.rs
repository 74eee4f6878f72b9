//! The metrics exposition: every family cairn can name up front exists from the first scrape
//! with help text, Prometheus's own linter (promtool) accepts it, and a real Prometheus server
//! scrapes `/metrics` with a bearer token.

use std::process::Stdio;
use std::time::{Duration, Instant};

use ops::metrics::METRICS;

use crate::common::app;

/// Families whose labels are only known once something happens: a dataset's first job event,
/// a projection stage, a request to a route, a connector's first successful run, a webhook.
const LABELLED_BY_EVENTS: [&str; 14] = [
    "cairn_sync_last_success_timestamp_seconds",
    "cairn_verify_last_complete_seconds",
    "cairn_verify_open_drift",
    "cairn_job_claims_total",
    "cairn_job_completions_total",
    "cairn_job_retries_scheduled_total",
    "cairn_job_quarantines_total",
    "cairn_job_failures_total",
    "cairn_lease_rescues_total",
    "cairn_projection_stage_seconds",
    "cairn_http_request_duration_seconds",
    "cairn_webhook_deliveries",
    "cairn_webhook_oldest_undelivered_seconds",
    "cairn_webhook_events_behind",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_exist_from_the_start_with_help_and_pass_promtool() {
    let app = app().await;
    let (base, server) = app.listen().await;
    let text = crate::common::scrape(&base, &app.admin).await;
    for (name, _, _) in METRICS {
        if LABELLED_BY_EVENTS.contains(name) || name.starts_with("cairn_http_requests") {
            continue;
        }
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "{name} is missing from a fresh server's exposition:\n{text}"
        );
    }
    // Every family shown has its help text.
    for line in text.lines().filter(|line| line.starts_with("# TYPE ")) {
        let name = line.split_whitespace().nth(2).expect("name");
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "{name} has no help text"
        );
    }
    // After a request, the HTTP families are there too; promtool finds nothing to fix.
    let text = crate::common::scrape(&base, &app.admin).await;
    assert!(text
        .contains("cairn_http_requests_total{route=\"/metrics\",method=\"GET\",status=\"200\"}"));
    let mut promtool = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (scripts/setup-prometheus installs it)");
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = promtool.stdin.take().expect("stdin");
        stdin.write_all(text.as_bytes()).await.expect("write");
    }
    let output = promtool.wait_with_output().await.expect("promtool");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && report.trim().is_empty(),
        "promtool: {report}"
    );
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_with_the_bearer_token() {
    let app = app().await;
    app.put(
        &app.admin,
        serde_json::json!({"dataset": "docs", "source_key": "a", "content": "scraped"}),
    )
    .await;
    let (base, server) = app.listen().await;
    let directory = tempfile::tempdir().expect("tempdir");
    let token_file = directory.path().join("token");
    std::fs::write(&token_file, &app.admin).expect("token");
    let target = base.trim_start_matches("http://");
    let config = directory.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: cairn\n    \
             authorization:\n      credentials_file: {}\n    static_configs:\n      - targets: \
             ['{target}']\n",
            token_file.display()
        ),
    )
    .expect("config");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port();
    let mut prometheus = tokio::process::Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            directory.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("prometheus (scripts/setup-prometheus installs it)");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let sources = loop {
        let answer = client
            .get(format!("http://127.0.0.1:{port}/api/v1/query"))
            .query(&[("query", "cairn_sources and on() up{job=\"cairn\"} == 1")])
            .send()
            .await;
        if let Ok(answer) = answer {
            if let Ok(body) = answer.json::<serde_json::Value>().await {
                if let Some(value) = body["data"]["result"][0]["value"][1].as_str() {
                    break value.to_owned();
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus did not scrape cairn within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(sources, "1");
    let _ = prometheus.start_kill();
    let _ = prometheus.wait().await;
    server.abort();
}
