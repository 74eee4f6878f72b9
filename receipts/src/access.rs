//! # access: who may read which document
//!
//! ## Model
//! - A **reader** is a name: `user:<name>` or `service:<name>` (a principal), or
//!   `group:<name>`. A token may read as an [`Identity`]: one principal and its groups. A token
//!   without one reads its whole datasets (every token made before access existed, and the
//!   operators' admin and `ops:read` tokens unless they are given one).
//! - A **source** may name its readers ([`SourceAccess`]), at a put or by an access change.
//!   Readers belong to the source, not to a revision: changing them is not a new revision, and
//!   nothing is chunked or embedded again. A source that names none follows its **dataset's
//!   default** ([`DefaultAccess`]): everyone who may read the dataset (the default of a
//!   dataset nobody configured), or nobody until a document says who.
//! - An identity may read a source when one of its names ([`Identity::names`]) is among the
//!   source's readers, or when the source names none and its dataset is open.
//!
//! ## Invariants
//! - Enforced where every answer is made, and fail closed: search reads the ledger's current
//!   access for every hit at binding (a [`crate::filter::Condition::Readable`] joined to the
//!   query's filter, so the lexical query, the ledger's selection, the facet counts and the
//!   binding check all apply it), and every read of a source or revision asks
//!   [`crate::ledger::Reader::may_read`]. A revoked reader stops seeing a document at the next
//!   query, whatever the stores still hold.
//! - A document a caller may not read is answered as absent (`not_found`), never refused, so
//!   that its existence does not leak.
//! - Every change goes through the ledger's one write path, in one transaction, and the ledger
//!   records it in `history` (entity `access`) with its actor and reason.
//! - A change to a source's readers queues, in the same transaction, one `access` job per live
//!   generation that holds vectors ([`crate::JobKind::Access`]), unless that generation's
//!   projection of the source waits to run (it reads the readers when it runs; a running one
//!   reads them again once its points are current, and a change after that queues a job). The job
//!   writes the readers onto the source's points, so the store's prefilter follows the change;
//!   binding never waits for it.

use serde::{Deserialize, Serialize};

use crate::clock::Micros;
use crate::error::LedgerError;
use crate::filter::{printable, Condition, Filter};

/// Most readers one source may name.
pub const MAX_READERS: usize = 256;
/// Most groups one identity may carry.
pub const MAX_GROUPS: usize = 64;
/// Longest reader name, in bytes (`group:` included).
pub const MAX_READER_BYTES: usize = 200;
/// Claim priority of access jobs: above projection and connector runs, so a permission change
/// reaches the stores' prefilter before content that waits behind it.
pub const ACCESS_PRIORITY: i64 = 2;
/// Who queues access jobs (their `changed_by`): the ledger, on an access change.
pub const ACCESS_QUEUER: &str = "cairn:access";

/// The identity a request reads as: a principal (`user:<name>` or `service:<name>`) and the
/// groups it belongs to (`group:<name>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct Identity {
    /// `user:<name>` or `service:<name>`.
    pub principal: String,
    /// `group:<name>` each, sorted, without repeats.
    pub groups: Vec<String>,
}

impl Identity {
    /// An identity, checked: a principal name and group names (`eng` and `group:eng` both
    /// name the group `group:eng`).
    pub fn new(principal: &str, groups: &[String]) -> Result<Identity, LedgerError> {
        let principal = principal.trim();
        if !(principal.starts_with("user:") || principal.starts_with("service:")) {
            return Err(LedgerError::invalid(
                "invalid_principal",
                format!(
                    "a principal is `user:<name>` or `service:<name>` (got `{}`)",
                    printable(principal)
                ),
            ));
        }
        check_reader(principal, "invalid_principal")?;
        if groups.len() > MAX_GROUPS {
            return Err(LedgerError::invalid(
                "invalid_groups",
                format!(
                    "an identity has at most {MAX_GROUPS} groups (got {})",
                    groups.len()
                ),
            ));
        }
        let mut named = Vec::with_capacity(groups.len());
        for group in groups {
            let group = group.trim();
            let group = if group.starts_with("group:") {
                group.to_owned()
            } else {
                format!("group:{group}")
            };
            check_reader(&group, "invalid_groups")?;
            named.push(group);
        }
        named.sort_unstable();
        named.dedup();
        Ok(Identity {
            principal: principal.to_owned(),
            groups: named,
        })
    }

    /// Every name the identity reads as: its principal and its groups.
    pub fn names(&self) -> Vec<String> {
        let mut names = Vec::with_capacity(self.groups.len() + 1);
        names.push(self.principal.clone());
        names.extend(self.groups.iter().cloned());
        names
    }
}

/// A source's readers on the wire (`access` on a put, the body of an access change).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SourceAccess {
    /// Who may read the source: `user:<name>`, `service:<name>` or `group:<name>`. An empty
    /// list: nobody but tokens that read their whole datasets.
    pub readers: Vec<String>,
}

