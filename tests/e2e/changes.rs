//! The change feed (`GET /v1/changes`) through `cairn serve`: a consumer follows its cursor
//! while documents are accepted and projected, across a restart of cairn, and sees every
//! revision's `receipt.verified` exactly once, in each source's order, with nothing invented;
//! and the feed's refusals (scopes, datasets, bad parameters) through the app.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use receipts::Scope;
use serde_json::{json, Value};

/// Reads the feed from `after` until `done` says the events seen so far are enough.
async fn follow(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    after: i64,
    seen: &mut Vec<Value>,
    done: impl Fn(&[Value]) -> bool,
) -> i64 {
    let mut cursor = after;
    let deadline = Instant::now() + Duration::from_secs(180);
    while !done(seen) {
        assert!(
            Instant::now() < deadline,
            "the feed did not deliver: {seen:?}"
        );
        let page: Value = http
            .get(format!(
                "{base}/v1/changes?after={cursor}&wait_ms=2000&limit=50"
            ))
            .bearer_auth(token)
            .send()
            .await
            .expect("changes")
            .json()
            .await
            .expect("json");
        assert_eq!(page["version"], 1, "{page}");
        let events = page["events"].as_array().expect("events");
        for event in events {
            let seq = event["seq"].as_i64().expect("seq");
            assert!(seq > cursor, "an event at or before the cursor: {event}");
            cursor = seq;
        }
        seen.extend(events.iter().cloned());
        cursor = cursor.max(page["next_after"].as_i64().expect("next_after"));
    }
    cursor
}

fn verified_all(events: &[Value]) -> BTreeMap<String, usize> {
    let mut revisions = BTreeMap::new();
    for event in events {
        if event["type"] == "receipt.verified" && event["data"]["backend"] == "all" {
            *revisions
                .entry(event["revision_id"].as_str().unwrap_or_default().to_owned())
                .or_insert(0) += 1;
        }
    }
    revisions
}

#[tokio::test]
async fn a_consumer_follows_the_feed_across_a_restart() {
    let directory = tempfile::tempdir().expect("tempdir");
    let data = directory.path().join("data");
    let (mut child, base) =
        crate::crash::spawn_serve_with(&data, &[], &[], "warn", std::process::Stdio::inherit())
            .await;
    let admin = crate::common::admin_token(&data);
    let http = reqwest::Client::new();

    // Three sources, two revisions each: six revisions, each verified once.
    let mut accepted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for round in 0..2 {
        for key in ["a.md", "b.md", "c.md"] {
            let revision = crate::common::post_source(
                &http,
                &base,
                &admin,
                &json!({"dataset": "docs", "source_key": key,
                        "content": format!("the heron's notes, round {round}, {key}")}),
            )
            .await;
            accepted.entry(key.to_owned()).or_default().push(revision);
        }
    }
    let revisions: BTreeSet<String> = accepted.values().flatten().cloned().collect();
    let mut seen = Vec::new();
    // The first revision of a source may be superseded before it is projected: its job is
    // then never run, so only the heads are sure to be verified.
    let heads: BTreeSet<String> = accepted
        .values()
        .filter_map(|list| list.last().cloned())
        .collect();
    let cursor = follow(&http, &base, &admin, 0, &mut seen, |events| {
        let verified = verified_all(events);
        heads.iter().all(|head| verified.contains_key(head))
    })
    .await;

    // cairn restarts; the consumer goes on from its cursor.
    child.kill().await.expect("kill");
    let _ = child.wait().await;
    let (mut child, base) =
        crate::crash::spawn_serve_with(&data, &[], &[], "warn", std::process::Stdio::inherit())
            .await;
    let later = crate::common::post_source(
        &http,
        &base,
        &admin,
        &json!({"dataset": "docs", "source_key": "a.md", "content": "the heron flew on"}),
    )
    .await;
    follow(&http, &base, &admin, cursor, &mut seen, |events| {
        verified_all(events).contains_key(&later)
    })
    .await;

    // Each revision verified at most once, only revisions that exist, every head verified.
    let verified = verified_all(&seen);
    assert!(verified.values().all(|count| *count == 1), "{verified:?}");
    let mut known = revisions.clone();
    known.insert(later.clone());
    assert!(
        verified.keys().all(|revision| known.contains(revision)),
        "an event for a revision never accepted: {verified:?}"
    );
    // The numbers only grow, and each source's events come in its order: a revision is
    // superseded only after it was accepted, and verified before the feed says so twice.
    let seqs: Vec<i64> = seen
        .iter()
        .filter_map(|event| event["seq"].as_i64())
        .collect();
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "{seqs:?}");
    let superseded: Vec<&str> = seen
        .iter()
        .filter(|event| event["type"] == "source.superseded" && event["source_key"] == "a.md")
        .filter_map(|event| event["revision_id"].as_str())
        .collect();
    assert_eq!(
        superseded,
        accepted["a.md"]
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    );
    assert!(seen
        .iter()
        .all(|event| event.get("content").is_none() && event["data"].get("content").is_none()));

    // Filters: a type and a dataset that has nothing.
    let page: Value = http
        .get(format!("{base}/v1/changes?types=source.superseded"))
        .bearer_auth(&admin)
        .send()
        .await
        .expect("changes")
        .json()
        .await
        .expect("json");
    assert!(page["events"]
        .as_array()
        .expect("events")
        .iter()
        .all(|event| event["type"] == "source.superseded"));
    assert_eq!(page["events"].as_array().map(Vec::len), Some(4));
    child.kill().await.expect("kill");
    let _ = child.wait().await;
}

