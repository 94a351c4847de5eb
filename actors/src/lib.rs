//! The actors of pyvisor and the worker-process plumbing they share.
//!
//! [`session::SessionActor`] owns one Python worker; [`supervisor::Supervisor`] owns every
//! session and the arbiter threads they run on. Nothing here knows about HTTP, JSON-RPC, the
//! CLI or config files: the `pyvisor` crate builds those on top.

pub mod bridge;
pub mod checkpoint;
pub mod errors;
pub mod execution;
pub mod limits;
pub mod memory;
pub mod metrics;
pub mod pool;
pub mod proactive;
mod running;
pub mod session;
pub mod supervisor;
pub mod worker;

pub use errors::{PoolError, SessionError, SpawnError, SupervisorError};
pub use execution::{
    DisplayData, ErrorInfo, ExecuteRequest, ExecutionEvent, ExecutionResult, ExecutionStatus,
    OutputStream, Recovered, ResultValue, Transaction,
};
pub use limits::{ProcessLimits, SessionLimits};
