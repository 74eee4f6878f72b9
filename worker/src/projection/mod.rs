//! The projection job: turns a revision's retained bytes into chunk rows, embeddings and
//! vector points, reads every write back, and records one receipt per backend.
//!
//! ## Order (a `project` job)
//! relational write -> read-back -> embed -> vector write (visible) -> read-back -> mark the
//! source's other revisions not current (durable: it puts the points on disk too) -> receipts.
//! Ledger writes (chunk rows, receipts) are fenced by
//! the lease; each stage starts with a fenced heartbeat that names the stage (the dashboard's
//! "stage" column), so a run that lost its lease stops before writing. A `tombstone` job marks
//! every revision of the source not current,
//! reads that back, and records `excluded` receipts; it writes no content. A `tombstone` job of
//! an erasure deletes the points of the source's erased revisions instead, reads back none,
//! and records `erased` receipts.
//!
//! ## Invariants
//! - Reconcile before writing: rows or points that already exist and verify are recorded as
//!   verified with `reconciled: true`, not written again.
//! - A stale run can never leave an old revision current: if its final receipt write is
//!   fenced out and its revision is no longer head, it retires its own points; the newer
//!   job's `set_current` step covers anything it left before that.
//! - Errors are classified by type ([`GatewayError`] and [`LedgerError`] variants), never by
//!   message text.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use gateways::{Chunker, Embedder, GatewayError, PointFacts, VectorPoint, VectorStore};
use receipts::{
    Backend, ChunkRow, ChunkSummary, Failure, Generation, Job, JobKind, LeaseToken, ReceiptState,
    ReceiptUpdate, WorkLedger,
};
use serde_json::json;

use crate::job::{
    extract, inline, ledger_failure, millis, permanent, record_receipt, retryable, revision_bytes,
    revision_of, store_failure, Stages,
};
use crate::Work;

mod unit;

/// Which projections run together as a unit ([`crate::unit`]): text documents of at most
/// `max_bytes` (larger ones, and binary formats, take the lone path inside their unit), their
/// chunks embedded, written and read back in batches of at most `max_chunks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitSettings {
    /// Largest document (bytes) projected in a unit's shared batch.
    pub max_bytes: usize,
    /// Most chunks in one of a unit's batches.
    pub max_chunks: usize,
}

impl Default for UnitSettings {
    /// 16 KiB documents (read and chunked inline, see `job::INLINE_BYTES`), 256 chunks.
    fn default() -> Self {
        UnitSettings {
            max_bytes: crate::job::INLINE_BYTES,
            max_chunks: 256,
        }
    }
}

/// The stores a projection writes to.
#[derive(Clone)]
pub struct Projector {
    ledger: Arc<dyn WorkLedger>,
    embedder: Arc<dyn Embedder>,
    chunker: Arc<Chunker>,
    vectors: Option<Arc<dyn VectorStore>>,
    generation: Generation,
    graph: Option<Arc<crate::graph::GraphStage>>,
    units: UnitSettings,
}

impl std::fmt::Debug for Projector {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Projector")
            .field("generation", &self.generation)
            .finish()
    }
}

impl Projector {
    /// A projector for `generation`. `vectors` is required when the generation includes the
    /// vector backend.
    pub fn new(
        ledger: Arc<dyn WorkLedger>,
        embedder: Arc<dyn Embedder>,
        chunker: Arc<Chunker>,
        vectors: Option<Arc<dyn VectorStore>>,
        generation: Generation,
    ) -> Result<Projector, GatewayError> {
        if generation.backends.contains(&Backend::Vector) && vectors.is_none() {
            return Err(GatewayError::Config(
                "the vector backend is configured but no vector store is open".to_owned(),
            ));
        }
        Ok(Projector {
            ledger,
            embedder,
            chunker,
            vectors,
            generation,
            graph: None,
            units: UnitSettings::default(),
        })
    }

    /// A projector for another generation (its own embedder, chunker and vector store),
    /// sharing this one's ledger; it runs no graph jobs (those belong to no generation).
    pub fn for_generation(
        &self,
        generation: Generation,
        embedder: Arc<dyn Embedder>,
        chunker: Arc<Chunker>,
        vectors: Option<Arc<dyn VectorStore>>,
    ) -> Result<Projector, GatewayError> {
        Projector::new(self.ledger.clone(), embedder, chunker, vectors, generation)
            .map(|projector| projector.with_units(self.units))
    }

