//! A folder as the files a dataset should hold: walked in byte order of names, every file and
//! folder resolved beneath the connector's folder when it is opened, every file left out
//! recorded with its reason.
//!
//! The folder is an open directory ([`crate::confine::Roots::open`]); nothing here takes an
//! absolute path. Files are opened by their key, relative to it, with `RESOLVE_BENEATH`
//! semantics (`cap-std`): a link is followed only while it stays inside the folder, and a link
//! swapped in between the listing and the read is refused at the read. A file with more than
//! one name (a hard link) is not read: its other name may lie outside the folder, and a path
//! cannot tell.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};

use crate::confine::is_escape;
use crate::{media_type_for, Selection, SkipReason};

/// Deepest folder listed (a path that long is refused by the kernel anyway; the bound keeps a
/// folder swapped for a link to its parent, over and over, from walking for ever).
const MAX_DEPTH: usize = 256;

/// A file the dataset should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The source key: the path inside the folder, `/`-separated; the file is read by it.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// Last modification, when the file system keeps it.
    pub modified: Option<SystemTime>,
    /// The media type it is read as.
    pub media_type: &'static str,
    /// Its owner, group, mode and ACL, when the listing was asked for them
    /// ([`list_with_access`]).
    pub posix: Option<crate::access::Posix>,
}

/// A file that is not listed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Its path inside the folder (lossily decoded when it is not UTF-8).
    pub path: String,
    /// Why.
    pub reason: SkipReason,
    /// The detail, for the report.
    pub detail: String,
}

/// A folder's listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// Files to hold, by key in byte order.
    pub entries: Vec<Entry>,
    /// Files left out, by path.
    pub skipped: Vec<Skipped>,
}

/// Why an open file is not read.
#[derive(Debug)]
enum Refusal {
    /// Resolved outside the folder.
    Escapes,
    /// Not a regular file (a folder, a device, a pipe).
    NotAFile { folder: bool },
    /// A file with more than one name.
    HardLink(u64),
    /// Over the size limit.
    TooLarge(u64),
    /// The file system said no.
    Io(std::io::Error),
}

impl Refusal {
    fn skip(self, path: String, limit: u64) -> Skipped {
        let (reason, detail) = match self {
            Refusal::Escapes => (
                SkipReason::LinkLeavesRoot,
                "the link resolves outside the folder, or nowhere".to_owned(),
            ),
            Refusal::NotAFile { folder: true } => (
                SkipReason::LinkToFolder,
                "a link to a folder is not followed".to_owned(),
            ),
            Refusal::NotAFile { folder: false } => (
                SkipReason::UnsupportedFormat,
                "not a regular file".to_owned(),
            ),
            Refusal::HardLink(names) => (
                SkipReason::HardLink,
                format!("the file has {names} names (hard links); one may lie outside the folder"),
            ),
            Refusal::TooLarge(size) => (
                SkipReason::TooLarge,
                format!("{size} bytes, over the limit of {limit}"),
            ),
            Refusal::Io(error) => (SkipReason::Unreadable, error.to_string()),
        };
        Skipped {
            path,
            reason,
            detail,
        }
    }
}

impl From<Refusal> for std::io::Error {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Io(error) => error,
            other => {
                let skipped = other.skip(String::new(), 0);
                std::io::Error::new(std::io::ErrorKind::PermissionDenied, skipped.detail)
            }
        }
    }
}

/// What `relative` names now, links followed beneath `folder`: the path to open (an absolute
/// link inside the folder made relative), refused when it leads out, names nothing, or names
/// a folder or anything but a regular file (opening a pipe would wait for a writer).
fn resolve(folder: &Dir, relative: &Path) -> Result<PathBuf, Refusal> {
    let mut target = relative.to_path_buf();
    let named = match folder.metadata(&target) {
        Ok(metadata) => metadata,
        Err(error) if is_escape(&error) => {
            // An absolute link naming a file inside the folder is read as the relative path
            // it names; that path is resolved beneath the folder again.
            target = absolute_link_inside(folder, relative).ok_or(Refusal::Escapes)?;
            folder.metadata(&target).map_err(|_| Refusal::Escapes)?
        }
        // A link to nowhere reads like one that leaves.
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Err(Refusal::Escapes),
        Err(error) => return Err(Refusal::Io(error)),
    };
    if !named.is_file() {
        return Err(Refusal::NotAFile {
            folder: named.is_dir(),
        });
    }
    Ok(target)
}

