//! The raw embedder of the benchmarks: a model called directly, with none of cairn around it.
//! A local model runs every session at once over shares of the texts
//! ([`LocalEmbedder::embed_parallel`]); a remote server gets batches of its configured size,
//! `embeddings.parallel` calls in flight (its best rate, as a client that knows its texts in
//! advance would call it).

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use futures::StreamExt;
use gateways::embedder::{local_model, LocalEmbedder, ModelFiles, RemoteEmbedder};
use gateways::Embedder;
use serde_json::{json, Value};

use crate::config::Config;

/// A model called directly.
pub(super) enum Raw {
    /// In process.
    Local(Arc<LocalEmbedder>),
    /// On a server: the client, its batch and the calls in flight.
    Remote(Arc<RemoteEmbedder>, usize, usize),
}

impl Raw {
    /// `model` as `config` runs it (a local model's files, or the configured server).
    pub(super) fn open(config: &Config, model: &str) -> anyhow::Result<Raw> {
        if let Some(local) = local_model(model) {
            let files = ModelFiles::locate_model(&config.projection.models_dir, local)?;
            let embedder = LocalEmbedder::load(
                &files,
                config.projection.embed_sessions,
                config.projection.embed_threads,
            )?
            .with_batch_size(config.projection.embed_batch);
            return Ok(Raw::Local(Arc::new(embedder)));
        }
        let server = config
            .embeddings
            .as_ref()
            .filter(|server| {
                gateways::embedder::remote_model_id(&server.options.url, &server.options.model)
                    == model
            })
            .with_context(|| {
                format!("model {model} is neither local nor the configured server's")
            })?;
        Ok(Raw::Remote(
            Arc::new(RemoteEmbedder::new(server.options.clone())?),
            server.options.batch.max(1),
            server.parallel.max(1),
        ))
    }

    /// The texts' vectors, in order.
    pub(super) async fn embed(&self, texts: &[String]) -> anyhow::Result<Vec<Vec<f32>>> {
        match self {
            Raw::Local(model) => {
                let (model, texts) = (model.clone(), texts.to_vec());
                Ok(
                    tokio::task::spawn_blocking(move || model.embed_parallel(&texts))
                        .await
                        .context("raw embedding")??,
                )
            }
            Raw::Remote(remote, batch, parallel) => {
                let calls = texts.chunks(*batch).map(|part| remote.embed(part.to_vec()));
                let answers: Vec<_> = futures::stream::iter(calls)
                    .buffered(*parallel)
                    .collect()
                    .await;
                let mut vectors = Vec::with_capacity(texts.len());
                for answer in answers {
                    vectors.extend(answer?);
                }
                Ok(vectors)
            }
        }
    }

    /// Embeds `texts` in order and sorted by length; returns the seconds of each and the
    /// vectors in order.
    pub(super) async fn time(&self, texts: &[String]) -> anyhow::Result<(f64, f64, Vec<Vec<f32>>)> {
        let (seconds, sorted, vectors) = self.time_with_cpu(texts).await?;
        Ok((seconds, sorted.0, vectors))
    }

    /// [`Raw::time`], with the process's CPU seconds over the sorted pass beside its seconds.
    pub(super) async fn time_with_cpu(
        &self,
        texts: &[String],
    ) -> anyhow::Result<(f64, (f64, f64), Vec<Vec<f32>>)> {
        let mut sorted = texts.to_vec();
        sorted.sort_by_key(String::len);
        let started = Instant::now();
        let cpu_before = super::process_cpu();
        self.embed(&sorted).await?;
        let sorted_cpu = super::process_cpu() - cpu_before;
        let sorted_seconds = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let vectors = self.embed(texts).await?;
        Ok((
            started.elapsed().as_secs_f64(),
            (sorted_seconds, sorted_cpu),
            vectors,
        ))
    }
}

/// `cairn bench models`: every model `config` can run, called directly on the same chunks, in
/// order and sorted by length, with each one's vectors compared with the default model's
/// (mean and lowest cosine).
/// The chunks are those of the first `docs` documents of the BEIR `corpus`.
pub async fn models(
    config: &Config,
    corpus: &std::path::Path,
    docs: usize,
) -> anyhow::Result<Value> {
    let files = ModelFiles::locate(&config.projection.models_dir)?;
    let chunker = gateways::Chunker::new(files.tokenizer()?, config.projection.chunker)?;
    let texts: Vec<String> = super::corpus::read_corpus(corpus, docs, false)?
        .iter()
        .flat_map(|(_, text)| chunker.chunk(text))
        .map(|chunk| chunk.text)
        .collect();
    let texts = texts.as_slice();
    let catalog = crate::projection::model_catalog(config);
    let mut reference: Option<Vec<Vec<f32>>> = None;
    let mut reports = Vec::new();
    for entry in catalog.models() {
        eprintln!("models: {} on {} chunks", entry.id, texts.len());
        let raw = Raw::open(config, &entry.id)?;
        let (seconds, sorted_seconds, vectors) = raw.time(texts).await?;
        let agreement = reference.as_ref().map(|reference| {
            let cosines: Vec<f32> = reference
                .iter()
                .zip(&vectors)
                .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>())
                .collect();
            json!({
                "mean_cosine": cosines.iter().sum::<f32>() / cosines.len().max(1) as f32,
                "lowest_cosine": cosines.iter().copied().fold(f32::INFINITY, f32::min),
            })
        });
        if reference.is_none() {
            reference = Some(vectors);
        }
        reports.push(json!({
            "model": entry.id,
            "runs": entry.runs,
            "dimension": entry.dimension,
            "in_order": { "seconds": seconds, "chunks_per_second": texts.len() as f64 / seconds },
            "sorted": { "seconds": sorted_seconds, "chunks_per_second": texts.len() as f64 / sorted_seconds },
            "against_the_default_model": agreement,
        }));
    }
    let rate = |index: usize| reports[index]["sorted"]["chunks_per_second"].as_f64();
    let speedups: Vec<Value> = (1..reports.len())
        .map(|index| {
            json!({
                "model": reports[index]["model"],
                "sorted_over_default": rate(index).zip(rate(0)).map(|(a, b)| a / b),
            })
        })
        .collect();
    Ok(json!({
        "benchmark": "models",
        "chunks": texts.len(),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "embed_batch": config.projection.embed_batch,
        "embed_sessions": config.projection.embed_sessions,
        "models": reports,
        "speed_over_default": speedups,
    }))
}
