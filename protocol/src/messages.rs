//! The messages exchanged between the host and a worker, one per frame.
//!
//! [`HostMessage`] travels host → worker on fd 3, the requests the worker's main thread takes
//! up in order, or on fd 5, the control messages its control thread serves at once, also
//! while code runs (see [`HostMessage::lane`]); [`WorkerMessage`] on fd 4 (worker → host). The zygote's messages are in
//! [`crate::zygote`]. All are JSON objects tagged by a `type` field;
//! pyworker/pyvisor_worker/protocol.py documents the same shapes from the Python side.

use serde::{Deserialize, Serialize};

use crate::bridge::{LlmCallKind, LlmFailure};

/// Version announced in the worker's `hello`; the host refuses any other. Version 2 added
/// the control pipe (fd 5).
pub const PROTOCOL_VERSION: u32 = 2;

/// The pipe a [`HostMessage`] travels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// fd 3: read by the worker's main thread between executions, in order.
    Requests,
    /// fd 5: read by the worker's control thread at once, also while code runs.
    Control,
}

/// A message from the host to a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum HostMessage {
    /// Run `code` in the session namespace.
    Execute {
        id: String,
        code: String,
        /// Longest repr of the final expression the worker returns, in bytes.
        repr_limit: usize,
        /// What happens to the namespace when the code fails.
        #[serde(default)]
        transaction: Transaction,
        /// Report what the cell did ([`CellFacts`]) in a [`WorkerMessage::Facts`] after its
        /// result.
        #[serde(default)]
        facts: bool,
        /// The number N of the cell's filename, `<cell-N>`: the session's execution count,
        /// which outlives the worker (a crash, a restore); absent, the worker counts its own.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cell: Option<u64>,
    },
    /// Interrupt the execution `id`: `KeyboardInterrupt` in its code if it runs, or, if the
    /// worker has it but has not started it, a `KeyboardInterrupt` result without running it.
    /// Ignored once that execution has finished, so it never reaches a later one.
    Interrupt { id: String },
    /// Answer to an [`WorkerMessage::InputRequest`]; `None` makes `input()` raise `EOFError`.
    InputReply { id: String, value: Option<String> },
    /// Ask the worker to exit cleanly.
    Shutdown,
    /// Lets a worker forked by the zygote run: the host has contained it (janitor, cgroup).
    Start,
    /// Save the namespace, between executions, as groups of names (those that share objects
    /// go together): each group that changed since the checkpoint the worker last reported
    /// (when `incremental`) is pickled to a file of its own in the directory `dir`. With
    /// `background`, a forked child writes them while the worker goes on serving. A state
    /// over `max_bytes` is not written.
    Checkpoint {
        id: String,
        dir: String,
        background: bool,
        incremental: bool,
        max_bytes: u64,
    },
    /// Bring the namespace back to a checkpoint: `index` as the worker reported it, and each
    /// group's blob file. With `clear`, names the checkpoint does not have are removed; a
    /// group the worker still holds unchanged (same token) is kept as it is, not reloaded.
    Restore {
        id: String,
        index: serde_json::Value,
        groups: Vec<RestoreGroup>,
        clear: bool,
    },
    /// Describe the namespace; answered at once, also while code runs.
    Inspect { id: String },
    /// Complete the name or dotted attribute that ends at byte `cursor` of `text`, from the
    /// namespace, as `rlcompleter` does; served between executions, in order with them.
    Complete {
        id: String,
        text: String,
        cursor: usize,
    },
    /// Run predicted snippets, in order, in a forked child of the worker (between
    /// executions): the session's namespace is never touched. Each snippet is answered by a
    /// [`WorkerMessage::Speculated`] as soon as it is done, then the speculation by one
    /// [`WorkerMessage::SpeculationDone`]. A later snippet sees the child's state after the
    /// earlier ones (a predicted `df = ...` then `df.head()`). The worker kills the child when
    /// an `execute` or `restore` arrives, on `cancel_speculation`, or when it has used
    /// `cpu_ms` of CPU time.
    Speculate {
        id: String,
        snippets: Vec<String>,
        repr_limit: usize,
        /// Longest stdout plus stderr of one snippet that can be cached, in bytes.
        output_limit: usize,
        cpu_ms: u64,
    },
    /// Kill the child of speculation `id` if it still runs.
    CancelSpeculation { id: String },
    /// Fork the worker `count` times between executions (after the running one): each child
    /// is a clone of the session with pipes of its own, waiting for [`HostMessage::Start`] on
    /// them before it says hello. Answered by one [`WorkerMessage::Forked`]. With `plans`
    /// (one per clone, Landlock on), each clone isolates itself from its source and siblings
    /// as its plan says, once started and before it says hello.
    Fork {
        id: String,
        count: u32,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        plans: Vec<ClonePlan>,
    },
    /// The host answered `code` from a speculative run computed on the namespace exactly as
    /// it is (no execution ran since): count it as an execution of the session (its cell
    /// number, its source for tracebacks). No reply.
    Counted { code: String },
    /// The host is about to answer `code` from the cache: check that everything the
    /// speculative run read is as it was (`reads`, `files`, `ambient`) and, if so, count the
    /// answer as an execution of the session (its cell number, its source for tracebacks).
    Adopt {
        id: String,
        code: String,
        reads: Vec<NameStamp>,
        files: Vec<FileStamp>,
        ambient: String,
    },
    /// Give the session's code `llm_query` and its kin (as builtins); sent before any
    /// execute of a session that has the LLM bridge. No reply.
    LlmEnable,
    /// The answer to [`WorkerMessage::LlmCall`] `call`: one answer per prompt, or why none.
    LlmReply {
        call: u64,
        #[serde(default)]
        answers: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<LlmFailure>,
    },
}

