//! Settings of an embedded engine, with the defaults of docs/config.md; the daemon's TOML
//! configuration is read in `file` and mapped onto them in `resolve` (with the `server` feature).

#[cfg(feature = "server")]
mod file;
#[cfg(feature = "server")]
mod resolve;

#[cfg(feature = "server")]
pub use file::LimitCeilings;
#[cfg(feature = "server")]
pub use resolve::http_addr;

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pyvisor_actors::checkpoint::{
    DEFAULT_RETENTION, DEFAULT_SESSION_DISK_BYTES, DEFAULT_TOTAL_DISK_BYTES,
};
use pyvisor_actors::memory::{Opened, PolicyConfig};
use pyvisor_actors::pool::PoolConfig;
use pyvisor_actors::session::AutoCheckpoint;
use pyvisor_actors::supervisor::Quotas;
use pyvisor_actors::SessionLimits;
use pyvisor_protocol::DEFAULT_MAX_FRAME_BYTES;

#[cfg(feature = "server")]
pub use file::{
    EngineSettings, LimitSettings, LlmSettings, LoadContext, Loaded, MemorySettings, ModelSettings,
    Origin, PoolSettings, ProactiveSettings, SandboxSettings, ServerSettings, Settings,
    StateSettings, TokenSettings,
};

/// How an [`crate::Engine`] runs its workers.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Python interpreter of the pool's workers: a name on `PATH` or a path. Resolved once
    /// to the real binary.
    pub python: String,
    /// Sizes of the pool of ready workers.
    pub pool: PoolConfig,
    /// Modules every worker has imported before it counts as ready (e.g. `pandas`).
    pub preload: Vec<String>,
    /// Fork workers from a zygote process that has `preload` imported, instead of starting
    /// each interpreter from scratch (plain spawns remain the fallback).
    pub zygote: bool,
    /// Default limits of every session.
    pub limits: SessionLimits,
    /// Where the worker package is installed; `$XDG_CACHE_HOME/pyvisor` when `None`.
    pub cache_dir: Option<PathBuf>,
    /// How long a new worker may take to become ready.
    pub handshake_timeout: Duration,
    /// Largest protocol frame accepted from a worker.
    pub max_frame_bytes: usize,
    /// Threads that host session actors.
    pub arbiters: usize,
    /// Contain each worker in a cgroup leaf when the host allows it (else rlimits only).
    pub use_cgroups: bool,
    /// Where and how sessions keep checkpoints.
    pub state: StateConfig,
    /// Computing ahead of sessions' requests while they are idle.
    pub proactive: ProactiveConfig,
    /// Sessions per owner, and when an unused session is checkpointed and closed.
    pub quotas: Quotas,
    /// How workers are confined. All off by default: an embedded engine runs session code
    /// as the user who embeds it; set `uid_range` (as root) to separate the sessions.
    pub sandbox: SandboxConfig,
    /// Remembering execution outcomes and warning before a known failure repeats.
    pub memory: MemoryConfig,
    /// The LLM endpoint that sessions' bridge calls and task loops use; none when `None`.
    pub llm: Option<LlmConfig>,
    /// The bridge of sessions whose client answers their code's LLM calls (`llm: "client"`).
    pub client_llm: ClientLlmConfig,
}

/// The client-answered bridge (`[llm] client_timeout_s`, `batch_window_ms`): needs no
/// endpoint, so it works without `[llm] base_url`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientLlmConfig {
    /// Longest wait for the client's answer to one call; the call then raises `LlmError`.
    pub timeout: Duration,
    /// Calls that arrive within this window of the first are sent to clients together.
    pub batch_window: Duration,
}

impl Default for ClientLlmConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(300),
            batch_window: Duration::from_millis(10),
        }
    }
}

/// Worker confinement (docs/security.md): each worker's own uid, Landlock, seccomp, network.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxConfig {
    /// Give every worker its own uid (and gid) from this range; needs root.
    pub uid_range: Option<RangeInclusive<u32>>,
    /// Restrict each worker's file access with Landlock.
    pub landlock: bool,
    /// Install the seccomp filter in each worker.
    pub seccomp: bool,
    /// Whether sessions may open internet sockets unless they say otherwise.
    pub network: bool,
    /// Paths every worker may read besides the defaults (Landlock).
    pub read_paths: Vec<PathBuf>,
    /// Layers whose absence makes the engine refuse to start.
    pub require: Vec<SandboxLayer>,
    /// Where the workers' private directories go; `/run/pyvisor/sandbox` as root, else
    /// `sandbox` in the cache directory, when `None`.
    pub dir: Option<PathBuf>,
}

