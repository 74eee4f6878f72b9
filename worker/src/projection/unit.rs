//! A unit's projections ([`crate::unit`]): small documents of one generation projected
//! together, at the embedder's speed.
//!
//! ## Order (the same as a lone projection's, shared)
//! read and chunk each document -> one ledger transaction for the chunk rows -> one read-back
//! -> one embedding call (after reuse) -> fenced heartbeats -> one upsert -> one ledger
//! transaction for the receipts so far -> one read-back -> fenced heartbeats -> one
//! `set_current` -> one ledger transaction for the verified receipts -> each job completed.
//!
//! ## Invariants
//! - Everything a lone projection guarantees holds per job: read-back before `verified`,
//!   reconciliation, chunk reuse, receipts and history, and a stale job never leaving its
//!   revision current (the same `retire_if_stale`).
//! - Each step writes only for the members still held: a member whose lease was lost, or
//!   that was superseded or cancelled, is out of every later write, and its points are never
//!   flagged current by the unit. Every ledger write is fenced per job.
//! - A document that fails to read, chunk or embed fails alone, with its own classification:
//!   a shared call that fails is retried once per member without the others (bounded), so
//!   the failure lands on the member that causes it. An outage of a store fails the members
//!   that needed it, each retried as usual.
//! - Larger documents (over [`super::UnitSettings::max_bytes`], or binary) take the lone path
//!   inside the unit, beside the shared batch, and end on their own.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use gateways::{Chunk, CurrentChange, GatewayError, PointFacts, VectorPoint, VectorStore};
use receipts::{
    Backend, ChunkSummary, Failure, LedgerError, ReceiptState, ReceiptUpdate, Revision, UnitWrite,
};
use serde_json::json;

use super::{rows_of, Projector};
use crate::job::{inline, ledger_failure, millis, revision_bytes, revision_of, store_failure};
use crate::Unit;

/// One member's document, read and chunked, and what the unit did for it so far.
struct Prepared {
    /// The member's index in the unit.
    index: usize,
    revision: Revision,
    chunks: Vec<Chunk>,
    chunks_from: &'static str,
    chunk_ms: f64,
    expected: ChunkSummary,
    /// Receipt updates waiting for the unit's next ledger write.
    receipts: Vec<ReceiptUpdate>,
    /// Its points were already stored and verified before the unit wrote any.
    vector_reconciled: bool,
    reused: usize,
    /// The readers the upsert wrote (`None`: it wrote none).
    written_readers: Option<Option<Vec<String>>>,
}

/// What reading a member's document decided.
enum Read {
    /// Small: it joins the shared batch.
    Small(Box<Prepared>),
    /// Large or binary: the lone path.
    Lone(usize),
}

impl Projector {
    /// Projects a unit's members (see the module documentation), reporting each outcome.
    pub(super) async fn project_unit(&self, unit: &Unit) {
        let started = Instant::now();
        unit.note("reading");
        let reads = futures::future::join_all(
            unit.held()
                .into_iter()
                .map(|index| async move { (index, self.read_member(unit, index).await) }),
        )
        .await;
        let mut small = Vec::new();
        let mut lone = Vec::new();
        for (index, read) in reads {
            match read {
                Ok(Read::Small(prepared)) => small.push(*prepared),
                Ok(Read::Lone(index)) => lone.push(index),
                Err(failure) => unit.report(index, Err(failure)),
            }
        }
        let lone = futures::future::join_all(lone.into_iter().map(|index| async move {
            let member = &unit.members()[index];
            let outcome = self.project(&member.job, &member.token).await;
            unit.report(index, outcome);
        }));
        let shared = async {
            for batch in batches(small, self.units.max_chunks) {
                self.project_batch(unit, batch, started).await;
            }
        };
        futures::join!(lone, shared);
    }

    /// Crosses a scheduled member's boundary, reads its bytes, and chunks it when it is small.
    async fn read_member(&self, unit: &Unit, index: usize) -> Result<Read, Failure> {
        let member = &unit.members()[index];
        let started = Instant::now();
        self.boundary(&member.job, &member.token).await?;
        let (revision, bytes) =
            revision_bytes(self.ledger.as_ref(), revision_of(&member.job)?).await?;
        let small = inline(
            extract::Format::of(&revision.media_type),
            revision.byte_length,
        ) && usize::try_from(revision.byte_length)
            .is_ok_and(|length| length <= self.units.max_bytes);
        if !small {
            return Ok(Read::Lone(index));
        }
        let (chunks, chunks_from) = self.chunks_of(&revision, bytes).await?;
        let expected = ChunkSummary::of(chunks.iter().map(|chunk| chunk.sha256.as_str()));
        Ok(Read::Small(Box::new(Prepared {
            index,
            revision,
            chunks,
            chunks_from,
            chunk_ms: millis(started),
            expected,
            receipts: Vec::new(),
            vector_reconciled: false,
            reused: 0,
            written_readers: None,
        })))
    }

