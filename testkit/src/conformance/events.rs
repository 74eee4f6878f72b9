//! The events outbox: what each change writes, in sequence order, read after a cursor with
//! filters, and pruned by age.

use receipts::events::{EventQuery, EventType};
use receipts::model::Backend;
use receipts::Clock;

use super::*;

async fn read(harness: &Harness, after: i64) -> receipts::events::EventPage {
    must(
        harness
            .ledger
            .events(&EventQuery {
                after,
                datasets: None,
                types: None,
                limit: 100,
            })
            .await,
        "events",
    )
}

fn kinds(page: &receipts::events::EventPage) -> Vec<(&'static str, Option<String>)> {
    page.events
        .iter()
        .map(|event| {
            (
                event.event_type.as_str(),
                event.data["backend"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

/// A verified projection reports each store and then the whole revision; a new head, a
/// deletion and an erasure report what they did; the numbers only grow and a cursor sees each
/// event once.
pub async fn events_report_changes_in_commit_order(harness: Harness) {
    let generation = activate_test_generation(&harness).await;
    let start = read(&harness, 0).await;
    let first = must_accept(&harness, put("docs", "a", "first text")).await;
    assert!(
        read(&harness, start.next_after).await.events.is_empty(),
        "a first revision is no event (its receipt is)"
    );
    let token = claimed_token(&harness, first.source_revision_id).await;
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
    let page = read(&harness, start.next_after).await;
    assert_eq!(
        kinds(&page),
        vec![
            ("receipt.verified", Some("relational".to_owned())),
            ("receipt.verified", Some("vector".to_owned())),
            ("receipt.verified", Some("all".to_owned())),
        ]
    );
    let all = &page.events[2];
    assert_eq!(all.dataset.as_deref(), Some("docs"));
    assert_eq!(all.source_key.as_deref(), Some("a"));
    assert_eq!(
        all.revision_id.as_deref(),
        Some(first.source_revision_id.to_string().as_str())
    );
    assert_eq!(all.data["generation"], generation.id.as_str());
    assert_eq!(all.id, format!("evt_{}", all.seq));
    assert!(page.events.windows(2).all(|pair| pair[0].seq < pair[1].seq));
    assert_eq!(page.next_after, all.seq);

    // A new head supersedes the first; a deletion supersedes that and tombstones the source.
    let second = must_accept(&harness, put("docs", "a", "second text")).await;
    let deleted = must_accept(&harness, delete("docs", "a")).await;
    let page = read(&harness, page.next_after).await;
    assert_eq!(
        kinds(&page),
        vec![
            ("source.superseded", None),
            ("source.superseded", None),
            ("source.tombstoned", None),
        ]
    );
    assert_eq!(
        page.events[0].revision_id.as_deref(),
        Some(first.source_revision_id.to_string().as_str())
    );
    assert_eq!(
        page.events[0].data["superseded_by"],
        second.source_revision_id.to_string()
    );
    assert_eq!(
        page.events[2].revision_id.as_deref(),
        Some(deleted.source_revision_id.to_string().as_str())
    );
    // Read again from the same cursor: the same events, nothing new.
    assert_eq!(read(&harness, start.next_after).await.events.len(), 6);
    assert!(read(&harness, page.next_after).await.events.is_empty());
}

/// Filters by dataset and type keep the cursor moving past what they leave out; a limit
/// pages; pruning removes a prefix by age and a cursor below it is known to be behind.
pub async fn events_are_filtered_paged_and_pruned(harness: Harness) {
    let start = read(&harness, 0).await;
    for round in 0..3 {
        for dataset in ["docs", "notes"] {
            must_accept(&harness, put(dataset, "k", &format!("text {round}"))).await;
        }
    }
    // Two supersessions in each dataset.
    let notes = must(
        harness
            .ledger
            .events(&EventQuery {
                after: start.next_after,
                datasets: Some(vec!["notes".to_owned()]),
                types: Some(vec![EventType::SourceSuperseded]),
                limit: 100,
            })
            .await,
        "events",
    );
    assert_eq!(notes.events.len(), 2);
    assert!(notes
        .events
        .iter()
        .all(|event| event.dataset.as_deref() == Some("notes")));
    let everything = read(&harness, start.next_after).await;
    assert_eq!(everything.events.len(), 4);
    assert_eq!(
        notes.next_after, everything.next_after,
        "a filtered read moves past what it left out"
    );
    let none = must(
        harness
            .ledger
            .events(&EventQuery {
                after: start.next_after,
                datasets: Some(vec!["elsewhere".to_owned()]),
                types: None,
                limit: 100,
            })
            .await,
        "events",
    );
    assert!(none.events.is_empty());
    assert_eq!(none.next_after, everything.next_after);
    // Pages of one.
    let mut cursor = start.next_after;
    let mut seen = Vec::new();
    loop {
        let page = must(
            harness
                .ledger
                .events(&EventQuery {
                    after: cursor,
                    datasets: None,
                    types: None,
                    limit: 1,
                })
                .await,
            "events",
        );
        if page.events.is_empty() {
            break;
        }
        seen.extend(page.events.iter().map(|event| event.seq));
        cursor = page.next_after;
    }
    assert_eq!(
        seen,
        everything
            .events
            .iter()
            .map(|event| event.seq)
            .collect::<Vec<_>>()
    );

    // Pruning by age: the events before the cut go, a prefix; the cursor's floor moves.
    harness.clock.advance(60 * SECOND);
    let cut = harness.clock.now_micros();
    harness.clock.advance(SECOND);
    must_accept(&harness, put("docs", "k", "after the cut")).await;
    let removed = must(harness.ledger.prune_events(cut).await, "prune");
    assert_eq!(removed, 4 + start.events.len() as u64);
    let left = read(&harness, 0).await;
    assert_eq!(left.events.len(), 1, "{:?}", left.events);
    assert_eq!(left.pruned_through, everything.next_after);
    assert!(left.events[0].seq > left.pruned_through);
    assert_eq!(
        must(harness.ledger.prune_events(cut).await, "prune again"),
        0
    );
}
