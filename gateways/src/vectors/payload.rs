//! What a filter can test of a point, kept as its payload, and a search filter pushed down to
//! the store over it.
//!
//! ## Model
//! A projection writes, with each point, the facts of its revision that a search filter tests
//! ([`PointFacts`]): `tags`, `media_type`, `metadata`, `accepted_at`, and the key's folder
//! prefixes (`key_prefixes`: `a/` and `a/b/` for `a/b/c.md`), marked by `facts` (the payload's
//! version), and its source's `readers`. Text facts (tags, the media type, metadata strings,
//! readers) are kept as digests ([`digest`]), never as text: an erased document leaves no
//! text in the store's files. [`pushdown`] turns a search filter ([`receipts::filter::Filter`]) into a
//! [`PayloadFilter`] that each store translates into its own filter, so the store's payload
//! indexes select the matching points and its planner searches a small selection exactly.
//!
//! ## Invariants
//! - **A prefilter never loses a match.** The pushed filter selects a superset of the points
//!   whose revision matches: a condition the payload cannot decide exactly (a key prefix that
//!   ends inside a folder name, a glob, `exists`) is widened where it must hold and dropped
//!   where it must not. The readers (`readers`, the source's own list, rewritten by an access
//!   job after each change) pass a caller named there or a source that names none; a reader
//!   granted a moment ago may miss the prefilter until its access job ran, never a revoked one
//!   slip past binding. Binding then checks every hit against the
//!   ledger's current revision, which is the last word.
//! - **Points without facts** (written before payloads carried them, by a writer that has
//!   none, or of a revision whose metadata exceeds [`MAX_PAYLOAD_METADATA_BYTES`]) always pass
//!   the prefilter: their revision is judged at binding only.

use receipts::filter::{Condition, Filter, KeyTest, Range, Scalar, TagTest, ValueTest};

/// The payload version that marks a point written with its revision's facts.
pub const FACTS_VERSION: i64 = 1;

/// Most folder prefixes kept for one key (deeper folders are matched at binding).
const MAX_PREFIXES: usize = 16;

/// The facts of a point's revision that a search filter tests, written as its payload.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PointFacts {
    /// The revision's tags.
    pub tags: Vec<String>,
    /// Its media type.
    pub media_type: String,
    /// Its metadata (an object; anything else is written as an empty object).
    pub metadata: serde_json::Value,
    /// Its acceptance time, epoch microseconds.
    pub accepted_at: i64,
    /// The readers its source names (empty: none, so the dataset's default applies), as the
    /// ledger held them when the points were written; an access job keeps them current.
    pub readers: Vec<String>,
}

/// The payload fields that carry a source's readers: the list (`readers`, empty when the
/// source names none) and its digest (`readers_digest`, what a read-back compares).
pub fn readers_payload(readers: &[String]) -> serde_json::Map<String, serde_json::Value> {
    let mut fields = serde_json::Map::new();
    fields.insert("readers".to_owned(), digests(readers).into());
    fields.insert("readers_digest".to_owned(), readers_digest(readers).into());
    fields
}

/// A short digest of a readers list (order as given: the ledger keeps them sorted).
pub fn readers_digest(readers: &[String]) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    for reader in readers {
        hasher.update(reader.as_bytes());
        hasher.update(b"\n");
    }
    hex::encode(&hasher.finalize()[..8])
}

/// Largest metadata payload (digests, numbers, booleans) copied onto every point of a
/// revision, serialised. A revision with more is written without the `facts` marker, so its
/// points pass every prefilter and binding alone judges them: the payload of a many-chunk
/// document stays small.
pub const MAX_PAYLOAD_METADATA_BYTES: usize = 8 * 1024;

/// The digest a text fact is kept as in the payload (the first 8 bytes of its SHA-256, hex):
/// the store can match it, and no text of a document (a tag, a metadata value, a reader)
/// lingers in the store's files once an erasure deleted its points. Two texts that share a
/// digest pass the prefilter together; binding tells them apart.
pub fn digest(text: &str) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(text.as_bytes())[..8])
}

