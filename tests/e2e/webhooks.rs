//! Webhooks through `cairn serve`, delivered to real receivers that verify every signature
//! with PyPI's `standardwebhooks` (tests/webhooks/receiver.py): a burst of acceptances with a
//! SIGKILL in the middle, where every acknowledged revision's `receipt.verified` still
//! arrives, in each source's order, and nothing arrives for a revision that does not exist;
//! receivers that are slow, fail for a while, never answer or answer 410, beside a healthy
//! one that none of them holds up; dead deliveries retried and replayed; refused URLs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn python() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv-webhooks/bin/python")
}

/// The reference receiver, on a port chosen before its secrets are known.
struct Receiver {
    child: Option<tokio::process::Child>,
    port: u16,
}

impl Receiver {
    fn reserve() -> Receiver {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        Receiver { child: None, port }
    }

    fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/{name}", self.port)
    }

    /// Starts it with `NAME=SECRET[,MODE=VALUE]` arguments.
    async fn start(&mut self, names: &[String]) {
        let mut child = tokio::process::Command::new(python())
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/webhooks/receiver.py"
            ))
            .arg(self.port.to_string())
            .args(names)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the receiver (scripts/setup-webhooks)");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
        let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the receiver started in time")
            .expect("read");
        assert_eq!(ready.as_deref(), Some("listening"));
        self.child = Some(child);
    }

    async fn log(&self) -> Vec<Value> {
        reqwest::get(format!("http://127.0.0.1:{}/log", self.port))
            .await
            .expect("log")
            .text()
            .await
            .expect("text")
            .lines()
            .map(|line| serde_json::from_str(line).expect("json line"))
            .collect()
    }

    /// The deliveries to `name` it saw, each with its event parsed.
    async fn seen(&self, name: &str) -> Vec<(Value, Value)> {
        self.log()
            .await
            .into_iter()
            .filter(|entry| entry["path"] == format!("/{name}"))
            .map(|entry| {
                let event: Value = serde_json::from_str(entry["body"].as_str().unwrap_or("{}"))
                    .expect("an event body");
                (entry, event)
            })
            .collect()
    }
}

