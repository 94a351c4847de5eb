//! Reading a session directory: the sequences of its checkpoint files, their metadata and the
//! groups they hold, without their payloads.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::io_error;
use crate::checkpoint::blobs::BlobRef;
use crate::checkpoint::envelope::{read_summary, Envelope, Summary};
use crate::checkpoint::errors::{CheckpointError, CorruptionError};
use crate::checkpoint::layout::{
    checkpoint_file_name, parse_checkpoint_file_name, session_dir_name,
};
use crate::checkpoint::meta::{CheckpointId, CheckpointInfo, CheckpointMeta};

/// Reads the metadata of one checkpoint file, leaving its payload unread.
pub(super) fn read_info(
    session: &str,
    path: &Path,
    id: CheckpointId,
) -> Result<CheckpointInfo, CorruptionError> {
    let mut file = File::open(path).map_err(CorruptionError::Read)?;
    let file_bytes = file.metadata().map_err(CorruptionError::Read)?.len();
    let summary = read_summary(&mut file, file_bytes)?;
    checked_info(
        session,
        id,
        summary.envelope,
        file_bytes,
        summary.compressed,
    )
}

/// The session name recorded in the newest checkpoint of a directory whose metadata is
/// readable and whose name matches the directory.
pub(super) fn newest_session_name(dir: &Path) -> Result<Option<String>, CheckpointError> {
    let dir_name = dir.file_name().and_then(|name| name.to_str());
    for sequence in sequences(dir)? {
        let path = dir.join(checkpoint_file_name(sequence));
        match summary_of(&path) {
            Ok(summary)
                if Some(session_dir_name(&summary.envelope.session).as_str()) == dir_name =>
            {
                return Ok(Some(summary.envelope.session));
            }
            Ok(_) => {
                tracing::warn!(path = %path.display(), "a checkpoint is in another session's directory")
            }
            Err(err) => {
                tracing::warn!(path = %path.display(), error = %err, "skipping an unusable checkpoint")
            }
        }
    }
    Ok(None)
}

/// Checks that a file's metadata matches where it was found, and describes it.
pub(super) fn checked_info(
    session: &str,
    id: CheckpointId,
    envelope: Envelope,
    file_bytes: u64,
    compressed: bool,
) -> Result<CheckpointInfo, CorruptionError> {
    if envelope.session != session {
        return Err(CorruptionError::WrongSession {
            found: envelope.session,
        });
    }
    if envelope.sequence != id.sequence() {
        return Err(CorruptionError::WrongSequence {
            found: envelope.sequence,
        });
    }
    Ok(CheckpointInfo {
        id,
        session: envelope.session,
        created_at: system_time(envelope.created_at_ms),
        meta: CheckpointMeta {
            execution_count: envelope.execution_count,
            names_saved: envelope.names_saved,
            names_lost: envelope.names_lost,
        },
        payload_bytes: envelope.payload_bytes,
        file_bytes,
        compressed,
        state_bytes: envelope.groups.iter().map(|g| g.blob.bytes).sum(),
        written_bytes: None,
    })
}

/// The sequences of the checkpoint files in a session directory, newest first; none when the
/// directory does not exist.
pub(super) fn sequences(dir: &Path) -> Result<Vec<u64>, CheckpointError> {
    let read_error = io_error("read", dir);
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(read_error(err)),
    };
    let mut sequences = Vec::new();
    for entry in entries {
        let entry = entry.map_err(&read_error)?;
        if let Some(sequence) = parse_checkpoint_file_name(&entry.file_name()) {
            sequences.push(sequence);
        }
    }
    sequences.sort_unstable_by(|a, b| b.cmp(a));
    Ok(sequences)
}

/// The sequence for the next checkpoint in a directory: one past the newest file there, so
/// numbering continues across restarts.
pub(super) fn next_sequence(dir: &Path) -> Result<u64, CheckpointError> {
    Ok(sequences(dir)?
        .first()
        .map_or(1, |newest| newest.saturating_add(1)))
}

pub(super) fn system_time(unix_ms: u64) -> SystemTime {
    // Cannot overflow on 64-bit Unix: u64 milliseconds fit in i64 seconds.
    UNIX_EPOCH
        .checked_add(Duration::from_millis(unix_ms))
        .unwrap_or(UNIX_EPOCH)
}

/// The readable envelopes of the checkpoints in a session directory, newest first.
pub(super) fn envelopes(dir: &Path) -> Result<Vec<Envelope>, CheckpointError> {
    let mut found = Vec::new();
    for sequence in sequences(dir)? {
        if let Ok(summary) = summary_of(&dir.join(checkpoint_file_name(sequence))) {
            found.push(summary.envelope);
        }
    }
    Ok(found)
}

/// The checked header and metadata of the checkpoint file at `path`.
fn summary_of(path: &Path) -> Result<Summary, CorruptionError> {
    let mut file = File::open(path).map_err(CorruptionError::Read)?;
    let len = file.metadata().map_err(CorruptionError::Read)?.len();
    read_summary(&mut file, len)
}

/// The blob of every group of the retained checkpoints of a session, by the group's token.
pub(super) fn retained_groups(
    session: &str,
    dir: &Path,
) -> Result<HashMap<String, BlobRef>, CheckpointError> {
    let mut groups = HashMap::new();
    for envelope in envelopes(dir)? {
        if envelope.session == session {
            for group in envelope.groups {
                groups.entry(group.token).or_insert(group.blob);
            }
        }
    }
    Ok(groups)
}
