//! Assembles the projection job from configuration: the model files, the embedder (batched
//! across jobs), the chunker, the projection generation and the vector store.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use gateways::embedder::{LocalEmbedder, ModelFiles, MODEL_DIMENSION, MODEL_ID};
use gateways::{
    BatchingEmbedder, Chunker, EdgeVectorStore, Embedder, ServerVectorStore, VectorStore,
};
use receipts::{Backend, Generation, Ledger};
use worker::Projector;

use crate::Config;

/// The projection generation of a configuration.
pub fn generation(config: &Config) -> Generation {
    Generation::new(
        MODEL_ID,
        MODEL_DIMENSION as i64,
        &config.projection.chunker.fingerprint(),
        &config.backends,
    )
}

/// Where a generation's vector shard lives.
pub fn vector_path(config: &Config, generation: &Generation) -> PathBuf {
    config.data_dir.join("vectors").join(&generation.id)
}

/// The projection job and the stores it writes, shared with search in `cairn serve`.
pub struct Projection {
    /// The job workers run.
    pub projector: Arc<Projector>,
    /// The vector store (when the `vector` backend is configured).
    pub vectors: Option<Arc<dyn VectorStore>>,
    /// The model files.
    pub files: ModelFiles,
    /// Stops the vector store's background optimiser.
    optimizer: Option<Arc<AtomicBool>>,
}

impl Projection {
    /// Stops the optimiser and puts the vector store on disk, reporting a failed last flush
    /// (a full disk, say) as an error instead of a panic at exit. Nothing is lost by such a
    /// failure: a vector receipt is verified only after its flush, so a revision whose points
    /// did not reach the disk is projected again.
    pub async fn close(self) -> anyhow::Result<()> {
        if let Some(stop) = &self.optimizer {
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        if let Some(vectors) = &self.vectors {
            vectors
                .close()
                .await
                .context("closing the vector store: its last flush failed")?;
        }
        Ok(())
    }
}

/// Loads the model, activates the generation in the ledger (refusing a changed one) and opens
/// the vector store. Must run inside a tokio runtime (the embedding batcher is a task).
pub async fn open_projector(
    config: &Config,
    ledger: Arc<dyn Ledger>,
) -> anyhow::Result<Arc<Projector>> {
    Ok(open_projection(config, ledger).await?.projector)
}

/// The embedder search uses for queries: its own model session with one thread, so a query
/// never waits behind a projection batch (about 2 ms per short query).
pub async fn query_embedder(files: &ModelFiles) -> anyhow::Result<Arc<dyn Embedder>> {
    let files = files.clone();
    let model = tokio::task::spawn_blocking(move || LocalEmbedder::load(&files, 1, Some(1)))
        .await
        .context("loading the query embedder")??;
    Ok(Arc::new(model))
}

/// Opens the generation's vector store: a collection on the Qdrant server when `vectors.url`
/// is set (shared by any number of processes), else the embedded qdrant-edge shard (owned by
/// this process, with its background optimiser, whose stop flag comes back too).
pub async fn open_vectors(
    config: &Config,
    generation: &Generation,
) -> anyhow::Result<(Arc<dyn VectorStore>, Option<Arc<AtomicBool>>)> {
    match &config.vectors {
        Some(options) => {
            let store = ServerVectorStore::open(options, &generation.id, MODEL_DIMENSION)
                .await
                .with_context(|| {
                    format!(
                        "opening the vector collection of generation {} on the Qdrant server at {}",
                        generation.id, options.url
                    )
                })?;
            tracing::info!(location = %store.location(), "vectors on the Qdrant server");
            Ok((Arc::new(store), None))
        }
        None => {
            let path = vector_path(config, generation);
            let store =
                tokio::task::spawn_blocking(move || EdgeVectorStore::open(&path, MODEL_DIMENSION))
                    .await
                    .context("opening the vector store")??;
            let optimizer = store.spawn_optimizer(config.projection.optimize)?;
            Ok((Arc::new(store), Some(optimizer)))
        }
    }
}

/// [`open_projector`], keeping the stores for search.
pub async fn open_projection(
    config: &Config,
    ledger: Arc<dyn Ledger>,
) -> anyhow::Result<Projection> {
    let files = ModelFiles::locate(&config.projection.models_dir)?;
    let threads = config.projection.embed_threads;
    let batch = config.projection.embed_batch;
    let sessions = config.projection.embed_sessions;
    let model_files = files.clone();
    let local = tokio::task::spawn_blocking(move || {
        LocalEmbedder::load(&model_files, sessions, threads)
            .map(|model| model.with_batch_size(batch))
    })
    .await
    .context("loading the embedding model")??;
    let embedder: Arc<dyn Embedder> = Arc::new(BatchingEmbedder::start(
        Arc::new(local),
        batch.max(1) * 4,
        sessions,
    ));
    let chunker = Arc::new(Chunker::new(files.tokenizer()?, config.projection.chunker)?);
    let generation = generation(config);
    ledger
        .activate_generation(&generation, "cairn:startup")
        .await
        .with_context(|| {
            format!(
                "activating projection generation {} ({MODEL_ID}, {}, backends {:?})",
                generation.id, generation.chunker, generation.backends
            )
        })?;
    let (vectors, optimizer) = if config.backends.contains(&Backend::Vector) {
        let (store, optimizer) = open_vectors(config, &generation).await?;
        (Some(store), optimizer)
    } else {
        (None, None)
    };
    let mut projector = Projector::new(
        ledger.clone(),
        embedder,
        chunker.clone(),
        vectors.clone(),
        generation.clone(),
    )?;
    if let Some(options) = &config.graph {
        let store = gateways::BoltGraphStore::open(options)
            .await
            .with_context(|| format!("opening the graph at {}", options.url))?;
        tracing::info!(location = %gateways::GraphStore::location(&store), "graph projection on");
        projector = projector.with_graph(worker::GraphStage::new(
            ledger,
            chunker,
            Arc::new(store),
            vec![Arc::new(gateways::graph::extract::LinkExtractor)],
            &generation.id,
        ));
    }
    let projector = Arc::new(projector);
    Ok(Projection {
        projector,
        vectors,
        files,
        optimizer,
    })
}
