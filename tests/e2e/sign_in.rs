//! `cairn serve` as an OAuth resource server, configured from its file, against the
//! fault-injecting issuer (`faulty_issuer::FaultyIssuer`, a fake named as one; the whole host
//! flow against a real authorization server is still to be built): `/mcp` and `/v1/*`
//! challenge a request without a token with their metadata, an issuer's token searches as its
//! subject and groups and finds only what they may read, a token for another audience is
//! refused, cairn's own tokens keep working beside them, and `cairn auth check` says what it
//! makes of a token.

#[path = "../../oauth/tests/common/mod.rs"]
mod faulty_issuer;

use faulty_issuer::{FaultyIssuer, SigningKey};
use serde_json::{json, Value};

const RESOURCE: &str = "https://cairn.test";

#[tokio::test]
async fn an_issuers_token_searches_as_its_groups_and_a_request_without_one_is_challenged() {
    let key = SigningKey::ed25519("k1");
    let issuer = FaultyIssuer::start(&[&key]).await;
    let directory = tempfile::tempdir().expect("tempdir");
    let config = directory.path().join("cairn.toml");
    std::fs::write(
        &config,
        format!(
            "[workers]\ncount = 0\n[oauth]\nresource = \"{RESOURCE}\"\n[[oauth.issuers]]\n\
             issuer = \"{}\"\ngroups_claim = \"groups\"\n\
             scopes = {{ \"cairn.search\" = [\"search\"] }}\n",
            issuer.url
        ),
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
    let http = reqwest::Client::new();

    // Two documents: one for group:hr, one for group:finance.
    for (key, readers) in [
        ("hr/pay.md", "group:hr"),
        ("finance/q3.md", "group:finance"),
    ] {
        let response = http
            .post(format!("{base}/v1/sources"))
            .bearer_auth(&admin)
            .json(&json!({"dataset": "docs", "source_key": key,
                          "content": format!("lantern notes for {key}"),
                          "access": {"readers": [readers]}}))
            .send()
            .await
            .expect("put");
        assert_eq!(response.status().as_u16(), 202, "{key}");
    }

    // No token: each endpoint challenges with its own metadata.
    let response = http.post(format!("{base}/mcp")).send().await.expect("mcp");
    assert_eq!(response.status().as_u16(), 401);
    let challenge = response
        .headers()
        .get("www-authenticate")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        challenge,
        format!("Bearer resource_metadata=\"{RESOURCE}/.well-known/oauth-protected-resource/mcp\"")
    );
    let response = http
        .post(format!("{base}/v1/search"))
        .json(&json!({"query": "lantern"}))
        .send()
        .await
        .expect("search");
    assert_eq!(response.status().as_u16(), 401);
    let metadata: Value = http
        .get(format!("{base}/.well-known/oauth-protected-resource/mcp"))
        .send()
        .await
        .expect("metadata")
        .json()
        .await
        .expect("json");
    assert_eq!(metadata["resource"], format!("{RESOURCE}/mcp"));
    assert_eq!(metadata["authorization_servers"], json!([issuer.url]));

    // alice's token (groups eng and hr, minted for the MCP endpoint) finds the hr document
    // only.
    let mut claims = issuer.claims("alice", 300);
    claims["aud"] = json!(format!("{RESOURCE}/mcp"));
    let token = key.mint(&claims);
    let search = |token: String| {
        http.post(format!("{base}/v1/search"))
            .bearer_auth(token)
            .json(&json!({"query": "lantern", "mode": "lexical", "datasets": ["docs"]}))
            .send()
    };
    let response = search(token.clone()).await.expect("search");
    assert_eq!(response.status().as_u16(), 200);
    let answer: Value = response.json().await.expect("json");
    let keys: Vec<&str> = answer["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter_map(|hit| hit["source_key"].as_str())
        .collect();
    assert_eq!(keys, vec!["hr/pay.md"], "{answer}");

    // A token for another audience is refused, naming why.
    let mut claims = issuer.claims("alice", 300);
    claims["aud"] = json!("https://elsewhere.test");
    let response = search(key.mint(&claims)).await.expect("search");
    assert_eq!(response.status().as_u16(), 401);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["details"]["reason"], "audience", "{body}");

    // The admin's cairn token still works, and reads everything.
    let response = search(admin.clone()).await.expect("search");
    assert_eq!(response.status().as_u16(), 200);
    let answer: Value = response.json().await.expect("json");
    assert_eq!(
        answer["results"].as_array().map(Vec::len),
        Some(2),
        "{answer}"
    );

    // The guard counts what it decided, by outcome.
    let metrics = http
        .get(format!("{base}/metrics"))
        .bearer_auth(&admin)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("cairn_oauth_tokens_total{outcome=\"accepted\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cairn_oauth_tokens_total{outcome=\"audience\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cairn_oauth_key_fetches_total{outcome=\"ok\"} 1"),
        "{metrics}"
    );

    // `cairn auth check` says the same from the configuration file.
    // (Run without blocking: the issuer answers from this test's runtime.)
    let check = |token: String| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["auth", "check", &token, "--config", config_arg])
            .env("CAIRN_LOG", "error")
            .output()
    };
    let output = check(token).await.expect("cairn auth check");
    assert_eq!(output.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(report["principal"], "user:alice", "{report}");
    assert_eq!(
        report["groups"],
        json!(["group:eng", "group:hr"]),
        "{report}"
    );
    assert_eq!(report["scopes"], json!(["search"]), "{report}");
    let mut claims = issuer.claims("alice", -3600);
    claims["aud"] = json!(RESOURCE);
    let output = check(key.mint(&claims)).await.expect("cairn auth check");
    assert_eq!(output.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(report["reason"], "expired", "{report}");

    child.kill().await.expect("stop");
    let _ = child.wait().await;
}
