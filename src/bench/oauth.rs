//! `cairn bench oauth`: what checking an issuer's JWT costs a request, against a cairn token
//! on the same server, the same endpoint and the same query (a lexical search, 3 hits).
//!
//! - **Latency:** one client alternates the two tokens query by query on one keep-alive
//!   connection; the report gives each one's percentiles and the median of the paired
//!   differences, per signing algorithm (EdDSA, ES256).
//! - **Load:** 64 clients, each with a token of its own (64 subjects, or 64 cairn tokens with
//!   the same identities), run back to back for a fixed time, twice each, alternating;
//!   latency percentiles and throughput of each.
//! - **Rotation:** the issuer publishes a new key and all 64 clients present tokens signed
//!   with it at once: how many times cairn fetched the key set (the goal is one).
//!
//! The issuer is the benchmark's own (a key set and metadata served on loopback, Ed25519 and
//! P-256 keys made with ring), since what is measured is cairn's guard, not a server's
//! token endpoint; the sign-in test runs the real one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use receipts::auth::NewToken;
use receipts::Scope;
use ring::signature::KeyPair;
use serde_json::{json, Value};

use super::search_latency::{summary, Random};
use crate::config::Config;

/// How the OAuth benchmark runs.
#[derive(Debug, Clone)]
pub struct OAuthBench {
    /// Documents in the corpus.
    pub docs: usize,
    /// Queries per token in the latency series (after a warm-up).
    pub queries: usize,
    /// Clients in the load run and at the rotation.
    pub clients: usize,
    /// Seconds per load run.
    pub seconds: u64,
}

const DATASET: &str = "bench";
const RESOURCE: &str = "https://cairn.bench.invalid";

/// A signing key of the benchmark's issuer.
struct BenchKey {
    kid: String,
    algorithm: Algorithm,
    encoding: EncodingKey,
    jwk: Value,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

impl BenchKey {
    fn new(algorithm: Algorithm, kid: &str) -> anyhow::Result<BenchKey> {
        let random = ring::rand::SystemRandom::new();
        let failed = |_| anyhow::anyhow!("could not make a {algorithm:?} key");
        match algorithm {
            Algorithm::EdDSA => {
                let pkcs8 =
                    ring::signature::Ed25519KeyPair::generate_pkcs8(&random).map_err(failed)?;
                let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
                    .map_err(|_| anyhow::anyhow!("an Ed25519 key"))?;
                Ok(BenchKey {
                    kid: kid.to_owned(),
                    algorithm,
                    encoding: EncodingKey::from_ed_der(pkcs8.as_ref()),
                    jwk: json!({"kty": "OKP", "crv": "Ed25519", "use": "sig", "alg": "EdDSA",
                                "kid": kid, "x": b64(pair.public_key().as_ref())}),
                })
            }
            Algorithm::ES256 => {
                let signing = &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING;
                let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(signing, &random)
                    .map_err(failed)?;
                let pair =
                    ring::signature::EcdsaKeyPair::from_pkcs8(signing, pkcs8.as_ref(), &random)
                        .map_err(|_| anyhow::anyhow!("a P-256 key"))?;
                let point = pair.public_key().as_ref();
                anyhow::ensure!(point.len() == 65, "an uncompressed P-256 point");
                Ok(BenchKey {
                    kid: kid.to_owned(),
                    algorithm,
                    encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
                    jwk: json!({"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256",
                                "kid": kid, "x": b64(&point[1..33]), "y": b64(&point[33..65])}),
                })
            }
            other => anyhow::bail!("the benchmark makes no {other:?} key"),
        }
    }

    fn mint(&self, issuer: &str, subject: &str) -> anyhow::Result<String> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        let mut header = Header::new(self.algorithm);
        header.kid = Some(self.kid.clone());
        header.typ = Some("at+jwt".to_owned());
        let claims = json!({"iss": issuer, "sub": subject, "aud": RESOURCE, "iat": now,
                            "exp": now + 3600, "scope": "cairn.search",
                            "groups": ["bench"], "client_id": "bench"});
        Ok(jsonwebtoken::encode(&header, &claims, &self.encoding)?)
    }
}

