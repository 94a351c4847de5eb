//! The SessionActor: one per session, owning exactly one Python worker at a time.
//!
//! Callers (the engine's `Session` handle, later the RPC server) send it [`Execute`],
//! [`SendInput`], [`Interrupt`], [`GetInfo`], [`Drain`], [`Close`] and the checkpoint
//! messages. It serialises executions in a bounded queue, relays the worker's output, input
//! requests and displays to the caller of the running execution, enforces the timeout (an
//! interrupt frame, then SIGKILL of the process group after the grace period) and treats the
//! worker's exit as an ordinary event:
//! the running execution ends `crashed` (or `timeout`) and the actor stops, so that actix
//! supervision restarts it under the same session id; the restarted actor keeps its queue
//! and takes a fresh worker from the pool. A closed session stays behind as a tombstone that
//! refuses work until the last handle to it is dropped.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use pyvisor_protocol::HostMessage;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::errors::SessionError;
use crate::execution::{
    ErrorInfo, ExecuteRequest, ExecutionEvent, ExecutionResult, ExecutionStatus,
};
use crate::limits::SessionLimits;
use crate::memory::{Memory, OutcomeDraft};
use crate::metrics::{self, EngineCounters};
use crate::pool::{Acquire, PoolActor, Slot};
use crate::running::{InterruptCause, Running};
use crate::worker::{Worker, WorkerEvent, WorkerSpec};

mod completion;
mod durability;
mod events;
mod handlers;
mod idle;
mod llm_calls;
mod messages;
mod proactive;
mod serving;
mod speculation;
mod state;
mod worker_events;

pub use completion::{Complete, Completion, MAX_COMPLETE_BYTES};
pub use durability::DurabilityReport;
pub use events::{Executed, SessionEvent, Speculated, Subscribers};
pub use llm_calls::LlmLink;
pub use messages::{
    CheckpointNow, CheckpointSummary, Close, CloseState, Drain, EventSender, Execute,
    ExecutionTicket, GetInfo, Interrupt, ListCheckpoints, RestoreCheckpoint, RestoreSummary,
    SendInput, SessionPhase, SessionSnapshot,
};
pub use proactive::ProactiveSetup;

pub(crate) use serving::ServePath;
pub use speculation::{PlannedSnippet, Speculate};
use state::Durability;
pub use state::{AutoCheckpoint, DurabilityMode, Inspection, StateSetup};

/// Most executions waiting behind the running one.
pub const MAX_QUEUED_EXECUTIONS: usize = 1024;
/// How long a closing worker may take to exit after `shutdown` before it is killed.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

enum State {
    /// Between workers: the last one died and a replacement is on its way from the pool.
    Restarting,
    /// The worker is about to restore a checkpoint; executions wait until it has the frame.
    Restoring,
    Idle,
    Busy(Box<Running>),
    /// No worker could be had; the next execution asks the pool again.
    Failed,
    Closing,
    /// Closed for good: every request is refused.
    Closed,
}

impl State {
    fn phase(&self) -> SessionPhase {
        match self {
            State::Restarting | State::Restoring => SessionPhase::Restarting,
            State::Idle => SessionPhase::Idle,
            State::Busy(_) => SessionPhase::Busy,
            State::Failed => SessionPhase::Failed,
            State::Closing => SessionPhase::Closing,
            State::Closed => SessionPhase::Closed,
        }
    }
}

/// Event from the worker of a given generation; events of a previous worker are ignored.
struct Tagged(u64, WorkerEvent);

/// Everything a session needs besides its first worker.
pub struct SessionSetup {
    /// The worker kind to ask the pool for after a crash; the pool's own kind when `None`.
    pub spec: Option<Box<WorkerSpec>>,
    /// Largest frame the worker accepts, which bounds the code of one execution.
    pub max_frame: usize,
    pub limits: SessionLimits,
    pub pool: Addr<PoolActor>,
    pub counters: Arc<EngineCounters>,
    /// Who hears what the session does (executions, idleness, restores, its close).
    pub events: Subscribers,
    /// Proactive computation for this session; off when `None`.
    pub proactive: Option<ProactiveSetup>,
    /// Where the session keeps checkpoints; none are kept when `None`.
    pub state: Option<StateSetup>,
    /// Checkpoint and close the session after this long without activity; never when `None`.
    pub idle_timeout: Option<Duration>,
    /// The engine's memory and the owner the session remembers for; off when `None`.
    pub memory: Option<MemoryLink>,
    /// The LLM bridge of the session's code (`llm_query` and its kin); none when `None`.
    pub llm: Option<LlmLink>,
}

