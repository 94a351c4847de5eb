//! What the checkpoint store takes and gives back besides the payload: checkpoint ids, the
//! metadata a caller attaches to a save, and the descriptions of saved, loaded and skipped
//! checkpoints.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::SystemTime;

pub use pyvisor_protocol::LostName;

use super::blobs::LoadedGroup;
use super::errors::{CheckpointError, CorruptionError};

/// The id of a checkpoint within its session, written `c-<sequence>`.
///
/// Sequences grow by one per save and continue from the files on disk after a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CheckpointId(u64);

impl CheckpointId {
    pub(super) fn from_sequence(sequence: u64) -> Self {
        Self(sequence)
    }

    /// The sequence number of this checkpoint within its session.
    pub fn sequence(self) -> u64 {
        self.0
    }
}

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c-{}", self.0)
    }
}

impl FromStr for CheckpointId {
    type Err = CheckpointError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        input
            .strip_prefix("c-")
            .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|digits| digits.parse().ok())
            .map(Self)
            .ok_or_else(|| CheckpointError::InvalidId {
                input: input.to_owned(),
            })
    }
}

/// The metadata a caller attaches to a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointMeta {
    /// The session's execution count when the checkpoint was taken.
    pub execution_count: u64,
    /// The names the payload holds.
    pub names_saved: Vec<String>,
    /// The names the payload does not hold, with the reason for each.
    pub names_lost: Vec<LostName>,
}

/// A checkpoint on disk, as described by its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// The checkpoint's id within its session.
    pub id: CheckpointId,
    /// The session the checkpoint belongs to.
    pub session: String,
    /// When the checkpoint was saved (millisecond precision).
    pub created_at: SystemTime,
    /// The caller's metadata.
    pub meta: CheckpointMeta,
    /// The payload's length before compression.
    pub payload_bytes: u64,
    /// The length of the checkpoint file.
    pub file_bytes: u64,
    /// Whether the payload is stored compressed.
    pub compressed: bool,
    /// The bytes of the blobs that hold the checkpoint's values, shared or not.
    pub state_bytes: u64,
    /// What saving the checkpoint added to the disk (new blobs and the file); only known to
    /// the save that wrote it.
    pub written_bytes: Option<u64>,
}

/// A checkpoint read back from disk.
#[derive(Debug)]
pub struct LoadedCheckpoint {
    /// What the checkpoint is.
    pub info: CheckpointInfo,
    /// The payload exactly as it was given to `save`.
    pub payload: Vec<u8>,
    /// The groups of names and their blobs, each checked against its hash.
    pub groups: Vec<LoadedGroup>,
    /// A directory holding blobs that are stored compressed, decompressed for this load;
    /// the caller removes it once the worker has read (or mapped) them.
    pub restore_dir: Option<PathBuf>,
    /// Newer checkpoints of the session that were skipped because they are unusable.
    pub skipped: Vec<SkippedCheckpoint>,
}

/// A checkpoint file that `load` passed over, and why.
#[derive(Debug)]
pub struct SkippedCheckpoint {
    /// The id its file name gives it.
    pub id: CheckpointId,
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: CorruptionError,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_id_round_trips_through_its_string_form() {
        let id = CheckpointId::from_sequence(42);
        assert_eq!(id.to_string(), "c-42");
        assert_eq!("c-42".parse::<CheckpointId>().ok(), Some(id));
    }

    #[test]
    fn malformed_checkpoint_ids_are_rejected() {
        for input in [
            "",
            "c-",
            "42",
            "c-x",
            "c--1",
            "c-+1",
            "c-1 ",
            "d-1",
            "c-99999999999999999999",
        ] {
            assert!(
                matches!(
                    input.parse::<CheckpointId>(),
                    Err(CheckpointError::InvalidId { .. })
                ),
                "{input:?} parsed"
            );
        }
    }
}
