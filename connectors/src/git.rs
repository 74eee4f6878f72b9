//! A git tree as the files a dataset should hold, read from the repository's object database
//! through `gix` (no work tree, no `git` binary): the ref resolved to a commit, its tree walked
//! in byte order of names, and every subtree whose id the last complete run recorded taken
//! from that record without reading it.
//!
//! ## Invariants
//! - A key is the path in the tree, `/`-separated, valid UTF-8 and a valid source key; a name
//!   that is not is refused, never rewritten.
//! - A repository is opened only inside the configured roots, with every indirection (a
//!   `.git` file, `commondir`, alternates, links in the git folder) checked to stay inside
//!   them ([`open`]).
//! - Links are never followed (a link's target is outside the object database's guarantees),
//!   submodules are not read; both are skipped with their reason, like files over the size
//!   limit and formats cairn does not read.
//! - An unchanged subtree (same id as recorded) is not read: its files are the recorded ones.
//!   A tree id names its whole content, so this is exact, and a force-push or a rewound ref is
//!   compared like any other tree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gix::ObjectId;

use crate::confine::{Confinement, Roots};
use crate::{media_type_for, Selection, SkipReason};

/// A file of the tree the dataset should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The source key: the path in the tree.
    pub key: String,
    /// The blob's id.
    pub blob: ObjectId,
    /// The media type it is read as.
    pub media_type: &'static str,
    /// The SHA-256 of its bytes, when the record vouches for it (the blob is then not read).
    pub sha256: Option<String>,
    /// Its size in bytes, when it was looked up (every blob the record does not vouch for).
    pub size: Option<u64>,
}

/// A file left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Its path in the tree (lossily decoded when it is not UTF-8).
    pub path: String,
    /// Why.
    pub reason: SkipReason,
    /// The detail.
    pub detail: String,
}

/// What the last complete run recorded: each file's blob id and SHA-256, each folder's tree id.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    /// By key: the blob id and the SHA-256 of its bytes.
    pub files: BTreeMap<String, (String, String)>,
    /// By folder (`""` for the root, else `dir/sub`): the tree id.
    pub trees: BTreeMap<String, String>,
}

/// The tree at a ref.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// The commit the ref resolved to.
    pub commit: String,
    /// When it was committed (seconds since the epoch).
    pub commit_time: i64,
    /// Its author, as `name <email>`.
    pub author: String,
    /// Files to hold, by key.
    pub entries: Vec<Entry>,
    /// Files left out, by path.
    pub skipped: Vec<Skipped>,
    /// Every folder's tree id (`""` for the root), for the next run's record.
    pub trees: BTreeMap<String, String>,
    /// Trees read from the object database (unchanged ones are not).
    pub trees_read: u64,
}

/// Why a repository could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// The repository cannot be opened (missing, not a repository, unreadable).
    #[error("the repository at {location} cannot be opened: {message}")]
    Unavailable {
        /// The location.
        location: String,
        /// What went wrong.
        message: String,
    },
    /// The ref does not name a commit.
    #[error("`{reference}` names no commit in {location}: {message}")]
    UnknownRef {
        /// The location.
        location: String,
        /// The ref.
        reference: String,
        /// What went wrong.
        message: String,
    },
    /// The repository, or a place it reads from, lies outside the configured roots.
    #[error("the repository at {location} is refused: {message}")]
    Refused {
        /// The location.
        location: String,
        /// What leads outside.
        message: String,
    },
    /// An object the tree names cannot be read (a corrupt or incomplete repository).
    #[error("reading the repository failed: {0}")]
    Read(String),
}

fn read_error(error: impl std::fmt::Display) -> GitError {
    GitError::Read(error.to_string())
}

/// The largest `.git` file read (it holds one line: `gitdir: <path>`).
const MAX_GIT_FILE_BYTES: u64 = 4096;

/// Deepest folder of a git folder searched for links.
const MAX_LINK_SCAN_DEPTH: usize = 16;

fn refused(location: &str, what: String) -> GitError {
    GitError::Refused {
        location: location.to_owned(),
        message: what,
    }
}

