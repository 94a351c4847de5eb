//! The proactive engine's running totals (`engine.stats` `proactive`, `session.info`) and its
//! Prometheus metrics (docs/metrics.md).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use metrics::{counter, gauge, histogram};
use serde::{Deserialize, Serialize};

pub const PREDICTIONS_TOTAL: &str = "pyvisor_proactive_predictions_total";
pub const CACHE_HITS_TOTAL: &str = "pyvisor_proactive_cache_hits_total";
pub const CACHE_MISSES_TOTAL: &str = "pyvisor_proactive_cache_misses_total";
pub const EXECUTION_SECONDS: &str = "pyvisor_proactive_execution_seconds";
pub const CACHE_SIZE: &str = "pyvisor_proactive_cache_size";
pub const HIT_RATE: &str = "pyvisor_proactive_hit_rate";
pub const CPU_SECONDS_TOTAL: &str = "pyvisor_proactive_cpu_seconds_total";

/// The figures of `engine.stats` `proactive` (or one session's share of them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProactiveStats {
    /// Predictions sent to a worker to speculate (an answer already stored is not sent again).
    pub predictions: u64,
    /// Snippets run in speculative children.
    pub speculations: u64,
    /// Executions answered from the cache.
    pub hits: u64,
    /// Executions answered by joining the speculation computing them.
    pub joins: u64,
    /// Executions that could have been served and were run for real.
    pub misses: u64,
    /// (hits + joins) / (hits + joins + misses); 0 before any execution.
    pub hit_rate: f64,
    /// Speculative answers dropped unserved (stale, evicted, expired).
    pub discarded: u64,
    /// CPU time the speculative children used, in milliseconds.
    pub cpu_ms: f64,
    /// Bytes the cache holds now (engine-wide; 0 in a session's share).
    pub cache_bytes: u64,
    /// Hits and joins by the prediction source that proposed the answer.
    #[serde(default)]
    pub served_by_source: BTreeMap<String, u64>,
}

impl ProactiveStats {
    /// An execution was served from an answer `source` proposed (`joined`: by waiting for
    /// its speculation).
    pub(crate) fn served(&mut self, source: &'static str, joined: bool) {
        if joined {
            self.joins += 1;
        } else {
            self.hits += 1;
        }
        *self.served_by_source.entry(source.to_owned()).or_default() += 1;
        self.hit_rate = hit_rate(self.hits + self.joins, self.misses);
    }

    /// An execution was run for real.
    pub(crate) fn missed(&mut self) {
        self.misses += 1;
        self.hit_rate = hit_rate(self.hits + self.joins, self.misses);
    }
}

/// Running totals shared by the proactive actors and the sessions.
#[derive(Debug, Default)]
pub struct ProactiveCounters {
    predictions: AtomicU64,
    speculations: AtomicU64,
    hits: AtomicU64,
    joins: AtomicU64,
    misses: AtomicU64,
    discarded: AtomicU64,
    cpu_us: AtomicU64,
    cache_bytes: AtomicU64,
    served_by_source: Mutex<BTreeMap<String, u64>>,
}

