//! The erasure journal: erasures, token revocations and access changes, also written outside
//! the ledger, so that a restore from a backup taken before them makes them again instead of
//! bringing the erased content, the revoked token or a revoked reader back to life.
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
//! - Access changes come many at a time (a connector's run, a bulk change): a
//!   [`JournalWriter`] appends the entries that arrive together with one `fsync`, and answers
//!   each caller once its line is on disk.

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
    /// A source's readers or a dataset's default changed.
    Access,
}

/// What an access change set, as journalled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JournalAccess {
    /// A source's readers; `None`: back to its dataset's default.
    Readers(Option<Vec<String>>),
    /// A dataset's default.
    Default(crate::access::DefaultAccess),
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
    /// What an access change set (the source is `dataset` and `source_key`; a dataset's
    /// default names no key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<JournalAccess>,
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
            access: None,
            actor: request.actor.clone(),
            reason: request.reason.clone(),
        }
    }

    /// The entry of an access change.
    pub fn access(change: &crate::access::AccessChange, at: i64) -> JournalEntry {
        use crate::access::AccessChange;
        let (dataset, source_key, access, actor, reason) = match change {
            AccessChange::Source {
                dataset,
                source_key,
                readers,
                actor,
                reason,
            } => (
                dataset,
                Some(source_key.clone()),
                JournalAccess::Readers(readers.clone()),
                actor,
                reason,
            ),
            AccessChange::Dataset {
                dataset,
                default,
                actor,
                reason,
            } => (
                dataset,
                None,
                JournalAccess::Default(*default),
                actor,
                reason,
            ),
        };
        JournalEntry {
            at,
            kind: JournalKind::Access,
            dataset: Some(dataset.clone()),
            source_key,
            token_id: None,
            access: Some(access),
            actor: actor.clone(),
            reason: reason.clone(),
        }
    }

    /// The access change an entry records, made again by `actor` with `note` added to its
    /// reason; `None` for another kind of entry, or one missing its parts.
    pub fn access_change(&self, note: &str) -> Option<crate::access::AccessChange> {
        use crate::access::AccessChange;
        let dataset = self.dataset.clone()?;
        let reason = format!("{} ({note})", self.reason);
        match (&self.access, &self.source_key) {
            (Some(JournalAccess::Readers(readers)), Some(source_key)) => {
                Some(AccessChange::Source {
                    dataset,
                    source_key: source_key.clone(),
                    readers: readers.clone(),
                    actor: self.actor.clone(),
                    reason,
                })
            }
            (Some(JournalAccess::Default(default)), None) => Some(AccessChange::Dataset {
                dataset,
                default: *default,
                actor: self.actor.clone(),
                reason,
            }),
            _ => None,
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
            access: None,
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

/// An entry waiting for its line to reach the disk, with where to answer.
type Pending = (
    JournalEntry,
    tokio::sync::oneshot::Sender<std::result::Result<(), String>>,
);

/// Most entries one `fsync` covers.
const MAX_GROUP: usize = 4096;

/// Appends entries to one journal from a thread of its own, every entry that arrived while
/// the last group was written going out together with one `fsync`. Stops when the last
/// handle to it is dropped.
#[derive(Debug)]
pub(crate) struct JournalWriter {
    path: PathBuf,
    sender: Mutex<std::sync::mpsc::Sender<Pending>>,
}

impl JournalWriter {
    /// A writer of the journal at `path`.
    pub(crate) fn start(path: PathBuf) -> std::io::Result<JournalWriter> {
        let (sender, receiver) = std::sync::mpsc::channel::<Pending>();
        let journal = Journal::at(path.clone());
        std::thread::Builder::new()
            .name("cairn-journal".to_owned())
            .spawn(move || {
                while let Ok(first) = receiver.recv() {
                    let mut group = vec![first];
                    while group.len() < MAX_GROUP {
                        match receiver.try_recv() {
                            Ok(next) => group.push(next),
                            Err(_) => break,
                        }
                    }
                    let (entries, replies): (Vec<JournalEntry>, Vec<_>) = group.into_iter().unzip();
                    let written = journal
                        .append_all(&entries)
                        .map_err(|error| error.to_string());
                    for reply in replies {
                        let _ = reply.send(written.clone());
                    }
                }
            })?;
        Ok(JournalWriter {
            path,
            sender: Mutex::new(sender),
        })
    }

    /// The writer of a ledger's journal, if it keeps one, as a ledger error.
    pub(crate) fn for_ledger(path: Option<&Path>) -> crate::Result<Option<std::sync::Arc<Self>>> {
        path.map(|path| {
            JournalWriter::start(path.to_path_buf())
                .map(std::sync::Arc::new)
                .map_err(|error| {
                    crate::LedgerError::Unavailable(format!(
                        "starting the journal's writer: {error}"
                    ))
                })
        })
        .transpose()
    }

    /// Appends `entry` and returns once it is on disk, as a ledger error.
    pub(crate) async fn append(&self, entry: JournalEntry) -> crate::Result<()> {
        let failed = |error: String| {
            crate::LedgerError::Unavailable(format!(
                "the erasure journal {} could not be written ({error}); nothing was changed",
                self.path.display()
            ))
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.sender
            .lock()
            .map_err(|_| failed("its writer's lock is poisoned".to_owned()))?
            .send((entry, reply))
            .map_err(|_| failed("its writer stopped".to_owned()))?;
        answer
            .await
            .map_err(|_| failed("its writer stopped".to_owned()))?
            .map_err(failed)
    }
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
        self.append_all(std::slice::from_ref(entry))
    }

    /// Appends `entries` in order, with one `fsync`, and returns once they are on disk.
    pub fn append_all(&self, entries: &[JournalEntry]) -> std::io::Result<()> {
        let _writing = WRITING
            .lock()
            .map_err(|_| std::io::Error::other("the journal lock is poisoned"))?;
        let mut line = Vec::new();
        for entry in entries {
            serde_json::to_writer(&mut line, entry).map_err(std::io::Error::other)?;
            line.push(b'\n');
        }
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
            access: None,
            actor: "token:admin".into(),
            reason: "legal request".into(),
        };
        let revoke = JournalEntry {
            at: 2,
            kind: JournalKind::Revoke,
            dataset: None,
            source_key: None,
            token_id: Some(Uuid::nil()),
            access: None,
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn access_changes_are_grouped_and_made_again_from_their_lines() {
        use crate::access::{AccessChange, DefaultAccess};
        let directory = tempfile::tempdir().expect("tempdir");
        let path = Journal::beside(directory.path());
        let writer = std::sync::Arc::new(JournalWriter::start(path.clone()).expect("writer"));
        let changes: Vec<AccessChange> = (0..200)
            .map(|n| AccessChange::Source {
                dataset: "docs".into(),
                source_key: format!("k{n}"),
                readers: (n % 3 != 0).then(|| vec![format!("user:u{n}")]),
                actor: "token:t".into(),
                reason: "why".into(),
            })
            .chain([AccessChange::Dataset {
                dataset: "docs".into(),
                default: DefaultAccess::Nobody,
                actor: "config".into(),
                reason: "closed".into(),
            }])
            .collect();
        let mut tasks = Vec::new();
        for (at, change) in changes.iter().enumerate() {
            let writer = writer.clone();
            let entry = JournalEntry::access(change, at as i64);
            tasks.push(tokio::spawn(async move { writer.append(entry).await }));
        }
        for task in tasks {
            task.await.expect("task").expect("appended");
        }
        let mut read = Journal::read(&path).expect("read").expect("a journal");
        assert_eq!(read.len(), changes.len());
        read.sort_by_key(|entry| entry.at);
        for (entry, change) in read.iter().zip(&changes) {
            let again = entry.access_change("replayed").expect("an access change");
            let expected = match change.clone() {
                AccessChange::Source {
                    dataset,
                    source_key,
                    readers,
                    actor,
                    ..
                } => AccessChange::Source {
                    dataset,
                    source_key,
                    readers,
                    actor,
                    reason: "why (replayed)".into(),
                },
                AccessChange::Dataset {
                    dataset,
                    default,
                    actor,
                    ..
                } => AccessChange::Dataset {
                    dataset,
                    default,
                    actor,
                    reason: "closed (replayed)".into(),
                },
            };
            assert_eq!(again, expected);
        }
    }
}
