//! Connectors: a record that keeps a dataset equal to a folder or a git tree, the sources it
//! owns, the index of what its last runs saw, and the report of each run (a `sync` job).

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::jobs::Job;
use crate::clock::Micros;

closed_enum! {
    /// Where a connector reads from.
    ConnectorKind {
        /// A folder on the machine that runs the job.
        Folder => "folder",
        /// A git repository (a path or URL) at a ref.
        Git => "git",
    }
}

closed_enum! {
    /// Where a connector is in its life.
    ConnectorState {
        /// Runs at its interval.
        Active => "active",
        /// Runs nothing until resumed.
        Paused => "paused",
        /// Gone for good: it owns nothing any more; with `tombstone`, one last run deletes
        /// what it created.
        Removed => "removed",
    }
}

closed_enum! {
    /// What removing a connector does with the sources it created.
    Removal {
        /// They stay, as if API ingest had created them.
        Keep => "keep",
        /// A last run tombstones every one of them.
        Tombstone => "tombstone",
    }
}

closed_enum! {
    /// Where a folder connector reads each file's readers from.
    AccessFrom {
        /// The file's owner, group, mode bits and POSIX ACL, mapped through the system's user
        /// and group names.
        Posix => "posix",
    }
}

/// Who may read the sources a connector keeps ([`crate::access`]). Nothing set: the
/// connector never touches access, and its sources follow whatever access changes name (or
/// their dataset's default). Set, each run computes every file's readers and records the
/// ones that changed as access changes: no new revision, nothing embedded again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ConnectorAccess {
    /// Readers of every file that nothing else names (`user:<name>`, `service:<name>`,
    /// `group:<name>`); unset: the dataset's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readers: Option<Vec<String>>,
    /// A folder connector's readers from the file system (`posix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<AccessFrom>,
    /// A git connector's rules file, a path inside the repository read at the run's commit
    /// (docs/operations.md, "Connectors", gives its format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

impl ConnectorAccess {
    /// Whether the connector keeps its sources' readers at all.
    pub fn is_set(&self) -> bool {
        self.readers.is_some() || self.from.is_some() || self.file.is_some()
    }
}

/// A connector as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct Connector {
    /// Connector id (UUID v7).
    pub id: Uuid,
    /// The dataset it keeps.
    pub dataset: String,
    /// Folder or git.
    pub kind: ConnectorKind,
    /// The folder's path, or the repository's path or URL.
    pub location: String,
    /// The git ref (branch, tag or commit); `None` for a folder.
    pub git_ref: Option<String>,
    /// Globs over the key a file must match (empty: every file).
    pub include: Vec<String>,
    /// Globs over the key that leave a file out.
    pub exclude: Vec<String>,
    /// Largest file it reads, in bytes.
    pub max_file_bytes: i64,
    /// Time between the end of a run and the start of the next, in milliseconds.
    pub interval_ms: i64,
    /// Who may read its sources, kept by each run.
    #[serde(default)]
    pub access: ConnectorAccess,
    /// A remote repository's credentials: the name of a file in the workers' credentials
    /// folder (never the secret itself); `None`: the environment's, or none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
    /// Where it is in its life.
    pub state: ConnectorState,
    /// Set once removed: what happened to its sources.
    pub removal: Option<Removal>,
    /// Who created it.
    pub created_by: String,
    /// Why it was created.
    pub reason: String,
    /// When it was created.
    pub created_at: Micros,
    /// Who made the last change.
    pub changed_by: String,
    /// Why (the cause recorded in history).
    pub change_cause: String,
    /// When.
    pub changed_at: Micros,
}

impl Connector {
    /// The owner its sources carry (`connector:<id>`).
    pub fn owner(&self) -> String {
        owner_of(self.id)
    }
}

/// The owner a connector's sources carry: `connector:<id>`.
pub fn owner_of(id: Uuid) -> String {
    format!("connector:{id}")
}

/// What a new connector is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewConnector {
    /// The dataset it keeps.
    pub dataset: String,
    /// Folder or git.
    pub kind: ConnectorKind,
    /// The folder's path, or the repository's path or URL.
    pub location: String,
    /// The git ref (required for git, refused for a folder).
    pub git_ref: Option<String>,
    /// Include globs (empty: every file).
    pub include: Vec<String>,
    /// Exclude globs.
    pub exclude: Vec<String>,
    /// Largest file it reads, in bytes.
    pub max_file_bytes: i64,
    /// Time between runs, in milliseconds (at least 1 s).
    pub interval_ms: i64,
    /// Who may read its sources.
    pub access: ConnectorAccess,
    /// A remote repository's credentials file, by name in the workers' credentials folder.
    pub credentials: Option<String>,
}

