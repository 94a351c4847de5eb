//! The JSON shapes of docs/protocol.md: the params and results of every method and the streamed
//! notifications. The server decodes params and encodes results with these types, and
//! [`crate::client`] does the reverse, so both ends agree by construction.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::{
    ExecutionMeta, LostName, MemoryStats, OutputStream, PoolStats, ProactiveStats, Transaction,
};

/// `session.create` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Interpreter of this session's worker; the engine's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitParams>,
    /// Compute ahead of this session's requests; the engine's `[proactive] enabled` when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proactive: Option<bool>,
    /// Whether the session may open internet sockets; the engine's `[sandbox] network` when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<bool>,
    /// Give the session's code `llm_query` and its kin (`true`: answered by the engine's
    /// `[llm]`, `"client"`: by the client that runs each execution); the engine's
    /// `[llm] sessions` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<LlmChoice>,
}

/// `session.create`'s `llm`: `true`, `false`, or `"client"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlmChoice {
    /// `true` or `false`: the engine's bridge, or none.
    Engine(bool),
    /// `"client"`: the client connection that started the running execution answers.
    Client,
}

impl Serialize for LlmChoice {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            LlmChoice::Engine(on) => serializer.serialize_bool(*on),
            LlmChoice::Client => serializer.serialize_str("client"),
        }
    }
}

impl<'de> Deserialize<'de> for LlmChoice {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Choice;
        impl serde::de::Visitor<'_> for Choice {
            type Value = LlmChoice;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("true, false or \"client\"")
            }
            fn visit_bool<E: serde::de::Error>(self, on: bool) -> Result<LlmChoice, E> {
                Ok(LlmChoice::Engine(on))
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<LlmChoice, E> {
                match text {
                    "client" => Ok(LlmChoice::Client),
                    other => Err(E::invalid_value(serde::de::Unexpected::Str(other), &self)),
                }
            }
        }
        deserializer.deserialize_any(Choice)
    }
}

/// `bridge.llm` params: a call of session code that the client answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BridgeLlmParams {
    pub session_id: String,
    pub execution_id: String,
    /// Also the request's JSON-RPC id, and what `bridge.cancel` names.
    pub call_id: String,
    pub kind: pyvisor_protocol::LlmCallKind,
    pub prompts: Vec<String>,
    /// Nesting of the session's loop: 0 for a session a client created.
    pub depth: u32,
    /// The model name the code asked for, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The `ctx` of an `rlm_query`, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<serde_json::Value>,
}

/// The client's result of `bridge.llm`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeLlmAnswers {
    /// One answer per prompt, in order.
    pub answers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<BridgeUsage>,
}

/// What the client says its answers used, for the engine's accounting.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Dollars; 0 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}

/// `bridge.cancel` params: the client may stop working on `call_id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BridgeCancelParams {
    pub call_id: String,
}

/// Per-session limits of `session.create`; absent ones keep the engine's defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u64>,
}

/// `session.create` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Created {
    pub session_id: String,
    pub pid: Option<u32>,
    pub python_version: Option<String>,
    /// Whether the session's worker came from the pre-warmed pool.
    pub warm: bool,
    /// Whether `name` was taken and this is that existing session.
    #[serde(default)]
    pub attached: bool,
    /// Whether the session came back from checkpoints an earlier daemon left on disk.
    #[serde(default)]
    pub restored: bool,
}

/// `session.execute` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecuteParams {
    pub session_id: String,
    pub code: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// Send `session.output`/`session.input_request`/`session.display` notifications
    /// before the response, and forward `input()` to the client.
    #[serde(default)]
    pub stream: bool,
    /// With `stream`, whether the result repeats the streamed stdout and stderr (default);
    /// `false` leaves them empty in the result, so each byte crosses the wire once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_echo: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transaction: Option<Transaction>,
    /// Wait behind a running execution (default) or fail with "session busy".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<bool>,
    /// Whether a speculative answer may serve it (default); `false` runs it for real.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<bool>,
    /// What the caller says about the code, remembered with its outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<ExecutionMeta>,
}

impl ExecuteParams {
    /// Params that run `code` in `session_id` with every option at its default.
    pub fn new(session_id: impl Into<String>, code: impl Into<String>) -> Self {
        Self {
            session_id: session_id.into(),
            code: code.into(),
            timeout_s: None,
            stream: false,
            stream_echo: None,
            transaction: None,
            queue: None,
            cache: None,
            meta: None,
        }
    }
}

/// Params of the methods that only name a session (`session.interrupt`, `.checkpoint`,
/// `.checkpoints`, `.info`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRef {
    pub session_id: String,
}

/// `session.fork` params: `count` clones (1 when absent; the number of `names` when they
/// are given).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkParams {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub names: Option<Vec<String>>,
}

