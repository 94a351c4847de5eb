//! The seam between a session and whatever answers its code's LLM calls: the engine gives a
//! session with the bridge an [`LlmBridge`], and the session hands it each call of its
//! worker's `llm_query` and `llm_query_batched`. This crate knows nothing of HTTP or models.

use std::sync::Arc;

use futures::future::BoxFuture;
pub use pyvisor_protocol::{LlmCallKind, LlmFailure, LlmFailureKind};

/// One call of session code, as the session hands it over.
#[derive(Debug, Clone)]
pub struct BridgeCall {
    pub session_id: Arc<str>,
    /// The session's owner (`""` for sessions without one).
    pub owner: Arc<str>,
    /// The execution whose code made the call.
    pub execution_id: String,
    pub kind: LlmCallKind,
    pub prompts: Vec<String>,
    /// The model name the code asked for; the default when `None`.
    pub model: Option<String>,
}

/// Answers the LLM calls of sessions' code.
pub trait LlmBridge: Send + Sync {
    /// One answer per prompt of `call`, or why there are none. Dropping the future cancels
    /// the call.
    fn call(&self, call: BridgeCall) -> BoxFuture<'static, Result<Vec<String>, LlmFailure>>;
}

/// A failure that raises `LlmError` in the session's code.
pub fn llm_error(message: impl Into<String>) -> LlmFailure {
    LlmFailure {
        kind: LlmFailureKind::LlmError,
        message: message.into(),
    }
}
