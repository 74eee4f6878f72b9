//! The wire form to a [`Filter`], checked as it is read: shapes, fields, types, ranges and
//! size, each refusal naming where it is.

use serde_json::{Map, Value};

use super::{
    Condition, Filter, FilterError, FilterLimits, KeyTest, Range, Scalar, TagTest, ValueTest,
    MAX_VALUE_BYTES,
};

/// What the parse has counted so far.
struct Budget {
    limits: FilterLimits,
    conditions: usize,
    values: usize,
}

fn refuse(code: &'static str, at: &str, message: impl Into<String>) -> FilterError {
    FilterError {
        code,
        at: at.to_owned(),
        message: message.into(),
    }
}

pub(super) fn parse(value: &Value, limits: FilterLimits) -> Result<Filter, FilterError> {
    let mut budget = Budget {
        limits,
        conditions: 0,
        values: 0,
    };
    node(value, "filter", 0, &mut budget)
}

fn node(value: &Value, at: &str, depth: usize, budget: &mut Budget) -> Result<Filter, FilterError> {
    let Value::Object(object) = value else {
        return Err(refuse(
            "filter_shape",
            at,
            "expected an object: a group ({\"must\": [...]}, `should`, `must_not`) or a \
             condition ({\"field\": \"tags\", \"any\": [\"a\"]})",
        ));
    };
    if object.contains_key("field") {
        budget.conditions += 1;
        if budget.conditions > budget.limits.max_conditions {
            return Err(refuse(
                "filter_too_large",
                at,
                format!(
                    "more than {} conditions (search.filter_max_conditions)",
                    budget.limits.max_conditions
                ),
            ));
        }
        return condition(object, at, budget).map(Filter::Condition);
    }
    if depth >= budget.limits.max_depth {
        return Err(refuse(
            "filter_too_deep",
            at,
            format!(
                "groups nest at most {} deep (search.filter_max_depth)",
                budget.limits.max_depth
            ),
        ));
    }
    if object.is_empty() {
        return Err(refuse(
            "filter_shape",
            at,
            "an empty group; give `must`, `should` or `must_not`",
        ));
    }
    let mut parts = [Vec::new(), Vec::new(), Vec::new()];
    for (key, children) in object {
        let slot = match key.as_str() {
            "must" => 0,
            "should" => 1,
            "must_not" => 2,
            other => {
                return Err(refuse(
                    "filter_shape",
                    &format!("{at}.{}", printable(other)),
                    "a group has only `must`, `should` and `must_not` (a condition has \
                     `field`)",
                ))
            }
        };
        let here = format!("{at}.{key}");
        let Value::Array(children) = children else {
            return Err(refuse("filter_shape", &here, "expected a list of filters"));
        };
        if children.is_empty() {
            return Err(refuse(
                "filter_shape",
                &here,
                "an empty list; leave it out instead",
            ));
        }
        for (index, child) in children.iter().enumerate() {
            parts[slot].push(node(child, &format!("{here}[{index}]"), depth + 1, budget)?);
        }
    }
    let [must, should, must_not] = parts;
    Ok(Filter::Group {
        must,
        should,
        must_not,
    })
}

/// The operators each field takes, for messages.
const FIELDS: &str = "tags (any, all, none), media_type (eq, in), source_key (eq, in, prefix, \
                      glob), accepted_at (gt, gte, lt, lte), metadata.<name> (eq, in, exists, \
                      gt, gte, lt, lte)";

