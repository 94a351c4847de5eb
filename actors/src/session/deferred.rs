//! Checkpoints and restores asked for while the session has no worker ready (a new session
//! whose worker is on its way, a worker being replaced after a crash, a namespace being
//! restored): they wait for the worker, as executions do, instead of failing with "the session
//! is restarting". They run, in the order asked, as soon as the worker can take them.

use actix::prelude::*;
use tokio::sync::oneshot;

use super::state::{CheckpointReply, RestoreReply};
use super::{SessionActor, State};
use crate::checkpoint::CheckpointId;
use crate::errors::SessionError;

/// A request waiting for the worker.
pub(super) enum Deferred {
    Checkpoint(CheckpointReply),
    Restore {
        id: Option<CheckpointId>,
        reply: RestoreReply,
    },
}

impl SessionActor {
    /// Whether the worker can take a checkpoint or restore request now. Otherwise one is
    /// on its way (or the session is closing, when waiting ends with `Closed`).
    pub(super) fn worker_ready(&self) -> bool {
        self.worker.is_some() && matches!(self.state, State::Idle | State::Busy(_))
    }

    /// Whether a request made now should wait for the worker rather than fail.
    pub(super) fn worker_coming(&self) -> bool {
        matches!(self.state, State::Restarting | State::Restoring)
    }

    /// Sends the requests that waited for the worker, once it is ready.
    pub(super) fn run_deferred(&mut self, ctx: &mut Context<Self>) {
        if self.deferred.is_empty() || !self.worker_ready() {
            return;
        }
        for request in std::mem::take(&mut self.deferred) {
            match request {
                Deferred::Checkpoint(reply) => {
                    let (written, outcome) = oneshot::channel();
                    match self.start_checkpoint(Some(written), ctx) {
                        Ok(()) => forward(outcome, reply),
                        Err(err) => {
                            let _ = reply.send(Err(err));
                        }
                    }
                }
                Deferred::Restore { id, reply } => self.start_restore(id, Some(reply), false, ctx),
            }
        }
    }

    /// Ends the requests that waited for a worker that will not come.
    pub(super) fn fail_deferred(&mut self, reason: &str) {
        let no_worker = || SessionError::NoWorker {
            session_id: self.session_id.clone(),
            reason: reason.to_owned(),
        };
        for request in std::mem::take(&mut self.deferred) {
            // A caller that stopped waiting has nobody to tell.
            match request {
                Deferred::Checkpoint(reply) => drop(reply.send(Err(no_worker()))),
                Deferred::Restore { reply, .. } => drop(reply.send(Err(no_worker()))),
            }
        }
    }
}

/// Hands what `outcome` receives to `reply` (a dropped sender drops `reply` too, which its
/// receiver reads as the session closing).
fn forward<T: Send + 'static>(outcome: oneshot::Receiver<T>, reply: oneshot::Sender<T>) {
    actix::spawn(async move {
        if let Ok(outcome) = outcome.await {
            let _ = reply.send(outcome);
        }
    });
}