impl HostMessage {
    /// The pipe this message travels on: what must reach the worker while its main thread
    /// runs code (an interrupt, an `input()` answer, an LLM answer, an inspection, the kill
    /// of a speculation, shutdown) goes on the control pipe; everything else waits its turn
    /// on the request pipe.
    pub fn lane(&self) -> Lane {
        match self {
            HostMessage::Interrupt { .. }
            | HostMessage::InputReply { .. }
            | HostMessage::Shutdown
            | HostMessage::Inspect { .. }
            | HostMessage::CancelSpeculation { .. }
            | HostMessage::LlmReply { .. } => Lane::Control,
            HostMessage::Execute { .. }
            | HostMessage::Start
            | HostMessage::Checkpoint { .. }
            | HostMessage::Restore { .. }
            | HostMessage::Complete { .. }
            | HostMessage::Speculate { .. }
            | HostMessage::Fork { .. }
            | HostMessage::Counted { .. }
            | HostMessage::Adopt { .. }
            | HostMessage::LlmEnable => Lane::Requests,
        }
    }
}

/// A name and the content fingerprint of its value (`None`: the name was not bound).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NameStamp {
    pub name: String,
    pub fingerprint: Option<String>,
}

/// A file that code opened for reading, as it was then.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FileStamp {
    /// Absolute path.
    pub path: String,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub inode: u64,
}

/// What one execution did, for the proactive engine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CellFacts {
    /// Global names the cell's code loads.
    pub reads: Vec<String>,
    /// Names the execution added, rebound or removed.
    pub binds: Vec<String>,
    /// Names whose values the execution may have changed in place, aliases included
    /// (other names bound to the same objects); `None` when it cannot be told (any name).
    pub touched: Option<Vec<String>>,
    /// Files the code opened for reading.
    pub files: Vec<FileStamp>,
    /// Token of the state outside the namespace that changes what code prints (pandas and
    /// numpy display options, the working directory); equal tokens, equal outputs.
    pub ambient: String,
    /// Summaries of the data objects the cell bound or touched, bounded in number and size.
    pub objects: Vec<ObjectSummary>,
    /// Whether the cell is a single expression with no assignment, call of the session's own
    /// code, or other effect the static purity guard refuses.
    pub pure: bool,
    /// Time the worker spent computing these facts.
    pub cost_ms: f64,
}

