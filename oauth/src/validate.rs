//! Verifying an access token and mapping its claims to a cairn principal.

use std::collections::BTreeSet;

use base64::Engine as _;
use jsonwebtoken::{Algorithm, Validation};
use receipts::access::Identity;
use receipts::{Principal, Scope};
use serde_json::Value;

use crate::cache::{until, TokenCache};
use crate::config::{IssuerConfig, Resource};
use crate::introspect::Introspector;
use crate::keys::KeyCache;

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not a JWT, or a part of it does not decode.
    #[error("the token is not a well-formed JWT: {0}")]
    Malformed(String),
    /// `iss` names no configured issuer (compared exactly).
    #[error("the token's issuer `{0}` is not trusted")]
    UnknownIssuer(String),
    /// The algorithm is `none`, an HMAC, or not among the issuer's.
    #[error("the token's algorithm is refused: {0}")]
    Algorithm(String),
    /// `aud` does not name this resource.
    #[error("the token was not minted for this resource ({0})")]
    Audience(String),
    /// `exp` has passed, beyond the skew.
    #[error("the token has expired")]
    Expired,
    /// `nbf` is still ahead, beyond the skew.
    #[error("the token is not valid yet")]
    NotYetValid,
    /// No published key of the issuer has that key id.
    #[error("{0}")]
    UnknownKey(String),
    /// No key verifies the signature.
    #[error("the token's signature does not verify")]
    Signature,
    /// A claim cairn needs is missing or not usable.
    #[error("the token's claims are not usable: {0}")]
    Claims(String),
    /// The issuer says the token is not active (revoked, expired or never issued).
    #[error("the issuer says the token is not active")]
    Inactive,
    /// The token cannot be checked now (its issuer's keys cannot be fetched): a 503, so that
    /// a client keeps its token and retries.
    #[error("{0}")]
    Unavailable(String),
}

impl Refusal {
    /// A stable name for the reason, for logs, metrics and the error's details.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Malformed(_) => "malformed",
            Refusal::UnknownIssuer(_) => "unknown_issuer",
            Refusal::Algorithm(_) => "algorithm",
            Refusal::Audience(_) => "audience",
            Refusal::Expired => "expired",
            Refusal::NotYetValid => "not_yet_valid",
            Refusal::UnknownKey(_) => "unknown_key",
            Refusal::Signature => "signature",
            Refusal::Claims(_) => "claims",
            Refusal::Inactive => "inactive",
            Refusal::Unavailable(_) => "issuer_unavailable",
        }
    }

    /// Whether the refusal is temporary (503) rather than final (401).
    pub fn is_temporary(&self) -> bool {
        matches!(self, Refusal::Unavailable(_))
    }
}

/// A verified token, mapped to cairn's model.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    /// The issuer that minted it.
    pub issuer: String,
    /// Its subject (the principal claim's value).
    pub subject: String,
    /// The scope names it carries, as the issuer named them.
    pub issuer_scopes: Vec<String>,
    /// When it expires (seconds since the epoch).
    pub expires_at: i64,
    /// What it grants in cairn.
    pub principal: Principal,
}

/// Verifies access tokens for one resource against its issuers.
pub struct Validator {
    /// The audiences a token may name: the resource, and its MCP endpoint (a host asks for a
    /// token for the URL it connects to, RFC 8707).
    audiences: Vec<String>,
    issuers: Vec<Trusted>,
    /// JWTs already verified against their keys, until they expire (at most
    /// [`VERIFIED_FOR`]): a client repeating its token pays for one signature check.
    verified: TokenCache<Held>,
}

/// A verified token held in the cache: its issuer (an index), the key id it named, and what
/// it grants.
#[derive(Clone)]
struct Held {
    index: usize,
    kid: Option<String>,
    verified: Verified,
}

/// The longest a verified JWT is reused without checking its signature again, so that a key
/// the issuer withdrew stops working within it.
const VERIFIED_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// One trusted issuer: its settings, its keys, and how its tokens are introspected.
struct Trusted {
    config: IssuerConfig,
    keys: KeyCache,
    introspector: Option<Introspector>,
}