    /// The same projector, running units with `units`.
    pub fn with_units(mut self, units: UnitSettings) -> Projector {
        self.units = units;
        self
    }

    /// Its embedder.
    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.embedder
    }

    /// The generation it writes.
    pub fn generation(&self) -> &Generation {
        &self.generation
    }

    /// Its chunker.
    pub fn chunker(&self) -> &Arc<Chunker> {
        &self.chunker
    }

    /// The same projector, also running `graph` jobs with `graph`.
    pub fn with_graph(mut self, graph: crate::graph::GraphStage) -> Projector {
        self.graph = Some(Arc::new(graph));
        self
    }

    fn has(&self, backend: Backend) -> bool {
        self.generation.backends.contains(&backend)
    }

    async fn receipt(
        &self,
        token: &LeaseToken,
        backend: Backend,
        state: ReceiptState,
        cause: &str,
        evidence: serde_json::Value,
    ) -> Result<(), Failure> {
        record_receipt(
            self.ledger.as_ref(),
            token,
            ReceiptUpdate {
                backend,
                state,
                evidence,
                cause: cause.to_owned(),
                generation: self.generation.id.clone(),
            },
        )
        .await
    }

    async fn project(&self, job: &Job, token: &LeaseToken) -> Result<(), Failure> {
        let started = Instant::now();
        let mut stages = Stages::new(self.ledger.as_ref(), token, job.kind);
        stages.note("reading");
        let (revision, bytes) = revision_bytes(self.ledger.as_ref(), revision_of(job)?).await?;
        stages.note("chunking");
        let (chunks, chunks_from) = self.chunks_of(&revision, bytes).await?;
        let chunk_ms = millis(started);
        let expected = ChunkSummary::of(chunks.iter().map(|chunk| chunk.sha256.as_str()));
        let tokens: usize = chunks.iter().map(|chunk| chunk.token_count).sum();

        // Relational: chunk rows in the ledger, read back by count and checksum.
        if self.has(Backend::Relational) {
            stages.note("relational write");
            let step = Instant::now();
            let existing = self
                .ledger
                .chunk_summary(revision_of(job)?, &self.generation.id)
                .await
                .map_err(ledger_failure)?;
            let reconciled = existing == expected;
            if !reconciled {
                let rows = rows_of(&chunks);
                self.ledger
                    .write_chunks(token, &self.generation.id, rows)
                    .await
                    .map_err(ledger_failure)?;
                let stored = self
                    .ledger
                    .chunk_summary(revision_of(job)?, &self.generation.id)
                    .await
                    .map_err(ledger_failure)?;
                if stored != expected {
                    return Err(store_failure(GatewayError::ReadbackMismatch {
                        store: "relational",
                        message: format!(
                            "wrote {} chunk rows (checksum {}), read back {} (checksum {})",
                            expected.count, expected.checksum, stored.count, stored.checksum
                        ),
                    }));
                }
            }
            self.receipt(
                token,
                Backend::Relational,
                ReceiptState::Verified,
                if reconciled {
                    "verified: rows already present (reconciled)"
                } else {
                    "verified: rows read back"
                },
                json!({
                    "rows": expected.count,
                    "checksum": expected.checksum,
                    "tokens": tokens,
                    "reconciled": reconciled,
                    "chunks_from": chunks_from,
                    "chunk_ms": chunk_ms,
                    "write_ms": millis(step),
                    "generation": self.generation.id,
                }),
            )
            .await?;
        }

        // Vector: embed, upsert, read back, then make this revision the source's current one.
        if let (true, Some(vectors)) = (self.has(Backend::Vector), &self.vectors) {
            let count = chunks.len();
            let existing = vectors
                .revision_points(revision_of(job)?)
                .await
                .map_err(store_failure)?;
            let reconciled =
                count > 0 && existing.count == count && existing.with_dimension == count;
            let mut embed_ms = 0.0;
            let mut write_ms = 0.0;
            let mut reused = 0;
            // The readers the upsert wrote (`None`: it wrote none).
            let mut written_readers: Option<Option<Vec<String>>> = None;
            if !reconciled {
                stages.note("embedding");
                let step = Instant::now();
                let (vectors_out, chunks_reused) =
                    self.embed_or_reuse(job, vectors.as_ref(), &chunks).await?;
                reused = chunks_reused;
                embed_ms = millis(step);
                stages.enter("vector write").await?;
                let step = Instant::now();
                // What a search filter tests, carried by every point for the store's prefilter,
                // with the source's readers as the ledger holds them now (checked again once
                // the points are current).
                let access = self
                    .ledger
                    .access_of(&job.dataset, &job.source_key)
                    .await
                    .map_err(ledger_failure)?;
                written_readers = Some(access.readers.clone());
                let facts = Arc::new(PointFacts {
                    tags: revision.tags.clone(),
                    media_type: revision.media_type.clone(),
                    metadata: revision.metadata.clone(),
                    accepted_at: revision.accepted_at,
                    readers: access.readers.unwrap_or_default(),
                });
                let points = chunks
                    .iter()
                    .zip(vectors_out)
                    .map(|(chunk, vector)| VectorPoint {
                        dataset: job.dataset.clone(),
                        source_key: job.source_key.clone(),
                        revision_id: revision.id,
                        chunk_index: chunk.index,
                        head_at: job.created_at,
                        vector,
                        facts: Some(facts.clone()),
                    })
                    .collect();
                // Visible at once, durable with `set_current` below (one flush per run, not
                // two): nothing is verified before that write returns.
                vectors
                    .upsert_visible(points)
                    .await
                    .map_err(store_failure)?;
                write_ms = millis(step);
                self.receipt(
                    token,
                    Backend::Vector,
                    ReceiptState::Written,
                    "written: points upserted, read-back pending",
                    json!({
                        "points": count,
                        "embedded": count - reused,
                        "reused": reused,
                        "embed_ms": embed_ms,
                        "write_ms": write_ms,
                    }),
                )
                .await?;
            }
            stages.note("read-back");
            let step = Instant::now();
            let stored = vectors
                .revision_points(revision_of(job)?)
                .await
                .map_err(store_failure)?;
            if stored.count != count || stored.with_dimension != count {
                return Err(store_failure(GatewayError::ReadbackMismatch {
                    store: "vector",
                    message: format!(
                        "expected {count} points of dimension {}, read back {} ({} with that dimension)",
                        vectors.dimension(),
                        stored.count,
                        stored.with_dimension
                    ),
                }));
            }
            stages.enter("making current").await?;
            vectors
                .set_current(
                    &job.dataset,
                    &job.source_key,
                    Some(revision_of(job)?),
                    job.created_at,
                )
                .await
                .map_err(store_failure)?;
            // An access change that landed while the points were written (or points already
            // present, whose readers this run did not write) gets its readers written now:
            // the change queued no access job while this projection was open.
            let now_readers = self
                .ledger
                .access_of(&job.dataset, &job.source_key)
                .await
                .map_err(ledger_failure)?
                .readers;
            if written_readers.as_ref() != Some(&now_readers) {
                crate::access::refresh(
                    self.ledger.as_ref(),
                    vectors.as_ref(),
                    &job.dataset,
                    &job.source_key,
                )
                .await?;
            }
            let verified = self
                .receipt(
                    token,
                    Backend::Vector,
                    ReceiptState::Verified,
                    if reconciled {
                        "verified: points already present (reconciled)"
                    } else {
                        "verified: points read back"
                    },
                    json!({
                        "points": count,
                        "dimension": vectors.dimension(),
                        "model": self.embedder.model_id(),
                        "store": vectors.name(),
                        "reconciled": reconciled,
                        "embedded": if reconciled { 0 } else { count - reused },
                        "reused": reused,
                        "embed_ms": embed_ms,
                        "write_ms": write_ms,
                        "readback_ms": millis(step),
                        "total_ms": millis(started),
                        "generation": self.generation.id,
                    }),
                )
                .await;
            if let Err(failure) = verified {
                self.retire_if_stale(job).await;
                return Err(failure);
            }
        }
        Ok(())
    }

    /// The chunks' vectors, in order: reused from the vector store where a chunk of the same
    /// text already has a vector in this dataset and generation (found through the ledger's
    /// chunk rows; copied under the new point id by the upsert), embedded otherwise. Returns
    /// them with how many were reused. A candidate whose point is missing is simply embedded.
    async fn embed_or_reuse(
        &self,
        job: &Job,
        store: &dyn VectorStore,
        chunks: &[gateways::Chunk],
    ) -> Result<(Vec<Vec<f32>>, usize), Failure> {
        let mut hashes: Vec<String> = chunks.iter().map(|chunk| chunk.sha256.clone()).collect();
        hashes.sort();
        hashes.dedup();
        let candidates = self
            .ledger
            .chunks_with_hashes(
                &job.dataset,
                &self.generation.id,
                &hashes,
                revision_of(job)?,
            )
            .await
            .map_err(ledger_failure)?;
        let ids: Vec<uuid::Uuid> = candidates
            .iter()
            .map(|candidate| {
                gateways::vectors::point_id(candidate.revision_id, candidate.chunk_index)
            })
            .collect();
        let found = if ids.is_empty() {
            Vec::new()
        } else {
            store.vectors(&ids).await.map_err(store_failure)?
        };
        let by_hash: std::collections::HashMap<&str, Vec<f32>> = candidates
            .iter()
            .zip(found)
            .filter_map(|(candidate, vector)| {
                vector.map(|vector| (candidate.sha256.as_str(), vector))
            })
            .collect();
        let mut out: Vec<Option<Vec<f32>>> = chunks
            .iter()
            .map(|chunk| by_hash.get(chunk.sha256.as_str()).cloned())
            .collect();
        let missing: Vec<usize> = out
            .iter()
            .enumerate()
            .filter_map(|(index, vector)| vector.is_none().then_some(index))
            .collect();
        let reused = chunks.len() - missing.len();
        if !missing.is_empty() {
            let embedded = self
                .embedder
                .embed(
                    missing
                        .iter()
                        .map(|index| chunks[*index].text.clone())
                        .collect(),
                )
                .await
                .map_err(store_failure)?;
            if embedded.len() != missing.len() {
                return Err(store_failure(GatewayError::Embedder(format!(
                    "{} vectors for {} texts",
                    embedded.len(),
                    missing.len()
                ))));
            }
            for (index, vector) in missing.into_iter().zip(embedded) {
                out[index] = Some(vector);
            }
        }
        Ok((out.into_iter().flatten().collect(), reused))
    }

    /// The chunks of a revision whose bytes equal its predecessor's (a change of tags or
    /// metadata only), copied from the predecessor's chunk rows in this generation instead of
    /// cutting the same text again: the chunker is deterministic for the same bytes and
    /// settings, and a revision's rows are written whole or not at all. `None` when there is
    /// no such predecessor, or it has no rows here.
    async fn predecessor_chunks(
        &self,
        revision: &receipts::Revision,
    ) -> Result<Option<Vec<gateways::Chunk>>, Failure> {
        let Some(previous) = revision.previous_revision_id else {
            return Ok(None);
        };
        let Some(detail) = self
            .ledger
            .revision(previous)
            .await
            .map_err(ledger_failure)?
        else {
            return Ok(None);
        };
        if detail.revision.content_sha256.is_none()
            || detail.revision.content_sha256 != revision.content_sha256
        {
            return Ok(None);
        }
        let rows = self
            .ledger
            .chunks(previous, &self.generation.id)
            .await
            .map_err(ledger_failure)?;
        if rows.is_empty() {
            return Ok(None);
        }
        rows.into_iter()
            .map(|row| {
                let number = |value: i64| {
                    usize::try_from(value)
                        .map_err(|_| permanent("ledger_error", "a negative chunk row field"))
                };
                Ok(gateways::Chunk {
                    index: u32::try_from(row.chunk_index)
                        .map_err(|_| permanent("ledger_error", "a chunk index out of range"))?,
                    byte_start: number(row.byte_start)?,
                    byte_end: number(row.byte_end)?,
                    token_count: number(row.token_count)?,
                    text: row.text,
                    sha256: row.sha256,
                    section: row.section,
                    page: row.page.and_then(|page| u32::try_from(page).ok()),
                })
            })
            .collect::<Result<Vec<_>, Failure>>()
            .map(Some)
    }

    /// A revision's chunks, and where they came from: its predecessor's rows when the bytes
    /// are the same (`predecessor`), else the chunker (`chunker`; inline for a small text
    /// document, on the blocking pool otherwise).
    async fn chunks_of(
        &self,
        revision: &receipts::Revision,
        bytes: Vec<u8>,
    ) -> Result<(Vec<gateways::Chunk>, &'static str), Failure> {
        let copied = self.predecessor_chunks(revision).await?;
        let chunks_from = if copied.is_some() {
            "predecessor"
        } else {
            "chunker"
        };
        let chunks = match copied {
            Some(chunks) => chunks,
            None => {
                let extracted = extract(revision, bytes).await?;
                let chunker = self.chunker.clone();
                if inline(
                    extract::Format::of(&revision.media_type),
                    revision.byte_length,
                ) {
                    chunker.chunk_extracted(&extracted)
                } else {
                    tokio::task::spawn_blocking(move || chunker.chunk_extracted(&extracted))
                        .await
                        .map_err(|error| {
                            permanent("chunker_failed", format!("chunking failed: {error}"))
                        })?
                }
            }
        };
        Ok((chunks, chunks_from))
    }

    /// A job that waited (a revision scheduled from a later instant, or a retry) first makes
    /// sure its revision is the head once its validity has begun; a job queued to run at once
    /// projects the head acceptance just moved, and costs no extra write.
    async fn boundary(&self, job: &Job, token: &LeaseToken) -> Result<(), Failure> {
        if job.run_at > job.created_at
            && !matches!(job.kind, JobKind::Sync | JobKind::Access)
            && !self
                .ledger
                .cross_boundary(token)
                .await
                .map_err(ledger_failure)?
        {
            return Err(retryable(
                "lease_lost",
                "a later assertion overrode the revision at its boundary: the job was superseded",
            ));
        }
        Ok(())
    }

    /// After a fenced-out final write: if the revision is no longer head, its points must not
    /// stay current.
    async fn retire_if_stale(&self, job: &Job) {
        let Some(vectors) = &self.vectors else { return };
        let Some(revision_id) = job.revision_id else {
            return;
        };
        let is_head = match self.ledger.revision(revision_id).await {
            Ok(Some(detail)) => detail.is_head,
            _ => false,
        };
        let erased = matches!(self.ledger.revision(revision_id).await, Ok(None));
        if erased {
            // The revision was erased while this run wrote: its points go too.
            let selector = gateways::PointSelector::Revision(revision_id);
            if let Err(error) = vectors.delete_points(selector).await {
                tracing::warn!(job_id = %job.id, revision_id = %revision_id, %error, "could not delete the points of an erased revision written by a stale run");
            }
            return;
        }
        if !is_head {
            if let Err(error) = vectors.retire_revision(revision_id).await {
                tracing::warn!(job_id = %job.id, revision_id = %revision_id, %error, "could not retire a stale revision's points; the newer job's set_current covers them");
            }
        }
    }

    async fn exclude(&self, job: &Job, token: &LeaseToken) -> Result<(), Failure> {
        if let Some(erasure) = self
            .ledger
            .erasure(revision_of(job)?)
            .await
            .map_err(ledger_failure)?
        {
            return self.erase(job, token, &erasure).await;
        }
        let started = Instant::now();
        let mut stages = Stages::new(self.ledger.as_ref(), token, job.kind);
        if self.has(Backend::Relational) {
            stages.note("relational exclude");
            self.receipt(
                token,
                Backend::Relational,
                ReceiptState::Excluded,
                "excluded: the source is deleted (lexical passages removed at acceptance)",
                json!({ "generation": self.generation.id }),
            )
            .await?;
        }
        if let (true, Some(vectors)) = (self.has(Backend::Vector), &self.vectors) {
            stages.enter("vector exclude").await?;
            vectors
                .set_current(&job.dataset, &job.source_key, None, job.created_at)
                .await
                .map_err(store_failure)?;
            let current = vectors
                .source_current(&job.dataset, &job.source_key)
                .await
                .map_err(store_failure)?;
            if current != 0 {
                return Err(store_failure(GatewayError::ReadbackMismatch {
                    store: "vector",
                    message: format!("{current} points of the deleted source are still current"),
                }));
            }
            self.receipt(
                token,
                Backend::Vector,
                ReceiptState::Excluded,
                "excluded: no point of the source is current",
                json!({ "current_points": 0, "total_ms": millis(started), "generation": self.generation.id }),
            )
            .await?;
        }
        Ok(())
    }
}

