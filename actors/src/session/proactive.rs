//! A session's side of proactive computation: what it knows of its namespace (name versions
//! from every real execution's facts), what it publishes to its subscribers, and the answers
//! it stored. How a request is answered from speculation is in `serving`, how the session
//! runs the predictor's snippets in `speculation`.
//!
//! Versions follow every real execution's facts, which the worker sends after the result;
//! until they come, nothing is served from the cache and nothing is speculated on. A restore,
//! a crash or a close drops the session's answers.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use pyvisor_protocol::CellFacts;

use super::events::{Executed, SessionEvent};
use super::speculation::InFlight;
use super::{SessionActor, State};
use crate::proactive::cache::{CacheActor, Discard, ForgetSession};
use crate::proactive::predictor::QUIET;
use crate::proactive::stats::{ProactiveCounters, ProactiveStats};
use crate::proactive::versions::{ReadKey, VersionTable};

/// What the host takes in of a worker's facts (the worker is untrusted): object summaries,
/// columns per summary, and names per list; longer name lists count as "anything may have
/// changed".
const MAX_FACT_OBJECTS: usize = 20;
const MAX_FACT_COLUMNS: usize = 200;
const MAX_FACT_NAMES: usize = 4096;
const MAX_FACT_FILES: usize = 64;
/// Literals of the data (index labels, column values) kept per object or column, and the
/// longest kept, in bytes (the worker sends at most 5 of at most 40 characters).
const MAX_FACT_LITERALS: usize = 5;
const MAX_FACT_LITERAL_BYTES: usize = 160;

/// What a session needs to take part in proactive computation.
#[derive(Clone)]
pub struct ProactiveSetup {
    pub cache: Addr<CacheActor>,
    /// Answers the cache keeps for one session
    /// ([`CacheLimits::per_session`](crate::proactive::cache::CacheLimits::per_session)).
    pub kept: usize,
    pub counters: Arc<ProactiveCounters>,
}

/// A real execution whose facts the worker has yet to send.
pub(super) struct AwaitedFacts {
    execution_id: String,
    rolled_back: bool,
    /// The execution's event, published once its facts are in.
    executed: Option<Executed>,
    /// Code hinted since (`session.hint`), published after the execution's event: the
    /// predictor must not take the execution for a run of the hinted code after the hint.
    hinted: Option<Vec<String>>,
}

/// A session's proactive state.
pub(crate) struct Proactive {
    pub(super) setup: ProactiveSetup,
    pub(super) versions: VersionTable,
    /// Until they come, the versions are behind and nothing is served from the cache.
    pub(super) awaited: Option<AwaitedFacts>,
    /// Real executions so far, restores and crashes included: what changes the namespace.
    pub(super) real_runs: u64,
    /// Normal forms of the answers this session stored, with their keys.
    pub(super) stored: HashMap<String, ReadKey>,
    pub(super) flight: Option<InFlight>,
    pub(super) share: ProactiveStats,
    /// Speculations sent to the worker so far; numbers their ids.
    pub(super) flights_sent: u64,
}

impl Proactive {
    pub fn new(setup: ProactiveSetup) -> Self {
        Self {
            setup,
            versions: VersionTable::default(),
            awaited: None,
            real_runs: 0,
            stored: HashMap::new(),
            flight: None,
            share: ProactiveStats::default(),
            flights_sent: 0,
        }
    }

    /// This session's share of the proactive figures.
    pub fn share(&self) -> ProactiveStats {
        self.share.clone()
    }

    /// The code the speculation in flight has not answered yet.
    pub fn speculating(&self) -> Vec<String> {
        let Some(flight) = &self.flight else {
            return Vec::new();
        };
        flight
            .snippets
            .iter()
            .zip(&flight.answered)
            .filter(|(_, answered)| !**answered)
            .map(|(snippet, _)| snippet.code.clone())
            .collect()
    }

