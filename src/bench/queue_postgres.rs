//! `cairn bench queue --ledger postgres://...`: the queue benchmark on a PostgreSQL ledger with
//! workers as separate `cairn worker` processes (not tasks), as they run across machines.
//!
//! Per worker count: claims are paused, the jobs are accepted, the worker processes start and
//! report ready, the database is vacuumed (`vacuum`), then claims resume (one `NOTIFY`
//! wakes them) and the clock runs until the ledger counts every job of the scenario completed
//! (each completion committed). The latency scenario accepts jobs one by one while one worker
//! process waits on `LISTEN`; enqueue to start is the job's first claim minus its acceptance,
//! both on the database's clock.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use receipts::{JobFilter, JobState, Ledger};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::database::vacuum;
use super::{per_second, percentile, QueueBench};

/// Starts one `cairn worker` process and waits until it says it runs.
async fn start_worker(
    url: &str,
    owner: &str,
    concurrency: usize,
    data_dir: &std::path::Path,
) -> anyhow::Result<Child> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["worker", "--ledger", url, "--simulate-work-ms", "0"])
        .args(["--concurrency", &concurrency.to_string(), "--owner", owner])
        .arg("--data-dir")
        .arg(data_dir)
        .env("CAIRN_LOG", "error")
        // A no-op worker needs two connections: its claims and its grouped completions. Fewer
        // backends contend less (4 processes: 7,709-8,095 jobs/s with 4 connections each,
        // 8,960-9,475 with 2), and 8 processes hold 24 with their listeners, well within
        // PostgreSQL's default 100. The peer gets 2 as well.
        .env("CAIRN_LEDGER_POOL_SIZE", "2")
        .env("CAIRN_LEDGER_COMMITTERS", "1")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("spawning cairn worker")?;
    let stdout = child.stdout.take().context("worker stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
    anyhow::ensure!(
        matches!(&ready, Ok(Ok(Some(line))) if line.contains("running")),
        "worker {owner} did not start: {ready:?}"
    );
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(child)
}

async fn stop(children: Vec<Child>) {
    for mut child in children {
        if let Some(pid) = child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    }
}

/// The scenario's datasets: 4, so that claims take turns as in the SQLite benchmark.
fn datasets(tag: &str) -> Vec<String> {
    (0..4).map(|index| format!("{tag}d{index}")).collect()
}

/// Jobs of this scenario in `state` (an index walk of the scenario's datasets only).
async fn count(ledger: &dyn Ledger, tag: &str, state: JobState) -> anyhow::Result<i64> {
    Ok(ledger
        .find_jobs(&JobFilter {
            states: vec![state],
            allowed_datasets: Some(datasets(tag)),
            limit: 1,
            ..JobFilter::default()
        })
        .await?
        .total)
}

/// How long to wait before counting again: half the time the jobs left would take at the rate
/// so far, between 25 ms and 1 s. Every count is a query on the measured server (about 10 ms of
/// its CPU once 20,000 jobs are completed), so polling every 25 ms took about a third of the
/// server's time from the workers; this way a run counts about 15 times, and still every 25 ms
/// as it ends, so the end is timed within 25 ms.
fn next_poll(elapsed: Duration, completed: i64, jobs: usize) -> Duration {
    let floor = Duration::from_millis(25);
    if completed <= 0 {
        return floor;
    }
    let left = (jobs as f64 - completed as f64).max(0.0) / completed as f64;
    elapsed
        .mul_f64(left / 2.0)
        .clamp(floor, Duration::from_secs(1))
}

