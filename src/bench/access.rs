//! `cairn bench access`: who may read which document, priced.
//!
//! - **Access changes**: every source of the corpus is given its readers through the ledger's
//!   one path ([`receipts::Acceptor::change_access`]), many at once as a connector's run or
//!   concurrent API calls send them; then 10,000 of them are changed again (a group revoked
//!   and granted). Changes per second, and each change's latency to its commit, which is when
//!   it is in force: search reads the ledger's current readers at every query, so no job has
//!   to run before a revocation holds, and nothing is chunked or embedded again. The same
//!   documents' acceptance and projection (without the model: a lower bound of re-projecting
//!   them) is reported beside it. Then the access jobs the changes queued are run as workers
//!   run them (the readers written onto each source's points in the store and read back):
//!   jobs per second and each one's lag from its change.
//! - **Search** on the corpus of `cairn bench filters` (synthetic one-chunk documents with
//!   planted neighbours, the embedded default), for identities that may read every source,
//!   one in ten and one in a hundred, against today's search (no identity): p50 and p99 per
//!   mode, vector recall@k against an exact search over what each identity may read, and
//!   pages short of `top_k` when enough readable sources match.

use std::time::Instant;

use futures::StreamExt;
use receipts::access::{restrict, AccessChange, Identity};
use receipts::filter::Filter;
use serde_json::{json, Value};

use super::filters::{Corpus, FilterBench};
use super::search_latency::{summary, DATASET};
use crate::config::Config;

/// Changes in flight at once.
const CONCURRENT_CHANGES: usize = 512;

/// Sources changed in the second round.
const CHANGED_AGAIN: usize = 10_000;

/// The identities measured: a name, its groups, and which sources name one of them.
const READERS: [(&str, &str, usize, usize); 3] = [
    ("reads_all", "all", 1, 0),
    ("reads_10pct", "p10", 10, 0),
    ("reads_1pct", "p1", 100, 1),
];

/// Source `n`'s readers: `group:all`, and `group:p10`, `group:p1` for its shares.
fn readers_of(n: usize, revoked_p10: bool) -> Vec<String> {
    let mut readers = vec!["group:all".to_owned()];
    for (_, group, every, at) in READERS.iter().skip(1) {
        if n % every == *at && !(revoked_p10 && *group == "p10") {
            readers.push(format!("group:{group}"));
        }
    }
    readers
}

/// Sends the changes `keys` → readers, [`CONCURRENT_CHANGES`] at a time: changes per second
/// and each change's latency to its commit.
async fn change_all(
    ledger: &std::sync::Arc<dyn receipts::Ledger>,
    changes: Vec<(usize, Vec<String>)>,
    why: &str,
) -> anyhow::Result<Value> {
    let count = changes.len();
    let started = Instant::now();
    let latencies: Vec<anyhow::Result<f64>> = futures::stream::iter(changes)
        .map(|(n, readers)| {
            let ledger = ledger.clone();
            async move {
                let sent = Instant::now();
                ledger
                    .change_access(AccessChange::Source {
                        dataset: DATASET.to_owned(),
                        source_key: format!("doc-{n}"),
                        readers: Some(readers),
                        actor: "bench".to_owned(),
                        reason: why.to_owned(),
                    })
                    .await?;
                Ok(sent.elapsed().as_secs_f64() * 1000.0)
            }
        })
        .buffer_unordered(CONCURRENT_CHANGES)
        .collect()
        .await;
    let seconds = started.elapsed().as_secs_f64();
    let latencies = latencies
        .into_iter()
        .collect::<anyhow::Result<Vec<f64>>>()?;
    let mut report = summary(latencies);
    report["changes"] = json!(count);
    report["seconds"] = json!(seconds);
    report["changes_per_second"] = json!(count as f64 / seconds.max(1e-9));
    Ok(report)
}

