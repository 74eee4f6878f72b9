//! Credential detection. Content that carries a private key block, a cloud access key or a
//! common API token format is refused before anything is written. A finding names the kind
//! and byte offset, never the secret itself.

use std::sync::OnceLock;

use regex::bytes::{Regex, RegexSet};

/// A credential found in content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Which kind of credential (stable name, e.g. `aws_access_key_id`).
    pub kind: &'static str,
    /// Byte offset of its first byte in the content.
    pub offset: usize,
}

const PATTERNS: &[(&str, &str)] = &[
    (
        "private_key",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----",
    ),
    (
        "aws_access_key_id",
        r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA)[0-9A-Z]{16}\b",
    ),
    ("github_token", r"\bgh[pousr]_[A-Za-z0-9]{36,255}\b"),
    (
        "github_fine_grained_token",
        r"\bgithub_pat_[A-Za-z0-9_]{22,255}\b",
    ),
    ("gitlab_token", r"\bglpat-[A-Za-z0-9_\-]{20,}"),
    ("slack_token", r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"),
    ("google_api_key", r"\bAIza[0-9A-Za-z_\-]{35}"),
    ("stripe_secret_key", r"\b[rs]k_live_[0-9A-Za-z]{24,}"),
    (
        "anthropic_api_key",
        r"\bsk-ant-[a-z0-9]+-[A-Za-z0-9_\-]{40,}",
    ),
    (
        "openai_api_key",
        r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}T3BlbkFJ[A-Za-z0-9_\-]{20,}",
    ),
    ("openai_project_key", r"\bsk-proj-[A-Za-z0-9_\-]{40,}"),
    ("npm_token", r"\bnpm_[A-Za-z0-9]{36}\b"),
    ("pypi_token", r"\bpypi-AgEIcHlwaS5vcmc[A-Za-z0-9_\-]{50,}"),
    // cairn's own API tokens (`cairn_` and 43 base64url characters).
    (
        "cairn_token",
        r"\bcairn_[A-Za-z0-9_\-]{43}(?:[^A-Za-z0-9_\-]|$)",
    ),
];

/// Each pattern compiled, in the order of [`PATTERNS`] (so indices match the set's).
fn compiled() -> &'static [(&'static str, Option<Regex>)] {
    static COMPILED: OnceLock<Vec<(&'static str, Option<Regex>)>> = OnceLock::new();
    COMPILED.get_or_init(|| {
        PATTERNS
            .iter()
            .map(|(kind, pattern)| match Regex::new(pattern) {
                Ok(regex) => (*kind, Some(regex)),
                Err(error) => {
                    tracing::error!(kind, %error, "secret pattern does not compile");
                    (*kind, None)
                }
            })
            .collect()
    })
}

fn any_pattern() -> Option<&'static RegexSet> {
    static SET: OnceLock<Option<RegexSet>> = OnceLock::new();
    SET.get_or_init(|| RegexSet::new(PATTERNS.iter().map(|(_, pattern)| *pattern)).ok())
        .as_ref()
}

/// The earliest credential in `content`, if any. One pass over the content finds whether any
/// pattern matches; only then are the matching patterns located.
pub fn scan(content: &[u8]) -> Option<Finding> {
    let matched = any_pattern()?.matches(content);
    if !matched.matched_any() {
        return None;
    }
    compiled()
        .iter()
        .enumerate()
        .filter(|(index, _)| matched.matched(*index))
        .filter_map(|(_, (kind, regex))| {
            regex.as_ref()?.find(content).map(|found| Finding {
                kind,
                offset: found.start(),
            })
        })
        .min_by_key(|finding| finding.offset)
}

/// `text` with every credential [`scan`] would find replaced by `[redacted:<kind>]`, and how
/// many were replaced: for text on its way out (to a model's context, a log), where refusing
/// is not an option.
pub fn redact(text: &str) -> (String, usize) {
    let Some(set) = any_pattern() else {
        return (text.to_owned(), 0);
    };
    if !set.is_match(text.as_bytes()) {
        return (text.to_owned(), 0);
    }
    let mut out = text.to_owned();
    let mut replaced = 0;
    for (kind, regex) in compiled() {
        let Some(regex) = regex else { continue };
        let mut next = String::with_capacity(out.len());
        let mut last = 0;
        for found in regex.find_iter(out.as_bytes()) {
            // Matches of these ASCII patterns start and end on character boundaries; a match
            // that does not (it cannot) is left as it is.
            let (Some(before), Some(_)) = (out.get(last..found.start()), out.get(found.range()))
            else {
                continue;
            };
            next.push_str(before);
            next.push_str(&format!("[redacted:{kind}]"));
            last = found.end();
            replaced += 1;
        }
        next.push_str(out.get(last..).unwrap_or_default());
        out = next;
    }
    (out, replaced)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_replaces_every_credential_and_keeps_the_rest() {
        let text = "one AKIAIOSFODNN7EXAMPLE two ghp_abcdefghijklmnopqrstuvwxyz0123456789 três";
        let (out, replaced) = redact(text);
        assert_eq!(replaced, 2);
        assert_eq!(
            out,
            "one [redacted:aws_access_key_id] two [redacted:github_token] três"
        );
        assert_eq!(scan(out.as_bytes()), None);
        assert_eq!(redact("nothing here"), ("nothing here".to_owned(), 0));
    }

    #[test]
    fn every_pattern_compiles() {
        assert!(compiled().iter().all(|(_, regex)| regex.is_some()));
        assert!(any_pattern().is_some());
    }

    #[test]
    fn finds_kinds_and_offsets() {
        let aws = b"config: AKIAIOSFODNN7EXAMPLE rest";
        assert_eq!(
            scan(aws),
            Some(Finding {
                kind: "aws_access_key_id",
                offset: 8
            })
        );
        let key = b"x\n-----BEGIN RSA PRIVATE KEY-----\nMIIE";
        assert_eq!(
            scan(key),
            Some(Finding {
                kind: "private_key",
                offset: 2
            })
        );
        let openssh = b"-----BEGIN OPENSSH PRIVATE KEY-----";
        assert_eq!(scan(openssh).map(|f| f.kind), Some("private_key"));
        let github = format!("token=ghp_{}", "a1B2".repeat(9));
        assert_eq!(
            scan(github.as_bytes()),
            Some(Finding {
                kind: "github_token",
                offset: 6
            })
        );
        let slack = b"xoxb-1234567890-abcdefghij";
        assert_eq!(scan(slack).map(|f| f.kind), Some("slack_token"));
    }

    #[test]
    fn ordinary_text_passes() {
        assert_eq!(
            scan(b"The public key is published; AKIA is a prefix. sk-learn is a library."),
            None
        );
        assert_eq!(
            scan("ünïcödé text with -----BEGIN PUBLIC KEY-----".as_bytes()),
            None
        );
    }
}
