//! The API contract: `/openapi.json` is generated from the handlers, covers every operation
//! with its security and error answers, and schemathesis (PyPI, `scripts/setup-schemathesis`)
//! finds no failure when it runs against a real `cairn serve` with every check on but one
//! (see `CHECKS`), on every operation but the change feed's long poll.

use std::time::Duration;

use serde_json::Value;

use crate::common::app;

/// Every schemathesis check except `positive_data_acceptance`: that one asserts that every
/// schema-valid request succeeds, which no JSON Schema of this API can make true (base64
/// content must decode to UTF-8 text, content must carry no credential, a requeue needs a dead
/// job), so the document states the shapes and the server refuses the rest with typed 4xx
/// answers, which the other checks verify are documented.
const CHECKS: [&str; 4] = [
    "--checks",
    "all",
    "--exclude-checks",
    "positive_data_acceptance",
];

#[tokio::test]
async fn the_document_describes_every_operation_with_security_and_errors() {
    let app = app().await;
    let (status, document) = app.call("GET", "/openapi.json", None, None).await;
    assert_eq!(status, 200);
    assert_eq!(document["openapi"], "3.1.0");
    assert_eq!(
        document["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    let paths = document["paths"].as_object().expect("paths");
    for path in [
        "/v1/sources",
        "/v1/sources/batch",
        "/v1/revisions/{id}",
        "/v1/search",
        "/v1/tokens",
        "/v1/ops/jobs/{id}",
        "/metrics",
    ] {
        assert!(paths.contains_key(path), "{path} is not documented");
    }
    let open = ["/healthz", "/ops"];
    for (path, item) in paths {
        for (method, operation) in item.as_object().expect("operations") {
            let responses = operation["responses"].as_object().expect("responses");
            if open.contains(&path.as_str()) {
                continue;
            }
            assert!(
                operation["security"].is_array(),
                "{method} {path} has no security"
            );
            for status in ["401", "403", "422", "500", "503"] {
                assert!(
                    responses.contains_key(status),
                    "{method} {path} does not document {status}"
                );
            }
        }
    }
    // Every request body is described by a schema.
    let schemas = document["components"]["schemas"]
        .as_object()
        .expect("schemas");
    for name in [
        "SourceRequest",
        "SearchBody",
        "CreateBody",
        "Acceptance",
        "Error",
    ] {
        assert!(schemas.contains_key(name), "{name} is missing");
    }
    // The rendered reference is served beside it.
    let (status, page) = app.call("GET", "/docs", None, None).await;
    assert_eq!(status, 200);
    assert!(page
        .as_str()
        .is_some_and(|html| html.contains("/openapi.json")));
}

fn schemathesis() -> std::path::PathBuf {
    std::env::var_os("CAIRN_SCHEMATHESIS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-schemathesis/bin/st")
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_failure_against_the_real_server() {
    let st = schemathesis();
    assert!(
        st.exists(),
        "{} is missing: run scripts/setup-schemathesis",
        st.display()
    );
    let directory = tempfile::tempdir().expect("tempdir");
    let (mut child, base) = crate::crash::start(directory.path()).await;
    let token = std::fs::read_to_string(directory.path().join("admin.token"))
        .expect("admin token")
        .trim()
        .to_owned();
    let reports = tempfile::tempdir().expect("tempdir");
    let output = tokio::time::timeout(
        Duration::from_secs(600),
        tokio::process::Command::new(&st)
            .arg("run")
            .arg(format!("{base}/openapi.json"))
            .args(CHECKS)
            .args(["--seed", "1", "--max-examples", "100", "--no-color"])
            .args(["--request-timeout", "30"])
            // The change feed long-polls by design (up to 30 s per call when nothing
            // happens), which the response-time check and 100 examples cannot take; its
            // parameters and refusals are tested in `changes::the_feed_refuses_what_it_must`.
            .args(["--exclude-path", "/v1/changes"])
            .arg("--header")
            .arg(format!("Authorization: Bearer {token}"))
            .current_dir(reports.path())
            .env("SCHEMATHESIS_HOOKS", "")
            .output(),
    )
    .await
    .expect("schemathesis finished within 10 minutes")
    .expect("run schemathesis");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "schemathesis failed:\n{report}");
    assert!(report.contains(" passed"), "{report}");
    // The server is still healthy after the run.
    let health: Value = reqwest::get(format!("{base}/healthz"))
        .await
        .expect("healthz")
        .json()
        .await
        .expect("json");
    assert_eq!(health["status"], "ok");
    let _ = child.start_kill();
    let _ = child.wait().await;
}
