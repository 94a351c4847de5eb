//! Session state that outlives a worker: checkpoints (asked for, or taken by the automatic
//! policy), restores (asked for, after a crash, or for a named session found on disk), and
//! inspection of the namespace.
//!
//! The worker writes and reads the payload files (pyworker/pyvisor_worker/checkpoints.py
//! documents them); the host moves them between its scratch directory and the
//! [`CheckpointStore`] on the blocking pool, never on the actor's thread. A checkpoint is
//! taken by a forked child of the worker, so executions go on while it is written. When the
//! worker dies, the session remembers which checkpoint it will come back from and how many
//! executions that loses; the replacement worker restores it before it runs anything else,
//! and the next result says so.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pyvisor_protocol::{Definition, HostMessage, LostName, Variable};
use tokio::sync::oneshot;

use super::messages::{CheckpointSummary, RestoreSummary};
use super::{SessionActor, State};
use crate::checkpoint::{CheckpointError, CheckpointId, CheckpointMeta, CheckpointStore};
use crate::errors::SessionError;
use crate::execution::Recovered;
use crate::metrics;

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
    /// Directory for payload files on their way between the worker and the store.
    pub scratch: PathBuf,
    /// Restore the latest checkpoint before the first execution (a named session that an
    /// earlier engine left on disk).
    pub restore_on_start: bool,
}

impl StateSetup {
    /// The store key of a session: its name when it has one (a later engine finds its
    /// checkpoints by that name), else its id, which no later engine knows.
    pub fn key_for(name: Option<&str>, session_id: &str) -> String {
        match name {
            Some(name) => Self::named_key(name),
            None => format!("id:{session_id}"),
        }
    }

    /// The store key of the session named `name`.
    pub fn named_key(name: &str) -> String {
        format!("{NAMED_KEY_PREFIX}{name}")
    }

    /// Whether the session is named, so that its checkpoints may outlive it.
    pub fn named(&self) -> bool {
        self.key.starts_with(NAMED_KEY_PREFIX)
    }
}

/// Prefix of the store keys of named sessions.
const NAMED_KEY_PREFIX: &str = "name:";

/// When a session checkpoints by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoCheckpoint {
    /// Checkpoint once this many executions may have changed the namespace (0: never).
    pub after_changes: u32,
    /// At most one automatic checkpoint per interval; later changes wait for the next.
    pub min_interval: Duration,
}

