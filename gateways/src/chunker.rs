//! Chunking by the embedding model's own tokenizer (text-splitter): every chunk fits the
//! model's window, neighbouring chunks overlap by a configurable number of tokens, and
//! boundaries prefer paragraphs, then sentences, then words. Deterministic for the same text.

use sha2::{Digest, Sha256};
use text_splitter::{ChunkConfig, MarkdownSplitter, TextSplitter};

use extract::{Extracted, Format};

use crate::embedder::MODEL_MAX_TOKENS;
use crate::GatewayError;

/// How text is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkerSettings {
    /// Most tokens per chunk, not counting `[CLS]` and `[SEP]`.
    pub max_tokens: usize,
    /// Tokens shared by neighbouring chunks.
    pub overlap_tokens: usize,
}

impl Default for ChunkerSettings {
    fn default() -> Self {
        Self {
            max_tokens: MODEL_MAX_TOKENS - 2,
            overlap_tokens: 32,
        }
    }
}

impl ChunkerSettings {
    /// A stable text form, part of the projection generation's identity.
    pub fn fingerprint(&self) -> String {
        format!(
            "text-splitter-0.33/document-offsets/max{}/overlap{}",
            self.max_tokens, self.overlap_tokens
        )
    }

    /// The settings a [`ChunkerSettings::fingerprint`] was made from (a generation's chunker,
    /// as the ledger records it), if it is one this chunker makes.
    pub fn from_fingerprint(fingerprint: &str) -> Option<ChunkerSettings> {
        let rest = fingerprint.strip_prefix("text-splitter-0.33/document-offsets/max")?;
        let (max, overlap) = rest.split_once("/overlap")?;
        Some(ChunkerSettings {
            max_tokens: max.parse().ok()?,
            overlap_tokens: overlap.parse().ok()?,
        })
    }
}

/// One chunk of a revision's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Position in the revision (0-based).
    pub index: u32,
    /// The chunk's text.
    pub text: String,
    /// Byte offset of its first byte in the revision's text.
    pub byte_start: usize,
    /// Byte offset after its last byte.
    pub byte_end: usize,
    /// Tokens in it (without special tokens).
    pub token_count: usize,
    /// Hex sha256 of its text.
    pub sha256: String,
    /// The section it starts in (`# A > ## B`), for formats with headings.
    pub section: Option<String>,
    /// The page it starts on (1-based), for paged formats (PDF).
    pub page: Option<u32>,
}

/// Cuts text into chunks that fit the model.
pub struct Chunker {
    tokenizer: tokenizers::Tokenizer,
    settings: ChunkerSettings,
}

/// Sizes pieces of one document from a single tokenization of the whole document: the splitter
/// only ever sizes slices of the text it splits, so a piece's tokens are the document's tokens
/// whose byte ranges meet the piece's range (two binary searches instead of re-encoding every
/// candidate piece, which made chunking a third of the projection pipeline's overhead). A token
/// cut by a piece's edge counts, so a piece's size never under-counts what the model sees.
struct DocumentSizer<'a> {
    /// Address of the document's first byte.
    base: usize,
    /// Its length in bytes.
    len: usize,
    /// Token byte ranges, in order (`encode` keeps byte offsets; `encode_fast` drops them).
    starts: Vec<usize>,
    ends: Vec<usize>,
    /// For a piece that is not a slice of the document (never expected): encode it.
    tokenizer: &'a tokenizers::Tokenizer,
}

impl<'a> DocumentSizer<'a> {
    fn new(tokenizer: &'a tokenizers::Tokenizer, text: &str) -> DocumentSizer<'a> {
        let (starts, ends) = match tokenizer.encode(text, false) {
            Ok(encoding) => encoding.get_offsets().iter().copied().unzip(),
            Err(_) => (Vec::new(), Vec::new()),
        };
        DocumentSizer {
            base: text.as_ptr() as usize,
            len: text.len(),
            starts,
            ends,
            tokenizer,
        }
    }

    /// Tokens of the document's bytes `start..end`.
    fn tokens_in(&self, start: usize, end: usize) -> usize {
        let first = self.ends.partition_point(|&token_end| token_end <= start);
        let after = self
            .starts
            .partition_point(|&token_start| token_start < end);
        after.saturating_sub(first)
    }
}

impl text_splitter::ChunkSizer for DocumentSizer<'_> {
    fn size(&self, chunk: &str) -> usize {
        let address = chunk.as_ptr() as usize;
        match address.checked_sub(self.base) {
            Some(start) if start + chunk.len() <= self.len => {
                self.tokens_in(start, start + chunk.len())
            }
            _ => self
                .tokenizer
                .encode_fast(chunk, false)
                .map(|encoding| encoding.len())
                .unwrap_or(usize::MAX),
        }
    }
}