    fn update(
        &self,
        backend: Backend,
        state: ReceiptState,
        cause: &str,
        evidence: serde_json::Value,
    ) -> ReceiptUpdate {
        ReceiptUpdate {
            backend,
            state,
            evidence,
            cause: cause.to_owned(),
            generation: self.generation.id.clone(),
        }
    }

    /// Writes each member's pending receipts (one ledger transaction for the batch) and keeps
    /// the members whose writes held.
    async fn flush_receipts(&self, unit: &Unit, live: &mut Vec<Prepared>) {
        let (indexes, writes): (Vec<usize>, Vec<UnitWrite>) = live
            .iter_mut()
            .filter(|prepared| !prepared.receipts.is_empty())
            .map(|prepared| {
                (
                    prepared.index,
                    UnitWrite {
                        lease: unit.members()[prepared.index].token.clone(),
                        chunks: None,
                        receipts: std::mem::take(&mut prepared.receipts),
                    },
                )
            })
            .unzip();
        if writes.is_empty() {
            return;
        }
        let results = self.ledger.project_many(writes).await;
        settle(unit, live, &indexes, results);
    }

    /// The shared path of one batch of small members.
    async fn project_batch(&self, unit: &Unit, batch: Vec<Prepared>, started: Instant) {
        let mut live = batch;
        live.retain(|prepared| unit.is_held(prepared.index));
        if live.is_empty() {
            return;
        }
        if self.has(Backend::Relational) {
            unit.note("relational write");
            self.write_rows(unit, &mut live).await;
        }
        if let (true, Some(vectors)) = (self.has(Backend::Vector), self.vectors.clone()) {
            self.write_points(unit, &mut live, vectors.as_ref(), started)
                .await;
        } else {
            self.flush_receipts(unit, &mut live).await;
        }
        for prepared in &live {
            unit.report(prepared.index, Ok(()));
        }
    }

    /// Chunk rows: one transaction for every member whose rows are not there yet, one
    /// read-back, and each member's relational receipt queued.
    async fn write_rows(&self, unit: &Unit, live: &mut Vec<Prepared>) {
        let step = Instant::now();
        let generation = self.generation.id.as_str();
        let ids: Vec<uuid::Uuid> = live.iter().map(|prepared| prepared.revision.id).collect();
        let existing = match self.ledger.chunk_summaries(&ids, generation).await {
            Ok(existing) => existing,
            Err(error) => return fail_all(unit, live, &ledger_failure(error)),
        };
        let reconciled: Vec<bool> = live
            .iter()
            .zip(&existing)
            .map(|(prepared, existing)| *existing == prepared.expected)
            .collect();
        let (indexes, writes): (Vec<usize>, Vec<UnitWrite>) = live
            .iter()
            .zip(&reconciled)
            .filter(|(_, reconciled)| !**reconciled)
            .map(|(prepared, _)| {
                (
                    prepared.index,
                    UnitWrite {
                        lease: unit.members()[prepared.index].token.clone(),
                        chunks: Some((generation.to_owned(), rows_of(&prepared.chunks))),
                        receipts: Vec::new(),
                    },
                )
            })
            .unzip();
        if !writes.is_empty() {
            let results = self.ledger.project_many(writes).await;
            let mut kept = std::mem::take(live);
            let mut flags: HashMap<usize, bool> = kept
                .iter()
                .zip(&reconciled)
                .map(|(prepared, reconciled)| (prepared.index, *reconciled))
                .collect();
            settle(unit, &mut kept, &indexes, results);
            // The read-back of what was written.
            let written: Vec<uuid::Uuid> = kept
                .iter()
                .filter(|prepared| !flags.get(&prepared.index).copied().unwrap_or(true))
                .map(|prepared| prepared.revision.id)
                .collect();
            let stored = match self.ledger.chunk_summaries(&written, generation).await {
                Ok(stored) => stored,
                Err(error) => return fail_all(unit, &mut kept, &ledger_failure(error)),
            };
            let stored: HashMap<uuid::Uuid, ChunkSummary> =
                written.into_iter().zip(stored).collect();
            for prepared in &kept {
                if let Some(stored) = stored.get(&prepared.revision.id) {
                    if *stored != prepared.expected {
                        let expected = &prepared.expected;
                        unit.report(
                            prepared.index,
                            Err(store_failure(GatewayError::ReadbackMismatch {
                                store: "relational",
                                message: format!(
                                    "wrote {} chunk rows (checksum {}), read back {} (checksum {})",
                                    expected.count,
                                    expected.checksum,
                                    stored.count,
                                    stored.checksum
                                ),
                            })),
                        );
                    }
                }
            }
            kept.retain(|prepared| unit.is_held(prepared.index));
            *live = kept;
            flags.retain(|index, _| live.iter().any(|prepared| prepared.index == *index));
            for prepared in live.iter_mut() {
                let reconciled = flags.get(&prepared.index).copied().unwrap_or(false);
                prepared
                    .receipts
                    .push(self.relational_receipt(prepared, reconciled, &step));
            }
        } else {
            for prepared in live.iter_mut() {
                prepared
                    .receipts
                    .push(self.relational_receipt(prepared, true, &step));
            }
        }
    }