    /// Normal forms of the answers computed ahead that still hold: none while the facts of
    /// the last real execution are awaited, when nothing is served.
    pub fn ahead(&self) -> Vec<String> {
        if self.awaited.is_some() {
            return Vec::new();
        }
        let mut ahead: Vec<String> = self
            .stored
            .iter()
            .filter(|(_, key)| self.versions.holds(key))
            .map(|(normal, _)| normal.clone())
            .collect();
        ahead.sort();
        ahead
    }

    /// The worker will send the facts of real execution `execution_id` after its result.
    pub fn await_facts(&mut self, execution_id: String, rolled_back: bool) {
        self.real_runs += 1;
        self.awaited = Some(AwaitedFacts {
            execution_id,
            rolled_back,
            executed: None,
            hinted: None,
        });
    }

    /// Remembers that the answer to `normal` is stored under `key`.
    pub(super) fn remember(&mut self, normal: String, key: ReadKey) {
        self.stored.insert(normal, key);
    }

    /// Makes room in the cache for up to `wanted` new answers and says for how many there
    /// is: the answers that went stale go, then, as far as needed, those that are not among
    /// the predictions `ranked` now. A speculation sends no more snippets than that: beyond
    /// it the cache would evict the answers stored first, which are the likeliest.
    pub(super) fn make_room(
        &mut self,
        session_id: &str,
        wanted: usize,
        ranked: &HashSet<String>,
    ) -> usize {
        let versions = &self.versions;
        let mut gone: Vec<String> = (self.stored.iter())
            .filter(|(_, key)| !versions.holds(key))
            .map(|(normal, _)| normal.clone())
            .collect();
        let short = (self.stored.len() - gone.len() + wanted).saturating_sub(self.setup.kept);
        let unranked = (self.stored.iter())
            .filter(|(normal, key)| versions.holds(key) && !ranked.contains(*normal))
            .take(short)
            .map(|(normal, _)| normal.clone());
        gone.extend(unranked.collect::<Vec<_>>());
        if !gone.is_empty() {
            for normal in &gone {
                self.stored.remove(normal);
            }
            self.setup.cache.do_send(Discard {
                session_id: session_id.into(),
                normals: gone,
            });
        }
        self.setup.kept.saturating_sub(self.stored.len())
    }
}

impl SessionActor {
    /// Tells the subscribers about an execution that ended, once its facts are in.
    pub(super) fn publish_executed(&mut self, executed: Executed) {
        if let Some(awaited) = self
            .proactive
            .as_mut()
            .and_then(|p| p.awaited.as_mut())
            .filter(|awaited| awaited.execution_id == executed.execution_id)
        {
            awaited.executed = Some(executed);
            return;
        }
        self.events
            .publish(SessionEvent::Executed(Arc::new(executed)));
    }

    /// The facts of execution `id` came (`None`: the worker did not compute them, or the
    /// worker is gone and they never will): the versions catch up and the execution's event
    /// goes out.
    pub(super) fn facts_arrived(
        &mut self,
        id: &str,
        facts: Option<Box<CellFacts>>,
        ctx: &mut Context<Self>,
    ) {
        let Some(proactive) = &mut self.proactive else {
            return;
        };
        let Some(awaited) = proactive.awaited.take() else {
            return;
        };
        if awaited.execution_id != id && !id.is_empty() {
            proactive.awaited = Some(awaited);
            return;
        }
        let facts = facts.and_then(bounded);
        proactive
            .versions
            .observe(facts.as_deref(), awaited.rolled_back);
        let versions = &proactive.versions;
        proactive.stored.retain(|_, key| versions.holds(key));
        if let Some(mut executed) = awaited.executed {
            executed.facts = facts;
            self.events
                .publish(SessionEvent::Executed(Arc::new(executed)));
        }
        if let Some(code) = awaited.hinted {
            self.publish_hint(code);
        }
        self.publish_idle(ctx);
    }

