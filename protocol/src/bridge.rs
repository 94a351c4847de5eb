//! The payloads of the LLM bridge's frames: a call that session code makes
//! ([`crate::WorkerMessage::LlmCall`]) and how one fails ([`crate::HostMessage::LlmReply`]).

use serde::{Deserialize, Serialize};

/// Which bridge function made a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LlmCallKind {
    /// `llm_query(prompt)`: one prompt, one answer.
    Llm,
    /// `llm_query_batched(prompts)`: one answer per prompt.
    LlmBatched,
    /// `rlm_query(task, ctx)`: one task for a nested loop, one answer.
    Rlm,
}

impl LlmCallKind {
    /// The name used in metrics and docs.
    pub fn as_str(self) -> &'static str {
        match self {
            LlmCallKind::Llm => "llm",
            LlmCallKind::LlmBatched => "llm_batched",
            LlmCallKind::Rlm => "rlm",
        }
    }
}

/// Why a bridge call got no answers; the worker raises the exception class `kind` names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LlmFailure {
    pub kind: LlmFailureKind,
    pub message: String,
}

/// The Python exception a failed call raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LlmFailureKind {
    LlmError,
    BudgetExceeded,
}
