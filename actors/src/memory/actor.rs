//! The MemoryActor: follows every session's event stream for what the memory learns after a
//! result is out (the names the cell read, which the worker reports after the result) and for
//! sessions that close (their policy state goes). Outcomes themselves are recorded by the
//! session as its execution ends, so that the next execution's check already knows them.

use std::sync::Arc;

use actix::prelude::*;

use super::Memory;
use crate::session::SessionEvent;

/// Subscribes to sessions on behalf of a [`Memory`].
pub struct MemoryActor {
    memory: Arc<Memory>,
}

impl MemoryActor {
    pub fn new(memory: Arc<Memory>) -> Self {
        Self { memory }
    }
}

impl Actor for MemoryActor {
    type Context = Context<Self>;
}

impl MemoryActor {
    /// The events the memory follows: executions whose facts came (their names read), and
    /// closings.
    pub fn interest(event: &SessionEvent) -> bool {
        match event {
            SessionEvent::Executed(executed) => executed.facts.is_some(),
            SessionEvent::Closed { .. } => true,
            _ => false,
        }
    }
}

impl Handler<SessionEvent> for MemoryActor {
    type Result = ();

    fn handle(&mut self, event: SessionEvent, _: &mut Context<Self>) {
        match event {
            SessionEvent::Executed(executed) => {
                if let Some(facts) = &executed.facts {
                    self.memory.attach_reads(
                        &executed.session_id,
                        &executed.execution_id,
                        &facts.reads,
                    );
                }
            }
            SessionEvent::Closed { session_id } => self.memory.forget_session(&session_id),
            _ => {}
        }
    }
}