impl SourceAccess {
    /// The readers checked, sorted and without repeats.
    pub fn checked(&self) -> Result<Vec<String>, LedgerError> {
        if self.readers.len() > MAX_READERS {
            return Err(LedgerError::invalid(
                "invalid_access",
                format!(
                    "`access.readers` names at most {MAX_READERS} readers (got {})",
                    self.readers.len()
                ),
            ));
        }
        let mut readers = Vec::with_capacity(self.readers.len());
        for reader in &self.readers {
            let reader = reader.trim();
            if !["user:", "service:", "group:"]
                .iter()
                .any(|kind| reader.starts_with(kind))
            {
                return Err(LedgerError::invalid(
                    "invalid_access",
                    format!(
                        "a reader is `user:<name>`, `service:<name>` or `group:<name>` \
                         (got `{}`)",
                        printable(reader)
                    ),
                ));
            }
            check_reader(reader, "invalid_access")?;
            readers.push(reader.to_owned());
        }
        readers.sort_unstable();
        readers.dedup();
        Ok(readers)
    }
}

/// A dataset's default for sources that name no readers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DefaultAccess {
    /// Everyone who may read the dataset.
    #[default]
    Everyone,
    /// Nobody (but tokens that read whole datasets) until a document names its readers.
    Nobody,
}

impl DefaultAccess {
    /// The wire and stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            DefaultAccess::Everyone => "everyone",
            DefaultAccess::Nobody => "nobody",
        }
    }
}

impl std::str::FromStr for DefaultAccess {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "everyone" => Ok(DefaultAccess::Everyone),
            "nobody" => Ok(DefaultAccess::Nobody),
            other => Err(format!(
                "unknown default access `{}`; valid: everyone, nobody",
                printable(other)
            )),
        }
    }
}

/// A change to who may read, applied by the ledger's one write path and recorded in history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessChange {
    /// Name a source's readers (`Some`), or hand it back to its dataset's default (`None`).
    Source {
        /// The dataset.
        dataset: String,
        /// The source's key.
        source_key: String,
        /// Its readers, checked ([`SourceAccess::checked`]); `None`: the dataset's default.
        readers: Option<Vec<String>>,
        /// Who (recorded in history).
        actor: String,
        /// Why (recorded in history).
        reason: String,
    },
    /// Set a dataset's default.
    Dataset {
        /// The dataset.
        dataset: String,
        /// Its default.
        default: DefaultAccess,
        /// Who (recorded in history).
        actor: String,
        /// Why (recorded in history).
        reason: String,
    },
}

/// Who may read one source, as the ledger holds it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct AccessRecord {
    /// The dataset.
    pub dataset: String,
    /// The source's key.
    pub source_key: String,
    /// The readers the source names; `None`: it follows the dataset's default.
    pub readers: Option<Vec<String>>,
    /// The dataset's default.
    pub default: DefaultAccess,
    /// How many times the source's readers were set (0: never).
    pub version: i64,
    /// Who set them last.
    pub changed_by: Option<String>,
    /// When (microseconds since the epoch).
    pub changed_at: Option<Micros>,
}

impl AccessRecord {
    /// The readers in force: the source's own, else `None` for an open dataset and no one
    /// for a closed one.
    pub fn effective(&self) -> Option<Vec<String>> {
        match (&self.readers, self.default) {
            (Some(readers), _) => Some(readers.clone()),
            (None, DefaultAccess::Everyone) => None,
            (None, DefaultAccess::Nobody) => Some(Vec::new()),
        }
    }
}

/// Whether an identity with these `names` may read a source whose readers in force are
/// `readers` (`None`: everyone who may read its dataset). The one rule every path applies.
pub fn admits(readers: Option<&[String]>, names: &[String]) -> bool {
    match readers {
        None => true,
        Some(readers) => readers.iter().any(|reader| names.contains(reader)),
    }
}

/// The columns that read a `revisions` row's readers in force: `named_readers` (the source's
/// own list, or NULL) and `default_access` (its dataset's, or NULL for open), for
/// [`in_force`]. The same text on both engines.
pub(crate) const FACT_COLUMNS: &str = "(SELECT a.readers FROM source_access a \
    WHERE a.dataset = revisions.dataset AND a.source_key = revisions.source_key) AS named_readers, \
    (SELECT d.default_access FROM dataset_access d WHERE d.dataset = revisions.dataset) \
    AS default_access";

/// A stored readers list: JSON text (SQLite) or a `jsonb` value (PostgreSQL).
pub(crate) trait StoredReaders {
    /// The list, or why it is corrupt.
    fn readers(self) -> Result<Vec<String>, LedgerError>;
}

