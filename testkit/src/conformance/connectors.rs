//! Connectors: the one change path and its history, scheduling at claims, a run's fenced
//! progress, and ownership of sources.

use receipts::model::{
    ConnectorChange, ConnectorCommand, ConnectorFile, ConnectorKind, ConnectorState, JobKind,
    JobState, NewConnector, Removal, Submission, SyncProgress, SyncReport,
};
use receipts::{Clock, Connector};
use uuid::Uuid;

use super::{claim_one, lost, must, put, Harness, SECOND};

fn folder(dataset: &str) -> NewConnector {
    NewConnector {
        dataset: dataset.to_owned(),
        kind: ConnectorKind::Folder,
        location: "/srv/docs".to_owned(),
        git_ref: None,
        include: vec!["**/*.md".to_owned()],
        exclude: vec![],
        max_file_bytes: 1 << 20,
        interval_ms: 60_000,
        access: Default::default(),
        credentials: None,
    }
}

fn command(change: ConnectorChange) -> ConnectorCommand {
    ConnectorCommand {
        change,
        actor: "test:operator".to_owned(),
        reason: "conformance".to_owned(),
    }
}

async fn create(harness: &Harness, dataset: &str) -> Connector {
    must(
        harness
            .ledger
            .change_connector(command(ConnectorChange::Create(folder(dataset))))
            .await,
        "create a connector",
    )
    .connector
}

/// A submission by a connector.
fn by(connector: Uuid, submission: Submission) -> Submission {
    Submission {
        connector: Some(connector),
        actor: format!("connector:{connector}"),
        ..submission
    }
}

