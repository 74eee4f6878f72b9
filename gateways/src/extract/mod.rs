//! Extraction: a revision's retained bytes as the text projection chunks, with the structure
//! chunks carry (section paths). Extraction is derived data, like chunks: the retained bytes
//! stay exactly as accepted.
//!
//! ## Model
//! The format comes from the media type ([`Format::of`]). Plain text is its own extraction.
//! Markdown keeps its source as the text (so byte offsets still point into the retained
//! bytes) and adds the heading structure: every byte belongs to the section of the nearest
//! heading above it, named by its path (`# A > ## B`).
//!
//! ## Invariants
//! - Extraction is deterministic for the same bytes and format.
//! - Sections are sorted by start and cover the text from the first heading on.

mod markdown;

/// How a revision's bytes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// UTF-8 text, as is.
    PlainText,
    /// CommonMark (with tables): headings become section paths, and chunks keep code blocks
    /// and tables whole where they fit.
    Markdown,
}

impl Format {
    /// The format of a media type (parameters such as `; charset=utf-8` are ignored). Every
    /// other text type is read as plain text.
    pub fn of(media_type: &str) -> Format {
        let essence = media_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "text/markdown" | "text/x-markdown" => Format::Markdown,
            _ => Format::PlainText,
        }
    }
}

/// Where a section starts in the extracted text, and its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Byte offset of its heading.
    pub start: usize,
    /// Its path from the top heading, e.g. `# Guide > ## Install`.
    pub path: String,
}

/// What projection chunks: the text and its structure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    /// The text (for plain text and Markdown, the retained bytes themselves).
    pub text: String,
    /// How it is read (the chunker keeps Markdown structure whole where it fits).
    pub format: Format,
    /// Sections, by start.
    pub sections: Vec<Section>,
}

impl Extracted {
    /// `text` read as `format`.
    pub fn new(text: String, format: Format) -> Extracted {
        let sections = match format {
            Format::PlainText => Vec::new(),
            Format::Markdown => markdown::sections(&text),
        };
        Extracted {
            text,
            format,
            sections,
        }
    }

    /// The path of the section the byte at `offset` belongs to.
    pub fn section_at(&self, offset: usize) -> Option<&str> {
        let after = self
            .sections
            .partition_point(|section| section.start <= offset);
        after
            .checked_sub(1)
            .and_then(|index| self.sections.get(index))
            .map(|section| section.path.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_choose_the_format() {
        assert_eq!(Format::of("text/markdown"), Format::Markdown);
        assert_eq!(Format::of("Text/Markdown; charset=utf-8"), Format::Markdown);
        assert_eq!(Format::of("text/x-markdown"), Format::Markdown);
        assert_eq!(Format::of("text/plain"), Format::PlainText);
        assert_eq!(Format::of("application/json"), Format::PlainText);
    }

    #[test]
    fn every_byte_belongs_to_the_nearest_heading_above_it() {
        let text = "Intro line.\n\n# Guide\n\nWelcome.\n\n## Install\n\nRun it.\n\n### On Linux\n\nApt.\n\n## Use\n\nCall it.\n\n# Other\n\nEnd.\n";
        let extracted = Extracted::new(text.to_owned(), Format::Markdown);
        let at = |needle: &str| {
            let offset = text.find(needle).expect("needle");
            extracted.section_at(offset).map(str::to_owned)
        };
        assert_eq!(at("Intro"), None);
        assert_eq!(at("# Guide").as_deref(), Some("# Guide"));
        assert_eq!(at("Welcome").as_deref(), Some("# Guide"));
        assert_eq!(at("Run it").as_deref(), Some("# Guide > ## Install"));
        assert_eq!(
            at("Apt").as_deref(),
            Some("# Guide > ## Install > ### On Linux")
        );
        assert_eq!(at("Call it").as_deref(), Some("# Guide > ## Use"));
        assert_eq!(at("End").as_deref(), Some("# Other"));
        let plain = Extracted::new(text.to_owned(), Format::PlainText);
        assert_eq!(plain.section_at(30), None);
    }

    #[test]
    fn headings_keep_their_inline_text_and_setext_headings_count() {
        let text = "Title with `code` and *emphasis*\n================================\n\nBody.\n\n## A [link](x.md) here\n\nMore.\n";
        let extracted = Extracted::new(text.to_owned(), Format::Markdown);
        assert_eq!(
            extracted.section_at(text.find("Body").expect("body")),
            Some("# Title with code and emphasis")
        );
        assert_eq!(
            extracted.section_at(text.find("More").expect("more")),
            Some("# Title with code and emphasis > ## A link here")
        );
    }
}
