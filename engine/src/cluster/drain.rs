//! Draining a node (`node.drain`, `pyvisor daemon drain`): the way to take a node out for an
//! upgrade without losing a session.
//!
//! The node marks itself draining in the store (`cluster.status` shows it, `/readyz` turns
//! 503 so a load balancer sends new work elsewhere) and from then on takes no session, new or
//! taken over. Then it hands each session it holds over to the store, one at a time: requests
//! for the session are refused (`-32006`, retried elsewhere), a checkpoint is taken once the
//! session is idle (a running execution, and those queued behind it, finish first), uploaded
//! under the session's epoch, and the lease is released, so that the next request for the
//! session on any node claims it at once and restores that checkpoint. When no session is
//! left, the daemon stops.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use pyvisor_actors::checkpoint::CheckpointId;
use pyvisor_actors::session::SessionPhase;
use tokio::sync::watch;

use super::checkpoints::{self, Writer};
use super::directory::{self, Held};
use super::metrics;
use super::node::Node;
use crate::errors::ClusterError;
use crate::Session;

/// Checkpoints a drain takes of one session before it gives up waiting for it to be idle:
/// a caller that keeps a session busy past this many rounds loses nothing it was told of
/// (refused requests are retried elsewhere), but the last executions are not handed over.
const MAX_ROUNDS: usize = 20;

impl Node {
    /// Starts draining (again: a second call changes nothing) and returns at once; the
    /// hand-over goes on in the background until [`Node::drained`] says it is done.
    pub async fn drain(self: &Arc<Self>) -> Result<(), ClusterError> {
        if self.draining.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        directory::mark_draining(&self.store, &self.config.node_id).await?;
        tracing::info!(node = %self.config.node_id, "draining: handing every session over");
        let node = self.clone();
        tokio::spawn(async move {
            node.hand_over_all().await;
            tracing::info!(node = %node.config.node_id, "drained: no session left");
            node.drained.send_replace(true);
        });
        Ok(())
    }

    /// Whether `node.drain` was called on this node.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Turns true once a drain has handed every session over.
    pub fn drained(&self) -> watch::Receiver<bool> {
        self.drained.subscribe()
    }

    /// [`ClusterError::Draining`] when this node drains.
    pub fn refuse_when_draining(&self) -> Result<(), ClusterError> {
        match self.is_draining() {
            true => Err(self.draining_error()),
            false => Ok(()),
        }
    }

    pub(super) fn draining_error(&self) -> ClusterError {
        ClusterError::Draining {
            node: self.config.node_id.clone(),
        }
    }

    async fn hand_over_all(&self) {
        // Sessions taken over while the drain began are in the list by the time their
        // take-over lock is released; a second look catches them.
        loop {
            let ids: Vec<String> = self.lock_held().keys().cloned().collect();
            if ids.is_empty() {
                return;
            }
            for session_id in ids {
                if let Err(err) = self.hand_over(&session_id).await {
                    tracing::warn!(session = %session_id, error = %err,
                        "could not hand the session over; its lease will run out instead");
                    self.lock_held().remove(&session_id);
                }
            }
        }
    }

    /// Hands one session over: no more requests here, a checkpoint once it is idle, the
    /// checkpoint uploaded, the lease released, the local copy closed.
    async fn hand_over(&self, session_id: &str) -> Result<(), ClusterError> {
        let Some(epoch) = self.lock_held().get_mut(session_id).map(|holding| {
            holding.releasing = true;
            holding.epoch
        }) else {
            return Ok(());
        };
        let session = self.engine.session(session_id, None).await.ok();
        let checkpoint = match &session {
            Some(session) => self.checkpoint_when_idle(session).await,
            None => None,
        };
        let _no_other_upload = self.uploading.lock().await;
        let Some(holding) = self.lock_held().get(session_id).cloned() else {
            return Ok(());
        };
        if let (Some(id), Some((local, _))) = (checkpoint, self.engine.checkpoint_store()) {
            let writer = Writer {
                session_id,
                key: &holding.key,
                node_id: &self.config.node_id,
                epoch,
            };
            if holding.uploaded != Some(id.sequence()) {
                let upload = checkpoints::upload(&self.store, local, writer, id);
                match metrics::timed("upload", upload).await {
                    Ok(_) => {}
                    Err(ClusterError::Fenced { epoch, .. }) => {
                        self.lose(session_id, epoch).await;
                        return Ok(());
                    }
                    Err(err) => return Err(err),
                }
            }
        }
        let held = Held {
            session_id: session_id.to_owned(),
            epoch,
            execution_count: holding.count as i64,
        };
        let release = directory::release(&self.store, &self.config.node_id, &held);
        let released = metrics::timed("release", release).await?;
        self.lock_held().remove(session_id);
        tracing::info!(session = session_id, released, "handed the session over");
        if let Some(session) = session {
            if let Err(err) = session.close().await {
                tracing::warn!(session = session_id, error = %err, "cannot close a handed-over session");
            }
        }
        Ok(())
    }

    /// A checkpoint of `session` with nothing run after it: taken again while executions
    /// that came before the drain still run. `None` when the session keeps no checkpoints.
    async fn checkpoint_when_idle(&self, session: &Session) -> Option<CheckpointId> {
        for _ in 0..MAX_ROUNDS {
            let taken = match session.checkpoint().await {
                Ok(taken) => taken,
                Err(err) => {
                    tracing::warn!(session = session.id(), error = %err,
                        "no checkpoint to hand the session over with");
                    return None;
                }
            };
            let id: CheckpointId = taken.checkpoint_id.parse().ok()?;
            let Ok(now) = session.info().await else {
                return Some(id);
            };
            self.executed(session.id(), now.execution_count);
            let idle = now.phase == SessionPhase::Idle && now.queued == 0;
            if idle && now.last_checkpoint.as_deref() == Some(taken.checkpoint_id.as_str()) {
                return Some(id);
            }
        }
        tracing::warn!(
            session = session.id(),
            rounds = MAX_ROUNDS,
            "the session stayed busy; handing over its last checkpoint"
        );
        session.checkpoint().await.ok()?.checkpoint_id.parse().ok()
    }
}
