//! The content-addressed blobs of a session's checkpoints.
//!
//! The worker pickles its namespace as groups of names (the names that share objects go
//! together) and writes each group that changed since its last checkpoint to a file of its
//! own. The store takes such a file in once: it hashes it (XXH3-128), moves it to
//! `blobs/<hash>` in the session's directory and records the reference in the checkpoint.
//! Every checkpoint that holds the same group refers to the same blob, so keeping many
//! checkpoints costs only their differences; a blob that no checkpoint refers to any more is
//! removed.
//!
//! Blob files come from the worker, which runs the session's (hostile) code: they are opened
//! without following symlinks, must be regular files within the size limit, and are checked
//! against their hash again whenever a checkpoint is loaded.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use super::errors::{CheckpointError, CorruptionError};
use super::layout::create_private_dir;

/// The directory, inside a session's checkpoint directory, that holds its blobs.
pub(super) const BLOBS_DIR: &str = "blobs";

/// Prefix of the directories, inside a session's checkpoint directory, that hold unused blobs
/// on their way out.
pub(super) const TRASH_PREFIX: &str = ".trash-";

/// Prefix of the directories, inside a session's checkpoint directory, that hold compressed
/// blobs decompressed for a restore.
pub(super) const RESTORE_PREFIX: &str = ".restore-";

/// Prefix of a blob being compressed, in the blobs directory.
const COMPRESSING_PREFIX: &str = ".compressing-";

/// Suffix of a blob stored compressed with zstd.
const COMPRESSED_SUFFIX: &str = ".zst";

/// Blobs smaller than this are never compressed: there is little to win.
pub(super) const COMPRESS_MIN: u64 = 1024 * 1024;

/// The sample by which compression is chosen: this many windows of this many bytes, spread
/// over the blob.
const SAMPLE_WINDOWS: u64 = 4;
const SAMPLE_WINDOW: usize = 256 * 1024;

/// A blob is stored compressed when its sample compresses to at most this share of its size:
/// pickles of real tables (numbers read from CSV files, strings, categories) come to 0.1-0.3,
/// random floats to about 0.95, where compressing would cost time and win nothing.
const COMPRESSION_PAYS: f64 = 0.75;

/// zstd's fastest level that still compresses tables well.
const ZSTD_LEVEL: i32 = 1;

/// Bytes read at a time while hashing a blob.
const HASH_CHUNK: usize = 4 * 1024 * 1024;

/// A blob as a checkpoint refers to it: its content hash and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlobRef {
    /// XXH3-128 of the blob's bytes.
    pub hash: u128,
    /// The blob's length in bytes.
    pub bytes: u64,
}

impl BlobRef {
    /// The blob's file name: its hash in hexadecimal.
    pub(super) fn file_name(&self) -> String {
        format!("{:032x}", self.hash)
    }
}

/// One group of names in a saved checkpoint, and the blob that holds their values.
///
/// Part of the on-disk envelope: changing its fields changes the file format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredGroup {
    /// The worker's name for this version of the group, by which a later checkpoint says
    /// that it is unchanged.
    pub token: String,
    /// The names whose values the blob holds.
    pub names: Vec<String>,
    pub blob: BlobRef,
}

/// Where the values of a group in a new checkpoint come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupSource {
    /// A file the worker has just written, to be taken into the store.
    File(PathBuf),
    /// Unchanged since a retained checkpoint of the session that has a group of this token.
    Unchanged,
}

/// One group of names of a checkpoint being saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewGroup {
    pub token: String,
    pub names: Vec<String>,
    pub source: GroupSource,
}

/// One group of a loaded checkpoint, its blob checked against its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedGroup {
    pub token: String,
    pub names: Vec<String>,
    /// The blob file, to be read (or mapped) by the worker.
    pub path: PathBuf,
    pub bytes: u64,
}

