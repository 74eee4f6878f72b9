//! Erasure end to end on the embedded default (the binary, SQLite, qdrant-edge, the real
//! model): a source with two revisions is erased through `cairn erase`; the ledger part commits,
//! the server is killed before the stores are erased, and on restart the erasure's jobs finish
//! (`erased` receipts with read-back evidence). Afterwards no search mode finds it, and a
//! unique marker from its text is in no file of the data directory once the WAL is
//! checkpointed and the vector shard flushed and optimised. The source can be ingested again.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::crash::start;

const MARKER: &str = "quokkazygote";

async fn put(http: &reqwest::Client, base: &str, token: &str, key: &str, text: &str) -> String {
    // The marker in the metadata too, where the text has it.
    let note = if text.contains(MARKER) {
        format!("{MARKER} in the metadata")
    } else {
        String::new()
    };
    let body = json!({
        "dataset": "docs", "source_key": key, "content": text, "metadata": { "note": note },
    });
    crate::common::post_source(http, base, token, &body).await
}

/// Keys of the results for the marker, in every mode.
async fn found(http: &reqwest::Client, base: &str, token: &str) -> Vec<(String, String)> {
    let mut keys = Vec::new();
    for mode in ["vector", "lexical", "auto"] {
        let answer: Value = http
            .post(format!("{base}/v1/search"))
            .bearer_auth(token)
            .json(&json!({ "query": format!("{MARKER} orchard"), "mode": mode, "datasets": ["docs"] }))
            .send()
            .await
            .expect("search")
            .json()
            .await
            .expect("json");
        for result in answer["results"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"))
        {
            keys.push((
                mode.to_owned(),
                result["source_key"].as_str().unwrap_or_default().to_owned(),
            ));
        }
    }
    keys
}

/// Files under `root` that contain `needle`.
fn files_containing(root: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(directory) = stack.pop() {
        for entry in std::fs::read_dir(&directory).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                if bytes.windows(needle.len()).any(|window| window == needle) {
                    found.push(path.display().to_string());
                }
            }
        }
    }
    found
}

async fn terminate(child: &mut tokio::process::Child) {
    let pid = child.id().expect("pid").to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("stopped")
        .expect("wait");
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erased_source_leaves_no_trace_and_an_interrupted_erasure_finishes_on_restart() {
    let data = tempfile::tempdir().expect("tempdir");
    let (mut server, base) = start(data.path()).await;
    let token = crate::common::admin_token(data.path());
    let http = reqwest::Client::new();
    let text = |version: u32| {
        format!(
            "Private notes, version {version}. The {MARKER} lives in the old orchard behind the \
             mill, and nobody else knows about the {MARKER} at all.\n\nA second paragraph about \
             apples and pears in the orchard."
        )
    };
    let first = put(&http, &base, &token, "secret", &text(1)).await;
    let second = put(&http, &base, &token, "secret", &text(2)).await;
    let kept = put(
        &http,
        &base,
        &token,
        "kept",
        "Apples and pears grow in every orchard.",
    )
    .await;
    for id in [&second, &kept] {
        crate::projection::wait_for_job(&http, &base, &token, id, "completed").await;
    }
    let before = found(&http, &base, &token).await;
    assert!(before.iter().any(|(_, key)| key == "secret"), "{before:?}");

    // The ledger part commits; the stores' part is held back by a pause, then the server dies.
    crate::common::cairn_json(
        data.path(),
        &base,
        &["ops", "pause", "--reason", "test: hold the erasure"],
    );
    let erased = crate::common::cairn_json(
        data.path(),
        &base,
        &[
            "erase",
            "--dataset",
            "docs",
            "--source-key",
            "secret",
            "--reason",
            "legal 42",
        ],
    );
    let erasure = erased["source_revision_id"]
        .as_str()
        .expect("erasure id")
        .to_owned();
    server.start_kill().expect("SIGKILL");
    server.wait().await.expect("killed");

    let (mut server, base) = start(data.path()).await;
    // Gone from the ledger at once: no revision, no lexical hit.
    for gone in [&first, &second] {
        let status = http
            .get(format!("{base}/v1/revisions/{gone}"))
            .bearer_auth(&token)
            .send()
            .await
            .expect("GET")
            .status();
        assert_eq!(status, 404, "{gone}");
    }
    crate::common::cairn_json(
        data.path(),
        &base,
        &["ops", "resume", "--reason", "test: let it finish"],
    );
    let detail = crate::projection::wait_for_job(&http, &base, &token, &erasure, "completed").await;
    let receipts = detail["receipts"].as_array().expect("receipts");
    assert_eq!(receipts.len(), 2, "{detail}");
    for receipt in receipts {
        assert_eq!(receipt["state"], "erased", "{detail}");
    }
    let vector = receipts
        .iter()
        .find(|receipt| receipt["backend"] == "vector")
        .expect("vector receipt");
    assert!(
        vector["evidence"]["points_deleted"]
            .as_u64()
            .expect("points")
            >= 1
    );
    assert_eq!(vector["evidence"]["points_left"], 0);
    let relational = receipts
        .iter()
        .find(|receipt| receipt["backend"] == "relational")
        .expect("relational receipt");
    assert_eq!(relational["evidence"]["revisions_erased"], 2);
    assert_eq!(relational["evidence"]["contents_deleted"], 2);
    let after = found(&http, &base, &token).await;
    assert!(after.iter().all(|(_, key)| key != "secret"), "{after:?}");
    let source: Value = http
        .get(format!("{base}/v1/sources?dataset=docs&source_key=secret"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("GET source")
        .json()
        .await
        .expect("json");
    assert_eq!(source["deleted"], true);
    assert_eq!(source["revisions"].as_array().expect("revisions").len(), 1);
    let history = serde_json::to_string(&source["head_history"]).expect("history");
    assert!(
        history.contains("legal 42") && !history.contains(MARKER),
        "{history}"
    );

    // On disk: stop cleanly (the shard is flushed), checkpoint the WAL, optimise the shard.
    terminate(&mut server).await;
    let ledger = data.path().join("ledger.db");
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&ledger);
    let mut connection = <sqlx::SqliteConnection as sqlx::Connection>::connect_with(&options)
        .await
        .expect("open the ledger");
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&mut connection)
        .await
        .expect("checkpoint");
    sqlx::Connection::close(connection).await.expect("close");
    for shard in std::fs::read_dir(data.path().join("vectors"))
        .expect("vectors")
        .flatten()
    {
        let store =
            gateways::EdgeVectorStore::open(&shard.path(), gateways::embedder::MODEL_DIMENSION)
                .expect("open the shard");
        store.optimize_now().await.expect("optimise");
        gateways::VectorStore::close(&store).await.expect("flush");
    }
    let traces = files_containing(data.path(), MARKER.as_bytes());
    assert!(
        traces.is_empty(),
        "the erased marker is still in {traces:?}"
    );

    // Ingested again, as new.
    let (mut server, base) = start(data.path()).await;
    let again = put(&http, &base, &token, "secret", &text(3)).await;
    let detail = crate::projection::wait_for_job(&http, &base, &token, &again, "completed").await;
    assert_eq!(detail["revision"]["previous_revision_id"], erasure.as_str());
    let found_again = found(&http, &base, &token).await;
    assert!(found_again.iter().any(|(_, key)| key == "secret"));
    server.kill().await.expect("stop");
}
