//! Conformance: verify reads one bucket of the ledger (settled heads and what their receipts
//! promise, work in flight apart), passes move through one audited path, and a repair queues a
//! projection of the head only.

use receipts::model::{
    Backend, ChunkSummary, DriftKind, DriftRecord, DriftState, PassChange, PassState, ReceiptState,
    ReceiptUpdate, VerifyTier,
};
use receipts::verify::bucket;
use receipts::LedgerError;
use uuid::Uuid;

use super::{
    activate_test_generation, claimed_token, delete, must, must_accept, put, rows, Harness,
};

fn code<T: std::fmt::Debug>(result: receipts::Result<T>) -> String {
    match result {
        Err(error) => error.code().to_owned(),
        Ok(value) => panic!("expected an error, got {value:?}"),
    }
}

/// One bucket's ledger side: a projected head with its promises, a head in flight, a settled
/// tombstone (neither a head nor in flight, its revisions known); the bucket is the same as
/// `receipts::verify::bucket` computes.
pub async fn verify_reads_a_bucket_of_settled_heads(harness: Harness) {
    let generation = activate_test_generation(&harness).await;
    let done = must_accept(&harness, put("docs", "done.md", "first text")).await;
    let texts = ["alpha", "beta"];
    let token = claimed_token(&harness, done.source_revision_id).await;
    must(
        harness
            .ledger
            .write_chunks(&token, &generation.id, rows(&texts))
            .await,
        "chunks",
    );
    let summary = ChunkSummary::of(
        rows(&texts)
            .iter()
            .map(|row| row.sha256.clone())
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str),
    );
    for (backend, evidence) in [
        (
            Backend::Relational,
            serde_json::json!({"rows": 2, "checksum": summary.checksum}),
        ),
        (Backend::Vector, serde_json::json!({"points": 2})),
    ] {
        let update = ReceiptUpdate {
            backend,
            state: ReceiptState::Verified,
            evidence,
            cause: "verified: read back".to_owned(),
            generation: generation.id.clone(),
        };
        must(
            harness.ledger.record_receipt(&token, update).await,
            "receipt",
        );
    }
    must(harness.ledger.complete(&token).await, "complete");

    let ledger_side = must(
        harness
            .ledger
            .verify_bucket(&generation.id, bucket("docs", "done.md"))
            .await,
        "verify bucket",
    );
    let head = ledger_side
        .heads
        .iter()
        .find(|head| head.source_key == "done.md")
        .expect("the projected head is settled, in the bucket Rust computes");
    assert_eq!(head.revision_id, done.source_revision_id);
    assert_eq!(head.points, Some(2));
    assert_eq!(head.rows.as_ref().map(|r| r.count), Some(2));
    assert_eq!(
        head.rows.as_ref().map(|r| r.checksum.clone()),
        Some(summary.checksum.clone())
    );
    assert_eq!(head.rows_found, summary, "the rows the ledger holds now");
    assert_eq!(
        ledger_side.known.get(&done.source_revision_id),
        Some(&("docs".to_owned(), "done.md".to_owned()))
    );

    // A head whose job is pending is work in flight, never a promise.
    let pending = must_accept(&harness, put("docs", "pending.md", "not yet")).await;
    let ledger_side = must(
        harness
            .ledger
            .verify_bucket(&generation.id, bucket("docs", "pending.md"))
            .await,
        "verify bucket",
    );
    assert!(ledger_side
        .unsettled
        .contains(&("docs".to_owned(), "pending.md".to_owned())));
    assert!(ledger_side
        .heads
        .iter()
        .all(|head| head.revision_id != pending.source_revision_id));

    // A settled tombstone: projected, then deleted and the tombstone's job completed. It
    // promises no current point, so it is neither a settled head nor work in flight; its
    // revisions, the tombstone included, are known (a point of either is stale, not unknown).
    let live = must_accept(&harness, put("docs", "gone.md", "soon deleted")).await;
    let token = claimed_token(&harness, live.source_revision_id).await;
    must(harness.ledger.complete(&token).await, "complete");
    let tombstone = must_accept(&harness, delete("docs", "gone.md")).await;
    let token = claimed_token(&harness, tombstone.source_revision_id).await;
    for backend in [Backend::Relational, Backend::Vector] {
        let update = ReceiptUpdate {
            backend,
            state: ReceiptState::Verified,
            evidence: serde_json::json!({"current_points": 0}),
            cause: "verified: nothing current read back".to_owned(),
            generation: generation.id.clone(),
        };
        must(
            harness.ledger.record_receipt(&token, update).await,
            "tombstone receipt",
        );
    }
    must(
        harness.ledger.complete(&token).await,
        "complete the tombstone",
    );
    let ledger_side = must(
        harness
            .ledger
            .verify_bucket(&generation.id, bucket("docs", "gone.md"))
            .await,
        "verify bucket",
    );
    let gone = ("docs".to_owned(), "gone.md".to_owned());
    assert!(
        ledger_side
            .heads
            .iter()
            .all(|head| head.source_key != "gone.md"),
        "a settled tombstone promises no point: {ledger_side:?}"
    );
    assert!(
        !ledger_side.unsettled.contains(&gone),
        "a settled tombstone is not work in flight: {ledger_side:?}"
    );
    for revision in [live.source_revision_id, tombstone.source_revision_id] {
        assert_eq!(ledger_side.known.get(&revision), Some(&gone), "{revision}");
    }

    // Every bucket together holds each live source once; the settled tombstone in neither.
    let mut sources = 0;
    for each in 0..receipts::verify::BUCKETS {
        let side = must(
            harness.ledger.verify_bucket(&generation.id, each).await,
            "bucket",
        );
        sources += side.heads.len() + side.unsettled.len();
    }
    assert_eq!(sources, 2);
}

