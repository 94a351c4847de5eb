//! Closing a session nobody uses: after `idle_timeout` since its last execution was asked
//! for or ended (looking at it with `info` does not count), the session checkpoints and
//! closes itself, freeing its worker. A named session comes back from that checkpoint on its next attach by name.

use std::time::{Duration, Instant};

use actix::prelude::*;

use super::messages::{Close, CloseState};
use super::{SessionActor, State};

/// Shortest and longest pause between two looks at a session's idleness.
const LOOK_EVERY: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(5));

/// When the session last did something, and whether it has already asked to close.
#[derive(Debug)]
pub(super) struct Idleness {
    last_active: Instant,
    closing: bool,
}

impl Default for Idleness {
    fn default() -> Self {
        Self {
            last_active: Instant::now(),
            closing: false,
        }
    }
}

impl Idleness {
    /// An execution was asked for or ended now.
    pub fn touch(&mut self) {
        self.last_active = Instant::now();
    }
}

impl SessionActor {
    /// Starts looking at the session's idleness, if the engine closes idle sessions.
    pub(super) fn watch_idleness(&mut self, ctx: &mut Context<Self>) {
        let Some(timeout) = self.setup.idle_timeout else {
            return;
        };
        let every = (timeout / 4).clamp(LOOK_EVERY.0, LOOK_EVERY.1);
        ctx.run_interval(every, move |act, ctx| act.close_if_idle(timeout, ctx));
    }

    fn close_if_idle(&mut self, timeout: Duration, ctx: &mut Context<Self>) {
        let idle = matches!(self.state, State::Idle) && self.queue.is_empty();
        if !idle || self.idleness.closing || self.idleness.last_active.elapsed() < timeout {
            return;
        }
        self.idleness.closing = true;
        tracing::info!(session = %self.session_id, ?timeout, "closing an idle session");
        ctx.notify(Close {
            graceful: true,
            state: CloseState::Checkpoint,
        });
    }
}