fn digests(texts: &[String]) -> Vec<String> {
    texts.iter().map(|text| digest(text)).collect()
}

/// A metadata value as payload: strings as digests, numbers and booleans as they are, a
/// list's elements alike; objects and `null` (which no filter matches) left out.
fn metadata_value(value: &serde_json::Value) -> Option<serde_json::Value> {
    use serde_json::Value;
    match value {
        Value::String(text) => Some(Value::String(digest(text))),
        Value::Number(_) | Value::Bool(_) => Some(value.clone()),
        Value::Array(items) => Some(Value::Array(
            items
                .iter()
                .filter(|item| !item.is_array())
                .filter_map(metadata_value)
                .collect(),
        )),
        Value::Object(_) | Value::Null => None,
    }
}

impl PointFacts {
    /// The payload fields these facts add to a point of the source `source_key`.
    pub fn payload(&self, source_key: &str) -> serde_json::Map<String, serde_json::Value> {
        let mut fields = serde_json::Map::new();
        let metadata: serde_json::Map<String, serde_json::Value> = match &self.metadata {
            serde_json::Value::Object(object) => object
                .iter()
                .filter_map(|(name, value)| Some((name.clone(), metadata_value(value)?)))
                .collect(),
            _ => serde_json::Map::new(),
        };
        let metadata = serde_json::Value::Object(metadata);
        let metadata_bytes = serde_json::to_vec(&metadata).map_or(usize::MAX, |b| b.len());
        if metadata_bytes > MAX_PAYLOAD_METADATA_BYTES {
            return fields;
        }
        fields.insert("facts".to_owned(), FACTS_VERSION.into());
        fields.insert("tags".to_owned(), digests(&self.tags).into());
        fields.insert("media_type".to_owned(), digest(&self.media_type).into());
        fields.insert("metadata".to_owned(), metadata);
        fields.insert("accepted_at".to_owned(), self.accepted_at.into());
        fields.insert("key_prefixes".to_owned(), key_prefixes(source_key).into());
        fields.extend(readers_payload(&self.readers));
        fields
    }
}

/// The folder prefixes of a key, each ending in `/`: `a/`, `a/b/` for `a/b/c.md`.
pub fn key_prefixes(source_key: &str) -> Vec<String> {
    source_key
        .match_indices('/')
        .take(MAX_PREFIXES)
        .map(|(at, _)| source_key[..=at].to_owned())
        .collect()
}

/// A filter over point payloads, free of vendor types: each store translates it.
#[derive(Debug, Clone, PartialEq)]
pub enum PayloadFilter {
    /// Every one holds.
    All(Vec<PayloadFilter>),
    /// At least one holds.
    Any(Vec<PayloadFilter>),
    /// It does not hold.
    Not(Box<PayloadFilter>),
    /// The field's value (or one element of a list) equals one of these strings.
    Keywords(String, Vec<String>),
    /// The field's value (or one element of a list) is a number in the range.
    Numbers(String, Range<f64>),
    /// The field's value (or one element of a list) is this boolean.
    Flag(String, bool),
    /// The field is absent, null or an empty list.
    Missing(String),
}

impl PayloadFilter {
    /// The filter in Qdrant's JSON form (a condition, or a nested filter).
    pub fn to_qdrant_json(&self) -> serde_json::Value {
        use serde_json::json;
        let list = |nodes: &[PayloadFilter]| -> Vec<serde_json::Value> {
            nodes.iter().map(PayloadFilter::to_qdrant_json).collect()
        };
        match self {
            PayloadFilter::All(nodes) => json!({ "must": list(nodes) }),
            PayloadFilter::Any(nodes) => json!({ "should": list(nodes) }),
            PayloadFilter::Not(node) => json!({ "must_not": [node.to_qdrant_json()] }),
            PayloadFilter::Keywords(key, values) => {
                json!({ "key": key, "match": { "any": values } })
            }
            PayloadFilter::Numbers(key, range) => {
                let mut bounds = serde_json::Map::new();
                if let Some((lower, closed)) = range.lower {
                    bounds.insert(if closed { "gte" } else { "gt" }.to_owned(), lower.into());
                }
                if let Some((upper, closed)) = range.upper {
                    bounds.insert(if closed { "lte" } else { "lt" }.to_owned(), upper.into());
                }
                json!({ "key": key, "range": bounds })
            }
            PayloadFilter::Flag(key, value) => json!({ "key": key, "match": { "value": value } }),
            PayloadFilter::Missing(key) => json!({ "is_empty": { "key": key } }),
        }
    }
}

