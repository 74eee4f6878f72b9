//! # oauth: cairn as an OAuth 2.1 resource server
//!
//! ## Model
//! - cairn is a **resource**, named by its public URL ([`Resource::resource`]). Clients present
//!   access tokens minted for it by one of the configured **issuers** ([`IssuerConfig`]).
//! - An access token is a JWT (RFC 9068 profile). It is **verified** ([`Validator::verify`])
//!   against its issuer's signing keys, found through the issuer's metadata (RFC 8414, or OIDC
//!   discovery) and kept in a [`KeyCache`], and then **mapped** to cairn's model: the issuer's
//!   scope names to cairn's [`receipts::Scope`]s through a configured table, `sub` to the
//!   principal (`user:<sub>`), a configured claim to groups, and a claim or a fixed list to the
//!   dataset allowlist. The result is a [`receipts::Principal`], the same value a cairn token
//!   grants, so every check downstream (scopes, datasets, who may read which document) is one.
//! - A token that fails is **refused** with a [`Refusal`] that says why; refusals are 401
//!   (the token will never work: the client must get another), except [`Refusal::Unavailable`],
//!   a 503 (cairn cannot check the token now: a client must keep it and retry).
//! - [`metadata`] builds the protected resource metadata (RFC 9728) and the `WWW-Authenticate`
//!   challenges that lead a client from a 401 to the issuer. [`guard`] is the middleware that
//!   verifies a JWT bearer token before any route sees the request and hands its principal to
//!   the API's extractor ([`receipts::http::Authenticated`]); [`Guard::routes`] serves the
//!   metadata.
//!
//! ## Invariants
//! - No token is accepted without a signature verified by a key its issuer publishes, with an
//!   algorithm the issuer's configuration allows. `none` and every HMAC algorithm are refused
//!   whatever is configured: a public key must never verify an HMAC.
//! - `iss` is compared exactly (no trailing-slash leniency); `aud` must name the resource or
//!   its `/mcp` endpoint (RFC 8707), so a token minted for another service is refused; `exp`
//!   is required, and `exp` and `nbf` are checked with the configured skew.
//! - Keys are cached. A token naming a key the cache lacks refetches the key set at most once
//!   per [`IssuerConfig::refetch_interval`], whatever the number of concurrent requests. While
//!   the issuer cannot be reached, cached keys keep working; a key that only a fetch could find
//!   is then [`Refusal::Unavailable`], never a 401 that would make a client drop its token.
//! - Every fetch is bounded in time and size. A client's token is never sent anywhere.

mod cache;
mod config;
mod introspect;
mod keys;
mod layer;
pub mod metadata;
mod validate;

pub use config::{Introspection, IssuerConfig, Resource, Secret, ALGORITHMS};
pub use keys::{KeyCache, KeyStats};
pub use layer::{guard, Guard};
pub use validate::{Refusal, Validator, Verified};
