//! The access job: a source's readers written onto its points in one generation's vector
//! store, so that the store's prefilter follows a permission change without anything being
//! chunked or embedded again.
//!
//! ## Invariants
//! - The readers written are the ledger's, read when the job runs (so one pending job per
//!   source and generation serves any number of changes), and the job ends only when the
//!   ledger still holds them after the write and every point of the source carries them (read
//!   back by digest). A change that lands meanwhile is written in the next round; two jobs of
//!   one source that race each end with the readers the ledger holds last.
//! - The payload is a prefilter for recall only: binding in the ledger decides what a caller
//!   may read, before and after this job.

use std::time::Instant;

use gateways::VectorStore;
use receipts::{Job, Reader};
use serde_json::json;

use crate::job::{ledger_failure, retryable, store_failure};
use receipts::Failure;

/// Rounds of write and re-read before the job gives up for now (retried with backoff): the
/// source's readers kept changing under it.
const ROUNDS: usize = 4;

/// Writes the source's readers in force onto every point of `job`'s source in `store`, reads
/// them back, and answers the evidence (points, digest, rounds, milliseconds).
pub async fn refresh(
    ledger: &dyn Reader,
    store: &dyn VectorStore,
    dataset: &str,
    source_key: &str,
) -> Result<serde_json::Value, Failure> {
    let started = Instant::now();
    for round in 1..=ROUNDS {
        let record = ledger
            .access_of(dataset, source_key)
            .await
            .map_err(ledger_failure)?;
        let readers = record.readers.clone().unwrap_or_default();
        store
            .set_readers(dataset, source_key, &readers)
            .await
            .map_err(store_failure)?;
        let (points, carrying) = store
            .readers_held(dataset, source_key, &readers)
            .await
            .map_err(store_failure)?;
        if carrying != points {
            return Err(store_failure(gateways::GatewayError::ReadbackMismatch {
                store: "vector",
                message: format!(
                    "wrote the readers of {dataset}/{source_key} onto {points} points; {carrying} \
                     carry them"
                ),
            }));
        }
        let after = ledger
            .access_of(dataset, source_key)
            .await
            .map_err(ledger_failure)?;
        if after.readers == record.readers {
            return Ok(json!({
                "points": points,
                "readers": readers.len(),
                "digest": gateways::vectors::readers_digest(&readers),
                "version": record.version,
                "rounds": round,
                "store": store.name(),
                "ms": started.elapsed().as_secs_f64() * 1000.0,
            }));
        }
    }
    Err(retryable(
        "access_moving",
        format!(
            "the readers of {dataset}/{source_key} changed in each of {ROUNDS} rounds of writing \
             them; retried later"
        ),
    ))
}

/// Runs an access job on `store` (`None`: its generation holds no vectors, so there is
/// nothing to write), and records how long the change took to reach the store
/// (`cairn_access_applied_seconds`).
pub async fn run(
    ledger: &dyn Reader,
    store: Option<&dyn VectorStore>,
    job: &Job,
) -> Result<(), Failure> {
    let Some(store) = store else {
        return Ok(());
    };
    let evidence = refresh(ledger, store, &job.dataset, &job.source_key).await?;
    let now = receipts::Clock::now_micros(&receipts::SystemClock);
    let lag = (now - job.created_at).max(0) as f64 / 1e6;
    metrics::histogram!("cairn_access_applied_seconds").record(lag);
    tracing::info!(
        job = %job.id,
        dataset = %job.dataset,
        source_key = %job.source_key,
        generation = job.generation.as_deref().unwrap_or(""),
        %evidence,
        "access: readers written onto the source's points and read back"
    );
    Ok(())
}
