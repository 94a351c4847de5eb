//! The LLM layer: a chat completions client ([`LlmClient`], with [`OpenAiClient`] for
//! OpenAI-compatible endpoints) whose calls report their tokens and cost, and the bridge
//! that answers the `llm_query` calls of sessions' code with it.
//!
//! The key comes from an environment variable of the engine (`[llm] api_key_env`), never from
//! a request or the config file; models are named in the config, so a caller can only choose
//! among them.

mod client;
mod dispatch;
mod openai;
mod stats;
mod window;

pub use client::{ChatMessage, ChatRequest, Completion, LlmClient, LlmError, Usage};
pub(crate) use dispatch::{texts, Dispatcher};
pub use openai::OpenAiClient;
pub(crate) use stats::LlmCounters;
pub use stats::LlmStats;
#[cfg(feature = "server")]
pub(crate) use {stats::describe, window::BatchWindow};
