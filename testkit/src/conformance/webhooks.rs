//! Webhook subscriptions and their deliveries: changes through one audited path, fan-out
//! from the outbox with the subscription's filters, claims in lane order with fencing, retries,
//! dead deliveries and replays.

use receipts::events::EventType;
use receipts::webhooks::{
    Attempted, Claimed, DeliveryClaim, DeliveryFinished, DeliveryState, NewWebhook, Webhook,
    WebhookChange, WebhookCommand, WebhookState,
};
use receipts::Clock;

use super::*;

fn command(change: WebhookChange) -> WebhookCommand {
    WebhookCommand {
        change,
        actor: "token:ops".to_owned(),
        reason: "conformance".to_owned(),
    }
}

async fn create(
    harness: &Harness,
    events: Vec<EventType>,
    datasets: Option<Vec<String>>,
) -> Webhook {
    must(
        harness
            .ledger
            .change_webhook(command(WebhookChange::Create(NewWebhook {
                id: Uuid::new_v4(),
                url: "https://receiver.example/hook".to_owned(),
                events,
                datasets,
                description: "conformance".to_owned(),
                sealed_secret: "sealed-1".to_owned(),
            })))
            .await,
        "create webhook",
    )
    .webhook
}

async fn claim(harness: &Harness, webhook: &Webhook, lease_ms: i64) -> Vec<Claimed> {
    must(
        harness
            .ledger
            .claim_deliveries(&DeliveryClaim {
                webhook_id: webhook.id,
                owner: "dispatcher-a".to_owned(),
                lease_ms,
                limit: 50,
            })
            .await,
        "claim deliveries",
    )
}

async fn finish(harness: &Harness, claimed: &Claimed, outcome: Attempted) -> bool {
    must(
        harness
            .ledger
            .finish_delivery(&DeliveryFinished {
                webhook_id: claimed.delivery.webhook_id,
                seq: claimed.delivery.seq,
                fence: claimed.delivery.fence,
                outcome,
            })
            .await,
        "finish delivery",
    )
}

