//! Extraction: a revision's retained bytes as the text projection chunks, with the structure
//! chunks carry (section paths, page numbers). Extraction is derived data, like chunks: the
//! retained bytes stay exactly as accepted.
//!
//! ## Model
//! The format comes from the media type ([`Format::of`]) and, for binary formats, is checked
//! against the bytes' signature ([`Format::admit`]); a mismatch is refused, never guessed.
//! Each format has one [`FormatExtractor`] ([`Format::extractor`]):
//! - Plain text is its own extraction.
//! - Markdown keeps its source as the text (so byte offsets still point into the retained
//!   bytes) and adds the heading structure: every byte belongs to the section of the nearest
//!   heading above it, named by its path (`# A > ## B`).
//! - HTML is read as a browser shows it: the title, then the main text in paragraphs,
//!   without scripts, styles, navigation, headers, footers and forms; headings are sections.
//! - PDF is read page by page, in reading order, by poppler's `pdftotext` in a child process
//!   bounded in time, memory and output ([`pdf`]); every byte belongs to a page.
//! - DOCX is read from its `word/document.xml`: paragraphs, headings (by style or outline
//!   level) as sections, and tables as rows of cells ([`docx`]), within bounds on what is
//!   decompressed.
//!
//! Offsets of chunks of the formats that extract ([`Format::extracts`]) point into the
//! extracted text, not into the retained bytes, and the lexical index holds that text too, so
//! a word in a script, a tag or a compressed stream is never found.
//!
//! ## Invariants
//! - Extraction is deterministic for the same bytes, format and extractor version.
//! - Sections and pages are sorted by start; sections cover the text from the first heading
//!   on, pages cover all of it.
//! - Every failure is an [`ExtractError`] with a stable code; extraction never panics the
//!   caller and never runs past its [`Limits`].

pub mod docx;
pub mod html;
pub mod markdown;
pub mod pdf;

use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// How many binary documents (PDF, DOCX) one process extracts at once; the rest wait their
/// turn. Each may hold [`Limits::max_text_bytes`] of text and decompressed XML (a PDF also a
/// child process), so this bounds extraction's memory however many requests arrive.
pub const MAX_CONCURRENT: usize = 4;

static RUNNING: Mutex<usize> = Mutex::new(0);
static FREED: Condvar = Condvar::new();

/// One of the [`MAX_CONCURRENT`] places, held while a binary document is extracted.
struct Slot;

impl Slot {
    fn take() -> Slot {
        let mut running = RUNNING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while *running >= MAX_CONCURRENT {
            running = FREED
                .wait(running)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        *running += 1;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut running = RUNNING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *running = running.saturating_sub(1);
        FREED.notify_one();
    }
}

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
    /// PDF: the text of each page, in reading order.
    Pdf,
    /// Word (Office Open XML): paragraphs, headings as section paths, tables as text.
    Docx,
}

/// The media type of DOCX documents.
pub const DOCX_MEDIA_TYPE: &str =
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document";

