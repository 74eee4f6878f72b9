//! `cairn bench filters`: filtered search at each selectivity (50%, 5%, 0.5%, 0.05% of the
//! sources), per mode, against the same queries unfiltered: p50 and p99, vector recall@k
//! against an exact filtered search, and whether every page was full when enough sources
//! matched; then facet counts over every head for three fields.
//!
//! The corpus is built like `cairn bench temporal`'s first round (synthetic one-chunk
//! documents, pseudo-random unit vectors with planted neighbours near each query, written
//! through the ledger's fenced projection writes and qdrant-edge), with tags that select each
//! share of the sources: source `n` has `p50` when `n % 2 == 0`, `p5` when `n % 20 == 1`,
//! `p0_5` when `n % 200 == 3` and `p0_05` when `n % 2000 == 5`, a media type from three and
//! `metadata.group` from seven.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use gateways::embedder::{LocalEmbedder, ModelFiles, MODEL_DIMENSION};
use gateways::{EdgeVectorStore, Embedder, VectorStore};
use receipts::filter::facets::FacetField;
use receipts::filter::{Filter, FilterLimits};
use receipts::{Backend, Change, Ledger, SqliteLedger, Submission, SystemClock};
use search::facets::{FacetQuery, FacetRequest};
use search::{Mode, Query, Searcher, VectorSide};
use serde_json::{json, Value};

use super::search_latency::{project_claimed, summary, Random, DATASET};
use super::temporal::{exact, Planting};
use crate::config::Config;

/// How the filter benchmark runs.
#[derive(Debug, Clone)]
pub struct FilterBench {
    /// Sources in the corpus.
    pub docs: usize,
    /// Queries per selectivity and mode.
    pub queries: usize,
    /// Results per query.
    pub top_k: usize,
}

/// Each selectivity: its tag, and which sources hold it.
const SELECTIVITIES: [(&str, usize, usize); 4] = [
    ("p50", 2, 0),
    ("p5", 20, 1),
    ("p0_5", 200, 3),
    ("p0_05", 2000, 5),
];

const MEDIA: [&str; 3] = ["text/plain", "text/markdown", "text/html"];

fn tags_of(n: usize) -> Vec<String> {
    SELECTIVITIES
        .iter()
        .filter(|(_, every, at)| n % every == *at)
        .map(|(tag, _, _)| (*tag).to_owned())
        .collect()
}

