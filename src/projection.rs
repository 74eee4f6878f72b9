//! Assembles the projection job from configuration: the models (a catalog of the local ones
//! and the remote server), the chunker, the projection generation and the vector stores.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use gateways::embedder::{CatalogOptions, ModelFiles};
use gateways::{
    Chunker, EdgeVectorStore, EmbedRole, Embedders, GatewayError, ModelCatalog, ServerVectorStore,
    VectorStore, VectorStores,
};
use receipts::{Backend, Generation, Projections, WorkLedger};
use worker::{GenerationRouter, Projector};

use crate::Config;

/// The models `config` can embed with: every local model `scripts/setup-model` installed, and
/// the remote server's, each loaded on first use.
pub fn model_catalog(config: &Config) -> Arc<ModelCatalog> {
    let projection = &config.projection;
    Arc::new(ModelCatalog::new(CatalogOptions {
        models_dir: projection.models_dir.clone(),
        sessions: projection.embed_sessions,
        threads: projection.embed_threads,
        batch: projection.embed_batch,
        remote: config
            .embeddings
            .as_ref()
            .map(|server| server.options.clone()),
        remote_parallel: config
            .embeddings
            .as_ref()
            .map_or(1, |server| server.parallel),
    }))
}

/// The dimension of `config`'s own model (validated to be a local model or the server's).
pub fn model_dimension(config: &Config) -> usize {
    match gateways::embedder::local_model(&config.projection.model) {
        Some(model) => model.dimension,
        None => config
            .embeddings
            .as_ref()
            .map_or(gateways::embedder::MODEL_DIMENSION, |server| {
                server.options.dimension
            }),
    }
}

/// The projection generation of a configuration.
pub fn generation(config: &Config) -> Generation {
    Generation::new(
        &config.projection.model,
        model_dimension(config) as i64,
        &config.projection.chunker.fingerprint(),
        &config.backends,
    )
    .with_vector_layout(
        &config
            .vectors
            .as_ref()
            .map(|options| options.layout.fingerprint())
            .unwrap_or_default(),
    )
}

/// Where a generation's vector shard lives.
pub fn vector_path(config: &Config, generation: &Generation) -> PathBuf {
    config.data_dir.join("vectors").join(&generation.id)
}

/// The vector stores of every generation this process projects into or searches, each opened
/// on first use and shared by its workers, its search and the generation endpoints (an
/// embedded shard has one owner, so one process opens it once). Retiring a generation closes
/// and deletes its store here.
pub struct GenerationStores {
    server: Option<gateways::ServerOptions>,
    data_dir: PathBuf,
    optimize: gateways::OptimizePolicy,
    /// The configured generation and its dimension.
    own: (String, usize),
    /// Where other generations' dimensions are read.
    ledger: Option<Arc<dyn Projections>>,
    /// The metadata fields each store indexes (`datasets.<d>.filterable`).
    filterable: Vec<(String, gateways::FieldKind)>,
    opened: tokio::sync::Mutex<HashMap<String, Opened>>,
}

enum Opened {
    Edge {
        store: Arc<EdgeVectorStore>,
        optimizer: Arc<AtomicBool>,
    },
    Server(Arc<ServerVectorStore>),
}

impl Opened {
    fn store(&self) -> Arc<dyn VectorStore> {
        match self {
            Opened::Edge { store, .. } => store.clone(),
            Opened::Server(store) => store.clone(),
        }
    }
}

impl GenerationStores {
    /// The registry of `config`'s vector stores (a Qdrant server, or shards under the data
    /// directory). A store is opened with its generation's dimension, as `ledger` records it
    /// (the configured model's dimension for a generation it does not know, or without one).
    pub fn new(config: &Config, ledger: Option<Arc<dyn Projections>>) -> Arc<GenerationStores> {
        Arc::new(GenerationStores {
            server: config.vectors.clone(),
            data_dir: config.data_dir.clone(),
            optimize: config.projection.optimize,
            own: (generation(config).id, model_dimension(config)),
            ledger,
            filterable: config.filterable.clone(),
            opened: tokio::sync::Mutex::new(HashMap::new()),
        })
    }

    fn shard_path(&self, generation: &str) -> PathBuf {
        self.data_dir.join("vectors").join(generation)
    }

    /// The vector dimension of `generation`.
    async fn dimension(&self, generation: &str) -> anyhow::Result<usize> {
        if generation == self.own.0 {
            return Ok(self.own.1);
        }
        if let Some(ledger) = &self.ledger {
            let known = ledger
                .generations()
                .await
                .context("reading the generations' dimensions")?;
            if let Some(view) = known.iter().find(|view| view.id == generation) {
                return usize::try_from(view.dimension).with_context(|| {
                    format!("generation {generation} has dimension {}", view.dimension)
                });
            }
        }
        Ok(self.own.1)
    }