impl Format {
    /// The format of a media type (parameters such as `; charset=utf-8` are ignored). Every
    /// other type is read as plain text (and must then be UTF-8).
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
            "application/pdf" => Format::Pdf,
            DOCX_MEDIA_TYPE => Format::Docx,
            _ => Format::PlainText,
        }
    }

    /// Its name in messages and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Format::PlainText => "text",
            Format::Markdown => "markdown",
            Format::Html => "html",
            Format::Pdf => "pdf",
            Format::Docx => "docx",
        }
    }

    /// Whether its text differs from the retained bytes (so that chunk offsets and the
    /// lexical index refer to the extracted text).
    pub fn extracts(self) -> bool {
        matches!(self, Format::Html | Format::Pdf | Format::Docx)
    }

    /// Whether its bytes are binary (not UTF-8 text).
    pub fn binary(self) -> bool {
        matches!(self, Format::Pdf | Format::Docx)
    }

    /// The largest document of this format admission accepts: extraction's cost grows with
    /// the bytes, and for the binary formats much faster than the bytes' size suggests.
    pub fn max_bytes(self) -> usize {
        match self {
            Format::PlainText | Format::Markdown => 32 * 1024 * 1024,
            Format::Html => 16 * 1024 * 1024,
            Format::Pdf => 64 * 1024 * 1024,
            Format::Docx => 32 * 1024 * 1024,
        }
    }

    /// Checks that `bytes` can be this format before anything is extracted: within its size
    /// limit (`document_too_large`), with the signature of a binary format
    /// (`format_mismatch`), or UTF-8 for the text formats (`not_text`).
    pub fn admit(self, bytes: &[u8]) -> Result<(), ExtractError> {
        if bytes.len() > self.max_bytes() {
            return Err(ExtractError::new(
                "document_too_large",
                format!(
                    "the {} document is {} bytes; at most {} are accepted for this format",
                    self.name(),
                    bytes.len(),
                    self.max_bytes()
                ),
            ));
        }
        let signature = match self {
            // A PDF may start with junk before its header; readers look in the first KiB.
            Format::Pdf => bytes.windows(5).take(1024).any(|window| window == b"%PDF-"),
            Format::Docx => bytes.starts_with(b"PK\x03\x04"),
            Format::PlainText | Format::Markdown | Format::Html => {
                return match std::str::from_utf8(bytes) {
                    Ok(_) => Ok(()),
                    Err(error) => Err(ExtractError::new(
                        "not_text",
                        format!(
                            "content is not UTF-8 text (invalid byte at offset {}); cairn reads \
                             text as plain text, Markdown or HTML, and binary documents as \
                             application/pdf or {DOCX_MEDIA_TYPE}",
                            error.valid_up_to()
                        ),
                    )),
                };
            }
        };
        if signature {
            return Ok(());
        }
        let found = if bytes.starts_with(b"PK\x03\x04") {
            "a zip archive"
        } else if bytes.windows(5).take(1024).any(|window| window == b"%PDF-") {
            "a PDF"
        } else if std::str::from_utf8(bytes).is_ok() {
            "text"
        } else {
            "unrecognised bytes"
        };
        Err(ExtractError::new(
            "format_mismatch",
            format!(
                "the media type says {} but the content is {found}; send the media type of \
                 what the bytes are",
                self.name()
            ),
        ))
    }
}

/// One format's reader: a document's bytes in, its text and structure out, within [`Limits`].
/// [`Format::extractor`] names the one for each format; [`Extracted::from_bytes`] runs it after
/// admission's checks, with any panic contained.
pub trait FormatExtractor: Send + Sync {
    /// The format it reads.
    fn format(&self) -> Format;
    /// The text and structure of `bytes` (which passed [`Format::admit`] for this format).
    fn extract(&self, bytes: &[u8], limits: &Limits) -> Result<Extracted, ExtractError>;
}

/// The text formats (plain text, Markdown, HTML): UTF-8 read as its format, bounded by
/// its parse ([`Extracted::new`]).
#[derive(Debug, Clone, Copy)]
pub struct TextExtractor {
    format: Format,
}

impl FormatExtractor for TextExtractor {
    fn format(&self) -> Format {
        self.format
    }

    fn extract(&self, bytes: &[u8], _limits: &Limits) -> Result<Extracted, ExtractError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| ExtractError::new("not_text", "content is not UTF-8 text"))?;
        Extracted::new(text.to_owned(), self.format)
    }
}

impl Format {
    /// The extractor that reads this format.
    pub fn extractor(self) -> &'static dyn FormatExtractor {
        match self {
            Format::PlainText => &TextExtractor {
                format: Format::PlainText,
            },
            Format::Markdown => &TextExtractor {
                format: Format::Markdown,
            },
            Format::Html => &TextExtractor {
                format: Format::Html,
            },
            Format::Pdf => &pdf::PdfExtractor,
            Format::Docx => &docx::DocxExtractor,
        }
    }
}

/// Why a document cannot be extracted: a typed refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ExtractError {
    /// Stable code: `not_text`, `format_mismatch`, `document_too_large`, `unextractable`,
    /// `encrypted`, `no_text_layer`, `extraction_limit` (permanent), or
    /// `extractor_unavailable` (this machine lacks the extractor: transient).
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
}

