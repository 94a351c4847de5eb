//! The engine's measurements: Prometheus-named metrics (docs/metrics.md) through the `metrics`
//! facade, and the few running totals that `engine.stats` reports.
//!
//! The actors call the functions here at the moment something happens; whoever embeds the
//! engine decides where the `metrics` facade sends them (a Prometheus exporter in the daemon,
//! nothing at all by default). The totals in [`EngineCounters`] are kept apart from the
//! facade because `engine.stats` must work without any recorder installed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{counter, gauge, histogram};

use crate::execution::ExecutionStatus;

pub const EXECUTIONS_TOTAL: &str = "pyvisor_executions_total";
pub const EXECUTION_SECONDS: &str = "pyvisor_execution_seconds";
pub const SESSIONS: &str = "pyvisor_sessions";
pub const POOL_ACQUIRE_SECONDS: &str = "pyvisor_pool_acquire_seconds";
pub const POOL_HITS_TOTAL: &str = "pyvisor_pool_hits_total";
pub const POOL_MISSES_TOTAL: &str = "pyvisor_pool_misses_total";
pub const WORKER_SPAWN_SECONDS: &str = "pyvisor_worker_spawn_seconds";
pub const WORKER_CRASHES_TOTAL: &str = "pyvisor_worker_crashes_total";
pub const RESTORES_TOTAL: &str = "pyvisor_restores_total";
pub const CHECKPOINT_SECONDS: &str = "pyvisor_checkpoint_seconds";
pub const CHECKPOINT_BYTES: &str = "pyvisor_checkpoint_bytes";

/// Running totals of one engine, shared by its actors.
#[derive(Debug, Default)]
pub struct EngineCounters {
    executions: AtomicU64,
    crashes: AtomicU64,
    restores: AtomicU64,
}

impl EngineCounters {
    /// Executions that ran on a worker and ended, whatever their status.
    pub fn executions(&self) -> u64 {
        self.executions.load(Ordering::Relaxed)
    }

    /// Workers that died while their session still wanted them.
    pub fn crashes(&self) -> u64 {
        self.crashes.load(Ordering::Relaxed)
    }

    /// Namespaces brought back from a checkpoint.
    pub fn restores(&self) -> u64 {
        self.restores.load(Ordering::Relaxed)
    }

    /// A worker restored a checkpoint.
    pub(crate) fn restored(&self) {
        self.restores.fetch_add(1, Ordering::Relaxed);
        counter!(RESTORES_TOTAL).increment(1);
    }

    /// An execution ended with `status` after `elapsed` on the worker.
    pub(crate) fn execution_finished(&self, status: ExecutionStatus, elapsed: Duration) {
        self.executions.fetch_add(1, Ordering::Relaxed);
        counter!(EXECUTIONS_TOTAL, "status" => status.as_str()).increment(1);
        histogram!(EXECUTION_SECONDS).record(elapsed.as_secs_f64());
    }

    /// A session's worker died without being asked to.
    pub(crate) fn worker_crashed(&self) {
        self.crashes.fetch_add(1, Ordering::Relaxed);
        counter!(WORKER_CRASHES_TOTAL).increment(1);
    }
}

/// A session moved from phase `from` (none when it is new) to `to` (none when it is gone).
pub(crate) fn session_phase_changed(from: Option<&'static str>, to: Option<&'static str>) {
    if from == to {
        return;
    }
    if let Some(from) = from {
        gauge!(SESSIONS, "state" => from).decrement(1.0);
    }
    if let Some(to) = to {
        gauge!(SESSIONS, "state" => to).increment(1.0);
    }
}

/// An acquire was answered after `waited`, from the idle pool (`hit`) or not.
pub(crate) fn pool_acquired(hit: bool, waited: Duration) {
    if hit {
        counter!(POOL_HITS_TOTAL).increment(1);
    } else {
        counter!(POOL_MISSES_TOTAL).increment(1);
    }
    histogram!(POOL_ACQUIRE_SECONDS).record(waited.as_secs_f64());
}

/// A checkpoint of `bytes` was stored, `elapsed` after it was asked for.
pub(crate) fn checkpoint_written(elapsed: Duration, bytes: u64) {
    histogram!(CHECKPOINT_SECONDS).record(elapsed.as_secs_f64());
    histogram!(CHECKPOINT_BYTES).record(bytes as f64);
}

/// A worker took `elapsed` from spawn to its hello.
pub(crate) fn worker_spawned(elapsed: Duration) {
    histogram!(WORKER_SPAWN_SECONDS).record(elapsed.as_secs_f64());
}

/// Describes every metric to the installed recorder and starts each counter at zero, so
/// that a scrape shows every series from the start rather than from its first event. Call
/// it once after installing a recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(EXECUTIONS_TOTAL, "Executions that ended, by status.");
    describe_histogram!(
        EXECUTION_SECONDS,
        Unit::Seconds,
        "Time an execution ran on its worker."
    );
    describe_gauge!(SESSIONS, "Live sessions, by state.");
    describe_histogram!(
        POOL_ACQUIRE_SECONDS,
        Unit::Seconds,
        "Time a new session waited for a worker."
    );
    describe_counter!(
        POOL_HITS_TOTAL,
        "Acquires answered at once by a ready worker."
    );
    describe_counter!(
        POOL_MISSES_TOTAL,
        "Acquires that waited for a worker to start."
    );
    describe_histogram!(
        WORKER_SPAWN_SECONDS,
        Unit::Seconds,
        "Time from spawn to a ready worker."
    );
    describe_counter!(
        WORKER_CRASHES_TOTAL,
        "Workers that died while their session wanted them."
    );
    describe_counter!(RESTORES_TOTAL, "Namespaces brought back from a checkpoint.");
    describe_histogram!(
        CHECKPOINT_SECONDS,
        Unit::Seconds,
        "Time to take and store a checkpoint."
    );
    describe_histogram!(CHECKPOINT_BYTES, Unit::Bytes, "Size of stored checkpoints.");
    for status in [
        ExecutionStatus::Ok,
        ExecutionStatus::Error,
        ExecutionStatus::Timeout,
        ExecutionStatus::Interrupted,
        ExecutionStatus::Crashed,
    ] {
        counter!(EXECUTIONS_TOTAL, "status" => status.as_str()).increment(0);
    }
    for name in [
        POOL_HITS_TOTAL,
        POOL_MISSES_TOTAL,
        WORKER_CRASHES_TOTAL,
        RESTORES_TOTAL,
    ] {
        counter!(name).increment(0);
    }
    for state in ["idle", "busy", "restarting"] {
        gauge!(SESSIONS, "state" => state).increment(0.0);
    }
    crate::proactive::stats::describe();
    crate::memory::describe();
}
