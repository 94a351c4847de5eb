//! Seeding a new session's checkpoints from another session's: a clone of a forked session
//! inherits its source's record of the groups of the source's latest checkpoint, so its first
//! checkpoint names those groups unchanged, and the store hard-links their blobs in from the
//! source's directory instead of having the clone pickle and write them again (a clone of a
//! session holding 400 MB writes only what changed since its source's checkpoint).
//!
//! A link is the blob itself, shared: it outlives the source's checkpoints, and the clone's
//! own pruning and garbage collection treat it as any blob of the clone.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::listing::envelopes;
use super::CheckpointStore;
use crate::checkpoint::blobs::{self, BlobRef, BLOBS_DIR};
use crate::checkpoint::errors::CheckpointError;
use crate::checkpoint::meta::CheckpointId;

/// A checkpoint of another session whose groups a session's checkpoint may name unchanged:
/// the one its worker's record of groups describes (for a clone, its source's latest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointSeed {
    /// The other session's key in the store.
    pub key: String,
    pub checkpoint: CheckpointId,
}

/// The groups of a seed, read from its checkpoint when a group is first asked for.
pub(super) struct SeedGroups<'a> {
    seed: Option<&'a CheckpointSeed>,
    dir: PathBuf,
    groups: Option<HashMap<String, BlobRef>>,
}

impl<'a> SeedGroups<'a> {
    pub(super) fn new(store: &CheckpointStore, seed: Option<&'a CheckpointSeed>) -> Self {
        let dir = seed.map_or_else(PathBuf::new, |seed| store.session_dir(&seed.key));
        Self {
            seed,
            dir,
            groups: None,
        }
    }

    /// Links the blob of the seed's group `token` into `blobs_dir`: its reference, whether it
    /// is raw (to be compressed where that pays) and the bytes of the file newly linked (on
    /// the disk already), or `None` when the seed has no such group or its blob is gone.
    pub(super) fn link(&mut self, token: &str, blobs_dir: &Path) -> Option<(BlobRef, bool, u64)> {
        let seed = self.seed?;
        let dir = &self.dir;
        let groups = self.groups.get_or_insert_with(|| {
            seed_groups(seed, dir).unwrap_or_else(|err| {
                tracing::debug!(seed = %seed.key, error = %err, "a checkpoint seed is unreadable");
                HashMap::new()
            })
        });
        let blob = *groups.get(token)?;
        match blobs::link(&self.dir.join(BLOBS_DIR), blobs_dir, &blob) {
            Ok((raw, bytes)) => Some((blob, raw, bytes)),
            Err(err) => {
                tracing::debug!(seed = %seed.key, blob = %blob.file_name(), error = %err, "a seed's blob cannot be linked");
                None
            }
        }
    }
}

/// The groups of the seed's checkpoint, by token.
fn seed_groups(
    seed: &CheckpointSeed,
    dir: &Path,
) -> Result<HashMap<String, BlobRef>, CheckpointError> {
    let envelope = envelopes(dir)?.into_iter().find(|envelope| {
        envelope.session == seed.key && envelope.sequence == seed.checkpoint.sequence()
    });
    Ok(envelope
        .into_iter()
        .flat_map(|envelope| envelope.groups)
        .map(|group| (group.token, group.blob))
        .collect())
}
