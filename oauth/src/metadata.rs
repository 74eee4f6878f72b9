//! The protected resource metadata (RFC 9728) and the `WWW-Authenticate` challenges (RFC 6750)
//! that lead a client from a refusal to the issuer that can give it a token.

use serde_json::{json, Value};

use crate::config::Resource;

/// Where the metadata of `resource` is served: the well-known name inserted between the
/// origin and the resource's path (RFC 9728, section 3.1), so `https://host/mcp` has its
/// metadata at `https://host/.well-known/oauth-protected-resource/mcp`.
pub fn metadata_url(resource: &str) -> Result<String, String> {
    let parsed = reqwest::Url::parse(resource)
        .map_err(|error| format!("the resource `{resource}`: {error}"))?;
    let origin = parsed.origin().ascii_serialization();
    let path = parsed.path().trim_end_matches('/');
    Ok(format!(
        "{origin}/.well-known/oauth-protected-resource{path}"
    ))
}

/// The metadata document of `resource`, naming the scopes a client may ask its issuers for.
pub fn document(resource: &Resource, scopes_supported: &[String]) -> Value {
    json!({
        "resource": resource.resource,
        "authorization_servers": resource
            .issuers
            .iter()
            .map(|issuer| issuer.issuer.clone())
            .collect::<Vec<_>>(),
        "scopes_supported": scopes_supported,
        "bearer_methods_supported": ["header"],
        "resource_name": "cairn",
    })
}

/// A `WWW-Authenticate: Bearer` challenge: where the metadata is, the scopes the call needs
/// (every one, in one challenge) and, when a token was refused, the RFC 6750 error
/// (`invalid_token`, `insufficient_scope`) with a description.
pub fn challenge(metadata_url: &str, scopes: &[String], error: Option<(&str, &str)>) -> String {
    let mut parts = vec![format!("resource_metadata={}", quoted(metadata_url))];
    if !scopes.is_empty() {
        parts.push(format!("scope={}", quoted(&scopes.join(" "))));
    }
    if let Some((code, description)) = error {
        parts.push(format!("error={}", quoted(code)));
        parts.push(format!("error_description={}", quoted(description)));
    }
    format!("Bearer {}", parts.join(", "))
}

/// A quoted-string (RFC 9110): quotes and backslashes escaped; characters a header cannot
/// carry (controls, non-ASCII) replaced.
fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for character in text.chars() {
        match character {
            '"' | '\\' => {
                out.push('\\');
                out.push(character);
            }
            ' '..='~' => out.push(character),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::IssuerConfig;

    #[test]
    fn the_metadata_url_inserts_the_well_known_name() {
        assert_eq!(
            metadata_url("https://cairn.example.com/mcp").expect("url"),
            "https://cairn.example.com/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            metadata_url("https://cairn.example.com/").expect("url"),
            "https://cairn.example.com/.well-known/oauth-protected-resource"
        );
    }

    #[test]
    fn the_document_names_the_issuers_and_scopes() {
        let resource = Resource {
            resource: "https://cairn.example.com".to_owned(),
            issuers: vec![IssuerConfig::new("https://id.example.com")],
        };
        let document = document(&resource, &["cairn.search".to_owned()]);
        assert_eq!(document["resource"], "https://cairn.example.com");
        assert_eq!(
            document["authorization_servers"][0],
            "https://id.example.com"
        );
        assert_eq!(document["scopes_supported"][0], "cairn.search");
    }

    #[test]
    fn challenges_quote_what_they_carry() {
        let header = challenge(
            "https://cairn.example.com/.well-known/oauth-protected-resource",
            &["search".to_owned(), "ops:read".to_owned()],
            Some(("insufficient_scope", "needs \"search\"\nand more")),
        );
        assert_eq!(
            header,
            "Bearer resource_metadata=\"https://cairn.example.com/.well-known/oauth-protected-resource\", \
             scope=\"search ops:read\", error=\"insufficient_scope\", \
             error_description=\"needs \\\"search\\\"?and more\""
        );
    }
}
