//! Checkpoints sent from the node's local store to the shared one: by the uploader, once per
//! heartbeat for every held session, and before the reply of an execution when
//! `[state] durability = "reply"` (an acknowledged execution then survives the node's death).
//!
//! One upload at a time per node ([`Node::uploading`]): a drain's final upload, an
//! uploader's pass and a durable reply never race, so an older checkpoint never lands after a
//! newer one.

use pyvisor_actors::checkpoint::CheckpointStore;

use super::checkpoints::{self, Uploaded, Writer};
use super::metrics;
use super::node::{Holding, Node};
use crate::errors::ClusterError;

impl Node {
    /// Uploads the newest local checkpoint of every held session the store lacks (a session
    /// a drain hands over is the drain's to upload).
    pub(super) async fn upload_checkpoints(&self) {
        let Some((local, _)) = self.engine.checkpoint_store() else {
            return;
        };
        let _pass = self.uploading.lock().await;
        let held: Vec<String> = self.lock_held().keys().cloned().collect();
        for session_id in held {
            match self.upload_newest(local, &session_id).await {
                Ok(Some(uploaded)) => {
                    tracing::debug!(session = %session_id, checkpoint = %uploaded.checkpoint_id,
                        sent = uploaded.sent_bytes, stored = uploaded.stored_bytes,
                        "checkpoint uploaded");
                }
                Ok(None) => {}
                Err(err) => tracing::warn!(session = %session_id, error = %err,
                    "checkpoint upload failed"),
            }
        }
    }

    /// With `[state] durability = "reply"`, uploads the session's newest checkpoint before
    /// its result is sent; a no-op in the default mode. The error says why the state is not
    /// in the store (the result then warns of it).
    pub async fn upload_before_reply(&self, session_id: &str) -> Result<(), ClusterError> {
        let Some((local, _)) = self.engine.checkpoint_store() else {
            return Ok(());
        };
        if !self.engine.replies_after_checkpoint() {
            return Ok(());
        }
        let _one_upload = self.uploading.lock().await;
        self.upload_newest(local, session_id).await.map(drop)
    }

    /// Uploads the session's newest local checkpoint if the store lacks it; `None` when there
    /// was nothing to send (no checkpoint, already sent, a take-over or drain under way).
    /// A fenced upload means another node claimed the session: it is let go here.
    async fn upload_newest(
        &self,
        local: &CheckpointStore,
        session_id: &str,
    ) -> Result<Option<Uploaded>, ClusterError> {
        let Some(holding) = self.lock_held().get(session_id).cloned() else {
            return Ok(None);
        };
        let (store, key) = (local.clone(), holding.key.clone());
        let newest = tokio::task::spawn_blocking(move || store.list(&key))
            .await
            .ok()
            .and_then(Result::ok)
            .and_then(|list| list.into_iter().next());
        // Looked at again: a drain may have begun while the store was listed.
        let busy = |holding: &Holding| holding.restoring || holding.releasing;
        if self.lock_held().get(session_id).is_none_or(busy) {
            return Ok(None);
        }
        let Some(newest) = newest.filter(|n| holding.uploaded != Some(n.id.sequence())) else {
            return Ok(None);
        };
        let writer = Writer {
            session_id,
            key: &holding.key,
            node_id: &self.config.node_id,
            epoch: holding.epoch,
        };
        let upload = checkpoints::upload(&self.store, local, writer, newest.id);
        match metrics::timed("upload", upload).await {
            Ok(uploaded) => {
                if let Some(holding) = self.lock_held().get_mut(session_id) {
                    holding.uploaded = Some(newest.id.sequence());
                }
                Ok(Some(uploaded))
            }
            Err(ClusterError::Fenced { epoch, .. }) => {
                self.lose(session_id, epoch).await;
                Err(ClusterError::Fenced {
                    session_id: session_id.to_owned(),
                    epoch,
                })
            }
            Err(err) => Err(err),
        }
    }
}
