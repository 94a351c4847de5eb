//! The events a session publishes: what its executions did, when it is idle, what its
//! speculations cost, and when its state was replaced or it closed.
//!
//! Any actor may subscribe, saying which events it takes (the registry only `Closed`, the
//! memory the executions that carry facts and `Closed`, the predictor all of them); a session
//! tells every subscriber the events it takes, in order, and never waits for them. No subscriber reaches into a session's state: what it needs is in the
//! event, and what it asks of the session it asks by message ([`super::Speculate`]).

use std::sync::Arc;

use actix::prelude::*;
use pyvisor_protocol::CellFacts;

use super::SessionActor;
use crate::execution::ExecutionStatus;

/// Something that happened to a session.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub enum SessionEvent {
    /// An execution ended.
    Executed(Arc<Executed>),
    /// The session has nothing to run; `addr` takes a [`super::Speculate`].
    Idle {
        session_id: Arc<str>,
        addr: Addr<SessionActor>,
    },
    /// A speculative snippet ran (servable or not).
    Speculated(Arc<Speculated>),
    /// A speculation's child is gone, having used `cpu_ms` of CPU.
    SpeculationEnded { session_id: Arc<str>, cpu_ms: f64 },
    /// The namespace was replaced wholesale (restore, crash recovery): what was known of it
    /// holds no more.
    Restored { session_id: Arc<str> },
    /// The session is closed for good.
    Closed { session_id: Arc<str> },
}

/// One execution, as the session's subscribers see it.
#[derive(Debug)]
pub struct Executed {
    pub session_id: Arc<str>,
    pub execution_id: String,
    pub code: String,
    pub status: ExecutionStatus,
    /// What the cell did, when the worker reported it (executions run for real with
    /// proactive computation on).
    pub facts: Option<Box<CellFacts>>,
    pub duration_ms: f64,
    /// The prediction source whose speculative answer served it, if one did.
    pub served_by: Option<&'static str>,
}

/// One speculative snippet, as it ran.
#[derive(Debug)]
pub struct Speculated {
    pub session_id: Arc<str>,
    pub code: String,
    pub source: &'static str,
    pub servable: bool,
    pub duration_ms: f64,
    pub cpu_ms: f64,
}

/// Which events of a session a subscriber takes.
pub type Interest = fn(&SessionEvent) -> bool;

/// Every event.
pub fn every_event(_: &SessionEvent) -> bool {
    true
}

/// Only the closing of a session (the registry's interest).
pub fn closing_only(event: &SessionEvent) -> bool {
    matches!(event, SessionEvent::Closed { .. })
}

/// One subscriber, and the events it takes.
#[derive(Debug, Clone)]
pub struct Subscription {
    recipient: Recipient<SessionEvent>,
    interest: Interest,
}

impl Subscription {
    /// `recipient` gets the events `interest` takes, and no other: a subscriber that wants a
    /// few kinds is not woken for every execution.
    pub fn new(recipient: Recipient<SessionEvent>, interest: Interest) -> Self {
        Self {
            recipient,
            interest,
        }
    }
}

/// The subscribers of one session.
#[derive(Debug, Clone, Default)]
pub struct Subscribers(Vec<Subscription>);

impl Subscribers {
    /// Subscribers that each get the events of the session they take.
    pub fn new(subscriptions: Vec<Subscription>) -> Self {
        Self(subscriptions)
    }

    /// Tells `event` to every subscriber that takes it.
    pub fn publish(&self, event: SessionEvent) {
        for subscription in &self.0 {
            if (subscription.interest)(&event) {
                subscription.recipient.do_send(event.clone());
            }
        }
    }

    /// Whether anyone listens.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