    /// Tells the subscribers that the caller expects `code` to run soon, after the event of
    /// the execution whose facts are awaited, if any.
    pub(super) fn publish_hint(&mut self, code: Vec<String>) {
        let Some(proactive) = &mut self.proactive else {
            return;
        };
        if let Some(awaited) = &mut proactive.awaited {
            awaited.hinted = Some(code);
            return;
        }
        self.events.publish(SessionEvent::Hinted {
            session_id: self.session_id.as_str().into(),
            code,
        });
    }

    /// The namespace was replaced (restore, crash) or the session closes: nothing cached
    /// for it holds. A speculation in flight runs on (its child is being killed) until its
    /// end is reported, but serves nothing.
    pub(super) fn forget_answers(&mut self) {
        let Some(proactive) = &mut self.proactive else {
            return;
        };
        proactive.versions.new_epoch();
        proactive.real_runs += 1;
        proactive.stored.clear();
        if let Some(flight) = &mut proactive.flight {
            flight.stale = true;
        }
        proactive.setup.cache.do_send(ForgetSession {
            session_id: self.session_id.as_str().into(),
        });
    }

    /// Tells the subscribers that the session has nothing to run, if so; those that take
    /// events when the session is quiet get them (this one with those held before) once
    /// nothing else has run for [`QUIET`].
    pub(super) fn publish_idle(&mut self, ctx: &mut Context<Self>) {
        let idle = matches!(self.state, State::Idle) && self.queue.is_empty();
        let Some(proactive) = self.proactive.as_ref() else {
            return;
        };
        let quiet = proactive.flight.is_none() && proactive.awaited.is_none();
        if idle && quiet && self.draining.is_none() {
            self.events.publish(SessionEvent::Idle {
                session_id: self.session_id.as_str().into(),
                addr: ctx.address(),
                since: Instant::now(),
                computed: proactive.ahead(),
            });
            let mark = self.events.mark();
            ctx.run_later(QUIET, move |act, _| act.events.quiet(Some(mark)));
        }
    }
}

/// `facts` cut to what the host takes in from an untrusted worker; `None` (anything may have
/// changed) when its name lists are longer than any real cell's.
fn bounded(mut facts: Box<CellFacts>) -> Option<Box<CellFacts>> {
    let too_long = |names: &Vec<String>| names.len() > MAX_FACT_NAMES;
    if too_long(&facts.reads)
        || too_long(&facts.binds)
        || facts.touched.as_ref().is_some_and(too_long)
    {
        return None;
    }
    facts.objects.truncate(MAX_FACT_OBJECTS);
    for object in &mut facts.objects {
        object.columns.truncate(MAX_FACT_COLUMNS);
        bound_literals(&mut object.labels);
        for column in &mut object.columns {
            bound_literals(&mut column.values);
        }
    }
    facts.files.truncate(MAX_FACT_FILES);
    Some(facts)
}

/// `literals` without the overlong ones, at most [`MAX_FACT_LITERALS`].
fn bound_literals(literals: &mut Vec<String>) {
    literals.retain(|l| l.len() <= MAX_FACT_LITERAL_BYTES);
    literals.truncate(MAX_FACT_LITERALS);
}

#[cfg(test)]
mod tests {
    use pyvisor_protocol::messages::{ColumnSummary, ObjectSummary};

    use super::*;

    #[test]
    fn the_literals_a_worker_sends_are_cut_to_their_bounds() {
        let many: Vec<String> = (0..50).map(|i| format!("v{i}")).collect();
        let mut literals = many.clone();
        literals.insert(1, "x".repeat(MAX_FACT_LITERAL_BYTES + 1));
        let facts = CellFacts {
            objects: vec![ObjectSummary {
                name: "df".into(),
                labels: literals.clone(),
                columns: vec![ColumnSummary {
                    name: "a".into(),
                    values: literals,
                    ..ColumnSummary::default()
                }],
                ..ObjectSummary::default()
            }],
            ..CellFacts::default()
        };
        let kept = bounded(Box::new(facts)).expect("name lists are short");
        let object = &kept.objects[0];
        assert_eq!(object.labels, many[..MAX_FACT_LITERALS]);
        assert_eq!(object.columns[0].values, many[..MAX_FACT_LITERALS]);
    }
}
