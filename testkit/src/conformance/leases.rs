//! Conformance: leases are claimed, renewed, fenced, rescued and ended by the lease rules; retries
//! back off, attempts are bounded, crashing jobs are quarantined, claims are fair.

use receipts::clock::Clock;
use receipts::model::{Failure, FailureClass, JobState, LeaseToken};
use receipts::LedgerError;

use super::{claim_one, job_of, lost, must, must_accept, put, retryable, Harness, SECOND};

/// Claim, heartbeat and complete, each recorded in history.
pub async fn lease_lifecycle_claim_heartbeat_complete(harness: Harness) {
    let receipt = must_accept(&harness, put("docs", "a", "alpha")).await;
    let (job, token) = claim_one(&harness, "worker-1").await;
    assert_eq!(job.id, receipt.projection_job_id);
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.lease_owner.as_deref(), Some("worker-1"));
    let now = harness.clock.now_micros();
    assert_eq!(job.lease_expires_at, Some(now + 30 * SECOND));
    assert_eq!(job.deadline_at, Some(now + 15 * 60 * SECOND));
    assert!(
        must(harness.ledger.claim("worker-2", 5).await, "claim").is_empty(),
        "a running job is not claimed twice"
    );
    harness.clock.advance(10 * SECOND);
    let beat = must(harness.ledger.heartbeat(&token).await, "heartbeat");
    assert_eq!(beat.lease_expires_at, now + 40 * SECOND);
    assert!(!beat.cancel_requested);
    let done = must(harness.ledger.complete(&token).await, "complete");
    assert_eq!(done.state, JobState::Completed);
    assert_eq!(done.lease_id, None);
    lost(harness.ledger.complete(&token).await);
    let history = must(
        harness.ledger.history("job", &job.id.to_string()).await,
        "history",
    );
    let steps: Vec<(Option<&str>, Option<&str>, &str)> = history
        .iter()
        .map(|h| (h.from.as_deref(), h.to.as_deref(), h.actor.as_str()))
        .collect();
    assert_eq!(
        steps,
        [
            (None, Some("pending"), "test:conformance"),
            (Some("pending"), Some("running"), "worker-1"),
            (Some("running"), Some("completed"), "worker-1")
        ]
    );
}

/// An expired lease fences its holder out; the rescue is recorded and counted as a crash.
pub async fn expired_lease_is_fenced_and_rescued(harness: Harness) {
    must_accept(&harness, put("docs", "a", "alpha")).await;
    let (job, stale) = claim_one(&harness, "worker-1").await;
    harness.clock.advance(31 * SECOND);
    let before = job_of(&harness, job.id).await;
    lost(harness.ledger.heartbeat(&stale).await);
    lost(harness.ledger.complete(&stale).await);
    lost(harness.ledger.fail(&stale, retryable("boom", None)).await);
    assert_eq!(
        job_of(&harness, job.id).await,
        before,
        "fenced-out writes change nothing"
    );
    let (again, fresh) = claim_one(&harness, "worker-2").await;
    assert_eq!(again.id, job.id);
    assert_eq!(again.crashes, 1);
    assert_eq!(again.attempt, 0, "a crash is not an attempt");
    assert_ne!(fresh.lease_id, stale.lease_id);
    lost(harness.ledger.complete(&stale).await);
    must(harness.ledger.complete(&fresh).await, "complete");
    let history = must(
        harness.ledger.history("job", &job.id.to_string()).await,
        "history",
    );
    assert!(history
        .iter()
        .any(|h| h.cause == "lease_expired" && h.to.as_deref() == Some("pending")));
}

/// Heartbeats never extend a lease past the run's hard deadline.
pub async fn hard_deadline_ends_heartbeats(harness: Harness) {
    must_accept(&harness, put("docs", "a", "alpha")).await;
    let (job, token) = claim_one(&harness, "worker-1").await;
    let deadline = job.deadline_at.expect("deadline");
    let start = harness.clock.now_micros();
    // Ten-second beats reach the deadline in (deadline - start) / 10 s of them; a few more
    // would mean heartbeats extend leases without end.
    let most = (deadline - start) / (10 * SECOND) + 3;
    for beat in 0.. {
        assert!(beat <= most, "heartbeats still accepted after {beat} beats");
        harness.clock.advance(10 * SECOND);
        match harness.ledger.heartbeat(&token).await {
            Ok(beat) => assert!(beat.lease_expires_at <= deadline),
            Err(LedgerError::LeaseLost { .. }) => break,
            Err(error) => panic!("heartbeat failed: {error}"),
        }
    }
    assert!(harness.clock.now_micros() >= deadline);
    let rescued = must(harness.ledger.claim("worker-2", 1).await, "claim");
    assert_eq!(rescued[0].crashes, 1);
}

