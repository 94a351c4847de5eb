//! The SessionActor: one per session, owning exactly one Python worker at a time.
//!
//! Callers (the engine's `Session` handle, later the RPC server) send it [`Execute`],
//! [`SendInput`], [`Interrupt`], [`GetInfo`], [`Drain`] and [`Close`]. It serialises
//! executions in a bounded queue, relays the worker's output, input requests and displays to
//! the caller of the running execution, enforces the timeout (SIGINT, then SIGKILL of the
//! process group after the grace period) and treats the worker's exit as an ordinary event:
//! the running execution ends `crashed` (or `timeout`) and the actor stops, so that actix
//! supervision restarts it under the same session id; the restarted actor keeps its queue
//! and takes a fresh worker from the pool. A closed session stays behind as a tombstone that
//! refuses work until the last handle to it is dropped.

use std::collections::VecDeque;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use pyvisor_protocol::{HostMessage, WorkerMessage, WorkerStatus};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::checkpoint::CheckpointInfo;
use crate::errors::SessionError;
use crate::execution::{
    DisplayData, ErrorInfo, ExecuteRequest, ExecutionEvent, ExecutionResult, ExecutionStatus,
    OutputStream,
};
use crate::limits::SessionLimits;
use crate::metrics::{self, EngineCounters};
use crate::pool::{Acquire, PoolActor, Slot};
use crate::running::{InterruptCause, Running};
use crate::worker::{Worker, WorkerEvent, WorkerSpec};

mod messages;
mod state;

