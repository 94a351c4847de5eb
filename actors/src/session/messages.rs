//! The messages a [`super::SessionActor`] accepts, their replies, and the snapshot it
//! reports. Callers construct these; the actor's handlers are in `handlers.rs`.

use actix::prelude::*;
use tokio::sync::mpsc;

use pyvisor_protocol::LostName;

use super::Inspection;
use crate::checkpoint::{CheckpointId, CheckpointInfo};
use crate::errors::SessionError;
use crate::execution::{ExecuteRequest, ExecutionEvent};

/// What the caller of one execution hears, in order: its ticket, then its events (the last is
/// [`ExecutionEvent::Finished`]); or only the reason it was refused.
#[derive(Debug)]
pub enum Progress {
    Accepted(ExecutionTicket),
    Event(ExecutionEvent),
    Refused(SessionError),
}

/// Receives the [`Progress`] of one execution.
pub type EventSender = mpsc::UnboundedSender<Progress>;

/// Queue an execution; its ticket and then its events go to `events`, so that the caller
/// waits for one channel and makes no round trip for the ticket.
#[derive(Message)]
#[rtype(result = "()")]
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
    /// What becomes of the session's checkpoints.
    pub state: CloseState,
}

/// What closing does to a session's checkpoints. Those of a session without a name are
/// always deleted: nothing could find them again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseState {
    /// Delete them: the user is done with the session.
    Forget,
    /// Keep them, so that a later engine can bring the named session back.
    Keep,
    /// Take a last checkpoint, then keep them.
    Checkpoint,
}

/// Checkpoint the namespace now (after the running execution, if any).
#[derive(Message)]
#[rtype(result = "Result<CheckpointSummary, SessionError>")]
pub struct CheckpointNow;

/// What a checkpoint saved (`session.checkpoint` of docs/protocol.md).
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointSummary {
    pub checkpoint_id: String,
    /// Bytes the checkpoint added to the disk: its file and the blobs of the groups that
    /// changed.
    pub bytes: u64,
    /// Bytes of all the blobs the checkpoint holds, shared with earlier ones or not.
    pub state_bytes: u64,
    pub saved: Vec<String>,
    pub lost: Vec<LostName>,
    pub duration_ms: f64,
}

/// Put the namespace back as checkpoint `checkpoint_id` (the latest when `None`) saved it.
#[derive(Message)]
#[rtype(result = "Result<RestoreSummary, SessionError>")]
pub struct RestoreCheckpoint {
    pub checkpoint_id: Option<CheckpointId>,
}

/// What a restore brought back (`session.restore` of docs/protocol.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreSummary {
    pub checkpoint_id: String,
    pub restored: Vec<String>,
    /// Names the worker held unchanged, left as they were rather than reloaded.
    pub kept: Vec<String>,
    pub lost: Vec<LostName>,
}

/// The session's checkpoints, newest first.
#[derive(Message)]
#[rtype(result = "Result<Vec<CheckpointInfo>, SessionError>")]
pub struct ListCheckpoints;

/// Refuse new executions and reply once the running one (if any) has ended.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Drain;

/// What a session is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionPhase {
    /// Its worker died; a new one is on its way and executions wait for it.
    Restarting,
    Idle,
    Busy,
    /// No worker could be had; the next execution tries again.
    Failed,
    Closing,
    Closed,
}

impl SessionPhase {
    /// The `state` label of the `pyvisor_sessions` gauge; `None` for a closed session.
    pub fn metric_label(self) -> Option<&'static str> {
        match self {
            SessionPhase::Restarting => Some("restarting"),
            SessionPhase::Idle => Some("idle"),
            SessionPhase::Busy => Some("busy"),
            SessionPhase::Failed => Some("failed"),
            SessionPhase::Closing => Some("closing"),
            SessionPhase::Closed => None,
        }
    }
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
    /// CPU seconds used by the current worker and every process it started, from its cgroup;
    /// `None` without a worker or CPU accounting.
    pub cpu_s: Option<f64>,
    /// The latest checkpoint the session wrote or restored.
    pub last_checkpoint: Option<String>,
    /// Whether a crash now would lose anything, and why.
    pub durability: super::DurabilityReport,
    /// The session's share of the proactive figures; `None` when it is not proactive.
    pub proactive: Option<crate::proactive::stats::ProactiveStats>,
    /// The code a speculative child of its worker is computing now, not answered yet.
    pub speculating: Vec<String>,
    /// Normal forms of the code whose answers are computed ahead and still hold.
    pub ahead: Vec<String>,
    /// The namespace as the worker described it; `None` when it could not answer in time.
    pub namespace: Option<Inspection>,
    /// The confinement the worker applied; `None` when it is unconfined or there is none.
    pub sandbox: Option<pyvisor_protocol::SandboxApplied>,
    /// The session's limits.
    pub limits: crate::limits::SessionLimits,
}