pub(super) async fn queue(bench: &QueueBench, url: &str) -> anyhow::Result<Value> {
    let directory = tempfile::tempdir().context("creating a temporary directory")?;
    let ledger: Arc<dyn Ledger> =
        Arc::new(receipts::PostgresLedger::open(receipts::PostgresOptions::new(url)).await?);
    let run = receipts::ids::new_v7().simple().to_string();
    let mut throughput = serde_json::Map::new();
    let mut peer = serde_json::Map::new();
    let mut ratios = serde_json::Map::new();
    for workers in bench.worker_counts.iter().copied() {
        let tag = format!("{run}-{workers}w-");
        ledger
            .pause(None, "cairn:bench", "loading the queue benchmark")
            .await?;
        for chunk in (0..bench.jobs).collect::<Vec<_>>().chunks(1000) {
            let submissions = chunk
                .iter()
                .map(|index| {
                    receipts::Submission::text(
                        &datasets(&tag)[index % 4],
                        &format!("k{index}"),
                        "bench",
                        &format!("job {run} {index}"),
                    )
                })
                .collect();
            for result in ledger.accept(submissions).await {
                result?;
            }
        }
        let mut children = Vec::new();
        for index in 0..workers {
            children.push(
                start_worker(
                    url,
                    &format!("bench-{workers}-{index}"),
                    bench.concurrency,
                    &directory.path().join(format!("w{workers}-{index}")),
                )
                .await?,
            );
        }
        eprintln!(
            "queue (PostgreSQL): {} no-op jobs with {workers} worker process(es)",
            bench.jobs
        );
        vacuum(url).await?;
        let started = Instant::now();
        ledger
            .resume(None, "cairn:bench", "measuring the queue benchmark")
            .await?;
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let completed = count(ledger.as_ref(), &tag, JobState::Completed).await?;
            if completed >= bench.jobs as i64 {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "jobs unfinished after 600 s");
            tokio::time::sleep(next_poll(started.elapsed(), completed, bench.jobs)).await;
        }
        let seconds = started.elapsed().as_secs_f64();
        stop(children).await;
        let report = json!({ "jobs": bench.jobs, "seconds": seconds, "per_second": bench.jobs as f64 / seconds });
        if let Some(apalis) = peer_throughput(url, bench.jobs, workers, bench.concurrency).await? {
            ratios.insert(
                format!("{workers}_workers"),
                json!(per_second(&report) / per_second(&apalis)),
            );
            peer.insert(format!("{workers}_workers"), apalis);
        }
        throughput.insert(format!("{workers}_workers"), report);
    }

    eprintln!(
        "queue (PostgreSQL): enqueue-to-start over {} jobs accepted one by one, one worker process",
        bench.latency_jobs
    );
    let tag = format!("{run}-latency-");
    let waiting = vec![start_worker(url, "latency", 4, &directory.path().join("latency")).await?];
    // Let the worker's first poll pass: from here on only the wake-up starts jobs early.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut ids = Vec::new();
    for index in 0..bench.latency_jobs {
        let submission = receipts::Submission::text(
            "latency",
            &format!("{tag}k{index}"),
            "bench",
            &format!("latency {run} {index}"),
        );
        let receipt = ledger
            .accept(vec![submission])
            .await
            .pop()
            .context("no result")??;
        ids.push(receipt.projection_job_id);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let mut latencies = Vec::new();
    for id in ids {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let job = ledger.job(id).await?.context("job vanished")?;
            if job.state == JobState::Completed {
                latencies.push(job.started_at.unwrap_or(job.run_at) - job.created_at);
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "latency job {id} never completed"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    stop(waiting).await;
    latencies.sort_unstable();
    Ok(json!({
        "benchmark": "queue",
        "ledger": format!("PostgreSQL at {}", crate::config::redact_url(url)),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "jobs": bench.jobs,
        "concurrency_per_worker": bench.concurrency,
        "workers": "separate `cairn worker` processes (2 pooled connections each), woken by LISTEN/NOTIFY, polling every 500 ms as the fallback",
        "scenarios": "each starts after VACUUM (ANALYZE) of the database, cairn's and the peer's alike",
        "work": "no-op; claim and completion are durable (synchronous_commit = on)",
        "throughput": throughput,
        "enqueue_to_start_ms": {
            "jobs": latencies.len(),
            "p50": percentile(&latencies, 0.5) as f64 / 1000.0,
            "p99": percentile(&latencies, 0.99) as f64 / 1000.0,
            "max": latencies.last().copied().unwrap_or(0) as f64 / 1000.0,
        },
        "peer": if cfg!(feature = "peer-apalis") {
            json!({
                "name": "apalis 0.7.4 + apalis-sql 0.7.3 (PostgreSQL, LISTEN/NOTIFY), workers as tasks in one process with 2 pooled connections, buffer = concurrency",
                "throughput": peer,
                "cairn_over_peer": ratios,
                // Each side at its best worker count: the goal is 1.5x.
                "best_over_best": best(&throughput) / best(&peer),
            })
        } else {
            json!("not measured: build with --features peer-apalis")
        },
    }))
}

/// The highest `per_second` among a scenario's worker counts (0 when none ran).
fn best(reports: &serde_json::Map<String, Value>) -> f64 {
    reports.values().map(per_second).fold(0.0, f64::max)
}

async fn peer_throughput(
    url: &str,
    jobs: usize,
    workers: usize,
    concurrency: usize,
) -> anyhow::Result<Option<Value>> {
    #[cfg(feature = "peer-apalis")]
    {
        eprintln!("queue (PostgreSQL): the same {jobs} jobs on apalis with {workers} worker(s)");
        super::apalis_peer::postgres_throughput(url, jobs, workers, concurrency)
            .await
            .map(Some)
    }
    #[cfg(not(feature = "peer-apalis"))]
    {
        let _ = (url, jobs, workers, concurrency);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::next_poll;
    use std::time::Duration;

    #[test]
    fn polls_follow_the_time_left() {
        let ms = Duration::from_millis;
        // Nothing done yet: no rate to go by.
        assert_eq!(next_poll(ms(500), 0, 20_000), ms(25));
        // A quarter done in 1 s: 3 s left, so wait the 1 s cap.
        assert_eq!(next_poll(ms(1_000), 5_000, 20_000), ms(1_000));
        // Half done in 1 s: 1 s left, wait half of it.
        assert_eq!(next_poll(ms(1_000), 10_000, 20_000), ms(500));
        // Nearly done: the 25 ms floor times the end.
        assert_eq!(next_poll(ms(4_000), 19_900, 20_000), ms(25));
    }
}