/// Creating queues a first run; pause cancels it, resume queues one, run now makes it due; a
/// removal is final; every state change is in history with its actor and reason.
pub async fn connector_changes_go_through_one_path(harness: Harness) {
    let ledger = &harness.ledger;
    let created = must(
        ledger
            .change_connector(command(ConnectorChange::Create(folder("docs"))))
            .await,
        "create",
    );
    let id = created.connector.id;
    assert_eq!(created.connector.state, ConnectorState::Active);
    assert_eq!(created.connector.include, vec!["**/*.md".to_owned()]);
    let first = created.run.expect("a first run is queued");
    assert_eq!(
        (first.kind, first.state),
        (JobKind::Sync, JobState::Pending)
    );
    assert_eq!(first.connector_id, Some(id));
    assert_eq!(first.revision_id, None);
    assert_eq!(first.priority, receipts::connectors::SYNC_PRIORITY);

    let paused = must(
        ledger
            .change_connector(command(ConnectorChange::Pause { id }))
            .await,
        "pause",
    );
    assert_eq!(paused.connector.state, ConnectorState::Paused);
    assert_eq!((paused.cancelled_runs, paused.run), (1, None));
    // Asking again changes nothing; running a paused connector is refused.
    let again = must(
        ledger
            .change_connector(command(ConnectorChange::Pause { id }))
            .await,
        "pause again",
    );
    assert_eq!(again.cancelled_runs, 0);
    let refused = ledger
        .change_connector(command(ConnectorChange::RunNow { id, delivery: None }))
        .await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|error| error.code() == "connector_state"),
        "{refused:?}"
    );
    let resumed = must(
        ledger
            .change_connector(command(ConnectorChange::Resume { id }))
            .await,
        "resume",
    );
    assert_eq!(resumed.connector.state, ConnectorState::Active);
    let run = resumed.run.expect("resume queues a run");
    assert_eq!(run.run_at, harness.clock.now_micros());
    // No second open run: run now answers the open one.
    let now = must(
        ledger
            .change_connector(command(ConnectorChange::RunNow { id, delivery: None }))
            .await,
        "run now",
    );
    assert_eq!(now.run.map(|run| run.id), Some(run.id));
    // A push hook's delivery is recorded with the change it causes; the same delivery again
    // is refused and changes nothing, another one is taken.
    let hooked = |delivery: &str| {
        command(ConnectorChange::RunNow {
            id,
            delivery: Some(delivery.to_owned()),
        })
    };
    let first_delivery = must(
        ledger.change_connector(hooked("github:d-1")).await,
        "a delivery",
    );
    assert_eq!(first_delivery.run.map(|run| run.id), Some(run.id));
    let replayed = ledger.change_connector(hooked("github:d-1")).await;
    assert!(
        replayed
            .as_ref()
            .is_err_and(|error| error.code() == "duplicate_delivery"),
        "{replayed:?}"
    );
    must(
        ledger.change_connector(hooked("github:d-2")).await,
        "another delivery",
    );
    let refused_id = ledger.change_connector(hooked("bad\nid")).await;
    assert!(
        refused_id
            .as_ref()
            .is_err_and(|error| error.code() == "invalid_delivery"),
        "{refused_id:?}"
    );

    let removed = must(
        ledger
            .change_connector(command(ConnectorChange::Remove {
                id,
                removal: Removal::Keep,
            }))
            .await,
        "remove",
    );
    assert_eq!(removed.connector.state, ConnectorState::Removed);
    assert_eq!(removed.connector.removal, Some(Removal::Keep));
    assert_eq!(removed.run, None);
    let final_state = ledger
        .change_connector(command(ConnectorChange::Resume { id }))
        .await;
    assert!(final_state.is_err_and(|error| error.code() == "connector_state"));
    let unknown = ledger
        .change_connector(command(ConnectorChange::Pause { id: Uuid::nil() }))
        .await;
    assert!(unknown.is_err_and(|error| error.code() == "connector_not_found"));
    let invalid = ledger
        .change_connector(command(ConnectorChange::Create(NewConnector {
            location: "relative/path".to_owned(),
            ..folder("docs")
        })))
        .await;
    assert!(invalid.is_err_and(|error| error.code() == "invalid_connector"));

    let trail = must(
        ledger.history("connector", &id.to_string()).await,
        "history",
    );
    let states: Vec<&str> = trail
        .iter()
        .filter_map(|entry| entry.to.as_deref())
        .collect();
    assert_eq!(
        states,
        [
            "active",
            "paused",
            "active",
            "github:d-1",
            "github:d-2",
            "removed:keep"
        ],
        "{trail:?}"
    );
    // Each delivery taken is in history as a `hook` event with its actor and cause; the
    // replay refused is not.
    let hooks: Vec<(&str, &str)> = trail
        .iter()
        .filter(|entry| entry.event == "hook")
        .map(|entry| (entry.actor.as_str(), entry.cause.as_str()))
        .collect();
    assert_eq!(
        hooks,
        [
            ("test:operator", "run now: conformance"),
            ("test:operator", "run now: conformance")
        ],
        "{trail:?}"
    );
    assert!(
        trail.iter().all(|entry| entry.actor == "test:operator"),
        "{trail:?}"
    );
    assert!(
        trail
            .iter()
            .any(|entry| entry.cause.contains("conformance")),
        "{trail:?}"
    );
    let listed = must(ledger.connectors().await, "connectors");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        must(ledger.connector(id).await, "connector").map(|c| c.state),
        Some(ConnectorState::Removed)
    );
    // Access settings are kept as given, and checked like every reader list.
    let access = receipts::model::ConnectorAccess {
        readers: Some(vec!["group:staff".to_owned()]),
        from: Some(receipts::model::AccessFrom::Posix),
        file: None,
    };
    let kept = must(
        ledger
            .change_connector(command(ConnectorChange::Create(NewConnector {
                access: access.clone(),
                ..folder("posix")
            })))
            .await,
        "a connector with access settings",
    );
    let stored = must(ledger.connector(kept.connector.id).await, "read back");
    assert_eq!(stored.map(|connector| connector.access), Some(access));
    let bad_readers = ledger
        .change_connector(command(ConnectorChange::Create(NewConnector {
            access: receipts::model::ConnectorAccess {
                readers: Some(vec!["staff".to_owned()]),
                ..Default::default()
            },
            ..folder("docs")
        })))
        .await;
    assert!(bad_readers.is_err_and(|error| error.code() == "invalid_access"));
}

