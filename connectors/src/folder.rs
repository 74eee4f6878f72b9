//! A folder as the files a dataset should hold: walked in byte order of names, links resolved
//! only inside the root, every file left out recorded with its reason.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::{media_type_for, Selection, SkipReason};

/// A file the dataset should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The source key: the path inside the root, `/`-separated.
    pub key: String,
    /// Where its bytes are (a link's target inside the root).
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// Last modification, when the file system keeps it.
    pub modified: Option<SystemTime>,
    /// The media type it is read as.
    pub media_type: &'static str,
}

/// A file that is not listed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Its path inside the root (lossily decoded when it is not UTF-8).
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

/// The signature a binary format's bytes must start with.
fn signature_ok(path: &Path, media_type: &str) -> Result<(), String> {
    if !extract::Format::of(media_type).binary() {
        return Ok(());
    }
    let mut head = vec![0u8; 1024];
    let read = std::fs::File::open(path)
        .and_then(|mut file| std::io::Read::read(&mut file, &mut head))
        .map_err(|error| format!("cannot read it: {error}"))?;
    head.truncate(read);
    admit_head(&head, media_type)
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

/// Lists `root` under `selection`.
pub fn list(root: &Path, selection: &Selection) -> std::io::Result<Listing> {
    let root = std::fs::canonicalize(root)?;
    let mut listing = Listing::default();
    let mut walk = walkdir::WalkDir::new(&root)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter();
    let relative = |path: &Path| {
        path.strip_prefix(&root)
            .unwrap_or(path)
            .to_string_lossy()
            .into_owned()
    };
    while let Some(entry) = walk.next() {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                listing.skipped.push(Skipped {
                    path: error.path().map(relative).unwrap_or_default(),
                    reason: SkipReason::Unreadable,
                    detail: error.to_string(),
                });
                continue;
            }
        };
        if entry.depth() == 0 {
            continue;
        }
        let path = entry.path();
        let shown = relative(path);
        let skip = |reason, detail: String| Skipped {
            path: shown.clone(),
            reason,
            detail,
        };
        // The key: every component UTF-8. A folder whose name is not is not descended.
        let inside = path.strip_prefix(&root).unwrap_or(path);
        let parts: Option<Vec<&str>> = inside
            .components()
            .map(|c| c.as_os_str().to_str())
            .collect();
        let Some(parts) = parts else {
            listing.skipped.push(skip(
                SkipReason::InvalidName,
                "the name is not valid UTF-8".to_owned(),
            ));
            if entry.file_type().is_dir() {
                walk.skip_current_dir();
            }
            continue;
        };
        if entry.file_type().is_dir() {
            continue;
        }
        let key = parts.join("/");
        // A link is followed only to a file inside the root.
        let target = if entry.path_is_symlink() {
            match std::fs::canonicalize(path) {
                Ok(target) if target.starts_with(&root) && target.is_file() => target,
                Ok(target) if target.starts_with(&root) && target.is_dir() => {
                    listing.skipped.push(skip(
                        SkipReason::LinkToFolder,
                        "a link to a folder is not followed".to_owned(),
                    ));
                    continue;
                }
                Ok(_) | Err(_) => {
                    listing.skipped.push(skip(
                        SkipReason::LinkLeavesRoot,
                        "the link resolves outside the folder, or nowhere".to_owned(),
                    ));
                    continue;
                }
            }
        } else if entry.file_type().is_file() {
            path.to_path_buf()
        } else {
            listing.skipped.push(skip(
                SkipReason::UnsupportedFormat,
                "not a regular file".to_owned(),
            ));
            continue;
        };
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
        let metadata = match std::fs::metadata(&target) {
            Ok(metadata) => metadata,
            Err(error) => {
                listing
                    .skipped
                    .push(skip(SkipReason::Unreadable, error.to_string()));
                continue;
            }
        };
        if metadata.len() > selection.max_file_bytes {
            listing.skipped.push(skip(
                SkipReason::TooLarge,
                format!(
                    "{} bytes, over the limit of {}",
                    metadata.len(),
                    selection.max_file_bytes
                ),
            ));
            continue;
        }
        if let Err(detail) = signature_ok(&target, media_type) {
            listing
                .skipped
                .push(skip(SkipReason::UnsupportedFormat, detail));
            continue;
        }
        listing.entries.push(Entry {
            key,
            path: target,
            size: metadata.len(),
            modified: metadata.modified().ok(),
            media_type,
        });
    }
    listing.entries.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(listing)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let selection = Selection::new(&[], &["**/drafts/**".to_owned()], 100).expect("selection");
        let listing = list(root.path(), &selection).expect("list");
        let keys: Vec<&str> = listing.entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["a.md", "alias.md", "docs/b.txt"]);
        assert_eq!(listing.entries[0].media_type, "text/markdown");
        assert_eq!(listing.entries[0].size, 3);
        assert_eq!(
            listing.entries[1].path,
            std::fs::canonicalize(root.path().join("a.md")).expect("real"),
            "a link inside the root reads its target"
        );
        let mut skipped = reasons(&listing);
        skipped.sort_unstable();
        assert_eq!(
            skipped,
            [
                ("big.md", "too_large"),
                ("docs-link", "link_to_folder"),
                ("docs/drafts/c.md", "excluded"),
                ("fake.pdf", "unsupported_format"),
                ("leak.md", "link_leaves_root"),
                ("photo.png", "unsupported_format"),
            ]
        );
    }

    #[test]
    fn names_that_are_not_utf8_are_refused() {
        use std::os::unix::ffi::OsStrExt;
        let root = tempfile::tempdir().expect("root");
        let name = std::ffi::OsStr::from_bytes(b"bad\xff.md");
        std::fs::write(root.path().join(name), b"x").expect("write");
        std::fs::write(root.path().join("good.md"), b"x").expect("write");
        let listing = list(root.path(), &Selection::default()).expect("list");
        assert_eq!(listing.entries.len(), 1);
        assert_eq!(listing.skipped.len(), 1);
        assert_eq!(listing.skipped[0].reason, SkipReason::InvalidName);
    }
}
