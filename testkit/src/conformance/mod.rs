//! The ledger conformance suite: behaviour every [`Ledger`] implementation must show. An
//! implementation's tests call [`crate::ledger_conformance!`] with a factory that builds a
//! fresh [`Harness`]; the macro expands to one test per check. One file per topic; the
//! harness and the helpers every topic uses are here.

use std::sync::Arc;

use receipts::clock::ManualClock;
use receipts::faults::FaultPlan;
use receipts::model::{
    Acceptance, Change, Failure, FailureClass, Job, JobState, LeaseToken, ReceiptState, Submission,
};
use receipts::{Ledger, LedgerError};
use uuid::Uuid;

pub use receipts::policy::DEFAULT_BACKENDS;

mod acceptance;
mod access;
mod connectors;
mod erasure;
mod events;
mod filters;
mod generations;
mod indexing;
mod leases;
mod operations;
mod projection;
mod search;
mod tokens;
mod validity;
mod verify;
mod webhooks;

pub use acceptance::*;
pub use access::*;
pub use connectors::*;
pub use erasure::*;
pub use events::*;
pub use filters::*;
pub use generations::*;
pub use indexing::*;
pub use leases::*;
pub use operations::*;
pub use projection::*;
pub use search::*;
pub use tokens::*;
pub use validity::*;
pub use verify::*;
pub use webhooks::*;

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
        connector: None,
        validity: Default::default(),
        change: Change::Delete {
            reason: Some("test".to_owned()),
        },
        readers: None,
    }
}

async fn accept_one(harness: &Harness, submission: Submission) -> receipts::Result<Acceptance> {
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

async fn lexical(harness: &Harness, query: &str) -> Vec<receipts::LexicalHit> {
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

fn must<T>(result: receipts::Result<T>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("{what} failed: {error}"),
    }
}

fn lost<T: std::fmt::Debug>(result: receipts::Result<T>) {
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

/// A generation of the test backends.
fn test_generation(chunker: &str) -> receipts::model::Generation {
    receipts::model::Generation::new(
        "test-model",
        3,
        chunker,
        &[
            receipts::model::Backend::Relational,
            receipts::model::Backend::Vector,
        ],
    )
}

fn rows(texts: &[&str]) -> Vec<receipts::model::ChunkRow> {
    texts
        .iter()
        .enumerate()
        .map(|(index, text)| receipts::model::ChunkRow {
            chunk_index: index as i64,
            text: (*text).to_owned(),
            byte_start: 0,
            byte_end: text.len() as i64,
            token_count: 1,
            sha256: receipts::ids::sha256_hex(text.as_bytes()),
            section: (index > 0).then(|| format!("# Part {index}")),
            page: (index > 0).then_some(index as i64),
        })
        .collect()
}

/// Activates the conformance generation (chunker `chunker-a`) and returns it.
async fn activate_test_generation(harness: &Harness) -> receipts::model::Generation {
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
    backend: receipts::model::Backend,
    generation: &receipts::model::Generation,
) -> receipts::model::ReceiptUpdate {
    receipts::model::ReceiptUpdate {
        backend,
        state: ReceiptState::Verified,
        evidence: serde_json::json!({"rows": 2}),
        cause: "verified: read back".to_owned(),
        generation: generation.id.clone(),
    }
}

/// The lease on `revision`'s job, claimed now.
async fn claimed_token(harness: &Harness, revision: Uuid) -> LeaseToken {
    let claimed = must(harness.ledger.claim("w", 10).await, "claim");
    let job = claimed
        .iter()
        .find(|job| job.revision_id == Some(revision))
        .expect("the revision's job is claimable");
    LeaseToken::of(job).expect("lease")
}

/// Whether the ledger binds chunk 0 of `revision` as vector-searchable.
async fn searchable(harness: &Harness, revision: Uuid) -> bool {
    let hit = receipts::model::HitRef {
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

/// Expands to one `#[tokio::test]` per conformance check, each with a fresh harness from
/// `$factory` (an async fn returning [`Harness`]).
#[macro_export]
macro_rules! ledger_conformance {
    ($factory:path) => {
        $crate::ledger_conformance!(@tests $factory;
            accept_records_revision_job_and_receipts,
            events_report_changes_in_commit_order,
            events_are_filtered_paged_and_pruned,
            webhooks_change_through_one_audited_path,
            deliveries_go_in_lane_order_and_are_fenced,
            dead_deliveries_are_retried_discarded_and_replayed,
            duplicate_creates_nothing,
            new_head_supersedes_previous_job,
            revert_reactivates_earlier_revision,
            tombstone_deletes_source,
            counts_follow_acceptance,
            sources_are_listed_by_prefix_in_byte_order,
            blocked_content_is_refused,
            lexical_index_holds_current_heads_only,
            faults_leave_no_partial_rows,
            batch_items_are_independent,
            a_large_batch_keeps_each_sources_order,
            concurrent_acceptances_are_all_durable,
            tokens_authenticate,
            tokens_carry_an_identity,
            access_changes_are_one_audited_path,
            a_puts_readers_hold_only_when_it_is_accepted,
            access_changes_queue_access_jobs,
            readable_sources_are_selected_exactly,
            verify_reads_a_bucket_of_settled_heads,
            verify_passes_go_through_one_path,
            a_repair_reprojects_the_head_only,
            a_restore_voids_every_lease,
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
            connector_changes_go_through_one_path,
            sync_runs_are_leased_recorded_and_scheduled,
            sources_belong_to_their_owner,
            a_removal_that_tombstones_runs_until_nothing_is_left,
            documents_are_indexed_with_their_structure,
            projection_writes_are_fenced_and_read_back,
            unit_writes_are_fenced_one_job_at_a_time,
            chunks_are_found_by_text_hash_within_a_dataset,
            hits_bind_to_current_searchable_revisions,
            lexical_search_ends_at_its_deadline,
            operations_read_jobs_activity_and_events,
            validity_answers_what_held_and_what_was_known,
            validity_refusals_are_typed_and_write_nothing,
            validity_follows_replayed_assertions,
            scheduled_revisions_take_the_head_at_their_boundary,
            bounded_periods_return_the_head_at_their_end,
            history_gaps_name_what_temporal_search_cannot_return,
            filters_select_what_the_exact_evaluation_selects,
            filters_apply_to_the_revision_that_held,
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
                $crate::conformance::$name($factory($crate::conformance::DEFAULT_BACKENDS).await)
                    .await;
            }
        )+
    };
}