    async fn open(&self, generation: &str) -> anyhow::Result<Opened> {
        let dimension = self.dimension(generation).await?;
        match &self.server {
            Some(options) => {
                let store = ServerVectorStore::open(options, generation, dimension)
                    .await
                    .with_context(|| {
                        format!(
                            "opening the vector collection of generation {generation} on the \
                             Qdrant server at {}",
                            options.urls.join(", ")
                        )
                    })?;
                tracing::info!(location = %store.location(), "vectors on the Qdrant server");
                Ok(Opened::Server(Arc::new(store)))
            }
            None => {
                let path = self.shard_path(generation);
                let store =
                    tokio::task::spawn_blocking(move || EdgeVectorStore::open(&path, dimension))
                        .await
                        .context("opening the vector store")??;
                let optimizer = store.spawn_optimizer(self.optimize)?;
                Ok(Opened::Edge {
                    store: Arc::new(store),
                    optimizer,
                })
            }
        }
    }

    /// The store of `generation`, opened now if this process has not opened it yet.
    pub async fn get(&self, generation: &str) -> anyhow::Result<Arc<dyn VectorStore>> {
        let mut opened = self.opened.lock().await;
        if let Some(existing) = opened.get(generation) {
            return Ok(existing.store());
        }
        let fresh = self.open(generation).await?;
        let store = fresh.store();
        // The declared metadata fields are indexed before the store serves anything; the
        // store indexes the points it already holds as it creates each index.
        store
            .ensure_indexes(&self.filterable)
            .await
            .with_context(|| {
                format!("indexing the filterable metadata fields of generation {generation}")
            })?;
        opened.insert(generation.to_owned(), fresh);
        Ok(store)
    }

    /// Deletes `generation`'s vectors (its collection, or its shard directory) and reads back
    /// that they are gone; the evidence is recorded with the retirement. Handles that jobs or
    /// queries still hold answer `unavailable` from then on (their work is cancelled anyway).
    pub async fn delete(&self, generation: &str) -> anyhow::Result<serde_json::Value> {
        // Out of the registry first, so the slow part holds no lock that search waits on.
        let existing = self.opened.lock().await.remove(generation);
        let existing = match existing {
            Some(existing) => existing,
            None => self.open(generation).await?,
        };
        match existing {
            Opened::Server(store) => {
                let points = store.total_points().await?;
                store.delete_collection().await?;
                if store.exists().await? {
                    anyhow::bail!("{} still exists after it was deleted", store.location());
                }
                Ok(serde_json::json!({
                    "store": store.name(),
                    "location": store.location(),
                    "points_deleted": points,
                    "collection_exists": false,
                }))
            }
            Opened::Edge { store, optimizer } => {
                optimizer.store(true, std::sync::atomic::Ordering::SeqCst);
                let location = store.location();
                let bytes = store.destroy().await?;
                Ok(serde_json::json!({
                    "store": store.name(),
                    "location": location,
                    "bytes_freed": bytes,
                    "directory_exists": false,
                }))
            }
        }
    }

