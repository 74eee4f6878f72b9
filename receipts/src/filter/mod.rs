//! # filter: one filter language for every search mode
//!
//! A search may narrow its sources by what the ledger knows of each revision: its `tags`,
//! `metadata` fields, `media_type`, `source_key` and `accepted_at`. The filter is parsed once
//! from JSON ([`Filter::parse`]) into a tree of groups and conditions, then
//! - compiled to SQL over the `revisions` row of each candidate ([`sql`]), for the lexical
//!   phase on SQLite and PostgreSQL, inside the query, before its top-k cut;
//! - evaluated exactly in Rust ([`Filter::matches`]) against the revision a hit binds to, which
//!   is the last word: a hit whose current revision does not match is dropped.
//!
//! ## Wire form
//! A node is either a **group**, an object whose keys are among `must` (every child holds),
//! `should` (at least one holds) and `must_not` (none holds), each a non-empty list of nodes;
//! or a **condition**, an object with `field` and one operator:
//! - `tags`: `any`, `all` or `none`, a list of strings;
//! - `media_type`: `eq` (a string) or `in` (a list);
//! - `source_key`: `eq`, `in`, `prefix`, or `glob` (`*` any run of characters, `/` included;
//!   `?` one character; everything else literal);
//! - `accepted_at`: a range, one or two of `gt`/`gte` and `lt`/`lte`, each an instant (RFC 3339
//!   with an offset, or epoch microseconds);
//! - `metadata.<name>` (`name`: letters, digits, `_`, `-`): `eq` (a string, number or boolean),
//!   `in` (a list of them), `exists` (a boolean), or a range of numbers.
//!
//! ## Invariants
//! - Both paths give the same answer for every revision: the property test in
//!   `testkit::conformance::filters` compares the SQL of both ledgers with [`Filter::matches`].
//! - A metadata value that is a list matches when any of its elements does (as in Qdrant);
//!   values of another type never match (`"1"` is not `1`); objects and `null` never match; a
//!   missing field matches only `exists: false` (and `must_not`).
//! - Size is bounded before anything runs ([`FilterLimits`]); every refusal names the part of
//!   the filter at fault (`filter.must[1].field`) with a stable code.

mod eval;
pub mod facets;
mod parse;
pub mod sql;

pub use eval::Facts;
pub use parse::metadata_name;
pub(crate) use parse::printable;

/// What the ledger holds of one revision that a filter can test (an owned [`Facts`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RevisionFacts {
    /// The revision.
    pub revision_id: uuid::Uuid,
    /// Its source's key.
    pub source_key: String,
    /// Media type.
    pub media_type: String,
    /// Tags.
    pub tags: Vec<String>,
    /// Metadata (an object).
    pub metadata: serde_json::Value,
    /// Acceptance time, epoch microseconds.
    pub accepted_at: crate::Micros,
    /// Who may read its source now ([`crate::access`]): `None` for everyone who may read
    /// the dataset, else the readers in force (empty: nobody).
    pub readers: Option<Vec<String>>,
}

impl RevisionFacts {
    /// The facts, borrowed, as [`Filter::matches`] reads them.
    pub fn facts(&self) -> Facts<'_> {
        Facts {
            source_key: &self.source_key,
            media_type: &self.media_type,
            tags: &self.tags,
            metadata: &self.metadata,
            accepted_at: self.accepted_at,
            readers: self.readers.as_deref(),
        }
    }
}

/// A parsed filter: a group, or a single condition.
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    /// Every part holds: each of `must`, at least one of `should` (when given), none of
    /// `must_not`.
    Group {
        /// Every one holds.
        must: Vec<Filter>,
        /// At least one holds (empty: no such requirement).
        should: Vec<Filter>,
        /// None holds.
        must_not: Vec<Filter>,
    },
    /// One condition on one field.
    Condition(Condition),
}

/// A condition on one field of a revision.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// On the revision's tags.
    Tags(TagTest, Vec<String>),
    /// The media type is one of these.
    MediaType(Vec<String>),
    /// On the source key.
    SourceKey(KeyTest),
    /// The acceptance time lies in the range.
    AcceptedAt(Range<crate::Micros>),
    /// On one top-level metadata field.
    Metadata(String, ValueTest),
    /// The source's readers in force now admit one of these names
    /// ([`crate::access::admits`]). Never read from the wire: the search joins it to the
    /// caller's filter for a token that reads as an identity ([`crate::access::restrict`]).
    Readable(Vec<String>),
}