/// One clone of `session.fork`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkedSession {
    pub session_id: String,
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `session.fork` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkResult {
    pub sessions: Vec<ForkedSession>,
    pub duration_ms: f64,
    /// Threads of the source's code that were running at the fork; none runs in a clone.
    #[serde(default)]
    pub threads: u32,
}

/// `session.input` params: the answer to a pending `input()`; `null` raises `EOFError`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputParams {
    pub session_id: String,
    pub execution_id: String,
    pub value: Option<String>,
}

/// `session.interrupt` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interrupted {
    /// False when nothing was running.
    pub interrupted: bool,
}

/// `session.checkpoint` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointTaken {
    pub checkpoint_id: String,
    /// Bytes the checkpoint added to the disk (its file and the blobs of changed groups).
    pub bytes: u64,
    /// Bytes of all the state the checkpoint holds, shared with earlier checkpoints or not.
    #[serde(default)]
    pub state_bytes: u64,
    pub saved: Vec<String>,
    pub lost: Vec<LostName>,
    pub duration_ms: f64,
}

/// `session.restore` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreParams {
    pub session_id: String,
    /// The latest checkpoint when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_id: Option<String>,
}

/// `session.restore` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Restored {
    pub checkpoint_id: String,
    pub restored: Vec<String>,
    /// Names the worker held unchanged since that checkpoint, left as they were.
    #[serde(default)]
    pub kept: Vec<String>,
    pub lost: Vec<LostName>,
}

/// One entry of `session.checkpoints`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointEntry {
    pub checkpoint_id: String,
    /// Seconds since the Unix epoch.
    pub created_at: f64,
    /// Size of the checkpoint file.
    pub bytes: u64,
    /// Bytes of the state it holds, in blobs it may share with other checkpoints.
    #[serde(default)]
    pub state_bytes: u64,
    /// Execution count of the session when it was taken.
    pub execution_count: u64,
    pub saved: Vec<String>,
    pub lost: Vec<LostName>,
}

/// `session.info` result, and each entry of `session.list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub session_id: String,
    pub name: Option<String>,
    pub owner: Option<String>,
    pub pid: Option<u32>,
    /// `idle`, `busy` or `restarting`.
    pub state: String,
    pub execution_count: u64,
    pub variables: Vec<VariableInfo>,
    pub rss_bytes: Option<u64>,
    /// Seconds since the Unix epoch.
    pub created_at: f64,
    pub last_checkpoint: Option<String>,
    pub durability: Durability,
    /// CPU seconds used by the session's current worker and its children (its cgroup);
    /// absent without cgroup CPU accounting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_s: Option<f64>,
    /// The session's share of `engine.stats` `proactive` (`cache_bytes` is 0) and what is
    /// computed ahead of it now; absent when the session is not proactive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proactive: Option<SessionProactive>,
    /// How the session's worker is confined (docs/security.md).
    #[serde(default)]
    pub sandbox: SandboxInfo,
    /// What enforces memory and process limits: `cgroup2`, `cgroup1` or `rlimit`; absent
    /// while the session has no worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containment: Option<String>,
    /// Functions and classes defined in the session, with the source a restore re-runs.
    #[serde(default)]
    pub definitions: Vec<DefinitionInfo>,
    /// The session's limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsInfo>,
    /// The cluster node that answered (docs/cluster.md); absent on a single node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// `proactive` of `session.info`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionProactive {
    /// The session's share of the figures.
    #[serde(flatten)]
    pub stats: ProactiveStats,
    /// Normal forms of the code whose answers are computed ahead and would serve a request
    /// now, sorted.
    #[serde(default)]
    pub ahead: Vec<String>,
    /// The code a speculative child of the worker is computing now.
    #[serde(default)]
    pub speculating: Vec<String>,
}

/// One definition of `session.info`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DefinitionInfo {
    pub name: String,
    /// `function`, `class` or `lambda`.
    pub kind: String,
    pub source: String,
}

/// `limits` of `session.info`: `null` where there is no limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimitsInfo {
    pub memory_mb: Option<u64>,
    pub cpu_s: Option<u64>,
    pub open_files: Option<u64>,
    pub processes: Option<u64>,
    pub timeout_s: f64,
    pub output_bytes: usize,
    pub result_repr_bytes: usize,
    pub input_timeout_s: f64,
    pub interrupt_grace_s: f64,
    #[serde(default)]
    pub file_bytes: u64,
    #[serde(default)]
    pub disk_mb: Option<u64>,
}