/// A bounded description of one data object of the namespace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObjectSummary {
    pub name: String,
    /// `DataFrame`, `Series`, `ndarray`, `list`, `dict`, `int`, ... (the type's own name).
    pub kind: String,
    /// `pandas`, `numpy`, `builtins`, ... (the type's top-level module).
    pub module: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub len: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shape: Vec<u64>,
    /// For a DataFrame, its columns (at most 200); for a Series, itself as one column.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<ColumnSummary>,
    /// Type name of a pandas index (`RangeIndex`, `DatetimeIndex`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<String>,
    /// The first few string labels of an index that is not a `RangeIndex` (at most 5, each
    /// at most 40 characters): the session's own data, for the predictor only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
}

/// One column of a frame (or a Series).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ColumnSummary {
    /// The label as `str()` gives it; `label_is_str` says whether it is a string label.
    pub name: String,
    pub label_is_str: bool,
    pub dtype: String,
    /// Missing values (estimated from a sample on large frames).
    pub nulls: u64,
    /// Distinct values (estimated from a sample on large frames).
    pub distinct: u64,
    /// For a text column of few distinct values, its most frequent string values (at most
    /// 5, each at most 40 characters): the session's own data, for the predictor only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// What a speculative run of one snippet produced, as a real execution would have.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeculativeOutcome {
    pub status: WorkerStatus,
    pub stdout: String,
    pub stderr: String,
    pub result: Option<ResultValue>,
    #[serde(default)]
    pub display: Vec<DisplayItem>,
    pub error: Option<ErrorInfo>,
    /// Whether the answer may be served for a real request: the snippet passed the purity
    /// guard before and after its run (nothing rebound, what it read unchanged), wrote no
    /// warning, and its output is whole UTF-8 within `output_limit`.
    pub servable: bool,
    /// Why it may not be served, when it may not.
    #[serde(default)]
    pub refusal: Option<String>,
    /// The global names the snippet read, fingerprinted before it ran.
    #[serde(default)]
    pub reads: Vec<NameStamp>,
    #[serde(default)]
    pub files: Vec<FileStamp>,
    /// The ambient token (see [`CellFacts::ambient`]) when it ran.
    #[serde(default)]
    pub ambient: String,
    /// Names the snippet bound (a predicted assignment; later snippets build on it).
    #[serde(default)]
    pub binds: Vec<String>,
    pub cpu_ms: f64,
    pub duration_ms: f64,
}

/// A display of a speculative run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisplayItem {
    pub mime: String,
    pub data: String,
}

/// One group of names of a checkpoint to restore, and the file that holds its values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreGroup {
    pub token: String,
    pub names: Vec<String>,
    pub path: String,
}

/// One group of names of a checkpoint the worker wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointGroup {
    /// The worker's name for this version of the group; unchanged groups keep theirs.
    pub token: String,
    pub names: Vec<String>,
    /// The file (a name within the checkpoint's directory) holding the values; `None` when the
    /// group is unchanged since the checkpoint the worker last reported.
    pub file: Option<String>,
    /// The length of `file`, or of the unchanged group's blob.
    pub bytes: u64,
}

/// What an execution does to the namespace when it fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transaction {
    /// Whatever the code changed before it failed stays changed.
    #[default]
    CommitAlways,
    /// A failed execution leaves the namespace as it was before it started.
    RollbackOnFailure,
}

