//! Extraction: a revision's retained bytes as the text projection chunks, with the structure
//! chunks carry (section paths). Extraction is derived data, like chunks: the retained bytes
//! stay exactly as accepted.
//!
//! ## Model
//! The format comes from the media type ([`Format::of`]). Plain text is its own extraction.
//! Markdown keeps its source as the text (so byte offsets still point into the retained
//! bytes) and adds the heading structure: every byte belongs to the section of the nearest
//! heading above it, named by its path (`# A > ## B`). HTML is read as a browser shows it: the
//! title, then the main text in paragraphs, without scripts, styles, navigation, headers,
//! footers and forms; its headings are section paths too. Offsets of HTML chunks point into
//! that text, not into the markup ([`Format::extracts`]), and the lexical index holds that
//! text as well, so a word in a script or a tag is never found.
//!
//! ## Invariants
//! - Extraction is deterministic for the same bytes and format.
//! - Sections are sorted by start and cover the text from the first heading on.

pub mod html;
mod markdown;

/// How a revision's bytes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// UTF-8 text, as is.
    PlainText,
    /// CommonMark (with tables): headings become section paths, and chunks keep code blocks
    /// and tables whole where they fit.
    Markdown,
    /// HTML: the readable text, headings as section paths.
    Html,
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
            "text/html" | "application/xhtml+xml" => Format::Html,
            _ => Format::PlainText,
        }
    }

    /// Whether its text differs from the retained bytes (so that chunk offsets and the
    /// lexical index refer to the extracted text).
    pub fn extracts(self) -> bool {
        self == Format::Html
    }
}

/// Why a document cannot be extracted (a permanent, typed refusal).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ExtractError {
    /// Stable code: `unextractable`.
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
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
    /// `text` (the retained bytes, as UTF-8) read as `format`; a page nested deeper than
    /// [`html::MAX_DEPTH`] is refused (`unextractable`) before it is parsed.
    pub fn new(text: String, format: Format) -> Result<Extracted, ExtractError> {
        Ok(match format {
            Format::PlainText => Extracted::plain(text),
            Format::Markdown => Extracted {
                sections: markdown::sections(&text),
                text,
                format,
            },
            Format::Html => {
                let depth = html::nesting(&text);
                if depth > html::MAX_DEPTH {
                    return Err(ExtractError {
                        code: "unextractable",
                        message: format!(
                            "the HTML nests {depth} elements deep; at most {} can be extracted",
                            html::MAX_DEPTH
                        ),
                    });
                }
                let (text, sections) = html::extract(&text);
                Extracted {
                    text,
                    format,
                    sections,
                }
            }
        })
    }

    /// Plain text, as is.
    pub fn plain(text: String) -> Extracted {
        Extracted {
            text,
            format: Format::PlainText,
            sections: Vec::new(),
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
        assert_eq!(Format::of("text/html; charset=utf-8"), Format::Html);
        assert!(Format::Html.extracts() && !Format::Markdown.extracts());
    }

    #[test]
    fn html_keeps_the_title_and_main_text_with_headings_as_sections() {
        let page = "<!doctype html><html><head><title>Field  guide</title>\
            <style>body { color: red }</style><script>var hidden = 'scriptword';</script></head>\
            <body><nav><a href='/'>Home</a> menuword</nav><header>Site banner</header>\
            <main><h1>Birds</h1><p>Herons <b>wade</b> in\n   reeds.</p>\
            <h2>Kingfishers</h2><p>They dive.</p><pre>  keep   this\n  spacing</pre>\
            <ul><li>one</li><li>two</li></ul></main>\
            <footer>Copyright footerword</footer></body></html>";
        let extracted = Extracted::new(page.to_owned(), Format::Html).expect("html");
        let text = &extracted.text;
        for gone in [
            "scriptword",
            "menuword",
            "footerword",
            "color",
            "Site banner",
            "<",
        ] {
            assert!(!text.contains(gone), "{gone} in {text:?}");
        }
        assert!(
            text.starts_with("Field guide\n\nBirds\n\nHerons wade in reeds."),
            "{text:?}"
        );
        assert!(text.contains("  keep   this\n  spacing"), "{text:?}");
        assert!(text.contains("one\n\ntwo"), "{text:?}");
        let at = |needle: &str| extracted.section_at(text.find(needle).expect("needle"));
        assert_eq!(at("Field guide"), None);
        assert_eq!(at("Herons"), Some("# Birds"));
        assert_eq!(at("They dive"), Some("# Birds > ## Kingfishers"));
    }

    #[test]
    fn hostile_html_is_bounded_and_never_panics() {
        let deep = |depth: usize| "<div>".repeat(depth) + "deep text" + &"</div>".repeat(depth);
        let refused = Extracted::new(deep(100_000), Format::Html).expect_err("too deep");
        assert_eq!(refused.code, "unextractable");
        let nested = Extracted::new(deep(html::MAX_DEPTH - 10), Format::Html).expect("nested");
        assert!(nested.text.contains("deep text"));
        assert_eq!(html::nesting("<p>a<br>b<img src=x/><p/><p>c</p></p>"), 2);
        for broken in [
            "<",
            "<html",
            "</p></p><p<<>>",
            "<script>never closed",
            "\u{0}<b>\u{feff}x",
        ] {
            let _ = Extracted::new(broken.to_owned(), Format::Html);
        }
    }

    #[test]
    fn every_byte_belongs_to_the_nearest_heading_above_it() {
        let text = "Intro line.\n\n# Guide\n\nWelcome.\n\n## Install\n\nRun it.\n\n### On Linux\n\nApt.\n\n## Use\n\nCall it.\n\n# Other\n\nEnd.\n";
        let extracted = Extracted::new(text.to_owned(), Format::Markdown).expect("markdown");
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
        let plain = Extracted::plain(text.to_owned());
        assert_eq!(plain.section_at(30), None);
    }

    #[test]
    fn headings_keep_their_inline_text_and_setext_headings_count() {
        let text = "Title with `code` and *emphasis*\n================================\n\nBody.\n\n## A [link](x.md) here\n\nMore.\n";
        let extracted = Extracted::new(text.to_owned(), Format::Markdown).expect("markdown");
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