/// `sandbox` of `session.info`: the layers the worker applied to itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxInfo {
    /// The worker's own uid; `null` when it runs as the engine's user.
    pub uid: Option<u32>,
    /// `"abi N"` when Landlock confines its file access, else `null`.
    pub landlock: Option<String>,
    /// Whether the seccomp filter is installed.
    pub seccomp: bool,
    /// Whether it may open internet sockets.
    pub network: bool,
    /// For a clone: what isolates it from its source and siblings (`"files"`, `"ptrace"`,
    /// `"signals"`, `"abstract_sockets"`), empty when it shares their uid and directories;
    /// absent for a session that is not a clone (or whose worker was replaced since).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_isolation: Option<Vec<String>>,
}

impl Default for SandboxInfo {
    /// An unconfined worker.
    fn default() -> Self {
        Self {
            uid: None,
            landlock: None,
            seccomp: false,
            network: true,
            clone_isolation: None,
        }
    }
}

/// `durability` of `session.info`: whether a crash now would lose anything.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Durability {
    /// True when the latest checkpoint holds every change and every name.
    pub saved: bool,
    /// The checkpoint a crash would come back from.
    pub last_checkpoint: Option<String>,
    /// Executions that may have changed the namespace since that checkpoint.
    pub unsaved_executions: u64,
    /// Names the latest checkpoint could not save.
    pub lost_names: Vec<LostName>,
    /// Why the latest checkpoint failed, until one succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// One name of a session's namespace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariableInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub type_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
}

/// `session.list` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// `session.close` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloseParams {
    pub session_id: String,
    /// Take a last checkpoint and keep the session's checkpoints on disk (a named session
    /// then comes back on its next use); otherwise they are deleted.
    #[serde(default)]
    pub checkpoint: bool,
}

/// The empty result `{}` of `session.input` and `session.close`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Empty {}

/// `engine.stats` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub pool: PoolStats,
    pub sessions: usize,
    pub executions: u64,
    pub crashes: u64,
    pub restores: u64,
    pub proactive: ProactiveStats,
    /// The memory's figures (every owner's).
    #[serde(default)]
    pub memory: MemoryStats,
    /// What LLM calls used; absent without `[llm]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<crate::llm::LlmStats>,
}

/// `session.hint` params: code the caller expects the session to run soon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HintParams {
    pub session_id: String,
    pub code: Vec<String>,
}

/// `session.hint` result: how many snippets the predictor took (0 for a session that is not
/// proactive; code that does not tokenize as Python is not taken).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hinted {
    pub accepted: usize,
}

/// `session.complete` params: complete the word that ends at character `cursor` of `code`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompleteParams {
    pub session_id: String,
    pub code: String,
    /// In characters (Unicode code points) of `code`; its end when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<usize>,
}

/// `session.complete` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completed {
    /// Each replaces the word before the cursor (identifier characters and dots); a
    /// callable ends with `(`.
    pub matches: Vec<String>,
    /// Code was running in the session, so nothing was looked up.
    #[serde(default)]
    pub busy: bool,
}

/// `engine.health` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    /// `ok` while serving, `stopping` once a graceful stop has begun.
    pub status: String,
    pub version: String,
    pub uptime_s: f64,
}

/// `session.output` notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputNote {
    pub session_id: String,
    pub execution_id: String,
    pub stream: OutputStream,
    pub data: String,
}

/// `session.input_request` notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputRequestNote {
    pub session_id: String,
    pub execution_id: String,
    pub prompt: String,
    pub password: bool,
}

/// `session.display` notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DisplayNote {
    pub session_id: String,
    pub execution_id: String,
    pub mime: String,
    pub data: String,
}

/// Method names, as docs/protocol.md spells them.
pub mod method {
    pub const CREATE: &str = "session.create";
    pub const EXECUTE: &str = "session.execute";
    pub const INPUT: &str = "session.input";
    pub const INTERRUPT: &str = "session.interrupt";
    pub const CHECKPOINT: &str = "session.checkpoint";
    pub const RESTORE: &str = "session.restore";
    pub const CHECKPOINTS: &str = "session.checkpoints";
    pub const INFO: &str = "session.info";
    pub const LIST: &str = "session.list";
    pub const CLOSE: &str = "session.close";
    pub const HINT: &str = "session.hint";
    pub const COMPLETE: &str = "session.complete";
    pub const FORK: &str = "session.fork";
    pub const STATS: &str = "engine.stats";
    pub const HEALTH: &str = "engine.health";
    pub const CLUSTER_STATUS: &str = "cluster.status";
    pub const NODE_DRAIN: &str = "node.drain";
}

/// Notification names, as docs/protocol.md spells them.
pub mod notification {
    pub const OUTPUT: &str = "session.output";
    pub const INPUT_REQUEST: &str = "session.input_request";
    pub const DISPLAY: &str = "session.display";
    /// A request from the server: a bridge call the client answers.
    pub const BRIDGE_LLM: &str = "bridge.llm";
    pub const BRIDGE_CANCEL: &str = "bridge.cancel";
}

/// Seconds since the Unix epoch, for `created_at` fields.
pub fn unix_seconds(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