/// A message from a worker to the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerMessage {
    /// Sent once when the worker is ready to execute.
    Hello {
        protocol: u32,
        pid: u32,
        python_version: String,
        executable: String,
        /// The confinement the worker applied to itself before any session code ran;
        /// `None` when it was started without a sandbox plan.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<SandboxApplied>,
        /// The optional requests and messages this worker serves beyond `execute`,
        /// `interrupt`, `input_reply` and `shutdown` (`"speculate"`, `"facts"`, ...), so a host
        /// can tell what it may send without both sides moving in lockstep; empty from a worker
        /// that predates the list.
        #[serde(default)]
        capabilities: Vec<String>,
    },
    /// User code called `input()` or `getpass.getpass()`.
    InputRequest {
        id: String,
        prompt: String,
        password: bool,
    },
    /// Rich output (`display(obj)`, a matplotlib figure).
    Display {
        id: String,
        mime: String,
        data: String,
    },
    /// The execution `id` has finished.
    Result {
        id: String,
        status: WorkerStatus,
        result: Option<ResultValue>,
        error: Option<ErrorInfo>,
        /// Whether the code may have changed the namespace (a binding or an object in it).
        #[serde(default)]
        changed: bool,
        /// Whether a failed `rollback_on_failure` execution put the namespace back.
        #[serde(default)]
        rolled_back: bool,
    },
    /// What execution `id` did, after its result, when the request asked for facts; `None`
    /// when the worker could not compute them. Not sent at all when an `execute` or a
    /// `restore` came before the worker got to them: the reply to that request then comes
    /// first, and tells the host that these facts are unknown.
    Facts {
        id: String,
        facts: Option<Box<CellFacts>>,
    },
    /// Snippet `index` of speculation `id` is done.
    Speculated {
        id: String,
        index: usize,
        outcome: Box<SpeculativeOutcome>,
    },
    /// Speculation `id` is over: its child has exited and is reaped. `ending` is `finished`,
    /// `cancelled`, `cpu_limit` or `crashed: <how>`; `cpu_ms` is the child's CPU time
    /// (user + system, from its rusage).
    SpeculationDone {
        id: String,
        ending: String,
        cpu_ms: f64,
    },
    /// The answer to an `adopt`: `fresh` when the cached answer may be served (the worker
    /// then counted it as an execution), else `reason` says what changed.
    AdoptDone {
        id: String,
        fresh: bool,
        reason: Option<String>,
    },
    /// The checkpoint `id` is written (or `error` says why not).
    CheckpointDone {
        id: String,
        /// Bytes of the files written.
        bytes: u64,
        saved: Vec<String>,
        lost: Vec<LostName>,
        error: Option<String>,
        /// What the worker needs besides the groups to restore (imports, definitions); the
        /// host keeps it as it is.
        #[serde(default)]
        index: serde_json::Value,
        #[serde(default)]
        groups: Vec<CheckpointGroup>,
    },
    /// The restore `id` is done (or `error` says why it could not start).
    RestoreDone {
        id: String,
        restored: Vec<String>,
        lost: Vec<LostName>,
        error: Option<String>,
        /// Names the restore left as they were, because the worker held them unchanged.
        #[serde(default)]
        kept: Vec<String>,
    },
    /// The namespace as the inspect `id` found it.
    InspectDone {
        id: String,
        variables: Vec<Variable>,
        /// Functions, classes and lambdas defined in the session, with their source.
        definitions: Vec<Definition>,
        /// Resident memory of the worker process.
        rss_bytes: Option<u64>,
    },
    /// The completions of the complete request `id`: each replaces the word before the
    /// cursor (the run of identifier characters and dots that ends there).
    CompleteDone { id: String, matches: Vec<String> },
    /// The clones of fork `id`, forked between executions; `error` says why there are
    /// fewer than asked for (none when the first fork failed).
    Forked {
        id: String,
        clones: Vec<ForkedClone>,
        /// Threads of the session's code that were running at the fork (none survive in a
        /// clone).
        #[serde(default)]
        threads: u32,
        #[serde(default)]
        error: Option<String>,
    },
    /// Code of execution `id` called the LLM bridge; its thread waits for the
    /// [`HostMessage::LlmReply`] of `call` (a number the worker never reuses).
    LlmCall {
        id: String,
        call: u64,
        kind: LlmCallKind,
        prompts: Vec<String>,
        /// A model name of the engine's config; its default model when `None`.
        #[serde(default)]
        model: Option<String>,
        /// The context of an `rlm` call (`ctx`): a string, or another JSON value.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context: Option<serde_json::Value>,
    },
    /// A message kind this host does not know, from a newer worker. The host never sends it;
    /// the pump drops it with a warning rather than take the stream for corrupt. A kind it
    /// knows with fields it cannot read is still an error.
    #[serde(other, skip_serializing)]
    Unknown,
}