/// How a tag list is tested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagTest {
    /// At least one of the listed tags.
    Any,
    /// Every listed tag.
    All,
    /// None of the listed tags.
    None,
}

/// How a source key is tested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyTest {
    /// One of these keys.
    In(Vec<String>),
    /// Starts with this.
    Prefix(String),
    /// Matches this glob (`*`, `?`).
    Glob(String),
}

/// How a metadata value is tested.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueTest {
    /// Equal to one of these scalars (strings, numbers, booleans).
    In(Vec<Scalar>),
    /// Present and not null (`true`), or absent or null (`false`).
    Exists(bool),
    /// A number in the range.
    Range(Range<f64>),
}

/// A scalar metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    /// A string.
    Text(String),
    /// A number (compared as a 64-bit float).
    Number(f64),
    /// A boolean.
    Bool(bool),
}

/// A range: each end optional, open or closed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Range<T> {
    /// The lower end and whether it is included (`gte`).
    pub lower: Option<(T, bool)>,
    /// The upper end and whether it is included (`lte`).
    pub upper: Option<(T, bool)>,
}

impl<T: PartialOrd + Copy> Range<T> {
    /// Whether `value` lies in the range.
    pub fn contains(&self, value: T) -> bool {
        let above = match self.lower {
            None => true,
            Some((lower, true)) => value >= lower,
            Some((lower, false)) => value > lower,
        };
        let below = match self.upper {
            None => true,
            Some((upper, true)) => value <= upper,
            Some((upper, false)) => value < upper,
        };
        above && below
    }
}

/// Bounds on a filter's size, checked while it is parsed (`search.filter_*` in the
/// configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilterLimits {
    /// Most conditions in one filter.
    pub max_conditions: usize,
    /// Deepest nesting of groups (a bare condition is depth 0, a group of conditions 1).
    pub max_depth: usize,
    /// Most listed values (in `any`, `all`, `none` and `in` lists) in one filter.
    pub max_values: usize,
}

impl Default for FilterLimits {
    fn default() -> Self {
        FilterLimits {
            max_conditions: 32,
            max_depth: 4,
            max_values: 256,
        }
    }
}

/// The longest string a condition may hold, in bytes.
pub const MAX_VALUE_BYTES: usize = 1024;

/// Why a filter was refused: a stable code, the part at fault, and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {message}")]
pub struct FilterError {
    /// `filter_shape`, `filter_unknown_field`, `filter_wrong_type`, `filter_empty_range`,
    /// `filter_too_large` or `filter_too_deep`.
    pub code: &'static str,
    /// The part of the filter at fault (`filter.must[1].any`).
    pub at: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl From<FilterError> for crate::LedgerError {
    fn from(error: FilterError) -> Self {
        crate::LedgerError::invalid(error.code, error.to_string())
    }
}

impl Filter {
    /// Parses and checks a filter in its wire form, within `limits`.
    pub fn parse(value: &serde_json::Value, limits: FilterLimits) -> Result<Filter, FilterError> {
        parse::parse(value, limits)
    }

    /// Whether a revision with these facts matches: the exact evaluation every other path
    /// must agree with.
    pub fn matches(&self, facts: &Facts<'_>) -> bool {
        eval::matches(self, facts)
    }

    /// The metadata fields the filter names, sorted, without repeats.
    pub fn metadata_fields(&self) -> Vec<&str> {
        let mut fields = Vec::new();
        self.visit(&mut |condition| {
            if let Condition::Metadata(name, _) = condition {
                fields.push(name.as_str());
            }
        });
        fields.sort_unstable();
        fields.dedup();
        fields
    }

    fn visit<'a>(&'a self, each: &mut impl FnMut(&'a Condition)) {
        match self {
            Filter::Condition(condition) => each(condition),
            Filter::Group {
                must,
                should,
                must_not,
            } => {
                for child in must.iter().chain(should).chain(must_not) {
                    child.visit(each);
                }
            }
        }
    }
}
