//! Restores: a checkpoint loaded from the store and handed to the worker, asked for by the
//! caller or owed after the worker died (and then reported as the session's recovery).

use std::time::Instant;

use actix::prelude::*;
use pyvisor_protocol::{HostMessage, RestoreGroup};

use super::super::durability::LastCheckpoint;
use super::super::messages::RestoreSummary;
use super::super::{SessionActor, State};
use super::{remove_dir_later, Pending, RestoreReply, RestoreReport};
use crate::checkpoint::{hand_over_blobs, CheckpointError, CheckpointId, LoadedCheckpoint};
use crate::errors::SessionError;

impl SessionActor {
    /// Loads checkpoint `id` (the latest when `None`) and has the worker restore it. With
    /// `recovery` (the worker died), the session runs nothing until the restore frame is
    /// sent, and a checkpoint that cannot be restored leaves the session with a fresh
    /// namespace that the next result reports.
    pub(in crate::session) fn start_restore(
        &mut self,
        id: Option<CheckpointId>,
        reply: Option<RestoreReply>,
        recovery: bool,
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
        if recovery {
            self.state = State::Restoring;
        }
        // A confined worker cannot read the store: it gets copies of its own.
        let handover = self
            .worker
            .as_ref()
            .and_then(|worker| worker.confinement())
            .filter(|confinement| confinement.cannot_read_the_store())
            .map(|confinement| (confinement.uid(), confinement.checkpoint_dir()));
        let loaded = tokio::task::spawn_blocking(move || {
            let mut loaded = setup.store.load(&setup.key, id)?;
            for skipped in &loaded.skipped {
                tracing::warn!(checkpoint = %skipped.id, reason = %skipped.reason, "skipped a corrupt checkpoint");
            }
            if let Some((uid, area)) = handover {
                hand_over_blobs(&mut loaded, uid, &area).map_err(|source| CheckpointError::Io {
                    action: "hand the checkpoint's blobs to the worker's uid",
                    path: area.clone(),
                    source,
                })?;
            }
            Ok::<_, CheckpointError>(loaded)
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
            let sent = outcome.and_then(|loaded| act.send_restore(loaded, recovery, &mut reply));
            match sent {
                Ok(execution_count) => {
                    if recovery {
                        // The namespace continues from the checkpoint's numbering.
                        act.execution_count = act.execution_count.max(execution_count);
                    }
                }
                Err(err) => {
                    tracing::warn!(session = %act.session_id, error = %err, "restore not started");
                    if recovery {
                        act.recovery_failed(&err.to_string());
                    }
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

    /// Sends the restore frame of a loaded checkpoint; on success the request, with `reply`,
    /// awaits its answer. Returns the checkpoint's execution count.
    fn send_restore(
        &mut self,
        loaded: LoadedCheckpoint,
        recovery: bool,
        reply: &mut Option<RestoreReply>,
    ) -> Result<u64, SessionError> {
        let restore_dir = loaded.restore_dir.clone();
        let sent = self.send_restore_frame(&loaded);
        let request = match sent {
            Ok(request) => request,
            Err(err) => {
                remove_dir_later(restore_dir);
                return Err(err);
            }
        };
        let execution_count = loaded.info.meta.execution_count;
        self.durability.pending.insert(
            request,
            Pending::Restore {
                reply: reply.take(),
                checkpoint: LastCheckpoint {
                    id: loaded.info.id,
                    execution_count,
                    at: Instant::now(),
                },
                recovery,
                restore_dir,
            },
        );
        Ok(execution_count)
    }

    /// Sends the restore frame of `loaded`; returns the request's id.
    fn send_restore_frame(&mut self, loaded: &LoadedCheckpoint) -> Result<String, SessionError> {
        let worker_state = |reason: String| SessionError::WorkerState {
            session_id: self.session_id.clone(),
            reason,
        };
        let Some(worker) = &self.worker else {
            return Err(self.no_worker());
        };
        let index = serde_json::from_slice(&loaded.payload)
            .map_err(|err| worker_state(format!("the checkpoint's index does not parse: {err}")))?;
        let request = format!("r-{}", self.durability.next_request + 1);
        let frame = HostMessage::Restore {
            id: request.clone(),
            index,
            groups: loaded
                .groups
                .iter()
                .map(|group| RestoreGroup {
                    token: group.token.clone(),
                    names: group.names.clone(),
                    path: group.path.to_string_lossy().into_owned(),
                })
                .collect(),
            clear: true,
        };
        worker
            .writer
            .send(&frame)
            .map_err(|err| worker_state(err.to_string()))?;
        self.durability.next_request += 1;
        self.forget_answers();
        self.events.publish(crate::session::SessionEvent::Restored {
            session_id: self.session_id.as_str().into(),
        });
        Ok(request)
    }

    /// The worker restored (or failed to restore) the namespace of request `id`.
    pub(in crate::session) fn restore_done(&mut self, id: &str, report: RestoreReport) {
        let Some(Pending::Restore {
            reply,
            checkpoint,
            recovery,
            restore_dir,
        }) = self.durability.pending.remove(id)
        else {
            return;
        };
        // The worker has read or mapped the blobs decompressed for it.
        remove_dir_later(restore_dir);
        let outcome = match report.error {
            Some(reason) => {
                if recovery {
                    self.recovery_failed(&reason);
                }
                Err(SessionError::WorkerState {
                    session_id: self.session_id.clone(),
                    reason,
                })
            }
            None => {
                self.setup.counters.restored();
                self.durability.ledger.restored(checkpoint);
                self.durability.incremental = true;
                if !report.lost.is_empty() {
                    tracing::info!(session = %self.session_id, lost = ?report.lost, "names not restored");
                }
                Ok(RestoreSummary {
                    checkpoint_id: checkpoint.id.to_string(),
                    restored: report.restored,
                    kept: report.kept,
                    lost: report.lost,
                })
            }
        };
        if let Some(reply) = reply {
            let _ = reply.send(outcome);
        }
    }

    /// The checkpoint a crashed session was to come back from could not be restored: the
    /// namespace is fresh, and the next result says so instead.
    fn recovery_failed(&mut self, reason: &str) {
        let started = self.last_started_count();
        let recovered = self.durability.ledger.fresh(started);
        tracing::warn!(session = %self.session_id, %reason, "recovery failed; the namespace is fresh");
        self.durability.crash_cause =
            Some(format!("its checkpoint could not be restored ({reason})"));
        self.durability.recovered = Some(recovered);
    }
}
