//! The actors of pyvisor and the worker-process plumbing they share.
//!
//! [`session::SessionActor`] owns one Python worker; [`supervisor::RegistryActor`] owns every
//! session and the arbiter threads they run on. Nothing here knows about HTTP, JSON-RPC, the
//! CLI or config files: the `pyvisor` crate builds those on top.
//!
//! # Where things run
//!
//! - The engine's actix `System` thread runs the [`supervisor::RegistryActor`], the
//!   [`pool::PoolActor`] and the proactive [`proactive::cache`] and predictor actors.
//! - `N` arbiter threads, owned by the RegistryActor, run the [`session::SessionActor`]s and,
//!   beside each, its worker's I/O: the pump task ([`worker`]'s `pump`, fds 4, 1 and 2 → a
//!   bounded channel the actor reads as a stream) and the writer's backlog task (fd 3). The
//!   pool starts each worker with `Worker::start` on an arbiter (its own workers in turn, a
//!   replacement on the session's arbiter, [`pool::Acquire::arbiter`]), and that arbiter is
//!   where the worker's tasks live; the RegistryActor starts a new session on its lease's arbiter.
//!   A session and its worker therefore share a thread, and an execute needs no thread switch
//!   between the actor and the pipes.
//! - Blocking work (checkpoint store reads and writes) goes to tokio's blocking pool of the
//!   arbiter; the zygote and the memory writer have threads of their own.
//!
//! One execute: the caller's `Execute` reaches the session's mailbox; the actor writes the
//! frame to fd 3, which the worker's main thread reads itself when it is free; it runs the
//! code and writes the result to fd 4 (interrupts and `input()` answers go on fd 5, which a
//! control thread of the worker serves while code runs); the pump reads it and hands it to the actor, which
//! sends the result on the caller's channel. The `pyvisor` crate's lib.rs draws this map.

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
