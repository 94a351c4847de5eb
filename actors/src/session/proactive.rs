//! A session's side of proactive computation: running the predictor's snippets in a fork of
//! its worker while it is idle, and answering a request from their results when, and only
//! when, a real run would have answered the same.
//!
//! An execution request takes one of three paths ([`ServePath`]). If the speculation in
//! flight is computing the same code (same normal form), the request joins it and is answered
//! when the child is done. If the cache holds an answer whose key still holds (no name it
//! read has changed since, same ambient token: [`VersionTable`]), the session takes it from
//! the [`CacheActor`]. Either way the worker then checks the content of what the answer read
//! (`adopt`) and counts the execution; a stale answer, or any doubt, runs the code for real,
//! which also kills the speculative child. Versions follow every real execution's facts; a
//! restore, a crash or a close drops the session's answers.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use pyvisor_protocol::{CellFacts, HostMessage, SpeculativeOutcome, WorkerStatus};

use super::events::{Executed, SessionEvent, Speculated};
use super::{host_error, SessionActor, State};
use crate::execution::{DisplayData, ExecutionEvent, ExecutionStatus, OutputStream};
use crate::proactive::cache::{CacheActor, CacheEntry, ForgetSession, Store, Take};
use crate::proactive::predict::normalise;
use crate::proactive::stats::{ProactiveCounters, ProactiveStats};
use crate::proactive::versions::{ReadKey, Snapshot, VersionTable};

/// Answers a session remembers having stored, to tell a likely hit without asking the cache.
const REMEMBERED_ANSWERS: usize = 64;
/// What the host takes in of a worker's facts (the worker is untrusted): object summaries,
/// columns per summary, and names per list; longer name lists count as "anything may have
/// changed".
const MAX_FACT_OBJECTS: usize = 20;
const MAX_FACT_COLUMNS: usize = 200;
const MAX_FACT_NAMES: usize = 4096;
const MAX_FACT_FILES: usize = 64;

/// What a session needs to take part in proactive computation.
#[derive(Clone)]
pub struct ProactiveSetup {
    pub cache: Addr<CacheActor>,
    pub counters: Arc<ProactiveCounters>,
}

/// Run predicted snippets in a fork of the session's worker, in order, while it is idle;
/// replies whether the session took them (not when busy, or already speculating).
#[derive(Message)]
#[rtype(result = "bool")]
pub struct Speculate {
    pub snippets: Vec<PlannedSnippet>,
    /// CPU milliseconds the child may use before the worker kills it.
    pub cpu_ms: u64,
}

/// One snippet of a [`Speculate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedSnippet {
    pub code: String,
    /// Its normal form ([`normalise`]), the key a request is matched on.
    pub normal: String,
    /// The prediction source that proposed it.
    pub source: &'static str,
}

/// How the running execution gets its answer.
#[derive(Debug, Default)]
pub(crate) enum ServePath {
    /// The worker runs it.
    #[default]
    Real,
    /// It waits for snippet `index` of the speculation in flight.
    Joining { index: usize },
    /// The session asked the cache for the answer.
    Taking,
    /// The worker checks that `entry` is still what a run would answer.
    Adopting {
        entry: Arc<CacheEntry>,
        joined: bool,
    },
}

/// The speculation a session's worker is running.
struct InFlight {
    id: String,
    snapshot: Snapshot,
    /// The session's count of real executions when it was sent.
    forked_at: u64,
    snippets: Vec<PlannedSnippet>,
    /// Servable answers, by snippet; `answered` says which snippets are done at all.
    ready: Vec<Option<Arc<CacheEntry>>>,
    answered: Vec<bool>,
    /// Names the snippets done so far bound (later ones build on them).
    bound: Vec<String>,
    /// The namespace was replaced since it started: nothing it computes may serve.
    stale: bool,
}

/// A real execution whose facts the worker has yet to send.
struct AwaitedFacts {
    execution_id: String,
    rolled_back: bool,
    /// The execution's event, published once its facts are in.
    executed: Option<Executed>,
}

/// A session's proactive state.
pub(crate) struct Proactive {
    setup: ProactiveSetup,
    versions: VersionTable,
    /// Until they come, the versions are behind and nothing is served from the cache.
    awaited: Option<AwaitedFacts>,
    /// Real executions so far, restores and crashes included: what changes the namespace.
    real_runs: u64,
    /// Normal forms of the answers this session stored, with their keys.
    stored: HashMap<String, ReadKey>,
    flight: Option<InFlight>,
    share: ProactiveStats,
    speculations: u64,
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
            speculations: 0,
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

