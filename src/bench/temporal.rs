//! `cairn bench temporal`: search at a point in time (`valid_at`, `as_of`, both) over a corpus
//! of `docs` sources with `revisions` revisions each, per mode: p50 and p99, and for vector
//! mode the recall of cairn's answer against an exact search with the same filter.
//!
//! The corpus is built like `cairn bench search`'s (synthetic one-chunk documents, pseudo-random
//! unit vectors written through the ledger's fenced projection writes and the vector store),
//! in rounds: round `k` asserts every source's `k`-th revision valid from `T0 + k * STEP` (a
//! correction that reaches back), and is projected before the next round, so that every
//! revision has its vectors and the history is complete. Which revision held at a point is
//! then known for every source alike: round `k` holds over `[T0 + k * STEP, T0 + (k+1) *
//! STEP)` as known now, and as known right after round `k` was accepted, round `k` holds from
//! `T0 + k * STEP` on. The exact search is a brute-force scan of that round's vectors with the
//! query's embedding (the same model, the same text).
//!
//! Pseudo-random vectors alone have no true neighbours: a model's query embedding is about
//! equally far from all of them, and no approximate index can rank them. So each round plants
//! neighbours ([`Planting`]): for every query, some sources get vectors near the query's own
//! embedding at growing distances. Each round plants them at other sources, so the rounds that
//! did not hold at a point hold decoys near the same query, which binding must set aside.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use gateways::embedder::{LocalEmbedder, ModelFiles, MODEL_DIMENSION};
use gateways::{EdgeVectorStore, Embedder, VectorStore};
use receipts::validity::{At, Validity};
use receipts::{Backend, Clock, Ledger, SqliteLedger, SystemClock};
use search::{Mode, Query, Searcher, VectorSide};
use serde_json::{json, Value};

use super::search_latency::{accept_texts, project_claimed, summary, Random, DATASET};
use crate::config::Config;

/// How the temporal search benchmark runs.
#[derive(Debug, Clone)]
pub struct TemporalBench {
    /// Sources in the corpus.
    pub docs: usize,
    /// Revisions per source.
    pub revisions: usize,
    /// Queries measured per kind of point and mode.
    pub queries: usize,
    /// Results per query.
    pub top_k: usize,
}

/// 2020-01-01T00:00:00Z: the first round's valid start.
const T0: i64 = 1_577_836_800_000_000;
/// 30 days between rounds' valid starts.
const STEP: i64 = 30 * 86_400_000_000;

/// Planted neighbours: in round `k`, source `(k * 7919 + q * per_query + i) mod docs` gets a
/// vector near query `q`'s embedding, the farther the larger `i`.
pub(super) struct Planting {
    /// The queries' embeddings.
    pub(super) queries: Vec<Vec<f32>>,
    /// Sources planted per query and round (0: none).
    pub(super) per_query: usize,
    /// Sources in the corpus.
    pub(super) docs: usize,
}

impl Planting {
    /// The query and rank planted at `source` in `round`, if any.
    fn at(&self, round: usize, source: usize) -> Option<(usize, usize)> {
        if self.per_query == 0 || self.docs == 0 {
            return None;
        }
        let offset = (round * 7919) % self.docs;
        let slot = (source + self.docs - offset) % self.docs;
        let (query, rank) = (slot / self.per_query, slot % self.per_query);
        (query < self.queries.len()).then_some((query, rank))
    }

    /// The vector of `source` in `round`: near a query's embedding where one is planted
    /// (cosine about 0.96 for the nearest, falling to about 0.5), else pseudo-random.
    pub(super) fn vector(&self, round: usize, source: usize, random: &mut Random) -> Vec<f32> {
        let noise = random.unit_vector();
        let Some((query, rank)) = self.at(round, source) else {
            return noise;
        };
        let Some(centre) = self.queries.get(query) else {
            return noise;
        };
        let sigma = 0.3 + 0.05 * rank as f32;
        let raw: Vec<f32> = centre
            .iter()
            .zip(&noise)
            .map(|(c, n)| c + sigma * n)
            .collect();
        let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-9);
        raw.into_iter().map(|x| x / norm).collect()
    }
}

