//! The PostgreSQL ledger against a real PostgreSQL 15 server (one per test, on a free
//! loopback port): the conformance suite, plus what only a server shows (raw SQL from psql,
//! constraints, history that refuses changes, restart).

use std::sync::Arc;

use receipts::conformance::{put, Harness, START};
use receipts::faults::FaultPlan;
use receipts::testing::PostgresServer;
use receipts::{LedgerClock, ManualClock, PostgresLedger, PostgresOptions};

async fn postgres_harness(backends: &[receipts::Backend]) -> Harness {
    let server = PostgresServer::start().expect("start PostgreSQL");
    let url = server.create_database("ledger").expect("create database");
    let clock = Arc::new(ManualClock::new(START));
    let faults = Arc::new(FaultPlan::default());
    let mut options = PostgresOptions::new(url);
    options.backends = backends.to_vec();
    let ledger = PostgresLedger::open_with(
        options,
        LedgerClock::Injected(clock.clone()),
        faults.clone(),
    )
    .await
    .expect("open ledger");
    Harness {
        ledger: Arc::new(ledger),
        clock,
        faults,
        guard: Box::new(server),
    }
}

receipts::ledger_conformance!(postgres_harness);

/// A raw `UPDATE jobs SET state = ...` from psql lands in history as `unattributed`; history
/// refuses UPDATE, DELETE and TRUNCATE; CHECK constraints refuse unknown states.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_psql_writes_are_recorded_unattributed_and_history_is_append_only() {
    let server = PostgresServer::start().expect("start PostgreSQL");
    let url = server.create_database("ledger").expect("create database");
    let ledger = PostgresLedger::open(PostgresOptions::new(url))
        .await
        .expect("open ledger");
    let mut results = receipts::Acceptor::accept(&ledger, vec![put("docs", "a", "text")]).await;
    let receipt = results.pop().expect("result").expect("accepted");
    let job = receipt.projection_job_id.to_string();

    server
        .psql(
            "ledger",
            &format!("UPDATE jobs SET state = 'cancelled' WHERE id = '{job}'"),
        )
        .expect("raw update");
    server
        .psql(
            "ledger",
            &format!(
                "UPDATE projection_receipts SET state = 'failed' \
                 WHERE job_id = '{job}' AND backend = 'vector'"
            ),
        )
        .expect("raw update");
    let history = receipts::Reader::history(&ledger, "job", &job)
        .await
        .expect("history");
    let last = history.last().expect("entries");
    assert_eq!(
        (
            last.from.as_deref(),
            last.to.as_deref(),
            last.actor.as_str(),
            last.cause.as_str()
        ),
        (
            Some("pending"),
            Some("cancelled"),
            "unattributed",
            "unattributed_write"
        )
    );
    let receipt_history = receipts::Reader::history(&ledger, "receipt", &format!("{job}/vector"))
        .await
        .expect("history");
    let last = receipt_history.last().expect("entries");
    assert_eq!(
        (last.to.as_deref(), last.actor.as_str()),
        (Some("failed"), "unattributed")
    );

    for statement in [
        "UPDATE history SET actor = 'someone else'",
        "DELETE FROM history",
        "TRUNCATE history",
    ] {
        let error = server
            .psql("ledger", statement)
            .expect_err("history must refuse it");
        assert!(
            error.to_string().contains("append-only"),
            "{statement}: {error}"
        );
    }
    let error = server
        .psql(
            "ledger",
            &format!("UPDATE jobs SET state = 'bogus' WHERE id = '{job}'"),
        )
        .expect_err("CHECK refuses unknown states");
    assert!(error.to_string().contains("check constraint"), "{error}");
    let error = server
        .psql(
            "ledger",
            &format!("UPDATE jobs SET lease_id = 'x' WHERE id = '{job}'"),
        )
        .expect_err("a lease is whole, and only on a running job");
    assert!(error.to_string().contains("check constraint"), "{error}");
}

/// The lexemes an acceptance sends in `tsvector`'s binary form are what the server makes of
/// their text form: Unicode words, digits, word forms that stem alike, and a lexeme past
/// PostgreSQL's 256 positions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_lexemes_equal_their_text_form() {
    let server = PostgresServer::start().expect("start PostgreSQL");
    let url = server.create_database("ledger").expect("create database");
    let ledger = PostgresLedger::open(PostgresOptions::new(url))
        .await
        .expect("open ledger");
    let many = (0..300)
        .map(|n| if n % 3 == 0 { "Cells" } else { "cell" })
        .collect::<Vec<_>>()
        .join(" ");
    let texts = [
        "Cells, cell's DIFFERENTIATION; 42 o'clock \\ back\\slash",
        "Zürich naïve ΣΟΦΊΑ façade straße 東京 2024-12-01",
        many.as_str(),
    ];
    let submissions = texts
        .iter()
        .enumerate()
        .map(|(index, text)| put("docs", &format!("k{index}"), text))
        .collect();
    for result in receipts::Acceptor::accept(&ledger, submissions).await {
        result.expect("accepted");
    }
    for (index, text) in texts.iter().enumerate() {
        let literal = receipts::passages::lexemes(text)
            .to_string()
            .replace('\'', "''");
        let answer = server
            .psql(
                "ledger",
                &format!(
                    "SELECT count(*) FILTER (WHERE words = '{literal}'::tsvector) || '/' || \
                     count(*) FROM passages WHERE source_key = 'k{index}'"
                ),
            )
            .expect("compare");
        assert_eq!(answer.trim(), "1/1", "text {index}: {literal}");
    }
}

/// A commit that queues work notifies `cairn_work` once, whatever its size, and only once it
/// has committed; a duplicate, which queues nothing, notifies nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_work_notifies_listeners_once_and_duplicates_do_not() {
    use std::time::Duration;
    let server = PostgresServer::start().expect("start PostgreSQL");
    let url = server.create_database("ledger").expect("create database");
    let ledger = PostgresLedger::open(PostgresOptions::new(url.clone()))
        .await
        .expect("open ledger");
    let mut listener = sqlx::postgres::PgListener::connect(&url)
        .await
        .expect("listener");
    listener.listen("cairn_work").await.expect("listen");
    let submissions = (0..3)
        .map(|index| put("docs", &format!("k{index}"), &format!("text {index}")))
        .collect();
    for result in receipts::Acceptor::accept(&ledger, submissions).await {
        result.expect("accepted");
    }
    let woken = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification for queued work")
        .expect("notification");
    assert_eq!(woken.channel(), "cairn_work");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), listener.recv())
            .await
            .is_err(),
        "one transaction notifies once"
    );
    let mut again = receipts::Acceptor::accept(&ledger, vec![put("docs", "k0", "text 0")]).await;
    let duplicate = again.pop().expect("result").expect("accepted");
    assert_eq!(duplicate.status, receipts::AcceptStatus::Duplicate);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), listener.recv())
            .await
            .is_err(),
        "a duplicate queues nothing and wakes nobody"
    );
}
