//! [`CheckpointStore`]: saves, lists, loads and prunes the checkpoints of every session under
//! one state directory, with the blobs they share.
//!
//! The SessionActor saves through it after a checkpoint request to its worker, and the
//! RegistryActor loads through it when it restarts a session or the engine.

use std::collections::HashMap;
use std::fs::{self, DirBuilder, File};
use std::io::{self, Read};
use std::num::NonZeroUsize;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use super::blobs::{
    self, BlobRef, GroupSource, LoadedGroup, NewGroup, StoredGroup, BLOBS_DIR, RESTORE_PREFIX,
    TRASH_PREFIX,
};
use super::envelope::{
    decode_file, prepare_payload, write_file, Envelope, HEADER_LEN, MAX_ENVELOPE_BYTES, TRAILER_LEN,
};
use super::errors::{CheckpointError, CorruptionError};
use super::layout::{
    checkpoint_file_name, create_private_dir, is_session_dir_name, is_temp_file_name,
    session_dir_name, unique_name, SESSIONS_DIR, TEMP_PREFIX, TEMP_SUFFIX,
};
use super::meta::{
    CheckpointId, CheckpointInfo, CheckpointMeta, LoadedCheckpoint, SkippedCheckpoint,
};
use disk::session_usage;
use listing::{
    checked_info, newest_session_name, next_sequence, read_info, retained_groups, sequences,
    system_time,
};
pub use options::StoredOptions;
pub use seed::CheckpointSeed;
use seed::SeedGroups;

/// How many checkpoints a session keeps by default. Checkpoints share the blobs of the groups
/// they have in common, so keeping many costs only their differences.
pub const DEFAULT_RETENTION: NonZeroUsize = match NonZeroUsize::new(50) {
    Some(retention) => retention,
    None => panic!("50 is not zero"),
};

/// The largest payload (the worker's index of a checkpoint) and the largest state a
/// checkpoint may hold, engine-wide: 64 GiB. Each session is held to its own, smaller limit
/// (by default its memory limit).
pub const DEFAULT_MAX_BYTES: usize = 64 * 1024 * 1024 * 1024;

/// What the checkpoints of one session may take on disk by default: 8 GiB.
pub const DEFAULT_SESSION_DISK_BYTES: u64 = 8 * 1024 * 1024 * 1024;

/// What the checkpoints of all sessions may take on disk by default: 32 GiB.
pub const DEFAULT_TOTAL_DISK_BYTES: u64 = 32 * 1024 * 1024 * 1024;

/// How often a save retries when a concurrent save took its sequence number.
const PUBLISH_ATTEMPTS: usize = 8;

/// Where and how much a [`CheckpointStore`] keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointStoreConfig {
    /// The state directory; checkpoints go under `<root>/sessions`. See
    /// [`default_state_dir`](super::default_state_dir).
    pub root: PathBuf,
    /// How many checkpoints each session keeps, the newest ones. Default
    /// [`DEFAULT_RETENTION`] (50).
    pub retention: NonZeroUsize,
    /// The largest payload, before compression, that `save` accepts and `load` reads back,
    /// and the largest state a checkpoint may hold. Default [`DEFAULT_MAX_BYTES`].
    pub max_bytes: usize,
    /// What one session's checkpoints may take on disk; the oldest are pruned to stay below.
    pub session_disk_bytes: u64,
    /// What all sessions' checkpoints may take on disk.
    pub total_disk_bytes: u64,
}

impl CheckpointStoreConfig {
    /// A configuration rooted at `root` with the default retention and limits.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            retention: DEFAULT_RETENTION,
            max_bytes: DEFAULT_MAX_BYTES,
            session_disk_bytes: DEFAULT_SESSION_DISK_BYTES,
            total_disk_bytes: DEFAULT_TOTAL_DISK_BYTES,
        }
    }
}

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

/// The checkpoints of every session, as files under one state directory.
///
/// Every method does blocking file I/O, fsync included: call it through
/// `tokio::task::spawn_blocking`, never from an actor's handler. The store is cheap to clone
/// into such a closure, and clones share its locks and its account of the disk. Use one store
/// per state directory at a time: [`CheckpointStore::open`] removes the temporary files that
/// crashed saves leave, and would break another process's save in progress.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    config: CheckpointStoreConfig,
    sessions_dir: PathBuf,
    /// Bytes that every session's checkpoints take on disk, blobs included.
    total_usage: Arc<AtomicU64>,
    /// One lock per session directory: a save, its pruning and its garbage collection must not
    /// interleave with another save of the same session.
    session_locks: Arc<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>>,
}

