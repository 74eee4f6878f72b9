//! Conformance: hits bind to current, searchable revisions only, and lexical search ends at its
//! deadline.

use receipts::faults::FaultPoint;
use receipts::model::{LeaseToken, ReceiptState};
use receipts::LedgerError;
use uuid::Uuid;

use super::{
    activate_test_generation, claimed_token, delete, lexical_hits, must, must_accept, put, rows,
    searchable, verified_receipt, Harness,
};

/// Binding a hit tells current from superseded and deleted revisions, and vector-searchable
/// (relational and vector receipts verified in the active generation) from pending.
pub async fn hits_bind_to_current_searchable_revisions(harness: Harness) {
    use receipts::model::{Backend, HitRef};
    let generation = activate_test_generation(&harness).await;
    // Project `old` fully, then `new` one receipt at a time: searchable needs both receipts
    // verified in the active generation, and a newer verified revision supersedes the older.
    let old = must_accept(&harness, put("docs", "a", "old text")).await;
    let old_token = claimed_token(&harness, old.source_revision_id).await;
    let verify = |token: &LeaseToken, backend| {
        let (ledger, token) = (harness.ledger.clone(), token.clone());
        let update = verified_receipt(backend, &generation);
        async move { must(ledger.record_receipt(&token, update).await, "receipt") }
    };
    let write = |token: &LeaseToken, text: &'static str| {
        let (ledger, token, generation) =
            (harness.ledger.clone(), token.clone(), generation.id.clone());
        async move {
            must(
                ledger
                    .write_chunks(&token, &generation, rows(&[text]))
                    .await,
                "write chunks",
            )
        }
    };
    write(&old_token, "old text").await;
    verify(&old_token, Backend::Relational).await;
    verify(&old_token, Backend::Vector).await;
    assert!(searchable(&harness, old.source_revision_id).await);
    let new = must_accept(&harness, put("docs", "a", "new text")).await;
    let gone = must_accept(&harness, put("docs", "b", "deleted soon")).await;
    must_accept(&harness, delete("docs", "b")).await;
    let pending = must_accept(&harness, put("notes", "c", "not projected")).await;
    let new_token = claimed_token(&harness, new.source_revision_id).await;
    write(&new_token, "new text").await;
    verify(&new_token, Backend::Relational).await;
    assert!(
        !searchable(&harness, new.source_revision_id).await,
        "relational alone is not vector-searchable"
    );
    assert!(
        !searchable(&harness, old.source_revision_id).await,
        "the newer revision's verified relational receipt supersedes the old one's"
    );
    verify(&new_token, Backend::Vector).await;
    assert!(searchable(&harness, new.source_revision_id).await);
    let asked = [
        HitRef {
            revision_id: new.source_revision_id,
            chunk_index: Some(0),
        },
        HitRef {
            revision_id: old.source_revision_id,
            chunk_index: Some(0),
        },
        HitRef {
            revision_id: gone.source_revision_id,
            chunk_index: None,
        },
        HitRef {
            revision_id: Uuid::now_v7(),
            chunk_index: None,
        },
        HitRef {
            revision_id: pending.source_revision_id,
            chunk_index: None,
        },
        HitRef {
            revision_id: new.source_revision_id,
            chunk_index: Some(5),
        },
    ];
    let bound = must(
        harness.ledger.bind_hits(&asked, &generation.id).await,
        "bind",
    );
    let summary: Vec<_> = bound
        .iter()
        .map(|b| (b.hit, b.current, b.vector_searchable, b.chunk_text.clone()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (asked[0], true, true, Some("new text".to_owned())),
            (asked[1], false, false, Some("old text".to_owned())),
            (asked[2], false, false, None),
            (asked[4], true, false, None),
            (asked[5], true, true, None),
        ],
        "unknown revisions are left out; the rest keep the order asked"
    );
    assert_eq!(bound[3].dataset, "notes");
    assert_eq!(bound[3].source_key, "c");
    assert_eq!(
        (bound[0].accepted_at, bound[3].accepted_at),
        (new.accepted_at, pending.accepted_at),
        "every bound hit says when its revision was accepted"
    );
    let submitter = put("docs", "a", "x").actor;
    assert!(bound.iter().all(|b| b.actor == submitter), "and by whom");
    assert!(must(
        harness.ledger.bind_hits(&[], &generation.id).await,
        "bind nothing"
    )
    .is_empty());
    // A receipt that leaves `verified` takes the revision out at once.
    let failed = receipts::model::ReceiptUpdate {
        state: ReceiptState::Failed,
        cause: "read-back mismatch".to_owned(),
        ..verified_receipt(Backend::Vector, &generation)
    };
    must(
        harness.ledger.record_receipt(&new_token, failed).await,
        "receipt",
    );
    assert!(!searchable(&harness, new.source_revision_id).await);
}

/// A lexical search with a deadline ends at the deadline, with real SQLite work interrupted
/// (not abandoned), and leaves its connection usable.
pub async fn lexical_search_ends_at_its_deadline(harness: Harness) {
    must_accept(&harness, put("docs", "a", "zulu yankee")).await;
    harness.faults.arm(FaultPoint::SlowLexical);
    let started = std::time::Instant::now();
    let deadline = started + std::time::Duration::from_millis(150);
    match harness
        .ledger
        .lexical_search("zulu", &[], 10, Some(deadline))
        .await
    {
        Err(error @ LedgerError::DeadlineExceeded(_)) => {
            assert_eq!(error.code(), "deadline_exceeded");
            assert_eq!(error.http_status(), 504);
        }
        other => panic!("expected deadline_exceeded, got {other:?}"),
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed < std::time::Duration::from_secs(5),
        "the interrupted query ran for {elapsed:?}"
    );
    // Every pooled connection still answers (no deadline handler left behind).
    for _ in 0..8 {
        assert_eq!(lexical_hits(&harness, "zulu").await, 1);
    }
    let far = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let hits = must(
        harness
            .ledger
            .lexical_search("yankee", &[], 10, Some(far))
            .await,
        "search with a far deadline",
    );
    assert_eq!(hits.len(), 1);
}
