//! Saving a checkpoint: taking the new groups' blob files in (or linking the seed's), writing
//! and publishing the checkpoint file under the next free sequence number, then pruning and
//! enforcing the disk caps.

use std::fs;
use std::io;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use super::disk::session_usage;
use super::listing::{next_sequence, retained_groups, system_time};
use super::seed::SeedGroups;
use super::{io_error, sync_dir, CheckpointSeed, CheckpointStore};
use crate::checkpoint::blobs::{self, BlobRef, GroupSource, NewGroup, StoredGroup, BLOBS_DIR};
use crate::checkpoint::envelope::{prepare_payload, write_file, Envelope};
use crate::checkpoint::errors::CheckpointError;
use crate::checkpoint::layout::{
    checkpoint_file_name, create_private_dir, TEMP_PREFIX, TEMP_SUFFIX,
};
use crate::checkpoint::meta::{CheckpointId, CheckpointInfo, CheckpointMeta};

/// How often a save retries when a concurrent save took its sequence number.
const PUBLISH_ATTEMPTS: usize = 8;

/// A checkpoint to save: the caller's metadata, the worker's index of the checkpoint (opaque
/// to the store) and the groups of names whose values are in blobs.
#[derive(Debug, Clone, Copy)]
pub struct NewCheckpoint<'a> {
    pub meta: &'a CheckpointMeta,
    pub payload: &'a [u8],
    pub groups: &'a [NewGroup],
    /// The most the groups' blobs may hold together (the session's own limit).
    pub max_state_bytes: u64,
    /// Another session's checkpoint whose groups an unchanged group may be (a clone's first
    /// checkpoint: its source's latest), linked in when no retained checkpoint has it.
    pub seed: Option<&'a CheckpointSeed>,
}

impl CheckpointStore {
    /// Saves a checkpoint of `session` whose whole state is `payload`, as its newest, then
    /// prunes its oldest beyond the retention.
    ///
    /// Fails with [`CheckpointError::TooLarge`] when the payload exceeds `max_bytes`. Once this
    /// returns, the checkpoint is on disk (file and directory entry fsynced).
    pub fn save(
        &self,
        session: &str,
        meta: &CheckpointMeta,
        payload: &[u8],
    ) -> Result<CheckpointInfo, CheckpointError> {
        self.save_checkpoint(
            session,
            NewCheckpoint {
                meta,
                payload,
                groups: &[],
                max_state_bytes: self.config.max_bytes as u64,
                seed: None,
            },
        )
    }

    /// Saves `checkpoint` of `session` as its newest: takes the blob files of its new groups
    /// into the store, writes the checkpoint file, then prunes the oldest checkpoints beyond
    /// the retention and the disk caps and removes the blobs no checkpoint refers to.
    ///
    /// Fails with [`CheckpointError::TooLarge`] when the payload or the state is over its
    /// limit, [`CheckpointError::UnknownGroup`] when an unchanged group is in no retained
    /// checkpoint (nor in the seed), and [`CheckpointError::DiskFull`] when the checkpoint alone would take the
    /// session or the store over its disk cap. Whatever fails, the blob files given are gone
    /// afterwards and the session's earlier checkpoints are untouched.
    pub fn save_checkpoint(
        &self,
        session: &str,
        checkpoint: NewCheckpoint<'_>,
    ) -> Result<CheckpointInfo, CheckpointError> {
        let remove_sources = || {
            for group in checkpoint.groups {
                if let GroupSource::File(path) = &group.source {
                    let _ = fs::remove_file(path);
                }
            }
        };
        let payload = checkpoint.payload;
        if payload.len() > self.config.max_bytes {
            remove_sources();
            return Err(CheckpointError::TooLarge {
                bytes: payload.len() as u64,
                limit: self.config.max_bytes as u64,
            });
        }
        let dir = self.session_dir(session);
        if let Err(err) = self.create_session_dir(&dir) {
            remove_sources();
            return Err(err);
        }
        let lock = self.session_lock(&dir);
        let _held = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let usage_before = session_usage(&dir);
        let outcome = self.write_checkpoint(session, &dir, checkpoint);
        if outcome.is_err() {
            remove_sources();
        }
        // Whatever happened, no blob outlives the checkpoints that refer to it.
        self.collect_garbage(&dir);
        let written = session_usage(&dir);
        self.account(usage_before, written);
        let (mut info, new_blobs, linked_bytes) = outcome?;
        self.enforce_caps(session, &dir, &info, written)?;
        let added = written
            .saturating_sub(usage_before)
            .saturating_sub(linked_bytes);
        info.written_bytes = Some(added.max(info.file_bytes));
        self.compress_later(&dir, new_blobs);
        Ok(info)
    }

