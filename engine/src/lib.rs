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

pub mod client;
pub mod config;
mod engine;
pub mod errors;
mod http_client;
pub mod llm;
pub mod loadtest;
mod memory;
pub mod rpc;
mod scratch;
pub mod server;
mod session;
mod state_lock;
pub mod task;

pub use config::{
    EngineConfig, LlmConfig, MemoryConfig, Price, ProactiveConfig, RemoteEmbedderConfig,
    SandboxConfig, SandboxLayer, StateConfig,
};
pub use engine::{Engine, EngineStats};
pub use errors::EngineError;
pub use pyvisor_actors::checkpoint::{default_state_dir, CheckpointInfo};
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
pub use pyvisor_actors::{
    DisplayData, ErrorInfo, ExecuteRequest, ExecutionEvent, ExecutionResult, ExecutionStatus,
    OutputStream, PoolError, Recovered, ResultValue, SessionError, SessionLimits, SupervisorError,
    Transaction,
};
pub use session::{Execution, Session};
