//! Proactive memory: the engine remembers what happened when code ran (per owner, across
//! sessions and restarts), recognises code about to repeat an approach that already failed,
//! and says so on the result, with evidence and what worked instead, within a budget.
//!
//! [`Memory`] is shared by the sessions (which record each outcome and check each execution
//! against the in-memory index on their own thread, so the check never waits for anything),
//! the [`MemoryActor`] (which follows the session event stream for what comes after a result:
//! the names a cell read, closed sessions) and the engine's API. Outcomes persist through an
//! [`OutcomeStore`] on a thread of its own; a store several engines share is followed by
//! another thread, which takes in what the other engines recorded.

mod actor;
mod api;
mod core;
mod detect;
mod embed;
mod follow;
mod index;
mod loading;
mod normalize;
mod policy;
mod statements;
mod store;
mod writer;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use metrics::{counter, histogram};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

pub use actor::MemoryActor;
pub use core::now_ms;
pub use embed::{call_signature, code_shape, mentioned_names, normalize, Embedder, LocalEmbedder};
pub use normalize::normalize_message;
pub use policy::PolicyConfig;
pub use statements::failing_line;
pub use store::{
    Changes, ExecutionMeta, FeedbackRecord, InterruptionRecord, Loaded, OutcomeRecord,
    OutcomeStore, PatternRecord, SqliteStore, StoreError, StoreFailure, Write,
};

/// A store opened, or why it could not be.
pub type Opened = Result<Box<dyn OutcomeStore>, StoreError>;

use crate::execution::ExecutionStatus;
use detect::{detect, Patterns, Query};
use follow::follow;
use index::{quantize, Entry, Index, Probe};
use policy::SessionPolicy;
use writer::{Health, Writer};

pub const INTERRUPTIONS_TOTAL: &str = "pyvisor_memory_interruptions_total";
pub const OUTCOMES_TOTAL: &str = "pyvisor_memory_outcomes_total";
pub const CHECK_SECONDS: &str = "pyvisor_memory_check_seconds";

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory")
            .field("config", &self.config)
            .field("embedder", &self.embedder.name())
            .finish_non_exhaustive()
    }
}

/// Describes the memory's metrics to the installed recorder, starting counters at zero.
pub(crate) fn describe() {
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_counter!(
        INTERRUPTIONS_TOTAL,
        "Insights shown on results (interruptions of the caller)."
    );
    describe_counter!(OUTCOMES_TOTAL, "Execution outcomes remembered, by status.");
    describe_histogram!(
        CHECK_SECONDS,
        Unit::Seconds,
        "Time to check code against earlier failures."
    );
    counter!(INTERRUPTIONS_TOTAL).increment(0);
    for status in ["ok", "error", "timeout", "interrupted", "crashed"] {
        counter!(OUTCOMES_TOTAL, "status" => status).increment(0);
    }
}

/// Longest code kept in memory as "what worked".
const MAX_FIX_CHARS: usize = 400;
/// Longest original error message kept in memory.
const MAX_MESSAGE_CHARS: usize = 300;
/// Executions remembered by (session, execution id), for facts that come after the result.
const RECENT: usize = 4096;
/// Outcomes over `max_outcomes` tolerated before a prune, so pruning happens in batches.
const PRUNE_SLACK: usize = 256;

/// The settings of the memory (`[memory]`).
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryConfig {
    /// Most outcomes kept; the oldest go first.
    pub max_outcomes: u64,
    /// Outcomes older than this are dropped; kept forever when `None`.
    pub max_age: Option<Duration>,
    /// Least cosine similarity between code and an earlier failure's code.
    pub threshold: f64,
    pub policy: PolicyConfig,
    /// The store's file; outcomes live in memory only when `None`.
    pub path: Option<PathBuf>,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            max_outcomes: 1_000_000,
            max_age: None,
            threshold: 0.85,
            policy: PolicyConfig::default(),
            path: None,
        }
    }
}

/// An insight on a result (docs/protocol.md `insights`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Insight {
    /// `i-N` when it was shown on a result; `p-N` (the pattern) from a check.
    pub id: String,
    /// Always `failure_pattern` for now.
    pub kind: String,
    pub confidence: f64,
    pub message: String,
    pub suggestion: Option<String>,
    /// Ids (`m-N`) of the earlier failures it rests on.
    pub evidence: Vec<String>,
}