/// A change to a connector: the one path for every connector state change.
// A change is made a few times an hour and moved once; boxing `Create` would only add noise
// at every site that builds one.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectorChange {
    /// Records an active connector and queues its first run now.
    Create(NewConnector),
    /// Stops its runs: an open run that has not started is cancelled, a running one is asked
    /// to stop.
    Pause {
        /// The connector.
        id: Uuid,
    },
    /// Makes a paused connector active again and queues a run now.
    Resume {
        /// The connector.
        id: Uuid,
    },
    /// Runs an active connector now: its waiting run becomes due, or a run is queued (a run
    /// already running is the answer).
    RunNow {
        /// The connector.
        id: Uuid,
        /// The push-hook delivery that asks (`<provider>:<delivery id>`): recorded with the
        /// change, and a delivery already recorded is refused (`duplicate_delivery`), so a
        /// replay changes nothing.
        delivery: Option<String>,
    },
    /// Removes a connector for good. Its open run is stopped as by a pause; with
    /// [`Removal::Tombstone`] a last run then tombstones every source it created.
    Remove {
        /// The connector.
        id: Uuid,
        /// What happens to its sources.
        removal: Removal,
    },
}

/// A connector change with its actor and reason (history records both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorCommand {
    /// What to change.
    pub change: ConnectorChange,
    /// Who asks.
    pub actor: String,
    /// Why.
    pub reason: String,
}

/// What a connector change did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct ConnectorChanged {
    /// The connector after the change.
    pub connector: Connector,
    /// Its open run after the change (queued, made due, or the one still running), if any.
    pub run: Option<Job>,
    /// Runs cancelled by the change (pause, remove).
    pub cancelled_runs: i64,
}

/// What a connector's runs last saw of one file: a fingerprint (size and modification time
/// for a folder, the blob id for git) and the SHA-256 of its bytes. A file whose fingerprint
/// is unchanged is never read again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectorFile {
    /// The source key.
    pub source_key: String,
    /// Size and modification time, or the git blob id.
    pub fingerprint: String,
    /// SHA-256 of the bytes, lowercase hex.
    pub sha256: String,
}

/// Most files a report names (skipped, failed and conflicts together); its counts are exact.
pub const MAX_REPORTED_FILES: usize = 100;

/// What happened to one file that a run did not keep in step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct SyncFile {
    /// The path inside the folder or tree.
    pub path: String,
    /// `skipped`, `failed` or `conflict`.
    pub outcome: String,
    /// A stable code (`too_large`, `owned_by_another`, `secret_detected`, ...).
    pub code: String,
    /// The detail.
    pub detail: String,
}

/// The report of one run, written as the run goes and complete at its end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct SyncReport {
    /// Where the run read (a folder's path, or `repository@commit`).
    pub location: String,
    /// The commit a git run read.
    pub commit: Option<String>,
    /// The step it reached: `listing`, `submitting`, `tombstoning`, `done`.
    pub stage: String,
    /// New files accepted.
    pub added: u64,
    /// Changed files accepted.
    pub changed: u64,
    /// Files whose bytes the dataset already held.
    pub unchanged: u64,
    /// Sources tombstoned because their file is gone.
    pub removed: u64,
    /// Files left out (format, size, name, links, globs).
    pub skipped: u64,
    /// Files refused by acceptance (bad content, a credential, ...).
    pub failed: u64,
    /// Files whose key another owner holds: never overwritten.
    pub conflicts: u64,
    /// Files read and hashed (the rest matched the index by fingerprint).
    pub hashed: u64,
    /// Git trees read (a subtree whose id the last run recorded is not).
    #[serde(default)]
    pub trees_read: u64,
    /// Sources whose readers the run changed (counted apart from content changes: an access
    /// change is no new revision).
    #[serde(default)]
    pub access_changed: u64,
    /// A remote repository's fetch: bytes it wrote to the mirror (0 when nothing changed).
    #[serde(default)]
    pub fetched_bytes: u64,
    /// How long the fetch took, in milliseconds (0 for a local repository or a folder).
    #[serde(default)]
    pub fetch_ms: u64,
    /// Up to [`MAX_REPORTED_FILES`] files skipped, failed or in conflict.
    pub files: Vec<SyncFile>,
    /// Files beyond the cap that `files` leaves out.
    pub files_omitted: u64,
    /// How long the run took, in milliseconds (at its last report).
    pub elapsed_ms: u64,
}

impl SyncReport {
    /// Records a file left out, failed or in conflict; past the cap only its count.
    pub fn note(&mut self, path: &str, outcome: &str, code: &str, detail: &str) {
        match outcome {
            "skipped" => self.skipped += 1,
            "conflict" => self.conflicts += 1,
            _ => self.failed += 1,
        }
        if self.files.len() < MAX_REPORTED_FILES {
            self.files.push(SyncFile {
                path: path.to_owned(),
                outcome: outcome.to_owned(),
                code: code.to_owned(),
                detail: detail.to_owned(),
            });
        } else {
            self.files_omitted += 1;
        }
    }
}

/// What a run records as it goes (fenced by its lease): index rows for the files it has
/// accepted or found unchanged, keys it no longer holds, and its report so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncProgress {
    /// Index rows to write (replacing any for the same key).
    pub files: Vec<ConnectorFile>,
    /// Keys to drop from the index (tombstoned, or no longer listed).
    pub forgotten: Vec<String>,
    /// The report so far.
    pub report: SyncReport,
}

/// One run of a connector: its job and its report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct SyncRun {
    /// The `sync` job.
    pub job: Job,
    /// Its report (`None` before it records one).
    pub report: Option<SyncReport>,
}