/// Takes the file at `source` into `blobs_dir`, at most `max_bytes` long. Returns its
/// reference and whether it added a blob (false when an identical one was there already).
pub(super) fn ingest(
    blobs_dir: &Path,
    source: &Path,
    max_bytes: u64,
) -> Result<(BlobRef, bool), CheckpointError> {
    let io = |action| {
        move |err| CheckpointError::Io {
            action,
            path: source.to_owned(),
            source: err,
        }
    };
    let file = open_no_follow(source).map_err(io("open the checkpoint blob"))?;
    let meta = file.metadata().map_err(io("read the checkpoint blob"))?;
    if !meta.is_file() {
        return Err(CheckpointError::Io {
            action: "take in the checkpoint blob",
            path: source.to_owned(),
            source: io::Error::new(io::ErrorKind::InvalidData, "not a regular file"),
        });
    }
    if meta.len() > max_bytes {
        return Err(CheckpointError::TooLarge {
            bytes: meta.len(),
            limit: max_bytes,
        });
    }
    let blob = BlobRef {
        hash: hash_file(&file, max_bytes).map_err(io("hash the checkpoint blob"))?,
        bytes: meta.len(),
    };
    if blob.bytes
        != file
            .metadata()
            .map_err(io("read the checkpoint blob"))?
            .len()
    {
        return Err(CheckpointError::Io {
            action: "take in the checkpoint blob",
            path: source.to_owned(),
            source: io::Error::new(io::ErrorKind::InvalidData, "it changed while being hashed"),
        });
    }
    let target = blobs_dir.join(blob.file_name());
    if target.exists() {
        let _ = fs::remove_file(source);
        return Ok((blob, false));
    }
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .map_err(io("protect the checkpoint blob"))?;
    file.sync_all().map_err(io("sync the checkpoint blob"))?;
    fs::rename(source, &target).map_err(io("move the checkpoint blob into the store"))?;
    // The worker's code could have put another file at `source` between the hash and the
    // rename: keep the blob only if it is the very file that was hashed.
    let moved = fs::symlink_metadata(&target);
    let same = moved.is_ok_and(|m| m.is_file() && m.dev() == meta.dev() && m.ino() == meta.ino());
    if !same {
        let _ = fs::remove_file(&target);
        return Err(CheckpointError::Io {
            action: "take in the checkpoint blob",
            path: source.to_owned(),
            source: io::Error::new(io::ErrorKind::InvalidData, "it was replaced while hashed"),
        });
    }
    Ok((blob, true))
}

/// The blob `blob` of `blobs_dir` as a file the worker can read, in the directory
/// `restore_dir` (created here; the caller removes it): a hard link to the blob, checked
/// against its length and hash, or, when it is stored compressed, a file holding it
/// decompressed and checked. The link, not the blob's own name, is what the worker opens:
/// compression may replace the raw blob by its compressed form at any time, and the link
/// keeps the raw file for the restore that was told its path.
pub(super) fn materialize(
    blobs_dir: &Path,
    blob: &BlobRef,
    restore_dir: &Path,
) -> Result<PathBuf, CorruptionError> {
    let raw = blobs_dir.join(blob.file_name());
    create_private_dir(restore_dir).map_err(CorruptionError::Read)?;
    let linked = restore_dir.join(blob.file_name());
    match fs::hard_link(&raw, &linked) {
        Ok(()) => return verify(&linked, blob).map(|()| linked),
        // Compressed (below), or collected: then the compressed file is missing too.
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        // No link here (another file system, say): the blob's own name, which compression
        // may take away before the worker reads it; the restore then reports the name lost.
        Err(_) => match verify(&raw, blob) {
            Err(CorruptionError::BlobMissing { .. }) => {}
            done => return done.map(|()| raw),
        },
    }
    let compressed = blobs_dir.join(blob.file_name() + COMPRESSED_SUFFIX);
    let source = open_no_follow(&compressed).map_err(|err| match err.kind() {
        io::ErrorKind::NotFound => CorruptionError::BlobMissing {
            blob: blob.file_name(),
        },
        _ => CorruptionError::Read(err),
    })?;
    let target = linked;
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&target)
        .map_err(CorruptionError::Read)?;
    let decoder = zstd::stream::read::Decoder::new(source).map_err(CorruptionError::Read)?;
    let mut hashing = HashingReader {
        inner: decoder.take(blob.bytes + 1),
        hasher: Xxh3::new(),
    };
    let copied = io::copy(&mut hashing, &mut out).map_err(CorruptionError::Decompress)?;
    if copied != blob.bytes {
        return Err(CorruptionError::BlobLength {
            expected: blob.bytes,
            actual: copied,
        });
    }
    if hashing.hasher.digest128() != blob.hash {
        return Err(CorruptionError::BlobChecksum);
    }
    Ok(target)
}

