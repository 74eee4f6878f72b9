//! `cairn bench project`: end-to-end projection throughput (chunks per second from accepted
//! to verified, through leased workers, the ledger, the real model and qdrant-edge) on a BEIR
//! corpus, and in the same run the raw embedder alone on the same chunks. Also peak RSS and
//! qdrant-edge's upsert rate.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use gateways::embedder::ModelFiles;
use gateways::{Chunker, EdgeVectorStore, ServerVectorStore, VectorPoint, VectorStore};
use receipts::{JobState, Ledger};
use serde_json::{json, Value};

use crate::config::Config;

/// How the projection benchmark runs.
#[derive(Debug, Clone)]
pub struct ProjectBench {
    /// A BEIR `corpus.jsonl` (`_id`, `title`, `text`).
    pub corpus: std::path::PathBuf,
    /// Documents to project (the first ones of the corpus).
    pub docs: usize,
    /// Workers and jobs per worker.
    pub workers: usize,
    /// Jobs each worker runs at once.
    pub concurrency: usize,
    /// Also run the pipeline with this graph on (same documents, a fresh ledger).
    pub graph: Option<gateways::BoltOptions>,
    /// Then project a new revision of every document (chunk reuse).
    pub edits: bool,
    /// One line per document: the records' titles.
    pub one_line: bool,
    /// Project the PDFs of this folder (those with a text layer) instead of the corpus.
    pub pdfs: Option<std::path::PathBuf>,
    /// With `pdfs`: only the PDFs whose text makes at least this many chunks.
    pub min_chunks: usize,
}

/// A PDF of the benchmark: its name, its bytes and its extraction.
type Pdf = (String, Vec<u8>, extract::Extracted);

/// The PDFs of `folder` that have a text layer, with their extraction; the others are
/// counted by their code.
fn read_pdfs(folder: &Path) -> anyhow::Result<(Vec<Pdf>, Value)> {
    let mut paths: Vec<std::path::PathBuf> = std::fs::read_dir(folder)
        .with_context(|| format!("reading {}", folder.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|found| found == "pdf"))
        .collect();
    paths.sort();
    let mut documents = Vec::new();
    let mut refused = serde_json::Map::new();
    let limits = extract::Limits::default();
    for path in paths {
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        match extract::Extracted::from_bytes(&bytes, extract::Format::Pdf, &limits) {
            Ok(extracted) => {
                let key = path
                    .file_name()
                    .map(|name| name.to_string_lossy().into_owned())
                    .unwrap_or_default();
                documents.push((key, bytes, extracted));
            }
            Err(error) => {
                let count = refused.entry(error.code).or_insert(json!(0));
                *count = json!(count.as_u64().unwrap_or(0) + 1);
            }
        }
    }
    Ok((documents, Value::Object(refused)))
}

