//! The PoolActor: ready workers, handed out to new sessions without waiting for a spawn.
//!
//! The RegistryActor sends it [`Acquire`] for every new session and [`Release`] when a session
//! ends; a session whose worker died sends [`Acquire`] with [`Slot::Held`] for a replacement.
//! The pool keeps `min_idle..max_idle` ready workers (handshake done, preload modules
//! imported) and never more than `max_total` processes, counting idle ones, ones starting
//! and ones held by sessions. Spawns run on the engine's arbiter threads, never in the pool's
//! own handlers, so an acquire or a stats request is answered while workers start: in turn
//! for the pool's own workers, and on the session's arbiter for a replacement, so that a
//! session and its worker's pipes always share a thread. Waiting
//! acquires are served first come, first served, and fail with [`PoolError::Exhausted`] after
//! `acquire_timeout`. Idle workers older than `idle_ttl` are ended down to `min_idle`, on a
//! timer and at once when [`Resize`] changes the bounds.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::errors::{PoolError, SpawnError};
use crate::metrics;
use crate::worker::{Worker, WorkerSpec};

mod messages;

pub use messages::{
    Acquire, DrainPool, GetPoolStats, Lease, PoolConfig, PoolStats, Release, ReserveClones, Resize,
    Slot,
};

/// Spawn durations kept for the `spawn_ms_p50` figure.
const SPAWN_SAMPLES: usize = 256;
/// How long after a hit the pool starts refilling, while it still has idle workers.
const REFILL_DELAY: Duration = Duration::from_millis(5);
/// How long refilling pauses after a failed spawn, so a broken interpreter is not respawned
/// in a tight loop.
const REFILL_BACKOFF: Duration = Duration::from_secs(1);

/// A ready worker waiting for a session.
struct IdleWorker {
    worker: Worker,
    arbiter: ArbiterHandle,
    since: Instant,
}

/// An acquire that could not be answered at once.
struct Waiter {
    id: u64,
    spec: Option<Box<WorkerSpec>>,
    slot: Slot,
    /// The arbiter its worker must be spawned on ([`Acquire::arbiter`]).
    arbiter: Option<ArbiterHandle>,
    reply: oneshot::Sender<Result<Lease, PoolError>>,
    since: Instant,
    /// Whether a spawn was started on this waiter's behalf.
    spawning: bool,
}

impl Waiter {
    /// Whether an idle worker serves it: it wants the pool's own kind, on any arbiter.
    fn takes_idle(&self) -> bool {
        self.spec.is_none() && self.arbiter.is_none()
    }
}

/// Why a spawn was started, which decides where its worker goes.
#[derive(Debug, Clone, Copy)]
struct SpawnPurpose {
    /// The waiter a custom or pinned worker is for; `None` for a worker of the pool's own
    /// kind on any arbiter, which goes to the first waiter that wants one.
    custom_for: Option<u64>,
    /// Whether the spawn counts under `max_total` (a [`Slot::Held`] replacement does not).
    counted: bool,
}

/// The actor that keeps ready workers.
pub struct PoolActor {
    config: PoolConfig,
    spec: WorkerSpec,
    arbiters: Vec<ArbiterHandle>,
    next_arbiter: usize,
    idle: VecDeque<IdleWorker>,
    /// Spawns in flight that count under `max_total`.
    counted_spawns: usize,
    /// Spawns in flight of the pool's own kind (counted or not).
    default_spawns: usize,
    /// Every spawn in flight.
    spawns: usize,
    /// Places held by sessions.
    active: usize,
    waiters: VecDeque<Waiter>,
    next_waiter: u64,
    hits: u64,
    misses: u64,
    spawn_ms: VecDeque<f64>,
    refill_paused_until: Option<Instant>,
    draining: bool,
}

impl PoolActor {
    /// A pool of workers started from `spec`, spawned in turn on `arbiters`.
    pub fn new(config: PoolConfig, spec: WorkerSpec, arbiters: Vec<ArbiterHandle>) -> Self {
        assert!(!arbiters.is_empty(), "a pool needs an arbiter to spawn on");
        Self {
            config,
            spec,
            arbiters,
            next_arbiter: 0,
            idle: VecDeque::new(),
            counted_spawns: 0,
            default_spawns: 0,
            spawns: 0,
            active: 0,
            waiters: VecDeque::new(),
            next_waiter: 0,
            hits: 0,
            misses: 0,
            spawn_ms: VecDeque::new(),
            refill_paused_until: None,
            draining: false,
        }
    }

