//! Access tokens against the fault-injecting issuer (`common::FaultyIssuer`, a fake named as
//! one), so that the tests can mint what no real authorization server would (expired, for
//! another audience, signed by a stranger, `none`, HMAC with a public key), rotate its keys
//! and take it down. The whole flow against a real authorization server is the host test's.

mod common;

use std::time::Duration;

use common::{b64, now, validator, FaultyIssuer, SigningKey};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use oauth::{Refusal, Validator};
use receipts::Scope;
use serde_json::json;

#[tokio::test]
async fn a_token_maps_to_a_principal_with_groups_and_scopes() {
    let ed = SigningKey::ed25519("ed-1");
    let ec = SigningKey::p256("ec-1");
    let issuer = FaultyIssuer::start(&[&ed, &ec]).await;
    let validator = validator(&issuer);
    for key in [&ed, &ec] {
        let verified = validator
            .verify(&key.mint(&issuer.claims("alice", 300)))
            .await
            .unwrap_or_else(|refusal| panic!("{} refused: {refusal}", key.kid));
        assert_eq!(verified.issuer, issuer.url);
        assert_eq!(verified.subject, "alice");
        assert_eq!(
            verified.principal.scopes,
            vec![Scope::Search],
            "openid grants nothing"
        );
        assert_eq!(verified.principal.datasets, None);
        assert_eq!(
            verified.principal.reads_as(),
            Some(vec![
                "user:alice".to_owned(),
                "group:eng".to_owned(),
                "group:hr".to_owned()
            ])
        );
        assert_eq!(verified.issuer_scopes, vec!["cairn.search", "openid"]);
    }
    // Groups as one string, joined by commas (glewlwyd joins a multi-valued property so)
    // or spaces.
    for joined in ["eng,hr", "eng hr", " eng , hr "] {
        let mut claims = issuer.claims("alice", 300);
        claims["groups"] = json!(joined);
        let verified = validator
            .verify(&ed.mint(&claims))
            .await
            .unwrap_or_else(|refusal| panic!("{joined:?} refused: {refusal}"));
        assert_eq!(
            verified.principal.reads_as(),
            Some(vec![
                "user:alice".to_owned(),
                "group:eng".to_owned(),
                "group:hr".to_owned()
            ]),
            "{joined:?}"
        );
    }
    assert_eq!(issuer.fetches(), 1, "one fetch serves both keys");
    assert!(Validator::looks_like_jwt(
        &ed.mint(&issuer.claims("alice", 300))
    ));
    assert!(!Validator::looks_like_jwt("cairn_0123456789abcdef"));
}

#[tokio::test]
async fn tokens_that_must_not_work_are_refused_with_their_reason() {
    let key = SigningKey::ed25519("ed-1");
    let stranger = SigningKey::ed25519("ed-1");
    let issuer = FaultyIssuer::start(&[&key]).await;
    let validator = validator(&issuer);
    let mut claims = issuer.claims("alice", 300);
    claims["aud"] = json!("https://other.example.com");
    assert!(matches!(
        validator.verify(&key.mint(&claims)).await,
        Err(Refusal::Audience(_))
    ));
    // Beyond the 60 s skew: expired; within it: still accepted.
    let expired = key.mint(&issuer.claims("alice", -120));
    assert_eq!(
        validator.verify(&expired).await.err(),
        Some(Refusal::Expired)
    );
    let lately = key.mint(&issuer.claims("alice", -30));
    assert!(validator.verify(&lately).await.is_ok());
    let mut early = issuer.claims("alice", 300);
    early["nbf"] = json!(now() + 600);
    assert_eq!(
        validator.verify(&key.mint(&early)).await.err(),
        Some(Refusal::NotYetValid)
    );
    // Same key id, another key: the signature does not verify.
    assert_eq!(
        validator
            .verify(&stranger.mint(&issuer.claims("alice", 300)))
            .await
            .err(),
        Some(Refusal::Signature)
    );
    // A trailing slash is another issuer.
    let mut slashed = issuer.claims("alice", 300);
    slashed["iss"] = json!(format!("{}/", issuer.url));
    assert!(matches!(
        validator.verify(&key.mint(&slashed)).await,
        Err(Refusal::UnknownIssuer(_))
    ));
    // `none`: no signature at all.
    let unsigned = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","typ":"at+jwt"}"#),
        b64(issuer.claims("alice", 300).to_string().as_bytes())
    );
    assert!(matches!(
        validator.verify(&unsigned).await,
        Err(Refusal::Algorithm(_))
    ));
    // HS256 "signed" with the issuer's public key as the secret.
    let public = key.jwk["x"].as_str().expect("x").to_owned();
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("ed-1".to_owned());
    let forged = jsonwebtoken::encode(
        &header,
        &issuer.claims("alice", 300),
        &EncodingKey::from_secret(public.as_bytes()),
    )
    .expect("forge");
    assert!(matches!(
        validator.verify(&forged).await,
        Err(Refusal::Algorithm(_))
    ));
    // A tampered payload.
    let token = key.mint(&issuer.claims("alice", 300));
    let parts: Vec<&str> = token.split('.').collect();
    let mut claims = issuer.claims("mallory", 300);
    claims["scope"] = json!("cairn.ops");
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        b64(claims.to_string().as_bytes()),
        parts[2]
    );
    assert_eq!(
        validator.verify(&tampered).await.err(),
        Some(Refusal::Signature)
    );
    // No principal claim.
    let mut anonymous = issuer.claims("alice", 300);
    anonymous.as_object_mut().expect("object").remove("sub");
    assert!(matches!(
        validator.verify(&key.mint(&anonymous)).await,
        Err(Refusal::Claims(_))
    ));
    assert!(matches!(
        validator.verify("not.a-jwt").await,
        Err(Refusal::Malformed(_))
    ));
}

