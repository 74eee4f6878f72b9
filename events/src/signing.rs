//! Signing deliveries the Standard Webhooks way: `webhook-id`, `webhook-timestamp` and
//! `webhook-signature`, the signature an HMAC-SHA256 over `id.timestamp.body` under the
//! subscription's secret (`whsec_` and its base64), as `v1,<base64>`. While a rotated secret's
//! grace lasts, the new secret and the one before both sign, space-separated, so a receiver
//! that still holds the old one keeps verifying.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ring::hmac;

/// The prefix of a secret's text.
const PREFIX: &str = "whsec_";
/// Random bytes in a new secret.
const SECRET_BYTES: usize = 32;

/// A signing secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Vec<u8>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Secret(..)")
    }
}

impl Secret {
    /// A new random secret.
    pub fn generate() -> Result<Secret, String> {
        let mut key = vec![0u8; SECRET_BYTES];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
            .map_err(|_| "the system's random source failed".to_owned())?;
        Ok(Secret { key })
    }

    /// A secret from its text (`whsec_` and base64, as it was shown once to its owner).
    pub fn parse(text: &str) -> Result<Secret, String> {
        let encoded = text.strip_prefix(PREFIX).unwrap_or(text);
        let key = STANDARD
            .decode(encoded.trim_end_matches('='))
            .or_else(|_| {
                base64::engine::general_purpose::STANDARD_NO_PAD
                    .decode(encoded.trim_end_matches('='))
            })
            .map_err(|_| "a webhook secret is `whsec_` followed by base64".to_owned())?;
        if key.len() < 16 {
            return Err("a webhook secret has at least 16 bytes".to_owned());
        }
        Ok(Secret { key })
    }

    /// Its text: what its owner is shown once and configures in the receiver.
    pub fn text(&self) -> String {
        format!("{PREFIX}{}", STANDARD.encode(&self.key))
    }

    /// `v1,<base64 HMAC-SHA256 of id.timestamp.body>`.
    pub fn signature(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.key);
        let mut context = hmac::Context::with_key(&key);
        context.update(id.as_bytes());
        context.update(b".");
        context.update(timestamp.to_string().as_bytes());
        context.update(b".");
        context.update(body);
        format!("v1,{}", STANDARD.encode(context.sign().as_ref()))
    }
}

/// The three headers of a delivery signed by each of `secrets` (the current one first).
pub fn headers(
    secrets: &[Secret],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> [(&'static str, String); 3] {
    let signature = secrets
        .iter()
        .map(|secret| secret.signature(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ");
    [
        ("webhook-id", id.to_owned()),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", signature),
    ]
}

/// Whether `signature_header` carries a valid signature of `id.timestamp.body` under
/// `secret`, compared in constant time, and the timestamp is within `tolerance_seconds` of
/// `now` (a receiver's check; cairn's tests use it beside the reference verifier).
pub fn verify(
    secret: &Secret,
    id: &str,
    timestamp: i64,
    body: &[u8],
    signature_header: &str,
    now: i64,
    tolerance_seconds: i64,
) -> bool {
    if (now - timestamp).abs() > tolerance_seconds {
        return false;
    }
    let key = hmac::Key::new(hmac::HMAC_SHA256, &secret.key);
    let mut message = Vec::with_capacity(id.len() + body.len() + 24);
    message.extend_from_slice(id.as_bytes());
    message.push(b'.');
    message.extend_from_slice(timestamp.to_string().as_bytes());
    message.push(b'.');
    message.extend_from_slice(body);
    signature_header.split(' ').any(|versioned| {
        versioned
            .strip_prefix("v1,")
            .and_then(|encoded| STANDARD.decode(encoded).ok())
            .is_some_and(|tag| hmac::verify(&key, &message, &tag).is_ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification.
    #[test]
    fn the_specifications_example_signs_alike() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("secret");
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            secret.signature("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        let header = secret.signature("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert!(verify(
            &secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            body,
            &header,
            1614265330,
            300
        ));
        assert!(!verify(
            &secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            b"{}",
            &header,
            1614265330,
            300
        ));
        assert!(!verify(
            &secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            body,
            &header,
            1614265330 + 301,
            300
        ));
    }

    #[test]
    fn a_rotated_secret_and_the_one_before_both_sign() {
        let old = Secret::generate().expect("old");
        let new = Secret::generate().expect("new");
        let [_, _, (_, signature)] = headers(&[new.clone(), old.clone()], "evt_1", 100, b"body");
        assert_eq!(signature.split(' ').count(), 2);
        assert!(verify(&new, "evt_1", 100, b"body", &signature, 100, 300));
        assert!(verify(&old, "evt_1", 100, b"body", &signature, 100, 300));
        let stranger = Secret::generate().expect("stranger");
        assert!(!verify(
            &stranger, "evt_1", 100, b"body", &signature, 100, 300
        ));
        assert_eq!(Secret::parse(&new.text()).expect("round trip"), new);
        assert!(Secret::parse("whsec_c2hvcnQ=").is_err(), "too short");
        assert!(Secret::parse("whsec_not base64!").is_err());
        assert!(!format!("{new:?}").contains(&new.text()[6..]));
    }
}
