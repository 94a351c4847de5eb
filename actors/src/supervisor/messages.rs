//! The settings of a [`super::RegistryActor`], the messages it accepts and what it answers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix::prelude::*;

use crate::bridge::LlmBridge;
use crate::checkpoint::CheckpointStore;
use crate::errors::SupervisorError;
use crate::limits::SessionLimits;
use crate::memory::Memory;
use crate::metrics::EngineCounters;
use crate::pool::{PoolConfig, PoolStats};
use crate::proactive::cache::CacheLimits;
use crate::proactive::predictor::{PredictorActor, PredictorConfig};
use crate::proactive::stats::ProactiveCounters;
use crate::session::{AutoCheckpoint, SessionActor};
use crate::worker::{WorkerInfo, WorkerSpec};

/// Defaults every new session starts from.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// How to start a worker; per-session options are applied on top.
    pub worker: WorkerSpec,
    /// Default limits of a session.
    pub limits: SessionLimits,
    /// Arbiter threads that host session actors and run spawns.
    pub arbiters: usize,
    pub pool: PoolConfig,
    /// Totals shared with the caller for `engine.stats`.
    pub counters: Arc<EngineCounters>,
    /// Where sessions keep checkpoints; none are kept when `None`.
    pub state: Option<StateOptions>,
    /// Proactive computation (prediction, speculation, the cache).
    pub proactive: ProactiveOptions,
    /// What one owner may hold, and when an unused session is closed.
    pub quotas: Quotas,
    /// The memory of outcomes every session records to and checks against; off when `None`.
    pub memory: Option<Arc<Memory>>,
    /// What answers the LLM calls of sessions' code; no session has the bridge when `None`.
    pub llm: Option<LlmOptions>,
}

/// The LLM bridge of sessions.
#[derive(Clone)]
pub struct LlmOptions {
    pub bridge: Arc<dyn LlmBridge>,
    /// Whether a session that does not say gets the bridge.
    pub by_default: bool,
}

impl std::fmt::Debug for LlmOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmOptions")
            .field("by_default", &self.by_default)
            .finish_non_exhaustive()
    }
}

/// Bounds on what sessions hold over time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quotas {
    /// Live sessions one owner may have at once (sessions without an owner are not counted);
    /// unbounded when `None`.
    pub max_sessions_per_owner: Option<usize>,
    /// Checkpoint and close a session after this long without activity; never when `None`.
    pub idle_timeout: Option<Duration>,
}

/// How the engine computes ahead of its sessions' requests.
#[derive(Debug, Clone)]
pub struct ProactiveOptions {
    /// Whether a session that does not say is proactive.
    pub by_default: bool,
    pub predictor: PredictorConfig,
    pub cache: CacheLimits,
    /// Totals shared with the caller for `engine.stats`.
    pub counters: Arc<ProactiveCounters>,
}

impl Default for ProactiveOptions {
    fn default() -> Self {
        Self {
            by_default: true,
            predictor: PredictorConfig::default(),
            cache: CacheLimits::default(),
            counters: Arc::default(),
        }
    }
}

/// The checkpoint settings every session gets.
#[derive(Debug, Clone)]
pub struct StateOptions {
    pub store: CheckpointStore,
    pub policy: AutoCheckpoint,
    /// Directory where workers write the blob files of checkpoints for the store.
    pub scratch: PathBuf,
    /// The largest state a session's checkpoint may hold; the session's memory limit when
    /// `None`.
    pub max_bytes: Option<u64>,
}

/// What a caller may choose about a new session.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// A name to find the session by; creating a session under an existing name attaches
    /// to that session instead.
    pub name: Option<String>,
    /// Who the session belongs to; a caller that states an owner reaches only its own.
    pub owner: Option<String>,
    /// Interpreter of the worker; the engine's when `None`.
    pub python: Option<Interpreter>,
    /// Working directory of the worker.
    pub cwd: Option<PathBuf>,
    /// Extra environment variables of the worker.
    pub env: Vec<(String, String)>,
    /// Limits replacing the engine defaults.
    pub limits: Option<SessionLimits>,
    /// Whether the engine computes ahead of this session's requests; the engine's default
    /// when `None`.
    pub proactive: Option<bool>,
    /// Whether the worker may open internet sockets; the engine's `[sandbox] network` when
    /// `None`.
    pub network: Option<bool>,
    /// Whether the session's code gets `llm_query` and its kin; the engine's `[llm] sessions`
    /// when `None`.
    pub llm: Option<bool>,
    /// A bridge of this session's own, which answers its code's LLM calls in place of the
    /// engine's (the session gets the functions whatever `llm` says).
    pub bridge: Option<crate::bridge::SessionBridge>,
    /// The session's code gets `llm_query` and its kin, answered by the client that started
    /// the running execution ([`crate::ExecuteRequest::llm`]) instead of by the engine.
    pub llm_by_client: bool,
    /// The id of a session this engine takes over from another engine that shared its
    /// checkpoints (a cluster's failover): the session keeps that id instead of getting a new
    /// one, and restores the newest checkpoint its key has in the store before it runs
    /// anything. A live session with that id is returned as it is.
    pub take_over: Option<String>,
}

/// A Python interpreter other than the engine's, with the worker package it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    /// The resolved interpreter binary.
    pub python: PathBuf,
    /// The installed worker package, compiled for this interpreter.
    pub script: PathBuf,
}

/// Create a session (or attach to the one of that name) with a worker from the pool.
#[derive(Message)]
#[rtype(result = "Result<SessionHandle, SupervisorError>")]
pub struct CreateSession {
    pub options: SessionOptions,
}

/// Find a live session by id or name. With an `owner`, only that owner's sessions match.
#[derive(Message)]
#[rtype(result = "Result<SessionHandle, SupervisorError>")]
pub struct FindSession {
    pub session: String,
    pub owner: Option<String>,
}

/// A live session as the supervisor knows it.
#[derive(Debug, Clone)]
pub struct SessionHandle {
    pub session_id: String,
    pub name: Option<String>,
    pub owner: Option<String>,
    pub addr: Addr<SessionActor>,
    pub created_at: SystemTime,
    /// Whether its first worker came ready from the pool.
    pub warm: bool,
    /// Whether this handle came from a create that found the name taken by this session.
    pub attached: bool,
    /// The worker it was created with; only known to the create that made it.
    pub worker: Option<WorkerInfo>,
    /// Whether the create found the session's checkpoints on disk (left by an earlier
    /// engine) and the session restores the latest before it runs anything.
    pub restored: bool,
    /// The predictor following the session, when it is proactive (takes its hints).
    pub predictor: Option<Addr<PredictorActor>>,
    /// The registry the session is in, for what concerns more than the session (a fork).
    pub registry: Addr<super::RegistryActor>,
}

/// Every live session, or an owner's.
#[derive(Message)]
#[rtype(result = "Vec<SessionHandle>")]
pub struct ListSessions {
    pub owner: Option<String>,
}

/// The supervisor's figures: the pool's and the number of sessions.
#[derive(Message)]
#[rtype(result = "Result<SupervisorStats, SupervisorError>")]
pub struct GetStats;

/// What [`GetStats`] answers.
#[derive(Debug, Clone)]
pub struct SupervisorStats {
    pub pool: PoolStats,
    pub sessions: usize,
}

/// Graceful stop: refuse new sessions and executions, let running executions finish for
/// up to `grace`, then end every worker. Replies when all are gone.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopAll {
    pub grace: Duration,
    /// Take a last checkpoint of every session before its worker ends.
    pub checkpoint: bool,
}