/// A session's tie to the engine's memory.
#[derive(Clone)]
pub struct MemoryLink {
    pub memory: Arc<Memory>,
    /// The session's owner (`""` for sessions without one).
    pub owner: Arc<str>,
}

/// The actor owning one session and its worker.
pub struct SessionActor {
    session_id: String,
    setup: SessionSetup,
    state: State,
    /// The worker leased at creation, taken over when the actor first starts.
    first_worker: Option<Worker>,
    worker: Option<Worker>,
    generation: u64,
    queue: VecDeque<Queued>,
    execution_count: u64,
    restarts: u64,
    /// Why the current worker is being killed, for the crash message.
    kill_reason: Option<String>,
    closers: Vec<oneshot::Sender<()>>,
    /// Set by [`Drain`]: new executions are refused; these wait for the running one to end.
    draining: Option<Vec<oneshot::Sender<()>>>,
    /// The phase last published to the `pyvisor_sessions` gauge.
    published_phase: Option<&'static str>,
    durability: Durability,
    completions: completion::Completions,
    /// Keep the session's checkpoints when it closes (else they are deleted).
    keep_state: bool,
    proactive: Option<proactive::Proactive>,
    events: Subscribers,
    idleness: idle::Idleness,
    llm_calls: llm_calls::LlmCalls,
}

/// An execution waiting for the worker.
pub(crate) struct Queued {
    pub ticket: ExecutionTicket,
    pub request: ExecuteRequest,
    pub events: EventSender,
}

impl SessionActor {
    /// A session that takes `worker` when the actor starts.
    pub fn new(session_id: String, worker: Worker, setup: SessionSetup) -> Self {
        let durability = Durability::new(setup.state.is_some());
        let proactive = setup.proactive.clone().map(proactive::Proactive::new);
        let events = setup.events.clone();
        Self {
            session_id,
            setup,
            state: State::Restarting,
            first_worker: Some(worker),
            worker: None,
            generation: 0,
            queue: VecDeque::new(),
            execution_count: 0,
            restarts: 0,
            kill_reason: None,
            closers: Vec::new(),
            draining: None,
            published_phase: None,
            durability,
            completions: Default::default(),
            keep_state: false,
            proactive,
            events,
            idleness: idle::Idleness::default(),
            llm_calls: Default::default(),
        }
    }

    /// The count of the execution running now, or else of the last one to run.
    fn last_started_count(&self) -> u64 {
        let waiting = self.queue.len() as u64;
        self.execution_count.saturating_sub(waiting)
    }

    /// Makes `worker` the session's worker and starts what is queued.
    fn adopt(&mut self, mut worker: Worker, ctx: &mut Context<Self>) {
        self.generation += 1;
        let generation = self.generation;
        let events = std::mem::replace(&mut worker.events, mpsc::channel(1).1);
        ctx.add_stream(ReceiverStream::new(events).map(move |e| Tagged(generation, e)));
        self.worker = Some(worker);
        self.state = State::Idle;
        self.enable_llm();
        let restore_on_start = self
            .setup
            .state
            .as_mut()
            .is_some_and(|state| std::mem::take(&mut state.restore_on_start));
        if restore_on_start || std::mem::take(&mut self.durability.restore_next_worker) {
            return self.start_restore(None, None, true, ctx);
        }
        self.start_next(ctx);
    }

    /// Asks the pool for a replacement worker; requests keep queueing meanwhile.
    fn replace_worker(&mut self, ctx: &mut Context<Self>) {
        self.state = State::Restarting;
        // Spawned on this session's arbiter: the worker's pipes are served on the thread
        // that runs the session, as they were for the worker it replaces.
        let acquire = self.setup.pool.send(Acquire {
            spec: self.setup.spec.clone(),
            slot: Slot::Held,
            arbiter: Some(Arbiter::current()),
        });
        ctx.spawn(acquire.into_actor(self).map(|outcome, act, ctx| {
            let reason = match outcome {
                Ok(Ok(lease)) => match act.state {
                    State::Restarting => return act.adopt(lease.worker, ctx),
                    // Closed while waiting: the lease's worker ends as it is dropped.
                    _ => return,
                },
                Ok(Err(err)) => err.to_string(),
                Err(_) => "the pool has stopped".to_owned(),
            };
            tracing::warn!(session = %act.session_id, %reason, "no replacement worker");
            if let State::Restarting = act.state {
                act.fail_queue(&reason);
                act.state = State::Failed;
            }
            act.publish_phase();
        }));
    }

