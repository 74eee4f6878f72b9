//! Where a connector may read: the configured roots, and one rule that holds at every read.
//!
//! A location is resolved beneath the root that contains it at the moment it is opened
//! (`openat2` with `RESOLVE_BENEATH` on Linux, through `cap-std`), never by checking a path
//! string first and opening it later. The folder a run reads is that open directory; every
//! file and folder the run lists, stats or opens is resolved beneath it in turn, so a link
//! that leads out of the folder, a folder swapped for a link after it was checked, or a
//! location that did not exist when the connector was created and is a link now, is refused
//! when it is opened.
//!
//! A git repository is read by `gix` through paths. Its git folder, common folder and every
//! alternate object store are therefore checked to lie inside a root, by where they really
//! are, before and after `gix` opens the repository ([`crate::git::open`]).

use std::io;
use std::path::{Component, Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;

/// Why a location cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum Confinement {
    /// The location lies outside every root, or resolves outside its root now.
    #[error("{0}")]
    Refused(String),
    /// The location lies inside a root but cannot be opened now (missing, not a folder,
    /// unreadable): a later run may succeed.
    #[error("{0}")]
    Unavailable(String),
}

/// The folders connectors may read (`connectors.folder_roots`), as absolute paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roots {
    roots: Vec<PathBuf>,
}

/// Whether `error` is cap-std's refusal of a path that leads outside the directory it is
/// resolved beneath (an OS permission error carries an errno; the refusal does not).
pub fn is_escape(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::PermissionDenied && error.raw_os_error().is_none()
}

/// Opens a folder of this machine's own choosing (a path the operator gave on the command
/// line, not one a token named): [`crate::folder::list`] then lists it as it lists a
/// connector's.
pub fn open_folder(path: &Path) -> io::Result<Dir> {
    Dir::open_ambient_dir(path, ambient_authority())
}

impl Roots {
    /// The roots (absolute paths; a relative one never contains anything).
    pub fn new(roots: Vec<PathBuf>) -> Roots {
        Roots { roots }
    }

    /// Whether no root is configured (every location is refused).
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// How many roots are configured.
    pub fn len(&self) -> usize {
        self.roots.len()
    }

    fn refused_outside(&self) -> Confinement {
        Confinement::Refused(if self.roots.is_empty() {
            "no folder may be read: set connectors.folder_roots (CAIRN_CONNECTOR_FOLDER_ROOTS) \
             to the folders and repositories connectors may keep"
                .to_owned()
        } else {
            format!(
                "the folder or repository must be an absolute path inside one of the configured \
                 roots ({} configured; see connectors.folder_roots)",
                self.roots.len()
            )
        })
    }

