//! Crash test: `cairn serve` (the built binary) takes 16 concurrent ingest clients, is killed
//! with SIGKILL mid-stream and restarted. Every receipt returned before the kill must resolve
//! after the restart, with retained bytes that match its sha256.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Starts `cairn serve` on a free port; returns the child and its base URL.
pub(crate) async fn start(data_dir: &Path) -> (Child, String) {
    spawn_serve(data_dir, "warn", Stdio::inherit()).await
}

/// Starts `cairn serve` on a free port with a log filter and where its stderr goes; returns
/// the child (its stderr taken when piped) and its base URL.
pub(crate) async fn spawn_serve(data_dir: &Path, log: &str, stderr: Stdio) -> (Child, String) {
    spawn_serve_with(data_dir, &[], &[], log, stderr).await
}

/// [`spawn_serve`] with more arguments and environment variables.
pub(crate) async fn spawn_serve_with(
    data_dir: &Path,
    args: &[&str],
    envs: &[(&str, &str)],
    log: &str,
    stderr: Stdio,
) -> (Child, String) {
    // A free port unless the caller binds one (a resource whose public URL must be known
    // before the server starts).
    let bind: &[&str] = if args.contains(&"--bind") {
        &[]
    } else {
        &["--bind", "127.0.0.1:0"]
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("serve")
        .args(bind)
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .envs(envs.iter().copied())
        .env(
            "CAIRN_MODELS_DIR",
            concat!(env!("CARGO_MANIFEST_DIR"), "/models"),
        )
        .env("CAIRN_LOG", log)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn cairn serve");
    let base = await_line(&mut child, Duration::from_secs(60), |line| {
        line.strip_prefix("listening on ")
            .map(|address| address.trim().to_owned())
    })
    .await
    .unwrap_or_else(|| panic!("cairn serve did not start listening within 60 s"));
    (child, base)
}

/// Reads `child`'s stdout until `ready` finds what it waits for in a line, within `limit`;
/// `None` when the output ends or time runs out first. Then keeps draining stdout, so the
/// child never blocks on a full pipe.
pub(crate) async fn await_line<T>(
    child: &mut Child,
    limit: Duration,
    mut ready: impl FnMut(&str) -> Option<T>,
) -> Option<T> {
    let stdout = child.stdout.take().expect("stdout piped");
    let mut lines = BufReader::new(stdout).lines();
    let found = tokio::time::timeout(limit, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(found) = ready(&line) {
                return Some(found);
            }
        }
        None
    })
    .await
    .ok()
    .flatten();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    found
}

#[derive(Debug, Clone)]
struct Acknowledged {
    revision_id: String,
    sha256: String,
    content: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_no_acknowledged_receipt() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (mut child, base) = start(directory.path()).await;
    let token = std::fs::read_to_string(directory.path().join("admin.token"))
        .expect("admin token")
        .trim()
        .to_owned();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");

    let acknowledged: Arc<Mutex<Vec<Acknowledged>>> = Arc::default();
    let mut clients = Vec::new();
    for client in 0..16 {
        let (http, base, token, acknowledged) = (
            http.clone(),
            base.clone(),
            token.clone(),
            acknowledged.clone(),
        );
        clients.push(tokio::spawn(async move {
            for item in 0.. {
                let content = format!("client {client} document {item}: {}", "durable bytes ".repeat(item % 50 + 1));
                let body = json!({"dataset": "crash", "source_key": format!("{client}/{item}"), "content": content});
                match http.post(format!("{base}/v1/sources")).bearer_auth(&token).json(&body).send().await {
                    Ok(response) if response.status().as_u16() == 202 => {
                        let receipt: Value = match response.json().await {
                            Ok(receipt) => receipt,
                            Err(_) => break, // the connection died mid-answer: not acknowledged
                        };
                        let ack = Acknowledged {
                            revision_id: receipt["source_revision_id"].as_str().expect("id").to_owned(),
                            sha256: receipt["content_sha256"].as_str().expect("sha").to_owned(),
                            content,
                        };
                        acknowledged.lock().expect("lock").push(ack);
                    }
                    Ok(response) => panic!("unexpected answer before the kill: HTTP {}", response.status()),
                    Err(_) => break, // the server is gone: this request was never acknowledged
                }
            }
        }));
    }

    // Kill once a few hundred receipts are out, while all 16 clients are mid-stream.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while acknowledged.lock().expect("lock").len() < 400 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "too few receipts before the deadline"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reap");
    for client in clients {
        client.await.expect("client task");
    }
    let acknowledged = acknowledged.lock().expect("lock").clone();
    assert!(acknowledged.len() >= 400);

    let (mut restarted, base) = start(directory.path()).await;
    for ack in &acknowledged {
        let detail: Value = http
            .get(format!("{base}/v1/revisions/{}", ack.revision_id))
            .bearer_auth(&token)
            .send()
            .await
            .expect("revision request")
            .json()
            .await
            .expect("revision json");
        assert_eq!(
            detail["revision"]["content_sha256"],
            ack.sha256.as_str(),
            "receipt {} lost",
            ack.revision_id
        );
        assert_eq!(detail["is_head"], true);
        assert!(
            detail["job"]["id"].is_string(),
            "receipt {} has no projection job",
            ack.revision_id
        );
        let bytes = http
            .get(format!("{base}/v1/revisions/{}/content", ack.revision_id))
            .bearer_auth(&token)
            .send()
            .await
            .expect("content request")
            .bytes()
            .await
            .expect("content bytes");
        assert_eq!(receipts::ids::sha256_hex(&bytes), ack.sha256);
        assert_eq!(bytes.as_ref(), ack.content.as_bytes());
    }
    let status: Value = http
        .get(format!("{base}/v1/status"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("status")
        .json()
        .await
        .expect("status json");
    let sources = status["counts"]["sources"].as_u64().expect("sources");
    assert!(
        sources as usize >= acknowledged.len(),
        "{sources} sources for {} receipts",
        acknowledged.len()
    );
    eprintln!("{} receipts acknowledged before SIGKILL; all {} resolve after restart ({} sources committed)", acknowledged.len(), acknowledged.len(), sources);
    restarted.start_kill().expect("stop");
    let _ = restarted.wait().await;
}