/// The relational backend's rows of `chunks`.
fn rows_of(chunks: &[gateways::Chunk]) -> Vec<ChunkRow> {
    chunks
        .iter()
        .map(|chunk| ChunkRow {
            chunk_index: i64::from(chunk.index),
            text: chunk.text.clone(),
            byte_start: chunk.byte_start as i64,
            byte_end: chunk.byte_end as i64,
            token_count: chunk.token_count as i64,
            sha256: chunk.sha256.clone(),
            section: chunk.section.clone(),
            page: chunk.page.map(i64::from),
        })
        .collect()
}

impl Projector {
    /// An erasure's job: the ledger already deleted the source's earlier revisions (its
    /// read-back must show nothing left); the vector store deletes their points, in this
    /// job's generation, and reads back none. Receipts `erased`, with the evidence.
    async fn erase(
        &self,
        job: &Job,
        token: &LeaseToken,
        erasure: &receipts::Erasure,
    ) -> Result<(), Failure> {
        let started = Instant::now();
        let mut stages = Stages::new(self.ledger.as_ref(), token, job.kind);
        if self.has(Backend::Relational) {
            stages.note("relational erase");
            if erasure.remaining != receipts::ErasureRemaining::default() {
                return Err(retryable(
                    "readback_mismatch",
                    format!(
                        "the ledger still holds part of the erased source: {:?}",
                        erasure.remaining
                    ),
                ));
            }
            self.receipt(
                token,
                Backend::Relational,
                ReceiptState::Erased,
                "erased: no revision, chunk row, passage or unshared content of the source is \
                 left in the ledger",
                json!({
                    "revisions_erased": erasure.revisions_erased,
                    "contents_deleted": erasure.contents_deleted,
                    "chunk_rows_deleted": erasure.chunk_rows_deleted,
                    "content_sha256": erasure.content_sha256,
                    "remaining": erasure.remaining,
                    "generation": self.generation.id,
                }),
            )
            .await?;
        }
        if let (true, Some(vectors)) = (self.has(Backend::Vector), &self.vectors) {
            stages.enter("vector erase").await?;
            let selector = gateways::PointSelector::Source {
                dataset: job.dataset.clone(),
                source_key: job.source_key.clone(),
                head_before: erasure.erased_at,
            };
            let before = vectors
                .count_points(selector.clone())
                .await
                .map_err(store_failure)?;
            vectors
                .delete_points(selector.clone())
                .await
                .map_err(store_failure)?;
            let left = vectors
                .count_points(selector)
                .await
                .map_err(store_failure)?;
            if left != 0 {
                return Err(store_failure(GatewayError::ReadbackMismatch {
                    store: "vector",
                    message: format!("{left} points of the erased source are still stored"),
                }));
            }
            self.receipt(
                token,
                Backend::Vector,
                ReceiptState::Erased,
                "erased: no point of the source's erased revisions is left",
                json!({
                    "points_deleted": before,
                    "points_left": 0,
                    "store": vectors.name(),
                    "location": vectors.location(),
                    "total_ms": millis(started),
                    "generation": self.generation.id,
                }),
            )
            .await?;
        }
        Ok(())
    }
}

