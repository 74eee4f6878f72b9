//! The graph backend: a [`GraphStore`] trait free of vendor types, its Bolt implementation
//! ([`BoltGraphStore`], through `neo4rs`: ArcadeDB's Bolt plugin in the tests, Neo4j alike),
//! and the reference extractors ([`links`]).
//!
//! ## Model
//! - Nodes: `(:Dataset {name})`, `(:Source {dataset, key, head_at})`,
//!   `(:Revision {id, sha256, accepted_at, generation, dataset, source_key, head_at})`,
//!   `(:Chunk {id, revision_id, index, sha256})` (ids as the vector points'), `(:Tag {name})`,
//!   `(:Url {url})`.
//! - Edges: `CONTAINS` (dataset to source), `HAS_REVISION` (source to each projected revision),
//!   `HEAD` (source to its current revision, and only to it), `SUPERSEDES` (revision to the
//!   one it replaced), `HAS_CHUNK` and `NEXT` (chunks in order), `LINKS_TO {revision_id}`
//!   (source to source, made by the head revision's links), `TAGGED` (head revision to tag),
//!   `CITES` (head revision to URL).
//!
//! ## Invariants
//! - Writes are idempotent (`MERGE`): projecting a revision twice leaves one copy.
//! - `HEAD` moves are ordered by `head_at` (when the revision became head in the ledger): a
//!   late write of an older head never moves `HEAD` back; its own subgraph is still written.
//! - References (links, tags, URLs) belong to the current head only: a head move replaces
//!   them, a tombstone removes them, and `Tag` and `Url` nodes nothing references any more are
//!   deleted (orphan cleanup).
//! - Every call runs under a timeout; the read-back reads the graph itself, never what was
//!   sent.

mod bolt;
pub mod links;

pub use bolt::{BoltGraphStore, BoltOptions};

use async_trait::async_trait;
use uuid::Uuid;

use crate::GatewayError;

/// One chunk as the graph keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphChunk {
    /// Its id: the vector point id of (revision, index).
    pub id: Uuid,
    /// Position in the revision.
    pub index: u32,
    /// SHA-256 of its text.
    pub sha256: String,
}

/// What one revision contributes to the graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevisionGraph {
    /// Dataset.
    pub dataset: String,
    /// Source key.
    pub source_key: String,
    /// The revision.
    pub revision_id: Uuid,
    /// SHA-256 of its content.
    pub sha256: String,
    /// When it was accepted (epoch microseconds).
    pub accepted_at: i64,
    /// When it became head (its job's creation, epoch microseconds): orders `HEAD` moves.
    pub head_at: i64,
    /// The projection generation.
    pub generation: String,
    /// The revision it replaced, if any.
    pub previous_revision_id: Option<Uuid>,
    /// Its chunks, in order.
    pub chunks: Vec<GraphChunk>,
    /// Source keys of the same dataset it links to (resolved against the ledger).
    pub links: Vec<String>,
    /// External URLs it cites.
    pub urls: Vec<String>,
    /// Its submission tags.
    pub tags: Vec<String>,
}

/// What the graph holds for a revision (the read-back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GraphCounts {
    /// Whether the revision node exists.
    pub exists: bool,
    /// Chunks attached to it.
    pub chunks: usize,
    /// `NEXT` edges between its chunks.
    pub next: usize,
    /// `LINKS_TO` edges carrying it.
    pub links: usize,
    /// URLs it cites.
    pub urls: usize,
    /// Tags it carries.
    pub tags: usize,
    /// Whether its source's `HEAD` points at it.
    pub is_head: bool,
}

/// What the graph holds for a source.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SourceGraph {
    /// The revision `HEAD` points at.
    pub head: Option<Uuid>,
    /// How many `HEAD` edges leave the source (never more than one).
    pub heads: usize,
    /// Its outgoing `LINKS_TO` edges.
    pub links_out: usize,
}

/// Which way links are followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Sources this one links to.
    Out,
    /// Sources linking to this one.
    In,
    /// Both.
    Both,
}

/// A source linked to another, as the graph has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkedSource {
    /// Its key (same dataset).
    pub source_key: String,
    /// `out` (linked from the asked source) or `in` (linking to it).
    pub direction: Direction,
    /// The revision whose link made the edge.
    pub via_revision: Uuid,
    /// Its current head, as the graph has it (the caller binds it to the ledger).
    pub head: Option<Uuid>,
    /// Its head's tags.
    pub tags: Vec<String>,
}

/// A store of the projection graph.
#[async_trait]
pub trait GraphStore: Send + Sync + 'static {
    /// The store's name for receipts and logs.
    fn name(&self) -> &'static str;
    /// Where the graph lives (never a password).
    fn location(&self) -> String;
    /// Writes the revision's subgraph; when it is the newest head the graph has seen for its
    /// source, moves `HEAD` to it and replaces the source's references with its own (then
    /// deletes orphaned tags and URLs). Returns whether it moved `HEAD`.
    async fn project(&self, revision: &RevisionGraph) -> Result<bool, GatewayError>;
    /// Reads back what the graph holds for a revision.
    async fn revision_counts(&self, revision_id: Uuid) -> Result<GraphCounts, GatewayError>;
    /// A tombstone that became head at `head_at`: unless a newer head is in the graph, the
    /// source loses `HEAD` and its references; orphaned tags and URLs are deleted.
    async fn exclude(
        &self,
        dataset: &str,
        source_key: &str,
        head_at: i64,
    ) -> Result<(), GatewayError>;
    /// What the graph holds for a source.
    async fn source(&self, dataset: &str, source_key: &str) -> Result<SourceGraph, GatewayError>;
    /// Tags and URLs that nothing references (orphan cleanup leaves none).
    async fn orphans(&self) -> Result<usize, GatewayError>;
    /// Sources linked to a source.
    async fn linked(
        &self,
        dataset: &str,
        source_key: &str,
        direction: Direction,
        limit: usize,
    ) -> Result<Vec<LinkedSource>, GatewayError>;
    /// Revision ids in the graph for a dataset, with whether each is a head (for reconcile).
    async fn revisions(&self, dataset: &str) -> Result<Vec<(Uuid, bool)>, GatewayError>;
    /// Deletes a revision's subgraph (reconcile: a revision the ledger does not know).
    async fn forget_revision(&self, revision_id: Uuid) -> Result<(), GatewayError>;
    /// The revisions of a source accepted before `before` (epoch microseconds): what an
    /// erasure deletes, and its read-back expects none.
    async fn source_revisions(
        &self,
        dataset: &str,
        source_key: &str,
        before: i64,
    ) -> Result<Vec<Uuid>, GatewayError>;
    /// Deletes the source's node once nothing refers to it any more (no revision, no
    /// incoming link): the end of an erasure. Returns whether it was deleted.
    async fn forget_source(&self, dataset: &str, source_key: &str) -> Result<bool, GatewayError>;
}
