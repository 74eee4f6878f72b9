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
use receipts::{JobKind, JobState, LedgerError, OpsLedger};
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
                Ok(handle) => {
                    describe();
                    Some(handle)
                }
                Err(error) => {
                    tracing::warn!(%error, "a metrics recorder is already installed; in-process metrics are off");
                    None
                }
            }
        })
        .as_ref()
}

/// Every metric cairn exports: name, kind and help text. The exposition carries a `# HELP`
/// line for each (promtool checks it in the tests).
pub const METRICS: &[(&str, Kind, &str)] = &[
    (
        "cairn_jobs",
        Kind::Gauge,
        "Jobs by state, read from the ledger at scrape time.",
    ),
    (
        "cairn_receipts",
        Kind::Gauge,
        "Projection receipts by backend and state, read from the ledger at scrape time.",
    ),
    (
        "cairn_queue_depth",
        Kind::Gauge,
        "Jobs waiting to run (pending or retry_wait).",
    ),
    (
        "cairn_queue_due",
        Kind::Gauge,
        "Waiting jobs whose run time has come.",
    ),
    (
        "cairn_running_jobs",
        Kind::Gauge,
        "Jobs running under a lease.",
    ),
    (
        "cairn_oldest_running_lease_age_seconds",
        Kind::Gauge,
        "Age of the oldest lease held by a running job (0 when none runs).",
    ),
    (
        "cairn_max_heartbeat_age_seconds",
        Kind::Gauge,
        "Longest time since a running job's last heartbeat (0 when none runs).",
    ),
    (
        "cairn_claim_pauses",
        Kind::Gauge,
        "Active claim pauses (one per paused dataset, one for all datasets).",
    ),
    (
        "cairn_sources",
        Kind::Gauge,
        "Sources in the ledger, deleted ones included.",
    ),
    ("cairn_revisions", Kind::Gauge, "Revisions in the ledger."),
    (
        "cairn_job_claims_total",
        Kind::Counter,
        "Jobs claimed by workers, by dataset, counted from the job history.",
    ),
    (
        "cairn_job_completions_total",
        Kind::Counter,
        "Jobs completed, by dataset, counted from the job history.",
    ),
    (
        "cairn_job_retries_scheduled_total",
        Kind::Counter,
        "Runs that ended in a scheduled retry, by dataset.",
    ),
    (
        "cairn_job_quarantines_total",
        Kind::Counter,
        "Jobs quarantined after repeated crashes, by dataset.",
    ),
    (
        "cairn_job_failures_total",
        Kind::Counter,
        "Runs that ended in an error, by dataset, error code and the state the job went to.",
    ),
    (
        "cairn_lease_rescues_total",
        Kind::Counter,
        "Expired leases taken back from workers that stopped heartbeating, by dataset and outcome.",
    ),
    (
        "cairn_job_enqueue_to_start_seconds",
        Kind::Histogram,
        "Time from acceptance to a job's first claim.",
    ),
    (
        "cairn_accepted_to_searchable_seconds",
        Kind::Histogram,
        "Time from acceptance to a completed projection (every backend read back).",
    ),
    (
        "cairn_search_requests_total",
        Kind::Counter,
        "Searches by the mode that answered (or was asked, on error) and HTTP status.",
    ),
    (
        "cairn_search_duration_seconds",
        Kind::Histogram,
        "Time to answer a search, by the mode that answered.",
    ),
    (
        "cairn_search_stale_dropped_total",
        Kind::Counter,
        "Vector hits dropped by binding because their revision is no longer current.",
    ),
    (
        "cairn_search_degraded_total",
        Kind::Counter,
        "Searches answered with less than asked, by reason.",
    ),
    (
        "cairn_projection_stage_seconds",
        Kind::Histogram,
        "Time spent in each projection stage, by stage and job kind.",
    ),
    (
        "cairn_http_requests_total",
        Kind::Counter,
        "HTTP requests by route, method and status.",
    ),
    (
        "cairn_http_request_duration_seconds",
        Kind::Histogram,
        "Time to answer an HTTP request, by route and method.",
    ),
    (
        "cairn_http_connections_open",
        Kind::Gauge,
        "HTTP connections open, by the service that serves them (app or overflow).",
    ),
    (
        "cairn_http_connections_refused_total",
        Kind::Counter,
        "HTTP connections closed at once because the cap and the overflow were full.",
    ),
    (
        "cairn_sync_runs_total",
        Kind::Counter,
        "Connector runs ended by this process, by outcome (done, failed).",
    ),
    (
        "cairn_sync_files_total",
        Kind::Counter,
        "Files that finished connector runs handled, by outcome (added, changed, unchanged, \
         removed, skipped, failed, conflict, access_changed).",
    ),
    (
        "cairn_access_changes_total",
        Kind::Counter,
        "Access changes (a source's readers, a dataset's default) made in this process, by \
         origin (api, connector, config, restore) and outcome (committed, failed).",
    ),
    (
        "cairn_access_change_seconds",
        Kind::Histogram,
        "Time from an access change's call to its commit, when it is in force (search reads \
         the ledger's current readers at every query; no job has to run), by origin.",
    ),
    (
        "cairn_access_applied_seconds",
        Kind::Histogram,
        "Time from an access change to its access job's end: the source's readers written \
         onto its points in one generation's vector store and read back, so the store's \
         prefilter follows the change (binding applies it from the commit on).",
    ),
    (
        "cairn_oauth_tokens_total",
        Kind::Counter,
        "OAuth access tokens checked by the guard, by outcome: accepted, or the refusal's \
         reason (expired, audience, unknown_issuer, unknown_key, signature, algorithm, claims, \
         malformed, not_yet_valid, inactive, issuer_unavailable).",
    ),
    (
        "cairn_events_pruned_total",
        Kind::Counter,
        "Events removed from the outbox by retention (events.retention_hours); a change feed \
         consumer whose cursor falls behind them gets 410 cursor_expired.",
    ),
    (
        "cairn_webhook_deliveries_total",
        Kind::Counter,
        "Webhook delivery attempts, by outcome: delivered (2xx), failed (retried later), dead          (its retry span is spent), gone (410: the webhook is disabled), stale (its claim was          taken over), unrecorded (the ledger could not record it; it goes again).",
    ),
    (
        "cairn_webhook_delivery_lag_seconds",
        Kind::Histogram,
        "From an event's commit to its receiver's 2xx, per delivery (retries included).",
    ),
    (
        "cairn_webhook_deliveries",
        Kind::Gauge,
        "Deliveries per webhook and state (pending, delivering, dead), read every 10 s by the          process that delivers.",
    ),
    (
        "cairn_webhook_oldest_undelivered_seconds",
        Kind::Gauge,
        "Per webhook, the age of the oldest event still waiting for delivery (0 when none).",
    ),
    (
        "cairn_webhook_events_behind",
        Kind::Gauge,
        "Per webhook, outbox events past its cursor, not yet fanned out to it (grows while it          is paused or disabled).",
    ),
    (
        "cairn_oauth_introspections_total",
        Kind::Counter,
        "Calls to an issuer's token introspection endpoint (RFC 7662) that it answered, by \
         outcome: active, or the refusal's reason (inactive, audience, expired, ...). Cached \
         answers are not counted; an endpoint that cannot answer shows as \
         cairn_oauth_tokens_total{outcome=\"issuer_unavailable\"}.",
    ),
    (
        "cairn_oauth_key_fetches_total",
        Kind::Counter,
        "Fetches of an OAuth issuer's key set (discovery included), by outcome (ok, failed); \
         a failure leaves cached keys in use.",
    ),
    (
        "cairn_sync_run_seconds",
        Kind::Histogram,
        "Duration of connector runs, successful or not.",
    ),
    (
        "cairn_sync_last_success_timestamp_seconds",
        Kind::Gauge,
        "When each connector's last run succeeded in this process (Unix seconds); time() minus \
         it is the time since the last success.",
    ),
    (
        "cairn_verify_buckets_checked_total",
        Kind::Counter,
        "Buckets verify checked, by tier (counts, scrub, deep); 1,024 make a pass.",
    ),
    (
        "cairn_verify_store_requests_total",
        Kind::Counter,
        "Requests verify made to the vector store, by tier.",
    ),
    (
        "cairn_verify_drift_total",
        Kind::Counter,
        "Drift verify confirmed (a second look agreed), by kind and store (vector, relational, \
         bytes).",
    ),
    (
        "cairn_verify_repairs_total",
        Kind::Counter,
        "Verify repairs, by outcome (repairing: a projection job queued; repaired: fixed and \
         read back; corrupt: bytes reported, never repaired; failed).",
    ),
    (
        "cairn_verify_last_complete_seconds",
        Kind::Gauge,
        "When the last verify pass of each tier completed (Unix seconds); time() minus it is \
         the age of the last complete check.",
    ),
    (
        "cairn_verify_open_drift",
        Kind::Gauge,
        "Drift the last completed pass of each tier confirmed.",
    ),
];