/// A search filter as the store can apply it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pushed {
    /// The prefilter (`None`: every point passes).
    pub filter: Option<PayloadFilter>,
    /// Whether the prefilter decides every condition exactly for points with facts (then
    /// binding drops only revisions that changed since their points were written).
    pub exact: bool,
}

/// What a part of the filter became: always true, never true, or a payload filter.
enum Part {
    True,
    False,
    Node(PayloadFilter),
}

/// Pushes `filter` down to the point payload of a search of the current points (`current`)
/// or of every revision's (a search at a past time). Points without facts always pass.
pub fn pushdown(filter: &Filter, current: bool) -> Pushed {
    let mut exact = true;
    let part = translate(filter, true, current, &mut exact);
    let without_facts = PayloadFilter::Missing("facts".to_owned());
    let filter = match part {
        Part::True => None,
        Part::False => Some(without_facts),
        Part::Node(node) => Some(PayloadFilter::Any(vec![node, without_facts])),
    };
    Pushed { filter, exact }
}

/// `positive`: the part must select a superset of what matches (it holds as written);
/// otherwise a subset (it sits under an odd number of `must_not`).
fn translate(filter: &Filter, positive: bool, current: bool, exact: &mut bool) -> Part {
    match filter {
        Filter::Condition(condition) => match condition_of(condition, current) {
            Decided::Exact(node) => Part::Node(node),
            Decided::Wider(widened) => {
                *exact = false;
                match (positive, widened) {
                    (true, Some(node)) => Part::Node(node),
                    (true, None) => Part::True,
                    (false, _) => Part::False,
                }
            }
        },
        Filter::Group {
            must,
            should,
            must_not,
        } => {
            let mut all: Vec<Part> = must
                .iter()
                .map(|child| translate(child, positive, current, exact))
                .collect();
            if !should.is_empty() {
                all.push(any(should
                    .iter()
                    .map(|child| translate(child, positive, current, exact))
                    .collect()));
            }
            all.extend(
                must_not
                    .iter()
                    .map(|child| not(translate(child, !positive, current, exact))),
            );
            every(all)
        }
    }
}

fn every(parts: Vec<Part>) -> Part {
    let mut nodes = Vec::new();
    for part in parts {
        match part {
            Part::False => return Part::False,
            Part::True => {}
            Part::Node(node) => nodes.push(node),
        }
    }
    match nodes.len() {
        0 => Part::True,
        1 => Part::Node(nodes.remove(0)),
        _ => Part::Node(PayloadFilter::All(nodes)),
    }
}

fn any(parts: Vec<Part>) -> Part {
    let mut nodes = Vec::new();
    for part in parts {
        match part {
            Part::True => return Part::True,
            Part::False => {}
            Part::Node(node) => nodes.push(node),
        }
    }
    match nodes.len() {
        0 => Part::False,
        1 => Part::Node(nodes.remove(0)),
        _ => Part::Node(PayloadFilter::Any(nodes)),
    }
}

fn not(part: Part) -> Part {
    match part {
        Part::True => Part::False,
        Part::False => Part::True,
        Part::Node(node) => Part::Node(PayloadFilter::Not(Box::new(node))),
    }
}

/// A condition decided by the payload exactly, or only widened (`None`: not at all).
enum Decided {
    Exact(PayloadFilter),
    Wider(Option<PayloadFilter>),
}