/// Runs every access job the changes queued, as workers do ([`worker::access::run`], 16 at
/// once): jobs per second, and each job's lag from its change to its end (the change's
/// readers on its points in the store, read back).
async fn drain_access_jobs(corpus: &Corpus) -> anyhow::Result<Value> {
    let ledger = corpus.ledger.clone();
    let started = Instant::now();
    let mut lags = Vec::new();
    loop {
        let jobs = ledger.claim("bench-access", 1000).await?;
        if jobs.is_empty() {
            break;
        }
        let done: Vec<anyhow::Result<f64>> = futures::stream::iter(jobs)
            .map(|job| {
                let ledger = ledger.clone();
                let store = corpus.store.clone();
                async move {
                    anyhow::ensure!(
                        job.kind == receipts::JobKind::Access,
                        "a {} job in the access benchmark",
                        job.kind
                    );
                    let token = receipts::LeaseToken::of(&job)
                        .ok_or_else(|| anyhow::anyhow!("a claimed job without a lease"))?;
                    worker::access::run(ledger.as_ref(), Some(store.as_ref()), &job)
                        .await
                        .map_err(|failure| {
                            anyhow::anyhow!("{}: {}", failure.code, failure.message)
                        })?;
                    ledger.complete(&token).await?;
                    let now = receipts::Clock::now_micros(&receipts::SystemClock);
                    Ok((now - job.created_at) as f64 / 1000.0)
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        for lag in done {
            lags.push(lag?);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let jobs = lags.len();
    let mut report = summary(lags);
    report["jobs"] = json!(jobs);
    report["seconds"] = json!(seconds);
    report["jobs_per_second"] = json!(jobs as f64 / seconds.max(1e-9));
    Ok(report)
}

/// Runs the benchmark in a temporary directory: the embedded default (SQLite, qdrant-edge).
pub async fn access(config: &Config, bench: FilterBench) -> anyhow::Result<Value> {
    let corpus = Corpus::build(config, &bench).await?;
    let ledger = corpus.ledger.clone();
    eprintln!("access: naming every source's readers");
    let initial = change_all(
        &ledger,
        (0..bench.docs).map(|n| (n, readers_of(n, false))).collect(),
        "bench: readers",
    )
    .await?;
    eprintln!("access: initial {initial}");
    eprintln!("access: running the access jobs");
    let initial_jobs = drain_access_jobs(&corpus).await?;
    eprintln!("access: initial jobs {initial_jobs}");
    // Each identity, and today's search (no identity) first: the ratios are to it.
    let mut cases: Vec<(String, Option<Filter>, Vec<usize>)> =
        vec![("no_identity".to_owned(), None, (0..bench.docs).collect())];
    for (name, group, every, at) in READERS {
        let identity = Identity::new(&format!("user:{name}"), &[group.to_owned()])?;
        let matching: Vec<usize> = (0..bench.docs).filter(|n| n % every == at).collect();
        cases.push((
            name.to_owned(),
            Some(restrict(None, identity.names())),
            matching,
        ));
    }
    // A payload change moves each point out of the indexed segment (qdrant-edge copies it on
    // write), so search is measured as the jobs leave the store, and again once the
    // optimiser (which counts the moved points) has indexed them.
    eprintln!("access: searching before the optimiser");
    let before_reindex = corpus.measure(&cases, bench.top_k).await?;
    eprintln!("access: indexing the moved points");
    let started = Instant::now();
    corpus.edge.optimize_now().await?;
    let reindex_seconds = started.elapsed().as_secs_f64();
    let report = corpus.measure(&cases, bench.top_k).await?;
    // A second round of 10,000 changes: group:p10 revoked on 5,000 sources that name it,
    // then granted back.
    let again: Vec<usize> = (0..bench.docs)
        .filter(|n| n % 10 == 0)
        .take(CHANGED_AGAIN / 2)
        .collect();
    let mut flips: Vec<(usize, Vec<String>)> =
        again.iter().map(|n| (*n, readers_of(*n, true))).collect();
    let revoked = change_all(&ledger, std::mem::take(&mut flips), "bench: revoke").await?;
    let revoked_jobs = drain_access_jobs(&corpus).await?;
    flips = again.iter().map(|n| (*n, readers_of(*n, false))).collect();
    let granted = change_all(&ledger, flips, "bench: grant").await?;
    let granted_jobs = drain_access_jobs(&corpus).await?;
    Ok(json!({
        "benchmark": "access",
        "docs": bench.docs,
        "queries": bench.queries,
        "top_k": bench.top_k,
        "concurrent_changes": CONCURRENT_CHANGES,
        "load_seconds": corpus.load_seconds,
        "hnsw_seconds": corpus.hnsw_seconds,
        "reprojection_lower_bound_seconds_per_10k": corpus.load_seconds * 10_000.0
            / bench.docs.max(1) as f64,
        "changes": {
            "initial": initial,
            "revoke": revoked,
            "grant": granted,
        },
        "access_jobs": {
            "initial": initial_jobs,
            "revoke": revoked_jobs,
            "grant": granted_jobs,
        },
        "search_before_reindex": Value::Object(before_reindex),
        "reindex_seconds": reindex_seconds,
        "search": Value::Object(report),
    }))
}
