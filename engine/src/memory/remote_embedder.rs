//! [`RemoteEmbedder`]: code turned into vectors by an OpenAI-compatible embeddings endpoint
//! (`POST {base_url}/embeddings`, as served by OpenAI, vLLM, llama.cpp's server and Ollama's
//! OpenAI route), for `[memory.embedder]`.
//!
//! The memory asks for vectors synchronously, on the thread of the session that runs the
//! code, so requests go to a thread of their own that runs them concurrently on a small
//! runtime, and each caller waits at most `timeout` for its answer. A text that cannot be
//! embedded (the endpoint failed, timed out or answered nonsense) gets a zero vector, which
//! matches nothing: an execution never fails or waits longer because of the embedder. Recent
//! answers are kept, since a check and the record after it embed the same code.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use pyvisor_actors::memory::Embedder;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc as tokio_mpsc;
use xxhash_rust::xxh3::xxh3_64;

use crate::config::RemoteEmbedderConfig;

/// Answers kept for texts embedded recently.
const CACHE_ENTRIES: usize = 4096;
/// Texts in one request at most.
const MAX_BATCH: usize = 256;

/// Why a remote embedder could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RemoteEmbedderError {
    #[error("memory.embedder.api_key_env names {0}, which is not set in the engine's environment")]
    MissingKey(String),
    #[error("start the embedder's thread: {0}")]
    Thread(#[from] std::io::Error),
    #[error("the embeddings endpoint {url} did not answer a first request: {reason}")]
    Unreachable { url: String, reason: String },
}

/// An [`Embedder`] backed by an OpenAI-compatible embeddings endpoint.
pub struct RemoteEmbedder {
    name: String,
    dims: usize,
    timeout: Duration,
    requests: tokio_mpsc::UnboundedSender<Request>,
    cache: Mutex<Cache>,
    errors: AtomicU64,
    /// Whether the last request failed: warn once per run of failures.
    failing: AtomicBool,
}

/// Texts to embed and where their vectors go.
struct Request {
    texts: Vec<String>,
    reply: mpsc::SyncSender<Result<Vec<Vec<f32>>, String>>,
}

#[derive(Serialize)]
struct EmbeddingsBody<'a> {
    model: &'a str,
    input: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    dimensions: Option<u32>,
}

#[derive(Deserialize)]
struct EmbeddingsAnswer {
    data: Vec<EmbeddingItem>,
}

#[derive(Deserialize)]
struct EmbeddingItem {
    index: usize,
    embedding: Vec<f32>,
}

impl RemoteEmbedder {
    /// Starts the embedder and asks the endpoint for one vector, to learn (or check) the
    /// vectors' length. Blocking, up to the configured timeout.
    pub fn connect(config: &RemoteEmbedderConfig) -> Result<Self, RemoteEmbedderError> {
        let key = match &config.api_key_env {
            Some(name) => Some(
                std::env::var(name).map_err(|_| RemoteEmbedderError::MissingKey(name.clone()))?,
            ),
            None => None,
        };
        let requests = start_thread(config.clone(), key)?;
        let mut embedder = RemoteEmbedder {
            name: String::new(),
            dims: 0,
            timeout: config.timeout,
            requests,
            cache: Mutex::new(Cache::default()),
            errors: AtomicU64::new(0),
            failing: AtomicBool::new(false),
        };
        let unreachable = |reason: String| RemoteEmbedderError::Unreachable {
            url: config.base_url.clone(),
            reason,
        };
        let first = embedder
            .ask(vec!["import pandas as pd".to_owned()])
            .map_err(unreachable)?;
        let dims = first[0].len();
        if config
            .dimensions
            .is_some_and(|asked| asked as usize != dims)
        {
            return Err(unreachable(format!(
                "asked for {} dimensions, got {dims}",
                config.dimensions.unwrap_or_default()
            )));
        }
        embedder.dims = dims;
        embedder.name = format!("openai:{}:{dims}", config.model);
        Ok(embedder)
    }

    /// Sends `texts` to the endpoint's thread and waits for their vectors.
    fn ask(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, String> {
        let expected = texts.len();
        let (reply, answer) = mpsc::sync_channel(1);
        self.requests
            .send(Request { texts, reply })
            .map_err(|_| "the embedder's thread has stopped".to_owned())?;
        let vectors = match answer.recv_timeout(self.timeout) {
            Ok(answer) => answer?,
            Err(_) => return Err(format!("no answer within {:?}", self.timeout)),
        };
        if vectors.len() != expected {
            return Err(format!("{} vectors for {expected} texts", vectors.len()));
        }
        Ok(vectors)
    }

    /// Records how the last request went; warns when failures start and says when they end.
    fn note(&self, outcome: &Result<Vec<Vec<f32>>, String>, texts: usize) {
        match outcome {
            Ok(_) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(embedder = %self.name, "the embeddings endpoint answers again");
                }
            }
            Err(reason) => {
                self.errors.fetch_add(texts as u64, Ordering::Relaxed);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        embedder = %self.name,
                        %reason,
                        "the embeddings endpoint failed: code goes unmatched by memory until it answers"
                    );
                }
            }
        }
    }
}

