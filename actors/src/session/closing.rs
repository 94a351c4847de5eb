//! Closing a session: the queue is refused, a running execution ends `SessionClosed`, the
//! worker gets `shutdown` (or SIGKILL when the close is not graceful, or it does not exit
//! within [`CLOSE_GRACE`]); once it is gone the closers are answered, the checkpoints of an
//! unnamed session are removed and the subscribers hear `Closed`.

use std::time::Duration;

use actix::prelude::*;
use pyvisor_protocol::HostMessage;

use super::{host_error, SessionActor, SessionEvent, State};
use crate::execution::ExecutionStatus;

/// How long a closing worker may take to exit after `shutdown` before it is killed.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

impl SessionActor {
    pub(super) fn begin_close(&mut self, graceful: bool, ctx: &mut Context<Self>) {
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
    pub(super) fn finish_close(&mut self) {
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
        // What was held for quiet times goes out before the end.
        self.events.quiet(None);
        self.events.publish(SessionEvent::Closed {
            session_id: self.session_id.as_str().into(),
        });
    }
}