#[tokio::test]
async fn rotated_keys_are_fetched_once_and_unknown_ones_do_not_hammer_the_issuer() {
    let old = SigningKey::ed25519("k1");
    let issuer = FaultyIssuer::start(&[&old]).await;
    let validator = validator(&issuer);
    assert!(validator
        .verify(&old.mint(&issuer.claims("alice", 300)))
        .await
        .is_ok());
    assert_eq!(issuer.fetches(), 1);
    // A key nobody publishes: one fetch, then refusals from the cache until the interval
    // has passed, however many requests ask.
    let stranger = SigningKey::ed25519("k-stranger");
    tokio::time::sleep(Duration::from_millis(350)).await;
    let tokens: Vec<String> = (0..64)
        .map(|_| stranger.mint(&issuer.claims("alice", 300)))
        .collect();
    let answers = futures_join(&validator, &tokens).await;
    assert!(answers
        .iter()
        .all(|answer| matches!(answer, Err(Refusal::UnknownKey(_)))));
    assert_eq!(
        issuer.fetches(),
        2,
        "64 requests for an unknown key fetch once"
    );
    // The issuer rotates: a token with the new key is accepted after one refetch, by 64
    // concurrent requests, and the old key's tokens stop working after it.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let new = SigningKey::p256("k2");
    issuer.publish(&[&new]);
    let tokens: Vec<String> = (0..64)
        .map(|_| new.mint(&issuer.claims("alice", 300)))
        .collect();
    let answers = futures_join(&validator, &tokens).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(issuer.fetches(), 3, "one fetch per rotation");
    assert!(matches!(
        validator
            .verify(&old.mint(&issuer.claims("alice", 300)))
            .await,
        Err(Refusal::UnknownKey(_))
    ));
}

#[tokio::test]
async fn while_the_issuer_is_down_cached_keys_work_and_new_ones_are_unavailable() {
    let key = SigningKey::ed25519("k1");
    let issuer = FaultyIssuer::start(&[&key]).await;
    let validator = validator(&issuer);
    assert!(validator
        .verify(&key.mint(&issuer.claims("alice", 300)))
        .await
        .is_ok());
    issuer.set_down(true);
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(
        validator
            .verify(&key.mint(&issuer.claims("bob", 300)))
            .await
            .is_ok(),
        "a cached key keeps working"
    );
    let new = SigningKey::ed25519("k2");
    let refused = validator
        .verify(&new.mint(&issuer.claims("alice", 300)))
        .await
        .expect_err("a key only a fetch could find");
    assert!(refused.is_temporary(), "{refused:?}");
    assert_eq!(refused.reason(), "issuer_unavailable");
    assert_eq!(
        validator
            .keys(&issuer.url)
            .expect("issuer")
            .stats()
            .failures,
        1
    );
    // Back up, after the interval: the new key is fetched.
    issuer.publish(&[&key, &new]);
    issuer.set_down(false);
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(validator
        .verify(&new.mint(&issuer.claims("alice", 300)))
        .await
        .is_ok());
}

#[tokio::test]
async fn an_issuer_whose_metadata_names_another_issuer_is_not_trusted() {
    let key = SigningKey::ed25519("k1");
    let issuer = FaultyIssuer::start(&[&key]).await;
    issuer.published.lock().expect("lock").issuer = "https://elsewhere.example.com".to_owned();
    let validator = validator(&issuer);
    let refused = validator
        .verify(&key.mint(&issuer.claims("alice", 300)))
        .await
        .expect_err("mismatched metadata");
    assert!(
        refused.is_temporary(),
        "no key could be fetched: {refused:?}"
    );
}

async fn futures_join(
    validator: &Validator,
    tokens: &[String],
) -> Vec<Result<oauth::Verified, Refusal>> {
    let mut set = Vec::new();
    for token in tokens {
        set.push(validator.verify(token));
    }
    futures::future::join_all(set).await
}
