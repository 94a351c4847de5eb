//! Forking a session's worker (`session.fork`): [`ForkWorkers`] has the worker fork `count`
//! clones of itself between executions (the fork frame waits in the worker behind a running
//! execution, and executions queued here go after it), then adopts each clone as a worker of
//! the session's kind, on this session's arbiter. The registry makes sessions of them.
//!
//! A clone goes on from its source ([`StartClone`]): it counts its executions on from the
//! source's count at the fork, so its cells never take the names (`<cell-N>`, in tracebacks
//! and `inspect`) of the source's cells whose functions it holds. And its worker inherits the
//! source's record of the groups of names its latest checkpoint holds: when that record is
//! what the store holds at the fork, the clone is seeded with that checkpoint, its first
//! checkpoint writes only the groups changed since, and the store links the others' blobs in
//! from the source's lineage.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use actix::prelude::*;
use pyvisor_protocol::{ForkedClone, HostMessage};
use tokio::sync::oneshot;

use super::{SessionActor, State};
use crate::checkpoint::CheckpointSeed;
use crate::errors::{SessionError, SpawnError};
use crate::limits::SessionLimits;
use crate::worker::{CloneConfinement, Worker, WorkerSpec};

/// Fork the session's worker `count` times.
#[derive(Message)]
#[rtype(result = "Result<ForkedWorkers, SessionError>")]
pub struct ForkWorkers {
    pub count: u32,
    /// The pool's kind of worker: what the clones are, for a session without a spec of its own.
    pub base: Box<WorkerSpec>,
}

/// The clones of a [`ForkWorkers`], ready, and what a session of each needs.
pub struct ForkedWorkers {
    pub workers: Vec<Worker>,
    /// Why there are fewer workers than asked for.
    pub failures: Vec<String>,
    /// The source's own worker kind, which replaces a clone's worker after a crash.
    pub spec: Option<Box<WorkerSpec>>,
    pub limits: SessionLimits,
    /// Threads of the session's code that were running at the fork.
    pub threads: u32,
    /// The arbiter the clones' pipes are served on.
    pub arbiter: ArbiterHandle,
    /// What each clone goes on from.
    pub start: StartClone,
}

/// What a new clone takes from its source at the fork, before anything else: its execution
/// count, and the seed of its first checkpoint, taken at once (written whole without one).
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct StartClone {
    /// The source's executions that reached its worker before the fork.
    pub execution_count: u64,
    /// The source's checkpoint that the clone's record of groups describes, if any.
    pub seed: Option<CheckpointSeed>,
}

/// What the worker answered to a fork.
pub(super) struct ForkReport {
    pub clones: Vec<ForkedClone>,
    pub threads: u32,
    pub error: Option<String>,
}

/// Forks the worker has not answered yet.
#[derive(Default)]
pub(super) struct Forks {
    pending: HashMap<String, oneshot::Sender<ForkReport>>,
    next: u64,
}

impl Forks {
    /// The worker is gone: its forks fail.
    pub(super) fn forget(&mut self) {
        self.pending.clear();
    }
}

impl SessionActor {
    /// The worker answered fork `id`.
    pub(super) fn forked(&mut self, id: &str, report: ForkReport) {
        match self.forks.pending.remove(id) {
            Some(reply) => drop(reply.send(report)),
            // Nobody waits for them: the clones wait for a start that never comes, and end
            // at the end of file of their pipes.
            None => tracing::warn!(session = %self.session_id, id, "clones of an unknown fork"),
        }
    }
}

impl Handler<ForkWorkers> for SessionActor {
    type Result = ResponseFuture<Result<ForkedWorkers, SessionError>>;

