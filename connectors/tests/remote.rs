//! Remote git connectors against real remotes on loopback, from Debian's packages: `git
//! daemon` (git://), `git http-backend` behind an HTTP server that wants a token, and `sshd`
//! (OpenSSH) with a client key and a `known_hosts` file. A
//! run fetches into the connector's mirror and then lists it: commits arrive, a force-push is
//! followed, a deleted ref, an unreachable remote, a wrong credential and a pack over the
//! limit each fail the run and remove nothing.

use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use connectors::confine::Roots;
use connectors::remote::{Credentials, RemoteSettings};
use connectors::Runner;
use receipts::model::{
    ConnectorChange, ConnectorCommand, ConnectorKind, FailureClass, JobKind, LeaseToken,
    NewConnector, SyncReport,
};
use receipts::{Ledger, ManualClock, SqliteLedger, SqliteOptions};
use testkit::conformance::START;
use testkit::git::{commit, git};
use testkit::git_servers::{ssh_key, GitDaemon, GitHttp, SshServer};
use worker::Work;

async fn sqlite_ledger() -> (Arc<dyn Ledger>, Arc<ManualClock>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(START));
    let ledger = SqliteLedger::open(
        SqliteOptions::new(dir.path().join("ledger.db")),
        clock.clone(),
    )
    .await
    .expect("open the ledger");
    (Arc::new(ledger), clock, dir)
}

/// Settings that allow loopback remotes, with mirrors and credentials under `data`.
fn settings(data: &Path) -> RemoteSettings {
    RemoteSettings {
        hosts: vec!["127.0.0.1".to_owned()],
        ..RemoteSettings::none(data)
    }
}

async fn create(
    ledger: &Arc<dyn Ledger>,
    dataset: &str,
    location: &str,
    credentials: Option<&str>,
) -> uuid::Uuid {
    ledger
        .change_connector(ConnectorCommand {
            change: ConnectorChange::Create(NewConnector {
                dataset: dataset.to_owned(),
                kind: ConnectorKind::Git,
                location: location.to_owned(),
                git_ref: Some("main".to_owned()),
                include: vec![],
                exclude: vec![],
                max_file_bytes: 1 << 20,
                interval_ms: 60_000,
                access: Default::default(),
                credentials: credentials.map(str::to_owned),
            }),
            actor: "test:operator".to_owned(),
            reason: "remote test".to_owned(),
        })
        .await
        .expect("create the connector")
        .connector
        .id
}

/// Claims the connector's due run, runs it with `remote`, completes or fails it; answers the
/// run's result and its report.
async fn run_once(
    ledger: &Arc<dyn Ledger>,
    clock: &ManualClock,
    id: uuid::Uuid,
    remote: &RemoteSettings,
) -> (Result<(), receipts::Failure>, Option<SyncReport>) {
    clock.advance(3_600_000_000);
    let jobs = ledger.claim("test-worker", 100).await.expect("claim");
    let mut outcome = None;
    for job in &jobs {
        let token = LeaseToken::of(job).expect("leased");
        if job.kind == JobKind::Sync && job.connector_id == Some(id) {
            let runner = Runner::new(
                ledger.clone(),
                Roots::new(vec![std::env::temp_dir()]),
                remote.clone(),
            );
            let result = runner.run(job).await;
            match &result {
                Ok(()) => drop(ledger.complete(&token).await.expect("complete")),
                Err(failure) => drop(ledger.fail(&token, failure.clone()).await.expect("fail")),
            }
            outcome = Some((result, job.id));
        } else if job.kind == JobKind::Sync {
            ledger.release(&token).await.expect("release");
        } else {
            // Projection is not under test: its jobs end (a later run may supersede them).
            let _ = ledger.complete(&token).await;
        }
    }
    let (result, ran) = outcome.expect("the connector's run was due");
    let report = ledger
        .sync_runs(id, 10)
        .await
        .expect("runs")
        .into_iter()
        .find(|run| run.job.id == ran)
        .and_then(|run| run.report);
    (result, report)
}

async fn live_keys(ledger: &Arc<dyn Ledger>, dataset: &str) -> Vec<String> {
    ledger
        .list_sources(dataset, "", None, 1000)
        .await
        .expect("list")
        .into_iter()
        .filter(|head| !head.tombstone)
        .map(|head| head.source_key)
        .collect()
}

