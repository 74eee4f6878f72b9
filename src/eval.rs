//! `cairn eval beir DIR`: retrieval quality through the public API. Starts cairn on a
//! temporary data directory (workers, the real model, qdrant-edge), ingests the BEIR corpus
//! through `POST /v1/sources/batch`, waits until every document is verified, runs every query
//! of the split through `POST /v1/search` in each mode and reports nDCG@10 and recall@100.
//!
//! With `--churn`, it then supersedes a share of the documents with changed text and deletes
//! another share, waits for projection, checks that no result of any query points at a
//! superseded or deleted revision, and compares the scores of the queries whose relevant
//! documents were untouched, before and after.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::cli::client::{ok_or_error, Client};
use crate::config::Config;

/// How the evaluation runs.
#[derive(Debug, Clone)]
pub struct BeirEval {
    /// The data set's directory (`corpus.jsonl`, `queries.jsonl`, `qrels/SPLIT.tsv`).
    pub directory: PathBuf,
    /// The qrels split.
    pub split: String,
    /// Use only the first documents (0: all); queries are kept when all their relevant
    /// documents are among them.
    pub limit_docs: usize,
    /// Supersede and delete shares of the corpus and evaluate again.
    pub churn: bool,
    /// Budget per search, in milliseconds.
    pub budget_ms: u64,
    /// Modes to evaluate (`vector`, `lexical`, `auto`). Lexical alone needs no projection:
    /// the run starts no workers and does not wait.
    pub modes: Vec<String>,
    /// Keep the data here (and reuse what an earlier run left: re-ingesting is all
    /// duplicates) instead of a temporary directory.
    pub data_dir: Option<PathBuf>,
    /// Models to evaluate, one generation each (empty: `projection.model` only). The first is
    /// the active generation's; each further one is built as a new generation beside it
    /// (`POST /v1/ops/generations`), switched to once built, and evaluated in turn: the
    /// comparison an operator makes before switching for real.
    pub models: Vec<String>,
}

const DATASET: &str = "beir";

struct Corpus {
    documents: Vec<(String, String)>,
    queries: Vec<(String, String)>,
    qrels: HashMap<String, HashMap<String, f64>>,
}

fn read_jsonl(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(number, line)| {
            serde_json::from_str(line)
                .with_context(|| format!("{} line {}", path.display(), number + 1))
        })
        .collect()
}

fn read_corpus(eval: &BeirEval) -> anyhow::Result<Corpus> {
    let mut documents = Vec::new();
    for record in read_jsonl(&eval.directory.join("corpus.jsonl"))? {
        let id = record["_id"].as_str().context("a document without _id")?;
        let title = record["title"].as_str().unwrap_or("");
        let body = record["text"].as_str().unwrap_or("");
        documents.push((id.to_owned(), format!("{title}\n\n{body}")));
        if eval.limit_docs > 0 && documents.len() >= eval.limit_docs {
            break;
        }
    }
    let kept: HashSet<&str> = documents.iter().map(|(id, _)| id.as_str()).collect();
    let qrels_path = eval
        .directory
        .join("qrels")
        .join(format!("{}.tsv", eval.split));
    let text = std::fs::read_to_string(&qrels_path)
        .with_context(|| format!("reading {}", qrels_path.display()))?;
    let mut qrels: HashMap<String, HashMap<String, f64>> = HashMap::new();
    for (number, line) in text.lines().enumerate() {
        let fields: Vec<&str> = line.split('\t').collect();
        if number == 0 && fields.first() == Some(&"query-id") {
            continue;
        }
        let [query, document, score] = fields[..] else {
            bail!(
                "{} line {}: expected 3 columns",
                qrels_path.display(),
                number + 1
            );
        };
        let score: f64 = score
            .trim()
            .parse()
            .with_context(|| format!("{} line {}", qrels_path.display(), number + 1))?;
        if score > 0.0 {
            qrels
                .entry(query.to_owned())
                .or_default()
                .insert(document.to_owned(), score);
        }
    }
    qrels.retain(|_, relevant| relevant.keys().all(|id| kept.contains(id.as_str())));
    let mut queries = Vec::new();
    for record in read_jsonl(&eval.directory.join("queries.jsonl"))? {
        let id = record["_id"].as_str().context("a query without _id")?;
        if qrels.contains_key(id) {
            let text = record["text"].as_str().context("a query without text")?;
            queries.push((id.to_owned(), text.to_owned()));
        }
    }
    anyhow::ensure!(
        !queries.is_empty(),
        "no query of split {} has its documents",
        eval.split
    );
    Ok(Corpus {
        documents,
        queries,
        qrels,
    })
}

