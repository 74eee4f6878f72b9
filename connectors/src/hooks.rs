//! Push hooks: `POST /v1/connectors/{id}/hook` takes a push webhook from GitHub, GitLab, Gitea
//! or Forgejo and makes the git connector's run due now, so that a push is searchable in
//! seconds instead of at the next interval (which stays the guarantee).
//!
//! ## Invariants
//! - Nothing changes before the delivery is verified with the connector's own secret
//!   (`hook_secret` in its credentials file; the ledger never holds it): GitHub's
//!   `X-Hub-Signature-256` and Gitea's or Forgejo's `X-Gitea-Signature` (HMAC-SHA256 of the raw
//!   body), GitLab's `X-Gitlab-Token` (the secret itself), each compared in constant time. A
//!   missing or wrong one is a 401 that changes nothing.
//! - Only a push to the connector's ref makes the run due; any other ref or event is answered
//!   with the reason it was ignored.
//! - A delivery is taken once: its provider's delivery id is recorded in the ledger with the
//!   run-now change it causes ([`receipts::connectors::delivery`]), so a replay changes
//!   nothing.

use ring::hmac;

/// Largest push payload read (GitHub caps its payloads at 25 MB; a push's is far smaller).
pub const MAX_HOOK_BYTES: usize = 5 << 20;

/// Who sent a hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// GitHub (`X-Hub-Signature-256`, `X-GitHub-Event`, `X-GitHub-Delivery`).
    GitHub,
    /// GitLab (`X-Gitlab-Token`, `X-Gitlab-Event`, `X-Gitlab-Event-UUID`).
    GitLab,
    /// Gitea or Forgejo (`X-Gitea-Signature` or `X-Forgejo-Signature`, `X-Gitea-Event`,
    /// `X-Gitea-Delivery`).
    Gitea,
}

impl Provider {
    /// Its name in deliveries, history and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::GitHub => "github",
            Provider::GitLab => "gitlab",
            Provider::Gitea => "gitea",
        }
    }
}

/// A verified delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Who sent it.
    pub provider: Provider,
    /// The provider's delivery id, when it sent one.
    pub id: Option<String>,
    /// Whether it reports a push (others are ignored).
    pub push: bool,
    /// The event's name as sent (`push`, `Push Hook`, `ping`, ...).
    pub event: String,
    /// The pushed ref (`refs/heads/main`).
    pub reference: Option<String>,
    /// The commit the ref names after the push.
    pub after: Option<String>,
}

/// Why a hook was refused before anything changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No provider's signature header.
    #[error("the delivery carries no signature (X-Hub-Signature-256, X-Gitea-Signature or X-Gitlab-Token)")]
    Unsigned,
    /// The signature does not match the connector's secret.
    #[error("the delivery's signature does not match the connector's hook secret")]
    BadSignature,
    /// The body is not a JSON object.
    #[error("the delivery's body is not a JSON object: {0}")]
    NotJson(String),
}

/// A header's value as text ("" when absent or not text).
fn header<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .trim()
}

/// Compares two byte strings in time that depends on their lengths only.
fn same(left: &[u8], right: &[u8]) -> bool {
    left.len() == right.len()
        && left
            .iter()
            .zip(right)
            .fold(0u8, |difference, (a, b)| difference | (a ^ b))
            == 0
}

/// Whether `hex_tag` (lowercase or uppercase hex) is the HMAC-SHA256 of `body` under `secret`.
fn hmac_matches(secret: &str, body: &[u8], hex_tag: &str) -> bool {
    let Ok(tag) = hex::decode(hex_tag) else {
        return false;
    };
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    hmac::verify(&key, body, &tag).is_ok()
}