    /// Normal forms of the answers computed ahead that still hold.
    pub fn ahead(&self) -> Vec<String> {
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
        });
    }

    /// Remembers that the answer to `normal` is stored under `key`.
    fn remember(&mut self, normal: String, key: ReadKey) {
        if self.stored.len() >= REMEMBERED_ANSWERS {
            let versions = &self.versions;
            self.stored.retain(|_, key| versions.holds(key));
        }
        if self.stored.len() >= REMEMBERED_ANSWERS {
            // Forgetting one only costs a request a round trip to the cache for nothing.
            if let Some(any) = self.stored.keys().next().cloned() {
                self.stored.remove(&any);
            }
        }
        self.stored.insert(normal, key);
    }
}

impl SessionActor {
    /// How the execution of `code` will be answered.
    pub(super) fn serve_path(&mut self, code: &str, cache: bool) -> ServePath {
        let Some(proactive) = self.proactive.as_mut().filter(|_| cache) else {
            return ServePath::Real;
        };
        let Some(normal) = normalise(code).filter(|_| proactive.awaited.is_none()) else {
            return ServePath::Real;
        };
        if let Some(flight) = proactive.flight.as_ref().filter(|f| !f.stale) {
            if let Some(index) = flight.snippets.iter().position(|s| s.normal == normal) {
                match &flight.ready[index] {
                    Some(entry) if proactive.versions.holds(&entry.key) => {
                        return ServePath::Adopting {
                            entry: entry.clone(),
                            joined: false,
                        }
                    }
                    None if !flight.answered[index] => return ServePath::Joining { index },
                    _ => {}
                }
            }
        }
        match proactive.stored.get(&normal) {
            Some(key) if proactive.versions.holds(key) => ServePath::Taking,
            _ => ServePath::Real,
        }
    }

    /// Starts answering the running execution along `path`.
    pub(super) fn serve(&mut self, path: ServePath, ctx: &mut Context<Self>) {
        match path {
            ServePath::Real => self.run_for_real(ctx),
            ServePath::Joining { index } => self.set_path(ServePath::Joining { index }),
            ServePath::Taking => self.take_cached(ctx),
            ServePath::Adopting { entry, joined } => self.offer_cached(entry, joined, ctx),
        }
    }

    fn set_path(&mut self, path: ServePath) {
        if let State::Busy(running) = &mut self.state {
            running.path = path;
        }
    }

    /// Sends the running execution to the worker (which kills any speculative child).
    pub(super) fn run_for_real(&mut self, ctx: &mut Context<Self>) {
        let State::Busy(running) = &mut self.state else {
            return;
        };
        running.path = ServePath::Real;
        let frame = HostMessage::Execute {
            id: running.ticket.execution_id.clone(),
            code: running.request.code.clone(),
            repr_limit: self.setup.limits.result_repr_bytes,
            transaction: running.request.transaction,
            facts: self.proactive.is_some(),
        };
        if let Some(proactive) = &mut self.proactive {
            if running.request.cache {
                proactive.setup.counters.missed();
                proactive.share.missed();
            }
        }
        let sent = match &self.worker {
            Some(worker) => worker.writer.send(&frame).map_err(|err| err.to_string()),
            None => Err("the session has no worker".to_owned()),
        };
        if let Err(reason) = sent {
            let error = host_error("NotExecuted", reason);
            self.finish(ExecutionStatus::Crashed, None, Some(error), ctx);
        }
    }

    fn take_cached(&mut self, ctx: &mut Context<Self>) {
        let (Some(proactive), State::Busy(running)) = (&self.proactive, &mut self.state) else {
            return self.run_for_real(ctx);
        };
        running.path = ServePath::Taking;
        let Some(normal) = normalise(&running.request.code) else {
            return self.run_for_real(ctx);
        };
        let execution_id = running.ticket.execution_id.clone();
        let take = proactive.setup.cache.send(Take {
            session_id: self.session_id.as_str().into(),
            normal,
        });
        ctx.spawn(take.into_actor(self).map(move |taken, act, ctx| {
            let State::Busy(running) = &act.state else {
                return;
            };
            if running.ticket.execution_id != execution_id
                || !matches!(running.path, ServePath::Taking)
            {
                return;
            }
            let holds = |entry: &CacheEntry| {
                act.proactive
                    .as_ref()
                    .is_some_and(|p| p.versions.holds(&entry.key))
            };
            match taken.ok().flatten() {
                Some(entry) if holds(&entry) => act.offer_cached(entry, false, ctx),
                _ => act.run_for_real(ctx),
            }
        }));
    }