/// Hard-links the blob `blob` of `from_dir` (another session's blobs directory) into
/// `to_dir`, as it is stored there: raw or compressed. Returns whether it is raw, and the
/// length of the file linked. The raw file is tried first: compression renames the compressed file in before it removes the raw one,
/// so one of the two is always there until the blob is collected (then: `NotFound`).
pub(super) fn link(from_dir: &Path, to_dir: &Path, blob: &BlobRef) -> io::Result<(bool, u64)> {
    let raw = blob.file_name();
    for (name, is_raw) in [(raw.clone(), true), (raw + COMPRESSED_SUFFIX, false)] {
        let linked = to_dir.join(&name);
        match fs::hard_link(from_dir.join(&name), &linked) {
            // When it exists, it is the same content (the name is its hash).
            Ok(()) => return Ok((is_raw, fs::symlink_metadata(&linked)?.len())),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => return Ok((is_raw, 0)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("blob {} is gone", blob.file_name()),
    ))
}

/// Stores the blob `blob` of `blobs_dir` compressed when a sample says that pays: writes
/// `<hash>.zst` beside it, and `swap` (which holds the store's lock of the session) runs the
/// step that replaces the raw blob with it. Returns the bytes saved.
pub(super) fn compress_if_it_pays(
    blobs_dir: &Path,
    blob: &BlobRef,
    swap: impl FnOnce(&dyn Fn() -> io::Result<()>) -> io::Result<()>,
) -> io::Result<u64> {
    let raw = blobs_dir.join(blob.file_name());
    let file = open_no_follow(&raw)?;
    if blob.bytes < COMPRESS_MIN || !compression_pays(&file, blob.bytes)? {
        return Ok(0);
    }
    let mut temp = tempfile::Builder::new()
        .prefix(COMPRESSING_PREFIX)
        .tempfile_in(blobs_dir)?;
    let mut encoder = zstd::stream::write::Encoder::new(temp.as_file_mut(), ZSTD_LEVEL)?;
    io::copy(&mut (&file).take(blob.bytes), &mut encoder)?;
    encoder.finish()?;
    temp.as_file().sync_all()?;
    let stored = temp.as_file().metadata()?.len();
    let compressed = blobs_dir.join(blob.file_name() + COMPRESSED_SUFFIX);
    swap(&|| {
        if !raw.exists() {
            // Removed meanwhile: no checkpoint refers to it any more.
            return Ok(());
        }
        fs::rename(temp.path(), &compressed)?;
        fs::remove_file(&raw)
    })?;
    Ok(blob.bytes.saturating_sub(stored))
}

/// Whether zstd shrinks samples of `file` (of `len` bytes) enough to pay.
fn compression_pays(file: &File, len: u64) -> io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let mut sample = vec![0; SAMPLE_WINDOW];
    let (mut read, mut compressed) = (0usize, 0usize);
    let step = len / SAMPLE_WINDOWS;
    for window in 0..SAMPLE_WINDOWS {
        let n = file.read_at(&mut sample, window * step)?;
        read += n;
        compressed += zstd::bulk::compress(&sample[..n], ZSTD_LEVEL)?.len();
    }
    Ok(read > 0 && (compressed as f64) <= COMPRESSION_PAYS * read as f64)
}

