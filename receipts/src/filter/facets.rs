//! Facets: for a field, the values that the matching current sources hold, each with the number
//! of sources that hold it.
//!
//! ## Model
//! - The counted set is every source whose revision (the head, or the one that held at a point
//!   in time) is in the asked datasets, is not a tombstone and matches the filter: never a
//!   page of hits. A source counts once per distinct value it holds.
//! - Fields: `tags` (each tag), `media_type`, and `metadata.<name>` (its value, or each element
//!   of a list; strings, numbers and booleans, as filters compare them: `1` and `1.0` are one
//!   value, `"1"` another; objects and `null` are no value).
//! - Values are ordered by count, most first, then booleans, numbers and strings, each in its
//!   own order (strings by their UTF-8 bytes), so every engine cuts a long list at the same
//!   place. `truncated` says that more values exist than were listed.
//! - Counts are exact: the ledger counts every matching source. A count that cannot finish
//!   within its deadline is an error (`DeadlineExceeded`), never a smaller number.

use serde::Serialize;

use super::parse::{metadata_name, METADATA_NAMES};

/// A field that can be counted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FacetField {
    /// Each tag.
    Tags,
    /// The media type.
    MediaType,
    /// A top-level metadata field (its name).
    Metadata(String),
}

/// Fields offered, for refusals.
pub const FACET_FIELDS: &str = "tags, media_type, metadata.<name>";

/// A field that cannot be counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FacetError {
    /// Stable code: `facet_unknown_field`.
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
}

impl FacetField {
    /// Reads `tags`, `media_type` or `metadata.<name>`.
    pub fn parse(text: &str) -> Result<Self, FacetError> {
        match text {
            "tags" => Ok(FacetField::Tags),
            "media_type" => Ok(FacetField::MediaType),
            other if other.starts_with("metadata.") => metadata_name(other)
                .map(|name| FacetField::Metadata(name.to_owned()))
                .ok_or_else(|| FacetError {
                    code: "facet_unknown_field",
                    message: METADATA_NAMES.to_owned(),
                }),
            other => Err(FacetError {
                code: "facet_unknown_field",
                message: format!(
                    "cannot count {:?}; facets are {FACET_FIELDS}",
                    other.chars().take(80).collect::<String>()
                ),
            }),
        }
    }

    /// The field as it is written.
    pub fn name(&self) -> String {
        match self {
            FacetField::Tags => "tags".to_owned(),
            FacetField::MediaType => "media_type".to_owned(),
            FacetField::Metadata(name) => format!("metadata.{name}"),
        }
    }
}

/// One counted value.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum FacetValue {
    /// A boolean.
    Bool(bool),
    /// A number.
    Number(f64),
    /// A string.
    Text(String),
}

impl FacetValue {
    /// The order of values of equal count: booleans, numbers, strings.
    pub fn order(&self, other: &Self) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        match (self, other) {
            (FacetValue::Bool(a), FacetValue::Bool(b)) => a.cmp(b),
            (FacetValue::Number(a), FacetValue::Number(b)) => a.total_cmp(b),
            (FacetValue::Text(a), FacetValue::Text(b)) => a.as_bytes().cmp(b.as_bytes()),
            (FacetValue::Bool(_), _) | (FacetValue::Number(_), FacetValue::Text(_)) => {
                Ordering::Less
            }
            _ => Ordering::Greater,
        }
    }
}

/// A value and how many sources hold it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct FacetCount {
    /// The value.
    pub value: FacetValue,
    /// Matching sources that hold it.
    pub count: u64,
}

/// One field's counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct FacetCounts {
    /// The field, as asked.
    pub field: String,
    /// Matching sources, whatever their value.
    pub sources: u64,
    /// Matching sources with no value for the field.
    pub missing: u64,
    /// The most frequent values, most first (ties: booleans, numbers, strings, each in order).
    pub values: Vec<FacetCount>,
    /// More values exist than are listed.
    pub truncated: bool,
    /// Always `true`: counts are over every matching source, never estimated.
    pub exact: bool,
}

/// Gathers an engine's rows of [`super::sql::facet_query`] into [`FacetCounts`].
#[derive(Debug)]
pub struct FacetTally {
    counts: FacetCounts,
    valued: u64,
    distinct: u64,
    limit: usize,
}

impl FacetTally {
    /// An empty tally for `field`, listing at most `limit` values.
    pub fn new(field: &FacetField, limit: u32) -> Self {
        FacetTally {
            counts: FacetCounts {
                field: field.name(),
                sources: 0,
                missing: 0,
                values: Vec::new(),
                truncated: false,
                exact: true,
            },
            valued: 0,
            distinct: 0,
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
        }
    }

    /// A `value` row.
    pub fn value(&mut self, value: FacetValue, count: i64) {
        self.counts.values.push(FacetCount {
            value,
            count: u64::try_from(count).unwrap_or(0),
        });
    }

    /// A total row: `sources`, `valued` or `distinct`.
    pub fn total(&mut self, kind: &str, count: i64) {
        let count = u64::try_from(count).unwrap_or(0);
        match kind {
            "sources" => self.counts.sources = count,
            "valued" => self.valued = count,
            "distinct" => self.distinct = count,
            _ => {}
        }
    }

    /// The counts, values in their order.
    pub fn finish(mut self) -> FacetCounts {
        self.counts
            .values
            .sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.value.order(&b.value)));
        self.counts.values.truncate(self.limit);
        self.counts.missing = self.counts.sources.saturating_sub(self.valued);
        self.counts.truncated = self.distinct > self.counts.values.len() as u64;
        self.counts
    }
}
