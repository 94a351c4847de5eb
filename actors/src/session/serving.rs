//! How a request of a proactive session is answered: from the worker, or from speculation
//! when, and only when, a real run would have answered the same.
//!
//! An execution request takes one of these paths ([`ServePath`]). If the speculation in
//! flight is computing the same code (same normal form), the request joins it and is answered
//! when the child is done. If the cache holds an answer whose key still holds (no name it read
//! has changed since, same ambient token: [`crate::proactive::versions::VersionTable`]), the
//! session takes it from the [`crate::proactive::cache::CacheActor`]. Either way the worker
//! then checks the content of what the answer read (`adopt`) and counts the execution, or,
//! when nothing ran since the speculation forked and the answer read no file, is only told to
//! count it. A stale answer, or any doubt, runs the code for real, which also kills the
//! speculative child.

use std::sync::Arc;

use actix::prelude::*;
use pyvisor_protocol::HostMessage;

use super::proactive::Proactive;
use super::{host_error, SessionActor, State};
use crate::execution::{DisplayData, ExecutionStatus, OutputStream};
use crate::proactive::cache::{CacheEntry, Take};
use crate::proactive::predict::normalise;

/// How the running execution gets its answer.
#[derive(Debug, Default)]
pub(crate) enum ServePath {
    /// The worker runs it.
    #[default]
    Real,
    /// It waits for snippet `index` of the speculation in flight.
    Joining { index: usize },
    /// The session asked the cache for the answer to code of normal form `normal`.
    Taking { normal: String },
    /// The worker checks that `entry` is still what a run would answer.
    Adopting {
        entry: Arc<CacheEntry>,
        joined: bool,
    },
}

impl Proactive {
    /// How a request for `normal` will be answered, and why (for the debug log).
    fn path_for(&self, normal: String) -> (ServePath, &'static str) {
        if let Some(flight) = self.flight.as_ref().filter(|f| !f.stale) {
            if let Some(index) = flight.snippets.iter().position(|s| s.normal == normal) {
                match &flight.ready[index] {
                    Some(entry) if self.versions.holds(&entry.key) => {
                        let path = ServePath::Adopting {
                            entry: entry.clone(),
                            joined: false,
                        };
                        return (path, "computed by the running speculation");
                    }
                    None if !flight.answered[index] => {
                        return (ServePath::Joining { index }, "being speculated");
                    }
                    _ => {}
                }
            }
        }
        match self.stored.get(&normal) {
            Some(key) if self.versions.holds(key) => (ServePath::Taking { normal }, "cached"),
            Some(_) => (ServePath::Real, "cached, but what it read changed since"),
            None => (ServePath::Real, "never speculated"),
        }
    }
}

impl SessionActor {
    /// How the execution of `code` will be answered.
    pub(super) fn serve_path(&self, code: &str, cache: bool) -> ServePath {
        let Some(proactive) = self.proactive.as_ref().filter(|_| cache) else {
            return ServePath::Real;
        };
        let Some(normal) = normalise(code).filter(|_| proactive.awaited.is_none()) else {
            return ServePath::Real;
        };
        let (path, why) = proactive.path_for(normal.clone());
        tracing::debug!(session = %self.session_id, code = %normal, why, "request");
        path
    }

    /// Starts answering the running execution along `path`.
    pub(super) fn serve(&mut self, path: ServePath, ctx: &mut Context<Self>) {
        match path {
            ServePath::Real => self.run_for_real(ctx),
            ServePath::Joining { index } => self.set_path(ServePath::Joining { index }),
            ServePath::Taking { normal } => self.take_cached(normal, ctx),
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
            cell: Some(running.ticket.execution_count),
        };
        if let Some(proactive) = &mut self.proactive {
            if running.request.cache {
                proactive.setup.counters.missed();
                proactive.share.missed();
            }
        }
        // A worker killed before the session noticed takes the frame into its pipe all the
        // same; when its exit comes, the frame is found unread and goes to the next worker.
        let sent = match &self.worker {
            Some(worker) => worker.writer.send(&frame).map_err(|err| err.to_string()),
            None => Err("the session has no worker".to_owned()),
        };
        match sent {
            Ok(sent) => running.sent = Some(sent),
            Err(reason) => {
                let error = host_error("NotExecuted", reason);
                self.finish(ExecutionStatus::Crashed, None, Some(error), ctx);
            }
        }
    }

    fn take_cached(&mut self, normal: String, ctx: &mut Context<Self>) {
        let (Some(proactive), State::Busy(running)) = (&self.proactive, &mut self.state) else {
            return self.run_for_real(ctx);
        };
        running.path = ServePath::Taking {
            normal: normal.clone(),
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
                || !matches!(running.path, ServePath::Taking { .. })
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
    pub(super) fn offer_cached(
        &mut self,
        entry: Arc<CacheEntry>,
        joined: bool,
        ctx: &mut Context<Self>,
    ) {
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
            if matches!(sent, Some(Ok(_))) {
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
        if !matches!(sent, Some(Ok(_))) {
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
            running.push_display(DisplayData {
                mime: item.mime.clone(),
                data: item.data.clone(),
            });
        }
        if let Some(proactive) = &mut self.proactive {
            proactive.setup.counters.hit(entry.source, joined);
            proactive.share.served(entry.source, joined);
        }
        self.finish(ExecutionStatus::Ok, outcome.result.clone(), None, ctx);
    }
}