fn write(root: &Path, key: &str, text: &str) {
    let path = root.join(key);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

/// A work repository and the bare repository `name` under `base` it pushes to.
fn repositories(base: &Path, work: &Path, name: &str) {
    git(base, &["init", "--quiet", "--bare", name]);
    git(work, &["init", "--quiet", "--initial-branch=main"]);
    let remote = base.join(name);
    git(
        work,
        &["remote", "add", "origin", &remote.to_string_lossy()],
    );
}

/// Checks the run failed with `code`; answers whether it may be retried.
#[track_caller]
fn failed_with(result: &Result<(), receipts::Failure>, code: &str) -> bool {
    let failure = result.as_ref().expect_err("the run fails");
    assert_eq!(failure.code, code, "{}", failure.message);
    matches!(failure.class, FailureClass::Retryable { .. })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_git_daemon_remote_is_followed_through_commits_force_pushes_and_failures() {
    let (ledger, clock, data) = sqlite_ledger().await;
    let base = tempfile::tempdir().expect("base");
    let work = tempfile::tempdir().expect("work");
    repositories(base.path(), work.path(), "docs.git");
    write(work.path(), "guide/a.md", "# A\n\nThe first guide.");
    write(work.path(), "b.md", "# B\n\nThe second page.");
    let first = commit(work.path(), "first");
    git(work.path(), &["push", "--quiet", "origin", "main"]);
    let daemon = GitDaemon::start(base.path()).expect("git daemon");
    let remote = settings(data.path());
    let id = create(&ledger, "docs", &daemon.url("docs.git"), None).await;

    // The first run fetches the whole ref and accepts every file.
    let (result, report) = run_once(&ledger, &clock, id, &remote).await;
    result.expect("the first run");
    let report = report.expect("a report");
    assert_eq!(report.commit.as_deref(), Some(first.as_str()));
    assert_eq!(report.added, 2);
    assert!(report.fetched_bytes > 0, "{report:?}");
    assert_eq!(live_keys(&ledger, "docs").await, ["b.md", "guide/a.md"]);
    let mirror = connectors::remote::mirror_path(&remote, id);
    assert!(
        mirror.join("HEAD").is_file(),
        "a bare mirror under the data directory"
    );
    assert!(
        mirror.join("shallow").is_file(),
        "fetched shallow at the default depth of 1"
    );

    // A commit: a change and a new file.
    write(work.path(), "guide/a.md", "# A\n\nThe first guide, edited.");
    write(work.path(), "c.md", "# C\n\nA new page.");
    let second = commit(work.path(), "second");
    git(work.path(), &["push", "--quiet", "origin", "main"]);
    let (result, report) = run_once(&ledger, &clock, id, &remote).await;
    result.expect("the second run");
    let report = report.expect("a report");
    assert_eq!(report.commit.as_deref(), Some(second.as_str()));
    assert_eq!((report.added, report.changed), (1, 1), "{report:?}");
    assert_eq!(
        live_keys(&ledger, "docs").await,
        ["b.md", "c.md", "guide/a.md"]
    );

    // Nothing new: the fetch brings no pack and nothing is accepted.
    let (result, report) = run_once(&ledger, &clock, id, &remote).await;
    result.expect("a no-change run");
    let report = report.expect("a report");
    assert_eq!(report.fetched_bytes, 0, "{report:?}");
    assert_eq!((report.added, report.changed, report.removed), (0, 0, 0));

    // A force-push rewrites history: the run follows the new tree, whatever it replaced.
    git(work.path(), &["reset", "--quiet", "--hard", &first]);
    write(work.path(), "d.md", "# D\n\nWritten after the rewrite.");
    let rewritten = commit(work.path(), "rewritten");
    git(
        work.path(),
        &["push", "--quiet", "--force", "origin", "main"],
    );
    let (result, report) = run_once(&ledger, &clock, id, &remote).await;
    result.expect("the run after a force-push");
    let report = report.expect("a report");
    assert_eq!(report.commit.as_deref(), Some(rewritten.as_str()));
    assert_eq!(
        live_keys(&ledger, "docs").await,
        ["b.md", "d.md", "guide/a.md"]
    );

    // The ref deleted on the remote: the run fails, retryable, and removes nothing.
    git(
        base.path(),
        &["-C", "docs.git", "update-ref", "-d", "refs/heads/main"],
    );
    let (result, report) = run_once(&ledger, &clock, id, &remote).await;
    assert!(failed_with(&result, "unknown_ref"), "retryable");
    assert_eq!(
        report.map(|report| report.stage).as_deref(),
        Some("unknown_ref")
    );
    assert_eq!(
        live_keys(&ledger, "docs").await,
        ["b.md", "d.md", "guide/a.md"]
    );
    git(
        base.path(),
        &[
            "-C",
            "docs.git",
            "update-ref",
            "refs/heads/main",
            &rewritten,
        ],
    );

    // The host taken off the allowlist: refused at the run, nothing removed.
    let closed = RemoteSettings {
        hosts: vec!["git.example.org".to_owned()],
        ..remote.clone()
    };
    let (result, _) = run_once(&ledger, &clock, id, &closed).await;
    assert!(!failed_with(&result, "location_refused"), "permanent");
    assert_eq!(
        live_keys(&ledger, "docs").await,
        ["b.md", "d.md", "guide/a.md"]
    );

    // The remote gone: the run fails, retryable, and removes nothing.
    drop(daemon);
    let (result, report) = run_once(&ledger, &clock, id, &remote).await;
    assert!(failed_with(&result, "remote_unavailable"), "retryable");
    let report = report.expect("a report");
    assert_eq!(report.removed, 0);
    assert!(
        report
            .files
            .iter()
            .any(|file| file.code == "remote_unavailable"),
        "the report names the failure: {report:?}"
    );
    assert_eq!(
        live_keys(&ledger, "docs").await,
        ["b.md", "d.md", "guide/a.md"]
    );
}

/// A file of `bytes` bytes that no compression shrinks (xorshift output, hex-free).
fn incompressible(bytes: usize) -> String {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(b'!' + (state % 90) as u8)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_remote_takes_its_token_and_refuses_a_wrong_one_and_a_huge_pack() {
    let (ledger, clock, data) = sqlite_ledger().await;
    let base = tempfile::tempdir().expect("base");
    let work = tempfile::tempdir().expect("work");
    repositories(base.path(), work.path(), "wiki.git");
    write(work.path(), "home.md", "# Home\n\nThe wiki's first page.");
    let head = commit(work.path(), "first");
    git(work.path(), &["push", "--quiet", "origin", "main"]);
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("x-access-token:s3cret-token")
    );
    let server = GitHttp::start(base.path(), &expected)
        .await
        .expect("git http-backend");
    let remote = settings(data.path());
    std::fs::create_dir_all(&remote.credentials_dir).expect("credentials folder");
    std::fs::write(
        remote.credentials_dir.join("good.toml"),
        "token = \"s3cret-token\"\n",
    )
    .expect("write");
    std::fs::write(
        remote.credentials_dir.join("wrong.toml"),
        "token = \"not-it\"\n",
    )
    .expect("write");
    std::fs::write(
        remote.credentials_dir.join("broken.toml"),
        "token = \"s3cret-token\nusername = 1\n",
    )
    .expect("write");

    let url = server.url("wiki.git");
    let good = create(&ledger, "good", &url, Some("good.toml")).await;
    let (result, report) = run_once(&ledger, &clock, good, &remote).await;
    result.expect("the run with the right token");
    assert_eq!(report.and_then(|report| report.commit), Some(head));
    assert_eq!(live_keys(&ledger, "good").await, ["home.md"]);

    // The same token from the environment, for a connector that names no file.
    let from_environment = RemoteSettings {
        environment: Credentials {
            token: Some("s3cret-token".to_owned()),
            ..Credentials::default()
        },
        ..remote.clone()
    };
    let unnamed = create(&ledger, "environment", &url, None).await;
    let (result, _) = run_once(&ledger, &clock, unnamed, &from_environment).await;
    result.expect("the run with the environment's token");
    assert_eq!(live_keys(&ledger, "environment").await, ["home.md"]);

    // A wrong token, and none at all: refused by the server, nothing accepted.
    let wrong = create(&ledger, "wrong", &url, Some("wrong.toml")).await;
    let (result, _) = run_once(&ledger, &clock, wrong, &remote).await;
    failed_with(&result, "remote_auth_failed");
    let (result, _) = run_once(&ledger, &clock, unnamed, &remote).await;
    failed_with(&result, "remote_auth_failed");
    assert!(live_keys(&ledger, "wrong").await.is_empty());

    // A credentials file that is not valid: the error tells the line, never the secret.
    let broken = create(&ledger, "broken", &url, Some("broken.toml")).await;
    let (result, _) = run_once(&ledger, &clock, broken, &remote).await;
    let failure = result.as_ref().expect_err("a broken credentials file");
    assert_eq!(failure.code, "credentials_invalid");
    assert!(!failure.message.contains("s3cret"), "{}", failure.message);

    // A pack over the limit fails the run for good and changes nothing; the mirror keeps no
    // part of it, so the next run measures the same pack again.
    write(work.path(), "big.md", &incompressible(400_000));
    commit(work.path(), "a big page");
    git(work.path(), &["push", "--quiet", "origin", "main"]);
    let small = RemoteSettings {
        max_fetch_bytes: 100_000,
        ..remote.clone()
    };
    for _ in 0..2 {
        let (result, _) = run_once(&ledger, &clock, good, &small).await;
        assert!(!failed_with(&result, "fetch_too_large"), "permanent");
        assert_eq!(live_keys(&ledger, "good").await, ["home.md"]);
    }
    let (result, _) = run_once(&ledger, &clock, good, &remote).await;
    result.expect("the same pack within the default limit");
    assert_eq!(live_keys(&ledger, "good").await, ["big.md", "home.md"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ssh_remote_needs_its_key_and_a_known_host_key() {
    let (ledger, clock, data) = sqlite_ledger().await;
    let base = tempfile::tempdir().expect("base");
    let work = tempfile::tempdir().expect("work");
    repositories(base.path(), work.path(), "notes.git");
    write(work.path(), "notes/today.md", "# Today\n\nNotes over SSH.");
    let head = commit(work.path(), "first");
    git(work.path(), &["push", "--quiet", "origin", "main"]);
    let server = SshServer::start().expect("sshd (scripts/setup-git installs openssh-server)");
    let remote = settings(data.path());
    let credentials = &remote.credentials_dir;
    std::fs::create_dir_all(credentials).expect("credentials folder");
    std::fs::write(
        credentials.join("known_hosts"),
        server.known_hosts_line().expect("host key"),
    )
    .expect("write");
    std::fs::copy(server.client_key(), credentials.join("id_ed25519")).expect("copy the key");
    // Another host key under the same name: what a man in the middle would show.
    ssh_key(&credentials.join("other_host")).expect("another key");
    let other = std::fs::read_to_string(credentials.join("other_host.pub")).expect("read");
    let mut other = other.split_whitespace();
    std::fs::write(
        credentials.join("wrong_known_hosts"),
        format!(
            "[127.0.0.1]:{} {} {}\n",
            server
                .url(Path::new("/"))
                .rsplit_once(':')
                .map_or("", |(_, port)| port.trim_end_matches('/')),
            other.next().unwrap_or_default(),
            other.next().unwrap_or_default()
        ),
    )
    .expect("write");
    ssh_key(&credentials.join("stranger")).expect("a key sshd does not know");
    for (name, text) in [
        (
            "ssh.toml",
            "ssh_key = \"id_ed25519\"\nknown_hosts = \"known_hosts\"\n",
        ),
        (
            "mitm.toml",
            "ssh_key = \"id_ed25519\"\nknown_hosts = \"wrong_known_hosts\"\n",
        ),
        (
            "stranger.toml",
            "ssh_key = \"stranger\"\nknown_hosts = \"known_hosts\"\n",
        ),
        ("no-hosts.toml", "ssh_key = \"id_ed25519\"\n"),
    ] {
        std::fs::write(credentials.join(name), text).expect("write");
    }
    let url = server.url(&base.path().join("notes.git"));

    let good = create(&ledger, "good", &url, Some("ssh.toml")).await;
    let (result, report) = run_once(&ledger, &clock, good, &remote).await;
    if let Err(failure) = &result {
        panic!("the run over SSH: {failure:?}\nsshd: {}", server.log());
    }
    assert_eq!(report.and_then(|report| report.commit), Some(head));
    assert_eq!(live_keys(&ledger, "good").await, ["notes/today.md"]);

    // A host key that is not the known one: refused, never accepted on first use.
    let mitm = create(&ledger, "mitm", &url, Some("mitm.toml")).await;
    let (result, _) = run_once(&ledger, &clock, mitm, &remote).await;
    assert!(!failed_with(&result, "remote_auth_failed"), "permanent");
    // A key the server does not authorize.
    let stranger = create(&ledger, "stranger", &url, Some("stranger.toml")).await;
    let (result, _) = run_once(&ledger, &clock, stranger, &remote).await;
    assert!(!failed_with(&result, "remote_auth_failed"), "permanent");
    // No known_hosts at all: refused before anything is sent.
    let blind = create(&ledger, "blind", &url, Some("no-hosts.toml")).await;
    let (result, _) = run_once(&ledger, &clock, blind, &remote).await;
    assert!(!failed_with(&result, "credentials_invalid"), "permanent");
    for dataset in ["mitm", "stranger", "blind"] {
        assert!(live_keys(&ledger, dataset).await.is_empty(), "{dataset}");
    }
}
