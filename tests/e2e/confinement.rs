//! Connector roots hold at every read, tried through the API as a hostile user would: someone
//! who may write files inside a root and holds an `ingest` token for one dataset. On both
//! ledgers: a location that becomes a link out after the connector was made, a hard link and a
//! link through `/proc/self/root` inside a folder, a git work tree whose `.git` file points
//! outside, a repository borrowing objects from outside (alternates), a glob that does not
//! compile, another dataset's connector; and a subfolder swapped between a folder and a link
//! out of the root while runs list it. A marker that exists only outside the root is never
//! searchable, and no key from outside is ever accepted.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::git::{commit, git};

use crate::crash::spawn_serve_with;

/// A word that exists only outside the root.
const MARKER: &str = "quagganoid";

fn write(root: &Path, key: &str, text: &str) {
    let path = root.join(key);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("the API answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn create(&self, token: &str, body: Value) -> (u16, Value) {
        self.call("POST", "/v1/connectors", token, Some(body)).await
    }

    /// Runs the connector now and waits for that run to end; answers the run (job and report).
    async fn run(&self, token: &str, id: &str) -> Value {
        let (status, changed) = self
            .call("POST", &format!("/v1/connectors/{id}/run"), token, None)
            .await;
        assert_eq!(status, 200, "{changed}");
        let job = changed["run"]["id"]
            .as_str()
            .expect("the run's job")
            .to_owned();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, view) = self
                .call("GET", &format!("/v1/connectors/{id}"), token, None)
                .await;
            assert_eq!(status, 200, "{view}");
            let ended = view["runs"].as_array().expect("runs").iter().find(|run| {
                run["job"]["id"] == job.as_str()
                    && matches!(
                        run["job"]["state"].as_str(),
                        Some("completed" | "dead" | "cancelled" | "superseded" | "quarantined")
                    )
            });
            if let Some(run) = ended {
                return run.clone();
            }
            assert!(Instant::now() < deadline, "run {job} did not end: {view}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Lexical hits for `query` in `dataset` (asserting a 200).
    async fn hits(&self, token: &str, dataset: &str, query: &str) -> Vec<String> {
        let (status, answer) = self
            .call(
                "POST",
                "/v1/search",
                token,
                Some(
                    json!({"query": query, "mode": "lexical", "top_k": 50, "datasets": [dataset]}),
                ),
            )
            .await;
        assert_eq!(status, 200, "{answer}");
        answer["results"]
            .as_array()
            .expect("results")
            .iter()
            .filter_map(|hit| hit["source_key"].as_str().map(str::to_owned))
            .collect()
    }

    /// Every key the dataset ever held a head for, tombstoned ones included.
    async fn keys(&self, token: &str, dataset: &str) -> Vec<String> {
        let (status, page) = self
            .call(
                "GET",
                &format!("/v1/datasets/{dataset}/sources?limit=500"),
                token,
                None,
            )
            .await;
        assert_eq!(status, 200, "{page}");
        page["sources"]
            .as_array()
            .expect("sources")
            .iter()
            .filter_map(|head| head["source_key"].as_str().map(str::to_owned))
            .collect()
    }
}

fn skipped(run: &Value) -> Vec<(String, String)> {
    run["report"]["files"]
        .as_array()
        .map(|files| {
            files
                .iter()
                .map(|file| {
                    (
                        file["path"].as_str().unwrap_or_default().to_owned(),
                        file["code"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn assert_refused(run: &Value) {
    assert_eq!(run["job"]["state"], "dead", "{run}");
    assert_eq!(run["job"]["last_error_code"], "location_refused", "{run}");
    assert_eq!(run["report"]["stage"], "location_refused", "{run}");
}

async fn escapes_are_refused(postgres: bool) {
    let data = tempfile::tempdir().expect("data");
    let roots = tempfile::tempdir().expect("roots");
    let outside = tempfile::tempdir().expect("outside");
    let root = roots.path();
    write(
        outside.path(),
        "outside-secret.md",
        &format!("# Secret\n\n{MARKER} lives outside the root"),
    );
    let outrepo = outside.path().join("outrepo");
    std::fs::create_dir(&outrepo).expect("outrepo");
    git(&outrepo, &["init", "--quiet", "--initial-branch=main"]);
    write(
        &outrepo,
        "outside-secret.md",
        &format!("# Secret\n\n{MARKER} in git"),
    );
    commit(&outrepo, "outside");

    let server = postgres.then(|| testkit::postgres::PostgresServer::start().expect("PostgreSQL"));
    let url = server
        .as_ref()
        .map(|server| server.create_database("ledger").expect("database"));
    let ledger_args: Vec<&str> = match &url {
        Some(url) => vec!["--ledger", url.as_str()],
        None => Vec::new(),
    };
    let root_text = root.to_string_lossy().into_owned();
    let (mut serve, base) = spawn_serve_with(
        data.path(),
        &ledger_args,
        &[("CAIRN_CONNECTOR_FOLDER_ROOTS", root_text.as_str())],
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let admin = crate::common::admin_token(data.path());
    let api = Api {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("client"),
        base,
    };
    // The attacker: `ingest` (and `search`) for the dataset `docs` only.
    let (status, created) = api
        .call(
            "POST",
            "/v1/tokens",
            &admin,
            Some(json!({"name": "attacker", "scopes": ["ingest", "search"], "datasets": ["docs"]})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let attacker = created["secret"].as_str().expect("secret").to_owned();
    let folder = |location: &Path| json!({"dataset": "docs", "kind": "folder", "location": location, "interval_ms": 3_600_000});

    // 1. A location that does not exist yet is admitted; a link out by the time it runs is not.
    let (status, later) = api.create(&attacker, folder(&root.join("later"))).await;
    assert_eq!(status, 201, "{later}");
    let later_id = later["connector"]["id"].as_str().expect("id").to_owned();
    std::os::unix::fs::symlink(outside.path(), root.join("later")).expect("link");
    let run = api.run(&attacker, &later_id).await;
    assert_refused(&run);

    // 2. A folder that ran once, replaced by a link: refused, and nothing it made is removed.
    write(
        &root.join("swap"),
        "kept.md",
        "# Kept\n\nwombat inside the root",
    );
    let (status, swap) = api.create(&attacker, folder(&root.join("swap"))).await;
    assert_eq!(status, 201, "{swap}");
    let swap_id = swap["connector"]["id"].as_str().expect("id").to_owned();
    let run = api.run(&attacker, &swap_id).await;
    assert_eq!(run["report"]["stage"], "done", "{run}");
    std::fs::rename(root.join("swap"), root.join("swap.orig")).expect("mv");
    std::os::unix::fs::symlink(outside.path(), root.join("swap")).expect("link");
    let run = api.run(&attacker, &swap_id).await;
    assert_refused(&run);
    assert_eq!(api.hits(&attacker, "docs", "wombat").await, ["kept.md"]);

    // A hard link to a file outside, and a link through /proc/self/root, inside a folder.
    write(&root.join("tricks"), "fine.md", "# Fine\n\nplatypus inside");
    let hard = std::fs::hard_link(
        outside.path().join("outside-secret.md"),
        root.join("tricks/outside-hard.md"),
    );
    std::os::unix::fs::symlink(
        Path::new("/proc/self/root").join(outside.path().strip_prefix("/").expect("absolute")),
        root.join("tricks/outside-proc"),
    )
    .expect("proc link to a folder");
    std::os::unix::fs::symlink(
        Path::new("/proc/self/root")
            .join(outside.path().strip_prefix("/").expect("absolute"))
            .join("outside-secret.md"),
        root.join("tricks/outside-proc.md"),
    )
    .expect("proc link to a file");
    let (status, tricks) = api.create(&attacker, folder(&root.join("tricks"))).await;
    assert_eq!(status, 201, "{tricks}");
    let tricks_id = tricks["connector"]["id"].as_str().expect("id").to_owned();
    let run = api.run(&attacker, &tricks_id).await;
    assert_eq!(run["report"]["stage"], "done", "{run}");
    let codes = skipped(&run);
    assert!(
        codes.contains(&("outside-proc.md".to_owned(), "link_leaves_root".to_owned())),
        "{codes:?}"
    );
    assert!(
        codes.contains(&("outside-proc".to_owned(), "link_leaves_root".to_owned())),
        "{codes:?}"
    );
    if hard.is_ok() {
        assert!(
            codes.contains(&("outside-hard.md".to_owned(), "hard_link".to_owned())),
            "{codes:?}"
        );
    }
    assert_eq!(api.hits(&attacker, "docs", "platypus").await, ["fine.md"]);

    // 3. A work tree whose .git file points outside, 4. a repository borrowing objects.
    std::fs::create_dir(root.join("gitfile")).expect("gitfile");
    std::fs::write(
        root.join("gitfile/.git"),
        format!("gitdir: {}\n", outrepo.join(".git").display()),
    )
    .expect(".git file");
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
    for location in [root.join("gitfile"), root.join("alt.git")] {
        let (status, answer) = api
            .create(
                &attacker,
                json!({"dataset": "docs", "kind": "git", "location": location, "ref": "main"}),
            )
            .await;
        assert_eq!(status, 422, "{location:?}: {answer}");
        assert_eq!(answer["code"], "location_refused", "{answer}");
    }

    // 5. A glob that does not compile is refused at creation, naming the glob.
    let mut bad = folder(&root.join("swap.orig"));
    bad["include"] = json!(["docs/**", "{a,b"]);
    let (status, answer) = api.create(&attacker, bad).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["code"], "invalid_connector", "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap_or_default()
            .contains("{a,b"),
        "{answer}"
    );

    // 7. Another dataset's connector is absent to this token, whatever it asks.
    std::fs::create_dir(root.join("private")).expect("private");
    let (status, private) = api
        .create(
            &admin,
            json!({"dataset": "hr", "kind": "folder", "location": root.join("private")}),
        )
        .await;
    assert_eq!(status, 201, "{private}");
    let private_id = private["connector"]["id"].as_str().expect("id").to_owned();
    for (method, path) in [
        ("GET", format!("/v1/connectors/{private_id}")),
        ("POST", format!("/v1/connectors/{private_id}/run")),
        ("POST", format!("/v1/connectors/{private_id}/pause")),
        ("DELETE", format!("/v1/connectors/{private_id}")),
    ] {
        let (status, answer) = api.call(method, &path, &attacker, None).await;
        assert_eq!(status, 404, "{method} {path}: {answer}");
        assert_eq!(answer["code"], "connector_not_found", "{answer}");
        assert!(!answer.to_string().contains("\"hr\""), "{answer}");
    }

    // The marker was never accepted, by any of the above.
    assert!(api.hits(&admin, "docs", MARKER).await.is_empty());
    let keys = api.keys(&admin, "docs").await;
    assert!(keys.iter().all(|key| !key.contains("outside")), "{keys:?}");
    let _ = serve.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connector_escapes_are_refused_on_sqlite() {
    escapes_are_refused(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connector_escapes_are_refused_on_postgres() {
    escapes_are_refused(true).await;
}

/// While runs list a folder of a few hundred files, a subfolder is swapped between a real
/// folder and a link out of the root, thousands of times. Runs see both (the guard against a
/// vacuous pass), and no byte from outside is ever accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_swapped_for_a_link_during_runs_leaks_nothing() {
    let data = tempfile::tempdir().expect("data");
    let roots = tempfile::tempdir().expect("roots");
    let outside = tempfile::tempdir().expect("outside");
    let root = roots.path();
    let race = root.join("race");
    for index in 0..300 {
        write(
            &race,
            &format!("file-{index:03}.md"),
            &format!("# File {index}\n\nwombat {index}"),
        );
    }
    for index in 0..20 {
        write(
            &root.join("sub.real"),
            &format!("inner-{index:02}.md"),
            "# Inner\n\nnumbat",
        );
        write(
            outside.path(),
            &format!("inner-{index:02}.md"),
            &format!("# Outside\n\n{MARKER} {index}"),
        );
    }
    std::os::unix::fs::symlink(outside.path(), root.join("sub.link")).expect("link");
    let root_text = root.to_string_lossy().into_owned();
    let (mut serve, base) = spawn_serve_with(
        data.path(),
        &[],
        &[("CAIRN_CONNECTOR_FOLDER_ROOTS", root_text.as_str())],
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let admin = crate::common::admin_token(data.path());
    let api = Api {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("client"),
        base,
    };
    let (status, created) = api
        .create(
            &admin,
            json!({"dataset": "race", "kind": "folder", "location": race, "interval_ms": 3_600_000}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["connector"]["id"].as_str().expect("id").to_owned();

    // The swapper: `race/sub` is the real folder, then the link out, over and over (each
    // rename is atomic, so `sub` is always one or the other).
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps) = (stop.clone(), swaps.clone());
        let (real, link, sub) = (
            root.join("sub.real"),
            root.join("sub.link"),
            race.join("sub"),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for from in [&real, &link] {
                    std::fs::rename(from, &sub).expect("swap in");
                    std::thread::sleep(Duration::from_micros(200));
                    std::fs::rename(&sub, from).expect("swap out");
                    swaps.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let (mut saw_folder, mut saw_refusal, mut runs) = (false, false, 0);
    let deadline = Instant::now() + Duration::from_secs(120);
    while runs < 8 || !(saw_folder && saw_refusal) {
        assert!(
            Instant::now() < deadline,
            "runs never saw both states: folder {saw_folder}, refusal {saw_refusal}"
        );
        let run = api.run(&admin, &id).await;
        assert_eq!(run["job"]["state"], "completed", "{run}");
        runs += 1;
        let codes = skipped(&run);
        saw_refusal |= codes
            .iter()
            .any(|(path, code)| path.starts_with("sub") && code == "link_leaves_root");
        saw_folder |= run["report"]["added"].as_u64().unwrap_or(0) > 0
            && api
                .keys(&admin, "race")
                .await
                .iter()
                .any(|key| key.starts_with("sub/"));
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().expect("swapper");
    assert!(
        swaps.load(Ordering::Relaxed) > 100,
        "the folder was hardly swapped"
    );
    assert!(
        api.hits(&admin, "race", MARKER).await.is_empty(),
        "bytes from outside were accepted"
    );
    // Every revision ever accepted under `sub/`, not only the heads search sees.
    let sources = api.keys(&admin, "race").await;
    let mut read = 0;
    for key in sources.iter().filter(|key| key.starts_with("sub/")) {
        let (status, view) = api
            .call(
                "GET",
                &format!("/v1/sources?dataset=race&source_key={key}&limit=500"),
                &admin,
                None,
            )
            .await;
        assert_eq!(status, 200, "{view}");
        for revision in view["revisions"].as_array().expect("revisions") {
            let Some(id) = revision["id"].as_str() else {
                continue;
            };
            let content = api
                .http
                .get(format!("{}/v1/revisions/{id}/content", api.base))
                .bearer_auth(&admin)
                .send()
                .await
                .expect("content");
            if content.status().as_u16() == 200 {
                let text = content.text().await.expect("text");
                assert!(
                    !text.contains(MARKER),
                    "{key} revision {id} holds bytes from outside"
                );
                read += 1;
            }
        }
    }
    assert!(read > 0, "no revision under sub/ was read back");
    let _ = serve.kill().await;
}
