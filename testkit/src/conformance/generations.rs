//! Conformance: generations built side by side, switched, rolled back and retired.

use super::{
    activate_test_generation, delete, must, must_accept, put, rows, test_generation,
    verified_receipt, Harness,
};
use receipts::model::{
    Backend, Generation, GenerationChange, GenerationChanged, GenerationCommand, GenerationState,
    HitRef, Job, JobKind, LeaseToken,
};
use receipts::LedgerError;

fn command(change: GenerationChange) -> GenerationCommand {
    GenerationCommand {
        change,
        actor: "token:admin".to_owned(),
        reason: "conformance".to_owned(),
    }
}

async fn change(
    harness: &Harness,
    change: GenerationChange,
) -> receipts::Result<GenerationChanged> {
    harness.clock.advance(1_000);
    harness.ledger.change_generation(command(change)).await
}

fn refused<T: std::fmt::Debug>(result: receipts::Result<T>, code: &str) -> String {
    match result {
        Err(error) if error.code() == code => {
            assert_eq!(error.http_status(), 409, "{code} is a conflict");
            error.to_string()
        }
        other => panic!("expected {code}, got {other:?}"),
    }
}

/// Claims every due job and projects each into its own generation: chunk rows whose text
/// names the generation, then verified relational and vector receipts. Returns the jobs.
async fn project_all(harness: &Harness, generations: &[&Generation]) -> Vec<Job> {
    let mut done = Vec::new();
    loop {
        let jobs = must(harness.ledger.claim("projector", 50).await, "claim");
        if jobs.is_empty() {
            return done;
        }
        for job in jobs {
            let token = LeaseToken::of(&job).expect("lease");
            let generation = generations
                .iter()
                .find(|generation| Some(&generation.id) == job.generation.as_ref())
                .unwrap_or_else(|| panic!("a job for an unknown generation: {job:?}"));
            if job.kind == JobKind::Project {
                let text = format!("{} of {}", generation.chunker, job.source_key);
                must(
                    harness
                        .ledger
                        .write_chunks(&token, &generation.id, rows(&[&text]))
                        .await,
                    "write chunks",
                );
                for backend in [Backend::Relational, Backend::Vector] {
                    must(
                        harness
                            .ledger
                            .record_receipt(&token, verified_receipt(backend, generation))
                            .await,
                        "receipt",
                    );
                }
            }
            must(harness.ledger.complete(&token).await, "complete");
            done.push(job);
        }
    }
}

