//! The binary's commands against a served instance: `cairn ingest`, `cairn status`, and a
//! graceful stop on SIGTERM.

use std::time::Duration;

use serde_json::json;

use crate::crash::start;

fn cairn() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_reports_accepted_duplicate_and_rejected_then_sigterm_stops() {
    let data = tempfile::tempdir().expect("tempdir");
    let corpus = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(corpus.path().join("notes")).expect("mkdir");
    std::fs::write(corpus.path().join("a.md"), "# Alpha\n\nfirst file").expect("write");
    std::fs::write(corpus.path().join("notes/b.txt"), "second file").expect("write");
    std::fs::write(corpus.path().join("notes/empty.txt"), "").expect("write");
    std::fs::write(
        corpus.path().join("notes/creds.txt"),
        "aws AKIAIOSFODNN7EXAMPLE",
    )
    .expect("write");
    std::fs::write(corpus.path().join("blob.bin"), [0u8, 255, 254, 1]).expect("write");
    // Documents as people have them: a PDF and a DOCX are sent as bytes with their media
    // types and read; a PDF that needs a password is refused, typed.
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("extract/tests/fixtures");
    for (from, to) in [
        ("pdfjs/file_pdfjs_test.pdf", "report.pdf"),
        ("docx/par-known-styles.docx", "notes/styles.docx"),
        ("pdfjs/issue6010_1.pdf", "locked.pdf"),
    ] {
        std::fs::copy(fixtures.join(from), corpus.path().join(to)).expect("copy fixture");
    }

    let (mut server, base) = start(data.path()).await;
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(data.path().join("admin.token"))
            .expect("admin.token")
            .permissions(),
    );
    assert_eq!(
        mode & 0o777,
        0o600,
        "the admin token is readable by its owner only"
    );
    let (ingest_base, ingest_data, ingest_corpus) = (
        base.clone(),
        data.path().to_path_buf(),
        corpus.path().to_path_buf(),
    );
    let run_ingest = move || {
        let output = cairn()
            .args([
                "ingest",
                "--quiet",
                "--dataset",
                "docs",
                "--server",
                &ingest_base,
                "--data-dir",
            ])
            .arg(&ingest_data)
            .arg(&ingest_corpus)
            .env("CAIRN_LOG", "warn")
            .output()
            .expect("run cairn ingest");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    let (code, stdout) = tokio::task::spawn_blocking(run_ingest.clone())
        .await
        .expect("ingest");
    assert_eq!(
        code,
        Some(2),
        "rejected files make the exit status 2:\n{stdout}"
    );
    assert!(stdout.contains("accepted  4"), "{stdout}");
    assert!(stdout.contains("duplicate 0"), "{stdout}");
    assert!(stdout.contains("rejected  4"), "{stdout}");
    assert!(
        stdout.contains("encrypted (1)") && stdout.contains("locked.pdf"),
        "{stdout}"
    );
    // Bytes that are not UTF-8 are refused at admission, not accepted to fail later.
    assert!(
        stdout.contains("not_text (1)") && stdout.contains("blob.bin"),
        "{stdout}"
    );
    assert!(
        stdout.contains("empty_content (1)") && stdout.contains("notes/empty.txt"),
        "{stdout}"
    );
    assert!(
        stdout.contains("secret_detected (1)") && stdout.contains("notes/creds.txt"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("AKIAIOSFODNN7EXAMPLE"),
        "secrets are never echoed"
    );

    let (_, again) = tokio::task::spawn_blocking(run_ingest)
        .await
        .expect("ingest");
    assert!(
        again.contains("accepted  0") && again.contains("duplicate 4"),
        "{again}"
    );

    let base_for_status = base.clone();
    let data_dir = data.path().to_path_buf();
    let status = tokio::task::spawn_blocking(move || {
        cairn()
            .args([
                "status",
                "--json",
                "--server",
                &base_for_status,
                "--data-dir",
            ])
            .arg(&data_dir)
            .output()
            .expect("run cairn status")
    })
    .await
    .expect("status");
    assert!(status.status.success());
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status json");
    assert_eq!(report["status"]["counts"]["sources"], 4);
    assert_eq!(report["ready"]["status"], "ready");

    let pid = server.id().expect("pid").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let exit = tokio::time::timeout(Duration::from_secs(30), server.wait())
        .await
        .expect("cairn serve stops within 30 s of SIGTERM")
        .expect("wait");
    assert!(exit.success(), "graceful stop exits 0, got {exit:?}");
}

/// `cairn serve` with a graph (ArcadeDB's Bolt plugin) projects links into it with its
/// in-process workers, and `cairn graph` prints them, bound to current revisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_projects_links_into_the_graph_and_cairn_graph_prints_them() {
    let graph = testkit::graph::GraphServer::start().expect("start ArcadeDB");
    let data = tempfile::tempdir().expect("tempdir");
    let bolt = graph.bolt_url();
    let (mut server, base) = crate::crash::spawn_serve_with(
        data.path(),
        &[],
        &[
            ("CAIRN_GRAPH_URL", bolt.as_str()),
            ("CAIRN_GRAPH_USER", "root"),
            ("CAIRN_GRAPH_PASSWORD", testkit::graph::GRAPH_PASSWORD),
            ("CAIRN_GRAPH_DATABASE", testkit::graph::GRAPH_DATABASE),
        ],
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let token = std::fs::read_to_string(data.path().join("admin.token"))
        .expect("admin token")
        .trim()
        .to_owned();
    let http = reqwest::Client::new();
    let response = http
        .post(format!("{base}/v1/sources/batch"))
        .bearer_auth(&token)
        .json(&serde_json::json!({ "items": [
            { "dataset": "docs", "source_key": "b.md", "content": "# B\n\nThe second page.", "tags": ["guide"] },
            { "dataset": "docs", "source_key": "a.md", "content": "# A\n\nRead [b](b.md) next." },
        ]}))
        .send()
        .await
        .expect("batch");
    assert_eq!(response.status().as_u16(), 200);
    // Wait for both revisions' graph receipts.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let status: serde_json::Value = http
            .get(format!("{base}/v1/status"))
            .bearer_auth(&token)
            .send()
            .await
            .expect("status")
            .json()
            .await
            .expect("json");
        if status["counts"]["jobs"]["completed"].as_i64() == Some(4) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "graph and projection jobs did not complete: {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let output = cairn()
        .args([
            "graph",
            "a.md",
            "--dataset",
            "docs",
            "--server",
            &base,
            "--data-dir",
        ])
        .arg(data.path())
        .env("CAIRN_LOG", "warn")
        .output()
        .expect("run cairn graph");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{printed} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(printed.contains("-> b.md"), "{printed}");
    let output = cairn()
        .args([
            "graph",
            "b.md",
            "--dataset",
            "docs",
            "--direction",
            "in",
            "--server",
            &base,
            "--data-dir",
        ])
        .arg(data.path())
        .output()
        .expect("run cairn graph");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("<- a.md"), "{printed}");
    // The ops summary shows the graph's progress.
    let summary: serde_json::Value = http
        .get(format!("{base}/v1/ops/summary"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("summary")
        .json()
        .await
        .expect("json");
    assert_eq!(summary["graph"]["verified"], 2, "{summary}");
    assert_eq!(summary["graph"]["lag"], 0, "{summary}");
    // Reconcile from the command line: nothing drifted.
    let output = cairn()
        .args(["reconcile", "--dataset", "docs", "--data-dir"])
        .arg(data.path())
        .env("CAIRN_GRAPH_URL", &bolt)
        .env("CAIRN_GRAPH_USER", "root")
        .env("CAIRN_GRAPH_PASSWORD", testkit::graph::GRAPH_PASSWORD)
        .env("CAIRN_GRAPH_DATABASE", testkit::graph::GRAPH_DATABASE)
        .env(
            "CAIRN_MODELS_DIR",
            concat!(env!("CARGO_MANIFEST_DIR"), "/models"),
        )
        .env("CAIRN_LOG", "warn")
        .output()
        .expect("run cairn reconcile");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{printed} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(printed.contains("2 current heads checked"), "{printed}");
    assert!(!printed.contains(testkit::graph::GRAPH_PASSWORD));
    server.start_kill().expect("stop");
    let _ = server.wait().await;
}

/// `cairn ingest DIR --prune`: the dataset's sources under the prefix end equal to the folder
/// (new and changed files sent, unchanged ones not, removed and renamed-away ones
/// tombstoned), a key outside the prefix is left alone, and a second run changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_prune_keeps_a_dataset_equal_to_a_folder() {
    let data = tempfile::tempdir().expect("tempdir");
    let folder = tempfile::tempdir().expect("folder");
    let write = |path: &str, text: &str| {
        let path = folder.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
        std::fs::write(path, text).expect("write");
    };
    write("a.md", "# Alpha\n\nwombat original text");
    write("b.md", "# Bravo\n\nwombat to be deleted");
    write("sub/c.txt", "wombat to be renamed");
    write("photo.png", "not a format cairn reads");
    let outside = tempfile::tempdir().expect("outside");
    std::fs::write(outside.path().join("secret.md"), "wombat secret outside").expect("secret");
    std::os::unix::fs::symlink(
        outside.path().join("secret.md"),
        folder.path().join("leak.md"),
    )
    .expect("symlink");
    let (mut server, base) = start(data.path()).await;
    let token = crate::common::admin_token(data.path());
    let http = reqwest::Client::new();
    crate::common::post_source(
        &http,
        &base,
        &token,
        &json!({"dataset": "docs", "source_key": "outside.md", "content": "wombat kept outside the prefix"}),
    )
    .await;
    let prune = |extra: &[&str]| {
        let output = cairn()
            .args(["ingest", "--quiet", "--dataset", "docs", "--prune"])
            .args(["--prefix", "notes/", "--server", &base, "--token", &token])
            .args(extra)
            .arg(folder.path())
            .env("CAIRN_LOG", "warn")
            .output()
            .expect("run cairn ingest --prune");
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let first = prune(&[]);
    assert!(first.contains("added     3 (sent)"), "{first}");
    assert!(first.contains("skipped   2"), "{first}");
    assert!(
        first.contains("leak.md: link_leaves_root"),
        "never followed: {first}"
    );
    assert!(first.contains("photo.png: unsupported_format"), "{first}");
    assert!(first.contains("accepted  3"), "{first}");

    write("a.md", "# Alpha\n\nwombat edited text");
    std::fs::remove_file(folder.path().join("b.md")).expect("delete");
    std::fs::rename(
        folder.path().join("sub/c.txt"),
        folder.path().join("sub/d.txt"),
    )
    .expect("rename");
    let dry = prune(&["--dry-run"]);
    assert!(
        dry.contains("added     1 (would sent)") && dry.contains("removed   2 (would tombstoned)"),
        "{dry}"
    );
    let second = prune(&[]);
    assert!(second.contains("added     1 (sent)"), "{second}");
    assert!(second.contains("changed   1 (sent)"), "{second}");
    assert!(second.contains("unchanged 0 (not sent)"), "{second}");
    assert!(second.contains("removed   2 (tombstoned)"), "{second}");
    assert!(
        second.contains("notes/b.md") && second.contains("notes/sub/c.txt"),
        "{second}"
    );

    // Search finds exactly the folder's files (and the key outside the prefix).
    let answer: serde_json::Value = http
        .post(format!("{base}/v1/search"))
        .bearer_auth(&token)
        .json(&json!({"query": "wombat", "mode": "lexical", "top_k": 20}))
        .send()
        .await
        .expect("search")
        .json()
        .await
        .expect("answer");
    assert_eq!(
        crate::common::hit_keys(&answer),
        ["notes/a.md", "notes/sub/d.txt", "outside.md"],
        "{answer}"
    );
    let edited = answer["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|hit| hit["source_key"] == "notes/a.md")
        .expect("a.md");
    assert!(edited["text"]
        .as_str()
        .is_some_and(|text| text.contains("edited")));

    let third = prune(&[]);
    assert!(third.contains("unchanged 2 (not sent)"), "{third}");
    assert!(
        third.contains("added     0")
            && third.contains("removed   0")
            && third.contains("accepted  0"),
        "nothing is sent again: {third}"
    );
    // The listing the client compares against, paged and marked.
    let listing: serde_json::Value = http
        .get(format!(
            "{base}/v1/datasets/docs/sources?prefix=notes/&limit=2"
        ))
        .bearer_auth(&token)
        .send()
        .await
        .expect("listing")
        .json()
        .await
        .expect("listing json");
    assert_eq!(
        listing["sources"].as_array().map(Vec::len),
        Some(2),
        "{listing}"
    );
    assert_eq!(listing["next_after"], "notes/b.md", "{listing}");
    assert_eq!(listing["sources"][1]["tombstone"], true, "{listing}");
    let _ = server.kill().await;
}
