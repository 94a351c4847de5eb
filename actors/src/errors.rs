//! Error types of the actors crate, one per boundary a caller can hit.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::checkpoint::CheckpointError;

/// Failure to start a worker process.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The configured interpreter cannot be run or did not report `sys.executable`.
    #[error("use python interpreter {python:?}: {reason}")]
    Interpreter { python: String, reason: String },
    /// A file of the worker package could not be written to its cache directory.
    #[error("install the worker package file {path}: {source}")]
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
    /// The zygote did not start, or could not fork a worker.
    #[error("use the zygote: {reason}")]
    Zygote { reason: String },
    /// Every uid of the sandbox's range is claimed by a live worker of this engine or of
    /// another engine on the machine (uids are claimed machine-wide).
    #[error(
        "give the worker a uid: every uid of {first}-{last} is in use, by this engine's \
         workers or by those of other pyvisor engines on this machine"
    )]
    UidsExhausted { first: u32, last: u32 },
    /// The worker's confinement could not be prepared.
    #[error("confine the worker: {reason}")]
    Sandbox { reason: String },
    /// A clone would be more forks deep than the kernel can give Landlock layers for.
    #[error(
        "isolate a clone: a lineage of clones may go {limit} forks deep (the kernel stacks \
         16 Landlock layers on a process, and each clone adds one); fork an earlier session"
    )]
    CloneTooDeep { limit: u32 },
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
    /// `send_input` named an execution that is not waiting in `input()`.
    #[error("answer input for {execution_id}: no input() is pending")]
    NoPendingInput { execution_id: String },
    /// The code is larger than a frame may be.
    #[error("send {bytes} bytes of code: the limit is {limit} bytes")]
    TooLarge { bytes: usize, limit: usize },
    /// The engine is stopping: running executions may finish, new ones are refused.
    #[error("run in session {session_id}: the engine is shutting down")]
    ShuttingDown { session_id: String },
    /// The engine keeps no checkpoints (its state directory is off).
    #[error("checkpoint session {session_id}: checkpoints are off in this engine")]
    CheckpointsOff { session_id: String },
    /// The session has no worker at the moment (it is restarting or closed).
    #[error("reach the worker of session {session_id}: {reason}")]
    NoWorker { session_id: String, reason: String },
    /// The checkpoint store refused or failed (not found, corrupt, too large, I/O).
    #[error("checkpoint session {session_id}: {source}")]
    Checkpoint {
        session_id: String,
        source: Arc<CheckpointError>,
    },
    /// The worker could not write or read a checkpoint.
    #[error("checkpoint session {session_id}: the worker failed: {reason}")]
    WorkerState { session_id: String, reason: String },
    /// The session's worker has no directory of its own (no `cwd` was given and no sandbox
    /// confines it): the files API has nowhere to reach.
    #[error("reach the files of session {session_id}: it has no work directory of its own (create it with a cwd, or run the engine with a sandbox)")]
    NoWorkDir { session_id: String },
    /// The clones' share of the sandbox could not be made (too deep a lineage, a directory).
    #[error("fork session {session_id}: {source}")]
    Clone {
        session_id: String,
        source: Arc<SpawnError>,
    },
    /// A completion's cursor lies past the end of its code.
    #[error("complete at character {cursor}: the code has {chars} characters")]
    CursorOutOfRange { cursor: usize, chars: usize },
}

/// Failure to get a worker from the pool.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PoolError {
    /// No room under `max_total` came free within `acquire_timeout`.
    #[error("acquire a worker: pool exhausted ({max_total} workers in use, waited {waited:?})")]
    Exhausted { waited: Duration, max_total: usize },
    /// The worker started for this acquire failed to start.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The engine is stopping and hands out no workers.
    #[error("acquire a worker: the engine is shutting down")]
    ShuttingDown,
}

/// Failure of a request to the supervisor.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SupervisorError {
    /// No worker could be had for a new session.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The engine is stopping and takes no new sessions.
    #[error("create a session: the engine is shutting down")]
    ShuttingDown,
    /// No session has this id or name, or it belongs to another owner.
    #[error("find session {session}: no such session")]
    UnknownSession { session: String },
    /// The owner already holds as many sessions as `max_sessions_per_owner` allows.
    #[error("create a session for owner {owner:?}: it already holds {limit} sessions, the most one owner may hold (limits.max_sessions_per_owner)")]
    TooManySessions { owner: String, limit: usize },
    /// A session taken over from another engine has a name that a different live session
    /// of the same owner has on this one.
    #[error(
        "take over session {session_id}: its name {name:?} is another session's here ({other})"
    )]
    NameTaken {
        session_id: String,
        name: String,
        other: String,
    },
    /// A clone was to take a name its owner's live session already has.
    #[error("fork: the name {name:?} is taken by a live session")]
    CloneNameTaken { name: String },
    /// The clones' share of the sandbox could not be made: a lineage of clones deeper than
    /// Landlock can isolate ([`SpawnError::CloneTooDeep`]), or their directories.
    #[error("fork session {session}: {source}")]
    Clone {
        session: String,
        source: Arc<SpawnError>,
    },
    /// The source session could not be forked (its worker refused, died, or no clone could
    /// be adopted).
    #[error("fork session {session}: {reason}")]
    Fork { session: String, reason: String },
}