    /// Brings the `pyvisor_sessions` gauge in line with the current state.
    fn publish_phase(&mut self) {
        let phase = self.state.phase().metric_label();
        metrics::session_phase_changed(self.published_phase, phase);
        self.published_phase = phase;
    }

    /// Checks that `request` may join the queue.
    fn admit(&self, request: &ExecuteRequest) -> Result<(), SessionError> {
        let session_id = || self.session_id.clone();
        let idle = matches!(self.state, State::Idle) && self.queue.is_empty();
        match &self.state {
            State::Closing | State::Closed => {
                return Err(SessionError::Closed {
                    session_id: session_id(),
                })
            }
            _ if self.draining.is_some() => {
                return Err(SessionError::ShuttingDown {
                    session_id: session_id(),
                })
            }
            _ if !request.queue && !idle => {
                return Err(SessionError::Busy {
                    session_id: session_id(),
                })
            }
            _ => {}
        }
        if self.queue.len() >= MAX_QUEUED_EXECUTIONS {
            return Err(SessionError::QueueFull {
                session_id: session_id(),
                limit: MAX_QUEUED_EXECUTIONS,
            });
        }
        // Leave room for the frame's envelope around the code.
        let limit = self.setup.max_frame.saturating_sub(1024);
        if request.code.len() > limit {
            return Err(SessionError::TooLarge {
                bytes: request.code.len(),
                limit,
            });
        }
        Ok(())
    }

    /// Starts the next queued execution if the worker is idle.
    fn start_next(&mut self, ctx: &mut Context<Self>) {
        if !matches!(self.state, State::Idle) {
            return;
        }
        if self.worker.is_none() {
            return;
        }
        let Some(queued) = self.queue.pop_front() else {
            return self.publish_idle(ctx);
        };
        if let Some(recovered) = self.durability.recovered.take() {
            if recovered.fresh_namespace && recovered.lost_executions > 0 {
                // The worker died between executions and its state is gone: running this code
                // in an empty namespace as if nothing happened would mislead its caller.
                let cause = self.durability.crash_cause.take().unwrap_or_default();
                queued.refuse_after_crash(&cause, recovered);
                return self.start_next(ctx);
            }
            self.durability.recovered = Some(recovered);
        }
        let path = self.serve_path(&queued.request.code, queued.request.cache);
        let timeout = queued.request.timeout.unwrap_or(self.setup.limits.timeout);
        let execution_id = queued.ticket.execution_id.clone();
        let timer = ctx.run_later(timeout, move |act, ctx| {
            if act.running_id() == Some(&execution_id) {
                act.interrupt(InterruptCause::Timeout(timeout), ctx);
            }
        });
        let mut running = Box::new(Running::new(queued, self.setup.limits.output_bytes, timer));
        if let Some(link) = &self.setup.memory {
            // Against the in-memory index only, on this thread: the code waits for nothing.
            running.insights = link.memory.interrupt(
                &link.owner,
                &self.session_id.as_str().into(),
                &running.ticket.execution_id,
                running.ticket.execution_count,
                &running.request.code,
            );
        }
        self.state = State::Busy(running);
        self.serve(path, ctx);
    }

    fn running_id(&self) -> Option<&String> {
        match &self.state {
            State::Busy(running) => Some(&running.ticket.execution_id),
            _ => None,
        }
    }

