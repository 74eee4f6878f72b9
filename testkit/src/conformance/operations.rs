//! Conformance: operators read jobs, activity and the job event stream.

use receipts::clock::Clock;
use receipts::model::JobState;
use receipts::LedgerError;

use super::{claim_one, job_of, must, must_accept, put, retryable, Harness, SECOND};

/// Operator reads: stages, each run's error in history, jobs by filter, the last hour's
/// activity and latencies, and the job event stream.
pub async fn operations_read_jobs_activity_and_events(harness: Harness) {
    use receipts::operations::{JobFilter, JobOrder};
    let ledger = &harness.ledger;
    let a = must_accept(&harness, put("docs", "a.txt", "alpha")).await;
    must_accept(&harness, put("docs", "b.txt", "bravo")).await;
    must_accept(&harness, put("other", "c.txt", "charlie")).await;
    harness.clock.advance(2 * SECOND);
    let first_claim_at = harness.clock.now_micros();
    let (first, token) = claim_one(&harness, "host-1:7:w").await;
    let beat = must(ledger.progress(&token, "chunking").await, "progress");
    assert!(!beat.cancel_requested);
    let running = job_of(&harness, first.id).await;
    assert_eq!(running.stage.as_deref(), Some("chunking"));
    assert_eq!(running.stage_at, Some(harness.clock.now_micros()));
    assert!(matches!(
        ledger.progress(&token, "Bad\nStage").await,
        Err(LedgerError::Invalid { .. })
    ));
    must(ledger.fail(&token, retryable("boom", None)).await, "fail");
    let failed = job_of(&harness, first.id).await;
    assert_eq!(failed.stage, None, "a run's stage ends with the run");
    let history = must(
        ledger.history("job", &first.id.to_string()).await,
        "history",
    );
    let last = history.last().expect("history");
    assert_eq!(last.to.as_deref(), Some("retry_wait"));
    assert_eq!(last.error_code.as_deref(), Some("boom"));
    assert_eq!(last.error_message.as_deref(), Some("boom happened"));
    assert_eq!(last.stage.as_deref(), Some("chunking"));
    assert!(
        history[..history.len() - 1]
            .iter()
            .all(|h| h.error_code.is_none()),
        "only a run that ended in an error carries one"
    );
    harness.clock.advance(SECOND);
    let second_claim_at = harness.clock.now_micros();
    let (second, token) = claim_one(&harness, "host-2:8:w").await;
    harness.clock.advance(SECOND);
    let completed_at = harness.clock.now_micros();
    must(ledger.complete(&token).await, "complete");
    let completed_history = must(
        ledger.history("job", &second.id.to_string()).await,
        "history",
    );
    assert!(completed_history.iter().all(|h| h.error_code.is_none()));

    // Jobs by filter.
    let find = |filter: JobFilter| async move {
        must(
            ledger
                .find_jobs(&JobFilter {
                    limit: 10,
                    ..filter
                })
                .await,
            "find",
        )
    };
    let retrying = find(JobFilter {
        states: vec![JobState::RetryWait],
        ..JobFilter::default()
    })
    .await;
    assert_eq!(retrying.total, 1);
    assert_eq!(retrying.jobs[0].id, a.projection_job_id);
    let by_code = find(JobFilter {
        error_code: Some("boom".to_owned()),
        ..JobFilter::default()
    })
    .await;
    assert_eq!(by_code.total, 1);
    let other = find(JobFilter {
        dataset: Some("other".to_owned()),
        ..JobFilter::default()
    })
    .await;
    assert_eq!(other.jobs.len(), 1);
    assert_eq!(other.jobs[0].source_key, "c.txt");
    let allowed = find(JobFilter {
        allowed_datasets: Some(vec!["other".to_owned()]),
        ..JobFilter::default()
    })
    .await;
    assert_eq!(allowed.total, 1);
    let nothing = find(JobFilter {
        allowed_datasets: Some(Vec::new()),
        ..JobFilter::default()
    })
    .await;
    assert_eq!(nothing.total, 0, "an empty allowlist shows nothing");
    let by_text = find(JobFilter {
        text: Some("b.tx".to_owned()),
        ..JobFilter::default()
    })
    .await;
    assert_eq!(by_text.jobs.len(), 1);
    assert_eq!(by_text.jobs[0].id, second.id);
    let by_id = find(JobFilter {
        text: Some(second.id.to_string().to_uppercase()),
        ..JobFilter::default()
    })
    .await;
    assert_eq!(by_id.total, 1);
    let paged = must(
        ledger
            .find_jobs(&JobFilter {
                order: JobOrder::RunAt,
                limit: 2,
                offset: 2,
                ..JobFilter::default()
            })
            .await,
        "page",
    );
    assert_eq!((paged.total, paged.jobs.len()), (3, 1));
    // A caller reading as an identity sees the jobs of sources it may read, counted alike.
    let change = |dataset: &str, key: Option<&str>, reader: Option<&str>| {
        let change = match key {
            Some(key) => receipts::access::AccessChange::Source {
                dataset: dataset.to_owned(),
                source_key: key.to_owned(),
                readers: reader.map(|reader| vec![reader.to_owned()]),
                actor: "test:conformance".to_owned(),
                reason: "conformance".to_owned(),
            },
            None => receipts::access::AccessChange::Dataset {
                dataset: dataset.to_owned(),
                default: if reader.is_some() {
                    receipts::access::DefaultAccess::Nobody
                } else {
                    receipts::access::DefaultAccess::Everyone
                },
                actor: "test:conformance".to_owned(),
                reason: "conformance".to_owned(),
            },
        };
        async move { must(ledger.change_access(change).await, "change access") }
    };
    let as_names = |who: &str| Some(vec![who.to_owned(), "group:staff".to_owned()]);
    let b_key = by_text.jobs[0].source_key.clone();
    change("docs", Some(&b_key), Some("user:bob")).await;
    let alice = find(JobFilter {
        readable_by: as_names("user:alice"),
        ..JobFilter::default()
    })
    .await;
    assert_eq!(alice.total, 2, "alice does not see bob's job: {alice:?}");
    assert!(alice.jobs.iter().all(|job| job.source_key != b_key));
    let bob = find(JobFilter {
        readable_by: as_names("user:bob"),
        ..JobFilter::default()
    })
    .await;
    assert_eq!(bob.total, 3);
    change("other", None, Some("closed")).await;
    let closed = find(JobFilter {
        readable_by: as_names("user:alice"),
        ..JobFilter::default()
    })
    .await;
    assert_eq!(closed.total, 1, "a closed dataset hides what names nobody");
    let everything = find(JobFilter::default()).await;
    assert_eq!(
        everything.total, 3,
        "a caller without an identity sees every job"
    );
    change("other", None, None).await;
    change("docs", Some(&b_key), None).await;

    // Activity: claims, completions, retries per minute; depth; latencies; pauses.
    must(
        ledger.pause(Some("docs"), "token:ops", "window").await,
        "pause",
    );
    let activity = must(
        ledger.activity(std::time::Duration::from_secs(3600)).await,
        "activity",
    );
    assert_eq!(activity.minutes.len(), 60);
    let sum = |pick: fn(&receipts::operations::MinuteActivity) -> i64| -> i64 {
        activity.minutes.iter().map(pick).sum()
    };
    assert_eq!(sum(|m| m.claimed), 2);
    assert_eq!(sum(|m| m.completed), 1);
    assert_eq!(sum(|m| m.retried), 1);
    assert_eq!(activity.queue_depth, 2, "one retrying, one pending");
    assert_eq!(activity.minutes.last().map(|m| m.queue_depth), Some(2));
    assert_eq!(activity.minutes.first().map(|m| m.queue_depth), Some(0));
    assert_eq!(activity.running, 0);
    assert_eq!(activity.enqueue_to_start.count, 2);
    let ms = |micros: i64| Some(micros as f64 / 1000.0);
    assert_eq!(
        activity.enqueue_to_start.p50_ms,
        ms(first_claim_at - first.created_at)
    );
    assert_eq!(
        activity.enqueue_to_start.p99_ms,
        ms(second_claim_at - second.created_at)
    );
    assert_eq!(activity.accepted_to_searchable.count, 1);
    let accepted = must(
        ledger.revision(second.revision().expect("revision")).await,
        "revision",
    )
    .expect("revision")
    .revision
    .accepted_at;
    assert_eq!(
        second.created_at, accepted,
        "a job is created with its receipt"
    );
    assert_eq!(
        activity.accepted_to_searchable.p50_ms,
        ms(completed_at - accepted)
    );
    assert_eq!(activity.pauses.len(), 1);
    assert_eq!(activity.pauses[0].dataset.as_deref(), Some("docs"));

    // The event stream, in order, resumable from any position.
    let events = must(ledger.job_events(0, 100).await, "events");
    assert_eq!(
        events.len(),
        3 + 2 + 1 + 1,
        "3 created, 2 claims, 1 retry, 1 completion"
    );
    assert!(events.windows(2).all(|pair| pair[0].seq < pair[1].seq));
    assert_eq!(events.iter().filter(|e| e.first_claim).count(), 2);
    let retry = events
        .iter()
        .find(|e| e.to == JobState::RetryWait)
        .expect("retry event");
    assert_eq!(retry.error_code.as_deref(), Some("boom"));
    assert_eq!(retry.from, Some(JobState::Running));
    let later = must(ledger.job_events(events[4].seq, 100).await, "events");
    assert_eq!(later.len(), 2);
    assert!(must(ledger.last_history_seq().await, "seq") >= events[6].seq);
    assert_eq!(ledger.clock_now(), harness.clock.now_micros());
}
