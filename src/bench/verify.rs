//! `cairn bench verify`: verify passes over a large installation generated without
//! embedding. A real SQLite ledger gets `sources` accepted documents, each projected by hand:
//! its job claimed, `chunks` chunk rows written, receipts recorded, and the job completed. A
//! real qdrant-edge shard gets `chunks` points per source, of a small dimension: verify never
//! reads a vector's values except in the deep tier. Then one pass of each tier runs at full
//! speed while a search loop measures its effect on search latency.
//!
//! Reports, per tier:
//! - the pass time;
//! - buckets and store calls per second;
//! - the search p50 and p99 while the pass runs, next to the same loop with no pass.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use gateways::{EdgeVectorStore, OneStore, VectorPoint, VectorStore};
use receipts::model::{
    Backend, ChunkRow, ChunkSummary, Generation, PassChange, ReceiptState, ReceiptUpdate,
    VerifyTier,
};
use receipts::{LeaseToken, Ledger, SqliteLedger, SqliteOptions, Submission, SystemClock};
use serde_json::{json, Value};

use super::search_latency::Random;

/// How the verify benchmark runs.
#[derive(Debug, Clone)]
pub struct VerifyBench {
    /// Sources (each one settled head).
    pub sources: usize,
    /// Chunk rows and points per source.
    pub chunks: usize,
    /// The vectors' dimension.
    pub dimension: usize,
    /// The passes' rate limit, points per second (`None`: unthrottled).
    pub rate: Option<u32>,
    /// Whether the backup and restore run after the passes.
    pub backup: bool,
}

fn unit(random: &mut Random, dimension: usize) -> Vec<f32> {
    let raw: Vec<f32> = (0..dimension)
        .map(|_| (random.next() % 1000) as f32 / 1000.0 + 0.001)
        .collect();
    let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
    raw.into_iter().map(|x| x / norm).collect()
}

/// Projects every pending job by hand: rows, points, receipts, completion.
async fn settle(
    ledger: &Arc<dyn Ledger>,
    store: &Arc<EdgeVectorStore>,
    generation: &Generation,
    chunks: usize,
    random: &mut Random,
) -> anyhow::Result<usize> {
    let mut settled = 0;
    loop {
        let jobs = ledger.claim("bench-verify", 1000).await?;
        if jobs.is_empty() {
            return Ok(settled);
        }
        let mut points = Vec::with_capacity(jobs.len() * chunks);
        let mut writes = Vec::with_capacity(jobs.len());
        for job in &jobs {
            let token = LeaseToken::of(job).context("a claimed job holds a lease")?;
            let revision = job
                .revision_id
                .context("a projection job names its revision")?;
            let rows: Vec<ChunkRow> = (0..chunks)
                .map(|index| {
                    let text = format!("chunk {index} of {}", job.source_key);
                    ChunkRow {
                        chunk_index: index as i64,
                        sha256: receipts::ids::sha256_hex(text.as_bytes()),
                        byte_start: 0,
                        byte_end: text.len() as i64,
                        token_count: 4,
                        text,
                        section: None,
                        page: None,
                    }
                })
                .collect();
            let summary = ChunkSummary::of(rows.iter().map(|row| row.sha256.as_str()));
            for index in 0..chunks {
                points.push(VectorPoint {
                    dataset: job.dataset.clone(),
                    source_key: job.source_key.clone(),
                    revision_id: revision,
                    chunk_index: index as u32,
                    head_at: job.created_at,
                    vector: unit(random, generation.dimension as usize),
                    facts: None,
                });
            }
            writes.push((token, rows, summary));
        }
        store.upsert(points).await?;
        let generation_id = generation.id.clone();
        let tasks = writes.into_iter().map(|(token, rows, summary)| {
            let (ledger, generation_id) = (ledger.clone(), generation_id.clone());
            async move {
                let count = rows.len();
                ledger.write_chunks(&token, &generation_id, rows).await?;
                for (backend, evidence) in [
                    (
                        Backend::Relational,
                        json!({"rows": count, "checksum": summary.checksum}),
                    ),
                    (Backend::Vector, json!({"points": count})),
                ] {
                    let update = ReceiptUpdate {
                        backend,
                        state: ReceiptState::Verified,
                        evidence,
                        cause: "verified: bench".to_owned(),
                        generation: generation_id.clone(),
                    };
                    ledger.record_receipt(&token, update).await?;
                }
                ledger.complete(&token).await?;
                anyhow::Ok(())
            }
        });
        for result in futures::future::join_all(tasks).await {
            result?;
        }
        settled += jobs.len();
    }
}

