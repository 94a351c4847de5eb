//! The host-side checkpoint store: session state saved to disk so that it survives a crashed
//! worker or a restarted engine.
//!
//! The Python worker pickles its namespace in groups of names (names that share objects go
//! together), each group that changed since the last checkpoint to a blob file of its own,
//! and describes the checkpoint in an index (imports, definitions) that is opaque to the host.
//! [`CheckpointStore::save_checkpoint`] takes the new blobs in under their content hash
//! (the `blobs` module), and writes a checkpoint file: metadata (execution count, names saved, names
//! lost and why, the groups and their blobs) and the index as payload. A group that did not
//! change points to the blob an earlier checkpoint stored, so checkpoints share their common
//! blobs and cost only their differences. The store owns one directory:
//!
//! ```text
//! <root>/                                  (0700; default: $XDG_STATE_HOME/pyvisor)
//!   sessions/                              (0700)
//!     s-<sanitised session name>/          (0700)
//!       00000000000000000007.ckpt          (0600; checkpoint c-7)
//!       .partial-XXXXXX.tmp                (a save in progress, or left by a crash)
//!       blobs/                             (0700)
//!         <32 hex digits of XXH3-128>      (0600; one group's pickled values)
//!       .trash-<nanos>/                    (unused blobs, being removed in the background)
//! ```
//!
//! Retention (50 checkpoints by default) and two disk caps (per session, and for the whole
//! store) bound what is kept: the oldest checkpoints go first, and a blob goes with the last
//! checkpoint that refers to it.
//!
//! Session names come from clients, so a directory name keeps only `[A-Za-z0-9_-]` and
//! percent-encodes every other byte; a name whose encoding is long is cut and suffixed with a
//! hash of the whole name. A name can therefore never escape `sessions/`, and the full name
//! is kept inside every checkpoint and checked on load.
//!
//! # File format (version 2, integers little-endian)
//!
//! ```text
//! offset  size  field
//!      0     8  magic "PYVCKPT\0"
//!      8     2  format version (1)
//!     10     2  flags: bit 0 = payload compressed with zstd; other bits must be 0
//!     12     4  envelope length E
//!     16     8  stored payload length P (after compression, if any)
//!     24     4  CRC-32 of the envelope
//!     28     4  CRC-32 of bytes 0..28
//!     32     E  envelope: postcard encoding of session name, sequence, execution count,
//!               creation time (Unix ms), uncompressed payload length, names saved, names lost,
//!               groups (worker token, names, blob hash and length)
//!   32+E     P  payload
//! 32+E+P     4  CRC-32 of every byte before it
//! ```
//!
//! The header and envelope checksums let [`CheckpointStore::list`] read metadata without
//! reading payloads; the trailing checksum covers the whole file and is checked by
//! [`CheckpointStore::load`]. Payloads above [`COMPRESSION_THRESHOLD`] are compressed with zstd
//! when that makes them smaller.
//!
//! # Crash safety
//!
//! A save writes a temporary file in the session's directory, fsyncs it, renames it to its
//! final name (never replacing a file) and fsyncs the directory. A crash at any point leaves
//! either the new checkpoint complete or no trace of it but a temporary file, which
//! [`CheckpointStore::open`] removes. A file that is truncated, has a flipped byte, or is not
//! a checkpoint at all fails its magic, version, length or checksum check, and `load` falls
//! back to the previous checkpoint, reporting the ones it skipped; so does a checkpoint one of
//! whose blobs is missing, of the wrong length or does not match its hash. Blobs are fsynced
//! before the checkpoint file that refers to them is written.

mod blobs;
mod envelope;
mod errors;
mod handover;
mod layout;
mod meta;
mod store;

pub use blobs::{BlobRef, GroupSource, LoadedGroup, NewGroup, StoredGroup};
pub use envelope::{COMPRESSION_THRESHOLD, FORMAT_VERSION};
pub use errors::{CheckpointError, CorruptionError};
pub use handover::hand_over_blobs;
pub use layout::default_state_dir;
pub use meta::{
    CheckpointId, CheckpointInfo, CheckpointMeta, LoadedCheckpoint, LostName, SkippedCheckpoint,
};
pub use store::{
    CheckpointSeed, CheckpointStore, CheckpointStoreConfig, NewCheckpoint, StoredOptions,
    DEFAULT_MAX_BYTES, DEFAULT_RETENTION, DEFAULT_SESSION_DISK_BYTES, DEFAULT_TOTAL_DISK_BYTES,
};