/// Where a work tree's `.git` file points, when `location` has one (`None`: a `.git` folder,
/// a link, or a bare repository).
fn gitdir_file(folder: &cap_std::fs::Dir, location: &str) -> Result<Option<PathBuf>, GitError> {
    let Ok(metadata) = folder.symlink_metadata(".git") else {
        return Ok(None);
    };
    if !metadata.is_file() {
        return Ok(None);
    }
    let text = crate::folder::read(folder, ".git", MAX_GIT_FILE_BYTES).map_err(|error| {
        GitError::Unavailable {
            location: location.to_owned(),
            message: format!("its .git file cannot be read: {error}"),
        }
    })?;
    let text = String::from_utf8_lossy(&text);
    let target = text
        .lines()
        .find_map(|line| line.strip_prefix("gitdir:"))
        .map(str::trim)
        .filter(|target| !target.is_empty())
        .ok_or_else(|| GitError::Unavailable {
            location: location.to_owned(),
            message: "its .git file names no `gitdir:`".to_owned(),
        })?;
    Ok(Some(Path::new(location).join(target)))
}

/// The first link under `folder` (a path on this machine) whose target lies outside the
/// roots, or that cannot be resolved. A git folder holds no links of its own making.
fn link_out(roots: &Roots, folder: &Path, depth: usize) -> Option<PathBuf> {
    let entries = std::fs::read_dir(folder).ok()?;
    for entry in entries.flatten() {
        let Ok(file_type) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        if file_type.is_symlink() {
            if !roots.contains_real(&path) {
                return Some(path);
            }
        } else if file_type.is_dir() && depth < MAX_LINK_SCAN_DEPTH {
            if let Some(found) = link_out(roots, &path, depth + 1) {
                return Some(found);
            }
        }
    }
    None
}

/// Opens the repository at `location` (a bare repository, a `.git` folder or a work tree's)
/// inside `roots`, and refuses it when any place its objects, refs or configuration come from
/// lies outside them:
/// - `location` itself is opened beneath its root ([`Roots::open`]);
/// - a work tree's `.git` file must point inside a root (`gitdir:`), as must a `.git` link;
/// - `gix` opens it with [`gix::open::Options::isolated`]: no environment variables (so no
///   `GIT_DIR`, `GIT_OBJECT_DIRECTORY` or `GIT_ALTERNATE_OBJECT_DIRECTORIES`), no system,
///   global or user configuration, and no `include.path` of the repository's configuration;
/// - after opening, the git folder, the common folder (`commondir`), the object folder and
///   every alternate object store `gix` would read (`objects/info/alternates`, followed
///   transitively) must lie inside a root, and no link inside the git folder may lead out.
///
/// `gix` has no option that stops it from following `commondir` or alternates, so they are
/// checked before any object is read.
pub fn open(roots: &Roots, location: &str) -> Result<gix::ThreadSafeRepository, GitError> {
    let folder = roots.open(location).map_err(|error| match error {
        Confinement::Refused(message) => refused(location, message),
        Confinement::Unavailable(message) => GitError::Unavailable {
            location: location.to_owned(),
            message,
        },
    })?;
    if let Some(target) = gitdir_file(&folder, location)? {
        if !roots.contains_real(&target) {
            return Err(refused(
                location,
                format!(
                    "its .git file points to {}, outside the configured roots",
                    target.display()
                ),
            ));
        }
    }
    let repository = gix::open_opts(location, gix::open::Options::isolated()).map_err(|error| {
        GitError::Unavailable {
            location: location.to_owned(),
            message: error.to_string(),
        }
    })?;
    let git_dir = repository.git_dir().to_path_buf();
    let common_dir = repository.common_dir().to_path_buf();
    let objects = repository.objects.store_ref().path().to_path_buf();
    for (what, path) in [
        ("its git folder", &git_dir),
        ("its common folder (commondir)", &common_dir),
        ("its object folder", &objects),
    ] {
        if !roots.contains_real(path) {
            return Err(refused(
                location,
                format!(
                    "{what} {} lies outside the configured roots",
                    path.display()
                ),
            ));
        }
    }
    let alternates = repository
        .objects
        .store_ref()
        .alternate_db_paths()
        .map_err(|error| GitError::Unavailable {
            location: location.to_owned(),
            message: format!("its alternates cannot be read: {error}"),
        })?;
    if let Some(alternate) = alternates.iter().find(|path| !roots.contains_real(path)) {
        return Err(refused(
            location,
            format!(
                "an alternate object store ({}) lies outside the configured roots",
                alternate.display()
            ),
        ));
    }
    for folder in [&git_dir, &common_dir] {
        if let Some(link) = link_out(roots, folder, 0) {
            return Err(refused(
                location,
                format!(
                    "{} is a link that leads outside the configured roots",
                    link.display()
                ),
            ));
        }
    }
    Ok(repository.into_sync())
}

