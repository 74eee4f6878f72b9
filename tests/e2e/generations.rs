//! Generation changes end to end: a chunker-settings change on the embedded default (SQLite,
//! qdrant-edge, the real model), and a model change (fp32 to int8) on PostgreSQL and a Qdrant
//! server. `cairn generation create` builds a second generation beside the active one while
//! documents keep arriving and searches keep running; it is switched in one step, rolled back,
//! switched again, and the first one retired (its vectors deleted and read back as gone).
//! Throughout, no search returns a superseded or deleted revision, and no search mixes the two
//! generations' chunks; each generation's queries are embedded with its own model.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::Mutex;

use crate::crash::start;

/// A document of about 150 words: one chunk under the default settings (up to 254 tokens),
/// several under 40 tokens.
fn document(key: usize, version: usize) -> String {
    let topics = [
        "volcanic basalt cools into hexagonal columns along the northern coast",
        "migrating cranes rest in the wetlands before crossing the mountains",
        "a copper kettle whistles while bread rises beside the warm stove",
        "glaciers carve deep valleys and leave polished granite behind them",
        "the violinist tunes her instrument before the evening concert starts",
    ];
    let topic = topics[key % topics.len()];
    let mut text = format!("Document {key} version {version}. ");
    for sentence in 0..5 {
        text.push_str(&format!(
            "In part {sentence} of record {key}, {topic}, and the observers write careful notes \
             about what they saw that day. "
        ));
    }
    text
}

/// What the test wrote: the current revision of each key (`None`: deleted), and every
/// revision ever accepted with its full text.
#[derive(Default)]
struct Written {
    heads: HashMap<String, Option<String>>,
    texts: HashMap<String, String>,
}

async fn put(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    written: &Mutex<Written>,
    key: &str,
    text: &str,
) -> String {
    // The lock is held across the request, so a search that starts after it is released
    // knows every head a receipt was issued for.
    let mut written = written.lock().await;
    let receipt: Value = http
        .post(format!("{base}/v1/sources"))
        .bearer_auth(token)
        .json(&json!({ "dataset": "docs", "source_key": key, "content": text }))
        .send()
        .await
        .expect("POST")
        .json()
        .await
        .expect("receipt");
    let id = receipt["source_revision_id"]
        .as_str()
        .expect("revision id")
        .to_owned();
    written.heads.insert(key.to_owned(), Some(id.clone()));
    written.texts.insert(id.clone(), text.to_owned());
    id
}

async fn delete(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    written: &Mutex<Written>,
    key: &str,
) {
    let mut written = written.lock().await;
    let status = http
        .delete(format!("{base}/v1/sources?dataset=docs&source_key={key}"))
        .bearer_auth(token)
        .send()
        .await
        .expect("DELETE")
        .status();
    assert!(status.is_success(), "delete {key}: {status}");
    written.heads.insert(key.to_owned(), None);
}

