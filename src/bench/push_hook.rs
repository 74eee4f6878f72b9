//! `cairn bench push-hook`: push-to-searchable on loopback. A real `cairn serve` (this binary,
//! on the embedded default, with its workers) keeps a dataset equal to a remote repository
//! served by Debian's `git daemon`, runs a day apart. Each round commits a file with a word
//! of its own, pushes it, sends the push hook as GitHub signs it, and polls a lexical search
//! every 10 ms until the word is found: the time from the hook's request to the first answer
//! that finds it.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};

use super::connector::{commit, daemon, git};

/// How the push-hook benchmark runs.
#[derive(Debug, Clone)]
pub struct PushHookBench {
    /// Pushes measured.
    pub pushes: usize,
}

/// A `cairn serve` child, killed on drop.
struct Serve(std::process::Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn percentile(sorted: &[f64], at: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() - 1) as f64 * at).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Runs the benchmark and returns its JSON report.
pub async fn push_hook(bench: PushHookBench) -> anyhow::Result<Value> {
    let data = tempfile::tempdir().context("temporary data directory")?;
    let remotes = tempfile::tempdir().context("temporary remotes")?;
    let work = tempfile::tempdir().context("temporary work tree")?;
    let credentials = tempfile::tempdir().context("temporary credentials")?;
    git(remotes.path(), &["init", "--quiet", "--bare", "docs.git"])?;
    git(work.path(), &["init", "--quiet", "--initial-branch=main"])?;
    let served = remotes.path().join("docs.git");
    git(
        work.path(),
        &["remote", "add", "origin", &served.to_string_lossy()],
    )?;
    std::fs::write(work.path().join("start.md"), "# Start\n\nThe first page.")?;
    commit(work.path(), "first")?;
    git(work.path(), &["push", "--quiet", "origin", "main"])?;
    let secret = "bench-hook-secret";
    std::fs::write(
        credentials.path().join("hook.toml"),
        format!("hook_secret = \"{secret}\"\n"),
    )?;
    let (_daemon, port) = daemon(remotes.path())?;

    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let bind = listener.local_addr()?;
    drop(listener);
    let _serve = Serve(
        std::process::Command::new(std::env::current_exe()?)
            .arg("serve")
            .env("CAIRN_DATA_DIR", data.path())
            .env("CAIRN_BIND", bind.to_string())
            .env("CAIRN_CONNECTOR_REMOTE_HOSTS", "127.0.0.1")
            .env("CAIRN_CONNECTOR_CREDENTIALS_DIR", credentials.path())
            .env("CAIRN_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .context("starting cairn serve")?,
    );
    let base = format!("http://{bind}");
    let http = reqwest::Client::new();
    let started = Instant::now();
    loop {
        let ready = http.get(format!("{base}/healthz")).send().await;
        if ready.is_ok_and(|response| response.status().is_success()) {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "cairn serve did not answer /healthz within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let token = std::fs::read_to_string(crate::config::admin_token_path(data.path()))
        .context("the admin token")?
        .trim()
        .to_owned();
    let created: Value = http
        .post(format!("{base}/v1/connectors"))
        .bearer_auth(&token)
        .json(&json!({
            "dataset": "docs", "kind": "git", "ref": "main",
            "location": format!("git://127.0.0.1:{port}/docs.git"),
            "interval_ms": 86_400_000, "credentials": "hook.toml",
        }))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let id = created["connector"]["id"]
        .as_str()
        .context("a connector id")?
        .to_owned();
    let searching = |word: String| {
        let (http, base, token) = (http.clone(), base.clone(), token.clone());
        async move {
            let answer: Value = http
                .post(format!("{base}/v1/search"))
                .bearer_auth(&token)
                .json(&json!({"query": word, "mode": "lexical", "top_k": 5, "datasets": ["docs"]}))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            anyhow::Ok(
                answer["results"]
                    .as_array()
                    .is_some_and(|hits| !hits.is_empty()),
            )
        }
    };
    // The first run (at creation) has to end before the measured pushes.
    let started = Instant::now();
    while !searching("first".to_owned()).await? {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "the first run did not finish within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let mut seconds = Vec::new();
    let mut answered_ms = Vec::new();
    for round in 0..bench.pushes.max(1) {
        let word = format!("pushmarker{round}x");
        std::fs::write(
            work.path().join(format!("push-{round}.md")),
            format!("# Push {round}\n\nThis page carries {word}."),
        )?;
        commit(work.path(), &format!("push {round}"))?;
        git(work.path(), &["push", "--quiet", "origin", "main"])?;
        let body = serde_json::to_vec(&json!({"ref": "refs/heads/main"}))?;
        let signature = hex::encode(ring::hmac::sign(&key, &body).as_ref());
        let sent = Instant::now();
        let response = http
            .post(format!("{base}/v1/connectors/{id}/hook"))
            .header("content-type", "application/json")
            .header("x-github-event", "push")
            .header("x-github-delivery", format!("bench-{round}"))
            .header("x-hub-signature-256", format!("sha256={signature}"))
            .body(body)
            .send()
            .await?;
        answered_ms.push(sent.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(
            response.status().as_u16() == 202,
            "the hook answered {}",
            response.status()
        );
        while !searching(word.clone()).await? {
            anyhow::ensure!(
                sent.elapsed() < Duration::from_secs(60),
                "push {round} was not searchable within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let took = sent.elapsed().as_secs_f64();
        eprintln!("push-hook bench: push {round}: searchable after {took:.3} s");
        seconds.push(took);
        // A push that lands while the previous run still runs waits for the next run: the
        // rounds are apart, as pushes are.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    seconds.sort_by(f64::total_cmp);
    answered_ms.sort_by(f64::total_cmp);
    Ok(json!({
        "benchmark": "push-hook",
        "pushes": seconds.len(),
        "push_to_searchable_seconds": {
            "p50": percentile(&seconds, 0.5),
            "p90": percentile(&seconds, 0.9),
            "max": seconds.last().copied().unwrap_or(0.0),
        },
        "hook_answer_ms": {
            "p50": percentile(&answered_ms, 0.5),
            "max": answered_ms.last().copied().unwrap_or(0.0),
        },
        "interval_seconds": 86_400,
        "machine": super::machine(),
    }))
}