impl ExtractError {
    /// An error with its code.
    pub fn new(code: &'static str, message: impl Into<String>) -> ExtractError {
        ExtractError {
            code,
            message: message.into(),
        }
    }

    /// Whether the same bytes would fail again anywhere (every code but
    /// `extractor_unavailable`, which installing the extractor cures).
    pub fn permanent(&self) -> bool {
        self.code != "extractor_unavailable"
    }
}

/// Bounds on one extraction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time for one document.
    pub deadline: Duration,
    /// Address space of the PDF extractor's child process.
    pub memory_bytes: u64,
    /// Extracted text (and, for DOCX, decompressed XML) per document.
    pub max_text_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            deadline: Duration::from_secs(10),
            memory_bytes: 1024 * 1024 * 1024,
            max_text_bytes: 32 * 1024 * 1024,
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

/// The headings open above the current point of a document, as section paths: the one
/// builder of paths for every format with headings.
#[derive(Debug, Default)]
pub(crate) struct Outline {
    /// Open headings: (depth, `#... title`).
    open: Vec<(usize, String)>,
    /// The sections so far, by start.
    pub(crate) sections: Vec<Section>,
}

impl Outline {
    /// A heading of `depth` (1 for the top) titled `title`, starting at `start`; headings
    /// without text are not sections.
    pub(crate) fn heading(&mut self, depth: usize, start: usize, title: &str) {
        let title = title.split_whitespace().collect::<Vec<_>>().join(" ");
        if title.is_empty() {
            return;
        }
        self.open.retain(|(level, _)| *level < depth);
        self.open
            .push((depth, format!("{} {title}", "#".repeat(depth))));
        let path = self
            .open
            .iter()
            .map(|(_, name)| name.as_str())
            .collect::<Vec<_>>()
            .join(" > ");
        self.sections.push(Section { start, path });
    }
}

/// The path of the section (of `sections`, sorted by start) the byte at `offset` belongs to.
pub fn section_at(sections: &[Section], offset: usize) -> Option<&str> {
    sections
        .partition_point(|section| section.start <= offset)
        .checked_sub(1)
        .and_then(|index| sections.get(index))
        .map(|section| section.path.as_str())
}

/// The page (1-based; `pages` holds each page's start) the byte at `offset` is on.
pub fn page_at(pages: &[usize], offset: usize) -> Option<u32> {
    let after = pages.partition_point(|start| *start <= offset);
    u32::try_from(after).ok().filter(|page| *page > 0)
}

/// The byte ranges a text of `len` bytes is cut into before it is split further: at every
/// page start and every section start, so that no piece spans two pages or two sections.
/// One range for a text without structure; none for an empty one.
pub fn segments(len: usize, sections: &[Section], pages: &[usize]) -> Vec<(usize, usize)> {
    let mut starts: Vec<usize> = pages
        .iter()
        .copied()
        .chain(sections.iter().map(|section| section.start))
        .chain([0])
        .filter(|start| *start < len)
        .collect();
    starts.sort_unstable();
    starts.dedup();
    let ends = starts.iter().skip(1).copied().chain([len]);
    starts.iter().copied().zip(ends).collect()
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
    /// Where each page starts (page 1 first), for paged formats (PDF); empty otherwise.
    pub pages: Vec<usize>,
}

impl Extracted {
    /// `text` (the retained bytes, as UTF-8) read as a text format; a page nested deeper than
    /// [`html::MAX_DEPTH`] is refused (`unextractable`) before it is parsed. A binary format
    /// is refused (`not_text`): those are read from bytes ([`Extracted::from_bytes`]).
    pub fn new(text: String, format: Format) -> Result<Extracted, ExtractError> {
        Ok(match format {
            Format::PlainText => Extracted::plain(text),
            Format::Markdown => Extracted {
                sections: markdown::sections(&text),
                text,
                format,
                pages: Vec::new(),
            },
            Format::Html => {
                let depth = html::nesting(&text);
                if depth > html::MAX_DEPTH {
                    return Err(ExtractError::new(
                        "unextractable",
                        format!(
                            "the HTML nests {depth} elements deep; at most {} can be extracted",
                            html::MAX_DEPTH
                        ),
                    ));
                }
                let (text, sections) = html::extract(&text);
                Extracted {
                    text,
                    format,
                    sections,
                    pages: Vec::new(),
                }
            }
            Format::Pdf | Format::Docx => {
                return Err(ExtractError::new(
                    "not_text",
                    format!("{} documents are read from their bytes", format.name()),
                ))
            }
        })
    }

