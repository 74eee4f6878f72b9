//! The data directory is private to the user cairn runs as: directories 0700, files 0600.
//!
//! The ledger holds every accepted document and the token hashes; the vector store holds
//! embeddings of the same text. [`prepare`] sets the process's umask to 077 before anything is
//! opened, so every file created later (SQLite's `-wal` and `-shm`, new qdrant-edge segments)
//! is private from its first byte, and tightens whatever it finds on disk that is looser,
//! with a warning that names it.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// Paths whose modes were found looser than private and tightened.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tightened {
    /// `(path, mode found)`, in walk order.
    pub paths: Vec<(PathBuf, u32)>,
}

/// Most paths named one by one in the warning.
const NAMED: usize = 5;

/// Makes `dir` (created when missing) and everything under it private, and sets the umask so
/// that files created later are private too.
pub fn prepare(dir: &Path) -> anyhow::Result<Tightened> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating data directory {}", dir.display()))?;
        let mut tightened = Tightened::default();
        for entry in walkdir::WalkDir::new(dir) {
            let entry =
                entry.with_context(|| format!("checking the modes under {}", dir.display()))?;
            if entry.path_is_symlink() {
                continue;
            }
            let metadata = entry
                .metadata()
                .with_context(|| format!("reading the mode of {}", entry.path().display()))?;
            let mode = metadata.permissions().mode() & 0o7777;
            if mode & 0o077 == 0 {
                continue;
            }
            let private = if metadata.is_dir() {
                0o700
            } else {
                mode & 0o700
            };
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(private))
                .with_context(|| {
                    format!(
                        "making {} private (mode {mode:o} found)",
                        entry.path().display()
                    )
                })?;
            tightened.paths.push((entry.path().to_owned(), mode));
        }
        if !tightened.paths.is_empty() {
            let named: Vec<String> = tightened
                .paths
                .iter()
                .take(NAMED)
                .map(|(path, mode)| format!("{} ({mode:o})", path.display()))
                .collect();
            tracing::warn!(
                data_dir = %dir.display(),
                count = tightened.paths.len(),
                examples = %named.join(", "),
                "the data directory held paths readable by other users; made them private \
                 (directories 0700, files 0600)"
            );
        }
        Ok(tightened)
    }
    #[cfg(not(unix))]
    {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating data directory {}", dir.display()))?;
        Ok(Tightened::default())
    }
}

/// The data directory's lock file: every process that uses the directory (`serve`, `worker`)
/// holds it shared while it runs; a restore takes it exclusively, so it never replaces files
/// under a running process.
pub fn lock_path(dir: &Path) -> PathBuf {
    dir.join("cairn.lock")
}

/// Holds the data directory shared for as long as the answer lives.
pub fn hold(dir: &Path) -> anyhow::Result<std::fs::File> {
    lock(dir, false)
}

/// Holds the data directory exclusively (a restore), or says which lock is held.
pub fn hold_exclusively(dir: &Path) -> anyhow::Result<std::fs::File> {
    lock(dir, true)
}

fn lock(dir: &Path, exclusive: bool) -> anyhow::Result<std::fs::File> {
    let path = lock_path(dir);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let locked = if exclusive {
        file.try_lock()
    } else {
        file.try_lock_shared()
    };
    match locked {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) if exclusive => anyhow::bail!(
            "a cairn process (serve or worker) is using {}: stop it before restoring",
            dir.display()
        ),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "the data directory {} is being restored; start cairn again once the restore ends",
            dir.display()
        ),
        Err(std::fs::TryLockError::Error(error)) => {
            Err(error).with_context(|| format!("locking {}", path.display()))
        }
    }
}