    /// Takes the new blobs in (and links the seed's) and writes the checkpoint file; pruning
    /// and caps come after. Returns the checkpoint, the blobs to compress where that pays,
    /// and the bytes of the files linked from the seed.
    fn write_checkpoint(
        &self,
        session: &str,
        dir: &Path,
        checkpoint: NewCheckpoint<'_>,
    ) -> Result<(CheckpointInfo, Vec<BlobRef>, u64), CheckpointError> {
        let blobs_dir = dir.join(BLOBS_DIR);
        if !checkpoint.groups.is_empty() {
            create_private_dir(&blobs_dir).map_err(io_error("create", &blobs_dir))?;
        }
        let retained = retained_groups(session, dir)?;
        let max_state = checkpoint.max_state_bytes.min(self.config.max_bytes as u64);
        let mut groups = Vec::with_capacity(checkpoint.groups.len());
        let mut new_blobs = Vec::new();
        let mut seed = SeedGroups::new(self, checkpoint.seed);
        // Bytes of blobs linked in from the seed, which take no more disk than before.
        let mut linked_bytes = 0u64;
        let mut state_bytes = 0u64;
        for group in checkpoint.groups {
            let blob = match &group.source {
                GroupSource::Unchanged => match retained.get(group.token.as_str()) {
                    Some(blob) => *blob,
                    None => match seed.link(&group.token, &blobs_dir) {
                        Some((blob, raw, bytes)) => {
                            linked_bytes += bytes;
                            if raw {
                                new_blobs.push(blob);
                            }
                            blob
                        }
                        None => {
                            return Err(CheckpointError::UnknownGroup {
                                token: group.token.clone(),
                            })
                        }
                    },
                },
                GroupSource::File(path) => {
                    let (blob, added) = blobs::ingest(&blobs_dir, path, max_state)?;
                    if added {
                        new_blobs.push(blob);
                    }
                    blob
                }
            };
            state_bytes = state_bytes.saturating_add(blob.bytes);
            if state_bytes > max_state {
                return Err(CheckpointError::TooLarge {
                    bytes: state_bytes,
                    limit: max_state,
                });
            }
            groups.push(StoredGroup {
                token: group.token.clone(),
                names: group.names.clone(),
                blob,
            });
        }

        let payload = checkpoint.payload;
        let meta = checkpoint.meta;
        let stored =
            prepare_payload(payload).map_err(io_error("compress a checkpoint for", dir))?;
        let created_at_ms = u64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis(),
        )
        .unwrap_or(u64::MAX);
        let mut envelope = Envelope {
            session: session.to_owned(),
            sequence: next_sequence(dir)?,
            execution_count: meta.execution_count,
            created_at_ms,
            payload_bytes: payload.len() as u64,
            names_saved: meta.names_saved.clone(),
            names_lost: meta.names_lost.clone(),
            groups,
        };

        for _ in 0..PUBLISH_ATTEMPTS {
            let encoded = envelope.encode()?;
            let path = dir.join(checkpoint_file_name(envelope.sequence));
            let mut temp = tempfile::Builder::new()
                .prefix(TEMP_PREFIX)
                .suffix(TEMP_SUFFIX)
                .tempfile_in(dir)
                .map_err(io_error("create a temporary checkpoint file in", dir))?;
            let file_bytes = write_file(temp.as_file_mut(), &encoded, &stored)
                .map_err(io_error("write", temp.path()))?;
            temp.as_file()
                .sync_all()
                .map_err(io_error("sync", temp.path()))?;
            // Never replace: two saves racing for one sequence must not lose either.
            match temp.persist_noclobber(&path) {
                Ok(_) => {
                    sync_dir(dir)?;
                    self.prune(dir);
                    let info = CheckpointInfo {
                        id: CheckpointId::from_sequence(envelope.sequence),
                        session: envelope.session,
                        created_at: system_time(created_at_ms),
                        meta: meta.clone(),
                        payload_bytes: envelope.payload_bytes,
                        file_bytes,
                        compressed: stored.compressed(),
                        state_bytes,
                        written_bytes: None,
                    };
                    return Ok((info, new_blobs, linked_bytes));
                }
                Err(err) if err.error.kind() == io::ErrorKind::AlreadyExists => {
                    envelope.sequence = next_sequence(dir)?.max(envelope.sequence + 1);
                }
                Err(err) => return Err(io_error("publish", &path)(err.error)),
            }
        }
        Err(CheckpointError::Io {
            action: "publish a checkpoint in",
            path: dir.to_owned(),
            source: io::Error::new(
                io::ErrorKind::AlreadyExists,
                "concurrent saves kept taking the next sequence number",
            ),
        })
    }
}