    /// The roots that contain `location` by its components (absolute, no `.` or `..`), with
    /// the path inside each.
    fn lexical<'a>(&'a self, location: &'a Path) -> Vec<(&'a Path, &'a Path)> {
        let clean = location.is_absolute()
            && !location
                .components()
                .any(|component| matches!(component, Component::ParentDir | Component::CurDir));
        if !clean {
            return Vec::new();
        }
        self.roots
            .iter()
            .filter(|root| root.is_absolute())
            .filter_map(|root| {
                location
                    .strip_prefix(root)
                    .ok()
                    .map(|inside| (root.as_path(), inside))
            })
            .collect()
    }

    /// Opens the folder `location` beneath the root that contains it. Links on the way are
    /// followed only while they stay inside that root.
    pub fn open(&self, location: &str) -> Result<Dir, Confinement> {
        let path = Path::new(location);
        let candidates = self.lexical(path);
        if candidates.is_empty() {
            return Err(self.refused_outside());
        }
        let mut unavailable = None;
        for (root, inside) in candidates {
            let root_dir = match Dir::open_ambient_dir(root, ambient_authority()) {
                Ok(dir) => dir,
                Err(error) => {
                    unavailable = Some(format!(
                        "the root {} cannot be opened: {error}",
                        root.display()
                    ));
                    continue;
                }
            };
            if inside.as_os_str().is_empty() {
                return Ok(root_dir);
            }
            match root_dir.open_dir(inside) {
                Ok(dir) => return Ok(dir),
                Err(error) if is_escape(&error) => {
                    // An absolute link that names a place inside the root is followed as
                    // the relative path it names; that open is resolved beneath the root too.
                    let again = std::fs::canonicalize(path).ok().and_then(|real| {
                        let root = std::fs::canonicalize(root).ok()?;
                        let inside = real.strip_prefix(root).ok()?.to_path_buf();
                        root_dir.open_dir(inside).ok()
                    });
                    return again.ok_or_else(|| {
                        Confinement::Refused(format!(
                            "{location} resolves outside its root {} (a link leads out of it)",
                            root.display()
                        ))
                    });
                }
                Err(error) => unavailable = Some(format!("{location}: {error}")),
            }
        }
        Err(Confinement::Unavailable(
            unavailable.unwrap_or_else(|| format!("{location} cannot be opened")),
        ))
    }

    /// Whether a connector on `location` may be created: inside a root by its components and,
    /// where it exists on this machine, by where it really is. A location that does not exist
    /// here is admitted (workers may run elsewhere): every run opens it through [`Roots::open`].
    pub fn admit(&self, location: &str) -> Result<(), Confinement> {
        match self.open(location) {
            Ok(_) | Err(Confinement::Unavailable(_)) => Ok(()),
            Err(refused) => Err(refused),
        }
    }

    /// Whether `path`, an absolute path as the file system resolves it now, lies inside a
    /// root (each root also taken as it really is).
    pub fn contains_real(&self, path: &Path) -> bool {
        let Ok(real) = std::fs::canonicalize(path) else {
            return false;
        };
        self.roots
            .iter()
            .filter(|root| root.is_absolute())
            .any(|root| {
                let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.clone());
                real.starts_with(root)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_opens_only_beneath_its_root() {
        let roots = tempfile::tempdir().expect("roots");
        let outside = tempfile::tempdir().expect("outside");
        let root = roots.path().to_path_buf();
        std::fs::create_dir(root.join("docs")).expect("docs");
        std::os::unix::fs::symlink(outside.path(), root.join("leak")).expect("link");
        std::os::unix::fs::symlink("docs", root.join("alias")).expect("link in");
        std::os::unix::fs::symlink(root.join("docs"), root.join("absolute")).expect("link in");
        std::os::unix::fs::symlink("/proc/self/root", root.join("proc")).expect("magic");
        let at = |relative: &str| format!("{}/{relative}", root.display());
        let roots = Roots::new(vec![root.clone()]);
        assert!(roots.open(&at("docs")).is_ok());
        assert!(roots.open(&at("alias")).is_ok(), "a link that stays inside");
        assert!(
            roots.open(&at("absolute")).is_ok(),
            "an absolute link inside"
        );
        assert!(
            roots.open(root.to_str().expect("utf-8")).is_ok(),
            "the root itself"
        );
        assert!(matches!(
            roots.open(&at("leak")),
            Err(Confinement::Refused(_))
        ));
        assert!(matches!(
            roots.open(&at("proc")),
            Err(Confinement::Refused(_))
        ));
        assert!(matches!(
            roots.open(&at("not-made-yet")),
            Err(Confinement::Unavailable(_))
        ));
        assert!(roots.admit(&at("not-made-yet")).is_ok());
        assert!(roots.admit(&at("leak")).is_err());
        assert!(roots.admit(&at("docs/../../etc")).is_err());
        assert!(roots.admit("relative/docs").is_err());
        assert!(roots.admit("/etc").is_err());
        assert!(Roots::default().admit(&at("docs")).is_err());
        assert!(roots.contains_real(&root.join("docs")));
        assert!(!roots.contains_real(&root.join("leak")));
    }
}
