//! The dashboard in headless Chromium, driven through WebDriver (Debian's `chromium` and
//! `chromium-driver`, which `.ci/run` installs): the leases table shows the running job with
//! its worker and a countdown, the retries table shows the retry with its rule, the dead job is
//! requeued from the page and moves, and a screenshot is saved.
//!
//! Set `CAIRN_CHROMIUM` / `CAIRN_CHROMEDRIVER` to use other binaries.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use receipts::{JobState, Scope};
use serde_json::{json, Value};

use crate::ops::seed;

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn binary(variable: &str, candidates: &[&str]) -> PathBuf {
    if let Ok(path) = std::env::var(variable) {
        return PathBuf::from(path);
    }
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
        .unwrap_or_else(|| {
            panic!(
                "{} not found: install Debian's `chromium` and `chromium-driver` (as .ci/run does) \
                 or set {variable}",
                candidates.join(" or ")
            )
        })
}

struct Driver {
    http: reqwest::Client,
    base: String,
    session: String,
    process: tokio::process::Child,
}

impl Driver {
    async fn start(profile: &std::path::Path) -> Driver {
        let chromium = binary(
            "CAIRN_CHROMIUM",
            &["/usr/bin/chromium", "/usr/bin/chromium-browser"],
        );
        let chromedriver = binary(
            "CAIRN_CHROMEDRIVER",
            &["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"],
        );
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
            listener.local_addr().expect("address").port()
        };
        let process = tokio::process::Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        let base = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        loop {
            let ready = http
                .get(format!("{base}/status"))
                .send()
                .await
                .ok()
                .map(|response| response.status().is_success())
                .unwrap_or(false);
            if ready {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let capabilities = json!({
            "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": chromium,
                    "args": [
                        "--headless", "--no-sandbox", "--disable-gpu",
                        "--disable-background-networking", "--no-first-run",
                        "--disable-dev-shm-usage", "--window-size=1400,1600",
                        format!("--user-data-dir={}", profile.display()),
                    ],
                },
            }},
        });
        let answer: Value = http
            .post(format!("{base}/session"))
            .json(&capabilities)
            .send()
            .await
            .expect("new session")
            .json()
            .await
            .expect("session answer");
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {answer}"))
            .to_owned();
        Driver {
            http,
            base,
            session,
            process,
        }
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut request = self.http.request(method, url);
        if !body.is_null() {
            request = request.json(&body);
        }
        let answer: Value = request
            .send()
            .await
            .expect("WebDriver request")
            .json()
            .await
            .expect("WebDriver answer");
        if answer["value"]["error"].is_string() {
            panic!("WebDriver {path}: {}", answer["value"]);
        }
        answer["value"].clone()
    }

    async fn go(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", json!({ "url": url }))
            .await;
    }

    async fn script(&self, script: &str, args: Value) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            json!({ "script": script, "args": args }),
        )
        .await
    }

    async fn click(&self, selector: &str) {
        let element = self
            .command(
                reqwest::Method::POST,
                "/element",
                json!({ "using": "css selector", "value": selector }),
            )
            .await;
        let id = element[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {selector}"))
            .to_owned();
        self.command(
            reqwest::Method::POST,
            &format!("/element/{id}/click"),
            json!({}),
        )
        .await;
    }

    /// Polls `script` until it returns a truthy value; returns it.
    async fn wait_for(&self, what: &str, script: &str, args: Value) -> Value {
        let started = Instant::now();
        loop {
            let value = self.script(script, args.clone()).await;
            let truthy = match &value {
                Value::Null | Value::Bool(false) => false,
                Value::String(text) => !text.is_empty(),
                _ => true,
            };
            if truthy {
                return value;
            }
            if started.elapsed() > Duration::from_secs(20) {
                let page = self
                    .script("return document.body.innerText", json!([]))
                    .await;
                panic!("timed out waiting for {what}; the page shows:\n{page}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        let value = self
            .command(reqwest::Method::GET, "/screenshot", Value::Null)
            .await;
        base64::engine::general_purpose::STANDARD
            .decode(value.as_str().expect("base64 screenshot"))
            .expect("png")
    }

    async fn quit(mut self) {
        let _ = self
            .http
            .delete(format!("{}/session/{}", self.base, self.session))
            .send()
            .await;
        let _ = self.process.kill().await;
    }
}

// Multi-threaded: the seeded worker's heartbeat (every second, on a 4 s lease) must not wait
// behind the test's own steps on a loaded machine, or the lease runs out mid-test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_leases_and_retries_and_requeues_from_the_page() {
    let seeded = seed(crate::common::Engine::Sqlite).await;
    let app = &seeded.app;
    let operator = app
        .token(
            "night-shift",
            &[Scope::OpsRead, Scope::OpsWrite, Scope::Search],
            None,
        )
        .await;
    let generation = receipts::Generation::new(
        "test-model",
        3,
        "chunker-a",
        &[receipts::Backend::Relational],
    );
    app.ledger
        .activate_generation(&generation, "test")
        .await
        .expect("generation");
    let (base, server) = app.listen().await;
    let profile = tempfile::tempdir().expect("profile");
    let driver = Driver::start(profile.path()).await;

    driver.go(&format!("{base}/ops")).await;
    // The page asks for the token once.
    driver
        .wait_for(
            "the sign-in form",
            "return !document.getElementById('login').hidden",
            json!([]),
        )
        .await;
    driver
        .script(
            "document.getElementById('token').value = arguments[0]; return true;",
            json!([operator]),
        )
        .await;
    driver.click("#login-form button[type=submit]").await;

    // Generations: the active one with its coverage of the current heads (none verified:
    // nothing was projected here).
    let generations = driver
        .wait_for(
            "the active generation",
            "const body = document.getElementById('generations-body'); \
             return body.innerText.includes(arguments[0]) ? body.innerText : null;",
            json!([generation.id]),
        )
        .await;
    let generations = generations.as_str().expect("generations text");
    assert!(generations.contains("active"), "{generations}");
    assert!(generations.contains("0 of 7"), "{generations}");
    assert!(generations.contains(&generation.model), "{generations}");

    // Leases: the running job with its worker, stage and a lease countdown.
    let running = seeded.running.id.to_string();
    let row = driver
        .wait_for(
            "the running job in the leases table",
            "const row = document.querySelector(`#leases-body tr[data-job='${arguments[0]}']`); \
             return row ? row.innerText : null;",
            json!([running]),
        )
        .await;
    let row = row.as_str().expect("row text");
    assert!(row.contains("host-b:202:worker-1"), "{row}");
    assert!(row.contains("embedding"), "{row}");
    let countdown = driver
        .script(
            "return document.querySelector(`#leases-body tr[data-job='${arguments[0]}'] .countdown`).innerText",
            json!([running]),
        )
        .await;
    let countdown = countdown.as_str().expect("countdown").to_owned();
    let seconds: f64 = countdown
        .trim_end_matches(" s")
        .parse()
        .unwrap_or_else(|_| panic!("countdown `{countdown}` is not in seconds"));
    assert!(
        seconds > 0.0 && seconds <= 4.0,
        "lease countdown {countdown}"
    );

    // Retries: the retry with the rule that set its time and its error.
    let retry = driver
        .wait_for(
            "the retry in the retries table",
            "const row = document.querySelector(`#retries-body tr[data-job='${arguments[0]}']`); \
             return row ? row.innerText : null;",
            json!([seeded.retrying.id.to_string()]),
        )
        .await;
    let retry = retry.as_str().expect("retry text");
    assert!(retry.contains("backoff after attempt 1"), "{retry}");
    assert!(retry.contains("vector_unavailable"), "{retry}");

    // Dead: requeue from the page, confirm, and see it leave the dead table.
    let dead = seeded.dead.id.to_string();
    driver
        .wait_for(
            "the dead job",
            "return !!document.querySelector(`#dead-body tr[data-job='${arguments[0]}']`)",
            json!([dead]),
        )
        .await;
    let screenshot = driver.screenshot().await;
    driver
        .click(&format!(
            "#dead-body button[data-action=requeue][data-id='{dead}']"
        ))
        .await;
    driver
        .wait_for(
            "the confirmation",
            "return getComputedStyle(document.getElementById('modal')).display !== 'none'",
            json!([]),
        )
        .await;
    driver
        .script(
            "document.getElementById('modal-reason').value = 'fixed the encoding'; return true;",
            json!([]),
        )
        .await;
    driver.click("#modal-yes").await;
    driver
        .wait_for(
            "the requeued job to leave the dead table",
            "return document.getElementById('dead-body').innerText.length > 0 && \
             !document.querySelector(`#dead-body tr[data-job='${arguments[0]}']`)",
            json!([dead]),
        )
        .await;
    let job = app
        .ledger
        .job(seeded.dead.id)
        .await
        .expect("job")
        .expect("exists");
    assert_eq!(job.state, JobState::Pending);
    let history = app.ledger.history("job", &dead).await.expect("history");
    let last = history.last().expect("entry");
    assert_eq!(last.actor, "token:night-shift");
    assert!(last.cause.contains("fixed the encoding"), "{last:?}");

    // Search documents: a hit names the section of its document it lies in.
    let mut guide = receipts::Submission::text(
        "alpha",
        "guide.md",
        "test",
        "# Guide\n\nIntro words.\n\n## Install\n\nRun the zebrafish installer.\n",
    );
    if let receipts::Change::Put(document) = &mut guide.change {
        document.media_type = "text/markdown".to_owned();
    }
    for result in app.ledger.accept(vec![guide]).await {
        result.expect("accepted");
    }
    driver
        .script(
            "document.getElementById('query-q').value = 'zebrafish installer'; \
             document.getElementById('query-mode').value = 'lexical'; \
             document.getElementById('query-form').requestSubmit(); return true;",
            json!([]),
        )
        .await;
    let hit = driver
        .wait_for(
            "the search hit",
            "const body = document.getElementById('query-body').innerText; \
             return body.includes('guide.md') ? body : null;",
            json!([]),
        )
        .await;
    let hit = hit.as_str().expect("hit text");
    assert!(hit.contains("alpha/guide.md"), "{hit}");
    assert!(hit.contains("# Guide > ## Install"), "{hit}");

    // The same search narrowed by the search API's filter, with facet counts over every
    // source it selects.
    let mut notes = receipts::Submission::text(
        "alpha",
        "notes.md",
        "test",
        "# Notes\n\nThe zebrafish installer needs a second run.\n",
    );
    if let receipts::Change::Put(document) = &mut notes.change {
        document.media_type = "text/markdown".to_owned();
        document.tags = vec!["draft".to_owned()];
    }
    for result in app.ledger.accept(vec![notes]).await {
        result.expect("accepted");
    }
    driver
        .script(
            "document.getElementById('query-filter').value = '{\"field\": \"tags\", \"any\": [\"draft\"]}'; \
             document.getElementById('query-facets').value = 'tags, media_type'; \
             document.getElementById('query-form').requestSubmit(); return true;",
            json!([]),
        )
        .await;
    let narrowed = driver
        .wait_for(
            "the filtered hit and its facets",
            "const body = document.getElementById('query-body').innerText; \
             const facets = document.getElementById('query-facets-out').innerText; \
             return body.includes('notes.md') && facets.includes('tags') ? body + '\\n' + facets : null;",
            json!([]),
        )
        .await;
    let narrowed = narrowed.as_str().expect("text");
    assert!(!narrowed.contains("guide.md"), "{narrowed}");
    assert!(narrowed.contains("tags: draft 1"), "{narrowed}");
    assert!(
        narrowed.contains("media_type: text/markdown 1"),
        "{narrowed}"
    );
    // A filter that is not JSON is refused on the page, before any request.
    driver
        .script(
            "document.getElementById('query-filter').value = '{nope'; \
             document.getElementById('query-form').requestSubmit(); return true;",
            json!([]),
        )
        .await;
    driver
        .wait_for(
            "the filter's refusal",
            "return document.getElementById('error').innerText.includes('not JSON') || null;",
            json!([]),
        )
        .await;

    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ops-dashboard.png");
    std::fs::write(&path, &screenshot).expect("screenshot");
    assert!(screenshot.starts_with(b"\x89PNG"), "a PNG screenshot");
    eprintln!("dashboard screenshot: {}", path.display());
    driver.quit().await;
    server.abort();
}