impl CheckpointStore {
    /// Opens (creating, mode 0700) the store's directories and removes temporary files left by
    /// saves that crashed.
    pub fn open(config: CheckpointStoreConfig) -> Result<Self, CheckpointError> {
        let sessions_dir = config.root.join(SESSIONS_DIR);
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&sessions_dir)
            .map_err(io_error("create the checkpoint directory", &sessions_dir))?;
        let store = Self {
            config,
            sessions_dir,
            total_usage: Arc::default(),
            session_locks: Arc::default(),
        };
        store.remove_temp_files()?;
        let usage = store
            .session_dirs()?
            .iter()
            .map(|dir| session_usage(dir))
            .sum();
        store.total_usage.store(usage, Ordering::Relaxed);
        Ok(store)
    }

    /// The largest payload a checkpoint may have.
    pub fn max_bytes(&self) -> usize {
        self.config.max_bytes
    }

    /// Bytes that the checkpoints of every session take on disk now.
    pub fn disk_usage(&self) -> u64 {
        self.total_usage.load(Ordering::Relaxed)
    }

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

    fn session_lock(&self, dir: &Path) -> Arc<Mutex<()>> {
        let mut locks = self
            .session_locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        locks.entry(dir.to_owned()).or_default().clone()
    }

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

    /// The checkpoints of `session`, newest first, from their metadata alone.
    ///
    /// Files whose header or metadata fail their checks are left out (and logged); a listed
    /// checkpoint's payload is only checked when it is loaded.
    pub fn list(&self, session: &str) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        let dir = self.session_dir(session);
        let mut infos = Vec::new();
        for sequence in sequences(&dir)? {
            let id = CheckpointId::from_sequence(sequence);
            let path = dir.join(checkpoint_file_name(sequence));
            match read_info(session, &path, id) {
                Ok(info) => infos.push(info),
                Err(CorruptionError::Read(err)) if err.kind() == io::ErrorKind::NotFound => {}
                Err(reason) => tracing::warn!(
                    session,
                    checkpoint = %id,
                    path = %path.display(),
                    error = %reason,
                    "leaving an unusable checkpoint out of the list"
                ),
            }
        }
        Ok(infos)
    }

    /// The names of the sessions that have at least one checkpoint with readable metadata,
    /// sorted.
    pub fn sessions(&self) -> Result<Vec<String>, CheckpointError> {
        let mut sessions = Vec::new();
        for dir in self.session_dirs()? {
            if let Some(session) = newest_session_name(&dir)? {
                sessions.push(session);
            }
        }
        sessions.sort();
        sessions.dedup();
        Ok(sessions)
    }

    /// Removes every checkpoint of `session`; returns whether it had a directory.
    pub fn remove_session(&self, session: &str) -> Result<bool, CheckpointError> {
        let dir = self.session_dir(session);
        let lock = self.session_lock(&dir);
        let _held = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let usage = session_usage(&dir);
        match fs::remove_dir_all(&dir) {
            Ok(()) => {
                self.account(usage, 0);
                sync_dir(&self.sessions_dir)?;
                Ok(true)
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(err) => Err(io_error("remove", &dir)(err)),
        }
    }

    fn session_dir(&self, session: &str) -> PathBuf {
        self.sessions_dir.join(session_dir_name(session))
    }

    /// Creates a session's directory if needed, making its entry durable.
    fn create_session_dir(&self, dir: &Path) -> Result<(), CheckpointError> {
        match DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => sync_dir(&self.sessions_dir),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(err) => Err(io_error("create", dir)(err)),
        }
    }

    /// The directories under `sessions/` that may hold checkpoints.
    fn session_dirs(&self) -> Result<Vec<PathBuf>, CheckpointError> {
        let read_error = io_error("read", &self.sessions_dir);
        let mut dirs = Vec::new();
        for entry in fs::read_dir(&self.sessions_dir).map_err(&read_error)? {
            let entry = entry.map_err(&read_error)?;
            let is_dir = entry.file_type().is_ok_and(|kind| kind.is_dir());
            if is_dir && is_session_dir_name(&entry.file_name()) {
                dirs.push(entry.path());
            }
        }
        Ok(dirs)
    }

    /// Removes the temporary files of saves that never finished.
    fn remove_temp_files(&self) -> Result<(), CheckpointError> {
        for dir in self.session_dirs()? {
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(err) => {
                    tracing::warn!(dir = %dir.display(), error = %err, "cannot read a session's checkpoint directory");
                    continue;
                }
            };
            for entry in entries.flatten() {
                let is_leftover = entry.file_name().to_str().is_some_and(|name| {
                    name.starts_with(TRASH_PREFIX) || name.starts_with(RESTORE_PREFIX)
                });
                if is_leftover {
                    // Unused blobs whose removal a crash interrupted, or blobs decompressed
                    // for a restore the engine did not live to clean up.
                    let _ = fs::remove_dir_all(entry.path());
                } else if is_temp_file_name(&entry.file_name()) {
                    let path = entry.path();
                    match fs::remove_file(&path) {
                        Ok(()) => {
                            tracing::info!(path = %path.display(), "removed the temporary file of an interrupted checkpoint")
                        }
                        Err(err) => {
                            tracing::warn!(path = %path.display(), error = %err, "cannot remove the temporary file of an interrupted checkpoint")
                        }
                    }
                }
            }
        }
        Ok(())
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

/// fsyncs a directory, making the entries created or removed in it durable.
fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir)
        .and_then(|handle| handle.sync_all())
        .map_err(io_error("sync", dir))
}

pub(super) fn io_error<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl Fn(io::Error) -> CheckpointError + 'a {
    move |source| CheckpointError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

mod disk;
mod listing;
mod options;
mod seed;
#[cfg(test)]
mod tests;