impl Embedder for RemoteEmbedder {
    fn name(&self) -> &str {
        &self.name
    }

    fn dims(&self) -> usize {
        self.dims
    }

    fn embed(&self, code: &str) -> Vec<f32> {
        self.embed_batch(&[code]).pop().unwrap_or_default()
    }

    fn embed_batch(&self, texts: &[&str]) -> Vec<Vec<f32>> {
        let keys: Vec<u64> = texts.iter().map(|text| xxh3_64(text.as_bytes())).collect();
        let mut vectors: Vec<Option<Vec<f32>>> = {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            keys.iter().map(|key| cache.get(*key)).collect()
        };
        let missing: Vec<usize> = (0..texts.len()).filter(|&i| vectors[i].is_none()).collect();
        for chunk in missing.chunks(MAX_BATCH) {
            let asked: Vec<String> = chunk.iter().map(|&i| texts[i].to_owned()).collect();
            let answer = self.ask(asked).and_then(|found| {
                if found.iter().all(|vector| vector.len() == self.dims) {
                    Ok(found)
                } else {
                    Err(format!("a vector without {} dimensions", self.dims))
                }
            });
            self.note(&answer, chunk.len());
            let Ok(found) = answer else { continue };
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            for (&i, mut vector) in chunk.iter().zip(found) {
                pyvisor_actors::memory::normalize(&mut vector);
                cache.put(keys[i], vector.clone());
                vectors[i] = Some(vector);
            }
        }
        vectors
            .into_iter()
            .map(|vector| vector.unwrap_or_else(|| vec![0.0; self.dims]))
            .collect()
    }

    fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}

/// Where and how requests go: built once, shared by every request.
struct Endpoint {
    client: reqwest::Client,
    url: String,
    key: Option<String>,
    model: String,
    dimensions: Option<u32>,
}

/// Starts the thread that sends requests, each on a task of its own.
fn start_thread(
    config: RemoteEmbedderConfig,
    key: Option<String>,
) -> Result<tokio_mpsc::UnboundedSender<Request>, RemoteEmbedderError> {
    let client = crate::http_client::builder()
        .map_err(|err| RemoteEmbedderError::Unreachable {
            url: config.base_url.clone(),
            reason: format!("set up TLS: {err}"),
        })?
        .timeout(config.timeout)
        .build()
        .map_err(|err| RemoteEmbedderError::Unreachable {
            url: config.base_url.clone(),
            reason: format!("build the HTTP client: {err}"),
        })?;
    let endpoint = Arc::new(Endpoint {
        client,
        url: format!("{}/embeddings", config.base_url.trim_end_matches('/')),
        key,
        model: config.model,
        dimensions: config.dimensions,
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (requests, mut received) = tokio_mpsc::unbounded_channel::<Request>();
    std::thread::Builder::new()
        .name("pyvisor-embedder".into())
        .spawn(move || {
            runtime.block_on(async move {
                while let Some(Request { texts, reply }) = received.recv().await {
                    let endpoint = endpoint.clone();
                    tokio::spawn(async move {
                        let _ = reply.try_send(endpoint.post(&texts).await);
                    });
                }
            })
        })?;
    Ok(requests)
}

impl Endpoint {
    /// One request: the vectors in the order of `texts`.
    async fn post(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
        let body = EmbeddingsBody {
            model: &self.model,
            input: texts,
            dimensions: self.dimensions,
        };
        let mut builder = self.client.post(&self.url).json(&body);
        if let Some(key) = &self.key {
            builder = builder.bearer_auth(key);
        }
        let response = builder.send().await.map_err(|err| err.to_string())?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("{} answered {status}", self.url));
        }
        let mut answer: EmbeddingsAnswer = response.json().await.map_err(|err| {
            format!(
                "{} answered something other than embeddings: {err}",
                self.url
            )
        })?;
        answer.data.sort_by_key(|item| item.index);
        Ok(answer.data.into_iter().map(|item| item.embedding).collect())
    }
}

/// Vectors of recently embedded texts, by the texts' hash; the oldest go first.
#[derive(Default)]
struct Cache {
    vectors: HashMap<u64, Vec<f32>>,
    order: VecDeque<u64>,
}

impl Cache {
    fn get(&mut self, key: u64) -> Option<Vec<f32>> {
        self.vectors.get(&key).cloned()
    }

    fn put(&mut self, key: u64, vector: Vec<f32>) {
        if self.vectors.insert(key, vector).is_none() {
            self.order.push_back(key);
            if self.order.len() > CACHE_ENTRIES {
                if let Some(oldest) = self.order.pop_front() {
                    self.vectors.remove(&oldest);
                }
            }
        }
    }
}