/// The benchmark's issuer: metadata and a key set on loopback, counting key-set fetches.
struct BenchIssuer {
    url: String,
    keys: Arc<Mutex<Vec<Value>>>,
    fetches: Arc<AtomicU64>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Drop for BenchIssuer {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl BenchIssuer {
    async fn start(keys: Vec<Value>) -> anyhow::Result<BenchIssuer> {
        use axum::routing::get;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let keys = Arc::new(Mutex::new(keys));
        let fetches = Arc::new(AtomicU64::new(0));
        let metadata = json!({"issuer": url, "jwks_uri": format!("{url}/jwks")});
        let (served_keys, counted) = (keys.clone(), fetches.clone());
        let app = axum::Router::new()
            .route(
                "/.well-known/oauth-authorization-server",
                get(move || async move { axum::Json(metadata) }),
            )
            .route(
                "/jwks",
                get(move || {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let keys = served_keys
                        .lock()
                        .map(|keys| keys.clone())
                        .unwrap_or_default();
                    async move { axum::Json(json!({ "keys": keys })) }
                }),
            );
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(BenchIssuer {
            url,
            keys,
            fetches,
            server,
        })
    }

    fn publish(&self, keys: Vec<Value>) {
        if let Ok(mut published) = self.keys.lock() {
            *published = keys;
        }
    }

    fn fetches(&self) -> u64 {
        self.fetches.load(Ordering::SeqCst)
    }
}

/// One lexical search with `token`; the hits it answered.
async fn search(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    query: &str,
) -> anyhow::Result<usize> {
    let answer: Value = http
        .post(format!("{base}/v1/search"))
        .bearer_auth(token)
        .json(&json!({"query": query, "top_k": 3, "mode": "lexical"}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(answer["results"].as_array().map_or(0, Vec::len))
}

/// `tokens.len()` clients, one token each, searching back to back until `deadline`; every
/// request's latency (ms), and how many failed.
async fn load(
    http: &reqwest::Client,
    base: &str,
    tokens: &[String],
    queries: &[String],
    deadline: Instant,
) -> (Vec<f64>, u64) {
    let tasks: Vec<_> = tokens
        .iter()
        .enumerate()
        .map(|(client, token)| {
            let (http, base, token, queries) = (
                http.clone(),
                base.to_owned(),
                token.clone(),
                queries.to_vec(),
            );
            tokio::spawn(async move {
                let (mut took, mut failed, mut n) = (Vec::new(), 0u64, client);
                while Instant::now() < deadline {
                    let started = Instant::now();
                    match search(&http, &base, &token, &queries[n % queries.len()]).await {
                        Ok(_) => took.push(started.elapsed().as_secs_f64() * 1000.0),
                        Err(_) => failed += 1,
                    }
                    n += 7;
                }
                (took, failed)
            })
        })
        .collect();
    let (mut took, mut failed) = (Vec::new(), 0u64);
    for task in tasks {
        if let Ok((client_took, client_failed)) = task.await {
            took.extend(client_took);
            failed += client_failed;
        }
    }
    (took, failed)
}

/// Runs the benchmark and returns its JSON report.
pub async fn oauth(config: &Config, bench: OAuthBench) -> anyhow::Result<Value> {
    let algorithms = [Algorithm::EdDSA, Algorithm::ES256];
    let first: Vec<BenchKey> = algorithms
        .iter()
        .map(|algorithm| BenchKey::new(*algorithm, &format!("{algorithm:?}-1")))
        .collect::<anyhow::Result<_>>()?;
    let issuer = BenchIssuer::start(first.iter().map(|key| key.jwk.clone()).collect()).await?;
    let mut issuer_config = oauth::IssuerConfig::new(&issuer.url);
    let refetch_interval = issuer_config.refetch_interval;
    issuer_config
        .scopes
        .insert("cairn.search".to_owned(), vec![Scope::Search]);
    issuer_config.groups_claim = Some("groups".to_owned());
    let mut config = config.clone();
    config.oauth = Some(crate::config::OAuthSettings {
        resource: oauth::Resource {
            resource: RESOURCE.to_owned(),
            issuers: vec![issuer_config],
        },
        cairn_tokens: true,
    });
    let served = super::served::served(&config, Scope::Search).await?;
    let (ledger, base) = (&served.ledger, served.base.clone());

    let mut random = Random(11);
    let queries = served
        .seed(DATASET, bench.docs, 120, bench.queries, &mut random)
        .await?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;

    // cairn tokens with the same identity as the JWTs' claims (a principal and a group), so
    // that both read through the same access checks and only authentication differs.
    let own_token = |subject: String| {
        let ledger = ledger.clone();
        async move {
            let identity = receipts::access::Identity::new(
                &format!("user:{subject}"),
                &["group:bench".to_owned()],
            )?;
            anyhow::Ok(
                ledger
                    .create_token(NewToken {
                        name: subject,
                        scopes: vec![Scope::Search],
                        datasets: None,
                        identity: Some(identity),
                        created_by: "bench".to_owned(),
                        expires_at: None,
                    })
                    .await?
                    .secret,
            )
        }
    };

    // Latency, per algorithm: the cairn token and a JWT, alternating.
    let own = own_token("bench-user".to_owned()).await?;
    let mut latency = serde_json::Map::new();
    for key in &first {
        let jwt = key.mint(&issuer.url, "bench-user")?;
        for query in queries.iter().take(50) {
            search(&http, &base, &own, query).await?;
            search(&http, &base, &jwt, query).await?;
        }
        let (mut own_ms, mut oauth, mut added) = (Vec::new(), Vec::new(), Vec::new());
        for (index, query) in queries.iter().enumerate() {
            let mut took = [0.0f64; 2];
            let order = if index % 2 == 0 { [0, 1] } else { [1, 0] };
            for which in order {
                let token = if which == 0 { &own } else { &jwt };
                let started = Instant::now();
                search(&http, &base, token, query).await?;
                took[which] = started.elapsed().as_secs_f64() * 1000.0;
            }
            own_ms.push(took[0]);
            oauth.push(took[1]);
            added.push(took[1] - took[0]);
        }
        added.sort_by(f64::total_cmp);
        let own_p50 = p50(&own_ms);
        let oauth_p50 = p50(&oauth);
        latency.insert(
            format!("{:?}", key.algorithm),
            json!({
                "cairn_token": summary(own_ms),
                "jwt": summary(oauth),
                "added_p50_ms_paired": super::percentile_f64(&added, 0.5),
                "added_p50_ms": oauth_p50 - own_p50,
            }),
        );
    }

    // Load: `clients` cairn tokens, then `clients` JWTs (distinct subjects), ES256.
    let clients = bench.clients.max(1);
    let mut own_tokens = Vec::new();
    for client in 0..clients {
        own_tokens.push(own_token(format!("user-{client}")).await?);
    }
    let es256 = first
        .iter()
        .find(|key| key.algorithm == Algorithm::ES256)
        .context("an ES256 key")?;
    let jwts: Vec<String> = (0..clients)
        .map(|client| es256.mint(&issuer.url, &format!("user-{client}")))
        .collect::<anyhow::Result<_>>()?;
    // Two rounds of each, alternating, so that neither meets a warmer or cooler machine.
    let seconds = Duration::from_secs(bench.seconds.max(1));
    let mut runs: Vec<(&str, Vec<f64>, u64, f64)> = vec![
        ("cairn_token", Vec::new(), 0, 0.0),
        ("jwt_es256", Vec::new(), 0, 0.0),
    ];
    for _round in 0..2 {
        for (index, tokens) in [&own_tokens, &jwts].into_iter().enumerate() {
            let started = Instant::now();
            let (took, failed) = load(&http, &base, tokens, &queries, started + seconds).await;
            let run = &mut runs[index];
            run.1.extend(took);
            run.2 += failed;
            run.3 += started.elapsed().as_secs_f64();
        }
    }
    let mut loaded = serde_json::Map::new();
    for (name, took, failed, elapsed) in runs {
        eprintln!(
            "oauth bench: {clients} clients, {name}: {:.0} searches/s, p50 {:.2} ms ({failed} failed)",
            took.len() as f64 / elapsed,
            p50(&took)
        );
        loaded.insert(
            name.to_owned(),
            json!({
                "latency": summary(took.clone()),
                "searches_per_second": took.len() as f64 / elapsed,
                "failed": failed,
            }),
        );
    }
    let load_added_p50 = loaded["jwt_es256"]["latency"]["p50_ms"]
        .as_f64()
        .unwrap_or(0.0)
        - loaded["cairn_token"]["latency"]["p50_ms"]
            .as_f64()
            .unwrap_or(0.0);

    // Rotation: a new key published, then every client at once with a token it signed. A
    // key the cache lacks is fetched at most once per refetch interval, so the rotation comes
    // at least one interval after the last fetch (as an issuer's does: hours apart); sooner,
    // its tokens would be refused (503) until the interval ends.
    tokio::time::sleep(refetch_interval).await;
    let second = BenchKey::new(Algorithm::ES256, "ES256-2")?;
    let mut published: Vec<Value> = first.iter().map(|key| key.jwk.clone()).collect();
    published.push(second.jwk.clone());
    issuer.publish(published);
    let fetches_before = issuer.fetches();
    let rotated: Vec<String> = (0..clients)
        .map(|client| second.mint(&issuer.url, &format!("user-{client}")))
        .collect::<anyhow::Result<_>>()?;
    let started = Instant::now();
    let (took, failed) = load(
        &http,
        &base,
        &rotated,
        &queries,
        started + Duration::from_secs(2),
    )
    .await;
    let rotation = json!({
        "clients": clients,
        "jwks_fetches": issuer.fetches() - fetches_before,
        "answered": took.len(),
        "failed": failed,
        "latency": summary(took),
    });

    Ok(json!({
        "benchmark": "oauth",
        "corpus": {"docs": bench.docs, "words_per_doc": 120},
        "queries": queries.len(),
        "arguments": {"top_k": 3, "mode": "lexical"},
        "latency": latency,
        "load": {"clients": clients, "seconds": bench.seconds, "runs": loaded,
                 "added_p50_ms": load_added_p50},
        "rotation": rotation,
        "jwks_fetches_total": issuer.fetches(),
        "machine": super::machine(),
    }))
}

fn p50(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    super::percentile_f64(&sorted, 0.5)
}