pub use messages::{
    CheckpointNow, CheckpointSummary, Close, CloseState, Drain, EventSender, Execute,
    ExecutionTicket, GetInfo, Interrupt, ListCheckpoints, RestoreCheckpoint, RestoreSummary,
    SendInput, SessionEnded, SessionPhase, SessionSnapshot,
};
pub use state::{AutoCheckpoint, Inspection, StateSetup};
use state::{Durability, INSPECT_TIMEOUT};

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
    /// Told once when the session is closed for good.
    pub on_end: Option<Recipient<SessionEnded>>,
    /// Where the session keeps checkpoints; none are kept when `None`.
    pub state: Option<StateSetup>,
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
    /// Keep the session's checkpoints when it closes (else they are deleted).
    keep_state: bool,
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
            durability: Durability::default(),
            keep_state: false,
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
        let acquire = self.setup.pool.send(Acquire {
            spec: self.setup.spec.clone(),
            slot: Slot::Held,
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
        let Some(worker) = &self.worker else { return };
        let Some(queued) = self.queue.pop_front() else {
            return;
        };
        let frame = HostMessage::Execute {
            id: queued.ticket.execution_id.clone(),
            code: queued.request.code.clone(),
            repr_limit: self.setup.limits.result_repr_bytes,
            transaction: queued.request.transaction,
        };
        if let Err(err) = worker.writer.send(&frame) {
            // Size was checked on enqueue; anything else means the frame cannot be built.
            queued.refuse(&err.to_string());
            return self.start_next(ctx);
        }
        let timeout = queued.request.timeout.unwrap_or(self.setup.limits.timeout);
        let execution_id = queued.ticket.execution_id.clone();
        let timer = ctx.run_later(timeout, move |act, ctx| {
            if act.running_id() == Some(&execution_id) {
                act.interrupt(InterruptCause::Timeout(timeout), ctx);
            }
        });
        self.state = State::Busy(Box::new(Running::new(
            queued,
            self.setup.limits.output_bytes,
            timer,
        )));
    }

    fn running_id(&self) -> Option<&String> {
        match &self.state {
            State::Busy(running) => Some(&running.ticket.execution_id),
            _ => None,
        }
    }

    /// SIGINT to the running code, and SIGKILL of the group if it has not stopped after the
    /// grace period. Returns whether an execution was running.
    fn interrupt(&mut self, cause: InterruptCause, ctx: &mut Context<Self>) -> bool {
        let State::Busy(running) = &mut self.state else {
            return false;
        };
        if running.interrupt.is_some() {
            return true;
        }
        running.interrupt = Some(cause);
        if let Some(worker) = &self.worker {
            worker.interrupt();
        }
        let execution_id = running.ticket.execution_id.clone();
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

    fn on_message(&mut self, message: WorkerMessage, ctx: &mut Context<Self>) {
        // Answers to state requests may come in any state, also between executions.
        let message = match message {
            WorkerMessage::CheckpointDone {
                id,
                saved,
                lost,
                error,
                ..
            } => return self.checkpoint_done(&id, saved, lost, error, ctx),
            WorkerMessage::RestoreDone {
                id,
                restored,
                lost,
                error,
            } => return self.restore_done(&id, restored, lost, error),
            WorkerMessage::InspectDone {
                id,
                variables,
                definitions,
                rss_bytes,
            } => {
                let inspection = Inspection {
                    variables,
                    definitions,
                    rss_bytes,
                };
                return self.inspect_done(&id, inspection);
            }
            other => other,
        };
        let State::Busy(running) = &mut self.state else {
            return self.kill_worker(format!("unexpected message while idle: {message:?}"));
        };
        let execution_id = running.ticket.execution_id.clone();
        match message {
            WorkerMessage::Result {
                id,
                status,
                result,
                error,
                changed,
                ..
            } if id == execution_id => {
                let status = match (status, &error, running.interrupt) {
                    (WorkerStatus::Ok, _, _) => ExecutionStatus::Ok,
                    (WorkerStatus::Error, Some(e), Some(cause))
                        if e.type_name == "KeyboardInterrupt" =>
                    {
                        cause.status()
                    }
                    (WorkerStatus::Error, _, _) => ExecutionStatus::Error,
                };
                self.finish(status, result, error, ctx);
                self.count_change(changed, ctx);
            }
            WorkerMessage::InputRequest {
                id,
                prompt,
                password,
            } if id == execution_id => {
                let answerable = running.request.input && !running.events.is_closed();
                if answerable {
                    let _ = running
                        .events
                        .send(Ok(ExecutionEvent::InputRequest { prompt, password }));
                    let timeout = self.setup.limits.input_timeout;
                    let waiting_id = id.clone();
                    let timer = ctx.run_later(timeout, move |act, _| {
                        act.answer_input(&waiting_id, None);
                    });
                    running.pending_input = Some(timer);
                } else if let Some(worker) = &self.worker {
                    let _ = worker
                        .writer
                        .send(&HostMessage::InputReply { id, value: None });
                }
            }
            WorkerMessage::Display { id, mime, data } if id == execution_id => {
                let display = DisplayData { mime, data };
                let _ = running
                    .events
                    .send(Ok(ExecutionEvent::Display(display.clone())));
                running.display.push(display);
            }
            other => self.kill_worker(format!("unexpected message: {other:?}")),
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

    fn on_output(&mut self, stream: OutputStream, bytes: &[u8]) {
        if let State::Busy(running) = &mut self.state {
            running.push_output(stream, bytes);
        }
    }

    /// Ends the running execution with `status` and starts the next one.
    fn finish(
        &mut self,
        status: ExecutionStatus,
        result: Option<crate::execution::ResultValue>,
        error: Option<ErrorInfo>,
        ctx: &mut Context<Self>,
    ) {
        let State::Busy(mut running) = std::mem::replace(&mut self.state, State::Idle) else {
            return;
        };
        if running.recovered.is_none() {
            running.recovered = self.durability.recovered.take();
        }
        ctx.cancel_future(running.timer);
        if let Some(timer) = running.pending_input {
            ctx.cancel_future(timer);
        }
        self.setup
            .counters
            .execution_finished(status, running.started.elapsed());
        running.into_result(status, result, error);
        if let Some(waiting) = self.draining.as_mut() {
            for drained in waiting.drain(..) {
                let _ = drained.send(());
            }
        }
        self.start_next(ctx);
    }

    /// The worker is gone: end the running execution, then stop, so that supervision
    /// restarts the actor with a new worker (or finish closing).
    fn on_exit(&mut self, status: Option<ExitStatus>, ctx: &mut Context<Self>) {
        self.worker = None;
        let cause = describe_exit(status, self.kill_reason.take());
        tracing::info!(session = %self.session_id, %cause, "worker exited");
        if let State::Closing = self.state {
            self.forget_worker_requests(false);
            return self.finish_close();
        }
        self.setup.counters.worker_crashed();
        let recovered = self.forget_worker_requests(true);
        let comeback = match &recovered {
            Some(r) => format!(
                "the session restarts from checkpoint {} ({} execution(s) lost)",
                r.checkpoint_id, r.lost_executions
            ),
            None => "the session restarted with a fresh namespace".to_owned(),
        };
        if let State::Busy(running) = &mut self.state {
            running.recovered = recovered;
            let (status, error) = match running.interrupt {
                Some(InterruptCause::Timeout(limit)) => (
                    ExecutionStatus::Timeout,
                    host_error(
                        "TimeoutError",
                        format!("execution exceeded its {limit:?} timeout; {cause}; {comeback}"),
                    ),
                ),
                _ => (
                    ExecutionStatus::Crashed,
                    host_error("WorkerCrashed", format!("{cause}; {comeback}")),
                ),
            };
            // With no worker, `finish` leaves the queue alone until the restart completes.
            self.finish(status, None, Some(error), ctx);
        } else {
            self.durability.recovered = recovered;
        }
        self.restarts += 1;
        self.state = State::Restarting;
        ctx.stop();
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
            let named = state.key.starts_with("name:");
            if !(named && self.keep_state) {
                let (store, key) = (state.store.clone(), state.key.clone());
                drop(tokio::task::spawn_blocking(move || {
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
        if let Some(on_end) = self.setup.on_end.take() {
            on_end.do_send(SessionEnded {
                session_id: self.session_id.clone(),
            });
        }
    }
}

impl Queued {
    /// Ends an execution that never reached the worker with a `NotExecuted` error.
    fn refuse(&self, reason: &str) {
        let result = ExecutionResult {
            execution_id: self.ticket.execution_id.clone(),
            execution_count: self.ticket.execution_count,
            status: ExecutionStatus::Crashed,
            stdout: String::new(),
            stderr: String::new(),
            result: None,
            display: Vec::new(),
            error: Some(host_error("NotExecuted", reason)),
            duration_ms: 0.0,
            recovered: None,
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

/// A human sentence for how the worker ended.
fn describe_exit(status: Option<ExitStatus>, kill_reason: Option<String>) -> String {
    use std::os::unix::process::ExitStatusExt;
    let how = match status.map_or((None, None), |status| (status.code(), status.signal())) {
        (Some(code), _) => format!("the worker exited with code {code}"),
        (None, Some(libc::SIGXCPU)) => {
            "the worker hit its cpu limit (limits.cpu_s) and was killed by SIGXCPU".to_owned()
        }
        (None, Some(signal)) => {
            let name = nix::sys::signal::Signal::try_from(signal)
                .map(|s| s.as_str().to_owned())
                .unwrap_or_else(|_| format!("signal {signal}"));
            format!("the worker was killed by {name}")
        }
        (None, None) if status.is_none() => {
            "the worker ended (its exit status is unknown: the zygote that forked it is gone)"
                .to_owned()
        }
        (None, None) => "the worker ended".to_owned(),
    };
    match kill_reason {
        Some(reason) => format!("{how} ({reason})"),
        None => how,
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

impl StreamHandler<Tagged> for SessionActor {
    fn handle(&mut self, Tagged(generation, event): Tagged, ctx: &mut Context<Self>) {
        if generation != self.generation {
            return;
        }
        match event {
            WorkerEvent::Output { stream, bytes } => self.on_output(stream, &bytes),
            WorkerEvent::Message(message) => self.on_message(message, ctx),
            // A worker being ended closes its pipe on the way out: nothing to report.
            WorkerEvent::ProtocolError(_)
                if matches!(self.state, State::Closing) || self.kill_reason.is_some() => {}
            WorkerEvent::ProtocolError(reason) => {
                tracing::warn!(session = %self.session_id, %reason, "protocol error");
                self.kill_worker(format!("protocol error: {reason}"));
            }
            WorkerEvent::Exited(status) => self.on_exit(status, ctx),
        }
        self.publish_phase();
    }

    /// A worker's event stream ends after its exit; the session lives on.
    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl Handler<Execute> for SessionActor {
    type Result = Result<ExecutionTicket, SessionError>;

    fn handle(&mut self, msg: Execute, ctx: &mut Context<Self>) -> Self::Result {
        if let Err(err) = self.admit(&msg.request) {
            // Callers that did not wait for this reply learn the reason from the channel.
            let _ = msg.events.send(Err(err.clone()));
            return Err(err);
        }
        if let State::Failed = self.state {
            self.replace_worker(ctx);
        }
        self.execution_count += 1;
        let ticket = ExecutionTicket {
            execution_id: format!("e-{}", self.execution_count),
            execution_count: self.execution_count,
        };
        self.queue.push_back(Queued {
            ticket: ticket.clone(),
            request: msg.request,
            events: msg.events,
        });
        self.start_next(ctx);
        self.publish_phase();
        Ok(ticket)
    }
}

impl Handler<SendInput> for SessionActor {
    type Result = Result<(), SessionError>;

    fn handle(&mut self, msg: SendInput, ctx: &mut Context<Self>) -> Self::Result {
        let pending = match &mut self.state {
            State::Busy(running) if running.ticket.execution_id == msg.execution_id => {
                running.pending_input.take()
            }
            _ => None,
        };
        let Some(timer) = pending else {
            return Err(SessionError::NoPendingInput {
                execution_id: msg.execution_id,
            });
        };
        ctx.cancel_future(timer);
        if let Some(worker) = &self.worker {
            let _ = worker.writer.send(&HostMessage::InputReply {
                id: msg.execution_id,
                value: msg.value,
            });
        }
        Ok(())
    }
}

impl Handler<Interrupt> for SessionActor {
    type Result = bool;

    fn handle(&mut self, _: Interrupt, ctx: &mut Context<Self>) -> bool {
        self.interrupt(InterruptCause::User, ctx)
    }
}

impl Handler<GetInfo> for SessionActor {
    // A plain future, not an actor future: it must survive a restart of the actor.
    type Result = ResponseFuture<SessionSnapshot>;

    fn handle(&mut self, _: GetInfo, _: &mut Context<Self>) -> Self::Result {
        let inspection = self.start_inspect();
        let mut snapshot = SessionSnapshot {
            session_id: self.session_id.clone(),
            phase: self.state.phase(),
            pid: self.worker.as_ref().map(Worker::pid),
            python_version: self.worker.as_ref().map(|w| w.info.python_version.clone()),
            execution_count: self.execution_count,
            queued: self.queue.len(),
            restarts: self.restarts,
            containment: self.worker.as_ref().map(|w| w.containment),
            last_checkpoint: self.durability.last.map(|last| last.id.to_string()),
            namespace: None,
        };
        Box::pin(async move {
            if let Some(answer) = inspection {
                snapshot.namespace = tokio::time::timeout(INSPECT_TIMEOUT, answer)
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
            snapshot
        })
    }
}

impl Handler<Close> for SessionActor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: Close, ctx: &mut Context<Self>) -> Self::Result {
        let open = !matches!(self.state, State::Closing | State::Closed);
        // A busy worker would checkpoint only after its execution, which a close must not
        // wait for: the session keeps its last checkpoint instead.
        let idle = !matches!(self.state, State::Busy(_));
        if open && idle && msg.state == CloseState::Checkpoint {
            // Checkpoint first, then close through the mailbox, which outlives a restart.
            let (reply, written) = oneshot::channel();
            let started = self.start_checkpoint(Some(reply), ctx);
            let session = ctx.address();
            return Box::pin(async move {
                let outcome = match started {
                    Ok(()) => written.await.map_or(Ok(()), |stored| stored.map(drop)),
                    Err(err) => Err(err),
                };
                if let Err(err) = outcome {
                    tracing::warn!(error = %err, "no last checkpoint before close");
                }
                let close = Close {
                    graceful: msg.graceful,
                    state: CloseState::Keep,
                };
                let _ = session.send(close).await;
            });
        }
        let (done, closed) = oneshot::channel();
        match self.state {
            State::Closed => {
                let _ = done.send(());
            }
            State::Closing => self.closers.push(done),
            _ => {
                self.closers.push(done);
                self.keep_state = msg.state != CloseState::Forget;
                self.begin_close(msg.graceful, ctx);
            }
        }
        self.publish_phase();
        Box::pin(async move {
            let _ = closed.await;
        })
    }
}

impl Handler<CheckpointNow> for SessionActor {
    type Result = ResponseFuture<Result<CheckpointSummary, SessionError>>;

    fn handle(&mut self, _: CheckpointNow, ctx: &mut Context<Self>) -> Self::Result {
        let (reply, written) = oneshot::channel();
        if let Err(err) = self.start_checkpoint(Some(reply), ctx) {
            return Box::pin(async move { Err(err) });
        }
        let session_id = self.session_id.clone();
        Box::pin(async move {
            written
                .await
                .unwrap_or(Err(SessionError::Closed { session_id }))
        })
    }
}

impl Handler<RestoreCheckpoint> for SessionActor {
    type Result = ResponseFuture<Result<RestoreSummary, SessionError>>;

    fn handle(&mut self, msg: RestoreCheckpoint, ctx: &mut Context<Self>) -> Self::Result {
        let (reply, restored) = oneshot::channel();
        if self.worker.is_none() {
            let err = self.no_worker();
            return Box::pin(async move { Err(err) });
        }
        self.start_restore(msg.checkpoint_id, Some(reply), false, ctx);
        let session_id = self.session_id.clone();
        Box::pin(async move {
            restored
                .await
                .unwrap_or(Err(SessionError::Closed { session_id }))
        })
    }
}

impl Handler<ListCheckpoints> for SessionActor {
    type Result = ResponseFuture<Result<Vec<CheckpointInfo>, SessionError>>;

    fn handle(&mut self, _: ListCheckpoints, _: &mut Context<Self>) -> Self::Result {
        let session_id = self.session_id.clone();
        let Some(state) = &self.setup.state else {
            return Box::pin(async move { Err(SessionError::CheckpointsOff { session_id }) });
        };
        let (store, key) = (state.store.clone(), state.key.clone());
        Box::pin(async move {
            let listed = tokio::task::spawn_blocking(move || store.list(&key)).await;
            match listed {
                Ok(Ok(list)) => Ok(list),
                Ok(Err(err)) => Err(SessionError::Checkpoint {
                    session_id,
                    source: Arc::new(err),
                }),
                Err(join) => Err(SessionError::WorkerState {
                    session_id,
                    reason: format!("listing checkpoints panicked: {join}"),
                }),
            }
        })
    }
}

impl Handler<Drain> for SessionActor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Drain, _: &mut Context<Self>) -> Self::Result {
        let waiting = self.draining.get_or_insert_with(Vec::new);
        let (done, drained) = oneshot::channel();
        if matches!(self.state, State::Busy(_)) {
            waiting.push(done);
        } else {
            let _ = done.send(());
        }
        self.fail_queue("the engine is shutting down");
        Box::pin(async move {
            let _ = drained.await;
        })
    }
}