impl std::fmt::Debug for Chunker {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Chunker")
            .field("settings", &self.settings)
            .finish()
    }
}

impl Chunker {
    /// A chunker over `tokenizer` (padding and truncation off; see
    /// [`crate::ModelFiles::tokenizer`]).
    pub fn new(
        tokenizer: tokenizers::Tokenizer,
        settings: ChunkerSettings,
    ) -> Result<Chunker, GatewayError> {
        if settings.max_tokens == 0 || settings.max_tokens > MODEL_MAX_TOKENS - 2 {
            return Err(GatewayError::Config(format!(
                "chunk max_tokens must be between 1 and {}",
                MODEL_MAX_TOKENS - 2
            )));
        }
        ChunkConfig::new(settings.max_tokens)
            .with_overlap(settings.overlap_tokens)
            .map_err(|error| GatewayError::Config(format!("chunk overlap: {error}")))?;
        Ok(Chunker {
            tokenizer,
            settings,
        })
    }

    /// A chunker with the same tokenizer and other settings (another generation's).
    pub fn with_settings(&self, settings: ChunkerSettings) -> Result<Chunker, GatewayError> {
        Chunker::new(self.tokenizer.clone(), settings)
    }

    /// The settings it cuts by.
    pub fn settings(&self) -> ChunkerSettings {
        self.settings
    }

    /// The chunks of plain `text`, in order (none for blank text).
    pub fn chunk(&self, text: &str) -> Vec<Chunk> {
        self.chunk_extracted(&Extracted::plain(text.to_owned()))
    }

    /// The chunks of an extraction, in order, each with the section it starts in. Markdown
    /// is cut at its own structure first (headings, then blocks: a code block or a table
    /// stays whole where it fits), then as text; HTML, PDF and DOCX at every heading and page
    /// first, then as text, so that a chunk never spans two sections or two pages.
    pub fn chunk_extracted(&self, extracted: &Extracted) -> Vec<Chunk> {
        let text = extracted.text.as_str();
        let sizer = DocumentSizer::new(&self.tokenizer, text);
        let config = match ChunkConfig::new(self.settings.max_tokens)
            .with_sizer(&sizer)
            .with_overlap(self.settings.overlap_tokens)
        {
            Ok(config) => config,
            // `new` checked the same settings.
            Err(_) => return Vec::new(),
        };
        let pieces: Vec<(usize, &str)> = match extracted.format {
            Format::Markdown => MarkdownSplitter::new(config).chunk_indices(text).collect(),
            // Paged or sectioned text is cut at every page and heading first, so that each
            // chunk lies on the one page and in the one section it names.
            Format::Html | Format::Pdf | Format::Docx => {
                let splitter = TextSplitter::new(config);
                extract::segments(text.len(), &extracted.sections, &extracted.pages)
                    .into_iter()
                    .flat_map(|(start, end)| {
                        let segment = text.get(start..end).unwrap_or_default();
                        splitter
                            .chunk_indices(segment)
                            .map(move |(offset, piece)| (start + offset, piece))
                            .collect::<Vec<_>>()
                    })
                    .collect()
            }
            Format::PlainText => TextSplitter::new(config).chunk_indices(text).collect(),
        };
        pieces
            .into_iter()
            .enumerate()
            .map(|(index, (offset, piece))| Chunk {
                index: u32::try_from(index).unwrap_or(u32::MAX),
                text: piece.to_owned(),
                byte_start: offset,
                byte_end: offset + piece.len(),
                token_count: sizer.tokens_in(offset, offset + piece.len()),
                sha256: hex::encode(Sha256::digest(piece.as_bytes())),
                section: extracted.section_at(offset).map(str::to_owned),
                page: extracted.page_at(offset),
            })
            .collect()
    }
}