/// CPU seconds (user and system) this process's threads have used, by thread name with its
/// digits dropped (`tokio-runtime-w`, `sqlx-sqlite-wo`, ONNX Runtime's pool, ...): where a
/// phase's CPU went, from `/proc/self/task/*/stat` (Linux; empty elsewhere).
fn thread_cpu() -> std::collections::BTreeMap<String, f64> {
    let mut totals = std::collections::BTreeMap::new();
    let ticks = 100.0; // USER_HZ on Linux.
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return totals;
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // `pid (name) state ...`: the name may hold spaces; fields follow the last `)`.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name: String = stat[open + 1..close]
            .chars()
            .filter(|c| !c.is_ascii_digit())
            .collect();
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let cpu = |index: usize| {
            fields
                .get(index)
                .and_then(|field| field.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        // utime and stime are fields 14 and 15 of stat; 12 and 13 after the name.
        *totals.entry(name).or_insert(0.0) += (cpu(11) + cpu(12)) / ticks;
    }
    totals
}

/// What each thread group used between two [`thread_cpu`] readings (seconds, largest first).
fn cpu_between(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
) -> Value {
    let mut used: Vec<(String, f64)> = after
        .iter()
        .map(|(name, seconds)| {
            (
                name.clone(),
                seconds - before.get(name).copied().unwrap_or(0.0),
            )
        })
        .filter(|(_, seconds)| *seconds > 0.0)
        .collect();
    used.sort_by(|a, b| b.1.total_cmp(&a.1));
    Value::Object(
        used.into_iter()
            .map(|(name, seconds)| (name, json!((seconds * 100.0).round() / 100.0)))
            .collect(),
    )
}

/// The pipeline's CPU per chunk less the raw embedder's sorted pass's, in milliseconds: what
/// the pipeline spends around the model, if the model costs inside it what it costs alone.
fn cpu_beyond_raw(pipeline: f64, raw_sorted: f64, chunks: usize) -> Option<f64> {
    (chunks > 0).then(|| (pipeline - raw_sorted) * 1000.0 / chunks as f64)
}

/// Peak resident memory of this process, in MiB (Linux `VmHWM`).
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// One report of several runs: each run's report, and the median of each ratio with its
/// spread (the machine's noise is large; the median of interleaved runs is the figure). One
/// run's report is returned as it is.
pub fn project_runs(mut reports: Vec<Value>) -> Value {
    if reports.len() < 2 {
        return reports.pop().unwrap_or(Value::Null);
    }
    let summary = |field: &str| {
        let mut values: Vec<f64> = reports
            .iter()
            .filter_map(|report| report.get(field).and_then(Value::as_f64))
            .collect();
        values.sort_by(f64::total_cmp);
        let median = values.get(values.len() / 2).copied();
        json!({
            "median": median,
            "min": values.first(),
            "max": values.last(),
            "values": values,
        })
    };
    json!({
        "benchmark": "project",
        "runs": reports.len(),
        "pipeline_over_raw_sorted": summary("pipeline_over_raw_sorted"),
        "pipeline_over_raw": summary("pipeline_over_raw"),
        "cpu_ms_per_chunk_beyond_raw": summary("cpu_ms_per_chunk_beyond_raw"),
        "note": "each run: the raw embedder (in order, then sorted) then the pipeline, on a fresh data directory; runs one after another, so the two alternate",
        "each_run": reports,
    })
}

/// Runs the benchmark with `config`'s projection settings on a temporary data directory.
pub async fn project(config: &Config, bench: ProjectBench) -> anyhow::Result<Value> {
    // What is projected: the corpus's text, or PDFs as accepted bytes; the raw embedder gets
    // the same chunks (of the PDFs' extracted text, which the pipeline extracts again).
    let (documents, pdfs) = match &bench.pdfs {
        Some(folder) => {
            anyhow::ensure!(
                !bench.edits,
                "--edits runs on the text corpus, not on --pdfs"
            );
            let (pdfs, refused) = read_pdfs(folder)?;
            let files = ModelFiles::locate(&config.projection.models_dir)?;
            let chunker = Chunker::new(files.tokenizer()?, config.projection.chunker)?;
            let pdfs: Vec<Pdf> = pdfs
                .into_iter()
                .filter(|(_, _, extracted)| {
                    chunker.chunk_extracted(extracted).len() >= bench.min_chunks
                })
                .take(bench.docs)
                .collect();
            (Vec::new(), Some((pdfs, refused)))
        }
        None => (
            super::corpus::read_corpus(&bench.corpus, bench.docs, bench.one_line)?,
            None,
        ),
    };
    let submissions: Vec<receipts::Submission> = match &pdfs {
        Some((pdfs, _)) => pdfs
            .iter()
            .map(|(key, bytes, _)| {
                receipts::Submission::document(
                    "pdfs",
                    key,
                    "bench",
                    bytes.clone(),
                    "application/pdf",
                )
            })
            .collect(),
        None => documents
            .iter()
            .map(|(id, text)| receipts::Submission::text("scifact", id, "bench", text))
            .collect(),
    };
    anyhow::ensure!(!submissions.is_empty(), "no documents to project");
    let directory = tempfile::tempdir().context("creating a temporary directory")?;
    let mut config = config.clone();
    config.data_dir = directory.path().to_path_buf();
    if let Some(vectors) = config.vectors.as_mut() {
        // Collections of this run's own on the server (deleted at the end).
        vectors.collection_prefix = format!(
            "bench-{}-",
            &receipts::ids::new_v7().simple().to_string()[20..]
        );
    }
    let files = ModelFiles::locate(&config.projection.models_dir)?;

    // The raw embedder on the same chunks, first.
    let chunker = Chunker::new(files.tokenizer()?, config.projection.chunker)?;
    let started = Instant::now();
    let chunk_texts: Vec<String> = match &pdfs {
        Some((pdfs, _)) => pdfs
            .iter()
            .flat_map(|(_, _, extracted)| chunker.chunk_extracted(extracted))
            .map(|chunk| chunk.text)
            .collect(),
        None => documents
            .iter()
            .flat_map(|(_, text)| chunker.chunk(text))
            .map(|chunk| chunk.text)
            .collect(),
    };
    let chunk_seconds = started.elapsed().as_secs_f64();
    let raw_model = super::raw::Raw::open(&config, &config.projection.model)?;
    eprintln!(
        "project: raw embedder ({}) on {} chunks of {} documents",
        config.projection.model,
        chunk_texts.len(),
        submissions.len()
    );
    // Sorted by length (the embedder at its best: no batch pads short chunks to the length of
    // a long one), then in document order (as a pipeline meets them).
    let cpu_before = thread_cpu();
    let (raw_seconds, (sorted_seconds, raw_sorted_cpu), vectors) =
        raw_model.time_with_cpu(&chunk_texts).await?;
    let raw_cpu = cpu_between(&cpu_before, &thread_cpu());
    drop(raw_model);
    let dimension = crate::projection::model_dimension(&config);

    // qdrant-edge alone: upsert the raw vectors in batches of 64.
    let store: Arc<dyn VectorStore> = match &config.vectors {
        Some(options) => {
            Arc::new(ServerVectorStore::open(options, "upsert-only", dimension).await?)
        }
        None => Arc::new(EdgeVectorStore::open(
            &directory.path().join("upsert-only"),
            dimension,
        )?),
    };
    let store_name = store.name();
    let started = Instant::now();
    let points: Vec<VectorPoint> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, vector)| VectorPoint {
            dataset: "bench".to_owned(),
            source_key: format!("s{}", index / 4),
            revision_id: uuid::Uuid::from_u128(index as u128 / 4 + 1),
            chunk_index: (index % 4) as u32,
            head_at: 0,
            vector,
            facts: None,
        })
        .collect();
    let point_count = points.len();
    for batch in points.chunks(64) {
        store.upsert(batch.to_vec()).await?;
    }
    let upsert_seconds = started.elapsed().as_secs_f64();
    drop(store);
    if let Some(options) = &config.vectors {
        ServerVectorStore::open(options, "upsert-only", dimension)
            .await?
            .delete_collection()
            .await?;
    }

    // The pipeline: accept every document, let leased workers project them all; with
    // `--graph`, again on a fresh ledger with the graph on (its jobs included).
    let cpu_before = thread_cpu();
    let run = pipeline(&config, &submissions, &bench).await?;
    let pipeline_cpu = cpu_between(&cpu_before, &thread_cpu());
    let pipeline_process_cpu = run.cpu_seconds;
    let edits = if bench.edits {
        eprintln!("project: new revisions of every document (edits)");
        Some(edit_phase(&run, &documents, &bench).await?)
    } else {
        None
    };
    let Run {
        seconds: pipeline_seconds,
        chunk_rows,
        stages,
        jobs,
        ..
    } = run;
    let mut graph_run = None;
    if let Some(options) = &bench.graph {
        let mut with_graph = config.clone();
        with_graph.data_dir = directory.path().join("with-graph");
        std::fs::create_dir_all(&with_graph.data_dir)?;
        with_graph.graph = Some(options.clone());
        if !with_graph.backends.contains(&receipts::Backend::Graph) {
            with_graph.backends.push(receipts::Backend::Graph);
        }
        if let Some(vectors) = with_graph.vectors.as_mut() {
            vectors.collection_prefix = format!("{}graph-", vectors.collection_prefix);
        }
        eprintln!("project: the same documents with the graph on");
        let graph = pipeline(&with_graph, &submissions, &bench).await?;
        anyhow::ensure!(
            graph.chunk_rows == chunk_rows,
            "the graph run stored {} chunks, not {chunk_rows}",
            graph.chunk_rows
        );
        graph_run = Some((graph.seconds, graph.stages));
    }
    let stage_means: serde_json::Map<String, Value> = stages
        .into_iter()
        .map(|(key, total)| (key, json!(total / jobs.len() as f64)))
        .collect();
    anyhow::ensure!(
        chunk_rows as usize == chunk_texts.len(),
        "the pipeline stored {chunk_rows} chunks, the chunker made {}",
        chunk_texts.len()
    );
    if let Some(options) = &config.vectors {
        let generation = crate::projection::generation(&config);
        ServerVectorStore::open(options, &generation.id, dimension)
            .await?
            .delete_collection()
            .await?;
    }
    let raw_rate = chunk_texts.len() as f64 / raw_seconds;
    let sorted_rate = chunk_texts.len() as f64 / sorted_seconds;
    let pipeline_rate = chunk_texts.len() as f64 / pipeline_seconds;
    Ok(json!({
        "benchmark": "project",
        "corpus": bench.pdfs.as_ref().unwrap_or(&bench.corpus).display().to_string(),
        "format": if pdfs.is_some() { "pdf" } else if bench.one_line { "one line (titles)" } else { "text" },
        "pdf_pages": pdfs.as_ref().map(|(pdfs, _)| pdfs.iter().map(|(_, _, extracted)| extracted.pages.len()).sum::<usize>()),
        "pdfs_left_out": pdfs.as_ref().map(|(_, refused)| refused.clone()),
        "pdf_min_chunks": pdfs.as_ref().map(|_| bench.min_chunks),
        "documents": submissions.len(),
        "chunks": chunk_texts.len(),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "model": config.projection.model,
        "embed_batch": config.projection.embed_batch,
        "embed_sessions": config.projection.embed_sessions,
        "embed_threads_per_session": config.projection.embed_threads,
        "workers": bench.workers,
        "concurrency_per_worker": bench.concurrency,
        "raw_embedder": { "seconds": raw_seconds, "chunks_per_second": raw_rate,
            "note": "the chunks in document order, batched as they come" },
        "raw_embedder_sorted": { "seconds": sorted_seconds, "chunks_per_second": sorted_rate,
            "note": "the same chunks sorted by length: no batch pads a short chunk to a long one" },
        "pipeline": {
            "seconds": pipeline_seconds,
            "chunks_per_second": pipeline_rate,
            "note": "accepted -> relational rows read back -> embedded -> vector points read back -> receipts verified -> job completed",
        },
        "vectors": config.vectors_description(),
        "pipeline_over_raw": pipeline_rate / raw_rate,
        "pipeline_over_raw_sorted": pipeline_rate / sorted_rate,
        "chunker_alone_seconds": chunk_seconds,
        "pipeline_cpu_seconds_by_thread": pipeline_cpu,
        "raw_embedder_cpu_seconds_by_thread": raw_cpu,
        "cpu_note": "CPU seconds by thread name: the pipeline's, and the raw embedder's for both of its runs (sorted and in order) together",
        "pipeline_cpu_seconds": pipeline_process_cpu,
        "raw_embedder_sorted_cpu_seconds": raw_sorted_cpu,
        "cpu_ms_per_chunk_beyond_raw": cpu_beyond_raw(pipeline_process_cpu, raw_sorted_cpu, chunk_texts.len()),
        "mean_stage_ms_per_job": stage_means,
        "vector_upsert": {
            "store": store_name,
            "points": point_count,
            "batch": 64,
            "seconds": upsert_seconds,
            "points_per_second": point_count as f64 / upsert_seconds,
            "note": "each batch durable (flushed, or acknowledged with wait=true) before the next",
        },
        "graph": graph_run.map(|(seconds, stages)| {
            let rate = chunk_texts.len() as f64 / seconds;
            json!({
                "store": bench.graph.as_ref().map(|options| options.url.clone()),
                "seconds": seconds,
                "chunks_per_second": rate,
                "over_graph_off": rate / pipeline_rate,
                "goal_at_least_0_9": rate / pipeline_rate >= 0.9,
                "mean_stage_ms_per_job": stages
                    .into_iter()
                    .map(|(key, total)| (key, json!(total / submissions.len() as f64)))
                    .collect::<serde_json::Map<String, Value>>(),
                "note": "the same documents on a fresh ledger with the graph on: every revision also gets a graph job (chunks, links, read-back); timed until every job has ended",
            })
        }),
        "edits": edits,
        "peak_rss_mib": peak_rss_mib(),
    }))
}