fn drift(pass_id: Uuid, revision_id: Uuid) -> DriftRecord {
    DriftRecord {
        id: Uuid::now_v7(),
        pass_id,
        kind: DriftKind::Missing,
        store: "vector".to_owned(),
        generation: String::new(),
        dataset: "docs".to_owned(),
        source_key: "a.md".to_owned(),
        revision_id,
        evidence: serde_json::json!({"expected_points": 2, "found_points": 0}),
        state: DriftState::Open,
        repair: None,
        found_at: 0,
        changed_at: 0,
    }
}

/// A pass starts once per tier and generation, moves one bucket at a time with its drift,
/// ends completed only after every bucket, and every change is in history.
pub async fn verify_passes_go_through_one_path(harness: Harness) {
    let generation = activate_test_generation(&harness).await;
    let start = |tier| PassChange::Start {
        tier,
        generation: generation.id.clone(),
        repair: false,
        actor: "test:operator".to_owned(),
        reason: "nightly".to_owned(),
    };
    let pass = must(
        harness.ledger.change_pass(start(VerifyTier::Counts)).await,
        "start",
    );
    assert_eq!((pass.state, pass.cursor), (PassState::Running, 0));
    let again = must(
        harness.ledger.change_pass(start(VerifyTier::Counts)).await,
        "again",
    );
    assert_eq!(
        again.id, pass.id,
        "one running pass per tier and generation"
    );
    let scrub = must(
        harness.ledger.change_pass(start(VerifyTier::Scrub)).await,
        "scrub",
    );
    assert_ne!(scrub.id, pass.id);
    assert_eq!(
        code(
            harness
                .ledger
                .change_pass(PassChange::Start {
                    tier: VerifyTier::Counts,
                    generation: "no-such-generation".to_owned(),
                    repair: false,
                    actor: "test".to_owned(),
                    reason: "test".to_owned(),
                })
                .await
        ),
        "generation_state"
    );

    let found = drift(pass.id, Uuid::now_v7());
    let advanced = must(
        harness
            .ledger
            .change_pass(PassChange::Advance {
                pass_id: pass.id,
                bucket: 0,
                skipped: 3,
                drift: vec![found.clone()],
            })
            .await,
        "advance",
    );
    assert_eq!(
        (advanced.cursor, advanced.buckets_checked, advanced.skipped),
        (1, 1, 3)
    );
    assert_eq!(advanced.drift.get("missing"), Some(&1));
    // Another process that advanced the same bucket again is refused: nothing is counted twice.
    let twice = harness
        .ledger
        .change_pass(PassChange::Advance {
            pass_id: pass.id,
            bucket: 0,
            skipped: 0,
            drift: vec![],
        })
        .await;
    assert_eq!(code(twice), "verify_state");
    let early = harness
        .ledger
        .change_pass(PassChange::Finish {
            pass_id: pass.id,
            state: PassState::Completed,
            actor: "test".to_owned(),
            reason: "done".to_owned(),
        })
        .await;
    assert_eq!(
        code(early),
        "verify_state",
        "completed only after every bucket"
    );

    must(
        harness
            .ledger
            .change_pass(PassChange::Repair {
                drift_id: found.id,
                state: DriftState::Repairing,
                repair: "queued projection job x".to_owned(),
                actor: "test:verify".to_owned(),
            })
            .await,
        "repair",
    );
    let recorded = must(harness.ledger.pass_drift(pass.id).await, "drift");
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].state, DriftState::Repairing);
    assert_eq!(recorded[0].generation, generation.id);
    assert_eq!(recorded[0].evidence, found.evidence);
    assert_eq!(
        recorded[0].repair.as_deref(),
        Some("queued projection job x")
    );

    let ended = must(
        harness
            .ledger
            .change_pass(PassChange::Finish {
                pass_id: pass.id,
                state: PassState::Abandoned,
                actor: "test:operator".to_owned(),
                reason: "stopped by hand".to_owned(),
            })
            .await,
        "abandon",
    );
    assert_eq!(ended.state, PassState::Abandoned);
    let history = must(
        harness.ledger.history("verify", &pass.id.to_string()).await,
        "history",
    );
    let states: Vec<(Option<String>, Option<String>, String)> = history
        .iter()
        .map(|entry| (entry.from.clone(), entry.to.clone(), entry.actor.clone()))
        .collect();
    assert_eq!(
        states,
        vec![
            (None, Some("running".into()), "test:operator".into()),
            (
                Some("running".into()),
                Some("abandoned".into()),
                "test:operator".into()
            ),
        ]
    );
    let drift_history = must(
        harness.ledger.history("drift", &found.id.to_string()).await,
        "drift history",
    );
    assert_eq!(drift_history.len(), 2, "{drift_history:?}");
    let passes = must(harness.ledger.verify_passes(10).await, "passes");
    assert_eq!(passes.len(), 2);
    // A new pass of the same tier may start once the last one ended.
    let next = must(
        harness.ledger.change_pass(start(VerifyTier::Counts)).await,
        "next",
    );
    assert_ne!(next.id, pass.id);
}