impl StoredReaders for String {
    fn readers(self) -> Result<Vec<String>, LedgerError> {
        serde_json::from_str(&self)
            .map_err(|error| LedgerError::Corrupt(format!("source_access.readers: {error}")))
    }
}

impl StoredReaders for serde_json::Value {
    fn readers(self) -> Result<Vec<String>, LedgerError> {
        serde_json::from_value(self)
            .map_err(|error| LedgerError::Corrupt(format!("source_access.readers: {error}")))
    }
}

/// The readers in force from what [`FACT_COLUMNS`] read: the source's own, else `None` for an
/// open dataset and nobody for a closed one.
pub(crate) fn in_force<R: StoredReaders>(
    named: Option<R>,
    default: Option<&str>,
) -> Result<Option<Vec<String>>, LedgerError> {
    match (named, default) {
        (Some(named), _) => Ok(Some(named.readers()?)),
        (None, Some("nobody")) => Ok(Some(Vec::new())),
        (None, Some("everyone") | None) => Ok(None),
        (None, Some(other)) => Err(LedgerError::Corrupt(format!(
            "dataset_access.default_access `{other}`"
        ))),
    }
}

/// The filter a search runs for an identity with these `names`: the caller's own `filter`,
/// and the source's readers admitting one of the names.
pub fn restrict(filter: Option<Filter>, names: Vec<String>) -> Filter {
    let readable = Filter::Condition(Condition::Readable(names));
    match filter {
        None => readable,
        Some(filter) => Filter::Group {
            must: vec![filter, readable],
            should: Vec::new(),
            must_not: Vec::new(),
        },
    }
}

/// Who made an access change, as a metric label: `connector`, `config`, `restore` or `api`.
fn origin(change: &AccessChange) -> &'static str {
    let (actor, reason) = match change {
        AccessChange::Source { actor, reason, .. }
        | AccessChange::Dataset { actor, reason, .. } => (actor, reason),
    };
    if actor.starts_with("connector:") {
        "connector"
    } else if actor == "config" {
        "config"
    } else if reason.contains("replayed by the restore") {
        "restore"
    } else {
        "api"
    }
}

/// Records an access change's outcome and its time from the call to its commit, which is when
/// it is in force (search reads the ledger's current readers at every query):
/// `cairn_access_changes_total{origin,outcome}` and `cairn_access_change_seconds{origin}`.
pub(crate) fn observe(change: &AccessChange, started: std::time::Instant, ok: bool) {
    let origin = origin(change);
    let outcome = if ok { "committed" } else { "failed" };
    metrics::counter!("cairn_access_changes_total", "origin" => origin, "outcome" => outcome)
        .increment(1);
    if ok {
        metrics::histogram!("cairn_access_change_seconds", "origin" => origin)
            .record(started.elapsed().as_secs_f64());
    }
}

/// Every origin label [`observe`] uses, for series that exist from the first scrape.
pub const ORIGINS: [&str; 4] = ["api", "connector", "config", "restore"];

fn check_reader(name: &str, code: &'static str) -> Result<(), LedgerError> {
    let (_, rest) = name.split_once(':').unwrap_or((name, ""));
    let fine = !rest.is_empty()
        && name.len() <= MAX_READER_BYTES
        && rest
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '@' | '+'));
    if fine {
        Ok(())
    } else {
        Err(LedgerError::invalid(
            code,
            format!(
                "`{}`: a name after its kind has 1 to {MAX_READER_BYTES} bytes of letters, \
                 digits and `_ - . @ +`",
                printable(name)
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_and_readers_are_checked_and_normalised() {
        let identity =
            Identity::new("user:alice", &["eng".into(), "group:hr".into()]).expect("an identity");
        assert_eq!(identity.groups, vec!["group:eng", "group:hr"]);
        assert_eq!(
            identity.names(),
            vec!["user:alice", "group:eng", "group:hr"]
        );
        for bad in ["alice", "group:eng", "user:", "user:a b", "user:\u{0}"] {
            assert!(Identity::new(bad, &[]).is_err(), "{bad:?}");
        }
        let access = SourceAccess {
            readers: vec!["group:eng".into(), "user:bob".into(), "group:eng".into()],
        };
        assert_eq!(
            access.checked().expect("readers"),
            vec!["group:eng", "user:bob"]
        );
        for bad in ["bob", "role:x", "group:"] {
            let access = SourceAccess {
                readers: vec![bad.into()],
            };
            let error = access.checked().expect_err(bad);
            assert_eq!(error.code(), "invalid_access", "{bad}");
        }
    }

    #[test]
    fn admits_follows_the_readers_in_force() {
        let names = vec!["user:alice".to_owned(), "group:eng".to_owned()];
        assert!(admits(None, &names));
        assert!(!admits(Some(&[]), &names));
        assert!(admits(Some(&["group:eng".to_owned()]), &names));
        assert!(!admits(Some(&["user:bob".to_owned()]), &names));
    }
}
