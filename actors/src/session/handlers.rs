//! The messages a [`SessionActor`] handles: each handler checks the request against the
//! session's state and hands the work to the actor's methods in `executions.rs`
//! and `state.rs` (checkpoints, restores, inspection).

use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::deferred::Deferred;
use super::messages::{
    CheckpointNow, CheckpointSummary, Close, CloseState, Drain, Execute, ExecutionTicket, GetInfo,
    Interrupt, ListCheckpoints, Progress, RestoreCheckpoint, RestoreSummary, SendInput,
    SessionSnapshot,
};
use super::state::INSPECT_TIMEOUT;
use super::{Queued, SessionActor, State};
use crate::checkpoint::CheckpointInfo;
use crate::errors::SessionError;
use crate::running::InterruptCause;
use crate::worker::Worker;
use pyvisor_protocol::HostMessage;

impl Handler<Execute> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: Execute, ctx: &mut Context<Self>) {
        if let Err(err) = self.admit(&msg.request) {
            let _ = msg.events.send(Progress::Refused(err));
            return;
        }
        if let State::Failed = self.state {
            self.replace_worker(ctx);
        }
        self.idleness.touch();
        self.execution_count += 1;
        let ticket = ExecutionTicket {
            execution_id: format!("e-{}", self.execution_count),
            execution_count: self.execution_count,
        };
        let _ = msg.events.send(Progress::Accepted(ticket.clone()));
        self.queue.push_back(Queued {
            ticket,
            request: msg.request,
            events: msg.events,
        });
        self.start_next(ctx);
        self.publish_phase();
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
            cpu_s: (self.worker.as_ref())
                .and_then(Worker::cgroup)
                .and_then(|leaf| leaf.cpu_usage())
                .map(|used| used.as_secs_f64()),
            sandbox: self.worker.as_ref().and_then(|w| w.info.sandbox.clone()),
            limits: self.setup.limits.clone(),
            last_checkpoint: self.durability.ledger.last.map(|last| last.id.to_string()),
            durability: self.durability.ledger.report(),
            proactive: self.proactive.as_ref().map(|p| p.share()),
            speculating: self
                .proactive
                .as_ref()
                .map(|p| p.speculating())
                .unwrap_or_default(),
            ahead: self
                .proactive
                .as_ref()
                .map(|p| p.ahead())
                .unwrap_or_default(),
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
        if self.worker_coming() {
            self.deferred.push(Deferred::Checkpoint(reply));
        } else if let Err(err) = self.start_checkpoint(Some(reply), ctx) {
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
        if self.worker_coming() {
            self.deferred.push(Deferred::Restore {
                id: msg.checkpoint_id,
                reply,
            });
        } else if self.worker.is_none() {
            let err = self.no_worker();
            return Box::pin(async move { Err(err) });
        } else {
            self.start_restore(msg.checkpoint_id, Some(reply), false, ctx);
        }
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