    fn handle(&mut self, msg: ForkWorkers, _: &mut Context<Self>) -> Self::Result {
        let refused = |err| -> Self::Result { Box::pin(async move { Err(err) }) };
        if let State::Closing | State::Closed = self.state {
            return refused(SessionError::Closed {
                session_id: self.session_id.clone(),
            });
        }
        let ready = matches!(self.state, State::Idle | State::Busy(_));
        let Some(worker) = self.worker.as_ref().filter(|_| ready) else {
            return refused(self.no_worker());
        };
        if !worker.info.supports("fork") {
            return refused(SessionError::WorkerState {
                session_id: self.session_id.clone(),
                reason: "its worker package cannot fork".into(),
            });
        }
        let kind = self.setup.spec.as_deref().unwrap_or(&msg.base);
        let scratch = self
            .setup
            .state
            .as_ref()
            .map(|state| state.scratch.as_path());
        let shares = match clone_shares(worker, kind, scratch, msg.count) {
            Ok(shares) => shares,
            Err(err) => {
                return refused(SessionError::Clone {
                    session_id: self.session_id.clone(),
                    source: Arc::new(err),
                })
            }
        };
        self.forks.next += 1;
        let id = format!("f-{}", self.forks.next);
        let frame = HostMessage::Fork {
            id: id.clone(),
            count: msg.count,
            plans: (shares.iter().flatten())
                .filter_map(|share| share.plan.clone())
                .collect(),
        };
        if worker.writer.send(&frame).is_err() {
            return refused(self.no_worker());
        }
        let (reply, answer) = oneshot::channel();
        self.forks.pending.insert(id, reply);
        let start = StartClone {
            execution_count: self.last_started_count(),
            seed: (self.setup.state.as_ref())
                .and_then(|state| self.durability.seed_for_clone(&state.key)),
        };
        let source_pid = worker.pid();
        let spec = self.setup.spec.clone();
        let limits = self.setup.limits.clone();
        let session_id = self.session_id.clone();
        Box::pin(async move {
            let report = answer.await.map_err(|_| SessionError::NoWorker {
                session_id,
                reason: "its worker ended before it forked".into(),
            })?;
            let kind = spec.as_deref().unwrap_or(&msg.base);
            let mut shares = shares.into_iter();
            let adoptions: Vec<_> = (report.clones.iter().zip(shares.by_ref()))
                .map(|(clone, share)| Worker::adopt_clone(kind, source_pid, clone, share))
                .collect();
            // The shares of clones the worker did not make go, their directories with them,
            // off the actor thread (the last holder of a uid sweeps it).
            let unused: Vec<_> = shares.collect();
            if !unused.is_empty() {
                drop(tokio::task::spawn_blocking(move || drop(unused)));
            }
            let mut workers = Vec::new();
            let mut failures: Vec<String> = report.error.into_iter().collect();
            for adopted in futures::future::join_all(adoptions).await {
                match adopted {
                    Ok(worker) => workers.push(worker),
                    Err(err) => failures.push(err.to_string()),
                }
            }
            Ok(ForkedWorkers {
                workers,
                failures,
                spec,
                limits,
                threads: report.threads,
                arbiter: Arbiter::current(),
                start,
            })
        })
    }
}

/// Each clone's share of the source worker's confinement (`None` for an unconfined worker):
/// under Landlock, directories of its own and the plan that isolates it.
fn clone_shares(
    worker: &Worker,
    kind: &WorkerSpec,
    scratch: Option<&Path>,
    count: u32,
) -> Result<Vec<Option<CloneConfinement>>, SpawnError> {
    let (Some(confinement), Some(sandbox)) = (worker.shared_confinement(), kind.sandbox.as_ref())
    else {
        return Ok((0..count).map(|_| None).collect());
    };
    (0..count)
        .map(|_| confinement.for_clone(sandbox, scratch).map(Some))
        .collect()
}

impl Handler<StartClone> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: StartClone, ctx: &mut Context<Self>) {
        self.execution_count = msg.execution_count;
        if let Some(seed) = msg.seed {
            self.durability.seed_from(seed);
        }
        if let Err(err) = self.start_checkpoint(None, ctx) {
            tracing::debug!(session = %self.session_id, error = %err, "a clone's first checkpoint");
        }
    }
}
