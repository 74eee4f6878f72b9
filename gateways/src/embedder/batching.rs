//! Batching embedding requests across jobs, so that the model (or the remote server) stays busy
//! and each call carries as many texts as it can take.

use std::sync::Arc;

use async_trait::async_trait;

use super::Embedder;
use crate::GatewayError;

/// Vectors embedded in `order` (`order[k]` is the original index of the `k`-th text) put back
/// in the original order.
fn unsort(vectors: Vec<Vec<f32>>, order: &[usize]) -> Vec<Vec<f32>> {
    let mut placed: Vec<Vec<f32>> = vec![Vec::new(); vectors.len()];
    for (vector, &index) in vectors.into_iter().zip(order) {
        if let Some(slot) = placed.get_mut(index) {
            *slot = vector;
        }
    }
    placed
}

struct EmbedRequest {
    texts: Vec<String>,
    reply: tokio::sync::oneshot::Sender<Result<Vec<Vec<f32>>, GatewayError>>,
}

/// Batches embedding requests across jobs so the model stays busy: while one batch runs,
/// requests queue; the next batch takes everything queued (up to `max_texts`) in one call.
#[derive(Clone)]
pub struct BatchingEmbedder {
    sender: tokio::sync::mpsc::Sender<EmbedRequest>,
    model_id: String,
    dimension: usize,
    agreement: f32,
}

impl std::fmt::Debug for BatchingEmbedder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("BatchingEmbedder")
            .field("model", &self.model_id)
            .finish()
    }
}

impl BatchingEmbedder {
    /// Starts the batching task over `inner` (on the current tokio runtime), running up to
    /// `parallel` batches at once (one per model session).
    pub fn start(inner: Arc<dyn Embedder>, max_texts: usize, parallel: usize) -> BatchingEmbedder {
        let (sender, mut receiver) = tokio::sync::mpsc::channel::<EmbedRequest>(1024);
        let model_id = inner.model_id().to_owned();
        let dimension = inner.dimension();
        let agreement = inner.agreement();
        let max_texts = max_texts.max(1);
        let parallel = parallel.max(1);
        let slots = Arc::new(tokio::sync::Semaphore::new(parallel));
        // Signalled whenever a batch ends.
        let ended = Arc::new(tokio::sync::Notify::new());
        tokio::spawn(async move {
            loop {
                // Wait for a free session first, so requests keep queueing into the next batch.
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    break;
                };
                let Some(first) = receiver.recv().await else {
                    break;
                };
                let mut batch = vec![first];
                let mut texts: usize = batch[0].texts.len();
                loop {
                    while texts < max_texts {
                        match receiver.try_recv() {
                            Ok(request) => {
                                texts += request.texts.len();
                                batch.push(request);
                            }
                            Err(_) => break,
                        }
                    }
                    // A batch that is not full waits while another one runs (until requests
                    // fill it, or a batch ends): an idle model gets work at once, a busy one
                    // gets full batches instead of many small calls.
                    let busy = slots.available_permits() + 1 < parallel;
                    if texts >= max_texts || !busy {
                        break;
                    }
                    tokio::select! {
                        request = receiver.recv() => match request {
                            Some(request) => {
                                texts += request.texts.len();
                                batch.push(request);
                            }
                            None => break,
                        },
                        () = ended.notified() => break,
                    }
                }
                let sizes: Vec<usize> = batch.iter().map(|request| request.texts.len()).collect();
                let all: Vec<String> = batch
                    .iter_mut()
                    .flat_map(|request| std::mem::take(&mut request.texts))
                    .collect();
                // Embedded sorted by length, so that the model's sub-batches do not pad a short
                // chunk to the length of a long one; answered in request order.
                let mut order: Vec<usize> = (0..all.len()).collect();
                order.sort_by_key(|&index| all[index].len());
                let mut slots: Vec<Option<String>> = all.into_iter().map(Some).collect();
                let sorted: Vec<String> = order
                    .iter()
                    .filter_map(|&index| slots.get_mut(index).and_then(Option::take))
                    .collect();
                let inner = inner.clone();
                let ended = ended.clone();
                tokio::spawn(async move {
                    match inner
                        .embed(sorted)
                        .await
                        .map(|vectors| unsort(vectors, &order))
                    {
                        Ok(vectors) => {
                            let mut vectors = vectors.into_iter();
                            for (request, size) in batch.into_iter().zip(sizes) {
                                let _ = request
                                    .reply
                                    .send(Ok(vectors.by_ref().take(size).collect()));
                            }
                        }
                        Err(error) => {
                            for request in batch {
                                let _ = request.reply.send(Err(error.clone()));
                            }
                        }
                    }
                    drop(slot);
                    // A stored permit if nobody waits: a batch that starts waiting later
                    // sees it and goes (at worst one batch leaves before it is full).
                    ended.notify_one();
                });
            }
        });
        BatchingEmbedder {
            sender,
            model_id,
            dimension,
            agreement,
        }
    }
}

#[async_trait]
impl Embedder for BatchingEmbedder {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn dimension(&self) -> usize {
        self.dimension
    }

    fn agreement(&self) -> f32 {
        self.agreement
    }

    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, GatewayError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.sender
            .send(EmbedRequest { texts, reply })
            .await
            .map_err(|_| GatewayError::Embedder("the embedding batcher stopped".to_owned()))?;
        answer.await.map_err(|_| {
            GatewayError::Embedder("the embedding batcher dropped a request".to_owned())
        })?
    }
}
