//! A folder connector's runs against real ledgers (an SQLite file, a PostgreSQL server) and a
//! real folder: what a run accepts, skips, tombstones and refuses; that unchanged files are
//! not read again; that a missing folder changes nothing; that a tombstoning removal empties
//! what the connector created and nothing else; that readers from POSIX access (real users,
//! groups and ACLs) and from a git rules file are kept apart from content.

use std::path::Path;
use std::sync::Arc;

use connectors::confine::Roots;
use connectors::Runner;
use receipts::model::{
    ConnectorChange, ConnectorCommand, ConnectorKind, FailureClass, JobKind, LeaseToken,
    NewConnector, Removal, SyncReport,
};
use receipts::{Ledger, ManualClock, SourceListing, SqliteLedger, SqliteOptions};
use testkit::conformance::{put, START};
use testkit::git::{commit, git};
use worker::Work;

/// Every test folder lies in the system's temporary folder: that is the runner's root.
fn temp_roots() -> Roots {
    Roots::new(vec![std::env::temp_dir()])
}

fn command(change: ConnectorChange) -> ConnectorCommand {
    ConnectorCommand {
        change,
        actor: "test:operator".to_owned(),
        reason: "runner test".to_owned(),
    }
}

/// A connector of `dataset` on `root`, files up to 1,000 bytes, runs a minute apart.
fn new_connector(
    dataset: &str,
    kind: ConnectorKind,
    root: &Path,
    git_ref: Option<&str>,
) -> NewConnector {
    NewConnector {
        dataset: dataset.to_owned(),
        kind,
        location: root.to_string_lossy().into_owned(),
        git_ref: git_ref.map(str::to_owned),
        include: vec![],
        exclude: vec![],
        max_file_bytes: 1_000,
        interval_ms: 60_000,
        access: Default::default(),
        credentials: None,
    }
}

