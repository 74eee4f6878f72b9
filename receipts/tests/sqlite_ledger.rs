//! The SQLite ledger: the conformance suite, plus what only SQLite can show (raw SQL writes,
//! constraints, reopening).

use std::sync::Arc;

use receipts::faults::FaultPlan;
use receipts::{ManualClock, SqliteLedger, SqliteOptions};
use testkit::conformance::{put, Harness, START};

async fn sqlite_harness(backends: &[receipts::Backend]) -> Harness {
    let directory = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(START));
    let faults = Arc::new(FaultPlan::default());
    let mut options = SqliteOptions::new(directory.path().join("ledger.db"));
    options.backends = backends.to_vec();
    let ledger = SqliteLedger::open_with_faults(options, clock.clone(), faults.clone())
        .await
        .expect("open ledger");
    Harness {
        ledger: Arc::new(ledger),
        clock,
        faults,
        guard: Box::new(directory),
    }
}

testkit::ledger_conformance!(sqlite_harness);

async fn open(path: &std::path::Path) -> SqliteLedger {
    SqliteLedger::open(SqliteOptions::new(path), Arc::new(ManualClock::new(START)))
        .await
        .expect("open")
}

#[tokio::test]
async fn raw_sql_state_change_lands_in_history_unattributed() {
    let directory = tempfile::tempdir().expect("tempdir");
    let ledger = open(&directory.path().join("ledger.db")).await;
    let mut results = receipts::Acceptor::accept(&ledger, vec![put("docs", "a", "text")]).await;
    let receipt = results.pop().expect("result").expect("accepted");
    let job = receipt.projection_job_id.to_string();
    sqlx::query("UPDATE jobs SET state = 'cancelled' WHERE id = ?")
        .bind(&job)
        .execute(ledger.read_pool())
        .await
        .expect("raw update");
    sqlx::query(
        "UPDATE projection_receipts SET state = 'failed' WHERE job_id = ? AND backend = 'vector'",
    )
    .bind(&job)
    .execute(ledger.read_pool())
    .await
    .expect("raw update");
    let history = receipts::Reader::history(&ledger, "job", &job)
        .await
        .expect("history");
    let last = history.last().expect("entries");
    assert_eq!(
        (last.from.as_deref(), last.to.as_deref()),
        (Some("pending"), Some("cancelled"))
    );
    assert_eq!(last.actor, "unattributed");
    assert_eq!(last.cause, "unattributed_write");
    assert!(
        last.at > START,
        "an unattributed write is stamped with the database clock"
    );
    let receipt_history = receipts::Reader::history(&ledger, "receipt", &format!("{job}/vector"))
        .await
        .expect("history");
    assert_eq!(
        receipt_history.last().and_then(|h| h.to.as_deref()),
        Some("failed")
    );
    // A raw head move is recorded too.
    sqlx::query("INSERT INTO revisions SELECT 'raw-rev', dataset, source_key, content_sha256, byte_length, media_type, tags, metadata, 0, id, 'raw', NULL, accepted_at FROM revisions")
        .execute(ledger.read_pool())
        .await
        .expect("raw insert");
    sqlx::query("UPDATE sources SET head_revision_id = 'raw-rev'")
        .execute(ledger.read_pool())
        .await
        .expect("raw update");
    let moves = receipts::Reader::history(&ledger, "source", "docs/a")
        .await
        .expect("history");
    assert_eq!(
        moves.last().map(|h| (h.to.as_deref(), h.actor.as_str())),
        Some((Some("raw-rev"), "unattributed"))
    );
}

#[tokio::test]
async fn history_is_append_only_and_states_are_checked() {
    let directory = tempfile::tempdir().expect("tempdir");
    let ledger = open(&directory.path().join("ledger.db")).await;
    receipts::Acceptor::accept(&ledger, vec![put("docs", "a", "text")]).await;
    let pool = ledger.read_pool();
    // Each write is refused by the rule named, not by anything else.
    let refused = |sql: &'static str, rule: &'static str| async move {
        match sqlx::query(sql).execute(pool).await {
            Ok(done) => panic!("`{sql}` succeeded ({} rows)", done.rows_affected()),
            Err(error) => assert!(
                error.to_string().contains(rule),
                "`{sql}` failed for another reason: {error}"
            ),
        }
    };
    refused(
        "UPDATE history SET actor = 'forged'",
        "history is append-only",
    )
    .await;
    refused("DELETE FROM history", "history is append-only").await;
    refused(
        "UPDATE jobs SET state = 'exploded'",
        "CHECK constraint failed",
    )
    .await;
    refused(
        "UPDATE projection_receipts SET state = 'done'",
        "CHECK constraint failed",
    )
    .await;
    // A pending job holds no lease.
    refused("UPDATE jobs SET lease_id = 'x'", "CHECK constraint failed").await;
}