/// A kind of point in time: from a query's round and an earlier round, the point searched
/// and the round that held there.
type PointOf = Box<dyn Fn(usize, usize) -> (At, usize)>;

/// One round: every source's next revision, accepted (valid from the round's start) and
/// projected with synthetic vectors, planted neighbours among them (kept in `vectors`, by
/// source, for the exact search).
async fn round(
    ledger: &Arc<dyn Ledger>,
    store: &dyn VectorStore,
    generation: &str,
    bench: &TemporalBench,
    index: usize,
    random: &mut Random,
    planting: &Planting,
) -> anyhow::Result<(Vec<Vec<f32>>, Vec<uuid::Uuid>)> {
    let valid = Validity {
        valid_from: Some(T0 + index as i64 * STEP),
        valid_to: None,
    };
    let texts = accept_texts(ledger, bench.docs, random, valid).await?;
    let mut vectors = vec![Vec::new(); bench.docs];
    let mut revisions = Vec::with_capacity(bench.docs);
    let label = format!("temporal round {index}");
    project_claimed(
        ledger,
        store,
        generation,
        &texts,
        random,
        &label,
        |job, random| {
            let source: usize = job
                .source_key
                .strip_prefix("doc-")
                .and_then(|n| n.parse().ok())
                .context("a bench source key")?;
            let vector = planting.vector(index, source, random);
            if let Some(slot) = vectors.get_mut(source) {
                *slot = vector.clone();
            }
            revisions.push(job.revision()?);
            Ok((vector, None))
        },
    )
    .await?;
    anyhow::ensure!(
        vectors.iter().all(|vector| !vector.is_empty()),
        "round {index}: a source was not projected"
    );
    Ok((vectors, revisions))
}

