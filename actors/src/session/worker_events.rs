//! What a session does with what its worker says and does: frames (results, input
//! requests, displays, answers to state requests), output, and the worker's exit.

use std::process::ExitStatus;

use actix::prelude::*;
use pyvisor_protocol::{HostMessage, WorkerMessage, WorkerStatus};

use super::state::{CheckpointReport, Inspection, RestoreReport};
use super::{host_error, Progress, SessionActor, SessionEvent, State, Tagged};
use crate::execution::{DisplayData, ExecutionEvent, ExecutionStatus, OutputStream};
use crate::running::InterruptCause;
use crate::worker::{Worker, WorkerEvent};

impl SessionActor {
    fn on_message(&mut self, message: WorkerMessage, ctx: &mut Context<Self>) {
        if matches!(
            message,
            WorkerMessage::Result { .. } | WorkerMessage::RestoreDone { .. }
        ) {
            // The worker sends an execution's facts before any later reply, or, when the
            // next execute or restore came first, never: those it did not send are unknown.
            self.facts_arrived("", None, ctx);
        }
        // Answers to state requests may come in any state, also between executions.
        let message = match message {
            WorkerMessage::CheckpointDone {
                id,
                saved,
                lost,
                error,
                index,
                groups,
                ..
            } => {
                let report = CheckpointReport {
                    saved,
                    lost,
                    error,
                    index,
                    groups,
                };
                return self.checkpoint_done(&id, report, ctx);
            }
            WorkerMessage::RestoreDone {
                id,
                restored,
                lost,
                error,
                kept,
            } => {
                let report = RestoreReport {
                    restored,
                    kept,
                    lost,
                    error,
                };
                return self.restore_done(&id, report);
            }
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
            WorkerMessage::CompleteDone { id, matches } => {
                return self.complete_done(&id, matches);
            }
            WorkerMessage::Forked {
                id,
                clones,
                threads,
                error,
            } => {
                let report = super::forking::ForkReport {
                    clones,
                    threads,
                    error,
                };
                return self.forked(&id, report);
            }
            WorkerMessage::Speculated { id, index, outcome } => {
                return self.speculated(&id, index, *outcome, ctx);
            }
            WorkerMessage::Facts { id, facts } => {
                return self.facts_arrived(&id, facts, ctx);
            }
            WorkerMessage::SpeculationDone { id, ending, cpu_ms } => {
                return self.speculation_done(&id, &ending, cpu_ms, ctx);
            }
            WorkerMessage::LlmCall {
                id,
                call,
                kind,
                prompts,
                model,
                context,
            } => {
                let frame = super::llm_calls::CallFrame {
                    execution_id: id,
                    call,
                    kind,
                    prompts,
                    model,
                    context,
                };
                return self.llm_call(frame, ctx);
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
                rolled_back,
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
                if changed {
                    self.durability.ledger.changed();
                }
                if let Some(proactive) = &mut self.proactive {
                    proactive.await_facts(id, rolled_back);
                }
                if changed && self.checkpoints_before_reply() {
                    return self.finish_after_checkpoint(status, result, error, ctx);
                }
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
                        .send(Progress::Event(ExecutionEvent::InputRequest {
                            prompt,
                            password,
                        }));
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
            WorkerMessage::AdoptDone { id, fresh, .. } if id == execution_id => {
                self.adopt_done(fresh, ctx);
            }
            WorkerMessage::Display { id, mime, data } if id == execution_id => {
                running.push_display(DisplayData { mime, data });
            }
            other => self.kill_worker(format!("unexpected message: {other:?}")),
        }
    }

    fn on_output(&mut self, stream: OutputStream, bytes: &[u8]) {
        if let State::Busy(running) = &mut self.state {
            running.push_output(stream, bytes);
        }
    }

    /// The worker is gone: end the running execution, then stop, so that supervision
    /// restarts the actor with a new worker (or finish closing).
    fn on_exit(&mut self, status: Option<ExitStatus>, ctx: &mut Context<Self>) {
        // Whether the worker died without having read the running execution: then the code
        // never ran, and goes to the next worker.
        let unread = match (&self.state, &self.worker) {
            (State::Busy(running), Some(worker)) => {
                running.sent.is_some_and(|sent| worker.writer.unread(sent))
            }
            _ => false,
        };
        let memory_limit_kill = self.worker.take().and_then(|w| memory_limit_kill(&w));
        self.cancel_llm_calls("the worker exited", ctx);
        let cause = match (memory_limit_kill, self.kill_reason.take()) {
            // The memory limit killed it, and the host, if it killed it too, for that reason.
            (Some(oom), reason)
                if killed_or_unknown(status) && reason.as_ref().is_none_or(|r| *r == oom) =>
            {
                format!("the worker was {oom}")
            }
            (_, reason) => describe_exit(status, reason),
        };
        tracing::info!(session = %self.session_id, %cause, "worker exited");
        if let State::Closing = self.state {
            self.forget_worker_requests(false);
            return self.finish_close();
        }
        self.setup.counters.worker_crashed();
        self.forget_answers();
        self.speculation_lost();
        self.facts_arrived("", None, ctx);
        self.events.publish(SessionEvent::Restored {
            session_id: self.session_id.as_str().into(),
        });
        if matches!(&self.state, State::Busy(running) if unread && running.interrupt.is_none()) {
            if let State::Busy(running) = std::mem::replace(&mut self.state, State::Restarting) {
                ctx.cancel_future(running.timer);
                self.queue.push_front(running.into_queued());
            }
        }
        let recovered = self.forget_worker_requests(true);
        let comeback = match recovered
            .as_ref()
            .and_then(|r| r.checkpoint_id.as_ref().zip(Some(r)))
        {
            Some((checkpoint, r)) => format!(
                "the session restarts from checkpoint {checkpoint} ({} execution(s) lost)",
                r.lost_executions
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
            self.durability.crash_cause = Some(cause);
            self.durability.recovered = recovered;
        }
        self.restarts += 1;
        self.state = State::Restarting;
        ctx.stop();
    }
}

/// "killed by the memory limit (512 MB)" when the kernel has killed a process of the worker's
/// cgroup leaf for want of memory.
fn memory_limit_kill(worker: &Worker) -> Option<String> {
    let leaf = worker.cgroup()?;
    if leaf.oom_kills() == 0 {
        return None;
    }
    Some(match leaf.memory_limit() {
        Some(bytes) if bytes % (1 << 20) == 0 => {
            format!("killed by the memory limit ({} MB)", bytes >> 20)
        }
        Some(bytes) => format!("killed by the memory limit ({bytes} bytes)"),
        None => "killed by the kernel for want of memory".to_owned(),
    })
}

/// Whether the worker died of SIGKILL (what the OOM killer sends) or of an unknown cause.
fn killed_or_unknown(status: Option<ExitStatus>) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.is_none_or(|status| status.signal() == Some(libc::SIGKILL))
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
            // The memory limit closes the worker's pipes by killing it: no protocol error.
            WorkerEvent::ProtocolError(reason) => {
                match self.worker.as_ref().and_then(memory_limit_kill) {
                    Some(oom) => self.kill_worker(oom),
                    None => {
                        tracing::warn!(session = %self.session_id, %reason, "protocol error");
                        self.kill_worker(format!("protocol error: {reason}"));
                    }
                }
            }
            WorkerEvent::Exited(status) => self.on_exit(status, ctx),
        }
        self.publish_phase();
    }

    /// A worker's event stream ends after its exit; the session lives on.
    fn finished(&mut self, _: &mut Context<Self>) {}
}