    /// Processes counted under `max_total`.
    fn total(&self) -> usize {
        self.idle.len() + self.counted_spawns + self.active
    }

    fn has_room(&self) -> bool {
        self.total() < self.config.max_total
    }

    /// Takes the oldest idle worker that is still alive; dead ones are dropped on the way.
    fn take_idle(&mut self) -> Option<IdleWorker> {
        while let Some(mut idle) = self.idle.pop_front() {
            if idle_worker_alive(&mut idle.worker) {
                return Some(idle);
            }
            tracing::debug!(
                pid = idle.worker.pid(),
                "dropping an idle worker that exited"
            );
        }
        None
    }

    /// Answers as many waiters as possible, starts the spawns they need, then refills.
    fn dispatch(&mut self, ctx: &mut Context<Self>) {
        self.serve_waiters_from_idle();
        let mut new_blocked = false;
        for index in 0..self.waiters.len() {
            let waiter = &self.waiters[index];
            if waiter.spawning || (waiter.slot == Slot::New && new_blocked) {
                continue;
            }
            let custom_for = (!waiter.takes_idle()).then_some(waiter.id);
            let counted = waiter.slot == Slot::New;
            if counted && !self.has_room() {
                // Room for a custom worker can be made by ending an idle one of ours.
                if custom_for.is_some() && self.idle.pop_front().is_some() {
                    tracing::debug!("ended an idle worker to make room for a custom one");
                } else {
                    new_blocked = true;
                    continue;
                }
            }
            let spec = self.waiters[index].spec.as_deref().cloned();
            let arbiter = self.waiters[index].arbiter.clone();
            self.waiters[index].spawning = true;
            self.spawn(
                spec,
                arbiter,
                SpawnPurpose {
                    custom_for,
                    counted,
                },
                ctx,
            );
        }
        self.refill(ctx);
    }

    /// Gives idle workers to the waiters that want the pool's own kind on any arbiter, oldest
    /// waiter first.
    fn serve_waiters_from_idle(&mut self) {
        while let Some(index) = self.waiters.iter().position(Waiter::takes_idle) {
            let Some(idle) = self.take_idle() else { return };
            let waiter = self.waiters.remove(index).expect("index from position");
            self.serve(waiter, idle.worker, idle.arbiter, false);
        }
    }

    /// Starts spawns of the pool's own kind until `min_idle` workers are ready or coming.
    fn refill(&mut self, ctx: &mut Context<Self>) {
        if self.draining {
            return;
        }
        if let Some(until) = self.refill_paused_until {
            if Instant::now() < until {
                return;
            }
            self.refill_paused_until = None;
        }
        let wanting = self.waiters.iter().filter(|w| w.takes_idle()).count();
        let mut coming = self.idle.len() + self.default_spawns.saturating_sub(wanting);
        while coming < self.config.min_idle.min(self.config.max_idle) && self.has_room() {
            self.spawn(
                None,
                None,
                SpawnPurpose {
                    custom_for: None,
                    counted: true,
                },
                ctx,
            );
            coming += 1;
        }
    }

    /// Starts a worker on `arbiter`, else on the next one in turn; its outcome comes back to
    /// [`Self::spawned`].
    fn spawn(
        &mut self,
        spec: Option<WorkerSpec>,
        arbiter: Option<ArbiterHandle>,
        purpose: SpawnPurpose,
        ctx: &mut Context<Self>,
    ) {
        let is_default = spec.is_none() && purpose.custom_for.is_none();
        let spec = spec.unwrap_or_else(|| self.spec.clone());
        let arbiter = arbiter.unwrap_or_else(|| {
            self.next_arbiter += 1;
            self.arbiters[(self.next_arbiter - 1) % self.arbiters.len()].clone()
        });
        self.spawns += 1;
        if purpose.counted {
            self.counted_spawns += 1;
        }
        if is_default {
            self.default_spawns += 1;
        }
        let (done, outcome) = oneshot::channel();
        let started = arbiter.spawn(async move {
            let began = Instant::now();
            let worker = Worker::start(&spec).await;
            let _ = done.send((worker, began.elapsed()));
        });
        if !started {
            tracing::warn!("an arbiter thread is gone; the spawn on it is lost");
        }
        let target = arbiter.clone();
        ctx.spawn(outcome.into_actor(self).map(move |outcome, act, ctx| {
            act.spawns -= 1;
            if purpose.counted {
                act.counted_spawns -= 1;
            }
            if is_default {
                act.default_spawns -= 1;
            }
            match outcome {
                Ok((Ok(worker), elapsed)) => {
                    act.record_spawn(elapsed);
                    act.spawned(worker, target, purpose);
                }
                Ok((Err(err), _)) => act.spawn_failed(err, purpose),
                Err(_) => act.spawn_failed(
                    SpawnError::Handshake {
                        reason: "the arbiter thread running the spawn stopped".into(),
                    },
                    purpose,
                ),
            }
            act.dispatch(ctx);
        }));
    }

