//! The seam between a session and whatever answers its code's LLM calls: the engine gives a
//! session with the bridge an [`LlmBridge`], and the session hands it each call of its
//! worker's `llm_query`, `llm_query_batched` and `rlm_query`. This crate knows nothing of HTTP or models.

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
    /// The context of an `rlm` call.
    pub context: Option<serde_json::Value>,
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

/// A failure that raises `BudgetExceeded` in the session's code.
pub fn budget_exceeded(message: impl Into<String>) -> LlmFailure {
    LlmFailure {
        kind: LlmFailureKind::BudgetExceeded,
        message: message.into(),
    }
}

/// The bridge of one session, in place of the engine's (a task's sessions have one that
/// accounts their calls in the task's budget).
#[derive(Clone)]
pub struct SessionBridge(pub Arc<dyn LlmBridge>);

impl std::fmt::Debug for SessionBridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionBridge")
    }
}