/// Backoff grows exponentially with bounded jitter; a retry-after wins and costs no attempt;
/// a permanent error is dead.
pub async fn retries_follow_backoff_and_retry_after(harness: Harness) {
    must_accept(&harness, put("docs", "a", "alpha")).await;
    let (job, token) = claim_one(&harness, "w").await;
    let now = harness.clock.now_micros();
    let waiting = must(
        harness
            .ledger
            .fail(&token, retryable("store_unavailable", None))
            .await,
        "fail",
    );
    assert_eq!(waiting.state, JobState::RetryWait);
    assert_eq!(waiting.attempt, 1);
    assert!(
        (now + 900_000..=now + 1_100_000).contains(&waiting.run_at),
        "first backoff is 1 s +-10%"
    );
    assert!(
        waiting.run_at_rule.starts_with("backoff after attempt 1"),
        "{}",
        waiting.run_at_rule
    );
    assert_eq!(
        waiting.last_error_code.as_deref(),
        Some("store_unavailable")
    );
    assert!(
        must(harness.ledger.claim("w", 1).await, "claim").is_empty(),
        "not due yet"
    );
    harness.clock.set(waiting.run_at);
    let (_, token) = claim_one(&harness, "w").await;
    let now = harness.clock.now_micros();
    let second = must(
        harness
            .ledger
            .fail(&token, retryable("store_unavailable", None))
            .await,
        "fail",
    );
    assert!(
        (now + 1_800_000..=now + 2_200_000).contains(&second.run_at),
        "second backoff is 2 s +-10%"
    );
    harness.clock.set(second.run_at);
    let (_, token) = claim_one(&harness, "w").await;
    let now = harness.clock.now_micros();
    let snoozed = must(
        harness
            .ledger
            .fail(&token, retryable("rate_limited", Some(5 * SECOND)))
            .await,
        "fail",
    );
    assert_eq!(snoozed.attempt, 2, "a snooze costs no attempt");
    assert_eq!(snoozed.run_at, now + 5 * SECOND);
    assert!(
        snoozed.run_at_rule.starts_with("retry-after 5000 ms"),
        "{}",
        snoozed.run_at_rule
    );
    harness.clock.set(snoozed.run_at);
    let (_, token) = claim_one(&harness, "w").await;
    let permanent = Failure {
        class: FailureClass::Permanent,
        code: "decode_error".to_owned(),
        message: "bad bytes".to_owned(),
    };
    let dead = must(harness.ledger.fail(&token, permanent).await, "fail");
    assert_eq!(dead.state, JobState::Dead);
    assert_eq!(dead.attempt, 3);
    let history = must(
        harness.ledger.history("job", &job.id.to_string()).await,
        "history",
    );
    assert!(history
        .iter()
        .any(|h| h.cause.starts_with("snoozed: rate_limited")));
    assert_eq!(
        history.last().map(|h| h.cause.as_str()),
        Some("dead: permanent error decode_error")
    );
}

/// Retryable failures end in `dead` once attempts reach the maximum.
pub async fn attempts_are_bounded(harness: Harness) {
    must_accept(&harness, put("docs", "a", "alpha")).await;
    let mut last = None;
    for _ in 0..receipts::policy::DEFAULT_MAX_ATTEMPTS {
        let (_, token) = claim_one(&harness, "w").await;
        let job = must(
            harness.ledger.fail(&token, retryable("flaky", None)).await,
            "fail",
        );
        assert!(job.attempt <= job.max_attempts);
        harness
            .clock
            .set(job.run_at.max(harness.clock.now_micros()));
        last = Some(job);
    }
    let last = last.expect("failed at least once");
    assert_eq!(last.state, JobState::Dead);
    assert_eq!(last.attempt, last.max_attempts);
    assert!(must(harness.ledger.claim("w", 1).await, "claim").is_empty());
}

/// A job whose leases keep expiring is quarantined instead of retried forever.
pub async fn crashing_jobs_are_quarantined(harness: Harness) {
    must_accept(&harness, put("docs", "a", "alpha")).await;
    for _ in 0..receipts::policy::DEFAULT_QUARANTINE_AFTER_CRASHES {
        claim_one(&harness, "doomed").await;
        harness.clock.advance(31 * SECOND);
    }
    assert!(must(harness.ledger.claim("w", 1).await, "claim").is_empty());
    let counts = must(harness.ledger.counts().await, "counts");
    assert_eq!(counts.jobs.get("quarantined"), Some(&1));
}

