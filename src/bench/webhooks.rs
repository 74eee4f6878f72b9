//! `cairn bench webhooks`: what webhooks cost acceptance, and how long a delivery takes.
//!
//! Each scenario is a fresh SQLite ledger served on loopback with the real delivery loop
//! (`events::dispatch`) in the same process, and 0, 1 or 10 subscriptions to `source.*`
//! events, all pointing at one receiver of the benchmark's own on loopback (it answers 204 at
//! once and notes when each delivery arrived; the e2e tests verify signatures with the
//! reference library). 16 clients put `docs` documents over `keys` source keys, so most puts
//! supersede a revision: each such acceptance writes one event, which becomes one delivery
//! per subscription while the clients keep putting.
//!
//! Reported per scenario: acceptances per second (and the ratio to no subscriptions, the
//! goal being at least 0.9), deliveries received, and the delivery lag from the event's
//! commit to the receiver's answer (p50, p99, max), read once every delivery arrived. Under
//! that saturating load the lag is mostly time waiting in the backlog; a last, paced run (one
//! client, 20 puts a second, one subscription) gives the lag of a delivery when nothing
//! waits.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::routing::post;
use serde_json::{json, Value};

use super::percentile_f64;
use crate::config::{Config, Overrides};

/// How the webhooks benchmark runs.
#[derive(Debug, Clone)]
pub struct WebhooksBench {
    /// Documents put per scenario.
    pub docs: usize,
    /// Distinct source keys they go to.
    pub keys: usize,
    /// Rounds; every scenario runs once per round (interleaved) and reports its median.
    pub rounds: usize,
}

/// What the benchmark's receiver saw: each delivery's lag, in seconds.
#[derive(Debug, Default)]
struct Seen {
    lags: Vec<f64>,
}

async fn receive(
    axum::extract::State(seen): axum::extract::State<Arc<Mutex<Seen>>>,
    body: axum::body::Bytes,
) -> axum::http::StatusCode {
    let now = receipts::Clock::now_micros(&receipts::SystemClock);
    if let Ok(event) = serde_json::from_slice::<Value>(&body) {
        if let Some(at) = event["at"].as_i64() {
            if let Ok(mut seen) = seen.lock() {
                seen.lags.push((now - at).max(0) as f64 / 1e6);
            }
        }
    }
    axum::http::StatusCode::NO_CONTENT
}

