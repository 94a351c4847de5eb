//! What a session's checkpoints take on disk: pruning by retention and by the disk caps, the
//! blobs that no checkpoint refers to any more, and the store's running account of the bytes.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::listing::{envelopes, sequences};
use super::CheckpointStore;
use crate::checkpoint::blobs::{self, BlobRef, BLOBS_DIR, TRASH_PREFIX};
use crate::checkpoint::errors::CheckpointError;
use crate::checkpoint::layout::{checkpoint_file_name, unique_name};
use crate::checkpoint::meta::{CheckpointId, CheckpointInfo};

impl CheckpointStore {
    /// Stores the new blobs of a checkpoint compressed where that pays, on a thread of its own:
    /// the checkpoint is durable already, and compressing a large blob takes longer than a
    /// checkpoint should.
    pub(super) fn compress_later(&self, dir: &Path, blobs: Vec<BlobRef>) {
        let blobs: Vec<BlobRef> = blobs
            .into_iter()
            .filter(|blob| blob.bytes >= blobs::COMPRESS_MIN)
            .collect();
        if blobs.is_empty() {
            return;
        }
        let (store, dir) = (self.clone(), dir.to_owned());
        let spawned = std::thread::Builder::new()
            .name("pyvisor-blob-zstd".into())
            .spawn(move || store.compress(&dir, &blobs));
        if let Err(err) = spawned {
            tracing::warn!(error = %err, "checkpoint blobs stay uncompressed");
        }
    }

    fn compress(&self, dir: &Path, blobs: &[BlobRef]) {
        let blobs_dir = dir.join(BLOBS_DIR);
        for blob in blobs {
            let swapped = blobs::compress_if_it_pays(&blobs_dir, blob, |swap| {
                let lock = self.session_lock(dir);
                let _held = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                let before = session_usage(dir);
                let outcome = swap();
                self.account(before, session_usage(dir));
                outcome
            });
            match swapped {
                Ok(0) => {}
                Ok(saved) => tracing::debug!(blob = %blob.file_name(), saved, "blob compressed"),
                // Removed meanwhile, or the disk is full: the raw blob serves as well.
                Err(err) => {
                    tracing::debug!(blob = %blob.file_name(), error = %err, "blob not compressed")
                }
            }
        }
    }

    /// Prunes the oldest checkpoints of a session while it, or the whole store, is over its
    /// disk cap. A newest checkpoint `newest` that is over a cap by itself is removed instead,
    /// the earlier ones left as they are, and the caller is told.
    pub(super) fn enforce_caps(
        &self,
        session: &str,
        dir: &Path,
        newest: &CheckpointInfo,
        mut usage: u64,
    ) -> Result<(), CheckpointError> {
        let alone = newest.state_bytes.saturating_add(newest.file_bytes);
        let others = self
            .total_usage
            .load(Ordering::Relaxed)
            .saturating_sub(usage);
        let refusal = if alone > self.config.session_disk_bytes {
            Some(("this session's", alone, self.config.session_disk_bytes))
        } else if others.saturating_add(alone) > self.config.total_disk_bytes {
            Some((
                "all sessions'",
                others + alone,
                self.config.total_disk_bytes,
            ))
        } else {
            None
        };
        if let Some((scope, bytes, limit)) = refusal {
            remove_if_there(&dir.join(checkpoint_file_name(newest.id.sequence())));
            self.collect_garbage(dir);
            self.account(usage, session_usage(dir));
            return Err(CheckpointError::DiskFull {
                scope,
                bytes,
                limit,
            });
        }
        let over = |store: &Self, usage: u64| {
            usage > store.config.session_disk_bytes
                || store.total_usage.load(Ordering::Relaxed) > store.config.total_disk_bytes
        };
        while over(self, usage) {
            let oldest = sequences(dir)?
                .into_iter()
                .rev()
                .find(|s| *s != newest.id.sequence());
            let Some(oldest) = oldest else { break };
            tracing::info!(session, checkpoint = %CheckpointId::from_sequence(oldest), "pruning a checkpoint to stay within the disk cap");
            remove_if_there(&dir.join(checkpoint_file_name(oldest)));
            self.collect_garbage(dir);
            let now = session_usage(dir);
            self.account(usage, now);
            usage = now;
        }
        Ok(())
    }

    /// Removes the blobs of a session that none of its checkpoints refers to.
    pub(super) fn collect_garbage(&self, dir: &Path) {
        let blobs_dir = dir.join(BLOBS_DIR);
        if !blobs_dir.exists() {
            return;
        }
        match referenced_blobs(dir) {
            Ok(referenced) => {
                let trash = dir.join(unique_name(TRASH_PREFIX));
                if blobs::collect_garbage(&blobs_dir, &referenced, &trash) > 0 {
                    remove_in_background(trash);
                }
            }
            Err(err) => tracing::warn!(error = %err, "cannot tell which checkpoint blobs are used"),
        }
    }

    /// Moves the store's account of the disk from a session's usage `before` to `after`.
    pub(super) fn account(&self, before: u64, after: u64) {
        if after >= before {
            self.total_usage
                .fetch_add(after - before, Ordering::Relaxed);
        } else {
            let freed = before - after;
            let _ = self
                .total_usage
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |total| {
                    Some(total.saturating_sub(freed))
                });
        }
    }

    /// Deletes a session's checkpoints beyond the retention, oldest first. The new checkpoint
    /// is saved already, so a failure here is only logged.
    pub(super) fn prune(&self, dir: &Path) {
        let sequences = match sequences(dir) {
            Ok(sequences) => sequences,
            Err(err) => {
                tracing::warn!(error = %err, "cannot prune old checkpoints");
                return;
            }
        };
        for sequence in sequences.into_iter().skip(self.config.retention.get()) {
            remove_if_there(&dir.join(checkpoint_file_name(sequence)));
        }
    }
}

/// The blobs that the checkpoints of a session refer to. A checkpoint whose metadata cannot be
/// read refers to none: it cannot be loaded anyway.
pub(super) fn referenced_blobs(dir: &Path) -> Result<HashSet<BlobRef>, CheckpointError> {
    Ok(envelopes(dir)?
        .into_iter()
        .flat_map(|envelope| envelope.groups)
        .map(|group| group.blob)
        .collect())
}

/// Bytes that a session's checkpoint files and blobs take on disk.
pub(super) fn session_usage(dir: &Path) -> u64 {
    let files: u64 = fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .filter_map(|entry| entry.metadata().ok())
            .filter(|meta| meta.is_file())
            .map(|meta| meta.len())
            .sum()
    });
    files + blobs::usage(&dir.join(BLOBS_DIR))
}

/// Removes a directory of unused blobs on a thread of its own, or at once if none starts.
pub(super) fn remove_in_background(dir: PathBuf) {
    let remove = |dir: &Path| {
        if let Err(err) = fs::remove_dir_all(dir) {
            tracing::warn!(dir = %dir.display(), error = %err, "cannot remove unused checkpoint blobs");
        }
    };
    let spawned = std::thread::Builder::new()
        .name("pyvisor-blob-gc".into())
        .spawn({
            let dir = dir.clone();
            move || remove(&dir)
        });
    if spawned.is_err() {
        remove(&dir);
    }
}

pub(super) fn remove_if_there(path: &Path) {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => {
            tracing::warn!(path = %path.display(), error = %err, "cannot remove a checkpoint")
        }
    }
}