#[tokio::test]
async fn acknowledged_acceptances_survive_reopen() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("ledger.db");
    let receipt = {
        let ledger = open(&path).await;
        let mut results = receipts::Acceptor::accept(&ledger, vec![put("docs", "a", "kept")]).await;
        results.pop().expect("result").expect("accepted")
    };
    let ledger = open(&path).await;
    let detail = receipts::Reader::revision(&ledger, receipt.source_revision_id)
        .await
        .expect("read")
        .expect("exists");
    assert!(detail.is_head);
    let bytes = receipts::Reader::content(&ledger, receipt.content_sha256.as_deref().expect("sha"))
        .await
        .expect("read");
    assert_eq!(bytes.as_deref(), Some(&b"kept"[..]));
}

#[tokio::test]
async fn each_job_kind_gets_its_own_policy() {
    use receipts::policy::{JobPolicies, JobPolicy};
    use receipts::{JobKind, Leases};
    let directory = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(START));
    let mut options = SqliteOptions::new(directory.path().join("ledger.db"));
    options.job_policies = JobPolicies {
        project: JobPolicy {
            max_attempts: 9,
            lease_micros: 5_000_000,
            ..JobPolicy::default()
        },
        tombstone: JobPolicy {
            max_attempts: 2,
            lease_micros: 700_000,
            quarantine_after_crashes: 1,
            ..JobPolicy::default()
        },
        graph: JobPolicy::default(),
        sync: JobPolicy::default(),
        access: JobPolicy::default(),
    };
    let ledger = SqliteLedger::open(options, clock.clone())
        .await
        .expect("open");
    receipts::Acceptor::accept(&ledger, vec![put("docs", "a", "text")])
        .await
        .pop()
        .expect("result")
        .expect("accepted");
    let project = ledger
        .claim("w", 1)
        .await
        .expect("claim")
        .pop()
        .expect("job");
    assert_eq!(project.kind, JobKind::Project);
    assert_eq!(project.max_attempts, 9);
    assert_eq!(project.lease_expires_at, Some(START + 5_000_000));
    // The tombstone supersedes the running project job and queues its own.
    receipts::Acceptor::accept(&ledger, vec![testkit::conformance::delete("docs", "a")])
        .await
        .pop()
        .expect("result")
        .expect("accepted");
    let tombstone = ledger
        .claim("w", 1)
        .await
        .expect("claim")
        .pop()
        .expect("job");
    assert_eq!(tombstone.kind, JobKind::Tombstone);
    assert_eq!(tombstone.max_attempts, 2);
    assert_eq!(tombstone.lease_expires_at, Some(START + 700_000));
    // Its lease expires: one crash quarantines it under the tombstone policy.
    clock.advance(700_000);
    assert!(ledger.claim("w", 1).await.expect("claim").is_empty());
    let rescued = ledger
        .job(tombstone.id)
        .await
        .expect("job")
        .expect("exists");
    assert_eq!(rescued.state, receipts::JobState::Quarantined);
}

