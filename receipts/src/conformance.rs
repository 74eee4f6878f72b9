//! The ledger conformance suite: behaviour every [`Ledger`] implementation must show. An
//! implementation's tests call [`crate::ledger_conformance!`] with a factory that builds a
//! fresh [`Harness`]; the macro expands to one test per check.

use std::sync::Arc;

use uuid::Uuid;

use crate::auth::{NewToken, Scope};
use crate::clock::Clock;
use crate::clock::ManualClock;
use crate::faults::{FaultPlan, FaultPoint};
use crate::ledger::Ledger;
use crate::model::{
    AcceptStatus, Acceptance, Backend, Change, ContentBlock, Failure, FailureClass, Job, JobKind,
    JobState, LeaseToken, ReceiptState, Submission,
};
use crate::LedgerError;

/// A ledger under test with the clock and fault plan it was built with.
pub struct Harness {
    /// The ledger.
    pub ledger: Arc<dyn Ledger>,
    /// Its clock.
    pub clock: Arc<ManualClock>,
    /// Its fault plan.
    pub faults: Arc<FaultPlan>,
    /// Keeps temporary resources (directories, servers) alive.
    pub guard: Box<dyn std::any::Any + Send>,
}

/// Start of the manual clock in conformance runs (2026-01-01T00:00:00Z).
pub const START: i64 = 1_767_225_600_000_000;

/// A text submission.
pub fn put(dataset: &str, key: &str, text: &str) -> Submission {
    Submission::text(dataset, key, "test:conformance", text)
}

/// A deletion.
pub fn delete(dataset: &str, key: &str) -> Submission {
    Submission {
        dataset: dataset.to_owned(),
        source_key: key.to_owned(),
        actor: "test:conformance".to_owned(),
        change: Change::Delete {
            reason: Some("test".to_owned()),
        },
    }
}

async fn accept_one(harness: &Harness, submission: Submission) -> crate::Result<Acceptance> {
    harness.clock.advance(1_000);
    let mut results = harness.ledger.accept(vec![submission]).await;
    results
        .pop()
        .unwrap_or_else(|| Err(LedgerError::Unavailable("no result".to_owned())))
}

async fn must_accept(harness: &Harness, submission: Submission) -> Acceptance {
    match accept_one(harness, submission).await {
        Ok(acceptance) => acceptance,
        Err(error) => panic!("acceptance failed: {error}"),
    }
}

async fn lexical(harness: &Harness, query: &str) -> Vec<crate::LexicalHit> {
    must(
        harness.ledger.lexical_search(query, &[], 10, None).await,
        "lexical search",
    )
}

async fn lexical_hits(harness: &Harness, query: &str) -> usize {
    lexical(harness, query).await.len()
}

async fn job_state(harness: &Harness, revision: Uuid) -> JobState {
    let detail = harness
        .ledger
        .revision(revision)
        .await
        .expect("read revision")
        .expect("revision exists");
    detail.job.expect("revision has a job").state
}

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
        Some(crate::ids::sha256_hex(b"hello durable world").as_str())
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
    assert_eq!(graph_job.revision_id, first.source_revision_id);
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
    must_accept(&harness, put("docs", "a", "alpha")).await;
    must_accept(&harness, put("docs", "b", "alpha")).await; // the same bytes: retained once
    must_accept(&harness, put("docs", "a", "alpha two")).await;
    must_accept(&harness, put("notes", "c", "gamma")).await;
    let before_delete = harness.ledger.counts().await.expect("counts");
    must_accept(&harness, delete("notes", "c")).await;
    let counts = harness.ledger.counts().await.expect("counts");
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
    let sha = crate::ids::sha256_hex(b"rejected claim");
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

