//! [`CheckpointStore`]: saves, lists, loads and prunes the checkpoint files of every session
//! under one state directory.
//!
//! The SessionActor saves through it after a checkpoint request to its worker, and the
//! Supervisor loads through it when it restarts a session or the engine.

use std::fs::{self, DirBuilder, File};
use std::io::{self, Read};
use std::num::NonZeroUsize;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::envelope::{
    decode_file, prepare_payload, read_summary, write_file, Envelope, HEADER_LEN,
    MAX_ENVELOPE_BYTES, TRAILER_LEN,
};
use super::errors::{CheckpointError, CorruptionError};
use super::layout::{
    checkpoint_file_name, is_session_dir_name, is_temp_file_name, parse_checkpoint_file_name,
    session_dir_name, SESSIONS_DIR, TEMP_PREFIX, TEMP_SUFFIX,
};
use super::meta::{
    CheckpointId, CheckpointInfo, CheckpointMeta, LoadedCheckpoint, SkippedCheckpoint,
};

/// How many checkpoints a session keeps by default.
pub const DEFAULT_RETENTION: NonZeroUsize = match NonZeroUsize::new(5) {
    Some(retention) => retention,
    None => panic!("5 is not zero"),
};

/// The largest payload a checkpoint may have by default: 10 MiB.
pub const DEFAULT_MAX_BYTES: usize = 10 * 1024 * 1024;

/// How often a save retries when a concurrent save took its sequence number.
const PUBLISH_ATTEMPTS: usize = 8;

/// Where and how much a [`CheckpointStore`] keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointStoreConfig {
    /// The state directory; checkpoints go under `<root>/sessions`. See
    /// [`default_state_dir`](super::default_state_dir).
    pub root: PathBuf,
    /// How many checkpoints each session keeps, the newest ones. Default
    /// [`DEFAULT_RETENTION`] (5).
    pub retention: NonZeroUsize,
    /// The largest payload, before compression, that `save` accepts and `load` reads back.
    /// Default [`DEFAULT_MAX_BYTES`] (10 MiB).
    pub max_bytes: usize,
}

