//! How a proactive session runs the predictor's snippets: a [`Speculate`] while it is idle
//! becomes one forked child of its worker, whose answers are keyed on the versions of the
//! names they read when it was sent, kept in the cache, and handed to a request that waits
//! for them.

use std::collections::HashSet;
use std::sync::Arc;

use actix::prelude::*;
use pyvisor_protocol::{HostMessage, SpeculativeOutcome, WorkerStatus};

use super::events::{SessionEvent, Speculated};
use super::serving::ServePath;
use super::{SessionActor, State};
use crate::proactive::cache::{CacheEntry, Store};
use crate::proactive::predict::normalise;
use crate::proactive::versions::Snapshot;

/// Run predicted snippets in a fork of the session's worker, in order, while it is idle;
/// replies `None` when it cannot take them now (busy, or already speculating), else the
/// normal forms of those it sent to the worker: not those whose answer is stored, nor those
/// the cache has no room for, nor any when its worker cannot speculate.
#[derive(Message)]
#[rtype(result = "Option<Vec<String>>")]
pub struct Speculate {
    pub snippets: Vec<PlannedSnippet>,
    /// CPU milliseconds the child may use before the worker kills it.
    pub cpu_ms: u64,
    /// Normal forms of everything the predictor ranks likely now, planned or not: stored
    /// answers outside it give way when the cache has no room for the snippets.
    pub ranked: HashSet<String>,
}

/// Code the caller expects the session to run soon (`session.hint`), published to the
/// session's subscribers after the executions before it; replies how many snippets the
/// predictor can take (0 for a session without proactive computation, or closed).
#[derive(Message)]
#[rtype(result = "usize")]
pub struct Hint {
    pub code: Vec<String>,
}

/// One snippet of a [`Speculate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedSnippet {
    pub code: String,
    /// Its normal form ([`crate::proactive::predict::normalise`]), the key a request is
    /// matched on.
    pub normal: String,
    /// The prediction source that proposed it.
    pub source: &'static str,
}

/// The speculation a session's worker is running.
pub(super) struct InFlight {
    pub(super) id: String,
    pub(super) snapshot: Snapshot,
    /// The session's count of real executions when it was sent.
    pub(super) forked_at: u64,
    pub(super) snippets: Vec<PlannedSnippet>,
    /// Servable answers, by snippet; `answered` says which snippets are done at all.
    pub(super) ready: Vec<Option<Arc<CacheEntry>>>,
    pub(super) answered: Vec<bool>,
    /// Names the snippets done so far bound (later ones build on them).
    pub(super) bound: Vec<String>,
    /// The namespace was replaced since it started: nothing it computes may serve.
    pub(super) stale: bool,
}

impl SessionActor {
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
                finished: false,
                unrun: Vec::new(),
                cut_off: None,
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
        tracing::debug!(
            session = %self.session_id,
            code = %planned.normal,
            servable = outcome.servable,
            status = ?outcome.status,
            "snippet speculated"
        );
        if index == 0 && proactive.real_runs == flight.forked_at && !outcome.ambient.is_empty() {
            // The child's first snippet saw the surroundings (display options and the like)
            // as the worker had them at the fork and, nothing having run since, has them now.
            // A session that has run nothing yet has no facts to know them from.
            proactive.versions.surroundings_are(&outcome.ambient);
        }
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
        // The child runs its snippets in order: the first one without an answer is the one
        // it died in, unless it was cancelled from outside or ended on its own.
        let mut unanswered = flight
            .snippets
            .iter()
            .zip(&flight.answered)
            .filter(|(_, answered)| !**answered)
            .map(|(snippet, _)| snippet.normal.clone());
        let died_in = match ending {
            "finished" | "cancelled" => None,
            _ => unanswered.next(),
        };
        let unrun: Vec<String> = unanswered.collect();
        let cut_off = died_in.filter(|_| ending == "cpu_limit");
        tracing::debug!(
            session = %self.session_id,
            ending,
            cpu_ms,
            snippets = flight.snippets.len(),
            unrun = unrun.len(),
            "speculation ended"
        );
        self.events.publish(SessionEvent::SpeculationEnded {
            session_id: self.session_id.as_str().into(),
            cpu_ms,
            finished: ending == "finished",
            unrun,
            cut_off,
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

impl Handler<Hint> for SessionActor {
    type Result = usize;

    fn handle(&mut self, msg: Hint, ctx: &mut Context<Self>) -> usize {
        if self.proactive.is_none() || matches!(self.state, State::Closed) {
            return 0;
        }
        let taken = msg.code.iter().filter(|c| normalise(c).is_some()).count();
        self.publish_hint(msg.code);
        // An idle session is speculated on only after it says so, which one that has run
        // nothing yet never did.
        self.publish_idle(ctx);
        taken
    }
}

impl Handler<Speculate> for SessionActor {
    type Result = Option<Vec<String>>;

    fn handle(&mut self, msg: Speculate, _: &mut Context<Self>) -> Option<Vec<String>> {
        let idle = matches!(self.state, State::Idle) && self.queue.is_empty();
        let (Some(proactive), Some(worker)) = (&mut self.proactive, &self.worker) else {
            return None;
        };
        if !worker.info.supports("speculate") {
            return Some(Vec::new()); // nor will it ever
        }
        let behind = proactive.awaited.is_some();
        if !idle || behind || proactive.flight.is_some() || self.draining.is_some() {
            return None;
        }
        let stored = &proactive.stored;
        let fresh: Vec<PlannedSnippet> = msg
            .snippets
            .into_iter()
            .filter(|s| !stored.contains_key(&s.normal))
            .collect();
        let room = proactive.make_room(&self.session_id, fresh.len(), &msg.ranked);
        let snippets: Vec<PlannedSnippet> = fresh.into_iter().take(room).collect();
        if snippets.is_empty() {
            return Some(Vec::new());
        }
        proactive.flights_sent += 1;
        let id = format!("p-{}", proactive.flights_sent);
        let frame = HostMessage::Speculate {
            id: id.clone(),
            snippets: snippets.iter().map(|s| s.code.clone()).collect(),
            repr_limit: self.setup.limits.result_repr_bytes,
            output_limit: self.setup.limits.output_bytes,
            cpu_ms: msg.cpu_ms,
        };
        if worker.writer.send(&frame).is_err() {
            return None;
        }
        let count = snippets.len();
        let sent = snippets.iter().map(|s| s.normal.clone()).collect();
        tracing::debug!(
            session = %self.session_id,
            snippets = ?snippets.iter().map(|s| s.normal.as_str()).collect::<Vec<_>>(),
            cpu_ms = msg.cpu_ms,
            "speculation sent"
        );
        proactive.flight = Some(InFlight {
            id,
            snapshot: proactive.versions.snapshot(),
            forked_at: proactive.real_runs,
            snippets,
            ready: vec![None; count],
            answered: vec![false; count],
            bound: Vec::new(),
            stale: false,
        });
        Some(sent)
    }
}
