//! [`CheckpointStore`]: saves, lists, loads and prunes the checkpoints of every session under
//! one state directory, with the blobs they share.
//!
//! The SessionActor saves through it after a checkpoint request to its worker, and the
//! RegistryActor loads through it when it restarts a session or the engine.

use std::collections::HashMap;
use std::fs::{self, DirBuilder, File};
use std::io;
use std::num::NonZeroUsize;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::blobs::{RESTORE_PREFIX, TRASH_PREFIX};
use super::errors::{CheckpointError, CorruptionError};
use super::layout::{
    checkpoint_file_name, is_session_dir_name, is_temp_file_name, session_dir_name, SESSIONS_DIR,
};
use super::meta::{CheckpointId, CheckpointInfo};
use disk::session_usage;
use listing::{newest_session_name, read_info, sequences};
pub use options::StoredOptions;
pub use save::NewCheckpoint;
pub use seed::CheckpointSeed;

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

    fn session_lock(&self, dir: &Path) -> Arc<Mutex<()>> {
        let mut locks = self
            .session_locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        locks.entry(dir.to_owned()).or_default().clone()
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
}

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
mod load;
mod options;
mod save;
mod seed;
#[cfg(test)]
mod tests;
