//! The batch body, parsed with its item limit applied while parsing.
//!
//! `{"items": [...]}` is read element by element; the parser stops at the first item past the
//! limit and never looks at the rest of the body. Memory is therefore bounded by the batch
//! body limit (the buffered bytes) plus at most `limit` parsed items, whatever the body holds:
//! a 60 MiB array of `0`s costs its 60 MiB of bytes and 1,001 tiny values, not 30 million.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// Why a batch body was refused.
#[derive(Debug)]
pub(crate) enum BatchError {
    /// More than `limit` items.
    TooMany {
        /// The limit.
        limit: usize,
    },
    /// Not `{"items": [...]}` (serde's message).
    Invalid(serde_json::Error),
}

/// Parses `{"items": [...]}` holding at most `limit` items. Unknown top-level fields are
/// refused, as everywhere in the API.
pub(crate) fn parse(body: &[u8], limit: usize) -> Result<Vec<Value>, BatchError> {
    let over = Cell::new(false);
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let parsed = BodySeed { limit, over: &over }
        .deserialize(&mut deserializer)
        .and_then(|items| deserializer.end().map(|()| items));
    match parsed {
        Ok(items) => Ok(items),
        Err(_) if over.get() => Err(BatchError::TooMany { limit }),
        Err(error) => Err(BatchError::Invalid(error)),
    }
}

/// The top-level object.
struct BodySeed<'a> {
    limit: usize,
    over: &'a Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for BodySeed<'_> {
    type Value = Vec<Value>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Vec<Value>, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for BodySeed<'_> {
    type Value = Vec<Value>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("an object `{\"items\": [...]}`")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<Value>, A::Error> {
        let mut items = None;
        while let Some(key) = map.next_key::<String>()? {
            if key != "items" {
                return Err(de::Error::unknown_field(&key, &["items"]));
            }
            if items.is_some() {
                return Err(de::Error::duplicate_field("items"));
            }
            items = Some(map.next_value_seed(ItemsSeed {
                limit: self.limit,
                over: self.over,
            })?);
        }
        items.ok_or_else(|| de::Error::missing_field("items"))
    }
}

/// The `items` array: counted while it is read.
struct ItemsSeed<'a> {
    limit: usize,
    over: &'a Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_> {
    type Value = Vec<Value>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Vec<Value>, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_> {
    type Value = Vec<Value>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("an array of items")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Value>, A::Error> {
        // The hint comes from the client: it bounds nothing, so it is capped by the limit.
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.limit));
        while items.len() < self.limit {
            match seq.next_element::<Value>()? {
                Some(item) => items.push(item),
                None => return Ok(items),
            }
        }
        // At the limit: one more element means too many. It is skipped without being kept,
        // and parsing stops here.
        match seq.next_element::<IgnoredAny>()? {
            None => Ok(items),
            Some(_) => {
                self.over.set(true);
                Err(de::Error::custom("too many items"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_up_to_the_limit_parse() {
        let items = parse(br#"{"items":[1,{"a":2},"x"]}"#, 3).expect("three items");
        assert_eq!(items.len(), 3);
        assert_eq!(items[1]["a"], 2);
        assert!(parse(br#"{"items":[]}"#, 3).expect("empty").is_empty());
    }

    #[test]
    fn parsing_stops_at_the_first_item_past_the_limit() {
        // Everything after the fourth item is garbage: a parser that read the whole array
        // first would call it invalid JSON; one that counts stops before it.
        let body = br#"{"items":[0,0,0,0,  this is not json"#;
        assert!(matches!(
            parse(body, 3),
            Err(BatchError::TooMany { limit: 3 })
        ));
        // A body with exactly the limit is not refused for its size.
        assert!(matches!(
            parse(br#"{"items":[0,0,0] garbage"#, 3),
            Err(BatchError::Invalid(_))
        ));
    }

    #[test]
    fn shape_errors_are_named() {
        for (body, expected) in [
            (&br#"{"items":[], "more": 1}"#[..], "unknown field `more`"),
            (br#"{}"#, "missing field `items`"),
            (br#"{"items":[],"items":[]}"#, "duplicate field `items`"),
            (br#"[1,2]"#, "expected an object"),
            (br#"{"items":{}}"#, "expected an array of items"),
        ] {
            match parse(body, 10) {
                Err(BatchError::Invalid(error)) => {
                    assert!(error.to_string().contains(expected), "{error}")
                }
                other => panic!("{}: {other:?}", String::from_utf8_lossy(body)),
            }
        }
    }
}
