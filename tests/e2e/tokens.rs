//! The token lifecycle: create with an expiry, list without secrets, revoke with immediate
//! effect, rotate, all recorded in history with actor and reason; through the admin API and
//! through `cairn token` on the data directory.

use receipts::Scope;
use serde_json::{json, Value};

use crate::common::{app, assert_error};

#[tokio::test]
async fn tokens_are_listed_revoked_at_once_rotated_and_expire() {
    let app = app().await;
    let admin = app.admin.clone();
    let reader = app.token("reader", &[Scope::OpsRead], None).await;
    // Admin only.
    assert_error(
        &app.call("GET", "/v1/tokens", Some(&reader), None).await,
        403,
        "forbidden",
    );

    let (status, created) = app
        .call(
            "POST",
            "/v1/tokens",
            Some(&admin),
            Some(json!({"name": "ci", "scopes": ["search"], "datasets": ["docs"], "expires_in_seconds": 3600})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let secret = created["secret"].as_str().expect("secret").to_owned();
    let id = created["token"]["id"].as_str().expect("id").to_owned();
    assert_eq!(created["token"]["state"], "active");
    assert!(created["token"]["expires_at"].as_i64().is_some());
    let search = json!({"query": "anything", "mode": "lexical"});
    let (status, _) = app
        .call("POST", "/v1/search", Some(&secret), Some(search.clone()))
        .await;
    assert_eq!(status, 200);

    // Listed, never with a secret.
    let (status, listed) = app.call("GET", "/v1/tokens", Some(&admin), None).await;
    assert_eq!(status, 200);
    let text = listed.to_string();
    assert!(!text.contains(&secret) && !text.contains("sha256") && !text.contains("secret"));
    let names: Vec<&str> = listed["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(|token| token["name"].as_str())
        .collect();
    assert_eq!(names, ["ci", "reader", "admin"], "newest first");

    // Rotation: same name, scopes and datasets; the old secret stops, the new one works.
    let (status, rotated) = app
        .call(
            "POST",
            &format!("/v1/tokens/{id}/rotate"),
            Some(&admin),
            Some(json!({"reason": "quarterly rotation"})),
        )
        .await;
    assert_eq!(status, 201, "{rotated}");
    let new_secret = rotated["secret"].as_str().expect("secret").to_owned();
    let new_id = rotated["token"]["id"].as_str().expect("id").to_owned();
    assert_eq!(rotated["token"]["name"], "ci");
    assert_eq!(rotated["token"]["datasets"], json!(["docs"]));
    assert!(rotated["token"]["expires_at"].as_i64().is_some());
    assert_error(
        &app.call("POST", "/v1/search", Some(&secret), Some(search.clone()))
            .await,
        401,
        "unauthenticated",
    );
    let (status, _) = app
        .call(
            "POST",
            "/v1/search",
            Some(&new_secret),
            Some(search.clone()),
        )
        .await;
    assert_eq!(status, 200);

    // Revocation takes effect at the very next request (no cache keeps it alive).
    let (status, revoked) = app
        .call(
            "POST",
            &format!("/v1/tokens/{new_id}/revoke"),
            Some(&admin),
            Some(json!({"reason": "leaked in a log"})),
        )
        .await;
    assert_eq!(status, 200, "{revoked}");
    assert_eq!(revoked["token"]["state"], "revoked");
    assert!(revoked.get("secret").is_none());
    assert_error(
        &app.call(
            "POST",
            "/v1/search",
            Some(&new_secret),
            Some(search.clone()),
        )
        .await,
        401,
        "unauthenticated",
    );
    assert_error(
        &app.call(
            "POST",
            &format!("/v1/tokens/{new_id}/revoke"),
            Some(&admin),
            None,
        )
        .await,
        409,
        "token_revoked",
    );
    assert_error(
        &app.call(
            "POST",
            "/v1/tokens/0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b/revoke",
            Some(&admin),
            None,
        )
        .await,
        404,
        "token_not_found",
    );

    // History: who and why, for every step.
    let history = |id: String| {
        let ledger = app.ledger.clone();
        async move { ledger.history("token", &id).await.expect("history") }
    };
    let old = history(id.clone()).await;
    assert_eq!(old.len(), 2, "{old:?}");
    assert_eq!(old[0].actor, "token:admin");
    assert_eq!(old[1].event, "rotated");
    assert_eq!(old[1].to.as_deref(), Some(new_id.as_str()));
    assert_eq!(old[1].cause, "quarterly rotation");
    let new = history(new_id.clone()).await;
    assert_eq!(new[1].event, "revoked");
    assert_eq!(new[1].actor, "token:admin");
    assert_eq!(new[1].cause, "leaked in a log");

    // Expiry: a token past its expiry does not authenticate and is listed as expired.
    let (_, short) = app
        .call(
            "POST",
            "/v1/tokens",
            Some(&admin),
            Some(json!({"name": "short", "scopes": ["search"], "expires_in_seconds": 1})),
        )
        .await;
    let short_secret = short["secret"].as_str().expect("secret").to_owned();
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    assert_error(
        &app.call("POST", "/v1/search", Some(&short_secret), Some(search))
            .await,
        401,
        "unauthenticated",
    );
    let (_, listed) = app.call("GET", "/v1/tokens", Some(&admin), None).await;
    assert_eq!(listed["tokens"][0]["state"], "expired", "{listed}");

    // Bad input is typed and changes nothing.
    for (body, code) in [
        (json!({"name": "x", "scopes": ["root"]}), "invalid_scopes"),
        (
            json!({"name": "", "scopes": ["search"]}),
            "invalid_token_name",
        ),
        (
            json!({"name": "x", "scopes": ["search"], "expires_in_seconds": 0}),
            "invalid_expiry",
        ),
        (
            json!({"name": "x", "scopes": ["search"], "owner": "me"}),
            "invalid_json",
        ),
    ] {
        assert_error(
            &app.call("POST", "/v1/tokens", Some(&admin), Some(body))
                .await,
            422,
            code,
        );
    }
    assert_error(
        &app.call("POST", "/v1/tokens/not-a-uuid/revoke", Some(&admin), None)
            .await,
        422,
        "invalid_token_id",
    );
}

fn cairn(args: &[&str]) -> (bool, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .env("CAIRN_LOG", "warn")
        .output()
        .expect("cairn");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_token_cli_creates_lists_rotates_and_revokes() {
    let directory = tempfile::tempdir().expect("tempdir");
    let data = directory.path().to_string_lossy().into_owned();
    let (ok, secret, stderr) = cairn(&[
        "token",
        "create",
        "--name",
        "robot",
        "--scope",
        "ingest",
        "--dataset",
        "docs",
        "--expires-in",
        "90d",
        "--data-dir",
        &data,
    ]);
    assert!(ok, "{stderr}");
    let secret = secret.trim().to_owned();
    assert!(secret.starts_with("cairn_"), "{secret}");

    let list = |json: bool| {
        let mut args = vec!["token", "list", "--data-dir", data.as_str()];
        if json {
            args.push("--json");
        }
        let (ok, stdout, stderr) = cairn(&args);
        assert!(ok, "{stderr}");
        stdout
    };
    let table = list(false);
    assert!(
        table.contains("robot") && table.contains("active"),
        "{table}"
    );
    assert!(!table.contains(&secret));
    let tokens: Value = serde_json::from_str(&list(true)).expect("json");
    let id = tokens[0]["id"].as_str().expect("id").to_owned();

    let (ok, rotated, stderr) = cairn(&[
        "token",
        "rotate",
        &id,
        "--reason",
        "moved to vault",
        "--data-dir",
        &data,
    ]);
    assert!(ok, "{stderr}");
    let rotated = rotated.trim().to_owned();
    assert!(rotated.starts_with("cairn_") && rotated != secret);
    let tokens: Value = serde_json::from_str(&list(true)).expect("json");
    assert_eq!(tokens[1]["state"], "revoked", "{tokens}");
    let new_id = tokens[0]["id"].as_str().expect("id").to_owned();
    assert_eq!(tokens[1]["replaced_by"], new_id.as_str());

    let (ok, _, stderr) = cairn(&["token", "revoke", &new_id, "--data-dir", &data]);
    assert!(ok, "{stderr}");
    let tokens: Value = serde_json::from_str(&list(true)).expect("json");
    assert_eq!(tokens[0]["state"], "revoked");
    assert!(tokens[0]["revoked_by"]
        .as_str()
        .is_some_and(|actor| actor.starts_with("cli:")));
    // A second revocation is refused with a clear message.
    let (ok, _, stderr) = cairn(&["token", "revoke", &new_id, "--data-dir", &data]);
    assert!(!ok);
    assert!(stderr.contains("already revoked"), "{stderr}");
}
