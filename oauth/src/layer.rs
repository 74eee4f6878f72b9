//! The HTTP side: a middleware that verifies JWT bearer tokens before any route sees the
//! request, and the well-known routes of the protected resource metadata.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{HeaderValue, AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use receipts::http::{ApiError, Authenticated, MissingScope};
use receipts::Scope;

use crate::config::Resource;
use crate::metadata;
use crate::validate::Validator;

/// What the middleware needs: the validator, where the metadata is, and whether cairn's own
/// tokens are still accepted beside the issuers'.
#[derive(Clone)]
pub struct Guard {
    validator: Arc<Validator>,
    resource: Resource,
    metadata_url: String,
    mcp_metadata_url: String,
    cairn_tokens: bool,
}

impl Guard {
    /// A guard for `resource`; `cairn_tokens`: whether a bearer token that is not a JWT is
    /// still looked up among cairn's own tokens.
    pub fn new(resource: &Resource, cairn_tokens: bool) -> Result<Guard, String> {
        Ok(Guard {
            validator: Arc::new(Validator::new(resource)?),
            resource: resource.clone(),
            metadata_url: metadata::metadata_url(&resource.resource)?,
            mcp_metadata_url: metadata::metadata_url(&format!(
                "{}/mcp",
                resource.resource.trim_end_matches('/')
            ))?,
            cairn_tokens,
        })
    }

    /// The issuers' scope names that grant `scope` (admin grants every scope).
    fn scope_names(&self, scope: Option<Scope>) -> Vec<String> {
        let names: BTreeSet<String> = self
            .resource
            .issuers
            .iter()
            .flat_map(|issuer| issuer.scopes.iter())
            .filter(|(_, granted)| {
                scope
                    .is_none_or(|scope| granted.contains(&scope) || granted.contains(&Scope::Admin))
            })
            .map(|(name, _)| name.clone())
            .collect();
        names.into_iter().collect()
    }

    /// The challenge for a request to `path`: `/mcp` has its own metadata.
    fn challenge(
        &self,
        path: &str,
        scope: Option<Scope>,
        error: Option<(&str, &str)>,
    ) -> Option<HeaderValue> {
        let names = match scope {
            Some(_) => self.scope_names(scope),
            None => Vec::new(),
        };
        let url = if path == "/mcp" || path.starts_with("/mcp/") {
            &self.mcp_metadata_url
        } else {
            &self.metadata_url
        };
        HeaderValue::from_str(&metadata::challenge(url, &names, error)).ok()
    }

    /// The routes of the protected resource metadata: for the API at the resource's own
    /// well-known URL, and for `/mcp` at its path-suffixed one (RFC 9728).
    pub fn routes(&self) -> Router {
        let scopes = self.scope_names(None);
        let api = metadata::document(&self.resource, &scopes);
        let mut mcp_resource = self.resource.clone();
        mcp_resource.resource = format!("{}/mcp", self.resource.resource.trim_end_matches('/'));
        let mcp = metadata::document(&mcp_resource, &scopes);
        let path = |resource: &str| {
            metadata::metadata_url(resource).ok().and_then(|url| {
                reqwest::Url::parse(&url)
                    .ok()
                    .map(|parsed| parsed.path().to_owned())
            })
        };
        let mut router = Router::new();
        if let Some(path) = path(&self.resource.resource) {
            router = router.route(&path, get(move || async move { Json(api) }));
        }
        if let Some(path) = path(&mcp_resource.resource) {
            router = router.route(&path, get(move || async move { Json(mcp) }));
        }
        router
    }
}

/// How cairn's own token secrets begin (`receipts::auth::generate_secret`).
const OWN_TOKEN_PREFIX: &str = "cairn_";

/// Verifies a JWT bearer token (or introspects an opaque one), hands its principal to the routes ([`Authenticated`]), and
/// adds the challenges to refusals: a 401 names the metadata (and why the token was refused),
/// a 403 for a missing scope names the issuer's scopes that grant it. A token that cannot be
/// checked now (its issuer's keys cannot be fetched) is a 503, never a 401.
pub async fn guard(State(guard): State<Guard>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    let bearer = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(|token| token.trim().to_owned());
    if let Some(token) = bearer {
        // A JWT is checked against its issuer; a token of cairn's own shape goes to cairn's
        // tokens (when they are on); any other token is introspected when an issuer does so.
        let own = token.starts_with(OWN_TOKEN_PREFIX);
        let verified = if Validator::looks_like_jwt(&token) {
            Some(guard.validator.verify(&token).await)
        } else if !own && guard.validator.introspects() {
            Some(guard.validator.verify_opaque(&token).await)
        } else {
            None
        };
        if let Some(verified) = verified {
            let outcome = match &verified {
                Ok(_) => "accepted",
                Err(refusal) => refusal.reason(),
            };
            metrics::counter!("cairn_oauth_tokens_total", "outcome" => outcome).increment(1);
            match verified {
                Ok(verified) => {
                    tracing::debug!(issuer = %verified.issuer, subject = %verified.subject, "oauth token verified");
                    request
                        .extensions_mut()
                        .insert(Authenticated(verified.principal));
                }
                Err(refusal) if refusal.is_temporary() => {
                    tracing::warn!(reason = refusal.reason(), %refusal, "oauth token cannot be checked now");
                    let mut error = ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "auth_unavailable",
                        "the token's issuer cannot be reached to check it; retry shortly",
                    );
                    error.retry_after = Some(5);
                    return error.into_response();
                }
                Err(refusal) => {
                    tracing::info!(reason = refusal.reason(), %refusal, "oauth token refused");
                    let message = refusal.to_string();
                    let mut response =
                        ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", message.clone())
                            .with_details(serde_json::json!({ "reason": refusal.reason() }))
                            .into_response();
                    if let Some(value) =
                        guard.challenge(&path, None, Some(("invalid_token", &message)))
                    {
                        response.headers_mut().insert(WWW_AUTHENTICATE, value);
                    }
                    return response;
                }
            }
        } else if !guard.cairn_tokens {
            let mut response = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "cairn's own tokens are switched off here: sign in through an issuer",
            )
            .into_response();
            if let Some(value) = guard.challenge(&path, None, None) {
                response.headers_mut().insert(WWW_AUTHENTICATE, value);
            }
            return response;
        }
    }
    let mut response = next.run(request).await;
    if response.status() == StatusCode::UNAUTHORIZED {
        if let Some(value) = guard.challenge(&path, None, None) {
            response.headers_mut().insert(WWW_AUTHENTICATE, value);
        }
    } else if response.status() == StatusCode::FORBIDDEN {
        if let Some(MissingScope(scope)) = response.extensions().get::<MissingScope>().copied() {
            let description = format!("this call needs the `{}` scope", scope.as_str());
            if let Some(value) = guard.challenge(
                &path,
                Some(scope),
                Some(("insufficient_scope", &description)),
            ) {
                response.headers_mut().insert(WWW_AUTHENTICATE, value);
            }
        }
    }
    response
}
