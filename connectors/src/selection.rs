//! Which files of a copy belong in the dataset: include and exclude globs over the key, a size
//! limit per file, and the media type a file is read as.

use globset::{Glob, GlobSet, GlobSetBuilder};

/// A glob that does not compile.
#[derive(Debug, thiserror::Error)]
#[error("`{glob}` is not a glob: {message}")]
pub struct SelectionError {
    /// The glob as given.
    pub glob: String,
    /// What is wrong with it.
    pub message: String,
}

/// Which files are listed.
#[derive(Debug, Clone)]
pub struct Selection {
    include: Option<GlobSet>,
    exclude: GlobSet,
    /// Largest file listed, in bytes.
    pub max_file_bytes: u64,
}

fn set(globs: &[String]) -> Result<GlobSet, SelectionError> {
    let mut builder = GlobSetBuilder::new();
    for glob in globs {
        builder.add(Glob::new(glob).map_err(|error| SelectionError {
            glob: glob.clone(),
            message: error.kind().to_string(),
        })?);
    }
    builder.build().map_err(|error| SelectionError {
        glob: globs.join(", "),
        message: error.to_string(),
    })
}

impl Selection {
    /// Keys matching any of `include` (every key when it is empty) and none of `exclude`
    /// (globs over the key, `**` across folders), of at most `max_file_bytes`.
    pub fn new(
        include: &[String],
        exclude: &[String],
        max_file_bytes: u64,
    ) -> Result<Selection, SelectionError> {
        Ok(Selection {
            include: if include.is_empty() {
                None
            } else {
                Some(set(include)?)
            },
            exclude: set(exclude)?,
            max_file_bytes,
        })
    }

    /// Whether the globs select `key`.
    pub fn selects(&self, key: &str) -> bool {
        self.include
            .as_ref()
            .is_none_or(|include| include.is_match(key))
            && !self.exclude.is_match(key)
    }
}

impl Default for Selection {
    /// Every key, up to the largest document the ingest API accepts.
    fn default() -> Self {
        Selection {
            include: None,
            exclude: GlobSet::empty(),
            max_file_bytes: receipts::policy::DEFAULT_MAX_BODY_BYTES as u64,
        }
    }
}

/// The media type a file is read as, by its name; `None` for a format cairn does not read.
pub fn media_type_for(name: &str) -> Option<&'static str> {
    let extension = name
        .rsplit_once('.')
        .map(|(_, ext)| ext.to_ascii_lowercase())?;
    Some(match extension.as_str() {
        "md" | "markdown" => "text/markdown",
        "html" | "htm" => "text/html",
        "xhtml" => "application/xhtml+xml",
        "docx" => extract::DOCX_MEDIA_TYPE,
        "pdf" => "application/pdf",
        "json" => "application/json",
        "csv" => "text/csv",
        "xml" => "application/xml",
        "txt" | "text" | "rst" | "adoc" | "org" | "rs" | "py" | "go" | "js" | "ts" | "java"
        | "c" | "h" | "toml" | "yaml" | "yml" => "text/plain",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_select_keys() {
        let selection = Selection::new(
            &["docs/**".to_owned(), "*.md".to_owned()],
            &["**/drafts/**".to_owned()],
            10,
        )
        .expect("globs");
        assert!(selection.selects("docs/a/b.txt"));
        assert!(selection.selects("README.md"));
        assert!(!selection.selects("docs/drafts/x.md"));
        assert!(!selection.selects("src/main.rs"));
        assert!(Selection::default().selects("anything"));
        assert!(Selection::new(&["[".to_owned()], &[], 1).is_err());
    }

    #[test]
    fn formats_by_name() {
        assert_eq!(media_type_for("a/B.MD"), Some("text/markdown"));
        assert_eq!(media_type_for("x.pdf"), Some("application/pdf"));
        assert_eq!(media_type_for("photo.png"), None);
        assert_eq!(media_type_for("Makefile"), None);
    }
}
