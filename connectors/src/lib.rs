//! # connectors: what a dataset should hold, read from where people keep documents
//!
//! A connector keeps a dataset equal to a folder or a git repository at a ref. This crate
//! reads the folder ([`folder::list`]) or the tree ([`git::list`], through `gix`, unchanged
//! subtrees not read) as the set of `(source key, file)` the dataset should hold, under a [`Selection`] (include and exclude globs, a size limit per
//! file), with every file left out named and why; and runs a connector's `sync` jobs
//! ([`Runner`], a [`worker::Work`]): list, hash what the index does not vouch for, compare
//! with what the connector owns ([`receipts::sync::difference`], which `cairn ingest DIR
//! --prune` shares), submit and tombstone through acceptance, record the index and the
//! report. Its API ([`api`]) creates, lists and changes connectors under the tokens' scopes
//! and the configured folder roots. The connector record, its states and scheduling are the
//! ledger's ([`receipts::connectors`]).
//!
//! ## Invariants
//! - A key is the file's path inside the root, `/`-separated, valid UTF-8 and a valid source
//!   key; a name that is not is refused, never rewritten.
//! - Nothing outside the roots is read ([`confine`]): a run opens its folder beneath the
//!   configured root that contains it, and every file beneath that folder, at the moment it is
//!   opened. A symbolic link is followed only when it resolves to a file inside the folder; one
//!   that leaves it, or names a folder, is refused with its reason, and so is a file with more
//!   than one name. A location that resolves outside its root now fails the run with
//!   `location_refused` and removes nothing. A git repository's folder, common folder and
//!   alternate object stores must lie inside the roots too ([`git::open`]).
//! - A file is listed only in a format cairn reads (Markdown, HTML, text, PDF, DOCX), by name
//!   and, for binary formats, by signature; anything else is skipped with its reason.
//! - Listing is deterministic: entries by key in byte order, skips by path.
//! - A run's invariants (nothing lost to a crash, a missing folder empties nothing, conflicts
//!   never overwritten, bounded memory) are stated in [`runner`].

pub mod access;
pub mod api;
pub mod confine;
pub mod folder;
pub mod git;
pub mod hooks;
pub mod remote;
pub mod runner;
mod selection;

pub use runner::Runner;

pub use selection::{media_type_for, Selection, SelectionError};

/// Why a file is not listed. Stable codes, shown to operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SkipReason {
    /// A symbolic link that resolves outside the root (or cannot be resolved).
    LinkLeavesRoot,
    /// A symbolic link to a folder (not descended, so no link can loop).
    LinkToFolder,
    /// A file with more than one name: its other name may lie outside the folder.
    HardLink,
    /// A name that is not UTF-8, or not a valid source key.
    InvalidName,
    /// Over the selection's size limit.
    TooLarge,
    /// A format cairn does not read, or bytes that do not carry the format's signature.
    UnsupportedFormat,
    /// Matched by an exclude glob, or by no include glob.
    Excluded,
    /// The file could not be read.
    Unreadable,
}

impl SkipReason {
    /// The stable code.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::LinkLeavesRoot => "link_leaves_root",
            SkipReason::LinkToFolder => "link_to_folder",
            SkipReason::HardLink => "hard_link",
            SkipReason::InvalidName => "invalid_name",
            SkipReason::TooLarge => "too_large",
            SkipReason::UnsupportedFormat => "unsupported_format",
            SkipReason::Excluded => "excluded",
            SkipReason::Unreadable => "unreadable",
        }
    }
}
