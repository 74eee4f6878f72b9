//! The graph job: projects a revision into the graph store and reads it back, on its own
//! schedule. A `graph` job is queued beside every `project` or `tombstone` job when the graph
//! backend is configured; it has its own receipt, retries and dead state, so a slow or absent
//! graph never holds up search (a revision is searchable on its relational and vector receipts
//! alone).
//!
//! ## Order (a `graph` job)
//! - Content: read the revision -> chunk it (the projection's chunker, so chunk ids equal the
//!   vector points') -> extract references (links resolved against the ledger: a link counts
//!   only when it names a current source of the same dataset) -> write the subgraph, moving
//!   `HEAD` when this is the newest head -> read back counts -> `graph` receipt `verified`.
//! - Tombstone: remove `HEAD` and the source's references, delete orphaned tags and URLs ->
//!   read back that none remain -> `graph` receipt `excluded`.
//!
//! ## Invariants
//! - Graph success is read from the graph itself, never inferred from another backend.
//! - Every stage starts with a fenced heartbeat, so a run that lost its lease stops before it
//!   writes; the graph orders `HEAD` moves by head time, so a stale run never moves it back.

use std::sync::Arc;
use std::time::Instant;

use gateways::graph::links::GraphExtractor;
use gateways::graph::{GraphChunk, RevisionGraph};
use gateways::{Chunker, GatewayError, GraphStore};
use receipts::{Backend, Failure, Job, LeaseToken, ReceiptState, ReceiptUpdate, WorkLedger};
use serde_json::json;

use crate::job::{
    backend_failure, ledger_failure, millis, permanent, record_receipt, revision_detail,
    revision_of, revision_text, Stages,
};

/// A graph store error as a job failure (`graph_unavailable`, `graph_timeout`, ...).
fn store_failure(error: GatewayError) -> Failure {
    backend_failure("graph", error)
}

/// Most link candidates looked up in the ledger per revision (a page of a thousand links
/// resolves in bounded time).
const MAX_LINK_LOOKUPS: usize = 1000;

/// What a graph job needs: the ledger, the chunker, the store and the extractors.
pub struct GraphStage {
    ledger: Arc<dyn WorkLedger>,
    chunker: Arc<Chunker>,
    store: Arc<dyn GraphStore>,
    extractors: Vec<Arc<dyn GraphExtractor>>,
    generation: String,
}

impl std::fmt::Debug for GraphStage {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("GraphStage")
            .field("store", &self.store.location())
            .finish()
    }
}

impl GraphStage {
    /// A graph stage writing into `store`; `generation` is recorded on its receipts.
    pub fn new(
        ledger: Arc<dyn WorkLedger>,
        chunker: Arc<Chunker>,
        store: Arc<dyn GraphStore>,
        extractors: Vec<Arc<dyn GraphExtractor>>,
        generation: &str,
    ) -> GraphStage {
        GraphStage {
            ledger,
            chunker,
            store,
            extractors,
            generation: generation.to_owned(),
        }
    }

    async fn receipt(
        &self,
        token: &LeaseToken,
        state: ReceiptState,
        cause: &str,
        evidence: serde_json::Value,
    ) -> Result<(), Failure> {
        record_receipt(
            self.ledger.as_ref(),
            token,
            ReceiptUpdate {
                backend: Backend::Graph,
                state,
                evidence,
                cause: cause.to_owned(),
                generation: self.generation.clone(),
            },
        )
        .await
    }