/// One pipeline run on `config`'s data directory: accepts every document, runs the workers
/// until every job has ended, and returns the seconds it took, the chunk rows stored, the mean
/// time of each receipt's stages per job, and the acceptances.
async fn pipeline(
    config: &Config,
    submissions: &[receipts::Submission],
    bench: &ProjectBench,
) -> anyhow::Result<Run> {
    let ledger: Arc<dyn Ledger> = crate::open_ledger(config).await?;
    let projector = crate::projection::open_projector(config, ledger.clone()).await?;
    eprintln!(
        "project: pipeline with {} worker(s) x {} jobs",
        bench.workers, bench.concurrency
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let cpu_before = super::process_cpu();
    let mut jobs = Vec::new();
    for batch in submissions.chunks(500) {
        for result in ledger.accept(batch.to_vec()).await {
            jobs.push(result?);
        }
    }
    let mut handles = Vec::new();
    for index in 0..bench.workers {
        let mut worker_config = worker::WorkerConfig::new(format!("bench-{index}"));
        worker_config.concurrency = bench.concurrency;
        worker_config.unit_jobs = config.workers.unit_jobs;
        worker_config.poll_interval = std::time::Duration::from_millis(50);
        let runner = worker::Worker::new(ledger.clone(), projector.clone(), worker_config);
        let mut stopped = stopped.clone();
        handles.push(tokio::spawn(runner.run(async move {
            let _ = stopped.changed().await;
        })));
    }
    let mut last = None;
    loop {
        let counts = ledger.counts().await?;
        let completed = counts.jobs.get("completed").copied().unwrap_or(0);
        let dead = counts.jobs.get("dead").copied().unwrap_or(0);
        anyhow::ensure!(dead == 0, "{dead} projection jobs died; see the log");
        let open = counts.open_jobs();
        if completed as usize >= jobs.len() && open == 0 {
            break;
        }
        if last != Some(completed) {
            eprintln!("project: {completed} of {} documents verified", jobs.len());
            last = Some(completed);
        }
        tokio::time::sleep(DONE_POLL).await;
    }
    let pipeline_seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = super::process_cpu() - cpu_before;
    let _ = stop.send(true);
    for handle in handles {
        handle.await?;
    }
    let mut chunk_rows = 0;
    // Where a job's time goes, from its receipts' evidence (milliseconds, mean per job).
    let mut stages: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
    for acceptance in &jobs {
        let job = ledger
            .job(acceptance.projection_job_id)
            .await?
            .context("a job vanished")?;
        anyhow::ensure!(
            job.state == JobState::Completed,
            "job {} is {}",
            job.id,
            job.state
        );
        chunk_rows += ledger
            .chunk_summary(acceptance.source_revision_id, &projector.generation().id)
            .await?
            .count;
        add_stages(&mut stages, &ledger.receipts(job.id).await?);
    }
    Ok(Run {
        seconds: pipeline_seconds,
        cpu_seconds,
        chunk_rows,
        stages,
        jobs,
        ledger,
        projector,
    })
}

/// How often a phase checks whether every job has ended (its timing error).
const DONE_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Adds a job's stage times (milliseconds, from its receipts' evidence) to `stages`.
fn add_stages(
    stages: &mut std::collections::BTreeMap<String, f64>,
    receipts: &[receipts::ProjectionReceipt],
) {
    for receipt in receipts {
        let Some(evidence) = &receipt.evidence else {
            continue;
        };
        for key in [
            "chunk_ms",
            "write_ms",
            "embed_ms",
            "readback_ms",
            "total_ms",
        ] {
            if let Some(ms) = evidence.get(key).and_then(Value::as_f64) {
                *stages
                    .entry(format!("{}.{key}", receipt.backend))
                    .or_default() += ms;
            }
        }
    }
}

