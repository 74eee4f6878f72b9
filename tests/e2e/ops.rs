//! Operations: the ops API and its actions (permissions, dry run, history), the Prometheus
//! metrics under a workload, and the dashboard in headless Chromium.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use receipts::{Failure, FailureClass, Job, JobState, LeaseToken, Ledger, Scope, Submission};
use serde_json::{json, Value};

use crate::common::{app_on, assert_error, metric, Engine, TestApp};

/// Lease of the seeded jobs: short enough that the crashing worker's lease runs out quickly,
/// long enough for a held lease to be seen counting down.
const LEASE_MS: u64 = 4000;

/// Jobs seeded in every operator-visible state.
pub(crate) struct Seeded {
    pub(crate) app: TestApp,
    /// Running, its lease held by a heartbeat task (`host-b`).
    pub(crate) running: Job,
    /// Waiting to retry after a `vector_unavailable` error.
    pub(crate) retrying: Job,
    /// Dead after a permanent `not_text` error.
    pub(crate) dead: Job,
    /// Quarantined: its only lease expired.
    pub(crate) quarantined: Job,
    /// Cancelled by an operator while pending.
    pub(crate) cancelled: Job,
    /// Still pending.
    pub(crate) pending: Job,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl Drop for Seeded {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

async fn claim_one(ledger: &Arc<dyn Ledger>, owner: &str) -> Job {
    let mut jobs = ledger.claim(owner, 1).await.expect("claim");
    assert_eq!(jobs.len(), 1, "{owner} should claim one job");
    jobs.remove(0)
}

/// Seeds jobs in dataset `alpha` (and one in `beta`): running with a held lease, retrying,
/// dead, quarantined, cancelled, pending. Nothing else claims: the app runs no workers.
pub(crate) async fn seed(engine: Engine) -> Seeded {
    let lease = LEASE_MS.to_string();
    let app = app_on(
        engine,
        &[
            ("CAIRN_LEASE_MS", lease.as_str()),
            ("CAIRN_QUARANTINE_AFTER_CRASHES", "1"),
            ("CAIRN_BACKOFF_BASE_MS", "600000"),
            ("CAIRN_BACKOFF_CAP_MS", "600000"),
        ],
    )
    .await;
    let ledger = app.ledger.clone();
    let mut submissions: Vec<Submission> = (1..=6)
        .map(|n| {
            Submission::text(
                "alpha",
                &format!("doc-{n}.txt"),
                "test",
                &format!("text {n}"),
            )
        })
        .collect();
    submissions.push(Submission::text("beta", "b-1.txt", "test", "beta text"));
    for result in ledger.accept(submissions).await {
        result.expect("accepted");
    }
    // A worker that claims and dies: its lease runs out, the next claim rescues the job into
    // quarantine (the threshold is one lost lease here).
    let quarantined = claim_one(&ledger, "host-a:101:crashy").await;
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 300)).await;
    let running = claim_one(&ledger, "host-b:202:worker-1").await;
    let token = LeaseToken::of(&running).expect("lease");
    ledger
        .progress(&token, "embedding")
        .await
        .expect("progress");
    let heartbeat = {
        let ledger = ledger.clone();
        let token = token.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(LEASE_MS / 4)).await;
                let _ = ledger.progress(&token, "embedding").await;
            }
        })
    };
    let retrying = claim_one(&ledger, "host-c:303:worker-2").await;
    ledger
        .fail(
            &LeaseToken::of(&retrying).expect("lease"),
            Failure {
                class: FailureClass::Retryable {
                    retry_after_micros: None,
                },
                code: "vector_unavailable".to_owned(),
                message: "qdrant answered 503 Service Unavailable".to_owned(),
            },
        )
        .await
        .expect("fail");
    let dead = claim_one(&ledger, "host-c:303:worker-2").await;
    ledger
        .fail(
            &LeaseToken::of(&dead).expect("lease"),
            Failure {
                class: FailureClass::Permanent,
                code: "not_text".to_owned(),
                message: "the content is not UTF-8 text (byte 3)".to_owned(),
            },
        )
        .await
        .expect("fail");
    let waiting = ledger
        .find_jobs(&receipts::JobFilter {
            states: vec![JobState::Pending],
            limit: 10,
            ..receipts::JobFilter::default()
        })
        .await
        .expect("pending")
        .jobs;
    assert!(waiting.len() >= 2, "two pending jobs left: {waiting:?}");
    let cancelled = ledger
        .cancel(waiting[0].id, "token:seed", "not needed")
        .await
        .expect("cancel");
    let reload = |job: Job| {
        let ledger = ledger.clone();
        async move { ledger.job(job.id).await.expect("job").expect("exists") }
    };
    let seeded = Seeded {
        quarantined: reload(quarantined).await,
        running: reload(running).await,
        retrying: reload(retrying).await,
        dead: reload(dead).await,
        cancelled,
        pending: waiting[1].clone(),
        heartbeat,
        app,
    };
    assert_eq!(seeded.quarantined.state, JobState::Quarantined);
    assert_eq!(seeded.running.state, JobState::Running);
    assert_eq!(seeded.retrying.state, JobState::RetryWait);
    assert_eq!(seeded.dead.state, JobState::Dead);
    assert_eq!(seeded.cancelled.state, JobState::Cancelled);
    seeded
}

