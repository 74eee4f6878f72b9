//! Conformance: acceptance records a revision, its job and receipts in one transaction; duplicates,
//! supersession, reverts, tombstones, blocks, faults and batches.

use receipts::faults::FaultPoint;
use receipts::model::{
    AcceptStatus, Acceptance, Backend, ContentBlock, JobKind, JobState, ReceiptState, Submission,
};
use receipts::LedgerError;

use super::{
    accept_one, delete, job_state, lexical_hits, must, must_accept, put, Harness, SECOND, START,
};

/// A receipt names the new head and a pending job with one pending receipt per backend.
pub async fn accept_records_revision_job_and_receipts(harness: Harness) {
    let receipt = must_accept(&harness, put("docs", "a.txt", "hello durable world")).await;
    assert!(receipt.accepted);
    assert_eq!(receipt.status, AcceptStatus::QueuedNotConfirmed);
    assert_eq!(receipt.byte_length, 19);
    assert_eq!(receipt.accepted_at, START + 1_000);
    assert_eq!(receipt.previous_revision_id, None);
    assert_eq!(
        receipt.content_sha256.as_deref(),
        Some(receipts::ids::sha256_hex(b"hello durable world").as_str())
    );
    let detail = harness
        .ledger
        .revision(receipt.source_revision_id)
        .await
        .expect("read")
        .expect("exists");
    assert!(detail.is_head);
    let job = detail.job.expect("job");
    assert_eq!(job.id, receipt.projection_job_id);
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(job.attempt, 0);
    assert!(!detail.receipts.is_empty());
    assert!(detail
        .receipts
        .iter()
        .all(|r| r.state == ReceiptState::Pending));
    let events: Vec<(String, Option<String>)> = detail
        .history
        .iter()
        .map(|h| (h.entity.clone(), h.to.clone()))
        .collect();
    assert!(events.contains(&(
        "source".to_owned(),
        Some(receipt.source_revision_id.to_string())
    )));
    assert!(events.contains(&("job".to_owned(), Some("pending".to_owned()))));
    assert_eq!(
        events
            .iter()
            .filter(|(entity, _)| entity == "receipt")
            .count(),
        detail.receipts.len()
    );
    assert!(detail.history.iter().all(|h| h.actor == "test:conformance"));
    let bytes = harness
        .ledger
        .content(&detail.revision.content_sha256.expect("sha"))
        .await
        .expect("read");
    assert_eq!(bytes.as_deref(), Some(&b"hello durable world"[..]));
}

/// The backends the graph check runs with.
pub const GRAPH_BACKENDS: &[Backend] = &[Backend::Relational, Backend::Vector, Backend::Graph];

