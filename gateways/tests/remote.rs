//! The embedding models beyond the default: the int8 model, and the remote embedder against a
//! real OpenAI-compatible server (llama.cpp's, `scripts/setup-embedding-server`) serving the
//! same weights. Faults the real server does not produce on demand (429s, malformed answers)
//! come from `FaultyEmbeddingProxy`, a fault injector in front of it.

use std::path::PathBuf;
use std::time::Duration;

use gateways::embedder::{
    local_model, remote_model_id, CatalogOptions, EmbedRole, Embedder, Embedders, LocalEmbedder,
    ModelCatalog, ModelFiles, RemoteEmbedder, RemoteOptions, MINILM, MINILM_INT8,
};
use gateways::GatewayError;
use testkit::embedding::{EmbeddingServer, Fault, FaultyEmbeddingProxy, SERVED_MODEL};

fn models_dir() -> PathBuf {
    std::env::var_os("CAIRN_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")))
}

fn texts() -> Vec<String> {
    [
        "The cat sits on the mat.",
        "Receipts are written before any projection runs.",
        "A lease with a fencing token keeps a stale worker from writing.",
        "Quantum chromodynamics describes the strong interaction between quarks and gluons.",
        "naïve café façade — ünïcödé text, with punctuation!",
        "x",
        "A longer passage: the projection worker reads the revision's bytes back, cuts them into \
         chunks with the model's own tokenizer, embeds every chunk, writes the points and reads \
         them back before it records a verified receipt for the vector backend.",
    ]
    .iter()
    .map(|text| (*text).to_owned())
    .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

fn options(url: String) -> RemoteOptions {
    RemoteOptions {
        url,
        model: SERVED_MODEL.to_owned(),
        dimension: 384,
        key: None,
        batch: 3,
        timeout: Duration::from_secs(20),
    }
}

async fn local(model: &'static gateways::embedder::LocalModel) -> Vec<Vec<f32>> {
    let files = ModelFiles::locate_model(&models_dir(), model).expect("setup-model ran");
    let embedder = LocalEmbedder::load(&files, 1, Some(1)).expect("load");
    assert_eq!(embedder.model_id(), model.id);
    embedder.embed(texts()).await.expect("embed")
}

#[tokio::test]
async fn the_int8_model_is_its_own_model_close_to_fp32() {
    let fp32 = local(&MINILM).await;
    let int8 = local(&MINILM_INT8).await;
    assert_ne!(MINILM.id, MINILM_INT8.id);
    assert_eq!(local_model(MINILM_INT8.id), Some(&MINILM_INT8));
    let mut worst = 1.0_f32;
    let mut identical = 0;
    for (a, b) in fp32.iter().zip(&int8) {
        let similarity = cosine(a, b);
        worst = worst.min(similarity);
        if a == b {
            identical += 1;
        }
        let norm: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!(
            (norm - 1.0).abs() < 1e-3,
            "int8 vectors are unit length: {norm}"
        );
    }
    // Close (measured: about 0.995), but not the same model: no vector is identical.
    assert!(worst > 0.97, "int8 against fp32: worst cosine {worst}");
    assert_eq!(identical, 0, "int8 vectors differ from fp32's");
}

#[tokio::test]
async fn a_texts_vector_depends_on_its_batch_only_within_the_models_agreement() {
    for model in [&MINILM, &MINILM_INT8] {
        let files = ModelFiles::locate_model(&models_dir(), model).expect("setup-model ran");
        let embedder = LocalEmbedder::load(&files, 1, Some(1)).expect("load");
        let in_batch = embedder.embed(texts()).await.expect("embed");
        let mut lowest = 1.0_f32;
        for (text, batched) in texts().into_iter().zip(&in_batch) {
            let alone = embedder.embed(vec![text]).await.expect("embed alone");
            lowest = lowest.min(cosine(&alone[0], batched));
        }
        assert_eq!(embedder.agreement(), model.agreement);
        assert!(
            lowest >= model.agreement,
            "{}: alone against in a batch, lowest cosine {lowest}",
            model.id
        );
        if model.id == MINILM_INT8.id {
            // Dynamic quantization scales each batch as a whole: the batch shows.
            assert!(
                lowest < 0.9999,
                "int8 vectors do not depend on the batch: {lowest}"
            );
        }
    }
}

#[tokio::test]
async fn a_real_server_with_the_same_weights_matches_the_local_model() {
    let server = EmbeddingServer::start().expect("start the embedding server");
    let remote = RemoteEmbedder::new(options(server.url())).expect("client");
    remote.probe().await.expect("the dimension probe");
    assert_eq!(
        remote.model_id(),
        remote_model_id(&server.url(), SERVED_MODEL)
    );
    // Seven texts in batches of three: three calls, answered in order.
    let vectors = remote.embed(texts()).await.expect("embed remotely");
    let reference = local(&MINILM).await;
    assert_eq!(vectors.len(), reference.len());
    for ((vector, expected), text) in vectors.iter().zip(&reference).zip(texts()) {
        let similarity = cosine(vector, expected);
        assert!(
            similarity >= 0.999,
            "{text:?}: cosine {similarity} against the in-process model"
        );
        let norm: f32 = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "normalised: {norm}");
    }
    // A wrong dimension is found by the probe, before anything is stored.
    let wrong = RemoteEmbedder::new(RemoteOptions {
        dimension: 768,
        ..options(server.url())
    })
    .expect("client");
    assert!(matches!(wrong.probe().await, Err(GatewayError::Config(_))));
}

