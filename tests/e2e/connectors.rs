//! A folder connector in a served instance, driven by `cairn connector`: after each change to
//! the folder (an edit, a deletion, a rename), search returns exactly the folder's files and
//! nothing removed; API ingest cannot overwrite the connector's sources; a folder outside the
//! configured roots and a token outside the dataset are refused; removing with `--tombstone`
//! empties what the connector created.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use testkit::git::{commit, git};

use crate::crash::spawn_serve_with;

fn cairn() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
}

/// Runs `cairn connector ARGS` against `base` and answers its stdout (asserting success).
fn connector(base: &str, token: &str, args: &[&str]) -> String {
    let output = cairn()
        .arg("connector")
        .args(args)
        .args(["--server", base, "--token", token])
        .env("CAIRN_LOG", "warn")
        .output()
        .expect("run cairn connector");
    assert_eq!(
        output.status.code(),
        Some(0),
        "cairn connector {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `GET url` with `token`, as JSON (asserting a 200).
async fn get_json(http: &reqwest::Client, url: &str, token: &str) -> Value {
    let response = http
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap_or_else(|error| panic!("GET {url}: {error}"));
    assert_eq!(response.status().as_u16(), 200, "GET {url}");
    response.json().await.expect("a JSON answer")
}

/// Waits until the connector has `runs` runs that ended with a report `done`, and answers the
/// newest of them.
async fn wait_for_runs(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    id: &str,
    runs: usize,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view: Value = get_json(http, &format!("{base}/v1/connectors/{id}"), token).await;
        let done: Vec<&Value> = view["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .filter(|run| run["job"]["state"] == "completed" && run["report"]["stage"] == "done")
            .collect();
        if done.len() >= runs {
            return done[0].clone();
        }
        assert!(Instant::now() < deadline, "runs did not finish: {view}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Now, in microseconds since the epoch: the ledger's clock on this machine.
fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as i64)
}

/// How long after its stamped time a head move may still be invisible to a search: the
/// ledger stamps a change when its write group starts, and readers see it once the group has
/// committed (an fsync later, longer on a loaded machine).
const COMMIT_SLACK_MICROS: i64 = 250_000;

/// The keys a lexical search for "wombat" finds in `docs`, each hit checked against its
/// source's head history: the hit's revision must have been the source's head (a content
/// revision, not a tombstone) at some moment between the request being sent and its answer
/// received (a move counting from its commit, up to [`COMMIT_SLACK_MICROS`] after its stamp). A hit on the old revision of an edited file, or on a source deleted before the
/// request, fails here even though its key is right; a head that moves while a run is
/// tombstoning (the loop after the removal) does not. An error answer fails instead of
/// reading as "nothing found".
async fn found(http: &reqwest::Client, base: &str, token: &str) -> Vec<String> {
    let sent = now_micros();
    let response = http
        .post(format!("{base}/v1/search"))
        .bearer_auth(token)
        .json(&json!({"query": "wombat", "mode": "lexical", "top_k": 50, "datasets": ["docs"]}))
        .send()
        .await
        .expect("search");
    assert_eq!(response.status().as_u16(), 200, "search");
    let answer: Value = response.json().await.expect("answer");
    let received = now_micros();
    let mut keys = Vec::new();
    for hit in answer["results"].as_array().expect("results") {
        let key = hit["source_key"].as_str().expect("a hit's key");
        let revision = hit["source_revision_id"]
            .as_str()
            .expect("a hit's revision");
        let source = get_json(
            http,
            &format!("{base}/v1/sources?dataset=docs&source_key={key}"),
            token,
        )
        .await;
        // Each stretch of time the revision was the head: from a move to it to the next move.
        let mut moves: Vec<(i64, i64, &str)> = source["head_history"]
            .as_array()
            .expect("head history")
            .iter()
            .filter_map(|entry| {
                Some((
                    entry["seq"].as_i64()?,
                    entry["at"].as_i64()?,
                    entry["to"].as_str()?,
                ))
            })
            .collect();
        moves.sort_unstable();
        let held = moves.iter().enumerate().any(|(index, (_, at, to))| {
            let until = moves.get(index + 1).map_or(i64::MAX, |next| next.1);
            *to == revision && *at <= received && until.saturating_add(COMMIT_SLACK_MICROS) >= sent
        });
        assert!(
            held,
            "a hit on {key} ({revision}) was not its source's head while the search ran \
             ({sent}..{received}): {hit} {source}"
        );
        let content = source["revisions"]
            .as_array()
            .expect("revisions")
            .iter()
            .any(|known| known["id"] == revision && known["tombstone"] == false);
        assert!(content, "a hit on a tombstone: {hit}");
        keys.push(key.to_owned());
    }
    keys.sort_unstable();
    keys.dedup();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_connector_keeps_search_equal_to_the_folder() {
    let data = tempfile::tempdir().expect("tempdir");
    let roots = tempfile::tempdir().expect("roots");
    let folder = roots.path().join("handbook");
    let write = |path: &str, text: &str| {
        let path = folder.join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
        std::fs::write(path, text).expect("write");
    };
    write("a.md", "# Alpha\n\nwombat original text");
    write("b.md", "# Bravo\n\nwombat to be deleted");
    write("guides/c.txt", "wombat to be renamed");
    write("photo.png", "not a format cairn reads");
    let root_text = roots.path().to_string_lossy().into_owned();
    let (mut server, base) = spawn_serve_with(
        data.path(),
        &[],
        &[("CAIRN_CONNECTOR_FOLDER_ROOTS", root_text.as_str())],
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let admin = crate::common::admin_token(data.path());
    let http = reqwest::Client::new();

    let created = connector(
        &base,
        &admin,
        &[
            "add",
            "folder",
            &folder.to_string_lossy(),
            "--dataset",
            "docs",
            "--every",
            "1h",
            "--reason",
            "the team handbook",
            "--json",
        ],
    );
    let created: Value = serde_json::from_str(&created).expect("created json");
    let id = created["connector"]["id"].as_str().expect("id").to_owned();
    assert_eq!(created["connector"]["created_by"], "token:admin");
    let first = wait_for_runs(&http, &base, &admin, &id, 1).await;
    assert_eq!(first["report"]["added"], 3, "{first}");
    assert_eq!(first["report"]["skipped"], 1, "{first}");
    assert_eq!(
        found(&http, &base, &admin).await,
        ["a.md", "b.md", "guides/c.txt"]
    );

    // The connector owns its sources: API ingest is refused, typed, and changes nothing.
    let refused = http
        .post(format!("{base}/v1/sources"))
        .bearer_auth(&admin)
        .json(&json!({"dataset": "docs", "source_key": "a.md", "content": "api overwrite"}))
        .send()
        .await
        .expect("put");
    assert_eq!(refused.status().as_u16(), 409);
    let body: Value = refused.json().await.expect("error json");
    assert_eq!(body["code"], "owned_by_connector", "{body}");

    // An edit, a deletion and a rename, then a run now.
    write("a.md", "# Alpha\n\nwombat edited text");
    std::fs::remove_file(folder.join("b.md")).expect("delete");
    std::fs::rename(folder.join("guides/c.txt"), folder.join("guides/d.txt")).expect("rename");
    let ran = connector(&base, &admin, &["run", &id, "--reason", "files changed"]);
    assert!(ran.contains("run:"), "{ran}");
    let second = wait_for_runs(&http, &base, &admin, &id, 2).await;
    let report = &second["report"];
    assert_eq!(
        (&report["added"], &report["changed"], &report["removed"]),
        (&json!(1), &json!(1), &json!(2)),
        "{second}"
    );
    assert_eq!(found(&http, &base, &admin).await, ["a.md", "guides/d.txt"]);
    let listed: Value = get_json(&http, &format!("{base}/v1/connectors"), &admin).await;
    let entry = &listed["connectors"][0];
    assert_eq!(entry["connector"]["id"], id.as_str(), "{listed}");
    assert_eq!(entry["last_run"]["report"]["removed"], 2, "{listed}");
    let shown = connector(&base, &admin, &["show", &id]);
    assert!(
        shown.contains("handbook") && shown.contains("removed 2"),
        "{shown}"
    );

    // Refusals: a folder outside the roots; a token whose allowlist lacks the dataset.
    let outside = http
        .post(format!("{base}/v1/connectors"))
        .bearer_auth(&admin)
        .json(&json!({"dataset": "docs", "kind": "folder", "location": "/etc"}))
        .send()
        .await
        .expect("create outside");
    assert_eq!(outside.status().as_u16(), 422);
    let body: Value = outside.json().await.expect("json");
    assert_eq!(body["code"], "location_refused", "{body}");
    let other: Value = http
        .post(format!("{base}/v1/tokens"))
        .bearer_auth(&admin)
        .json(&json!({"name": "other-team", "scopes": ["ingest"], "datasets": ["other"]}))
        .send()
        .await
        .expect("token")
        .json()
        .await
        .expect("token json");
    let other = other["secret"].as_str().expect("secret").to_owned();
    let forbidden = http
        .post(format!("{base}/v1/connectors"))
        .bearer_auth(&other)
        .json(&json!({"dataset": "docs", "kind": "folder", "location": folder}))
        .send()
        .await
        .expect("create forbidden");
    assert_eq!(forbidden.status().as_u16(), 403);
    let hidden = http
        .get(format!("{base}/v1/connectors/{id}"))
        .bearer_auth(&other)
        .send()
        .await
        .expect("get hidden");
    // Another dataset's connector is absent to this token, as revisions and jobs are.
    assert_eq!(hidden.status().as_u16(), 404);
    let hidden: Value = hidden.json().await.expect("json");
    assert_eq!(hidden["code"], "connector_not_found", "{hidden}");
    let listed: Value = get_json(&http, &format!("{base}/v1/connectors"), &other).await;
    assert_eq!(listed["connectors"], json!([]), "{listed}");

    // Removed with its sources tombstoned: search finds none of them.
    connector(
        &base,
        &admin,
        &["remove", &id, "--tombstone", "--reason", "handbook retired"],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !found(&http, &base, &admin).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the connector's sources were not tombstoned"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let view: Value = get_json(&http, &format!("{base}/v1/connectors/{id}"), &admin).await;
    let trail: Vec<(&str, &str, &str)> = view["history"]
        .as_array()
        .expect("history")
        .iter()
        .map(|entry| {
            (
                entry["to"].as_str().unwrap_or(""),
                entry["actor"].as_str().unwrap_or(""),
                entry["cause"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        trail,
        [
            ("active", "token:admin", "created: the team handbook"),
            (
                "removed:tombstone",
                "token:admin",
                "removed; its sources are tombstoned by a last run: handbook retired"
            ),
        ],
        "{view}"
    );
    let _ = server.kill().await;
}

/// A run killed midway (SIGKILL of the process that runs it) is finished by the next lease
/// after a restart: every file accepted exactly once (one revision each), the rescue in the
/// run's record, nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_midway_is_finished_after_a_restart() {
    const FILES: usize = 3_000;
    let data = tempfile::tempdir().expect("tempdir");
    let roots = tempfile::tempdir().expect("roots");
    let folder = roots.path().join("wiki");
    for n in 0..FILES {
        let path = folder.join(format!("d{:02}/page-{n}.md", n % 30));
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
        std::fs::write(path, format!("# Page {n}\n\nwombat number {n}")).expect("write");
    }
    // A short lease for runs, so that the rescue comes quickly after the kill.
    let config = data.path().join("cairn.toml");
    std::fs::write(
        &config,
        format!(
            "[jobs.sync]\nlease_ms = 2000\n\n[connectors]\nfolder_roots = [{:?}]\n",
            roots.path().to_string_lossy()
        ),
    )
    .expect("config");
    let config_text = config.to_string_lossy().into_owned();
    let args = ["--config", config_text.as_str()];
    let (mut server, base) = spawn_serve_with(
        data.path(),
        &args,
        &[],
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let admin = crate::common::admin_token(data.path());
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{base}/v1/connectors"))
        .bearer_auth(&admin)
        .json(&json!({"dataset": "wiki", "kind": "folder", "location": folder, "interval_ms": 3_600_000}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("created json");
    let id = created["connector"]["id"].as_str().expect("id").to_owned();
    // Kill as soon as part of the folder is accepted, and before the run ends.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view: Value = get_json(&http, &format!("{base}/v1/connectors/{id}"), &admin).await;
        let report = &view["runs"][0]["report"];
        let added = report["added"].as_u64().unwrap_or(0);
        if added > 0 {
            assert_ne!(
                report["stage"], "done",
                "the run ended before the kill: {view}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the run never started: {view}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.kill().await.expect("SIGKILL");

    let (mut server, base) = spawn_serve_with(
        data.path(),
        &args,
        &[],
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let finished = wait_for_runs(&http, &base, &admin, &id, 1).await;
    assert_eq!(
        finished["job"]["crashes"], 1,
        "the killed run was rescued and finished: {finished}"
    );
    let report = &finished["report"];
    assert_eq!(
        report["added"].as_u64().unwrap_or(0) + report["unchanged"].as_u64().unwrap_or(0),
        FILES as u64,
        "{finished}"
    );
    let status: Value = get_json(&http, &format!("{base}/v1/status"), &admin).await;
    assert_eq!(status["counts"]["sources"], FILES, "{status}");
    assert_eq!(
        status["counts"]["revisions"], FILES,
        "no file was accepted twice: {status}"
    );
    let _ = server.kill().await;
}

/// A git connector in a served instance, driven by `cairn connector`: search answers the
/// files at the ref after a commit that edits, deletes and renames, and after a force-push
/// back to the first commit; the revisions name their commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_git_connector_keeps_search_equal_to_the_ref() {
    let data = tempfile::tempdir().expect("tempdir");
    let roots = tempfile::tempdir().expect("roots");
    let repository = roots.path().join("handbook.git");
    let write = |path: &str, text: &str| {
        let path = repository.join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
        std::fs::write(path, text).expect("write");
    };
    std::fs::create_dir_all(&repository).expect("mkdir");
    git(&repository, &["init", "--quiet", "--initial-branch=main"]);
    write("a.md", "# Alpha\n\nwombat original text");
    write("b.md", "# Bravo\n\nwombat to be deleted");
    write("guides/c.md", "# Charlie\n\nwombat to be renamed");
    commit(&repository, "first");
    let root_text = roots.path().to_string_lossy().into_owned();
    let (mut server, base) = spawn_serve_with(
        data.path(),
        &[],
        &[("CAIRN_CONNECTOR_FOLDER_ROOTS", root_text.as_str())],
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let admin = crate::common::admin_token(data.path());
    let http = reqwest::Client::new();
    let created = connector(
        &base,
        &admin,
        &[
            "add",
            "git",
            &repository.to_string_lossy(),
            "--ref",
            "main",
            "--dataset",
            "docs",
            "--json",
        ],
    );
    let created: Value = serde_json::from_str(&created).expect("created json");
    let id = created["connector"]["id"].as_str().expect("id").to_owned();
    let first = wait_for_runs(&http, &base, &admin, &id, 1).await;
    let first_commit = first["report"]["commit"]
        .as_str()
        .expect("commit")
        .to_owned();
    assert_eq!(
        found(&http, &base, &admin).await,
        ["a.md", "b.md", "guides/c.md"]
    );

    write("a.md", "# Alpha\n\nwombat edited text");
    git(&repository, &["rm", "--quiet", "b.md"]);
    git(&repository, &["mv", "guides/c.md", "guides/d.md"]);
    commit(&repository, "second");
    connector(&base, &admin, &["run", &id]);
    let second = wait_for_runs(&http, &base, &admin, &id, 2).await;
    assert_ne!(second["report"]["commit"], first_commit.as_str());
    assert_eq!(found(&http, &base, &admin).await, ["a.md", "guides/d.md"]);

    git(
        &repository,
        &["update-ref", "refs/heads/main", &first_commit],
    );
    connector(&base, &admin, &["run", &id]);
    let third = wait_for_runs(&http, &base, &admin, &id, 3).await;
    assert_eq!(third["report"]["commit"], first_commit.as_str(), "{third}");
    assert_eq!(
        found(&http, &base, &admin).await,
        ["a.md", "b.md", "guides/c.md"]
    );
    let source: Value = get_json(
        &http,
        &format!("{base}/v1/sources?dataset=docs&source_key=a.md"),
        &admin,
    )
    .await;
    assert_eq!(
        source["head"]["metadata"]["commit"],
        first_commit.as_str(),
        "{source}"
    );
    assert_eq!(
        source["head"]["metadata"]["author"],
        "Ada Writer <ada@example.org>"
    );
    let _ = server.kill().await;
}

/// `POST {base}/v1/connectors/{id}/hook` as GitHub sends it, signed with `secret`; answers the
/// status and the JSON body.
async fn github_push(
    http: &reqwest::Client,
    base: &str,
    id: &str,
    secret: &str,
    reference: &str,
    delivery: &str,
) -> (u16, Value) {
    let body =
        serde_json::to_vec(&json!({"ref": reference, "after": "0".repeat(40)})).expect("payload");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let signature = hex::encode(ring::hmac::sign(&key, &body).as_ref());
    let response = http
        .post(format!("{base}/v1/connectors/{id}/hook"))
        .header("content-type", "application/json")
        .header("x-github-event", "push")
        .header("x-github-delivery", delivery)
        .header("x-hub-signature-256", format!("sha256={signature}"))
        .body(body)
        .send()
        .await
        .expect("hook");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON answer"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_hook_makes_a_remote_connector_run_at_once() {
    let data = tempfile::tempdir().expect("tempdir");
    let remotes = tempfile::tempdir().expect("remotes");
    let work = tempfile::tempdir().expect("work");
    let credentials = tempfile::tempdir().expect("credentials");
    git(remotes.path(), &["init", "--quiet", "--bare", "docs.git"]);
    git(work.path(), &["init", "--quiet", "--initial-branch=main"]);
    let served = remotes.path().join("docs.git");
    git(
        work.path(),
        &["remote", "add", "origin", &served.to_string_lossy()],
    );
    std::fs::write(
        work.path().join("a.md"),
        "# Alpha\n\nwombat from the first push",
    )
    .expect("write");
    commit(work.path(), "first");
    git(work.path(), &["push", "--quiet", "origin", "main"]);
    std::fs::write(
        credentials.path().join("hook.toml"),
        "hook_secret = \"hook-s3cret\"\n",
    )
    .expect("write");
    let daemon = testkit::git_servers::GitDaemon::start(remotes.path()).expect("git daemon");
    let credentials_dir = credentials.path().to_string_lossy().into_owned();
    let (mut server, base) = spawn_serve_with(
        data.path(),
        &[],
        &[
            ("CAIRN_CONNECTOR_REMOTE_HOSTS", "127.0.0.1"),
            ("CAIRN_CONNECTOR_CREDENTIALS_DIR", credentials_dir.as_str()),
        ],
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let admin = crate::common::admin_token(data.path());
    let http = reqwest::Client::new();
    // A remote on a host the configuration does not name is refused at creation.
    let refused = cairn()
        .args([
            "connector",
            "add",
            "git",
            "https://example.org/org/docs.git",
            "--ref",
            "main",
        ])
        .args(["--dataset", "docs", "--server", &base, "--token", &admin])
        .output()
        .expect("run cairn connector");
    assert_ne!(refused.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("location_refused"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    // Runs a day apart: only the hook can make the second one come soon.
    let created = connector(
        &base,
        &admin,
        &[
            "add",
            "git",
            &daemon.url("docs.git"),
            "--ref",
            "main",
            "--dataset",
            "docs",
            "--every",
            "1d",
            "--credentials",
            "hook.toml",
            "--json",
        ],
    );
    let created: Value = serde_json::from_str(&created).expect("created json");
    let id = created["connector"]["id"].as_str().expect("id").to_owned();
    wait_for_runs(&http, &base, &admin, &id, 1).await;
    assert_eq!(found(&http, &base, &admin).await, ["a.md"]);

    std::fs::write(
        work.path().join("b.md"),
        "# Bravo\n\nwombat from the second push",
    )
    .expect("write");
    commit(work.path(), "second");
    git(work.path(), &["push", "--quiet", "origin", "main"]);

    // A wrong signature, and none: 401, nothing changes.
    let (status, answer) = github_push(
        &http,
        &base,
        &id,
        "not-the-secret",
        "refs/heads/main",
        "d-0",
    )
    .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (401, Some("hook_signature_invalid")),
        "{answer}"
    );
    let unsigned = http
        .post(format!("{base}/v1/connectors/{id}/hook"))
        .header("content-type", "application/json")
        .body("{\"ref\":\"refs/heads/main\"}")
        .send()
        .await
        .expect("hook");
    assert_eq!(unsigned.status().as_u16(), 401);
    // A push to another ref is ignored, with the reason.
    let (status, answer) =
        github_push(&http, &base, &id, "hook-s3cret", "refs/heads/dev", "d-1").await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (200, Some("ignored")),
        "{answer}"
    );
    assert!(answer["reason"]
        .as_str()
        .is_some_and(|reason| reason.contains("refs/heads/dev")));
    // The push to main: the run is due now, and search finds the commit's change in seconds.
    let (status, answer) =
        github_push(&http, &base, &id, "hook-s3cret", "refs/heads/main", "d-2").await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (202, Some("run_due")),
        "{answer}"
    );
    // The same delivery again changes nothing.
    let (status, answer) =
        github_push(&http, &base, &id, "hook-s3cret", "refs/heads/main", "d-2").await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (200, Some("duplicate")),
        "{answer}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while found(&http, &base, &admin).await != ["a.md", "b.md"] {
        assert!(
            Instant::now() < deadline,
            "the pushed file was not found within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The connector's history names the hook, its delivery and the ref it moved.
    let view = get_json(&http, &format!("{base}/v1/connectors/{id}"), &admin).await;
    let hooks: Vec<&Value> = view["history"]
        .as_array()
        .expect("history")
        .iter()
        .filter(|entry| entry["event"] == "hook")
        .collect();
    assert_eq!(hooks.len(), 1, "one delivery taken: {view}");
    assert_eq!(hooks[0]["actor"], "hook:github");
    assert_eq!(hooks[0]["to"], "github:d-2");
    assert!(
        hooks[0]["cause"]
            .as_str()
            .is_some_and(|cause| cause.contains("refs/heads/main")),
        "{view}"
    );
    drop(daemon);
    let _ = server.kill().await;
}