/// A name a checkpoint could not save, or a restore could not bring back, and why. Also part
/// of the checkpoint files' metadata: changing its fields changes their format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostName {
    pub name: String,
    pub reason: String,
}

/// One name of the namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Variable {
    pub name: String,
    #[serde(rename = "type")]
    pub type_name: String,
    /// Approximate size of the value (`sys.getsizeof`, deep for containers of known types).
    pub size_bytes: Option<u64>,
}

/// A function, class or lambda defined by the session's code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Definition {
    pub name: String,
    /// `function`, `class` or `lambda`.
    pub kind: String,
    pub source: String,
}

/// How an execution ended, as the worker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerStatus {
    Ok,
    Error,
}

/// The value of a final expression statement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultValue {
    pub repr: String,
    #[serde(rename = "type")]
    pub type_name: String,
    /// `text/html` rendering, for objects such as pandas DataFrames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
}

/// An exception raised by user code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    #[serde(rename = "type")]
    pub type_name: String,
    pub message: String,
    pub traceback: Vec<String>,
}

/// How a clone of `session.fork` isolates itself from its source and its siblings
/// (pyvisor_worker/sandbox.py `isolate_clone`): it copies its source's work directory into
/// its own, then adds a Landlock layer of its own (reading what its source could read at its
/// start, writing only `write`; signals and abstract unix sockets scoped to itself where the
/// kernel's ABI has scopes), enters `cwd` and points `env` (TMPDIR, HOME, MPLCONFIGDIR) at
/// its own directories.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClonePlan {
    /// Paths readable and writable by the clone: its own directories, and a client `cwd`.
    pub write: Vec<String>,
    /// The clone's working directory.
    pub cwd: String,
    /// Variables set in the clone's environment.
    pub env: Vec<(String, String)>,
    /// The source's work directory, whose files the clone copies into `cwd` first; `None`
    /// when the two share a client's `cwd`.
    pub copy_from: Option<String>,
}

/// What a worker reports of its confinement in its `hello`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxApplied {
    /// The uid the worker runs as, when it was given one.
    pub uid: Option<u32>,
    /// The Landlock ABI version enforced, `None` when Landlock is off or missing.
    pub landlock: Option<u32>,
    /// Whether the seccomp filter is installed.
    pub seccomp: bool,
    /// Whether the worker may open internet sockets.
    pub network: bool,
    /// For a clone of `session.fork`: what it is isolated from its source and siblings by
    /// (`"files"`, `"ptrace"`, `"signals"`, `"abstract_sockets"`); empty when it shares their
    /// principal. `None` for a worker that is not a clone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_isolation: Option<Vec<String>>,
}

/// One clone of a [`HostMessage::Fork`]: its pid (also its process group) and the numbers
/// of the descriptors in it that hold the host's ends of its pipes, for the host to open
/// through `/proc/<pid>/fd` before the start frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkedClone {
    pub pid: u32,
    pub stdout: i32,
    pub stderr: i32,
    pub requests: i32,
    pub replies: i32,
    pub control: i32,
}
