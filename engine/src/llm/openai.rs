//! [`OpenAiClient`]: chat completions from an OpenAI-compatible endpoint (`POST
//! {base_url}/chat/completions`, as served by OpenAI, vLLM, llama.cpp's server and Ollama's
//! OpenAI route), with retries and backoff on 429, 5xx and unreachable endpoints.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::client::{ChatMessage, ChatRequest, Completion, LlmClient, LlmError, Usage};
use crate::config::{LlmConfig, Price};

/// The first retry's wait; each further one doubles it.
const BACKOFF_START: Duration = Duration::from_millis(250);
/// The longest wait between two attempts, a `Retry-After` included.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The most of an error body quoted in an error.
const QUOTED_BYTES: usize = 400;

/// An [`LlmClient`] for an OpenAI-compatible chat completions endpoint.
#[derive(Clone)]
pub struct OpenAiClient {
    inner: Arc<Inner>,
}

struct Inner {
    client: reqwest::Client,
    url: String,
    key: Option<String>,
    default_model: String,
    models: BTreeMap<String, String>,
    prices: BTreeMap<String, Price>,
    timeout: Duration,
    max_retries: u32,
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    messages: &'a [ChatMessage],
}

#[derive(Deserialize)]
struct Answer {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<AnswerUsage>,
}

#[derive(Deserialize)]
struct Choice {
    message: AnswerMessage,
}

#[derive(Deserialize)]
struct AnswerMessage {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize)]
struct AnswerUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

/// How one attempt failed, and whether another may succeed.
struct Failure {
    error: LlmError,
    retry: bool,
    /// The wait the endpoint asked for (`Retry-After`).
    after: Option<Duration>,
}

impl OpenAiClient {
    /// A client for `config`'s endpoint, with the key read from the engine's environment.
    pub fn new(config: &LlmConfig) -> Result<Self, LlmError> {
        let key = match &config.api_key_env {
            Some(name) if pyvisor_actors::worker::inherited_by_workers(name) => {
                return Err(LlmError::Setup(format!(
                    "llm.api_key_env names {name}, a variable that workers inherit: \
                     the key would reach session code"
                )))
            }
            Some(name) => {
                Some(std::env::var(name).map_err(|_| LlmError::MissingKey(name.clone()))?)
            }
            None => None,
        };
        let client = crate::http_client::builder()
            .map_err(|err| LlmError::Setup(format!("TLS: {err}")))?
            .timeout(config.timeout)
            .build()
            .map_err(|err| LlmError::Setup(err.to_string()))?;
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                url: format!("{}/chat/completions", config.base_url.trim_end_matches('/')),
                key,
                default_model: config.model.clone(),
                models: config.models.clone(),
                prices: config.prices.clone(),
                timeout: config.timeout,
                max_retries: config.max_retries,
            }),
        })
    }
}

impl LlmClient for OpenAiClient {
    fn complete(&self, request: ChatRequest) -> BoxFuture<'static, Result<Completion, LlmError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let model = inner.resolve(request.model.as_deref())?;
            inner.complete(model, &request.messages).await
        })
    }

    fn resolve_model(&self, name: Option<&str>) -> Result<String, LlmError> {
        self.inner.resolve(name)
    }
}

impl Inner {
    fn resolve(&self, name: Option<&str>) -> Result<String, LlmError> {
        match name {
            None => Ok(self.default_model.clone()),
            Some(name) if name == self.default_model => Ok(name.to_owned()),
            Some(name) => (self.models.get(name).cloned())
                .ok_or_else(|| LlmError::UnknownModel(name.to_owned())),
        }
    }