/// With the graph backend, every accepted revision (content or tombstone) also gets a `graph`
/// job with its own `graph` receipt, so the graph retries and dies on its own schedule; the
/// answer and the revision's job stay the projection job; supersession and claims treat graph
/// jobs like any other. (Run with [`GRAPH_BACKENDS`].)
pub async fn graph_jobs_are_queued_beside_projection(harness: Harness) {
    let first = must_accept(&harness, put("docs", "a", "graph one")).await;
    let detail = must(
        harness.ledger.revision(first.source_revision_id).await,
        "read revision",
    )
    .expect("exists");
    let job = detail.job.expect("job");
    assert_eq!(
        (job.id, job.kind),
        (first.projection_job_id, JobKind::Project)
    );
    let mut backends: Vec<Backend> = detail.receipts.iter().map(|r| r.backend).collect();
    backends.sort_by_key(|backend| backend.as_str());
    assert_eq!(
        backends,
        [Backend::Graph, Backend::Relational, Backend::Vector]
    );
    let claimed = must(harness.ledger.claim("worker", 10).await, "claim");
    let mut kinds: Vec<JobKind> = claimed.iter().map(|job| job.kind).collect();
    kinds.sort_by_key(|kind| kind.as_str());
    assert_eq!(kinds, [JobKind::Graph, JobKind::Project]);
    let graph_job = claimed
        .iter()
        .find(|job| job.kind == JobKind::Graph)
        .expect("graph job");
    assert_eq!(graph_job.revision_id, Some(first.source_revision_id));
    let receipts = must(harness.ledger.receipts(graph_job.id).await, "receipts");
    assert_eq!(
        receipts.iter().map(|r| r.backend).collect::<Vec<_>>(),
        [Backend::Graph]
    );
    let projection_receipts = must(harness.ledger.receipts(job.id).await, "receipts");
    assert!(projection_receipts
        .iter()
        .all(|receipt| receipt.backend != Backend::Graph));

    // A duplicate answers with the projection job, not the graph job.
    let again = must_accept(&harness, put("docs", "a", "graph one")).await;
    assert_eq!(again.status, AcceptStatus::Duplicate);
    assert_eq!(again.projection_job_id, first.projection_job_id);

    // A new head supersedes both running jobs of the old one.
    must_accept(&harness, put("docs", "a", "graph two")).await;
    for id in [job.id, graph_job.id] {
        let state = must(harness.ledger.job(id).await, "job")
            .expect("exists")
            .state;
        assert_eq!(state, JobState::Superseded, "job {id}");
    }
    // A tombstone gets a graph job too.
    let gone = must_accept(&harness, delete("docs", "a")).await;
    let detail = must(
        harness.ledger.revision(gone.source_revision_id).await,
        "read",
    )
    .expect("exists");
    assert_eq!(detail.job.expect("job").kind, JobKind::Tombstone);
    assert!(detail.receipts.iter().any(|r| r.backend == Backend::Graph));
    let counts = must(harness.ledger.counts().await, "counts");
    assert_eq!(
        counts.jobs.get("pending").copied(),
        Some(2),
        "{:?}",
        counts.jobs
    );
}

/// Identical bytes to the current head create nothing.
pub async fn duplicate_creates_nothing(harness: Harness) {
    let first = must_accept(&harness, put("docs", "a.txt", "same bytes")).await;
    let before = harness.ledger.counts().await.expect("counts");
    let second = must_accept(&harness, put("docs", "a.txt", "same bytes")).await;
    assert_eq!(second.status, AcceptStatus::Duplicate);
    assert_eq!(second.source_revision_id, first.source_revision_id);
    assert_eq!(second.projection_job_id, first.projection_job_id);
    assert_eq!(second.accepted_at, first.accepted_at);
    assert_eq!(harness.ledger.counts().await.expect("counts"), before);
    // The same bytes under another key are a different source.
    let other = must_accept(&harness, put("docs", "b.txt", "same bytes")).await;
    assert_eq!(other.status, AcceptStatus::QueuedNotConfirmed);
    assert_ne!(other.source_revision_id, first.source_revision_id);
    let counts = harness.ledger.counts().await.expect("counts");
    assert_eq!(
        counts.contents, before.contents,
        "content is retained once per sha256"
    );
}

/// A new head supersedes the previous head's unfinished job and receipts.
pub async fn new_head_supersedes_previous_job(harness: Harness) {
    let first = must_accept(&harness, put("docs", "a.txt", "version one")).await;
    let second = must_accept(&harness, put("docs", "a.txt", "version two")).await;
    assert_eq!(second.previous_revision_id, Some(first.source_revision_id));
    assert_eq!(
        job_state(&harness, first.source_revision_id).await,
        JobState::Superseded
    );
    assert_eq!(
        job_state(&harness, second.source_revision_id).await,
        JobState::Pending
    );
    let old = harness
        .ledger
        .revision(first.source_revision_id)
        .await
        .expect("read")
        .expect("exists");
    assert!(!old.is_head);
    assert!(old
        .receipts
        .iter()
        .all(|r| r.state == ReceiptState::Superseded));
    let job_history = harness
        .ledger
        .history("job", &first.projection_job_id.to_string())
        .await
        .expect("history");
    let last = job_history.last().expect("job history");
    assert_eq!(last.from.as_deref(), Some("pending"));
    assert_eq!(last.to.as_deref(), Some("superseded"));
    assert_eq!(
        last.cause,
        format!("superseded_by:{}", second.source_revision_id)
    );
    let source = harness
        .ledger
        .source("docs", "a.txt")
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(source.head.id, second.source_revision_id);
    assert_eq!(source.revisions.len(), 2);
    assert_eq!(source.head_history.len(), 2);
}

