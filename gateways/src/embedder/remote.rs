//! A remote embedder: any server that speaks OpenAI's `POST /v1/embeddings`
//! (text-embeddings-inference, vLLM, Ollama, infinity, llama.cpp's server, hosted providers).
//!
//! ## Contract
//! - Texts go in batches of at most [`RemoteOptions::batch`] per call, each call bounded by
//!   [`RemoteOptions::timeout`]; the answer is bounded in size before it is parsed.
//! - Every answer is checked: one vector per text (by `index`), every one of the configured
//!   dimension and finite. Vectors are L2-normalised here (not every server does).
//! - Errors are typed for the worker's retries: no connection, a timeout, 408 and 5xx are
//!   [`GatewayError::Unavailable`]/[`GatewayError::Timeout`] (retried with backoff); 429 is
//!   [`GatewayError::RateLimited`] with the server's `Retry-After` (a snooze that costs no
//!   attempt); 401, 403 and 404 are the server's configuration, not the request's, so they are
//!   retried too; any other 4xx is the request's fault ([`GatewayError::Rejected`]: permanent).
//! - The key comes from the environment only and never appears in a log or an error.

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;

use super::{normalized, Embedder};
use crate::GatewayError;

const STORE: &str = "embedder";

/// Longest `Retry-After` honoured; a longer one is cut to this (the job asks again then).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// Where the server is and what it serves.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteOptions {
    /// The API's base URL, up to and including `/v1` (e.g. `http://gpu-1:8080/v1`);
    /// requests go to `{url}/embeddings`.
    pub url: String,
    /// The model name the server knows.
    pub model: String,
    /// The dimension its vectors have (checked against every answer).
    pub dimension: usize,
    /// The bearer key, when the server wants one (from the environment only).
    pub key: Option<String>,
    /// Most texts per call (the server's limit).
    pub batch: usize,
    /// Time limit of one call.
    pub timeout: Duration,
}

impl std::fmt::Debug for RemoteOptions {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RemoteOptions")
            .field("url", &self.url)
            .field("model", &self.model)
            .field("dimension", &self.dimension)
            .field("key", &self.key.as_ref().map(|_| "(set)"))
            .field("batch", &self.batch)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The model id a generation records for `model` on the server at `url`: the server's
/// identity is part of it, so moving to another server is a new generation.
pub fn remote_model_id(url: &str, model: &str) -> String {
    format!("openai:{model}@{}", url.trim_end_matches('/'))
}

/// The OpenAI-compatible embeddings client.
pub struct RemoteEmbedder {
    client: reqwest::Client,
    options: RemoteOptions,
    id: String,
    endpoint: String,
}

impl std::fmt::Debug for RemoteEmbedder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RemoteEmbedder")
            .field("id", &self.id)
            .field("options", &self.options)
            .finish()
    }
}

#[derive(Deserialize)]
struct Answer {
    data: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    index: usize,
    embedding: Vec<f32>,
}

impl RemoteEmbedder {
    /// A client of the server in `options` (no call is made: see [`RemoteEmbedder::probe`]).
    pub fn new(options: RemoteOptions) -> Result<RemoteEmbedder, GatewayError> {
        if options.dimension == 0 {
            return Err(GatewayError::Config(
                "the remote embedding model's dimension must be set (embeddings.dimensions)"
                    .to_owned(),
            ));
        }
        let client = reqwest::Client::builder()
            .timeout(options.timeout)
            .connect_timeout(options.timeout.min(Duration::from_secs(5)))
            .build()
            .map_err(|error| GatewayError::Config(format!("the embeddings client: {error}")))?;
        let base = options.url.trim_end_matches('/');
        Ok(RemoteEmbedder {
            client,
            id: remote_model_id(base, &options.model),
            endpoint: format!("{base}/embeddings"),
            options: RemoteOptions {
                batch: options.batch.max(1),
                ..options
            },
        })
    }

    /// Embeds one text and checks the dimension the server answers with against the
    /// configured one (a mismatch is [`GatewayError::Config`]: the generation records the
    /// dimension, so a different model needs a new generation).
    pub async fn probe(&self) -> Result<(), GatewayError> {
        let vectors = self
            .call(&["cairn: dimension probe".to_owned()], None)
            .await?;
        match vectors.first().map(Vec::len) {
            Some(dimension) if dimension == self.options.dimension => Ok(()),
            other => Err(GatewayError::Config(format!(
                "the embedding server at {} answers {} with {} dimensions; embeddings.dimensions \
                 is {} (a different model needs a new generation with its own dimension)",
                self.options.url,
                self.options.model,
                other.map_or("no vector".to_owned(), |d| d.to_string()),
                self.options.dimension
            ))),
        }
    }