    /// An interrupt frame for the running execution, and SIGKILL of the group if it has not
    /// stopped after the grace period. Returns whether an execution was running.
    fn interrupt(&mut self, cause: InterruptCause, ctx: &mut Context<Self>) -> bool {
        let State::Busy(running) = &mut self.state else {
            return false;
        };
        if running.interrupt.is_some() || running.saving {
            return true;
        }
        running.interrupt = Some(cause);
        let execution_id = running.ticket.execution_id.clone();
        if !matches!(running.path, ServePath::Real) {
            // Not on the worker yet: run it there, where the interrupt stops it as it would
            // have stopped a real run.
            self.run_for_real(ctx);
        }
        if let Some(worker) = &self.worker {
            worker.interrupt(&execution_id);
        }
        let grace = self.setup.limits.interrupt_grace;
        ctx.run_later(grace, move |act, _| {
            if act.running_id() == Some(&execution_id) {
                act.kill_worker(format!(
                    "the code did not stop within {grace:?} of the interrupt"
                ));
            }
        });
        true
    }

    /// Kills the worker's process group; its exit then arrives as an ordinary event.
    fn kill_worker(&mut self, reason: String) {
        if let Some(worker) = &self.worker {
            tracing::info!(session = %self.session_id, pid = worker.pid(), %reason, "killing worker");
            self.kill_reason.get_or_insert(reason);
            worker.kill();
        }
    }

    /// Sends an input reply for `execution_id` if it is waiting; false otherwise.
    fn answer_input(&mut self, execution_id: &str, value: Option<String>) -> bool {
        let State::Busy(running) = &mut self.state else {
            return false;
        };
        if running.ticket.execution_id != execution_id || running.pending_input.is_none() {
            return false;
        }
        running.pending_input = None;
        if let Some(worker) = &self.worker {
            let _ = worker.writer.send(&HostMessage::InputReply {
                id: execution_id.to_owned(),
                value,
            });
        }
        true
    }

    /// Ends the running execution with `status` and starts the next one.
    fn finish(
        &mut self,
        status: ExecutionStatus,
        result: Option<crate::execution::ResultValue>,
        error: Option<ErrorInfo>,
        ctx: &mut Context<Self>,
    ) {
        self.idleness.touch();
        let State::Busy(mut running) = std::mem::replace(&mut self.state, State::Idle) else {
            return;
        };
        self.cancel_llm_calls("the execution that made the call has ended", ctx);
        if running.recovered.is_none() {
            running.recovered = self.durability.recovered.take();
        }
        running.warnings = self.durability.ledger.warnings();
        ctx.cancel_future(running.timer);
        if let Some(timer) = running.pending_input {
            ctx.cancel_future(timer);
        }
        self.setup
            .counters
            .execution_finished(status, running.started.elapsed());
        self.publish_executed(events::Executed {
            session_id: self.session_id.as_str().into(),
            execution_id: running.ticket.execution_id.clone(),
            code: running.request.code.clone(),
            status,
            facts: None,
            duration_ms: running.started.elapsed().as_secs_f64() * 1000.0,
            served_by: running.served_by,
        });
        if let Some(link) = &self.setup.memory {
            link.memory.record(OutcomeDraft {
                owner: link.owner.clone(),
                session_id: self.session_id.as_str().into(),
                execution_id: running.ticket.execution_id.clone(),
                execution_count: running.ticket.execution_count,
                code: running.request.code.clone(),
                status,
                error: error
                    .as_ref()
                    .map(|error| (error.type_name.clone(), error.message.clone())),
                failing_line: error
                    .as_ref()
                    .and_then(|error| crate::memory::failing_line(&error.traceback)),
                duration_ms: running.started.elapsed().as_secs_f64() * 1000.0,
                meta: running.request.meta.clone(),
            });
        }
        running.into_result(status, result, error);
        if let Some(waiting) = self.draining.as_mut() {
            for drained in waiting.drain(..) {
                let _ = drained.send(());
            }
        }
        self.start_next(ctx);
    }

    /// Ends every queued execution with an error result.
    fn fail_queue(&mut self, reason: &str) {
        for queued in self.queue.drain(..) {
            queued.refuse(reason);
        }
    }

    fn begin_close(&mut self, graceful: bool, ctx: &mut Context<Self>) {
        self.fail_queue("the session was closed");
        let previous = std::mem::replace(&mut self.state, State::Closing);
        if let State::Busy(running) = previous {
            ctx.cancel_future(running.timer);
            running.into_result(
                ExecutionStatus::Interrupted,
                None,
                Some(host_error(
                    "SessionClosed",
                    "the session was closed while the execution ran",
                )),
            );
            return self.kill_worker("session closed".into());
        }
        match &self.worker {
            None => self.finish_close(),
            Some(worker) if graceful => {
                let _ = worker.writer.send(&HostMessage::Shutdown);
                ctx.run_later(CLOSE_GRACE, |act, _| {
                    act.kill_worker("did not exit after shutdown".into())
                });
            }
            Some(_) => self.kill_worker("session closed".into()),
        }
    }