    /// Stops the optimisers and puts every open store on disk, reporting a failed last flush
    /// (a full disk, say) as an error instead of a panic at exit. Nothing is lost by such a
    /// failure: a vector receipt is verified only after its flush, so a revision whose points
    /// did not reach the disk is projected again.
    pub async fn close(&self) -> anyhow::Result<()> {
        let opened = std::mem::take(&mut *self.opened.lock().await);
        for (generation, opened) in opened {
            if let Opened::Edge { optimizer, .. } = &opened {
                optimizer.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            opened.store().close().await.with_context(|| {
                format!(
                    "closing the vector store of generation {generation}: its last flush failed"
                )
            })?;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl VectorStores for GenerationStores {
    async fn store(&self, generation: &str) -> Result<Arc<dyn VectorStore>, GatewayError> {
        self.get(generation)
            .await
            .map_err(|error| GatewayError::Unavailable {
                store: "vector",
                message: format!("{error:#}"),
            })
    }
}

/// The generation endpoints' view of this process: new generations are described from its
/// configuration, and retired ones' vectors deleted through its stores.
pub struct OpsGenerations {
    config: Config,
    stores: Option<Arc<GenerationStores>>,
    models: Arc<ModelCatalog>,
}

impl OpsGenerations {
    /// The setup of `config`, with the models of `models`, deleting vectors through `stores`.
    pub fn new(
        config: &Config,
        stores: Option<Arc<GenerationStores>>,
        models: Arc<ModelCatalog>,
    ) -> OpsGenerations {
        OpsGenerations {
            config: config.clone(),
            stores,
            models,
        }
    }
}

#[async_trait::async_trait]
impl ops::generations::GenerationSetup for OpsGenerations {
    fn describe(&self, request: &ops::generations::CreateGeneration) -> Result<Generation, String> {
        let model = self
            .models
            .resolve(
                request
                    .model
                    .as_deref()
                    .unwrap_or(&self.config.projection.model),
            )
            .map_err(|error| match error {
                GatewayError::ModelMissing(message) => message,
                error => error.to_string(),
            })?;
        let defaults = self.config.projection.chunker;
        let settings = gateways::ChunkerSettings {
            max_tokens: request.max_tokens.unwrap_or(defaults.max_tokens),
            overlap_tokens: request.overlap_tokens.unwrap_or(defaults.overlap_tokens),
        };
        let most = gateways::embedder::MODEL_MAX_TOKENS - 2;
        if settings.max_tokens == 0 || settings.max_tokens > most {
            return Err(format!("max_tokens must be between 1 and {most}"));
        }
        if settings.overlap_tokens >= settings.max_tokens {
            return Err("overlap_tokens must be below max_tokens".to_owned());
        }
        let backends = request
            .backends
            .clone()
            .unwrap_or_else(|| self.config.backends.clone());
        if !backends.contains(&Backend::Relational) {
            return Err("a generation needs the relational backend (its chunk rows)".to_owned());
        }
        if backends.contains(&Backend::Vector) && self.stores.is_none() {
            return Err("this server has no vector store; it cannot build vectors".to_owned());
        }
        Ok(Generation::new(
            &model.id,
            model.dimension as i64,
            &settings.fingerprint(),
            &backends,
        ))
    }

    async fn delete_vectors(&self, generation: &Generation) -> Result<serde_json::Value, String> {
        let stores = self
            .stores
            .as_ref()
            .ok_or_else(|| "this server has no vector store".to_owned())?;
        stores
            .delete(&generation.id)
            .await
            .map_err(|error| format!("{error:#}"))
    }
}

/// The projection job and the stores it writes, shared with search in `cairn serve`.
pub struct Projection {
    /// The projector of this process's configured generation.
    pub projector: Arc<Projector>,
    /// What workers run: each job with the projector of the generation it writes.
    pub work: Arc<GenerationRouter>,
    /// The vector stores of every generation (when the `vector` backend is configured).
    pub stores: Option<Arc<GenerationStores>>,
    /// The models every generation embeds with.
    pub models: Arc<ModelCatalog>,
}

impl Projection {
    /// Closes every vector store ([`GenerationStores::close`]).
    pub async fn close(self) -> anyhow::Result<()> {
        if let Some(stores) = &self.stores {
            stores.close().await?;
        }
        Ok(())
    }
}

/// Loads the model, activates the generation in the ledger (refusing one the ledger does not
/// project: [`receipts::Projections::activate_generation`]) and opens its vector store. Must run
/// inside a tokio runtime (the embedding batcher is a task).
pub async fn open_projector(
    config: &Config,
    ledger: Arc<dyn WorkLedger>,
) -> anyhow::Result<Arc<Projector>> {
    Ok(open_projection(config, ledger).await?.projector)
}

/// [`open_projector`], keeping the stores for search.
pub async fn open_projection(
    config: &Config,
    ledger: Arc<dyn WorkLedger>,
) -> anyhow::Result<Projection> {
    // Chunks are measured with the default model's tokenizer, whatever the model.
    let files = ModelFiles::locate(&config.projection.models_dir)?;
    let models = model_catalog(config);
    let embedder = models
        .embedder(&config.projection.model, EmbedRole::Projection)
        .await
        .with_context(|| format!("loading the embedding model {}", config.projection.model))?;
    let chunker = Arc::new(Chunker::new(files.tokenizer()?, config.projection.chunker)?);
    let generation = generation(config);
    ledger
        .activate_generation(&generation, "cairn:startup")
        .await
        .with_context(|| {
            format!(
                "activating projection generation {} ({}, {}, backends {:?})",
                generation.id, generation.model, generation.chunker, generation.backends
            )
        })?;
    let stores = config
        .backends
        .contains(&Backend::Vector)
        .then(|| GenerationStores::new(config, Some(ledger.clone() as Arc<dyn Projections>)));
    let vectors = match &stores {
        Some(stores) => Some(stores.get(&generation.id).await?),
        None => None,
    };
    let mut projector = Projector::new(
        ledger.clone(),
        embedder,
        chunker.clone(),
        vectors.clone(),
        generation.clone(),
    )?
    .with_units(worker::UnitSettings {
        max_bytes: config.workers.unit_max_bytes,
        ..worker::UnitSettings::default()
    });
    if let Some(options) = &config.graph {
        let store = gateways::BoltGraphStore::open(options)
            .await
            .with_context(|| format!("opening the graph at {}", options.url))?;
        tracing::info!(location = %gateways::GraphStore::location(&store), "graph projection on");
        projector = projector.with_graph(worker::GraphStage::new(
            ledger.clone(),
            chunker,
            Arc::new(store),
            vec![Arc::new(gateways::graph::links::LinkExtractor)],
            &generation.id,
        ));
    }
    let projector = Arc::new(projector);
    let work = Arc::new(GenerationRouter::new(
        ledger,
        projector.clone(),
        stores.clone().map(|stores| stores as Arc<dyn VectorStores>),
        Some(models.clone() as Arc<dyn Embedders>),
    ));
    Ok(Projection {
        projector,
        work,
        stores,
        models,
    })
}
