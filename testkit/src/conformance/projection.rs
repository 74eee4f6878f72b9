//! Conformance: projection writes chunk rows and receipts under the lease, reads them back, and
//! reuses chunks by text hash within a dataset.

use receipts::model::ReceiptState;
use uuid::Uuid;

use super::{
    activate_test_generation, claim_one, lost, must, must_accept, put, rows, verified_receipt,
    Harness,
};

/// Chunks are found by text hash within a dataset, in revisions verified in the generation,
/// never across datasets and never in the asking revision: where a projection reuses a vector
/// instead of embedding.
pub async fn chunks_are_found_by_text_hash_within_a_dataset(harness: Harness) {
    let generation = activate_test_generation(&harness).await;
    let hash = |text: &str| receipts::ids::sha256_hex(text.as_bytes());
    let mut revisions = Vec::new();
    for (dataset, key, texts) in [
        ("docs", "a", ["shared", "only-a"]),
        ("docs", "b", ["only-b", "shared"]),
        ("notes", "c", ["shared", "only-c"]),
    ] {
        let accepted = must_accept(&harness, put(dataset, key, &texts.join(" "))).await;
        let (_, token) = claim_one(&harness, "w1").await;
        must(
            harness
                .ledger
                .write_chunks(&token, &generation.id, rows(&texts))
                .await,
            "write chunks",
        );
        for backend in [
            receipts::model::Backend::Relational,
            receipts::model::Backend::Vector,
        ] {
            must(
                harness
                    .ledger
                    .record_receipt(&token, verified_receipt(backend, &generation))
                    .await,
                "verified",
            );
        }
        revisions.push(accepted.source_revision_id);
    }
    // Rows of a revision whose vectors are not verified are no candidates.
    must_accept(&harness, put("docs", "d", "unverified only-d")).await;
    let (_, token) = claim_one(&harness, "w1").await;
    must(
        harness
            .ledger
            .write_chunks(&token, &generation.id, rows(&["unverified", "only-d"]))
            .await,
        "write chunks",
    );
    let asking = Uuid::now_v7();
    let found = must(
        harness
            .ledger
            .chunks_with_hashes(
                "docs",
                &generation.id,
                &[
                    hash("shared"),
                    hash("only-a"),
                    hash("only-c"),
                    hash("nowhere"),
                ],
                asking,
            )
            .await,
        "lookup",
    );
    let mut hashes: Vec<&str> = found.iter().map(|chunk| chunk.sha256.as_str()).collect();
    hashes.sort_unstable();
    hashes.dedup();
    let mut expected = vec![hash("shared"), hash("only-a")];
    expected.sort();
    assert_eq!(hashes, expected, "from docs only, verified only: {found:?}");
    let only_a: Vec<_> = found
        .iter()
        .filter(|chunk| chunk.sha256 == hash("only-a"))
        .map(|chunk| (chunk.revision_id, chunk.chunk_index))
        .collect();
    assert_eq!(only_a, [(revisions[0], 1)]);
    // Every holder of the text, newest first (b was accepted after a).
    let shared: Vec<_> = found
        .iter()
        .filter(|chunk| chunk.sha256 == hash("shared"))
        .map(|chunk| (chunk.revision_id, chunk.chunk_index))
        .collect();
    assert_eq!(shared, [(revisions[1], 1), (revisions[0], 0)], "{found:?}");
    // The asking revision's own rows never count, nor another generation's.
    let own = must(
        harness
            .ledger
            .chunks_with_hashes("docs", &generation.id, &[hash("only-a")], revisions[0])
            .await,
        "lookup",
    );
    assert!(own.is_empty(), "{own:?}");
    let elsewhere = must(
        harness
            .ledger
            .chunks_with_hashes("docs", "g-other", &[hash("shared")], asking)
            .await,
        "lookup",
    );
    assert!(elsewhere.is_empty());
    assert!(must(
        harness
            .ledger
            .chunks_with_hashes("docs", &generation.id, &[], asking)
            .await,
        "lookup"
    )
    .is_empty());
}

/// Chunk rows and receipts are written only under a live lease; the read-back sees exactly
/// what was written; a verified receipt supersedes the older revision's.
pub async fn projection_writes_are_fenced_and_read_back(harness: Harness) {
    let generation = activate_test_generation(&harness).await;
    let first = must_accept(&harness, put("docs", "a", "first text")).await;
    let (_, token) = claim_one(&harness, "w1").await;
    let written = rows(&["first", "text"]);
    must(
        harness
            .ledger
            .write_chunks(&token, &generation.id, written.clone())
            .await,
        "write chunks",
    );
    // Rewriting replaces the rows whole.
    must(
        harness
            .ledger
            .write_chunks(&token, &generation.id, written.clone())
            .await,
        "write chunks again",
    );
    let summary = must(
        harness
            .ledger
            .chunk_summary(first.source_revision_id, &generation.id)
            .await,
        "summary",
    );
    assert_eq!(
        summary,
        receipts::model::ChunkSummary::of(written.iter().map(|row| row.sha256.as_str()))
    );
    assert_eq!(summary.count, 2);
    assert_eq!(
        must(
            harness
                .ledger
                .chunks(first.source_revision_id, &generation.id)
                .await,
            "chunks"
        ),
        written
    );
    let verified = |backend| verified_receipt(backend, &generation);
    must(
        harness
            .ledger
            .record_receipt(&token, verified(receipts::model::Backend::Relational))
            .await,
        "receipt",
    );
    must(harness.ledger.complete(&token).await, "complete");
    // The completed job's lease no longer holds: late writes change nothing.
    lost(
        harness
            .ledger
            .write_chunks(&token, &generation.id, rows(&["late"]))
            .await,
    );
    lost(
        harness
            .ledger
            .record_receipt(&token, verified(receipts::model::Backend::Vector))
            .await,
    );
    assert_eq!(
        must(
            harness
                .ledger
                .chunk_summary(first.source_revision_id, &generation.id)
                .await,
            "summary"
        ),
        summary
    );
    let receipts = must(
        harness.ledger.receipts(first.projection_job_id).await,
        "receipts",
    );
    let states: Vec<_> = receipts.iter().map(|r| (r.backend, r.state)).collect();
    assert_eq!(
        states,
        [
            (receipts::model::Backend::Relational, ReceiptState::Verified),
            (receipts::model::Backend::Vector, ReceiptState::Pending)
        ]
    );
    // A newer revision verified in the same backend supersedes the older receipt.
    let second = must_accept(&harness, put("docs", "a", "second text")).await;
    let (_, token) = claim_one(&harness, "w2").await;
    must(
        harness
            .ledger
            .record_receipt(&token, verified(receipts::model::Backend::Relational))
            .await,
        "receipt",
    );
    let old = must(
        harness.ledger.receipts(first.projection_job_id).await,
        "receipts",
    );
    assert_eq!(old[0].state, ReceiptState::Superseded);
    let new = must(
        harness.ledger.receipts(second.projection_job_id).await,
        "receipts",
    );
    assert_eq!(new[0].state, ReceiptState::Verified);
    let trail = must(
        harness
            .ledger
            .history(
                "receipt",
                &format!("{}/relational", first.projection_job_id),
            )
            .await,
        "history",
    );
    let last = trail.last().expect("receipt history");
    assert_eq!(last.to.as_deref(), Some("superseded"));
    assert_eq!(last.actor, "w2");
}

