//! `cairn verify` against a served instance (SQLite and qdrant-edge): clean after projection
//! (exit 0), drift after chunk rows are deleted behind cairn's back (exit 1, one JSON line per
//! drift), `--repair` queues the projection that puts them back, and the next pass is clean
//! again; a bad request is a typed 422 and an unknown generation exits 2.

use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{admin_token, post_source};
use crate::crash::spawn_serve_with;
use crate::projection::wait_for_job;

fn verify(base: &str, token: &str, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("verify")
        .args(args)
        .args(["--server", base, "--token", token])
        .env("CAIRN_LOG", "warn")
        .output()
        .expect("run cairn verify")
}

fn lines(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_finds_and_repairs_drift_from_the_cli() {
    let data = tempfile::tempdir().expect("tempdir");
    let (mut server, base) = spawn_serve_with(
        data.path(),
        &[],
        &[("CAIRN_VERIFY_POINTS_PER_SECOND", "4000000000")],
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let token = admin_token(data.path());
    let http = reqwest::Client::new();
    let mut revisions = Vec::new();
    for key in ["a.md", "b.md", "c.md"] {
        let body = json!({"dataset": "docs", "source_key": key, "content": format!("# {key}\n\nA note about {key}, long enough to make one chunk of text.")});
        revisions.push(post_source(&http, &base, &token, &body).await);
    }
    for revision in &revisions {
        wait_for_job(&http, &base, &token, revision, "completed").await;
    }

    let clean = verify(&base, &token, &["--tier", "scrub"]);
    assert_eq!(
        clean.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );
    assert!(lines(&clean).is_empty());
    assert!(String::from_utf8_lossy(&clean.stderr).contains("completed: 1024 buckets checked"));

    // Chunk rows deleted behind cairn's back (another connection to the ledger file).
    {
        use sqlx::ConnectOptions;
        let mut connection = receipts::sqlite::connect_options(
            &data.path().join("ledger.db"),
            Duration::from_secs(5),
        )
        .connect()
        .await
        .expect("open the ledger file");
        let deleted = sqlx::query("DELETE FROM chunks WHERE revision_id = ?")
            .bind(&revisions[1])
            .execute(&mut connection)
            .await
            .expect("delete rows")
            .rows_affected();
        assert!(deleted > 0);
    }
    let found = verify(&base, &token, &["--tier", "counts"]);
    assert_eq!(
        found.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&found.stderr)
    );
    let drift = lines(&found);
    assert_eq!(drift.len(), 1, "{drift:?}");
    assert_eq!(
        (
            &drift[0]["kind"],
            &drift[0]["store"],
            &drift[0]["source_key"]
        ),
        (&json!("missing"), &json!("relational"), &json!("b.md"))
    );
    assert_eq!(drift[0]["evidence"]["found"]["rows"], 0, "{}", drift[0]);
    let drift_pass = drift[0]["pass_id"]
        .as_str()
        .expect("the drift's pass")
        .to_owned();

    let repaired = verify(
        &base,
        &token,
        &["--tier", "scrub", "--repair", "--reason", "rows lost"],
    );
    assert_eq!(repaired.status.code(), Some(1));
    let drift = lines(&repaired);
    assert_eq!(drift[0]["state"], "repairing", "{drift:?}");
    assert!(drift[0]["repair"]
        .as_str()
        .unwrap_or("")
        .starts_with("queued projection job"));

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let again = verify(&base, &token, &["--tier", "scrub"]);
        if again.status.code() == Some(0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "drift did not clear: {}",
            String::from_utf8_lossy(&again.stdout)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // A bad request changes nothing and is typed; an unknown generation exits 2.
    let bad = http
        .post(format!("{base}/v1/verify"))
        .bearer_auth(&token)
        .json(&json!({"tier": "thorough"}))
        .send()
        .await
        .expect("post");
    assert_eq!(bad.status().as_u16(), 422);
    let body: Value = bad.json().await.expect("json");
    assert_eq!(body["code"], "invalid_json", "{body}");
    let unknown = verify(&base, &token, &["--generation", "g-0000000000000000"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("generation_state"));

    // The passes and their drift are listed, and metrics count them.
    let listed: Value = http
        .get(format!("{base}/v1/verify?limit=10"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    assert!(
        listed["passes"].as_array().expect("passes").len() >= 4,
        "{listed}"
    );

    // A pass covers every dataset: a token limited to some may neither start nor abandon one,
    // `repair` or not; it still reads passes, with only its datasets' drift.
    let created: Value = http
        .post(format!("{base}/v1/tokens"))
        .bearer_auth(&token)
        .json(
            &json!({"name": "docs-ops", "scopes": ["ops:write", "ops:read"], "datasets": ["docs"]}),
        )
        .send()
        .await
        .expect("token")
        .json()
        .await
        .expect("json");
    let limited = created["secret"].as_str().expect("secret").to_owned();
    let pass_id = listed["passes"][0]["id"]
        .as_str()
        .expect("a pass id")
        .to_owned();
    for (path, body) in [
        ("/v1/verify".to_owned(), json!({"tier": "counts"})),
        (
            "/v1/verify".to_owned(),
            json!({"tier": "scrub", "repair": true}),
        ),
        (format!("/v1/verify/passes/{pass_id}/abandon"), json!(null)),
    ] {
        let mut request = http.post(format!("{base}{path}")).bearer_auth(&limited);
        if !body.is_null() {
            request = request.json(&body);
        }
        let refused = request.send().await.expect("post");
        assert_eq!(refused.status().as_u16(), 403, "{path} {body}");
        let answer: Value = refused.json().await.expect("json");
        assert_eq!(answer["code"], "forbidden", "{answer}");
        assert_eq!(answer["details"]["needs"], "every_dataset", "{answer}");
    }
    let after: Value = http
        .get(format!("{base}/v1/verify?limit=10"))
        .bearer_auth(&limited)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    assert_eq!(
        after["passes"].as_array().map(Vec::len),
        listed["passes"].as_array().map(Vec::len),
        "no pass was started: {after}"
    );
    // A token that reads as an identity sees the drift of the sources it may read only.
    let narrowed = http
        .put(format!("{base}/v1/sources/access"))
        .bearer_auth(&token)
        .json(
            &json!({"dataset": "docs", "source_key": "b.md", "readers": ["user:dave"],
                      "reason": "dave only"}),
        )
        .send()
        .await
        .expect("access");
    assert_eq!(narrowed.status().as_u16(), 200);
    let drift_seen_by = |principal: &'static str| {
        let (http, base, token) = (http.clone(), base.clone(), token.clone());
        let drift_pass = drift_pass.clone();
        async move {
            let response = http
                .post(format!("{base}/v1/tokens"))
                .bearer_auth(&token)
                .json(&json!({"name": principal, "scopes": ["ops:read"],
                              "principal": principal}))
                .send()
                .await
                .expect("token");
            assert_eq!(response.status().as_u16(), 201, "{principal}");
            let created: Value = response.json().await.expect("json");
            let secret = created["secret"].as_str().expect("secret").to_owned();
            let response = http
                .get(format!("{base}/v1/verify/passes/{drift_pass}"))
                .bearer_auth(&secret)
                .send()
                .await
                .expect("pass");
            assert_eq!(response.status().as_u16(), 200, "{principal}");
            let detail: Value = response.json().await.expect("json");
            detail["drift"]
                .as_array()
                .expect("drift")
                .iter()
                .filter_map(|record| record["source_key"].as_str().map(str::to_owned))
                .collect::<Vec<String>>()
        }
    };
    assert_eq!(drift_seen_by("user:dave").await, ["b.md"]);
    assert!(drift_seen_by("user:carol").await.is_empty());
    let metrics = crate::common::scrape(&base, &token).await;
    assert!(
        crate::common::metric(
            &metrics,
            "cairn_verify_drift_total",
            &[("kind", "missing"), ("store", "relational")]
        ) >= 2.0,
        "{metrics}"
    );
    let _ = server.kill().await;
    let _ = server.wait().await;
}
