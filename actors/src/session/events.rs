//! The events a session publishes: what its executions did, when it is idle, what its
//! speculations cost, and when its state was replaced or it closed.
//!
//! Any actor may subscribe, saying which events it takes (the registry only `Closed`, the
//! memory the executions that carry facts and `Closed`, the predictor all of them) and when:
//! at once, or once the session is quiet ([`Delivery`]). A session tells every subscriber the
//! events it takes, in order, and never waits for them. The predictor has no use for the
//! events of a session that runs cells back to back, only for where it stands once it pauses:
//! holding its events until then spares it (and the engine thread it runs on) a wake-up for
//! every execution. No subscriber reaches into a session's state: what it needs is in the
//! event, and what it asks of the session it asks by message ([`super::Speculate`]).

use std::sync::Arc;
use std::time::Instant;

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
    /// The session has nothing to run, and has had nothing since `since`; `addr` takes a
    /// [`super::Speculate`]. `computed` holds the normal forms of the answers it stored
    /// that still hold: computing them again would be wasted.
    Idle {
        session_id: Arc<str>,
        addr: Addr<SessionActor>,
        since: Instant,
        computed: Vec<String>,
    },
    /// A speculative snippet ran (servable or not).
    Speculated(Arc<Speculated>),
    /// A speculation's child is gone, having used `cpu_ms` of CPU; `finished` when it ended
    /// on its own (not killed: cancelled, out of CPU, crashed). `unrun` holds the normal forms
    /// of the snippets it did not come to (it died first, or a snippet left it unfit for
    /// them): they may be planned again. `cut_off` is the snippet it was running when it ran
    /// out of CPU, which needs more than it had.
    SpeculationEnded {
        session_id: Arc<str>,
        cpu_ms: f64,
        finished: bool,
        unrun: Vec<String>,
        cut_off: Option<String>,
    },
    /// The caller expects the session to run `code` soon (`session.hint`), replacing what it
    /// announced before. It comes in order with the executions: one that ran before the hint
    /// was given does not use it up.
    Hinted {
        session_id: Arc<str>,
        code: Vec<String>,
    },
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

/// When a subscriber gets the events it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// As they happen.
    AtOnce,
    /// While the session runs cells, held (in order) until it is quiet again.
    WhenQuiet,
}

/// One subscriber, and the events it takes.
#[derive(Debug, Clone)]
pub struct Subscription {
    recipient: Recipient<SessionEvent>,
    interest: Interest,
    delivery: Delivery,
}

impl Subscription {
    /// `recipient` gets the events `interest` takes, and no other, as `delivery` says: a
    /// subscriber that wants a few kinds is not woken for every execution.
    pub fn new(recipient: Recipient<SessionEvent>, interest: Interest, delivery: Delivery) -> Self {
        Self {
            recipient,
            interest,
            delivery,
        }
    }
}

/// The subscribers of one session, and the events held for those that take them when the
/// session is quiet.
#[derive(Debug, Clone, Default)]
pub struct Subscribers {
    subscriptions: Vec<Subscription>,
    /// Events held, in order, with the index of their subscriber.
    held: Vec<(usize, SessionEvent)>,
    /// Whether the session is quiet (held events go out at once).
    quiet: bool,
    /// Counts the times the session got busy, so that a quiet timer armed before knows it is
    /// out of date.
    busy_spells: u64,
}

impl Subscribers {
    /// Subscribers that each get the events of the session they take. A new session is quiet.
    pub fn new(subscriptions: Vec<Subscription>) -> Self {
        Self {
            subscriptions,
            held: Vec::new(),
            quiet: true,
            busy_spells: 0,
        }
    }

    /// Tells `event` to every subscriber that takes it, now or once the session is quiet.
    pub fn publish(&mut self, event: SessionEvent) {
        for (index, subscription) in self.subscriptions.iter().enumerate() {
            if !(subscription.interest)(&event) {
                continue;
            }
            if self.quiet || subscription.delivery == Delivery::AtOnce {
                subscription.recipient.do_send(event.clone());
            } else {
                self.held.push((index, event.clone()));
            }
        }
    }

