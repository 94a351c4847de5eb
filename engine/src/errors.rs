//! Errors of the embedding API, and (with the `server` and `client` features) of the
//! configuration, the daemon and the client.

#[cfg(feature = "server")]
use std::path::PathBuf;

use pyvisor_actors::{SessionError, SpawnError, SupervisorError};
use thiserror::Error;

#[cfg(feature = "server")]
use crate::config::Origin;

/// Why an engine call failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The engine could not be started.
    #[error("start the engine: {0}")]
    Start(String),
    /// A worker could not be started.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The session refused the request.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The supervisor refused the request.
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
    /// The engine has stopped (its last handle was dropped).
    #[error("reach the engine: it has stopped")]
    Stopped,
    /// The memory refused the request (unknown insight, invalid score).
    #[error(transparent)]
    Memory(pyvisor_actors::memory::MemoryError),
    /// The engine does not remember outcomes (`[memory] enabled = false`).
    #[error("memory is disabled on this engine")]
    MemoryDisabled,
    /// A session asked for the LLM bridge on an engine without `[llm]`.
    #[error("give the session llm_query: the engine has no [llm] endpoint configured")]
    NoLlm,
    /// A call on a session's files failed (`session.files.*`).
    #[error(transparent)]
    Files(#[from] crate::files::FileError),
    /// A fork asked for what cannot be (a count out of range, names that do not match it).
    #[error("fork: {0}")]
    InvalidFork(String),
    /// A task request that cannot run (an unknown kind, a task id in use).
    #[error("run the task: {0}")]
    Task(String),
}

impl From<actix::MailboxError> for EngineError {
    fn from(_: actix::MailboxError) -> Self {
        EngineError::Stopped
    }
}

/// Why the cluster's shared store failed a node's request (docs/cluster.md).
#[cfg(feature = "server")]
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The store cannot be reached, or a connection to it failed.
    #[error("reach the cluster store: {0}")]
    Unreachable(String),
    /// The store refused or failed a statement.
    #[error("{what}: {source}")]
    Store {
        what: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    /// A schema migration failed; the store is left at the version before it.
    #[error("migrate the cluster store to version {version}: {source}")]
    Migrate {
        version: i32,
        #[source]
        source: tokio_postgres::Error,
    },
    /// The store refused a write made under an epoch that is no longer the session's: another
    /// node has claimed the session since.
    #[error("write session {session_id} under epoch {epoch}: another node has claimed it since")]
    Fenced { session_id: String, epoch: i64 },
    /// This node cannot renew its lease on the session (the store is unreachable), so it
    /// can no longer prove it holds it and stops serving it.
    #[error("serve session {session_id}: its lease ran out and the cluster store cannot renew it")]
    LeaseExpired { session_id: String },
    /// Another node that is alive holds the session.
    #[error("session {session_id} is held by node {node} ({advertise_url})")]
    HeldElsewhere {
        session_id: String,
        node: String,
        advertise_url: String,
    },
    /// The owner has a session of this name on some node of the cluster already.
    #[error("the name {name:?} is taken by a live session of the cluster ({session_id})")]
    NameTaken { name: String, session_id: String },
    /// This node drains (`node.drain`): it takes no session, new or taken over, and hands
    /// those it holds to the store; another node serves them at their next request.
    #[error("node {node} is draining: it takes no session; another node serves it")]
    Draining { node: String },
    /// The owner already holds as many sessions across the cluster as
    /// `limits.max_sessions_per_owner` allows.
    #[error("create a session for owner {owner:?}: it already holds {limit} sessions across the cluster, the most one owner may hold (limits.max_sessions_per_owner)")]
    TooManySessions { owner: String, limit: usize },
    /// A checkpoint could not be moved between the local store and the shared one.
    #[error("move checkpoint {checkpoint} of session {session_id}: {message}")]
    Checkpoint {
        session_id: String,
        checkpoint: String,
        message: String,
    },
    /// Taking a session over failed in the engine (no worker, the engine stopping).
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Why the configuration could not be loaded; every variant names the file or variable.
#[cfg(feature = "server")]
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file named by `--config` or `$PYVISOR_CONFIG` does not exist.
    #[error("read {}: no such file (named by {named_by})", path.display())]
    Missing {
        path: PathBuf,
        named_by: &'static str,
    },
    /// A config file exists but could not be read.
    #[error("read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A config file is not valid TOML.
    #[error("{}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    /// A file or a `PYVISOR_<SECTION>__<KEY>` variable names a setting that does not exist.
    #[error("{origin}: unknown key {key}")]
    UnknownKey { origin: Origin, key: String },
    /// A setting has a value of the wrong type or out of range.
    #[error("{origin}: {key}: {message}")]
    Invalid {
        origin: Origin,
        key: String,
        message: String,
    },
}

/// Why `pyvisor serve` could not run.
#[cfg(feature = "server")]
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The socket could not be created.
    #[error("listen on {}: {source}", path.display())]
    Socket {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Another daemon answers on the socket.
    #[error("listen on {}: another pyvisor daemon is serving there", path.display())]
    InUse { path: PathBuf },
    /// The HTTP server could not bind its address.
    #[error("serve HTTP on {addr}: {source}")]
    Http {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    /// The engine did not start.
    #[error(transparent)]
    Engine(EngineError),
    /// Signal handlers could not be installed.
    #[error("install signal handlers: {0}")]
    Signals(std::io::Error),
    /// The node could not join its cluster (`[cluster]`).
    #[error("join the cluster: {0}")]
    Cluster(ClusterError),
}

/// Why a [`crate::client::Client`] call failed.
#[cfg(feature = "client")]
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The daemon's socket could not be reached.
    #[error("connect to {}: {source}", path.display())]
    Connect {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The connection failed with this I/O error before the call was made.
    #[error("talk to the server: {0}")]
    Io(#[from] std::io::Error),
    /// The server answered with this error object (its code is kept).
    #[error("call the server: {0}")]
    Rpc(#[from] crate::rpc::RpcError),
    /// The server sent something this client does not understand.
    #[error("understand the server: {0}")]
    Protocol(String),
    /// The connection ended before the response arrived.
    #[error("hear from the server: the connection closed")]
    Closed,
}