    /// Asks the worker whether `entry` is still what the running execution would answer;
    /// when nothing ran since its speculation forked and it read no file, the namespace is
    /// exactly what it read, and the worker is only told to count it.
    fn offer_cached(&mut self, entry: Arc<CacheEntry>, joined: bool, ctx: &mut Context<Self>) {
        let State::Busy(running) = &mut self.state else {
            return;
        };
        let unchanged = self
            .proactive
            .as_ref()
            .is_some_and(|p| p.real_runs == entry.forked_at && entry.outcome.files.is_empty());
        if unchanged {
            let counted = HostMessage::Counted {
                code: running.request.code.clone(),
            };
            running.path = ServePath::Adopting { entry, joined };
            let sent = self.worker.as_ref().map(|w| w.writer.send(&counted));
            if matches!(sent, Some(Ok(()))) {
                return self.adopt_done(true, ctx);
            }
            return self.run_for_real(ctx);
        }
        let frame = HostMessage::Adopt {
            id: running.ticket.execution_id.clone(),
            code: running.request.code.clone(),
            reads: entry.outcome.reads.clone(),
            files: entry.outcome.files.clone(),
            ambient: entry.outcome.ambient.clone(),
        };
        running.path = ServePath::Adopting { entry, joined };
        let sent = self.worker.as_ref().map(|w| w.writer.send(&frame));
        if !matches!(sent, Some(Ok(()))) {
            self.run_for_real(ctx);
        }
    }

    /// The worker's answer to an `adopt` of the running execution.
    pub(super) fn adopt_done(&mut self, fresh: bool, ctx: &mut Context<Self>) {
        let State::Busy(running) = &mut self.state else {
            return;
        };
        let path = std::mem::take(&mut running.path);
        let ServePath::Adopting { entry, joined } = path else {
            running.path = path;
            return;
        };
        if !fresh {
            if let (Some(proactive), Some(normal)) =
                (&mut self.proactive, normalise(&running.request.code))
            {
                proactive.stored.remove(&normal);
                proactive.setup.counters.discarded(1);
                proactive.share.discarded += 1;
            }
            return self.run_for_real(ctx);
        }
        let outcome = &entry.outcome;
        running.served_by = Some(entry.source);
        running.push_output(OutputStream::Stdout, outcome.stdout.as_bytes());
        running.push_output(OutputStream::Stderr, outcome.stderr.as_bytes());
        for item in &outcome.display {
            let display = DisplayData {
                mime: item.mime.clone(),
                data: item.data.clone(),
            };
            let _ = running
                .events
                .send(Ok(ExecutionEvent::Display(display.clone())));
            running.display.push(display);
        }
        if let Some(proactive) = &mut self.proactive {
            proactive.setup.counters.hit(entry.source, joined);
            proactive.share.served(entry.source, joined);
        }
        self.finish(ExecutionStatus::Ok, outcome.result.clone(), None, ctx);
    }

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
        self.publish_idle(ctx);
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

    /// The worker died with a speculation in flight: its child died with it, and no end
    /// will be reported.
    pub(super) fn speculation_lost(&mut self) {
        let Some(proactive) = &mut self.proactive else {
            return;
        };
        if proactive.flight.take().is_some() {
            self.events.publish(SessionEvent::SpeculationEnded {
                session_id: self.session_id.as_str().into(),
                cpu_ms: 0.0,
            });
        }
    }

    /// Tells the subscribers that the session has nothing to run, if so.
    pub(super) fn publish_idle(&self, ctx: &mut Context<Self>) {
        let idle = matches!(self.state, State::Idle) && self.queue.is_empty();
        let quiet = self
            .proactive
            .as_ref()
            .is_some_and(|p| p.flight.is_none() && p.awaited.is_none());
        if idle && quiet && self.draining.is_none() {
            self.events.publish(SessionEvent::Idle {
                session_id: self.session_id.as_str().into(),
                addr: ctx.address(),
            });
        }
    }

