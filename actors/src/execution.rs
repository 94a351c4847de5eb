//! What a caller asks a session to run and what comes back: requests, streamed events and
//! the final result (the `session.execute` result of docs/protocol.md).

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use pyvisor_protocol::{ErrorInfo, ResultValue, Transaction};

use crate::memory::{ExecutionMeta, Insight};

/// One piece of code to run in a session.
#[derive(Debug, Clone)]
pub struct ExecuteRequest {
    /// Python source to run in the session namespace.
    pub code: String,
    /// Wall-clock limit; the session's `timeout` limit when `None`.
    pub timeout: Option<Duration>,
    /// Whether `input()` is forwarded to the caller (otherwise it raises `EOFError`).
    pub input: bool,
    /// Whether output and displays reach the caller as events while the code runs; the
    /// result carries all of them either way.
    pub stream: bool,
    /// Wait behind a running execution (`true`) or fail with "session busy" (`false`).
    pub queue: bool,
    /// What a failure does to the namespace.
    pub transaction: Transaction,
    /// Whether a speculative answer may serve it (docs/protocol.md `cache`); `false` runs it for real.
    pub cache: bool,
    /// What the caller says about the code (approach, task, tags), remembered with its
    /// outcome.
    pub meta: Option<ExecutionMeta>,
    /// Who answers the LLM calls this execution's code makes, in a session whose calls its
    /// client answers ([`crate::supervisor::SessionOptions::llm_by_client`]): the connection
    /// that sent it. Without one, such calls raise `LlmError`.
    pub llm: Option<crate::bridge::SessionBridge>,
}

impl ExecuteRequest {
    /// A request with the session defaults: queued, no input forwarding.
    pub fn new(code: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            timeout: None,
            input: false,
            stream: true,
            queue: true,
            transaction: Transaction::CommitAlways,
            cache: true,
            meta: None,
            llm: None,
        }
    }

    /// Sets a wall-clock limit for this execution.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sends no output or display events: only the result, which carries them all.
    pub fn no_stream(mut self) -> Self {
        self.stream = false;
        self
    }

    /// Forwards `input()` calls to the caller as [`ExecutionEvent::InputRequest`].
    pub fn with_input(mut self) -> Self {
        self.input = true;
        self
    }

    /// Puts the namespace back as it was if the code fails.
    pub fn rollback_on_failure(mut self) -> Self {
        self.transaction = Transaction::RollbackOnFailure;
        self
    }

    /// Runs the code for real even when a speculative answer for it is ready.
    pub fn no_cache(mut self) -> Self {
        self.cache = false;
        self
    }

    /// Describes the code for the memory (docs/protocol.md `meta`).
    pub fn with_meta(mut self, meta: ExecutionMeta) -> Self {
        self.meta = Some(meta);
        self
    }

    /// Has `answerer` answer the LLM calls of this execution's code, in a session whose
    /// client answers them.
    pub fn with_llm(mut self, answerer: crate::bridge::SessionBridge) -> Self {
        self.llm = Some(answerer);
        self
    }

    /// Fails with "session busy" instead of waiting behind a running execution.
    pub fn no_queue(mut self) -> Self {
        self.queue = false;
        self
    }
}

impl From<&str> for ExecuteRequest {
    fn from(code: &str) -> Self {
        ExecuteRequest::new(code)
    }
}

impl From<String> for ExecuteRequest {
    fn from(code: String) -> Self {
        ExecuteRequest::new(code)
    }
}

/// Which of the worker's output streams a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// Rich output: one MIME bundle entry (`data` is base64 for binary types).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisplayData {
    pub mime: String,
    pub data: String,
}

/// Something that happened during an execution, in the order it happened.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecutionEvent {
    /// Text written to fd 1 or 2 by the code, C extensions or child processes.
    Output { stream: OutputStream, data: String },
    /// The code waits in `input()`; answer with the session's `send_input`.
    InputRequest { prompt: String, password: bool },
    /// Rich output from `display()` or a matplotlib figure.
    Display(DisplayData),
    /// The execution is over; always the last event.
    Finished(Box<ExecutionResult>),
}

/// How an execution ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    Ok,
    Error,
    Timeout,
    Interrupted,
    Crashed,
}

impl ExecutionStatus {
    /// The status as docs/protocol.md spells it: `ok`, `error`, `timeout`, `interrupted`, `crashed`.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionStatus::Ok => "ok",
            ExecutionStatus::Error => "error",
            ExecutionStatus::Timeout => "timeout",
            ExecutionStatus::Interrupted => "interrupted",
            ExecutionStatus::Crashed => "crashed",
        }
    }
}

/// The outcome of one execution (the `session.execute` result of docs/protocol.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionResult {
    pub execution_id: String,
    pub execution_count: u64,
    pub status: ExecutionStatus,
    pub stdout: String,
    pub stderr: String,
    pub result: Option<ResultValue>,
    pub display: Vec<DisplayData>,
    pub error: Option<ErrorInfo>,
    pub duration_ms: f64,
    /// The answer was computed ahead of the request by speculation, and is what a real run
    /// would have answered.
    #[serde(default)]
    pub from_cache: bool,
    /// Set when the session's worker died: what its state came back from.
    pub recovered: Option<Recovered>,
    /// What the caller should know about the session's state, such as "state not saved:
    /// ..." while a crash would lose it (docs/protocol.md `warnings`).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// What the memory recognised in the code before it ran: earlier failures it seems to
    /// repeat (docs/protocol.md `insights`).
    #[serde(default)]
    pub insights: Vec<Insight>,
    /// The cluster node that ran it (docs/cluster.md); `None` on a single node, and left
    /// out of the JSON then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// What a session got back after its worker died (docs/protocol.md `recovered`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovered {
    /// The checkpoint the namespace was restored from; `None` when no checkpoint could be
    /// used and the session goes on with a fresh namespace.
    pub checkpoint_id: Option<String>,
    /// Executions that ran after that checkpoint (or, with a fresh namespace, since the
    /// session began), whose effects are gone (the one that crashed included).
    pub lost_executions: u64,
    /// The execution count the session came back to: that of the checkpoint (0, or the
    /// count of an earlier fresh start, with a fresh namespace). Every execution a client
    /// was told of with a higher count, before this result, is lost: the exact loss, when
    /// `lost_executions` is only a lower bound. `None` from an engine too old to say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_count: Option<u64>,
    /// The session's names are all gone: it starts again from an empty namespace.
    #[serde(default)]
    pub fresh_namespace: bool,
    /// `lost_executions` is a lower bound: more may be lost than it counts. True only for a
    /// session taken over from a dead node in the default durability mode, whose executions
    /// acknowledged after its last heartbeat nobody else knows of (docs/cluster.md).
    #[serde(default)]
    pub lost_may_be_more: bool,
    /// The node that held the session before this one took it over from the cluster's
    /// store (docs/cluster.md); `None` on a single node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_node: Option<String>,
}
