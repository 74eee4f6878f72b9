//! The models a process can embed with, loaded on first use: every local model
//! `scripts/setup-model` built, and the remote model of the configured server, if any.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::OnceCell;

use super::{
    local_model, BatchingEmbedder, EmbedRole, Embedder, Embedders, LocalEmbedder, ModelFiles,
    RemoteEmbedder, RemoteOptions, LOCAL_MODELS,
};
use crate::GatewayError;

/// How the catalog loads its models.
#[derive(Debug, Clone)]
pub struct CatalogOptions {
    /// Where `scripts/setup-model` put the local models.
    pub models_dir: PathBuf,
    /// Inference sessions per local model for projection (batches run on them in parallel).
    pub sessions: usize,
    /// ONNX Runtime threads per session (`None`: every core).
    pub threads: Option<usize>,
    /// Texts per ONNX Runtime call.
    pub batch: usize,
    /// The remote embedding server, when one is configured.
    pub remote: Option<RemoteOptions>,
    /// Calls in flight to the remote server at once, for projection.
    pub remote_parallel: usize,
}

/// A model this process can run: its id, dimension and what it is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ModelEntry {
    /// The id generations record.
    pub id: String,
    /// Its dimension.
    pub dimension: usize,
    /// Local (in process) or remote (the server's URL).
    pub runs: String,
    /// What it is.
    pub description: String,
}

type Slot = Arc<OnceCell<Arc<dyn Embedder>>>;

/// Every model this process can run, each loaded once per role on first use.
pub struct ModelCatalog {
    options: CatalogOptions,
    remote_id: Option<String>,
    loaded: std::sync::Mutex<HashMap<(String, EmbedRole), Slot>>,
}

impl std::fmt::Debug for ModelCatalog {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ModelCatalog")
            .field("options", &self.options)
            .finish()
    }
}

impl ModelCatalog {
    /// The catalog of `options` (nothing is loaded yet).
    pub fn new(options: CatalogOptions) -> ModelCatalog {
        let remote_id = options
            .remote
            .as_ref()
            .map(|remote| super::remote_model_id(&remote.url, &remote.model));
        ModelCatalog {
            options,
            remote_id,
            loaded: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The models this process can run: the local ones whose files are installed, and the
    /// remote one.
    pub fn models(&self) -> Vec<ModelEntry> {
        let mut models: Vec<ModelEntry> = LOCAL_MODELS
            .iter()
            .filter(|model| ModelFiles::locate_model(&self.options.models_dir, model).is_ok())
            .map(|model| ModelEntry {
                id: model.id.to_owned(),
                dimension: model.dimension,
                runs: "local".to_owned(),
                description: model.description.to_owned(),
            })
            .collect();
        if let (Some(remote), Some(id)) = (&self.options.remote, &self.remote_id) {
            models.push(ModelEntry {
                id: id.clone(),
                dimension: remote.dimension,
                runs: remote.url.clone(),
                description: format!("{} on an OpenAI-compatible server", remote.model),
            });
        }
        models
    }

    /// The model `requested` names: a model id, or `remote` for the configured server's model.
    /// Unknown names are [`GatewayError::ModelMissing`], listing what is available.
    pub fn resolve(&self, requested: &str) -> Result<ModelEntry, GatewayError> {
        let models = self.models();
        let wanted = match (requested, &self.remote_id) {
            ("remote", Some(id)) => id.as_str(),
            _ => requested,
        };
        models
            .iter()
            .find(|model| model.id == wanted)
            .cloned()
            .ok_or_else(|| {
                let names: Vec<&str> = models.iter().map(|model| model.id.as_str()).collect();
                GatewayError::ModelMissing(format!(
                    "model `{requested}` is not available here (available: {}; a local model \
                     needs scripts/setup-model, a remote one embeddings.url)",
                    names.join(", ")
                ))
            })
    }

    async fn load(&self, model: &str, role: EmbedRole) -> Result<Arc<dyn Embedder>, GatewayError> {
        if let Some(local) = local_model(model) {
            let files = ModelFiles::locate_model(&self.options.models_dir, local)?;
            let (sessions, threads) = match role {
                EmbedRole::Projection => (self.options.sessions.max(1), self.options.threads),
                EmbedRole::Query => (1, Some(1)),
            };
            let batch = self.options.batch.max(1);
            let embedder = tokio::task::spawn_blocking(move || {
                LocalEmbedder::load(&files, sessions, threads)
                    .map(|embedder| embedder.with_batch_size(batch))
            })
            .await
            .map_err(|error| GatewayError::ModelMissing(format!("loading {model}: {error}")))??;
            tracing::info!(model, ?role, sessions, "embedding model loaded");
            return Ok(match role {
                EmbedRole::Projection => Arc::new(BatchingEmbedder::start(
                    Arc::new(embedder),
                    batch * 16,
                    sessions,
                )),
                EmbedRole::Query => Arc::new(embedder),
            });
        }
        match (&self.options.remote, &self.remote_id) {
            (Some(options), Some(id)) if id == model => {
                let remote = RemoteEmbedder::new(options.clone())?;
                match remote.probe().await {
                    Ok(()) => tracing::info!(model, "remote embedding server answers"),
                    // Not reachable now: every answer is checked anyway, and jobs retry.
                    Err(GatewayError::Config(message)) => {
                        return Err(GatewayError::Config(message))
                    }
                    Err(error) => tracing::warn!(
                        model,
                        %error,
                        "the remote embedding server did not answer its probe; jobs retry until it does"
                    ),
                }
                let remote: Arc<dyn Embedder> = Arc::new(remote);
                Ok(match role {
                    EmbedRole::Projection => Arc::new(BatchingEmbedder::start(
                        remote,
                        options.batch.max(1),
                        self.options.remote_parallel.max(1),
                    )),
                    EmbedRole::Query => remote,
                })
            }
            _ => Err(self
                .resolve(model)
                .err()
                .unwrap_or_else(|| GatewayError::ModelMissing(format!("model {model}")))),
        }
    }
}

#[async_trait]
impl Embedders for ModelCatalog {
    async fn embedder(
        &self,
        model: &str,
        role: EmbedRole,
    ) -> Result<Arc<dyn Embedder>, GatewayError> {
        let slot = {
            let mut loaded = self
                .loaded
                .lock()
                .map_err(|_| GatewayError::Embedder("the model catalog lock is poisoned".into()))?;
            loaded.entry((model.to_owned(), role)).or_default().clone()
        };
        slot.get_or_try_init(|| self.load(model, role))
            .await
            .cloned()
    }
}
