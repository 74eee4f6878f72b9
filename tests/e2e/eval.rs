//! `cairn eval beir` on a slice of SciFact with churn: after superseding 20% of the documents
//! with changed text and deleting 10%, no result in any mode points at a superseded or deleted
//! revision, both before projection catches up (claims paused: only the binding protects the
//! answers) and after, and the scores of queries whose documents were untouched do not drop.

use std::path::PathBuf;

use cairn::config::{Config, Overrides};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_never_surfaces_retired_revisions_and_keeps_scores() {
    let models = std::env::var("CAIRN_MODELS_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/models").to_owned());
    let env = [("CAIRN_MODELS_DIR".to_owned(), models)].into();
    let config = Config::load(&Overrides::default(), &env).expect("config");
    let report = cairn::eval::beir(
        &config,
        cairn::eval::BeirEval {
            directory: PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/data/scifact-200"
            )),
            split: "train".to_owned(),
            limit_docs: 0,
            churn: true,
            budget_ms: 10_000,
            modes: vec!["vector".to_owned(), "lexical".to_owned(), "auto".to_owned()],
            data_dir: None,
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
