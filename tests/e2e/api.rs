//! The HTTP API: receipts, every error code, and that refused requests write nothing.

use axum::body::Body;
use axum::http::Request;
use base64::Engine;
use proptest::prelude::*;
use receipts::Scope;
use serde_json::json;

use crate::common::{app, app_with, assert_error};

#[tokio::test]
async fn put_returns_a_durable_receipt_and_duplicates_create_nothing() {
    let app = app().await;
    let body = json!({"dataset": "docs", "source_key": "a.md", "content": "hello", "media_type": "text/markdown", "tags": ["b", "a"], "metadata": {"lang": "en"}});
    let (status, receipt) = app.put(&app.admin, body.clone()).await;
    assert_eq!(status, 202, "{receipt}");
    assert_eq!(receipt["accepted"], true);
    assert_eq!(receipt["status"], "queued_not_confirmed");
    assert_eq!(receipt["byte_length"], 5);
    assert_eq!(
        receipt["content_sha256"],
        receipts::ids::sha256_hex(b"hello")
    );
    assert!(receipt["previous_revision_id"].is_null());
    for field in [
        "source_revision_id",
        "projection_job_id",
        "accepted_at",
        "dataset",
        "source_key",
    ] {
        assert!(!receipt[field].is_null(), "missing {field}");
    }
    let before = app.counts().await;
    let (status, duplicate) = app.put(&app.admin, body).await;
    assert_eq!(status, 202);
    assert_eq!(duplicate["status"], "duplicate");
    assert_eq!(
        duplicate["source_revision_id"],
        receipt["source_revision_id"]
    );
    assert_eq!(duplicate["projection_job_id"], receipt["projection_job_id"]);
    assert_eq!(app.counts().await, before);

    let revision = receipt["source_revision_id"].as_str().expect("id");
    let (status, detail) = app
        .call(
            "GET",
            &format!("/v1/revisions/{revision}"),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        detail["revision"]["content_sha256"],
        receipt["content_sha256"]
    );
    assert_eq!(detail["revision"]["tombstone"], false);
    assert_eq!(detail["revision"]["tags"], json!(["a", "b"]));
    assert_eq!(detail["job"]["state"], "pending");
    let backends: Vec<&str> = detail["receipts"]
        .as_array()
        .expect("receipts")
        .iter()
        .filter_map(|r| r["backend"].as_str())
        .collect();
    assert_eq!(backends, ["relational", "vector"]);
    assert!(detail["receipts"]
        .as_array()
        .expect("receipts")
        .iter()
        .all(|r| r["state"] == "pending"));
    assert!(detail["history"]
        .as_array()
        .expect("history")
        .iter()
        .all(|h| h["actor"] == "token:admin"));

    let request = Request::get(format!("/v1/revisions/{revision}/content"))
        .header("authorization", format!("Bearer {}", app.admin))
        .body(Body::empty())
        .expect("request");
    let (status, headers, bytes) = app.raw(request).await;
    assert_eq!(status, 200);
    assert_eq!(bytes, b"hello");
    assert_eq!(headers["content-type"], "text/markdown");
}

/// Regression: a passage cut right after a two-byte space (U+00A0) panicked in the handler.
#[tokio::test]
async fn multibyte_whitespace_at_a_passage_boundary_is_accepted() {
    let app = app().await;
    // The last whitespace within the first passage's byte budget is the two-byte U+00A0.
    let content = format!(
        "{}\u{a0}{} {}",
        "x".repeat(receipts::passages::PASSAGE_TARGET_BYTES - 10),
        "y".repeat(20),
        "zebra ".repeat(50)
    );
    let body = json!({"dataset": "docs", "source_key": "nbsp", "content": content});
    let (status, receipt) = app.put(&app.admin, body).await;
    assert_eq!(status, 202, "{receipt}");
    let hits = app
        .ledger
        .lexical_search("zebra", &[], 10, None)
        .await
        .expect("search");
    assert_eq!(hits.len(), 1, "{hits:#?}");
    assert!(
        hits[0].text.starts_with("yyyy"),
        "the second passage starts after U+00A0: {}",
        hits[0].text
    );
}

