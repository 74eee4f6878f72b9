//! `cairn serve` projects what it accepts: its in-process workers chunk, embed (the real
//! model), write qdrant-edge points and read them back; receipts turn verified, a deletion
//! turns them excluded, and a restart keeps everything.

use std::time::Duration;

use serde_json::{json, Value};

use crate::crash::start;

pub(crate) async fn revision(http: &reqwest::Client, base: &str, token: &str, id: &str) -> Value {
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

/// One search in one dataset, each hit on its own (not grouped by source), as JSON.
fn search_in(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    dataset: &str,
    query: &str,
    mode: &str,
) -> impl std::future::Future<Output = Value> {
    let request = http
        .post(format!("{base}/v1/search"))
        .bearer_auth(token)
        .json(
            &json!({ "query": query, "mode": mode, "datasets": [dataset],
            "group_by_source": false, "top_k": 5 }),
        );
    async move {
        request
            .send()
            .await
            .expect("search")
            .json::<Value>()
            .await
            .expect("json")
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
    let metrics = crate::common::scrape(&base, &token).await;
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
    let search = |query: &str, mode: &str| search_in(&http, &base, &token, "docs", query, mode);
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
    // The CLI's filter and facets: only the Markdown guide, and the counts of what matches.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["search", "the valley and the harbour", "--dataset", "docs"])
        .args([
            "--filter",
            r#"{"field": "media_type", "eq": "text/markdown"}"#,
        ])
        .args(["--facet", "media_type", "--server", &base, "--data-dir"])
        .arg(data.path())
        .output()
        .expect("cairn search");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{table}");
    assert!(
        table.contains("guide.md") && !table.contains("tides.html"),
        "{table}"
    );
    assert!(
        table.contains("media_type (1 source(s), 0 without a value)"),
        "{table}"
    );
    assert!(table.contains("       1  text/markdown"), "{table}");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["search", "valley", "--filter", "{not json"])
        .args(["--server", &base, "--data-dir"])
        .arg(data.path())
        .output()
        .expect("cairn search");
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("not JSON"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    server.kill().await.expect("stop");
}

/// A PDF and a DOCX (real files from pdf.js's and python-docx's test corpora) through the API:
/// they become verified and searchable as their text, with their page and section in the
/// results. A new revision of the PDF supersedes the old one in every search mode, and a
/// tombstone excludes it. Documents that cannot be read are refused at the door, typed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pdf_and_docx_become_searchable_with_their_page_and_section() {
    use base64::Engine as _;
    let fixture = |path: &str| {
        let bytes = std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("extract/tests/fixtures")
                .join(path),
        )
        .expect("fixture");
        base64::engine::general_purpose::STANDARD.encode(bytes)
    };
    let data = tempfile::tempdir().expect("tempdir");
    let (mut server, base) = start(data.path()).await;
    let token = crate::common::admin_token(data.path());
    let http = reqwest::Client::new();
    let search = |query: &str, mode: &str, dataset: &str| {
        search_in(&http, &base, &token, dataset, query, mode)
    };
    let post = |dataset: &str, key: &str, path: &str, media_type: &str| {
        json!({ "dataset": dataset, "source_key": key, "content_base64": fixture(path),
            "media_type": media_type })
    };

    // A five-page PDF: each hit names the page its chunk starts on.
    let pdf = post(
        "papers",
        "testing.pdf",
        "pdfjs/file_pdfjs_test.pdf",
        "application/pdf",
    );
    let first = crate::common::post_source(&http, &base, &token, &pdf).await;
    let detail = wait_for_job(&http, &base, &token, &first, "completed").await;
    assert!(
        receipt_states(&detail).contains(&("vector".to_owned(), "verified".to_owned())),
        "{detail}"
    );
    let answer = search(
        "Talos measures the load time of web pages from the Alexa top 500",
        "vector",
        "papers",
    )
    .await;
    let top = &answer["results"][0];
    assert_eq!(top["source_key"], "testing.pdf", "{answer}");
    assert_eq!(top["page"], 3, "{answer}");
    let pages: Vec<i64> = answer["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter_map(|hit| hit["page"].as_i64())
        .collect();
    assert!(pages.iter().all(|page| (1..=5).contains(page)), "{answer}");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "search",
            "Speedtests in several browsers",
            "--dataset",
            "papers",
        ])
        .args(["--server", &base, "--data-dir"])
        .arg(data.path())
        .output()
        .expect("cairn search");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.contains("p. 4"), "{table}");
    let lexical = search("xpcshell mozmill", "lexical", "papers").await;
    assert_eq!(
        lexical["results"][0]["source_key"], "testing.pdf",
        "{lexical}"
    );

    // A new revision supersedes it: nothing of the old text is found in any mode.
    let pdf = post(
        "papers",
        "testing.pdf",
        "pdfjs/issue1002.pdf",
        "application/pdf",
    );
    let second = crate::common::post_source(&http, &base, &token, &pdf).await;
    wait_for_job(&http, &base, &token, &second, "completed").await;
    for mode in ["lexical", "vector", "auto"] {
        let answer = search("Talos load time of web pages", mode, "papers").await;
        let hits = answer["results"].as_array();
        for hit in hits.unwrap_or_else(|| panic!("{mode}: {answer}")) {
            assert_eq!(
                hit["source_revision_id"],
                second.as_str(),
                "{mode}: {answer}"
            );
        }
    }
    let lexical = search("xpcshell", "lexical", "papers").await;
    assert_eq!(lexical["results"], json!([]), "{lexical}");
    let answer = search("acquiring knowledge and mastery", "vector", "papers").await;
    assert_eq!(
        answer["results"][0]["source_revision_id"],
        second.as_str(),
        "{answer}"
    );
    assert_eq!(answer["results"][0]["page"], 1, "{answer}");

    // A tombstone excludes it.
    let deleted = http
        .delete(format!(
            "{base}/v1/sources?dataset=papers&source_key=testing.pdf"
        ))
        .bearer_auth(&token)
        .send()
        .await
        .expect("delete");
    assert!(deleted.status().is_success(), "{}", deleted.status());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let vector = search("acquiring knowledge and mastery", "vector", "papers").await;
        let lexical = search("knowledge mastery", "lexical", "papers").await;
        if vector["results"] == json!([]) && lexical["results"] == json!([]) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{vector} {lexical}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A DOCX: its headings are sections, its tables are text.
    let docx_type = "application/vnd.openxmlformats-officedocument.wordprocessingml.document";
    let styled = post(
        "word",
        "styles.docx",
        "docx/par-known-styles.docx",
        docx_type,
    );
    let id = crate::common::post_source(&http, &base, &token, &styled).await;
    wait_for_job(&http, &base, &token, &id, "completed").await;
    let table = post(
        "word",
        "table.docx",
        "docx/tbl-having-applied-style.docx",
        docx_type,
    );
    let id = crate::common::post_source(&http, &base, &token, &table).await;
    wait_for_job(&http, &base, &token, &id, "completed").await;
    let answer = search("body text", "lexical", "word").await;
    assert_eq!(
        answer["results"][0]["source_key"], "styles.docx",
        "{answer}"
    );
    let answer = search("Body Text under heading one", "vector", "word").await;
    let hit = answer["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|hit| hit["source_key"] == "styles.docx")
        .cloned()
        .unwrap_or_default();
    assert_eq!(hit["section"], "# Heading 1", "{answer}");
    let answer = search("a hearty foo to you too sir", "lexical", "word").await;
    assert_eq!(answer["results"][0]["source_key"], "table.docx", "{answer}");
    assert!(answer["results"][0]["text"]
        .as_str()
        .expect("text")
        .contains("foo to you | and a hearty foo to you too sir!"));

    // What cannot be read is refused, typed, and nothing is kept.
    let refusal = |body: Value| {
        let http = http.clone();
        let (base, token) = (base.clone(), token.clone());
        async move {
            let response = http
                .post(format!("{base}/v1/sources"))
                .bearer_auth(&token)
                .json(&body)
                .send()
                .await
                .expect("post");
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.expect("json"))
        }
    };
    for (path, media_type, status, code) in [
        ("pdfjs/issue6010_1.pdf", "application/pdf", 422, "encrypted"),
        (
            "pdfjs/noembed-sjis.pdf",
            "application/pdf",
            422,
            "no_text_layer",
        ),
        (
            "pdfjs/REDHAT-1531897-0.pdf",
            "application/pdf",
            422,
            "unextractable",
        ),
        ("docx/test.docx", "application/pdf", 422, "format_mismatch"),
        ("pdfjs/issue1002.pdf", docx_type, 422, "format_mismatch"),
        ("pdfjs/issue1002.pdf", "text/plain", 422, "not_text"),
    ] {
        let (got, body) = refusal(post("refused", "x", path, media_type)).await;
        assert_eq!(
            (got, body["code"].as_str()),
            (status, Some(code)),
            "{path}: {body}"
        );
    }
    let source = http
        .get(format!("{base}/v1/sources?dataset=refused&source_key=x"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("get");
    assert_eq!(source.status().as_u16(), 404);
    server.kill().await.expect("stop");
}