/// A generation is built beside the active one (rebuild jobs for current heads, new
/// acceptances projected into both), switched in one step only once complete (or forced),
/// rolled back, and retired (its jobs cancelled, its chunk rows deleted, no more work), with
/// every step in history.
pub async fn generations_build_switch_and_retire(harness: Harness) {
    let first = activate_test_generation(&harness).await;
    let second = test_generation("chunker-b");
    let a = must_accept(&harness, put("notes", "a", "alpha")).await;
    must_accept(&harness, put("notes", "b", "beta")).await;
    must_accept(&harness, put("notes", "c", "gamma")).await;
    must_accept(&harness, delete("notes", "c")).await;
    project_all(&harness, &[&first]).await;

    // Build: one low-priority rebuild job per current head (not the deleted one).
    let created = must(
        change(
            &harness,
            GenerationChange::Create {
                generation: second.clone(),
                priority: receipts::generations::REBUILD_PRIORITY,
            },
        )
        .await,
        "create",
    );
    assert_eq!(created.jobs, 2);
    assert_eq!(created.generation.state, GenerationState::Building);
    assert_eq!(created.generation.progress.heads, 2);
    assert_eq!(created.generation.progress.verified, 0);
    assert_eq!(created.generation.progress.open_jobs, 2);
    let views = must(harness.ledger.generations().await, "list");
    assert_eq!(
        views
            .iter()
            .map(|view| (view.id.as_str(), view.state))
            .collect::<Vec<_>>()
            .len(),
        2
    );
    let active = views
        .iter()
        .find(|view| view.id == first.id)
        .expect("first");
    assert_eq!(active.state, GenerationState::Active);
    assert_eq!(
        active.progress.verified, 2,
        "the active one holds both heads"
    );
    // One build at a time; the active one cannot be created again.
    refused(
        change(
            &harness,
            GenerationChange::Create {
                generation: test_generation("chunker-c"),
                priority: 0,
            },
        )
        .await,
        "generation_state",
    );
    refused(
        change(
            &harness,
            GenerationChange::Create {
                generation: first.clone(),
                priority: 0,
            },
        )
        .await,
        "generation_exists",
    );
    // Not yet complete: the switch is refused and names what is missing.
    let message = refused(
        change(
            &harness,
            GenerationChange::Switch {
                id: second.id.clone(),
                force: false,
            },
        )
        .await,
        "generation_incomplete",
    );
    assert!(message.contains("2 current head(s)") && message.contains("notes/a"));

    // A new revision while building is queued for both generations; the rebuild job of the
    // old head is superseded. Rebuild jobs yield to fresh ingest.
    let a2 = must_accept(&harness, put("notes", "a", "alpha two")).await;
    let claimed = must(harness.ledger.claim("peek", 1).await, "claim one");
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].priority, 0, "fresh ingest is claimed first");
    must(
        harness
            .ledger
            .release(&LeaseToken::of(&claimed[0]).expect("lease"))
            .await,
        "release",
    );
    let done = project_all(&harness, &[&first, &second]).await;
    let for_a2: Vec<_> = done
        .iter()
        .filter(|job| job.revision_id == Some(a2.source_revision_id))
        .filter_map(|job| job.generation.clone())
        .collect();
    assert_eq!(for_a2.len(), 2, "one job per live generation: {for_a2:?}");
    assert!(for_a2.contains(&first.id) && for_a2.contains(&second.id));
    assert!(
        !done
            .iter()
            .any(|job| job.revision_id == Some(a.source_revision_id)),
        "the old head's rebuild job was superseded"
    );
    // Each generation keeps its own chunk rows of the same revision.
    let rows_of = |generation: &Generation| {
        let ledger = harness.ledger.clone();
        let id = generation.id.clone();
        async move {
            must(ledger.chunks(a2.source_revision_id, &id).await, "chunks")
                .into_iter()
                .map(|row| row.text)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(rows_of(&first).await, ["chunker-a of a"]);
    assert_eq!(rows_of(&second).await, ["chunker-b of a"]);
    // Binding answers for the generation searched.
    let hit = HitRef {
        revision_id: a2.source_revision_id,
        chunk_index: Some(0),
    };
    for generation in [&first, &second] {
        let bound = must(
            harness.ledger.bind_hits(&[hit], &generation.id).await,
            "bind",
        );
        assert!(bound[0].vector_searchable);
        assert_eq!(
            bound[0].chunk_text.as_deref(),
            Some(format!("{} of a", generation.chunker).as_str())
        );
    }

    // Complete: the switch is one step; the previous one stays as standby.
    let switched = must(
        change(
            &harness,
            GenerationChange::Switch {
                id: second.id.clone(),
                force: false,
            },
        )
        .await,
        "switch",
    );
    assert_eq!(switched.previous.as_ref(), Some(&first.id));
    assert_eq!(switched.generation.state, GenerationState::Active);
    assert_eq!(switched.generation.progress.verified, 2);
    assert_eq!(
        must(harness.ledger.active_generation().await, "active").map(|g| g.id),
        Some(second.id.clone())
    );
    // The standby one still receives new acceptances; a process configured for it may start.
    must(
        harness.ledger.activate_generation(&first, "test").await,
        "a live generation is accepted at start",
    );
    must_accept(&harness, put("notes", "d", "delta")).await;
    let done = project_all(&harness, &[&first, &second]).await;
    assert_eq!(done.len(), 2, "one job per live generation");
    // Rollback and back again, each one transaction.
    for (to, from) in [(&first, &second), (&second, &first)] {
        let switched = must(
            change(
                &harness,
                GenerationChange::Switch {
                    id: to.id.clone(),
                    force: false,
                },
            )
            .await,
            "switch",
        );
        assert_eq!(switched.previous.as_ref(), Some(&from.id));
    }

    // Retire: never the active one; the standby one loses its work and chunk rows.
    refused(
        change(
            &harness,
            GenerationChange::Retire {
                id: second.id.clone(),
            },
        )
        .await,
        "generation_state",
    );
    must_accept(&harness, put("notes", "e", "epsilon")).await;
    let retired = must(
        change(
            &harness,
            GenerationChange::Retire {
                id: first.id.clone(),
            },
        )
        .await,
        "retire",
    );
    assert_eq!(retired.generation.state, GenerationState::Retiring);
    assert_eq!(retired.jobs, 1, "the pending job of `e` was cancelled");
    assert_eq!(
        retired.chunk_rows_deleted, 4,
        "a, b, d, and the first revision of a"
    );
    assert!(rows_of(&first).await.is_empty());
    assert_eq!(rows_of(&second).await, ["chunker-b of a"]);
    let bound = must(harness.ledger.bind_hits(&[hit], &first.id).await, "bind");
    assert!(!bound[0].vector_searchable);
    refused(
        change(
            &harness,
            GenerationChange::Switch {
                id: first.id.clone(),
                force: true,
            },
        )
        .await,
        "generation_state",
    );
    let finished = must(
        change(
            &harness,
            GenerationChange::Retired {
                id: first.id.clone(),
                evidence: serde_json::json!({"points": 0}),
            },
        )
        .await,
        "retired",
    );
    assert_eq!(finished.generation.state, GenerationState::Retired);
    assert_eq!(
        finished.generation.retired_evidence,
        Some(serde_json::json!({"points": 0, "chunk_rows": 0}))
    );
    // No more work for it.
    must_accept(&harness, put("notes", "f", "zeta")).await;
    let done = project_all(&harness, &[&second]).await;
    assert_eq!(done.len(), 2, "e and f, in the active generation only");
    // A process still configured for it is refused.
    assert_eq!(
        harness
            .ledger
            .activate_generation(&first, "test")
            .await
            .map_err(|error| error.code()),
        Err("generation_mismatch")
    );
    let states: Vec<_> = must(
        harness.ledger.history("generation", &first.id).await,
        "history",
    )
    .into_iter()
    .map(|entry| (entry.to.unwrap_or_default(), entry.actor))
    .collect();
    let names: Vec<&str> = states.iter().map(|(state, _)| state.as_str()).collect();
    assert_eq!(
        names,
        ["active", "standby", "active", "standby", "retiring", "retired"]
    );
    assert!(states[1..].iter().all(|(_, actor)| actor == "token:admin"));

    // A forced switch to an incomplete build names what is missing; rebuilding a retired
    // generation starts it again.
    let rebuilt = must(
        change(
            &harness,
            GenerationChange::Create {
                generation: first.clone(),
                priority: -10,
            },
        )
        .await,
        "create again",
    );
    assert_eq!(rebuilt.jobs, 5);
    let forced = must(
        change(
            &harness,
            GenerationChange::Switch {
                id: first.id.clone(),
                force: true,
            },
        )
        .await,
        "forced switch",
    );
    assert_eq!(forced.missing, 5);
    assert_eq!(forced.missing_sample.len(), 5);
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