/// Re-accepting an earlier revision's content makes that revision head again.
pub async fn revert_reactivates_earlier_revision(harness: Harness) {
    let first = must_accept(&harness, put("docs", "a.txt", "original")).await;
    let second = must_accept(&harness, put("docs", "a.txt", "changed")).await;
    let third = must_accept(&harness, put("docs", "a.txt", "original")).await;
    assert_eq!(third.status, AcceptStatus::QueuedNotConfirmed);
    assert_eq!(third.source_revision_id, first.source_revision_id);
    assert_eq!(third.previous_revision_id, Some(second.source_revision_id));
    assert_ne!(
        third.projection_job_id, first.projection_job_id,
        "a reverted head gets a new job"
    );
    assert_eq!(
        job_state(&harness, second.source_revision_id).await,
        JobState::Superseded
    );
    let source = harness
        .ledger
        .source("docs", "a.txt")
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(source.head.id, first.source_revision_id);
    assert_eq!(
        source.revisions.len(),
        2,
        "no look-alike revision is formed"
    );
    let moves: Vec<_> = source
        .head_history
        .iter()
        .map(|h| (h.to.clone(), h.cause.clone()))
        .collect();
    assert_eq!(moves.len(), 3);
    assert_eq!(
        moves[2],
        (
            Some(first.source_revision_id.to_string()),
            "reverted_to_earlier_revision".to_owned()
        )
    );
}

/// The ledger-wide counts follow acceptance exactly: sources (deleted ones counted apart),
/// revisions, retained contents once per distinct content, their bytes, history rows.
pub async fn counts_follow_acceptance(harness: Harness) {
    let empty = harness.ledger.counts().await.expect("counts");
    assert_eq!(
        (
            empty.sources,
            empty.deleted_sources,
            empty.revisions,
            empty.contents
        ),
        (0, 0, 0, 0)
    );
    assert_eq!(empty.retained_bytes, 0);
    assert_eq!(harness.ledger.datasets().await.expect("datasets"), vec![]);
    must_accept(&harness, put("docs", "a", "alpha")).await;
    must_accept(&harness, put("docs", "b", "alpha")).await; // the same bytes: retained once
    harness.clock.advance(SECOND);
    let newest_docs = must_accept(&harness, put("docs", "a", "alpha two")).await;
    must_accept(&harness, put("notes", "c", "gamma")).await;
    let before_delete = harness.ledger.counts().await.expect("counts");
    harness.clock.advance(SECOND);
    let deleted = must_accept(&harness, delete("notes", "c")).await;
    let counts = harness.ledger.counts().await.expect("counts");
    let summary =
        |dataset: &str, sources, deleted_sources, last_accepted_at| receipts::DatasetSummary {
            dataset: dataset.to_owned(),
            sources,
            deleted_sources,
            last_accepted_at,
        };
    assert_eq!(
        harness.ledger.datasets().await.expect("datasets"),
        vec![
            summary("docs", 2, 0, newest_docs.accepted_at),
            summary("notes", 1, 1, deleted.accepted_at),
        ],
        "datasets by name, counted by their heads"
    );
    assert_eq!(counts.sources, 3, "{counts:?}");
    assert_eq!(counts.deleted_sources, 1, "{counts:?}");
    assert_eq!(
        counts.revisions, 5,
        "four contents and one tombstone: {counts:?}"
    );
    assert_eq!(counts.contents, 3, "alpha, alpha two, gamma: {counts:?}");
    assert_eq!(
        counts.retained_bytes,
        ("alpha".len() + "alpha two".len() + "gamma".len()) as i64,
        "{counts:?}"
    );
    assert!(
        counts.history > before_delete.history && before_delete.history > empty.history,
        "history grows with every change: {empty:?} {before_delete:?} {counts:?}"
    );
}