    /// Sends the request until it succeeds, fails for good, or the retries run out.
    async fn complete(
        &self,
        model: String,
        messages: &[ChatMessage],
    ) -> Result<Completion, LlmError> {
        let started = Instant::now();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let failure = match self.attempt(&model, messages).await {
                Ok((text, usage)) => {
                    let price = self.prices.get(&model).copied().unwrap_or_default();
                    let cost = (usage.input_tokens as f64 * price.input_per_mtok
                        + usage.output_tokens as f64 * price.output_per_mtok)
                        / 1e6;
                    return Ok(Completion {
                        text,
                        model,
                        usage,
                        cost,
                        attempts,
                        duration: started.elapsed(),
                    });
                }
                Err(failure) => failure,
            };
            if !failure.retry || attempts > self.max_retries {
                return Err(failure.error);
            }
            let backoff = BACKOFF_START.saturating_mul(1 << (attempts - 1).min(16));
            let jitter = backoff.mul_f64(fastrand::f64() * 0.25);
            let wait = failure.after.unwrap_or(backoff + jitter).min(BACKOFF_MAX);
            tracing::debug!(url = %self.url, attempts, ?wait, error = %failure.error, "retrying an LLM call");
            tokio::time::sleep(wait).await;
        }
    }

    /// One request.
    async fn attempt(
        &self,
        model: &str,
        messages: &[ChatMessage],
    ) -> Result<(String, Usage), Failure> {
        let mut builder = self.client.post(&self.url).json(&Body { model, messages });
        if let Some(key) = &self.key {
            builder = builder.bearer_auth(key);
        }
        let response = builder.send().await.map_err(|err| self.transport(err))?;
        let status = response.status();
        if !status.is_success() {
            let after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.trim().parse::<f64>().ok())
                .filter(|seconds| seconds.is_finite() && *seconds >= 0.0)
                .map(|seconds| Duration::from_secs_f64(seconds.min(BACKOFF_MAX.as_secs_f64())));
            let body = response.text().await.unwrap_or_default();
            return Err(Failure {
                error: LlmError::Status {
                    status: status.as_u16(),
                    message: error_message(&body),
                },
                retry: status.as_u16() == 429 || status.is_server_error(),
                after,
            });
        }
        let answer: Answer = response.json().await.map_err(|err| {
            if err.is_timeout() {
                self.transport(err)
            } else {
                Failure {
                    error: LlmError::BadAnswer(format!(
                        "{} answered no completion: {err}",
                        self.url
                    )),
                    retry: false,
                    after: None,
                }
            }
        })?;
        let text = (answer.choices.into_iter().next())
            .map(|choice| choice.message.content.unwrap_or_default())
            .ok_or_else(|| Failure {
                error: LlmError::BadAnswer(format!("{} answered no choices", self.url)),
                retry: false,
                after: None,
            })?;
        let usage = answer.usage.map_or(Usage::default(), |usage| Usage {
            input_tokens: usage.prompt_tokens,
            output_tokens: usage.completion_tokens,
        });
        Ok((text, usage))
    }

    /// A request that got no answer: a timeout is final, an unreachable endpoint is retried.
    fn transport(&self, err: reqwest::Error) -> Failure {
        if err.is_timeout() {
            return Failure {
                error: LlmError::Timeout(self.timeout),
                retry: false,
                after: None,
            };
        }
        let mut reason = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            reason = format!("{reason}: {cause}");
            source = cause.source();
        }
        Failure {
            error: LlmError::Unreachable(reason),
            retry: err.is_connect(),
            after: None,
        }
    }
}

/// The message of an error body: OpenAI's `{"error": {"message"}}`, else the start of the body.
fn error_message(body: &str) -> String {
    let parsed: Option<String> = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|value| value["error"]["message"].as_str().map(str::to_owned));
    let mut message = parsed.unwrap_or_else(|| body.trim().to_owned());
    if message.len() > QUOTED_BYTES {
        let mut end = QUOTED_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_come_from_the_body() {
        assert_eq!(
            error_message(r#"{"error": {"message": "rate limited", "type": "x"}}"#),
            "rate limited"
        );
        assert_eq!(error_message(" upstream down \n"), "upstream down");
        let long = "é".repeat(QUOTED_BYTES);
        assert!(error_message(&long).len() <= QUOTED_BYTES + '…'.len_utf8());
    }

    #[test]
    fn models_are_only_those_of_the_config() {
        let mut config = LlmConfig::new("http://127.0.0.1:1/v1", "big");
        config.models.insert("small".into(), "tiny-1".into());
        let client = OpenAiClient::new(&config).unwrap();
        assert_eq!(client.resolve_model(None).unwrap(), "big");
        assert_eq!(client.resolve_model(Some("big")).unwrap(), "big");
        assert_eq!(client.resolve_model(Some("small")).unwrap(), "tiny-1");
        assert_eq!(
            client.resolve_model(Some("tiny-1")),
            Err(LlmError::UnknownModel("tiny-1".into()))
        );
    }
}