fn condition_of(condition: &Condition, current: bool) -> Decided {
    // Text facts are kept as digests: the values looked for are digested alike.
    let keywords =
        |field: &str, values: &[String]| PayloadFilter::Keywords(field.to_owned(), digests(values));
    let plain =
        |field: &str, values: &[String]| PayloadFilter::Keywords(field.to_owned(), values.to_vec());
    match condition {
        Condition::Tags(TagTest::Any, tags) => Decided::Exact(keywords("tags", tags)),
        Condition::Tags(TagTest::All, tags) => Decided::Exact(PayloadFilter::All(
            tags.iter()
                .map(|tag| keywords("tags", std::slice::from_ref(tag)))
                .collect(),
        )),
        Condition::Tags(TagTest::None, tags) => {
            Decided::Exact(PayloadFilter::Not(Box::new(keywords("tags", tags))))
        }
        Condition::MediaType(types) => Decided::Exact(keywords("media_type", types)),
        Condition::SourceKey(KeyTest::In(keys)) => Decided::Exact(plain("source_key", keys)),
        Condition::SourceKey(KeyTest::Prefix(prefix)) => folder_of(prefix, prefix.ends_with('/')),
        Condition::SourceKey(KeyTest::Glob(pattern)) => {
            let literal = pattern
                .find(['*', '?'])
                .map_or(pattern.as_str(), |at| &pattern[..at]);
            folder_of(literal, false)
        }
        Condition::AcceptedAt(range) => Decided::Exact(PayloadFilter::Numbers(
            "accepted_at".to_owned(),
            Range {
                lower: range.lower.map(|(at, closed)| (at as f64, closed)),
                upper: range.upper.map(|(at, closed)| (at as f64, closed)),
            },
        )),
        Condition::Metadata(name, test) => {
            let field = format!("metadata.{name}");
            match test {
                ValueTest::In(scalars) => {
                    let texts: Vec<String> = scalars
                        .iter()
                        .filter_map(|scalar| match scalar {
                            Scalar::Text(text) => Some(text.clone()),
                            _ => None,
                        })
                        .collect();
                    let mut any = Vec::new();
                    if !texts.is_empty() {
                        any.push(PayloadFilter::Keywords(field.clone(), digests(&texts)));
                    }
                    for scalar in scalars {
                        match scalar {
                            Scalar::Number(number) => any.push(PayloadFilter::Numbers(
                                field.clone(),
                                Range {
                                    lower: Some((*number, true)),
                                    upper: Some((*number, true)),
                                },
                            )),
                            Scalar::Bool(flag) => {
                                any.push(PayloadFilter::Flag(field.clone(), *flag))
                            }
                            Scalar::Text(_) => {}
                        }
                    }
                    Decided::Exact(if any.len() == 1 {
                        any.remove(0)
                    } else {
                        PayloadFilter::Any(any)
                    })
                }
                ValueTest::Range(range) => Decided::Exact(PayloadFilter::Numbers(field, *range)),
                // Absent, null and an empty list differ in the ledger, not in every store's
                // emptiness test: decided at binding.
                ValueTest::Exists(_) => Decided::Wider(None),
            }
        }
        // The readers change without a new revision, so the payload may lag a change: a
        // current point passes when its source names one of the caller's names or names no
        // readers (the dataset's default, decided at binding); binding decides the rest. An
        // access job rewrites a source's readers after each change, on its current points
        // above all; a search at a past time leaves them to binding.
        Condition::Readable(names) if current => Decided::Wider(Some(PayloadFilter::Any(vec![
            PayloadFilter::Keywords("readers".to_owned(), digests(names)),
            PayloadFilter::Missing("readers".to_owned()),
        ]))),
        Condition::Readable(_) => Decided::Wider(None),
    }
}