/// A repair queues a projection of the head in the generation, only while nothing else is in
/// flight for the source and only for the head.
pub async fn a_repair_reprojects_the_head_only(harness: Harness) {
    let generation = activate_test_generation(&harness).await;
    let first = must_accept(&harness, put("docs", "a.md", "one")).await;
    let token = claimed_token(&harness, first.source_revision_id).await;
    must(harness.ledger.complete(&token).await, "complete");
    let reproject = |revision| {
        let (ledger, generation) = (harness.ledger.clone(), generation.id.clone());
        async move {
            ledger
                .reproject(
                    "docs",
                    "a.md",
                    revision,
                    &generation,
                    "test:verify",
                    "missing points",
                )
                .await
        }
    };
    let job = must(reproject(first.source_revision_id).await, "reproject");
    assert_eq!(job.revision_id, Some(first.source_revision_id));
    assert_eq!(job.generation.as_deref(), Some(generation.id.as_str()));
    assert_eq!(job.state, receipts::model::JobState::Pending);
    assert!(job.change_cause.contains("missing points"));
    assert_eq!(
        code(reproject(first.source_revision_id).await),
        "repair_refused",
        "a job is in flight"
    );
    let claimed = must(harness.ledger.claim("w", 10).await, "claim");
    assert!(claimed.iter().any(|claimed| claimed.id == job.id));
    for claimed in &claimed {
        if let Some(token) = receipts::model::LeaseToken::of(claimed) {
            must(harness.ledger.complete(&token).await, "complete");
        }
    }
    must_accept(&harness, delete("docs", "a.md")).await;
    let refused = reproject(first.source_revision_id).await;
    assert!(matches!(
        refused,
        Err(LedgerError::Invalid {
            code: "repair_refused",
            ..
        })
    ));
}

/// After a restore no lease from before it counts: running jobs are pending again, their
/// worker is fenced out, and history records the restore.
pub async fn a_restore_voids_every_lease(harness: Harness) {
    activate_test_generation(&harness).await;
    let accepted = must_accept(&harness, put("docs", "a.md", "text")).await;
    let token = claimed_token(&harness, accepted.source_revision_id).await;
    let record = receipts::model::RestoreRecord {
        backup_id: "backup-1-abc".to_owned(),
        actor: "test:operator".to_owned(),
        cause: "restored from a test backup".to_owned(),
    };
    let voided = must(harness.ledger.record_restore(&record).await, "restore");
    assert_eq!(voided, 1);
    let lost = harness.ledger.complete(&token).await;
    assert!(
        matches!(lost, Err(LedgerError::LeaseLost { .. })),
        "a lease from before the restore cannot complete: {lost:?}"
    );
    let job = must(harness.ledger.job(token.job_id).await, "job").expect("job");
    assert_eq!(job.state, receipts::model::JobState::Pending);
    assert!(
        job.change_cause.contains("backup-1-abc"),
        "{}",
        job.change_cause
    );
    let history = must(
        harness.ledger.history("restore", "backup-1-abc").await,
        "history",
    );
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(history[0].actor, "test:operator");
    assert!(
        history[0].cause.contains("1 leases voided"),
        "{}",
        history[0].cause
    );
    // The job runs again under a new lease.
    let again = claimed_token(&harness, accepted.source_revision_id).await;
    must(harness.ledger.complete(&again).await, "complete");
}