/// One execution as the memory takes it in.
#[derive(Debug, Clone)]
pub struct OutcomeDraft {
    pub owner: Arc<str>,
    pub session_id: Arc<str>,
    pub execution_id: String,
    /// The execution's count in its session (from 1).
    pub execution_count: u64,
    pub code: String,
    pub status: ExecutionStatus,
    /// Error type and message.
    pub error: Option<(String, String)>,
    /// The line of the code that raised ([`failing_line`] of the traceback).
    pub failing_line: Option<u32>,
    pub duration_ms: f64,
    pub meta: Option<ExecutionMeta>,
}

/// What feedback is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedbackTarget {
    /// `i-N`: an insight shown on a result.
    Insight(i64),
    /// `m-N`: an outcome (a failure: its pattern; an execution that carried an insight).
    Outcome(i64),
}

/// Why the memory refused a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    #[error("unknown insight or outcome {0}")]
    Unknown(String),
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

/// An outcome found by [`Memory::search`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FoundOutcome {
    pub id: String,
    pub score: f64,
    pub owner: String,
    pub session_id: String,
    pub execution_id: Option<String>,
    pub status: Option<String>,
    pub code: Option<String>,
    pub error: Option<FoundError>,
    pub meta: Option<ExecutionMeta>,
    pub at_ms: Option<i64>,
}

/// The error of a found outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FoundError {
    #[serde(rename = "type")]
    pub type_name: String,
    pub message: String,
    pub normalized: String,
}

/// `memory.stats`: counts since the store began, figures since the engine started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MemoryStats {
    pub enabled: bool,
    pub outcomes: u64,
    pub failures: u64,
    pub patterns: u64,
    /// Patterns that still fire (not marked wrong twice).
    pub active_patterns: u64,
    pub checks: u64,
    /// Failing executions recorded since the engine started.
    pub failing_executions: u64,
    pub interruptions: u64,
    /// Interruptions per failing execution since the engine started.
    pub interruption_rate: f64,
    pub feedback: FeedbackCounts,
    /// Where outcomes persist; `null` when only in memory.
    pub store: Option<String>,
    /// Why memory runs without (part of) its store, once it does.
    pub warning: Option<String>,
    /// The embedder's name (and version).
    pub embedder: String,
    /// Texts the embedder could not embed (a remote one that failed or timed out).
    pub embedder_errors: u64,
}

/// Feedback received since the engine started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FeedbackCounts {
    pub helpful: u64,
    pub neutral: u64,
    pub wrong: u64,
}

/// Per-owner figures since the engine started.
#[derive(Debug, Clone, Default)]
struct Figures {
    checks: u64,
    failing: u64,
    interruptions: u64,
    feedback: FeedbackCounts,
}

/// Recent executions by (session, execution id), with their owner and outcome id, for what
/// arrives after their result; oldest first in `order`.
#[derive(Default)]
struct Recent {
    by_key: HashMap<(Arc<str>, String), (Arc<str>, i64)>,
    order: VecDeque<(Arc<str>, String)>,
}

/// An insight that was shown: whose, its pattern, and the outcome of the execution that
/// carried it (once recorded).
struct Shown {
    owner: Arc<str>,
    pattern: u32,
    outcome: Option<i64>,
}

/// What the index and the patterns hold, under one lock.
struct Knowledge {
    index: Index,
    patterns: Patterns,
    /// The latest outcome of each session: whether it failed.
    last_failed: HashMap<Arc<str>, bool>,
}

/// The memory of one engine.
pub struct Memory {
    config: MemoryConfig,
    embedder: Arc<dyn Embedder>,
    knowledge: RwLock<Knowledge>,
    sessions: Mutex<HashMap<Arc<str>, SessionPolicy>>,
    recent: Mutex<Recent>,
    interruptions: Mutex<HashMap<i64, Shown>>,
    figures: Mutex<HashMap<Arc<str>, Figures>>,
    next_outcome: AtomicI64,
    next_interruption: AtomicI64,
    health: Arc<Health>,
    /// Where the store is, while its thread runs.
    store: Option<String>,
    reader: Option<Mutex<Box<dyn OutcomeStore>>>,
    // Declared last: dropped last, so that everything queued is written before it goes.
    writer: Option<Writer>,
}
