//! `cairn bench search`: search latency per mode at 10k and 100k chunks, and in the same run
//! the raw cost of the same queries (the query embedder plus a bare qdrant-edge search), so
//! cairn's own overhead (binding, fusion, serialisation) is the difference.
//!
//! The corpus is synthetic (text drawn from a fixed vocabulary, one chunk per document) and is
//! loaded through the ledger's own fenced projection writes (chunk rows, verified receipts) and
//! the vector store, with pseudo-random unit vectors instead of model embeddings: projecting
//! 100k chunks through the model would take hours on two cores, and the nearest-neighbour cost
//! depends on the number and size of the vectors, not on what they mean. The queries are
//! embedded by the real model, as in `cairn serve`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use gateways::embedder::{LocalEmbedder, ModelFiles, MODEL_DIMENSION};
use gateways::{EdgeVectorStore, Embedder, ServerVectorStore, VectorPoint, VectorStore};
use receipts::validity::Validity;
use receipts::{
    Backend, ChunkRow, LeaseToken, Ledger, ReceiptState, ReceiptUpdate, SqliteLedger, Submission,
    SystemClock,
};
use search::{Mode, Query, Searcher, VectorSide};
use serde_json::{json, Value};

use crate::config::Config;

/// How the search benchmark runs.
#[derive(Debug, Clone)]
pub struct SearchBench {
    /// Corpus sizes, in chunks.
    pub sizes: Vec<usize>,
    /// Queries measured per mode (after a warm-up).
    pub queries: usize,
    /// Results per query.
    pub top_k: usize,
    /// Keeps each loaded corpus under `DIR/SIZE` and reuses it when it is complete.
    pub data_dir: Option<std::path::PathBuf>,
}

/// The bench corpus's dataset.
pub(super) const DATASET: &str = "bench";
const VOCABULARY: usize = 5000;

/// A deterministic generator (SplitMix64).
pub(super) struct Random(pub(super) u64);

impl Random {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(super) fn word(&mut self) -> String {
        // Zipf-like: low ranks are common, as in real text.
        let rank = (self.next() % VOCABULARY as u64) * (self.next() % VOCABULARY as u64)
            / VOCABULARY as u64;
        let syllables = [
            "ka", "lo", "mi", "ren", "tu", "sa", "vel", "dor", "qui", "ban",
        ];
        let mut word = String::new();
        let mut n = rank + 1;
        while n > 0 {
            word.push_str(syllables[(n % 10) as usize]);
            n /= 10;
        }
        word
    }