    /// Runs one `graph` job.
    pub(crate) async fn run(&self, job: &Job, token: &LeaseToken) -> Result<(), Failure> {
        let started = Instant::now();
        let mut stages = Stages::new(self.ledger.as_ref(), token, job.kind);
        stages.note("graph read");
        if let Some(erasure) = self
            .ledger
            .erasure(revision_of(job)?)
            .await
            .map_err(ledger_failure)?
        {
            self.exclude_verified(job, Some(&mut stages)).await?;
            return self.erase(job, token, &erasure, stages, started).await;
        }
        if self.is_tombstone(job).await? {
            self.exclude_verified(job, Some(&mut stages)).await?;
            return self
                .receipt(
                    token,
                    ReceiptState::Excluded,
                    "excluded: no HEAD, no links, no orphaned tags or URLs",
                    json!({
                        "heads": 0,
                        "links_out": 0,
                        "orphans": 0,
                        "total_ms": millis(started),
                        "generation": self.generation,
                    }),
                )
                .await;
        }
        let written = self.project_verified(job, Some(&mut stages)).await?;
        self.receipt(
            token,
            ReceiptState::Verified,
            if written.is_head {
                "verified: subgraph read back, HEAD moved"
            } else {
                "verified: subgraph read back (a newer head holds HEAD)"
            },
            json!({
                "chunks": written.counts.chunks,
                "links": written.counts.links,
                "urls": written.counts.urls,
                "tags": written.counts.tags,
                "head": written.is_head,
                "extractors": self.extractors.iter().map(|e| e.name()).collect::<Vec<_>>(),
                "store": self.store.location(),
                "write_ms": written.write_ms,
                "total_ms": millis(started),
                "generation": self.generation,
            }),
        )
        .await
    }

    async fn is_tombstone(&self, job: &Job) -> Result<bool, Failure> {
        Ok(revision_detail(self.ledger.as_ref(), revision_of(job)?)
            .await?
            .revision
            .tombstone)
    }

    /// Writes a content revision's subgraph and reads it back (each step announced to
    /// `stages` when a lease is held).
    async fn project_verified(
        &self,
        job: &Job,
        mut stages: Option<&mut Stages<'_>>,
    ) -> Result<Written, Failure> {
        let (revision, text) = revision_text(self.ledger.as_ref(), revision_of(job)?).await?;
        enter(&mut stages, "graph extract").await?;
        let chunker = self.chunker.clone();
        let chunk_text = text.clone();
        let chunks = tokio::task::spawn_blocking(move || chunker.chunk(&chunk_text))
            .await
            .map_err(|error| permanent("chunker_failed", format!("chunking failed: {error}")))?;
        let mut links = Vec::new();
        let mut urls = Vec::new();
        let mut lookups = 0;
        for extractor in &self.extractors {
            let found = extractor.extract(&revision.source_key, &revision.media_type, &text);
            urls.extend(found.urls);
            for candidates in found.links {
                for key in candidates {
                    if lookups >= MAX_LINK_LOOKUPS {
                        break;
                    }
                    lookups += 1;
                    if receipts::validate::source_key(&key).is_err() {
                        continue;
                    }
                    let current = self
                        .ledger
                        .source(&revision.dataset, &key)
                        .await
                        .map_err(ledger_failure)?
                        .is_some_and(|source| !source.deleted);
                    if current {
                        links.push(key);
                        break;
                    }
                }
            }
        }
        links.sort();
        links.dedup();
        urls.sort();
        urls.dedup();
        let mut tags = revision.tags.clone();
        tags.sort();
        tags.dedup();
        let graph = RevisionGraph {
            dataset: revision.dataset.clone(),
            source_key: revision.source_key.clone(),
            revision_id: revision.id,
            sha256: revision.content_sha256.clone().unwrap_or_default(),
            accepted_at: revision.accepted_at,
            head_at: job.created_at,
            generation: self.generation.clone(),
            previous_revision_id: revision.previous_revision_id,
            chunks: chunks
                .iter()
                .map(|chunk| GraphChunk {
                    id: gateways::vectors::point_id(revision.id, chunk.index),
                    index: chunk.index,
                    sha256: chunk.sha256.clone(),
                })
                .collect(),
            links,
            urls,
            tags,
        };
        enter(&mut stages, "graph write").await?;
        let step = Instant::now();
        let is_head = self.store.project(&graph).await.map_err(store_failure)?;
        let write_ms = millis(step);
        enter(&mut stages, "graph read-back").await?;
        let counts = self
            .store
            .revision_counts(revision.id)
            .await
            .map_err(store_failure)?;
        let references = |count: usize| if is_head { count } else { 0 };
        let expected = (
            true,
            graph.chunks.len(),
            graph.chunks.len().saturating_sub(1),
            references(graph.links.len()),
            references(graph.urls.len()),
            references(graph.tags.len()),
            is_head,
        );
        let found = (
            counts.exists,
            counts.chunks,
            counts.next,
            counts.links,
            counts.urls,
            counts.tags,
            counts.is_head,
        );
        if found != expected {
            return Err(store_failure(GatewayError::ReadbackMismatch {
                store: "graph",
                message: format!(
                    "wrote (exists, chunks, next, links, urls, tags, head) {expected:?}, read back {found:?}"
                ),
            }));
        }
        Ok(Written {
            is_head,
            counts,
            write_ms,
        })
    }