#[tokio::test]
async fn errors_are_typed_for_retries() {
    let mut server = EmbeddingServer::start().expect("start the embedding server");
    let proxy = FaultyEmbeddingProxy::start(server.port()).expect("proxy");
    let remote = RemoteEmbedder::new(options(proxy.url())).expect("client");
    let one = || vec!["one text".to_owned()];

    proxy.inject([Fault::RateLimited(Some("7".to_owned()))]);
    match remote.embed(one()).await {
        Err(GatewayError::RateLimited { retry_after, .. }) => {
            assert_eq!(retry_after, Duration::from_secs(7))
        }
        other => panic!("429 is rate limited with its Retry-After: {other:?}"),
    }
    proxy.inject([Fault::RateLimited(None)]);
    assert!(matches!(
        remote.embed(one()).await,
        Err(GatewayError::RateLimited { retry_after, .. }) if retry_after == Duration::from_secs(1)
    ));
    proxy.inject([Fault::Status(503, "{}".to_owned())]);
    assert!(matches!(
        remote.embed(one()).await,
        Err(GatewayError::Unavailable { .. })
    ));
    proxy.inject([Fault::Status(401, "{}".to_owned())]);
    match remote.embed(one()).await {
        Err(GatewayError::Unavailable { message, .. }) => {
            assert!(message.contains("CAIRN_EMBEDDINGS_KEY"), "{message}")
        }
        other => panic!("401 is the server's configuration, retried: {other:?}"),
    }
    proxy.inject([Fault::Status(
        400,
        r#"{"error":"input too long"}"#.to_owned(),
    )]);
    assert!(matches!(
        remote.embed(one()).await,
        Err(GatewayError::Rejected { .. })
    ));
    for body in [
        "not json".to_owned(),
        r#"{"data":[]}"#.to_owned(),
        r#"{"data":[{"index":0,"embedding":[0.5,0.5]}]}"#.to_owned(),
        r#"{"data":[{"index":4,"embedding":[]}]}"#.to_owned(),
    ] {
        proxy.inject([Fault::Malformed(body.clone())]);
        match remote.embed(one()).await {
            Err(GatewayError::Embedder(message)) => {
                assert!(message.contains("malformed"), "{body}: {message}")
            }
            other => panic!("{body}: a malformed answer is an embedder error: {other:?}"),
        }
    }
    assert_eq!(proxy.injected(), 9);
    // Nothing scripted: forwarded to the real server.
    let vectors = remote.embed(one()).await.expect("forwarded");
    assert_eq!(vectors[0].len(), 384);
    assert!(proxy.forwarded() >= 1);

    // The server gone: unavailable, retryable.
    server.kill();
    let direct = RemoteEmbedder::new(options(server.url())).expect("client");
    assert!(matches!(
        direct.embed(one()).await,
        Err(GatewayError::Unavailable { .. })
    ));
    server.start_again().expect("start again");
    assert_eq!(direct.embed(one()).await.expect("back")[0].len(), 384);
}

#[tokio::test]
async fn the_catalog_lists_resolves_and_loads_each_model_once() {
    let server = EmbeddingServer::start().expect("start the embedding server");
    let catalog = ModelCatalog::new(CatalogOptions {
        models_dir: models_dir(),
        sessions: 1,
        threads: Some(1),
        batch: 8,
        remote: Some(options(server.url())),
        remote_parallel: 2,
    });
    let ids: Vec<String> = catalog.models().into_iter().map(|model| model.id).collect();
    let remote_id = remote_model_id(&server.url(), SERVED_MODEL);
    assert_eq!(
        ids,
        vec![
            MINILM.id.to_owned(),
            MINILM_INT8.id.to_owned(),
            remote_id.clone()
        ]
    );
    assert_eq!(catalog.resolve("remote").expect("alias").id, remote_id);
    match catalog.resolve("bge-large") {
        Err(GatewayError::ModelMissing(message)) => {
            assert!(message.contains(MINILM_INT8.id), "{message}")
        }
        other => panic!("unknown models are refused: {other:?}"),
    }
    let first = catalog
        .embedder(MINILM_INT8.id, EmbedRole::Query)
        .await
        .expect("int8");
    let again = catalog
        .embedder(MINILM_INT8.id, EmbedRole::Query)
        .await
        .expect("int8");
    assert!(std::sync::Arc::ptr_eq(&first, &again), "loaded once");
    let remote = catalog
        .embedder(&remote_id, EmbedRole::Projection)
        .await
        .expect("remote");
    assert_eq!(remote.model_id(), remote_id);
    let vectors = remote.embed(texts()).await.expect("batched remotely");
    assert_eq!(vectors.len(), texts().len());
    assert!(matches!(
        catalog.embedder("bge-large", EmbedRole::Query).await,
        Err(GatewayError::ModelMissing(_))
    ));
}
