//! Running a session's executions: admitting a request to the queue, starting the next one
//! on the worker, its timeout and interrupt (an interrupt frame, then SIGKILL of the group
//! after the grace period), answering its `input()` calls, and finishing it: the result goes
//! to its caller, the execution to the subscribers and to memory, and the next one starts.

use actix::prelude::*;
use pyvisor_protocol::HostMessage;

use super::{
    events, EventSender, ExecutionTicket, Progress, ServePath, SessionActor, State,
    MAX_QUEUED_EXECUTIONS,
};
use crate::errors::SessionError;
use crate::execution::{
    ErrorInfo, ExecuteRequest, ExecutionEvent, ExecutionResult, ExecutionStatus,
};
use crate::memory::OutcomeDraft;
use crate::running::{InterruptCause, Running};

/// An execution waiting for the worker.
pub(crate) struct Queued {
    pub ticket: ExecutionTicket,
    pub request: ExecuteRequest,
    pub events: EventSender,
}

impl SessionActor {
    /// Checks that `request` may join the queue.
    pub(super) fn admit(&self, request: &ExecuteRequest) -> Result<(), SessionError> {
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
    pub(super) fn start_next(&mut self, ctx: &mut Context<Self>) {
        self.run_deferred(ctx);
        if !matches!(self.state, State::Idle) {
            return;
        }
        if self.worker.is_none() {
            return;
        }
        let Some(queued) = self.queue.pop_front() else {
            return self.publish_idle(ctx);
        };
        self.events.busy();
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

    pub(super) fn running_id(&self) -> Option<&String> {
        match &self.state {
            State::Busy(running) => Some(&running.ticket.execution_id),
            _ => None,
        }
    }

    /// An interrupt frame for the running execution, and SIGKILL of the group if it has not
    /// stopped after the grace period. Returns whether an execution was running.
    pub(super) fn interrupt(&mut self, cause: InterruptCause, ctx: &mut Context<Self>) -> bool {
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
    pub(super) fn kill_worker(&mut self, reason: String) {
        if let Some(worker) = &self.worker {
            tracing::info!(session = %self.session_id, pid = worker.pid(), %reason, "killing worker");
            self.kill_reason.get_or_insert(reason);
            worker.kill();
        }
    }

    /// Sends an input reply for `execution_id` if it is waiting; false otherwise.
    pub(super) fn answer_input(&mut self, execution_id: &str, value: Option<String>) -> bool {
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
    pub(super) fn finish(
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
    pub(super) fn fail_queue(&mut self, reason: &str) {
        for queued in self.queue.drain(..) {
            queued.refuse(reason);
        }
    }
}

impl Queued {
    /// Ends an execution that never reached the worker with a `NotExecuted` error.
    pub(super) fn refuse(&self, reason: &str) {
        self.end_unrun(host_error("NotExecuted", reason), None);
    }

    /// Ends an execution that was not run because the worker died before it and the
    /// session's state is gone (`recovered` says how much), with a `StateLost` error.
    pub(super) fn refuse_after_crash(&self, cause: &str, recovered: crate::execution::Recovered) {
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
            node: None,
        };
        let _ = self
            .events
            .send(Progress::Event(ExecutionEvent::Finished(Box::new(result))));
    }
}

/// An error raised by the host rather than by the user's code (it has no traceback).
pub(super) fn host_error(type_name: &str, message: impl Into<String>) -> ErrorInfo {
    ErrorInfo {
        type_name: type_name.to_owned(),
        message: message.into(),
        traceback: Vec::new(),
    }
}