/// Tokens authenticate by secret and carry their scopes and datasets.
pub async fn tokens_authenticate(harness: Harness) {
    let created = harness
        .ledger
        .create_token(NewToken {
            name: "ingest-bot".to_owned(),
            scopes: vec![Scope::Ingest],
            datasets: Some(vec!["docs".to_owned()]),
            created_by: "test".to_owned(),
            expires_at: None,
        })
        .await
        .expect("create");
    let principal = harness
        .ledger
        .authenticate(&created.secret)
        .await
        .expect("auth")
        .expect("known");
    assert_eq!(principal.name, "ingest-bot");
    assert!(principal.has(Scope::Ingest));
    assert!(!principal.has(Scope::Admin));
    assert!(principal.require_dataset("docs").is_ok());
    assert!(principal.require_dataset("other").is_err());
    assert_eq!(
        harness
            .ledger
            .authenticate("cairn_wrong")
            .await
            .expect("auth"),
        None
    );
    assert_eq!(harness.ledger.token_count().await.expect("count"), 1);
}

/// The token lifecycle on the ledger's clock: an expired token stops authenticating; a revoked
/// one stops at once and cannot be revoked twice; a rotation keeps name, scopes and datasets,
/// ends the old secret and starts the new one in one change; history names actor and reason.
pub async fn token_lifecycle(harness: Harness) {
    use crate::auth::{TokenChange, TokenState};
    let now = harness.clock.now_micros();
    let short = must(
        harness
            .ledger
            .change_token(TokenChange::Create(NewToken {
                name: "short".to_owned(),
                scopes: vec![Scope::Search],
                datasets: Some(vec!["docs".to_owned()]),
                created_by: "test".to_owned(),
                expires_at: Some(now + 60 * SECOND),
            }))
            .await,
        "create",
    );
    let secret = short.secret.clone().expect("a new secret");
    assert!(harness
        .ledger
        .authenticate(&secret)
        .await
        .expect("auth")
        .is_some());
    // A past expiry is refused at creation.
    assert!(matches!(
        harness
            .ledger
            .change_token(TokenChange::Create(NewToken {
                name: "stale".to_owned(),
                scopes: vec![Scope::Search],
                datasets: None,
                created_by: "test".to_owned(),
                expires_at: Some(now),
            }))
            .await,
        Err(LedgerError::Invalid {
            code: "invalid_expiry",
            ..
        })
    ));

    // Rotation: same name, scopes, datasets and remaining lifetime; the old secret is over.
    let rotated = must(
        harness
            .ledger
            .change_token(TokenChange::Rotate {
                id: short.token.id,
                actor: "token:admin".to_owned(),
                reason: Some("scheduled".to_owned()),
                expires_at: None,
            })
            .await,
        "rotate",
    );
    let new_secret = rotated.secret.clone().expect("a new secret");
    assert_eq!(rotated.token.name, "short");
    assert_eq!(rotated.token.scopes, vec![Scope::Search]);
    assert_eq!(rotated.token.datasets, Some(vec!["docs".to_owned()]));
    assert_eq!(rotated.token.expires_at, Some(now + 60 * SECOND));
    assert_eq!(
        harness.ledger.authenticate(&secret).await.expect("auth"),
        None
    );
    assert!(harness
        .ledger
        .authenticate(&new_secret)
        .await
        .expect("auth")
        .is_some());
    let listed = harness.ledger.tokens().await.expect("tokens");
    let old = listed
        .iter()
        .find(|t| t.id == short.token.id)
        .expect("old token");
    assert_eq!(old.state, TokenState::Revoked);
    assert_eq!(old.replaced_by, Some(rotated.token.id));

    // Expiry, on the ledger's clock.
    harness.clock.advance(61 * SECOND);
    assert_eq!(
        harness
            .ledger
            .authenticate(&new_secret)
            .await
            .expect("auth"),
        None
    );
    let listed = harness.ledger.tokens().await.expect("tokens");
    let current = listed
        .iter()
        .find(|t| t.id == rotated.token.id)
        .expect("new token");
    assert_eq!(current.state, TokenState::Expired);

    // Revocation: at once, once.
    let kept = must(
        harness
            .ledger
            .create_token(NewToken {
                name: "kept".to_owned(),
                scopes: vec![Scope::Ingest],
                datasets: None,
                created_by: "test".to_owned(),
                expires_at: None,
            })
            .await,
        "create",
    );
    let revoke = || TokenChange::Revoke {
        id: kept.id,
        actor: "token:admin".to_owned(),
        reason: Some("leaked".to_owned()),
    };
    must(harness.ledger.change_token(revoke()).await, "revoke");
    assert_eq!(
        harness
            .ledger
            .authenticate(&kept.secret)
            .await
            .expect("auth"),
        None
    );
    assert!(matches!(
        harness.ledger.change_token(revoke()).await,
        Err(LedgerError::TokenRevoked(id)) if id == kept.id
    ));
    assert!(matches!(
        harness
            .ledger
            .change_token(TokenChange::Revoke {
                id: Uuid::nil(),
                actor: "token:admin".to_owned(),
                reason: None,
            })
            .await,
        Err(LedgerError::TokenNotFound(_))
    ));
    let history = harness
        .ledger
        .history("token", &kept.id.to_string())
        .await
        .expect("history");
    let last = history.last().expect("entries");
    assert_eq!(
        (
            last.event.as_str(),
            last.actor.as_str(),
            last.cause.as_str()
        ),
        ("revoked", "token:admin", "leaked")
    );
    assert_eq!(harness.ledger.token_count().await.expect("count"), 0);
}

