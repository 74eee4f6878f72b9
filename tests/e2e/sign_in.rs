//! `cairn serve` as an OAuth resource server, configured from its file.
//!
//! - Against a real authorization server (Debian's glewlwyd, `scripts/setup-oauth`), the whole
//!   host flow of the official MCP SDK's OAuth client: challenge, metadata, dynamic
//!   registration, authorization code with PKCE, then a search bounded by the user's groups;
//!   a missing scope, a key rotation and the server down.
//! - Against the fault-injecting issuer (`faulty_issuer::FaultyIssuer`, a fake named as one,
//!   for what a real server will not do on demand): `/mcp` and `/v1/*` challenge a request
//!   without a token with their metadata, an issuer's token searches as its subject and groups
//!   and finds only what they may read, a token for another audience is refused, cairn's own
//!   tokens keep working beside them, and `cairn auth check` says what it makes of a token.

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
             scopes = {{ \"cairn.search\" = [\"search\"], \"cairn.ops\" = [\"ops:read\"] }}\n",
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
        crate::common::post_source(
            &http,
            &base,
            &admin,
            &json!({"dataset": "docs", "source_key": key,
                    "content": format!("lantern notes for {key}"),
                    "access": {"readers": [readers]}}),
        )
        .await;
    }

    // No token: each endpoint challenges with its own metadata.
    let response = http.post(format!("{base}/mcp")).send().await.expect("mcp");
    assert_eq!(response.status().as_u16(), 401);
    let challenge = challenge_of(&response);
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
    assert_eq!(crate::common::hit_keys(&answer), ["hr/pay.md"], "{answer}");

    // A token for another audience is refused, naming why.
    let mut claims = issuer.claims("alice", 300);
    claims["aud"] = json!("https://elsewhere.test");
    let response = search(key.mint(&claims)).await.expect("search");
    assert_eq!(response.status().as_u16(), 401);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["details"]["reason"], "audience", "{body}");

    // The dashboard signs in with an issuer's token as with a cairn token: its calls carry
    // the bearer token, and the guard reads it before the ops API's scope check.
    let mut claims = issuer.claims("alice", 300);
    claims["scope"] = json!("cairn.ops");
    claims["aud"] = json!(RESOURCE);
    let ops_token = key.mint(&claims);
    for path in ["/v1/ops/summary", "/v1/ops/leases?limit=200"] {
        let response = http
            .get(format!("{base}{path}"))
            .bearer_auth(&ops_token)
            .send()
            .await
            .expect("ops");
        assert_eq!(response.status().as_u16(), 200, "{path}");
    }
    let response = http
        .get(format!("{base}/v1/ops/summary"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("ops");
    assert_eq!(response.status().as_u16(), 403, "search only");

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
    let metrics = crate::common::scrape(&base, &admin).await;
    assert!(
        metrics.contains("cairn_oauth_tokens_total{outcome=\"accepted\"} 4"),
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

/// The `WWW-Authenticate` challenge of an answer (empty when it has none).
fn challenge_of(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("www-authenticate")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Runs one of the Python scripts under tests/oauth with the MCP venv's interpreter, with
/// `config` as its JSON argument, and returns what it printed last (its JSON answer).
async fn python(script: &str, directory: &std::path::Path, config: &Value) -> Value {
    let path = directory.join(format!("{script}.json"));
    std::fs::write(&path, config.to_string()).expect("config");
    let output = tokio::process::Command::new(crate::mcp::python())
        .arg(format!(
            "{}/tests/oauth/{script}.py",
            env!("CARGO_MANIFEST_DIR")
        ))
        .args(match script {
            "glewlwyd" => vec![config["command"].as_str().expect("command")],
            _ => vec![],
        })
        .arg(&path)
        .output()
        .await
        .expect("run python (scripts/setup-mcp)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{script}.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or(Value::String(last.to_owned()))
}

/// The whole host flow against a real authorization server (glewlwyd, `scripts/setup-oauth`),
/// driven by the official MCP SDK's OAuth client (tests/oauth/host.py): the 401 challenge,
/// cairn's protected resource metadata, the server's metadata, dynamic registration,
/// authorization code with PKCE and the resource indicator, then `search`, which finds only
/// what the signed-in user and her groups may read. Then, with the server's token: a call that
/// needs a scope the token lacks gets 403 `insufficient_scope`; the server rotates its signing
/// key and a token signed with the new key is accepted after exactly one JWKS refetch; with
/// the server down, the cached key keeps working; and with introspection on, a token the
/// server revoked is refused.
#[tokio::test]
async fn an_mcp_host_signs_in_through_a_real_authorization_server() {
    let mut server = testkit::oauth_server::AuthorizationServer::start()
        .expect("glewlwyd (scripts/setup-oauth)");
    let directory = tempfile::tempdir().expect("tempdir");
    let [port] = testkit::ports::free_ports().expect("port");
    let resource = format!("http://127.0.0.1:{port}");
    let issuer = format!("{}/api/oidc", server.url());
    let (key, cert) = server.new_key("first").expect("key");
    let provision = |command: &str, key: &std::path::Path, cert: &std::path::Path| {
        json!({"command": command, "base": server.url(), "issuer": issuer, "resource": resource,
               "key": key, "cert": cert,
               "users": [{"name": "alice", "password": "alice-at-the-door",
                          "scopes": ["openid", "cairn.search"], "groups": ["eng", "staff"]}]})
    };
    let answer = python(
        "glewlwyd",
        directory.path(),
        &provision("provision", &key, &cert),
    )
    .await;
    assert_eq!(answer, "ok");

    let config = directory.path().join("cairn.toml");
    std::fs::write(
        &config,
        format!(
            "[oauth]\nresource = \"{resource}\"\n[[oauth.issuers]]\nissuer = \"{issuer}\"\n\
             principal_claim = \"preferred_username\"\ngroups_claim = \"groups\"\n\
             refetch_interval_seconds = 1\n\
             scopes = {{ \"cairn.search\" = [\"search\"], \"cairn.ingest\" = [\"ingest\"] }}\n"
        ),
    )
    .expect("config");
    let data = directory.path().join("data");
    let bind = format!("127.0.0.1:{port}");
    let config_arg = config.to_str().expect("a UTF-8 path");
    let (mut child, base) = crate::crash::spawn_serve_with(
        &data,
        &["--bind", &bind, "--config", config_arg],
        &[],
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    assert_eq!(base, resource);
    let admin = crate::common::admin_token(&data);
    let http = reqwest::Client::new();

    // Four documents: alice's own, her group's, another group's, and one for the admin only.
    let documents = [
        ("alice/notes.md", "user:alice"),
        ("eng/design.md", "group:eng"),
        ("hr/pay.md", "group:hr"),
        ("ops/keys.md", "user:root"),
    ];
    for (key, reader) in documents {
        crate::common::post_source(
            &http,
            &base,
            &admin,
            &json!({"dataset": "default", "source_key": key,
                    "content": format!("the lighthouse keeper's notes, filed under {key}"),
                    "access": {"readers": [reader]}}),
        )
        .await;
    }
    // Projected everywhere before the host searches.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let answer: Value = http
            .post(format!("{base}/v1/search"))
            .bearer_auth(&admin)
            .json(&json!({"query": "lighthouse keeper", "mode": "vector", "top_k": 10}))
            .send()
            .await
            .expect("search")
            .json()
            .await
            .expect("json");
        if answer["results"].as_array().map(Vec::len) == Some(documents.len()) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not projected: {answer}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    let host_config = json!({"mcp_url": format!("{base}/mcp"), "base": server.url(),
                             "user": "alice", "password": "alice-at-the-door",
                             "consent": ["openid", "cairn.search"],
                             "extra_grant_types": ["client_credentials"],
                             "query": "lighthouse keeper notes"});
    let signed_in = python("host", directory.path(), &host_config).await;
    assert_eq!(
        signed_in["keys"],
        json!(["alice/notes.md", "eng/design.md"]),
        "{signed_in}"
    );
    let token = signed_in["access_token"]
        .as_str()
        .expect("access token")
        .to_owned();

    // The token has `search` only: ingesting is refused with one challenge naming the scope.
    let response = http
        .post(format!("{base}/v1/sources"))
        .bearer_auth(&token)
        .json(&json!({"dataset": "default", "source_key": "x.md", "content": "x"}))
        .send()
        .await
        .expect("put");
    assert_eq!(response.status().as_u16(), 403);
    let challenge = challenge_of(&response);
    assert!(
        challenge.contains("error=\"insufficient_scope\"") && challenge.contains("cairn.ingest"),
        "{challenge}"
    );

    let key_fetches = || async {
        let text = crate::common::scrape(&base, &admin).await;
        crate::common::metric(&text, "cairn_oauth_key_fetches_total", &[("outcome", "ok")])
    };
    let fetched_before = key_fetches().await;

    // The server rotates its signing key; the host signs in again and its new token, signed
    // with a key cairn has not seen, is accepted after one refetch of the server's keys.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (key, cert) = server.new_key("second").expect("key");
    let answer = python(
        "glewlwyd",
        directory.path(),
        &provision("rotate", &key, &cert),
    )
    .await;
    assert_eq!(answer, "ok");
    let rotated = python("host", directory.path(), &host_config).await;
    assert_eq!(rotated["keys"], signed_in["keys"], "{rotated}");
    let new_token = rotated["access_token"].as_str().expect("token").to_owned();
    let kid = |token: &str| {
        jsonwebtoken::decode_header(token)
            .expect("a JWT")
            .kid
            .expect("a kid")
    };
    assert_ne!(kid(&new_token), kid(&token), "the key was rotated");
    assert_eq!(key_fetches().await, fetched_before + 1.0);

    // The server goes down: the cached key keeps serving the signed-in user.
    server.kill();
    let search = |token: String| {
        http.post(format!("{base}/v1/search"))
            .bearer_auth(token)
            .json(&json!({"query": "lighthouse keeper", "mode": "lexical", "top_k": 10}))
            .send()
    };
    let response = search(new_token.clone()).await.expect("search");
    assert_eq!(response.status().as_u16(), 200);
    let answer: Value = response.json().await.expect("json");
    assert_eq!(
        crate::common::hit_keys(&answer),
        ["alice/notes.md", "eng/design.md"],
        "{answer}"
    );

    // Revocation. cairn restarts set to introspect the server's JWTs as well (RFC 7662), with
    // the host's client credentials: glewlwyd lets a client introspect and revoke its own
    // tokens. The token works until the server revokes it, then is refused as inactive once
    // the one-second cache lapses.
    server.start_again().expect("glewlwyd again");
    child.kill().await.expect("stop");
    let _ = child.wait().await;
    let client_id = rotated["client_id"].as_str().expect("client id");
    let client_secret = rotated["client_secret"].as_str().expect("client secret");
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str(&format!(
        "[oauth.issuers.introspection]\nclient_id = \"{client_id}\"\n\
         client_secret_env = \"SIGN_IN_TEST_CLIENT_SECRET\"\ncache_seconds = 1\njwts = true\n"
    ));
    std::fs::write(&config, text).expect("config");
    let (mut child, _) = crate::crash::spawn_serve_with(
        &data,
        &["--bind", &bind, "--config", config_arg],
        &[("SIGN_IN_TEST_CLIENT_SECRET", client_secret)],
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let response = search(new_token.clone()).await.expect("search");
    assert_eq!(response.status().as_u16(), 200, "active at the server");
    let revoked = http
        .post(format!("{}/api/oidc/revoke", server.url()))
        .basic_auth(client_id, Some(client_secret))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={new_token}"))
        .send()
        .await
        .expect("revoke");
    assert_eq!(revoked.status().as_u16(), 200);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let response = search(new_token.clone()).await.expect("search");
    assert_eq!(response.status().as_u16(), 401);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["details"]["reason"], "inactive", "{body}");
    let text = crate::common::scrape(&base, &admin).await;
    for outcome in ["active", "inactive"] {
        assert_eq!(
            crate::common::metric(
                &text,
                "cairn_oauth_introspections_total",
                &[("outcome", outcome)]
            ),
            1.0,
            "{outcome}"
        );
    }

    child.kill().await.expect("stop");
    let _ = child.wait().await;
}
