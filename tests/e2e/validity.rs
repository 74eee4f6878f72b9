//! Validity time through the API: periods on the wire, typed refusals that write nothing, and
//! a source's timeline.

use serde_json::{json, Value};

use crate::common::{app, assert_error};

/// `2020-01-01T00:00:00Z` and `2020-03-01T00:00:00Z` in epoch microseconds.
const JAN_1_2020: i64 = 1_577_836_800_000_000;
const MAR_1_2020: i64 = 1_583_020_800_000_000;
const OPEN: i64 = (1 << 53) - 1;

/// `GET /v1/sources/timeline` of law/ruling: status and body.
async fn timeline_of(app: &crate::common::TestApp) -> (axum::http::StatusCode, Value) {
    app.call(
        "GET",
        "/v1/sources/timeline?dataset=law&source_key=ruling",
        Some(&app.admin),
        None,
    )
    .await
}

fn believed(timeline: &Value) -> Vec<(String, i64, i64)> {
    timeline["rectangles"]
        .as_array()
        .expect("rectangles")
        .iter()
        .filter(|rectangle| rectangle["recorded_to"] == OPEN)
        .map(|rectangle| {
            (
                rectangle["revision_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                rectangle["valid"]["from"].as_i64().unwrap_or_default(),
                rectangle["valid"]["to"].as_i64().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test]
async fn periods_on_the_wire_make_a_timeline_and_bad_ones_write_nothing() {
    let app = app().await;
    let put = |content: &str, extra: Value| {
        let mut body = json!({"dataset": "law", "source_key": "ruling", "content": content});
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        body
    };
    // J1 holds from 1 January 2020 (a correction reaching back), J2 from 1 March 2020 (given
    // in another offset, and as epoch microseconds the second time).
    let (status, j1) = app
        .put(
            &app.admin,
            put("J1", json!({"valid_from": "2020-01-01T00:00:00Z"})),
        )
        .await;
    assert_eq!(status, 202, "{j1}");
    let (status, j2) = app
        .put(
            &app.admin,
            put("J2", json!({"valid_from": "2020-03-01T01:00:00+01:00"})),
        )
        .await;
    assert_eq!(status, 202, "{j2}");
    let (status, timeline) = timeline_of(&app).await;
    assert_eq!(status, 200, "{timeline}");
    let j1_id = j1["source_revision_id"].as_str().expect("id").to_owned();
    let j2_id = j2["source_revision_id"].as_str().expect("id").to_owned();
    assert_eq!(
        believed(&timeline),
        vec![
            (j1_id.clone(), JAN_1_2020, MAR_1_2020),
            (j2_id.clone(), MAR_1_2020, OPEN)
        ]
    );
    assert_eq!(timeline["assertions"].as_array().map(Vec::len), Some(2));

    // `cairn timeline` prints the same, as people read it.
    let (base, server) = app.listen().await;
    let admin = app.admin.clone();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["timeline", "--dataset", "law", "--source-key", "ruling"])
            .env("CAIRN_SERVER", &base)
            .env("CAIRN_TOKEN", &admin)
            .output()
    })
    .await
    .expect("join")
    .expect("cairn timeline");
    server.abort();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{printed} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        printed.contains(&format!(
            "[2020-01-01T00:00:00.000000Z, 2020-03-01T00:00:00.000000Z)  {}",
            &j1_id.replace('-', "")[..8]
        )),
        "{printed}"
    );
    assert!(
        printed.contains(&format!(
            "[2020-03-01T00:00:00.000000Z, open)  {}",
            &j2_id.replace('-', "")[..8]
        )),
        "{printed}"
    );

    // Refusals: typed, and nothing written.
    let before = app.counts().await;
    let future = chrono_free_future();
    for (extra, code) in [
        (json!({"valid_from": "2020-03-01"}), "invalid_instant"),
        (
            json!({"valid_from": "2020-03-01T00:00:00"}),
            "invalid_instant",
        ),
        (json!({"valid_from": true}), "invalid_instant"),
        (json!({"valid_from": -5}), "invalid_instant"),
        (
            json!({"valid_from": MAR_1_2020, "valid_to": MAR_1_2020}),
            "empty_validity",
        ),
    ] {
        let result = app.put(&app.admin, put("J3", extra.clone())).await;
        assert_error(&result, 422, code);
    }
    // A source's first revision must hold now.
    let result = app
        .put(
            &app.admin,
            json!({"dataset": "law", "source_key": "fresh", "content": "later",
                   "valid_from": future}),
        )
        .await;
    assert_error(&result, 422, "validity_in_future");
    // A bounded period with nothing to hold after it.
    let result = app
        .put(
            &app.admin,
            json!({"dataset": "law", "source_key": "fresh", "content": "for a while",
                   "valid_from": JAN_1_2020, "valid_to": future}),
        )
        .await;
    assert_error(&result, 422, "validity_gap");
    assert_eq!(app.counts().await, before);

    // The head again, asserted further back: an assertion, no new revision.
    let (status, again) = app
        .put(&app.admin, put("J2", json!({"valid_from": JAN_1_2020})))
        .await;
    assert_eq!(status, 202, "{again}");
    assert_eq!(again["status"], "duplicate");
    assert_eq!(app.counts().await.revisions, before.revisions);
    let (_, timeline) = timeline_of(&app).await;
    assert_eq!(believed(&timeline), vec![(j2_id, JAN_1_2020, OPEN)]);

    // A deletion that reaches back: gone from 1 March 2020.
    let (status, tombstone) = app
        .call(
            "DELETE",
            &format!("/v1/sources?dataset=law&source_key=ruling&valid_from={MAR_1_2020}"),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(status, 202, "{tombstone}");
    let (_, timeline) = timeline_of(&app).await;
    let gone = tombstone["source_revision_id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(believed(&timeline)[1], (gone.clone(), MAR_1_2020, OPEN));
    assert_eq!(timeline["tombstones"], json!([gone]));
    // The dashboard's job view shows the source's validity.
    let job = tombstone["projection_job_id"].as_str().expect("job");
    let (status, detail) = app
        .call(
            "GET",
            &format!("/v1/ops/jobs/{job}"),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(status, 200, "{detail}");
    let held = &detail["source"]["timeline"]["held"];
    assert_eq!(held[1]["revision_id"], json!(gone));
    assert_eq!(held[1]["tombstone"], true);
    assert_eq!(held[1]["valid_from"], MAR_1_2020);
    assert!(held[1]["valid_to"].is_null());
    assert_eq!(
        detail["source"]["timeline"]["assertions"][0]["cause"], "deleted",
        "newest first"
    );
    let result = app
        .call(
            "DELETE",
            "/v1/sources?dataset=law&source_key=ruling&valid_from=yesterday",
            Some(&app.admin),
            None,
        )
        .await;
    assert_error(&result, 422, "invalid_instant");
    let result = app
        .call(
            "GET",
            "/v1/sources/timeline?dataset=law&source_key=nothing",
            Some(&app.admin),
            None,
        )
        .await;
    assert_error(&result, 404, "source_not_found");
}

/// An instant a day from now, as epoch microseconds.
fn chrono_free_future() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_micros() as i64)
        .unwrap_or_default();
    now + 86_400_000_000
}

/// `2020-02-15T00:00:00Z` and `2020-03-20T00:00:00Z`.
const FEB_15_2020: i64 = 1_581_724_800_000_000;
const MAR_20_2020: i64 = 1_584_662_400_000_000;

/// The case through a served cairn (embedded default: SQLite, qdrant-edge, the local
/// model), in every search mode: J1 holds from January, J2 (accepted later) from March.
/// Search finds J2 now, J1 at 15 February and J2 at 20 March as known now; as cairn knew it
/// between the two acceptances, J1, at 20 March too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_answers_as_it_held_and_as_it_was_known_in_every_mode() {
    let data = tempfile::tempdir().expect("tempdir");
    let (mut server, base) = crate::crash::start(data.path()).await;
    let token = crate::common::admin_token(data.path());
    let http = reqwest::Client::new();
    let put = |content: &str, valid_from: &str| {
        json!({"dataset": "law", "source_key": "ruling", "content": content,
               "valid_from": valid_from})
    };
    let j1 = crate::common::post_source(
        &http,
        &base,
        &token,
        &put(
            "The ruling: the speed limit on the coastal road is fifty kilometres per hour.",
            "2020-01-01T00:00:00Z",
        ),
    )
    .await;
    crate::projection::wait_for_job(&http, &base, &token, &j1, "completed").await;
    // Between the two acceptances: what cairn told people then.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let between = now_micros();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let j2 = crate::common::post_source(
        &http,
        &base,
        &token,
        &put(
            "The ruling: the speed limit on the coastal road is seventy kilometres per hour.",
            "2020-03-01T00:00:00Z",
        ),
    )
    .await;
    crate::projection::wait_for_job(&http, &base, &token, &j2, "completed").await;
    // An as_of must have settled (5 s): refused until then, typed.
    let search = |mode: &'static str, at: Value| {
        search_law(
            &http,
            &base,
            &token,
            "speed limit on the coastal road",
            mode,
            at,
        )
    };
    let (status, refused) = search("lexical", json!({"as_of": between})).await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["code"], "as_of_unsettled", "{refused}");
    let (status, refused) = search("lexical", json!({"valid_at": "2020-02-15"})).await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["code"], "invalid_instant", "{refused}");
    tokio::time::sleep(std::time::Duration::from_millis(5_200)).await;
    for mode in ["lexical", "vector", "auto"] {
        let open = Value::Null;
        let cases = [
            (json!({}), &j2, (json!(MAR_1_2020), open.clone()), "now"),
            (
                json!({"valid_at": FEB_15_2020}),
                &j1,
                (json!(JAN_1_2020), json!(MAR_1_2020)),
                "15 February",
            ),
            (
                json!({"valid_at": "2020-03-20T00:00:00Z"}),
                &j2,
                (json!(MAR_1_2020), open.clone()),
                "20 March",
            ),
            (
                json!({"as_of": between}),
                &j1,
                (json!(JAN_1_2020), open.clone()),
                "as known between the acceptances",
            ),
            (
                json!({"valid_at": MAR_20_2020, "as_of": between}),
                &j1,
                (json!(JAN_1_2020), open.clone()),
                "20 March as known between the acceptances",
            ),
        ];
        for (at, expected, (from, to), case) in cases {
            let (status, answer) = search(mode, at.clone()).await;
            assert_eq!(status, 200, "{mode} {case}: {answer}");
            assert_eq!(
                revisions(&answer),
                vec![expected.clone()],
                "{mode} {case}: {answer}"
            );
            // Each hit carries its period, as believed at the point searched.
            let hit = &answer["results"][0];
            assert_eq!(
                (&hit["valid_from"], &hit["valid_to"]),
                (&from, &to),
                "{mode} {case}: {answer}"
            );
            let temporal = at.as_object().is_some_and(|at| !at.is_empty());
            assert_eq!(
                answer["valid_at"].as_i64().is_some(),
                temporal,
                "{mode} {case}: the answer echoes its point in time"
            );
            // Every revision was projected: a temporal answer's history is complete.
            assert_eq!(
                answer.get("history_partial"),
                temporal.then_some(&json!(false)),
                "{mode} {case}: {answer}"
            );
        }
        // Before J1 held: nothing (an answer, not an error read as empty).
        let (status, answer) = search(mode, json!({"valid_at": "2019-06-01T00:00:00Z"})).await;
        assert_eq!(status, 200, "{mode}: before J1: {answer}");
        assert!(answer["results"].is_array(), "{mode}: before J1: {answer}");
        assert_eq!(
            revisions(&answer),
            Vec::<String>::new(),
            "{mode}: before J1"
        );
    }
    // A correction that held only in the past is history: found by its passages, and the
    // vector answer says that its history is partial instead of silently missing it.
    let response = http
        .post(format!("{base}/v1/sources"))
        .bearer_auth(&token)
        .json(&json!({"dataset": "law", "source_key": "ruling",
                      "content": "The ruling: the speed limit on the coastal road was sixty kilometres per hour.",
                      "valid_from": "2019-06-01T00:00:00Z", "valid_to": "2019-09-01T00:00:00Z"}))
        .send()
        .await
        .expect("put");
    assert_eq!(response.status().as_u16(), 202);
    let correction: Value = response.json().await.expect("json");
    let (_, answer) = search("lexical", json!({"valid_at": "2019-07-01T00:00:00Z"})).await;
    assert_eq!(
        revisions(&answer),
        vec![correction["source_revision_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned()],
        "{answer}"
    );
    assert_eq!(answer["history_partial"], false, "{answer}");
    let (_, answer) = search("vector", json!({"valid_at": "2019-07-01T00:00:00Z"})).await;
    assert_eq!(revisions(&answer), Vec::<String>::new(), "{answer}");
    assert_eq!(answer["history_partial"], true, "{answer}");
    assert_eq!(answer["history_gaps"], json!(["vector"]), "{answer}");
    server.kill().await.expect("stop");
}

/// Now, in epoch microseconds.
fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_micros() as i64)
        .unwrap_or_default()
}

