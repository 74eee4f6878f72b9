//! Filterable metadata fields at run time, through `cairn serve`: a filter on a metadata field
//! the vector store holds no index for is answered and says so (`filter_unindexed`);
//! `POST /v1/filterable` indexes it in every live generation's store, existing points
//! included, and the same search then answers the same sources without saying so.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = http.request(method, url).bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn keys(answer: &Value) -> BTreeSet<String> {
    crate::common::hit_keys(answer).into_iter().collect()
}

#[tokio::test]
async fn a_metadata_field_is_indexed_at_run_time_and_search_stops_saying_it_is_not() {
    let directory = tempfile::tempdir().expect("tempdir");
    let data = directory.path().join("data");
    let (mut child, base) =
        crate::crash::spawn_serve_with(&data, &[], &[], "warn", std::process::Stdio::inherit())
            .await;
    let admin = crate::common::admin_token(&data);
    let http = reqwest::Client::new();
    for n in 0..4 {
        crate::common::post_source(
            &http,
            &base,
            &admin,
            &json!({"dataset": "ships", "source_key": format!("ship-{n}.md"),
                    "content": format!("the ship number {n} is moored in the harbour"),
                    "metadata": {"n": n}}),
        )
        .await;
    }
    let search = json!({"query": "a ship moored in the harbour", "mode": "vector",
                        "datasets": ["ships"], "top_k": 10,
                        "filter": {"field": "metadata.n", "gte": 2}});
    // Searchable once projected: wait until all four answer unfiltered.
    let everything = json!({"query": "a ship moored in the harbour", "mode": "vector",
                            "datasets": ["ships"], "top_k": 10});
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (status, answer) = call(
            &http,
            reqwest::Method::POST,
            &format!("{base}/v1/search"),
            &admin,
            Some(everything.clone()),
        )
        .await;
        if status == 200 && keys(&answer).len() == 4 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not searchable: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let wanted: BTreeSet<String> = ["ship-2.md", "ship-3.md"].map(str::to_owned).into();

    let (status, before) = call(
        &http,
        reqwest::Method::POST,
        &format!("{base}/v1/search"),
        &admin,
        Some(search.clone()),
    )
    .await;
    assert_eq!(status, 200, "{before}");
    assert_eq!(keys(&before), wanted, "{before}");
    assert_eq!(
        before["filter_unindexed"],
        json!(["metadata.n"]),
        "{before}"
    );
    let (status, listed) = call(
        &http,
        reqwest::Method::GET,
        &format!("{base}/v1/filterable"),
        &admin,
        None,
    )
    .await;
    assert_eq!(status, 200, "{listed}");
    let indexed = &listed["generations"][0]["indexed"];
    assert!(
        indexed
            .as_array()
            .is_some_and(|fields| fields.iter().any(|f| f == "tags")),
        "{listed}"
    );
    assert!(
        !indexed
            .as_array()
            .is_some_and(|fields| fields.iter().any(|f| f == "metadata.n")),
        "{listed}"
    );

    // Refusals change nothing.
    let url = format!("{base}/v1/filterable");
    for (body, code) in [
        (json!({"field": "tags", "kind": "keyword"}), "invalid_field"),
        (
            json!({"field": "metadata.a b", "kind": "keyword"}),
            "invalid_field",
        ),
        (
            json!({"field": "metadata.n", "kind": "text"}),
            "invalid_field_kind",
        ),
    ] {
        let (status, answer) = call(&http, reqwest::Method::POST, &url, &admin, Some(body)).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (422, Some(code)),
            "{answer}"
        );
    }
    let (status, reader) = call(
        &http,
        reqwest::Method::POST,
        &format!("{base}/v1/tokens"),
        &admin,
        Some(json!({"name": "reader", "scopes": ["search"]})),
    )
    .await;
    assert_eq!(status, 201, "{reader}");
    let secret = reader["secret"].as_str().expect("secret").to_owned();
    let (status, answer) = call(
        &http,
        reqwest::Method::POST,
        &url,
        &secret,
        Some(json!({"field": "metadata.n", "kind": "number"})),
    )
    .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (403, Some("forbidden")),
        "{answer}"
    );

    let (status, added) = call(
        &http,
        reqwest::Method::POST,
        &url,
        &admin,
        Some(json!({"field": "metadata.n", "kind": "number", "reason": "filter ships by number"})),
    )
    .await;
    assert_eq!(status, 200, "{added}");
    assert!(
        added["generations"][0]["indexed"]
            .as_array()
            .is_some_and(|fields| fields.iter().any(|f| f == "metadata.n")),
        "{added}"
    );
    let (status, after) = call(
        &http,
        reqwest::Method::POST,
        &format!("{base}/v1/search"),
        &admin,
        Some(search),
    )
    .await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(keys(&after), wanted, "{after}");
    assert!(after.get("filter_unindexed").is_none(), "{after}");
    child.kill().await.expect("kill");
    let _ = child.wait().await;
}
