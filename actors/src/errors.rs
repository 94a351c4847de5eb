//! Error types of the actors crate, one per boundary a caller can hit.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

/// Failure to start a worker process.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The configured interpreter cannot be run or did not report `sys.executable`.
    #[error("use python interpreter {python:?}: {reason}")]
    Interpreter { python: String, reason: String },
    /// The worker script could not be written to its cache directory.
    #[error("install the worker script in {path}: {source}")]
    Script { path: PathBuf, source: io::Error },
    /// `fork`/`exec` of the interpreter failed.
    #[error("spawn {python}: {source}")]
    Spawn { python: PathBuf, source: io::Error },
    /// The worker's pipes could not be created or registered.
    #[error("create worker pipes: {0}")]
    Pipe(io::Error),
    /// The worker's cgroup leaf could not be created or joined.
    #[error("contain the worker in a cgroup: {0}")]
    Containment(io::Error),
    /// The worker started but did not complete the handshake.
    #[error("complete the worker handshake: {reason}")]
    Handshake { reason: String },
}

/// Failure of a request to a session.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum SessionError {
    /// Another execution is running and the request asked not to queue.
    #[error("run in session {session_id}: it is busy with another execution")]
    Busy { session_id: String },
    /// The session's execution queue is full.
    #[error("queue in session {session_id}: {limit} executions already waiting")]
    QueueFull { session_id: String, limit: usize },
    /// The session was closed.
    #[error("use session {session_id}: it is closed")]
    Closed { session_id: String },
    /// The session has no worker and could not start one.
    #[error("use session {session_id}: no worker ({reason})")]
    Unavailable { session_id: String, reason: String },
    /// `send_input` named an execution that is not waiting in `input()`.
    #[error("answer input for {execution_id}: no input() is pending")]
    NoPendingInput { execution_id: String },
    /// The code is larger than a frame may be.
    #[error("send {bytes} bytes of code: the limit is {limit} bytes")]
    TooLarge { bytes: usize, limit: usize },
}

/// Failure of a request to the supervisor.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SupervisorError {
    /// The worker of a new session could not be started.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The engine is stopping and takes no new sessions.
    #[error("create a session: the engine is shutting down")]
    ShuttingDown,
}
