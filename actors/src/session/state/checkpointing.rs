//! Checkpoints: asked for by the caller, due by the automatic policy, or owed before a
//! result in `durability = "reply"` mode. The worker's forked child writes the blob files;
//! the host takes them into the [`CheckpointStore`](crate::checkpoint::CheckpointStore) on
//! the blocking pool and keeps the session's account ([`Durability`](super::Durability)).

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::time::Instant;

use actix::prelude::*;
use pyvisor_protocol::{CheckpointGroup, HostMessage};
use tokio::sync::oneshot;

use super::super::durability::LastCheckpoint;
use super::super::messages::CheckpointSummary;
use super::super::{SessionActor, State};
use super::{
    remove_dir_later, CheckpointReply, CheckpointReport, DurabilityMode, Pending,
    CHECKPOINT_TIMEOUT,
};
use crate::checkpoint::{
    CheckpointError, CheckpointMeta, CheckpointSeed, CheckpointStore, GroupSource, NewCheckpoint,
    NewGroup,
};
use crate::errors::SessionError;
use crate::execution::{ErrorInfo, ExecutionStatus, ResultValue};
use crate::metrics;

impl SessionActor {
    /// Asks the worker for a checkpoint of the namespace as it will be once the running
    /// execution (if any) ends. The outcome goes to `reply`, when there is one.
    pub(in crate::session) fn start_checkpoint(
        &mut self,
        reply: Option<CheckpointReply>,
        ctx: &mut Context<Self>,
    ) -> Result<(), SessionError> {
        let setup = self.state_setup()?;
        let (scratch, max_bytes) = (setup.scratch.clone(), setup.max_bytes);
        if self.worker.is_none() || matches!(self.state, State::Restoring) {
            return Err(self.no_worker());
        }
        let id = self.next_request_id("k");
        // An isolated clone writes only in its own area of the scratch directory.
        let area = (self.worker.as_ref())
            .and_then(|w| w.confinement()?.checkpoint_area())
            .unwrap_or(&scratch);
        let dir = area.join(format!("{}-{id}", self.session_id));
        let worker_state = |reason: String| SessionError::WorkerState {
            session_id: self.session_id.clone(),
            reason,
        };
        // One mkdir: the worker needs the directory before it forks its writer. A worker with
        // a uid of its own gets it as its own, and no other worker can enter it.
        let uid = self.worker.as_ref().and_then(|w| w.confinement()?.uid());
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .and_then(|()| match uid {
                Some(uid) => std::os::unix::fs::chown(&dir, Some(uid), Some(uid)),
                None => Ok(()),
            })
            .map_err(|err| worker_state(format!("create {}: {err}", dir.display())))?;
        let frame = HostMessage::Checkpoint {
            id: id.clone(),
            dir: dir.to_string_lossy().into_owned(),
            background: true,
            incremental: self.durability.incremental,
            max_bytes,
        };
        if let Some(worker) = &self.worker {
            if let Err(err) = worker.writer.send(&frame) {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(worker_state(err.to_string()));
            }
        }
        let execution_count = self.last_started_count();
        let expiring = id.clone();
        ctx.run_later(CHECKPOINT_TIMEOUT, move |act, _| {
            if let Some(Pending::Checkpoint { reply, dir, .. }) =
                act.durability.pending.remove(&expiring)
            {
                remove_dir_later(dir);
                let reason = format!("no checkpoint within {CHECKPOINT_TIMEOUT:?}");
                act.durability.checkpoint_failed(reason.clone());
                if let Some(reply) = reply {
                    let _ = reply.send(Err(SessionError::WorkerState {
                        session_id: act.session_id.clone(),
                        reason,
                    }));
                }
            }
        });
        let turn = self.durability.next_store_turn();
        self.durability.pending.insert(
            id,
            Pending::Checkpoint {
                reply,
                dir,
                execution_count,
                mark: self.durability.ledger.mark(),
                started: Instant::now(),
                turn,
            },
        );
        self.durability.changes = 0;
        Ok(())
    }

