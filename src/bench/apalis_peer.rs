//! The queue benchmark's peer: apalis 0.7 with its SQLite storage (`apalis-sql`), on the same
//! workload as cairn's (no-op jobs, durable SQLite: WAL with `synchronous=FULL`). Built only
//! with the `peer-apalis` feature.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use apalis::prelude::*;
use apalis_sql::sqlite::SqliteStorage;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

/// The peer's no-op job.
#[derive(Debug, Serialize, Deserialize)]
struct NoOpJob {
    index: usize,
}

async fn no_op(_job: NoOpJob, done: Data<Arc<AtomicUsize>>) -> Result<(), Error> {
    done.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

fn connect_options(path: &Path, synchronous: SqliteSynchronous) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(synchronous)
        .busy_timeout(Duration::from_secs(30))
}

/// Jobs per second for `workers` apalis workers, each running `concurrency` jobs at once and
/// fetching up to `concurrency` ids per poll (every `poll`).
pub(crate) async fn throughput(
    directory: &Path,
    jobs: usize,
    workers: usize,
    concurrency: usize,
    poll: Duration,
) -> anyhow::Result<Value> {
    let path = directory.join(format!("apalis-{workers}.db"));
    let namespace = "bench";
    {
        // Loading is not measured: push through a non-durable connection to save time.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(connect_options(&path, SqliteSynchronous::Off))
            .await?;
        SqliteStorage::<()>::setup(&pool)
            .await
            .context("apalis setup")?;
        let mut storage: SqliteStorage<NoOpJob> =
            SqliteStorage::new_with_config(pool.clone(), apalis_sql::Config::new(namespace));
        for index in 0..jobs {
            storage
                .push(NoOpJob { index })
                .await
                .context("apalis push")?;
        }
        pool.close().await;
    }
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(connect_options(&path, SqliteSynchronous::Full))
        .await?;
    let config = apalis_sql::Config::new(namespace)
        .set_poll_interval(poll)
        .set_buffer_size(concurrency);
    let storage: SqliteStorage<NoOpJob> = SqliteStorage::new_with_config(pool.clone(), config);
    let handled = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut monitor = Monitor::new().shutdown_timeout(Duration::from_secs(5));
    for index in 0..workers {
        monitor = monitor.register(
            WorkerBuilder::new(format!("apalis-{index}"))
                .concurrency(concurrency)
                .data(handled.clone())
                .backend(storage.clone())
                .build_fn(no_op),
        );
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(monitor.run_with_signal(async move {
        let _ = stopped.await;
        Ok(())
    }));
    // Done means acknowledged in the database, as for cairn's completions.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if handled.load(Ordering::Relaxed) >= jobs {
            let done: i64 = sqlx::query_scalar("SELECT count(*) FROM Jobs WHERE status = 'Done'")
                .fetch_one(&pool)
                .await?;
            if done >= jobs as i64 {
                break;
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "apalis did not finish within 600 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let _ = stop.send(());
    let _ = running.await;
    pool.close().await;
    Ok(json!({
        "jobs": jobs,
        "seconds": seconds,
        "per_second": jobs as f64 / seconds,
    }))
}

/// Jobs per second for `workers` apalis workers (tasks) on apalis-sql's PostgreSQL storage, in
/// a namespace of their own in the database at `url`: the jobs are pushed first (not
/// measured), then the workers fetch up to `concurrency` jobs per poll (every 10 ms).
pub(crate) async fn postgres_throughput(
    url: &str,
    jobs: usize,
    workers: usize,
    concurrency: usize,
) -> anyhow::Result<Value> {
    use apalis_sql::postgres::PostgresStorage;
    // apalis keeps its own migration ledger: in a schema of its own (first on its search
    // path), apart from cairn's in the same database.
    let options: sqlx::postgres::PgConnectOptions = url.parse()?;
    {
        use sqlx::{ConnectOptions as _, Connection as _};
        let mut connection = options.clone().connect().await?;
        sqlx::query("CREATE SCHEMA IF NOT EXISTS apalis_peer")
            .execute(&mut connection)
            .await?;
        connection.close().await?;
    }
    // 2 connections, as each cairn worker process has: of the pools tried for apalis's 8
    // workers (16, 4, 2: 5,270-5,560, 5,653 and 5,851 jobs/s), the one that served it best.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.options([
            ("synchronous_commit", "on"),
            ("search_path", "apalis_peer,public"),
        ]))
        .await?;
    PostgresStorage::setup(&pool)
        .await
        .context("apalis setup")?;
    let namespace = format!("bench-{}-{workers}", receipts::ids::new_v7().simple());
    {
        let mut storage: PostgresStorage<NoOpJob> =
            PostgresStorage::new_with_config(pool.clone(), apalis_sql::Config::new(&namespace));
        for index in 0..jobs {
            storage
                .push(NoOpJob { index })
                .await
                .context("apalis push")?;
        }
    }
    super::database::vacuum(url).await?;
    let config = apalis_sql::Config::new(&namespace)
        .set_poll_interval(Duration::from_millis(10))
        .set_buffer_size(concurrency);
    let storage: PostgresStorage<NoOpJob> = PostgresStorage::new_with_config(pool.clone(), config);
    let handled = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut monitor = Monitor::new().shutdown_timeout(Duration::from_secs(5));
    for index in 0..workers {
        monitor = monitor.register(
            WorkerBuilder::new(format!("apalis-pg-{index}"))
                .concurrency(concurrency)
                .data(handled.clone())
                .backend(storage.clone())
                .build_fn(no_op),
        );
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(monitor.run_with_signal(async move {
        let _ = stopped.await;
        Ok(())
    }));
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if handled.load(Ordering::Relaxed) >= jobs {
            let done: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM apalis.jobs WHERE job_type = $1 AND status = 'Done'",
            )
            .bind(&namespace)
            .fetch_one(&pool)
            .await?;
            if done >= jobs as i64 {
                break;
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "apalis did not finish within 600 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let _ = stop.send(());
    let _ = running.await;
    pool.close().await;
    Ok(json!({
        "jobs": jobs,
        "seconds": seconds,
        "per_second": jobs as f64 / seconds,
    }))
}
