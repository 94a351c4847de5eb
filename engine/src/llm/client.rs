//! What an LLM client is: a chat request in, a completion with its usage and cost out.

use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// One message of a chat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    /// A message of `role` saying `content`.
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Self {
            role: role.to_owned(),
            content: content.into(),
        }
    }
}

/// A chat to complete.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// A model name of the config: `None` for `[llm] model`, else a `[llm.models]` name or
    /// `[llm] model` itself.
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
}

/// Tokens one call used, as the endpoint counted them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Self) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
    }
}

/// A completed chat.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The reply's text.
    pub text: String,
    /// The model id that was asked.
    pub model: String,
    pub usage: Usage,
    /// Dollars, from `[llm.prices]`; 0 for a model without a price.
    pub cost: f64,
    /// Requests sent: 1, plus one per retry.
    pub attempts: u32,
    /// From the first request to the answer, retries included.
    pub duration: Duration,
}

/// Why a call got no completion.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The engine has no `[llm]` endpoint.
    #[error("use an LLM: the engine has no [llm] endpoint configured")]
    NotConfigured,
    /// The call named a model the config does not list.
    #[error("use model {0:?}: not one of the configured models")]
    UnknownModel(String),
    /// `[llm] api_key_env` names a variable that is not set.
    #[error(
        "read the API key: llm.api_key_env names {0}, which is not set in the engine's environment"
    )]
    MissingKey(String),
    /// No answer within `[llm] timeout_s`.
    #[error("get a completion: no answer within {0:?}")]
    Timeout(Duration),
    /// The endpoint refused the request (after the retries, for 429 and 5xx).
    #[error("get a completion: the endpoint answered {status}: {message}")]
    Status { status: u16, message: String },
    /// The endpoint could not be reached (after the retries).
    #[error("reach the endpoint: {0}")]
    Unreachable(String),
    /// The endpoint answered something that is not a completion.
    #[error("read the completion: {0}")]
    BadAnswer(String),
    /// The HTTP client could not be built.
    #[error("set up the HTTP client: {0}")]
    Setup(String),
}

/// Completes chats.
pub trait LlmClient: Send + Sync {
    /// Completes `request`; the future owns what it needs.
    fn complete(&self, request: ChatRequest) -> BoxFuture<'static, Result<Completion, LlmError>>;

    /// The model id that `name` stands for; `None` for the default model.
    fn resolve_model(&self, name: Option<&str>) -> Result<String, LlmError>;
}