/// Deleting a source makes a tombstone head and removes it from lexical search.
pub async fn tombstone_deletes_source(harness: Harness) {
    let first = must_accept(&harness, put("docs", "a.txt", "zebra crossing")).await;
    assert_eq!(lexical_hits(&harness, "zebra").await, 1);
    let tombstone = must_accept(&harness, delete("docs", "a.txt")).await;
    assert!(tombstone.tombstone);
    assert_eq!(tombstone.content_sha256, None);
    assert_eq!(
        tombstone.previous_revision_id,
        Some(first.source_revision_id)
    );
    assert_eq!(
        job_state(&harness, first.source_revision_id).await,
        JobState::Superseded
    );
    assert!(lexical_hits(&harness, "zebra").await == 0);
    let source = harness
        .ledger
        .source("docs", "a.txt")
        .await
        .expect("read")
        .expect("exists");
    assert!(source.deleted);
    assert_eq!(source.head.reason.as_deref(), Some("test"));
    // Deleting again is idempotent.
    let again = must_accept(&harness, delete("docs", "a.txt")).await;
    assert_eq!(again.status, AcceptStatus::Duplicate);
    assert_eq!(again.source_revision_id, tombstone.source_revision_id);
    // Deleting a missing source is refused.
    match accept_one(&harness, delete("docs", "missing.txt")).await {
        Err(LedgerError::SourceNotFound { .. }) => {}
        other => panic!("expected source_not_found, got {other:?}"),
    }
    // The old content can come back; its revision becomes head again.
    let back = must_accept(&harness, put("docs", "a.txt", "zebra crossing")).await;
    assert_eq!(back.source_revision_id, first.source_revision_id);
    assert_eq!(lexical_hits(&harness, "zebra").await, 1);
}

/// Blocked content is refused in its dataset only, and the block is in history.
pub async fn blocked_content_is_refused(harness: Harness) {
    let sha = receipts::ids::sha256_hex(b"rejected claim");
    let block = ContentBlock {
        dataset: "docs".to_owned(),
        sha256: sha.clone(),
        reason: "retracted by curator".to_owned(),
        actor: "token:curator".to_owned(),
    };
    harness
        .ledger
        .block_content(block.clone())
        .await
        .expect("block");
    assert_eq!(
        harness
            .ledger
            .content_block("docs", &sha)
            .await
            .expect("read"),
        Some(block)
    );
    let before = harness.ledger.counts().await.expect("counts");
    match accept_one(&harness, put("docs", "new-key", "rejected claim")).await {
        Err(LedgerError::ContentBlocked { sha256, reason, .. }) => {
            assert_eq!(sha256, sha);
            assert_eq!(reason, "retracted by curator");
        }
        other => panic!("expected content_blocked, got {other:?}"),
    }
    assert_eq!(harness.ledger.counts().await.expect("counts"), before);
    must_accept(&harness, put("other", "new-key", "rejected claim")).await;
    let history = harness
        .ledger
        .history("block", &format!("docs/{sha}"))
        .await
        .expect("history");
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].actor, "token:curator");
    assert_eq!(history[0].cause, "retracted by curator");
}

/// Lexical search sees current heads only, filtered by dataset.
pub async fn lexical_index_holds_current_heads_only(harness: Harness) {
    let first = must_accept(&harness, put("docs", "a.txt", "alpha bravo")).await;
    let second = must_accept(&harness, put("docs", "a.txt", "charlie delta")).await;
    must_accept(&harness, put("notes", "n.txt", "charlie echo")).await;
    assert!(lexical_hits(&harness, "alpha").await == 0);
    let hits = harness
        .ledger
        .lexical_search("charlie", &["docs".to_owned()], 10, None)
        .await
        .expect("search");
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].revision_id, second.source_revision_id);
    assert_ne!(hits[0].revision_id, first.source_revision_id);
    assert_eq!(lexical_hits(&harness, "charlie").await, 2);
    // Query syntax never reaches the index: the words are searched as words, and find their
    // document.
    must_accept(
        &harness,
        put("docs", "syntax.txt", "unbalanced quotes and parentheses"),
    )
    .await;
    let hits = harness
        .ledger
        .lexical_search("\"unbalanced AND (", &[], 10, None)
        .await
        .expect("a query with search syntax is searched as words");
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0].source_key, "syntax.txt");
}

