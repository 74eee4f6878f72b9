//! An issuer's signing keys: found through its metadata, fetched with bounds, cached, and
//! refetched for a key the cache lacks at most once per interval.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use jsonwebtoken::jwk::{Jwk, JwkSet, PublicKeyUse};
use jsonwebtoken::DecodingKey;
use serde::Deserialize;

use crate::config::IssuerConfig;
use crate::validate::Refusal;

/// The most bytes a metadata document or a key set may have.
const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// One verification key.
#[derive(Clone)]
pub(crate) struct Key {
    /// The algorithm the key declares (`alg`), when it declares one.
    pub(crate) algorithm: Option<String>,
    pub(crate) decoding: DecodingKey,
}

/// What the cache holds now.
#[derive(Default)]
struct Held {
    /// Keys by `kid`; keys without one under the empty string.
    keys: HashMap<String, Vec<Key>>,
    /// The key set's URL, once found.
    jwks_uri: Option<String>,
    /// When a fetch was last tried, and whether it failed.
    last_attempt: Option<(Instant, bool)>,
}

/// Counters of what the cache has done (for tests, logs and metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyStats {
    /// Fetches of the key set tried.
    pub fetches: u64,
    /// Of those, the ones that failed.
    pub failures: u64,
}

/// The signing keys of one issuer.
pub struct KeyCache {
    issuer: IssuerConfig,
    http: reqwest::Client,
    held: RwLock<Arc<Held>>,
    /// Held while a fetch runs, so that concurrent requests for an unknown key fetch once.
    fetching: tokio::sync::Mutex<()>,
    fetches: AtomicU64,
    failures: AtomicU64,
}

impl KeyCache {
    /// A cache for `issuer`'s keys; nothing is fetched until a token needs a key.
    pub fn new(issuer: &IssuerConfig) -> Result<KeyCache, String> {
        let http = reqwest::Client::builder()
            .timeout(issuer.fetch_timeout)
            .connect_timeout(issuer.fetch_timeout)
            // An issuer's metadata and keys are read where they are; a redirect is refused.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| format!("the HTTP client for `{}`: {error}", issuer.issuer))?;
        let held = Held {
            jwks_uri: issuer.jwks_uri.clone(),
            ..Held::default()
        };
        Ok(KeyCache {
            issuer: issuer.clone(),
            http,
            held: RwLock::new(Arc::new(held)),
            fetching: tokio::sync::Mutex::new(()),
            fetches: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        })
    }

    /// What the cache has done so far.
    pub fn stats(&self) -> KeyStats {
        KeyStats {
            fetches: self.fetches.load(Ordering::SeqCst),
            failures: self.failures.load(Ordering::SeqCst),
        }
    }