#[tokio::test]
async fn the_feed_refuses_what_it_must() {
    let app = crate::common::app().await;
    let admin = app.admin.clone();
    let (status, body) = app
        .call(
            "GET",
            "/v1/changes?types=receipt.exploded",
            Some(&admin),
            None,
        )
        .await;
    crate::common::assert_error(&(status, body), 422, "invalid_event_type");
    let (status, body) = app
        .call("GET", "/v1/changes?limit=0", Some(&admin), None)
        .await;
    crate::common::assert_error(&(status, body), 422, "invalid_limit");
    let (status, body) = app
        .call("GET", "/v1/changes?after=-1", Some(&admin), None)
        .await;
    crate::common::assert_error(&(status, body), 422, "invalid_cursor");
    let (status, body) = app
        .call("GET", "/v1/changes?wait_ms=30001", Some(&admin), None)
        .await;
    crate::common::assert_error(&(status, body), 422, "invalid_wait");
    let (status, _) = app.call("GET", "/v1/changes", None, None).await;
    assert_eq!(status.as_u16(), 401);
    // A token for other datasets may not read this one's events.
    let other = app.token("other", &[Scope::Ingest], Some(&["other"])).await;
    let (status, body) = app
        .call("GET", "/v1/changes?datasets=docs", Some(&other), None)
        .await;
    crate::common::assert_error(&(status, body), 403, "forbidden");
    // Its own datasets are its default: another dataset's events are not shown.
    let (status, _) = app
        .put(
            &admin,
            json!({"dataset": "docs", "source_key": "k", "content": "one"}),
        )
        .await;
    assert_eq!(status.as_u16(), 202);
    let (status, _) = app
        .put(
            &admin,
            json!({"dataset": "docs", "source_key": "k", "content": "two"}),
        )
        .await;
    assert_eq!(status.as_u16(), 202);
    let (status, body) = app.call("GET", "/v1/changes", Some(&other), None).await;
    assert_eq!(status.as_u16(), 200, "{body}");
    assert_eq!(body["events"].as_array().map(Vec::len), Some(0), "{body}");
    let (_, body) = app.call("GET", "/v1/changes", Some(&admin), None).await;
    assert_eq!(body["events"].as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(body["events"][0]["type"], "source.superseded");
    // A scope that reads nothing here.
    let ops_write_only = app.token("w", &[Scope::Erase], None).await;
    let (status, body) = app
        .call("GET", "/v1/changes", Some(&ops_write_only), None)
        .await;
    crate::common::assert_error(&(status, body), 403, "forbidden");
}
