//! # connectors: what a dataset should hold, read from where people keep documents
//!
//! A connector keeps a dataset equal to a folder (and, next, a git repository). This crate
//! holds its first step: reading the folder as the set of `(source key, file)` the dataset
//! should hold ([`folder::list`]), under a [`Selection`] (include and exclude globs, a size
//! limit per file), with every file left out named and why. The difference against the
//! ledger is [`receipts::sync::difference`]; `cairn ingest DIR --prune` applies it today.
//!
//! ## Invariants
//! - A key is the file's path inside the root, `/`-separated, valid UTF-8 and a valid source
//!   key; a name that is not is refused, never rewritten.
//! - Nothing outside the root is read: a symbolic link is followed only when it resolves to a
//!   file inside the root; one that leaves it, or names a folder, is refused with its reason.
//! - A file is listed only in a format cairn reads (Markdown, HTML, text, PDF, DOCX), by name
//!   and, for binary formats, by signature; anything else is skipped with its reason.
//! - Listing is deterministic: entries by key in byte order, skips by path.

pub mod folder;
mod selection;

pub use selection::{media_type_for, Selection, SelectionError};

/// Why a file is not listed. Stable codes, shown to operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SkipReason {
    /// A symbolic link that resolves outside the root (or cannot be resolved).
    LinkLeavesRoot,
    /// A symbolic link to a folder (not descended, so no link can loop).
    LinkToFolder,
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
            SkipReason::InvalidName => "invalid_name",
            SkipReason::TooLarge => "too_large",
            SkipReason::UnsupportedFormat => "unsupported_format",
            SkipReason::Excluded => "excluded",
            SkipReason::Unreadable => "unreadable",
        }
    }
}
