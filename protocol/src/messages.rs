//! The messages exchanged between the host and a worker, one per frame.
//!
//! [`HostMessage`] travels on fd 3 (host → worker), [`WorkerMessage`] on fd 4
//! (worker → host). Both are JSON objects tagged by a `type` field; pyworker/worker.py
//! documents the same shapes from the Python side.

use serde::{Deserialize, Serialize};

/// Version announced in the worker's `hello`; the host refuses any other.
pub const PROTOCOL_VERSION: u32 = 1;

/// A message from the host to a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum HostMessage {
    /// Run `code` in the session namespace.
    Execute {
        id: String,
        code: String,
        /// Longest repr of the final expression the worker returns, in bytes.
        repr_limit: usize,
    },
    /// Answer to an [`WorkerMessage::InputRequest`]; `None` makes `input()` raise `EOFError`.
    InputReply { id: String, value: Option<String> },
    /// Ask the worker to exit cleanly.
    Shutdown,
}

/// A message from a worker to the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerMessage {
    /// Sent once when the worker is ready to execute.
    Hello {
        protocol: u32,
        pid: u32,
        python_version: String,
        executable: String,
    },
    /// User code called `input()` or `getpass.getpass()`.
    InputRequest {
        id: String,
        prompt: String,
        password: bool,
    },
    /// Rich output (`display(obj)`, a matplotlib figure).
    Display {
        id: String,
        mime: String,
        data: String,
    },
    /// The execution `id` has finished.
    Result {
        id: String,
        status: WorkerStatus,
        result: Option<ResultValue>,
        error: Option<ErrorInfo>,
    },
}

/// How an execution ended, as the worker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerStatus {
    Ok,
    Error,
}

/// The value of a final expression statement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultValue {
    pub repr: String,
    #[serde(rename = "type")]
    pub type_name: String,
    /// `text/html` rendering, for objects such as pandas DataFrames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
}

/// An exception raised by user code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    #[serde(rename = "type")]
    pub type_name: String,
    pub message: String,
    pub traceback: Vec<String>,
}