    /// The worker wrote (or failed to write) the blobs of checkpoint `id`: store them.
    pub(in crate::session) fn checkpoint_done(
        &mut self,
        id: &str,
        report: CheckpointReport,
        ctx: &mut Context<Self>,
    ) {
        let Some(Pending::Checkpoint {
            reply,
            dir,
            execution_count,
            mark,
            started,
            turn,
        }) = self.durability.pending.remove(id)
        else {
            return;
        };
        let Ok(setup) = self.state_setup() else {
            return;
        };
        if let Some(reason) = report.error {
            remove_dir_later(dir);
            tracing::warn!(session = %self.session_id, %reason, "checkpoint failed in the worker");
            self.durability.checkpoint_failed(reason.clone());
            if let Some(reply) = reply {
                let _ = reply.send(Err(SessionError::WorkerState {
                    session_id: self.session_id.clone(),
                    reason,
                }));
            }
            return;
        }
        let destination = Destination {
            store: setup.store.clone(),
            key: setup.key.clone(),
            max_bytes: setup.max_bytes,
            seed: self.durability.seed.clone(),
        };
        let seeded = destination.seed.is_some();
        let meta = CheckpointMeta {
            execution_count,
            names_saved: report.saved.clone(),
            names_lost: report.lost.clone(),
        };
        let (saved, lost) = (report.saved, report.lost);
        let gate = self.durability.store_gate.clone();
        let store_in_turn = move || {
            let removed = gate.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if *removed {
                let _ = std::fs::remove_dir_all(&dir);
                return None;
            }
            let stored = store_checkpoint(&destination, &dir, &meta, &report.index, report.groups);
            let _ = std::fs::remove_dir_all(&dir);
            Some(stored)
        };
        let stored = async move {
            if let Some(after) = turn.after {
                // An error only says the earlier checkpoint was dropped: its turn is over.
                let _ = after.await;
            }
            let stored = tokio::task::spawn_blocking(store_in_turn).await;
            drop(turn.done);
            stored
        };
        ctx.spawn(stored.into_actor(self).map(move |stored, act, ctx| {
            let outcome = match stored {
                // The session closed and its checkpoints are gone: nothing to report.
                Ok(None) => {
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(SessionError::Closed {
                            session_id: act.session_id.clone(),
                        }));
                    }
                    return;
                }
                Ok(Some(Ok(info))) => {
                    let elapsed = started.elapsed();
                    let written = info.written_bytes.unwrap_or(info.file_bytes);
                    metrics::checkpoint_written(elapsed, written);
                    let last = LastCheckpoint {
                        id: info.id,
                        execution_count,
                        at: Instant::now(),
                    };
                    act.durability.ledger.stored(last, mark, lost.clone());
                    act.durability.incremental = true;
                    act.durability.seed = None;
                    Ok(CheckpointSummary {
                        checkpoint_id: info.id.to_string(),
                        bytes: written,
                        state_bytes: info.state_bytes,
                        saved,
                        lost,
                        duration_ms: elapsed.as_secs_f64() * 1000.0,
                    })
                }
                Ok(Some(Err(err))) => Err(act.store_error(err)),
                Err(join) => Err(SessionError::WorkerState {
                    session_id: act.session_id.clone(),
                    reason: format!("storing the checkpoint panicked: {join}"),
                }),
            };
            if let Err(err) = &outcome {
                tracing::warn!(session = %act.session_id, error = %err, "checkpoint not stored");
                act.durability.checkpoint_failed(checkpoint_failure(err));
            }
            if let Some(reply) = reply {
                let _ = reply.send(outcome);
            } else if seeded && outcome.is_err() {
                // The source's blobs went before they were linked (pruned, say): the clone's
                // state is written whole at once rather than at its next change.
                let _ = act.start_checkpoint(None, ctx);
            }
            // Changes that came while this one was written may be due now.
            act.maybe_auto_checkpoint(ctx);
        }));
    }

    /// Whether results of executions that changed the namespace wait for its checkpoint.
    pub(in crate::session) fn checkpoints_before_reply(&self) -> bool {
        (self.setup.state.as_ref()).is_some_and(|s| s.policy.durability == DurabilityMode::Reply)
    }

    /// The running execution ended having changed the namespace: checkpoint it, then send
    /// the result, which says so in `warnings` if the checkpoint failed.
    pub(in crate::session) fn finish_after_checkpoint(
        &mut self,
        status: ExecutionStatus,
        result: Option<ResultValue>,
        error: Option<ErrorInfo>,
        ctx: &mut Context<Self>,
    ) {
        let State::Busy(running) = &mut self.state else {
            return;
        };
        // The code is done: a slow checkpoint is no timeout of it.
        ctx.cancel_future(running.timer);
        running.saving = true;
        let execution_id = running.ticket.execution_id.clone();
        let (reply, written) = oneshot::channel();
        if let Err(err) = self.start_checkpoint(Some(reply), ctx) {
            self.durability.checkpoint_failed(checkpoint_failure(&err));
            return self.finish(status, result, error, ctx);
        }
        // A worker that dies meanwhile ends the execution `crashed` before this runs.
        ctx.spawn(written.into_actor(self).map(move |_, act, ctx| {
            if act.running_id() == Some(&execution_id) {
                act.finish(status, result, error, ctx);
            }
        }));
    }

    /// An execution ended; `changed` says whether it may have changed the namespace.
    pub(in crate::session) fn count_change(&mut self, changed: bool, ctx: &mut Context<Self>) {
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
        let since = self.durability.ledger.last.map(|last| last.at.elapsed());
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
}