    pub(super) fn text(&mut self, words: usize) -> String {
        (0..words)
            .map(|_| self.word())
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub(super) fn unit_vector(&mut self) -> Vec<f32> {
        let raw: Vec<f32> = (0..MODEL_DIMENSION)
            .map(|_| (self.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
            .collect();
        let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-9);
        raw.into_iter().map(|x| x / norm).collect()
    }
}

/// Loads `size` one-chunk documents: accepted, chunk rows and verified receipts written under
/// their leases, points in the store.
async fn load(
    ledger: &Arc<dyn Ledger>,
    store: &dyn VectorStore,
    generation: &str,
    size: usize,
    random: &mut Random,
) -> anyhow::Result<()> {
    let texts = accept_texts(ledger, size, random, Validity::default()).await?;
    project_claimed(
        ledger,
        store,
        generation,
        &texts,
        random,
        "search",
        |_, random| Ok((random.unit_vector(), None)),
    )
    .await
}

/// Accepts a 40-word text for each of the sources `doc-0` to `doc-{size - 1}` of the bench
/// dataset, a thousand per call, over `validity`; answers each source's text.
pub(super) async fn accept_texts(
    ledger: &Arc<dyn Ledger>,
    size: usize,
    random: &mut Random,
    validity: Validity,
) -> anyhow::Result<std::collections::HashMap<String, String>> {
    let mut texts = std::collections::HashMap::new();
    for start in (0..size).step_by(1000) {
        let submissions: Vec<Submission> = (start..(start + 1000).min(size))
            .map(|n| {
                let key = format!("doc-{n}");
                let text = random.text(40);
                let submission = Submission::text(DATASET, &key, "bench", &text).valid(validity);
                texts.insert(key, text);
                submission
            })
            .collect();
        for result in ledger.accept(submissions).await {
            result?;
        }
    }
    Ok(texts)
}

/// A job's vector and the facts its points carry (`None`: written without facts).
pub(super) type Loaded = (Vec<f32>, Option<Arc<gateways::PointFacts>>);

/// Projects every claimable job as a worker would, with a pseudo-random unit vector per
/// revision instead of the model's: points in the store, the chunk row (the document's
/// `texts` entry, one chunk) and verified receipts written under each job's lease, the job
/// completed. `vector_for` gives each job's vector, from `random` or its own.
pub(super) async fn project_claimed(
    ledger: &Arc<dyn Ledger>,
    store: &dyn VectorStore,
    generation: &str,
    texts: &std::collections::HashMap<String, String>,
    random: &mut Random,
    label: &str,
    mut vector_for: impl FnMut(&receipts::Job, &mut Random) -> anyhow::Result<Loaded>,
) -> anyhow::Result<()> {
    let mut loaded = 0;
    loop {
        let jobs = ledger.claim(&format!("bench-{label}"), 1000).await?;
        if jobs.is_empty() {
            break;
        }
        let mut points = Vec::new();
        for job in &jobs {
            let (vector, facts) = vector_for(job, random)?;
            points.push(VectorPoint {
                dataset: job.dataset.clone(),
                source_key: job.source_key.clone(),
                revision_id: job.revision()?,
                chunk_index: 0,
                head_at: job.created_at,
                vector,
                facts,
            });
        }
        store.upsert(points).await?;
        let results: Vec<anyhow::Result<()>> = futures::stream::iter(jobs)
            .map(|job| {
                let text = texts.get(&job.source_key).cloned().unwrap_or_default();
                (job, text)
            })
            .map(|(job, text)| async move {
                let token = LeaseToken::of(&job).context("a claimed job without a lease")?;
                let row = ChunkRow {
                    chunk_index: 0,
                    byte_start: 0,
                    byte_end: text.len() as i64,
                    token_count: 40,
                    sha256: receipts::ids::sha256_hex(text.as_bytes()),
                    text,
                    section: None,
                    page: None,
                };
                ledger.write_chunks(&token, generation, vec![row]).await?;
                for backend in [Backend::Relational, Backend::Vector] {
                    ledger
                        .record_receipt(
                            &token,
                            ReceiptUpdate {
                                backend,
                                state: ReceiptState::Verified,
                                evidence: json!({"synthetic": true}),
                                cause: "bench: synthetic load".to_owned(),
                                generation: generation.to_owned(),
                            },
                        )
                        .await?;
                }
                ledger.complete(&token).await?;
                Ok(())
            })
            .buffer_unordered(512)
            .collect()
            .await;
        for result in results {
            result?;
        }
        loaded += 1000;
        eprintln!("{label}: projected {loaded} chunks");
    }
    Ok(())
}

pub(super) fn summary(mut samples: Vec<f64>) -> Value {
    samples.sort_by(f64::total_cmp);
    json!({
        "p50_ms": super::percentile_f64(&samples, 0.5),
        "p99_ms": super::percentile_f64(&samples, 0.99),
        "samples": samples.len(),
    })
}

/// `clients` searches started at once (auto mode, 3 s budget each): how many were answered
/// within their budget, refused (429) or timed out, and the goodput (answers within budget
/// per second of the burst's wall time).
async fn burst(
    searcher: &Arc<Searcher>,
    queries: &[String],
    datasets: &[String],
    top_k: usize,
    clients: usize,
) -> Value {
    let budget = Duration::from_secs(3);
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|index| {
            let searcher = searcher.clone();
            let query = Query {
                text: queries[index % queries.len().max(1)].clone(),
                datasets: datasets.to_vec(),
                top_k,
                budget,
                mode: Mode::Auto,
                group_by_source: true,
                at: None,
                filter: None,
                facets: None,
            };
            tokio::spawn(async move {
                let began = Instant::now();
                let outcome = searcher.search(query).await;
                (outcome, began.elapsed())
            })
        })
        .collect();
    let (mut answered, mut refused, mut failed, mut degraded) = (0usize, 0usize, 0usize, 0usize);
    let mut latencies = Vec::new();
    for task in tasks {
        match task.await {
            Ok((Ok(answer), took)) if took <= budget => {
                answered += 1;
                degraded += usize::from(answer.degraded);
                latencies.push(took.as_secs_f64() * 1000.0);
            }
            Ok((Err(search::SearchError::Overloaded { .. }), _)) => refused += 1,
            _ => failed += 1,
        }
    }
    let wall = started.elapsed().as_secs_f64();
    json!({
        "answered_within_budget": answered,
        "degraded_answers": degraded,
        "refused_429": refused,
        "timed_out_or_failed": failed,
        "wall_seconds": wall,
        "goodput_per_second": answered as f64 / wall.max(1e-9),
        "answer_latency": summary(latencies),
    })
}

/// Runs the benchmark on temporary data directories.
pub async fn search(config: &Config, bench: SearchBench) -> anyhow::Result<Value> {
    let files = ModelFiles::locate(&config.projection.models_dir)?;
    let embedder: Arc<LocalEmbedder> = {
        let files = files.clone();
        Arc::new(
            tokio::task::spawn_blocking(move || LocalEmbedder::load(&files, 1, Some(1))).await??,
        )
    };
    let mut random = Random(7);
    let queries: Vec<String> = (0..bench.queries).map(|_| random.text(4)).collect();
    let mut other = Random(11);
    let warm_up: Vec<String> = (0..20).map(|_| other.text(4)).collect();
    let mut reports = Vec::new();
    for &size in &bench.sizes {
        let temporary = tempfile::tempdir()?;
        let directory = match &bench.data_dir {
            Some(root) => root.join(size.to_string()),
            None => temporary.path().to_owned(),
        };
        let loaded_marker = directory.join("loaded");
        // A Qdrant server gets a fresh collection per size and run (deleted at the end); only
        // the embedded store's corpus can be kept and reused.
        let reuse = loaded_marker.exists() && config.vectors.is_none();
        let mut options = receipts::SqliteOptions::new(directory.join("ledger.db"));
        options.backends = vec![Backend::Relational, Backend::Vector];
        let ledger: Arc<dyn Ledger> =
            Arc::new(SqliteLedger::open(options, Arc::new(SystemClock)).await?);
        let generation = crate::projection::generation(config);
        ledger.activate_generation(&generation, "bench").await?;
        let (store, edge, server): (
            Arc<dyn VectorStore>,
            Option<EdgeVectorStore>,
            Option<ServerVectorStore>,
        ) = match &config.vectors {
            Some(options) => {
                let mut options = options.clone();
                options.collection_prefix = format!(
                    "bench-{}-{size}-",
                    &receipts::ids::new_v7().simple().to_string()[20..]
                );
                let server =
                    ServerVectorStore::open(&options, &generation.id, MODEL_DIMENSION).await?;
                (Arc::new(server.clone()), None, Some(server))
            }
            None => {
                let edge = EdgeVectorStore::open(&directory.join("vectors"), MODEL_DIMENSION)?;
                (Arc::new(edge.clone()), Some(edge), None)
            }
        };
        let (mut load_seconds, mut optimize_seconds, mut changed) = (None, None, None);
        if reuse {
            eprintln!(
                "search: reusing the {size}-chunk corpus in {}",
                directory.display()
            );
        } else {
            let started = Instant::now();
            load(&ledger, store.as_ref(), &generation.id, size, &mut random).await?;
            load_seconds = Some(started.elapsed().as_secs_f64());
            eprintln!("search: building the HNSW index for {size} points");
            let started = Instant::now();
            if let Some(edge) = &edge {
                changed = Some(edge.optimize_now().await?);
            }
            if let Some(server) = &server {
                changed = Some(
                    server
                        .wait_until_optimized(Duration::from_secs(1800))
                        .await?,
                );
            }
            optimize_seconds = Some(started.elapsed().as_secs_f64());
            if bench.data_dir.is_some() && edge.is_some() {
                std::fs::write(&loaded_marker, b"")?;
            }
        }

        let datasets = vec![DATASET.to_owned()];
        let searcher = Searcher::new(
            ledger.clone(),
            Some(VectorSide {
                embedders: Arc::new(gateways::OneModel(embedder.clone())),
                stores: Arc::new(gateways::OneStore::new(&generation.id, store.clone())),
            }),
            config.search,
        );
        let modes_measured = [
            ("vector", Mode::Vector),
            ("lexical", Mode::Lexical),
            ("auto", Mode::Auto),
        ];
        let query = |text: &String, mode: Mode| Query {
            text: text.clone(),
            datasets: datasets.clone(),
            top_k: bench.top_k,
            budget: Duration::from_secs(10),
            mode,
            group_by_source: true,
            at: None,
            filter: None,
            facets: None,
        };
        // Warm-up, alike for both sides: caches, the model's first runs, and the searcher's
        // learned over-fetch (its first queries fetch two hits per result).
        for text in &warm_up {
            let vector = embedder.embed(vec![text.clone()]).await?;
            let _ = store
                .search(vector[0].clone(), &datasets, None, bench.top_k)
                .await?;
            for (_, mode) in &modes_measured {
                searcher.search(query(text, *mode)).await?;
            }
        }
        // Interleaved, query by query (raw, then each mode), so drift in the machine's speed
        // hits every series alike.
        let mut raw = Vec::new();
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); modes_measured.len()];
        let mut degraded = vec![0usize; modes_measured.len()];
        let mut phase_totals: Vec<std::collections::BTreeMap<&str, f64>> =
            vec![std::collections::BTreeMap::new(); modes_measured.len()];
        for text in &queries {
            let started = Instant::now();
            let vector = embedder.embed(vec![text.clone()]).await?;
            let hits = store
                .search(vector[0].clone(), &datasets, None, bench.top_k)
                .await?;
            raw.push(started.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(!hits.is_empty(), "the bare search found nothing");
            for (index, (_, mode)) in modes_measured.iter().enumerate() {
                let started = Instant::now();
                let answer = searcher.search(query(text, *mode)).await?;
                let body = serde_json::to_vec(&answer)?;
                samples[index].push(started.elapsed().as_secs_f64() * 1000.0);
                anyhow::ensure!(!body.is_empty());
                if answer.degraded {
                    degraded[index] += 1;
                }
                let phases = &answer.phases;
                for (name, value) in [
                    ("embed", phases.embed),
                    ("vector", phases.vector),
                    ("bind", phases.bind),
                    ("lexical", phases.lexical),
                    ("fuse", phases.fuse),
                ] {
                    if let Some(ms) = value {
                        *phase_totals[index].entry(name).or_default() += ms;
                    }
                }
            }
        }
        // The same query's vector-mode time minus its raw time: the p50 of these differences
        // is a second, steadier estimate of the overhead (both series' jitter, mostly the
        // embedder's, cancels per query). The goal is judged on the difference of the p50s.
        let paired: Vec<f64> = samples[0]
            .iter()
            .zip(&raw)
            .map(|(cairn, raw)| cairn - raw)
            .collect();
        let paired = summary(paired);
        let mut modes = serde_json::Map::new();
        let mut p50 = std::collections::HashMap::new();
        for (index, (name, _)) in modes_measured.iter().enumerate() {
            let mut report = summary(std::mem::take(&mut samples[index]));
            p50.insert(*name, report["p50_ms"].as_f64().unwrap_or(0.0));
            report["degraded"] = json!(degraded[index]);
            report["mean_phase_ms"] = json!(phase_totals[index]
                .iter()
                .map(|(phase, total)| ((*phase).to_owned(), json!(total / queries.len() as f64)))
                .collect::<serde_json::Map<String, Value>>());
            modes.insert((*name).to_owned(), report);
        }
        let raw = summary(raw);
        let raw_p50 = raw["p50_ms"].as_f64().unwrap_or(0.0);
        let overhead = p50.get("vector").copied().unwrap_or(0.0) - raw_p50;
        eprintln!(
            "search: {size} chunks: raw p50 {raw_p50:.2} ms, vector p50 {:.2} ms, overhead {overhead:.2} ms (paired p50 {:.2} ms)",
            p50.get("vector").copied().unwrap_or(0.0),
            paired["p50_ms"].as_f64().unwrap_or(0.0)
        );
        // Bursts: many clients at once, each with one search (auto mode, 3 s budget), against
        // admission without a queue (429 at once past max_in_flight, as before issue 13) and
        // with the bounded queue.
        let mut bursts = Vec::new();
        for clients in [64, 256] {
            for (policy, max_queued) in [("no_queue", 0), ("queue", config.search.max_queued)] {
                let settings = search::SearchSettings {
                    max_queued,
                    ..config.search
                };
                let searcher = Arc::new(Searcher::new(
                    ledger.clone(),
                    Some(VectorSide {
                        embedders: Arc::new(gateways::OneModel(embedder.clone())),
                        stores: Arc::new(gateways::OneStore::new(&generation.id, store.clone())),
                    }),
                    settings,
                ));
                let report = burst(&searcher, &queries, &datasets, bench.top_k, clients).await;
                eprintln!("search: {size} chunks, burst of {clients}, {policy}: {report}");
                bursts.push(json!({ "clients": clients, "admission": policy, "max_queued": max_queued, "result": report }));
            }
        }
        if let Some(server) = &server {
            server.delete_collection().await?;
        }
        reports.push(json!({
            "chunks": size,
            "bursts": bursts,
            "load_seconds": load_seconds,
            "hnsw_build_seconds": optimize_seconds,
            "hnsw_built": changed,
            "raw_embed_plus_bare_store_search": raw,
            "store": store.location(),
            "modes": modes,
            "vector_overhead_p50_ms": overhead,
            "vector_minus_raw_per_query": paired,
            "goal_overhead_at_most_1ms": overhead <= 1.0,
        }));
    }
    Ok(json!({
        "benchmark": "search",
        "queries_per_mode": bench.queries,
        "top_k": bench.top_k,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "vectors": config.vectors_description(),
        "note": "synthetic one-chunk documents with pseudo-random vectors; queries embedded by the real model; cairn = in-process Searcher::search plus JSON serialisation; raw = the same query embedder plus one bare store search for top_k (qdrant-edge in process, or one qdrant-client search_points call to the server)",
        "sizes": reports,
    }))
}