fn write(root: &Path, key: &str, text: &str) {
    let path = root.join(key);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

/// Claims the connector's due run and runs it; completes it when it succeeds. Answers the
/// run's result and its report.
async fn run_once(
    ledger: &Arc<dyn Ledger>,
    clock: &ManualClock,
    id: uuid::Uuid,
) -> (Result<(), receipts::Failure>, Option<SyncReport>) {
    run_once_in(ledger, clock, id, &temp_roots()).await
}

/// [`run_once`] by a runner whose only root is `roots`.
async fn run_once_in(
    ledger: &Arc<dyn Ledger>,
    clock: &ManualClock,
    id: uuid::Uuid,
    roots: &Roots,
) -> (Result<(), receipts::Failure>, Option<SyncReport>) {
    // Whatever is due: a connector's run is scheduled one interval after the last.
    clock.advance(3_600_000_000);
    let jobs = ledger.claim("test-worker", 100).await.expect("claim");
    // Projection is not under test here: its jobs end first (the run's acceptances would
    // supersede them).
    for job in jobs.iter().filter(|job| job.kind != JobKind::Sync) {
        let token = LeaseToken::of(job).expect("leased");
        ledger.complete(&token).await.expect("complete other");
    }
    let mut result = None;
    let mut ran = None;
    for job in &jobs {
        let token = LeaseToken::of(job).expect("leased");
        if job.kind == JobKind::Sync && job.connector_id == Some(id) {
            let remote = connectors::remote::RemoteSettings::none(&std::env::temp_dir());
            let outcome = Runner::new(ledger.clone(), roots.clone(), remote)
                .run(job)
                .await;
            match &outcome {
                Ok(()) => drop(ledger.complete(&token).await.expect("complete")),
                Err(failure) => drop(ledger.fail(&token, failure.clone()).await.expect("fail")),
            }
            result = Some(outcome);
            ran = Some(job.id);
        } else if job.kind == JobKind::Sync {
            // Another connector's run: it waits for its own turn.
            ledger.release(&token).await.expect("release");
        }
    }
    let result = result.expect("the connector's run was due");
    let runs = ledger.sync_runs(id, 10).await.expect("runs");
    let report = runs
        .iter()
        .find(|run| Some(run.job.id) == ran)
        .and_then(|run| run.report.clone());
    (result, report)
}

async fn heads(ledger: &Arc<dyn Ledger>) -> Vec<SourceListing> {
    heads_in(ledger, "docs").await
}

async fn heads_in(ledger: &Arc<dyn Ledger>, dataset: &str) -> Vec<SourceListing> {
    ledger
        .list_sources(dataset, "", None, 1000)
        .await
        .expect("list")
        .into_iter()
        .filter(|head| !head.tombstone)
        .collect()
}

fn keys(heads: &[SourceListing]) -> Vec<&str> {
    heads.iter().map(|head| head.source_key.as_str()).collect()
}

async fn a_folder_is_kept_equal_to_its_dataset(ledger: Arc<dyn Ledger>, clock: Arc<ManualClock>) {
    let folder = tempfile::tempdir().expect("tempdir");
    let root = folder.path();
    write(root, "a.md", "# A\n\nalpha");
    write(root, "b.md", "# B\n\nbeta");
    write(root, "notes.txt", "plain text notes");
    write(root, "nested/d.md", "# D\n\ndelta");
    write(root, "big.md", &"x".repeat(5_000));
    write(root, "image.png", "not really a png");
    write(root, "api.md", "the folder's copy");
    let outside = tempfile::tempdir().expect("tempdir");
    write(outside.path(), "secret.md", "outside the root");
    std::os::unix::fs::symlink(outside.path().join("secret.md"), root.join("leak.md"))
        .expect("symlink");
    // A source API ingest created: the connector never overwrites it.
    let api = ledger
        .accept(vec![put("docs", "api.md", "from the API")])
        .await;
    assert!(api.iter().all(Result::is_ok));

    let created = ledger
        .change_connector(command(ConnectorChange::Create(new_connector(
            "docs",
            ConnectorKind::Folder,
            root,
            None,
        ))))
        .await
        .expect("create");
    let id = created.connector.id;

    let (result, report) = run_once(&ledger, &clock, id).await;
    assert!(result.is_ok(), "{result:?}");
    let report = report.expect("a report");
    assert_eq!(
        (
            report.added,
            report.changed,
            report.removed,
            report.conflicts
        ),
        (4, 0, 0, 1),
        "{report:?}"
    );
    assert_eq!(report.skipped, 3, "big.md, image.png, leak.md: {report:?}");
    let codes: Vec<(&str, &str)> = report
        .files
        .iter()
        .map(|file| (file.path.as_str(), file.code.as_str()))
        .collect();
    assert!(codes.contains(&("big.md", "too_large")), "{codes:?}");
    assert!(
        codes.contains(&("image.png", "unsupported_format")),
        "{codes:?}"
    );
    assert!(
        codes.contains(&("leak.md", "link_leaves_root")),
        "{codes:?}"
    );
    assert!(codes.contains(&("api.md", "owned_by_another")), "{codes:?}");
    let now = heads(&ledger).await;
    assert_eq!(
        keys(&now),
        ["a.md", "api.md", "b.md", "nested/d.md", "notes.txt"]
    );
    let api_head = now.iter().find(|head| head.source_key == "api.md");
    assert_eq!(api_head.and_then(|head| head.owner.clone()), None);
    let b = ledger
        .source("docs", "b.md")
        .await
        .expect("source")
        .expect("b");
    assert_eq!(b.head.actor, format!("connector:{id}"));
    assert_eq!(b.head.metadata["path"], "b.md");

    // Nothing changed: only the file in conflict is read again.
    let (result, report) = run_once(&ledger, &clock, id).await;
    assert!(result.is_ok(), "{result:?}");
    let report = report.expect("a report");
    assert_eq!((report.added, report.changed, report.removed), (0, 0, 0));
    assert_eq!((report.unchanged, report.hashed), (4, 1), "{report:?}");

    // An edit, a deletion, a new file.
    std::thread::sleep(std::time::Duration::from_millis(20));
    write(root, "b.md", "# B\n\nbeta, edited");
    std::fs::remove_file(root.join("a.md")).expect("rm");
    write(root, "e.md", "# E\n\nepsilon");
    let (result, report) = run_once(&ledger, &clock, id).await;
    assert!(result.is_ok(), "{result:?}");
    let report = report.expect("a report");
    assert_eq!(
        (
            report.added,
            report.changed,
            report.removed,
            report.unchanged
        ),
        (1, 1, 1, 2),
        "{report:?}"
    );
    assert_eq!(report.hashed, 3, "b.md, e.md and api.md: {report:?}");
    assert_eq!(
        keys(&heads(&ledger).await),
        ["api.md", "b.md", "e.md", "nested/d.md", "notes.txt"]
    );
    let a = ledger
        .source("docs", "a.md")
        .await
        .expect("source")
        .expect("a");
    assert!(a.deleted);
    assert_eq!(
        a.head.reason.as_deref(),
        Some(format!("removed from {}", root.display()).as_str())
    );

    // A folder that disappears fails the run and removes nothing.
    let moved = root.with_extension("moved");
    std::fs::rename(root, &moved).expect("move the folder away");
    let (result, report) = run_once(&ledger, &clock, id).await;
    let failure = result.expect_err("a missing folder fails the run");
    assert_eq!(failure.code, "location_unavailable");
    assert!(matches!(failure.class, FailureClass::Retryable { .. }));
    assert_eq!(report, None, "it failed before it changed anything");
    assert_eq!(heads(&ledger).await.len(), 5);
    std::fs::rename(&moved, root).expect("move it back");

    // Removed with its sources tombstoned: what it created goes, the API's source stays.
    let removed = ledger
        .change_connector(command(ConnectorChange::Remove {
            id,
            removal: Removal::Tombstone,
        }))
        .await
        .expect("remove");
    assert!(removed.run.is_some());
    let (result, report) = run_once(&ledger, &clock, id).await;
    assert!(result.is_ok(), "{result:?}");
    let report = report.expect("a report");
    assert_eq!(report.removed, 4, "{report:?}");
    assert_eq!(keys(&heads(&ledger).await), ["api.md"]);
    // Its keys are free again.
    let again = ledger
        .accept(vec![put("docs", "b.md", "the API's now")])
        .await;
    assert!(again.iter().all(Result::is_ok), "{again:?}");
}

/// A location inside the root when the connector was made, and outside it by the time a run
/// opens it, and repositories whose objects lie outside: every run is refused with
/// `location_refused`, its report says so, and nothing is accepted or removed. A link that
/// stays inside the root keeps working.
async fn escapes_are_refused_at_every_run(ledger: Arc<dyn Ledger>, clock: Arc<ManualClock>) {
    let roots_dir = tempfile::tempdir().expect("roots");
    let outside = tempfile::tempdir().expect("outside");
    let root = roots_dir.path();
    let roots = Roots::new(vec![root.to_path_buf()]);
    write(outside.path(), "secret.md", "# Secret\n\noutside the root");
    let outrepo = outside.path().join("outrepo");
    std::fs::create_dir(&outrepo).expect("outrepo");
    git(&outrepo, &["init", "--quiet", "--initial-branch=main"]);
    write(&outrepo, "secret.md", "# Secret\n\nin a repository outside");
    commit(&outrepo, "outside");
    let create = |dataset: &str, kind, location: &Path, git_ref: Option<&str>| {
        let ledger = ledger.clone();
        let new = new_connector(dataset, kind, location, git_ref);
        async move {
            ledger
                .change_connector(command(ConnectorChange::Create(new)))
                .await
                .expect("create")
                .connector
                .id
        }
    };
    let refused = |result: Result<(), receipts::Failure>, report: Option<SyncReport>| {
        let failure = result.expect_err("the run is refused");
        assert_eq!(failure.code, "location_refused", "{failure:?}");
        assert_eq!(failure.class, FailureClass::Permanent, "{failure:?}");
        let report = report.expect("a report");
        assert_eq!(report.stage, "location_refused", "{report:?}");
        assert!(
            report
                .files
                .iter()
                .any(|file| file.code == "location_refused"),
            "{report:?}"
        );
    };

    // 1. A location that did not exist when the connector was made, a link out now.
    let later = create("later", ConnectorKind::Folder, &root.join("later"), None).await;
    std::os::unix::fs::symlink(outside.path(), root.join("later")).expect("link");
    let (result, report) = run_once_in(&ledger, &clock, later, &roots).await;
    refused(result, report);
    assert!(heads_in(&ledger, "later").await.is_empty());

    // 2. A folder replaced by a link after its first run: refused, and nothing removed.
    write(&root.join("swap"), "a.md", "# A\n\ninside");
    let swap = create("swap", ConnectorKind::Folder, &root.join("swap"), None).await;
    let (result, _) = run_once_in(&ledger, &clock, swap, &roots).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(keys(&heads_in(&ledger, "swap").await), ["a.md"]);
    std::fs::rename(root.join("swap"), root.join("swap.orig")).expect("mv");
    std::os::unix::fs::symlink(outside.path(), root.join("swap")).expect("link");
    let (result, report) = run_once_in(&ledger, &clock, swap, &roots).await;
    refused(result, report);
    assert_eq!(
        keys(&heads_in(&ledger, "swap").await),
        ["a.md"],
        "nothing removed"
    );

    // A link that stays inside the root keeps working.
    std::fs::remove_file(root.join("swap")).expect("rm link");
    std::os::unix::fs::symlink("swap.orig", root.join("swap")).expect("link in");
    let (result, _) = run_once_in(&ledger, &clock, swap, &roots).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(keys(&heads_in(&ledger, "swap").await), ["a.md"]);

    // 3. A work tree whose `.git` file points at a repository outside.
    std::fs::create_dir(root.join("gitfile")).expect("gitfile");
    std::fs::write(
        root.join("gitfile/.git"),
        format!("gitdir: {}\n", outrepo.join(".git").display()),
    )
    .expect(".git file");
    let gitfile = create(
        "gitfile",
        ConnectorKind::Git,
        &root.join("gitfile"),
        Some("main"),
    )
    .await;
    let (result, report) = run_once_in(&ledger, &clock, gitfile, &roots).await;
    refused(result, report);
    assert!(heads_in(&ledger, "gitfile").await.is_empty());

    // 4. A bare repository whose objects come from an alternate store outside.
    git(
        root,
        &[
            "clone",
            "--quiet",
            "--bare",
            "--shared",
            &outrepo.to_string_lossy(),
            "alt.git",
        ],
    );
    assert!(root.join("alt.git/objects/info/alternates").exists());
    let alt = create(
        "alt",
        ConnectorKind::Git,
        &root.join("alt.git"),
        Some("main"),
    )
    .await;
    let (result, report) = run_once_in(&ledger, &clock, alt, &roots).await;
    refused(result, report);
    assert!(heads_in(&ledger, "alt").await.is_empty());

    // The same repository with its objects copied in is read.
    git(&root.join("alt.git"), &["repack", "-a", "-d", "--quiet"]);
    std::fs::remove_file(root.join("alt.git/objects/info/alternates")).expect("rm alternates");
    let (result, _) = run_once_in(&ledger, &clock, alt, &roots).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(keys(&heads_in(&ledger, "alt").await), ["secret.md"]);
}

/// An SQLite ledger in its own temporary folder (kept alive with it), on a manual clock.
async fn sqlite_ledger() -> (Arc<dyn Ledger>, Arc<ManualClock>, tempfile::TempDir) {
    let directory = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(START));
    let ledger = SqliteLedger::open(
        SqliteOptions::new(directory.path().join("ledger.db")),
        clock.clone(),
    )
    .await
    .expect("open");
    (Arc::new(ledger), clock, directory)
}