fn keys(claimed: &[Claimed]) -> Vec<(String, String)> {
    claimed
        .iter()
        .map(|each| {
            (
                each.event.source_key.clone().unwrap_or_default(),
                each.event.revision_id.clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn refused_with(result: receipts::Result<impl std::fmt::Debug>, code: &str) {
    match result {
        Err(error) => assert_eq!(error.code(), code, "{error}"),
        Ok(value) => panic!("expected `{code}`, got {value:?}"),
    }
}

/// Creation starts at the outbox's newest event; pause, resume, rotation, disabling and
/// deletion each go through the one change path, are recorded in history with who and why,
/// and the changes a state does not allow are refused the same way on every engine.
pub async fn webhooks_change_through_one_audited_path(harness: Harness) {
    must_accept(&harness, put("docs", "a", "one")).await;
    must_accept(&harness, put("docs", "a", "two")).await;
    let newest = must(
        harness
            .ledger
            .events(&receipts::events::EventQuery {
                after: 0,
                datasets: None,
                types: None,
                limit: 1000,
            })
            .await,
        "events",
    )
    .next_after;
    let hook = create(&harness, vec![], None).await;
    assert_eq!(hook.state, WebhookState::Active);
    assert_eq!(
        hook.cursor, newest,
        "a new webhook hears what happens from now on"
    );
    assert_eq!(hook.sealed_secret, "sealed-1");
    let id = hook.id;
    let change = |change: WebhookChange| command(change);
    let paused = must(
        harness
            .ledger
            .change_webhook(change(WebhookChange::Pause(id)))
            .await,
        "pause",
    );
    assert_eq!(paused.webhook.state, WebhookState::Paused);
    harness.clock.advance(SECOND);
    let until = harness.clock.now_micros() + 3_600 * SECOND;
    let rotated = must(
        harness
            .ledger
            .change_webhook(change(WebhookChange::RotateSecret {
                id,
                sealed_secret: "sealed-2".to_owned(),
                previous_until: until,
            }))
            .await,
        "rotate",
    );
    assert_eq!(rotated.webhook.sealed_secret, "sealed-2");
    assert_eq!(
        rotated.webhook.previous_sealed_secret.as_deref(),
        Some("sealed-1")
    );
    assert_eq!(rotated.webhook.previous_secret_until, Some(until));
    assert_eq!(rotated.webhook.state, WebhookState::Paused);
    must(
        harness
            .ledger
            .change_webhook(change(WebhookChange::Disable {
                id,
                reason: "gone".to_owned(),
            }))
            .await,
        "disable",
    );
    refused_with(
        harness
            .ledger
            .change_webhook(change(WebhookChange::Pause(id)))
            .await,
        "webhook_state",
    );
    let resumed = must(
        harness
            .ledger
            .change_webhook(change(WebhookChange::Resume(id)))
            .await,
        "resume",
    );
    assert_eq!(resumed.webhook.state, WebhookState::Active);
    assert_eq!(resumed.webhook.disabled_reason, None);
    must(
        harness
            .ledger
            .change_webhook(change(WebhookChange::Delete(id)))
            .await,
        "delete",
    );
    refused_with(
        harness
            .ledger
            .change_webhook(change(WebhookChange::Resume(id)))
            .await,
        "webhook_state",
    );
    refused_with(
        harness
            .ledger
            .change_webhook(change(WebhookChange::Pause(Uuid::new_v4())))
            .await,
        "webhook_not_found",
    );
    let history = must(
        harness.ledger.history("webhook", &id.to_string()).await,
        "history",
    );
    let trail: Vec<(String, Option<String>)> = history
        .iter()
        .map(|entry| (entry.event.clone(), entry.to.clone()))
        .collect();
    let expect = |event: &str, state: &str| (event.to_owned(), Some(state.to_owned()));
    assert_eq!(
        trail,
        vec![
            expect("create", "active"),
            expect("pause", "paused"),
            expect("rotate_secret", "paused"),
            expect("disable", "disabled"),
            expect("resume", "active"),
            expect("delete", "deleted"),
        ]
    );
    assert!(history
        .iter()
        .all(|entry| entry.actor == "token:ops" && entry.cause == "conformance"));
    let listed = must(harness.ledger.webhooks().await, "list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, WebhookState::Deleted);
    assert!(claim(&harness, &listed[0], 1_000).await.is_empty());
}

/// The events a subscription wants become its deliveries; a claim takes the first open
/// delivery of each lane (a source's events in order, sources in parallel); a finished
/// attempt counts only with its claim's fence; a failed one waits for its time; a lease that
/// runs out lets another claim take the delivery.
pub async fn deliveries_go_in_lane_order_and_are_fenced(harness: Harness) {
    let hook = create(
        &harness,
        vec![EventType::SourceSuperseded],
        Some(vec!["docs".to_owned()]),
    )
    .await;
    let a1 = must_accept(&harness, put("docs", "a", "a one")).await;
    let a2 = must_accept(&harness, put("docs", "a", "a two")).await;
    must_accept(&harness, put("docs", "a", "a three")).await;
    let b1 = must_accept(&harness, put("docs", "b", "b one")).await;
    must_accept(&harness, put("docs", "b", "b two")).await;
    must_accept(&harness, put("notes", "c", "c one")).await;
    must_accept(&harness, put("notes", "c", "c two")).await;
    let revision = |acceptance: &Acceptance| acceptance.source_revision_id.to_string();

    let first = claim(&harness, &hook, 30_000).await;
    assert_eq!(
        keys(&first),
        vec![
            ("a".to_owned(), revision(&a1)),
            ("b".to_owned(), revision(&b1))
        ],
        "the first of each lane, in sequence order; notes and other types left out"
    );
    assert!(first.iter().all(|each| each.delivery.attempt == 1
        && each.delivery.state == DeliveryState::Delivering
        && each.event.event_type == EventType::SourceSuperseded));
    assert!(
        claim(&harness, &hook, 30_000).await.is_empty(),
        "a lane waits while its head is being delivered"
    );
    // A stale fence changes nothing.
    let mut stale = first[0].clone();
    stale.delivery.fence -= 1;
    assert!(!finish(&harness, &stale, Attempted::Delivered { status: 200 }).await);
    assert!(finish(&harness, &first[0], Attempted::Delivered { status: 204 }).await);
    assert!(
        !finish(&harness, &first[0], Attempted::Delivered { status: 204 }).await,
        "a finished delivery is not finished twice"
    );
    let retry_at = harness.clock.now_micros() + 10 * SECOND;
    assert!(
        finish(
            &harness,
            &first[1],
            Attempted::Failed {
                status: Some(500),
                error: "the receiver answered 500".to_owned(),
                retry_at: Some(retry_at),
            },
        )
        .await
    );
    let next = claim(&harness, &hook, 30_000).await;
    assert_eq!(
        keys(&next),
        vec![("a".to_owned(), revision(&a2))],
        "lane a moves on; lane b waits for its failed head's retry"
    );
    harness.clock.advance(11 * SECOND);
    // Lane a's head is still being delivered; its lease runs out.
    let again = claim(&harness, &hook, 30_000).await;
    assert_eq!(keys(&again), vec![("b".to_owned(), revision(&b1))]);
    assert_eq!(again[0].delivery.attempt, 2);
    assert_eq!(again[0].delivery.last_status, Some(500));
    harness.clock.advance(31 * SECOND);
    let rescued = claim(&harness, &hook, 30_000).await;
    let seqs: Vec<i64> = rescued.iter().map(|each| each.delivery.seq).collect();
    assert_eq!(seqs, vec![next[0].delivery.seq, again[0].delivery.seq]);
    assert_eq!(rescued[0].delivery.fence, next[0].delivery.fence + 1);
    assert!(
        !finish(&harness, &next[0], Attempted::Delivered { status: 200 }).await,
        "the attempt whose lease ran out no longer counts"
    );
    for each in &rescued {
        assert!(finish(&harness, each, Attempted::Delivered { status: 200 }).await);
    }
    assert!(claim(&harness, &hook, 30_000).await.is_empty());
    let counts = must(harness.ledger.delivery_counts().await, "counts");
    let (_, counts) = counts
        .iter()
        .find(|(id, _)| *id == hook.id)
        .expect("counted");
    assert_eq!(counts.delivered, 3);
    assert_eq!(counts.pending + counts.delivering + counts.dead, 0);
    assert_eq!(counts.oldest_undelivered_at, None);
}

/// A delivery whose span is spent is dead and holds its lane no more; an operator retries or
/// discards it, or replays from a sequence number; a 410 disables the subscription and its
/// delivery waits; a paused subscription hears what happened while paused when resumed; a
/// deletion discards what waits; retention removes deliveries with their events.
pub async fn dead_deliveries_are_retried_discarded_and_replayed(harness: Harness) {
    let hook = create(&harness, vec![EventType::SourceSuperseded], None).await;
    for round in 0..3 {
        must_accept(&harness, put("docs", "a", &format!("a {round}"))).await;
    }
    let first = claim(&harness, &hook, 30_000).await;
    assert_eq!(first.len(), 1);
    let failed = Attempted::Failed {
        status: None,
        error: "timed out".to_owned(),
        retry_at: None,
    };
    assert!(finish(&harness, &first[0], failed.clone()).await);
    let second = claim(&harness, &hook, 30_000).await;
    assert_eq!(second.len(), 1, "a dead delivery no longer holds its lane");
    assert!(second[0].delivery.seq > first[0].delivery.seq);
    assert!(finish(&harness, &second[0], failed).await);
    let dead = must(
        harness
            .ledger
            .deliveries(hook.id, Some(DeliveryState::Dead), 0, 100)
            .await,
        "dead deliveries",
    );
    assert_eq!(dead.len(), 2);
    assert_eq!(dead[0].last_error.as_deref(), Some("timed out"));
    let retried = must(
        harness
            .ledger
            .change_webhook(command(WebhookChange::RetryDead {
                id: hook.id,
                seq: Some(first[0].delivery.seq),
            }))
            .await,
        "retry one",
    );
    assert_eq!(retried.deliveries, 1);
    refused_with(
        harness
            .ledger
            .change_webhook(command(WebhookChange::RetryDead {
                id: hook.id,
                seq: Some(first[0].delivery.seq),
            }))
            .await,
        "delivery_not_found",
    );
    let discarded = must(
        harness
            .ledger
            .change_webhook(command(WebhookChange::DiscardDead {
                id: hook.id,
                seq: None,
            }))
            .await,
        "discard the rest",
    );
    assert_eq!(discarded.deliveries, 1);
    let retried = claim(&harness, &hook, 30_000).await;
    assert_eq!(retried.len(), 1);
    assert_eq!(retried[0].delivery.seq, first[0].delivery.seq);
    assert_eq!(
        retried[0].delivery.attempt, 1,
        "a retry starts a fresh span"
    );
    // 410: the delivery waits, the subscription is disabled, and history says why.
    assert!(finish(&harness, &retried[0], Attempted::Gone).await);
    let gone = must(harness.ledger.webhook(hook.id).await, "webhook").expect("exists");
    assert_eq!(gone.state, WebhookState::Disabled);
    assert!(gone
        .disabled_reason
        .as_deref()
        .is_some_and(|reason| reason.contains("410")));
    assert!(claim(&harness, &hook, 30_000).await.is_empty());
    let history = must(
        harness
            .ledger
            .history("webhook", &hook.id.to_string())
            .await,
        "history",
    );
    assert!(history
        .iter()
        .any(|entry| entry.event == "disable" && entry.actor == "cairn:webhooks"));
    // Paused: events wait, and come when resumed.
    must(
        harness
            .ledger
            .change_webhook(command(WebhookChange::Resume(hook.id)))
            .await,
        "resume",
    );
    must(
        harness
            .ledger
            .change_webhook(command(WebhookChange::Pause(hook.id)))
            .await,
        "pause",
    );
    must_accept(&harness, put("docs", "b", "b 0")).await;
    must_accept(&harness, put("docs", "b", "b 1")).await;
    assert!(claim(&harness, &hook, 30_000).await.is_empty());
    must(
        harness
            .ledger
            .change_webhook(command(WebhookChange::Resume(hook.id)))
            .await,
        "resume",
    );
    let resumed = claim(&harness, &hook, 30_000).await;
    let lanes: Vec<Option<&str>> = resumed
        .iter()
        .map(|each| each.event.source_key.as_deref())
        .collect();
    assert_eq!(lanes, vec![Some("a"), Some("b")]);
    for each in &resumed {
        assert!(finish(&harness, each, Attempted::Delivered { status: 200 }).await);
    }
    // Replay from the first event: every event from there on goes again (the discarded one
    // too), whatever its state was.
    let replayed = must(
        harness
            .ledger
            .change_webhook(command(WebhookChange::Replay {
                id: hook.id,
                from: first[0].delivery.seq,
            }))
            .await,
        "replay",
    );
    assert_eq!(replayed.deliveries, 3);
    let again = claim(&harness, &hook, 30_000).await;
    assert_eq!(
        again
            .iter()
            .map(|each| each.delivery.seq)
            .collect::<Vec<_>>(),
        vec![first[0].delivery.seq, resumed[1].delivery.seq]
    );
    // Deletion discards what waits; retention removes deliveries with their events.
    let deleted = must(
        harness
            .ledger
            .change_webhook(command(WebhookChange::Delete(hook.id)))
            .await,
        "delete",
    );
    assert_eq!(deleted.deliveries, 3);
    harness.clock.advance(SECOND);
    must(
        harness
            .ledger
            .prune_events(harness.clock.now_micros())
            .await,
        "prune",
    );
    assert!(must(
        harness.ledger.deliveries(hook.id, None, 0, 100).await,
        "deliveries"
    )
    .is_empty());
    let other = create(&harness, vec![], None).await;
    refused_with(
        harness
            .ledger
            .change_webhook(command(WebhookChange::Replay {
                id: other.id,
                from: 1,
            }))
            .await,
        "cursor_expired",
    );
}