#[tokio::test]
async fn base64_content_keeps_its_bytes_and_non_utf8_is_refused_at_admission() {
    let app = app().await;
    // Text with a NUL, a CR and a non-ASCII letter: sent as base64, kept byte for byte.
    let bytes = "caf\u{e9}\0\r\nline".as_bytes().to_vec();
    let encoded = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let (status, receipt) = app
        .put(&app.admin, json!({"dataset": "bin", "source_key": "x", "content_base64": encoded, "media_type": "text/plain"}))
        .await;
    assert_eq!(status, 202, "{receipt}");
    assert_eq!(receipt["content_sha256"], receipts::ids::sha256_hex(&bytes));
    let stored = app
        .ledger
        .content(receipt["content_sha256"].as_str().expect("sha"))
        .await
        .expect("read");
    assert_eq!(stored.as_deref(), Some(&bytes[..]));

    // Bytes that are not UTF-8 would only die later as `not_text`: refused now, nothing kept.
    let before = app.counts().await;
    let binary = base64::engine::general_purpose::STANDARD.encode([0u8, 159, 146, 150, 255]);
    let refused = app
        .put(&app.admin, json!({"dataset": "bin", "source_key": "y", "content_base64": binary, "media_type": "application/octet-stream"}))
        .await;
    assert_error(&refused, 422, "not_text");
    assert_eq!(refused.1["details"]["offset"], 1);
    assert_eq!(app.counts().await, before);
    // Bytes that are not what their media type says are refused, and the message says what
    // the bytes are.
    let refused = app
        .put(&app.admin, json!({"dataset": "bin", "source_key": "p", "content_base64": binary, "media_type": "application/pdf"}))
        .await;
    assert_error(&refused, 422, "format_mismatch");
    let message = refused.1["message"].as_str().expect("message");
    assert!(
        message.contains("the media type says pdf but the content is unrecognised bytes"),
        "{message}"
    );
    assert_eq!(app.counts().await, before);
}