fn must<T>(result: crate::Result<T>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("{what} failed: {error}"),
    }
}

fn lost<T: std::fmt::Debug>(result: crate::Result<T>) {
    match result {
        Err(LedgerError::LeaseLost { .. }) => {}
        other => panic!("expected lease_lost, got {other:?}"),
    }
}

async fn job_of(harness: &Harness, id: Uuid) -> Job {
    must(harness.ledger.job(id).await, "read job").expect("job exists")
}

async fn claim_one(harness: &Harness, owner: &str) -> (Job, LeaseToken) {
    let mut jobs = must(harness.ledger.claim(owner, 1).await, "claim");
    assert_eq!(jobs.len(), 1, "expected one claimable job");
    let job = jobs.remove(0);
    let token = LeaseToken::of(&job).expect("a claimed job holds a lease");
    (job, token)
}

fn retryable(code: &str, retry_after_micros: Option<i64>) -> Failure {
    Failure {
        class: FailureClass::Retryable { retry_after_micros },
        code: code.to_owned(),
        message: format!("{code} happened"),
    }
}

const SECOND: i64 = 1_000_000;

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
    for _ in 0..crate::policy::DEFAULT_MAX_ATTEMPTS {
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
    for _ in 0..crate::policy::DEFAULT_QUARANTINE_AFTER_CRASHES {
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

/// A generation of the test backends.
fn test_generation(chunker: &str) -> crate::model::Generation {
    crate::model::Generation::new(
        "test-model",
        3,
        chunker,
        &[
            crate::model::Backend::Relational,
            crate::model::Backend::Vector,
        ],
    )
}

fn rows(texts: &[&str]) -> Vec<crate::model::ChunkRow> {
    texts
        .iter()
        .enumerate()
        .map(|(index, text)| crate::model::ChunkRow {
            chunk_index: index as i64,
            text: (*text).to_owned(),
            byte_start: 0,
            byte_end: text.len() as i64,
            token_count: 1,
            sha256: crate::ids::sha256_hex(text.as_bytes()),
            section: (index > 0).then(|| format!("# Part {index}")),
            page: (index > 0).then_some(index as i64),
        })
        .collect()
}

/// Activates the conformance generation (chunker `chunker-a`) and returns it.
async fn activate_test_generation(harness: &Harness) -> crate::model::Generation {
    let generation = test_generation("chunker-a");
    must(
        harness
            .ledger
            .activate_generation(&generation, "test")
            .await,
        "activate",
    );
    generation
}

/// A `verified` receipt update for `backend` in `generation`.
fn verified_receipt(
    backend: crate::model::Backend,
    generation: &crate::model::Generation,
) -> crate::model::ReceiptUpdate {
    crate::model::ReceiptUpdate {
        backend,
        state: ReceiptState::Verified,
        evidence: serde_json::json!({"rows": 2}),
        cause: "verified: read back".to_owned(),
        generation: generation.id.clone(),
    }
}

/// One generation at a time; a changed one is refused; activation is recorded in history.
pub async fn generations_are_fixed_once_active(harness: Harness) {
    let first = test_generation("chunker-a");
    must(
        harness.ledger.activate_generation(&first, "test").await,
        "activate",
    );
    must(
        harness.ledger.activate_generation(&first, "test").await,
        "activate again",
    );
    let active = must(harness.ledger.active_generation().await, "active");
    assert_eq!(active.as_ref(), Some(&first));
    match harness
        .ledger
        .activate_generation(&test_generation("chunker-b"), "test")
        .await
    {
        Err(error @ LedgerError::GenerationMismatch { .. }) => {
            assert_eq!(error.code(), "generation_mismatch");
        }
        other => panic!("expected generation_mismatch, got {other:?}"),
    }
    let history = must(
        harness.ledger.history("generation", &first.id).await,
        "history",
    );
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].actor, "test");
}