    fn held(&self) -> Arc<Held> {
        match self.held.read() {
            Ok(held) => held.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Whether the cache still holds a key with id `kid` (any key, for `None`): a token
    /// verified earlier is reused only while its key is still published.
    pub(crate) fn holds(&self, kid: Option<&str>) -> bool {
        found(&self.held(), kid).is_some()
    }

    /// The keys that may have signed a token with key id `kid`: the keys with that id, or
    /// every key when the token names none. Fetches the key set when the cache lacks them and
    /// the last fetch is older than the refetch interval.
    pub(crate) async fn keys(&self, kid: Option<&str>) -> Result<Vec<Key>, Refusal> {
        if let Some(keys) = found(&self.held(), kid) {
            return Ok(keys);
        }
        let _fetching = self.fetching.lock().await;
        // Another request may have fetched while this one waited.
        let held = self.held();
        if let Some(keys) = found(&held, kid) {
            return Ok(keys);
        }
        if let Some((at, failed)) = held.last_attempt {
            if at.elapsed() < self.issuer.refetch_interval {
                return Err(missing(&self.issuer.issuer, kid, failed));
            }
        }
        self.fetches.fetch_add(1, Ordering::SeqCst);
        let fetched = self.fetch(held.jwks_uri.clone()).await;
        let mut next = Held {
            keys: held.keys.clone(),
            jwks_uri: held.jwks_uri.clone(),
            last_attempt: Some((Instant::now(), fetched.is_err())),
        };
        let outcome = if fetched.is_ok() { "ok" } else { "failed" };
        metrics::counter!("cairn_oauth_key_fetches_total", "outcome" => outcome).increment(1);
        match fetched {
            Ok((jwks_uri, keys)) => {
                tracing::info!(issuer = %self.issuer.issuer, keys = keys.values().map(Vec::len).sum::<usize>(), "issuer keys fetched");
                next.keys = keys;
                next.jwks_uri = Some(jwks_uri);
            }
            Err(message) => {
                self.failures.fetch_add(1, Ordering::SeqCst);
                tracing::warn!(issuer = %self.issuer.issuer, %message, "issuer keys could not be fetched; cached keys stay in use");
                // Find the key set again next time: the issuer may have moved it.
                next.jwks_uri = self.issuer.jwks_uri.clone();
            }
        }
        let next = Arc::new(next);
        match self.held.write() {
            Ok(mut held) => *held = next.clone(),
            Err(poisoned) => *poisoned.into_inner() = next.clone(),
        }
        let failed = next.last_attempt.is_some_and(|(_, failed)| failed);
        found(&next, kid).ok_or_else(|| missing(&self.issuer.issuer, kid, failed))
    }

    /// Finds the key set's URL (unless known) and reads the keys.
    async fn fetch(
        &self,
        jwks_uri: Option<String>,
    ) -> Result<(String, HashMap<String, Vec<Key>>), String> {
        let jwks_uri = match jwks_uri {
            Some(uri) => uri,
            None => {
                let url = self.metadata().await?;
                url.jwks_uri
                    .ok_or_else(|| format!("{} names no jwks_uri", url.found_at))?
            }
        };
        let bytes = self.get(&jwks_uri).await?;
        let set: JwkSet = serde_json::from_slice(&bytes)
            .map_err(|error| format!("the key set at {jwks_uri} does not parse: {error}"))?;
        let mut keys: HashMap<String, Vec<Key>> = HashMap::new();
        for jwk in &set.keys {
            if let Some(key) = usable(jwk) {
                keys.entry(jwk.common.key_id.clone().unwrap_or_default())
                    .or_default()
                    .push(key);
            }
        }
        if keys.is_empty() {
            return Err(format!(
                "the key set at {jwks_uri} holds no usable signing key"
            ));
        }
        Ok((jwks_uri, keys))
    }

    /// The issuer's metadata: its authorization-server metadata (RFC 8414) or else its OpenID
    /// configuration. The metadata's `issuer` must be the configured one, exactly.
    pub(crate) async fn metadata(&self) -> Result<Metadata, String> {
        let mut errors = Vec::new();
        for url in metadata_urls(&self.issuer.issuer)? {
            let bytes = match self.get(&url).await {
                Ok(bytes) => bytes,
                Err(error) => {
                    errors.push(error);
                    continue;
                }
            };
            let mut metadata: Metadata = match serde_json::from_slice(&bytes) {
                Ok(metadata) => metadata,
                Err(error) => {
                    errors.push(format!("{url} does not parse: {error}"));
                    continue;
                }
            };
            if metadata.issuer != self.issuer.issuer {
                return Err(format!(
                    "{url} names issuer `{}`, not `{}`",
                    metadata.issuer, self.issuer.issuer
                ));
            }
            metadata.found_at = url;
            return Ok(metadata);
        }
        Err(errors.join("; "))
    }

    /// The client cairn reaches this issuer with (bounded in time, no redirects).
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// GETs `url`, bounded in time and size.
    async fn get(&self, url: &str) -> Result<Vec<u8>, String> {
        let response = self
            .http
            .get(url)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|error| format!("{url}: {error}"))?;
        if !response.status().is_success() {
            return Err(format!("{url} answered {}", response.status()));
        }
        read_bounded(url, response).await
    }
}

/// A response's body, at most [`MAX_DOCUMENT_BYTES`].
pub(crate) async fn read_bounded(
    url: &str,
    mut response: reqwest::Response,
) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| format!("{url}: {error}"))?
    {
        if bytes.len() + chunk.len() > MAX_DOCUMENT_BYTES {
            return Err(format!("{url} is over {MAX_DOCUMENT_BYTES} bytes"));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// The fields of an issuer's metadata that cairn reads.
#[derive(Deserialize)]
pub(crate) struct Metadata {
    issuer: String,
    jwks_uri: Option<String>,
    /// Where tokens are introspected (RFC 7662), when the issuer offers it.
    pub(crate) introspection_endpoint: Option<String>,
    /// The URL the metadata was read from.
    #[serde(skip)]
    pub(crate) found_at: String,
}

/// Where an issuer's metadata may be: RFC 8414's well-known URL (inserted before the issuer's
/// path), then OpenID Connect's (appended to it).
fn metadata_urls(issuer: &str) -> Result<Vec<String>, String> {
    let parsed =
        reqwest::Url::parse(issuer).map_err(|error| format!("issuer `{issuer}`: {error}"))?;
    let origin = parsed.origin().ascii_serialization();
    let path = parsed.path().trim_end_matches('/');
    Ok(vec![
        format!("{origin}/.well-known/oauth-authorization-server{path}"),
        format!("{origin}{path}/.well-known/openid-configuration"),
    ])
}

/// A signing key cairn can use: not an encryption key, and of a family cairn accepts.
fn usable(jwk: &Jwk) -> Option<Key> {
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return None;
    }
    let decoding = DecodingKey::from_jwk(jwk).ok()?;
    let algorithm = jwk
        .common
        .key_algorithm
        .map(|algorithm| format!("{algorithm:?}"));
    Some(Key {
        algorithm,
        decoding,
    })
}

fn found(held: &Held, kid: Option<&str>) -> Option<Vec<Key>> {
    match kid {
        Some(kid) => held.keys.get(kid).cloned(),
        None if held.keys.is_empty() => None,
        None => Some(held.keys.values().flatten().cloned().collect()),
    }
}

fn missing(issuer: &str, kid: Option<&str>, fetch_failed: bool) -> Refusal {
    let kid = kid.map(crate::validate::shown).unwrap_or_default();
    if fetch_failed {
        Refusal::Unavailable(format!(
            "the signing keys of `{issuer}` cannot be fetched now, and key `{kid}` is not cached"
        ))
    } else {
        Refusal::UnknownKey(format!("`{issuer}` publishes no key `{kid}`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_found_where_both_specifications_put_it() {
        assert_eq!(
            metadata_urls("https://id.example.com").expect("urls"),
            vec![
                "https://id.example.com/.well-known/oauth-authorization-server".to_owned(),
                "https://id.example.com/.well-known/openid-configuration".to_owned(),
            ]
        );
        assert_eq!(
            metadata_urls("https://id.example.com/realms/corp/").expect("urls"),
            vec![
                "https://id.example.com/.well-known/oauth-authorization-server/realms/corp"
                    .to_owned(),
                "https://id.example.com/realms/corp/.well-known/openid-configuration".to_owned(),
            ]
        );
    }
}