/// nDCG@k with graded gains (`2^rel - 1`, the BEIR convention) over distinct documents.
pub fn ndcg_at(ranked: &[String], relevant: &HashMap<String, f64>, k: usize) -> f64 {
    let gain = |rel: f64| 2f64.powf(rel) - 1.0;
    let dcg: f64 = ranked
        .iter()
        .take(k)
        .enumerate()
        .map(|(position, id)| {
            relevant.get(id).copied().map_or(0.0, gain) / (position as f64 + 2.0).log2()
        })
        .sum();
    let mut ideal: Vec<f64> = relevant.values().copied().collect();
    ideal.sort_by(|a, b| b.total_cmp(a));
    let idcg: f64 = ideal
        .iter()
        .take(k)
        .enumerate()
        .map(|(position, rel)| gain(*rel) / (position as f64 + 2.0).log2())
        .sum();
    if idcg == 0.0 {
        0.0
    } else {
        dcg / idcg
    }
}

/// Share of the relevant documents in the first `k`.
pub fn recall_at(ranked: &[String], relevant: &HashMap<String, f64>, k: usize) -> f64 {
    if relevant.is_empty() {
        return 0.0;
    }
    let found = ranked
        .iter()
        .take(k)
        .filter(|id| relevant.contains_key(id.as_str()))
        .count();
    found as f64 / relevant.len() as f64
}

/// One query's ranked documents, per mode, with the revisions the results pointed at.
struct Run {
    ranked: HashMap<String, Vec<String>>,
    revisions: Vec<(String, String)>,
    answered: BTreeMap<String, usize>,
    degraded: usize,
    latencies_ms: Vec<f64>,
    /// Hits the search dropped because their revision was no longer current.
    stale_dropped: u64,
}