/// The exact top `k` of `vectors` for `query` (unit vectors: the dot product is the cosine),
/// as indexes into `vectors`, best first.
pub(super) fn exact(round: &[Vec<f32>], query: &[f32], k: usize) -> Vec<usize> {
    let mut scored: Vec<(f32, usize)> = round
        .iter()
        .enumerate()
        .map(|(source, vector)| {
            (
                vector.iter().zip(query).map(|(a, b)| a * b).sum::<f32>(),
                source,
            )
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored
        .into_iter()
        .take(k)
        .map(|(_, source)| source)
        .collect()
}

/// Runs the benchmark in a temporary directory: the embedded default (SQLite, qdrant-edge).
pub async fn temporal(config: &Config, bench: TemporalBench) -> anyhow::Result<Value> {
    anyhow::ensure!(bench.revisions >= 2, "--revisions must be at least 2");
    let files = ModelFiles::locate(&config.projection.models_dir)?;
    let embedder: Arc<LocalEmbedder> = {
        let files = files.clone();
        Arc::new(
            tokio::task::spawn_blocking(move || LocalEmbedder::load(&files, 1, Some(1))).await??,
        )
    };
    let directory = tempfile::tempdir()?;
    let mut options = receipts::SqliteOptions::new(directory.path().join("ledger.db"));
    options.backends = vec![Backend::Relational, Backend::Vector];
    let ledger: Arc<dyn Ledger> =
        Arc::new(SqliteLedger::open(options, Arc::new(SystemClock)).await?);
    let generation = crate::projection::generation(config);
    ledger.activate_generation(&generation, "bench").await?;
    let edge = EdgeVectorStore::open(&directory.path().join("vectors"), MODEL_DIMENSION)?;
    let store: Arc<dyn VectorStore> = Arc::new(edge.clone());

    let mut words = Random(29);
    let queries: Vec<String> = (0..bench.queries).map(|_| words.text(4)).collect();
    let planting = Planting {
        queries: embedder.embed(queries.clone()).await?,
        per_query: (bench.docs / bench.queries.max(1)).min(30),
        docs: bench.docs,
    };
    let mut random = Random(23);
    let started = Instant::now();
    let mut rounds = Vec::with_capacity(bench.revisions);
    // `known[k]`: an instant after round `k` was accepted and before round `k + 1` was.
    let mut known = Vec::with_capacity(bench.revisions);
    let mut revision_round = std::collections::HashMap::new();
    for index in 0..bench.revisions {
        let (vectors, revisions) = round(
            &ledger,
            store.as_ref(),
            &generation.id,
            &bench,
            index,
            &mut random,
            &planting,
        )
        .await?;
        rounds.push(vectors);
        revision_round.extend(revisions.into_iter().map(|revision| (revision, index)));
        known.push(SystemClock.now_micros());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let load_seconds = started.elapsed().as_secs_f64();
    eprintln!("temporal: building the HNSW index");
    let started = Instant::now();
    let hnsw_built = edge.optimize_now().await?;
    let hnsw_seconds = started.elapsed().as_secs_f64();
    let counts = ledger.counts().await?;

    let datasets = vec![DATASET.to_owned()];
    let searcher = Searcher::new(
        ledger.clone(),
        Some(VectorSide {
            embedders: Arc::new(gateways::OneModel(embedder.clone())),
            stores: Arc::new(gateways::OneStore::new(&generation.id, store.clone())),
        }),
        config.search,
    );
    let now = SystemClock.now_micros();
    let (first_known, second_known) = (known.clone(), known);
    // Each kind of point: the point for a query's round, and the round that held there.
    let points: [(&str, PointOf); 3] = [
        (
            "valid_at",
            Box::new(move |round, _| {
                (
                    At {
                        valid_at: T0 + round as i64 * STEP + STEP / 2,
                        as_of: now,
                    },
                    round,
                )
            }),
        ),
        (
            "as_of",
            Box::new(move |round, _| {
                (
                    At {
                        valid_at: first_known[round],
                        as_of: first_known[round],
                    },
                    round,
                )
            }),
        ),
        (
            "valid_at_and_as_of",
            Box::new(move |round, earlier| {
                let held = earlier.min(round);
                (
                    At {
                        valid_at: T0 + held as i64 * STEP + STEP / 2,
                        as_of: second_known[round],
                    },
                    held,
                )
            }),
        ),
    ];
    let modes = [
        ("vector", Mode::Vector),
        ("lexical", Mode::Lexical),
        ("auto", Mode::Auto),
    ];
    let query = |text: &str, mode: Mode, at: Option<At>| Query {
        text: text.to_owned(),
        datasets: datasets.clone(),
        top_k: bench.top_k,
        budget: Duration::from_secs(10),
        mode,
        group_by_source: true,
        at,
        filter: None,
        facets: None,
    };
    // Warm-up: caches, the model's first runs, the searcher's over-fetch estimate.
    for text in queries.iter().take(20) {
        for (_, mode) in &modes {
            searcher.search(query(text, *mode, None)).await?;
        }
    }
    let mut pick = Random(31);
    let mut report = serde_json::Map::new();
    let mut by_kind = serde_json::Map::new();
    for (kind, point) in &points {
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        let mut recalls = Vec::new();
        let mut index_recalls = Vec::new();
        let mut partial = 0usize;
        for text in &queries {
            let round = (pick.next() % bench.revisions as u64) as usize;
            let earlier = (pick.next() % bench.revisions as u64) as usize;
            let (at, held) = point(round, earlier);
            for (index, (name, mode)) in modes.iter().enumerate() {
                let started = Instant::now();
                let answer = searcher.search(query(text, *mode, Some(at))).await?;
                let body = serde_json::to_vec(&answer)?;
                samples[index].push(started.elapsed().as_secs_f64() * 1000.0);
                anyhow::ensure!(!body.is_empty());
                partial += usize::from(answer.history_partial == Some(true));
                // No answer ever holds a revision outside the point asked.
                for result in &answer.results {
                    anyhow::ensure!(
                        result.valid_from == Some(T0 + held as i64 * STEP),
                        "{kind} {name}: a hit from outside the point searched: {:?}",
                        result
                    );
                }
                if *name == "vector" {
                    let embedded = embedder.embed(vec![text.clone()]).await?;
                    // The store's own approximate search against a scan, over every
                    // revision and without a filter: the recall the index itself gives.
                    if *kind == "valid_at" {
                        let everything: Vec<Vec<f32>> = rounds.iter().flatten().cloned().collect();
                        let truth = exact(&everything, &embedded[0], bench.top_k);
                        let approximate = store
                            .search_any(embedded[0].clone(), &datasets, None, bench.top_k)
                            .await?;
                        let found: std::collections::HashSet<(String, usize)> = approximate
                            .iter()
                            .filter_map(|hit| {
                                let round = revision_round.get(&hit.revision_id)?;
                                Some((hit.source_key.clone(), *round))
                            })
                            .collect();
                        let hit = truth
                            .iter()
                            .filter(|index| {
                                found.contains(&(
                                    format!("doc-{}", *index % bench.docs),
                                    *index / bench.docs,
                                ))
                            })
                            .count();
                        index_recalls.push(hit as f64 / truth.len().max(1) as f64);
                    }
                    let truth = exact(&rounds[held], &embedded[0], bench.top_k);
                    let found: std::collections::HashSet<String> = answer
                        .results
                        .iter()
                        .map(|result| result.source_key.clone())
                        .collect();
                    let hit = truth
                        .iter()
                        .filter(|source| found.contains(&format!("doc-{source}")))
                        .count();
                    recalls.push(hit as f64 / truth.len().max(1) as f64);
                }
            }
        }
        let mut per_mode = serde_json::Map::new();
        for (index, (name, _)) in modes.iter().enumerate() {
            per_mode.insert(
                (*name).to_owned(),
                summary(std::mem::take(&mut samples[index])),
            );
        }
        let mean_recall = recalls.iter().sum::<f64>() / recalls.len().max(1) as f64;
        let min_recall = recalls.iter().copied().fold(1.0_f64, f64::min);
        eprintln!(
            "temporal: {kind}: vector {} / lexical {} / auto {}; recall@{} mean {mean_recall:.4}, lowest {min_recall:.2}",
            per_mode["vector"], per_mode["lexical"], per_mode["auto"], bench.top_k
        );
        by_kind.insert(
            (*kind).to_owned(),
            json!({
                "modes": per_mode,
                "vector_recall_at_k": {"mean": mean_recall, "lowest": min_recall},
                "store_index_recall_at_k_unfiltered": (!index_recalls.is_empty()).then(|| {
                    index_recalls.iter().sum::<f64>() / index_recalls.len() as f64
                }),
                "history_partial_answers": partial,
            }),
        );
    }
    report.insert("points".to_owned(), Value::Object(by_kind));
    Ok(json!({
        "benchmark": "temporal",
        "docs": bench.docs,
        "revisions_per_doc": bench.revisions,
        "queries_per_point_and_mode": bench.queries,
        "top_k": bench.top_k,
        "planted_per_query_and_round": planting.per_query,
        "load_seconds": load_seconds,
        "hnsw_build_seconds": hnsw_seconds,
        "hnsw_built": hnsw_built,
        "ledger": {"revisions": counts.revisions, "jobs": counts.jobs},
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "note": "synthetic one-chunk documents with pseudo-random vectors, every revision projected; in each round, planted_per_query_and_round sources per query (at other sources each round) get vectors near the query's embedding at cosines from about 0.96 down; round k valid from 2020-01-01 + 30k days; valid_at = the middle of a random round's period, as known now; as_of = right after a random round was accepted (valid_at the same instant); both = an earlier round's middle as known after a later one; recall = cairn's vector answer against a brute-force scan of the vectors of the revision that held, with the query's embedding by the same model",
        "results": Value::Object(report),
    }))
}