/// Searches in every mode and checks each answer: every result is its source's current
/// revision as of the moment the search started, and every vector chunk was cut by the
/// generation the answer names (`whole`: the one generation that keeps each document whole,
/// while the other cuts it into pieces; `None`: every generation keeps them whole). Returns
/// the generations that answered.
async fn search_and_check(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    written: &Mutex<Written>,
    whole: Option<&str>,
) -> Vec<String> {
    let mut answered = Vec::new();
    for mode in ["vector", "lexical", "auto"] {
        let (heads, texts) = {
            let written = written.lock().await;
            (written.heads.clone(), written.texts.clone())
        };
        let answer: Value = http
            .post(format!("{base}/v1/search"))
            .bearer_auth(token)
            .json(&json!({
                "query": "observers write notes about basalt columns and cranes",
                "mode": mode, "top_k": 10, "datasets": ["docs"], "budget_ms": 5000,
            }))
            .send()
            .await
            .expect("search")
            .json()
            .await
            .expect("search json");
        let results = answer["results"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"));
        let generation = answer["generation"].as_str().unwrap_or("").to_owned();
        for result in results {
            let key = result["source_key"].as_str().expect("key");
            let revision = result["source_revision_id"].as_str().expect("revision");
            let head = heads.get(key).cloned().flatten();
            // A revision accepted after the snapshot may already be head: then the snapshot's
            // head must be older, never newer than what came back.
            let newer = !texts.contains_key(revision);
            assert!(
                head.as_deref() == Some(revision) || newer,
                "{mode}: {key} came back as {revision}, but its head is {head:?}: {answer}"
            );
            if let (Some(_), Some(text)) = (result["chunk_index"].as_u64(), texts.get(revision)) {
                let chunk = result["text"].as_str().expect("text");
                let is_whole = chunk.trim() == text.trim();
                assert_eq!(
                    is_whole,
                    whole.is_none_or(|whole| whole == generation),
                    "{mode}: a chunk of the other generation in an answer from {generation}: {answer}"
                );
            }
        }
        answered.push(generation);
    }
    answered
}

async fn wait_built(data: &Path, base: &str, id: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let status = crate::common::cairn_json(data, base, &["generation", "status"]);
        let generation = status["generations"]
            .as_array()
            .expect("generations")
            .iter()
            .find(|generation| generation["id"] == id)
            .cloned()
            .expect("the generation is listed");
        let progress = &generation["progress"];
        assert_eq!(progress["failed"], 0, "{generation}");
        if progress["heads"] == progress["verified"] && progress["open_jobs"] == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not built in time: {generation}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Switches to `id` as soon as every current head is verified in it (documents keep arriving,
/// so a switch may be refused as incomplete for a moment; never for another reason).
async fn switch_when_complete(data: &Path, base: &str, id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["generation", "switch", id, "--reason", "test", "--json"])
            .args(["--server", base, "--data-dir"])
            .arg(data)
            .output()
            .expect("switch");
        if output.status.success() {
            return serde_json::from_slice::<Value>(&output.stdout).expect("json");
        }
        let message = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(message.contains("generation_incomplete"), "{message}");
        assert!(tokio::time::Instant::now() < deadline, "{message}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Searches for the exact text of the one-chunk `probe` document in vector mode and checks that
/// the query was embedded with `model`: the score search answers is the cosine between the
/// stored vector (read from the Qdrant server) and `model`'s embedding of the text alone, not
/// the other model's. (int8 vectors depend on their batch, so an exact-text query does not
/// score 1 against them: the comparison is with what each model gives.)
async fn check_query_model(
    probe: (&str, &str),
    server: (&reqwest::Client, &str, &str),
    qdrant_http: u16,
    generation: &str,
    model: &'static gateways::embedder::LocalModel,
) {
    use gateways::embedder::{Embedder, LocalEmbedder, ModelFiles, MINILM, MINILM_INT8};
    let ((text, revision), (http, base, token)) = (probe, server);
    let score = exact_text_score(http, base, token, text).await;
    let point = gateways::vectors::point_id(revision.parse().expect("uuid"), 0);
    let stored: Value = http
        .get(format!(
            "http://127.0.0.1:{qdrant_http}/collections/cairn-{generation}/points/{point}"
        ))
        .send()
        .await
        .expect("qdrant")
        .json()
        .await
        .expect("point");
    let stored: Vec<f32> = serde_json::from_value(stored["result"]["vector"].clone())
        .unwrap_or_else(|_| panic!("no vector: {stored}"));
    let models_dir = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/models"));
    let cosine_with = |vector: &[f32]| -> f64 {
        let dot: f32 = vector.iter().zip(&stored).map(|(a, b)| a * b).sum();
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        f64::from(dot / (norm(vector) * norm(&stored)))
    };
    let mut expected = Vec::new();
    for candidate in [&MINILM, &MINILM_INT8] {
        let files = ModelFiles::locate_model(&models_dir, candidate).expect("models");
        let embedder = LocalEmbedder::load(&files, 1, Some(1)).expect("load");
        let alone = embedder.embed(vec![text.to_owned()]).await.expect("embed");
        expected.push((candidate.id, cosine_with(&alone[0])));
    }
    // The model whose query gives the score searched with: the closest of the two, and close.
    // (The two can land within 1e-4 of each other for one text, since int8 vectors depend on
    // their batch; the closest still tells them apart, the query's own cosine being exact.)
    let (closest, cosine) = expected
        .iter()
        .copied()
        .min_by(|a, b| (score - a.1).abs().total_cmp(&(score - b.1).abs()))
        .expect("two candidates");
    assert!(
        closest == model.id && (score - cosine).abs() < 1e-4,
        "search scored {score}; the queries would score {expected:?} (generation {generation}, \
         expected {})",
        model.id
    );
}

/// The top vector hit's score for `text`.
async fn exact_text_score(http: &reqwest::Client, base: &str, token: &str, text: &str) -> f64 {
    let answer: Value = http
        .post(format!("{base}/v1/search"))
        .bearer_auth(token)
        .json(&json!({
            "query": text, "mode": "vector", "top_k": 1, "datasets": ["docs"], "budget_ms": 5000,
        }))
        .send()
        .await
        .expect("search")
        .json()
        .await
        .expect("search json");
    answer["results"][0]["score"]
        .as_f64()
        .unwrap_or_else(|| panic!("{answer}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunker_change_is_built_beside_switched_rolled_back_and_retired_while_serving() {
    let data = tempfile::tempdir().expect("tempdir");
    let (server, base) = start(data.path()).await;
    let change = [
        "--max-tokens",
        "40",
        "--overlap-tokens",
        "8",
        "--reason",
        "smaller chunks",
    ];
    change_while_serving(data.path(), server, &base, &change, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_change_to_int8_is_built_beside_switched_rolled_back_and_retired_on_postgres_and_a_qdrant_server(
) {
    let postgres = testkit::postgres::PostgresServer::start().expect("start PostgreSQL");
    let ledger = postgres.create_database("ledger").expect("database");
    let qdrant = testkit::qdrant::QdrantServer::start().expect("start Qdrant");
    let data = tempfile::tempdir().expect("tempdir");
    let (server, base) = crate::crash::spawn_serve_with(
        data.path(),
        &["--ledger", &ledger, "--vectors", &qdrant.grpc_url()],
        &[],
        "warn",
        std::process::Stdio::inherit(),
    )
    .await;
    let int8 = gateways::embedder::MINILM_INT8.id;
    let change = ["--model", int8, "--reason", "int8 is faster"];
    let model = (&gateways::embedder::MINILM_INT8, qdrant.http_port());
    change_while_serving(data.path(), server, &base, &change, Some(model)).await;
}

/// Builds the generation `create` describes beside the active one while traffic runs, then
/// switches, rolls back, switches again and retires the first. `model`: the new generation's
/// model and the Qdrant server's REST port, when the change is one (its documents stay whole,
/// and its queries must be embedded with it).
async fn change_while_serving(
    data: &Path,
    mut server: tokio::process::Child,
    base: &str,
    create: &[&str],
    model: Option<(&'static gateways::embedder::LocalModel, u16)>,
) {
    let base = base.to_owned();
    let token = crate::common::admin_token(data);
    let http = reqwest::Client::new();
    let written = Arc::new(Mutex::new(Written::default()));
    for key in 0..24 {
        put(
            &http,
            &base,
            &token,
            &written,
            &format!("doc-{key}"),
            &document(key, 0),
        )
        .await;
    }
    // A source the traffic never writes: its exact text is the query that tells which model
    // embedded a search's query.
    let probe = document(99, 0);
    let probe_revision = put(&http, &base, &token, &written, "probe", &probe).await;
    let before = crate::common::cairn_json(data, &base, &["generation", "status"]);
    let first = before["generations"][0]["id"]
        .as_str()
        .expect("the active generation")
        .to_owned();
    assert_eq!(before["generations"][0]["state"], "active");
    wait_built(data, &base, &first).await;
    // A chunker change cuts documents into pieces in the new generation only.
    let whole: Option<String> = model.is_none().then(|| first.clone());

    // Ingest keeps going (new revisions, deletions, a revert) and searches keep checking.
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(Mutex::new(Vec::new()));
    let traffic = {
        let (http, base, token, written, stop, answered, whole) = (
            http.clone(),
            base.clone(),
            token.clone(),
            written.clone(),
            stop.clone(),
            answered.clone(),
            whole.clone(),
        );
        tokio::spawn(async move {
            let mut round = 1;
            while !stop.load(Ordering::SeqCst) {
                let key = round % 24;
                match round % 5 {
                    0 => delete(&http, &base, &token, &written, &format!("doc-{key}")).await,
                    _ => {
                        put(
                            &http,
                            &base,
                            &token,
                            &written,
                            &format!("doc-{key}"),
                            &document(key, round),
                        )
                        .await;
                    }
                }
                let generations =
                    search_and_check(&http, &base, &token, &written, whole.as_deref()).await;
                answered.lock().await.extend(generations);
                round += 1;
                // One revision per 400 ms at least: every revision queues a job per live
                // generation and supersedes the source's open ones, and claims go oldest
                // first, so traffic faster than projection supersedes every job before it
                // ends and nothing is ever verified. At 100 ms a full test run on 2 loaded
                // cores once left the building generation at 0 of 19 heads after 180 s.
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
        })
    };

    let mut arguments = vec!["generation", "create"];
    arguments.extend_from_slice(create);
    let created = crate::common::cairn_json(data, &base, &arguments);
    let second = created["generation"]["id"]
        .as_str()
        .expect("new generation")
        .to_owned();
    assert_ne!(second, first);
    assert_eq!(created["generation"]["state"], "building");
    assert!(created["change"]["jobs"].as_i64().expect("jobs") >= 20);
    // Not built yet: a switch is refused and says what is missing.
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "generation",
            "switch",
            &second,
            "--server",
            &base,
            "--data-dir",
        ])
        .arg(data)
        .output()
        .expect("switch");
    if !refused.status.success() {
        let message = String::from_utf8_lossy(&refused.stderr);
        assert!(message.contains("generation_incomplete"), "{message}");
    }
    wait_built(data, &base, &second).await;
    // Built while ingest continues: the switch succeeds once nothing is missing.
    let switched = switch_when_complete(data, &base, &second).await;
    assert_eq!(switched["change"]["previous"], first.as_str());
    if let Some((model, qdrant_http)) = model {
        assert_eq!(switched["generation"]["model"], model.id, "{switched}");
        // Each generation's queries are embedded with its own model.
        let probe = (probe.as_str(), probe_revision.as_str());
        check_query_model(probe, (&http, &base, &token), qdrant_http, &second, model).await;
    }
    // The next searches answer from the new generation (checked chunk by chunk).
    let after: Vec<String> =
        search_and_check(&http, &base, &token, &written, whole.as_deref()).await;
    assert!(
        after.iter().all(|generation| *generation == second),
        "{after:?}"
    );

    // Rollback, then forward again: each one step; the first generation kept up meanwhile.
    let back = switch_when_complete(data, &base, &first).await;
    assert_eq!(back["generation"]["state"], "active");
    assert_eq!(back["change"]["previous"], second.as_str());
    let rolled: Vec<String> =
        search_and_check(&http, &base, &token, &written, whole.as_deref()).await;
    assert!(
        rolled.iter().all(|generation| *generation == first),
        "{rolled:?}"
    );
    if let Some((_, qdrant_http)) = model {
        // And back to the first model's queries with the first generation.
        let probe = (probe.as_str(), probe_revision.as_str());
        let fp32 = &gateways::embedder::MINILM;
        check_query_model(probe, (&http, &base, &token), qdrant_http, &first, fp32).await;
    }
    switch_when_complete(data, &base, &second).await;

    // Retire the first: its shard directory (or collection) is deleted and read back as gone.
    let shard = data.join("vectors").join(&first);
    let embedded = model.is_none();
    assert_eq!(shard.is_dir(), embedded);
    let retired = crate::common::cairn_json(
        data,
        &base,
        &["generation", "retire", &first, "--reason", "done"],
    );
    assert_eq!(retired["generation"]["state"], "retired");
    let evidence = &retired["generation"]["retired_evidence"];
    if embedded {
        assert_eq!(evidence["vectors"]["directory_exists"], false, "{retired}");
        assert!(evidence["vectors"]["bytes_freed"].as_u64().expect("bytes") > 0);
    } else {
        assert_eq!(evidence["vectors"]["collection_exists"], false, "{retired}");
        assert!(
            evidence["vectors"]["points_deleted"]
                .as_u64()
                .expect("points")
                >= 24
        );
    }
    assert!(evidence["chunk_rows_deleted"].as_i64().expect("rows") >= 24);
    assert_eq!(evidence["chunk_rows"], 0);
    assert!(!shard.exists(), "the retired shard is still on disk");

    // A revert in the new generation reuses its vectors instead of embedding them again. It
    // is made on a source the traffic never writes, so no later revision supersedes it.
    let vector_receipt = |id: String| {
        let (http, base, token) = (http.clone(), base.clone(), token.clone());
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                let detail = crate::projection::revision(&http, &base, &token, &id).await;
                if detail["job"]["state"] == "completed" {
                    break detail["receipts"]
                        .as_array()
                        .expect("receipts")
                        .iter()
                        .find(|receipt| receipt["backend"] == "vector")
                        .cloned()
                        .expect("vector receipt");
                }
                assert!(tokio::time::Instant::now() < deadline, "{detail}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    for version in [0, 1] {
        let id = put(
            &http,
            &base,
            &token,
            &written,
            "pinned",
            &document(3, version),
        )
        .await;
        vector_receipt(id).await;
    }
    let reverted = put(&http, &base, &token, &written, "pinned", &document(3, 0)).await;
    let vector = vector_receipt(reverted).await;
    assert_eq!(vector["evidence"]["generation"], second.as_str());
    if let Some((model, _)) = model {
        assert_eq!(vector["evidence"]["model"], model.id, "{vector}");
    }
    // Nothing is embedded again: either the reverted revision's own points are still there
    // (the new generation built it before the traffic changed it: `reconciled`), or only the
    // chunk naming the version differs from what the new generation already holds.
    let evidence = &vector["evidence"];
    let (embedded, reused) = (
        evidence["embedded"].as_u64().expect("embedded"),
        evidence["reused"].as_u64().expect("reused"),
    );
    if evidence["reconciled"] == true {
        assert_eq!(embedded, 0, "{vector}");
    } else {
        assert_eq!(
            embedded + reused,
            evidence["points"].as_u64().expect("points")
        );
        assert!(embedded <= 1, "{vector}");
    }

    // The metrics name each generation's state and coverage.
    let metrics = crate::common::scrape(&base, &token).await;
    let state = |id: &str, state: &str| {
        crate::common::metric(
            &metrics,
            "cairn_generation_state",
            &[("generation", id), ("state", state)],
        )
    };
    assert_eq!(state(&second, "active"), 1.0);
    assert_eq!(state(&second, "building"), 0.0);
    assert_eq!(state(&first, "retired"), 1.0);
    assert!(
        crate::common::metric(
            &metrics,
            "cairn_generation_verified_heads",
            &[("generation", &second)]
        ) > 0.0
    );

    // The traffic saw both generations answer (it keeps running until it has seen the new one).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !answered.lock().await.contains(&second) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the traffic never saw the new generation answer"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    traffic.await.expect("traffic");
    let answered = answered.lock().await;
    assert!(answered.contains(&first));
    assert!(answered.contains(&second));
    let last: Vec<String> =
        search_and_check(&http, &base, &token, &written, whole.as_deref()).await;
    assert!(last.iter().all(|generation| *generation == second));
    server.kill().await.expect("stop");
}

/// Retiring deletes a generation's vectors on either store and reads back that they are gone:
/// the shard directory (embedded) or the collection (a real Qdrant server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retiring_deletes_the_shard_or_the_collection_and_reads_it_back() {
    let qdrant = testkit::qdrant::QdrantServer::start().expect("start Qdrant");
    let data = tempfile::tempdir().expect("tempdir");
    for server in [None, Some(qdrant.grpc_url())] {
        let overrides = cairn::config::Overrides {
            data_dir: Some(data.path().to_path_buf()),
            vectors_url: server.clone(),
            ..cairn::config::Overrides::default()
        };
        let config = cairn::config::Config::load(&overrides, &HashMap::new()).expect("config");
        let stores = cairn::projection::GenerationStores::new(&config, None);
        let id = "g-retire-me";
        let store = stores.get(id).await.expect("open");
        let revision = uuid::Uuid::now_v7();
        let mut vector = vec![0.0; gateways::embedder::MODEL_DIMENSION];
        vector[0] = 1.0;
        store
            .upsert(vec![gateways::VectorPoint {
                dataset: "docs".to_owned(),
                source_key: "a".to_owned(),
                revision_id: revision,
                chunk_index: 0,
                head_at: 1,
                vector,
                facts: None,
            }])
            .await
            .expect("upsert");
        let evidence = stores.delete(id).await.expect("delete");
        match &server {
            None => {
                assert_eq!(evidence["directory_exists"], false, "{evidence}");
                assert!(evidence["bytes_freed"].as_u64().expect("bytes") > 0);
                assert!(!data.path().join("vectors").join(id).exists());
                // A handle kept from before answers `unavailable`, never stale data.
                assert!(store.revision_points(revision).await.is_err());
            }
            Some(_) => {
                assert_eq!(evidence["collection_exists"], false, "{evidence}");
                assert_eq!(evidence["points_deleted"], 1);
            }
        }
        // Opening it again starts empty.
        let again = stores.get(id).await.expect("reopen");
        assert_eq!(
            again.revision_points(revision).await.expect("read").count,
            0
        );
        stores.delete(id).await.expect("clean up");
    }
}
