//! The guard in front of real routes that use the API's own extractor (`receipts::http::Auth`)
//! over a real SQLite ledger: challenges, metadata, JWTs beside cairn tokens, refusals with
//! their status, and the issuer down (the fault-injecting issuer of `common`, a fake named as
//! one).

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRef;
use axum::routing;
use axum::{Json, Router};
use common::{FaultyIssuer, SigningKey, RESOURCE};
use oauth::{Guard, Resource};
use receipts::auth::NewToken;
use receipts::http::{ApiError, Auth};
use receipts::{Scope, SqliteLedger, SqliteOptions, SystemClock, Tokens};
use serde_json::{json, Value};

#[derive(Clone)]
struct AppState {
    tokens: Arc<dyn Tokens>,
}

impl FromRef<AppState> for Arc<dyn Tokens> {
    fn from_ref(state: &AppState) -> Self {
        state.tokens.clone()
    }
}

async fn whoami(auth: Auth) -> Result<Json<Value>, ApiError> {
    let principal = auth.require(Scope::Search)?;
    Ok(Json(
        json!({ "name": principal.name, "reads_as": principal.reads_as() }),
    ))
}

async fn operate(auth: Auth) -> Result<Json<Value>, ApiError> {
    auth.require(Scope::OpsWrite)?;
    Ok(Json(json!({ "ok": true })))
}

/// Serves the routes behind a guard; returns the base URL.
async fn serve(tokens: Arc<dyn Tokens>, guard: Guard) -> String {
    let app = Router::new()
        .route("/v1/whoami", routing::get(whoami))
        .route("/v1/operate", routing::get(operate))
        .with_state(AppState { tokens })
        .merge(guard.routes())
        .layer(axum::middleware::from_fn_with_state(guard, oauth::guard));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

/// GETs `base` + `path`, with a bearer token when one is given.
async fn get(base: &str, path: &str, token: Option<&str>) -> reqwest::Response {
    let mut request = reqwest::Client::new().get(format!("{base}{path}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.expect("call")
}

fn challenge(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("www-authenticate")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn the_guard_admits_issuer_tokens_beside_cairn_tokens_and_challenges_the_rest() {
    let directory = tempfile::tempdir().expect("tempdir");
    let ledger = SqliteLedger::open(
        SqliteOptions::new(directory.path().join("ledger.db")),
        Arc::new(SystemClock),
    )
    .await
    .expect("ledger");
    let tokens: Arc<dyn Tokens> = Arc::new(ledger);
    let cairn = tokens
        .create_token(NewToken {
            name: "plain".to_owned(),
            scopes: vec![Scope::Search],
            datasets: None,
            identity: None,
            created_by: "test".to_owned(),
            expires_at: None,
        })
        .await
        .expect("token");
    let key = SigningKey::ed25519("k1");
    let issuer = FaultyIssuer::start(&[&key]).await;
    let resource = Resource {
        resource: RESOURCE.to_owned(),
        issuers: vec![issuer.config()],
    };
    let base = serve(tokens.clone(), Guard::new(&resource, true).expect("guard")).await;
    let metadata_url = "https://cairn.example.com/.well-known/oauth-protected-resource";

    // No token: 401, a challenge naming the metadata, cairn's typed body.
    let response = get(&base, "/v1/whoami", None).await;
    assert_eq!(response.status(), 401);
    assert_eq!(
        challenge(&response),
        format!("Bearer resource_metadata=\"{metadata_url}\"")
    );
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["code"], "unauthenticated");

    // The metadata, for the API and for /mcp.
    let document: Value = get(&base, "/.well-known/oauth-protected-resource", None)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(document["resource"], RESOURCE);
    assert_eq!(document["authorization_servers"], json!([issuer.url]));
    assert_eq!(
        document["scopes_supported"],
        json!(["cairn.ops", "cairn.search"])
    );
    let document: Value = get(&base, "/.well-known/oauth-protected-resource/mcp", None)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(document["resource"], format!("{RESOURCE}/mcp"));

    // An issuer's token reads as its subject and groups; a cairn token still works.
    let token = key.mint(&issuer.claims("alice", 300));
    let body: Value = get(&base, "/v1/whoami", Some(&token))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(body["name"], "oauth:alice");
    assert_eq!(
        body["reads_as"],
        json!(["user:alice", "group:eng", "group:hr"])
    );
    let response = get(&base, "/v1/whoami", Some(&cairn.secret)).await;
    assert_eq!(response.status(), 200);

    // A missing scope: 403 naming the issuer's scope that grants it.
    let response = get(&base, "/v1/operate", Some(&token)).await;
    assert_eq!(response.status(), 403);
    let header = challenge(&response);
    assert!(header.contains("error=\"insufficient_scope\""), "{header}");
    assert!(header.contains("scope=\"cairn.ops\""), "{header}");
    assert!(
        header.contains(&format!("resource_metadata=\"{metadata_url}\"")),
        "{header}"
    );

    // An expired token: 401 invalid_token, the reason in the body.
    let expired = key.mint(&issuer.claims("alice", -600));
    let response = get(&base, "/v1/whoami", Some(&expired)).await;
    assert_eq!(response.status(), 401);
    assert!(challenge(&response).contains("error=\"invalid_token\""));
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["details"]["reason"], "expired");

    // The issuer down and a key only a fetch could find: 503, with Retry-After.
    issuer.set_down(true);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let rotated = SigningKey::ed25519("k2");
    let rotated = rotated.mint(&issuer.claims("alice", 300));
    let response = get(&base, "/v1/whoami", Some(&rotated)).await;
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["code"], "auth_unavailable");
    // The cached key still works.
    let response = get(&base, "/v1/whoami", Some(&token)).await;
    assert_eq!(response.status(), 200);

    // With cairn's own tokens switched off, a cairn token is refused with a challenge.
    let strict = serve(tokens, Guard::new(&resource, false).expect("guard")).await;
    let response = get(&strict, "/v1/whoami", Some(&cairn.secret)).await;
    assert_eq!(response.status(), 401);
    assert!(challenge(&response).starts_with("Bearer resource_metadata="));
}
