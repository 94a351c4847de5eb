//! What the engine's LLM calls used: the `llm` figures of `engine.stats` and the
//! `pyvisor_llm_*` metrics (docs/metrics.md).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::client::{Completion, LlmError};

/// Calls of every model together.
pub const CALLS_TOTAL: &str = "pyvisor_llm_calls_total";
/// Tokens, by model and direction (`input`, `output`).
pub const TOKENS_TOTAL: &str = "pyvisor_llm_tokens_total";
/// Dollars, by model: a gauge that only grows.
pub const COST_DOLLARS_TOTAL: &str = "pyvisor_llm_cost_dollars_total";
/// Time of one completion, retries included.
pub const CALL_SECONDS: &str = "pyvisor_llm_call_seconds";

/// Running totals, shared by the bridge and the task loops.
#[derive(Debug, Default)]
pub struct LlmCounters {
    calls: AtomicU64,
    errors: AtomicU64,
    refused: AtomicU64,
    retries: AtomicU64,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    cost: Mutex<f64>,
}

/// The `llm` figures of `engine.stats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmStats {
    /// Completions requested (one per prompt), answered or not.
    pub calls: u64,
    /// Completions that failed after their retries.
    pub errors: u64,
    /// Bridge calls refused before any request (`max_pending`).
    pub refused: u64,
    /// Requests sent again after a 429, a 5xx or an unreachable endpoint.
    pub retries: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Dollars, from `[llm.prices]`.
    pub cost: f64,
}

impl LlmCounters {
    /// Counts one completion of `kind` (`llm`, `llm_batched`, `transform`, …).
    pub fn record(&self, kind: &'static str, outcome: &Result<Completion, LlmError>) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let Ok(done) = outcome else {
            self.errors.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let model = done.model.clone();
        self.retries.fetch_add(
            u64::from(done.attempts.saturating_sub(1)),
            Ordering::Relaxed,
        );
        self.input_tokens
            .fetch_add(done.usage.input_tokens, Ordering::Relaxed);
        self.output_tokens
            .fetch_add(done.usage.output_tokens, Ordering::Relaxed);
        *self.cost.lock().unwrap_or_else(|e| e.into_inner()) += done.cost;
        metrics::counter!(CALLS_TOTAL, "model" => model.clone(), "kind" => kind).increment(1);
        metrics::counter!(TOKENS_TOTAL, "model" => model.clone(), "direction" => "input")
            .increment(done.usage.input_tokens);
        metrics::counter!(TOKENS_TOTAL, "model" => model.clone(), "direction" => "output")
            .increment(done.usage.output_tokens);
        // A float that only grows: the metrics crate's counters count integers.
        metrics::gauge!(COST_DOLLARS_TOTAL, "model" => model).increment(done.cost);
        metrics::histogram!(CALL_SECONDS).record(done.duration.as_secs_f64());
    }

    /// Counts a bridge call refused before any request.
    pub fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// The totals so far.
    pub fn snapshot(&self) -> LlmStats {
        LlmStats {
            calls: self.calls.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            input_tokens: self.input_tokens.load(Ordering::Relaxed),
            output_tokens: self.output_tokens.load(Ordering::Relaxed),
            cost: *self.cost.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }
}

/// Describes the `pyvisor_llm_*` metrics to the installed recorder.
#[cfg(feature = "server")]
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(CALLS_TOTAL, "LLM completions requested, by model and kind.");
    describe_counter!(TOKENS_TOTAL, "LLM tokens, by model and direction.");
    describe_gauge!(COST_DOLLARS_TOTAL, "LLM cost in dollars so far, by model.");
    describe_histogram!(
        CALL_SECONDS,
        Unit::Seconds,
        "Time of one LLM completion, retries included."
    );
}