/// A unit's ledger write ([`receipts::Projections::project_many`]): each job's chunk rows and
/// receipts are fenced by its own lease, in one call. A job whose lease no longer holds gets
/// `lease_lost` and changes nothing, and its neighbours are written all the same; the batch
/// read-back ([`receipts::Projections::chunk_summaries`]) answers each revision in order.
pub async fn unit_writes_are_fenced_one_job_at_a_time(harness: Harness) {
    let generation = activate_test_generation(&harness).await;
    let a = must_accept(&harness, put("docs", "unit-a", "alpha")).await;
    let b = must_accept(&harness, put("docs", "unit-b", "beta")).await;
    let c = must_accept(&harness, put("docs", "unit-c", "gamma")).await;
    let jobs = must(harness.ledger.claim("unit", 3).await, "claim");
    assert_eq!(jobs.len(), 3, "three claimable jobs");
    let token_of = |revision: Uuid| {
        let job = jobs
            .iter()
            .find(|job| job.revision_id == Some(revision))
            .expect("the revision's job was claimed");
        receipts::model::LeaseToken::of(job).expect("a claimed job holds a lease")
    };
    let (ta, tb, tc) = (
        token_of(a.source_revision_id),
        token_of(b.source_revision_id),
        token_of(c.source_revision_id),
    );
    // b's lease is lost before the unit writes: a newer revision supersedes its job.
    let b2 = must_accept(&harness, put("docs", "unit-b", "beta again")).await;
    let write = |token: &receipts::model::LeaseToken, texts: &[&str]| receipts::UnitWrite {
        lease: token.clone(),
        chunks: Some((generation.id.clone(), rows(texts))),
        receipts: vec![verified_receipt(
            receipts::model::Backend::Relational,
            &generation,
        )],
    };
    let results = harness
        .ledger
        .project_many(vec![
            write(&ta, &["alpha"]),
            write(&tb, &["beta", "stale"]),
            write(&tc, &["gamma", "two"]),
        ])
        .await;
    assert_eq!(results.len(), 3);
    let mut results = results.into_iter();
    must(results.next().expect("a's result"), "a's write");
    lost(results.next().expect("b's result"));
    must(results.next().expect("c's result"), "c's write");
    let summaries = must(
        harness
            .ledger
            .chunk_summaries(
                &[
                    c.source_revision_id,
                    b.source_revision_id,
                    a.source_revision_id,
                    b2.source_revision_id,
                ],
                &generation.id,
            )
            .await,
        "summaries",
    );
    let of = |texts: &[&str]| {
        receipts::model::ChunkSummary::of(rows(texts).iter().map(|row| row.sha256.as_str()))
    };
    assert_eq!(
        summaries,
        vec![of(&["gamma", "two"]), of(&[]), of(&["alpha"]), of(&[])],
        "each revision's rows, in the asked order; nothing for the fenced-out job"
    );
    for (acceptance, state) in [
        (&a, ReceiptState::Verified),
        // Superseded by b2's acceptance; the fenced-out write did not turn it verified.
        (&b, ReceiptState::Superseded),
        (&c, ReceiptState::Verified),
    ] {
        let receipts = must(
            harness.ledger.receipts(acceptance.projection_job_id).await,
            "receipts",
        );
        let relational = receipts
            .iter()
            .find(|receipt| receipt.backend == receipts::model::Backend::Relational)
            .map(|receipt| receipt.state);
        assert_eq!(relational, Some(state), "{receipts:?}");
    }
    // Completed, a unit member's lease no longer holds either.
    must(harness.ledger.complete(&ta).await, "complete a");
    let results = harness
        .ledger
        .project_many(vec![write(&ta, &["late"]), write(&tc, &["gamma", "two"])])
        .await;
    let mut results = results.into_iter();
    lost(results.next().expect("a's late result"));
    must(results.next().expect("c's rewrite"), "c's rewrite");
    assert_eq!(
        must(
            harness
                .ledger
                .chunk_summary(a.source_revision_id, &generation.id)
                .await,
            "a's rows"
        ),
        of(&["alpha"])
    );
}
