//! Embedding: turning chunk and query texts into unit vectors.
//!
//! ## Models
//! A model is named by its id, which every generation records (with its dimension): changing
//! the model is a new generation, never a silent change under existing vectors.
//! - Local models ship with cairn ([`LOCAL_MODELS`], built by `scripts/setup-model`):
//!   all-MiniLM-L6-v2 in fp32 ([`MINILM`], the default) and in int8 ([`MINILM_INT8`]).
//! - A remote model is served by an OpenAI-compatible `/v1/embeddings` server
//!   ([`RemoteEmbedder`]); its id names the model and the server
//!   (`openai:MODEL@URL`, [`remote_model_id`]), so moving to another server is a new
//!   generation too.
//!
//! ## Invariants
//! - Every vector an [`Embedder`] returns is L2-normalised and has its model's dimension; an
//!   answer that is not (a server that returned too few vectors, or another dimension) is an
//!   error, never a vector stored.
//! - Model inference never runs on the async executor.
//! - [`Embedders`] hands out the embedder of a model id, loading it on first use; each
//!   generation is embedded, and its queries answered, with its own model.

mod batching;
mod catalog;
mod local;
mod remote;

use std::sync::Arc;

use async_trait::async_trait;

pub use batching::BatchingEmbedder;
pub use catalog::{CatalogOptions, ModelCatalog, ModelEntry};
pub use local::{LocalEmbedder, ModelFiles, DEFAULT_EMBED_BATCH};
pub use remote::{remote_model_id, RemoteEmbedder, RemoteOptions, MAX_RETRY_AFTER};

use crate::GatewayError;

/// A model that ships with cairn, run in process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalModel {
    /// Its id, as generations record it.
    pub id: &'static str,
    /// Its directory under the models directory.
    pub directory: &'static str,
    /// Its output dimension.
    pub dimension: usize,
    /// Its window in tokens, including `[CLS]` and `[SEP]`.
    pub max_tokens: usize,
    /// What it is, for listings and error messages.
    pub description: &'static str,
    /// The least cosine between two embeddings of the same text ([`Embedder::agreement`]).
    pub agreement: f32,
}

/// sentence-transformers/all-MiniLM-L6-v2 in fp32: the default model.
pub const MINILM: LocalModel = LocalModel {
    id: "sentence-transformers/all-MiniLM-L6-v2",
    directory: "all-MiniLM-L6-v2",
    dimension: 384,
    max_tokens: 256,
    description: "all-MiniLM-L6-v2, fp32 (the default)",
    agreement: STABLE_AGREEMENT,
};

/// The same weights quantized to int8 by ONNX Runtime's dynamic quantization (MatMul weights,
/// per channel): faster, with vectors at cosine about 0.995 of fp32's, so its own model.
pub const MINILM_INT8: LocalModel = LocalModel {
    id: "sentence-transformers/all-MiniLM-L6-v2@int8",
    directory: "all-MiniLM-L6-v2-int8",
    dimension: 384,
    max_tokens: 256,
    description: "all-MiniLM-L6-v2, int8 (dynamic quantization of MatMul weights, per channel)",
    // Dynamic quantization scales activations over the whole batch tensor (padding included),
    // so a text's vector depends on the batch it was embedded in: measured down to cosine 0.968
    // for a one-token text alone against padded in a batch of seven (0.997 for a typical one).
    agreement: 0.95,
};

/// Every local model, default first.
pub const LOCAL_MODELS: [LocalModel; 2] = [MINILM, MINILM_INT8];

/// The local model with `id`.
pub fn local_model(id: &str) -> Option<&'static LocalModel> {
    LOCAL_MODELS.iter().find(|model| model.id == id)
}

/// The default model's id, recorded in receipts and the projection generation.
pub const MODEL_ID: &str = MINILM.id;
/// The default model's dimension.
pub const MODEL_DIMENSION: usize = MINILM.dimension;
/// The default model's window in tokens, including `[CLS]` and `[SEP]` (the chunker's bound
/// for every model: chunks are measured with this model's tokenizer).
pub const MODEL_MAX_TOKENS: usize = MINILM.max_tokens;
/// The ONNX Runtime library file `scripts/setup-model` installs.
pub const ORT_LIBRARY: &str = "onnxruntime/libonnxruntime.so.1.31.1";
/// The default model's directory under the models directory.
pub const MODEL_DIRECTORY: &str = MINILM.directory;

/// The agreement of a model whose vectors do not depend on the batch (fp32 in process): two
/// embeddings of the same text differ by float rounding only.
pub const STABLE_AGREEMENT: f32 = 0.999;

/// The agreement assumed of a remote server (it may batch in reduced precision).
pub const REMOTE_AGREEMENT: f32 = 0.99;

/// Turns texts into unit vectors. Implementations run the model off the async executor.
#[async_trait]
pub trait Embedder: Send + Sync + 'static {
    /// The model id (e.g. `sentence-transformers/all-MiniLM-L6-v2`).
    fn model_id(&self) -> &str;
    /// The vectors' dimension.
    fn dimension(&self) -> usize;
    /// The least cosine between two embeddings of the same text by this model, in whatever
    /// batches: what a check that embeds a stored chunk again may expect (verify's deep tier).
    fn agreement(&self) -> f32 {
        STABLE_AGREEMENT
    }
    /// One L2-normalised vector per text, in order.
    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, GatewayError>;
}

/// What an embedder is for: projection batches many texts across jobs; queries run on their
/// own session so a query never waits behind a projection batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EmbedRole {
    /// Chunks of projection jobs.
    Projection,
    /// Search queries.
    Query,
}

/// The embedders of every model this process can run, by model id.
#[async_trait]
pub trait Embedders: Send + Sync {
    /// The embedder of `model` for `role`, loaded on first use. A model this process cannot
    /// run is [`GatewayError::ModelMissing`] (its message says what is configured).
    async fn embedder(
        &self,
        model: &str,
        role: EmbedRole,
    ) -> Result<Arc<dyn Embedder>, GatewayError>;
}

/// One embedder serving its own model for every role (tests and tools that run one model).
#[derive(Clone)]
pub struct OneModel(pub Arc<dyn Embedder>);

impl std::fmt::Debug for OneModel {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_tuple("OneModel")
            .field(&self.0.model_id())
            .finish()
    }
}

#[async_trait]
impl Embedders for OneModel {
    async fn embedder(
        &self,
        model: &str,
        _role: EmbedRole,
    ) -> Result<Arc<dyn Embedder>, GatewayError> {
        if model == self.0.model_id() {
            Ok(self.0.clone())
        } else {
            Err(GatewayError::ModelMissing(format!(
                "model {model} is not loaded here; this process embeds with {}",
                self.0.model_id()
            )))
        }
    }
}

/// `vector` scaled to unit length (a zero vector stays zero).
pub fn normalized(mut vector: Vec<f32>) -> Vec<f32> {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        for x in &mut vector {
            *x /= norm;
        }
    }
    vector
}