    /// One call for at most [`RemoteOptions::batch`] texts, every vector of `dimension` when
    /// one is given.
    async fn call(
        &self,
        texts: &[String],
        dimension: Option<usize>,
    ) -> Result<Vec<Vec<f32>>, GatewayError> {
        let mut request = self.client.post(&self.endpoint).json(&serde_json::json!({
            "model": self.options.model,
            "input": texts,
        }));
        if let Some(key) = &self.options.key {
            request = request.bearer_auth(key);
        }
        let mut response = request
            .send()
            .await
            .map_err(|error| self.transport(error))?;
        let status = response.status();
        // Bounded: what `texts` can need as JSON floats, and room for an error document.
        let limit = texts.len() * self.options.dimension.max(1) * 32 + 64 * 1024;
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| self.transport(error))?
        {
            if body.len() + chunk.len() > limit {
                return Err(GatewayError::Embedder(format!(
                    "the embedding server at {} sent more than {limit} bytes for {} texts",
                    self.options.url,
                    texts.len()
                )));
            }
            body.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            return Err(self.refusal(status, response.headers(), &body));
        }
        self.parse(texts.len(), dimension, &body)
    }

    fn transport(&self, error: reqwest::Error) -> GatewayError {
        let message = format!("{} ({}): {error}", self.endpoint, self.options.model);
        if error.is_timeout() {
            GatewayError::Timeout {
                store: STORE,
                message,
            }
        } else {
            GatewayError::Unavailable {
                store: STORE,
                message,
            }
        }
    }

    fn refusal(
        &self,
        status: reqwest::StatusCode,
        headers: &reqwest::header::HeaderMap,
        body: &[u8],
    ) -> GatewayError {
        let said: String = String::from_utf8_lossy(body).chars().take(300).collect();
        let message = format!(
            "{} answered {status} for model {}: {said}",
            self.endpoint, self.options.model
        );
        match status.as_u16() {
            429 => GatewayError::RateLimited {
                store: STORE,
                retry_after: retry_after(headers),
                message,
            },
            401 | 403 => GatewayError::Unavailable {
                store: STORE,
                message: format!("{message} (check the key in CAIRN_EMBEDDINGS_KEY)"),
            },
            404 => GatewayError::Unavailable {
                store: STORE,
                message: format!("{message} (check embeddings.url and embeddings.model)"),
            },
            408 => GatewayError::Timeout {
                store: STORE,
                message,
            },
            400..=499 => GatewayError::Rejected {
                store: STORE,
                message,
            },
            _ => GatewayError::Unavailable {
                store: STORE,
                message,
            },
        }
    }

    fn parse(
        &self,
        count: usize,
        dimension: Option<usize>,
        body: &[u8],
    ) -> Result<Vec<Vec<f32>>, GatewayError> {
        let malformed = |why: String| {
            GatewayError::Embedder(format!(
                "the embedding server at {} sent a malformed answer: {why}",
                self.options.url
            ))
        };
        let answer: Answer =
            serde_json::from_slice(body).map_err(|error| malformed(error.to_string()))?;
        if answer.data.len() != count {
            return Err(malformed(format!(
                "{} vectors for {count} texts",
                answer.data.len()
            )));
        }
        let mut vectors: Vec<Option<Vec<f32>>> = vec![None; count];
        for item in answer.data {
            if dimension.is_some_and(|dimension| item.embedding.len() != dimension) {
                return Err(malformed(format!(
                    "a vector of {} dimensions; the generation's model has {} \
                     (embeddings.dimensions)",
                    item.embedding.len(),
                    self.options.dimension
                )));
            }
            if item.embedding.iter().any(|x| !x.is_finite()) {
                return Err(malformed("a vector with a non-finite value".to_owned()));
            }
            let slot = vectors
                .get_mut(item.index)
                .ok_or_else(|| malformed(format!("index {} of {count}", item.index)))?;
            if slot.replace(normalized(item.embedding)).is_some() {
                return Err(malformed(format!("index {} twice", item.index)));
            }
        }
        vectors
            .into_iter()
            .map(|vector| vector.ok_or_else(|| malformed("a text without a vector".to_owned())))
            .collect()
    }
}

/// The server's `Retry-After` in seconds (an HTTP date or nothing counts as one second),
/// at most [`MAX_RETRY_AFTER`].
fn retry_after(headers: &reqwest::header::HeaderMap) -> Duration {
    headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<f64>().ok())
        .filter(|seconds| seconds.is_finite() && *seconds >= 0.0)
        .map(|seconds| Duration::from_secs_f64(seconds.min(MAX_RETRY_AFTER.as_secs_f64())))
        .unwrap_or(Duration::from_secs(1))
}

#[async_trait]
impl Embedder for RemoteEmbedder {
    fn model_id(&self) -> &str {
        &self.id
    }

    fn dimension(&self) -> usize {
        self.options.dimension
    }

    fn agreement(&self) -> f32 {
        super::REMOTE_AGREEMENT
    }

    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, GatewayError> {
        let mut vectors = Vec::with_capacity(texts.len());
        for batch in texts.chunks(self.options.batch) {
            vectors.extend(self.call(batch, Some(self.options.dimension)).await?);
        }
        Ok(vectors)
    }
}