impl ProactiveCounters {
    /// The totals now.
    pub fn stats(&self) -> ProactiveStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let (hits, joins, misses) = (load(&self.hits), load(&self.joins), load(&self.misses));
        ProactiveStats {
            predictions: load(&self.predictions),
            speculations: load(&self.speculations),
            hits,
            joins,
            misses,
            hit_rate: hit_rate(hits + joins, misses),
            discarded: load(&self.discarded),
            cpu_ms: load(&self.cpu_us) as f64 / 1000.0,
            cache_bytes: load(&self.cache_bytes),
            served_by_source: self
                .served_by_source
                .lock()
                .map(|counts| counts.clone())
                .unwrap_or_default(),
        }
    }

    /// A prediction from `source` was scheduled.
    pub(crate) fn predicted(&self, source: &'static str) {
        self.predictions.fetch_add(1, Ordering::Relaxed);
        counter!(PREDICTIONS_TOTAL, "source" => source).increment(1);
    }

    /// A snippet ran in a speculative child for `seconds`.
    pub(crate) fn speculated(&self, seconds: f64) {
        self.speculations.fetch_add(1, Ordering::Relaxed);
        histogram!(EXECUTION_SECONDS).record(seconds);
    }

    /// A speculative child used `cpu_ms` of CPU.
    pub(crate) fn used_cpu(&self, cpu_ms: f64) {
        let cpu_us = (cpu_ms.max(0.0) * 1000.0) as u64;
        let total_us = self.cpu_us.fetch_add(cpu_us, Ordering::Relaxed) + cpu_us;
        // A gauge that only grows: the facade's counters count whole units, and CPU time
        // comes in fractions of a second.
        gauge!(CPU_SECONDS_TOTAL).set(total_us as f64 / 1e6);
    }

    /// An execution was served from an answer `source` proposed (`joined`: by waiting for
    /// its speculation).
    pub(crate) fn hit(&self, source: &'static str, joined: bool) {
        if let Ok(mut counts) = self.served_by_source.lock() {
            *counts.entry(source.to_owned()).or_default() += 1;
        }
        let counter = if joined { &self.joins } else { &self.hits };
        counter.fetch_add(1, Ordering::Relaxed);
        counter!(CACHE_HITS_TOTAL).increment(1);
        self.publish_hit_rate();
    }

    /// An execution was run for real.
    pub(crate) fn missed(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
        counter!(CACHE_MISSES_TOTAL).increment(1);
        self.publish_hit_rate();
    }

    /// `count` speculative answers were dropped unserved.
    pub(crate) fn discarded(&self, count: u64) {
        self.discarded.fetch_add(count, Ordering::Relaxed);
    }

    /// The cache holds `bytes` now.
    pub(crate) fn cache_size(&self, bytes: u64) {
        self.cache_bytes.store(bytes, Ordering::Relaxed);
        gauge!(CACHE_SIZE).set(bytes as f64);
    }

    fn publish_hit_rate(&self) {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let served = load(&self.hits) + load(&self.joins);
        gauge!(HIT_RATE).set(hit_rate(served, load(&self.misses)));
    }
}

/// Describes the proactive metrics to the installed recorder and starts them at zero (see
/// [`crate::metrics::describe`]).
pub(crate) fn describe() {
    use crate::proactive::predict::Source;
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        PREDICTIONS_TOTAL,
        "Predictions scheduled for speculation, by source."
    );
    describe_counter!(
        CACHE_HITS_TOTAL,
        "Executions answered from speculation (cached or joined)."
    );
    describe_counter!(
        CACHE_MISSES_TOTAL,
        "Executions of proactive sessions run for real."
    );
    describe_histogram!(
        EXECUTION_SECONDS,
        Unit::Seconds,
        "Time a speculative snippet ran in its child."
    );
    describe_gauge!(
        CACHE_SIZE,
        Unit::Bytes,
        "Bytes of speculative answers held."
    );
    describe_gauge!(
        HIT_RATE,
        "Share of proactive executions answered from speculation."
    );
    describe_gauge!(
        CPU_SECONDS_TOTAL,
        Unit::Seconds,
        "CPU time used by speculative children since the engine started."
    );
    for source in Source::ALL {
        counter!(PREDICTIONS_TOTAL, "source" => source.as_str()).increment(0);
    }
    counter!(CACHE_HITS_TOTAL).increment(0);
    counter!(CACHE_MISSES_TOTAL).increment(0);
    for name in [CACHE_SIZE, HIT_RATE, CPU_SECONDS_TOTAL] {
        gauge!(name).increment(0.0);
    }
}

fn hit_rate(served: u64, misses: u64) -> f64 {
    if served + misses == 0 {
        0.0
    } else {
        served as f64 / (served + misses) as f64
    }
}