    fn relational_receipt(
        &self,
        prepared: &Prepared,
        reconciled: bool,
        step: &Instant,
    ) -> ReceiptUpdate {
        let tokens: usize = prepared.chunks.iter().map(|chunk| chunk.token_count).sum();
        self.update(
            Backend::Relational,
            ReceiptState::Verified,
            if reconciled {
                "verified: rows already present (reconciled)"
            } else {
                "verified: rows read back"
            },
            json!({
                "rows": prepared.expected.count,
                "checksum": prepared.expected.checksum,
                "tokens": tokens,
                "reconciled": reconciled,
                "chunks_from": prepared.chunks_from,
                "chunk_ms": prepared.chunk_ms,
                "write_ms": millis(*step),
                "generation": self.generation.id,
                "unit": true,
            }),
        )
    }

    /// Points: reuse or one embedding call, one upsert, the receipts so far, one read-back,
    /// one `set_current`, the access check, and the verified receipts.
    async fn write_points(
        &self,
        unit: &Unit,
        live: &mut Vec<Prepared>,
        vectors: &dyn VectorStore,
        started: Instant,
    ) {
        let ids: Vec<uuid::Uuid> = live.iter().map(|prepared| prepared.revision.id).collect();
        let existing = match vectors.revisions_points(&ids).await {
            Ok(existing) => existing,
            Err(error) => return fail_all(unit, live, &store_failure(error)),
        };
        for (prepared, existing) in live.iter_mut().zip(existing) {
            let count = prepared.chunks.len();
            prepared.vector_reconciled =
                count > 0 && existing.count == count && existing.with_dimension == count;
        }
        let mut embed_ms = 0.0;
        let mut write_ms = 0.0;
        if live.iter().any(|prepared| !prepared.vector_reconciled) {
            unit.note("embedding");
            let step = Instant::now();
            let mut embedded = self.embed_unit(unit, live, vectors).await;
            embed_ms = millis(step);
            let writing: Vec<usize> = live
                .iter()
                .filter(|prepared| !prepared.vector_reconciled)
                .map(|prepared| prepared.index)
                .collect();
            unit.enter(self.ledger.as_ref(), &writing, "vector write")
                .await;
            live.retain(|prepared| unit.is_held(prepared.index));
            let step = Instant::now();
            // What a search filter tests, carried by every point, with the source's readers
            // as the ledger holds them now (checked again once the points are current).
            let access = futures::future::join_all(live.iter().map(|prepared| async move {
                if prepared.vector_reconciled {
                    return (prepared.index, None);
                }
                let member = &unit.members()[prepared.index];
                let access = self
                    .ledger
                    .access_of(&member.job.dataset, &member.job.source_key)
                    .await;
                (prepared.index, Some(access))
            }))
            .await;
            let mut points = Vec::new();
            let mut written = Vec::new();
            for ((index, access), prepared) in access.into_iter().zip(live.iter_mut()) {
                let Some(access) = access else { continue };
                let access = match access {
                    Ok(access) => access,
                    Err(error) => {
                        unit.report(index, Err(ledger_failure(error)));
                        continue;
                    }
                };
                let Some(vectors_out) = embedded.remove(&index) else {
                    continue;
                };
                let member = &unit.members()[index];
                prepared.written_readers = Some(access.readers.clone());
                let facts = Arc::new(PointFacts {
                    tags: prepared.revision.tags.clone(),
                    media_type: prepared.revision.media_type.clone(),
                    metadata: prepared.revision.metadata.clone(),
                    accepted_at: prepared.revision.accepted_at,
                    readers: access.readers.unwrap_or_default(),
                });
                let mine: Vec<VectorPoint> = prepared
                    .chunks
                    .iter()
                    .zip(vectors_out)
                    .map(|(chunk, vector)| VectorPoint {
                        dataset: member.job.dataset.clone(),
                        source_key: member.job.source_key.clone(),
                        revision_id: prepared.revision.id,
                        chunk_index: chunk.index,
                        head_at: member.job.created_at,
                        vector,
                        facts: Some(facts.clone()),
                    })
                    .collect();
                written.push((index, mine.len()));
                points.push(mine);
            }
            live.retain(|prepared| unit.is_held(prepared.index));
            // Visible at once, durable with `set_current_many` below: nothing is verified
            // before that write returns.
            let all: Vec<VectorPoint> = points.iter().flatten().cloned().collect();
            if let Err(error) = vectors.upsert_visible(all).await {
                // Retried once per member, so that a point one store refuses fails its own
                // job only.
                tracing::warn!(%error, members = points.len(), "a unit's upsert failed; writing its members one by one");
                for ((index, _), mine) in written.iter().zip(points) {
                    if let Err(error) = vectors.upsert_visible(mine).await {
                        unit.report(*index, Err(store_failure(error)));
                    }
                }
                live.retain(|prepared| unit.is_held(prepared.index));
            }
            write_ms = millis(step);
            for prepared in live.iter_mut() {
                if prepared.vector_reconciled {
                    continue;
                }
                let count = prepared.chunks.len();
                prepared.receipts.push(self.update(
                    Backend::Vector,
                    ReceiptState::Written,
                    "written: points upserted, read-back pending",
                    json!({
                        "points": count,
                        "embedded": count - prepared.reused,
                        "reused": prepared.reused,
                        "embed_ms": embed_ms,
                        "write_ms": write_ms,
                        "unit": true,
                    }),
                ));
            }
        }
        self.flush_receipts(unit, live).await;
        // The read-back.
        unit.note("read-back");
        let step = Instant::now();
        let ids: Vec<uuid::Uuid> = live.iter().map(|prepared| prepared.revision.id).collect();
        let stored = match vectors.revisions_points(&ids).await {
            Ok(stored) => stored,
            Err(error) => return fail_all(unit, live, &store_failure(error)),
        };
        for (prepared, stored) in live.iter().zip(stored) {
            let count = prepared.chunks.len();
            if stored.count != count || stored.with_dimension != count {
                unit.report(
                    prepared.index,
                    Err(store_failure(GatewayError::ReadbackMismatch {
                        store: "vector",
                        message: format!(
                            "expected {count} points of dimension {}, read back {} ({} with that dimension)",
                            vectors.dimension(),
                            stored.count,
                            stored.with_dimension
                        ),
                    })),
                );
            }
        }
        live.retain(|prepared| unit.is_held(prepared.index));
        let going: Vec<usize> = live.iter().map(|prepared| prepared.index).collect();
        unit.enter(self.ledger.as_ref(), &going, "making current")
            .await;
        live.retain(|prepared| unit.is_held(prepared.index));
        let changes: Vec<CurrentChange> = live
            .iter()
            .map(|prepared| {
                let job = &unit.members()[prepared.index].job;
                CurrentChange {
                    dataset: job.dataset.clone(),
                    source_key: job.source_key.clone(),
                    keep: prepared.revision.id,
                    head_at: job.created_at,
                }
            })
            .collect();
        if let Err(error) = vectors.set_current_many(&changes).await {
            return fail_all(unit, live, &store_failure(error));
        }
        // An access change that landed while the points were written (or points already
        // present, whose readers this unit did not write) gets its readers written now.
        let readers = futures::future::join_all(live.iter().map(|prepared| async move {
            let job = &unit.members()[prepared.index].job;
            self.ledger.access_of(&job.dataset, &job.source_key).await
        }))
        .await;
        for (prepared, now) in live.iter().zip(readers) {
            let job = &unit.members()[prepared.index].job;
            let outcome = match now {
                Ok(now) if prepared.written_readers.as_ref() == Some(&now.readers) => Ok(()),
                Ok(_) => crate::access::refresh(
                    self.ledger.as_ref(),
                    vectors,
                    &job.dataset,
                    &job.source_key,
                )
                .await
                .map(|_| ()),
                Err(error) => Err(ledger_failure(error)),
            };
            if let Err(failure) = outcome {
                unit.report(prepared.index, Err(failure));
            }
        }
        live.retain(|prepared| unit.is_held(prepared.index));
        for prepared in live.iter_mut() {
            let count = prepared.chunks.len();
            let reconciled = prepared.vector_reconciled;
            prepared.receipts.push(self.update(
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
                    "embedded": if reconciled { 0 } else { count - prepared.reused },
                    "reused": prepared.reused,
                    "embed_ms": embed_ms,
                    "write_ms": write_ms,
                    "readback_ms": millis(step),
                    "total_ms": millis(started),
                    "generation": self.generation.id,
                    "unit": true,
                }),
            ));
        }
        let before: Vec<usize> = live.iter().map(|prepared| prepared.index).collect();
        self.flush_receipts(unit, live).await;
        // A member whose verified receipt was fenced out: its revision must not stay current
        // if it is no longer head.
        for index in before {
            if !live.iter().any(|prepared| prepared.index == index) {
                self.retire_if_stale(&unit.members()[index].job).await;
            }
        }
    }

    /// The vectors of every member that is not reconciled, by member index: reused where a
    /// chunk of the same text has a vector in its dataset, the rest embedded in one call. When
    /// that call fails, each member is embedded alone, so the failure lands on its own
    /// document.
    async fn embed_unit(
        &self,
        unit: &Unit,
        live: &mut [Prepared],
        store: &dyn VectorStore,
    ) -> HashMap<usize, Vec<Vec<f32>>> {
        let ledger = self.ledger.as_ref();
        let generation = self.generation.id.as_str();
        let wanted: Vec<&Prepared> = live
            .iter()
            .filter(|prepared| !prepared.vector_reconciled)
            .collect();
        let candidates = futures::future::join_all(wanted.iter().map(|prepared| async move {
            let mut hashes: Vec<String> = prepared
                .chunks
                .iter()
                .map(|chunk| chunk.sha256.clone())
                .collect();
            hashes.sort();
            hashes.dedup();
            let job = &unit.members()[prepared.index].job;
            ledger
                .chunks_with_hashes(&job.dataset, generation, &hashes, prepared.revision.id)
                .await
        }))
        .await;
        let mut found_for: Vec<(usize, Vec<receipts::ChunkRef>)> = Vec::new();
        for (prepared, candidates) in wanted.iter().zip(candidates) {
            match candidates {
                Ok(candidates) => found_for.push((prepared.index, candidates)),
                Err(error) => unit.report(prepared.index, Err(ledger_failure(error))),
            }
        }
        let ids: Vec<uuid::Uuid> = found_for
            .iter()
            .flat_map(|(_, candidates)| {
                candidates.iter().map(|candidate| {
                    gateways::vectors::point_id(candidate.revision_id, candidate.chunk_index)
                })
            })
            .collect();
        let found = if ids.is_empty() {
            Vec::new()
        } else {
            match store.vectors(&ids).await {
                Ok(found) => found,
                Err(error) => {
                    let failure = store_failure(error);
                    for (index, _) in &found_for {
                        unit.report(*index, Err(failure.clone()));
                    }
                    return HashMap::new();
                }
            }
        };
        let mut found = found.into_iter();
        // Per member: each chunk's vector where reused, and the texts left to embed.
        let mut out: HashMap<usize, Vec<Option<Vec<f32>>>> = HashMap::new();
        let mut missing: Vec<(usize, usize)> = Vec::new();
        for (index, candidates) in &found_for {
            let by_hash: HashMap<&str, Vec<f32>> = candidates
                .iter()
                .zip(found.by_ref())
                .filter_map(|(candidate, vector)| {
                    vector.map(|vector| (candidate.sha256.as_str(), vector))
                })
                .collect();
            let Some(prepared) = live.iter().find(|prepared| prepared.index == *index) else {
                continue;
            };
            let vectors: Vec<Option<Vec<f32>>> = prepared
                .chunks
                .iter()
                .map(|chunk| by_hash.get(chunk.sha256.as_str()).cloned())
                .collect();
            for (position, vector) in vectors.iter().enumerate() {
                if vector.is_none() {
                    missing.push((*index, position));
                }
            }
            out.insert(*index, vectors);
        }
        let text = |(index, position): &(usize, usize)| {
            live.iter()
                .find(|prepared| prepared.index == *index)
                .and_then(|prepared| prepared.chunks.get(*position))
                .map(|chunk| chunk.text.clone())
                .unwrap_or_default()
        };
        if !missing.is_empty() {
            let texts: Vec<String> = missing.iter().map(text).collect();
            match self.embedder.embed(texts).await {
                Ok(embedded) if embedded.len() == missing.len() => {
                    for ((index, position), vector) in missing.iter().zip(embedded) {
                        if let Some(slot) = out
                            .get_mut(index)
                            .and_then(|vectors| vectors.get_mut(*position))
                        {
                            *slot = Some(vector);
                        }
                    }
                }
                shared => {
                    if let Err(error) = &shared {
                        tracing::warn!(%error, "a unit's embedding call failed; embedding its members one by one");
                    }
                    // Each member alone: a document the model refuses fails by itself.
                    for index in out.keys().copied().collect::<Vec<_>>() {
                        let mine: Vec<(usize, usize)> = missing
                            .iter()
                            .filter(|(of, _)| *of == index)
                            .copied()
                            .collect();
                        if mine.is_empty() {
                            continue;
                        }
                        let texts: Vec<String> = mine.iter().map(text).collect();
                        match self.embedder.embed(texts).await {
                            Ok(embedded) if embedded.len() == mine.len() => {
                                for ((_, position), vector) in mine.iter().zip(embedded) {
                                    if let Some(slot) = out
                                        .get_mut(&index)
                                        .and_then(|vectors| vectors.get_mut(*position))
                                    {
                                        *slot = Some(vector);
                                    }
                                }
                            }
                            Ok(embedded) => unit.report(
                                index,
                                Err(store_failure(GatewayError::Embedder(format!(
                                    "{} vectors for {} texts",
                                    embedded.len(),
                                    mine.len()
                                )))),
                            ),
                            Err(error) => unit.report(index, Err(store_failure(error))),
                        }
                    }
                }
            }
        }
        for prepared in live.iter_mut() {
            if out.contains_key(&prepared.index) {
                let embedded = missing
                    .iter()
                    .filter(|(index, _)| *index == prepared.index)
                    .count();
                prepared.reused = prepared.chunks.len() - embedded;
            }
        }
        out.into_iter()
            .filter(|(index, _)| unit.is_held(*index))
            .filter_map(|(index, vectors)| {
                vectors
                    .into_iter()
                    .collect::<Option<Vec<Vec<f32>>>>()
                    .map(|vectors| (index, vectors))
            })
            .collect()
    }
}

