//! The messages a [`super::SessionActor`] accepts, their replies, and the snapshot it
//! reports. Callers construct these; the actor's handlers live beside it in `session.rs`.

use actix::prelude::*;
use tokio::sync::mpsc;

use crate::errors::SessionError;
use crate::execution::{ExecuteRequest, ExecutionEvent};

/// Receives the events of one execution, or the reason it was refused.
pub type EventSender = mpsc::UnboundedSender<Result<ExecutionEvent, SessionError>>;

/// Queue an execution; the reply names it, its events go to `events`.
#[derive(Message)]
#[rtype(result = "Result<ExecutionTicket, SessionError>")]
pub struct Execute {
    pub request: ExecuteRequest,
    pub events: EventSender,
}

/// The identity of a queued execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionTicket {
    pub execution_id: String,
    pub execution_count: u64,
}

/// Answer the pending `input()` of an execution (`None` = end of input).
#[derive(Message)]
#[rtype(result = "Result<(), SessionError>")]
pub struct SendInput {
    pub execution_id: String,
    pub value: Option<String>,
}

/// Interrupt the running execution; replies whether one was running.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct Interrupt;

/// Ask for a snapshot of the session.
#[derive(Message)]
#[rtype(result = "SessionSnapshot")]
pub struct GetInfo;

/// Close the session: end its worker and stop the actor. Replies once the worker is reaped.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Close {
    /// Let the worker exit on its own first (`shutdown` frame) instead of killing it at once.
    pub graceful: bool,
}

/// Told to whoever registered interest when a session actor stops for good.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct SessionEnded {
    pub session_id: String,
}

/// What a session is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionPhase {
    /// A worker is being started (first start or after a crash).
    Starting,
    Idle,
    Busy,
    /// No worker could be started; the session refuses work.
    Failed,
    Closing,
}

/// A point-in-time view of a session.
#[derive(Debug, Clone)]
pub struct SessionSnapshot {
    pub session_id: String,
    pub phase: SessionPhase,
    pub pid: Option<u32>,
    pub python_version: Option<String>,
    pub execution_count: u64,
    pub queued: usize,
    pub restarts: u64,
    /// What enforces the worker's memory and process limits: "cgroup2", "cgroup1", "rlimit".
    pub containment: Option<&'static str>,
}
