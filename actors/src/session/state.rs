//! Session state that outlives a worker: checkpoints (asked for, or taken by the automatic
//! policy), restores (asked for, after a crash, or for a named session found on disk), and
//! inspection of the namespace.
//!
//! For a checkpoint the worker writes one blob file per changed group of names into a
//! directory of the engine's scratch directory (pyworker/pyvisor_worker/checkpoints.py and
//! blobfiles.py document them), and reports the groups; the host takes the files into the [`CheckpointStore`] on
//! the blocking pool, never on the actor's thread. A checkpoint is written by a forked child
//! of the worker, so executions go on meanwhile. A restore hands the worker the blob files of
//! each group; groups it still holds unchanged are kept, not reloaded. When the worker dies,
//! the session comes back from its latest checkpoint, or says that its namespace is fresh;
//! [`Ledger`] keeps that account and what results must say about it.
//!
//! Here: the setup and policy types, the account of requests the worker owes an answer
//! ([`Durability`]), inspection, and what a dead worker leaves behind; `checkpointing` takes
//! checkpoints, `restoring` restores them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pyvisor_protocol::{CheckpointGroup, Definition, HostMessage, LostName, Variable};
use tokio::sync::oneshot;

use super::durability::{LastCheckpoint, Ledger};
use super::messages::{CheckpointSummary, RestoreSummary};
use super::SessionActor;
use crate::checkpoint::{CheckpointError, CheckpointSeed, CheckpointStore};
use crate::errors::SessionError;
use crate::execution::Recovered;

mod checkpointing;
mod restoring;
#[cfg(test)]
mod tests;

/// How long a checkpoint may take before its caller is told it failed. A forked child can
/// hang on a lock another thread of the session's code held when it forked.
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `GetInfo` waits for the worker to describe its namespace.
pub(super) const INSPECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Where and how a session keeps its checkpoints.
#[derive(Clone)]
pub struct StateSetup {
    pub store: CheckpointStore,
    /// The session's key in the store, from [`StateSetup::key_for`].
    pub key: String,
    pub policy: AutoCheckpoint,
    /// Directory where the worker writes the blob files of a checkpoint for the store.
    pub scratch: PathBuf,
    /// Restore the latest checkpoint before the first execution (a named session that an
    /// earlier engine left on disk).
    pub restore_on_start: bool,
    /// The execution count of the checkpoint restored on start: the session counts its
    /// executions on from it, the first one queued before the restore included.
    pub counted_from: u64,
    /// The largest state a checkpoint of this session may hold, in bytes.
    pub max_bytes: u64,
}

impl StateSetup {
    /// The store key of a session: its owner and name when it has a name (a later engine
    /// finds its checkpoints by them), else its id, which no later engine knows.
    pub fn key_for(owner: Option<&str>, name: Option<&str>, session_id: &str) -> String {
        match name {
            Some(name) => Self::named_key(owner, name),
            None => format!("id:{session_id}"),
        }
    }

    /// The store key of the session `owner` named `name`. The owner is part of the key, so
    /// it is persisted with every checkpoint (the envelope holds the key) and a name finds
    /// only its owner's checkpoints; the length keeps `(owner, name)` pairs apart.
    pub fn named_key(owner: Option<&str>, name: &str) -> String {
        match owner {
            None => format!("{NAMED_KEY_PREFIX}{name}"),
            Some(owner) => format!("{OWNED_KEY_PREFIX}{}:{owner}:{name}", owner.len()),
        }
    }

    /// Whether the session is named, so that its checkpoints may outlive it.
    pub fn named(&self) -> bool {
        self.key.starts_with(NAMED_KEY_PREFIX) || self.key.starts_with(OWNED_KEY_PREFIX)
    }
}

/// Prefix of the store keys of named sessions.
const NAMED_KEY_PREFIX: &str = "name:";

/// Prefix of the store keys of named sessions that have an owner.
const OWNED_KEY_PREFIX: &str = "owned:";

/// When a session checkpoints by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoCheckpoint {
    /// Checkpoint once this many executions may have changed the namespace (0: never).
    pub after_changes: u32,
    /// At most one automatic checkpoint per interval; later changes wait for the next.
    pub min_interval: Duration,
    /// When the result of an execution that changed the namespace is sent.
    pub durability: DurabilityMode,
}

impl Default for AutoCheckpoint {
    fn default() -> Self {
        Self {
            after_changes: 1,
            min_interval: Duration::from_secs(1),
            durability: DurabilityMode::Debounced,
        }
    }
}

