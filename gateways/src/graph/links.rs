//! What a revision's text refers to, deterministically (no model): links to other sources and
//! external URLs. Behind the small [`GraphExtractor`] trait, so a later entity extractor (a model)
//! can sit beside the link extractor.
//!
//! ## Invariants
//! - Extraction never fails and never panics: text that holds no reference yields none.
//! - Output is deduplicated and sorted, so projecting the same text twice writes the same
//!   edges.
//! - A link is a *candidate*: it names where it points (relative targets resolved against the
//!   source key's folder). Whether it is a source of the same dataset is for the caller to check
//!   against the ledger.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use regex::Regex;

/// The references found in one text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct References {
    /// Links that may name another source of the same dataset: for each link, the candidate
    /// source keys in order of preference.
    pub links: Vec<Vec<String>>,
    /// External `http(s)` URLs.
    pub urls: Vec<String>,
}

/// Finds references in a revision's text.
pub trait GraphExtractor: Send + Sync {
    /// The extractor's name (recorded in receipts).
    fn name(&self) -> &'static str;
    /// The references in `text`, a revision of `source_key` of media type `media_type`.
    fn extract(&self, source_key: &str, media_type: &str, text: &str) -> References;
}

/// Markdown links (`[text](target)`), HTML links (`href="target"`), wiki links
/// (`[[target]]`, `[[target|label]]`) and bare URLs.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkExtractor;

/// Longest link target considered (longer ones are not links people write).
const MAX_TARGET: usize = 1024;
/// Most references kept per text (a pathological page cannot explode the graph).
const MAX_REFERENCES: usize = 1000;

struct Patterns {
    markdown: Regex,
    html: Regex,
    wiki: Regex,
    bare_url: Regex,
}