fn condition(
    object: &Map<String, Value>,
    at: &str,
    budget: &mut Budget,
) -> Result<Condition, FilterError> {
    let field_at = format!("{at}.field");
    let Some(Value::String(field)) = object.get("field") else {
        return Err(refuse(
            "filter_wrong_type",
            &field_at,
            format!("`field` is a string: one of {FIELDS}"),
        ));
    };
    let operators: Vec<(&str, &Value)> = object
        .iter()
        .filter(|(key, _)| key.as_str() != "field")
        .map(|(key, value)| (key.as_str(), value))
        .collect();
    let allowed: &[&str] = match field.as_str() {
        "tags" => &["any", "all", "none"],
        "media_type" => &["eq", "in"],
        "source_key" => &["eq", "in", "prefix", "glob"],
        "accepted_at" => &["gt", "gte", "lt", "lte"],
        other if other.starts_with("metadata.") => {
            &["eq", "in", "exists", "gt", "gte", "lt", "lte"]
        }
        other => {
            return Err(refuse(
                "filter_unknown_field",
                &field_at,
                format!("unknown field {:?}; fields are {FIELDS}", printable(other)),
            ))
        }
    };
    for (key, _) in &operators {
        if !allowed.contains(key) {
            return Err(refuse(
                "filter_shape",
                &format!("{at}.{}", printable(key)),
                format!("{field} takes {}", allowed.join(", ")),
            ));
        }
    }
    let ranged = operators
        .iter()
        .all(|(key, _)| matches!(*key, "gt" | "gte" | "lt" | "lte"));
    if operators.is_empty() || (operators.len() > 1 && !ranged) {
        return Err(refuse(
            "filter_shape",
            at,
            format!(
                "a condition has `field` and one operator ({}), or a range of one or two ends",
                allowed.join(", ")
            ),
        ));
    }
    let (operator, value) = operators[0];
    let here = format!("{at}.{operator}");
    Ok(match field.as_str() {
        "tags" => {
            let test = match operator {
                "any" => TagTest::Any,
                "all" => TagTest::All,
                _ => TagTest::None,
            };
            Condition::Tags(test, strings(value, &here, budget)?)
        }
        "media_type" => Condition::MediaType(match operator {
            "eq" => vec![string(value, &here)?],
            _ => strings(value, &here, budget)?,
        }),
        "source_key" => Condition::SourceKey(match operator {
            "eq" => KeyTest::In(vec![string(value, &here)?]),
            "in" => KeyTest::In(strings(value, &here, budget)?),
            "prefix" => KeyTest::Prefix(string(value, &here)?),
            _ => KeyTest::Glob(string(value, &here)?),
        }),
        "accepted_at" => Condition::AcceptedAt(range(&operators, at, |key, value| {
            crate::validity::parse_instant(&format!("{at}.{key}"), value).map_err(|error| {
                refuse(
                    "filter_wrong_type",
                    &format!("{at}.{key}"),
                    error.to_string(),
                )
            })
        })?),
        _ => {
            let Some(name) = metadata_name(field) else {
                return Err(refuse("filter_unknown_field", &field_at, METADATA_NAMES));
            };
            let test = match operator {
                "eq" => ValueTest::In(vec![scalar(value, &here)?]),
                "in" => {
                    let list = list(value, &here, budget)?;
                    ValueTest::In(
                        list.iter()
                            .enumerate()
                            .map(|(index, value)| scalar(value, &format!("{here}[{index}]")))
                            .collect::<Result<_, _>>()?,
                    )
                }
                "exists" => match value {
                    Value::Bool(exists) => ValueTest::Exists(*exists),
                    _ => {
                        return Err(refuse(
                            "filter_wrong_type",
                            &here,
                            "`exists` is true or false",
                        ))
                    }
                },
                _ => ValueTest::Range(range(&operators, at, |key, value| {
                    value.as_f64().ok_or_else(|| {
                        refuse(
                            "filter_wrong_type",
                            &format!("{at}.{key}"),
                            "a metadata range compares numbers (store instants as epoch \
                             numbers, as connectors do with commit_time; or filter on \
                             accepted_at)",
                        )
                    })
                })?),
            };
            Condition::Metadata(name.to_owned(), test)
        }
    })
}