/// Hashes what it reads.
struct HashingReader<R> {
    inner: R,
    hasher: Xxh3,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Checks that the blob at `path` is a regular file with the length and hash of `blob`.
pub(super) fn verify(path: &Path, blob: &BlobRef) -> Result<(), CorruptionError> {
    let file = open_no_follow(path).map_err(|err| match err.kind() {
        io::ErrorKind::NotFound => CorruptionError::BlobMissing {
            blob: blob.file_name(),
        },
        _ => CorruptionError::Read(err),
    })?;
    let len = file.metadata().map_err(CorruptionError::Read)?.len();
    if len != blob.bytes {
        return Err(CorruptionError::BlobLength {
            expected: blob.bytes,
            actual: len,
        });
    }
    let hash = hash_file(&file, blob.bytes).map_err(CorruptionError::Read)?;
    if hash != blob.hash {
        return Err(CorruptionError::BlobChecksum);
    }
    Ok(())
}

/// Moves the blobs of `blobs_dir` that are not in `referenced` into the directory `trash`
/// (created when there is any), for the caller to remove: unlinking a file of gigabytes takes
/// longer than a checkpoint should wait, a rename does not. Returns the bytes moved.
pub(super) fn collect_garbage(
    blobs_dir: &Path,
    referenced: &HashSet<BlobRef>,
    trash: &Path,
) -> u64 {
    let keep: HashSet<String> = referenced
        .iter()
        .flat_map(|blob| [blob.file_name(), blob.file_name() + COMPRESSED_SUFFIX])
        .collect();
    let Ok(entries) = fs::read_dir(blobs_dir) else {
        return 0;
    };
    let mut moved = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let in_use = |name: &str| keep.contains(name) || name.starts_with(COMPRESSING_PREFIX);
        if name.to_str().is_some_and(in_use) {
            continue;
        }
        let bytes = entry.metadata().map_or(0, |m| m.len());
        let outcome =
            create_private_dir(trash).and_then(|()| fs::rename(entry.path(), trash.join(&name)));
        match outcome {
            Ok(()) => moved += bytes,
            Err(err) => {
                tracing::warn!(path = %entry.path().display(), error = %err, "cannot remove an unused checkpoint blob")
            }
        }
    }
    moved
}

/// The bytes that the blobs of `blobs_dir` take (a blob being compressed counts once it is).
pub(super) fn usage(blobs_dir: &Path) -> u64 {
    fs::read_dir(blobs_dir).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|entry| {
                !entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with(COMPRESSING_PREFIX)
            })
            .filter_map(|entry| entry.metadata().ok())
            .filter(|meta| meta.is_file())
            .map(|meta| meta.len())
            .sum()
    })
}