/// A run is a leased job: claimed once, its progress fenced by its lease, its index and report
/// kept; when it ends, the next claim queues the next run one interval later.
pub async fn sync_runs_are_leased_recorded_and_scheduled(harness: Harness) {
    let ledger = &harness.ledger;
    let connector = create(&harness, "docs").await;
    let (job, token) = claim_one(&harness, "worker-a").await;
    assert_eq!(job.connector_id, Some(connector.id));
    assert!(
        must(ledger.claim("worker-b", 5).await, "second claim").is_empty(),
        "two workers never run one connector"
    );
    let file = |key: &str, print: &str| ConnectorFile {
        source_key: key.to_owned(),
        fingerprint: print.to_owned(),
        sha256: receipts::ids::sha256_hex(key.as_bytes()),
    };
    let report = SyncReport {
        location: "/srv/docs".to_owned(),
        stage: "done".to_owned(),
        added: 2,
        ..SyncReport::default()
    };
    must(
        ledger
            .record_sync(
                &token,
                SyncProgress {
                    files: vec![file("a.md", "1:1"), file("b.md", "2:2")],
                    forgotten: vec![],
                    report: report.clone(),
                },
            )
            .await,
        "record",
    );
    must(
        ledger
            .record_sync(
                &token,
                SyncProgress {
                    files: vec![file("b.md", "2:3")],
                    forgotten: vec!["a.md".to_owned()],
                    report: report.clone(),
                },
            )
            .await,
        "record again",
    );
    let index = must(ledger.connector_files(connector.id).await, "index");
    assert_eq!(index, vec![file("b.md", "2:3")]);
    must(ledger.complete(&token).await, "complete");
    // A completed run's lease writes nothing more.
    lost(ledger.record_sync(&token, SyncProgress::default()).await);
    let runs = must(ledger.sync_runs(connector.id, 10).await, "runs");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].report.as_ref(), Some(&report));

    // The next claim schedules the next run, due one interval after the last one ended.
    let ended = harness.clock.now_micros();
    assert!(must(ledger.claim("worker-a", 5).await, "claim").is_empty());
    let runs = must(ledger.sync_runs(connector.id, 10).await, "runs");
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0].job.state, JobState::Pending);
    assert_eq!(runs[0].job.run_at, ended + 60 * SECOND);
    assert_eq!(runs[0].job.changed_by, "cairn:scheduler");
    assert_eq!(runs[0].job.priority, receipts::connectors::SYNC_PRIORITY);
    harness.clock.advance(61 * SECOND);
    let (next, next_token) = claim_one(&harness, "worker-b").await;
    assert_eq!(next.id, runs[0].job.id);

    // A push hook while that run runs: the run may have fetched before the push, so the next
    // one is due as soon as it ends, not one interval later.
    harness.clock.advance(SECOND);
    let pushed = must(
        ledger
            .change_connector(command(ConnectorChange::RunNow {
                id: connector.id,
                delivery: Some("github:while-running".to_owned()),
            }))
            .await,
        "a push while running",
    );
    assert_eq!(pushed.run.map(|run| run.id), Some(next.id));
    harness.clock.advance(SECOND);
    must(ledger.complete(&next_token).await, "complete");
    let (again, again_token) = claim_one(&harness, "worker-a").await;
    assert_eq!(again.connector_id, Some(connector.id));
    assert_eq!(
        again.run_at_rule,
        "a push hook arrived while the last run ran"
    );
    // That run started after the delivery: the one after it waits its interval again.
    must(ledger.complete(&again_token).await, "complete");
    assert!(
        must(ledger.claim("worker-a", 5).await, "claim").is_empty(),
        "no second run for one push"
    );
}

