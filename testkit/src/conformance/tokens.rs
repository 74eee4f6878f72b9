//! Conformance: tokens authenticate by hash, carry their scopes and datasets, and expire, rotate
//! and revoke with a recorded history.

use receipts::auth::{NewToken, Scope};
use receipts::clock::Clock;
use receipts::LedgerError;
use uuid::Uuid;

use super::{must, Harness, SECOND};

/// Tokens authenticate by secret and carry their scopes and datasets.
pub async fn tokens_authenticate(harness: Harness) {
    let created = harness
        .ledger
        .create_token(NewToken {
            name: "ingest-bot".to_owned(),
            scopes: vec![Scope::Ingest],
            datasets: Some(vec!["docs".to_owned()]),
            identity: None,
            created_by: "test".to_owned(),
            expires_at: None,
        })
        .await
        .expect("create");
    let principal = harness
        .ledger
        .authenticate(&created.secret)
        .await
        .expect("auth")
        .expect("known");
    assert_eq!(principal.name, "ingest-bot");
    assert!(principal.has(Scope::Ingest));
    assert!(!principal.has(Scope::Admin));
    assert!(principal.require_dataset("docs").is_ok());
    assert!(principal.require_dataset("other").is_err());
    assert_eq!(
        harness
            .ledger
            .authenticate("cairn_wrong")
            .await
            .expect("auth"),
        None
    );
    assert_eq!(harness.ledger.token_count().await.expect("count"), 1);
}

/// The token lifecycle on the ledger's clock: an expired token stops authenticating; a revoked
/// one stops at once and cannot be revoked twice; a rotation keeps name, scopes and datasets,
/// ends the old secret and starts the new one in one change; history names actor and reason.
pub async fn token_lifecycle(harness: Harness) {
    use receipts::auth::{TokenChange, TokenState};
    let now = harness.clock.now_micros();
    let short = must(
        harness
            .ledger
            .change_token(TokenChange::Create(NewToken {
                name: "short".to_owned(),
                scopes: vec![Scope::Search],
                datasets: Some(vec!["docs".to_owned()]),
                identity: None,
                created_by: "test".to_owned(),
                expires_at: Some(now + 60 * SECOND),
            }))
            .await,
        "create",
    );
    let secret = short.secret.clone().expect("a new secret");
    assert!(harness
        .ledger
        .authenticate(&secret)
        .await
        .expect("auth")
        .is_some());
    // A past expiry is refused at creation.
    assert!(matches!(
        harness
            .ledger
            .change_token(TokenChange::Create(NewToken {
                name: "stale".to_owned(),
                scopes: vec![Scope::Search],
                datasets: None,
                identity: None,
                created_by: "test".to_owned(),
                expires_at: Some(now),
            }))
            .await,
        Err(LedgerError::Invalid {
            code: "invalid_expiry",
            ..
        })
    ));

    // Rotation: same name, scopes, datasets and remaining lifetime; the old secret is over.
    let rotated = must(
        harness
            .ledger
            .change_token(TokenChange::Rotate {
                id: short.token.id,
                actor: "token:admin".to_owned(),
                reason: Some("scheduled".to_owned()),
                expires_at: None,
            })
            .await,
        "rotate",
    );
    let new_secret = rotated.secret.clone().expect("a new secret");
    assert_eq!(rotated.token.name, "short");
    assert_eq!(rotated.token.scopes, vec![Scope::Search]);
    assert_eq!(rotated.token.datasets, Some(vec!["docs".to_owned()]));
    assert_eq!(rotated.token.expires_at, Some(now + 60 * SECOND));
    assert_eq!(
        harness.ledger.authenticate(&secret).await.expect("auth"),
        None
    );
    assert!(harness
        .ledger
        .authenticate(&new_secret)
        .await
        .expect("auth")
        .is_some());
    let listed = harness.ledger.tokens().await.expect("tokens");
    let old = listed
        .iter()
        .find(|t| t.id == short.token.id)
        .expect("old token");
    assert_eq!(old.state, TokenState::Revoked);
    assert_eq!(old.replaced_by, Some(rotated.token.id));

    // Expiry, on the ledger's clock.
    harness.clock.advance(61 * SECOND);
    assert_eq!(
        harness
            .ledger
            .authenticate(&new_secret)
            .await
            .expect("auth"),
        None
    );
    let listed = harness.ledger.tokens().await.expect("tokens");
    let current = listed
        .iter()
        .find(|t| t.id == rotated.token.id)
        .expect("new token");
    assert_eq!(current.state, TokenState::Expired);

    // Revocation: at once, once.
    let kept = must(
        harness
            .ledger
            .create_token(NewToken {
                name: "kept".to_owned(),
                scopes: vec![Scope::Ingest],
                datasets: None,
                identity: None,
                created_by: "test".to_owned(),
                expires_at: None,
            })
            .await,
        "create",
    );
    let revoke = || TokenChange::Revoke {
        id: kept.id,
        actor: "token:admin".to_owned(),
        reason: Some("leaked".to_owned()),
    };
    must(harness.ledger.change_token(revoke()).await, "revoke");
    assert_eq!(
        harness
            .ledger
            .authenticate(&kept.secret)
            .await
            .expect("auth"),
        None
    );
    assert!(matches!(
        harness.ledger.change_token(revoke()).await,
        Err(LedgerError::TokenRevoked(id)) if id == kept.id
    ));
    assert!(matches!(
        harness
            .ledger
            .change_token(TokenChange::Revoke {
                id: Uuid::nil(),
                actor: "token:admin".to_owned(),
                reason: None,
            })
            .await,
        Err(LedgerError::TokenNotFound(_))
    ));
    let history = harness
        .ledger
        .history("token", &kept.id.to_string())
        .await
        .expect("history");
    let last = history.last().expect("entries");
    assert_eq!(
        (
            last.event.as_str(),
            last.actor.as_str(),
            last.cause.as_str()
        ),
        ("revoked", "token:admin", "leaked")
    );
    assert_eq!(harness.ledger.token_count().await.expect("count"), 0);
}