/// Accepts every source with its tags, media type and group.
async fn accept(
    ledger: &Arc<dyn Ledger>,
    docs: usize,
    random: &mut Random,
) -> anyhow::Result<std::collections::HashMap<String, String>> {
    let mut texts = std::collections::HashMap::new();
    for start in (0..docs).step_by(1000) {
        let submissions: Vec<Submission> = (start..(start + 1000).min(docs))
            .map(|n| {
                let key = format!("doc-{n}");
                let text = random.text(40);
                let mut submission = Submission::text(DATASET, &key, "bench", &text);
                if let Change::Put(document) = &mut submission.change {
                    document.tags = tags_of(n);
                    document.media_type = MEDIA[n % MEDIA.len()].to_owned();
                    document
                        .metadata
                        .insert("group".to_owned(), json!(format!("g{}", n % 7)));
                }
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

/// The corpus both benchmarks search: the ledger, the store, the searcher, and each source's
/// vector and each query's, kept for the exact searches recall is measured against.
pub(super) struct Corpus {
    /// The ledger (SQLite in `_directory`).
    pub(super) ledger: Arc<dyn Ledger>,
    /// The vector store (qdrant-edge in `_directory`).
    pub(super) store: Arc<dyn VectorStore>,
    /// The same store, for its optimiser.
    pub(super) edge: EdgeVectorStore,
    searcher: Searcher,
    queries: Vec<String>,
    embedded: Vec<Vec<f32>>,
    vectors: Vec<Vec<f32>>,
    datasets: Vec<String>,
    /// Seconds to accept and project every source.
    pub(super) load_seconds: f64,
    /// Seconds to build the HNSW index.
    pub(super) hnsw_seconds: f64,
    _directory: tempfile::TempDir,
}

/// The modes each case is measured in.
const MODES: [(&str, Mode); 3] = [
    ("vector", Mode::Vector),
    ("lexical", Mode::Lexical),
    ("auto", Mode::Auto),
];

impl Corpus {
    /// Builds the corpus in a temporary directory: the embedded default (SQLite,
    /// qdrant-edge), every source accepted and projected, the index built.
    pub(super) async fn build(config: &Config, bench: &FilterBench) -> anyhow::Result<Corpus> {
        let files = ModelFiles::locate(&config.projection.models_dir)?;
        let embedder: Arc<LocalEmbedder> = {
            let files = files.clone();
            Arc::new(
                tokio::task::spawn_blocking(move || LocalEmbedder::load(&files, 1, Some(1)))
                    .await??,
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

        let mut words = Random(41);
        let queries: Vec<String> = (0..bench.queries).map(|_| words.text(4)).collect();
        let embedded = embedder.embed(queries.clone()).await?;
        let planting = Planting {
            queries: embedded.clone(),
            per_query: (bench.docs / bench.queries.max(1)).min(40),
            docs: bench.docs,
        };
        let mut random = Random(43);
        let started = Instant::now();
        let texts = accept(&ledger, bench.docs, &mut random).await?;
        let mut vectors = vec![Vec::new(); bench.docs];
        project_claimed(
            &ledger,
            store.as_ref(),
            &generation.id,
            &texts,
            &mut random,
            "filters",
            |job, random| {
                let source: usize = job
                    .source_key
                    .strip_prefix("doc-")
                    .and_then(|n| n.parse().ok())
                    .context("a bench source key")?;
                let vector = planting.vector(0, source, random);
                if let Some(slot) = vectors.get_mut(source) {
                    *slot = vector.clone();
                }
                // The facts `accept` gave the source, as a projection writes them.
                let facts = gateways::PointFacts {
                    tags: tags_of(source),
                    media_type: MEDIA[source % MEDIA.len()].to_owned(),
                    metadata: json!({ "group": format!("g{}", source % 7) }),
                    accepted_at: job.created_at,
                    readers: Vec::new(),
                };
                Ok((vector, Some(Arc::new(facts))))
            },
        )
        .await?;
        let load_seconds = started.elapsed().as_secs_f64();
        eprintln!("filters: building the HNSW index");
        let started = Instant::now();
        edge.optimize_now().await?;
        let hnsw_seconds = started.elapsed().as_secs_f64();
        let searcher = Searcher::new(
            ledger.clone(),
            Some(VectorSide {
                embedders: Arc::new(gateways::OneModel(embedder.clone())),
                stores: Arc::new(gateways::OneStore::new(&generation.id, store.clone())),
            }),
            config.search,
        );
        let corpus = Corpus {
            ledger,
            store,
            edge,
            searcher,
            queries,
            embedded,
            vectors,
            datasets: vec![DATASET.to_owned()],
            load_seconds,
            hnsw_seconds,
            _directory: directory,
        };
        for text in corpus.queries.iter().take(20) {
            for (_, mode) in &MODES {
                corpus
                    .searcher
                    .search(corpus.query(text, *mode, None, bench.top_k))
                    .await?;
            }
        }
        Ok(corpus)
    }

    fn query(&self, text: &str, mode: Mode, filter: Option<Filter>, top_k: usize) -> Query {
        Query {
            text: text.to_owned(),
            datasets: self.datasets.clone(),
            top_k,
            budget: Duration::from_secs(10),
            mode,
            group_by_source: true,
            at: None,
            filter,
            facets: None,
        }
    }

    /// Each case (a name, a filter, the sources it matches), each mode, query by query
    /// interleaved: p50 and p99 (and their ratio to the first case's p50), vector recall@k
    /// against an exact search over the matching sources, and pages short of `top_k`.
    pub(super) async fn measure(
        &self,
        cases: &[(String, Option<Filter>, Vec<usize>)],
        top_k: usize,
    ) -> anyhow::Result<serde_json::Map<String, Value>> {
        let mut report = serde_json::Map::new();
        let mut base_p50 = std::collections::HashMap::new();
        for (case_index, (name, filter, matching)) in cases.iter().enumerate() {
            let subset: Vec<Vec<f32>> = matching.iter().map(|n| self.vectors[*n].clone()).collect();
            let mut samples = vec![Vec::new(); MODES.len()];
            let mut recall_sum = 0.0;
            let mut short_pages = 0;
            for (index, text) in self.queries.iter().enumerate() {
                for (slot, (mode_name, mode)) in MODES.iter().enumerate() {
                    let started = Instant::now();
                    let answer = self
                        .searcher
                        .search(self.query(text, *mode, filter.clone(), top_k))
                        .await?;
                    samples[slot].push(started.elapsed().as_secs_f64() * 1000.0);
                    let wanted = top_k.min(matching.len());
                    if *mode_name != "lexical" && answer.results.len() < wanted {
                        short_pages += 1;
                    }
                    if *mode_name == "vector" {
                        let truth: std::collections::HashSet<String> =
                            exact(&subset, &self.embedded[index], top_k)
                                .into_iter()
                                .map(|i| format!("doc-{}", matching[i]))
                                .collect();
                        let found = answer
                            .results
                            .iter()
                            .filter(|result| truth.contains(&result.source_key))
                            .count();
                        recall_sum += found as f64 / truth.len().max(1) as f64;
                    }
                }
            }
            let mut case = serde_json::Map::new();
            case.insert("matching".to_owned(), json!(matching.len()));
            for ((mode_name, _), series) in MODES.iter().zip(samples) {
                let mut summary = summary(series);
                let p50 = summary["p50_ms"].as_f64().unwrap_or(0.0);
                if case_index == 0 {
                    base_p50.insert(*mode_name, p50);
                } else if let Some(base) = base_p50.get(mode_name) {
                    summary[format!("p50_vs_{}", cases[0].0)] = json!(p50 / base.max(1e-9));
                }
                case.insert((*mode_name).to_owned(), summary);
            }
            case.insert(
                "vector_recall_at_k".to_owned(),
                json!(recall_sum / self.queries.len() as f64),
            );
            case.insert("short_pages".to_owned(), json!(short_pages));
            eprintln!("bench: {name}: {}", Value::Object(case.clone()));
            report.insert(name.clone(), Value::Object(case));
        }
        Ok(report)
    }
}

/// Runs the benchmark in a temporary directory: the embedded default (SQLite, qdrant-edge).
pub async fn filters(config: &Config, bench: FilterBench) -> anyhow::Result<Value> {
    let corpus = Corpus::build(config, &bench).await?;
    let datasets = corpus.datasets.clone();
    let searcher = &corpus.searcher;
    // Each selectivity (and none), each mode.
    let mut cases: Vec<(String, Option<Filter>, Vec<usize>)> =
        vec![("unfiltered".to_owned(), None, (0..bench.docs).collect())];
    for (tag, every, at) in SELECTIVITIES {
        let filter = Filter::parse(
            &json!({"field": "tags", "any": [tag]}),
            FilterLimits::default(),
        )?;
        let matching: Vec<usize> = (0..bench.docs).filter(|n| n % every == at).collect();
        cases.push((tag.to_owned(), Some(filter), matching));
    }
    let report = corpus.measure(&cases, bench.top_k).await?;
    // Facet counts over every head, three fields at once, as a search asks for them.
    let mut facet_samples = Vec::new();
    let request = FacetRequest {
        fields: vec![
            FacetField::Tags,
            FacetField::MediaType,
            FacetField::Metadata("group".to_owned()),
        ],
        values: 20,
    };
    for _ in 0..bench.queries.min(50) {
        let started = Instant::now();
        let answer = searcher
            .facets(FacetQuery {
                datasets: datasets.clone(),
                filter: None,
                at: None,
                request: request.clone(),
                budget: Duration::from_secs(30),
            })
            .await?;
        facet_samples.push(started.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            answer.facets_partial.is_empty() && answer.facets.len() == 3,
            "facets did not finish: {:?}",
            answer.facets_partial
        );
        anyhow::ensure!(
            answer.facets[1].sources == bench.docs as u64,
            "facets counted {} of {} sources",
            answer.facets[1].sources,
            bench.docs
        );
    }
    Ok(json!({
        "benchmark": "filters",
        "docs": bench.docs,
        "queries": bench.queries,
        "top_k": bench.top_k,
        "filter_max_narrowing": config.search.filter_max_narrowing,
        "load_seconds": corpus.load_seconds,
        "hnsw_seconds": corpus.hnsw_seconds,
        "selectivities": Value::Object(report),
        "facets_three_fields": summary(facet_samples),
    }))
}
