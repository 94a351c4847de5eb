//! The settings of a [`super::PoolActor`], the messages it accepts and what it answers.

use std::time::Duration;

use actix::prelude::*;
use serde::{Deserialize, Serialize};

use crate::errors::PoolError;
use crate::worker::{Worker, WorkerSpec};

/// How many workers the pool keeps and how long callers wait for one (defaults in docs/config.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Ready workers kept waiting for a session; refilled in the background.
    pub min_idle: usize,
    /// Most ready workers kept; a worker that would exceed it is ended.
    pub max_idle: usize,
    /// Most worker processes at once: idle, starting, and in use by sessions.
    pub max_total: usize,
    /// Idle workers older than this are ended, down to `min_idle`.
    pub idle_ttl: Duration,
    /// How long an acquire waits for room under `max_total` before "pool exhausted".
    pub acquire_timeout: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            min_idle: 2,
            max_idle: 8,
            max_total: 64,
            idle_ttl: Duration::from_secs(300),
            acquire_timeout: Duration::from_secs(5),
        }
    }
}

/// Whether an acquire takes a new place under `max_total` or reuses one already held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// A new session: waits for room under `max_total`, up to `acquire_timeout`.
    New,
    /// A session replacing its dead worker: it already holds a place, so it never waits for
    /// room and never times out.
    Held,
}

/// Get a ready worker: the pool's own kind when `spec` is `None`, else one started for
/// `spec` (a session with its own interpreter, directory, environment or kernel limits).
#[derive(Message)]
#[rtype(result = "Result<Lease, PoolError>")]
pub struct Acquire {
    pub spec: Option<Box<WorkerSpec>>,
    pub slot: Slot,
    /// The arbiter the worker's pipes must be served on: the asking session's own, for a
    /// replacement, so that the session and its worker share a thread. Such an acquire is
    /// served by a spawn on that arbiter, never by an idle worker of another one. `None`: any
    /// arbiter (the new session is started on the lease's).
    pub arbiter: Option<ArbiterHandle>,
}

/// A worker handed out by the pool, with the arbiter its pipes are served on (the session
/// that uses it runs best on the same thread).
#[derive(Debug)]
pub struct Lease {
    pub worker: Worker,
    pub arbiter: ArbiterHandle,
    /// Whether the worker was waiting ready in the pool (a hit) rather than started for this
    /// acquire.
    pub warm: bool,
}

/// Take `count` places under `max_total` for the clones of a session (`session.fork`), at
/// once or not at all (idle workers give way); answers the pool's own kind of worker. A clone
/// that did not come to be gives its place back with [`Release`].
#[derive(Message)]
#[rtype(result = "Result<Box<WorkerSpec>, PoolError>")]
pub struct ReserveClones {
    pub count: usize,
}

/// A session that held a place under `max_total` has ended. Its worker is never reused:
/// the pool only hands out fresh workers.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Release;

/// Replace the pool's sizes; idle workers beyond the new bounds are ended, and refilling
/// follows the new `min_idle` at once.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Resize(pub PoolConfig);

/// Stop refilling, fail every waiting acquire, and end the idle workers.
#[derive(Message)]
#[rtype(result = "()")]
pub struct DrainPool;

/// Ask for the pool's figures.
#[derive(Message)]
#[rtype(result = "PoolStats")]
pub struct GetPoolStats;

/// The pool figures of `engine.stats` (docs/protocol.md), in its wire shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolStats {
    /// Ready workers waiting for a session.
    pub idle: usize,
    /// Places held by sessions.
    pub active: usize,
    /// Workers being started.
    pub warming: usize,
    /// Acquires waiting for a worker to start or for room under `max_total`.
    pub waiting: usize,
    pub max_total: usize,
    /// Acquires answered at once from an idle worker.
    pub hits: u64,
    /// Acquires that had to wait for a worker to start (or for room).
    pub misses: u64,
    /// `hits / (hits + misses)`, 0 before the first acquire.
    pub hit_rate: f64,
    /// Median time from spawn to ready over the recent spawns, in milliseconds.
    pub spawn_ms_p50: Option<f64>,
}
