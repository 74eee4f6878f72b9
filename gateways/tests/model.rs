//! The real embedding model and chunker against the reference vectors in
//! `../shared/eval/minilm-reference.json`. Needs the files `scripts/setup-model` installs;
//! without them every test here fails loudly with the command to run (CI installs them).

use std::path::PathBuf;

use gateways::embedder::{Embedder, LocalEmbedder, ModelFiles, MODEL_DIMENSION};
use gateways::{Chunker, ChunkerSettings};

fn models_dir() -> PathBuf {
    std::env::var_os("CAIRN_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")))
}

fn files() -> ModelFiles {
    match ModelFiles::locate(&models_dir()) {
        Ok(files) => files,
        Err(error) => panic!("{error}"),
    }
}

fn reference() -> serde_json::Value {
    // A copy of `../shared/eval/minilm-reference.json` (reference vectors from an independent
    // ONNX Runtime run), kept in the repository so that a fresh clone can run the test.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/minilm-reference.json"
    );
    let text = std::fs::read_to_string(path).expect("reference vectors");
    serde_json::from_str(&text).expect("reference json")
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[tokio::test]
async fn embeddings_match_the_reference_run() {
    let embedder = LocalEmbedder::load(&files(), 1, None).expect("load model");
    let reference = reference();
    let texts: Vec<String> = reference["texts"]
        .as_array()
        .expect("texts")
        .iter()
        .map(|t| t.as_str().expect("text").to_owned())
        .collect();
    let vectors = embedder.embed(texts.clone()).await.expect("embed");
    assert_eq!(vectors.len(), texts.len());
    let mut worst = 0.0_f32;
    for (vector, expected) in vectors
        .iter()
        .zip(reference["vectors"].as_array().expect("vectors"))
    {
        let expected: Vec<f32> = expected
            .as_array()
            .expect("vector")
            .iter()
            .map(|x| x.as_f64().expect("number") as f32)
            .collect();
        assert_eq!(vector.len(), MODEL_DIMENSION);
        assert_eq!(expected.len(), MODEL_DIMENSION);
        for (got, want) in vector.iter().zip(&expected) {
            worst = worst.max((got - want).abs());
        }
    }
    assert!(worst <= 1e-4, "max absolute difference {worst} > 1e-4");
    let close = cosine(&vectors[0], &vectors[1]);
    let far = cosine(&vectors[0], &vectors[2]);
    assert!((close - 0.6660).abs() < 1e-3, "cosine(0, 1) = {close}");
    assert!((far - 0.1046).abs() < 1e-3, "cosine(0, 2) = {far}");
    // Batching does not change a vector: one text alone gives the same answer.
    let alone = embedder.embed(vec![texts[3].clone()]).await.expect("embed");
    let drift = alone[0]
        .iter()
        .zip(&vectors[3])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0_f32, f32::max);
    assert!(drift <= 1e-5, "batching changed a vector by {drift}");
}

/// Concurrent requests through the batcher (one model call for several jobs, sorted by
/// length inside) each get their own texts' vectors, in their own order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batcher_answers_each_request_with_its_own_vectors_in_order() {
    let local = std::sync::Arc::new(LocalEmbedder::load(&files(), 1, Some(1)).expect("load model"));
    let batcher = std::sync::Arc::new(gateways::BatchingEmbedder::start(local.clone(), 32, 1));
    // Lengths that sorting reorders, across and within requests.
    let requests: Vec<Vec<String>> = (0..6)
        .map(|request| {
            (0..3)
                .map(|text| {
                    let words = 1 + (request * 7 + text * 13) % 40;
                    format!("request {request} text {text} ")
                        + &"herons wade in the reeds ".repeat(words)
                })
                .collect()
        })
        .collect();
    let answers = futures::future::join_all(requests.iter().map(|texts| {
        let batcher = batcher.clone();
        let texts = texts.clone();
        async move { batcher.embed(texts).await.expect("batched") }
    }))
    .await;
    for (texts, answer) in requests.iter().zip(answers) {
        let alone = local.embed(texts.clone()).await.expect("alone");
        assert_eq!(answer.len(), alone.len());
        for (got, want) in answer.iter().zip(&alone) {
            assert!(
                cosine(got, want) > 0.9999,
                "a vector came back for another text"
            );
        }
    }
}

#[test]
fn chunks_fit_the_window_cover_the_text_and_are_deterministic() {
    let files = files();
    let chunker = Chunker::new(
        files.tokenizer().expect("tokenizer"),
        ChunkerSettings::default(),
    )
    .expect("chunker");
    let paragraph = "Leased workers project each revision into every store. ".repeat(40);
    let text = format!("{paragraph}\n\n{paragraph}\n\nA short closing paragraph.");
    let chunks = chunker.chunk(&text);
    assert!(chunks.len() >= 3, "{} chunks", chunks.len());
    for (index, chunk) in chunks.iter().enumerate() {
        assert_eq!(chunk.index as usize, index);
        assert!(
            chunk.token_count <= 254,
            "chunk {index} has {} tokens",
            chunk.token_count
        );
        assert!(chunk.token_count > 0);
        assert_eq!(&text[chunk.byte_start..chunk.byte_end], chunk.text);
    }
    // Within a paragraph neighbours overlap; across paragraphs they meet at the blank line.
    for pair in chunks.windows(2) {
        assert!(pair[1].byte_start > pair[0].byte_start);
        let gap = &text[pair[0].byte_end.min(pair[1].byte_start)..pair[1].byte_start];
        assert!(
            pair[1].byte_start < pair[0].byte_end || gap.trim().is_empty(),
            "text lost between chunks: {gap:?}"
        );
    }
    assert!(
        chunks
            .windows(2)
            .any(|pair| pair[1].byte_start < pair[0].byte_end),
        "no two chunks overlap"
    );
    // Boundaries prefer paragraphs: the second paragraph starts a chunk.
    let second = paragraph.len() + 2;
    assert!(
        chunks.iter().any(|c| c.byte_start == second),
        "no chunk starts at the second paragraph ({second})"
    );
    assert!(chunks
        .last()
        .is_some_and(|c| c.text.ends_with("A short closing paragraph.")));
    assert_eq!(chunker.chunk(&text), chunks);
    assert!(chunker.chunk("   \n  ").is_empty());
}

#[test]
fn every_chunk_fits_the_window_when_encoded_on_its_own() {
    // Chunk sizes come from one tokenization of the whole document; the model encodes each
    // chunk alone. Text with long unbroken words, digits and accents forces cuts inside words,
    // where the two can differ: the model's own count must still fit.
    let files = files();
    let tokenizer = files.tokenizer().expect("tokenizer");
    let chunker = Chunker::new(tokenizer.clone(), ChunkerSettings::default()).expect("chunker");
    let mut text = String::new();
    for index in 0..400 {
        text.push_str(&format!(
            "Pseudopseudohypoparathyroidism{index} naïveté-{}; ",
            index * 7919
        ));
        if index % 50 == 0 {
            text.push_str(&"x".repeat(900));
            text.push('\n');
        }
    }
    let chunks = chunker.chunk(&text);
    assert!(chunks.len() > 10, "{} chunks", chunks.len());
    for chunk in &chunks {
        let alone = tokenizer
            .encode(chunk.text.as_str(), false)
            .expect("encode")
            .len();
        assert!(
            alone <= 254,
            "chunk {} has {alone} tokens on its own (sized as {})",
            chunk.index,
            chunk.token_count
        );
        assert!(
            alone.abs_diff(chunk.token_count) <= 2,
            "chunk {} sized {} but encodes to {alone}",
            chunk.index,
            chunk.token_count
        );
    }
}
