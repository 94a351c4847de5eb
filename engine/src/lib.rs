//! pyvisor: supervise pools of persistent Python sessions.
//!
//! Start an [`Engine`], create a [`Session`], and run code in it: the namespace persists
//! between executions, output streams as it is printed, `input()` is answered by the caller,
//! and interrupts and timeouts really stop the code. The engine runs its actors on threads it
//! owns, so it works from any async runtime; dropping the last `Engine` handle ends every
//! worker.
//!
//! ```no_run
//! # async fn demo() -> Result<(), pyvisor::EngineError> {
//! let engine = pyvisor::Engine::start(pyvisor::EngineConfig::default()).await?;
//! let session = engine.create_session(Default::default()).await?;
//! session.run("x = 20").await?;
//! let result = session.run("x * 2 + 2").await?;
//! assert_eq!(result.result.unwrap().repr, "42");
//! # Ok(()) }
//! ```
//!
//! # A map of the runtimes
//!
//! Which thread runs each step of one `session.run("x = 1")`, and which channel connects
//! the steps. Names in `quotes` are thread names, as `top -H` or a debugger shows them.
//!
//! ```text
//!  caller's runtime              engine process                      worker process
//!  (any thread)             ┌───────────────────────────┐        ┌─────────────────────┐
//!  Session::run ──Execute──▶│ arbiter N: SessionActor   │─fd 3──▶│ main thread reads   │
//!   (actix mailbox)         │  writes the frame at once │        │  the request, runs  │
//!                           │  (interrupts, input(): fd 5)─fd 5─▶│  the code; control  │
//!  awaits the result ◀──────│ arbiter N: pump task      │◀─fd 4──│  thread serves fd 5 │
//!   (tokio unbounded mpsc)  │  └─mpsc─▶ SessionActor    │◀─fd 1,2│  prints on fds 1, 2 │
//!                           └───────────────────────────┘        └─────────────────────┘
//! ```
//!
//! 1. The caller's task (on whatever runtime the embedder runs; in the daemon, the
//!    `pyvisor-conn-N` thread that serves the caller's socket connection) sends `Execute` to
//!    the session's actor: an actix mailbox, and a tokio unbounded channel handed along for
//!    the events.
//! 2. The session's [`SessionActor`](pyvisor_actors::session::SessionActor) runs on one of the
//!    engine's arbiter threads (`actix-rt|system:0|arbiter:N`, `engine.arbiters` of them). It
//!    encodes the request and writes it straight into the worker's fd 3; only what the pipe
//!    cannot take at once goes to a writer task on the same arbiter.
//! 3. In the worker, the main thread reads the request off fd 3 itself when it has finished
//!    the one before, runs it and writes the result frame to fd 4: no thread switch inside
//!    the worker. What must reach the worker while code runs (interrupts, `input()` answers,
//!    inspections) goes on fd 5, which a control thread of the worker serves at once.
//! 4. The worker's pump, a tokio task on the **same arbiter** as its session, reads fd 4 and
//!    the output pipes (fds 1 and 2) and hands the session ordered events on a bounded tokio
//!    channel, which the actor consumes as a stream: no thread switch between them.
//! 5. The session sends on the caller's channel the ticket first, then the output and
//!    displays (only to a caller that streams), then the result: the caller's task wakes on
//!    its own thread. `Execute` has no reply of its own, so no round trip is spent on it.
//!
//! So an execute crosses two threads in the host (the caller's and the session's arbiter) and
//! one in the worker. A worker and its session always share an arbiter: a new session is
//! started on the arbiter its worker was spawned on, and a replacement for a dead worker is
//! spawned on the session's arbiter.
//!
//! The other threads:
//! - `pyvisor-engine` runs the actix `System` of the [`Engine`]: the RegistryActor (the registry
//!   of sessions), the pool (which starts workers on the arbiters, in turn), the proactive
//!   cache and predictor. Session creation and `engine.stats` pass through it; executions
//!   do not.
//! - `pyvisor-zygote` forks preloaded workers on request; `pyvisor-memory` writes outcomes
//!   to the memory store; `pyvisor-blob-zstd` and `pyvisor-blob-gc` compress and collect
//!   checkpoint blobs; tokio's blocking pool of each arbiter reads and writes checkpoints.
//! - A janitor process (Python) kills the workers' process groups if the engine dies.
//! - The daemon (`pyvisor serve`): the `tokio` runtime of `main` accepts connections and
//!   serves stdio; each Unix socket connection is dealt to one of the `pyvisor-conn-N`
//!   threads (a single-threaded runtime each, one per core up to 4), which runs one task per
//!   request in flight and writes a reply from that task when nothing is queued before it;
//!   with `--http`,
//!   `pyvisor-http` runs actix-web's own `System`, and `pyvisor-metrics` keeps the Prometheus
//!   histograms trimmed.

#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "server")]
pub mod cluster;
pub mod config;
mod engine;
pub mod errors;
pub mod files;
mod http_client;
pub mod llm;
#[cfg(feature = "cli")]
pub mod loadtest;
mod memory;
#[cfg(any(feature = "server", feature = "client"))]
pub mod rpc;
mod scratch;
#[cfg(feature = "server")]
pub mod server;
mod session;
mod state_lock;
pub mod task;

pub use config::{
    ClientLlmConfig, EngineConfig, LlmConfig, MemoryConfig, Price, ProactiveConfig,
    RemoteEmbedderConfig, RlmConfig, SandboxConfig, SandboxLayer, SharedMemoryStore, StateConfig,
};
pub use engine::{Engine, EngineStats};
pub use errors::EngineError;
pub use pyvisor_actors::checkpoint::{default_state_dir, CheckpointInfo, LostName};
pub use pyvisor_actors::memory::{
    ExecutionMeta, FeedbackTarget, FoundOutcome, Insight, MemoryStats,
};
pub use pyvisor_actors::metrics::describe as describe_metrics;
pub use pyvisor_actors::pool::{PoolConfig, PoolStats};
pub use pyvisor_actors::proactive::stats::ProactiveStats;
pub use pyvisor_actors::session::{
    AutoCheckpoint, CheckpointSummary, Completion, DurabilityMode, DurabilityReport, Inspection,
    RestoreSummary, SessionPhase, SessionSnapshot,
};
pub use pyvisor_actors::supervisor::{Interpreter, Quotas, SessionOptions};
pub use pyvisor_actors::worker::MAX_CLONE_GENERATIONS;
pub use pyvisor_actors::{
    DisplayData, ErrorInfo, ExecuteRequest, ExecutionEvent, ExecutionResult, ExecutionStatus,
    OutputStream, PoolError, Recovered, ResultValue, SessionError, SessionLimits, SpawnError,
    SupervisorError, Transaction,
};
pub use session::{Execution, Forked, Session, MAX_FORKS};