impl Default for AutoCheckpoint {
    fn default() -> Self {
        Self {
            after_changes: 1,
            min_interval: Duration::from_secs(1),
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

type CheckpointReply = oneshot::Sender<Result<CheckpointSummary, SessionError>>;
type RestoreReply = oneshot::Sender<Result<RestoreSummary, SessionError>>;

/// A request the worker has not answered yet.
enum Pending {
    Checkpoint {
        reply: Option<CheckpointReply>,
        path: PathBuf,
        execution_count: u64,
        started: Instant,
    },
    Restore {
        reply: Option<RestoreReply>,
        path: PathBuf,
        id: CheckpointId,
    },
    Inspect {
        reply: oneshot::Sender<Inspection>,
    },
}

/// The latest checkpoint this session wrote or restored.
#[derive(Debug, Clone, Copy)]
pub(super) struct LastCheckpoint {
    pub id: CheckpointId,
    pub execution_count: u64,
    at: Instant,
}

/// The session's bookkeeping of its durable state.
#[derive(Default)]
pub(super) struct Durability {
    pending: HashMap<String, Pending>,
    next_request: u64,
    /// Executions that may have changed the namespace since the last checkpoint.
    changes: u32,
    pub last: Option<LastCheckpoint>,
    auto_timer: Option<SpawnHandle>,
    /// To report with the next result: what came back after the worker died.
    pub recovered: Option<Recovered>,
    /// The next worker restores the latest checkpoint before it runs anything.
    pub restore_next_worker: bool,
}

impl Durability {
    /// A timer of the old actor incarnation is gone after a restart.
    pub fn forget_timers(&mut self) {
        self.auto_timer = None;
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

    /// Asks the worker for a checkpoint of the namespace as it will be once the running
    /// execution (if any) ends. The outcome goes to `reply`, when there is one.
    pub(super) fn start_checkpoint(
        &mut self,
        reply: Option<CheckpointReply>,
        ctx: &mut Context<Self>,
    ) -> Result<(), SessionError> {
        let scratch = self.state_setup()?.scratch.clone();
        if self.worker.is_none() || matches!(self.state, State::Restoring) {
            return Err(self.no_worker());
        }
        let id = self.next_request_id("k");
        let path = scratch.join(format!("{}-{id}.payload", self.session_id));
        let frame = HostMessage::Checkpoint {
            id: id.clone(),
            path: path.to_string_lossy().into_owned(),
            background: true,
        };
        if let Some(worker) = &self.worker {
            worker
                .writer
                .send(&frame)
                .map_err(|err| SessionError::WorkerState {
                    session_id: self.session_id.clone(),
                    reason: err.to_string(),
                })?;
        }
        let execution_count = self.last_started_count();
        let expiring = id.clone();
        ctx.run_later(CHECKPOINT_TIMEOUT, move |act, _| {
            if let Some(Pending::Checkpoint { reply, path, .. }) =
                act.durability.pending.remove(&expiring)
            {
                let _ = std::fs::remove_file(path);
                if let Some(reply) = reply {
                    let _ = reply.send(Err(SessionError::WorkerState {
                        session_id: act.session_id.clone(),
                        reason: format!("no checkpoint within {CHECKPOINT_TIMEOUT:?}"),
                    }));
                }
            }
        });
        self.durability.pending.insert(
            id,
            Pending::Checkpoint {
                reply,
                path,
                execution_count,
                started: Instant::now(),
            },
        );
        self.durability.changes = 0;
        Ok(())
    }

    /// The worker wrote (or failed to write) the payload of checkpoint `id`: store it.
    pub(super) fn checkpoint_done(
        &mut self,
        id: &str,
        saved: Vec<String>,
        lost: Vec<LostName>,
        error: Option<String>,
        ctx: &mut Context<Self>,
    ) {
        let Some(Pending::Checkpoint {
            reply,
            path,
            execution_count,
            started,
        }) = self.durability.pending.remove(id)
        else {
            return;
        };
        let Ok(setup) = self.state_setup() else {
            return;
        };
        if let Some(reason) = error {
            let _ = std::fs::remove_file(&path);
            tracing::warn!(session = %self.session_id, %reason, "checkpoint failed in the worker");
            if let Some(reply) = reply {
                let _ = reply.send(Err(SessionError::WorkerState {
                    session_id: self.session_id.clone(),
                    reason,
                }));
            }
            return;
        }
        let store = setup.store.clone();
        let key = setup.key.clone();
        let meta = CheckpointMeta {
            execution_count,
            names_saved: saved.clone(),
            names_lost: lost
                .iter()
                .map(|l| crate::checkpoint::LostName {
                    name: l.name.clone(),
                    reason: l.reason.clone(),
                })
                .collect(),
        };
        let stored = tokio::task::spawn_blocking(move || {
            let payload = read_payload(&path, &store);
            let _ = std::fs::remove_file(&path);
            store.save(&key, &meta, &payload?)
        });
        ctx.spawn(stored.into_actor(self).map(move |stored, act, ctx| {
            let outcome = match stored {
                Ok(Ok(info)) => {
                    let elapsed = started.elapsed();
                    metrics::checkpoint_written(elapsed, info.file_bytes);
                    act.durability.last = Some(LastCheckpoint {
                        id: info.id,
                        execution_count,
                        at: Instant::now(),
                    });
                    Ok(CheckpointSummary {
                        checkpoint_id: info.id.to_string(),
                        bytes: info.file_bytes,
                        saved,
                        lost,
                        duration_ms: elapsed.as_secs_f64() * 1000.0,
                    })
                }
                Ok(Err(err)) => Err(act.store_error(err)),
                Err(join) => Err(SessionError::WorkerState {
                    session_id: act.session_id.clone(),
                    reason: format!("storing the checkpoint panicked: {join}"),
                }),
            };
            if let Err(err) = &outcome {
                tracing::warn!(session = %act.session_id, error = %err, "checkpoint not stored");
            }
            if let Some(reply) = reply {
                let _ = reply.send(outcome);
            }
            // Changes that came while this one was written may be due now.
            act.maybe_auto_checkpoint(ctx);
        }));
    }

    /// Loads checkpoint `id` (the latest when `None`) and has the worker restore it. With
    /// `before_anything`, the session runs nothing until the restore frame is sent.
    pub(super) fn start_restore(
        &mut self,
        id: Option<CheckpointId>,
        reply: Option<RestoreReply>,
        before_anything: bool,
        ctx: &mut Context<Self>,
    ) {
        let setup = match self.state_setup() {
            Ok(setup) => setup.clone(),
            Err(err) => {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(err));
                }
                return;
            }
        };
        if before_anything {
            self.state = State::Restoring;
        }
        let request = self.next_request_id("r");
        let path = setup
            .scratch
            .join(format!("{}-{request}.payload", self.session_id));
        let target = path.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            let loaded = setup.store.load(&setup.key, id)?;
            for skipped in &loaded.skipped {
                tracing::warn!(checkpoint = %skipped.id, reason = %skipped.reason, "skipped a corrupt checkpoint");
            }
            write_private(&target, &loaded.payload).map_err(|source| CheckpointError::Io {
                action: "write the restore payload",
                path: target.clone(),
                source,
            })?;
            Ok::<_, CheckpointError>((loaded.info.id, loaded.info.meta.execution_count))
        });
        ctx.spawn(loaded.into_actor(self).map(move |loaded, act, ctx| {
            let outcome = match loaded {
                Ok(Ok(found)) => Ok(found),
                Ok(Err(err)) => Err(act.store_error(err)),
                Err(join) => Err(SessionError::WorkerState {
                    session_id: act.session_id.clone(),
                    reason: format!("loading the checkpoint panicked: {join}"),
                }),
            };
            let mut reply = reply;
            let sent = outcome.and_then(|(id, execution_count)| {
                act.send_restore(request, path, id, &mut reply)
                    .map(|()| (id, execution_count))
            });
            match sent {
                Ok((id, execution_count)) => {
                    if before_anything {
                        // The namespace continues from the checkpoint's numbering.
                        act.execution_count = act.execution_count.max(execution_count);
                    }
                    act.durability.last = Some(LastCheckpoint {
                        id,
                        execution_count,
                        at: Instant::now(),
                    });
                }
                Err(err) => {
                    tracing::warn!(session = %act.session_id, error = %err, "restore not started");
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(err));
                    }
                }
            }
            if matches!(act.state, State::Restoring) {
                act.state = State::Idle;
                act.start_next(ctx);
            }
            act.publish_phase();
        }));
    }

    /// Sends the restore frame; on success the request, with `reply`, awaits its answer.
    fn send_restore(
        &mut self,
        request: String,
        path: PathBuf,
        id: CheckpointId,
        reply: &mut Option<RestoreReply>,
    ) -> Result<(), SessionError> {
        let Some(worker) = &self.worker else {
            let _ = std::fs::remove_file(&path);
            return Err(self.no_worker());
        };
        let frame = HostMessage::Restore {
            id: request.clone(),
            path: path.to_string_lossy().into_owned(),
            clear: true,
        };
        if let Err(err) = worker.writer.send(&frame) {
            let _ = std::fs::remove_file(&path);
            return Err(SessionError::WorkerState {
                session_id: self.session_id.clone(),
                reason: err.to_string(),
            });
        }
        self.durability.pending.insert(
            request,
            Pending::Restore {
                reply: reply.take(),
                path,
                id,
            },
        );
        Ok(())
    }

    /// The worker restored (or failed to restore) the namespace of request `id`.
    pub(super) fn restore_done(
        &mut self,
        id: &str,
        restored: Vec<String>,
        lost: Vec<LostName>,
        error: Option<String>,
    ) {
        let Some(Pending::Restore {
            reply,
            path,
            id: checkpoint,
        }) = self.durability.pending.remove(id)
        else {
            return;
        };
        let _ = std::fs::remove_file(&path);
        let outcome = match error {
            Some(reason) => Err(SessionError::WorkerState {
                session_id: self.session_id.clone(),
                reason,
            }),
            None => {
                self.setup.counters.restored();
                if !lost.is_empty() {
                    tracing::info!(session = %self.session_id, ?lost, "names not restored");
                }
                Ok(RestoreSummary {
                    checkpoint_id: checkpoint.to_string(),
                    restored,
                    lost,
                })
            }
        };
        if let Some(reply) = reply {
            let _ = reply.send(outcome);
        }
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

    /// An execution ended; `changed` says whether it may have changed the namespace.
    pub(super) fn count_change(&mut self, changed: bool, ctx: &mut Context<Self>) {
        if changed {
            self.durability.changes = self.durability.changes.saturating_add(1);
            self.maybe_auto_checkpoint(ctx);
        }
    }

    /// Takes an automatic checkpoint when the policy says one is due, or arms a timer for
    /// when it will be.
    fn maybe_auto_checkpoint(&mut self, ctx: &mut Context<Self>) {
        let Some(policy) = self.setup.state.as_ref().map(|s| s.policy) else {
            return;
        };
        let due = policy.after_changes > 0 && self.durability.changes >= policy.after_changes;
        let writing = self
            .durability
            .pending
            .values()
            .any(|p| matches!(p, Pending::Checkpoint { .. }));
        if !due || writing || self.durability.auto_timer.is_some() {
            return;
        }
        let since = self.durability.last.map(|last| last.at.elapsed());
        match since {
            Some(since) if since < policy.min_interval => {
                let wait = policy.min_interval - since;
                self.durability.auto_timer = Some(ctx.run_later(wait, |act, ctx| {
                    act.durability.auto_timer = None;
                    act.maybe_auto_checkpoint(ctx);
                }));
            }
            _ => {
                if let Err(err) = self.start_checkpoint(None, ctx) {
                    tracing::debug!(session = %self.session_id, error = %err, "no automatic checkpoint");
                }
            }
        }
    }

    /// The worker is gone: every request it had is answered with an error, and the next
    /// worker is to come back from the latest checkpoint, if there is one.
    pub(super) fn forget_worker_requests(&mut self, crashed: bool) -> Option<Recovered> {
        for (_, pending) in self.durability.pending.drain() {
            let lost = || SessionError::WorkerState {
                session_id: self.session_id.clone(),
                reason: "the worker ended before it answered".into(),
            };
            match pending {
                Pending::Checkpoint { reply, path, .. } => {
                    let _ = std::fs::remove_file(path);
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(lost()));
                    }
                }
                Pending::Restore { reply, path, .. } => {
                    let _ = std::fs::remove_file(path);
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(lost()));
                    }
                }
                Pending::Inspect { .. } => {}
            }
        }
        if !crashed || self.setup.state.is_none() {
            return None;
        }
        let last = self.durability.last?;
        self.durability.restore_next_worker = true;
        Some(Recovered {
            checkpoint_id: last.id.to_string(),
            lost_executions: self
                .last_started_count()
                .saturating_sub(last.execution_count),
        })
    }
}

/// Reads the payload the worker wrote, refusing one over the store's size limit before it
/// is read into memory.
fn read_payload(
    path: &std::path::Path,
    store: &CheckpointStore,
) -> Result<Vec<u8>, CheckpointError> {
    let io = |action, source| CheckpointError::Io {
        action,
        path: path.to_owned(),
        source,
    };
    let bytes = std::fs::metadata(path)
        .map_err(|source| io("read the checkpoint payload", source))?
        .len();
    let limit = store.max_bytes() as u64;
    if bytes > limit {
        return Err(CheckpointError::TooLarge { bytes, limit });
    }
    std::fs::read(path).map_err(|source| io("read the checkpoint payload", source))
}

/// Writes `bytes` to a new file that only this user can read.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)
}