/// The shared batches of a unit's small members: at most `max_chunks` chunks each (a member
/// with more makes a batch of its own).
fn batches(small: Vec<Prepared>, max_chunks: usize) -> Vec<Vec<Prepared>> {
    let mut batches: Vec<Vec<Prepared>> = Vec::new();
    let mut chunks = 0;
    for prepared in small {
        let size = prepared.chunks.len();
        match batches.last_mut() {
            Some(batch) if chunks + size <= max_chunks.max(1) => {
                chunks += size;
                batch.push(prepared);
            }
            _ => {
                chunks = size;
                batches.push(vec![prepared]);
            }
        }
    }
    batches
}

/// Applies a ledger write's results (one per member index of `indexes`) to `live`: a lease
/// the ledger refused takes its member out, another error fails it; the rest stay.
fn settle(
    unit: &Unit,
    live: &mut Vec<Prepared>,
    indexes: &[usize],
    results: Vec<receipts::Result<()>>,
) {
    for (index, result) in indexes.iter().zip(results) {
        match result {
            Ok(()) => {}
            Err(error @ LedgerError::LeaseLost { .. }) => unit.lose(*index, &error),
            Err(error) => unit.report(*index, Err(ledger_failure(error))),
        }
    }
    live.retain(|prepared| unit.is_held(prepared.index));
}

/// Fails every member of `live` with `failure` (a shared call that failed for all).
fn fail_all(unit: &Unit, live: &mut Vec<Prepared>, failure: &Failure) {
    for prepared in live.iter() {
        unit.report(prepared.index, Err(failure.clone()));
    }
    live.clear();
}