/// A failure injected at any step of acceptance leaves no partial rows.
pub async fn faults_leave_no_partial_rows(harness: Harness) {
    let base = must_accept(&harness, put("docs", "a.txt", "stable base text")).await;
    for point in FaultPoint::ALL {
        for submission in [
            put("docs", "a.txt", &format!("failing update {point}")),
            delete("docs", "a.txt"),
        ] {
            let before = harness.ledger.counts().await.expect("counts");
            harness.faults.arm(point);
            match accept_one(&harness, submission).await {
                Err(LedgerError::Injected(fired)) => assert_eq!(fired, point),
                other => panic!("expected an injected fault at {point}, got {other:?}"),
            }
            assert_eq!(
                harness.ledger.counts().await.expect("counts"),
                before,
                "partial rows after {point}"
            );
            let source = harness
                .ledger
                .source("docs", "a.txt")
                .await
                .expect("read")
                .expect("exists");
            assert_eq!(
                source.head.id, base.source_revision_id,
                "head moved after {point}"
            );
            assert_eq!(
                job_state(&harness, base.source_revision_id).await,
                JobState::Pending
            );
            assert_eq!(lexical_hits(&harness, "stable").await, 1);
            assert!(lexical_hits(&harness, "failing").await == 0);
        }
    }
    // The ledger still works afterwards.
    must_accept(&harness, put("docs", "a.txt", "after the faults")).await;
}

/// One refused item in a batch does not fail the others.
pub async fn batch_items_are_independent(harness: Harness) {
    harness.clock.advance(1_000);
    let results = harness
        .ledger
        .accept(vec![
            put("docs", "1", "one"),
            put("", "2", "bad dataset"),
            put("docs", "3", "three"),
            put("docs", "4", ""),
        ])
        .await;
    assert_eq!(results.len(), 4);
    assert!(results[0].is_ok());
    assert_eq!(
        results[1].as_ref().err().map(LedgerError::code),
        Some("invalid_dataset")
    );
    assert!(results[2].is_ok());
    assert_eq!(
        results[3].as_ref().err().map(LedgerError::code),
        Some("empty_content")
    );
    assert_eq!(harness.ledger.counts().await.expect("counts").sources, 2);
}

/// A large batch (the PostgreSQL ledger commits one of 512 items or more in parts, side by
/// side) keeps each source's items in order: 1,200 items over 400 sources, three each, spread
/// through the batch. Every source's three receipts chain in batch order, and its head is the
/// last one.
pub async fn a_large_batch_keeps_each_sources_order(harness: Harness) {
    harness.clock.advance(1_000);
    let items: Vec<Submission> = (0..1200)
        .map(|n| {
            let source = n % 400;
            put(
                "docs",
                &format!("s{source}"),
                &format!("round {} of s{source}", n / 400),
            )
        })
        .collect();
    let results = harness.ledger.accept(items).await;
    assert_eq!(results.len(), 1200);
    let receipts: Vec<Acceptance> = results
        .into_iter()
        .map(|result| result.expect("accepted"))
        .collect();
    for source in 0..400 {
        let chain = [
            &receipts[source],
            &receipts[source + 400],
            &receipts[source + 800],
        ];
        assert_eq!(chain[0].previous_revision_id, None, "s{source}");
        assert_eq!(
            chain[1].previous_revision_id,
            Some(chain[0].source_revision_id),
            "s{source}"
        );
        assert_eq!(
            chain[2].previous_revision_id,
            Some(chain[1].source_revision_id),
            "s{source}"
        );
    }
    for source in [0, 199, 399] {
        let view = harness
            .ledger
            .source("docs", &format!("s{source}"))
            .await
            .expect("read")
            .expect("source");
        assert_eq!(view.head.id, receipts[source + 800].source_revision_id);
        assert_eq!(view.revisions.len(), 3);
    }
    assert_eq!(harness.ledger.counts().await.expect("counts").sources, 400);
}