    /// Snippet `index` of speculation `id` is done.
    pub(super) fn speculated(
        &mut self,
        id: &str,
        index: usize,
        outcome: SpeculativeOutcome,
        ctx: &mut Context<Self>,
    ) {
        let Some(proactive) = &mut self.proactive else {
            return;
        };
        let Some(mut flight) = proactive.flight.take_if(|f| f.id == id) else {
            return;
        };
        let Some(planned) = flight.snippets.get(index).cloned() else {
            proactive.flight = Some(flight);
            return;
        };
        flight.answered[index] = true;
        proactive
            .setup
            .counters
            .speculated(outcome.duration_ms / 1000.0);
        proactive.share.speculations += 1;
        self.events
            .publish(SessionEvent::Speculated(Arc::new(Speculated {
                session_id: self.session_id.as_str().into(),
                code: planned.code.clone(),
                source: planned.source,
                servable: outcome.servable,
                duration_ms: outcome.duration_ms,
                cpu_ms: outcome.cpu_ms,
            })));
        let binds = outcome.binds.clone();
        if outcome.servable && outcome.status == WorkerStatus::Ok {
            let key = flight.snapshot.key(
                outcome.reads.iter().map(|read| read.name.as_str()),
                &flight.bound,
                &outcome.ambient,
            );
            let entry = Arc::new(CacheEntry {
                outcome,
                key: key.clone(),
                source: planned.source,
                forked_at: flight.forked_at,
            });
            flight.ready[index] = Some(entry.clone());
            proactive.remember(planned.normal.clone(), key);
            proactive.setup.cache.do_send(Store {
                session_id: self.session_id.as_str().into(),
                normal: planned.normal,
                entry,
            });
        }
        flight.bound.extend(binds);
        let ready = flight.ready[index]
            .clone()
            .filter(|entry| !flight.stale && proactive.versions.holds(&entry.key));
        proactive.flight = Some(flight);
        let joined_here = matches!(
            &self.state,
            State::Busy(running) if matches!(running.path, ServePath::Joining { index: i } if i == index)
        );
        if joined_here {
            match ready {
                Some(entry) => self.offer_cached(entry, true, ctx),
                None => self.run_for_real(ctx),
            }
        }
    }

    /// Speculation `id` is over: its child is gone (`ending` says how).
    pub(super) fn speculation_done(
        &mut self,
        id: &str,
        ending: &str,
        cpu_ms: f64,
        ctx: &mut Context<Self>,
    ) {
        let Some(proactive) = &mut self.proactive else {
            return;
        };
        let Some(flight) = proactive.flight.take_if(|f| f.id == id) else {
            return;
        };
        if ending != "finished" && ending != "cancelled" && flight.answered.contains(&false) {
            // The snippet that crashed the child, or ran it out of CPU, ran too.
            proactive.share.speculations += 1;
            proactive.setup.counters.speculated(0.0);
        }
        proactive.setup.counters.used_cpu(cpu_ms);
        proactive.share.cpu_ms += cpu_ms;
        self.events.publish(SessionEvent::SpeculationEnded {
            session_id: self.session_id.as_str().into(),
            cpu_ms,
        });
        // A request still waiting for a snippet that never came runs for real.
        if let State::Busy(running) = &self.state {
            if matches!(running.path, ServePath::Joining { .. }) {
                self.run_for_real(ctx);
            }
        }
        self.publish_idle(ctx);
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
    }
    facts.files.truncate(MAX_FACT_FILES);
    Some(facts)
}

impl Handler<Speculate> for SessionActor {
    type Result = bool;

    fn handle(&mut self, msg: Speculate, _: &mut Context<Self>) -> bool {
        let idle = matches!(self.state, State::Idle) && self.queue.is_empty();
        let (Some(proactive), Some(worker)) = (&mut self.proactive, &self.worker) else {
            return false;
        };
        let behind = proactive.awaited.is_some();
        if !idle || behind || proactive.flight.is_some() || self.draining.is_some() {
            return false;
        }
        let versions = &proactive.versions;
        let snippets: Vec<PlannedSnippet> = msg
            .snippets
            .into_iter()
            .filter(|s| {
                proactive
                    .stored
                    .get(&s.normal)
                    .is_none_or(|key| !versions.holds(key))
            })
            .collect();
        if snippets.is_empty() {
            return false;
        }
        proactive.speculations += 1;
        let id = format!("p-{}", proactive.speculations);
        let frame = HostMessage::Speculate {
            id: id.clone(),
            snippets: snippets.iter().map(|s| s.code.clone()).collect(),
            repr_limit: self.setup.limits.result_repr_bytes,
            output_limit: self.setup.limits.output_bytes,
            cpu_ms: msg.cpu_ms,
        };
        if worker.writer.send(&frame).is_err() {
            return false;
        }
        let count = snippets.len();
        proactive.flight = Some(InFlight {
            id,
            snapshot: versions.snapshot(),
            forked_at: proactive.real_runs,
            snippets,
            ready: vec![None; count],
            answered: vec![false; count],
            bound: Vec::new(),
            stale: false,
        });
        true
    }
}