/// Search latencies (milliseconds, sorted) of a loop of vector searches bound to the
/// ledger, for as long as `running` holds.
async fn search_loop(
    ledger: Arc<dyn Ledger>,
    store: Arc<EdgeVectorStore>,
    generation: String,
    dimension: usize,
    running: Arc<AtomicBool>,
) -> Vec<f64> {
    let mut random = Random(99);
    let mut latencies = Vec::new();
    while running.load(Ordering::SeqCst) {
        let started = Instant::now();
        let hits = store
            .search(unit(&mut random, dimension), &[], None, 10)
            .await
            .unwrap_or_default();
        let refs: Vec<receipts::model::HitRef> = hits
            .iter()
            .map(|hit| receipts::model::HitRef {
                revision_id: hit.revision_id,
                chunk_index: Some(hit.chunk_index),
            })
            .collect();
        let _ = ledger.bind_hits(&refs, &generation).await;
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    latencies.sort_by(f64::total_cmp);
    latencies
}

fn latency(sorted: &[f64]) -> Value {
    json!({
        "searches": sorted.len(),
        "p50_ms": super::percentile_f64(sorted, 0.50),
        "p99_ms": super::percentile_f64(sorted, 0.99),
    })
}

/// Runs the benchmark and answers its JSON report.
pub async fn verify(bench: VerifyBench) -> anyhow::Result<Value> {
    let directory = tempfile::tempdir()?;
    let ledger: Arc<dyn Ledger> = Arc::new(
        SqliteLedger::open(
            SqliteOptions::new(directory.path().join("ledger.db")),
            Arc::new(SystemClock),
        )
        .await?,
    );
    let generation = Generation::new(
        "bench-model",
        bench.dimension as i64,
        "bench-chunker",
        &[Backend::Relational, Backend::Vector],
    );
    ledger.activate_generation(&generation, "bench").await?;
    // The data directory's layout, so that the backup restores into another one.
    let store = Arc::new(EdgeVectorStore::open(
        &directory.path().join("vectors").join(&generation.id),
        bench.dimension,
    )?);
    let mut random = Random(5);
    let started = Instant::now();
    let mut accepted = 0;
    let mut settled = 0;
    while accepted < bench.sources {
        let batch: Vec<Submission> = (accepted..(accepted + 1000).min(bench.sources))
            .map(|n| {
                Submission::text(
                    "bench",
                    &format!("docs/{:03}/source-{n}.md", n % 500),
                    "bench:verify",
                    &format!("source {n}: {} {}", random.word(), random.word()),
                )
            })
            .collect();
        accepted += batch.len();
        for result in ledger.accept(batch).await {
            result?;
        }
        settled += settle(&ledger, &store, &generation, bench.chunks, &mut random).await?;
    }
    let setup_s = started.elapsed().as_secs_f64();
    let points = store.total_points().await?;
    eprintln!(
        "bench verify: {settled} sources settled, {points} points, in {setup_s:.1} s; optimising the shard"
    );
    while store.optimize_now().await? {}

    let running = Arc::new(AtomicBool::new(true));
    let baseline = tokio::spawn(search_loop(
        ledger.clone(),
        store.clone(),
        generation.id.clone(),
        bench.dimension,
        running.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    running.store(false, Ordering::SeqCst);
    let baseline = baseline.await?;

    let verifier = verify::Verifier::new(
        ledger.clone(),
        Some(Arc::new(OneStore::new(&generation.id, store.clone()))),
        verify::VerifySettings {
            interval: None,
            points_per_second: bench.rate.unwrap_or(u32::MAX),
            ..verify::VerifySettings::default()
        },
    );
    let mut tiers = Vec::new();
    for tier in [VerifyTier::Counts, VerifyTier::Scrub, VerifyTier::Deep] {
        let pass = ledger
            .change_pass(PassChange::Start {
                tier,
                generation: generation.id.clone(),
                repair: false,
                actor: "bench".to_owned(),
                reason: "bench verify".to_owned(),
            })
            .await?;
        let running = Arc::new(AtomicBool::new(true));
        let searching = tokio::spawn(search_loop(
            ledger.clone(),
            store.clone(),
            generation.id.clone(),
            bench.dimension,
            running.clone(),
        ));
        let calls_before = verifier.store_calls();
        let started = Instant::now();
        let ended = verifier.run(pass).await?;
        let seconds = started.elapsed().as_secs_f64();
        running.store(false, Ordering::SeqCst);
        let during = searching.await?;
        let calls = verifier.store_calls() - calls_before;
        anyhow::ensure!(
            ended.drift_total() == 0,
            "the {tier} pass found drift in a clean installation: {:?}",
            ended.drift
        );
        eprintln!("bench verify: {tier} pass in {seconds:.2} s, {calls} store calls");
        tiers.push(json!({
            "tier": tier.as_str(),
            "seconds": seconds,
            "buckets": ended.buckets_checked,
            "buckets_per_s": ended.buckets_checked as f64 / seconds,
            "store_calls": calls,
            "store_calls_per_s": calls as f64 / seconds,
            "sources_per_s": settled as f64 / seconds,
            "drift": ended.drift_total(),
            "search_during": latency(&during),
        }));
    }
    let backup = if bench.backup {
        backup_and_restore(&ledger, &store, &generation).await?
    } else {
        Value::Null
    };
    Ok(json!({
        "benchmark": "verify",
        "command": format!(
            "cairn bench verify --sources {} --chunks {} --dimension {}{}{}",
            bench.sources,
            bench.chunks,
            bench.dimension,
            bench.rate.map(|rate| format!(" --rate {rate}")).unwrap_or_default(),
            if bench.backup { "" } else { " --no-backup" }
        ),
        "points_per_second": bench.rate,
        "sources": settled,
        "points": points,
        "chunks_per_source": bench.chunks,
        "dimension": bench.dimension,
        "ledger": "sqlite",
        "store": "qdrant-edge",
        "setup_seconds": setup_s,
        "search_without_verify": latency(&baseline),
        "passes": tiers,
        "backup": backup,
    }))
}

/// Takes a backup of the installation while single-document acceptances go on (their
/// latency shows whether the backup holds acceptance), then restores it into a fresh data
/// directory (which ends with its two deep passes).
async fn backup_and_restore(
    ledger: &Arc<dyn Ledger>,
    store: &Arc<EdgeVectorStore>,
    generation: &Generation,
) -> anyhow::Result<Value> {
    let root = tempfile::tempdir()?;
    let stores: Arc<dyn gateways::VectorStores> =
        Arc::new(OneStore::new(&generation.id, store.clone()));
    let running = Arc::new(AtomicBool::new(true));
    let accepting = {
        let (ledger, running) = (ledger.clone(), running.clone());
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = 0;
            while running.load(Ordering::SeqCst) {
                n += 1;
                let started = Instant::now();
                let submission = Submission::text(
                    "during-backup",
                    &format!("doc-{n}.md"),
                    "bench:verify",
                    &format!("accepted while the backup runs, number {n}"),
                );
                let _ = ledger.accept(vec![submission]).await;
                latencies.push(started.elapsed().as_secs_f64() * 1000.0);
            }
            latencies.sort_by(f64::total_cmp);
            latencies
        })
    };
    let started = Instant::now();
    let id = crate::backup::new_id();
    let (manifest, folder) = crate::backup::take(
        ledger,
        Some(&stores),
        root.path(),
        &id,
        false,
        "bench",
        "bench verify",
    )
    .await?;
    let backup_s = started.elapsed().as_secs_f64();
    running.store(false, Ordering::SeqCst);
    let accepted = accepting.await?;
    let bytes: u64 = manifest.ledger.file.bytes
        + manifest
            .generations
            .iter()
            .flat_map(|g| g.backup.files.iter().map(|f| f.bytes))
            .sum::<u64>();
    let held_ms: f64 = manifest.generations.iter().map(|g| g.backup.held_ms).sum();
    eprintln!("bench verify: backup in {backup_s:.1} s, {bytes} bytes, shard held {held_ms:.0} ms; restoring");

    let target = tempfile::tempdir()?;
    let config = crate::config::Config::load(
        &crate::config::Overrides {
            data_dir: Some(target.path().to_owned()),
            ..crate::config::Overrides::default()
        },
        &std::collections::HashMap::new(),
    )?;
    let started = Instant::now();
    let report = crate::backup::restore::restore(
        &config,
        &crate::backup::restore::RestoreOptions {
            from: folder,
            accept_resurrection: true,
            actor: "bench".to_owned(),
        },
    )
    .await?;
    let restore_s = started.elapsed().as_secs_f64();
    Ok(json!({
        "backup_seconds": backup_s,
        "backup_bytes": bytes,
        "ledger_bytes": manifest.ledger.file.bytes,
        "shard_held_ms": held_ms,
        "acceptances_during_backup": {
            "count": accepted.len(),
            "p50_ms": super::percentile_f64(&accepted, 0.50),
            "p99_ms": super::percentile_f64(&accepted, 0.99),
            "max_ms": accepted.last().copied().unwrap_or(0.0),
        },
        "restore_seconds": restore_s,
        "restore": report,
    }))
}
