//! The exact evaluation of a [`Filter`] against one revision's facts: what every pushed-down
//! form must agree with.

use serde_json::Value;

use super::{Condition, Filter, KeyTest, Scalar, TagTest, ValueTest};

/// What a filter can see of one revision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Facts<'a> {
    /// Source key.
    pub source_key: &'a str,
    /// Media type.
    pub media_type: &'a str,
    /// Tags.
    pub tags: &'a [String],
    /// Metadata (a JSON object; anything else has no fields).
    pub metadata: &'a Value,
    /// Acceptance time, epoch microseconds.
    pub accepted_at: crate::Micros,
    /// The source's readers in force now (`None`: everyone who may read the dataset).
    pub readers: Option<&'a [String]>,
}

pub(super) fn matches(filter: &Filter, facts: &Facts<'_>) -> bool {
    match filter {
        Filter::Condition(condition) => holds(condition, facts),
        Filter::Group {
            must,
            should,
            must_not,
        } => {
            must.iter().all(|child| matches(child, facts))
                && (should.is_empty() || should.iter().any(|child| matches(child, facts)))
                && !must_not.iter().any(|child| matches(child, facts))
        }
    }
}

fn holds(condition: &Condition, facts: &Facts<'_>) -> bool {
    match condition {
        Condition::Tags(test, listed) => {
            let has = |tag: &String| facts.tags.contains(tag);
            match test {
                TagTest::Any => listed.iter().any(has),
                TagTest::All => listed.iter().all(has),
                TagTest::None => !listed.iter().any(has),
            }
        }
        Condition::MediaType(listed) => listed.iter().any(|media| media == facts.media_type),
        Condition::SourceKey(KeyTest::In(keys)) => keys.iter().any(|key| key == facts.source_key),
        Condition::SourceKey(KeyTest::Prefix(prefix)) => facts.source_key.starts_with(prefix),
        Condition::SourceKey(KeyTest::Glob(pattern)) => glob(pattern, facts.source_key),
        Condition::AcceptedAt(range) => range.contains(facts.accepted_at),
        Condition::Readable(names) => crate::access::admits(facts.readers, names),
        Condition::Metadata(name, test) => {
            let value = facts.metadata.get(name).filter(|value| !value.is_null());
            match test {
                ValueTest::Exists(exists) => value.is_some() == *exists,
                ValueTest::In(listed) => candidates(value)
                    .any(|candidate| listed.iter().any(|scalar| equal(candidate, scalar))),
                ValueTest::Range(range) => candidates(value).any(|candidate| {
                    candidate
                        .as_f64()
                        .is_some_and(|number| range.contains(number))
                }),
            }
        }
    }
}

/// The values a metadata field offers: a list's elements, or the value itself.
fn candidates(value: Option<&Value>) -> impl Iterator<Item = &Value> {
    let values: &[Value] = match value {
        Some(Value::Array(items)) => items,
        Some(value) => std::slice::from_ref(value),
        None => &[],
    };
    values.iter()
}

fn equal(value: &Value, scalar: &Scalar) -> bool {
    match (value, scalar) {
        (Value::String(text), Scalar::Text(wanted)) => text == wanted,
        (Value::Number(number), Scalar::Number(wanted)) => number.as_f64() == Some(*wanted),
        (Value::Bool(flag), Scalar::Bool(wanted)) => flag == wanted,
        _ => false,
    }
}

/// Whether `text` matches `pattern`: `*` any run of characters (`/` included), `?` one
/// character, everything else itself.
pub(crate) fn glob(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    // The classic two-pointer walk with one backtrack point: linear in practice, never
    // exponential.
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, t));
                p += 1;
            }
            Some('?') => {
                p += 1;
                t += 1;
            }
            Some(character) if *character == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((star_p, star_t)) => {
                    p = star_p + 1;
                    t = star_t + 1;
                    star = Some((star_p, star_t + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|character| *character == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::FilterLimits;
    use serde_json::json;

    fn check(filter: Value, metadata: Value) -> bool {
        let filter = Filter::parse(&filter, FilterLimits::default()).expect("parses");
        let tags = vec!["async".to_owned(), "io".to_owned()];
        filter.matches(&Facts {
            source_key: "src/ch16-01-threads.md",
            media_type: "text/markdown",
            tags: &tags,
            metadata: &metadata,
            accepted_at: 1_000,
            readers: None,
        })
    }

    #[test]
    fn conditions_follow_the_documented_semantics() {
        let meta = json!({"year": 2021, "authors": ["Ada", "Alan"], "draft": false, "n": "1", "empty": null, "o": {"a": 1}});
        assert!(check(
            json!({"field": "tags", "all": ["async", "io"]}),
            meta.clone()
        ));
        assert!(!check(
            json!({"field": "tags", "all": ["async", "net"]}),
            meta.clone()
        ));
        assert!(check(
            json!({"field": "tags", "none": ["net"]}),
            meta.clone()
        ));
        assert!(check(
            json!({"field": "metadata.authors", "eq": "Alan"}),
            meta.clone()
        ));
        assert!(check(
            json!({"field": "metadata.year", "in": [2020, 2021.0]}),
            meta.clone()
        ));
        assert!(
            !check(json!({"field": "metadata.n", "eq": 1}), meta.clone()),
            "\"1\" is not 1"
        );
        assert!(check(
            json!({"field": "metadata.draft", "eq": false}),
            meta.clone()
        ));
        assert!(!check(
            json!({"field": "metadata.empty", "exists": true}),
            meta.clone()
        ));
        assert!(check(
            json!({"field": "metadata.missing", "exists": false}),
            meta.clone()
        ));
        assert!(!check(
            json!({"field": "metadata.o", "eq": 1}),
            meta.clone()
        ));
        assert!(check(
            json!({"field": "metadata.year", "gt": 2020, "lte": 2021}),
            meta.clone()
        ));
        assert!(!check(
            json!({"field": "metadata.n", "gte": 0}),
            meta.clone()
        ));
        assert!(check(
            json!({"field": "source_key", "glob": "src/ch16-*.md"}),
            meta.clone()
        ));
        assert!(check(
            json!({"field": "source_key", "glob": "*threads?md"}),
            meta.clone()
        ));
        assert!(!check(
            json!({"field": "source_key", "glob": "ch16*"}),
            meta.clone()
        ));
        assert!(check(
            json!({"field": "accepted_at", "gte": 1000, "lt": 1001}),
            meta.clone()
        ));
        assert!(check(
            json!({"should": [{"field": "media_type", "eq": "text/html"}, {"field": "tags", "any": ["io"]}],
                   "must_not": [{"field": "source_key", "prefix": "appendix"}]}),
            meta
        ));
    }

    #[test]
    fn globs_backtrack_without_blowing_up() {
        assert!(glob("a*b*c", "aXXbYYc"));
        assert!(!glob("a*b*c", "aXXbYY"));
        assert!(glob("*", ""));
        assert!(!glob("?", ""));
        let long = "a".repeat(2000);
        assert!(!glob(&"*a".repeat(200).replace("*a*a", "*a*b"), &long));
    }
}
