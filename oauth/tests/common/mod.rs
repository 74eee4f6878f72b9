//! The fault-injecting issuer both test files use (`FaultyIssuer`, a fake named as one): it
//! publishes its metadata and key set over loopback HTTP, and the tests mint the tokens, so
//! that they can mint what no real authorization server would, rotate its keys and take it
//! down. It also introspects (RFC 7662) the opaque tokens a test hands it, answering with what
//! the test scripted, for `INTROSPECTION_CLIENT` only.
#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use oauth::{IssuerConfig, Resource, Validator};
use receipts::Scope;
use ring::rand::SystemRandom;
use ring::signature::{self, KeyPair};
use serde_json::{json, Value};

pub const RESOURCE: &str = "https://cairn.example.com";
/// The client id and secret the issuer takes at its introspection endpoint.
pub const INTROSPECTION_CLIENT: (&str, &str) = ("cairn", "introspection-secret");

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A signing key of the test: its private half for minting, its public JWK for the issuer.
#[derive(Clone)]
pub struct SigningKey {
    pub kid: String,
    pub algorithm: Algorithm,
    pub encoding: EncodingKey,
    pub jwk: Value,
}

impl SigningKey {
    pub fn ed25519(kid: &str) -> SigningKey {
        let random = SystemRandom::new();
        let pkcs8 = signature::Ed25519KeyPair::generate_pkcs8(&random).expect("ed25519 key");
        let pair = signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("ed25519 pair");
        SigningKey {
            kid: kid.to_owned(),
            algorithm: Algorithm::EdDSA,
            encoding: EncodingKey::from_ed_der(pkcs8.as_ref()),
            jwk: json!({
                "kty": "OKP", "crv": "Ed25519", "use": "sig", "alg": "EdDSA", "kid": kid,
                "x": b64(pair.public_key().as_ref()),
            }),
        }
    }

    pub fn p256(kid: &str) -> SigningKey {
        let random = SystemRandom::new();
        let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &random,
        )
        .expect("p256 key");
        let pair = signature::EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            pkcs8.as_ref(),
            &random,
        )
        .expect("p256 pair");
        // An uncompressed point: 0x04, then x and y.
        let point = pair.public_key().as_ref();
        SigningKey {
            kid: kid.to_owned(),
            algorithm: Algorithm::ES256,
            encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
            jwk: json!({
                "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
                "x": b64(&point[1..33]), "y": b64(&point[33..65]),
            }),
        }
    }

    pub fn mint(&self, claims: &Value) -> String {
        let mut header = Header::new(self.algorithm);
        header.kid = Some(self.kid.clone());
        header.typ = Some("at+jwt".to_owned());
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("mint")
    }
}

/// What the faulty issuer serves, and what it has been asked.
pub struct Published {
    pub issuer: String,
    pub keys: Vec<Value>,
    pub down: bool,
    /// Introspection answers by token.
    pub answers: HashMap<String, Value>,
}

#[derive(Clone)]
pub struct FaultyIssuer {
    pub url: String,
    pub published: Arc<Mutex<Published>>,
    pub key_fetches: Arc<AtomicU64>,
    pub introspections: Arc<AtomicU64>,
}

impl FaultyIssuer {
    pub async fn start(keys: &[&SigningKey]) -> FaultyIssuer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let issuer = FaultyIssuer {
            url: url.clone(),
            published: Arc::new(Mutex::new(Published {
                issuer: url,
                keys: keys.iter().map(|key| key.jwk.clone()).collect(),
                down: false,
                answers: HashMap::new(),
            })),
            key_fetches: Arc::new(AtomicU64::new(0)),
            introspections: Arc::new(AtomicU64::new(0)),
        };
        let app = Router::new()
            .route("/.well-known/oauth-authorization-server", get(metadata))
            .route("/jwks", get(jwks))
            .route("/introspect", post(introspect))
            .with_state(issuer.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        issuer
    }