    /// A spawn succeeded: hand the worker to whoever it is for, or keep it idle.
    fn spawned(&mut self, worker: Worker, arbiter: ArbiterHandle, purpose: SpawnPurpose) {
        if self.draining {
            return;
        }
        let position = match purpose.custom_for {
            Some(id) => self.waiters.iter().position(|w| w.id == id),
            None => self.waiters.iter().position(Waiter::takes_idle),
        };
        if let Some(index) = position {
            let waiter = self.waiters.remove(index).expect("index from position");
            return self.serve(waiter, worker, arbiter, false);
        }
        // A custom worker whose waiter gave up, or one beyond the bounds, is ended.
        let keep = purpose.custom_for.is_none()
            && self.idle.len() < self.config.max_idle
            && self.has_room();
        if keep {
            self.idle.push_back(IdleWorker {
                worker,
                arbiter,
                since: Instant::now(),
            });
        }
    }

    fn spawn_failed(&mut self, err: SpawnError, purpose: SpawnPurpose) {
        tracing::warn!(error = %err, "worker spawn failed; refilling pauses");
        self.refill_paused_until = Some(Instant::now() + REFILL_BACKOFF);
        let position = match purpose.custom_for {
            Some(id) => self.waiters.iter().position(|w| w.id == id),
            None => self
                .waiters
                .iter()
                .position(|w| w.takes_idle() && w.spawning),
        };
        if let Some(index) = position {
            let waiter = self.waiters.remove(index).expect("index from position");
            let _ = waiter.reply.send(Err(PoolError::Spawn(err)));
        }
    }

    fn record_spawn(&mut self, elapsed: Duration) {
        metrics::worker_spawned(elapsed);
        if self.spawn_ms.len() == SPAWN_SAMPLES {
            self.spawn_ms.pop_front();
        }
        self.spawn_ms.push_back(elapsed.as_secs_f64() * 1000.0);
    }

    /// Answers `waiter` with `worker`; `hit` when it was served without waiting.
    fn serve(&mut self, waiter: Waiter, worker: Worker, arbiter: ArbiterHandle, hit: bool) {
        let lease = Lease {
            worker,
            arbiter,
            warm: hit,
        };
        if waiter.reply.send(Ok(lease)).is_err() {
            // The caller gave up; its worker is ended with the lease.
            return;
        }
        if waiter.slot == Slot::New {
            self.active += 1;
        }
        if hit {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
        metrics::pool_acquired(hit, waiter.since.elapsed());
    }

    /// Ends idle workers that waited longer than `idle_ttl` (down to `min_idle`) or died.
    fn reap(&mut self, ctx: &mut Context<Self>) {
        let ttl = self.config.idle_ttl;
        self.idle
            .retain_mut(|idle| idle_worker_alive(&mut idle.worker));
        while self.idle.len() > self.config.min_idle
            && self
                .idle
                .front()
                .is_some_and(|idle| idle.since.elapsed() >= ttl)
        {
            if let Some(idle) = self.idle.pop_front() {
                tracing::debug!(
                    pid = idle.worker.pid(),
                    "ending an idle worker past its ttl"
                );
            }
        }
        self.dispatch(ctx);
    }

    fn stats(&self) -> PoolStats {
        let acquires = self.hits + self.misses;
        let mut samples: Vec<f64> = self.spawn_ms.iter().copied().collect();
        samples.sort_by(f64::total_cmp);
        PoolStats {
            idle: self.idle.len(),
            active: self.active,
            warming: self.spawns,
            waiting: self.waiters.len(),
            max_total: self.config.max_total,
            hits: self.hits,
            misses: self.misses,
            hit_rate: if acquires == 0 {
                0.0
            } else {
                self.hits as f64 / acquires as f64
            },
            spawn_ms_p50: samples.get(samples.len() / 2).copied(),
        }
    }
}

/// Whether an idle worker is still usable: an idle worker has nothing to say, so any event
/// (its exit above all) means it is not.
fn idle_worker_alive(worker: &mut Worker) -> bool {
    matches!(
        worker.events.try_recv(),
        Err(tokio::sync::mpsc::error::TryRecvError::Empty)
    )
}

impl Actor for PoolActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let tick =
            (self.config.idle_ttl / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        ctx.run_interval(tick, |act, ctx| act.reap(ctx));
        self.refill(ctx);
    }
}

