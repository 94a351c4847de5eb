//! The SessionActor: one per session, owning exactly one Python worker at a time.
//!
//! Callers (the engine's `Session` handle, later the RPC server) send it [`Execute`],
//! [`SendInput`], [`Interrupt`], [`GetInfo`] and [`Close`]. It serialises executions in a
//! bounded queue, relays the worker's output, input requests and displays to the caller of
//! the running execution, enforces the timeout (SIGINT, then SIGKILL of the process group
//! after the grace period) and treats the worker's exit as an ordinary event: the running
//! execution ends `crashed` (or `timeout`) and a fresh worker is started under the same
//! session id.

use std::collections::VecDeque;
use std::process::ExitStatus;
use std::time::Duration;

use actix::prelude::*;
use pyvisor_protocol::{HostMessage, WorkerMessage, WorkerStatus};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::errors::{SessionError, SpawnError};
use crate::execution::{
    DisplayData, ErrorInfo, ExecuteRequest, ExecutionEvent, ExecutionResult, ExecutionStatus,
    OutputStream,
};
use crate::limits::SessionLimits;
use crate::running::{InterruptCause, Running};
use crate::worker::{Worker, WorkerEvent, WorkerInfo, WorkerSpec};

mod messages;

pub use messages::{
    Close, EventSender, Execute, ExecutionTicket, GetInfo, Interrupt, SendInput, SessionEnded,
    SessionPhase, SessionSnapshot,
};

/// Most executions waiting behind the running one.
pub const MAX_QUEUED_EXECUTIONS: usize = 1024;
/// How long a closing worker may take to exit after `shutdown` before it is killed.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

enum State {
    Starting,
    Idle,
    Busy(Box<Running>),
    Failed(String),
    Closing,
}

/// Event from the worker of a given generation; events of a previous worker are ignored.
struct Tagged(u64, WorkerEvent);

/// The actor owning one session and its worker.
pub struct SessionActor {
    session_id: String,
    spec: WorkerSpec,
    limits: SessionLimits,
    state: State,
    worker: Option<Worker>,
    generation: u64,
    queue: VecDeque<Queued>,
    execution_count: u64,
    restarts: u64,
    /// Why the current worker is being killed, for the crash message.
    kill_reason: Option<String>,
    ready: Option<oneshot::Sender<Result<WorkerInfo, SpawnError>>>,
    closers: Vec<oneshot::Sender<()>>,
    on_end: Option<Recipient<SessionEnded>>,
}

/// An execution waiting for the worker.
pub(crate) struct Queued {
    pub ticket: ExecutionTicket,
    pub request: ExecuteRequest,
    pub events: EventSender,
}

impl SessionActor {
    /// A session that starts its worker when the actor starts and reports the outcome on
    /// `ready`.
    pub fn new(
        session_id: String,
        spec: WorkerSpec,
        limits: SessionLimits,
        ready: oneshot::Sender<Result<WorkerInfo, SpawnError>>,
        on_end: Option<Recipient<SessionEnded>>,
    ) -> Self {
        Self {
            session_id,
            spec,
            limits,
            state: State::Starting,
            worker: None,
            generation: 0,
            queue: VecDeque::new(),
            execution_count: 0,
            restarts: 0,
            kill_reason: None,
            ready: Some(ready),
            closers: Vec::new(),
            on_end,
        }
    }

    /// Starts a worker; holds the mailbox until it is ready so no request sees a half state.
    fn start_worker(&mut self, ctx: &mut Context<Self>) {
        self.state = State::Starting;
        let spec = self.spec.clone();
        let started = async move { Worker::start(&spec).await };
        ctx.wait(started.into_actor(self).map(|outcome, act, ctx| match outcome {
            Ok(mut worker) => {
                act.generation += 1;
                let generation = act.generation;
                let events = std::mem::replace(&mut worker.events, mpsc::channel(1).1);
                ctx.add_stream(ReceiverStream::new(events).map(move |e| Tagged(generation, e)));
                if let Some(ready) = act.ready.take() {
                    let _ = ready.send(Ok(worker.info.clone()));
                }
                act.worker = Some(worker);
                act.state = State::Idle;
                act.start_next(ctx);
            }
            Err(err) => {
                tracing::warn!(session = %act.session_id, error = %err, "worker failed to start");
                let reason = err.to_string();
                match act.ready.take() {
                    Some(ready) => {
                        let _ = ready.send(Err(err));
                        ctx.stop();
                    }
                    None => act.fail_queue(&reason),
                }
                act.state = State::Failed(reason);
            }
        }));
    }