/// Where a session's checkpoint is stored, and on what terms.
pub(super) struct Destination {
    pub(super) store: CheckpointStore,
    /// The session's key in the store.
    pub(super) key: String,
    /// The largest state the checkpoint may hold.
    pub(super) max_bytes: u64,
    /// The source's checkpoint a clone's first checkpoint may link groups from.
    pub(super) seed: Option<CheckpointSeed>,
}

/// Takes the blob files of a reported checkpoint into the store, with `index` as payload.
pub(super) fn store_checkpoint(
    to: &Destination,
    dir: &Path,
    meta: &CheckpointMeta,
    index: &serde_json::Value,
    groups: Vec<CheckpointGroup>,
) -> Result<crate::checkpoint::CheckpointInfo, CheckpointError> {
    let io = |reason: &str| CheckpointError::Io {
        action: "take in the checkpoint of",
        path: dir.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, reason.to_owned()),
    };
    let mut new_groups = Vec::with_capacity(groups.len());
    for group in groups {
        let source = match group.file {
            // The name comes from the worker: it must stay inside the directory.
            Some(file) if is_plain_file_name(&file) => GroupSource::File(dir.join(file)),
            Some(file) => return Err(io(&format!("the worker named a blob file {file:?}"))),
            None => GroupSource::Unchanged,
        };
        new_groups.push(NewGroup {
            token: group.token,
            names: group.names,
            source,
        });
    }
    let payload = serde_json::to_vec(index).map_err(|err| io(&err.to_string()))?;
    to.store.save_checkpoint(
        &to.key,
        NewCheckpoint {
            meta,
            payload: &payload,
            groups: &new_groups,
            max_state_bytes: to.max_bytes,
            seed: to.seed.as_ref(),
        },
    )
}

/// Whether `name` is one plain component: no separator, not `.` or `..`, not empty.
pub(super) fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// What a result says of a checkpoint that could not be stored.
fn checkpoint_failure(err: &SessionError) -> String {
    match err {
        SessionError::Checkpoint { source, .. } => match source.as_ref() {
            CheckpointError::TooLarge { bytes, limit } => format!(
                "checkpoint of {} over the limit of {} (state.max_bytes, by default the \
                 session's memory limit)",
                megabytes(*bytes),
                megabytes(*limit)
            ),
            CheckpointError::DiskFull {
                scope,
                bytes,
                limit,
            } => format!(
                "checkpoints would take {scope} disk use to {}, over its cap of {}",
                megabytes(*bytes),
                megabytes(*limit)
            ),
            other => other.to_string(),
        },
        other => other.to_string(),
    }
}

/// `bytes` in megabytes, for a message.
fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}
