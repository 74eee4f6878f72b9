//! How a SQLite ledger is opened: its file, backends, group size and job policies.

use std::path::PathBuf;
use std::time::Duration;

use crate::model::Backend;
use crate::policy;

/// How to open a SQLite ledger.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// The database file (created with its directory when missing).
    pub path: PathBuf,
    /// Backends that get a projection receipt per job.
    pub backends: Vec<Backend>,
    /// Most submissions committed in one transaction.
    pub max_group: usize,
    /// Connections in the read pool.
    pub read_connections: u32,
    /// How long a statement waits for another process's write lock.
    pub busy_timeout: Duration,
    /// Lease, retry and quarantine policy of each job kind.
    pub job_policies: crate::policy::JobPolicies,
    /// The erasure journal ([`crate::journal`]): beside the database by default.
    pub journal: Option<PathBuf>,
}

impl SqliteOptions {
    /// Defaults for a database at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path: PathBuf = path.into();
        let journal = crate::journal::Journal::beside(
            path.parent().unwrap_or_else(|| std::path::Path::new(".")),
        );
        Self {
            journal: Some(journal),
            path,
            backends: policy::DEFAULT_BACKENDS.to_vec(),
            max_group: policy::DEFAULT_MAX_GROUP,
            read_connections: 4,
            busy_timeout: Duration::from_secs(10),
            job_policies: crate::policy::JobPolicies::default(),
        }
    }
}