/// A live source belongs to its owner: API ingest cannot overwrite or delete a connector's
/// source, a connector cannot take an API source or another connector's; a tombstoned source
/// is free; a removed connector's kept sources become free, except to its own last run.
pub async fn sources_belong_to_their_owner(harness: Harness) {
    let ledger = &harness.ledger;
    let mine = create(&harness, "docs").await.id;
    let other = create(&harness, "docs").await.id;
    let accept = |submission: Submission| async move {
        ledger
            .accept(vec![submission])
            .await
            .pop()
            .expect("one answer")
    };
    must(
        accept(by(mine, put("docs", "kept.md", "v1"))).await,
        "connector creates",
    );
    let listed = must(ledger.list_sources("docs", "", None, 10).await, "list");
    assert_eq!(
        listed[0].owner.as_deref(),
        Some(format!("connector:{mine}").as_str())
    );
    let api = accept(put("docs", "kept.md", "api edit")).await;
    assert!(
        api.as_ref()
            .is_err_and(|error| error.code() == "owned_by_connector" && error.http_status() == 409),
        "{api:?}"
    );
    let api_delete = accept(super::delete("docs", "kept.md")).await;
    assert!(api_delete.is_err_and(|error| error.code() == "owned_by_connector"));
    let theirs = accept(by(other, put("docs", "kept.md", "other"))).await;
    assert!(theirs.is_err_and(|error| error.code() == "owned_by_another"));
    must(
        accept(by(mine, put("docs", "kept.md", "v2"))).await,
        "owner edits",
    );

    must(
        accept(put("docs", "api.md", "from the api")).await,
        "api source",
    );
    let taken = accept(by(mine, put("docs", "api.md", "connector"))).await;
    assert!(taken.is_err_and(|error| error.code() == "owned_by_another"));

    // Deleted by its owner, a source is free: the API may create it again, and owns it.
    must(
        accept(by(mine, super::delete("docs", "kept.md"))).await,
        "tombstone",
    );
    must(
        accept(put("docs", "kept.md", "api now")).await,
        "api takes it",
    );
    let retaken = accept(by(mine, put("docs", "kept.md", "back"))).await;
    assert!(retaken.is_err_and(|error| error.code() == "owned_by_another"));

    // Removing a connector that keeps its sources frees them for the API.
    must(
        accept(by(other, put("docs", "other.md", "o"))).await,
        "other creates",
    );
    must(
        ledger
            .change_connector(command(ConnectorChange::Remove {
                id: other,
                removal: Removal::Keep,
            }))
            .await,
        "remove",
    );
    must(accept(put("docs", "other.md", "api edit")).await, "freed");
    let heads = must(ledger.list_sources("docs", "", None, 10).await, "list");
    let owners: Vec<(String, Option<String>)> = heads
        .iter()
        .map(|head| (head.source_key.clone(), head.owner.clone()))
        .collect();
    assert_eq!(
        owners,
        vec![
            ("api.md".to_owned(), None),
            ("kept.md".to_owned(), None),
            ("other.md".to_owned(), None),
        ]
    );
}

/// Removing a connector with its sources tombstoned queues a last run now, and keeps queuing
/// one while it still owns a live source; none once they are gone.
pub async fn a_removal_that_tombstones_runs_until_nothing_is_left(harness: Harness) {
    let ledger = &harness.ledger;
    let id = create(&harness, "docs").await.id;
    let (_, first) = claim_one(&harness, "worker").await;
    let accepted = ledger
        .accept(vec![
            by(id, put("docs", "a.md", "a")),
            by(id, put("docs", "b.md", "b")),
        ])
        .await;
    assert!(accepted.iter().all(Result::is_ok), "{accepted:?}");
    must(ledger.complete(&first).await, "complete");
    let removed = must(
        ledger
            .change_connector(command(ConnectorChange::Remove {
                id,
                removal: Removal::Tombstone,
            }))
            .await,
        "remove",
    );
    let last = removed.run.expect("a last run is queued at once");
    assert_eq!(last.run_at, harness.clock.now_micros());
    let claimed = must(ledger.claim("worker", 10).await, "claim");
    let run = claimed
        .iter()
        .find(|job| job.kind == JobKind::Sync)
        .expect("the last run is claimed");
    assert_eq!(run.id, last.id);
    let token = receipts::LeaseToken::of(run).expect("leased");
    // Its own last run may still tombstone what it created; this one ends with b.md live.
    let gone = ledger
        .accept(vec![by(id, super::delete("docs", "a.md"))])
        .await;
    assert!(gone.iter().all(Result::is_ok), "{gone:?}");
    must(ledger.complete(&token).await, "complete");
    // A live source is left: a further run is queued, due at once.
    let jobs = must(ledger.claim("worker", 10).await, "claim");
    let again = jobs
        .iter()
        .find(|job| job.kind == JobKind::Sync && job.connector_id == Some(id))
        .unwrap_or_else(|| panic!("b.md is live, so another run is queued: {jobs:?}"));
    assert_ne!(again.id, last.id);
    let token = receipts::LeaseToken::of(again).expect("leased");
    let gone = ledger
        .accept(vec![by(id, super::delete("docs", "b.md"))])
        .await;
    assert!(gone.iter().all(Result::is_ok), "{gone:?}");
    must(ledger.complete(&token).await, "complete");
    harness.clock.advance(3600 * SECOND);
    let jobs = must(ledger.claim("worker", 10).await, "claim");
    assert!(
        jobs.iter().all(|job| job.kind != JobKind::Sync),
        "nothing is left to tombstone: {jobs:?}"
    );
}