#[tokio::test]
async fn source_history_delete_and_revert() {
    let app = app().await;
    let put = |text: &str| json!({"dataset": "docs", "source_key": "k", "content": text});
    let (_, first) = app.put(&app.admin, put("one")).await;
    let (_, second) = app.put(&app.admin, put("two")).await;
    assert_eq!(second["previous_revision_id"], first["source_revision_id"]);
    let (status, tombstone) = app
        .call(
            "DELETE",
            "/v1/sources?dataset=docs&source_key=k&reason=gdpr%20request",
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(status, 202, "{tombstone}");
    assert_eq!(tombstone["tombstone"], true);
    assert!(tombstone["content_sha256"].is_null());
    let (status, source) = app
        .call(
            "GET",
            "/v1/sources?dataset=docs&source_key=k",
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(source["deleted"], true);
    assert_eq!(source["head"]["reason"], "gdpr request");
    assert_eq!(source["revisions"].as_array().map(Vec::len), Some(3));
    assert_eq!(source["revisions_total"], 3);
    assert_eq!(source["revisions"][0]["tombstone"], true, "newest first");
    let (_, page) = app
        .call(
            "GET",
            "/v1/sources?dataset=docs&source_key=k&limit=1&offset=2",
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(page["revisions"].as_array().map(Vec::len), Some(1));
    assert_eq!(page["revisions"][0]["id"], first["source_revision_id"]);
    let (_, back) = app.put(&app.admin, put("one")).await;
    assert_eq!(
        back["source_revision_id"], first["source_revision_id"],
        "reverting reactivates the earlier revision"
    );
    assert_error(
        &app.call(
            "DELETE",
            "/v1/sources?dataset=docs&source_key=missing",
            Some(&app.admin),
            None,
        )
        .await,
        404,
        "source_not_found",
    );
    assert_error(
        &app.call(
            "GET",
            "/v1/sources?dataset=docs&source_key=missing",
            Some(&app.admin),
            None,
        )
        .await,
        404,
        "source_not_found",
    );
    assert_error(
        &app.call("GET", "/v1/sources?dataset=docs", Some(&app.admin), None)
            .await,
        422,
        "invalid_query",
    );
    assert_error(
        &app.call("GET", "/v1/revisions/not-a-uuid", Some(&app.admin), None)
            .await,
        422,
        "invalid_revision_id",
    );
    assert_error(
        &app.call(
            "GET",
            "/v1/revisions/00000000-0000-0000-0000-000000000000",
            Some(&app.admin),
            None,
        )
        .await,
        404,
        "revision_not_found",
    );
    let tombstone_id = tombstone["source_revision_id"].as_str().expect("id");
    assert_error(
        &app.call(
            "GET",
            &format!("/v1/revisions/{tombstone_id}/content"),
            Some(&app.admin),
            None,
        )
        .await,
        410,
        "revision_is_tombstone",
    );
}

#[tokio::test]
async fn authentication_and_authorisation() {
    let app = app().await;
    let body = json!({"dataset": "docs", "source_key": "k", "content": "x"});
    assert_eq!(app.call("GET", "/healthz", None, None).await.0, 200);
    assert_error(
        &app.call("GET", "/readyz", None, None).await,
        401,
        "unauthenticated",
    );
    assert_eq!(
        app.call("GET", "/readyz", Some(&app.admin), None).await.0,
        200
    );
    assert_error(
        &app.call("POST", "/v1/sources", None, Some(body.clone()))
            .await,
        401,
        "unauthenticated",
    );
    assert_error(
        &app.call(
            "POST",
            "/v1/sources",
            Some("cairn_not_a_token"),
            Some(body.clone()),
        )
        .await,
        401,
        "unauthenticated",
    );
    let search_only = app.token("searcher", &[Scope::Search], None).await;
    let denied = app
        .call(
            "POST",
            "/v1/sources",
            Some(&search_only),
            Some(body.clone()),
        )
        .await;
    assert_error(&denied, 403, "forbidden");
    assert_eq!(denied.1["details"]["missing_scope"], "ingest");
    let scoped = app
        .token("docs-only", &[Scope::Ingest], Some(&["docs"]))
        .await;
    assert_eq!(app.put(&scoped, body.clone()).await.0, 202);
    let other = app
        .put(
            &scoped,
            json!({"dataset": "secret", "source_key": "k", "content": "x"}),
        )
        .await;
    assert_error(&other, 403, "forbidden");
    assert_eq!(other.1["details"]["dataset"], "secret");
    assert_error(
        &app.call("GET", "/v1/status", Some(&scoped), None).await,
        403,
        "forbidden",
    );
    let block = json!({"dataset": "docs", "content_sha256": receipts::ids::sha256_hex(b"x"), "reason": "r"});
    assert_error(
        &app.call("POST", "/v1/blocks", Some(&scoped), Some(block))
            .await,
        403,
        "forbidden",
    );
    // History names the token that acted.
    let (_, source) = app
        .call(
            "GET",
            "/v1/sources?dataset=docs&source_key=k",
            Some(&scoped),
            None,
        )
        .await;
    assert_eq!(source["head"]["actor"], "token:docs-only");
}

#[tokio::test]
async fn blocked_content_is_refused_with_409() {
    let app = app().await;
    let sha = receipts::ids::sha256_hex(b"retracted text");
    let block =
        json!({"dataset": "docs", "content_sha256": sha, "reason": "retracted by the editor"});
    assert_eq!(
        app.call("POST", "/v1/blocks", Some(&app.admin), Some(block))
            .await
            .0,
        201
    );
    let before = app.counts().await;
    let refused = app
        .put(
            &app.admin,
            json!({"dataset": "docs", "source_key": "k", "content": "retracted text"}),
        )
        .await;
    assert_error(&refused, 409, "content_blocked");
    assert_eq!(refused.1["details"]["content_sha256"], sha);
    assert_eq!(app.counts().await, before);
}

#[tokio::test]
async fn every_bad_input_is_typed_and_writes_nothing() {
    let app = app_with(&[
        ("CAIRN_MAX_BODY_BYTES", "4096"),
        ("CAIRN_MAX_BATCH_ITEMS", "3"),
    ])
    .await;
    let token = app.admin.clone();
    let before = app.counts().await;
    let long_dataset = "d".repeat(129);
    let cases = vec![
        (
            json!({"dataset": "docs", "source_key": "k", "content": ""}),
            422,
            "empty_content",
        ),
        (
            json!({"dataset": "docs", "source_key": "k", "content_base64": "%%%"}),
            422,
            "invalid_base64",
        ),
        (
            json!({"dataset": "", "source_key": "k", "content": "x"}),
            422,
            "invalid_dataset",
        ),
        (
            json!({"dataset": long_dataset, "source_key": "k", "content": "x"}),
            422,
            "invalid_dataset",
        ),
        (
            json!({"dataset": "a\u{7}b", "source_key": "k", "content": "x"}),
            422,
            "invalid_dataset",
        ),
        (
            json!({"dataset": "docs", "source_key": "", "content": "x"}),
            422,
            "invalid_source_key",
        ),
        (
            json!({"dataset": "docs", "source_key": "line\nbreak", "content": "x"}),
            422,
            "invalid_source_key",
        ),
        (
            json!({"dataset": "docs", "source_key": "k".repeat(1025), "content": "x"}),
            422,
            "invalid_source_key",
        ),
        (
            json!({"dataset": "docs", "source_key": "k", "content": "x", "colour": "red"}),
            422,
            "invalid_json",
        ),
        (
            json!({"dataset": "docs", "source_key": "k"}),
            422,
            "missing_content",
        ),
        (
            json!({"dataset": "docs", "source_key": "k", "content": "x", "content_base64": "eA=="}),
            422,
            "conflicting_content",
        ),
        (
            json!({"dataset": "docs", "source_key": "k", "content": "x", "media_type": "nonsense"}),
            422,
            "invalid_media_type",
        ),
        (
            json!({"dataset": "docs", "source_key": "k", "content": "x", "tags": [""]}),
            422,
            "invalid_tags",
        ),
        (
            json!({"dataset": "docs", "source_key": "k", "content": "x".repeat(5000)}),
            413,
            "payload_too_large",
        ),
    ];
    for (body, status, code) in cases {
        let result = app.put(&token, body.clone()).await;
        assert_error(&result, status, code);
    }
    let unknown = app
        .put(
            &token,
            json!({"dataset": "docs", "source_key": "k", "content": "x", "colour": "red"}),
        )
        .await;
    assert!(
        unknown.1["message"]
            .as_str()
            .unwrap_or_default()
            .contains("colour"),
        "the unknown field is named: {}",
        unknown.1
    );

    // A credential is named by kind and offset, never echoed.
    let secret = "AKIAIOSFODNN7EXAMPLE";
    let leaked = app
        .put(
            &token,
            json!({"dataset": "docs", "source_key": "k", "content": format!("aws key: {secret}")}),
        )
        .await;
    assert_error(&leaked, 422, "secret_detected");
    assert_eq!(
        leaked.1["details"],
        json!({"field": "content", "kind": "aws_access_key_id", "offset": 9})
    );
    assert!(!leaked.1.to_string().contains(secret));
    // The other stored fields are scanned too, and cairn's own tokens are recognised.
    for (field, body) in [
        (
            "source_key",
            json!({"dataset": "docs", "source_key": format!("keys/{secret}"), "content": "x"}),
        ),
        (
            "tags",
            json!({"dataset": "docs", "source_key": "k", "content": "x", "tags": ["ok", secret]}),
        ),
        (
            "metadata",
            json!({"dataset": "docs", "source_key": "k", "content": "x", "metadata": {"note": {"key": secret}}}),
        ),
        (
            "content",
            json!({"dataset": "docs", "source_key": "k", "content": format!("use {} here", app.admin)}),
        ),
    ] {
        let refused = app.put(&token, body).await;
        assert_error(&refused, 422, "secret_detected");
        assert_eq!(refused.1["details"]["field"], field, "{}", refused.1);
        assert!(!refused.1.to_string().contains(&app.admin));
    }
    let key = app.put(&token, json!({"dataset": "docs", "source_key": "k", "content": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"})).await;
    assert_error(&key, 422, "secret_detected");
    assert_eq!(key.1["details"]["kind"], "private_key");

    // Bodies that are not JSON, or not UTF-8.
    let raw = |body: Vec<u8>, content_type: &str| {
        Request::post("/v1/sources")
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", content_type)
            .body(Body::from(body))
            .expect("request")
    };
    let (status, _, bytes) = app
        .raw(raw(
            b"{\"dataset\": \"d\", \"source_key\": \"k\", \"content\": \"\xff\"}".to_vec(),
            "application/json",
        ))
        .await;
    let value: serde_json::Value = serde_json::from_slice(&bytes).expect("json error");
    assert_error(&(status, value), 422, "invalid_utf8");
    let (status, _, bytes) = app.raw(raw(b"not json".to_vec(), "application/json")).await;
    assert_error(
        &(status, serde_json::from_slice(&bytes).expect("json")),
        422,
        "invalid_json",
    );
    let (status, _, bytes) = app
        .raw(raw(
            b"dataset=d".to_vec(),
            "application/x-www-form-urlencoded",
        ))
        .await;
    assert_error(
        &(status, serde_json::from_slice(&bytes).expect("json")),
        415,
        "unsupported_media_type",
    );

    // Batches: limits.
    let item = json!({"dataset": "docs", "source_key": "k", "content": "x"});
    assert_error(
        &app.call(
            "POST",
            "/v1/sources/batch",
            Some(&token),
            Some(json!({"items": []})),
        )
        .await,
        422,
        "empty_batch",
    );
    let too_many = json!({"items": [item.clone(), item.clone(), item.clone(), item.clone()]});
    assert_error(
        &app.call("POST", "/v1/sources/batch", Some(&token), Some(too_many))
            .await,
        422,
        "batch_too_large",
    );
    // The item limit is applied while parsing: a body whose items run past the limit is
    // refused for its size even though everything after the limit is not JSON at all, so
    // nothing past the limit is parsed or kept.
    let (status, _, bytes) = app
        .raw(
            axum::http::Request::builder()
                .method("POST")
                .uri("/v1/sources/batch")
                .header("authorization", format!("Bearer {token}"))
                .header("content-type", "application/json")
                .body(axum::body::Body::from(format!(
                    "{{\"items\":[0,0,0,0,{}",
                    "x".repeat(1000)
                )))
                .expect("request"),
        )
        .await;
    assert_error(
        &(status, serde_json::from_slice(&bytes).expect("json")),
        422,
        "batch_too_large",
    );
    assert_error(
        &app.call("GET", "/v1/nothing-here", Some(&token), None)
            .await,
        404,
        "not_found",
    );

    assert_eq!(app.counts().await, before, "refused requests wrote nothing");
}

#[tokio::test]
async fn batch_results_come_back_in_order_and_bad_items_fail_alone() {
    let app = app().await;
    let items = json!({"items": [
        {"dataset": "docs", "source_key": "1", "content": "first"},
        {"dataset": "docs", "source_key": "2", "content": ""},
        {"dataset": "docs", "source_key": "3", "content": "third", "extra": true},
        {"dataset": "docs", "source_key": "4", "content": "token ghp_abcdefghijklmnopqrstuvwxyz0123456789"},
        {"dataset": "docs", "source_key": "1", "content": "first"},
        {"dataset": "docs", "source_key": "1", "content": "first, edited"},
        "not an object",
    ]});
    let (status, answer) = app
        .call("POST", "/v1/sources/batch", Some(&app.admin), Some(items))
        .await;
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().expect("results");
    assert_eq!(results.len(), 7);
    for (index, result) in results.iter().enumerate() {
        assert_eq!(result["index"], index);
    }
    assert_eq!(results[0]["status"], "queued_not_confirmed");
    assert_eq!(
        (results[1]["accepted"].clone(), results[1]["code"].clone()),
        (json!(false), json!("empty_content"))
    );
    assert_eq!(results[2]["code"], "invalid_json");
    assert_eq!(results[3]["code"], "secret_detected");
    assert_eq!(results[3]["http_status"], 422);
    assert_eq!(
        results[4]["status"], "duplicate",
        "the same source twice in one batch sees the first"
    );
    assert_eq!(results[5]["status"], "queued_not_confirmed");
    assert_eq!(
        results[5]["previous_revision_id"],
        results[0]["source_revision_id"]
    );
    assert_eq!(results[6]["code"], "invalid_json");
    let counts = app.counts().await;
    assert_eq!(counts.sources, 1);
    assert_eq!(counts.revisions, 2);
}

#[tokio::test]
async fn status_reports_counts() {
    let app = app().await;
    app.put(
        &app.admin,
        json!({"dataset": "docs", "source_key": "k", "content": "x"}),
    )
    .await;
    let (status, body) = app.call("GET", "/v1/status", Some(&app.admin), None).await;
    assert_eq!(status, 200);
    assert_eq!(body["counts"]["sources"], 1);
    assert_eq!(body["counts"]["jobs"]["pending"], 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Arbitrary names and content never panic and never answer 5xx; whatever is refused
    /// writes nothing, whatever is accepted is readable back.
    #[test]
    fn arbitrary_submissions_are_accepted_or_refused_cleanly(
        dataset in "\\PC{0,4}|[\\x00-\\x1f]{1,3}|.{0,140}",
        source_key in "\\PC{0,8}|[ \\t]{1,2}\\PC{0,3}|.{0,20}",
        content in ".{0,64}",
        media_type in proptest::option::of("[a-z]{0,6}/?[a-z]{0,6}"),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let app = app().await;
            let before = app.counts().await;
            let mut body = json!({"dataset": dataset, "source_key": source_key, "content": content});
            if let Some(media_type) = &media_type {
                body["media_type"] = json!(media_type);
            }
            let (status, answer) = app.put(&app.admin, body).await;
            prop_assert!(status.as_u16() == 202 || status.is_client_error(), "status {} {}", status, answer);
            if status.as_u16() == 202 {
                let id = answer["source_revision_id"].as_str().expect("id").to_owned();
                let (status, detail) = app.call("GET", &format!("/v1/revisions/{id}"), Some(&app.admin), None).await;
                prop_assert_eq!(status.as_u16(), 200);
                prop_assert_eq!(&detail["revision"]["source_key"], &json!(source_key));
            } else {
                prop_assert!(answer["code"].is_string());
                prop_assert_eq!(app.counts().await, before);
            }
            Ok(())
        })?;
    }
}

#[tokio::test]
async fn search_without_a_vector_store_answers_lexically_from_acceptance_on() {
    let app = app().await;
    let body =
        json!({"dataset": "docs", "source_key": "lava", "content": "Lava reached the village."});
    let (status, receipt) = app.put(&app.admin, body).await;
    assert_eq!(status, 202, "{receipt}");
    // Findable at once, before any projection: lexical, labelled pending.
    let (status, answer) = app
        .call(
            "POST",
            "/v1/search",
            Some(&app.admin),
            Some(json!({"query": "lava village"})),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["mode"], "lexical");
    assert_eq!(answer["degraded"], false);
    assert_eq!(answer["results"][0]["source_key"], "lava");
    assert_eq!(answer["results"][0]["projection_state"], "pending");
    assert_eq!(
        answer["results"][0]["source_revision_id"],
        receipt["source_revision_id"]
    );
    let (status, error) = app
        .call(
            "POST",
            "/v1/search",
            Some(&app.admin),
            Some(json!({"query": "lava", "mode": "vector"})),
        )
        .await;
    assert_eq!(
        (status.as_u16(), error["code"].as_str()),
        (422, Some("vector_unconfigured"))
    );
    let (status, _) = app
        .call("POST", "/v1/search", None, Some(json!({"query": "lava"})))
        .await;
    assert_eq!(status.as_u16(), 401);
}

#[tokio::test]
async fn every_error_is_typed_json_whatever_rejects_it() {
    let app = app().await;
    let admin = app.admin.clone();
    // Query strings: a bad number, a repeated or unknown parameter.
    for (uri, code) in [
        ("/v1/ops/jobs?limit=-1", "invalid_limit"),
        ("/v1/ops/jobs?limit=abc", "invalid_limit"),
        ("/v1/ops/jobs?limit=1&limit=2", "invalid_limit"),
        ("/v1/ops/jobs?colour=red", "invalid_query"),
    ] {
        assert_error(&app.call("GET", uri, Some(&admin), None).await, 422, code);
    }
    // A path segment that is not UTF-8.
    assert_error(
        &app.call("GET", "/v1/ops/jobs/%FF%FE", Some(&admin), None)
            .await,
        422,
        "invalid_path",
    );
    // A wrong method: typed, with `Allow`.
    let (status, headers, bytes) = app
        .raw(
            Request::builder()
                .method("PUT")
                .uri("/v1/sources/batch")
                .header("authorization", format!("Bearer {admin}"))
                .body(Body::empty())
                .expect("request"),
        )
        .await;
    let body: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
    assert_error(&(status, body), 405, "method_not_allowed");
    assert_eq!(
        headers.get("allow").and_then(|v| v.to_str().ok()),
        Some("POST")
    );
}

#[tokio::test]
async fn reasons_are_bounded_printable_text_and_content_is_served_as_an_attachment() {
    let app = app().await;
    let admin = app.admin.clone();
    let sha = "a".repeat(64);
    for reason in [
        "with a NUL \u{0} byte".to_owned(),
        "x".repeat(100_000),
        " ".to_owned(),
    ] {
        let refused = app
            .call(
                "POST",
                "/v1/blocks",
                Some(&admin),
                Some(json!({"dataset": "docs", "content_sha256": sha, "reason": reason})),
            )
            .await;
        assert_error(&refused, 422, "invalid_reason");
    }
    let (status, _) = app
        .call(
            "POST",
            "/v1/blocks",
            Some(&admin),
            Some(json!({"dataset": "docs", "content_sha256": sha, "reason": "legal hold"})),
        )
        .await;
    assert_eq!(status, 201);

    // Client-chosen HTML is never rendered from cairn's origin.
    let (_, receipt) = app
        .put(
            &admin,
            json!({"dataset": "docs", "source_key": "page", "content": "<script>alert(1)</script>", "media_type": "text/html"}),
        )
        .await;
    let id = receipt["source_revision_id"].as_str().expect("id");
    let (status, headers, _) = app
        .raw(
            Request::builder()
                .uri(format!("/v1/revisions/{id}/content"))
                .header("authorization", format!("Bearer {admin}"))
                .body(Body::empty())
                .expect("request"),
        )
        .await;
    assert_eq!(status, 200);
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(header("content-disposition"), "attachment");
    assert_eq!(header("x-content-type-options"), "nosniff");
    assert!(header("content-security-policy").contains("sandbox"));

    // The dashboard: a policy that allows only its own script, no framing, no sniffing.
    let (status, headers, _) = app
        .raw(
            Request::builder()
                .uri("/ops")
                .body(Body::empty())
                .expect("request"),
        )
        .await;
    assert_eq!(status, 200);
    let policy = headers
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(policy.contains("script-src 'sha256-"), "{policy}");
    assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
    assert_eq!(
        headers.get("x-frame-options").map(|v| v.as_bytes()),
        Some(&b"DENY"[..])
    );
    assert_eq!(
        headers.get("x-content-type-options").map(|v| v.as_bytes()),
        Some(&b"nosniff"[..])
    );
    assert!(headers.get("referrer-policy").is_some());
}