impl Default for SandboxConfig {
    /// Every layer off, network on.
    fn default() -> Self {
        Self {
            uid_range: None,
            landlock: false,
            seccomp: false,
            network: true,
            read_paths: Vec::new(),
            require: Vec::new(),
            dir: None,
        }
    }
}

/// A confinement layer that `[sandbox] require` can insist on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxLayer {
    Landlock,
    Seccomp,
    Uid,
}

impl SandboxLayer {
    /// The layer of a `require` name.
    pub fn from_name(name: &str) -> Option<SandboxLayer> {
        match name {
            "landlock" => Some(SandboxLayer::Landlock),
            "seccomp" => Some(SandboxLayer::Seccomp),
            "uid" => Some(SandboxLayer::Uid),
            _ => None,
        }
    }
}

/// Proactive memory: outcomes remembered per owner (in `memory.db` of the state directory,
/// or in memory only without one), and insights on results that repeat a known failure.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryConfig {
    pub enabled: bool,
    /// Most outcomes kept; the oldest go first.
    pub max_outcomes: u64,
    /// Outcomes older than this are dropped; kept until `max_outcomes` pushes them out when
    /// `None`.
    pub max_age: Option<Duration>,
    /// Least similarity between code and an earlier failure's code.
    pub threshold: f64,
    /// When an insight may interrupt: confidence, failures, budget, spacing.
    pub policy: PolicyConfig,
    /// Where code is turned into vectors: the local hashing embedder when `None`.
    pub embedder: Option<RemoteEmbedderConfig>,
    /// A store the engines of a cluster share, in place of `memory.db` in the state
    /// directory (set from `[cluster]` by the daemon).
    pub shared: Option<SharedMemoryStore>,
}

/// Opens a connection to a memory store that several engines share; each engine's memory
/// opens three (to write, to read, to follow what the others write).
#[derive(Clone)]
pub struct SharedMemoryStore(pub Arc<dyn Fn() -> Opened + Send + Sync>);

impl std::fmt::Debug for SharedMemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedMemoryStore")
    }
}

impl PartialEq for SharedMemoryStore {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// An OpenAI-compatible embeddings endpoint for memory's similarity (`[memory.embedder]`).
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteEmbedderConfig {
    /// The API's base, e.g. `https://api.openai.com/v1`; requests go to `{base_url}/embeddings`.
    pub base_url: String,
    pub model: String,
    /// The engine's environment variable that holds the API key (sent as a bearer token);
    /// no key is sent when `None`.
    pub api_key_env: Option<String>,
    /// Asked of models that can shorten their vectors; checked against the answer.
    pub dimensions: Option<u32>,
    /// Longest wait for one request; code not embedded in time matches nothing.
    pub timeout: Duration,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        let defaults = pyvisor_actors::memory::MemoryConfig::default();
        Self {
            enabled: true,
            max_outcomes: defaults.max_outcomes,
            max_age: defaults.max_age,
            threshold: defaults.threshold,
            policy: defaults.policy,
            embedder: None,
            shared: None,
        }
    }
}

/// An OpenAI-compatible chat completions endpoint (`[llm]`, docs/config.md).
#[derive(Debug, Clone, PartialEq)]
pub struct LlmConfig {
    /// The API's base, e.g. `https://api.openai.com/v1`; requests go to
    /// `{base_url}/chat/completions`.
    pub base_url: String,
    /// The model of calls that name none.
    pub model: String,
    /// The engine's environment variable that holds the API key (sent as a bearer token);
    /// no key is sent when `None`.
    pub api_key_env: Option<String>,
    /// Longest wait for one attempt of one call.
    pub timeout: Duration,
    /// Attempts after the first when the endpoint answers 429 or 5xx or cannot be reached.
    pub max_retries: u32,
    /// Whether sessions that do not say get the bridge (`llm_query` and its kin).
    pub sessions: bool,
    /// Bridge calls that arrive within this window of the first are sent together.
    pub batch_window: Duration,
    /// Requests in flight at once, for the whole engine.
    pub max_concurrency: usize,
    /// Requests in flight at once for one session, so that one session cannot hold them all.
    pub session_concurrency: usize,
    /// Most prompts one session may have waiting or in flight; more are refused.
    pub max_pending: usize,
    /// Dollars per million tokens, by model id; a model without a price costs nothing.
    pub prices: BTreeMap<String, Price>,
    /// Other models that calls may name, by name: the model id each stands for.
    pub models: BTreeMap<String, String>,
    /// The RLM task loop's defaults.
    pub rlm: RlmConfig,
}

