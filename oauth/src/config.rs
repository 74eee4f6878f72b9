//! What cairn is told about itself as a resource and about each issuer it trusts.

use std::collections::BTreeMap;
use std::time::Duration;

use receipts::Scope;

/// The signing algorithms cairn can be told to accept. `none` and the HMAC family are not
/// among them: a resource server holds no shared secret, and an HMAC "verified" with a public
/// key is a forgery.
pub const ALGORITHMS: [&str; 4] = ["RS256", "PS256", "ES256", "EdDSA"];

/// cairn as a protected resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    /// cairn's public URL, the `aud` every accepted token must name (RFC 8707) and the
    /// `resource` of the protected resource metadata (RFC 9728).
    pub resource: String,
    /// The issuers whose tokens are accepted.
    pub issuers: Vec<IssuerConfig>,
}

impl Resource {
    /// Checks the configuration: a resource URL, at least one issuer, each issuer valid.
    pub fn check(&self) -> Result<(), String> {
        check_url("the resource", &self.resource)?;
        if self.issuers.is_empty() {
            return Err("an OAuth resource needs at least one issuer".to_owned());
        }
        for issuer in &self.issuers {
            issuer.check()?;
        }
        let mut seen = std::collections::BTreeSet::new();
        for issuer in &self.issuers {
            if !seen.insert(issuer.issuer.as_str()) {
                return Err(format!("issuer `{}` is configured twice", issuer.issuer));
            }
        }
        Ok(())
    }
}

/// One trusted issuer: where its keys are found and how its claims map to cairn's model.
#[derive(Debug, Clone, PartialEq)]
pub struct IssuerConfig {
    /// The issuer identifier, compared exactly with a token's `iss`. Its metadata is read
    /// from `/.well-known/oauth-authorization-server` (RFC 8414), then from
    /// `/.well-known/openid-configuration`.
    pub issuer: String,
    /// The key set's URL, when the issuer publishes no metadata (skips discovery).
    pub jwks_uri: Option<String>,
    /// The algorithms accepted from this issuer (a subset of [`ALGORITHMS`]).
    pub algorithms: Vec<String>,
    /// The issuer's scope names, each to the cairn scopes it grants. A scope the table does
    /// not name grants nothing.
    pub scopes: BTreeMap<String, Vec<Scope>>,
    /// The claim whose value becomes the principal `user:<value>` (default `sub`).
    pub principal_claim: String,
    /// The claim listing the caller's groups (`groups`, `roles`), each `group:<name>`.
    pub groups_claim: Option<String>,
    /// The claim listing the datasets the caller may touch; absent: [`Self::datasets`].
    pub datasets_claim: Option<String>,
    /// The dataset allowlist when no claim gives one; `None`: every dataset.
    pub datasets: Option<Vec<String>>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub skew: Duration,
    /// The shortest time between two fetches of the key set.
    pub refetch_interval: Duration,
    /// The longest a fetch (metadata or keys) may take.
    pub fetch_timeout: Duration,
    /// Token introspection (RFC 7662): for the issuer's opaque tokens, and for its JWTs too
    /// when [`Introspection::jwts`] is set.
    pub introspection: Option<Introspection>,
}

/// How cairn asks an issuer whether a token is active (RFC 7662).
#[derive(Debug, Clone, PartialEq)]
pub struct Introspection {
    /// The endpoint; absent, the issuer's metadata names it (`introspection_endpoint`).
    pub endpoint: Option<String>,
    /// cairn's client id at the issuer (HTTP Basic authentication).
    pub client_id: String,
    /// Its secret, read from a file or the environment, never from the configuration file.
    pub client_secret: Secret,
    /// The longest an answer is reused; never beyond the token's `exp`.
    pub cache: Duration,
    /// Whether the issuer's JWTs are introspected too (so that a revoked token stops working
    /// within [`Self::cache`]), instead of being checked against its keys alone.
    pub jwts: bool,
}

