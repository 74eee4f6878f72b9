//! Token introspection (RFC 7662) against the fault-injecting issuer (`common::FaultyIssuer`,
//! a fake named as one, whose answers each test scripts): opaque tokens, answers cached no
//! longer than configured or than the token lives, revocation, the checks an answer must pass,
//! JWTs sent to introspection when the issuer is set so, and an endpoint that cannot answer.
//! Against a real server (glewlwyd), the sign-in test revokes a token.

mod common;

use std::time::Duration;

use common::{now, FaultyIssuer, SigningKey, RESOURCE};
use oauth::{Refusal, Resource, Validator};
use serde_json::{json, Value};

fn validator(issuer: &FaultyIssuer, cache: Duration, jwts: bool, secret: &str) -> Validator {
    let mut config = issuer.config();
    let mut introspection = issuer.introspection(cache, jwts);
    introspection.client_secret = oauth::Secret(secret.to_owned());
    config.introspection = Some(introspection);
    Validator::new(&Resource {
        resource: RESOURCE.to_owned(),
        issuers: vec![config],
    })
    .expect("validator")
}

fn active(issuer: &FaultyIssuer, subject: &str, expires_in: i64) -> Value {
    let mut answer = issuer.claims(subject, expires_in);
    answer["active"] = json!(true);
    answer["groups"] = json!("eng,hr");
    answer
}

#[tokio::test]
async fn an_opaque_token_is_introspected_cached_and_stops_working_once_revoked() {
    let issuer = FaultyIssuer::start(&[]).await;
    let validator = validator(
        &issuer,
        Duration::from_millis(400),
        false,
        common::INTROSPECTION_CLIENT.1,
    );
    assert!(validator.introspects());
    issuer.answer("opaque-alice", active(&issuer, "alice", 300));

    let verified = validator
        .verify_opaque("opaque-alice")
        .await
        .expect("active");
    assert_eq!(verified.subject, "alice");
    assert_eq!(
        verified.principal.reads_as(),
        Some(vec![
            "user:alice".to_owned(),
            "group:eng".to_owned(),
            "group:hr".to_owned()
        ])
    );
    assert_eq!(verified.principal.scopes, vec![receipts::Scope::Search]);
    assert_eq!(issuer.introspected(), 1);
    // Cached: no second call.
    validator
        .verify_opaque("opaque-alice")
        .await
        .expect("cached");
    assert_eq!(issuer.introspected(), 1);

    // Revoked at the issuer: still served from the cache until it lapses, then refused.
    issuer.answer("opaque-alice", json!({"active": false}));
    validator
        .verify_opaque("opaque-alice")
        .await
        .expect("cached");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        validator.verify_opaque("opaque-alice").await,
        Err(Refusal::Inactive)
    );
    assert_eq!(issuer.introspected(), 2);
    // A refusal is cached as long: a client repeating a dead token costs one call per interval.
    assert_eq!(
        validator.verify_opaque("opaque-alice").await,
        Err(Refusal::Inactive)
    );
    assert_eq!(issuer.introspected(), 2);

    // A token the issuer never issued.
    assert_eq!(
        validator.verify_opaque("never-issued").await,
        Err(Refusal::Inactive)
    );
}

#[tokio::test]
async fn an_answer_is_checked_as_a_token_is() {
    let issuer = FaultyIssuer::start(&[]).await;
    let validator = validator(
        &issuer,
        Duration::from_secs(30),
        false,
        common::INTROSPECTION_CLIENT.1,
    );
    let mut cases: Vec<(&str, Value, &str)> = Vec::new();
    let mut other_audience = active(&issuer, "alice", 300);
    other_audience["aud"] = json!(["https://other.example.com"]);
    cases.push(("other-audience", other_audience, "audience"));
    let mut no_audience = active(&issuer, "alice", 300);
    no_audience.as_object_mut().expect("object").remove("aud");
    cases.push(("no-audience", no_audience, "audience"));
    cases.push(("expired", active(&issuer, "alice", -3600), "expired"));
    let mut other_issuer = active(&issuer, "alice", 300);
    other_issuer["iss"] = json!(format!("{}/", issuer.url));
    cases.push(("other-issuer", other_issuer, "unknown_issuer"));
    let mut no_expiry = active(&issuer, "alice", 300);
    no_expiry.as_object_mut().expect("object").remove("exp");
    cases.push(("no-expiry", no_expiry, "claims"));
    let mut not_yet = active(&issuer, "alice", 300);
    not_yet["nbf"] = json!(now() + 3600);
    cases.push(("not-yet", not_yet, "not_yet_valid"));
    let mut truthy = active(&issuer, "alice", 300);
    truthy["active"] = json!("true");
    cases.push(("truthy-string", truthy, "inactive"));
    for (token, answer, reason) in cases {
        issuer.answer(token, answer);
        let refusal = validator
            .verify_opaque(token)
            .await
            .expect_err(&format!("{token} must be refused"));
        assert_eq!(refusal.reason(), reason, "{token}: {refusal}");
    }
    // The audience may be the MCP endpoint, as a host asks for it.
    let mut for_mcp = active(&issuer, "alice", 300);
    for_mcp["aud"] = json!(format!("{RESOURCE}/mcp"));
    issuer.answer("for-mcp", for_mcp);
    validator.verify_opaque("for-mcp").await.expect("accepted");
}

#[tokio::test]
async fn jwts_go_to_introspection_when_the_issuer_is_set_so() {
    let key = SigningKey::ed25519("ed-1");
    let issuer = FaultyIssuer::start(&[&key]).await;
    let token = key.mint(&issuer.claims("alice", 300));
    // Keys alone: a validly signed token is accepted, whatever the issuer knows of it.
    let local = common::validator(&issuer);
    local.verify(&token).await.expect("signature and claims");
    // Introspected: the issuer revoked it.
    let validator = validator(
        &issuer,
        Duration::from_secs(30),
        true,
        common::INTROSPECTION_CLIENT.1,
    );
    issuer.answer(&token, json!({"active": false}));
    assert_eq!(validator.verify(&token).await, Err(Refusal::Inactive));
    let fresh = key.mint(&issuer.claims("carol", 300));
    issuer.answer(&fresh, active(&issuer, "carol", 300));
    let verified = validator.verify(&fresh).await.expect("active");
    assert_eq!(verified.subject, "carol");
    assert_eq!(issuer.introspected(), 2);
}

#[tokio::test]
async fn an_endpoint_that_cannot_answer_is_temporary_and_never_cached() {
    let issuer = FaultyIssuer::start(&[]).await;
    issuer.answer("opaque-alice", active(&issuer, "alice", 300));
    // cairn's credentials refused: an operator's problem, a 503 for the caller.
    let wrong = validator(&issuer, Duration::from_secs(30), false, "not-the-secret");
    let refusal = wrong
        .verify_opaque("opaque-alice")
        .await
        .expect_err("refused credentials");
    assert!(refusal.is_temporary(), "{refusal}");
    assert!(refusal.to_string().contains("credentials"), "{refusal}");

    let validator = validator(
        &issuer,
        Duration::from_secs(30),
        false,
        common::INTROSPECTION_CLIENT.1,
    );
    issuer.set_down(true);
    let refusal = validator
        .verify_opaque("opaque-alice")
        .await
        .expect_err("down");
    assert!(refusal.is_temporary(), "{refusal}");
    issuer.set_down(false);
    validator
        .verify_opaque("opaque-alice")
        .await
        .expect("up again, not a cached refusal");
}