/// Opens the file `relative` beneath `folder`, without blocking on a pipe, and checks what it
/// is by the open handle: a regular file with one name, of at most `limit` bytes.
fn open_file(
    folder: &Dir,
    relative: &Path,
    limit: u64,
) -> Result<(std::fs::File, std::fs::Metadata), Refusal> {
    let target = resolve(folder, relative)?;
    let mut options = OpenOptions::new();
    options
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32);
    let file = match folder.open_with(&target, &options) {
        Ok(file) => file.into_std(),
        Err(error) if is_escape(&error) => return Err(Refusal::Escapes),
        Err(error) => return Err(Refusal::Io(error)),
    };
    // What was opened is checked by its handle: whatever the path names by now.
    let metadata = file.metadata().map_err(Refusal::Io)?;
    if !metadata.is_file() {
        return Err(Refusal::NotAFile {
            folder: metadata.is_dir(),
        });
    }
    let names = std::os::unix::fs::MetadataExt::nlink(&metadata);
    if names > 1 {
        return Err(Refusal::HardLink(names));
    }
    if metadata.len() > limit {
        return Err(Refusal::TooLarge(metadata.len()));
    }
    Ok((file, metadata))
}

/// Where an absolute link at `relative` points inside `folder`, as a path relative to it
/// (`None`: not an absolute link, or one that names a place outside the folder). The folder's
/// own path is read from its open handle, so it is where the folder is now.
fn absolute_link_inside(folder: &Dir, relative: &Path) -> Option<PathBuf> {
    let target = folder.read_link_contents(relative).ok()?;
    if !target.is_absolute() {
        return None;
    }
    let fd = std::os::fd::AsRawFd::as_raw_fd(folder);
    let real = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let inside = target.strip_prefix(&real).ok()?;
    let clean = inside
        .components()
        .all(|component| matches!(component, std::path::Component::Normal(_)));
    (clean && !inside.as_os_str().is_empty()).then(|| inside.to_path_buf())
}

/// The bytes of the file `key` of `folder`, resolved beneath it now, of at most `limit` bytes.
pub fn read(folder: &Dir, key: &str, limit: u64) -> std::io::Result<Vec<u8>> {
    let (file, metadata) = open_file(folder, Path::new(key), limit)?;
    let mut bytes = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(Refusal::TooLarge(bytes.len() as u64).into());
    }
    Ok(bytes)
}

/// Whether the first bytes of a file carry its binary format's signature (text formats: yes).
pub(crate) fn admit_head(head: &[u8], media_type: &str) -> Result<(), String> {
    let format = extract::Format::of(media_type);
    if !format.binary() {
        return Ok(());
    }
    let head = &head[..head.len().min(1024)];
    match format.admit(head) {
        Ok(()) => Ok(()),
        // A size refusal of the first KiB says nothing about the file.
        Err(error) if error.code == "document_too_large" => Ok(()),
        Err(error) => Err(error.message),
    }
}

/// Lists `folder` under `selection`. Fails only when the folder itself cannot be read; a
/// subfolder that cannot is skipped with its reason.
pub fn list(folder: &Dir, selection: &Selection) -> std::io::Result<Listing> {
    list_with_access(folder, selection, false)
}

/// [`list`], reading each file's owner, group, mode and access ACL as well when `posix` is
/// set (from the open file, so they belong to the file that is listed). A file whose ACL
/// cannot be read is skipped as unreadable: its readers would be a guess.
pub fn list_with_access(
    folder: &Dir,
    selection: &Selection,
    posix: bool,
) -> std::io::Result<Listing> {
    let mut listing = Listing::default();
    let top = folder.entries()?;
    let walker = Walker { selection, posix };
    walker.walk(folder, top, Path::new(""), 0, &mut listing);
    listing.entries.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(listing)
}

/// A file's owner, group, mode and access ACL, read from its open handle.
fn posix_of(
    file: &std::fs::File,
    metadata: &std::fs::Metadata,
) -> std::io::Result<crate::access::Posix> {
    use std::os::unix::fs::MetadataExt;
    let mut buffer = vec![0u8; 4 + 8 * 64];
    let acl = loop {
        match rustix::fs::fgetxattr(file, "system.posix_acl_access", &mut buffer) {
            Ok(length) => {
                break crate::access::parse_acl(&buffer[..length])
                    .map_err(|message| std::io::Error::other(format!("its ACL: {message}")))?
            }
            Err(rustix::io::Errno::NODATA | rustix::io::Errno::NOTSUP) => break Vec::new(),
            Err(rustix::io::Errno::RANGE) if buffer.len() < 1 << 20 => {
                buffer.resize(buffer.len() * 8, 0)
            }
            Err(error) => return Err(error.into()),
        }
    };
    Ok(crate::access::Posix {
        uid: metadata.uid(),
        gid: metadata.gid(),
        mode: metadata.mode() & 0o7777,
        acl,
    })
}

