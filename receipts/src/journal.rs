//! The erasure journal: erasures and token revocations, also written outside the ledger, so
//! that a restore from a backup taken before them makes them again instead of bringing the
//! erased content (or the revoked token) back to life.
//!
//! ## Model
//! - One JSON line per entry, in `journal/erasures.jsonl` beside the ledger (SQLite) or in the
//!   data directory of the process that made the change (PostgreSQL).
//! - An entry holds identities and hashes, never content: the dataset and source key (or the
//!   token id), who, why and when.
//!
//! ## Invariants
//! - An entry is appended and fsynced *before* the change is committed. An entry whose change
//!   then failed only repeats a request the operator made, so replaying it is safe.
//! - Lines are appended whole, one writer at a time per process. A torn last line (a crash
//!   mid-write) is ignored when the journal is read; every earlier line is intact.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JournalKind {
    /// A source erased.
    Erase,
    /// A token revoked.
    Revoke,
}

/// One journal line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// When (epoch microseconds, the ledger's clock).
    pub at: i64,
    /// What.
    pub kind: JournalKind,
    /// The erased source's dataset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    /// The erased source's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_key: Option<String>,
    /// The revoked token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_id: Option<Uuid>,
    /// Who asked.
    pub actor: String,
    /// Why.
    pub reason: String,
}

impl JournalEntry {
    /// The entry of an erasure request.
    pub fn erasure(request: &crate::model::ErasureRequest, at: i64) -> JournalEntry {
        JournalEntry {
            at,
            kind: JournalKind::Erase,
            dataset: Some(request.dataset.clone()),
            source_key: Some(request.source_key.clone()),
            token_id: None,
            actor: request.actor.clone(),
            reason: request.reason.clone(),
        }
    }

    /// The entry of a token change that revokes a token (a revocation, a rotation's old
    /// token); `None` for a creation.
    pub fn token(change: &crate::auth::TokenChange, at: i64) -> Option<JournalEntry> {
        use crate::auth::TokenChange;
        let (id, actor, reason) = match change {
            TokenChange::Revoke { id, actor, reason } => (id, actor, reason),
            TokenChange::Rotate {
                id, actor, reason, ..
            } => (id, actor, reason),
            TokenChange::Create(_) => return None,
        };
        Some(JournalEntry {
            at,
            kind: JournalKind::Revoke,
            dataset: None,
            source_key: None,
            token_id: Some(*id),
            actor: actor.clone(),
            reason: reason.clone().unwrap_or_else(|| "revoked".to_owned()),
        })
    }
}

/// Appends `entry` to the journal at `path` when there is one, as a ledger error.
pub(crate) fn record(path: Option<&Path>, entry: Option<JournalEntry>) -> crate::Result<()> {
    let (Some(path), Some(entry)) = (path, entry) else {
        return Ok(());
    };
    Journal::at(path).append(&entry).map_err(|error| {
        crate::LedgerError::Unavailable(format!(
            "the erasure journal {} could not be written ({error}); nothing was changed",
            path.display()
        ))
    })
}

/// One append at a time in this process, whichever [`Journal`] value makes it.
static WRITING: Mutex<()> = Mutex::new(());

/// The journal file.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
}

impl Journal {
    /// The journal at `path` (created with its directory on the first append).
    pub fn at(path: impl Into<PathBuf>) -> Journal {
        Journal { path: path.into() }
    }

    /// The journal's default place beside a ledger file or in a data directory.
    pub fn beside(directory: &Path) -> PathBuf {
        directory.join("journal").join("erasures.jsonl")
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `entry` and returns once it is on disk.
    pub fn append(&self, entry: &JournalEntry) -> std::io::Result<()> {
        let _writing = WRITING
            .lock()
            .map_err(|_| std::io::Error::other("the journal lock is poisoned"))?;
        let mut line = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let directory = self.path.parent().unwrap_or_else(|| Path::new("."));
        let created = !self.path.exists();
        std::fs::create_dir_all(directory)?;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        file.write_all(&line)?;
        file.sync_all()?;
        if created {
            std::fs::File::open(directory)?.sync_all()?;
        }
        Ok(())
    }

    /// Every whole entry of the journal at `path`, oldest first (`None`: there is no journal).
    pub fn read(path: &Path) -> std::io::Result<Option<Vec<JournalEntry>>> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        let mut entries = Vec::new();
        let lines: Vec<&str> = text.split('\n').collect();
        for (index, line) in lines.iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str(line) {
                Ok(entry) => entries.push(entry),
                // Only the last line may be torn by a crash mid-append.
                Err(_) if index + 1 == lines.len() => {}
                Err(error) => {
                    return Err(std::io::Error::other(format!(
                        "{} line {}: {error}",
                        path.display(),
                        index + 1
                    )))
                }
            }
        }
        Ok(Some(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_appended_and_read_back_and_a_torn_tail_is_ignored() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = Journal::beside(directory.path());
        assert_eq!(Journal::read(&path).expect("read"), None);
        let journal = Journal::at(&path);
        let erase = JournalEntry {
            at: 1,
            kind: JournalKind::Erase,
            dataset: Some("docs".into()),
            source_key: Some("a.md".into()),
            token_id: None,
            actor: "token:admin".into(),
            reason: "legal request".into(),
        };
        let revoke = JournalEntry {
            at: 2,
            kind: JournalKind::Revoke,
            dataset: None,
            source_key: None,
            token_id: Some(Uuid::nil()),
            actor: "token:admin".into(),
            reason: "leaked".into(),
        };
        journal.append(&erase).expect("append");
        journal.append(&revoke).expect("append");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        file.write_all(b"{\"at\": 3, \"ki").expect("torn write");
        assert_eq!(
            Journal::read(&path).expect("read"),
            Some(vec![erase, revoke])
        );
    }
}
