//! Routing each job to the projector of the generation it writes.
//!
//! A `project` or `tombstone` job names its generation (the active one, one being built, or a
//! former active one kept for rollback). The router hands it to a [`Projector`] for that
//! generation: the process's own (its configuration's) when the names match or the job names
//! none, otherwise one assembled from the generation as the ledger records it, with a chunker
//! of its settings and its vector store from the process's [`VectorStores`]. A rebuild is
//! therefore an ordinary projection job; the worker runtime has no special case.
//!
//! ## Invariants
//! - A job never writes a generation other than its own: its chunk rows, points and receipts
//!   all carry the generation it names.
//! - A job for a generation that is no longer live (retiring, retired) fails permanently
//!   (`generation_retired`) instead of writing into it again.
//! - Each generation is embedded with its own model, from the process's [`Embedders`]; a
//!   generation whose model this process cannot run (not installed, no such server
//!   configured, or another dimension) fails permanently (`model_unavailable`).
//! - Stores are not cached here: the registry owns them, so retiring a generation can close
//!   and delete its store once the last job using it ends.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use gateways::{Chunker, ChunkerSettings, EmbedRole, Embedder, Embedders, VectorStores};
use receipts::{Backend, Failure, Generation, Job, WorkLedger};
use tokio::sync::Mutex;

use crate::job::{backend_failure, ledger_failure, permanent};
use crate::{Projector, Work};

/// Runs each job with the projector of its generation.
pub struct GenerationRouter {
    ledger: Arc<dyn WorkLedger>,
    own: Arc<Projector>,
    stores: Option<Arc<dyn VectorStores>>,
    embedders: Option<Arc<dyn Embedders>>,
    /// Chunkers by settings fingerprint (a tokenizer copy each).
    chunkers: Mutex<HashMap<String, Arc<Chunker>>>,
    /// Live generations as last read from the ledger, and when (re-read after
    /// [`GENERATIONS_TTL`]; a job of a generation retired meanwhile is fenced out by the
    /// ledger anyway, since retiring cancels it).
    known: Mutex<Option<(std::time::Instant, Vec<Generation>)>>,
}

/// How long the router trusts its list of live generations.
pub const GENERATIONS_TTL: std::time::Duration = std::time::Duration::from_secs(5);

impl std::fmt::Debug for GenerationRouter {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("GenerationRouter")
            .field("own", &self.own.generation().id)
            .finish()
    }
}

impl GenerationRouter {
    /// Routes to `own` by default, and to other generations through `stores` (required when
    /// a generation holds vectors) and `embedders` (required when a generation embeds with
    /// another model than `own`'s).
    pub fn new(
        ledger: Arc<dyn WorkLedger>,
        own: Arc<Projector>,
        stores: Option<Arc<dyn VectorStores>>,
        embedders: Option<Arc<dyn Embedders>>,
    ) -> GenerationRouter {
        GenerationRouter {
            ledger,
            own,
            stores,
            embedders,
            chunkers: Mutex::new(HashMap::new()),
            known: Mutex::new(None),
        }
    }

    async fn chunker(&self, fingerprint: &str) -> Result<Arc<Chunker>, Failure> {
        if fingerprint == self.own.generation().chunker {
            return Ok(self.own.chunker().clone());
        }
        let mut chunkers = self.chunkers.lock().await;
        if let Some(chunker) = chunkers.get(fingerprint) {
            return Ok(chunker.clone());
        }
        let settings = ChunkerSettings::from_fingerprint(fingerprint).ok_or_else(|| {
            permanent(
                "chunker_unavailable",
                format!("this worker has no chunker `{fingerprint}`"),
            )
        })?;
        let chunker = Arc::new(
            self.own
                .chunker()
                .with_settings(settings)
                .map_err(|error| backend_failure("chunker", error))?,
        );
        chunkers.insert(fingerprint.to_owned(), chunker.clone());
        Ok(chunker)
    }