    /// The session runs code: from now on events are held for the subscribers that take them
    /// when it is quiet, and quiet timers armed before are out of date.
    pub fn busy(&mut self) {
        self.quiet = false;
        self.busy_spells += 1;
    }

    /// The mark of the session's last busy spell, for [`Self::quiet`].
    pub fn mark(&self) -> u64 {
        self.busy_spells
    }

    /// The session has been quiet since the busy spell `mark` ended (or closes, with
    /// `None`): the held events go out in order, and later ones at once. A mark that a later
    /// spell replaced does nothing.
    pub fn quiet(&mut self, mark: Option<u64>) {
        if mark.is_some_and(|mark| mark != self.busy_spells) {
            return;
        }
        self.quiet = true;
        for (index, event) in self.held.drain(..) {
            self.subscriptions[index].recipient.do_send(event);
        }
    }

    /// Whether anyone listens.
    pub fn is_empty(&self) -> bool {
        self.subscriptions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the kinds of the events it gets, in order.
    #[derive(Default)]
    struct Recorder(Vec<&'static str>);

    impl Actor for Recorder {
        type Context = Context<Self>;
    }

    impl Handler<SessionEvent> for Recorder {
        type Result = ();

        fn handle(&mut self, event: SessionEvent, _: &mut Context<Self>) {
            self.0.push(match event {
                SessionEvent::Restored { .. } => "restored",
                SessionEvent::Closed { .. } => "closed",
                _ => "other",
            });
        }
    }

    /// What a recorder got so far: a mailbox is served in order, so every event sent to it
    /// before this message has been handled when it is answered.
    #[derive(Message)]
    #[rtype(result = "Vec<&'static str>")]
    struct Seen;

    impl Handler<Seen> for Recorder {
        type Result = Vec<&'static str>;

        fn handle(&mut self, _: Seen, _: &mut Context<Self>) -> Self::Result {
            self.0.clone()
        }
    }

    fn restored() -> SessionEvent {
        SessionEvent::Restored {
            session_id: "s".into(),
        }
    }

    fn closed() -> SessionEvent {
        SessionEvent::Closed {
            session_id: "s".into(),
        }
    }

    #[actix::test]
    async fn events_wait_for_quiet_subscribers_until_the_session_is_quiet_and_keep_their_order() {
        let now = Recorder::default().start();
        let later = Recorder::default().start();
        let mut subscribers = Subscribers::new(vec![
            Subscription::new(now.clone().recipient(), every_event, Delivery::AtOnce),
            Subscription::new(later.clone().recipient(), every_event, Delivery::WhenQuiet),
        ]);
        subscribers.busy();
        let stale = subscribers.mark();
        subscribers.publish(restored());
        subscribers.busy();
        subscribers.publish(closed());
        assert_eq!(now.send(Seen).await.unwrap(), ["restored", "closed"]);
        assert!(later.send(Seen).await.unwrap().is_empty());
        // A timer armed before the last busy spell is out of date.
        subscribers.quiet(Some(stale));
        assert!(later.send(Seen).await.unwrap().is_empty());
        subscribers.quiet(Some(subscribers.mark()));
        subscribers.publish(restored());
        assert_eq!(
            later.send(Seen).await.unwrap(),
            ["restored", "closed", "restored"]
        );
    }

    #[actix::test]
    async fn a_subscriber_gets_only_the_events_it_takes() {
        let registry = Recorder::default().start();
        let mut subscribers = Subscribers::new(vec![Subscription::new(
            registry.clone().recipient(),
            closing_only,
            Delivery::AtOnce,
        )]);
        subscribers.publish(restored());
        subscribers.publish(closed());
        assert_eq!(registry.send(Seen).await.unwrap(), ["closed"]);
    }
}