impl CheckpointStoreConfig {
    /// A configuration rooted at `root` with the default retention and size limit.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            retention: DEFAULT_RETENTION,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// The checkpoints of every session, as files under one state directory.
///
/// Every method does blocking file I/O, fsync included: call it through
/// `tokio::task::spawn_blocking`, never from an actor's handler. The store is cheap to clone
/// into such a closure. Use one store per state directory at a time: [`CheckpointStore::open`]
/// removes the temporary files that crashed saves leave, and would break another process's
/// save in progress.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    config: CheckpointStoreConfig,
    sessions_dir: PathBuf,
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
        };
        store.remove_temp_files()?;
        Ok(store)
    }

    /// The largest payload a checkpoint may have.
    pub fn max_bytes(&self) -> usize {
        self.config.max_bytes
    }

    /// Saves a checkpoint of `session` as its newest, then prunes its oldest beyond the
    /// retention.
    ///
    /// Fails with [`CheckpointError::TooLarge`] when the payload exceeds `max_bytes`. Once this
    /// returns, the checkpoint is on disk (file and directory entry fsynced).
    pub fn save(
        &self,
        session: &str,
        meta: &CheckpointMeta,
        payload: &[u8],
    ) -> Result<CheckpointInfo, CheckpointError> {
        if payload.len() > self.config.max_bytes {
            return Err(CheckpointError::TooLarge {
                bytes: payload.len() as u64,
                limit: self.config.max_bytes as u64,
            });
        }
        let dir = self.session_dir(session);
        self.create_session_dir(&dir)?;
        let stored =
            prepare_payload(payload).map_err(io_error("compress a checkpoint for", &dir))?;
        let created_at_ms = u64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis(),
        )
        .unwrap_or(u64::MAX);
        let mut envelope = Envelope {
            session: session.to_owned(),
            sequence: next_sequence(&dir)?,
            execution_count: meta.execution_count,
            created_at_ms,
            payload_bytes: payload.len() as u64,
            names_saved: meta.names_saved.clone(),
            names_lost: meta.names_lost.clone(),
        };

        for _ in 0..PUBLISH_ATTEMPTS {
            let encoded = envelope.encode()?;
            let path = dir.join(checkpoint_file_name(envelope.sequence));
            let mut temp = tempfile::Builder::new()
                .prefix(TEMP_PREFIX)
                .suffix(TEMP_SUFFIX)
                .tempfile_in(&dir)
                .map_err(io_error("create a temporary checkpoint file in", &dir))?;
            let file_bytes = write_file(temp.as_file_mut(), &encoded, &stored)
                .map_err(io_error("write", temp.path()))?;
            temp.as_file()
                .sync_all()
                .map_err(io_error("sync", temp.path()))?;
            // Never replace: two saves racing for one sequence must not lose either.
            match temp.persist_noclobber(&path) {
                Ok(_) => {
                    sync_dir(&dir)?;
                    self.prune(&dir);
                    return Ok(CheckpointInfo {
                        id: CheckpointId::from_sequence(envelope.sequence),
                        session: envelope.session,
                        created_at: system_time(created_at_ms),
                        meta: meta.clone(),
                        payload_bytes: envelope.payload_bytes,
                        file_bytes,
                        compressed: stored.compressed(),
                    });
                }
                Err(err) if err.error.kind() == io::ErrorKind::AlreadyExists => {
                    envelope.sequence = next_sequence(&dir)?.max(envelope.sequence + 1);
                }
                Err(err) => return Err(io_error("publish", &path)(err.error)),
            }
        }
        Err(CheckpointError::Io {
            action: "publish a checkpoint in",
            path: dir,
            source: io::Error::new(
                io::ErrorKind::AlreadyExists,
                "concurrent saves kept taking the next sequence number",
            ),
        })
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
                Ok((info, payload)) => Ok(LoadedCheckpoint {
                    info,
                    payload,
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
                Ok((info, payload)) => {
                    return Ok(LoadedCheckpoint {
                        info,
                        payload,
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
        match fs::remove_dir_all(&dir) {
            Ok(()) => {
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
                if is_temp_file_name(&entry.file_name()) {
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

    /// Deletes a session's checkpoints beyond the retention, oldest first. The new checkpoint
    /// is saved already, so a failure here is only logged.
    fn prune(&self, dir: &Path) {
        let sequences = match sequences(dir) {
            Ok(sequences) => sequences,
            Err(err) => {
                tracing::warn!(error = %err, "cannot prune old checkpoints");
                return;
            }
        };
        for sequence in sequences.into_iter().skip(self.config.retention.get()) {
            let path = dir.join(checkpoint_file_name(sequence));
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => {
                    tracing::warn!(path = %path.display(), error = %err, "cannot prune an old checkpoint")
                }
            }
        }
    }

    /// Reads and checks one whole checkpoint file.
    fn read_checkpoint(
        &self,
        session: &str,
        path: &Path,
        id: CheckpointId,
    ) -> Result<(CheckpointInfo, Vec<u8>), CorruptionError> {
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
        let decoded = decode_file(&bytes, max_payload)?;
        let info = checked_info(
            session,
            id,
            decoded.envelope,
            bytes.len() as u64,
            decoded.compressed,
        )?;
        Ok((info, decoded.payload))
    }
}

/// Reads the metadata of one checkpoint file, leaving its payload unread.
fn read_info(
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
fn newest_session_name(dir: &Path) -> Result<Option<String>, CheckpointError> {
    let dir_name = dir.file_name().and_then(|name| name.to_str());
    for sequence in sequences(dir)? {
        let path = dir.join(checkpoint_file_name(sequence));
        let summary = File::open(&path)
            .and_then(|file| Ok((file.metadata()?.len(), file)))
            .map_err(CorruptionError::Read)
            .and_then(|(len, mut file)| read_summary(&mut file, len));
        match summary {
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
fn checked_info(
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
    })
}

/// The sequences of the checkpoint files in a session directory, newest first; none when the
/// directory does not exist.
fn sequences(dir: &Path) -> Result<Vec<u64>, CheckpointError> {
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
fn next_sequence(dir: &Path) -> Result<u64, CheckpointError> {
    Ok(sequences(dir)?
        .first()
        .map_or(1, |newest| newest.saturating_add(1)))
}

fn system_time(unix_ms: u64) -> SystemTime {
    // Cannot overflow on 64-bit Unix: u64 milliseconds fit in i64 seconds.
    UNIX_EPOCH
        .checked_add(Duration::from_millis(unix_ms))
        .unwrap_or(UNIX_EPOCH)
}

/// fsyncs a directory, making the entries created or removed in it durable.
fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir)
        .and_then(|handle| handle.sync_all())
        .map_err(io_error("sync", dir))
}

fn io_error<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl Fn(io::Error) -> CheckpointError + 'a {
    move |source| CheckpointError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::process::{Child, Command, Stdio};
    use std::time::Instant;

    use proptest::prelude::*;
    use tempfile::TempDir;

    use super::*;
    use crate::checkpoint::{LostName, COMPRESSION_THRESHOLD};

    const SESSION: &str = "notebook";

    fn store_in(root: &Path, retention: usize, max_bytes: usize) -> CheckpointStore {
        CheckpointStore::open(CheckpointStoreConfig {
            root: root.to_path_buf(),
            retention: NonZeroUsize::new(retention).expect("tests use a retention above 0"),
            max_bytes,
        })
        .expect("open the store")
    }

    fn new_store() -> (TempDir, CheckpointStore) {
        let root = TempDir::new().expect("create a temp dir");
        let store = store_in(root.path(), 5, DEFAULT_MAX_BYTES);
        (root, store)
    }

    fn meta(execution_count: u64) -> CheckpointMeta {
        CheckpointMeta {
            execution_count,
            names_saved: vec!["df".into(), "model".into()],
            names_lost: vec![LostName {
                name: "conn".into(),
                reason: "cannot pickle 'sqlite3.Connection' object".into(),
            }],
        }
    }

    /// Deterministic bytes that zstd cannot shrink.
    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()[0]
            })
            .collect()
    }

    fn file_of(store: &CheckpointStore, session: &str, sequence: u64) -> PathBuf {
        store
            .session_dir(session)
            .join(checkpoint_file_name(sequence))
    }

    fn dir_entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .expect("read dir")
            .map(|entry| {
                entry
                    .expect("dir entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }

    #[test]
    fn small_payload_round_trips_with_its_metadata() {
        let (_root, store) = new_store();
        let saved = store.save(SESSION, &meta(3), b"pickle").expect("save");
        assert_eq!(saved.id.to_string(), "c-1");
        assert!(!saved.compressed);
        assert_eq!(saved.payload_bytes, 6);

        let loaded = store.load(SESSION, None).expect("load");
        assert_eq!(loaded.payload, b"pickle");
        assert_eq!(loaded.info, saved);
        assert!(loaded.skipped.is_empty());
        assert_eq!(store.list(SESSION).expect("list"), vec![saved.clone()]);
        let by_id = store.load(SESSION, Some(saved.id)).expect("load by id");
        assert_eq!(by_id.info, saved);
    }

    #[test]
    fn large_compressible_payload_is_stored_compressed() {
        let (_root, store) = new_store();
        let payload: Vec<u8> = b"column_a,column_b\n1.5,2.5\n"
            .iter()
            .copied()
            .cycle()
            .take(3 * 1024 * 1024)
            .collect();
        let saved = store.save(SESSION, &meta(1), &payload).expect("save");
        assert!(saved.compressed);
        let on_disk = fs::metadata(file_of(&store, SESSION, 1))
            .expect("stat")
            .len();
        assert_eq!(on_disk, saved.file_bytes);
        assert!(
            on_disk < payload.len() as u64 / 10,
            "{on_disk} bytes on disk"
        );
        assert_eq!(store.load(SESSION, None).expect("load").payload, payload);
    }

    #[test]
    fn large_incompressible_payload_is_stored_as_is() {
        let (_root, store) = new_store();
        let payload = noise(COMPRESSION_THRESHOLD + 4096, 9);
        let saved = store.save(SESSION, &meta(1), &payload).expect("save");
        assert!(!saved.compressed);
        assert_eq!(store.load(SESSION, None).expect("load").payload, payload);
    }

    #[test]
    fn retention_keeps_the_newest_checkpoints() {
        let root = TempDir::new().expect("temp dir");
        let store = store_in(root.path(), 3, DEFAULT_MAX_BYTES);
        for count in 1..=7 {
            store
                .save(SESSION, &meta(count), &count.to_le_bytes())
                .expect("save");
        }
        let ids: Vec<_> = store
            .list(SESSION)
            .expect("list")
            .iter()
            .map(|info| info.id.to_string())
            .collect();
        assert_eq!(ids, ["c-7", "c-6", "c-5"]);
        assert_eq!(dir_entries(&store.session_dir(SESSION)).len(), 3);
        let oldest = "c-5".parse().expect("id");
        assert_eq!(
            store.load(SESSION, Some(oldest)).expect("load").payload,
            5u64.to_le_bytes()
        );
    }

    #[test]
    fn sequence_continues_after_the_store_is_reopened() {
        let (root, store) = new_store();
        store.save(SESSION, &meta(1), b"a").expect("save");
        store.save(SESSION, &meta(2), b"b").expect("save");
        drop(store);
        let store = store_in(root.path(), 5, DEFAULT_MAX_BYTES);
        let saved = store.save(SESSION, &meta(3), b"c").expect("save");
        assert_eq!(saved.id.sequence(), 3);
    }

    #[test]
    fn payload_over_the_limit_fails_with_the_limit_error() {
        let root = TempDir::new().expect("temp dir");
        let store = store_in(root.path(), 5, 1000);
        store
            .save(SESSION, &meta(1), &[0; 1000])
            .expect("a payload at the limit is saved");
        match store.save(SESSION, &meta(2), &[0; 1001]) {
            Err(CheckpointError::TooLarge { bytes, limit }) => {
                assert_eq!((bytes, limit), (1001, 1000));
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert_eq!(store.list(SESSION).expect("list").len(), 1);
    }

    #[test]
    fn default_limits_are_as_documented() {
        let config = CheckpointStoreConfig::new("/state");
        assert_eq!(config.retention.get(), 5);
        assert_eq!(config.max_bytes, 10 * 1024 * 1024);
    }

    #[test]
    fn flipped_byte_in_the_newest_checkpoint_falls_back_to_the_previous() {
        let (_root, store) = new_store();
        store.save(SESSION, &meta(1), b"first state").expect("save");
        store
            .save(SESSION, &meta(2), b"second state")
            .expect("save");
        let newest = file_of(&store, SESSION, 2);
        let mut bytes = fs::read(&newest).expect("read");
        let middle = bytes.len() - 8;
        bytes[middle] ^= 0x01;
        fs::write(&newest, bytes).expect("write");

        let loaded = store.load(SESSION, None).expect("load");
        assert_eq!(loaded.payload, b"first state");
        assert_eq!(loaded.info.meta.execution_count, 1);
        assert_eq!(loaded.skipped.len(), 1);
        assert_eq!(loaded.skipped[0].id.sequence(), 2);
        assert!(matches!(
            loaded.skipped[0].reason,
            CorruptionError::Checksum
        ));

        let by_id = store.load(SESSION, Some(CheckpointId::from_sequence(2)));
        assert!(matches!(
            by_id,
            Err(CheckpointError::Corrupt {
                reason: CorruptionError::Checksum,
                ..
            })
        ));
    }

    #[test]
    fn truncated_newest_checkpoint_falls_back_to_the_previous() {
        let (_root, store) = new_store();
        store.save(SESSION, &meta(1), b"first state").expect("save");
        store
            .save(SESSION, &meta(2), &noise(10_000, 2))
            .expect("save");
        let newest = file_of(&store, SESSION, 2);
        let len = fs::metadata(&newest).expect("stat").len();
        File::options()
            .write(true)
            .open(&newest)
            .and_then(|file| file.set_len(len / 2))
            .expect("truncate");

        let loaded = store.load(SESSION, None).expect("load");
        assert_eq!(loaded.payload, b"first state");
        assert!(matches!(
            loaded.skipped[0].reason,
            CorruptionError::Truncated { .. }
        ));
        // Listing reads only headers, but still sees that the file is short.
        let listed: Vec<_> = store
            .list(SESSION)
            .expect("list")
            .iter()
            .map(|info| info.id.sequence())
            .collect();
        assert_eq!(listed, [1]);
    }

    #[test]
    fn garbage_files_named_like_checkpoints_are_skipped() {
        let (_root, store) = new_store();
        store.save(SESSION, &meta(1), b"state").expect("save");
        let dir = store.session_dir(SESSION);
        fs::write(
            dir.join(checkpoint_file_name(9)),
            b"not a checkpoint at all, but longer than a header",
        )
        .expect("write");
        fs::write(dir.join(checkpoint_file_name(8)), b"").expect("write");
        fs::write(dir.join("junk.ckpt"), b"junk").expect("write");

        let loaded = store.load(SESSION, None).expect("load");
        assert_eq!(loaded.payload, b"state");
        let skipped: Vec<_> = loaded.skipped.iter().map(|s| s.id.sequence()).collect();
        assert_eq!(skipped, [9, 8]);
        assert!(matches!(
            loaded.skipped[0].reason,
            CorruptionError::BadMagic
        ));
        assert!(matches!(
            loaded.skipped[1].reason,
            CorruptionError::Truncated { .. }
        ));
        // Numbering continues past the garbage, never reusing its name.
        let saved = store.save(SESSION, &meta(2), b"next").expect("save");
        assert_eq!(saved.id.sequence(), 10);
    }

    #[test]
    fn no_usable_checkpoint_is_not_found() {
        let (_root, store) = new_store();
        match store.load("never-saved", None) {
            Err(CheckpointError::NotFound { session, skipped }) => {
                assert_eq!(session, "never-saved");
                assert!(skipped.is_empty());
            }
            other => panic!("expected NotFound, got {other:?}"),
        }

        store.save(SESSION, &meta(1), b"state").expect("save");
        fs::write(file_of(&store, SESSION, 1), b"PYVCKPT\0garbage").expect("write");
        match store.load(SESSION, None) {
            Err(CheckpointError::NotFound { skipped, .. }) => assert_eq!(skipped.len(), 1),
            other => panic!("expected NotFound, got {other:?}"),
        }
        assert!(matches!(
            store.load(SESSION, Some(CheckpointId::from_sequence(99))),
            Err(CheckpointError::UnknownCheckpoint { .. })
        ));
    }

    #[test]
    fn checkpoint_moved_into_another_session_is_not_loaded_for_it() {
        let (_root, store) = new_store();
        store
            .save("alice", &meta(1), b"alice's data")
            .expect("save");
        store.save("bob", &meta(1), b"bob's data").expect("save");
        fs::copy(file_of(&store, "alice", 1), file_of(&store, "bob", 2)).expect("copy");

        let loaded = store.load("bob", None).expect("load");
        assert_eq!(loaded.payload, b"bob's data");
        assert!(matches!(
            loaded.skipped[0].reason,
            CorruptionError::WrongSession { ref found } if found == "alice"
        ));
    }

    #[test]
    fn temporary_files_are_ignored_and_removed_on_open() {
        let (root, store) = new_store();
        store.save(SESSION, &meta(1), b"state").expect("save");
        let dir = store.session_dir(SESSION);
        let leftover = dir.join(format!("{TEMP_PREFIX}crashed{TEMP_SUFFIX}"));
        fs::write(&leftover, b"PYVCKPT\0half a checkpo").expect("write");

        assert_eq!(store.load(SESSION, None).expect("load").payload, b"state");
        assert_eq!(store.list(SESSION).expect("list").len(), 1);
        store_in(root.path(), 5, DEFAULT_MAX_BYTES);
        assert!(!leftover.exists());
        assert_eq!(dir_entries(&dir), [checkpoint_file_name(1)]);
    }

    #[test]
    fn hostile_session_names_stay_inside_the_store() {
        let outer = TempDir::new().expect("temp dir");
        let root = outer.path().join("state");
        let store = store_in(&root, 5, DEFAULT_MAX_BYTES);
        let long = "x".repeat(5000);
        let names = ["../x", "/", "", "..", ".", "a/../../b", "\u{0}", &long];
        for (count, name) in names.iter().enumerate() {
            store
                .save(name, &meta(count as u64), name.as_bytes())
                .expect("save");
        }
        for name in names {
            assert_eq!(
                store.load(name, None).expect("load").payload,
                name.as_bytes()
            );
        }
        // Nothing was written outside <root>/sessions/<one directory per session>.
        assert_eq!(dir_entries(outer.path()), ["state"]);
        assert_eq!(dir_entries(&root), [SESSIONS_DIR]);
        let sessions_dir = root.join(SESSIONS_DIR);
        assert_eq!(dir_entries(&sessions_dir).len(), names.len());
        for dir in dir_entries(&sessions_dir) {
            assert_eq!(
                dir_entries(&sessions_dir.join(dir)),
                [checkpoint_file_name(1)]
            );
        }
        let mut expected: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        expected.sort();
        assert_eq!(store.sessions().expect("sessions"), expected);
    }

    #[test]
    fn directories_are_private_and_files_owner_only() {
        let (root, store) = new_store();
        store.save(SESSION, &meta(1), b"secret").expect("save");
        let mode = |path: &Path| fs::metadata(path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&root.path().join(SESSIONS_DIR)), 0o700);
        assert_eq!(mode(&store.session_dir(SESSION)), 0o700);
        assert_eq!(mode(&file_of(&store, SESSION, 1)), 0o600);
    }

    #[test]
    fn sessions_on_disk_are_found_and_removed() {
        let (root, store) = new_store();
        store.save("b", &meta(1), b"1").expect("save");
        store.save("a", &meta(1), b"1").expect("save");
        // A restarted engine finds them.
        let store = store_in(root.path(), 5, DEFAULT_MAX_BYTES);
        assert_eq!(store.sessions().expect("sessions"), ["a", "b"]);

        assert!(store.remove_session("a").expect("remove"));
        assert!(!store.remove_session("a").expect("remove again"));
        assert_eq!(store.sessions().expect("sessions"), ["b"]);
        assert!(matches!(
            store.load("a", None),
            Err(CheckpointError::NotFound { .. })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn corrupt_files_never_panic_nor_load_wrong_data(
            compressible in any::<bool>(),
            flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..6),
            cut in prop::option::of(any::<prop::sample::Index>()),
            extra in prop::collection::vec(any::<u8>(), 0..3),
        ) {
            let (_root, store) = new_store();
            let payload = if compressible {
                vec![b'z'; COMPRESSION_THRESHOLD + 10]
            } else {
                noise(300, 5)
            };
            store.save(SESSION, &meta(4), &payload).expect("save");
            let path = file_of(&store, SESSION, 1);
            let mut bytes = fs::read(&path).expect("read");
            for (at, mask) in flips {
                let at = at.index(bytes.len());
                bytes[at] ^= mask;
            }
            if let Some(cut) = cut {
                bytes.truncate(cut.index(bytes.len()));
            }
            bytes.extend(extra);
            fs::write(&path, &bytes).expect("write");

            store.list(SESSION).expect("list");
            match store.load(SESSION, None) {
                Ok(loaded) => {
                    prop_assert_eq!(loaded.payload, payload);
                    prop_assert_eq!(loaded.info.meta, meta(4));
                }
                Err(CheckpointError::NotFound { skipped, .. }) => prop_assert_eq!(skipped.len(), 1),
                Err(other) => prop_assert!(false, "unexpected error {other}"),
            }
        }
    }

    /// Set to a store root, this makes [`crash_writer`] save checkpoints until it is killed.
    const WRITER_ENV: &str = "PYVISOR_TEST_CHECKPOINT_WRITER_ROOT";

    /// The payload the writer saves with a given execution count: partly incompressible, so
    /// zstd works and the file is large.
    fn writer_payload(execution_count: u64) -> Vec<u8> {
        let mut payload = noise(3 * 1024 * 1024, execution_count);
        payload.resize(6 * 1024 * 1024, b'p');
        payload
    }

    /// The writer half of the SIGKILL test, run in a child process; does nothing unless
    /// [`WRITER_ENV`] is set.
    #[test]
    #[ignore = "run as a child process by sigkill_during_saves_leaves_a_loadable_checkpoint"]
    fn crash_writer() {
        let Some(root) = std::env::var_os(WRITER_ENV) else {
            return;
        };
        let store = store_in(Path::new(&root), 3, DEFAULT_MAX_BYTES);
        let first = store
            .list(SESSION)
            .expect("list")
            .first()
            .map_or(1, |info| info.meta.execution_count + 1);
        // Bounded, should the parent fail to kill it.
        for count in first..first + 500 {
            store
                .save(SESSION, &meta(count), &writer_payload(count))
                .expect("save");
        }
    }

    /// Kills the writer process if a test assertion fails first.
    struct WriterProcess(Child);

    impl Drop for WriterProcess {
        fn drop(&mut self) {
            // Already dead after a normal run; errors only mean that.
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn newest_sequence(store: &CheckpointStore) -> u64 {
        sequences(&store.session_dir(SESSION))
            .expect("list sequences")
            .first()
            .copied()
            .unwrap_or(0)
    }

    fn temp_files(store: &CheckpointStore) -> Vec<String> {
        dir_entries(&store.session_dir(SESSION))
            .into_iter()
            .filter(|name| is_temp_file_name(std::ffi::OsStr::new(name)))
            .collect()
    }

    #[test]
    fn sigkill_during_saves_leaves_a_loadable_checkpoint() {
        let root = TempDir::new().expect("temp dir");
        let store = store_in(root.path(), 3, DEFAULT_MAX_BYTES);
        let test_name = concat!(module_path!(), "::crash_writer")
            .split_once("::")
            .map(|(_crate, path)| path)
            .expect("module_path! starts with the crate name");
        let test_binary = std::env::current_exe().expect("the test binary's path");

        for _ in 0..4 {
            let before = newest_sequence(&store);
            let mut writer = WriterProcess(
                Command::new(&test_binary)
                    .args([test_name, "--exact", "--ignored", "--test-threads=1"])
                    .env(WRITER_ENV, root.path())
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn the writer"),
            );
            // Wait for one save to finish, then for the next one to start writing its
            // temporary file, and kill the writer there.
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut saved = false;
            loop {
                if let Some(status) = writer.0.try_wait().expect("poll the writer") {
                    panic!("the writer exited early: {status}");
                }
                assert!(Instant::now() < deadline, "the writer made no progress");
                saved = saved || newest_sequence(&store) > before;
                if saved && !temp_files(&store).is_empty() {
                    break;
                }
                std::thread::yield_now();
            }
            writer.0.kill().expect("SIGKILL the writer");
            writer.0.wait().expect("reap the writer");

            let reopened = store_in(root.path(), 3, DEFAULT_MAX_BYTES);
            let loaded = reopened.load(SESSION, None).expect("load after SIGKILL");
            assert!(loaded.skipped.is_empty(), "{:?}", loaded.skipped);
            assert!(loaded.info.id.sequence() > before);
            assert!(
                loaded.payload == writer_payload(loaded.info.meta.execution_count),
                "the payload of {} is not the one saved",
                loaded.info.id
            );
            let leftovers = temp_files(&reopened);
            assert!(leftovers.is_empty(), "{leftovers:?}");
        }
    }
}