async fn run_queries(
    client: &Client,
    corpus: &Corpus,
    mode: &str,
    budget_ms: u64,
) -> anyhow::Result<Run> {
    let mut run = Run {
        ranked: HashMap::new(),
        revisions: Vec::new(),
        answered: BTreeMap::new(),
        degraded: 0,
        latencies_ms: Vec::new(),
        stale_dropped: 0,
    };
    for (id, text) in &corpus.queries {
        let started = Instant::now();
        let (status, answer) = client
            .post(
                "/v1/search",
                &json!({
                    "query": text,
                    "datasets": [DATASET],
                    "top_k": 100,
                    "mode": mode,
                    "budget_ms": budget_ms,
                }),
            )
            .await?;
        run.latencies_ms
            .push(started.elapsed().as_secs_f64() * 1000.0);
        if status != 200 {
            bail!("query {id} ({mode}): HTTP {status}: {answer}");
        }
        let results = answer["results"].as_array().cloned().unwrap_or_default();
        let mut ranked = Vec::new();
        for result in &results {
            let key = result["source_key"].as_str().unwrap_or("").to_owned();
            let revision = result["source_revision_id"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            run.revisions.push((key.clone(), revision));
            ranked.push(key);
        }
        *run.answered
            .entry(answer["mode"].as_str().unwrap_or("?").to_owned())
            .or_default() += 1;
        if answer["degraded"].as_bool() == Some(true) {
            run.degraded += 1;
        }
        run.stale_dropped += answer["stale_dropped"].as_u64().unwrap_or(0);
        run.ranked.insert(id.clone(), ranked);
    }
    Ok(run)
}

fn percentile(values: &[f64], share: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    crate::bench::percentile_f64(&sorted, share)
}

fn scores(run: &Run, corpus: &Corpus, only: Option<&HashSet<String>>) -> (f64, f64, usize) {
    let mut ndcg = 0.0;
    let mut recall = 0.0;
    let mut count = 0;
    for (id, _) in &corpus.queries {
        if only.is_some_and(|only| !only.contains(id)) {
            continue;
        }
        let (Some(ranked), Some(relevant)) = (run.ranked.get(id), corpus.qrels.get(id)) else {
            continue;
        };
        ndcg += ndcg_at(ranked, relevant, 10);
        recall += recall_at(ranked, relevant, 100);
        count += 1;
    }
    if count == 0 {
        return (0.0, 0.0, 0);
    }
    (ndcg / count as f64, recall / count as f64, count)
}

async fn ingest(
    client: &Client,
    documents: &[(String, String)],
) -> anyhow::Result<HashMap<String, String>> {
    let mut revisions = HashMap::new();
    for batch in documents.chunks(200) {
        let items: Vec<Value> = batch
            .iter()
            .map(|(id, text)| json!({"dataset": DATASET, "source_key": id, "content": text}))
            .collect();
        let (status, answer) = client
            .post("/v1/sources/batch", &json!({ "items": items }))
            .await?;
        if !(200..300).contains(&status) {
            bail!("batch ingest: HTTP {status}: {answer}");
        }
        for ((id, _), result) in batch.iter().zip(
            answer["results"]
                .as_array()
                .context("a batch answer without results")?,
        ) {
            let revision = result["receipt"]["source_revision_id"]
                .as_str()
                .or_else(|| result["source_revision_id"].as_str())
                .with_context(|| format!("document {id} was not accepted: {result}"))?;
            revisions.insert(id.clone(), revision.to_owned());
        }
    }
    Ok(revisions)
}

/// Pauses (or resumes) claiming in the evaluation's dataset.
async fn pause(client: &Client, paused: bool) -> anyhow::Result<()> {
    let path = if paused {
        "/v1/ops/pause"
    } else {
        "/v1/ops/resume"
    };
    let (status, answer) = client
        .post(
            path,
            &json!({ "dataset": DATASET, "reason": "eval churn: binding checked before projection" }),
        )
        .await?;
    if status != 200 {
        bail!("{path}: HTTP {status}: {answer}");
    }
    Ok(())
}

async fn delete(client: &Client, id: &str) -> anyhow::Result<String> {
    let (status, answer) = client
        .delete(&format!(
            "/v1/sources?dataset={DATASET}&source_key={}&reason=eval-churn",
            percent_encode(id)
        ))
        .await?;
    if !(200..300).contains(&status) {
        bail!("delete {id}: HTTP {status}: {answer}");
    }
    Ok(answer["source_revision_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned())
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Waits until no projection job is pending, running or waiting to retry.
async fn wait_for_projection(client: &Client, started: Instant) -> anyhow::Result<()> {
    let mut last = String::new();
    loop {
        let status = client.get("/v1/status").await?;
        let jobs = &status["counts"]["jobs"];
        let count = |state: &str| jobs[state].as_i64().unwrap_or(0);
        let dead = count("dead") + count("quarantined");
        if dead > 0 {
            bail!("{dead} projection jobs died; see the server log");
        }
        let open = count("pending") + count("running") + count("retry_wait");
        let line = format!(
            "eval: {} projected, {open} to go ({:.0} s)",
            count("completed"),
            started.elapsed().as_secs_f64()
        );
        if line != last {
            eprintln!("{line}");
            last = line;
        }
        if open == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Runs the evaluation; returns the JSON report.
pub async fn beir(config: &Config, eval: BeirEval) -> anyhow::Result<Value> {
    let corpus = read_corpus(&eval)?;
    for mode in &eval.modes {
        anyhow::ensure!(
            ["vector", "lexical", "auto"].contains(&mode.as_str()),
            "unknown mode `{mode}`; valid modes: vector, lexical, auto"
        );
    }
    let lexical_only = eval.modes.iter().all(|mode| mode == "lexical");
    anyhow::ensure!(
        eval.models.len() <= 1 || !(eval.churn || lexical_only),
        "--models compares generations' vectors: it needs a vector mode, and runs without --churn"
    );
    let temporary = tempfile::tempdir().context("creating a temporary data directory")?;
    let mut config = config.clone();
    let catalog = crate::projection::model_catalog(&config);
    let models: Vec<String> = eval
        .models
        .iter()
        .map(|model| catalog.resolve(model).map(|entry| entry.id))
        .collect::<Result<_, _>>()?;
    if let Some(first) = models.first() {
        config.projection.model = first.clone();
    }
    config.data_dir = eval
        .data_dir
        .clone()
        .unwrap_or_else(|| temporary.path().to_path_buf());
    if let (Some(vectors), None) = (config.vectors.as_mut(), &eval.data_dir) {
        // A collection of this run's own: an earlier run's points would be reconciled, not
        // projected.
        vectors.collection_prefix = format!(
            "eval-{}-",
            &receipts::ids::new_v7().simple().to_string()[20..]
        );
    }
    config.bind = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
        probe.local_addr()?
    };
    config.workers.count = if lexical_only {
        0
    } else {
        config.workers.count.max(1)
    };
    let base = format!("http://{}", config.bind);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // The server runs on its own runtime and thread, as it would in its own process.
    let server = {
        let config = config.clone();
        std::thread::spawn(move || -> anyhow::Result<()> {
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(crate::serve(config, async move {
                    let _ = stopped.await;
                }))
        })
    };
    let token_path = crate::config::admin_token_path(&config.data_dir);
    let waiting = Instant::now();
    let token = loop {
        if let Ok(token) = std::fs::read_to_string(&token_path) {
            if !token.trim().is_empty()
                && Client::new(&base, token.trim().to_owned())?
                    .get("/healthz")
                    .await
                    .is_ok()
            {
                break token.trim().to_owned();
            }
        }
        if server.is_finished() {
            bail!("the server stopped during startup; see the log");
        }
        anyhow::ensure!(
            waiting.elapsed() < Duration::from_secs(120),
            "the server did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let client = Client::new(&base, token)?;

    eprintln!(
        "eval: ingesting {} documents, {} queries ({} split)",
        corpus.documents.len(),
        corpus.queries.len(),
        eval.split
    );
    let started = Instant::now();
    let revisions = ingest(&client, &corpus.documents).await?;
    let ingest_seconds = started.elapsed().as_secs_f64();
    if !lexical_only {
        wait_for_projection(&client, started).await?;
    }
    let searchable_seconds = started.elapsed().as_secs_f64();

    let mut report = json!({
        "benchmark": "eval-beir",
        "directory": eval.directory.display().to_string(),
        "split": eval.split,
        "documents": corpus.documents.len(),
        "queries": corpus.queries.len(),
        "ledger": config.ledger_description(),
        "vectors": config.vectors_description(),
        "budget_ms": eval.budget_ms,
        "ingest_seconds": ingest_seconds,
        "accepted_to_searchable_seconds": searchable_seconds,
        "chunking": format!(
            "{} tokens per chunk, {} overlap (model tokenizer); lexical passages of {} bytes",
            config.projection.chunker.max_tokens,
            config.projection.chunker.overlap_tokens,
            receipts::passages::PASSAGE_TARGET_BYTES
        ),
        "fusion": format!(
            "reciprocal rank fusion, k = {}, {} candidates per phase, best passage per source",
            search::fusion::RRF_K,
            search::fusion::CANDIDATE_WINDOW
        ),
    });
    let mut before = HashMap::new();
    println!(
        "{:<8} {:>8} {:>11} {:>9} {:>9}",
        "mode", "nDCG@10", "recall@100", "p50 ms", "p99 ms"
    );
    let first = crate::projection::generation(&config);
    let mut generations = vec![first.clone()];
    for mode in eval.modes.iter().map(String::as_str) {
        let run = run_queries(&client, &corpus, mode, eval.budget_ms).await?;
        report[mode] = mode_report(&run, &corpus, mode);
        before.insert(mode, run);
    }
    if models.len() > 1 {
        let mut compared = vec![generation_report(&first, &report, &eval.modes)];
        for model in &models[1..] {
            let generation = build_and_switch(&client, model, started).await?;
            println!("{} ({model})", generation.id);
            let mut answers = json!({});
            for mode in eval.modes.iter().map(String::as_str) {
                let run = run_queries(&client, &corpus, mode, eval.budget_ms).await?;
                answers[mode] = mode_report(&run, &corpus, mode);
            }
            compared.push(generation_report(&generation, &answers, &eval.modes));
            generations.push(generation);
        }
        report["generations"] = Value::Array(compared);
    }

    if eval.churn {
        report["churn"] = churn(
            &client,
            &corpus,
            &revisions,
            &before,
            &eval.modes,
            eval.budget_ms,
            lexical_only,
        )
        .await?;
    }
    let _ = stop.send(());
    tokio::task::spawn_blocking(move || server.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the server thread panicked"))??;
    if let (Some(vectors), None) = (&config.vectors, &eval.data_dir) {
        // The run's own collections on the server go with its temporary data directory.
        for generation in &generations {
            gateways::ServerVectorStore::open(
                vectors,
                &generation.id,
                usize::try_from(generation.dimension).unwrap_or(0),
            )
            .await?
            .delete_collection()
            .await?;
        }
    }
    Ok(report)
}

/// One mode's scores and latencies, printed as a table row.
fn mode_report(run: &Run, corpus: &Corpus, mode: &str) -> Value {
    let (ndcg, recall, count) = scores(run, corpus, None);
    println!(
        "{mode:<8} {ndcg:>8.4} {recall:>11.4} {:>9.1} {:>9.1}",
        percentile(&run.latencies_ms, 0.5),
        percentile(&run.latencies_ms, 0.99)
    );
    json!({
        "ndcg_at_10": ndcg,
        "recall_at_100": recall,
        "queries": count,
        "answered_as": run.answered,
        "degraded": run.degraded,
        "latency_ms": { "p50": percentile(&run.latencies_ms, 0.5), "p99": percentile(&run.latencies_ms, 0.99) },
    })
}

/// A generation's entry in the comparison: its id, model and each mode's scores.
fn generation_report(
    generation: &receipts::Generation,
    answers: &Value,
    modes: &[String],
) -> Value {
    let mut entry = json!({ "generation": generation.id, "model": generation.model });
    for mode in modes {
        entry[mode.as_str()] = answers[mode.as_str()].clone();
    }
    entry
}

/// Builds a generation of `model` beside the active one through the API, waits until every
/// job has ended, and switches to it.
async fn build_and_switch(
    client: &Client,
    model: &str,
    started: Instant,
) -> anyhow::Result<receipts::Generation> {
    eprintln!("eval: building a generation with {model}");
    let (status, created) = client
        .post(
            "/v1/ops/generations",
            &json!({ "model": model, "reason": "cairn eval beir --models" }),
        )
        .await?;
    let created = ok_or_error(status, created)?;
    let view: receipts::GenerationView = serde_json::from_value(created["generation"].clone())
        .with_context(|| format!("the created generation: {created}"))?;
    wait_for_projection(client, started).await?;
    let (status, switched) = client
        .post(
            &format!("/v1/ops/generations/{}/switch", view.id),
            &json!({ "reason": "cairn eval beir --models" }),
        )
        .await?;
    ok_or_error(status, switched)?;
    Ok(view.generation())
}

/// Supersedes 20% of the documents with changed text, deletes 10%, and evaluates again.
async fn churn(
    client: &Client,
    corpus: &Corpus,
    revisions: &HashMap<String, String>,
    before: &HashMap<&str, Run>,
    modes: &[String],
    budget_ms: u64,
    lexical_only: bool,
) -> anyhow::Result<Value> {
    // Deterministic choice: by a hash of the id.
    let bucket = |id: &str| {
        let digest = <sha2::Sha256 as sha2::Digest>::digest(id.as_bytes());
        digest[0] % 10
    };
    let mut superseded: HashSet<String> = HashSet::new();
    let mut deleted: HashSet<String> = HashSet::new();
    let mut updates = Vec::new();
    for (id, text) in &corpus.documents {
        match bucket(id) {
            0 | 1 => {
                superseded.insert(id.clone());
                // Changed text: the sentences in reverse order, marked as revised.
                let mut sentences: Vec<&str> = text.split(". ").collect();
                sentences.reverse();
                updates.push((id.clone(), format!("Revised. {}", sentences.join(". "))));
            }
            2 => {
                deleted.insert(id.clone());
            }
            _ => {}
        }
    }
    eprintln!(
        "eval: churn: superseding {} documents, deleting {}",
        updates.len(),
        deleted.len()
    );
    // Claims are paused while the churn is accepted, so the vector store still holds the
    // old revisions as current: only the binding at search time keeps them out of answers.
    if !lexical_only {
        pause(client, true).await?;
    }
    let started = Instant::now();
    let new_revisions = ingest(client, &updates).await?;
    for id in &deleted {
        delete(client, id).await?;
    }
    let retired: HashSet<&str> = superseded
        .iter()
        .chain(&deleted)
        .filter_map(|id| revisions.get(id).map(String::as_str))
        .collect();
    let mut unprojected = json!(null);
    if !lexical_only {
        let run = run_queries(client, corpus, "vector", budget_ms).await;
        // Claims resume whatever the queries found.
        pause(client, false).await?;
        let run = run?;
        let violations = run
            .revisions
            .iter()
            .filter(|(key, revision)| {
                retired.contains(revision.as_str())
                    || deleted.contains(key)
                    || new_revisions
                        .get(key)
                        .is_some_and(|current| current != revision)
            })
            .count();
        println!(
            "churn before projection (claims paused), vector mode: {} stale hit(s) dropped by \
             the binding, {violations} result(s) pointed at a superseded or deleted revision",
            run.stale_dropped
        );
        if violations > 0 || run.stale_dropped == 0 {
            bail!(
                "churn before projection: {violations} stale result(s), {} stale hit(s) \
                 dropped: the binding must drop every retired revision, and there were some to \
                 drop",
                run.stale_dropped
            );
        }
        unprojected = json!({
            "stale_dropped": run.stale_dropped,
            "results_pointing_at_retired_revisions": violations,
        });
        wait_for_projection(client, started).await?;
    }
    // Queries whose relevant documents were all left untouched.
    let untouched: HashSet<String> = corpus
        .qrels
        .iter()
        .filter(|(_, relevant)| {
            relevant
                .keys()
                .all(|id| !superseded.contains(id) && !deleted.contains(id))
        })
        .map(|(id, _)| id.clone())
        .collect();
    let mut report = json!({
        "superseded": superseded.len(),
        "deleted": deleted.len(),
        "untouched_queries": untouched.len(),
        "before_projection_vector": unprojected,
    });
    let mut violations = 0;
    for mode in modes.iter().map(String::as_str) {
        let run = run_queries(client, corpus, mode, budget_ms).await?;
        for (key, revision) in &run.revisions {
            if retired.contains(revision.as_str()) || deleted.contains(key) {
                violations += 1;
            }
            if let Some(current) = new_revisions.get(key) {
                if current != revision {
                    violations += 1;
                }
            }
        }
        let (ndcg_after, recall_after, count) = scores(&run, corpus, Some(&untouched));
        let (ndcg_before, recall_before, _) = before
            .get(mode)
            .map(|run| scores(run, corpus, Some(&untouched)))
            .unwrap_or_default();
        println!(
            "churn {mode:<8} nDCG@10 {ndcg_before:.4} -> {ndcg_after:.4}, recall@100 {recall_before:.4} -> {recall_after:.4} ({count} untouched queries)"
        );
        report[mode] = json!({
            "ndcg_at_10_before": ndcg_before,
            "ndcg_at_10_after": ndcg_after,
            "recall_at_100_before": recall_before,
            "recall_at_100_after": recall_after,
            "results_checked": run.revisions.len(),
        });
    }
    report["results_pointing_at_retired_revisions"] = json!(violations);
    println!("churn: {violations} result(s) pointed at a superseded or deleted revision");
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ndcg_and_recall_match_hand_computed_values() {
        let relevant: HashMap<String, f64> = [("a".to_owned(), 1.0), ("b".to_owned(), 1.0)].into();
        let ranked: Vec<String> = ["x", "a", "y", "b"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let dcg = 1.0 / 3f64.log2() + 1.0 / 5f64.log2();
        let idcg = 1.0 + 1.0 / 3f64.log2();
        assert!((ndcg_at(&ranked, &relevant, 10) - dcg / idcg).abs() < 1e-12);
        assert!((ndcg_at(&ranked, &relevant, 1)).abs() < 1e-12);
        assert!((recall_at(&ranked, &relevant, 3) - 0.5).abs() < 1e-12);
        assert!((recall_at(&ranked, &relevant, 100) - 1.0).abs() < 1e-12);
        let perfect: Vec<String> = vec!["a".to_owned(), "b".to_owned()];
        assert!((ndcg_at(&perfect, &relevant, 10) - 1.0).abs() < 1e-12);
    }
}
