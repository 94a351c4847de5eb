//! Loading a checkpoint whole: reading its file with every check (the payload's included),
//! and the blobs of its groups, decompressed where they are stored compressed; without an id,
//! the newest usable checkpoint, skipping the unusable ones.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::listing::{checked_info, sequences};
use super::CheckpointStore;
use crate::checkpoint::blobs::{self, LoadedGroup, BLOBS_DIR, RESTORE_PREFIX};
use crate::checkpoint::envelope::{decode_file, HEADER_LEN, MAX_ENVELOPE_BYTES, TRAILER_LEN};
use crate::checkpoint::errors::{CheckpointError, CorruptionError};
use crate::checkpoint::layout::{checkpoint_file_name, unique_name};
use crate::checkpoint::meta::{CheckpointId, CheckpointInfo, LoadedCheckpoint, SkippedCheckpoint};

impl CheckpointStore {
    /// Loads a checkpoint of `session`: the one named by `id`, or else the newest usable one.
    ///
    /// Without an id, unusable checkpoints (truncated, corrupt, not checkpoints at all) are
    /// skipped for older ones, logged, and listed in [`LoadedCheckpoint::skipped`];
    /// [`CheckpointError::NotFound`] means none is usable. With an id, an unusable checkpoint is
    /// [`CheckpointError::Corrupt`].
    pub fn load(
        &self,
        session: &str,
        id: Option<CheckpointId>,
    ) -> Result<LoadedCheckpoint, CheckpointError> {
        let dir = self.session_dir(session);
        if let Some(id) = id {
            let path = dir.join(checkpoint_file_name(id.sequence()));
            return match self.read_checkpoint(session, &path, id) {
                Ok((info, payload, groups, restore_dir)) => Ok(LoadedCheckpoint {
                    info,
                    payload,
                    groups,
                    restore_dir,
                    skipped: Vec::new(),
                }),
                Err(CorruptionError::Read(err)) if err.kind() == io::ErrorKind::NotFound => {
                    Err(CheckpointError::UnknownCheckpoint {
                        session: session.to_owned(),
                        id,
                    })
                }
                Err(reason) => Err(CheckpointError::Corrupt {
                    session: session.to_owned(),
                    id,
                    reason,
                }),
            };
        }

        let mut skipped = Vec::new();
        for sequence in sequences(&dir)? {
            let id = CheckpointId::from_sequence(sequence);
            let path = dir.join(checkpoint_file_name(sequence));
            match self.read_checkpoint(session, &path, id) {
                Ok((info, payload, groups, restore_dir)) => {
                    return Ok(LoadedCheckpoint {
                        info,
                        payload,
                        groups,
                        restore_dir,
                        skipped,
                    })
                }
                // Pruned by a concurrent save since the directory was read.
                Err(CorruptionError::Read(err)) if err.kind() == io::ErrorKind::NotFound => {}
                Err(reason) => {
                    tracing::warn!(
                        session,
                        checkpoint = %id,
                        path = %path.display(),
                        error = %reason,
                        "skipping an unusable checkpoint"
                    );
                    skipped.push(SkippedCheckpoint { id, path, reason });
                }
            }
        }
        Err(CheckpointError::NotFound {
            session: session.to_owned(),
            skipped,
        })
    }

    /// Reads and checks one whole checkpoint file and the blobs it refers to.
    fn read_checkpoint(
        &self,
        session: &str,
        path: &Path,
        id: CheckpointId,
    ) -> Result<ReadCheckpoint, CorruptionError> {
        // A valid file within the limit is never longer than this: a payload is stored
        // compressed only when that makes it shorter.
        let max_payload = self.config.max_bytes as u64;
        let max_file = (HEADER_LEN + MAX_ENVELOPE_BYTES + TRAILER_LEN) as u64 + max_payload;
        let file = File::open(path).map_err(CorruptionError::Read)?;
        let file_bytes = file.metadata().map_err(CorruptionError::Read)?.len();
        if file_bytes > max_file {
            return Err(CorruptionError::Oversized { bytes: file_bytes });
        }
        let mut bytes = Vec::with_capacity(usize::try_from(file_bytes).unwrap_or(0));
        // `take` bounds the read should the file grow meanwhile.
        file.take(max_file + 1)
            .read_to_end(&mut bytes)
            .map_err(CorruptionError::Read)?;
        let mut decoded = decode_file(&bytes, max_payload)?;
        let stored_groups = std::mem::take(&mut decoded.envelope.groups);
        let info = checked_info(
            session,
            id,
            decoded.envelope,
            bytes.len() as u64,
            decoded.compressed,
        )?;
        let blobs_dir = path.with_file_name(BLOBS_DIR);
        let restore_dir = path.with_file_name(unique_name(RESTORE_PREFIX));
        let mut groups = Vec::with_capacity(stored_groups.len());
        for group in stored_groups {
            let blob_path = match blobs::materialize(&blobs_dir, &group.blob, &restore_dir) {
                Ok(path) => path,
                Err(err) => {
                    let _ = fs::remove_dir_all(&restore_dir);
                    return Err(err);
                }
            };
            groups.push(LoadedGroup {
                token: group.token,
                names: group.names,
                path: blob_path,
                bytes: group.blob.bytes,
            });
        }
        let restore_dir = restore_dir.exists().then_some(restore_dir);
        Ok((info, decoded.payload, groups, restore_dir))
    }
}

/// A checkpoint read back: its description, payload, groups (blob files to read) and the
/// directory of blobs decompressed for the load, if any.
type ReadCheckpoint = (CheckpointInfo, Vec<u8>, Vec<LoadedGroup>, Option<PathBuf>);