    /// An erasure: after the exclusion, the subgraph of every revision the erasure deleted
    /// (accepted before it) goes, and the source's node once nothing refers to it; read back
    /// that none is left. Receipt `erased`.
    async fn erase(
        &self,
        job: &Job,
        token: &LeaseToken,
        erasure: &receipts::Erasure,
        mut stages: Stages<'_>,
        started: Instant,
    ) -> Result<(), Failure> {
        stages.enter("graph erase").await?;
        let erased = self
            .store
            .source_revisions(&job.dataset, &job.source_key, erasure.erased_at)
            .await
            .map_err(store_failure)?;
        for revision in &erased {
            self.store
                .forget_revision(*revision)
                .await
                .map_err(store_failure)?;
        }
        let left = self
            .store
            .source_revisions(&job.dataset, &job.source_key, erasure.erased_at)
            .await
            .map_err(store_failure)?;
        if !left.is_empty() {
            return Err(store_failure(GatewayError::ReadbackMismatch {
                store: "graph",
                message: format!("{} erased revisions are still in the graph", left.len()),
            }));
        }
        let node_deleted = self
            .store
            .forget_source(&job.dataset, &job.source_key)
            .await
            .map_err(store_failure)?;
        drop(stages);
        self.receipt(
            token,
            ReceiptState::Erased,
            "erased: no revision, chunk, tag or link of the erased revisions is left",
            json!({
                "revisions_deleted": erased.len(),
                "revisions_left": 0,
                "source_node_deleted": node_deleted,
                "store": self.store.location(),
                "total_ms": millis(started),
                "generation": self.generation,
            }),
        )
        .await
    }

    /// Removes a deleted source's `HEAD` and references and checks that none remain.
    async fn exclude_verified(
        &self,
        job: &Job,
        mut stages: Option<&mut Stages<'_>>,
    ) -> Result<(), Failure> {
        enter(&mut stages, "graph exclude").await?;
        self.store
            .exclude(&job.dataset, &job.source_key, job.created_at)
            .await
            .map_err(store_failure)?;
        enter(&mut stages, "graph read-back").await?;
        let source = self
            .store
            .source(&job.dataset, &job.source_key)
            .await
            .map_err(store_failure)?;
        let orphans = self.store.orphans().await.map_err(store_failure)?;
        if source.heads != 0 || source.links_out != 0 || orphans != 0 {
            return Err(store_failure(GatewayError::ReadbackMismatch {
                store: "graph",
                message: format!(
                    "after the exclusion: {} HEAD edges, {} outgoing links, {orphans} orphaned \
                     tags or URLs",
                    source.heads, source.links_out
                ),
            }));
        }
        Ok(())
    }

