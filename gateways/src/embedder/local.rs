//! The local embedding models: sentence-transformers/all-MiniLM-L6-v2 in fp32 or int8, through
//! fastembed (ONNX Runtime loaded dynamically from the file that `scripts/setup-model` installs).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;

use super::{Embedder, LocalModel, MINILM, ORT_LIBRARY};
use crate::GatewayError;

/// Where a local model's files are.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    /// Which model.
    pub model: &'static LocalModel,
    /// `models/all-MiniLM-L6-v2` (or `-int8`): model.onnx and the tokenizer files.
    pub model_dir: PathBuf,
    /// `models/onnxruntime/libonnxruntime.so.1.31.1`.
    pub ort_library: PathBuf,
}

impl ModelFiles {
    /// The default model's files under a models directory (as `scripts/setup-model` lays
    /// them out), checked to exist. A missing file is an error that names the command that
    /// installs it.
    pub fn locate(models_dir: &Path) -> Result<ModelFiles, GatewayError> {
        ModelFiles::locate_model(models_dir, &MINILM)
    }

    /// [`ModelFiles::locate`] for `model`.
    pub fn locate_model(
        models_dir: &Path,
        model: &'static LocalModel,
    ) -> Result<ModelFiles, GatewayError> {
        let files = ModelFiles {
            model,
            model_dir: models_dir.join(model.directory),
            ort_library: models_dir.join(ORT_LIBRARY),
        };
        for path in [
            files.model_dir.join("model.onnx"),
            files.model_dir.join("tokenizer.json"),
            files.model_dir.join("config.json"),
            files.model_dir.join("special_tokens_map.json"),
            files.model_dir.join("tokenizer_config.json"),
            files.ort_library.clone(),
        ] {
            if !path.is_file() {
                return Err(GatewayError::ModelMissing(format!(
                    "{} is missing; run scripts/setup-model (or point CAIRN_MODELS_DIR at a directory it filled)",
                    path.display()
                )));
            }
        }
        Ok(files)
    }

    fn read(&self, name: &str) -> Result<Vec<u8>, GatewayError> {
        let path = self.model_dir.join(name);
        std::fs::read(&path).map_err(|error| {
            GatewayError::ModelMissing(format!("reading {}: {error}", path.display()))
        })
    }

    /// The model's tokenizer without the padding and truncation baked into `tokenizer.json`
    /// (the chunker must see every token).
    pub fn tokenizer(&self) -> Result<tokenizers::Tokenizer, GatewayError> {
        let mut tokenizer = tokenizers::Tokenizer::from_bytes(self.read("tokenizer.json")?)
            .map_err(|error| GatewayError::ModelMissing(format!("tokenizer.json: {error}")))?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|error| GatewayError::ModelMissing(format!("tokenizer.json: {error}")))?;
        Ok(tokenizer)
    }
}

/// ONNX Runtime is loaded, and its one environment created, once per process.
fn onnx_runtime(library: &Path) -> Result<ort::environment::Environment, GatewayError> {
    static LOADED: OnceLock<Result<ort::environment::Environment, String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let builder = ort::init_from(library).map_err(|error| {
                format!("loading ONNX Runtime from {}: {error}", library.display())
            })?;
            builder
                .with_name("cairn")
                .build()
                .map_err(|error| format!("creating the ONNX Runtime environment: {error}"))
        })
        .clone()
        .map_err(GatewayError::ModelMissing)
}

/// fastembed running the local model in process. Inference runs on tokio's blocking pool,
/// one batch at a time (the session is not shared between threads).
pub struct LocalEmbedder {
    model: &'static LocalModel,
    /// Independent ONNX Runtime sessions of the same model: batches run on them in parallel.
    sessions: Arc<Vec<Mutex<fastembed::TextEmbedding>>>,
    next: Arc<std::sync::atomic::AtomicUsize>,
    batch_size: usize,
}

impl std::fmt::Debug for LocalEmbedder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("LocalEmbedder")
            .field("model", &self.model.id)
            .field("batch_size", &self.batch_size)
            .field("sessions", &self.sessions.len())
            .finish()
    }
}

/// Texts per ONNX Runtime call (measured: batches of 4-8 chunks are fastest on 2 cores).
pub const DEFAULT_EMBED_BATCH: usize = 8;

impl LocalEmbedder {
    /// Loads the model (a second or two per session). `sessions`: independent inference
    /// sessions that run batches in parallel; `threads`: ONNX Runtime intra-op threads per
    /// session (`None`: every core).
    pub fn load(
        files: &ModelFiles,
        sessions: usize,
        threads: Option<usize>,
    ) -> Result<LocalEmbedder, GatewayError> {
        let loaded = (0..sessions.max(1))
            .map(|_| Self::session(files, threads).map(Mutex::new))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(LocalEmbedder {
            model: files.model,
            sessions: Arc::new(loaded),
            next: Arc::default(),
            batch_size: DEFAULT_EMBED_BATCH,
        })
    }

