//! Conformance: erasure removes every trace of a source's revisions from the ledger, keeps
//! what another source shares, records the act (never the content), queues the store jobs, and
//! lets the source be ingested again as new.

use super::{
    activate_test_generation, claimed_token, job_of, lexical_hits, must, must_accept, put, rows,
    verified_receipt, Harness,
};
use receipts::model::{
    AcceptStatus, Backend, ErasureRequest, HitRef, JobKind, JobState, ReceiptState, ReceiptUpdate,
};

fn request(key: &str) -> ErasureRequest {
    ErasureRequest {
        dataset: "notes".to_owned(),
        source_key: key.to_owned(),
        actor: "token:legal".to_owned(),
        reason: "request 2026-117".to_owned(),
    }
}

/// Erasure of a source with two revisions, one sharing its bytes with another source.
pub async fn erasure_removes_every_trace(harness: Harness) {
    let generation = activate_test_generation(&harness).await;
    let first = must_accept(&harness, put("notes", "a", "zebra crossing alpha")).await;
    must_accept(&harness, put("notes", "b", "zebra crossing alpha")).await;
    let second = must_accept(&harness, put("notes", "a", "zebra crossing beta")).await;
    // Project a's head: chunk rows and verified receipts to erase.
    let token = claimed_token(&harness, second.source_revision_id).await;
    must(
        harness
            .ledger
            .write_chunks(&token, &generation.id, rows(&["zebra crossing beta"]))
            .await,
        "chunks",
    );
    for backend in [Backend::Relational, Backend::Vector] {
        must(
            harness
                .ledger
                .record_receipt(&token, verified_receipt(backend, &generation))
                .await,
            "receipt",
        );
    }
    must(harness.ledger.complete(&token).await, "complete");
    assert_eq!(lexical_hits(&harness, "beta").await, 1);

    harness.clock.advance(1_000);
    let erased = must(harness.ledger.erase(request("a")).await, "erase");
    assert!(erased.tombstone);
    assert_eq!(erased.status, AcceptStatus::QueuedNotConfirmed);
    // The source holds the erasure alone.
    let source = must(harness.ledger.source("notes", "a").await, "source").expect("source");
    assert_eq!(source.head.id, erased.source_revision_id);
    assert!(source.deleted);
    assert_eq!(source.revisions.len(), 1, "{:?}", source.revisions);
    for gone in [first.source_revision_id, second.source_revision_id] {
        assert!(must(harness.ledger.revision(gone).await, "revision").is_none());
        assert!(must(harness.ledger.chunks(gone, &generation.id).await, "chunks").is_empty());
    }
    // Bytes: beta's are gone; alpha's stay, since `b` holds the same content.
    let beta = second.content_sha256.clone().expect("sha");
    let alpha = first.content_sha256.clone().expect("sha");
    assert!(must(harness.ledger.content(&beta).await, "content").is_none());
    assert!(must(harness.ledger.content(&alpha).await, "content").is_some());
    assert_eq!(lexical_hits(&harness, "beta").await, 0);
    assert_eq!(lexical_hits(&harness, "alpha").await, 1, "b still matches");
    let bound = must(
        harness
            .ledger
            .bind_hits(
                &[HitRef {
                    revision_id: second.source_revision_id,
                    chunk_index: Some(0),
                }],
                &generation.id,
            )
            .await,
        "bind",
    );
    assert!(
        bound.is_empty(),
        "an erased revision still binds: {bound:?}"
    );
    // What was erased, read back.
    let erasure = must(
        harness.ledger.erasure(erased.source_revision_id).await,
        "erasure",
    )
    .expect("an erasure");
    assert_eq!(erasure.revisions_erased, 2);
    assert_eq!(erasure.contents_deleted, 1);
    assert_eq!(erasure.chunk_rows_deleted, 1);
    let mut hashes = vec![alpha.clone(), beta.clone()];
    hashes.sort();
    assert_eq!(erasure.content_sha256, hashes);
    assert_eq!(
        erasure.remaining,
        receipts::model::ErasureRemaining::default()
    );
    assert!(must(
        harness.ledger.erasure(first.source_revision_id).await,
        "none"
    )
    .is_none());
    // History: who, why, when and the hashes; never the text.
    let history = must(harness.ledger.history("source", "notes/a").await, "history");
    let event = history
        .iter()
        .find(|entry| entry.event == "erased")
        .expect("an erased event");
    assert_eq!(event.actor, "token:legal");
    assert!(event.cause.contains("request 2026-117") && event.cause.contains(&beta));
    assert!(history.iter().all(|entry| !entry.cause.contains("zebra")));
    // The stores' jobs: a tombstone job per live generation; its receipts can say `erased`.
    let job = job_of(&harness, erased.projection_job_id).await;
    assert_eq!(job.kind, JobKind::Tombstone);
    assert_eq!(job.generation.as_ref(), Some(&generation.id));
    let token = claimed_token(&harness, erased.source_revision_id).await;
    must(
        harness
            .ledger
            .record_receipt(
                &token,
                ReceiptUpdate {
                    state: ReceiptState::Erased,
                    cause: "erased: read back 0 points".to_owned(),
                    ..verified_receipt(Backend::Vector, &generation)
                },
            )
            .await,
        "erased receipt",
    );
    let receipts = must(harness.ledger.receipts(job.id).await, "receipts");
    assert!(receipts
        .iter()
        .any(|receipt| receipt.state == ReceiptState::Erased));
    // Unknown sources are refused, and an erased source is ingested again as new.
    assert_eq!(
        harness
            .ledger
            .erase(request("nobody"))
            .await
            .map_err(|error| error.code()),
        Err("source_not_found")
    );
    let again = must_accept(&harness, put("notes", "a", "zebra crossing beta")).await;
    assert_eq!(again.status, AcceptStatus::QueuedNotConfirmed);
    assert_eq!(again.previous_revision_id, Some(erased.source_revision_id));
    assert!(must(harness.ledger.content(&beta).await, "content").is_some());
    assert_eq!(lexical_hits(&harness, "beta").await, 1);
    // The erasure's job is not superseded by the new head: it still erases the stores.
    assert_eq!(job_of(&harness, job.id).await.state, JobState::Running);
    // A second erasure erases what came since; the first one's record stays.
    harness.clock.advance(1_000);
    let twice = must(harness.ledger.erase(request("a")).await, "erase again");
    let erasure = must(
        harness.ledger.erasure(twice.source_revision_id).await,
        "erasure",
    )
    .expect("an erasure");
    assert_eq!(erasure.revisions_erased, 1);
    assert_eq!(
        erasure.remaining,
        receipts::model::ErasureRemaining::default()
    );
    let source = must(harness.ledger.source("notes", "a").await, "source").expect("source");
    assert_eq!(
        source.revisions.len(),
        2,
        "both erasures: {:?}",
        source.revisions
    );
    assert!(must(
        harness.ledger.erasure(erased.source_revision_id).await,
        "first"
    )
    .is_some());
}