/// What a successful result promises about the state it produced (`[state] durability`:
/// `debounced` or `reply`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityMode {
    /// The result is sent at once and the automatic policy checkpoints afterwards: a crash
    /// before that checkpoint loses the executions since the previous one.
    #[default]
    Debounced,
    /// An execution that may have changed the namespace is checkpointed before its result
    /// is sent: a crash after a result loses nothing it reported.
    Reply,
}

impl DurabilityMode {
    /// The mode's name in the config file and on the wire.
    pub fn name(self) -> &'static str {
        match self {
            DurabilityMode::Debounced => "debounced",
            DurabilityMode::Reply => "reply",
        }
    }
}

/// What the worker said about its namespace.
#[derive(Debug, Clone, Default)]
pub struct Inspection {
    pub variables: Vec<Variable>,
    pub definitions: Vec<Definition>,
    pub rss_bytes: Option<u64>,
}

/// A checkpoint as the worker reported it.
pub(super) struct CheckpointReport {
    pub saved: Vec<String>,
    pub lost: Vec<LostName>,
    pub error: Option<String>,
    pub index: serde_json::Value,
    pub groups: Vec<CheckpointGroup>,
}

/// A restore as the worker reported it.
pub(super) struct RestoreReport {
    pub restored: Vec<String>,
    pub kept: Vec<String>,
    pub lost: Vec<LostName>,
    pub error: Option<String>,
}

pub(super) type CheckpointReply = oneshot::Sender<Result<CheckpointSummary, SessionError>>;
pub(super) type RestoreReply = oneshot::Sender<Result<RestoreSummary, SessionError>>;

/// A checkpoint's place in the order checkpoints are stored: the order they were asked in,
/// whatever order the worker's forked writers finish in. Sequences then follow the state they
/// hold, and an incremental checkpoint finds in the store the groups it leaves out.
struct StoreTurn {
    /// Closes when the checkpoint asked before this one is stored, failed or dropped.
    after: Option<oneshot::Receiver<()>>,
    /// Dropped once this checkpoint is stored, failed or dropped.
    done: oneshot::Sender<()>,
}

/// A request the worker has not answered yet.
enum Pending {
    Checkpoint {
        reply: Option<CheckpointReply>,
        /// The directory the worker writes the blob files to.
        dir: PathBuf,
        execution_count: u64,
        /// The ledger's mark when the checkpoint was asked for.
        mark: u64,
        started: Instant,
        turn: StoreTurn,
    },
    Restore {
        reply: Option<RestoreReply>,
        checkpoint: LastCheckpoint,
        /// A restore after the worker died, before anything else runs.
        recovery: bool,
        /// Blobs stored compressed, decompressed for the worker; removed once it answers.
        restore_dir: Option<PathBuf>,
    },
    Inspect {
        reply: oneshot::Sender<Inspection>,
    },
}

/// The session's bookkeeping of its durable state.
#[derive(Default)]
pub(super) struct Durability {
    pending: HashMap<String, Pending>,
    next_request: u64,
    /// Executions that may have changed the namespace since the last checkpoint request.
    changes: u32,
    pub ledger: Ledger,
    /// The worker's record of the groups it last reported matches what the store holds (or
    /// the seed), so its next checkpoint may leave unchanged groups out.
    incremental: bool,
    /// A clone's source's checkpoint, which the clone's worker's record of groups describes
    /// until the clone's first checkpoint is stored (see `session::forking`).
    seed: Option<CheckpointSeed>,
    auto_timer: Option<SpawnHandle>,
    /// To report with the next result: what came back after the worker died.
    pub recovered: Option<Recovered>,
    /// How the last worker ended, for a result refused after it died between executions.
    pub crash_cause: Option<String>,
    /// The next worker restores the latest checkpoint before it runs anything.
    pub restore_next_worker: bool,
    /// Held while a checkpoint is taken into the store and while a closed session's
    /// checkpoints are removed; true once they are, after which nothing more is stored, so
    /// that a close racing a checkpoint leaves no file of the session behind.
    pub store_gate: Arc<std::sync::Mutex<bool>>,
    /// Closes when the checkpoint asked last is stored, failed or dropped.
    last_turn: Option<oneshot::Receiver<()>>,
}

impl Durability {
    pub fn new(checkpoints_on: bool) -> Self {
        Self {
            ledger: Ledger::new(checkpoints_on),
            ..Self::default()
        }
    }

    /// A timer of the old actor incarnation is gone after a restart.
    pub fn forget_timers(&mut self) {
        self.auto_timer = None;
    }

    /// The place in the storing order of a checkpoint asked now.
    fn next_store_turn(&mut self) -> StoreTurn {
        let (done, closed) = oneshot::channel();
        StoreTurn {
            after: self.last_turn.replace(closed),
            done,
        }
    }