    /// The live generation `id`, if it is one.
    async fn live(&self, id: &str) -> Result<Option<Generation>, Failure> {
        let mut known = self.known.lock().await;
        let fresh = known
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < GENERATIONS_TTL);
        if !fresh {
            let live = self
                .ledger
                .generations()
                .await
                .map_err(ledger_failure)?
                .into_iter()
                .filter(|view| view.state.is_live())
                .map(|view| view.generation())
                .collect();
            *known = Some((std::time::Instant::now(), live));
        }
        Ok(known
            .as_ref()
            .and_then(|(_, live)| live.iter().find(|generation| generation.id == id))
            .cloned())
    }

    /// The embedder of `generation`'s model (the own projector's when the model is the same).
    async fn embedder(&self, generation: &Generation) -> Result<Arc<dyn Embedder>, Failure> {
        let own = self.own.embedder();
        let embedder = if generation.model == own.model_id() {
            own.clone()
        } else {
            let embedders = self.embedders.as_ref().ok_or_else(|| {
                permanent(
                    "model_unavailable",
                    format!(
                        "generation {} embeds with {}; this worker runs only {}",
                        generation.id,
                        generation.model,
                        own.model_id()
                    ),
                )
            })?;
            embedders
                .embedder(&generation.model, EmbedRole::Projection)
                .await
                .map_err(|error| match error {
                    gateways::GatewayError::ModelMissing(message) => {
                        permanent("model_unavailable", message)
                    }
                    error => backend_failure("vector", error),
                })?
        };
        let dimension = i64::try_from(embedder.dimension()).unwrap_or(i64::MAX);
        if dimension != generation.dimension {
            return Err(permanent(
                "model_unavailable",
                format!(
                    "generation {} has {} dimensions; its model {} here has {dimension}",
                    generation.id, generation.dimension, generation.model
                ),
            ));
        }
        Ok(embedder)
    }

    /// The projector for `job`'s generation.
    async fn projector(&self, job: &Job) -> Result<Arc<Projector>, Failure> {
        let wanted = match &job.generation {
            Some(id) if *id != self.own.generation().id => id,
            _ => return Ok(self.own.clone()),
        };
        let generation = self.live(wanted).await?.ok_or_else(|| {
            permanent(
                "generation_retired",
                format!(
                    "generation {wanted} is not live (retiring, retired or unknown): nothing \
                     is projected into it"
                ),
            )
        })?;
        let embedder = self.embedder(&generation).await?;
        let chunker = self.chunker(&generation.chunker).await?;
        let vectors = if generation.backends.contains(&Backend::Vector) {
            let stores = self.stores.as_ref().ok_or_else(|| {
                permanent(
                    "vector_unconfigured",
                    format!("generation {wanted} holds vectors; this worker has no vector store"),
                )
            })?;
            Some(
                stores
                    .store(&generation.id)
                    .await
                    .map_err(|error| backend_failure("vector", error))?,
            )
        } else {
            None
        };
        self.own
            .for_generation(generation, embedder, chunker, vectors)
            .map(Arc::new)
            .map_err(|error| backend_failure("vector", error))
    }
}

#[async_trait]
impl Work for GenerationRouter {
    async fn run(&self, job: &Job) -> Result<(), Failure> {
        let projector = self.projector(job).await?;
        projector.run(job).await
    }

    fn unit_key(&self, job: &Job) -> Option<String> {
        self.own.unit_key(job)
    }

    async fn run_unit(&self, unit: &crate::Unit) {
        // A unit never mixes generations: its members share the key, their generation.
        let Some(first) = unit.members().first() else {
            return;
        };
        match self.projector(&first.job).await {
            Ok(projector) => projector.run_unit(unit).await,
            Err(failure) => {
                for index in unit.held() {
                    unit.report(index, Err(failure.clone()));
                }
            }
        }
    }
}
