//! Crash test: `cairn serve` (the built binary) takes 16 concurrent ingest clients, is killed
//! with SIGKILL mid-stream and restarted. Every receipt returned before the kill must resolve
//! after the restart, with retained bytes that match its sha256.
//!
//! The clients rewrite 8 keys each, so revisions supersede one another while the workers
//! project them in units of 32 (`workers.unit_jobs`), and the kill lands between a unit's
//! writes. After the restart every acknowledged revision ends verified or superseded, and a
//! scrub finds no drift: no point is flagged current for a revision that is not the head, and
//! no chunk is counted twice.

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

/// GETs `url` with `token`: asserts a 200 first, then answers the JSON body.
async fn get_json(http: &reqwest::Client, url: &str, token: &str) -> Value {
    let response = http
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap_or_else(|error| panic!("GET {url}: {error}"));
    assert_eq!(response.status().as_u16(), 200, "GET {url}");
    response
        .json()
        .await
        .unwrap_or_else(|error| panic!("GET {url}: not JSON: {error}"))
}

/// Keys each client rewrites, so later revisions supersede earlier ones.
const KEYS: usize = 8;

#[derive(Debug, Clone)]
struct Acknowledged {
    client: usize,
    item: usize,
    revision_id: String,
    sha256: String,
    content: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_no_acknowledged_receipt() {
    let directory = tempfile::tempdir().expect("tempdir");
    let units = [("CAIRN_WORKER_UNIT_JOBS", "32")];
    let (mut child, base) =
        spawn_serve_with(directory.path(), &[], &units, "warn", Stdio::inherit()).await;
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
                let body = json!({"dataset": "crash", "source_key": format!("{client}/{}", item % KEYS), "content": content});
                match http.post(format!("{base}/v1/sources")).bearer_auth(&token).json(&body).send().await {
                    Ok(response) if response.status().as_u16() == 202 => {
                        let receipt: Value = match response.json().await {
                            Ok(receipt) => receipt,
                            Err(_) => break, // the connection died mid-answer: not acknowledged
                        };
                        let ack = Acknowledged {
                            client,
                            item,
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

    let (mut restarted, base) = spawn_serve_with(
        directory.path(),
        &[],
        &[units[0], ("CAIRN_VERIFY_POINTS_PER_SECOND", "4000000000")],
        "warn",
        Stdio::inherit(),
    )
    .await;
    // Per key, the last acknowledged revision; per client, its last acknowledged item (the
    // next one may have been committed unacknowledged, superseding its key's last ack).
    let mut last_of_key = std::collections::HashMap::new();
    let mut last_item = std::collections::HashMap::new();
    for ack in &acknowledged {
        last_of_key.insert((ack.client, ack.item % KEYS), ack.revision_id.clone());
        let last = last_item.entry(ack.client).or_insert(ack.item);
        *last = (*last).max(ack.item);
    }
    let mut heads = Vec::new();
    for ack in &acknowledged {
        let detail = get_json(
            &http,
            &format!("{base}/v1/revisions/{}", ack.revision_id),
            &token,
        )
        .await;
        assert_eq!(
            detail["revision"]["content_sha256"],
            ack.sha256.as_str(),
            "receipt {} lost",
            ack.revision_id
        );
        let key = (ack.client, ack.item % KEYS);
        let last = last_of_key.get(&key) == Some(&ack.revision_id);
        let maybe_superseded_unacknowledged = last_item
            .get(&ack.client)
            .is_some_and(|item| (item + 1) % KEYS == key.1);
        if !last {
            assert_eq!(
                detail["is_head"], false,
                "{} is not its key's last",
                ack.revision_id
            );
        } else if !maybe_superseded_unacknowledged {
            assert_eq!(
                detail["is_head"], true,
                "{} is its key's last",
                ack.revision_id
            );
        }
        if detail["is_head"] == true {
            heads.push(ack.revision_id.clone());
        }
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
    let status = get_json(&http, &format!("{base}/v1/status"), &token).await;
    let sources = status["counts"]["sources"].as_u64().expect("sources");
    assert!(
        sources as usize >= last_of_key.len(),
        "{sources} sources for {} keys acknowledged",
        last_of_key.len()
    );
    eprintln!("{} receipts acknowledged before SIGKILL; all {} resolve after restart ({} sources committed, {} keys acknowledged)", acknowledged.len(), acknowledged.len(), sources, last_of_key.len());

    // Projection resumes: every job ends, every head is verified in each store, every other
    // acknowledged revision superseded or never projected, and a scrub finds no drift.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    loop {
        let status = get_json(&http, &format!("{base}/v1/status"), &token).await;
        let jobs = &status["counts"]["jobs"];
        let count = |state: &str| jobs[state].as_i64().unwrap_or(0);
        assert_eq!(count("dead") + count("quarantined"), 0, "{jobs}");
        if count("pending") + count("running") + count("retry_wait") == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "projection did not finish: {jobs}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for ack in &acknowledged {
        let detail = get_json(
            &http,
            &format!("{base}/v1/revisions/{}", ack.revision_id),
            &token,
        )
        .await;
        let states: Vec<&str> = detail["receipts"]
            .as_array()
            .expect("receipts")
            .iter()
            .map(|receipt| receipt["state"].as_str().unwrap_or(""))
            .collect();
        assert!(!states.is_empty(), "{detail}");
        if heads.contains(&ack.revision_id) {
            assert!(
                states.iter().all(|state| *state == "verified"),
                "head {} not verified: {detail}",
                ack.revision_id
            );
        } else {
            assert!(
                states.iter().all(|state| *state != "verified"),
                "superseded {} still verified: {detail}",
                ack.revision_id
            );
        }
    }
    assert!(!heads.is_empty(), "no acknowledged revision is a head");
    let scrub = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "verify", "--tier", "scrub", "--server", &base, "--token", &token,
        ])
        .env("CAIRN_LOG", "warn")
        .output()
        .expect("run cairn verify");
    assert_eq!(
        scrub.status.code(),
        Some(0),
        "drift after the crash: {}{}",
        String::from_utf8_lossy(&scrub.stdout),
        String::from_utf8_lossy(&scrub.stderr)
    );
    eprintln!(
        "{} heads verified, the rest superseded; scrub clean",
        heads.len()
    );
    restarted.start_kill().expect("stop");
    let _ = restarted.wait().await;
}