#[async_trait]
impl Work for Projector {
    async fn run(&self, job: &Job) -> Result<(), Failure> {
        let token = LeaseToken::of(job)
            .ok_or_else(|| permanent("not_leased", "the job was handed over without a lease"))?;
        self.boundary(job, &token).await?;
        match job.kind {
            JobKind::Project => self.project(job, &token).await,
            JobKind::Tombstone => self.exclude(job, &token).await,
            JobKind::Graph => match &self.graph {
                Some(graph) => graph.run(job, &token).await,
                None => Err(permanent(
                    "graph_unconfigured",
                    "a graph job reached a worker without a graph store; configure graph.url \
                     on the workers, then requeue it",
                )),
            },
            JobKind::Access => {
                crate::access::run(self.ledger.as_ref(), self.vectors.as_deref(), job).await
            }
            JobKind::Sync => Err(permanent(
                "sync_unconfigured",
                "a sync run reached a projector: the worker was composed without its connector \
                 runner",
            )),
        }
    }
    fn unit_key(&self, job: &Job) -> Option<String> {
        (job.kind == JobKind::Project).then(|| {
            job.generation
                .clone()
                .unwrap_or_else(|| self.generation.id.clone())
        })
    }

    async fn run_unit(&self, unit: &crate::Unit) {
        self.project_unit(unit).await;
    }
}