/// A revision valid from a few seconds ahead, through a served cairn (embedded default): it
/// is accepted at once, and the default search goes on returning the revision before it in
/// every mode, while a lexical search at a later `valid_at` finds it. At the boundary its job
/// moves the head and projects it: the default search then returns it in every mode, the
/// vector store's current flag included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_revision_takes_over_at_its_boundary_in_every_mode() {
    let data = tempfile::tempdir().expect("tempdir");
    let (mut server, base) = crate::crash::start(data.path()).await;
    let token = crate::common::admin_token(data.path());
    let http = reqwest::Client::new();
    let j1 = crate::common::post_source(
        &http,
        &base,
        &token,
        &json!({"dataset": "law", "source_key": "ruling",
                "content": "The ruling: the ferry to the island leaves every hour from pier one."}),
    )
    .await;
    crate::projection::wait_for_job(&http, &base, &token, &j1, "completed").await;
    let boundary = now_micros() + 6_000_000;
    let response = http
        .post(format!("{base}/v1/sources"))
        .bearer_auth(&token)
        .json(&json!({"dataset": "law", "source_key": "ruling", "valid_from": boundary,
                      "content": "The ruling: the ferry to the island leaves every half hour from pier two."}))
        .send()
        .await
        .expect("put");
    assert_eq!(response.status().as_u16(), 202);
    let j2: Value = response.json().await.expect("json");
    let j1_id = j1.clone();
    let j2_id = j2["source_revision_id"].as_str().expect("id").to_owned();
    let search = |mode: &'static str, at: Value| {
        let answer = search_law(
            &http,
            &base,
            &token,
            "when does the ferry to the island leave",
            mode,
            at,
        );
        async move {
            let (status, answer) = answer.await;
            assert_eq!(status, 200, "{answer}");
            revisions(&answer)
        }
    };
    for mode in ["lexical", "vector", "auto"] {
        assert_eq!(
            search(mode, json!({})).await,
            vec![j1_id.clone()],
            "{mode}: before the boundary"
        );
    }
    assert_eq!(
        search("lexical", json!({"valid_at": boundary + 1_000_000})).await,
        vec![j2_id.clone()],
        "lexical at a valid time after the boundary"
    );
    let detail = crate::projection::revision(&http, &base, &token, &j2_id).await;
    assert_eq!(detail["job"]["state"], "pending", "{detail}");
    assert_eq!(detail["job"]["run_at"], json!(boundary), "{detail}");
    crate::projection::wait_for_job(&http, &base, &token, &j2_id, "completed").await;
    assert!(now_micros() >= boundary, "the job ran before its boundary");
    for mode in ["lexical", "vector", "auto"] {
        assert_eq!(
            search(mode, json!({})).await,
            vec![j2_id.clone()],
            "{mode}: after the boundary"
        );
    }
    let response = http
        .get(format!("{base}/v1/sources?dataset=law&source_key=ruling"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("source");
    let view: Value = response.json().await.expect("json");
    assert_eq!(view["head"]["id"], json!(j2_id), "{view}");
    assert_eq!(
        view["head_history"][0]["cause"], "validity_boundary",
        "{view}"
    );
    server.kill().await.expect("stop");
}

/// `POST /v1/search` in dataset `law` (five results), with the point in time `at` adds:
/// status and body.
fn search_law(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    query: &str,
    mode: &str,
    at: Value,
) -> impl std::future::Future<Output = (u16, Value)> {
    let mut body = json!({"query": query, "mode": mode, "datasets": ["law"], "top_k": 5});
    if let (Some(body), Some(at)) = (body.as_object_mut(), at.as_object()) {
        body.extend(at.clone());
    }
    let request = http
        .post(format!("{base}/v1/search"))
        .bearer_auth(token)
        .json(&body);
    async move {
        let response = request.send().await.expect("search");
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.expect("json"))
    }
}

/// The revisions of an answer's results, in order.
fn revisions(answer: &Value) -> Vec<String> {
    answer["results"]
        .as_array()
        .map(|results| {
            results
                .iter()
                .map(|hit| {
                    hit["source_revision_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect()
        })
        .unwrap_or_default()
}