fn open_no_follow(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// XXH3-128 of the first `limit` bytes of `file`, read from its start.
fn hash_file(file: &File, limit: u64) -> io::Result<u128> {
    let mut hasher = Xxh3::new();
    let mut reader = file.take(limit);
    let mut chunk = vec![0; HASH_CHUNK];
    loop {
        match reader.read(&mut chunk) {
            Ok(0) => return Ok(hasher.digest128()),
            Ok(n) => hasher.update(&chunk[..n]),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blobs_dir() -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let blobs = root.path().join(BLOBS_DIR);
        fs::create_dir(&blobs).unwrap();
        (root, blobs)
    }

    #[test]
    fn a_blob_is_stored_once_under_its_hash() {
        let (root, blobs) = blobs_dir();
        let first = root.path().join("a");
        let second = root.path().join("b");
        fs::write(&first, b"the same bytes").unwrap();
        fs::write(&second, b"the same bytes").unwrap();
        let (blob, added) = ingest(&blobs, &first, 1024).unwrap();
        assert!(added);
        assert_eq!(blob.bytes, 14);
        let (again, added) = ingest(&blobs, &second, 1024).unwrap();
        assert_eq!((again, added), (blob, false));
        assert!(!first.exists() && !second.exists());
        verify(&blobs.join(blob.file_name()), &blob).unwrap();
        let mode = fs::metadata(blobs.join(blob.file_name())).unwrap().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_symlink_or_an_oversized_file_is_refused() {
        let (root, blobs) = blobs_dir();
        let secret = root.path().join("secret");
        fs::write(&secret, b"not the worker's").unwrap();
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        assert!(ingest(&blobs, &link, 1024).is_err());
        let big = root.path().join("big");
        fs::write(&big, vec![7; 2048]).unwrap();
        assert!(matches!(
            ingest(&blobs, &big, 1024),
            Err(CheckpointError::TooLarge {
                bytes: 2048,
                limit: 1024
            })
        ));
        assert_eq!(usage(&blobs), 0);
    }

    #[test]
    fn a_changed_blob_fails_verification() {
        let (root, blobs) = blobs_dir();
        let source = root.path().join("a");
        fs::write(&source, b"0123456789").unwrap();
        let (blob, _) = ingest(&blobs, &source, 1024).unwrap();
        let path = blobs.join(blob.file_name());
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&path, b"0123456780").unwrap();
        assert!(matches!(
            verify(&path, &blob),
            Err(CorruptionError::BlobChecksum)
        ));
        fs::write(&path, b"01234").unwrap();
        assert!(matches!(
            verify(&path, &blob),
            Err(CorruptionError::BlobLength { .. })
        ));
    }

    #[test]
    fn garbage_collection_keeps_only_referenced_blobs() {
        let (root, blobs) = blobs_dir();
        let mut refs = Vec::new();
        for content in [&b"one"[..], b"two", b"three"] {
            let source = root.path().join("source");
            fs::write(&source, content).unwrap();
            refs.push(ingest(&blobs, &source, 1024).unwrap().0);
        }
        let keep: HashSet<BlobRef> = [refs[1]].into_iter().collect();
        let trash = root.path().join(".trash-1");
        assert_eq!(collect_garbage(&blobs, &keep, &trash), 8);
        assert_eq!(usage(&blobs), 3);
        assert_eq!(fs::read_dir(&trash).unwrap().count(), 2);
        verify(&blobs.join(refs[1].file_name()), &refs[1]).unwrap();
    }

    #[test]
    fn compression_is_chosen_by_a_sample() {
        let (root, _) = blobs_dir();
        let random = root.path().join("random");
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let noise: Vec<u8> = (0..2 << 20)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        fs::write(&random, &noise).unwrap();
        let table = root.path().join("table");
        let rows: Vec<u8> = (0..2 << 20).map(|i| b"label-7,42,7.5\n"[i % 15]).collect();
        fs::write(&table, &rows).unwrap();
        let pays = |path: &Path| compression_pays(&File::open(path).unwrap(), 2 << 20).unwrap();
        assert!(!pays(&random));
        assert!(pays(&table));
    }

    #[test]
    fn a_blob_handed_to_a_restore_stays_readable_when_compression_replaces_it() {
        let (root, blobs) = blobs_dir();
        let source = root.path().join("table");
        let rows: Vec<u8> = (0..2 << 20).map(|i| b"label-7,42,7.5\n"[i % 15]).collect();
        fs::write(&source, &rows).unwrap();
        let (blob, _) = ingest(&blobs, &source, 4 << 20).unwrap();
        let restore_dir = root.path().join("restore-1");
        let handed = materialize(&blobs, &blob, &restore_dir).unwrap();
        // Compression swaps the raw blob for its compressed form before the worker reads it.
        let saved = compress_if_it_pays(&blobs, &blob, |swap| swap()).unwrap();
        assert!(saved > 0 && !blobs.join(blob.file_name()).exists());
        assert_eq!(fs::read(&handed).unwrap(), rows);
    }
}
