//! Token introspection (RFC 7662): asking an issuer whether a token is active, for tokens
//! cairn cannot read itself (opaque ones) and, where configured, for JWTs that must stop
//! working once revoked.
//!
//! - An opaque token's principal comes from the answer's claims, checked as a JWT's are
//!   (active, issuer, audience, lifetime).
//! - A JWT of an issuer set to introspect them is verified against the keys first, keeps its
//!   signed claims, and is refused once the issuer says it is no longer active (revoked).
//! - An answer is cached under the token's SHA-256 (never the token itself) for at most the
//!   configured time and never beyond the token's `exp`; an inactive answer is cached as long,
//!   so a client repeating a dead token costs one call per interval. An issuer that cannot
//!   answer is a temporary refusal, never cached.

use serde_json::Value;

use crate::cache::{now, until, TokenCache};
use crate::config::{Introspection, IssuerConfig};
use crate::keys::{read_bounded, KeyCache};
use crate::validate::{map, names, shown, Refusal, Verified};

/// Introspects one issuer's tokens.
pub(crate) struct Introspector {
    settings: Introspection,
    /// The endpoint, once configured or found in the issuer's metadata.
    endpoint: tokio::sync::Mutex<Option<String>>,
    cache: TokenCache<Value>,
}

impl Introspector {
    pub(crate) fn new(settings: &Introspection) -> Introspector {
        Introspector {
            settings: settings.clone(),
            endpoint: tokio::sync::Mutex::new(settings.endpoint.clone()),
            cache: TokenCache::new(),
        }
    }

    /// Whether the issuer's JWTs go through introspection too.
    pub(crate) fn takes_jwts(&self) -> bool {
        self.settings.jwts
    }

    /// An opaque token: what the issuer says of it, judged as a token is and mapped to a
    /// principal from the answer's claims.
    pub(crate) async fn introspect(
        &self,
        issuer: &IssuerConfig,
        keys: &KeyCache,
        audiences: &[String],
        token: &str,
    ) -> Result<Verified, Refusal> {
        let answer = self.answer(keys, token).await?;
        judge(issuer, audiences, &answer)
    }

    /// A JWT already verified against the issuer's keys: whether the issuer still holds it
    /// active (not revoked). Its claims stay the signed token's.
    pub(crate) async fn still_active(&self, keys: &KeyCache, token: &str) -> Result<(), Refusal> {
        let answer = self.answer(keys, token).await?;
        if answer.get("active") == Some(&Value::Bool(true)) {
            Ok(())
        } else {
            Err(Refusal::Inactive)
        }
    }

    /// The issuer's answer for `token`, from the cache while it holds one.
    async fn answer(&self, keys: &KeyCache, token: &str) -> Result<Value, Refusal> {
        let digest = TokenCache::<Value>::digest(token);
        if let Some(answer) = self.cache.get(&digest) {
            return Ok(answer);
        }
        let endpoint = self.endpoint(keys).await?;
        let answer = self.ask(keys, &endpoint, token).await?;
        let active = answer.get("active") == Some(&Value::Bool(true));
        metrics::counter!("cairn_oauth_introspections_total",
            "outcome" => if active { "active" } else { "inactive" })
        .increment(1);
        let lifetime = if active {
            // Never beyond the token's own end (no `exp`: the answer is refused anyway).
            until(
                answer.get("exp").and_then(Value::as_i64).unwrap_or(0),
                self.settings.cache,
            )
        } else {
            self.settings.cache
        };
        self.cache.insert(digest, lifetime, answer.clone());
        Ok(answer)
    }

    /// The endpoint: configured, or read once from the issuer's metadata.
    async fn endpoint(&self, keys: &KeyCache) -> Result<String, Refusal> {
        let mut endpoint = self.endpoint.lock().await;
        if let Some(found) = endpoint.as_ref() {
            return Ok(found.clone());
        }
        let metadata = keys.metadata().await.map_err(|error| {
            Refusal::Unavailable(format!("the issuer's metadata cannot be read: {error}"))
        })?;
        let found = metadata.introspection_endpoint.ok_or_else(|| {
            Refusal::Unavailable(format!(
                "{} names no introspection_endpoint; configure one",
                metadata.found_at
            ))
        })?;
        *endpoint = Some(found.clone());
        Ok(found)
    }

    /// POSTs the token to the endpoint with cairn's client credentials; the answer's JSON.
    async fn ask(&self, keys: &KeyCache, endpoint: &str, token: &str) -> Result<Value, Refusal> {
        let unavailable = |why: String| {
            tracing::warn!(endpoint, %why, "token introspection failed");
            Refusal::Unavailable(format!("the issuer cannot introspect the token now: {why}"))
        };
        let response = keys
            .http()
            .post(endpoint)
            .basic_auth(
                &self.settings.client_id,
                Some(&self.settings.client_secret.0),
            )
            .header("accept", "application/json")
            .form(&[("token", token), ("token_type_hint", "access_token")])
            .send()
            .await
            .map_err(|error| unavailable(error.to_string()))?;
        let status = response.status();
        if status.as_u16() == 401 || status.as_u16() == 403 {
            // cairn's own credentials: an operator's problem, not the caller's.
            tracing::error!(endpoint, %status, "the introspection endpoint refused cairn's client credentials");
            return Err(unavailable(format!(
                "it refused cairn's credentials ({status})"
            )));
        }
        if !status.is_success() {
            return Err(unavailable(format!("it answered {status}")));
        }
        let bytes = read_bounded(endpoint, response)
            .await
            .map_err(unavailable)?;
        let answer: Value = serde_json::from_slice(&bytes)
            .map_err(|error| unavailable(format!("its answer does not parse: {error}")))?;
        if !answer.is_object() {
            return Err(unavailable("its answer is not a JSON object".to_owned()));
        }
        Ok(answer)
    }
}

/// An introspection answer, judged as a token is: active, from this issuer, for this
/// resource, within its lifetime; then mapped to a principal.
fn judge(issuer: &IssuerConfig, audiences: &[String], answer: &Value) -> Result<Verified, Refusal> {
    if answer.get("active") != Some(&Value::Bool(true)) {
        return Err(Refusal::Inactive);
    }
    if let Some(named) = answer.get("iss").and_then(Value::as_str) {
        if named != issuer.issuer {
            return Err(Refusal::UnknownIssuer(shown(named)));
        }
    }
    let audience = names(answer.get("aud"));
    if !audience.iter().any(|named| audiences.contains(named)) {
        return Err(Refusal::Audience(if audience.is_empty() {
            "the introspection answer names no `aud`".to_owned()
        } else {
            "`aud` does not name it".to_owned()
        }));
    }
    let skew = i64::try_from(issuer.skew.as_secs()).unwrap_or(0);
    let now = now();
    match answer.get("exp").and_then(Value::as_i64) {
        Some(exp) if exp + skew < now => return Err(Refusal::Expired),
        Some(_) => {}
        None => return Err(Refusal::Claims("`exp` is missing".to_owned())),
    }
    if answer
        .get("nbf")
        .and_then(Value::as_i64)
        .is_some_and(|nbf| nbf - skew > now)
    {
        return Err(Refusal::NotYetValid);
    }
    map(issuer, answer.clone())
}