impl Handler<Acquire> for PoolActor {
    type Result = ResponseFuture<Result<Lease, PoolError>>;

    fn handle(&mut self, msg: Acquire, ctx: &mut Context<Self>) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        if self.draining {
            return Box::pin(async { Err(PoolError::ShuttingDown) });
        }
        self.next_waiter += 1;
        let waiter = Waiter {
            id: self.next_waiter,
            spec: msg.spec,
            slot: msg.slot,
            arbiter: msg.arbiter,
            reply,
            since: Instant::now(),
            spawning: false,
        };
        let first_in_line = !self.waiters.iter().any(Waiter::takes_idle);
        if waiter.takes_idle() && first_in_line {
            if let Some(idle) = self.take_idle() {
                self.serve(waiter, idle.worker, idle.arbiter, true);
                // The caller's next step is to run code on the worker it got: keep the
                // refill's spawn work off the CPU for that moment, unless the pool is empty.
                if self.idle.is_empty() {
                    self.refill(ctx);
                } else {
                    ctx.run_later(REFILL_DELAY, |act, ctx| act.refill(ctx));
                }
                return Box::pin(receive(answer));
            }
        }
        if waiter.slot == Slot::New {
            let id = waiter.id;
            let timeout = self.config.acquire_timeout;
            ctx.run_later(timeout, move |act, ctx| {
                // A waiter with a spawn under way is bounded by the handshake timeout; this
                // one bounds the wait for room under `max_total`.
                let Some(index) = act.waiters.iter().position(|w| w.id == id && !w.spawning) else {
                    return;
                };
                let waiter = act.waiters.remove(index).expect("index from position");
                let _ = waiter.reply.send(Err(PoolError::Exhausted {
                    waited: timeout,
                    max_total: act.config.max_total,
                }));
                act.dispatch(ctx);
            });
        }
        self.waiters.push_back(waiter);
        self.dispatch(ctx);
        Box::pin(receive(answer))
    }
}

async fn receive(answer: oneshot::Receiver<Result<Lease, PoolError>>) -> Result<Lease, PoolError> {
    answer.await.unwrap_or(Err(PoolError::ShuttingDown))
}

impl Handler<Release> for PoolActor {
    type Result = ();

    fn handle(&mut self, _: Release, ctx: &mut Context<Self>) {
        self.active = self.active.saturating_sub(1);
        self.dispatch(ctx);
    }
}

impl Handler<ReserveClones> for PoolActor {
    type Result = Result<Box<WorkerSpec>, PoolError>;

    fn handle(&mut self, msg: ReserveClones, _: &mut Context<Self>) -> Self::Result {
        if self.draining {
            return Err(PoolError::ShuttingDown);
        }
        let max_total = self.config.max_total;
        if self.active + self.counted_spawns + msg.count > max_total {
            return Err(PoolError::Exhausted {
                waited: Duration::ZERO,
                max_total,
            });
        }
        // Ready spares give way to sessions.
        while self.total() + msg.count > max_total && self.idle.pop_back().is_some() {}
        self.active += msg.count;
        Ok(Box::new(self.spec.clone()))
    }
}

impl Handler<Resize> for PoolActor {
    type Result = ();

    fn handle(&mut self, Resize(config): Resize, ctx: &mut Context<Self>) {
        self.config = config;
        let keep = self.config.max_idle.min(self.config.max_total);
        while self.idle.len() > keep {
            self.idle.pop_front();
        }
        // Idle workers already past the new ttl end at once, down to the new min_idle.
        self.reap(ctx);
    }
}

impl Handler<DrainPool> for PoolActor {
    type Result = ();

    fn handle(&mut self, _: DrainPool, _: &mut Context<Self>) {
        self.draining = true;
        for waiter in self.waiters.drain(..) {
            let _ = waiter.reply.send(Err(PoolError::ShuttingDown));
        }
        self.idle.clear();
    }
}

impl Handler<GetPoolStats> for PoolActor {
    type Result = MessageResult<GetPoolStats>;

    fn handle(&mut self, _: GetPoolStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats())
    }
}