/// The RLM task loop's defaults (`[llm.rlm]`, read as they are here).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RlmConfig {
    /// Model replies of a task that states no `max_iterations`.
    pub max_iterations: u32,
    /// Nesting of `rlm_query` of a task that states no `max_depth`.
    pub max_depth: u32,
    /// The share of its parent's remaining cost and iterations a sub-loop gets.
    pub sub_share: f64,
    /// Below this many dollars left (with a cost limit), `rlm_query` runs as `llm_query`.
    pub downgrade_below_cost: f64,
    /// Below this many iterations left, `rlm_query` runs as `llm_query`.
    pub downgrade_below_iterations: u32,
    /// The most characters of one code block's output fed back to the model.
    pub output_chars: usize,
}

impl Default for RlmConfig {
    fn default() -> Self {
        Self {
            max_iterations: 20,
            max_depth: 2,
            sub_share: 0.5,
            downgrade_below_cost: 0.5,
            downgrade_below_iterations: 5,
            output_chars: 4000,
        }
    }
}

impl LlmConfig {
    /// A configuration for `model` at `base_url`, with the other defaults of docs/config.md.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key_env: None,
            timeout: Duration::from_secs(120),
            max_retries: 3,
            sessions: false,
            batch_window: Duration::from_millis(10),
            max_concurrency: 16,
            session_concurrency: 4,
            max_pending: 256,
            prices: BTreeMap::new(),
            models: BTreeMap::new(),
            rlm: RlmConfig::default(),
        }
    }
}

/// What a model's tokens cost, in dollars per million.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

/// Proactive computation: predicting each idle session's next code, running it in a fork of
/// its worker, and answering from that result when, and only when, a real run would answer
/// the same.
#[derive(Debug, Clone, PartialEq)]
pub struct ProactiveConfig {
    /// Whether a session that does not say is proactive.
    pub enabled: bool,
    /// Share of one core that speculation may use over time, for the whole engine.
    pub cpu_budget: f64,
    /// Bytes of speculative answers held at most, for the whole engine.
    pub cache_bytes: u64,
    /// Start no speculation while the machine has more runnable threads than CPUs.
    pub yield_to_load: bool,
}

impl Default for ProactiveConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            cpu_budget: 0.1,
            cache_bytes: 100 * 1024 * 1024,
            yield_to_load: true,
        }
    }
}

/// Checkpoint settings: where they live, how many, how big, and when they are taken.
#[derive(Debug, Clone)]
pub struct StateConfig {
    /// Keep checkpoints at all. Without them a crashed worker comes back empty.
    pub enabled: bool,
    /// The state directory; `$XDG_STATE_HOME/pyvisor` (else `~/.local/state/pyvisor`) when
    /// `None`.
    pub dir: Option<PathBuf>,
    /// Checkpoints kept per session, newest first. They share the blobs of unchanged groups
    /// of names, so many cost little more than one.
    pub retention: usize,
    /// Largest state one checkpoint of a session may hold; the session's memory limit when
    /// `None`. A larger one is not saved, and every result says so.
    pub max_bytes: Option<u64>,
    /// What one session's checkpoints may take on disk; the oldest are pruned to stay below.
    pub session_disk_bytes: u64,
    /// What the checkpoints of all sessions may take on disk.
    pub total_disk_bytes: u64,
    /// When sessions checkpoint by themselves.
    pub auto: AutoCheckpoint,
}

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            dir: None,
            retention: DEFAULT_RETENTION.get(),
            max_bytes: None,
            session_disk_bytes: DEFAULT_SESSION_DISK_BYTES,
            total_disk_bytes: DEFAULT_TOTAL_DISK_BYTES,
            auto: AutoCheckpoint::default(),
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            python: "python3".into(),
            pool: PoolConfig::default(),
            preload: Vec::new(),
            zygote: true,
            limits: SessionLimits::default(),
            cache_dir: None,
            handshake_timeout: Duration::from_secs(10),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            arbiters: std::thread::available_parallelism()
                .map(|n| n.get().min(4))
                .unwrap_or(1),
            use_cgroups: true,
            state: StateConfig::default(),
            proactive: ProactiveConfig::default(),
            quotas: Quotas::default(),
            sandbox: SandboxConfig::default(),
            memory: MemoryConfig::default(),
            llm: None,
            client_llm: ClientLlmConfig::default(),
        }
    }
}

impl EngineConfig {
    /// The cache directory in force: the configured one or the XDG default.
    pub fn cache_dir(&self) -> PathBuf {
        if let Some(dir) = &self.cache_dir {
            return dir.clone();
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
        base.join("pyvisor")
    }
}