/// One pipeline run and what it left (its ledger and projector, for the edit phase).
struct Run {
    seconds: f64,
    /// CPU seconds of the whole process over `seconds`.
    cpu_seconds: f64,
    chunk_rows: i64,
    stages: std::collections::BTreeMap<String, f64>,
    jobs: Vec<receipts::Acceptance>,
    ledger: Arc<dyn Ledger>,
    projector: Arc<worker::Projector>,
}

/// Runs the workers on `run`'s ledger until every job has ended; returns the seconds taken.
async fn drain(run: &Run, bench: &ProjectBench) -> anyhow::Result<f64> {
    let started = Instant::now();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut handles = Vec::new();
    for index in 0..bench.workers {
        let mut worker_config = worker::WorkerConfig::new(format!("bench-edit-{index}"));
        worker_config.concurrency = bench.concurrency;
        worker_config.poll_interval = std::time::Duration::from_millis(50);
        let runner = worker::Worker::new(run.ledger.clone(), run.projector.clone(), worker_config);
        let mut stopped = stopped.clone();
        handles.push(tokio::spawn(runner.run(async move {
            let _ = stopped.changed().await;
        })));
    }
    loop {
        let counts = run.ledger.counts().await?;
        let dead = counts.jobs.get("dead").copied().unwrap_or(0);
        anyhow::ensure!(dead == 0, "{dead} projection jobs died; see the log");
        if counts.open_jobs() == 0 {
            break;
        }
        tokio::time::sleep(DONE_POLL).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let _ = stop.send(true);
    for handle in handles {
        handle.await?;
    }
    Ok(seconds)
}

/// The edit phase: a new revision of every document. One document in eight gets a sentence
/// appended (its last chunk changes); the others only a new tag (a new revision with the same
/// text). Re-projecting embeds only the changed chunks and reuses every other vector.
async fn edit_phase(
    run: &Run,
    documents: &[(String, String)],
    bench: &ProjectBench,
) -> anyhow::Result<Value> {
    let mut submissions = Vec::new();
    let mut changed_documents = 0;
    for (index, (id, text)) in documents.iter().enumerate() {
        let edited = if index % 8 == 0 {
            changed_documents += 1;
            format!("{text}\n\nRevised in the edit benchmark ({index}).")
        } else {
            text.clone()
        };
        let mut submission = receipts::Submission::text("scifact", id, "bench", &edited);
        if let receipts::Change::Put(document) = &mut submission.change {
            document.tags = vec!["revised".to_owned()];
        }
        submissions.push(submission);
    }
    let mut revisions = Vec::new();
    let started = Instant::now();
    for batch in submissions.chunks(500) {
        for result in run.ledger.accept(batch.to_vec()).await {
            revisions.push(result?);
        }
    }
    drain(run, bench).await?;
    let seconds = started.elapsed().as_secs_f64();
    let (mut embedded, mut reused, mut points) = (0, 0, 0);
    let mut stages = std::collections::BTreeMap::new();
    for acceptance in &revisions {
        let receipts = run.ledger.receipts(acceptance.projection_job_id).await?;
        add_stages(&mut stages, &receipts);
        for receipt in receipts {
            if receipt.backend != receipts::Backend::Vector {
                continue;
            }
            if let Some(evidence) = receipt.evidence {
                embedded += evidence["embedded"].as_u64().unwrap_or(0);
                reused += evidence["reused"].as_u64().unwrap_or(0);
                points += evidence["points"].as_u64().unwrap_or(0);
            }
        }
    }
    let over_first = seconds / run.seconds;
    Ok(json!({
        "documents": documents.len(),
        "documents_with_changed_text": changed_documents,
        "seconds": seconds,
        "first_projection_seconds": run.seconds,
        "over_first_projection": over_first,
        "goal_at_most_0_15": over_first <= 0.15,
        "points": points,
        "embedded": embedded,
        "reused": reused,
        "mean_stage_ms_per_job": stages
            .iter()
            .map(|(stage, total)| (stage.clone(), json!(total / revisions.len().max(1) as f64)))
            .collect::<serde_json::Map<_, _>>(),
        "note": "a new revision of every document (one in eight with a sentence appended, the rest a new tag); timed from the first acceptance until every job has ended, on the first run's ledger and stores",
    }))
}
