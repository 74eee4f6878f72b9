//! `cairn eval beir` on a slice of SciFact with churn: after superseding 20% of the documents
//! with changed text and deleting 10%, no result in any mode points at a superseded or deleted
//! revision, both before projection catches up (claims paused: only the binding protects the
//! answers) and after, and the scores of queries whose documents were untouched do not drop.

use std::path::PathBuf;

use cairn::config::{Config, Overrides};

/// The default configuration, with the model files `scripts/setup-model` installed.
fn config() -> Config {
    let models = std::env::var("CAIRN_MODELS_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/models").to_owned());
    let env = [("CAIRN_MODELS_DIR".to_owned(), models)].into();
    Config::load(&Overrides::default(), &env).expect("config")
}

/// The slice of SciFact the tests evaluate on.
fn scifact_200() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/scifact-200"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_never_surfaces_retired_revisions_and_keeps_scores() {
    let config = config();
    let report = cairn::eval::beir(
        &config,
        cairn::eval::BeirEval {
            directory: scifact_200(),
            split: "train".to_owned(),
            limit_docs: 0,
            churn: true,
            budget_ms: 10_000,
            modes: vec!["vector".to_owned(), "lexical".to_owned(), "auto".to_owned()],
            data_dir: None,
            models: Vec::new(),
        },
    )
    .await
    .expect("eval");
    assert_eq!(report["documents"], 200);
    assert_eq!(report["queries"], 22);
    for mode in ["vector", "lexical", "auto"] {
        let ndcg = report[mode]["ndcg_at_10"].as_f64().expect("ndcg");
        assert!(ndcg > 0.5, "{mode}: nDCG@10 {ndcg} on an easy slice");
        assert_eq!(report[mode]["degraded"], 0, "{report}");
    }
    let churn = &report["churn"];
    assert!(
        churn["superseded"].as_u64().expect("superseded") >= 20,
        "{churn}"
    );
    assert!(churn["deleted"].as_u64().expect("deleted") >= 10, "{churn}");
    assert_eq!(churn["results_pointing_at_retired_revisions"], 0, "{churn}");
    // Before projection caught up (claims paused), the vector store still held the retired
    // revisions as current: the binding dropped them, and none reached an answer.
    let unprojected = &churn["before_projection_vector"];
    assert_eq!(
        unprojected["results_pointing_at_retired_revisions"], 0,
        "{churn}"
    );
    assert!(
        unprojected["stale_dropped"]
            .as_u64()
            .expect("stale_dropped")
            > 0,
        "{churn}"
    );
    assert!(
        churn["untouched_queries"].as_u64().expect("untouched") >= 5,
        "{churn}"
    );
    for mode in ["vector", "lexical", "auto"] {
        let before = churn[mode]["ndcg_at_10_before"].as_f64().expect("before");
        let after = churn[mode]["ndcg_at_10_after"].as_f64().expect("after");
        assert!(
            after >= before - 1e-9,
            "{mode}: nDCG@10 of untouched queries dropped {before} -> {after}"
        );
        assert!(churn[mode]["results_checked"].as_u64().expect("checked") > 100);
    }
}

/// `--models`: the default model is projected, int8 is built as a second generation beside
/// it through the API, switched to and evaluated; both generations' scores are reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_models_generation_is_built_switched_to_and_scored() {
    let config = config();
    let int8 = gateways::embedder::MINILM_INT8.id;
    let report = cairn::eval::beir(
        &config,
        cairn::eval::BeirEval {
            directory: scifact_200(),
            split: "train".to_owned(),
            limit_docs: 0,
            churn: false,
            budget_ms: 10_000,
            modes: vec!["vector".to_owned()],
            data_dir: None,
            models: vec![gateways::embedder::MODEL_ID.to_owned(), int8.to_owned()],
        },
    )
    .await
    .expect("eval");
    let generations = report["generations"].as_array().expect("generations");
    assert_eq!(generations.len(), 2, "{report}");
    assert_eq!(generations[0]["model"], gateways::embedder::MODEL_ID);
    assert_eq!(generations[1]["model"], int8);
    assert_ne!(generations[0]["generation"], generations[1]["generation"]);
    for generation in generations {
        let ndcg = generation["vector"]["ndcg_at_10"].as_f64().expect("ndcg");
        assert!(ndcg > 0.5, "{generation}");
        assert_eq!(generation["vector"]["degraded"], 0, "{generation}");
    }
    // The first generation's scores are the report's own.
    assert_eq!(generations[0]["vector"], report["vector"]);
}