/// What a listing reads.
struct Walker<'a> {
    selection: &'a Selection,
    /// Whether each file's owner, group, mode and ACL are read.
    posix: bool,
}

impl Walker<'_> {
    fn walk(
        &self,
        folder: &Dir,
        entries: cap_std::fs::ReadDir,
        at: &Path,
        depth: usize,
        listing: &mut Listing,
    ) {
        let selection = self.selection;
        let mut names = Vec::new();
        for entry in entries {
            match entry.and_then(|entry| Ok((entry.file_name(), entry.file_type()?))) {
                Ok(named) => names.push(named),
                Err(error) => listing.skipped.push(Skipped {
                    path: at.to_string_lossy().into_owned(),
                    reason: SkipReason::Unreadable,
                    detail: error.to_string(),
                }),
            }
        }
        names.sort_by(|a, b| {
            std::os::unix::ffi::OsStrExt::as_bytes(a.0.as_os_str())
                .cmp(std::os::unix::ffi::OsStrExt::as_bytes(b.0.as_os_str()))
        });
        for (name, file_type) in names {
            let relative: PathBuf = at.join(&name);
            let shown = relative.to_string_lossy().into_owned();
            let skip = |reason, detail: String| Skipped {
                path: shown.clone(),
                reason,
                detail,
            };
            // The key: every component UTF-8. A folder whose name is not is not descended.
            let parts: Option<Vec<&str>> = relative
                .components()
                .map(|c| c.as_os_str().to_str())
                .collect();
            let Some(parts) = parts else {
                listing.skipped.push(skip(
                    SkipReason::InvalidName,
                    "the name is not valid UTF-8".to_owned(),
                ));
                continue;
            };
            if file_type.is_dir() {
                if depth + 1 >= MAX_DEPTH {
                    listing.skipped.push(skip(
                        SkipReason::Unreadable,
                        format!("deeper than {MAX_DEPTH} folders"),
                    ));
                    continue;
                }
                // Opened beneath the folder now: a folder swapped for a link out is refused here.
                match folder.read_dir(&relative) {
                    Ok(inner) => self.walk(folder, inner, &relative, depth + 1, listing),
                    Err(error) if is_escape(&error) => listing.skipped.push(skip(
                        SkipReason::LinkLeavesRoot,
                        "the folder resolves outside the connector's folder now".to_owned(),
                    )),
                    Err(error) => listing
                        .skipped
                        .push(skip(SkipReason::Unreadable, error.to_string())),
                }
                continue;
            }
            if !file_type.is_file() && !file_type.is_symlink() {
                listing.skipped.push(skip(
                    SkipReason::UnsupportedFormat,
                    "not a regular file".to_owned(),
                ));
                continue;
            }
            // A link is judged by where it leads before its name: out, nowhere, or to a folder.
            if file_type.is_symlink() {
                if let Err(refusal) = resolve(folder, &relative) {
                    listing
                        .skipped
                        .push(refusal.skip(shown.clone(), selection.max_file_bytes));
                    continue;
                }
            }
            let key = parts.join("/");
            if let Err(error) = receipts::validate::source_key(&key) {
                listing
                    .skipped
                    .push(skip(SkipReason::InvalidName, error.to_string()));
                continue;
            }
            if !selection.selects(&key) {
                listing.skipped.push(skip(
                    SkipReason::Excluded,
                    "left out by the include and exclude globs".to_owned(),
                ));
                continue;
            }
            let Some(media_type) = media_type_for(&key) else {
                listing.skipped.push(skip(
                    SkipReason::UnsupportedFormat,
                    "cairn reads Markdown, HTML, text, PDF and DOCX; not this name".to_owned(),
                ));
                continue;
            };
            // A link is followed only to a file inside the folder: the open decides.
            let (file, metadata) = match open_file(folder, &relative, selection.max_file_bytes) {
                Ok(opened) => opened,
                Err(refusal) => {
                    listing
                        .skipped
                        .push(refusal.skip(shown.clone(), selection.max_file_bytes));
                    continue;
                }
            };
            if extract::Format::of(media_type).binary() {
                let mut head = Vec::with_capacity(1024);
                let read = (&file).take(1024).read_to_end(&mut head);
                let admitted = read
                    .map_err(|error| format!("cannot read it: {error}"))
                    .and_then(|_| admit_head(&head, media_type));
                if let Err(detail) = admitted {
                    listing
                        .skipped
                        .push(skip(SkipReason::UnsupportedFormat, detail));
                    continue;
                }
            }
            let posix = if self.posix {
                match posix_of(&file, &metadata) {
                    Ok(posix) => Some(posix),
                    Err(error) => {
                        listing.skipped.push(skip(
                            SkipReason::Unreadable,
                            format!("its owner and ACL cannot be read: {error}"),
                        ));
                        continue;
                    }
                }
            } else {
                None
            };
            listing.entries.push(Entry {
                key,
                size: metadata.len(),
                modified: metadata.modified().ok(),
                media_type,
                posix,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &Path) -> Dir {
        Dir::open_ambient_dir(path, cap_std::ambient_authority()).expect("open")
    }

    fn reasons(listing: &Listing) -> Vec<(&str, &str)> {
        listing
            .skipped
            .iter()
            .map(|skipped| (skipped.path.as_str(), skipped.reason.as_str()))
            .collect()
    }

    #[test]
    fn a_folder_lists_what_cairn_reads_and_names_what_it_leaves_out() {
        let root = tempfile::tempdir().expect("root");
        let outside = tempfile::tempdir().expect("outside");
        let write = |path: &str, bytes: &[u8]| {
            let path = root.path().join(path);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
            std::fs::write(path, bytes).expect("write");
        };
        write("a.md", b"# A");
        write("docs/b.txt", b"bee");
        write("docs/drafts/c.md", b"draft");
        write("big.md", &[b'x'; 200]);
        write("fake.pdf", b"not a pdf at all");
        write("photo.png", b"\x89PNG");
        std::fs::write(outside.path().join("secret.md"), b"outside").expect("outside");
        std::os::unix::fs::symlink(
            outside.path().join("secret.md"),
            root.path().join("leak.md"),
        )
        .expect("link out");
        std::os::unix::fs::symlink(root.path().join("a.md"), root.path().join("alias.md"))
            .expect("link in");
        std::os::unix::fs::symlink(root.path().join("docs"), root.path().join("docs-link"))
            .expect("link to folder");
        std::os::unix::fs::symlink("/proc/self/root/etc/hostname", root.path().join("proc.txt"))
            .expect("link through /proc");
        std::fs::write(outside.path().join("hard.md"), b"outside").expect("outside");
        let hard = std::fs::hard_link(outside.path().join("hard.md"), root.path().join("hard.md"));
        let selection = Selection::new(&[], &["**/drafts/**".to_owned()], 100).expect("selection");
        let listing = list(&open(root.path()), &selection).expect("list");
        let keys: Vec<&str> = listing.entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["a.md", "alias.md", "docs/b.txt"]);
        assert_eq!(listing.entries[0].media_type, "text/markdown");
        assert_eq!(listing.entries[0].size, 3);
        assert_eq!(
            read(&open(root.path()), "alias.md", 100).expect("read"),
            b"# A",
            "a link inside the root reads its target"
        );
        let mut skipped = reasons(&listing);
        skipped.sort_unstable();
        let mut expected = vec![
            ("big.md", "too_large"),
            ("docs-link", "link_to_folder"),
            ("docs/drafts/c.md", "excluded"),
            ("fake.pdf", "unsupported_format"),
            ("leak.md", "link_leaves_root"),
            ("photo.png", "unsupported_format"),
            ("proc.txt", "link_leaves_root"),
        ];
        // Temporary folders share a file system here; where they do not, no hard link exists.
        if hard.is_ok() {
            expected.push(("hard.md", "hard_link"));
            expected.sort_unstable();
        }
        assert_eq!(skipped, expected);
        for refused in ["leak.md", "proc.txt", "big.md", "docs-link"] {
            assert!(
                read(&open(root.path()), refused, 100).is_err(),
                "{refused} is refused at the read too"
            );
        }
    }

    #[test]
    fn names_that_are_not_utf8_are_refused() {
        use std::os::unix::ffi::OsStrExt;
        let root = tempfile::tempdir().expect("root");
        let name = std::ffi::OsStr::from_bytes(b"bad\xff.md");
        std::fs::write(root.path().join(name), b"x").expect("write");
        std::fs::write(root.path().join("good.md"), b"x").expect("write");
        let listing = list(&open(root.path()), &Selection::default()).expect("list");
        assert_eq!(listing.entries.len(), 1);
        assert_eq!(listing.skipped.len(), 1);
        assert_eq!(listing.skipped[0].reason, SkipReason::InvalidName);
    }
}