/// A range from its one or two ends; refused when nothing can lie in it.
fn range<T: PartialOrd + Copy + std::fmt::Debug>(
    operators: &[(&str, &Value)],
    at: &str,
    read: impl Fn(&str, &Value) -> Result<T, FilterError>,
) -> Result<Range<T>, FilterError> {
    let mut range = Range {
        lower: None,
        upper: None,
    };
    for (key, value) in operators {
        let end = read(key, value)?;
        let (slot, included) = match *key {
            "gt" => (&mut range.lower, false),
            "gte" => (&mut range.lower, true),
            "lt" => (&mut range.upper, false),
            _ => (&mut range.upper, true),
        };
        if slot.is_some() {
            return Err(refuse(
                "filter_shape",
                &format!("{at}.{key}"),
                "a range has one lower end (gt or gte) and one upper end (lt or lte)",
            ));
        }
        *slot = Some((end, included));
    }
    if let (Some((lower, low_in)), Some((upper, up_in))) = (range.lower, range.upper) {
        if lower > upper || (lower == upper && !(low_in && up_in)) {
            return Err(refuse(
                "filter_empty_range",
                at,
                format!("nothing lies between {lower:?} and {upper:?}"),
            ));
        }
    }
    Ok(range)
}

fn list<'a>(
    value: &'a Value,
    at: &str,
    budget: &mut Budget,
) -> Result<&'a Vec<Value>, FilterError> {
    let Value::Array(list) = value else {
        return Err(refuse("filter_wrong_type", at, "expected a list"));
    };
    if list.is_empty() {
        return Err(refuse(
            "filter_shape",
            at,
            "an empty list matches nothing; give at least one value",
        ));
    }
    budget.values += list.len();
    if budget.values > budget.limits.max_values {
        return Err(refuse(
            "filter_too_large",
            at,
            format!(
                "more than {} listed values in one filter (search.filter_max_values)",
                budget.limits.max_values
            ),
        ));
    }
    Ok(list)
}

fn strings(value: &Value, at: &str, budget: &mut Budget) -> Result<Vec<String>, FilterError> {
    list(value, at, budget)?
        .iter()
        .enumerate()
        .map(|(index, value)| string(value, &format!("{at}[{index}]")))
        .collect()
}

fn string(value: &Value, at: &str) -> Result<String, FilterError> {
    let Value::String(text) = value else {
        return Err(refuse("filter_wrong_type", at, "expected a string"));
    };
    text_value(text, at)
}

fn text_value(text: &str, at: &str) -> Result<String, FilterError> {
    if text.len() > MAX_VALUE_BYTES {
        return Err(refuse(
            "filter_too_large",
            at,
            format!("a value is at most {MAX_VALUE_BYTES} bytes"),
        ));
    }
    if text.contains('\0') {
        return Err(refuse("filter_wrong_type", at, "a value may not hold NUL"));
    }
    Ok(text.to_owned())
}

fn scalar(value: &Value, at: &str) -> Result<Scalar, FilterError> {
    match value {
        Value::String(text) => Ok(Scalar::Text(text_value(text, at)?)),
        Value::Bool(flag) => Ok(Scalar::Bool(*flag)),
        Value::Number(number) => number
            .as_f64()
            .filter(|number| number.is_finite())
            .map(Scalar::Number)
            .ok_or_else(|| refuse("filter_wrong_type", at, "a number out of range")),
        _ => Err(refuse(
            "filter_wrong_type",
            at,
            "expected a string, a number or a boolean",
        )),
    }
}

/// A client's text as it may appear in a message: short, without control characters.
pub(crate) fn printable(text: &str) -> String {
    let mut shown: String = text
        .chars()
        .take(64)
        .map(|character| {
            if character.is_control() {
                '?'
            } else {
                character
            }
        })
        .collect();
    if text.chars().count() > 64 {
        shown.push('…');
    }
    shown
}

/// What a metadata field's name may be, for refusals.
pub(crate) const METADATA_NAMES: &str = "a metadata field is `metadata.<name>`, the name 1 to 64 \
                                         letters, digits, `_` or `-` (a top-level key of the \
                                         revision's metadata)";

