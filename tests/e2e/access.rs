//! Who may read which document, through the API on both ledgers: tokens that read as an
//! identity see, search, list and count only what names them (or their groups) as readers;
//! everything else is answered as absent, on every read endpoint; an access change holds at
//! the next request, and a refused one changes nothing.

use receipts::Scope;
use serde_json::json;

use crate::common::{app_on, assert_error, Engine, TestApp};

async fn token(app: &TestApp, name: &str, principal: &str, groups: &[&str]) -> String {
    let (status, created) = app
        .call(
            "POST",
            "/v1/tokens",
            Some(&app.admin),
            Some(json!({"name": name, "scopes": ["search", "ingest"],
                        "principal": principal, "groups": groups})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["token"]["identity"]["principal"], principal);
    created["secret"].as_str().expect("secret").to_owned()
}

async fn found(app: &TestApp, token: &str, query: &str) -> Vec<String> {
    let (status, answer) = app
        .call(
            "POST",
            "/v1/search",
            Some(token),
            Some(
                json!({"query": query, "mode": "lexical", "datasets": ["docs"],
                        "facets": ["tags"]}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let mut keys = crate::common::hit_keys(&answer);
    keys.dedup();
    assert_eq!(
        answer["facets"][0]["sources"].as_u64(),
        Some(visible_count(app, token).await),
        "facets count what the token may read: {answer}"
    );
    keys
}

/// How many of the dataset's sources a token's listing shows.
async fn visible_count(app: &TestApp, token: &str) -> u64 {
    let (status, page) = app
        .call("GET", "/v1/datasets/docs/sources", Some(token), None)
        .await;
    assert_eq!(status, 200, "{page}");
    page["sources"].as_array().expect("sources").len() as u64
}

/// Every read of one source or revision, as `token`: its status codes.
async fn reads(app: &TestApp, token: &str, key: &str, revision: &str) -> Vec<u16> {
    let mut codes = Vec::new();
    for uri in [
        format!("/v1/sources?dataset=docs&source_key={key}"),
        format!("/v1/sources/timeline?dataset=docs&source_key={key}"),
        format!("/v1/sources/access?dataset=docs&source_key={key}"),
        format!("/v1/revisions/{revision}"),
        format!("/v1/revisions/{revision}/content"),
    ] {
        let (status, body) = app.call("GET", &uri, Some(token), None).await;
        if status == 404 {
            assert!(
                !body.to_string().contains("salaries"),
                "a 404 must not carry the document: {body}"
            );
        }
        codes.push(status.as_u16());
    }
    codes
}

async fn access_end_to_end(engine: Engine) {
    let app = app_on(engine, &[]).await;
    let alice = token(&app, "alice", "user:alice", &["hr"]).await;
    let bob = token(&app, "bob", "user:bob", &["eng"]).await;
    let plain = app
        .token("plain", &[Scope::Search, Scope::Ingest], None)
        .await;

    let (status, pay) = app
        .put(
            &app.admin,
            json!({"dataset": "docs", "source_key": "hr/pay.md", "content": "salaries lantern",
                   "tags": ["hr"], "access": {"readers": ["group:hr"]}}),
        )
        .await;
    assert_eq!(status, 202, "{pay}");
    let pay_revision = pay["source_revision_id"]
        .as_str()
        .expect("revision")
        .to_owned();
    let (status, home) = app
        .put(
            &app.admin,
            json!({"dataset": "docs", "source_key": "wiki/home.md",
                   "content": "welcome lantern", "tags": ["wiki"]}),
        )
        .await;
    assert_eq!(status, 202, "{home}");

    // A malformed reader is refused, and the put writes nothing.
    let refused = app
        .put(
            &app.admin,
            json!({"dataset": "docs", "source_key": "x.md", "content": "lantern",
                   "access": {"readers": ["alice"]}}),
        )
        .await;
    assert_error(&refused, 422, "invalid_access");
    assert_eq!(visible_count(&app, &plain).await, 2);

    // Ops views for a token that reads as an identity: the jobs of what it may read only; a
    // job of another's document is absent, as the document is.
    let (status, created) = app
        .call(
            "POST",
            "/v1/tokens",
            Some(&app.admin),
            Some(
                json!({"name": "bob-ops", "scopes": ["ops:read"], "principal": "user:bob",
                        "groups": ["eng"]}),
            ),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let bob_ops = created["secret"].as_str().expect("secret").to_owned();
    let (status, jobs) = app.call("GET", "/v1/ops/jobs", Some(&bob_ops), None).await;
    assert_eq!(status, 200, "{jobs}");
    let keys: Vec<&str> = jobs["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|job| job["source_key"].as_str())
        .collect();
    assert!(
        keys.contains(&"wiki/home.md") && !keys.contains(&"hr/pay.md"),
        "{jobs}"
    );
    assert_eq!(jobs["total"].as_u64(), Some(keys.len() as u64), "{jobs}");
    let pay_job = pay["projection_job_id"].as_str().expect("job");
    let (status, _) = app
        .call(
            "GET",
            &format!("/v1/ops/jobs/{pay_job}"),
            Some(&bob_ops),
            None,
        )
        .await;
    assert_eq!(status, 404);
    let (status, _) = app
        .call(
            "GET",
            &format!("/v1/ops/jobs/{pay_job}"),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(status, 200);

    assert_eq!(
        found(&app, &alice, "lantern").await,
        found_sorted(&["hr/pay.md", "wiki/home.md"])
    );
    assert_eq!(
        found(&app, &bob, "lantern").await,
        found_sorted(&["wiki/home.md"])
    );
    assert_eq!(found(&app, &bob, "salaries").await, Vec::<String>::new());
    assert_eq!(
        reads(&app, &alice, "hr/pay.md", &pay_revision).await,
        [200; 5]
    );
    assert_eq!(
        reads(&app, &bob, "hr/pay.md", &pay_revision).await,
        [404; 5]
    );
    assert_eq!(
        reads(&app, &plain, "hr/pay.md", &pay_revision).await,
        [200; 5]
    );
    // Changing readers of what it cannot see: absent too, and nothing changes.
    let hidden = app
        .call(
            "PUT",
            "/v1/sources/access",
            Some(&bob),
            Some(json!({"dataset": "docs", "source_key": "hr/pay.md", "readers": ["user:bob"]})),
        )
        .await;
    assert_error(&hidden, 404, "source_not_found");

    // alice hands it to engineering: at the next request, bob reads it and alice does not.
    let (status, record) = app
        .call(
            "PUT",
            "/v1/sources/access",
            Some(&alice),
            Some(json!({"dataset": "docs", "source_key": "hr/pay.md",
                        "readers": ["group:eng"], "reason": "moved to eng"})),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["readers"], json!(["group:eng"]));
    assert_eq!(record["version"], 2);
    assert_eq!(
        found(&app, &bob, "salaries").await,
        found_sorted(&["hr/pay.md"])
    );
    assert_eq!(found(&app, &alice, "salaries").await, Vec::<String>::new());
    assert_eq!(
        reads(&app, &alice, "hr/pay.md", &pay_revision).await,
        [404; 5]
    );
    let history = app
        .ledger
        .history("access", "docs/hr/pay.md")
        .await
        .expect("history");
    assert_eq!(history.len(), 2, "{history:?}");
    assert_eq!(history[1].actor, "token:alice");
    assert_eq!(history[1].cause, "moved to eng");

    // A closed dataset: what names no readers is read by nobody but whole-dataset tokens.
    let bad_default = app
        .call(
            "PUT",
            "/v1/datasets/docs/access",
            Some(&app.admin),
            Some(json!({"default": "some"})),
        )
        .await;
    assert_eq!(bad_default.0.as_u16(), 422, "{}", bad_default.1);
    let forbidden = app
        .call(
            "PUT",
            "/v1/datasets/docs/access",
            Some(&bob),
            Some(json!({"default": "nobody"})),
        )
        .await;
    assert_error(&forbidden, 403, "forbidden");
    let (status, _) = app
        .call(
            "PUT",
            "/v1/datasets/docs/access",
            Some(&app.admin),
            Some(json!({"default": "nobody", "reason": "closed"})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        found(&app, &bob, "lantern").await,
        found_sorted(&["hr/pay.md"])
    );
    assert_eq!(found(&app, &alice, "lantern").await, Vec::<String>::new());
    assert_eq!(visible_count(&app, &plain).await, 2);
}

fn found_sorted(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|key| (*key).to_owned()).collect()
}

#[tokio::test]
async fn documents_are_read_only_by_their_readers_on_sqlite() {
    access_end_to_end(Engine::Sqlite).await;
}

#[tokio::test]
async fn documents_are_read_only_by_their_readers_on_postgres() {
    access_end_to_end(Engine::Postgres).await;
}

/// `datasets.<d>.default_access` in the configuration is recorded at `cairn serve`'s start,
/// through the ledger's one path (history names `config`), and an open dataset stays open.
#[tokio::test]
async fn the_configuration_names_a_datasets_default_access() {
    let directory = tempfile::tempdir().expect("tempdir");
    let config = directory.path().join("cairn.toml");
    std::fs::write(
        &config,
        "[workers]\ncount = 0\n[datasets.hr]\ndefault_access = \"nobody\"\n",
    )
    .expect("config");
    let data = directory.path().join("data");
    let config_arg = config.to_str().expect("a UTF-8 path");
    let (mut child, base) = crate::crash::spawn_serve_with(
        &data,
        &["--config", config_arg],
        &[],
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let admin = crate::common::admin_token(&data);
    let client = reqwest::Client::new();
    let access = |dataset: &str| {
        client
            .get(format!(
                "{base}/v1/sources/access?dataset={dataset}&source_key=any.md"
            ))
            .bearer_auth(&admin)
            .send()
    };
    let hr = access("hr").await.expect("GET");
    assert_eq!(hr.status().as_u16(), 200);
    let hr: serde_json::Value = hr.json().await.expect("json");
    assert_eq!(hr["default"], "nobody", "{hr}");
    let wiki = access("wiki").await.expect("GET");
    assert_eq!(wiki.status().as_u16(), 200);
    let wiki: serde_json::Value = wiki.json().await.expect("json");
    assert_eq!(wiki["default"], "everyone", "{wiki}");
    child.kill().await.expect("stop");
    let _ = child.wait().await;
    let ledger = receipts::SqliteLedger::open(
        receipts::SqliteOptions::new(data.join("ledger.db")),
        std::sync::Arc::new(receipts::SystemClock),
    )
    .await
    .expect("open the ledger");
    let trail = receipts::Reader::history(&ledger, "access", "hr")
        .await
        .expect("history");
    assert!(
        trail
            .iter()
            .any(|entry| entry.actor == "config" && entry.to.as_deref() == Some("nobody")),
        "{trail:?}"
    );
}