    /// The worker is gone for good: answer the closers and tell the supervisor.
    fn finish_close(&mut self) {
        self.worker = None;
        self.state = State::Closed;
        if let Some(state) = &self.setup.state {
            if !(state.named() && self.keep_state) {
                let (store, key) = (state.store.clone(), state.key.clone());
                let gate = self.durability.store_gate.clone();
                drop(tokio::task::spawn_blocking(move || {
                    // After a checkpoint being stored now, and before any stored later.
                    let mut removed = gate.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    *removed = true;
                    if let Err(err) = store.remove_session(&key) {
                        tracing::warn!(session = %key, error = %err, "checkpoints not removed");
                    }
                }));
            }
        }
        for closer in self.closers.drain(..) {
            let _ = closer.send(());
        }
        for drained in self
            .draining
            .iter_mut()
            .flat_map(|waiting| waiting.drain(..))
        {
            let _ = drained.send(());
        }
        self.forget_answers();
        self.events.publish(SessionEvent::Closed {
            session_id: self.session_id.as_str().into(),
        });
    }
}

impl Queued {
    /// Ends an execution that never reached the worker with a `NotExecuted` error.
    fn refuse(&self, reason: &str) {
        self.end_unrun(host_error("NotExecuted", reason), None);
    }

    /// Ends an execution that was not run because the worker died before it and the
    /// session's state is gone (`recovered` says how much), with a `StateLost` error.
    fn refuse_after_crash(&self, cause: &str, recovered: crate::execution::Recovered) {
        let message = format!(
            "the worker died between executions ({cause}); no checkpoint could be used, so the \
             session restarted with a fresh namespace and {} execution(s) are lost; this code \
             was not run, send it again to run it in the fresh namespace",
            recovered.lost_executions
        );
        self.end_unrun(host_error("StateLost", message), Some(recovered));
    }

    fn end_unrun(&self, error: ErrorInfo, recovered: Option<crate::execution::Recovered>) {
        let result = ExecutionResult {
            execution_id: self.ticket.execution_id.clone(),
            execution_count: self.ticket.execution_count,
            status: ExecutionStatus::Crashed,
            stdout: String::new(),
            stderr: String::new(),
            result: None,
            display: Vec::new(),
            error: Some(error),
            duration_ms: 0.0,
            from_cache: false,
            recovered,
            warnings: Vec::new(),
            insights: Vec::new(),
        };
        let _ = self
            .events
            .send(Ok(ExecutionEvent::Finished(Box::new(result))));
    }
}

/// An error raised by the host rather than by the user's code (it has no traceback).
fn host_error(type_name: &str, message: impl Into<String>) -> ErrorInfo {
    ErrorInfo {
        type_name: type_name.to_owned(),
        message: message.into(),
        traceback: Vec::new(),
    }
}

impl Actor for SessionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        match (self.first_worker.take(), &self.state) {
            (_, State::Closed) => {}
            (Some(worker), _) => self.adopt(worker, ctx),
            (None, _) => self.replace_worker(ctx),
        }
        self.watch_idleness(ctx);
        self.publish_phase();
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // Last line of defence: no worker outlives the actor that owns it.
        if let Some(worker) = self.worker.take() {
            worker.kill();
        }
        if !matches!(self.state, State::Restarting) {
            metrics::session_phase_changed(self.published_phase.take(), None);
        }
    }
}

impl Supervised for SessionActor {
    fn restarting(&mut self, _: &mut Context<Self>) {
        // The actor stops on purpose only after answering the running execution; anything
        // else that stopped it must not leave that caller waiting.
        if let State::Busy(running) = std::mem::replace(&mut self.state, State::Restarting) {
            running.into_result(
                ExecutionStatus::Crashed,
                None,
                Some(host_error("WorkerCrashed", "the session restarted")),
            );
        }
        self.kill_reason = None;
        self.durability.forget_timers();
    }
}