fn patterns() -> &'static Patterns {
    static PATTERNS: OnceLock<Patterns> = OnceLock::new();
    PATTERNS.get_or_init(|| Patterns {
        markdown: Regex::new(r#"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"\n]*")?\s*\)"#)
            .unwrap_or_else(|_| unreachable!("a fixed pattern")),
        html: Regex::new(r#"(?i)\bhref\s*=\s*(?:"([^"]*)"|'([^']*)')"#)
            .unwrap_or_else(|_| unreachable!("a fixed pattern")),
        wiki: Regex::new(r"\[\[([^\]\|#\n]+)(?:#[^\]\|\n]*)?(?:\|[^\]\n]*)?\]\]")
            .unwrap_or_else(|_| unreachable!("a fixed pattern")),
        bare_url: Regex::new(r#"https?://[^\s<>()\[\]"'`]+"#)
            .unwrap_or_else(|_| unreachable!("a fixed pattern")),
    })
}

fn is_external(target: &str) -> bool {
    let scheme_end = target.find(':');
    match scheme_end {
        Some(end) if end > 0 => {
            let scheme = &target[..end];
            scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.')
                && scheme
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic())
        }
        _ => target.starts_with("//"),
    }
}

fn is_http(target: &str) -> bool {
    let lower = target.get(..8).unwrap_or(target).to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

/// Percent-decoding of a link target (invalid sequences stay as they are).
fn percent_decode(text: &str) -> String {
    fn hex(byte: u8) -> Option<u8> {
        (byte as char)
            .to_digit(16)
            .and_then(|value| u8::try_from(value).ok())
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' && index + 2 < bytes.len() {
            if let (Some(high), Some(low)) = (hex(bytes[index + 1]), hex(bytes[index + 2])) {
                out.push(high * 16 + low);
                index += 3;
                continue;
            }
        }
        out.push(bytes[index]);
        index += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| text.to_owned())
}

/// `folder/../x/./y` -> `x/y`; `None` when it climbs above the root.
fn normalise(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// The source keys a relative link target may name, best first: relative to the linking
/// source's folder, then from the dataset's root.
fn candidates(source_key: &str, target: &str) -> Vec<String> {
    let target = target.split(['#', '?']).next().unwrap_or_default().trim();
    if target.is_empty() || target.len() > MAX_TARGET {
        return Vec::new();
    }
    let target = percent_decode(target);
    let mut keys = Vec::new();
    if let Some(rooted) = target.strip_prefix('/') {
        keys.extend(normalise(rooted));
    } else {
        let folder = source_key.rsplit_once('/').map_or("", |(folder, _)| folder);
        let joined = if folder.is_empty() {
            target.clone()
        } else {
            format!("{folder}/{target}")
        };
        keys.extend(normalise(&joined));
        keys.extend(normalise(&target));
    }
    let mut seen = BTreeSet::new();
    keys.retain(|key| key != source_key && seen.insert(key.clone()));
    keys
}

impl GraphExtractor for LinkExtractor {
    fn name(&self) -> &'static str {
        "links"
    }

    fn extract(&self, source_key: &str, _media_type: &str, text: &str) -> References {
        let patterns = patterns();
        let mut links: BTreeSet<Vec<String>> = BTreeSet::new();
        let mut urls: BTreeSet<String> = BTreeSet::new();
        let mut take = |target: &str| {
            let target = target.trim();
            if target.is_empty() || target.len() > MAX_TARGET {
                return;
            }
            if is_external(target) {
                if is_http(target) {
                    urls.insert(target.to_owned());
                }
            } else {
                let keys = candidates(source_key, target);
                if !keys.is_empty() {
                    links.insert(keys);
                }
            }
        };
        for found in patterns.markdown.captures_iter(text) {
            if let Some(target) = found.get(1) {
                take(target.as_str());
            }
        }
        for found in patterns.html.captures_iter(text) {
            if let Some(target) = found.get(1).or_else(|| found.get(2)) {
                take(target.as_str());
            }
        }
        for found in patterns.wiki.captures_iter(text) {
            if let Some(target) = found.get(1) {
                let target = target.as_str().trim();
                // `[[Page]]` names a page by its key, with or without an extension.
                let mut keys = candidates(source_key, target);
                let with_extension = format!("{target}.md");
                for key in candidates(source_key, &with_extension) {
                    if !keys.contains(&key) {
                        keys.push(key);
                    }
                }
                if !keys.is_empty() {
                    links.insert(keys);
                }
            }
        }
        for found in patterns.bare_url.find_iter(text) {
            let url = found
                .as_str()
                .trim_end_matches(['.', ',', ';', ':', '!', '?']);
            urls.insert(url.to_owned());
        }
        References {
            links: links.into_iter().take(MAX_REFERENCES).collect(),
            urls: urls.into_iter().take(MAX_REFERENCES).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_html_wiki_links_and_urls() {
        let text = "See [the intro](intro.md#top), [up](../guide/setup.md \"Setup\") and \
                    <a href='/faq.html?x=1'>FAQ</a>, [[Glossary|terms]], \
                    [site](https://example.com/a), mail [me](mailto:x@y.z), \
                    and https://docs.rs/regex. Also [empty]() and [self](notes/page.md).";
        let found = LinkExtractor.extract("notes/page.md", "text/markdown", text);
        assert_eq!(
            found.links,
            vec![
                vec!["faq.html".to_owned()],
                vec!["guide/setup.md".to_owned()],
                vec![
                    "notes/Glossary".to_owned(),
                    "Glossary".to_owned(),
                    "notes/Glossary.md".to_owned(),
                    "Glossary.md".to_owned()
                ],
                vec!["notes/intro.md".to_owned(), "intro.md".to_owned()],
                vec!["notes/notes/page.md".to_owned()],
            ]
        );
        assert_eq!(
            found.urls,
            vec![
                "https://docs.rs/regex".to_owned(),
                "https://example.com/a".to_owned()
            ]
        );
    }

    #[test]
    fn nothing_to_find_and_hostile_text_are_fine() {
        assert_eq!(
            LinkExtractor.extract("a", "text/plain", ""),
            References::default()
        );
        let hostile = "[[".repeat(10_000) + &"](".repeat(10_000) + "%zz%4";
        let found = LinkExtractor.extract("a", "text/plain", &hostile);
        assert!(found.links.len() <= MAX_REFERENCES);
        assert_eq!(candidates("a/b", "../../../x"), Vec::<String>::new());
        assert_eq!(percent_decode("a%20b%zz%4"), "a b%zz%4");
        assert_eq!(percent_decode("%é%C3%A9"), "%éé");
    }
}
