//! `cairn serve` projects what it accepts: its in-process workers chunk, embed (the real
//! model), write qdrant-edge points and read them back; receipts turn verified, a deletion
//! turns them excluded, and a restart keeps everything.

use std::time::Duration;

use serde_json::{json, Value};

use crate::crash::start;

async fn revision(http: &reqwest::Client, base: &str, token: &str, id: &str) -> Value {
    http.get(format!("{base}/v1/revisions/{id}"))
        .bearer_auth(token)
        .send()
        .await
        .expect("GET revision")
        .json()
        .await
        .expect("revision json")
}

/// Polls a revision until its job reaches `state`; returns the detail.
pub(crate) async fn wait_for_job(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    id: &str,
    state: &str,
) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let detail = revision(http, base, token, id).await;
        if detail["job"]["state"] == state {
            return detail;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job of {id} did not reach {state}: {detail}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn receipt_states(detail: &Value) -> Vec<(String, String)> {
    detail["receipts"]
        .as_array()
        .expect("receipts")
        .iter()
        .map(|r| {
            (
                r["backend"].as_str().unwrap_or("").to_owned(),
                r["state"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_projects_accepted_revisions_and_excludes_deleted_ones() {
    let data = tempfile::tempdir().expect("tempdir");
    let (mut server, base) = start(data.path()).await;
    let token = crate::common::admin_token(data.path());
    let http = reqwest::Client::new();
    let body = json!({
        "dataset": "docs",
        "source_key": "guitar",
        "content": "A man is playing a guitar on a small stage.\n\nPeople listen quietly.",
    });
    let receipt: Value = http
        .post(format!("{base}/v1/sources"))
        .bearer_auth(&token)
        .json(&body)
        .send()
        .await
        .expect("POST")
        .json()
        .await
        .expect("receipt");
    let id = receipt["source_revision_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let detail = wait_for_job(&http, &base, &token, &id, "completed").await;
    assert_eq!(
        receipt_states(&detail),
        [
            ("relational".to_owned(), "verified".to_owned()),
            ("vector".to_owned(), "verified".to_owned())
        ]
    );
    let vector = detail["receipts"]
        .as_array()
        .expect("receipts")
        .iter()
        .find(|r| r["backend"] == "vector")
        .expect("vector receipt")
        .clone();
    assert_eq!(vector["evidence"]["dimension"], 384);
    assert_eq!(
        vector["evidence"]["model"],
        "sentence-transformers/all-MiniLM-L6-v2"
    );
    assert!(vector["evidence"]["points"].as_u64().expect("points") >= 1);

    // `cairn search` finds it, by meaning and by words, fused.
    let search = |json: bool| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"));
        command.args([
            "search",
            "someone performing music for an audience",
            "--dataset",
            "docs",
            "--server",
            &base,
            "--data-dir",
        ]);
        command.arg(data.path());
        if json {
            command.arg("--json");
        }
        let output = command.output().expect("cairn search");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let table = search(false);
    assert!(table.contains("guitar"), "{table}");
    assert!(table.contains("searchable"), "{table}");
    let answer: Value = serde_json::from_str(&search(true)).expect("search json");
    assert_eq!(answer["results"][0]["source_key"], "guitar", "{answer}");
    assert_eq!(answer["results"][0]["source_revision_id"], id.as_str());
    assert!(
        matches!(answer["mode"].as_str(), Some("hybrid" | "vector")),
        "{answer}"
    );

    let deleted: Value = http
        .delete(format!("{base}/v1/sources?dataset=docs&source_key=guitar"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("DELETE")
        .json()
        .await
        .expect("tombstone receipt");
    let tombstone = deleted["source_revision_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let detail = wait_for_job(&http, &base, &token, &tombstone, "completed").await;
    assert_eq!(
        receipt_states(&detail),
        [
            ("relational".to_owned(), "excluded".to_owned()),
            ("vector".to_owned(), "excluded".to_owned())
        ]
    );
    let answer: Value = serde_json::from_str(&search(true)).expect("search json");
    assert_eq!(
        answer["results"],
        json!([]),
        "a deleted source was found: {answer}"
    );
    let old = revision(&http, &base, &token, &id).await;
    assert!(
        receipt_states(&old)
            .iter()
            .all(|(_, state)| state == "superseded"),
        "{old}"
    );

    // The served metrics saw the real runs: every stage of both jobs, both completions, and
    // the searches above.
    let metrics = http
        .get(format!("{base}/metrics"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    let count = |name: &str, labels: &[(&str, &str)]| crate::common::metric(&metrics, name, labels);
    for stage in [
        "reading",
        "chunking",
        "relational write",
        "embedding",
        "vector write",
        "read-back",
        "making current",
    ] {
        assert!(
            count(
                "cairn_projection_stage_seconds_count",
                &[("kind", "project"), ("stage", stage)]
            ) >= 1.0,
            "no `{stage}` stage in the metrics:\n{metrics}"
        );
    }
    assert!(
        count(
            "cairn_projection_stage_seconds_count",
            &[("kind", "tombstone"), ("stage", "vector exclude")]
        ) >= 1.0
    );
    assert_eq!(count("cairn_job_completions_total", &[]), 2.0, "{metrics}");
    assert_eq!(
        count("cairn_accepted_to_searchable_seconds_count", &[]),
        1.0
    );
    assert!(
        count("cairn_search_requests_total", &[]) >= 2.0,
        "{metrics}"
    );

    // A graceful stop, a restart on the same data: the same generation, the same receipts.
    let pid = server.id().expect("pid");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let status = tokio::time::timeout(Duration::from_secs(30), server.wait())
        .await
        .expect("stopped in time")
        .expect("exit status");
    assert!(status.success(), "{status:?}");
    let (_server, base) = start(data.path()).await;
    let again = revision(&http, &base, &token, &tombstone).await;
    assert_eq!(receipt_states(&again), receipt_states(&detail));
}

/// A Markdown document and an HTML page through the API: their chunks carry their heading
/// paths, search results (JSON and the CLI's table) say which section a hit comes from, and
/// the page is searched as its text, never its markup or scripts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markdown_and_html_results_name_their_section() {
    let data = tempfile::tempdir().expect("tempdir");
    let (mut server, base) = start(data.path()).await;
    let token = crate::common::admin_token(data.path());
    let http = reqwest::Client::new();
    let content = format!(
        "# Field guide\n\n{}\n\n## Birds of the marsh\n\n{}\n\n## Trees of the ridge\n\n{}\n",
        "This guide describes the valley and its seasons. ".repeat(30),
        "Herons wade through reeds and kingfishers dive for small fish. ".repeat(25),
        "Old oaks and pines grow along the windy ridge above the valley. ".repeat(25),
    );
    let body = json!({
            "dataset": "docs", "source_key": "guide.md", "content": content,
            "media_type": "text/markdown",
    });
    let id = crate::common::post_source(&http, &base, &token, &body).await;
    wait_for_job(&http, &base, &token, &id, "completed").await;
    let answer: Value = http
        .post(format!("{base}/v1/search"))
        .bearer_auth(&token)
        .json(&json!({ "query": "herons and kingfishers catching fish", "mode": "vector", "datasets": ["docs"], "group_by_source": false }))
        .send()
        .await
        .expect("search")
        .json()
        .await
        .expect("json");
    assert_eq!(
        answer["results"][0]["section"], "# Field guide > ## Birds of the marsh",
        "{answer}"
    );
    assert!(answer["results"][0]["page"].is_null());
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["search", "oaks and pines on the ridge", "--dataset", "docs"])
        .args(["--server", &base, "--data-dir"])
        .arg(data.path())
        .output()
        .expect("cairn search");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        table.contains("[# Field guide > ## Trees of the ridge]"),
        "{table}"
    );

    let page = format!(
        "<!doctype html><html><head><title>Tide tables</title><script>var secretscript = 1;</script>\
         </head><body><nav>Home | About</nav><h1>Harbour</h1><p>{}</p><h2>Spring tides</h2><p>{}</p>\
         <footer>footer text</footer></body></html>",
        "Boats leave the harbour at dawn when the water is deep enough. ".repeat(20),
        "Spring tides rise highest under the full and the new moon. ".repeat(20),
    );
    let body = json!({
            "dataset": "docs", "source_key": "tides.html", "content": page,
            "media_type": "text/html",
    });
    let id = crate::common::post_source(&http, &base, &token, &body).await;
    wait_for_job(&http, &base, &token, &id, "completed").await;
    let search = |query: &str, mode: &str| {
        let http = http.clone();
        let (base, token) = (base.clone(), token.clone());
        let body =
            json!({ "query": query, "mode": mode, "datasets": ["docs"], "group_by_source": false });
        async move {
            http.post(format!("{base}/v1/search"))
                .bearer_auth(&token)
                .json(&body)
                .send()
                .await
                .expect("search")
                .json::<Value>()
                .await
                .expect("json")
        }
    };
    let answer = search("high water at full moon", "vector").await;
    assert_eq!(answer["results"][0]["source_key"], "tides.html", "{answer}");
    assert_eq!(
        answer["results"][0]["section"], "# Harbour > ## Spring tides",
        "{answer}"
    );
    let text = answer["results"][0]["text"].as_str().expect("text");
    assert!(!text.contains('<'), "{text}");
    let lexical = search("secretscript", "lexical").await;
    assert_eq!(lexical["results"], json!([]), "{lexical}");
    let lexical = search("spring tides moon", "lexical").await;
    assert_eq!(
        lexical["results"][0]["source_key"], "tides.html",
        "{lexical}"
    );
    assert!(!lexical["results"][0]["text"]
        .as_str()
        .expect("text")
        .contains('<'));
    server.kill().await.expect("stop");
}
