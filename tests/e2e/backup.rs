//! `cairn backup` while `cairn serve` runs, then `cairn restore` into the same data directory:
//! a restore refuses a running target, a damaged backup and a clock behind the backup, and
//! refuses to run without the erasure journal unless told to. After a restore, the ledger and
//! the vectors are the backup's (later ingests are gone, a verify is clean), while an erasure
//! and a token revocation made after the backup stay in force.

use std::process::Output;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{admin_token, cairn_json, post_source};
use crate::crash::spawn_serve_with;
use crate::projection::wait_for_job;

fn cairn(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .env("CAIRN_LOG", "warn")
        .output()
        .expect("run cairn")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The keys `query` finds in `docs`, lexically and by vector (the two must agree on a
/// restored installation), each hit's revision read back with its content holding `query`'s
/// word: an error answer fails, never reads as "nothing found".
async fn search_keys(http: &reqwest::Client, base: &str, token: &str, query: &str) -> Vec<String> {
    let mut found = Vec::new();
    for mode in ["lexical", "vector"] {
        let response = http
            .post(format!("{base}/v1/search"))
            .bearer_auth(token)
            .json(&json!({"query": query, "mode": mode, "top_k": 20, "datasets": ["docs"]}))
            .send()
            .await
            .expect("search");
        assert_eq!(response.status().as_u16(), 200, "{mode} search for {query}");
        let answer: Value = response.json().await.expect("answer");
        let hits = answer["results"]
            .as_array()
            .unwrap_or_else(|| panic!("{mode} search answers results: {answer}"));
        let mut keys = Vec::new();
        for hit in hits {
            let key = hit["source_key"].as_str().expect("a hit's key").to_owned();
            let revision = hit["source_revision_id"]
                .as_str()
                .expect("a hit's revision");
            let content = http
                .get(format!("{base}/v1/revisions/{revision}/content"))
                .bearer_auth(token)
                .send()
                .await
                .expect("content");
            assert_eq!(content.status().as_u16(), 200, "{key} {revision}");
            let text = content.text().await.expect("text");
            // A vector hit may be any near note; a lexical hit holds the word.
            if mode == "lexical" || text.contains(query) {
                assert!(text.contains(query), "{key} {revision}: {text}");
                keys.push(key);
            }
        }
        keys.sort_unstable();
        keys.dedup();
        found.push(keys);
    }
    let vector = found.pop().unwrap_or_default();
    let lexical = found.pop().unwrap_or_default();
    assert_eq!(
        lexical, vector,
        "lexical and vector search disagree on `{query}`"
    );
    lexical
}

/// Ingests one note per `(key, words)` into `docs` and waits until each is projected; answers
/// their revisions.
async fn project_notes(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    notes: &[(&str, &str)],
) -> Vec<String> {
    let mut revisions = Vec::new();
    for (key, words) in notes {
        let content = format!("# {key}\n\nA note on the {words}, long enough for one chunk.");
        let body = json!({"dataset": "docs", "source_key": key, "content": content});
        revisions.push(post_source(http, base, token, &body).await);
    }
    for revision in &revisions {
        wait_for_job(http, base, token, revision, "completed").await;
    }
    revisions
}

/// The source key of the best vector-only hit for `query`.
async fn top_vector_hit(http: &reqwest::Client, base: &str, token: &str, query: &str) -> String {
    let answer: Value = http
        .post(format!("{base}/v1/search"))
        .bearer_auth(token)
        .json(&json!({"query": query, "mode": "vector", "top_k": 3}))
        .send()
        .await
        .expect("search")
        .json()
        .await
        .expect("answer");
    answer["results"][0]["source_key"]
        .as_str()
        .unwrap_or_else(|| panic!("no vector hit: {answer}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restores_with_later_erasures_and_revocations_kept() {
    let data = tempfile::tempdir().expect("tempdir");
    let backups = tempfile::tempdir().expect("backups");
    let backup_dir = backups.path().to_string_lossy().into_owned();
    let envs = [
        ("CAIRN_BACKUP_DIR", backup_dir.as_str()),
        ("CAIRN_VERIFY_POINTS_PER_SECOND", "4000000000"),
    ];
    let (mut server, base) = spawn_serve_with(
        data.path(),
        &[],
        &envs,
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let admin = admin_token(data.path());
    let http = reqwest::Client::new();
    let revisions = project_notes(
        &http,
        &base,
        &admin,
        &[
            ("a.md", "aardvark first"),
            ("b.md", "badger secret"),
            ("c.md", "camel"),
        ],
    )
    .await;
    let reader: Value = http
        .post(format!("{base}/v1/tokens"))
        .bearer_auth(&admin)
        .json(&json!({"name": "reader", "scopes": ["search"]}))
        .send()
        .await
        .expect("token")
        .json()
        .await
        .expect("token json");
    let reader_secret = reader["secret"].as_str().expect("secret").to_owned();
    let reader_id = reader["token"]["id"].as_str().expect("id").to_owned();

    // The backup, while serving under a steady ingest and search load.
    let loading = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let load = {
        let (http, base, admin) = (http.clone(), base.clone(), admin.clone());
        let loading = loading.clone();
        tokio::spawn(async move {
            let mut accepted = 0;
            while loading.load(std::sync::atomic::Ordering::SeqCst) {
                let body = json!({"dataset": "load", "source_key": format!("load-{accepted}.md"),
                                  "content": format!("load document {accepted}")});
                let receipt = http
                    .post(format!("{base}/v1/sources"))
                    .bearer_auth(&admin)
                    .json(&body)
                    .send()
                    .await
                    .expect("ingest under load");
                assert_eq!(receipt.status().as_u16(), 202);
                let searched = http
                    .post(format!("{base}/v1/search"))
                    .bearer_auth(&admin)
                    .json(&json!({"query": "load document"}))
                    .send()
                    .await
                    .expect("search under load");
                assert_eq!(searched.status().as_u16(), 200);
                accepted += 1;
            }
            accepted
        })
    };
    let (backup_base, backup_admin) = (base.clone(), admin.clone());
    let backup = tokio::task::spawn_blocking(move || {
        cairn(&[
            "backup",
            "--reason",
            "nightly",
            "--server",
            &backup_base,
            "--token",
            &backup_admin,
        ])
    })
    .await
    .expect("backup");
    loading.store(false, std::sync::atomic::Ordering::SeqCst);
    let accepted_under_load: usize = load.await.expect("load");
    assert!(accepted_under_load > 0);
    assert_eq!(backup.status.code(), Some(0), "{}", text(&backup));
    let manifest: Value = serde_json::from_slice(&backup.stdout).expect("manifest json");
    let folder = backups.path().join(manifest["id"].as_str().expect("id"));
    assert!(folder.join("manifest.json").is_file());
    assert!(
        manifest["ledger"]["sources"].as_i64().unwrap_or(0) >= 3,
        "{manifest}"
    );
    assert_eq!(
        manifest["generations"].as_array().map(Vec::len),
        Some(1),
        "{manifest}"
    );
    assert!(
        manifest["generations"][0]["points"].as_u64().unwrap_or(0) >= 3,
        "{manifest}"
    );

    // After the backup: a new source, a new revision, an erasure and a revocation.
    let later = post_source(&http, &base, &admin, &json!({"dataset": "docs", "source_key": "d.md", "content": "# d\n\nA dingo arrived after the backup."})).await;
    let edited = post_source(&http, &base, &admin, &json!({"dataset": "docs", "source_key": "a.md", "content": "# a\n\nThe aardvark text was edited after the backup."})).await;
    wait_for_job(&http, &base, &admin, &later, "completed").await;
    wait_for_job(&http, &base, &admin, &edited, "completed").await;
    cairn_json(
        data.path(),
        &base,
        &[
            "erase",
            "--dataset",
            "docs",
            "--source-key",
            "b.md",
            "--reason",
            "legal 7",
        ],
    );
    let revoked = http
        .post(format!("{base}/v1/tokens/{reader_id}/revoke"))
        .bearer_auth(&admin)
        .json(&json!({"reason": "leaked"}))
        .send()
        .await
        .expect("revoke");
    assert_eq!(revoked.status().as_u16(), 200);
    // ... and an access change: c.md is read by carol alone from now on.
    let narrowed = http
        .put(format!("{base}/v1/sources/access"))
        .bearer_auth(&admin)
        .json(
            &json!({"dataset": "docs", "source_key": "c.md", "readers": ["user:carol"],
                      "reason": "carol only"}),
        )
        .send()
        .await
        .expect("access change");
    assert_eq!(narrowed.status().as_u16(), 200);

    // A restore refuses a running target.
    let data_dir = data.path().to_string_lossy().into_owned();
    let folder_text = folder.to_string_lossy().into_owned();
    let busy = cairn(&["restore", "--from", &folder_text, "--data-dir", &data_dir]);
    assert_eq!(busy.status.code(), Some(1));
    assert!(
        text(&busy).contains("stop it before restoring"),
        "{}",
        text(&busy)
    );
    let _ = server.kill().await;
    let _ = server.wait().await;

    // ... a clock behind the backup (a manifest from the future), and a damaged file.
    let copy = tempfile::tempdir().expect("copy");
    let copied = copy.path().join("backup");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(&folder)
        .arg(&copied)
        .status()
        .expect("cp");
    assert!(status.success());
    let mut future = manifest.clone();
    future["ledger"]["newest_at"] = json!(i64::MAX / 2);
    std::fs::write(
        copied.join("manifest.json"),
        serde_json::to_vec(&future).expect("json"),
    )
    .expect("write");
    let behind = cairn(&[
        "restore",
        "--from",
        &copied.to_string_lossy(),
        "--data-dir",
        &data_dir,
    ]);
    assert_eq!(behind.status.code(), Some(1));
    assert!(text(&behind).contains("clock"), "{}", text(&behind));
    std::fs::write(
        copied.join("manifest.json"),
        serde_json::to_vec(&manifest).expect("json"),
    )
    .expect("write");
    let ledger_copy = copied.join("ledger.db");
    let mut bytes = std::fs::read(&ledger_copy).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&ledger_copy, bytes).expect("damage");
    let damaged = cairn(&[
        "restore",
        "--from",
        &copied.to_string_lossy(),
        "--data-dir",
        &data_dir,
    ]);
    assert_eq!(damaged.status.code(), Some(1));
    assert!(
        text(&damaged).contains("does not match the manifest"),
        "{}",
        text(&damaged)
    );
    // ... and no journal, unless resurrection is accepted (the journal is put back after).
    let journal = data.path().join("journal").join("erasures.jsonl");
    let kept = copy.path().join("erasures.jsonl");
    std::fs::rename(&journal, &kept).expect("move the journal away");
    let unjournalled = cairn(&["restore", "--from", &folder_text, "--data-dir", &data_dir]);
    assert_eq!(unjournalled.status.code(), Some(1));
    assert!(
        text(&unjournalled).contains("--accept-resurrection"),
        "{}",
        text(&unjournalled)
    );
    std::fs::rename(&kept, &journal).expect("journal back");
    // Nothing of the above changed the data directory.
    assert!(!std::fs::read_dir(data.path())
        .expect("ls")
        .any(|entry| entry
            .map(|e| e
                .file_name()
                .to_string_lossy()
                .starts_with("before-restore"))
            .unwrap_or(false)));

    // The restore.
    let restored = cairn(&["restore", "--from", &folder_text, "--data-dir", &data_dir]);
    assert_eq!(restored.status.code(), Some(0), "{}", text(&restored));
    let steps: Vec<String> = String::from_utf8_lossy(&restored.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|step| step["step"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        steps,
        [
            "checked",
            "set_aside",
            "migrated",
            "leases_voided",
            "journal_replayed",
            "stores_loaded",
            "verified"
        ],
        "{}",
        text(&restored)
    );
    assert!(
        text(&restored).contains("\"erasures\":1"),
        "{}",
        text(&restored)
    );
    assert!(
        text(&restored).contains("\"access_changes\":1"),
        "{}",
        text(&restored)
    );

    let (mut server, base) = spawn_serve_with(
        data.path(),
        &[],
        &envs,
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    // The backup's state: d.md is gone, a.md is the backup's revision.
    assert!(search_keys(&http, &base, &admin, "dingo").await.is_empty());
    assert_eq!(
        search_keys(&http, &base, &admin, "aardvark").await,
        ["a.md"]
    );
    let source: Value = http
        .get(format!("{base}/v1/sources?dataset=docs&source_key=a.md"))
        .bearer_auth(&admin)
        .send()
        .await
        .expect("source")
        .json()
        .await
        .expect("json");
    assert_eq!(
        source["head"]["id"].as_str(),
        Some(revisions[0].as_str()),
        "{source}"
    );
    // The erasure made after the backup is in force: b.md's text is nowhere.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !search_keys(&http, &base, &admin, "badger").await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the erased source came back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The revocation too.
    let refused = http
        .post(format!("{base}/v1/search"))
        .bearer_auth(&reader_secret)
        .json(&json!({"query": "camel"}))
        .send()
        .await
        .expect("search");
    assert_eq!(refused.status().as_u16(), 401);
    // The access change too: c.md's readers are the ones set after the backup.
    let access = http
        .get(format!(
            "{base}/v1/sources/access?dataset=docs&source_key=c.md"
        ))
        .bearer_auth(&admin)
        .send()
        .await
        .expect("access");
    assert_eq!(access.status().as_u16(), 200);
    let access: Value = access.json().await.expect("json");
    assert_eq!(access["readers"], json!(["user:carol"]), "{access}");
    // And the restored installation verifies clean once the replayed erasure is projected.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let verified = cairn(&[
            "verify", "--tier", "deep", "--server", &base, "--token", &admin,
        ]);
        if verified.status.code() == Some(0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            text(&verified)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let _ = server.kill().await;
    let _ = server.wait().await;
}

/// A portable backup of an embedded installation restores onto a Qdrant server: the points
/// are loaded, not embedded again, and the restored installation searches and verifies clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portable_backup_moves_an_embedded_installation_to_a_qdrant_server() {
    let data = tempfile::tempdir().expect("tempdir");
    let backups = tempfile::tempdir().expect("backups");
    let backup_dir = backups.path().to_string_lossy().into_owned();
    let envs = [("CAIRN_BACKUP_DIR", backup_dir.as_str())];
    let (mut server, base) = spawn_serve_with(
        data.path(),
        &[],
        &envs,
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let admin = admin_token(data.path());
    let http = reqwest::Client::new();
    project_notes(
        &http,
        &base,
        &admin,
        &[("a.md", "aardvark"), ("b.md", "badger"), ("c.md", "camel")],
    )
    .await;
    let backup = cairn(&["backup", "--portable", "--server", &base, "--token", &admin]);
    assert_eq!(backup.status.code(), Some(0), "{}", text(&backup));
    let manifest: Value = serde_json::from_slice(&backup.stdout).expect("manifest");
    assert_eq!(manifest["generations"][0]["format"], "dump", "{manifest}");
    let _ = server.kill().await;
    let _ = server.wait().await;

    let qdrant = testkit::qdrant::QdrantServer::start().expect("start Qdrant");
    let target = tempfile::tempdir().expect("target");
    // The journal travels with the data directory; this one is new.
    std::fs::create_dir_all(target.path().join("journal")).expect("journal dir");
    std::fs::copy(
        data.path().join("journal").join("erasures.jsonl"),
        target.path().join("journal").join("erasures.jsonl"),
    )
    .or_else(|_| {
        std::fs::write(target.path().join("journal").join("erasures.jsonl"), "").map(|()| 0)
    })
    .expect("journal");
    let folder = backups.path().join(manifest["id"].as_str().expect("id"));
    let restored = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["restore", "--from"])
        .arg(&folder)
        .arg("--data-dir")
        .arg(target.path())
        .env("CAIRN_VECTORS_URL", qdrant.grpc_url())
        .env("CAIRN_LOG", "warn")
        .output()
        .expect("restore");
    assert_eq!(restored.status.code(), Some(0), "{}", text(&restored));
    assert!(
        text(&restored).contains("\"format\":\"dump\""),
        "{}",
        text(&restored)
    );

    // The tokens are the restored ledger's: the operator's admin token still works.
    std::fs::copy(
        data.path().join("admin.token"),
        target.path().join("admin.token"),
    )
    .expect("admin token");
    let grpc = qdrant.grpc_url();
    let envs = [
        ("CAIRN_VECTORS_URL", grpc.as_str()),
        ("CAIRN_VERIFY_POINTS_PER_SECOND", "4000000000"),
    ];
    let (mut server, base) = spawn_serve_with(
        target.path(),
        &[],
        &envs,
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let admin = admin_token(target.path());
    // No projection was needed: no job is open (pending, running or waiting to retry: serve's
    // own workers would hold a queued one as running at once), and vector search finds the
    // documents.
    let status = cairn_json(target.path(), &base, &["status"]);
    // (The check this replaced read `status.counts.jobs.pending`, which is not where the counts
    // are, as 0: it could not fail.)
    let jobs = status["status"]["counts"]["jobs"]
        .as_object()
        .unwrap_or_else(|| panic!("status counts jobs by state: {status}"));
    assert!(
        jobs.get("completed").and_then(Value::as_i64).unwrap_or(0) > 0,
        "the restored ledger holds the source's jobs: {status}"
    );
    let open: i64 = ["pending", "running", "retry_wait"]
        .iter()
        .map(|state| jobs.get(*state).and_then(Value::as_i64).unwrap_or(0))
        .sum();
    assert_eq!(open, 0, "the restore queued work: {status}");
    assert_eq!(
        top_vector_hit(&http, &base, &admin, "a note on the badger").await,
        "b.md"
    );
    let verified = cairn(&[
        "verify", "--tier", "scrub", "--server", &base, "--token", &admin,
    ]);
    assert_eq!(verified.status.code(), Some(0), "{}", text(&verified));
    let _ = server.kill().await;
    let _ = server.wait().await;
}

/// A PostgreSQL ledger is backed up with `pg_dump` on a snapshot exported by the transaction
/// that reads its history position, and restored with `pg_restore` into a fresh database
/// (never over one that holds a ledger); the restored installation verifies clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_ledger_backs_up_and_restores_into_a_fresh_database() {
    let postgres = testkit::postgres::PostgresServer::start().expect("start PostgreSQL");
    let url = postgres.create_database("ledger").expect("database");
    let data = tempfile::tempdir().expect("tempdir");
    let backups = tempfile::tempdir().expect("backups");
    let backup_dir = backups.path().to_string_lossy().into_owned();
    let envs = [
        ("CAIRN_BACKUP_DIR", backup_dir.as_str()),
        ("CAIRN_VERIFY_POINTS_PER_SECOND", "4000000000"),
    ];
    let (mut server, base) = spawn_serve_with(
        data.path(),
        &["--ledger", &url],
        &envs,
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let admin = admin_token(data.path());
    let http = reqwest::Client::new();
    project_notes(
        &http,
        &base,
        &admin,
        &[("a.md", "aardvark"), ("b.md", "badger")],
    )
    .await;
    let backup = cairn(&["backup", "--server", &base, "--token", &admin]);
    assert_eq!(backup.status.code(), Some(0), "{}", text(&backup));
    let manifest: Value = serde_json::from_slice(&backup.stdout).expect("manifest");
    assert_eq!(manifest["ledger"]["engine"], "postgres", "{manifest}");
    assert_eq!(
        manifest["ledger"]["file"]["path"], "ledger.pgdump",
        "{manifest}"
    );
    assert_eq!(manifest["ledger"]["sources"], 2, "{manifest}");
    let _ = server.kill().await;
    let _ = server.wait().await;
    let folder = backups.path().join(manifest["id"].as_str().expect("id"));
    let folder = folder.to_string_lossy().into_owned();

    // Into a fresh data directory (the vectors) and a fresh database (the ledger).
    let target = tempfile::tempdir().expect("target");
    std::fs::create_dir_all(target.path().join("journal")).expect("journal dir");
    std::fs::write(target.path().join("journal").join("erasures.jsonl"), "").expect("journal");
    let target_dir = target.path().to_string_lossy().into_owned();
    // Never over a database that holds a ledger.
    let over = cairn(&[
        "restore",
        "--from",
        &folder,
        "--data-dir",
        &target_dir,
        "--ledger",
        &url,
    ]);
    assert_eq!(over.status.code(), Some(1));
    assert!(
        text(&over).contains("fresh, empty database"),
        "{}",
        text(&over)
    );
    let fresh = postgres.create_database("restored").expect("database");
    let restored = cairn(&[
        "restore",
        "--from",
        &folder,
        "--data-dir",
        &target_dir,
        "--ledger",
        &fresh,
    ]);
    assert_eq!(restored.status.code(), Some(0), "{}", text(&restored));

    std::fs::copy(
        data.path().join("admin.token"),
        target.path().join("admin.token"),
    )
    .expect("admin token");
    let (mut server, base) = spawn_serve_with(
        target.path(),
        &["--ledger", &fresh],
        &envs,
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    assert_eq!(
        top_vector_hit(&http, &base, &admin, "a note on the badger").await,
        "b.md"
    );
    let verified = cairn(&[
        "verify", "--tier", "deep", "--server", &base, "--token", &admin,
    ]);
    assert_eq!(verified.status.code(), Some(0), "{}", text(&verified));
    let history = postgres
        .psql(
            "restored",
            "SELECT count(*) FROM history WHERE entity = 'restore'",
        )
        .expect("psql");
    assert_eq!(history.trim(), "1");
    let _ = server.kill().await;
    let _ = server.wait().await;
}