/// Schema 14 edits the definitions of `jobs` and `history` in place: a sync run names a
/// connector and no revision, one run per connector is open at a time, every other job still
/// needs its revision, and a connector's changes land in history, next to what was there.
#[tokio::test]
async fn sync_runs_name_a_connector_and_only_one_is_open() {
    let directory = tempfile::tempdir().expect("tempdir");
    let ledger = open(&directory.path().join("ledger.db")).await;
    receipts::Acceptor::accept(&ledger, vec![put("docs", "a", "text")]).await;
    let pool = ledger.read_pool();
    let run = |id: &'static str, state: &'static str| {
        format!(
            "INSERT INTO jobs (id, revision_id, connector_id, dataset, source_key, kind, state, \
               max_attempts, run_at, created_at, changed_by, change_cause, changed_at) \
             VALUES ('{id}', NULL, 'c1', 'docs', '', 'sync', '{state}', 5, 1, 1, 't', 'scheduled', 1)"
        )
    };
    sqlx::query(
        "INSERT INTO connectors (id, dataset, kind, location, include, exclude, max_file_bytes, \
           interval_ms, state, created_by, reason, created_at, changed_by, change_cause, changed_at) \
         VALUES ('c1', 'docs', 'folder', '/srv/docs', '[]', '[]', 1048576, 600000, 'active', \
           't', 'docs folder', 1, 't', 'created', 1)",
    )
    .execute(pool)
    .await
    .expect("a connector");
    sqlx::query(&run("r1", "pending"))
        .execute(pool)
        .await
        .expect("a sync run without a revision");
    let second = sqlx::query(&run("r2", "pending")).execute(pool).await;
    assert!(
        second
            .as_ref()
            .is_err_and(|error| error.to_string().contains("UNIQUE")),
        "{second:?}"
    );
    sqlx::query(&run("r3", "completed"))
        .execute(pool)
        .await
        .expect("an ended run beside the open one");
    let orphan = sqlx::query(
        "INSERT INTO jobs (id, revision_id, dataset, source_key, kind, state, max_attempts, \
           run_at, created_at, changed_by, change_cause, changed_at) \
         VALUES ('p1', NULL, 'docs', 'b', 'project', 'pending', 5, 1, 1, 't', 'x', 1)",
    )
    .execute(pool)
    .await;
    assert!(
        orphan
            .as_ref()
            .is_err_and(|error| error.to_string().contains("CHECK")),
        "{orphan:?}"
    );
    let trail: Vec<(String, String)> =
        sqlx::query_as("SELECT entity, coalesce(to_state, '') FROM history ORDER BY seq")
            .fetch_all(pool)
            .await
            .expect("history");
    assert!(
        trail.iter().any(|(entity, _)| entity == "source"),
        "{trail:?}"
    );
    assert!(
        trail.contains(&("connector".to_owned(), "active".to_owned())),
        "{trail:?}"
    );
    let jobs: Vec<Option<String>> =
        sqlx::query_scalar("SELECT revision_id FROM jobs WHERE kind = 'project'")
            .fetch_all(pool)
            .await
            .expect("jobs");
    assert!(jobs.iter().all(Option::is_some) && !jobs.is_empty());
}

/// Every source carries the verify bucket Rust computes; a source without one (a ledger that
/// schema 15 migrated) gets it when the ledger opens.
#[tokio::test]
async fn sources_carry_their_verify_bucket_and_missing_ones_are_filled_on_open() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("ledger.db");
    let long = "x".repeat(300);
    let keys = ["a.md", "guides/ünïcode ✓.md", long.as_str()];
    {
        let ledger = open(&path).await;
        let submissions = keys.iter().map(|key| put("docs", key, "text")).collect();
        for result in receipts::Acceptor::accept(&ledger, submissions).await {
            result.expect("accepted");
        }
        let rows: Vec<(String, String, i64)> =
            sqlx::query_as("SELECT dataset, source_key, bucket FROM sources")
                .fetch_all(ledger.read_pool())
                .await
                .expect("read");
        assert_eq!(rows.len(), keys.len());
        for (dataset, key, bucket) in rows {
            assert_eq!(
                bucket,
                i64::from(receipts::verify::bucket(&dataset, &key)),
                "{key}"
            );
        }
        sqlx::query("UPDATE sources SET bucket = NULL")
            .execute(ledger.read_pool())
            .await
            .expect("clear");
    }
    let ledger = open(&path).await;
    let rows: Vec<(String, String, Option<i64>)> =
        sqlx::query_as("SELECT dataset, source_key, bucket FROM sources")
            .fetch_all(ledger.read_pool())
            .await
            .expect("read");
    for (dataset, key, bucket) in rows {
        assert_eq!(
            bucket,
            Some(i64::from(receipts::verify::bucket(&dataset, &key))),
            "{key}"
        );
    }
}

/// Tables an acceptance statement may scan whole: the writer's staging tables (one wave's
/// rows) and the two tables of a handful of rows (generations, job policies).
const SCANNABLE: &[&str] = &[
    "wave",
    "wave_params",
    "wave_passages",
    "wave_superseded",
    "p",
    "passage",
    "g",
    "generations",
    "job_policies",
    "policy",
];

/// Whether `statement` reads `name` itself (after `FROM` or `JOIN`, or as an alias). A scan
/// of a table it does not name is the foreign-key check SQLite compiles into an insert into a
/// parent table, which runs only while a deferred violation is pending.
fn reads(statement: &str, name: &str) -> bool {
    let words: Vec<&str> = statement.split_whitespace().collect();
    words.windows(2).any(|pair| {
        let named = pair[1].trim_end_matches([',', ')', ';']);
        named.eq_ignore_ascii_case(name)
            && ["FROM", "JOIN", "AS"]
                .iter()
                .any(|keyword| pair[0].eq_ignore_ascii_case(keyword))
    })
}