/// A PostgreSQL ledger on a server of its own (kept alive with it), on a manual clock.
async fn postgres_ledger() -> (
    Arc<dyn Ledger>,
    Arc<ManualClock>,
    testkit::postgres::PostgresServer,
) {
    let server = testkit::postgres::PostgresServer::start().expect("start PostgreSQL");
    let url = server.create_database("ledger").expect("database");
    let clock = Arc::new(ManualClock::new(START));
    let ledger = receipts::PostgresLedger::open_with(
        receipts::PostgresOptions::new(url),
        receipts::LedgerClock::Injected(clock.clone()),
        Arc::new(receipts::faults::FaultPlan::default()),
    )
    .await
    .expect("open");
    (Arc::new(ledger), clock, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escapes_are_refused_at_every_run_on_sqlite() {
    let (ledger, clock, _directory) = sqlite_ledger().await;
    escapes_are_refused_at_every_run(ledger, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escapes_are_refused_at_every_run_on_postgres() {
    let (ledger, clock, _server) = postgres_ledger().await;
    escapes_are_refused_at_every_run(ledger, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_is_kept_equal_to_its_dataset_on_sqlite() {
    let (ledger, clock, _directory) = sqlite_ledger().await;
    a_folder_is_kept_equal_to_its_dataset(ledger, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_is_kept_equal_to_its_dataset_on_postgres() {
    let (ledger, clock, _server) = postgres_ledger().await;
    a_folder_is_kept_equal_to_its_dataset(ledger, clock).await;
}

/// A git connector on a repository made here: after each step (commits, a rename, a delete, a
/// force-push back to an older commit) the dataset's live heads are exactly the files at the
/// ref; a file over the limit, a link and an unread format are skipped with their reasons;
/// a run with no change reads no blob and only the root tree; a commit that changes one
/// folder reads only the trees on its path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_git_connector_follows_its_ref_on_sqlite() {
    let directory = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(START));
    let ledger: Arc<dyn Ledger> = Arc::new(
        SqliteLedger::open(
            SqliteOptions::new(directory.path().join("ledger.db")),
            clock.clone(),
        )
        .await
        .expect("open"),
    );
    let repository = tempfile::tempdir().expect("repository");
    let root = repository.path();
    git(root, &["init", "--quiet", "--initial-branch=main"]);
    write(root, "a.md", "# A\n\nalpha");
    write(root, "b.md", "# B\n\nbeta");
    write(root, "docs/c.md", "# C\n\ngamma");
    write(root, "docs/deep/d.md", "# D\n\ndelta");
    write(root, "big.md", &"x".repeat(5_000));
    write(root, "image.png", "not really a png");
    std::os::unix::fs::symlink("/etc/hostname", root.join("link.md")).expect("symlink");
    let first = commit(root, "first");

    let created = ledger
        .change_connector(command(ConnectorChange::Create(new_connector(
            "docs",
            ConnectorKind::Git,
            root,
            Some("main"),
        ))))
        .await
        .expect("create");
    let id = created.connector.id;
    let (result, report) = run_once(&ledger, &clock, id).await;
    assert!(result.is_ok(), "{result:?}");
    let report = report.expect("a report");
    assert_eq!(report.commit.as_deref(), Some(first.as_str()));
    assert_eq!((report.added, report.skipped), (4, 3), "{report:?}");
    let codes: Vec<(&str, &str)> = report
        .files
        .iter()
        .map(|file| (file.path.as_str(), file.code.as_str()))
        .collect();
    assert!(codes.contains(&("big.md", "too_large")), "{codes:?}");
    assert!(
        codes.contains(&("link.md", "link_leaves_root")),
        "{codes:?}"
    );
    assert!(
        codes.contains(&("image.png", "unsupported_format")),
        "{codes:?}"
    );
    assert_eq!(
        keys(&heads(&ledger).await),
        ["a.md", "b.md", "docs/c.md", "docs/deep/d.md"]
    );
    let c = ledger
        .source("docs", "docs/c.md")
        .await
        .expect("source")
        .expect("c");
    assert_eq!(c.head.metadata["commit"], first.as_str());
    assert_eq!(c.head.metadata["author"], testkit::git::AUTHOR);
    assert_eq!(c.head.metadata["commit_time"], testkit::git::COMMIT_TIME);

    // No change: the root tree's id is recorded, so nothing below it is read.
    let (result, report) = run_once(&ledger, &clock, id).await;
    assert!(result.is_ok(), "{result:?}");
    let report = report.expect("a report");
    assert_eq!((report.hashed, report.trees_read), (0, 0), "{report:?}");
    assert_eq!(report.unchanged, 4);

    // An edit in docs/, a rename and a delete at the root: docs/deep is not read.
    write(root, "docs/c.md", "# C\n\ngamma, edited");
    git(root, &["mv", "a.md", "e.md"]);
    git(root, &["rm", "--quiet", "b.md"]);
    let second = commit(root, "second");
    let (result, report) = run_once(&ledger, &clock, id).await;
    assert!(result.is_ok(), "{result:?}");
    let report = report.expect("a report");
    assert_eq!(
        (
            report.added,
            report.changed,
            report.removed,
            report.unchanged
        ),
        (1, 1, 2, 1),
        "{report:?}"
    );
    assert_eq!(
        report.trees_read, 2,
        "the root and docs/, not docs/deep: {report:?}"
    );
    assert_eq!(
        keys(&heads(&ledger).await),
        ["docs/c.md", "docs/deep/d.md", "e.md"]
    );
    let b = ledger
        .source("docs", "b.md")
        .await
        .expect("source")
        .expect("b");
    assert!(b.deleted);
    assert_eq!(
        b.head.reason.as_deref(),
        Some(format!("removed from {} at {second}", root.display()).as_str())
    );

    // A force-push back to the first commit: compared like any other tree.
    git(root, &["update-ref", "refs/heads/main", &first]);
    let (result, report) = run_once(&ledger, &clock, id).await;
    assert!(result.is_ok(), "{result:?}");
    let report = report.expect("a report");
    assert_eq!(report.commit.as_deref(), Some(first.as_str()));
    assert_eq!(
        (report.added, report.changed, report.removed),
        (2, 1, 1),
        "{report:?}"
    );
    assert_eq!(
        keys(&heads(&ledger).await),
        ["a.md", "b.md", "docs/c.md", "docs/deep/d.md"]
    );
    let c = ledger
        .source("docs", "docs/c.md")
        .await
        .expect("source")
        .expect("c");
    assert!(
        c.head.metadata["commit"] == first.as_str(),
        "{:?}",
        c.head.metadata
    );

    // A ref that names nothing fails the run and changes nothing.
    ledger
        .change_connector(command(ConnectorChange::Remove {
            id,
            removal: Removal::Keep,
        }))
        .await
        .expect("remove");
    let missing = ledger
        .change_connector(command(ConnectorChange::Create(new_connector(
            "other",
            ConnectorKind::Git,
            root,
            Some("no-such-branch"),
        ))))
        .await
        .expect("create");
    let before_docs = heads(&ledger).await;
    let (result, report) = run_once(&ledger, &clock, missing.connector.id).await;
    let failure = result.expect_err("an unknown ref fails the run");
    assert_eq!(failure.code, "unknown_ref");
    // Nothing changed: no source in its dataset, the other dataset's heads as they were, and
    // no file indexed.
    assert!(heads_in(&ledger, "other").await.is_empty());
    assert_eq!(heads(&ledger).await, before_docs);
    if let Some(report) = report {
        assert_eq!(
            (report.added, report.changed, report.removed),
            (0, 0, 0),
            "{report:?}"
        );
    }
    let indexed = ledger
        .connector_files(missing.connector.id)
        .await
        .expect("index");
    assert!(indexed.is_empty(), "{indexed:?}");
}

/// Runs a system command that must succeed (as root: `useradd`, `setfacl`, `chmod`), retried
/// while another test holds the password file's lock.
fn system(program: &str, args: &[&str]) {
    for attempt in 0.. {
        let output = std::process::Command::new(program)
            .args(args)
            .output()
            .unwrap_or_else(|error| {
                panic!("{program} cannot run ({error}): scripts/setup-acl installs it")
            });
        if output.status.success() {
            return;
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        if attempt < 50 && stderr.contains("lock") {
            std::thread::sleep(std::time::Duration::from_millis(100));
            continue;
        }
        panic!("{program} {args:?}: {stderr} (the POSIX access tests run as root, as CI does)");
    }
}

/// Users and groups made for one test, removed when it ends.
struct Accounts {
    users: Vec<String>,
    groups: Vec<String>,
}

impl Accounts {
    /// Users `<tag>alice` and `<tag>bob`, groups `<tag>eng` and `<tag>hr`, with `tag` unique
    /// to this process and test.
    fn make(test: &str) -> (Accounts, String) {
        let tag = format!("ct{}{test}", std::process::id() % 100_000);
        let mut accounts = Accounts {
            users: Vec::new(),
            groups: Vec::new(),
        };
        for group in ["eng", "hr"] {
            let name = format!("{tag}{group}");
            system("groupadd", &[&name]);
            accounts.groups.push(name);
        }
        for user in ["alice", "bob"] {
            let name = format!("{tag}{user}");
            system("useradd", &["-M", "-N", "-g", &format!("{tag}eng"), &name]);
            accounts.users.push(name);
        }
        (accounts, tag)
    }
}

impl Drop for Accounts {
    fn drop(&mut self) {
        for user in &self.users {
            let _ = std::process::Command::new("userdel").arg(user).output();
        }
        for group in &self.groups {
            let _ = std::process::Command::new("groupdel").arg(group).output();
        }
    }
}

/// The readers the ledger holds for a source.
async fn readers_of(ledger: &Arc<dyn Ledger>, key: &str) -> Option<Vec<String>> {
    ledger.access_of("docs", key).await.expect("access").readers
}

/// A folder connector reading POSIX access, on real users, groups, modes and ACLs: each file's
/// readers come from its owner, group, mode bits and ACL entries; `chmod`, `chgrp` and
/// `setfacl` without a content change are picked up by the next run as access changes (no new
/// revision); a file anyone may read takes the dataset's default.
async fn posix_access_is_kept_apart_from_content(
    ledger: Arc<dyn Ledger>,
    clock: Arc<ManualClock>,
    engine: &str,
) {
    let (_accounts, tag) = Accounts::make(engine);
    let user = |name: &str| format!("user:{tag}{name}");
    let group = |name: &str| format!("group:{tag}{name}");
    let folder = tempfile::tempdir().expect("tempdir");
    let root = folder.path();
    for (key, owner, owning_group, mode) in [
        ("team.md", "alice", "eng", "640"),
        ("private.md", "bob", "eng", "600"),
        ("public.md", "alice", "eng", "644"),
        ("shared.md", "alice", "eng", "600"),
    ] {
        write(root, key, &format!("# {key}\n\nwords about {key}"));
        let path = root.join(key);
        let path = path.to_str().expect("a UTF-8 path");
        system(
            "chown",
            &[&format!("{tag}{owner}:{tag}{owning_group}"), path],
        );
        system("chmod", &[mode, path]);
    }
    let shared = root.join("shared.md");
    let shared = shared.to_str().expect("a UTF-8 path");
    system(
        "setfacl",
        &["-m", &format!("u:{tag}bob:r,g:{tag}hr:r"), shared],
    );
    let mut new = new_connector("docs", ConnectorKind::Folder, root, None);
    new.access.from = Some(receipts::model::AccessFrom::Posix);
    let created = ledger
        .change_connector(command(ConnectorChange::Create(new)))
        .await
        .expect("create");
    let id = created.connector.id;
    let (result, report) = run_once(&ledger, &clock, id).await;
    assert!(result.is_ok(), "{result:?}");
    let report = report.expect("a report");
    assert_eq!((report.added, report.access_changed), (4, 3), "{report:?}");
    assert_eq!(
        readers_of(&ledger, "team.md").await,
        Some(vec![group("eng"), user("alice")])
    );
    assert_eq!(
        readers_of(&ledger, "private.md").await,
        Some(vec![user("bob")])
    );
    assert_eq!(
        readers_of(&ledger, "public.md").await,
        None,
        "anyone may read it"
    );
    assert_eq!(
        readers_of(&ledger, "shared.md").await,
        Some(vec![group("hr"), user("alice"), user("bob")])
    );
    let bob = [user("bob"), group("hr")];
    for (key, readable) in [
        ("team.md", false),
        ("private.md", true),
        ("public.md", true),
        ("shared.md", true),
    ] {
        assert_eq!(
            ledger
                .may_read(Some(&bob), "docs", key)
                .await
                .expect("may read"),
            readable,
            "{key}"
        );
    }
    let revision = |view: Option<receipts::model::SourceView>| {
        let view = view.expect("a source");
        (view.head.id, view.revisions.len())
    };
    let before = revision(ledger.source("docs", "team.md").await.expect("source"));

    // `chmod 600`: the group loses the file, and nothing else changes.
    system(
        "chmod",
        &["600", root.join("team.md").to_str().expect("path")],
    );
    let (result, report) = run_once(&ledger, &clock, id).await;
    assert!(result.is_ok(), "{result:?}");
    let report = report.expect("a report");
    assert_eq!(
        (
            report.added,
            report.changed,
            report.unchanged,
            report.access_changed
        ),
        (0, 0, 4, 1),
        "{report:?}"
    );
    assert_eq!(
        readers_of(&ledger, "team.md").await,
        Some(vec![user("alice")])
    );
    assert_eq!(
        revision(ledger.source("docs", "team.md").await.expect("source")),
        before,
        "an access change is no new revision"
    );
    // `setfacl -x` and `chgrp` with `chmod g+r`: two more access changes.
    system("setfacl", &["-x", &format!("u:{tag}bob"), shared]);
    let team = root.join("team.md");
    let team = team.to_str().expect("path");
    system("chgrp", &[&format!("{tag}hr"), team]);
    system("chmod", &["640", team]);
    let (result, report) = run_once(&ledger, &clock, id).await;
    assert!(result.is_ok(), "{result:?}");
    let report = report.expect("a report");
    assert_eq!(
        (report.changed, report.access_changed),
        (0, 2),
        "{report:?}"
    );
    assert_eq!(
        readers_of(&ledger, "shared.md").await,
        Some(vec![group("hr"), user("alice")])
    );
    assert_eq!(
        readers_of(&ledger, "team.md").await,
        Some(vec![group("hr"), user("alice")])
    );
    // Nothing changed: nothing recorded.
    let (result, report) = run_once(&ledger, &clock, id).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(report.expect("a report").access_changed, 0);
    // History holds every change with the connector as its actor.
    let trail = ledger
        .history("access", "docs/team.md")
        .await
        .expect("history");
    assert!(
        trail.len() >= 3
            && trail
                .iter()
                .all(|entry| entry.actor == format!("connector:{id}")),
        "{trail:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_access_is_kept_apart_from_content_on_sqlite() {
    let (ledger, clock, _directory) = sqlite_ledger().await;
    posix_access_is_kept_apart_from_content(ledger, clock, "s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_access_is_kept_apart_from_content_on_postgres() {
    let (ledger, clock, _server) = postgres_ledger().await;
    posix_access_is_kept_apart_from_content(ledger, clock, "g").await;
}

/// A git connector with a rules file: each file takes the last matching rule's readers, and
/// the connector's own readers where none matches; a commit that changes only the rules is
/// an access change (no new revision); a rules file that does not parse, or is gone, fails
/// the run and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_access_rules_are_kept_apart_from_content() {
    let (ledger, clock, _directory) = sqlite_ledger().await;
    let repository = tempfile::tempdir().expect("repository");
    let root = repository.path();
    git(root, &["init", "--quiet", "--initial-branch=main"]);
    write(root, "guide.md", "# Guide\n\nfor everyone in engineering");
    write(root, "hr/pay.md", "# Pay\n\nfor HR");
    write(root, "hr/handbook.md", "# Handbook\n\nfor everyone");
    write(root, "notes.txt", "left to the connector's readers");
    write(
        root,
        ".cairn/access",
        "# who reads what\n*.md group:eng\nhr/** group:hr   # HR only\nhr/handbook.md default\n",
    );
    commit(root, "first");
    let mut new = new_connector("docs", ConnectorKind::Git, root, Some("main"));
    new.access.file = Some(".cairn/access".to_owned());
    new.access.readers = Some(vec!["user:ops".to_owned()]);
    let created = ledger
        .change_connector(command(ConnectorChange::Create(new)))
        .await
        .expect("create");
    let id = created.connector.id;
    let (result, report) = run_once(&ledger, &clock, id).await;
    assert!(result.is_ok(), "{result:?}");
    let report = report.expect("a report");
    assert_eq!((report.added, report.access_changed), (4, 3), "{report:?}");
    let eng = Some(vec!["group:eng".to_owned()]);
    let hr = Some(vec!["group:hr".to_owned()]);
    assert_eq!(readers_of(&ledger, "guide.md").await, eng);
    assert_eq!(readers_of(&ledger, "hr/pay.md").await, hr);
    assert_eq!(readers_of(&ledger, "hr/handbook.md").await, None);
    assert_eq!(
        readers_of(&ledger, "notes.txt").await,
        Some(vec!["user:ops".to_owned()])
    );
    let pay = ledger
        .source("docs", "hr/pay.md")
        .await
        .expect("source")
        .expect("pay");

    // Only the rules change: an access change, no new revision.
    write(
        root,
        ".cairn/access",
        "*.md group:eng\nhr/** group:hr user:alice\nhr/handbook.md default\n",
    );
    commit(root, "alice reads HR");
    let (result, report) = run_once(&ledger, &clock, id).await;
    assert!(result.is_ok(), "{result:?}");
    let report = report.expect("a report");
    assert_eq!(
        (report.added, report.changed, report.access_changed),
        (0, 0, 1),
        "{report:?}"
    );
    assert_eq!(
        readers_of(&ledger, "hr/pay.md").await,
        Some(vec!["group:hr".to_owned(), "user:alice".to_owned()])
    );
    let after = ledger
        .source("docs", "hr/pay.md")
        .await
        .expect("source")
        .expect("pay");
    assert_eq!(after.head.id, pay.head.id);

    // A rules file that does not parse fails the run and changes nothing.
    write(root, ".cairn/access", "*.md group:eng\nhr/**\n");
    write(root, "guide.md", "# Guide\n\nedited");
    commit(root, "broken rules");
    let (result, report) = run_once(&ledger, &clock, id).await;
    let failure = result.expect_err("a broken rules file fails the run");
    assert_eq!(failure.code, "invalid_access_file");
    assert!(failure.message.contains("line 2"), "{}", failure.message);
    let report = report.expect("a report");
    assert_eq!(
        (report.changed, report.access_changed),
        (0, 0),
        "{report:?}"
    );
    assert_eq!(
        readers_of(&ledger, "hr/pay.md").await,
        Some(vec!["group:hr".to_owned(), "user:alice".to_owned()])
    );
    // Gone: the same.
    git(root, &["rm", "--quiet", ".cairn/access"]);
    commit(root, "no rules");
    let (result, _) = run_once(&ledger, &clock, id).await;
    assert_eq!(
        result.expect_err("a missing rules file fails the run").code,
        "access_file_missing"
    );
    assert_eq!(readers_of(&ledger, "guide.md").await, eng);
}
