//! Chunking by the embedding model's own tokenizer (text-splitter): every chunk fits the
//! model's window, neighbouring chunks overlap by a configurable number of tokens, and
//! boundaries prefer paragraphs, then sentences, then words. Deterministic for the same text.

use sha2::{Digest, Sha256};
use text_splitter::{ChunkConfig, TextSplitter};

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
            "text-splitter-0.33/max{}/overlap{}",
            self.max_tokens, self.overlap_tokens
        )
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
}

/// Cuts text into chunks that fit the model.
pub struct Chunker {
    splitter: TextSplitter<tokenizers::Tokenizer>,
    tokenizer: tokenizers::Tokenizer,
    settings: ChunkerSettings,
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
        let config = ChunkConfig::new(settings.max_tokens)
            .with_sizer(tokenizer.clone())
            .with_overlap(settings.overlap_tokens)
            .map_err(|error| GatewayError::Config(format!("chunk overlap: {error}")))?;
        Ok(Chunker {
            splitter: TextSplitter::new(config),
            tokenizer,
            settings,
        })
    }

    /// The settings it cuts by.
    pub fn settings(&self) -> ChunkerSettings {
        self.settings
    }

    /// The chunks of `text`, in order (none for blank text).
    pub fn chunk(&self, text: &str) -> Vec<Chunk> {
        self.splitter
            .chunk_indices(text)
            .enumerate()
            .map(|(index, (offset, piece))| Chunk {
                index: u32::try_from(index).unwrap_or(u32::MAX),
                text: piece.to_owned(),
                byte_start: offset,
                byte_end: offset + piece.len(),
                token_count: self
                    .tokenizer
                    .encode_fast(piece, false)
                    .map(|encoding| encoding.len())
                    .unwrap_or(0),
                sha256: hex::encode(Sha256::digest(piece.as_bytes())),
            })
            .collect()
    }
}