    /// A checkpoint failed for `reason`: results say so until one succeeds, and the next is
    /// written whole, since the worker's record of its groups may be ahead of the store.
    fn checkpoint_failed(&mut self, reason: String) {
        self.ledger.failed(reason);
        self.incremental = false;
        self.seed = None;
    }

    /// The checkpoint the worker's record of its groups describes, as a seed for a clone
    /// forked now: only while that record is what the store holds, with no checkpoint or
    /// restore in flight and the last checkpoint stored.
    pub(super) fn seed_for_clone(&mut self, key: &str) -> Option<CheckpointSeed> {
        let in_flight = self.pending.values().any(|pending| {
            matches!(
                pending,
                Pending::Checkpoint { .. } | Pending::Restore { .. }
            )
        });
        // A receiver that try_recv found done is used up (polling it again panics), and the
        // next checkpoint would wait on it: forget it, as nothing is left to wait for.
        let stored = match self.last_turn.as_mut().map(oneshot::Receiver::try_recv) {
            None => true,
            Some(Err(oneshot::error::TryRecvError::Empty)) => false,
            Some(_) => {
                self.last_turn = None;
                true
            }
        };
        let last = self
            .ledger
            .last
            .filter(|_| self.incremental && !in_flight && stored)?;
        Some(CheckpointSeed {
            key: key.to_owned(),
            checkpoint: last.id,
        })
    }

    /// This session is a clone whose worker's record of groups describes `seed`: its next
    /// checkpoint names those groups unchanged and the store links their blobs in.
    pub(super) fn seed_from(&mut self, seed: CheckpointSeed) {
        self.seed = Some(seed);
        self.incremental = true;
    }
}

impl SessionActor {
    fn state_setup(&self) -> Result<&StateSetup, SessionError> {
        self.setup
            .state
            .as_ref()
            .ok_or_else(|| SessionError::CheckpointsOff {
                session_id: self.session_id.clone(),
            })
    }

    pub(super) fn no_worker(&self) -> SessionError {
        SessionError::NoWorker {
            session_id: self.session_id.clone(),
            reason: format!("the session is {:?}", self.state.phase()).to_lowercase(),
        }
    }

    fn store_error(&self, err: CheckpointError) -> SessionError {
        SessionError::Checkpoint {
            session_id: self.session_id.clone(),
            source: Arc::new(err),
        }
    }

    fn next_request_id(&mut self, prefix: &str) -> String {
        self.durability.next_request += 1;
        format!("{prefix}-{}", self.durability.next_request)
    }

    /// Asks the worker to describe its namespace; `None` comes back when it cannot.
    pub(super) fn start_inspect(&mut self) -> Option<oneshot::Receiver<Inspection>> {
        let id = self.next_request_id("i");
        let worker = self.worker.as_ref()?;
        worker
            .writer
            .send(&HostMessage::Inspect { id: id.clone() })
            .ok()?;
        let (reply, answer) = oneshot::channel();
        self.durability
            .pending
            .insert(id, Pending::Inspect { reply });
        Some(answer)
    }

    pub(super) fn inspect_done(&mut self, id: &str, inspection: Inspection) {
        if let Some(Pending::Inspect { reply }) = self.durability.pending.remove(id) {
            let _ = reply.send(inspection);
        }
    }

    /// The worker is gone: every request it had is answered with an error. When it
    /// `crashed`, returns what the session comes back with, and has the next worker restore
    /// the latest checkpoint if there is one.
    pub(super) fn forget_worker_requests(&mut self, crashed: bool) -> Option<Recovered> {
        self.completions.forget();
        self.forks.forget();
        for (_, pending) in self.durability.pending.drain() {
            let lost = || SessionError::WorkerState {
                session_id: self.session_id.clone(),
                reason: "the worker ended before it answered".into(),
            };
            match pending {
                Pending::Checkpoint { reply, dir, .. } => {
                    remove_dir_later(dir);
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(lost()));
                    }
                }
                Pending::Restore {
                    reply, restore_dir, ..
                } => {
                    remove_dir_later(restore_dir);
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(lost()));
                    }
                }
                Pending::Inspect { .. } => {}
            }
        }
        // The next worker has no record of any group.
        self.durability.incremental = false;
        self.durability.seed = None;
        if !crashed {
            return None;
        }
        let recovered = self.durability.ledger.crashed(self.last_started_count());
        self.durability.restore_next_worker = !recovered.fresh_namespace;
        Some(recovered)
    }
}

/// Removes a scratch directory of a checkpoint or a restore, if any, on the blocking pool.
fn remove_dir_later(dir: impl Into<Option<PathBuf>>) {
    if let Some(dir) = dir.into() {
        drop(tokio::task::spawn_blocking(move || {
            let _ = std::fs::remove_dir_all(dir);
        }));
    }
}