impl Validator {
    /// A validator for `resource`; checks the configuration. Nothing is fetched yet.
    pub fn new(resource: &Resource) -> Result<Validator, String> {
        resource.check()?;
        let issuers = resource
            .issuers
            .iter()
            .map(|issuer| {
                Ok(Trusted {
                    config: issuer.clone(),
                    keys: KeyCache::new(issuer)?,
                    introspector: issuer.introspection.as_ref().map(Introspector::new),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let base = resource.resource.trim_end_matches('/');
        Ok(Validator {
            audiences: vec![resource.resource.clone(), format!("{base}/mcp")],
            issuers,
            verified: TokenCache::new(),
        })
    }

    /// The key cache of `issuer`, if it is configured.
    pub fn keys(&self, issuer: &str) -> Option<&KeyCache> {
        self.issuers
            .iter()
            .find(|trusted| trusted.config.issuer == issuer)
            .map(|trusted| &trusted.keys)
    }

    /// Whether a token that is not a JWT may be an issuer's (some issuer introspects).
    pub fn introspects(&self) -> bool {
        self.issuers
            .iter()
            .any(|trusted| trusted.introspector.is_some())
    }

    /// Verifies a token that is not a JWT through the introspecting issuers, in order: the
    /// first that says it is active decides. A refusal from each is final only when none of
    /// them was unavailable.
    pub async fn verify_opaque(&self, token: &str) -> Result<Verified, Refusal> {
        let mut last = Refusal::Inactive;
        for trusted in &self.issuers {
            let Some(introspector) = &trusted.introspector else {
                continue;
            };
            match introspector
                .introspect(&trusted.config, &trusted.keys, &self.audiences, token)
                .await
            {
                Ok(verified) => return Ok(verified),
                Err(refusal) if refusal.is_temporary() => last = refusal,
                Err(refusal) => {
                    if !last.is_temporary() {
                        last = refusal;
                    }
                }
            }
        }
        Err(last)
    }

    /// Whether `token` has a JWT's shape (three base64url parts), so that a bearer token that
    /// is not one (a cairn token) is never sent through JWT checks.
    pub fn looks_like_jwt(token: &str) -> bool {
        let parts: Vec<&str> = token.split('.').collect();
        parts.len() == 3
            && parts[..2].iter().all(|part| !part.is_empty())
            && parts.iter().all(|part| {
                part.bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
            })
    }

    /// Verifies `token` and maps it to a principal.
    pub async fn verify(&self, token: &str) -> Result<Verified, Refusal> {
        let digest = TokenCache::<Held>::digest(token);
        // A token verified earlier is reused while its key is still published: a key the
        // issuer withdrew (learnt at the next fetch) ends it at once.
        let held = self.verified.get(&digest).filter(|held| {
            self.issuers
                .get(held.index)
                .is_some_and(|trusted| trusted.keys.holds(held.kid.as_deref()))
        });
        let (index, verified) = match held {
            Some(held) => (held.index, held.verified),
            None => {
                let (index, kid, verified) = self.verify_uncached(token).await?;
                let lifetime = until(verified.expires_at, VERIFIED_FOR);
                self.verified.insert(
                    digest,
                    lifetime,
                    Held {
                        index,
                        kid,
                        verified: verified.clone(),
                    },
                );
                (index, verified)
            }
        };
        let Some(trusted) = self.issuers.get(index) else {
            return Err(Refusal::UnknownIssuer("(no longer configured)".to_owned()));
        };
        if let Some(introspector) = trusted
            .introspector
            .as_ref()
            .filter(|introspector| introspector.takes_jwts())
        {
            // The issuer is asked too, so that a revoked token stops working.
            introspector.still_active(&trusted.keys, token).await?;
        }
        Ok(verified)
    }

    /// Verifies a JWT against its issuer's keys: the issuer's index, the key id the token
    /// named, and what it grants.
    async fn verify_uncached(
        &self,
        token: &str,
    ) -> Result<(usize, Option<String>, Verified), Refusal> {
        let parts: Vec<&str> = token.split('.').collect();
        if parts.len() != 3 {
            return Err(Refusal::Malformed("a JWT has three parts".to_owned()));
        }
        let header = segment(parts[0], "header")?;
        let algorithm = header
            .get("alg")
            .and_then(Value::as_str)
            .ok_or_else(|| Refusal::Malformed("the header names no `alg`".to_owned()))?;
        // Read before anything is trusted: which issuer, so which keys and algorithms.
        let unverified = segment(parts[1], "payload")?;
        let issuer_name = unverified
            .get("iss")
            .and_then(Value::as_str)
            .ok_or_else(|| Refusal::Claims("`iss` is missing".to_owned()))?;
        let (index, trusted) = self
            .issuers
            .iter()
            .enumerate()
            .find(|(_, trusted)| trusted.config.issuer == issuer_name)
            .ok_or_else(|| Refusal::UnknownIssuer(shown(issuer_name)))?;
        let verified = self
            .verify_signed(trusted, &header, algorithm, token)
            .await?;
        let kid = header.get("kid").and_then(Value::as_str).map(str::to_owned);
        Ok((index, kid, verified))
    }

    /// Checks a JWT's algorithm, signature and claims against `trusted`'s keys.
    async fn verify_signed(
        &self,
        trusted: &Trusted,
        header: &Value,
        algorithm: &str,
        token: &str,
    ) -> Result<Verified, Refusal> {
        let (issuer, keys) = (&trusted.config, &trusted.keys);
        if !issuer.algorithms.iter().any(|allowed| allowed == algorithm) {
            return Err(Refusal::Algorithm(format!(
                "`{}` is not among {}",
                shown(algorithm),
                issuer.algorithms.join(", ")
            )));
        }
        let parsed: Algorithm = algorithm
            .parse()
            .map_err(|_| Refusal::Algorithm(format!("`{}` is unknown", shown(algorithm))))?;
        let kid = header.get("kid").and_then(Value::as_str);
        let candidates = keys.keys(kid).await?;
        let mut validation = Validation::new(parsed);
        validation.algorithms = vec![parsed];
        validation.set_issuer(&[issuer.issuer.as_str()]);
        validation.set_audience(&self.audiences);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.leeway = issuer.skew.as_secs();
        validation.validate_nbf = true;
        let mut last = Refusal::Signature;
        for key in candidates {
            if key
                .algorithm
                .as_deref()
                .is_some_and(|declared| declared != algorithm)
            {
                continue;
            }
            match jsonwebtoken::decode::<Value>(token, &key.decoding, &validation) {
                Ok(data) => return map(issuer, data.claims),
                Err(error) => {
                    last = refusal(error);
                    if !matches!(last, Refusal::Signature) {
                        return Err(last);
                    }
                }
            }
        }
        Err(last)
    }
}

/// One JWT part as a JSON object.
fn segment(part: &str, what: &str) -> Result<Value, Refusal> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .map_err(|_| Refusal::Malformed(format!("the {what} is not base64url")))?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|_| Refusal::Malformed(format!("the {what} is not JSON")))?;
    if !value.is_object() {
        return Err(Refusal::Malformed(format!(
            "the {what} is not a JSON object"
        )));
    }
    Ok(value)
}

fn refusal(error: jsonwebtoken::errors::Error) -> Refusal {
    use jsonwebtoken::errors::ErrorKind;
    match error.kind() {
        ErrorKind::ExpiredSignature => Refusal::Expired,
        ErrorKind::ImmatureSignature => Refusal::NotYetValid,
        ErrorKind::InvalidAudience => Refusal::Audience("`aud` does not name it".to_owned()),
        ErrorKind::InvalidIssuer => Refusal::UnknownIssuer("(differs after decoding)".to_owned()),
        ErrorKind::InvalidSignature => Refusal::Signature,
        ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
            Refusal::Algorithm("the key does not take this algorithm".to_owned())
        }
        ErrorKind::MissingRequiredClaim(claim) => {
            Refusal::Claims(format!("`{}` is missing", shown(claim)))
        }
        ErrorKind::InvalidKeyFormat | ErrorKind::InvalidEcdsaKey | ErrorKind::InvalidRsaKey(_) => {
            Refusal::Signature
        }
        _ => Refusal::Malformed(error.to_string()),
    }
}

/// Maps verified claims to a principal: scopes through the issuer's table, the principal
/// claim to `user:<value>`, the groups claim to `group:<name>`s, and the datasets.
pub(crate) fn map(issuer: &IssuerConfig, claims: Value) -> Result<Verified, Refusal> {
    let subject = claims
        .get(&issuer.principal_claim)
        .and_then(Value::as_str)
        .filter(|subject| !subject.trim().is_empty())
        .ok_or_else(|| {
            Refusal::Claims(format!(
                "`{}` (the principal) is missing or not a string",
                shown(&issuer.principal_claim)
            ))
        })?
        .to_owned();
    let issuer_scopes = names(claims.get("scope").or_else(|| claims.get("scp")));
    let scopes: BTreeSet<Scope> = issuer_scopes
        .iter()
        .filter_map(|name| issuer.scopes.get(name))
        .flatten()
        .copied()
        .collect();
    let groups: Vec<String> = match &issuer.groups_claim {
        Some(claim) => names(claims.get(claim))
            .iter()
            .map(|group| format!("group:{group}"))
            .collect(),
        None => Vec::new(),
    };
    let identity = Identity::new(&format!("user:{subject}"), &groups)
        .map_err(|error| Refusal::Claims(error.to_string()))?;
    let datasets = match &issuer.datasets_claim {
        Some(claim) => Some(names(claims.get(claim))),
        None => issuer.datasets.clone(),
    };
    let expires_at = claims
        .get("exp")
        .and_then(Value::as_i64)
        .unwrap_or_default();
    let token_id = uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_URL,
        format!("{}#{subject}", issuer.issuer).as_bytes(),
    );
    Ok(Verified {
        issuer: issuer.issuer.clone(),
        subject: subject.clone(),
        issuer_scopes,
        expires_at,
        principal: Principal {
            token_id,
            name: format!("oauth:{subject}"),
            scopes: scopes.into_iter().collect(),
            datasets,
            identity: Some(identity),
        },
    })
}

/// A claim that lists names: a JSON array of strings, or one string of names separated by
/// spaces (as `scope` is) or commas (as some servers join a multi-valued user property, and
/// glewlwyd does). No scope, group or dataset name may hold a comma, so neither split
/// changes a name.
pub(crate) fn names(claim: Option<&Value>) -> Vec<String> {
    match claim {
        Some(Value::String(text)) => text
            .split(|character: char| character.is_whitespace() || character == ',')
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
            .collect(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// Untrusted text as it may appear in a message: at most 80 characters, no control ones.
pub(crate) fn shown(text: &str) -> String {
    text.chars()
        .filter(|character| !character.is_control())
        .take(80)
        .collect()
}