    /// A document's retained bytes read as `format`, within `limits`: admission's checks
    /// ([`Format::admit`]) first, then the format's extractor. A panic inside an in-process
    /// extractor is contained and answered as `unextractable`.
    pub fn from_bytes(
        bytes: &[u8],
        format: Format,
        limits: &Limits,
    ) -> Result<Extracted, ExtractError> {
        format.admit(bytes)?;
        let extractor = format.extractor();
        // Blocking: callers run binary extraction on the blocking pool.
        let _slot = format.binary().then(Slot::take);
        let contained = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            extractor.extract(bytes, limits)
        }));
        let extracted = contained.unwrap_or_else(|_| {
            Err(ExtractError::new(
                "unextractable",
                format!("the {} extractor failed on this document", format.name()),
            ))
        })?;
        if extracted.text.len() > limits.max_text_bytes {
            return Err(ExtractError::new(
                "extraction_limit",
                format!(
                    "the document holds more than {} bytes of text",
                    limits.max_text_bytes
                ),
            ));
        }
        Ok(extracted)
    }

    /// Plain text, as is.
    pub fn plain(text: String) -> Extracted {
        Extracted {
            text,
            format: Format::PlainText,
            sections: Vec::new(),
            pages: Vec::new(),
        }
    }

    /// The path of the section the byte at `offset` belongs to.
    pub fn section_at(&self, offset: usize) -> Option<&str> {
        section_at(&self.sections, offset)
    }

    /// The page (1-based) the byte at `offset` is on, for paged formats.
    pub fn page_at(&self, offset: usize) -> Option<u32> {
        page_at(&self.pages, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_more_than_max_concurrent_binary_documents_are_extracted_at_once() {
        let pdf = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/pdfjs/file_pdfjs_test.pdf"
        ))
        .expect("fixture");
        let done = std::sync::atomic::AtomicBool::new(false);
        let most = std::thread::scope(|scope| {
            let sampler = scope.spawn(|| {
                let mut most = 0;
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    most = most.max(*RUNNING.lock().unwrap_or_else(|p| p.into_inner()));
                    std::thread::yield_now();
                }
                most
            });
            let workers: Vec<_> = (0..12)
                .map(|_| {
                    scope.spawn(|| {
                        for _ in 0..3 {
                            let extracted =
                                Extracted::from_bytes(&pdf, Format::Pdf, &Limits::default())
                                    .expect("pdf");
                            assert_eq!(extracted.pages.len(), 5);
                        }
                    })
                })
                .collect();
            for worker in workers {
                worker.join().expect("worker");
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            sampler.join().expect("sampler")
        });
        assert!(
            (1..=MAX_CONCURRENT).contains(&most),
            "{most} extractions ran at once"
        );
    }

    #[test]
    fn media_types_choose_the_format() {
        assert_eq!(Format::of("text/markdown"), Format::Markdown);
        assert_eq!(Format::of("Text/Markdown; charset=utf-8"), Format::Markdown);
        assert_eq!(Format::of("text/x-markdown"), Format::Markdown);
        assert_eq!(Format::of("text/plain"), Format::PlainText);
        assert_eq!(Format::of("application/json"), Format::PlainText);
        assert_eq!(Format::of("text/html; charset=utf-8"), Format::Html);
        assert!(Format::Html.extracts() && !Format::Markdown.extracts());
        assert_eq!(Format::of("application/pdf"), Format::Pdf);
        assert_eq!(Format::of(DOCX_MEDIA_TYPE), Format::Docx);
        for format in [
            Format::PlainText,
            Format::Markdown,
            Format::Html,
            Format::Pdf,
            Format::Docx,
        ] {
            assert_eq!(format.extractor().format(), format);
            assert_eq!(
                format.binary(),
                matches!(format, Format::Pdf | Format::Docx)
            );
        }
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