    pub fn publish(&self, keys: &[&SigningKey]) {
        self.published.lock().expect("lock").keys =
            keys.iter().map(|key| key.jwk.clone()).collect();
    }

    pub fn set_down(&self, down: bool) {
        self.published.lock().expect("lock").down = down;
    }

    /// Scripts the introspection answer for `token` (`{"active": false}` revokes it).
    pub fn answer(&self, token: &str, answer: Value) {
        self.published
            .lock()
            .expect("lock")
            .answers
            .insert(token.to_owned(), answer);
    }

    /// Introspection calls answered so far.
    pub fn introspected(&self) -> u64 {
        self.introspections.load(Ordering::SeqCst)
    }

    /// The settings cairn introspects this issuer with (endpoint found in its metadata).
    pub fn introspection(&self, cache: Duration, jwts: bool) -> oauth::Introspection {
        oauth::Introspection {
            endpoint: None,
            client_id: INTROSPECTION_CLIENT.0.to_owned(),
            client_secret: oauth::Secret(INTROSPECTION_CLIENT.1.to_owned()),
            cache,
            jwts,
        }
    }

    pub fn fetches(&self) -> u64 {
        self.key_fetches.load(Ordering::SeqCst)
    }

    pub fn config(&self) -> IssuerConfig {
        let mut config = IssuerConfig::new(&self.url);
        config.scopes = BTreeMap::from([
            ("cairn.search".to_owned(), vec![Scope::Search]),
            (
                "cairn.ops".to_owned(),
                vec![Scope::OpsRead, Scope::OpsWrite],
            ),
        ]);
        config.groups_claim = Some("groups".to_owned());
        config.refetch_interval = Duration::from_millis(300);
        config.fetch_timeout = Duration::from_secs(2);
        config
    }

    pub fn claims(&self, subject: &str, expires_in: i64) -> Value {
        let now = now();
        json!({
            "iss": self.url, "sub": subject, "aud": RESOURCE, "iat": now, "exp": now + expires_in,
            "scope": "cairn.search openid", "groups": ["eng", "hr"], "client_id": "host",
        })
    }
}

pub async fn metadata(State(issuer): State<FaultyIssuer>) -> Response {
    let published = issuer.published.lock().expect("lock");
    if published.down {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    Json(json!({
        "issuer": published.issuer,
        "jwks_uri": format!("{}/jwks", issuer.url),
        "token_endpoint": format!("{}/token", issuer.url),
        "introspection_endpoint": format!("{}/introspect", issuer.url),
    }))
    .into_response()
}

pub async fn jwks(State(issuer): State<FaultyIssuer>) -> Response {
    issuer.key_fetches.fetch_add(1, Ordering::SeqCst);
    let published = issuer.published.lock().expect("lock");
    if published.down {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    Json(json!({ "keys": published.keys })).into_response()
}

pub async fn introspect(
    State(issuer): State<FaultyIssuer>,
    headers: HeaderMap,
    body: String,
) -> Response {
    // The form body, decoded as a URL's query is.
    let form: HashMap<String, String> = reqwest::Url::parse(&format!("http://form/?{body}"))
        .map(|url| url.query_pairs().into_owned().collect())
        .unwrap_or_default();
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            INTROSPECTION_CLIENT.0, INTROSPECTION_CLIENT.1
        ))
    );
    if headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        != Some(&expected)
    {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let published = issuer.published.lock().expect("lock");
    if published.down {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    issuer.introspections.fetch_add(1, Ordering::SeqCst);
    let token = form.get("token").cloned().unwrap_or_default();
    Json(
        published
            .answers
            .get(&token)
            .cloned()
            .unwrap_or_else(|| json!({"active": false})),
    )
    .into_response()
}

pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs() as i64)
        .unwrap_or_default()
}

pub fn validator(issuer: &FaultyIssuer) -> Validator {
    Validator::new(&Resource {
        resource: RESOURCE.to_owned(),
        issuers: vec![issuer.config()],
    })
    .expect("validator")
}