/// The commit `reference` (a branch, a tag, a full ref name or a full commit id) resolves to.
fn resolve(
    repository: &gix::Repository,
    location: &str,
    reference: &str,
) -> Result<ObjectId, GitError> {
    let unknown = |message: String| GitError::UnknownRef {
        location: location.to_owned(),
        reference: reference.to_owned(),
        message,
    };
    let id = match ObjectId::from_hex(reference.as_bytes()) {
        Ok(id) => id,
        Err(_) => repository
            .find_reference(reference)
            .map_err(|error| unknown(error.to_string()))?
            .into_fully_peeled_id()
            .map_err(|error| unknown(error.to_string()))?
            .detach(),
    };
    let commit = repository
        .find_object(id)
        .map_err(|error| unknown(error.to_string()))?
        .peel_to_commit()
        .map_err(|error| unknown(error.to_string()))?;
    Ok(commit.id)
}

/// Lists the tree of the commit `reference` names, under `selection`, taking unchanged
/// subtrees from `recorded`.
pub fn list(
    repository: &gix::ThreadSafeRepository,
    location: &str,
    reference: &str,
    selection: &Selection,
    recorded: &Recorded,
) -> Result<Listing, GitError> {
    let repository = repository.to_thread_local();
    let commit_id = resolve(&repository, location, reference)?;
    let commit = repository.find_commit(commit_id).map_err(read_error)?;
    let tree = commit.tree_id().map_err(read_error)?.detach();
    let author = commit.author().map_err(read_error)?;
    let mut listing = Listing {
        commit: commit_id.to_string(),
        commit_time: commit.time().map_err(read_error)?.seconds,
        author: format!("{} <{}>", author.name, author.email),
        ..Listing::default()
    };
    walk(&repository, tree, "", selection, recorded, &mut listing)?;
    listing.entries.sort_by(|a, b| a.key.cmp(&b.key));
    listing.skipped.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(listing)
}