fn ids(page: &Value) -> Vec<String> {
    page["jobs"]
        .as_array()
        .map(|jobs| {
            jobs.iter()
                .filter_map(|job| job["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn ops_listings_show_each_state_with_its_why() {
    ops_listings_show_each_state_with_its_why_on(Engine::Sqlite).await;
}

/// [`ops_listings_show_each_state_with_its_why`] on a PostgreSQL ledger.
#[tokio::test]
async fn ops_listings_show_each_state_with_its_why_on_postgres() {
    ops_listings_show_each_state_with_its_why_on(Engine::Postgres).await;
}

async fn ops_listings_show_each_state_with_its_why_on(engine: Engine) {
    let seeded = seed(engine).await;
    let app = &seeded.app;
    let reader = app.token("ops-reader", &[Scope::OpsRead], None).await;

    let (status, summary) = app
        .call("GET", "/v1/ops/summary", Some(&reader), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{summary}");
    assert_eq!(summary["running"], 1);
    assert_eq!(summary["jobs"]["quarantined"], 1);
    assert_eq!(summary["jobs"]["dead"], 1);
    assert_eq!(summary["jobs"]["retry_wait"], 1);
    assert_eq!(summary["minutes"].as_array().map(Vec::len), Some(60));
    // Four first claims (crashy, worker-1, worker-2 twice) since acceptance.
    assert_eq!(summary["enqueue_to_start"]["count"], 4, "{summary}");
    assert!(summary["oldest_lease_age_ms"].as_i64().is_some());
    let claimed: i64 = summary["minutes"]
        .as_array()
        .expect("minutes")
        .iter()
        .map(|minute| minute["claimed"].as_i64().unwrap_or(0))
        .sum();
    assert_eq!(claimed, 4);

    let (_, leases) = app.call("GET", "/v1/ops/leases", Some(&reader), None).await;
    assert_eq!(ids(&leases), vec![seeded.running.id.to_string()]);
    let lease = &leases["jobs"][0];
    assert_eq!(lease["lease_owner"], "host-b:202:worker-1");
    assert_eq!(lease["worker_host"], "host-b");
    assert_eq!(lease["stage"], "embedding");
    let left = lease["lease_expires_in_ms"].as_i64().expect("countdown");
    assert!(left > 0 && left <= LEASE_MS as i64, "{lease}");
    assert_eq!(lease["heartbeat_late"], false);

    let (_, retries) = app
        .call("GET", "/v1/ops/retries", Some(&reader), None)
        .await;
    assert_eq!(ids(&retries), vec![seeded.retrying.id.to_string()]);
    let retry = &retries["jobs"][0];
    assert!(
        retry["run_at_rule"]
            .as_str()
            .is_some_and(|rule| rule.starts_with("backoff after attempt 1")),
        "{retry}"
    );
    assert_eq!(retry["last_error_code"], "vector_unavailable");
    assert_eq!(retry["attempts"][0]["error_code"], "vector_unavailable");
    assert_eq!(
        retry["attempts"][0]["error_message"],
        "qdrant answered 503 Service Unavailable"
    );
    assert!(retry["due_in_ms"].as_i64().is_some_and(|ms| ms > 60_000));

    let (_, dead) = app.call("GET", "/v1/ops/dead", Some(&reader), None).await;
    let mut listed = ids(&dead);
    listed.sort();
    let mut expected = vec![
        seeded.dead.id.to_string(),
        seeded.quarantined.id.to_string(),
        seeded.cancelled.id.to_string(),
    ];
    expected.sort();
    assert_eq!(listed, expected);
    // The quarantined job's only attempt record is its lost lease, with the crashed worker.
    let quarantined = dead["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .find(|job| job["state"] == "quarantined")
        .expect("quarantined listed");
    assert_eq!(quarantined["attempts"][0]["error_code"], "lease_expired");
    assert!(quarantined["attempts"][0]["error_message"]
        .as_str()
        .is_some_and(|message| message.contains("host-a:101:crashy")));

    // Filters: by error code, by state, by dataset, by source key text.
    let (_, by_code) = app
        .call(
            "GET",
            "/v1/ops/dead?error_code=not_text",
            Some(&reader),
            None,
        )
        .await;
    assert_eq!(ids(&by_code), vec![seeded.dead.id.to_string()]);
    let (_, by_state) = app
        .call("GET", "/v1/ops/jobs?state=pending", Some(&reader), None)
        .await;
    assert!(ids(&by_state).contains(&seeded.pending.id.to_string()));
    assert!(by_state["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .all(|job| job["state"] == "pending"));
    let (_, beta) = app
        .call("GET", "/v1/ops/jobs?dataset=beta", Some(&reader), None)
        .await;
    assert_eq!(beta["total"], 1);
    let key = seeded.dead.source_key.clone();
    let (_, by_key) = app
        .call(
            "GET",
            &format!("/v1/ops/jobs?q={}", key.replace('.', "%2E")),
            Some(&reader),
            None,
        )
        .await;
    assert_eq!(ids(&by_key), vec![seeded.dead.id.to_string()]);

    // Detail: history with actors and the run's error, receipts, revision chain.
    let (status, detail) = app
        .call(
            "GET",
            &format!("/v1/ops/jobs/{}", seeded.dead.id),
            Some(&reader),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    let history = detail["history"].as_array().expect("history");
    let transitions: Vec<(Value, Value)> = history
        .iter()
        .map(|entry| (entry["from"].clone(), entry["to"].clone()))
        .collect();
    assert_eq!(
        transitions,
        vec![
            (json!("running"), json!("dead")),
            (json!("pending"), json!("running")),
            (Value::Null, json!("pending")),
        ],
        "newest first"
    );
    assert_eq!(history[1]["actor"], "host-c:303:worker-2");
    assert_eq!(detail["history_total"], 3);
    // One page at a time.
    let (status, page) = app
        .call(
            "GET",
            &format!("/v1/ops/jobs/{}?limit=1&offset=1", seeded.dead.id),
            Some(&reader),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["history"].as_array().map(Vec::len), Some(1));
    assert_eq!(page["history"][0]["to"], "running");
    assert_eq!(page["history_total"], 3);
    assert_error(
        &app.call(
            "GET",
            &format!("/v1/ops/jobs/{}?limit=0", seeded.dead.id),
            Some(&reader),
            None,
        )
        .await,
        422,
        "invalid_limit",
    );
    assert_eq!(history[0]["error_code"], "not_text");
    assert_eq!(detail["receipts"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        detail["source"]["head_revision_id"],
        json!(seeded.dead.revision_id)
    );

    // Bad parameters are typed errors.
    let missing = format!("/v1/ops/jobs/{}", uuid::Uuid::nil());
    for (uri, status, code) in [
        ("/v1/ops/jobs?state=sleeping", 422, "invalid_state"),
        ("/v1/ops/leases?state=dead", 422, "invalid_state"),
        ("/v1/ops/jobs?limit=0", 422, "invalid_limit"),
        ("/v1/ops/jobs/not-a-uuid", 422, "invalid_job_id"),
        (missing.as_str(), 404, "job_not_found"),
    ] {
        assert_error(
            &app.call("GET", uri, Some(&reader), None).await,
            status,
            code,
        );
    }
}

#[tokio::test]
async fn ops_actions_need_their_scope_and_dataset_and_are_recorded() {
    ops_actions_need_their_scope_and_dataset_and_are_recorded_on(Engine::Sqlite).await;
}

/// [`ops_actions_need_their_scope_and_dataset_and_are_recorded`] on a PostgreSQL ledger.
#[tokio::test]
async fn ops_actions_need_their_scope_and_dataset_and_are_recorded_on_postgres() {
    ops_actions_need_their_scope_and_dataset_and_are_recorded_on(Engine::Postgres).await;
}

async fn ops_actions_need_their_scope_and_dataset_and_are_recorded_on(engine: Engine) {
    let seeded = seed(engine).await;
    let app = &seeded.app;
    let reader = app.token("ops-reader", &[Scope::OpsRead], None).await;
    let writer = app
        .token("alice", &[Scope::OpsRead, Scope::OpsWrite], None)
        .await;
    let beta_only = app
        .token(
            "beta-ops",
            &[Scope::OpsRead, Scope::OpsWrite],
            Some(&["beta"]),
        )
        .await;
    let ingest = app.token("ingest", &[Scope::Ingest], None).await;
    let requeue_dead = format!("/v1/ops/jobs/{}/requeue", seeded.dead.id);

    // 401 without a token, 403 without the scope, 403 or 404 outside the allowlist.
    assert_error(
        &app.call("GET", "/v1/ops/summary", None, None).await,
        401,
        "unauthenticated",
    );
    assert_error(
        &app.call("GET", "/v1/ops/leases", Some(&ingest), None).await,
        403,
        "forbidden",
    );
    assert_error(
        &app.call("GET", "/metrics", Some(&ingest), None).await,
        403,
        "forbidden",
    );
    assert_error(
        &app.call("POST", &requeue_dead, Some(&reader), Some(json!({})))
            .await,
        403,
        "forbidden",
    );
    // Another dataset's job is answered as absent, never named: read, requeue, cancel.
    let other_job = format!("/v1/ops/jobs/{}", seeded.dead.id);
    for (method, uri) in [
        ("GET", other_job.clone()),
        ("POST", requeue_dead.clone()),
        ("POST", format!("{other_job}/cancel")),
    ] {
        let body = (method == "POST").then(|| json!({}));
        let refused = app.call(method, &uri, Some(&beta_only), body).await;
        assert_error(&refused, 404, "job_not_found");
        assert!(!refused.1.to_string().contains("alpha"), "{}", refused.1);
    }
    assert_error(
        &app.call("GET", "/v1/ops/jobs?dataset=alpha", Some(&beta_only), None)
            .await,
        403,
        "forbidden",
    );
    // Views are scoped to the allowlist: another dataset's pause, actor and reason, and
    // ledger-wide counts are not shown; metrics (which name every dataset) need a token
    // without an allowlist.
    app.ledger
        .pause(Some("gamma"), "token:ops", "gamma maintenance window")
        .await
        .expect("pause gamma");
    let (status, summary) = app
        .call("GET", "/v1/ops/summary", Some(&beta_only), None)
        .await;
    assert_eq!(status, 200, "{summary}");
    assert!(
        !summary.to_string().contains("alpha") && !summary.to_string().contains("gamma"),
        "{summary}"
    );
    assert_eq!(summary["scope"]["datasets"], json!(["beta"]));
    let beta_jobs: i64 = summary["jobs"]
        .as_object()
        .expect("jobs")
        .values()
        .filter_map(Value::as_i64)
        .sum();
    assert_eq!(beta_jobs, 1, "{summary}");
    let (_, status_view) = app.call("GET", "/v1/status", Some(&beta_only), None).await;
    assert!(!status_view.to_string().contains("alpha"), "{status_view}");
    assert!(
        status_view["counts"].get("sources").is_none(),
        "{status_view}"
    );
    assert_error(
        &app.call("GET", "/metrics", Some(&beta_only), None).await,
        403,
        "forbidden",
    );
    app.ledger
        .resume(Some("gamma"), "token:ops", "done")
        .await
        .expect("resume gamma");
    // The allowlist narrows listings.
    let (_, beta_view) = app
        .call("GET", "/v1/ops/jobs", Some(&beta_only), None)
        .await;
    assert_eq!(beta_view["total"], 1, "{beta_view}");
    assert_error(
        &app.call("POST", "/v1/ops/pause", Some(&beta_only), Some(json!({})))
            .await,
        403,
        "forbidden",
    );

    // A refused action changed nothing.
    let unchanged = app
        .ledger
        .job(seeded.dead.id)
        .await
        .expect("job")
        .expect("exists");
    assert_eq!(unchanged.state, JobState::Dead);

    // Requeue one job: pending again, recorded with the token's identity and the reason.
    let (status, answer) = app
        .call(
            "POST",
            &requeue_dead,
            Some(&writer),
            Some(json!({ "reason": "the text was fixed upstream" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["job"]["state"], "pending");
    let history = app
        .ledger
        .history("job", &seeded.dead.id.to_string())
        .await
        .expect("history");
    let last = history.last().expect("entry");
    assert_eq!(last.actor, "token:alice");
    assert!(
        last.cause.contains("the text was fixed upstream"),
        "{last:?}"
    );
    // Requeueing it again is an invalid transition, typed.
    let again = app
        .call("POST", &requeue_dead, Some(&writer), Some(json!({})))
        .await;
    assert_eq!(again.0.as_u16(), 409, "{}", again.1);

    // Bulk requeue by filter: the dry run lists exactly the candidates and changes nothing.
    let (status, dry) = app
        .call(
            "POST",
            "/v1/ops/requeue",
            Some(&reader),
            Some(json!({ "dataset": "alpha", "dry_run": true })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    let mut candidates: Vec<String> = dry["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .filter_map(|job| job["id"].as_str().map(str::to_owned))
        .collect();
    candidates.sort();
    let mut expected = vec![
        seeded.quarantined.id.to_string(),
        seeded.cancelled.id.to_string(),
    ];
    expected.sort();
    assert_eq!(candidates, expected);
    assert_eq!(dry["matched"], 2);
    let still = app
        .ledger
        .job(seeded.quarantined.id)
        .await
        .expect("job")
        .expect("exists");
    assert_eq!(still.state, JobState::Quarantined);
    // A real bulk run needs ops:write; by error code it takes only the quarantined job.
    assert_error(
        &app.call(
            "POST",
            "/v1/ops/requeue",
            Some(&reader),
            Some(json!({ "error_code": "lease_expired" })),
        )
        .await,
        403,
        "forbidden",
    );
    assert_error(
        &app.call(
            "POST",
            "/v1/ops/requeue",
            Some(&writer),
            Some(json!({ "states": ["running"] })),
        )
        .await,
        422,
        "invalid_state",
    );
    let (status, bulk) = app
        .call(
            "POST",
            "/v1/ops/requeue",
            Some(&writer),
            Some(json!({ "error_code": "lease_expired", "reason": "worker host replaced" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{bulk}");
    assert_eq!(bulk["done"].as_array().map(Vec::len), Some(1), "{bulk}");
    assert_eq!(bulk["done"][0]["id"], json!(seeded.quarantined.id));
    let cancelled = app
        .ledger
        .job(seeded.cancelled.id)
        .await
        .expect("job")
        .expect("exists");
    assert_eq!(cancelled.state, JobState::Cancelled, "not in the filter");

    // Bulk cancel by filter: the dry run lists the waiting jobs of dataset beta only.
    let (status, dry) = app
        .call(
            "POST",
            "/v1/ops/cancel",
            Some(&writer),
            Some(json!({ "dataset": "beta", "states": ["pending"], "dry_run": true })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    assert_eq!(dry["matched"], 1, "{dry}");
    assert_eq!(dry["candidates"][0]["dataset"], "beta");
    let beta_job = dry["candidates"][0]["id"].as_str().expect("id").to_owned();
    let (status, done) = app
        .call(
            "POST",
            "/v1/ops/cancel",
            Some(&beta_only),
            Some(json!({ "dataset": "beta", "states": ["pending"], "reason": "dataset retired" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["done"][0]["id"], beta_job.as_str());
    assert_eq!(done["done"][0]["state"], "cancelled");

    // Cancel a running job: it is asked to stop (the worker stops at its next heartbeat).
    let (status, answer) = app
        .call(
            "POST",
            &format!("/v1/ops/jobs/{}/cancel", seeded.running.id),
            Some(&writer),
            Some(json!({ "reason": "runaway" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["job"]["cancel_requested"], true);

    // Pause and resume, recorded; a pause shows in the summary.
    let (status, paused) = app
        .call(
            "POST",
            "/v1/ops/pause",
            Some(&writer),
            Some(json!({ "dataset": "alpha", "reason": "reindex window" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{paused}");
    assert_eq!(paused["pauses"]["alpha"]["actor"], "token:alice");
    let (_, summary) = app
        .call("GET", "/v1/ops/summary", Some(&reader), None)
        .await;
    assert_eq!(summary["pauses"][0]["dataset"], "alpha");
    assert!(app
        .ledger
        .claim("host-z:1:w", 10)
        .await
        .expect("claim")
        .iter()
        .all(|job| job.dataset != "alpha"));
    let (status, resumed) = app
        .call(
            "POST",
            "/v1/ops/resume",
            Some(&writer),
            Some(json!({ "dataset": "alpha" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{resumed}");
    assert_eq!(resumed["pauses"], json!({}));
    let pauses = app.ledger.history("pause", "alpha").await.expect("history");
    assert_eq!(
        pauses
            .iter()
            .map(|entry| (entry.event.as_str(), entry.actor.as_str()))
            .collect::<Vec<_>>(),
        vec![("paused", "token:alice"), ("resumed", "token:alice")]
    );
    assert_error(
        &app.call(
            "POST",
            "/v1/ops/pause",
            Some(&writer),
            Some(json!({ "dataset": "alpha", "unknown": 1 })),
        )
        .await,
        422,
        "invalid_json",
    );
}

#[tokio::test]
async fn metrics_follow_a_workload() {
    metrics_follow_a_workload_on(Engine::Sqlite).await;
}

/// [`metrics_follow_a_workload`] on a PostgreSQL ledger.
#[tokio::test]
async fn metrics_follow_a_workload_on_postgres() {
    metrics_follow_a_workload_on(Engine::Postgres).await;
}

async fn metrics_follow_a_workload_on(engine: Engine) {
    let seeded = seed(engine).await;
    let app = &seeded.app;
    let reader = app.token("prometheus", &[Scope::OpsRead], None).await;
    let scrape = || async {
        let (status, _, body) = app
            .raw(
                axum::http::Request::builder()
                    .uri("/metrics")
                    .header("authorization", format!("Bearer {reader}"))
                    .body(axum::body::Body::empty())
                    .expect("request"),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        String::from_utf8(body).expect("text")
    };
    let before = scrape().await;
    assert_eq!(metric(&before, "cairn_jobs", &[("state", "running")]), 1.0);
    assert_eq!(
        metric(&before, "cairn_jobs", &[("state", "quarantined")]),
        1.0
    );
    assert_eq!(metric(&before, "cairn_job_claims_total", &[]), 4.0);
    assert_eq!(
        metric(
            &before,
            "cairn_job_failures_total",
            &[("code", "not_text"), ("outcome", "dead")]
        ),
        1.0
    );
    assert_eq!(
        metric(&before, "cairn_job_retries_scheduled_total", &[]),
        1.0
    );
    assert_eq!(metric(&before, "cairn_lease_rescues_total", &[]), 1.0);
    assert_eq!(metric(&before, "cairn_job_quarantines_total", &[]), 1.0);
    assert_eq!(
        metric(&before, "cairn_job_enqueue_to_start_seconds_count", &[]),
        4.0
    );
    assert!(metric(&before, "cairn_max_heartbeat_age_seconds", &[]) < (LEASE_MS as f64) / 1000.0);

    // Workload: complete the running job, claim and fail the pending ones, search twice.
    let ledger = &app.ledger;
    ledger
        .complete(&LeaseToken::of(&seeded.running).expect("lease"))
        .await
        .expect("complete");
    let mut failed = 0;
    for job in ledger.claim("host-d:404:w", 10).await.expect("claim") {
        ledger
            .fail(
                &LeaseToken::of(&job).expect("lease"),
                Failure {
                    class: FailureClass::Permanent,
                    code: "config_error".to_owned(),
                    message: "test".to_owned(),
                },
            )
            .await
            .expect("fail");
        failed += 1;
    }
    assert!(failed >= 1);
    let searcher = app.token("searcher", &[Scope::Search], None).await;
    for _ in 0..2 {
        let (status, body) = app
            .call(
                "POST",
                "/v1/search",
                Some(&searcher),
                Some(json!({ "query": "text", "mode": "lexical" })),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (status, _) = app
        .call(
            "POST",
            "/v1/search",
            Some(&searcher),
            Some(json!({ "query": "text", "mode": "vector" })),
        )
        .await;
    assert_eq!(status.as_u16(), 422);

    let after = scrape().await;
    assert_eq!(metric(&after, "cairn_job_completions_total", &[]), 1.0);
    assert_eq!(
        metric(&after, "cairn_job_claims_total", &[]),
        4.0 + failed as f64
    );
    assert_eq!(
        metric(
            &after,
            "cairn_job_failures_total",
            &[("code", "config_error")]
        ),
        failed as f64
    );
    assert_eq!(metric(&after, "cairn_jobs", &[("state", "running")]), 0.0);
    assert_eq!(
        metric(&after, "cairn_accepted_to_searchable_seconds_count", &[]),
        1.0
    );
    assert_eq!(
        metric(
            &after,
            "cairn_search_requests_total",
            &[("mode", "lexical"), ("status", "200")]
        ),
        2.0
    );
    assert_eq!(
        metric(
            &after,
            "cairn_search_requests_total",
            &[("mode", "vector"), ("status", "422")]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &after,
            "cairn_search_duration_seconds_count",
            &[("mode", "lexical")]
        ),
        2.0
    );
    // Counters never go back: a third scrape with no new events reads the same.
    let again = scrape().await;
    assert_eq!(
        metric(&again, "cairn_job_claims_total", &[]),
        metric(&after, "cairn_job_claims_total", &[])
    );
}

/// Runs `cairn ops ARGS...` against `base` with `token`; returns stdout (asserting success).
async fn cairn_ops(base: &str, token: &str, args: &[&str]) -> String {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("ops")
        .args(args)
        .args(["--server", base, "--token", token])
        .env("CAIRN_LOG", "warn")
        .output()
        .await
        .expect("run cairn ops");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "cairn ops {args:?} failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ops_cli_prints_tables_and_acts_by_filter() {
    the_ops_cli_prints_tables_and_acts_by_filter_on(Engine::Sqlite).await;
}

/// [`the_ops_cli_prints_tables_and_acts_by_filter`] on a PostgreSQL ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ops_cli_prints_tables_and_acts_by_filter_on_postgres() {
    the_ops_cli_prints_tables_and_acts_by_filter_on(Engine::Postgres).await;
}

async fn the_ops_cli_prints_tables_and_acts_by_filter_on(engine: Engine) {
    let seeded = seed(engine).await;
    let app = &seeded.app;
    let operator = app
        .token("cli-operator", &[Scope::OpsRead, Scope::OpsWrite], None)
        .await;
    let (base, server) = app.listen().await;

    let status = cairn_ops(&base, &operator, &["status"]).await;
    assert!(status.contains("running 1"), "{status}");
    assert!(status.contains("enqueue to start"), "{status}");
    let leases = cairn_ops(&base, &operator, &["leases"]).await;
    assert!(leases.contains("host-b:202:worker-1"), "{leases}");
    assert!(leases.contains("embedding"), "{leases}");
    let retries = cairn_ops(&base, &operator, &["retries"]).await;
    assert!(retries.contains("backoff after attempt 1"), "{retries}");
    assert!(retries.contains("vector_unavailable"), "{retries}");
    let dead = cairn_ops(&base, &operator, &["dead", "--error-code", "not_text"]).await;
    assert!(dead.contains(&seeded.dead.id.to_string()), "{dead}");
    assert!(!dead.contains(&seeded.quarantined.id.to_string()), "{dead}");
    let detail = cairn_ops(
        &base,
        &operator,
        &["job", &seeded.dead.id.to_string(), "--json"],
    )
    .await;
    let detail: Value = serde_json::from_str(&detail).expect("json");
    assert_eq!(detail["history"][0]["error_code"], "not_text");

    // A bulk action without --yes is a dry run: it lists the candidates and changes nothing.
    let dry = cairn_ops(
        &base,
        &operator,
        &["requeue", "--error-code", "lease_expired"],
    )
    .await;
    assert!(dry.contains(&seeded.quarantined.id.to_string()), "{dry}");
    assert!(dry.contains("run again with --yes"), "{dry}");
    let unchanged = app
        .ledger
        .job(seeded.quarantined.id)
        .await
        .expect("job")
        .expect("exists");
    assert_eq!(unchanged.state, JobState::Quarantined);
    let done = cairn_ops(
        &base,
        &operator,
        &[
            "requeue",
            "--error-code",
            "lease_expired",
            "--yes",
            "--reason",
            "new host",
        ],
    )
    .await;
    assert!(done.contains("1 done, 0 refused"), "{done}");
    let requeued = app
        .ledger
        .job(seeded.quarantined.id)
        .await
        .expect("job")
        .expect("exists");
    assert_eq!(requeued.state, JobState::Pending);

    let paused = cairn_ops(
        &base,
        &operator,
        &["pause", "--dataset", "beta", "--reason", "audit"],
    )
    .await;
    assert!(
        paused.contains("paused: beta (by token:cli-operator: audit)"),
        "{paused}"
    );
    let resumed = cairn_ops(&base, &operator, &["resume", "--dataset", "beta"]).await;
    assert!(
        resumed.contains("claiming runs for every dataset"),
        "{resumed}"
    );
    server.abort();
}