/// A key prefix as a folder condition: exact when it ends at a folder boundary, else widened
/// to the folder it lies in (none: the key's first segment, which every key passes).
fn folder_of(prefix: &str, at_boundary: bool) -> Decided {
    let folder = match prefix.rfind('/') {
        Some(at) => &prefix[..=at],
        None => return Decided::Wider(None),
    };
    let node = PayloadFilter::Keywords("key_prefixes".to_owned(), vec![folder.to_owned()]);
    if at_boundary && folder.len() == prefix.len() && folder.matches('/').count() <= MAX_PREFIXES {
        Decided::Exact(node)
    } else if folder.matches('/').count() <= MAX_PREFIXES {
        Decided::Wider(Some(node))
    } else {
        Decided::Wider(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: serde_json::Value) -> Filter {
        Filter::parse(&value, receipts::filter::FilterLimits::default()).expect("a valid filter")
    }

    #[test]
    fn large_metadata_leaves_a_point_without_facts() {
        let small = PointFacts {
            metadata: serde_json::json!({"author": "ann"}),
            ..PointFacts::default()
        };
        assert!(small.payload("a/b.md").contains_key("facts"));
        let many: serde_json::Map<String, serde_json::Value> = (0..MAX_PAYLOAD_METADATA_BYTES / 8)
            .map(|n| (format!("field{n}"), serde_json::json!(n)))
            .collect();
        let large = PointFacts {
            metadata: serde_json::Value::Object(many),
            ..PointFacts::default()
        };
        assert!(large.payload("a/b.md").is_empty());
    }

    #[test]
    fn no_text_of_a_document_is_kept_in_the_payload() {
        let facts = PointFacts {
            tags: vec!["secret-tag".to_owned()],
            media_type: "text/markdown".to_owned(),
            metadata: serde_json::json!({"note": "secret-note", "list": ["secret-item", 3],
                                         "nested": {"deep": "secret-deep"}, "n": 7}),
            accepted_at: 1,
            readers: vec!["user:secret-reader".to_owned()],
        };
        let payload = serde_json::Value::Object(facts.payload("a/b.md")).to_string();
        assert!(!payload.contains("secret"), "{payload}");
        assert!(payload.contains(&digest("secret-note")), "{payload}");
        assert!(payload.contains("\"n\":7"), "{payload}");
    }

    #[test]
    fn prefixes_are_the_folders_of_a_key() {
        assert_eq!(key_prefixes("a/b/c.md"), vec!["a/", "a/b/"]);
        assert!(key_prefixes("top.md").is_empty());
    }

    #[test]
    fn undecidable_conditions_widen_where_they_hold_and_vanish_where_they_must_not() {
        let exists = parse(serde_json::json!({"field": "metadata.x", "exists": true}));
        assert_eq!(pushdown(&exists, true).filter, None);
        assert!(!pushdown(&exists, true).exact);
        // must_not [exists]: the payload cannot tell which points have the field, so the
        // negation passes every point (dropping the subset it could not decide), never none.
        let negated = parse(serde_json::json!({"must_not": [
            {"field": "metadata.x", "exists": true}
        ]}));
        assert_eq!(pushdown(&negated, true).filter, None);
        // A prefix inside a folder name widens to the folder.
        let prefix = parse(serde_json::json!({"field": "source_key", "prefix": "docs/ap"}));
        let pushed = pushdown(&prefix, true);
        assert!(!pushed.exact);
        assert_eq!(
            pushed.filter,
            Some(PayloadFilter::Any(vec![
                PayloadFilter::Keywords("key_prefixes".to_owned(), vec!["docs/".to_owned()]),
                PayloadFilter::Missing("facts".to_owned()),
            ]))
        );
        // A `should` with one undecidable branch decides nothing.
        let either = parse(serde_json::json!({"should": [
            {"field": "tags", "any": ["a"]},
            {"field": "metadata.x", "exists": false}
        ]}));
        assert_eq!(pushdown(&either, true).filter, None);
    }

    #[test]
    fn decidable_conditions_are_exact() {
        let filter = parse(serde_json::json!({"must": [
            {"field": "tags", "all": ["a", "b"]},
            {"field": "source_key", "prefix": "docs/"},
            {"field": "metadata.year", "gte": 2020},
            {"field": "metadata.kind", "in": ["x", 3, true]}
        ], "must_not": [{"field": "media_type", "eq": "text/html"}]}));
        let pushed = pushdown(&filter, true);
        assert!(pushed.exact);
        let Some(PayloadFilter::Any(parts)) = pushed.filter else {
            panic!("a filter with a pass for points without facts");
        };
        let PayloadFilter::All(conditions) = &parts[0] else {
            panic!("every condition");
        };
        assert_eq!(conditions.len(), 5);
    }
}