/// Chunks are found by text hash within a dataset, in revisions verified in the generation,
/// never across datasets and never in the asking revision: where a projection reuses a vector
/// instead of embedding.
pub async fn chunks_are_found_by_text_hash_within_a_dataset(harness: Harness) {
    let generation = activate_test_generation(&harness).await;
    let hash = |text: &str| crate::ids::sha256_hex(text.as_bytes());
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
            crate::model::Backend::Relational,
            crate::model::Backend::Vector,
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
        crate::model::ChunkSummary::of(written.iter().map(|row| row.sha256.as_str()))
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
            .record_receipt(&token, verified(crate::model::Backend::Relational))
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
            .record_receipt(&token, verified(crate::model::Backend::Vector))
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
            (crate::model::Backend::Relational, ReceiptState::Verified),
            (crate::model::Backend::Vector, ReceiptState::Pending)
        ]
    );
    // A newer revision verified in the same backend supersedes the older receipt.
    let second = must_accept(&harness, put("docs", "a", "second text")).await;
    let (_, token) = claim_one(&harness, "w2").await;
    must(
        harness
            .ledger
            .record_receipt(&token, verified(crate::model::Backend::Relational))
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

/// Binding a hit tells current from superseded and deleted revisions, and vector-searchable
/// (relational and vector receipts verified in the active generation) from pending.
pub async fn hits_bind_to_current_searchable_revisions(harness: Harness) {
    use crate::model::{Backend, HitRef};
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
    assert!(must(
        harness.ledger.bind_hits(&[], &generation.id).await,
        "bind nothing"
    )
    .is_empty());
    // A receipt that leaves `verified` takes the revision out at once.
    let failed = crate::model::ReceiptUpdate {
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

/// The lease on `revision`'s job, claimed now.
async fn claimed_token(harness: &Harness, revision: Uuid) -> LeaseToken {
    let claimed = must(harness.ledger.claim("w", 10).await, "claim");
    let job = claimed
        .iter()
        .find(|job| job.revision_id == revision)
        .expect("the revision's job is claimable");
    LeaseToken::of(job).expect("lease")
}

/// Whether the ledger binds chunk 0 of `revision` as vector-searchable.
async fn searchable(harness: &Harness, revision: Uuid) -> bool {
    let hit = crate::model::HitRef {
        revision_id: revision,
        chunk_index: Some(0),
    };
    let generation = must(
        harness.ledger.active_generation().await,
        "active generation",
    )
    .expect("a generation is active");
    must(
        harness.ledger.bind_hits(&[hit], &generation.id).await,
        "bind",
    )
    .first()
    .is_some_and(|bound| bound.vector_searchable)
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

/// Operator reads: stages, each run's error in history, jobs by filter, the last hour's
/// activity and latencies, and the job event stream.
pub async fn operations_read_jobs_activity_and_events(harness: Harness) {
    use crate::operations::{JobFilter, JobOrder};
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
    let sum = |pick: fn(&crate::operations::MinuteActivity) -> i64| -> i64 {
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
    let accepted = must(ledger.revision(second.revision_id).await, "revision")
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

mod erasure;
mod generations;

/// HTML is indexed as the text a reader sees: words in scripts, styles or tags are never
/// found, hits show no markup, and a page nested too deep is refused before anything is
/// written.
pub async fn html_is_indexed_as_its_text(harness: Harness) {
    let page = "<html><head><title>Marsh notes</title><script>var scriptonly = 1;</script>\
        </head><body><nav>navonly</nav><h1>Herons</h1><p>Herons <em>wade</em> slowly.</p>\
        <p class=\"classonly\">Kingfishers dive.</p></body></html>";
    let mut submission = put("notes", "marsh.html", page);
    if let Change::Put(document) = &mut submission.change {
        document.media_type = "text/html".to_owned();
    }
    must_accept(&harness, submission).await;
    for hidden in ["scriptonly", "navonly", "classonly", "html", "em"] {
        assert_eq!(
            lexical_hits(&harness, hidden).await,
            0,
            "{hidden} was indexed"
        );
    }
    let hits = must(
        harness
            .ledger
            .lexical_search("herons wade", &[], 10, None)
            .await,
        "lexical search",
    );
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert!(hits[0].text.contains("Herons wade slowly."), "{hits:?}");
    assert!(!hits[0].text.contains('<'), "{hits:?}");
    assert_eq!(
        lexical_hits(&harness, "marsh").await,
        1,
        "the title is text"
    );
    // Too deep to extract: refused, nothing written.
    let deep = "<div>".repeat(crate::extract::html::MAX_DEPTH + 1);
    let mut submission = put("notes", "deep.html", &deep);
    if let Change::Put(document) = &mut submission.change {
        document.media_type = "text/html".to_owned();
    }
    let refused = accept_one(&harness, submission).await;
    assert_eq!(
        refused.map_err(|error| error.code()).err(),
        Some("unextractable")
    );
    assert!(must(harness.ledger.source("notes", "deep.html").await, "source").is_none());
}
/// Binary documents are indexed as their extracted text: a PDF's passages name their page
/// and a DOCX's or Markdown document's passages the section they start in; a superseding
/// revision replaces them; a PDF that needs a password is refused before anything is written.
pub async fn documents_are_indexed_with_their_structure(harness: Harness) {
    let fixture = |path: &str| {
        std::fs::read(format!(
            "{}/tests/fixtures/{path}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap_or_else(|error| panic!("fixture {path}: {error}"))
    };
    let pdf = Submission::document(
        "papers",
        "testing.pdf",
        "conformance",
        fixture("pdfjs/file_pdfjs_test.pdf"),
        "application/pdf",
    );
    must_accept(&harness, pdf).await;
    let hits = lexical(&harness, "Robocop trobopan").await;
    assert_eq!(hits.first().and_then(|hit| hit.page), Some(3), "{hits:?}");
    assert!(
        hits.iter().all(|hit| !hit.text.contains("%PDF")),
        "{hits:?}"
    );
    let markdown = "# Guide\n\nIntro words.\n\n## Install\n\nRun the zebrafish installer.\n";
    let mut submission = put("papers", "guide.md", markdown);
    if let Change::Put(document) = &mut submission.change {
        document.media_type = "text/markdown".to_owned();
    }
    must_accept(&harness, submission).await;
    let docx = Submission::document(
        "papers",
        "styles.docx",
        "conformance",
        fixture("docx/par-known-styles.docx"),
        crate::extract::DOCX_MEDIA_TYPE,
    );
    must_accept(&harness, docx).await;
    let hits = lexical(&harness, "body text").await;
    assert_eq!(
        hits.first().map(|hit| hit.source_key.as_str()),
        Some("styles.docx")
    );
    let hits = lexical(&harness, "zebrafish").await;
    assert_eq!(
        hits.first().and_then(|hit| hit.section.as_deref()),
        Some("# Guide > ## Install"),
        "a passage lies in one section and names it: {hits:?}"
    );
    // A new revision replaces the PDF's passages.
    let next = Submission::document(
        "papers",
        "testing.pdf",
        "conformance",
        fixture("pdfjs/issue1002.pdf"),
        "application/pdf",
    );
    must_accept(&harness, next).await;
    assert_eq!(lexical_hits(&harness, "trobopan").await, 0);
    assert_eq!(lexical_hits(&harness, "unstoppable").await, 1);
    // A password: refused, nothing written.
    let locked = Submission::document(
        "papers",
        "locked.pdf",
        "conformance",
        fixture("pdfjs/issue6010_1.pdf"),
        "application/pdf",
    );
    let refused = accept_one(&harness, locked).await;
    assert_eq!(
        refused.map_err(|error| error.code()).err(),
        Some("encrypted")
    );
    assert!(must(
        harness.ledger.source("papers", "locked.pdf").await,
        "source"
    )
    .is_none());
}

pub use erasure::erasure_removes_every_trace;
pub use generations::generations_build_switch_and_retire;

/// Expands to one `#[tokio::test]` per conformance check, each with a fresh harness from
/// `$factory` (an async fn returning [`Harness`]).
#[macro_export]
macro_rules! ledger_conformance {
    ($factory:path) => {
        $crate::ledger_conformance!(@tests $factory;
            accept_records_revision_job_and_receipts,
            duplicate_creates_nothing,
            new_head_supersedes_previous_job,
            revert_reactivates_earlier_revision,
            tombstone_deletes_source,
            counts_follow_acceptance,
            blocked_content_is_refused,
            lexical_index_holds_current_heads_only,
            faults_leave_no_partial_rows,
            batch_items_are_independent,
            a_large_batch_keeps_each_sources_order,
            concurrent_acceptances_are_all_durable,
            tokens_authenticate,
            token_lifecycle,
            lease_lifecycle_claim_heartbeat_complete,
            expired_lease_is_fenced_and_rescued,
            hard_deadline_ends_heartbeats,
            retries_follow_backoff_and_retry_after,
            attempts_are_bounded,
            crashing_jobs_are_quarantined,
            cancel_and_requeue,
            superseded_running_job_fences_its_worker,
            release_pause_and_fair_claims,
            generations_are_fixed_once_active,
            generations_build_switch_and_retire,
            erasure_removes_every_trace,
            html_is_indexed_as_its_text,
            documents_are_indexed_with_their_structure,
            projection_writes_are_fenced_and_read_back,
            chunks_are_found_by_text_hash_within_a_dataset,
            hits_bind_to_current_searchable_revisions,
            lexical_search_ends_at_its_deadline,
            operations_read_jobs_activity_and_events,
        );
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn graph_jobs_are_queued_beside_projection() {
            $crate::conformance::graph_jobs_are_queued_beside_projection(
                $factory($crate::conformance::GRAPH_BACKENDS).await,
            )
            .await;
        }
    };
    (@tests $factory:path; $($name:ident,)+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $crate::conformance::$name($factory($crate::policy::DEFAULT_BACKENDS).await)
                    .await;
            }
        )+
    };
}