/// Concurrent acceptances all succeed and each gets its own revision and job.
pub async fn concurrent_acceptances_are_all_durable(harness: Harness) {
    let mut tasks = Vec::new();
    for task in 0..16 {
        let ledger = harness.ledger.clone();
        tasks.push(tokio::spawn(async move {
            let mut receipts = Vec::new();
            for item in 0..20 {
                let mut result = ledger
                    .accept(vec![put(
                        "docs",
                        &format!("{task}/{item}"),
                        &format!("doc {task} {item}"),
                    )])
                    .await;
                receipts.push(result.pop().expect("one result").expect("accepted"));
            }
            receipts
        }));
    }
    let mut ids = std::collections::HashSet::new();
    for task in tasks {
        for receipt in task.await.expect("task") {
            assert!(ids.insert(receipt.projection_job_id));
        }
    }
    assert_eq!(ids.len(), 320);
    let counts = harness.ledger.counts().await.expect("counts");
    assert_eq!(counts.sources, 320);
    assert_eq!(counts.jobs.get("pending"), Some(&320));
}

/// A dataset's heads, listed under a key prefix in byte order, paged by cursor, tombstones
/// marked; another dataset's sources never listed.
pub async fn sources_are_listed_by_prefix_in_byte_order(harness: Harness) {
    let ledger = &harness.ledger;
    for key in [
        "docs/b.md",
        "docs/a.md",
        "docs/é.md",
        "docs/Z.md",
        "docsx",
        "other/a.md",
    ] {
        must_accept(&harness, put("set", key, &format!("text of {key}"))).await;
    }
    must_accept(&harness, put("elsewhere", "docs/a.md", "not this one")).await;
    let deleted = must_accept(&harness, delete("set", "docs/b.md")).await;
    let keys = |listing: &[receipts::SourceListing]| {
        listing
            .iter()
            .map(|head| head.source_key.clone())
            .collect::<Vec<_>>()
    };
    let all = must(ledger.list_sources("set", "docs/", None, 100).await, "list");
    assert_eq!(
        keys(&all),
        ["docs/Z.md", "docs/a.md", "docs/b.md", "docs/é.md"],
        "byte order: upper case first, then lower, then what UTF-8 encodes above ASCII"
    );
    let b = &all[2];
    assert!(b.tombstone && b.content_sha256.is_none());
    assert_eq!(b.head_revision_id, deleted.source_revision_id);
    let a = &all[1];
    assert_eq!(
        a.content_sha256.as_deref(),
        Some(receipts::ids::sha256_hex(b"text of docs/a.md").as_str())
    );
    assert_eq!(a.byte_length, "text of docs/a.md".len() as i64);
    // Paged by cursor: two at a time, then from after the last key.
    let first = must(ledger.list_sources("set", "docs/", None, 2).await, "page");
    let second = must(
        ledger
            .list_sources("set", "docs/", Some("docs/a.md"), 2)
            .await,
        "page",
    );
    assert_eq!(keys(&first), ["docs/Z.md", "docs/a.md"]);
    assert_eq!(keys(&second), ["docs/b.md", "docs/é.md"]);
    let everything = must(ledger.list_sources("set", "", None, 100).await, "list");
    assert_eq!(everything.len(), 6, "an empty prefix lists the dataset");
    assert!(must(ledger.list_sources("none", "", None, 10).await, "list").is_empty());
    // A prefix that is a pattern to SQL is a plain prefix here.
    assert!(must(ledger.list_sources("set", "docs%", None, 10).await, "list").is_empty());
}
