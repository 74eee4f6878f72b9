//! # gateways: adapters to real stores
//!
//! Each store cairn projects into sits behind a small capability trait with a real
//! implementation here: the embedding models ([`Embedder`]: local ones through fastembed, or an OpenAI-compatible server), the chunker
//! ([`Chunker`], the model's own tokenizer), relational chunk rows and vectors ([`VectorStore`]:
//! qdrant-edge in process, or a Qdrant server through `qdrant-client`). Depends on
//! `receipts` (the domain) and `extract` (format extraction) only; the worker composes these into
//! the projection job.
//!
//! ## Invariants
//! - No trait here names a vendor type (fastembed, qdrant-edge, sqlx): other implementations
//!   (a Qdrant server, Postgres) fit behind the same traits.
//! - Every write has a read-back that checks what the store holds, not what was sent.
//! - Model inference never runs on the async executor (tokio's blocking pool).
//! - Errors are typed ([`GatewayError`]); the worker classifies them for retries by type.

pub mod chunker;
pub mod embedder;
pub mod graph;
mod retry;
pub mod vectors;

pub use chunker::{Chunk, Chunker, ChunkerSettings};
pub use embedder::{
    BatchingEmbedder, EmbedRole, Embedder, Embedders, LocalEmbedder, ModelCatalog, ModelFiles,
    OneModel, RemoteEmbedder, RemoteOptions,
};
pub use graph::{BoltGraphStore, BoltOptions, GraphStore};
pub use vectors::{
    CollectionLayout, CurrentChange, EdgeVectorStore, FieldKind, OneStore, OptimizePolicy,
    OptimizerStats, PayloadFilter, PointFacts, PointSelector, RevisionPoints, ServerOptions,
    ServerVectorStore, VectorHit, VectorPoint, VectorStore, VectorStores,
};

/// What can go wrong in a store.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GatewayError {
    /// The model files are missing or unreadable (setup has not run).
    #[error("embedding model unavailable: {0}")]
    ModelMissing(String),
    /// The model failed on an input.
    #[error("embedding failed: {0}")]
    Embedder(String),
    /// A store refused or failed a write or read (retryable).
    #[error("{store} unavailable: {message}")]
    Unavailable {
        /// Which store.
        store: &'static str,
        /// What it said.
        message: String,
    },
    /// A store did not answer within its time limit (retryable).
    #[error("{store} timed out: {message}")]
    Timeout {
        /// Which store.
        store: &'static str,
        /// What it said.
        message: String,
    },
    /// A store asked to be called again later (HTTP 429): retryable after `retry_after`,
    /// without charging the job an attempt.
    #[error("{store} is rate limited (retry after {retry_after:?}): {message}")]
    RateLimited {
        /// Which store.
        store: &'static str,
        /// How long it asked to wait.
        retry_after: std::time::Duration,
        /// What it said.
        message: String,
    },
    /// A store refused a request as invalid (permanent: sending it again cannot help).
    #[error("{store} rejected the request: {message}")]
    Rejected {
        /// Which store.
        store: &'static str,
        /// What it said.
        message: String,
    },
    /// A read-back found something other than what was written.
    #[error("read-back mismatch in {store}: {message}")]
    ReadbackMismatch {
        /// Which store.
        store: &'static str,
        /// What differs.
        message: String,
    },
    /// The configuration cannot work (e.g. a generation changed under existing data).
    #[error("{0}")]
    Config(String),
}