/// A secret that no `Debug` output shows.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Secret(..)")
    }
}

impl IssuerConfig {
    /// An issuer with the defaults: EdDSA, ES256, RS256 and PS256; `sub` as the principal; no
    /// groups; every dataset; 60 s of skew; a refetch at most every 10 s; fetches bounded at 5 s.
    pub fn new(issuer: &str) -> IssuerConfig {
        IssuerConfig {
            issuer: issuer.to_owned(),
            jwks_uri: None,
            algorithms: ALGORITHMS.iter().map(|name| (*name).to_owned()).collect(),
            scopes: BTreeMap::new(),
            principal_claim: "sub".to_owned(),
            groups_claim: None,
            datasets_claim: None,
            datasets: None,
            skew: Duration::from_secs(60),
            refetch_interval: Duration::from_secs(10),
            fetch_timeout: Duration::from_secs(5),
            introspection: None,
        }
    }

    /// Checks the issuer's settings.
    pub fn check(&self) -> Result<(), String> {
        check_url("an issuer", &self.issuer)?;
        if let Some(uri) = &self.jwks_uri {
            check_url("a jwks_uri", uri)?;
        }
        if self.algorithms.is_empty() {
            return Err(format!("issuer `{}` accepts no algorithm", self.issuer));
        }
        for algorithm in &self.algorithms {
            if !ALGORITHMS.contains(&algorithm.as_str()) {
                return Err(format!(
                    "issuer `{}`: algorithm `{algorithm}` is not accepted; choose among {}",
                    self.issuer,
                    ALGORITHMS.join(", ")
                ));
            }
        }
        if self.principal_claim.trim().is_empty() {
            return Err(format!(
                "issuer `{}`: the principal claim is empty",
                self.issuer
            ));
        }
        if let Some(introspection) = &self.introspection {
            if let Some(endpoint) = &introspection.endpoint {
                check_url("an introspection endpoint", endpoint)?;
            }
            if introspection.client_id.trim().is_empty() || introspection.client_secret.0.is_empty()
            {
                return Err(format!(
                    "issuer `{}`: introspection needs a client id and secret",
                    self.issuer
                ));
            }
            if introspection.cache > Duration::from_secs(300) {
                return Err(format!(
                    "issuer `{}`: an introspection cache over 300 s keeps revoked tokens working",
                    self.issuer
                ));
            }
        }
        if self.skew > Duration::from_secs(600) {
            return Err(format!(
                "issuer `{}`: a skew over 600 s keeps expired tokens working",
                self.issuer
            ));
        }
        Ok(())
    }
}

fn check_url(what: &str, url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|error| format!("{what} `{url}`: {error}"))?;
    match parsed.scheme() {
        "https" => Ok(()),
        // Plain HTTP only on loopback: a test issuer, or one behind a local proxy.
        "http" if matches!(parsed.host_str(), Some("127.0.0.1" | "localhost" | "[::1]")) => Ok(()),
        _ => Err(format!(
            "{what} `{url}` must be an https URL (http only on loopback)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issuers_are_checked() {
        let mut issuer = IssuerConfig::new("https://id.example.com");
        assert_eq!(issuer.check(), Ok(()));
        issuer.algorithms = vec!["HS256".to_owned()];
        let message = issuer.check().expect_err("HS256 is refused");
        assert!(message.contains("HS256"), "{message}");
        issuer.algorithms = vec!["none".to_owned()];
        assert!(issuer.check().is_err());
        let plain = IssuerConfig::new("http://id.example.com");
        assert!(plain.check().is_err(), "plain http off loopback is refused");
        assert_eq!(IssuerConfig::new("http://127.0.0.1:8080").check(), Ok(()));
        let resource = Resource {
            resource: "https://cairn.example.com".to_owned(),
            issuers: vec![
                IssuerConfig::new("https://a.example.com"),
                IssuerConfig::new("https://a.example.com"),
            ],
        };
        assert!(resource.check().expect_err("twice").contains("twice"));
    }
}