    fn session(
        files: &ModelFiles,
        threads: Option<usize>,
    ) -> Result<fastembed::TextEmbedding, GatewayError> {
        let environment = onnx_runtime(&files.ort_library)?;
        let model = fastembed::UserDefinedEmbeddingModel::new(
            files.read("model.onnx")?,
            fastembed::TokenizerFiles {
                tokenizer_file: files.read("tokenizer.json")?,
                config_file: files.read("config.json")?,
                special_tokens_map_file: files.read("special_tokens_map.json")?,
                tokenizer_config_file: files.read("tokenizer_config.json")?,
            },
        )
        .with_pooling(fastembed::Pooling::Mean);
        let mut options = fastembed::InitOptionsUserDefined::new()
            .with_environment(environment)
            .with_max_length(files.model.max_tokens)
            // Idle ONNX Runtime threads sleep instead of spinning: the model shares the CPU
            // with the ledger, the vector store and the HTTP server.
            .with_session_config("session.intra_op.allow_spinning", "0");
        if let Some(threads) = threads {
            options = options.with_intra_threads(threads.max(1));
        }
        fastembed::TextEmbedding::try_new_from_user_defined(model, options).map_err(|error| {
            GatewayError::ModelMissing(format!("loading {}: {error}", files.model.id))
        })
    }

    fn shape(&self) -> Shape {
        Shape {
            batch_size: self.batch_size,
            dimension: self.model.dimension,
        }
    }

    /// Sessions that can run at once.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Sets the texts per ONNX Runtime call.
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size.max(1);
        self
    }

    /// Embeds on the calling thread, on one session (a free one when there is).
    pub fn embed_blocking(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, GatewayError> {
        embed_on(&self.sessions, &self.next, texts, self.shape())
    }

    /// Embeds with every session at once, each on its own thread over a share of the texts
    /// (the raw embedder's best rate, for benchmarks).
    pub fn embed_parallel(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, GatewayError> {
        let share = texts.len().div_ceil(self.sessions.len()).max(1);
        std::thread::scope(|scope| {
            let handles: Vec<_> = texts
                .chunks(share)
                .zip(self.sessions.iter())
                .map(|(part, session)| {
                    scope.spawn(move || embed_locked(session, part, self.shape()))
                })
                .collect();
            let mut vectors = Vec::with_capacity(texts.len());
            for handle in handles {
                let part = handle.join().map_err(|_| {
                    GatewayError::Embedder("an embedding thread panicked".to_owned())
                })??;
                vectors.extend(part);
            }
            Ok(vectors)
        })
    }
}

/// Texts per ONNX Runtime call, and the dimension every vector must have.
#[derive(Debug, Clone, Copy)]
struct Shape {
    batch_size: usize,
    dimension: usize,
}

/// Runs on a free session, or waits for the next one in turn when all are busy.
fn embed_on(
    sessions: &[Mutex<fastembed::TextEmbedding>],
    next: &std::sync::atomic::AtomicUsize,
    texts: &[String],
    shape: Shape,
) -> Result<Vec<Vec<f32>>, GatewayError> {
    for session in sessions {
        if let Ok(mut model) = session.try_lock() {
            return embed_with(&mut model, texts, shape);
        }
    }
    let turn = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % sessions.len().max(1);
    match sessions.get(turn) {
        Some(session) => embed_locked(session, texts, shape),
        None => Err(GatewayError::Embedder(
            "no embedding session is loaded".to_owned(),
        )),
    }
}

fn embed_locked(
    model: &Mutex<fastembed::TextEmbedding>,
    texts: &[String],
    shape: Shape,
) -> Result<Vec<Vec<f32>>, GatewayError> {
    let mut model = model
        .lock()
        .map_err(|_| GatewayError::Embedder("the embedding model lock is poisoned".to_owned()))?;
    embed_with(&mut model, texts, shape)
}

fn embed_with(
    model: &mut fastembed::TextEmbedding,
    texts: &[String],
    shape: Shape,
) -> Result<Vec<Vec<f32>>, GatewayError> {
    let vectors = model
        .embed(texts, Some(shape.batch_size))
        .map_err(|error| GatewayError::Embedder(error.to_string()))?;
    if vectors.len() != texts.len() || vectors.iter().any(|v| v.len() != shape.dimension) {
        return Err(GatewayError::Embedder(format!(
            "the model returned {} vectors for {} texts (dimension {:?}, expected {})",
            vectors.len(),
            texts.len(),
            vectors.first().map(Vec::len),
            shape.dimension
        )));
    }
    Ok(vectors)
}

#[async_trait]
impl Embedder for LocalEmbedder {
    fn model_id(&self) -> &str {
        self.model.id
    }

    fn dimension(&self) -> usize {
        self.model.dimension
    }

    fn agreement(&self) -> f32 {
        self.model.agreement
    }

    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, GatewayError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let sessions = self.sessions.clone();
        let next = self.next.clone();
        let shape = self.shape();
        tokio::task::spawn_blocking(move || embed_on(&sessions, &next, &texts, shape))
            .await
            .map_err(|error| GatewayError::Embedder(format!("embedding task failed: {error}")))?
    }
}