/// The name of a `metadata.<name>` field, when it is one and the name is well formed: the
/// one rule for a metadata field's name (filters, facets, filterable fields).
pub fn metadata_name(field: &str) -> Option<&str> {
    let name = field.strip_prefix("metadata.")?;
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-');
    valid.then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(value: Value) -> FilterError {
        parse(&value, FilterLimits::default()).expect_err("refused")
    }

    #[test]
    fn the_wire_form_reads_into_groups_and_conditions() {
        let filter = parse(
            &json!({"must": [
                {"field": "tags", "any": ["async", "io"]},
                {"field": "metadata.year", "gte": 2020, "lt": 2030},
            ], "must_not": [{"field": "source_key", "prefix": "appendix/"}]}),
            FilterLimits::default(),
        )
        .expect("parses");
        let Filter::Group {
            must,
            should,
            must_not,
        } = filter
        else {
            panic!("a group")
        };
        assert_eq!(must.len(), 2);
        assert!(should.is_empty());
        assert_eq!(
            must_not,
            vec![Filter::Condition(Condition::SourceKey(KeyTest::Prefix(
                "appendix/".into()
            )))]
        );
        assert_eq!(
            must[1],
            Filter::Condition(Condition::Metadata(
                "year".into(),
                ValueTest::Range(Range {
                    lower: Some((2020.0, true)),
                    upper: Some((2030.0, false))
                })
            ))
        );
    }

    #[test]
    fn refusals_name_the_part_at_fault() {
        let error = refused(
            json!({"must": [{"field": "tags", "any": ["a"]}, {"field": "colour", "eq": "red"}]}),
        );
        assert_eq!(
            (error.code, error.at.as_str()),
            ("filter_unknown_field", "filter.must[1].field")
        );
        let error = refused(json!({"field": "metadata.year", "gt": 5, "lt": 5}));
        assert_eq!(
            (error.code, error.at.as_str()),
            ("filter_empty_range", "filter")
        );
        let error = refused(json!({"field": "accepted_at", "gte": "yesterday"}));
        assert_eq!(
            (error.code, error.at.as_str()),
            ("filter_wrong_type", "filter.gte")
        );
        let error = refused(json!({"should": [{"field": "metadata.a", "eq": [1]}]}));
        assert_eq!(
            (error.code, error.at.as_str()),
            ("filter_wrong_type", "filter.should[0].eq")
        );
        let error = refused(json!({"field": "tags", "any": ["a\u{0}b"]}));
        assert_eq!(
            (error.code, error.at.as_str()),
            ("filter_wrong_type", "filter.any[0]")
        );
        let error = refused(json!({"field": "tags", "any": "a"}));
        assert_eq!(error.code, "filter_wrong_type");
        let error = refused(json!({"field": "tags", "any": ["a"], "all": ["b"]}));
        assert_eq!(error.code, "filter_shape");
        let error = refused(json!({"maybe": []}));
        assert_eq!(
            (error.code, error.at.as_str()),
            ("filter_shape", "filter.maybe")
        );
        let error = refused(json!({}));
        assert_eq!(error.code, "filter_shape");
    }

    #[test]
    fn size_and_depth_are_bounded() {
        let mut deep = json!({"field": "tags", "any": ["a"]});
        for _ in 0..5 {
            deep = json!({"must": [deep]});
        }
        assert_eq!(refused(deep).code, "filter_too_deep");
        let many: Vec<Value> = (0..40)
            .map(|_| json!({"field": "tags", "any": ["a"]}))
            .collect();
        assert_eq!(refused(json!({"should": many})).code, "filter_too_large");
        let values: Vec<String> = (0..300).map(|index| index.to_string()).collect();
        assert_eq!(
            refused(json!({"field": "tags", "any": values})).code,
            "filter_too_large"
        );
        assert_eq!(
            refused(json!({"field": "tags", "any": ["x".repeat(2000)]})).code,
            "filter_too_large"
        );
        let four =
            json!({"must": [{"must": [{"must": [{"must": [{"field": "tags", "none": ["a"]}]}]}]}]});
        assert!(parse(&four, FilterLimits::default()).is_ok());
    }
}