async fn create(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    body: Value,
) -> (reqwest::StatusCode, Value) {
    let response = http
        .post(format!("{base}/v1/webhooks"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("POST /v1/webhooks");
    let status = response.status();
    (status, response.json().await.expect("json"))
}

async fn created(http: &reqwest::Client, base: &str, token: &str, body: Value) -> (String, String) {
    let (status, answer) = create(http, base, token, body).await;
    assert_eq!(status.as_u16(), 201, "{answer}");
    (
        answer["webhook"]["id"].as_str().expect("id").to_owned(),
        answer["secret"].as_str().expect("secret").to_owned(),
    )
}

async fn get(http: &reqwest::Client, url: String, token: &str) -> Value {
    let response = http.get(url).bearer_auth(token).send().await.expect("GET");
    assert!(response.status().is_success(), "{}", response.status());
    response.json().await.expect("json")
}

/// Waits until `done` holds for what `name` received, or fails after `limit`.
async fn await_seen(
    receiver: &Receiver,
    name: &str,
    limit: Duration,
    done: impl Fn(&[(Value, Value)]) -> bool,
) -> Vec<(Value, Value)> {
    let deadline = Instant::now() + limit;
    loop {
        let seen = receiver.seen(name).await;
        if done(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "{name} did not receive in time: {} deliveries",
            seen.len()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn envs() -> Vec<(&'static str, &'static str)> {
    vec![
        ("CAIRN_WEBHOOKS_ALLOW_HOSTS", "127.0.0.1"),
        ("CAIRN_WEBHOOKS_BACKOFF_BASE_MS", "200"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_revision_is_delivered_across_a_sigkill() {
    let directory = tempfile::tempdir().expect("tempdir");
    let data = directory.path().join("data");
    let envs = envs();
    let (mut child, base) =
        crate::crash::spawn_serve_with(&data, &[], &envs, "warn", std::process::Stdio::inherit())
            .await;
    let token = crate::common::admin_token(&data);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let mut receiver = Receiver::reserve();
    let (_, secret) = created(
        &http,
        &base,
        &token,
        json!({"url": receiver.url("all"), "events": ["receipt.verified"], "description": "burst"}),
    )
    .await;
    receiver.start(&[format!("all={secret}")]).await;

    // 16 clients put sources until 1,000 are acknowledged, then cairn is killed mid-burst
    // (at most 2,000 are sent). Each source has two revisions in a row when the burst
    // allows, so a source's events have an order to keep.
    let acknowledged: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut clients = Vec::new();
    for client in 0..16 {
        let (http, base, token, acknowledged, sent) = (
            http.clone(),
            base.clone(),
            token.clone(),
            acknowledged.clone(),
            sent.clone(),
        );
        clients.push(tokio::spawn(async move {
            for item in 0.. {
                if sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 2_000 {
                    break;
                }
                let key = format!("{client}/{}", item / 2);
                let body = json!({"dataset": "burst", "source_key": key, "content": format!("client {client} item {item}: a short note")});
                match http.post(format!("{base}/v1/sources")).bearer_auth(&token).json(&body).send().await {
                    Ok(response) if response.status().as_u16() == 202 => match response.json::<Value>().await {
                        Ok(receipt) => acknowledged.lock().expect("lock").push((
                            key,
                            receipt["source_revision_id"].as_str().expect("id").to_owned(),
                        )),
                        Err(_) => break,
                    },
                    Ok(response) => panic!("unexpected answer before the kill: HTTP {}", response.status()),
                    Err(_) => break,
                }
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while acknowledged.lock().expect("lock").len() < 1_000 {
        assert!(Instant::now() < deadline, "too few acceptances in time");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reap");
    for client in clients {
        client.await.expect("client task");
    }
    let acknowledged = acknowledged.lock().expect("lock").clone();
    let (mut restarted, base) =
        crate::crash::spawn_serve_with(&data, &[], &envs, "warn", std::process::Stdio::inherit())
            .await;

    // A revision that was superseded before it was projected is never verified; the heads
    // always are. Wait for every acknowledged head's `receipt.verified` for all stores.
    let mut heads: BTreeMap<String, String> = BTreeMap::new();
    for (key, revision) in &acknowledged {
        heads.insert(key.clone(), revision.clone());
    }
    let wanted: BTreeSet<String> = heads.values().cloned().collect();
    let seen = await_seen(&receiver, "all", Duration::from_secs(600), |seen| {
        let verified: BTreeSet<&str> = seen
            .iter()
            .filter(|(_, event)| event["data"]["backend"] == "all")
            .filter_map(|(_, event)| event["revision_id"].as_str())
            .collect();
        wanted
            .iter()
            .all(|revision| verified.contains(revision.as_str()))
    })
    .await;
    // Every delivery verified; each event names a revision that exists; a source's events
    // arrive in sequence order (a duplicate after the kill comes before anything later).
    let mut last_seq: BTreeMap<String, i64> = BTreeMap::new();
    let mut revisions: BTreeSet<String> = BTreeSet::new();
    let mut ids: BTreeSet<String> = BTreeSet::new();
    for (entry, event) in &seen {
        assert_eq!(entry["verified"], true, "{entry}");
        assert_eq!(entry["id"], event["id"], "webhook-id is the event's id");
        let seq = event["seq"].as_i64().expect("seq");
        let key = event["source_key"].as_str().expect("source key").to_owned();
        let previous = last_seq.insert(key.clone(), seq).unwrap_or(0);
        let duplicate = ids.contains(event["id"].as_str().expect("id"));
        assert!(
            seq >= previous || duplicate,
            "source {key}: event {seq} arrived after {previous}"
        );
        ids.insert(event["id"].as_str().expect("id").to_owned());
        revisions.insert(event["revision_id"].as_str().expect("revision").to_owned());
    }
    for revision in &revisions {
        let response = http
            .get(format!("{base}/v1/revisions/{revision}"))
            .bearer_auth(&token)
            .send()
            .await
            .expect("revision");
        assert_eq!(
            response.status().as_u16(),
            200,
            "an event for revision {revision}, which does not exist"
        );
    }
    eprintln!(
        "{} acknowledged ({} heads) before SIGKILL; {} deliveries received ({} distinct events)",
        acknowledged.len(),
        wanted.len(),
        seen.len(),
        ids.len()
    );
    restarted.start_kill().expect("stop");
    let _ = restarted.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_receivers_back_off_alone_and_dead_deliveries_come_back() {
    let directory = tempfile::tempdir().expect("tempdir");
    let data = directory.path().join("data");
    let mut envs = envs();
    // An attempt may take 3 s: the slow receiver (0.5 s) stays well inside it on a loaded
    // machine, the silent one never answers.
    envs.push(("CAIRN_WEBHOOKS_ATTEMPT_TIMEOUT_MS", "3000"));
    envs.push(("CAIRN_WEBHOOKS_RETRY_FOR_SECONDS", "40"));
    let (mut child, base) =
        crate::crash::spawn_serve_with(&data, &[], &envs, "warn", std::process::Stdio::inherit())
            .await;
    let token = crate::common::admin_token(&data);
    let http = reqwest::Client::new();

    // Refused targets: nothing is created.
    for url in [
        "http://169.254.169.254/latest/meta-data",
        "https://10.0.0.7/hook",
        "https://[::1]/hook",
        "ftp://example.com/hook",
        "https://user:pw@example.com/hook",
    ] {
        let (status, answer) = create(&http, &base, &token, json!({"url": url})).await;
        assert_eq!(status.as_u16(), 422, "{url}: {answer}");
        assert_eq!(answer["code"], "webhook_url_refused", "{url}: {answer}");
    }
    let (status, answer) = create(
        &http,
        &base,
        &token,
        json!({"url": "https://example.com/x", "events": ["receipt.nope"]}),
    )
    .await;
    assert_eq!(status.as_u16(), 422, "{answer}");
    assert_eq!(answer["code"], "invalid_event_type");

    let mut receiver = Receiver::reserve();
    let mut names = Vec::new();
    let mut ids = BTreeMap::new();
    for (name, mode) in [
        ("ok", ""),
        ("slow", ",delay=0.5"),
        ("flaky", ",fail_for=30"),
        ("silent", ",hang=1"),
        ("gone", ",gone=1"),
    ] {
        let (id, secret) = created(
            &http,
            &base,
            &token,
            json!({"url": receiver.url(name), "events": ["receipt.verified"], "datasets": ["misbehave"], "description": name}),
        )
        .await;
        names.push(format!("{name}={secret}{mode}"));
        ids.insert(name, id);
    }
    let listed = get(&http, format!("{base}/v1/webhooks"), &token).await;
    assert_eq!(listed["webhooks"].as_array().map(Vec::len), Some(5));
    assert!(
        !listed.to_string().contains("whsec_"),
        "a secret is shown only once"
    );
    receiver.start(&names).await;
    let mut revisions = BTreeSet::new();
    for item in 0..4 {
        let revision = crate::common::post_source(
            &http,
            &base,
            &token,
            &json!({"dataset": "misbehave", "source_key": format!("doc-{item}.md"), "content": format!("note {item}")}),
        )
        .await;
        revisions.insert(revision);
    }
    let all_verified = |seen: &[(Value, Value)]| {
        let got: BTreeSet<&str> = seen
            .iter()
            .filter(|(entry, event)| entry["status"] == 204 && event["data"]["backend"] == "all")
            .filter_map(|(_, event)| event["revision_id"].as_str())
            .collect();
        revisions
            .iter()
            .all(|revision| got.contains(revision.as_str()))
    };
    // The healthy receiver is not held up by the others.
    let ok = await_seen(&receiver, "ok", Duration::from_secs(120), all_verified).await;
    await_seen(&receiver, "slow", Duration::from_secs(120), all_verified).await;
    // The receiver that fails for 30 s gets everything once it recovers, after retries that
    // back off (fewer attempts than a fixed 200 ms retry would make).
    let flaky = await_seen(&receiver, "flaky", Duration::from_secs(120), all_verified).await;
    let failures = flaky
        .iter()
        .filter(|(entry, _)| entry["status"] == 500)
        .count();
    let events = flaky
        .iter()
        .filter(|(entry, _)| entry["status"] == 204)
        .count();
    assert!(failures > 0, "the flaky receiver failed first");
    assert!(
        failures <= events * 12,
        "{failures} failed attempts for {events} events: retries did not back off"
    );
    // Every event reached the healthy receiver before the failing one accepted its first
    // (which it cannot do for 30 s): the healthy one never waited for the other.
    let at = |entries: &[(Value, Value)]| -> Vec<f64> {
        entries
            .iter()
            .filter(|(entry, _)| entry["status"] == 204)
            .filter_map(|(entry, _)| entry["at"].as_f64())
            .collect()
    };
    let healthy_done = at(&ok).into_iter().fold(f64::MIN, f64::max);
    let flaky_first = at(&flaky).into_iter().fold(f64::MAX, f64::min);
    assert!(
        healthy_done < flaky_first,
        "the healthy receiver finished at {healthy_done}, after the failing one recovered at {flaky_first}"
    );
    // 410: the subscription is disabled, with the reason.
    let gone = get(&http, format!("{base}/v1/webhooks/{}", ids["gone"]), &token).await;
    assert_eq!(gone["webhook"]["state"], "disabled", "{gone}");
    assert!(gone["history"]
        .as_array()
        .expect("history")
        .iter()
        .any(|entry| entry["event"] == "disable" && entry["actor"] == "cairn:webhooks"));
    // The silent receiver's deliveries die when their 40 s span is spent; then an operator
    // retries them (pending again) and discards them.
    let silent = &ids["silent"];
    let deadline = Instant::now() + Duration::from_secs(120);
    let dead = loop {
        let dead = get(
            &http,
            format!("{base}/v1/webhooks/{silent}/deliveries?state=dead"),
            &token,
        )
        .await;
        let count = dead["deliveries"].as_array().map_or(0, Vec::len);
        if count >= revisions.len() {
            break dead;
        }
        assert!(Instant::now() < deadline, "no dead deliveries: {dead}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(dead["deliveries"][0]["attempt"].as_i64().expect("attempt") >= 2);
    assert!(dead["deliveries"][0]["last_error"]
        .as_str()
        .is_some_and(|error| error.contains("in time")));
    let seq = dead["deliveries"][0]["seq"].as_i64().expect("seq");
    let retried = crate::common::cairn_json(
        &data,
        &base,
        &["webhook", "retry", silent, "--seq", &seq.to_string()],
    );
    assert_eq!(retried["deliveries"], 1, "{retried}");
    let discarded = crate::common::cairn_json(&data, &base, &["webhook", "discard", silent]);
    assert!(discarded["deliveries"].as_u64().expect("count") >= 1);
    // Replay: the healthy receiver gets every event again from the first one, with the same
    // ids.
    let ok = &ids["ok"];
    let before = receiver.seen("ok").await;
    let first = before
        .iter()
        .filter_map(|(_, event)| event["seq"].as_i64())
        .min()
        .expect("a first event");
    let replayed = crate::common::cairn_json(
        &data,
        &base,
        &["webhook", "replay", ok, "--from", &first.to_string()],
    );
    let count = replayed["deliveries"].as_u64().expect("count") as usize;
    assert!(count >= revisions.len(), "{replayed}");
    let after = await_seen(&receiver, "ok", Duration::from_secs(60), |seen| {
        seen.len() >= before.len() + count
    })
    .await;
    let first_ids: BTreeSet<&str> = before
        .iter()
        .filter_map(|(entry, _)| entry["id"].as_str())
        .collect();
    assert!(after[before.len()..]
        .iter()
        .all(|(entry, _)| first_ids.contains(entry["id"].as_str().unwrap_or_default())));
    // The metrics count outcomes and lag.
    let metrics = crate::common::scrape(&base, &token).await;
    assert!(
        crate::common::metric(
            &metrics,
            "cairn_webhook_deliveries_total",
            &[("outcome", "delivered")]
        ) >= 16.0
    );
    assert!(
        crate::common::metric(
            &metrics,
            "cairn_webhook_deliveries_total",
            &[("outcome", "dead")]
        ) >= 1.0
    );
    assert!(
        crate::common::metric(&metrics, "cairn_webhook_delivery_lag_seconds_count", &[]) >= 16.0
    );
    // Pause, resume, rotate, delete through the CLI.
    let paused = crate::common::cairn_json(&data, &base, &["webhook", "pause", ok]);
    assert_eq!(paused["webhook"]["state"], "paused");
    let rotated = crate::common::cairn_json(&data, &base, &["webhook", "rotate-secret", ok]);
    assert!(rotated["secret"]
        .as_str()
        .is_some_and(|secret| secret.starts_with("whsec_")));
    assert!(rotated["webhook"]["previous_secret_until"].is_i64());
    let deleted = crate::common::cairn_json(&data, &base, &["webhook", "delete", ok]);
    assert_eq!(deleted["webhook"]["state"], "deleted");
    child.start_kill().expect("stop");
    let _ = child.wait().await;
}