/// Cancel stops pending work at once and running work at its next heartbeat; requeue
/// restarts dead, cancelled or quarantined jobs.
pub async fn cancel_and_requeue(harness: Harness) {
    let receipt = must_accept(&harness, put("docs", "a", "alpha")).await;
    let id = receipt.projection_job_id;
    let cancelled = must(
        harness.ledger.cancel(id, "token:ops", "not needed").await,
        "cancel",
    );
    assert_eq!(cancelled.state, JobState::Cancelled);
    match harness.ledger.cancel(id, "token:ops", "again").await {
        Err(LedgerError::InvalidTransition { .. }) => {}
        other => panic!("expected invalid_transition, got {other:?}"),
    }
    let requeued = must(
        harness
            .ledger
            .requeue(id, "token:ops", "needed after all")
            .await,
        "requeue",
    );
    assert_eq!((requeued.state, requeued.attempt), (JobState::Pending, 0));
    let (_, token) = claim_one(&harness, "w").await;
    let asked = must(
        harness.ledger.cancel(id, "token:ops", "stop it").await,
        "cancel running",
    );
    assert_eq!(asked.state, JobState::Running);
    assert!(asked.cancel_requested);
    let beat = must(harness.ledger.heartbeat(&token).await, "heartbeat");
    assert!(
        beat.cancel_requested,
        "the worker learns at its next heartbeat"
    );
    let stopped = must(
        harness
            .ledger
            .fail(
                &token,
                Failure {
                    class: FailureClass::Cancelled,
                    code: "cancelled".to_owned(),
                    message: "stopped".to_owned(),
                },
            )
            .await,
        "fail",
    );
    assert_eq!(stopped.state, JobState::Cancelled);
    let history = must(
        harness.ledger.history("job", &id.to_string()).await,
        "history",
    );
    assert!(history
        .iter()
        .any(|h| h.event == "cancel_requested" && h.actor == "token:ops"));
    assert!(history
        .iter()
        .any(|h| h.cause == "requeued: needed after all" && h.actor == "token:ops"));
    // A superseded job cannot be requeued: its revision is no longer head.
    must(
        harness.ledger.requeue(id, "token:ops", "once more").await,
        "requeue",
    );
    must_accept(&harness, put("docs", "a", "beta")).await;
    match harness.ledger.requeue(id, "token:ops", "stale").await {
        Err(LedgerError::InvalidTransition { .. }) => {}
        other => panic!("expected invalid_transition, got {other:?}"),
    }
}

/// A new head supersedes a running job; its worker is fenced out.
pub async fn superseded_running_job_fences_its_worker(harness: Harness) {
    must_accept(&harness, put("docs", "a", "alpha")).await;
    let (job, token) = claim_one(&harness, "w").await;
    must_accept(&harness, put("docs", "a", "beta")).await;
    assert_eq!(job_of(&harness, job.id).await.state, JobState::Superseded);
    lost(harness.ledger.heartbeat(&token).await);
    lost(harness.ledger.complete(&token).await);
}

/// Releasing (graceful shutdown) charges nothing; pauses stop claims; datasets take turns.
pub async fn release_pause_and_fair_claims(harness: Harness) {
    for index in 0..10 {
        must_accept(
            &harness,
            put("busy", &format!("doc-{index}"), &format!("busy {index}")),
        )
        .await;
    }
    must_accept(&harness, put("quiet", "q1", "quiet one")).await;
    must_accept(&harness, put("quiet", "q2", "quiet two")).await;
    let claimed = must(harness.ledger.claim("w", 4).await, "claim");
    let quiet = claimed.iter().filter(|job| job.dataset == "quiet").count();
    assert_eq!(
        quiet,
        2,
        "the quiet dataset gets its turns: {:?}",
        claimed.iter().map(|j| &j.dataset).collect::<Vec<_>>()
    );
    for job in &claimed {
        let released = must(
            harness
                .ledger
                .release(&LeaseToken::of(job).expect("lease"))
                .await,
            "release",
        );
        assert_eq!(
            (released.state, released.attempt, released.crashes),
            (JobState::Pending, 0, 0)
        );
    }
    must(
        harness
            .ledger
            .pause(Some("busy"), "token:ops", "maintenance")
            .await,
        "pause",
    );
    let claimed = must(harness.ledger.claim("w", 20).await, "claim");
    assert!(claimed.iter().all(|job| job.dataset == "quiet"));
    must(
        harness.ledger.pause(None, "token:ops", "all stop").await,
        "pause all",
    );
    harness.clock.advance(1);
    assert!(must(harness.ledger.claim("w", 20).await, "claim").is_empty());
    must(
        harness.ledger.resume(None, "token:ops", "go").await,
        "resume all",
    );
    must(
        harness
            .ledger
            .resume(Some("busy"), "token:ops", "done")
            .await,
        "resume",
    );
    assert_eq!(must(harness.ledger.claim("w", 20).await, "claim").len(), 10);
    let pauses = must(harness.ledger.history("pause", "busy").await, "history");
    assert_eq!(
        pauses
            .iter()
            .map(|h| (h.event.as_str(), h.actor.as_str()))
            .collect::<Vec<_>>(),
        [("paused", "token:ops"), ("resumed", "token:ops")]
    );
}