/// Verifies a delivery with `secret` and reads what it reports.
pub fn verify(
    headers: &axum::http::HeaderMap,
    body: &[u8],
    secret: &str,
) -> Result<Delivery, Refusal> {
    // Forgejo sends its own header and Gitea's; Gitea sends GitHub's too. The most specific
    // one present decides.
    let gitea = [
        header(headers, "x-forgejo-signature"),
        header(headers, "x-gitea-signature"),
    ]
    .into_iter()
    .find(|value| !value.is_empty());
    let (provider, verified) = if let Some(signature) = gitea {
        (Provider::Gitea, hmac_matches(secret, body, signature))
    } else if !header(headers, "x-hub-signature-256").is_empty() {
        let signature = header(headers, "x-hub-signature-256");
        let matches = signature
            .strip_prefix("sha256=")
            .is_some_and(|tag| hmac_matches(secret, body, tag));
        (Provider::GitHub, matches)
    } else if !header(headers, "x-gitlab-token").is_empty() {
        (
            Provider::GitLab,
            same(
                header(headers, "x-gitlab-token").as_bytes(),
                secret.as_bytes(),
            ),
        )
    } else {
        return Err(Refusal::Unsigned);
    };
    if !verified {
        return Err(Refusal::BadSignature);
    }
    let payload: serde_json::Value =
        serde_json::from_slice(body).map_err(|error| Refusal::NotJson(error.to_string()))?;
    if !payload.is_object() {
        return Err(Refusal::NotJson("not an object".to_owned()));
    }
    let (event, id) = match provider {
        Provider::GitHub => (
            header(headers, "x-github-event"),
            header(headers, "x-github-delivery"),
        ),
        Provider::GitLab => {
            let id = [
                "x-gitlab-event-uuid",
                "x-gitlab-webhook-uuid",
                "idempotency-key",
            ]
            .iter()
            .map(|name| header(headers, name))
            .find(|value| !value.is_empty())
            .unwrap_or("");
            (header(headers, "x-gitlab-event"), id)
        }
        Provider::Gitea => {
            let event = [
                header(headers, "x-gitea-event"),
                header(headers, "x-forgejo-event"),
            ]
            .into_iter()
            .find(|value| !value.is_empty())
            .unwrap_or("");
            let id = [
                header(headers, "x-gitea-delivery"),
                header(headers, "x-forgejo-delivery"),
            ]
            .into_iter()
            .find(|value| !value.is_empty())
            .unwrap_or("");
            (event, id)
        }
    };
    let push = match provider {
        Provider::GitLab => {
            event.eq_ignore_ascii_case("Push Hook") || event.eq_ignore_ascii_case("Tag Push Hook")
        }
        _ => event.eq_ignore_ascii_case("push"),
    };
    let text = |field: &str| {
        payload
            .get(field)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    Ok(Delivery {
        provider,
        id: (!id.is_empty()).then(|| id.to_owned()),
        push,
        event: event.to_owned(),
        reference: text("ref"),
        after: text("after"),
    })
}

/// `text` for history and answers: at most `chars` characters, control characters as `?`.
pub fn shown(text: &str, chars: usize) -> String {
    text.chars()
        .take(chars)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Whether a push to `pushed` (a full ref name) moves the connector's `reference` (a branch,
/// a tag, or a full ref name).
pub fn moves(reference: &str, pushed: &str) -> bool {
    pushed == reference
        || pushed.strip_prefix("refs/heads/") == Some(reference)
        || pushed.strip_prefix("refs/tags/") == Some(reference)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

    fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).expect("header"));
        }
        map
    }

    fn sign(secret: &str, body: &[u8]) -> String {
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
        hex::encode(hmac::sign(&key, body).as_ref())
    }

    const BODY: &[u8] = br#"{"ref":"refs/heads/main","after":"0123abcd"}"#;

    #[test]
    fn each_provider_is_verified_with_the_secret() {
        let github = headers(&[
            (
                "x-hub-signature-256",
                format!("sha256={}", sign("s3", BODY)),
            ),
            ("x-github-event", "push".to_owned()),
            ("x-github-delivery", "d-1".to_owned()),
        ]);
        let delivery = verify(&github, BODY, "s3").expect("github");
        assert_eq!(delivery.provider, Provider::GitHub);
        assert!(delivery.push);
        assert_eq!(delivery.id.as_deref(), Some("d-1"));
        assert_eq!(delivery.reference.as_deref(), Some("refs/heads/main"));
        assert_eq!(verify(&github, BODY, "other"), Err(Refusal::BadSignature));
        let tampered = br#"{"ref":"refs/heads/evil","after":"0123abcd"}"#;
        assert_eq!(verify(&github, tampered, "s3"), Err(Refusal::BadSignature));

        // Gitea sends GitHub's header too; its own decides.
        let gitea = headers(&[
            ("x-gitea-signature", sign("s3", BODY)),
            ("x-hub-signature-256", "sha256=00".to_owned()),
            ("x-gitea-event", "push".to_owned()),
            ("x-gitea-delivery", "g-1".to_owned()),
        ]);
        let delivery = verify(&gitea, BODY, "s3").expect("gitea");
        assert_eq!((delivery.provider, delivery.push), (Provider::Gitea, true));
        let forgejo = headers(&[
            ("x-forgejo-signature", sign("s3", BODY)),
            ("x-forgejo-event", "push".to_owned()),
            ("x-forgejo-delivery", "f-1".to_owned()),
        ]);
        let delivery = verify(&forgejo, BODY, "s3").expect("forgejo");
        assert_eq!(delivery.id.as_deref(), Some("f-1"));
        assert_eq!(verify(&forgejo, BODY, "s4"), Err(Refusal::BadSignature));

        let gitlab = headers(&[
            ("x-gitlab-token", "s3".to_owned()),
            ("x-gitlab-event", "Push Hook".to_owned()),
            ("x-gitlab-event-uuid", "l-1".to_owned()),
        ]);
        let delivery = verify(&gitlab, BODY, "s3").expect("gitlab");
        assert_eq!((delivery.provider, delivery.push), (Provider::GitLab, true));
        assert_eq!(verify(&gitlab, BODY, "s4"), Err(Refusal::BadSignature));
        assert_eq!(
            verify(&HeaderMap::new(), BODY, "s3"),
            Err(Refusal::Unsigned)
        );
    }

    #[test]
    fn only_the_connectors_ref_is_moved() {
        assert!(moves("main", "refs/heads/main"));
        assert!(moves("v1.0", "refs/tags/v1.0"));
        assert!(moves("refs/heads/main", "refs/heads/main"));
        assert!(!moves("main", "refs/heads/main-old"));
        assert!(!moves("main", "refs/heads/dev"));
    }
}
