//! Errors of the checkpoint store: what a caller of a save or a load can be told, and why a
//! checkpoint file was found unusable.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

use super::envelope::FORMAT_VERSION;
use super::meta::{CheckpointId, SkippedCheckpoint};

/// Failure of a checkpoint store operation.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The payload is larger than the store's `max_bytes`.
    #[error("save a checkpoint of {bytes} bytes: the limit is {limit} bytes")]
    TooLarge { bytes: u64, limit: u64 },
    /// The metadata (mostly the lists of names) is larger than a checkpoint may carry.
    #[error("save checkpoint metadata of {bytes} bytes: the limit is {limit} bytes")]
    MetadataTooLarge { bytes: u64, limit: u64 },
    /// The session has no checkpoint that passes its checks.
    #[error(
        "load the latest checkpoint of session {session:?}: none is usable ({} corrupt skipped)",
        skipped.len()
    )]
    NotFound {
        session: String,
        skipped: Vec<SkippedCheckpoint>,
    },
    /// The checkpoint asked for by id does not exist.
    #[error("load checkpoint {id} of session {session:?}: it does not exist")]
    UnknownCheckpoint { session: String, id: CheckpointId },
    /// The checkpoint asked for by id exists but is unusable.
    #[error("load checkpoint {id} of session {session:?}: {reason}")]
    Corrupt {
        session: String,
        id: CheckpointId,
        #[source]
        reason: CorruptionError,
    },
    /// A checkpoint id string is not of the form `c-<sequence>`.
    #[error("parse checkpoint id {input:?}: expected c-<sequence>")]
    InvalidId { input: String },
    /// Neither `XDG_STATE_HOME` (absolute) nor `HOME` is set.
    #[error("find the state directory: neither XDG_STATE_HOME nor HOME is set")]
    NoStateDir,
    /// A group said to be unchanged is in no retained checkpoint of the session.
    #[error("save a checkpoint reusing group {token:?}: no retained checkpoint has it")]
    UnknownGroup { token: String },
    /// Saving would take the state directory over one of its disk caps.
    #[error("save a checkpoint: it would take {scope} checkpoints to {bytes} bytes on disk, over the cap of {limit} bytes")]
    DiskFull {
        /// `this session's` or `all sessions'`, for the message.
        scope: &'static str,
        bytes: u64,
        limit: u64,
    },
    /// A file system operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

/// Why a checkpoint file cannot be used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CorruptionError {
    /// The file could not be read.
    #[error("read the file: {0}")]
    Read(#[source] io::Error),
    /// The file is shorter than its header says (or than a header).
    #[error("the file is truncated: {actual} bytes, expected {expected}")]
    Truncated { expected: u64, actual: u64 },
    /// The file is longer than its header says.
    #[error("the file has trailing bytes: {actual} bytes, expected {expected}")]
    TrailingBytes { expected: u64, actual: u64 },
    /// The file is larger than any checkpoint this store would write.
    #[error("the file is {bytes} bytes, more than a checkpoint within the limit can be")]
    Oversized { bytes: u64 },
    /// The file does not start with the checkpoint magic bytes.
    #[error("not a checkpoint file (bad magic bytes)")]
    BadMagic,
    /// The file was written in a format this build does not read.
    #[error("format version {version} is not supported (this build reads {FORMAT_VERSION})")]
    UnsupportedVersion { version: u16 },
    /// The header has flags this build does not know.
    #[error("unknown header flags {flags:#06x}")]
    UnknownFlags { flags: u16 },
    /// The header does not match its checksum.
    #[error("header checksum mismatch")]
    HeaderChecksum,
    /// The metadata does not match its checksum.
    #[error("metadata checksum mismatch")]
    EnvelopeChecksum,
    /// The file does not match its trailing checksum.
    #[error("file checksum mismatch")]
    Checksum,
    /// The metadata passed its checksum but does not decode.
    #[error("decode the metadata: {0}")]
    Envelope(#[source] postcard::Error),
    /// The file is in this session's directory but belongs to another session.
    #[error("it belongs to session {found:?}")]
    WrongSession { found: String },
    /// The file's name and its metadata disagree on its sequence number.
    #[error("its metadata says sequence {found}")]
    WrongSequence { found: u64 },
    /// The payload is larger than the store's current `max_bytes`.
    #[error("its payload of {bytes} bytes exceeds the limit of {limit} bytes")]
    TooLarge { bytes: u64, limit: u64 },
    /// The compressed payload does not decompress.
    #[error("decompress the payload: {0}")]
    Decompress(#[source] io::Error),
    /// A blob the checkpoint refers to is not there.
    #[error("its blob {blob} is missing")]
    BlobMissing { blob: String },
    /// A blob the checkpoint refers to does not have the recorded length.
    #[error("a blob is {actual} bytes, the checkpoint says {expected}")]
    BlobLength { expected: u64, actual: u64 },
    /// A blob the checkpoint refers to does not match its hash.
    #[error("a blob does not match its hash")]
    BlobChecksum,
    /// The payload does not have the length the metadata records.
    #[error("the payload is {actual} bytes, its metadata says {expected}")]
    PayloadLength { expected: u64, actual: u64 },
}
