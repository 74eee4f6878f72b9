//! The ledger conformance suite: behaviour every [`Ledger`] implementation must show. An
//! implementation's tests call [`crate::ledger_conformance!`] with a factory that builds a
//! fresh [`Harness`]; the macro expands to one test per check.

use std::sync::Arc;

use uuid::Uuid;

use crate::auth::{NewToken, Scope};
use crate::clock::ManualClock;
use crate::faults::{FaultPlan, FaultPoint};
use crate::ledger::Ledger;
use crate::model::{
    AcceptStatus, Acceptance, Change, ContentBlock, Document, JobState, ReceiptState, Submission,
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
    Submission {
        dataset: dataset.to_owned(),
        source_key: key.to_owned(),
        actor: "test:conformance".to_owned(),
        change: Change::Put(Document {
            bytes: text.as_bytes().to_vec(),
            media_type: "text/plain".to_owned(),
            tags: Vec::new(),
            metadata: serde_json::Map::new(),
        }),
    }
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

/// Deleting a source makes a tombstone head and removes it from lexical search.
pub async fn tombstone_deletes_source(harness: Harness) {
    let first = must_accept(&harness, put("docs", "a.txt", "zebra crossing")).await;
    assert_eq!(
        harness
            .ledger
            .lexical_search("zebra", &[], 10)
            .await
            .expect("search")
            .len(),
        1
    );
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
    assert!(harness
        .ledger
        .lexical_search("zebra", &[], 10)
        .await
        .expect("search")
        .is_empty());
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
    assert_eq!(
        harness
            .ledger
            .lexical_search("zebra", &[], 10)
            .await
            .expect("search")
            .len(),
        1
    );
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
    assert!(harness
        .ledger
        .lexical_search("alpha", &[], 10)
        .await
        .expect("search")
        .is_empty());
    let hits = harness
        .ledger
        .lexical_search("charlie", &["docs".to_owned()], 10)
        .await
        .expect("search");
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].revision_id, second.source_revision_id);
    assert_ne!(hits[0].revision_id, first.source_revision_id);
    assert_eq!(
        harness
            .ledger
            .lexical_search("charlie", &[], 10)
            .await
            .expect("search")
            .len(),
        2
    );
    // Query syntax never reaches the index.
    assert!(harness
        .ledger
        .lexical_search("\"unbalanced AND (", &[], 10)
        .await
        .is_ok());
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
            assert_eq!(
                harness
                    .ledger
                    .lexical_search("stable", &[], 10)
                    .await
                    .expect("search")
                    .len(),
                1
            );
            assert!(harness
                .ledger
                .lexical_search("failing", &[], 10)
                .await
                .expect("search")
                .is_empty());
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
            blocked_content_is_refused,
            lexical_index_holds_current_heads_only,
            faults_leave_no_partial_rows,
            batch_items_are_independent,
            concurrent_acceptances_are_all_durable,
            tokens_authenticate,
        );
    };
    (@tests $factory:path; $($name:ident,)+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $crate::conformance::$name($factory().await).await;
            }
        )+
    };
}