/// Walks the tree `id` at `folder` (`""` for the root).
fn walk(
    repository: &gix::Repository,
    id: ObjectId,
    folder: &str,
    selection: &Selection,
    recorded: &Recorded,
    listing: &mut Listing,
) -> Result<(), GitError> {
    let hex = id.to_string();
    listing.trees.insert(folder.to_owned(), hex.clone());
    if recorded.trees.get(folder) == Some(&hex) {
        // The same tree as last time: the same files, none of them read.
        let prefix = if folder.is_empty() {
            String::new()
        } else {
            format!("{folder}/")
        };
        for (key, (blob, sha256)) in recorded.files.range(prefix.clone()..) {
            if !key.starts_with(&prefix) {
                break;
            }
            let (Ok(blob), Some(media_type)) =
                (ObjectId::from_hex(blob.as_bytes()), media_type_for(key))
            else {
                continue;
            };
            listing.entries.push(Entry {
                key: key.clone(),
                blob,
                media_type,
                sha256: Some(sha256.clone()),
                size: None,
            });
        }
        if !folder.is_empty() || !recorded.trees.is_empty() {
            for (path, tree) in recorded.trees.range(prefix.clone()..) {
                if !path.starts_with(&prefix) {
                    break;
                }
                listing.trees.insert(path.clone(), tree.clone());
            }
        }
        return Ok(());
    }
    listing.trees_read += 1;
    let tree = repository.find_tree(id).map_err(read_error)?;
    let mut subtrees = Vec::new();
    for entry in tree.iter() {
        let entry = entry.map_err(read_error)?;
        let name = entry.inner.filename;
        let mode = entry.inner.mode;
        let shown = if folder.is_empty() {
            String::from_utf8_lossy(name).into_owned()
        } else {
            format!("{folder}/{}", String::from_utf8_lossy(name))
        };
        let skip = |reason, detail: &str| Skipped {
            path: shown.clone(),
            reason,
            detail: detail.to_owned(),
        };
        let Ok(name) = std::str::from_utf8(name) else {
            listing
                .skipped
                .push(skip(SkipReason::InvalidName, "the name is not valid UTF-8"));
            continue;
        };
        let key = if folder.is_empty() {
            name.to_owned()
        } else {
            format!("{folder}/{name}")
        };
        if mode.is_tree() {
            subtrees.push((key, entry.inner.oid.to_owned()));
            continue;
        }
        if mode.is_link() {
            listing.skipped.push(skip(
                SkipReason::LinkLeavesRoot,
                "a link in a repository is never followed",
            ));
            continue;
        }
        if mode.is_commit() {
            listing.skipped.push(skip(
                SkipReason::UnsupportedFormat,
                "a submodule is not read",
            ));
            continue;
        }
        if let Err(error) = receipts::validate::source_key(&key) {
            listing
                .skipped
                .push(skip(SkipReason::InvalidName, &error.to_string()));
            continue;
        }
        if !selection.selects(&key) {
            listing.skipped.push(skip(
                SkipReason::Excluded,
                "left out by the include and exclude globs",
            ));
            continue;
        }
        let Some(media_type) = media_type_for(&key) else {
            listing.skipped.push(skip(
                SkipReason::UnsupportedFormat,
                "cairn reads Markdown, HTML, text, PDF and DOCX; not this name",
            ));
            continue;
        };
        let blob = entry.inner.oid.to_owned();
        let sha256 = recorded
            .files
            .get(&key)
            .filter(|(recorded_blob, _)| {
                ObjectId::from_hex(recorded_blob.as_bytes()).is_ok_and(|id| id == blob)
            })
            .map(|(_, sha256)| sha256.clone());
        let mut size = None;
        if sha256.is_none() {
            let bytes = repository.find_header(blob).map_err(read_error)?.size();
            size = Some(bytes);
            if bytes > selection.max_file_bytes {
                listing.skipped.push(skip(
                    SkipReason::TooLarge,
                    &format!(
                        "{bytes} bytes, over the limit of {}",
                        selection.max_file_bytes
                    ),
                ));
                continue;
            }
        }
        listing.entries.push(Entry {
            key,
            blob,
            media_type,
            sha256,
            size,
        });
    }
    for (key, id) in subtrees {
        walk(repository, id, &key, selection, recorded, listing)?;
    }
    Ok(())
}

/// Largest access rules file read, in bytes.
pub const MAX_ACCESS_FILE_BYTES: u64 = 1 << 20;

/// The bytes of the file at `path` in the tree of `commit` (a full commit id), or `None` when
/// the tree holds no file there; refused over `limit` bytes.
pub fn read_path(
    repository: &gix::ThreadSafeRepository,
    commit: &str,
    path: &str,
    limit: u64,
) -> Result<Option<Vec<u8>>, GitError> {
    let repository = repository.to_thread_local();
    let id = ObjectId::from_hex(commit.as_bytes()).map_err(read_error)?;
    let tree = repository
        .find_commit(id)
        .map_err(read_error)?
        .tree()
        .map_err(read_error)?;
    let Some(entry) = tree.lookup_entry_by_path(path).map_err(read_error)? else {
        return Ok(None);
    };
    if !entry.mode().is_blob() {
        return Ok(None);
    }
    let object = repository
        .find_object(entry.object_id())
        .map_err(read_error)?;
    if object.data.len() as u64 > limit {
        return Err(GitError::Read(format!(
            "{path} holds {} bytes, over the limit of {limit}",
            object.data.len()
        )));
    }
    Ok(Some(object.detach().data))
}

/// The bytes of a blob.
pub fn read_blob(
    repository: &gix::ThreadSafeRepository,
    blob: ObjectId,
) -> Result<Vec<u8>, GitError> {
    let repository = repository.to_thread_local();
    let object = repository.find_object(blob).map_err(read_error)?;
    Ok(object.detach().data)
}