/// Every statement of an acceptance (the decision and each write step) is planned by SQLite
/// as index probes into the ledger's tables: `EXPLAIN QUERY PLAN` on a ledger of a few
/// thousand sources, with the writer's staging tables, shows no scan of a table other than
/// those ([`SCANNABLE`]) and JSON parameters. A scan of `jobs` by its revision index once made
/// single acceptances fall from 453/s to 72/s as the jobs grew; the check fails on it (the
/// statement without its `CROSS JOIN` is checked too, and caught).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acceptance_statements_probe_by_key() {
    use sqlx::{ConnectOptions, Row};
    let directory = tempfile::tempdir().expect("tempdir");
    let file = directory.path().join("ledger.db");
    let ledger = open(&file).await;
    for batch in 0..3 {
        let submissions = (0..1000)
            .map(|index| {
                put(
                    "docs",
                    &format!("key-{batch}-{index}"),
                    "plain words for the index",
                )
            })
            .collect();
        let results = receipts::Acceptor::accept(&ledger, submissions).await;
        assert!(results.iter().all(Result::is_ok));
    }
    let mut connection =
        receipts::sqlite::connect_options(&file, std::time::Duration::from_secs(5))
            .connect()
            .await
            .expect("connect");
    // No `ANALYZE`: cairn never runs it, so the planner sees the ledger as a running one does.
    sqlx::raw_sql(include_str!("../src/sqlite/queries/wave_table.sql"))
        .execute(&mut connection)
        .await
        .expect("staging tables");
    let mutant = include_str!("../src/sqlite/queries/accept_queue.sql").replace(
        "CROSS JOIN jobs AS job ON job.revision_id",
        "JOIN jobs AS job ON job.revision_id",
    );
    let files = [
        (
            "accept_decide",
            include_str!("../src/sqlite/queries/accept_decide.sql"),
        ),
        (
            "accept_params",
            include_str!("../src/sqlite/queries/accept_params.sql"),
        ),
        (
            "accept_retain",
            include_str!("../src/sqlite/queries/accept_retain.sql"),
        ),
        (
            "accept_revisions",
            include_str!("../src/sqlite/queries/accept_revisions.sql"),
        ),
        (
            "accept_move_heads",
            include_str!("../src/sqlite/queries/accept_move_heads.sql"),
        ),
        (
            "accept_queue",
            include_str!("../src/sqlite/queries/accept_queue.sql"),
        ),
        (
            "accept_validity",
            include_str!("../src/sqlite/queries/accept_validity.sql"),
        ),
        (
            "accept_duplicates",
            include_str!("../src/sqlite/queries/accept_duplicates.sql"),
        ),
        // The step as it was (a plain join of the wave and the jobs), to show the check
        // catches it.
        ("mutant", mutant.as_str()),
    ];
    let mut scans = Vec::new();
    let mut explained = 0;
    for (name, text) in files {
        let text: String = text
            .lines()
            .filter(|line| !line.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        for statement in text.split(";\n").map(str::trim).filter(|s| !s.is_empty()) {
            let statement = statement.trim_end_matches(';');
            let sql = format!("EXPLAIN QUERY PLAN {statement}");
            let mut query = sqlx::query(&sql);
            for _ in 0..statement.matches('?').count() {
                query = query.bind(None::<String>);
            }
            let rows = query
                .fetch_all(&mut connection)
                .await
                .unwrap_or_else(|error| panic!("{name}: {error}\n{statement}"));
            explained += 1;
            for row in rows {
                let detail: String = row.try_get("detail").expect("detail");
                let Some(table) = detail.strip_prefix("SCAN ") else {
                    continue;
                };
                let table = table.split_whitespace().next().unwrap_or_default();
                if detail.contains("VIRTUAL TABLE")
                    || detail.starts_with("SCAN CONSTANT ROW")
                    || SCANNABLE.contains(&table)
                    || !reads(statement, table)
                {
                    continue;
                }
                scans.push((
                    name,
                    detail,
                    statement.chars().take(160).collect::<String>(),
                ));
            }
        }
    }
    assert!(explained > 20, "only {explained} statements explained");
    let (caught, rest): (Vec<_>, Vec<_>) = scans
        .into_iter()
        .partition(|(name, _, _)| *name == "mutant");
    assert!(
        !caught.is_empty(),
        "the check misses the scan it was written for"
    );
    assert!(
        rest.is_empty(),
        "acceptance statements that scan a ledger table:\n{}",
        rest.iter()
            .map(|(name, detail, statement)| format!("- {name}: {detail}\n  {statement}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