/// One scenario: `subscriptions` webhooks, 16 clients putting `docs` documents.
async fn scenario(
    bench: &WebhooksBench,
    subscriptions: usize,
    round: usize,
    paced: Option<Duration>,
) -> anyhow::Result<Value> {
    let directory = tempfile::tempdir().context("creating a temporary directory")?;
    let overrides = Overrides {
        data_dir: Some(directory.path().join("data")),
        bind: Some("127.0.0.1:0".to_owned()),
        ..Overrides::default()
    };
    let mut env: std::collections::HashMap<String, String> = std::env::vars().collect();
    env.insert(
        "CAIRN_WEBHOOKS_ALLOW_HOSTS".to_owned(),
        "127.0.0.1".to_owned(),
    );
    let config = Config::load(&overrides, &env)?;
    std::fs::create_dir_all(&config.data_dir)?;
    let ledger: Arc<dyn receipts::Ledger> = crate::open_ledger(&config).await?;
    crate::ensure_admin_token(ledger.as_ref(), &config.data_dir).await?;
    let token = crate::cli::client::resolve_token(None, &config.data_dir)?;

    // The receiver.
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let receiver = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let receiver_url = format!("http://{}/hook", receiver.local_addr()?);
    let routes = axum::Router::new()
        .route("/hook", post(receive))
        .with_state(seen.clone());
    let receiving = tokio::spawn(async move { axum::serve(receiver, routes).await });

    // cairn: the API and the delivery loop.
    let listener = tokio::net::TcpListener::bind(config.bind).await?;
    let base = format!("http://{}", listener.local_addr()?);
    let application = crate::app(ledger.clone(), &config, None);
    let server = tokio::spawn(async move { axum::serve(listener, application).await });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let sealer = config
        .webhooks
        .sealer()
        .context("the webhook secrets key")?;
    let dispatcher = Arc::new(
        events::dispatch::Dispatcher::new(
            ledger.clone(),
            sealer,
            config.webhooks.policy(),
            config.webhooks.dispatch.clone(),
        )
        .map_err(|error| anyhow::anyhow!(error))?,
    );
    let delivering = tokio::spawn(dispatcher.run(stopped));
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    for index in 0..subscriptions {
        let response = http
            .post(format!("{base}/v1/webhooks"))
            .bearer_auth(&token)
            .json(&json!({"url": receiver_url, "events": ["source.superseded", "source.tombstoned"], "description": format!("bench {index}")}))
            .send()
            .await?;
        anyhow::ensure!(
            response.status().as_u16() == 201,
            "creating a webhook: HTTP {}",
            response.status()
        );
    }

    // 16 clients put; the first put of a key is no event, every later one supersedes. Paced:
    // one client, one put per interval (the lag of a delivery when nothing waits).
    let started = Instant::now();
    let clients = if paced.is_some() { 1 } else { 16 };
    let mut tasks = Vec::new();
    for client in 0..clients {
        let (http, base, token) = (http.clone(), base.clone(), token.clone());
        let (docs, keys) = (bench.docs, bench.keys.max(1));
        tasks.push(tokio::spawn(async move {
            for index in (client..docs).step_by(clients) {
                if let Some(interval) = paced {
                    tokio::time::sleep(interval).await;
                }
                let response = http
                    .post(format!("{base}/v1/sources"))
                    .bearer_auth(&token)
                    .json(&json!({"dataset": "bench", "source_key": format!("key-{}", index % keys), "content": format!("round {round} document {index}: a short note about webhooks")}))
                    .send()
                    .await?;
                anyhow::ensure!(response.status().as_u16() == 202, "HTTP {}", response.status());
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let accept_seconds = started.elapsed().as_secs_f64();
    let events = bench.docs.saturating_sub(bench.keys.min(bench.docs));
    let expected = events * subscriptions;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let received = seen.lock().map(|seen| seen.lags.len()).unwrap_or(0);
        if received >= expected {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{received} of {expected} deliveries arrived in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drained_seconds = started.elapsed().as_secs_f64();
    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), delivering).await;
    server.abort();
    receiving.abort();
    let mut lags = seen
        .lock()
        .map(|seen| seen.lags.clone())
        .unwrap_or_default();
    lags.sort_by(f64::total_cmp);
    Ok(json!({
        "subscriptions": subscriptions,
        "paced_ms": paced.map(|interval| interval.as_millis() as u64),
        "documents": bench.docs,
        "events": events,
        "accept_seconds": accept_seconds,
        "accepted_per_second": bench.docs as f64 / accept_seconds,
        "deliveries": lags.len(),
        "all_delivered_after_seconds": drained_seconds,
        "lag_ms": {
            "p50": percentile_f64(&lags, 0.50) * 1e3,
            "p99": percentile_f64(&lags, 0.99) * 1e3,
            "max": lags.last().copied().unwrap_or(0.0) * 1e3,
        },
    }))
}

/// Runs every scenario `rounds` times, interleaved, and reports each one's median round.
pub async fn webhooks(bench: WebhooksBench) -> anyhow::Result<Value> {
    let counts = [0usize, 1, 10];
    let mut rounds: Vec<Vec<Value>> = vec![Vec::new(); counts.len()];
    for round in 0..bench.rounds.max(1) {
        for (slot, subscriptions) in counts.iter().enumerate() {
            eprintln!(
                "round {}/{}: {subscriptions} subscriptions, {} documents",
                round + 1,
                bench.rounds.max(1),
                bench.docs
            );
            rounds[slot].push(scenario(&bench, *subscriptions, round, None).await?);
        }
    }
    let rate = |value: &Value| value["accepted_per_second"].as_f64().unwrap_or(0.0);
    let median: Vec<Value> = rounds
        .into_iter()
        .map(|mut runs| {
            runs.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
            runs[runs.len() / 2].clone()
        })
        .collect();
    let baseline = rate(&median[0]).max(f64::MIN_POSITIVE);
    let scenarios: Vec<Value> = median
        .into_iter()
        .map(|mut run| {
            run["throughput_ratio_to_none"] = json!(rate(&run) / baseline);
            run
        })
        .collect();
    // The lag at a light load: one client, 20 puts a second, one subscription.
    eprintln!("paced: 1 subscription, 400 documents at 20 per second");
    let paced = scenario(
        &WebhooksBench {
            docs: 400,
            keys: 40,
            rounds: 1,
        },
        1,
        0,
        Some(Duration::from_millis(50)),
    )
    .await?;
    Ok(json!({
        "benchmark": "webhooks",
        "machine": super::machine(),
        "docs": bench.docs,
        "keys": bench.keys,
        "rounds": bench.rounds.max(1),
        "clients": 16,
        "scenarios": scenarios,
        "paced": paced,
    }))
}
