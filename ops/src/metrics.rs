//! `GET /metrics`: Prometheus text.
//!
//! Two sources, one exposition:
//! - **In-process metrics** recorded through the `metrics` facade by the crates that see the
//!   events (search latency by mode and status, degradations and stale drops; projection stage
//!   durations), rendered by the Prometheus recorder installed here.
//! - **Ledger-derived metrics**: job counters and latency histograms come from the job history
//!   itself (claims, completions, retries, failures by error code, rescues, quarantines,
//!   enqueue-to-start, accepted-to-searchable). Each scrape reads the history rows added since
//!   the last one, so workers in other processes are counted, and the counters count from the
//!   ledger's first event: they survive restarts of `cairn serve`. Gauges (jobs by state,
//!   receipts by backend and state, queue depth, lease ages, pauses) are read at scrape time.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use receipts::{JobKind, JobState, Ledger, LedgerError};
use tokio::sync::Mutex;

/// Histogram buckets, in seconds: 1 ms to 1 hour.
const BUCKETS: [f64; 20] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// Most history rows read per page while catching up.
const EVENT_PAGE: u32 = 5_000;
/// Most history rows one scrape reads, about a second's work (a large ledger's history is read
/// over the first few scrapes).
const EVENTS_PER_SCRAPE: usize = 50_000;

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide Prometheus recorder (once; later calls return the same handle).
/// `None` when another recorder was installed first: in-process metrics are then not shown.
pub fn recorder() -> Option<&'static PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            let builder = match PrometheusBuilder::new().set_buckets(&BUCKETS) {
                Ok(builder) => builder,
                Err(error) => {
                    tracing::warn!(%error, "metrics buckets refused; in-process metrics are off");
                    return None;
                }
            };
            match builder.install_recorder() {
                Ok(handle) => Some(handle),
                Err(error) => {
                    tracing::warn!(%error, "a metrics recorder is already installed; in-process metrics are off");
                    None
                }
            }
        })
        .as_ref()
}

/// The position in the job history up to which events were counted.
#[derive(Debug, Default)]
pub struct EventCursor {
    seq: Mutex<i64>,
}

fn seconds(micros: i64) -> f64 {
    micros.max(0) as f64 / 1e6
}

impl EventCursor {
    /// Counts the job events added since the last call.
    async fn catch_up(&self, ledger: &dyn Ledger) -> Result<(), LedgerError> {
        let mut seq = self.seq.lock().await;
        let mut read = 0;
        while read < EVENTS_PER_SCRAPE {
            let events = ledger.job_events(*seq, EVENT_PAGE).await?;
            let Some(last) = events.last() else { break };
            *seq = last.seq;
            read += events.len();
            for event in &events {
                let dataset = event.dataset.clone();
                match event.to {
                    JobState::Running => {
                        metrics::counter!("cairn_job_claims_total", "dataset" => dataset.clone())
                            .increment(1);
                        if event.first_claim {
                            metrics::histogram!("cairn_job_enqueue_to_start_seconds")
                                .record(seconds(event.at - event.job_created_at));
                        }
                    }
                    JobState::Completed => {
                        metrics::counter!("cairn_job_completions_total", "dataset" => dataset.clone())
                            .increment(1);
                        if event.kind == JobKind::Project {
                            metrics::histogram!("cairn_accepted_to_searchable_seconds")
                                .record(seconds(event.at - event.job_created_at));
                        }
                    }
                    JobState::RetryWait if event.from == Some(JobState::Running) => {
                        metrics::counter!("cairn_job_retries_scheduled_total", "dataset" => dataset.clone())
                            .increment(1);
                    }
                    JobState::Quarantined => {
                        metrics::counter!("cairn_job_quarantines_total", "dataset" => dataset.clone())
                            .increment(1);
                    }
                    _ => {}
                }
                if let Some(code) = &event.error_code {
                    metrics::counter!(
                        "cairn_job_failures_total",
                        "dataset" => dataset.clone(),
                        "code" => code.clone(),
                        "outcome" => event.to.as_str(),
                    )
                    .increment(1);
                    if code == "lease_expired" {
                        metrics::counter!(
                            "cairn_lease_rescues_total",
                            "dataset" => dataset,
                            "outcome" => event.to.as_str(),
                        )
                        .increment(1);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Reads the gauges and the new job events, then renders every metric.
pub async fn render(ledger: &dyn Ledger, cursor: &EventCursor) -> Result<String, LedgerError> {
    let Some(handle) = recorder() else {
        return Ok(String::from(
            "# cairn: another metrics recorder is installed in this process\n",
        ));
    };
    cursor.catch_up(ledger).await?;
    let counts = ledger.counts().await?;
    for state in JobState::ALL {
        let value = counts.jobs.get(state.as_str()).copied().unwrap_or(0);
        metrics::gauge!("cairn_jobs", "state" => state.as_str()).set(value as f64);
    }
    for (key, value) in &counts.receipts {
        let (backend, state) = key.split_once('/').unwrap_or((key.as_str(), ""));
        metrics::gauge!("cairn_receipts", "backend" => backend.to_owned(), "state" => state.to_owned())
            .set(*value as f64);
    }
    let activity = ledger.activity(Duration::from_secs(60)).await?;
    metrics::gauge!("cairn_queue_depth").set(activity.queue_depth as f64);
    metrics::gauge!("cairn_queue_due").set(activity.due as f64);
    metrics::gauge!("cairn_running_jobs").set(activity.running as f64);
    metrics::gauge!("cairn_oldest_running_lease_age_seconds")
        .set(activity.oldest_lease_age_micros.map_or(0.0, seconds));
    metrics::gauge!("cairn_max_heartbeat_age_seconds")
        .set(activity.max_heartbeat_age_micros.map_or(0.0, seconds));
    metrics::gauge!("cairn_claim_pauses").set(activity.pauses.len() as f64);
    metrics::gauge!("cairn_sources").set(counts.sources as f64);
    metrics::gauge!("cairn_revisions").set(counts.revisions as f64);
    handle.run_upkeep();
    Ok(handle.render())
}