    /// Checks that `request` may join the queue.
    fn admit(&self, request: &ExecuteRequest) -> Result<(), SessionError> {
        let session_id = || self.session_id.clone();
        let idle = matches!(self.state, State::Idle) && self.queue.is_empty();
        match &self.state {
            State::Closing => {
                return Err(SessionError::Closed {
                    session_id: session_id(),
                })
            }
            State::Failed(reason) => {
                return Err(SessionError::Unavailable {
                    session_id: session_id(),
                    reason: reason.clone(),
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
        let limit = self.spec.max_frame.saturating_sub(1024);
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
            repr_limit: self.limits.result_repr_bytes,
        };
        if let Err(err) = worker.writer.send(&frame) {
            // Size was checked on enqueue; anything else means the frame cannot be built.
            queued.refuse(&err.to_string());
            return self.start_next(ctx);
        }
        let timeout = queued.request.timeout.unwrap_or(self.limits.timeout);
        let execution_id = queued.ticket.execution_id.clone();
        let timer = ctx.run_later(timeout, move |act, ctx| {
            if act.running_id() == Some(&execution_id) {
                act.interrupt(InterruptCause::Timeout(timeout), ctx);
            }
        });
        self.state = State::Busy(Box::new(Running::new(
            queued,
            self.limits.output_bytes,
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
        let grace = self.limits.interrupt_grace;
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
                    let timeout = self.limits.input_timeout;
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
        let State::Busy(running) = std::mem::replace(&mut self.state, State::Idle) else {
            return;
        };
        ctx.cancel_future(running.timer);
        if let Some(timer) = running.pending_input {
            ctx.cancel_future(timer);
        }
        running.into_result(status, result, error);
        self.start_next(ctx);
    }

    /// The worker is gone: end the running execution, then restart, fail or stop.
    fn on_exit(&mut self, status: ExitStatus, ctx: &mut Context<Self>) {
        self.worker = None;
        let cause = describe_exit(status, self.kill_reason.take());
        tracing::info!(session = %self.session_id, %cause, "worker exited");
        if let State::Closing = self.state {
            return ctx.stop();
        }
        if let State::Busy(running) = &self.state {
            let (status, error) = match running.interrupt {
                Some(InterruptCause::Timeout(limit)) => (
                    ExecutionStatus::Timeout,
                    host_error(
                        "TimeoutError",
                        format!(
                            "execution exceeded its {limit:?} timeout; {cause}; the session \
                             restarted with a fresh namespace"
                        ),
                    ),
                ),
                _ => (
                    ExecutionStatus::Crashed,
                    host_error(
                        "WorkerCrashed",
                        format!("{cause}; the session restarted with a fresh namespace"),
                    ),
                ),
            };
            // With no worker, `finish` leaves the queue alone until the restart completes.
            self.finish(status, None, Some(error), ctx);
        }
        self.restarts += 1;
        self.start_worker(ctx);
    }

    /// Ends every queued execution with an error result.
    fn fail_queue(&mut self, reason: &str) {
        for queued in self.queue.drain(..) {
            queued.refuse(reason);
        }
    }

    fn begin_close(&mut self, graceful: bool, ctx: &mut Context<Self>) {
        self.fail_queue("the session was closed");
        if let State::Busy(running) = std::mem::replace(&mut self.state, State::Closing) {
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
            None => ctx.stop(),
            Some(worker) if graceful => {
                let _ = worker.writer.send(&HostMessage::Shutdown);
                ctx.run_later(CLOSE_GRACE, |act, _| {
                    act.kill_worker("did not exit after shutdown".into())
                });
            }
            Some(_) => self.kill_worker("session closed".into()),
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
fn describe_exit(status: ExitStatus, kill_reason: Option<String>) -> String {
    use std::os::unix::process::ExitStatusExt;
    let how = match (status.code(), status.signal()) {
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
        self.start_worker(ctx);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // Last line of defence: nothing of this session may outlive the actor.
        if let Some(worker) = &self.worker {
            worker.kill();
        }
        for closer in self.closers.drain(..) {
            let _ = closer.send(());
        }
        if let Some(on_end) = &self.on_end {
            on_end.do_send(SessionEnded {
                session_id: self.session_id.clone(),
            });
        }
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
    type Result = MessageResult<GetInfo>;

    fn handle(&mut self, _: GetInfo, _: &mut Context<Self>) -> Self::Result {
        let phase = match self.state {
            State::Starting => SessionPhase::Starting,
            State::Idle => SessionPhase::Idle,
            State::Busy(_) => SessionPhase::Busy,
            State::Failed(_) => SessionPhase::Failed,
            State::Closing => SessionPhase::Closing,
        };
        MessageResult(SessionSnapshot {
            session_id: self.session_id.clone(),
            phase,
            pid: self.worker.as_ref().map(Worker::pid),
            python_version: self.worker.as_ref().map(|w| w.info.python_version.clone()),
            execution_count: self.execution_count,
            queued: self.queue.len(),
            restarts: self.restarts,
            containment: self.worker.as_ref().map(|w| w.containment),
        })
    }
}

impl Handler<Close> for SessionActor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: Close, ctx: &mut Context<Self>) -> Self::Result {
        let (done, closed) = oneshot::channel();
        self.closers.push(done);
        if !matches!(self.state, State::Closing) {
            self.begin_close(msg.graceful, ctx);
        }
        Box::pin(async move {
            let _ = closed.await;
        })
    }
}