/// A metric's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Goes up and down.
    Gauge,
    /// Only goes up.
    Counter,
    /// Observations in buckets.
    Histogram,
}

/// Describes every metric and creates, at zero, each series whose labels are known before
/// the first event: dashboards and alerts see 0, not "no data".
fn describe() {
    for (name, kind, help) in METRICS {
        match kind {
            Kind::Gauge => metrics::describe_gauge!(*name, *help),
            Kind::Counter => metrics::describe_counter!(*name, *help),
            Kind::Histogram => metrics::describe_histogram!(*name, *help),
        }
    }
    for histogram in [
        "cairn_job_enqueue_to_start_seconds",
        "cairn_accepted_to_searchable_seconds",
    ] {
        let _ = metrics::histogram!(histogram);
    }
    let _ = metrics::histogram!("cairn_sync_run_seconds");
    for outcome in ["done", "failed"] {
        metrics::counter!("cairn_sync_runs_total", "outcome" => outcome).absolute(0);
    }
    for outcome in [
        "added",
        "changed",
        "unchanged",
        "removed",
        "skipped",
        "failed",
        "conflict",
        "access_changed",
    ] {
        metrics::counter!("cairn_sync_files_total", "outcome" => outcome).absolute(0);
    }
    for origin in receipts::access::ORIGINS {
        for outcome in ["committed", "failed"] {
            metrics::counter!("cairn_access_changes_total", "origin" => origin, "outcome" => outcome)
                .absolute(0);
        }
        let _ = metrics::histogram!("cairn_access_change_seconds", "origin" => origin);
    }
    let _ = metrics::histogram!("cairn_access_applied_seconds");
    metrics::counter!("cairn_oauth_tokens_total", "outcome" => "accepted").absolute(0);
    for outcome in ["ok", "failed"] {
        metrics::counter!("cairn_oauth_key_fetches_total", "outcome" => outcome).absolute(0);
    }
    metrics::counter!("cairn_oauth_introspections_total", "outcome" => "active").absolute(0);
    metrics::counter!("cairn_events_pruned_total").absolute(0);
    for outcome in ["delivered", "failed", "dead", "gone"] {
        metrics::counter!("cairn_webhook_deliveries_total", "outcome" => outcome).absolute(0);
    }
    let _ = metrics::histogram!("cairn_webhook_delivery_lag_seconds");
    for tier in ["counts", "scrub", "deep"] {
        metrics::counter!("cairn_verify_buckets_checked_total", "tier" => tier).absolute(0);
        metrics::counter!("cairn_verify_store_requests_total", "tier" => tier).absolute(0);
    }
    for kind in receipts::model::DriftKind::ALL {
        for store in ["vector", "relational", "bytes"] {
            metrics::counter!("cairn_verify_drift_total", "kind" => kind.as_str(), "store" => store)
                .absolute(0);
        }
    }
    for outcome in ["repairing", "repaired", "corrupt", "failed"] {
        metrics::counter!("cairn_verify_repairs_total", "outcome" => outcome).absolute(0);
    }
    metrics::counter!("cairn_search_stale_dropped_total").absolute(0);
    metrics::counter!("cairn_http_connections_refused_total").absolute(0);
    for service in ["app", "overflow"] {
        metrics::gauge!("cairn_http_connections_open", "service" => service).set(0.0);
    }
    for mode in ["hybrid", "vector", "lexical", "lexical_fallback"] {
        metrics::counter!("cairn_search_requests_total", "mode" => mode, "status" => "200")
            .absolute(0);
        let _ = metrics::histogram!("cairn_search_duration_seconds", "mode" => mode);
    }
    for mode in ["auto", "vector", "lexical"] {
        for status in ["422", "429", "500", "503", "504"] {
            metrics::counter!("cairn_search_requests_total", "mode" => mode, "status" => status)
                .absolute(0);
        }
    }
    for reason in [
        "vector_timeout",
        "vector_error",
        "embed_error",
        "lexical_timeout",
        "lexical_error",
        "stale_dropped",
    ] {
        metrics::counter!("cairn_search_degraded_total", "reason" => reason).absolute(0);
    }
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
    async fn catch_up(&self, ledger: &dyn OpsLedger) -> Result<(), LedgerError> {
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
pub async fn render(ledger: &dyn OpsLedger, cursor: &EventCursor) -> Result<String, LedgerError> {
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
    // Every backend and state, at zero when the ledger has none (a series that vanishes
    // reads as "no data", not as 0).
    for backend in receipts::Backend::ALL {
        for state in receipts::ReceiptState::ALL {
            let key = format!("{}/{}", backend.as_str(), state.as_str());
            let value = counts.receipts.get(&key).copied().unwrap_or(0);
            metrics::gauge!("cairn_receipts", "backend" => backend.as_str(), "state" => state.as_str())
                .set(value as f64);
        }
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
    // Each generation's state (1 for its state, 0 for the others, so a switch leaves no stale
    // series) and its coverage of the current heads (retired ones read 0).
    for generation in ledger.generations().await? {
        for state in receipts::GenerationState::ALL {
            metrics::gauge!("cairn_generation_state", "generation" => generation.id.clone(), "state" => state.as_str())
                .set(if *state == generation.state { 1.0 } else { 0.0 });
        }
        let live = generation.state.is_live();
        let progress = &generation.progress;
        let value = |count: i64| if live { count as f64 } else { 0.0 };
        let id = generation.id.clone();
        metrics::gauge!("cairn_generation_heads", "generation" => id.clone())
            .set(value(progress.heads));
        metrics::gauge!("cairn_generation_verified_heads", "generation" => id.clone())
            .set(value(progress.verified));
        metrics::gauge!("cairn_generation_failed_heads", "generation" => id.clone())
            .set(value(progress.failed));
        metrics::gauge!("cairn_generation_open_jobs", "generation" => id)
            .set(value(progress.open_jobs));
    }
    metrics::gauge!("cairn_sources").set(counts.sources as f64);
    metrics::gauge!("cairn_revisions").set(counts.revisions as f64);
    handle.run_upkeep();
    Ok(handle.render())
}