    /// Finds drift between the ledger and the graph for `dataset`, and with `repair` fixes it:
    /// - a current head whose graph job completed but whose subgraph or `HEAD` is missing (or a
    ///   deleted source that still has a `HEAD`) is written again from the ledger;
    /// - graph revisions the ledger does not know are deleted;
    /// - a graph `HEAD` on a revision the ledger retired is moved by writing the ledger's head
    ///   again.
    ///
    /// Ledger state never changes (the receipts stay what they are); every repair is written
    /// idempotently, read back, and logged.
    pub async fn reconcile(&self, dataset: &str, repair: bool) -> Result<Reconciled, Failure> {
        let mut report = Reconciled::default();
        // The newest completed graph job of each current head of the dataset (paged).
        let mut heads: std::collections::BTreeMap<String, Job> = std::collections::BTreeMap::new();
        let mut offset = 0;
        loop {
            let page = self
                .ledger
                .find_jobs(&receipts::JobFilter {
                    states: vec![receipts::JobState::Completed],
                    dataset: Some(dataset.to_owned()),
                    allowed_datasets: None,
                    text: None,
                    error_code: None,
                    order: receipts::JobOrder::RecentlyChanged,
                    limit: receipts::operations::MAX_PAGE,
                    offset,
                    readable_by: None,
                })
                .await
                .map_err(ledger_failure)?;
            let count = page.jobs.len();
            for job in page.jobs {
                let newer_known = heads
                    .get(&job.source_key)
                    .is_some_and(|known| known.created_at >= job.created_at);
                if job.kind == receipts::JobKind::Graph && !newer_known {
                    let is_head = self
                        .ledger
                        .revision(revision_of(&job)?)
                        .await
                        .map_err(ledger_failure)?
                        .is_some_and(|detail| detail.is_head);
                    if is_head {
                        heads.insert(job.source_key.clone(), job);
                    }
                }
            }
            if count < receipts::operations::MAX_PAGE as usize {
                break;
            }
            offset += count as u32;
        }
        for (key, job) in &heads {
            report.checked += 1;
            let tombstone = self.is_tombstone(job).await?;
            let drifted = if tombstone {
                self.store
                    .source(dataset, key)
                    .await
                    .map_err(store_failure)?
                    .heads
                    != 0
            } else {
                let counts = self
                    .store
                    .revision_counts(revision_of(job)?)
                    .await
                    .map_err(store_failure)?;
                !counts.exists || !counts.is_head
            };
            if drifted {
                report
                    .missing
                    .push(format!("{key} ({})", revision_of(job)?));
                if repair {
                    if tombstone {
                        self.exclude_verified(job, None).await?;
                    } else {
                        self.project_verified(job, None).await?;
                    }
                    tracing::info!(dataset, source_key = %key, revision_id = %revision_of(job)?, "graph reconcile: rewrote a current head");
                    report.repaired += 1;
                }
            }
        }
        for (revision_id, graph_head) in
            self.store.revisions(dataset).await.map_err(store_failure)?
        {
            let detail = self
                .ledger
                .revision(revision_id)
                .await
                .map_err(ledger_failure)?;
            match detail {
                None => {
                    report.unknown.push(revision_id.to_string());
                    if repair {
                        self.store
                            .forget_revision(revision_id)
                            .await
                            .map_err(store_failure)?;
                        tracing::info!(dataset, %revision_id, "graph reconcile: deleted a revision the ledger does not know");
                        report.repaired += 1;
                    }
                }
                Some(detail) if graph_head && !detail.is_head => {
                    report
                        .stale_heads
                        .push(format!("{} ({revision_id})", detail.revision.source_key));
                    if repair {
                        if let Some(job) = heads.get(&detail.revision.source_key) {
                            if self.is_tombstone(job).await? {
                                self.exclude_verified(job, None).await?;
                            } else {
                                self.project_verified(job, None).await?;
                            }
                            tracing::info!(dataset, %revision_id, "graph reconcile: moved a stale HEAD");
                            report.repaired += 1;
                        }
                    }
                }
                Some(_) => {}
            }
        }
        Ok(report)
    }
}

/// What a graph write read back.
struct Written {
    is_head: bool,
    counts: gateways::graph::GraphCounts,
    write_ms: f64,
}

/// Enters a stage when a lease is held (a job run); a reconcile holds none.
async fn enter(stages: &mut Option<&mut Stages<'_>>, stage: &'static str) -> Result<(), Failure> {
    match stages {
        Some(stages) => stages.enter(stage).await,
        None => Ok(()),
    }
}

/// What [`GraphStage::reconcile`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Reconciled {
    /// Current heads checked (those whose graph job completed).
    pub checked: usize,
    /// Current heads missing from the graph (or deleted sources still with a `HEAD`).
    pub missing: Vec<String>,
    /// Graph revisions the ledger does not know.
    pub unknown: Vec<String>,
    /// Graph `HEAD`s on revisions the ledger retired.
    pub stale_heads: Vec<String>,
    /// Repairs made.
    pub repaired: usize,
}
