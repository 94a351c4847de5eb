//! The embedded worker package and the interpreter that runs it.
//!
//! The worker is a Python package, `pyworker/`, compiled into the binary and written to a
//! content-addressed directory, so an installed binary needs nothing beside it but a Python
//! 3.9+ interpreter. The interpreter runs that directory (`python -I -B -u <dir>`): Python
//! puts it first on `sys.path` and runs its `__main__.py`, which starts `pyvisor_worker`.
//!
//! Integrity: the code a worker runs must never come from a place a session could have
//! written. As root the directory is root's (dirs 0755, files 0444), else private (0700,
//! 0600); `-B` keeps interpreters from writing bytecode. [`install_worker_package`] checks
//! every byte against the embedded sources and removes anything else (a planted
//! `__pycache__` included), then records each file's identity (device, inode, size, change
//! time); [`verify_worker_package`], before every zygote start
//! and every plain spawn, checks that the directory holds exactly those files, unchanged
//! (any write or rename changes a change time), and reinstalls it otherwise. There is no
//! bytecode to trust either: each interpreter compiles the package in memory when it starts
//! (about 15 ms, once per zygote), so engines sharing the directory never race to write it;
//! installs themselves take turns on a `flock` beside the package.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use nix::fcntl::{Flock, FlockArg};

use crate::errors::SpawnError;

/// `(path in pyworker/, its source)` of one file of the worker package, embedded at build time.
macro_rules! worker_file {
    ($path:literal) => {
        ($path, include_str!(concat!("../../../pyworker/", $path)))
    };
}

/// Every file of `pyworker/`: path inside the package directory, and source.
pub const WORKER_FILES: &[(&str, &str)] = &[
    worker_file!("__main__.py"),
    worker_file!("pyvisor_worker/__init__.py"),
    worker_file!("pyvisor_worker/adoption.py"),
    worker_file!("pyvisor_worker/blobfiles.py"),
    worker_file!("pyvisor_worker/bridge.py"),
    worker_file!("pyvisor_worker/cells.py"),
    worker_file!("pyvisor_worker/changes.py"),
    worker_file!("pyvisor_worker/checkpoints.py"),
    worker_file!("pyvisor_worker/cloning.py"),
    worker_file!("pyvisor_worker/completion.py"),
    worker_file!("pyvisor_worker/display.py"),
    worker_file!("pyvisor_worker/execution.py"),
    worker_file!("pyvisor_worker/facts.py"),
    worker_file!("pyvisor_worker/fingerprints.py"),
    worker_file!("pyvisor_worker/hidden.py"),
    worker_file!("pyvisor_worker/inspection.py"),
    worker_file!("pyvisor_worker/main.py"),
    worker_file!("pyvisor_worker/pages.py"),
    worker_file!("pyvisor_worker/pickling.py"),
    worker_file!("pyvisor_worker/prompts.py"),
    worker_file!("pyvisor_worker/protocol.py"),
    worker_file!("pyvisor_worker/purity.py"),
    worker_file!("pyvisor_worker/quiet.py"),
    worker_file!("pyvisor_worker/restores.py"),
    worker_file!("pyvisor_worker/sandbox.py"),
    worker_file!("pyvisor_worker/snippets.py"),
    worker_file!("pyvisor_worker/speculation.py"),
    worker_file!("pyvisor_worker/state.py"),
    worker_file!("pyvisor_worker/summaries.py"),
    worker_file!("pyvisor_worker/surroundings.py"),
    worker_file!("pyvisor_worker/versions.py"),
    worker_file!("pyvisor_worker/zygote.py"),
];

/// Writes the worker package under `cache_dir` and returns its directory, which the
/// interpreter runs.
///
/// The directory is named by a hash of every file's path and source. A file already there
/// with the right content is kept; any other is written beside its place and renamed into it,
/// so a concurrent engine never runs half a file; anything that is not a file of the package
/// is removed. The package is whole and its identity recorded once this returns.
pub fn install_worker_package(cache_dir: &Path) -> Result<PathBuf, SpawnError> {
    let package = cache_dir.join(format!("worker-{:016x}", package_hash()));
    let fail = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SpawnError::Script { path, source }
    };
    if is_root() {
        // Session uids must reach the package: the cache dir is entered, never listed.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(cache_dir)
            .map_err(fail(cache_dir))?;
    }
    // Engines installing at once (tests start many) would take each other's temporary files
    // for strangers: one installs at a time, across processes.
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(cache_dir)
        .map_err(fail(cache_dir))?;
    let lock_path = cache_dir.join(format!("worker-{:016x}.lock", package_hash()));
    let lock_file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(fail(&lock_path))?;
    let _installing = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| fail(&lock_path)(io::Error::from(errno)))?;
    let modes = Modes::for_owner();
    for (name, source) in WORKER_FILES {
        let path = package.join(name);
        let intact = fs::symlink_metadata(&path)
            .is_ok_and(|meta| meta.is_file() && meta.mode() & 0o7777 == modes.file)
            && fs::read(&path).is_ok_and(|existing| existing == source.as_bytes());
        if !intact {
            write_file(&path, source, modes).map_err(fail(&path))?;
        }
    }
    remove_strangers(&package, &package).map_err(fail(&package))?;
    record_identity(&package).map_err(fail(&package))?;
    Ok(package)
}

/// Checks that `package` holds exactly the files [`install_worker_package`] left there,
/// unchanged; installs it again when it does not.
/// Reads no file: a directory walk and a stat of each file, a few tens of microseconds.
pub fn verify_worker_package(package: &Path) -> Result<(), SpawnError> {
    let recorded = identities()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(package)
        .cloned();
    let current = identity_of(package).ok();
    if recorded.is_some() && recorded == current {
        return Ok(());
    }
    tracing::warn!(package = %package.display(), "the worker package changed; reinstalling it");
    let cache_dir = package
        .parent()
        .expect("the package is in the cache directory");
    install_worker_package(cache_dir).map(|_| ())
}

/// Identity of every file of a package, by path: what [`verify_worker_package`] compares.
type Identity = BTreeMap<PathBuf, (u64, u64, u64, i64, i64)>;

/// The identity of each installed package, recorded by this process.
fn identities() -> &'static Mutex<HashMap<PathBuf, Identity>> {
    static IDENTITIES: OnceLock<Mutex<HashMap<PathBuf, Identity>>> = OnceLock::new();
    IDENTITIES.get_or_init(Mutex::default)
}

/// Records the identity `package` has now as its verified one.
fn record_identity(package: &Path) -> io::Result<()> {
    let identity = identity_of(package)?;
    let mut identities = identities().lock().unwrap_or_else(|e| e.into_inner());
    identities.insert(package.to_path_buf(), identity);
    Ok(())
}

/// Device, inode, size and change time of every entry under `dir`, directories included.
fn identity_of(dir: &Path) -> io::Result<Identity> {
    let mut identity = Identity::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            let meta = fs::symlink_metadata(&path)?;
            if meta.is_dir() {
                pending.push(path.clone());
            }
            let stamp = (
                meta.dev(),
                meta.ino(),
                meta.size(),
                meta.ctime(),
                meta.ctime_nsec(),
            );
            identity.insert(path, stamp);
        }
    }
    Ok(identity)
}

/// Removes everything under `dir` that is not a file of the package.
fn remove_strangers(package: &Path, dir: &Path) -> io::Result<()> {
    // Another engine may be removing the same strangers: what is gone already is fine.
    let gone = |err: io::Error| match err.kind() {
        io::ErrorKind::NotFound => Ok(()),
        _ => Err(err),
    };
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.strip_prefix(package).unwrap_or(&path);
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        let known = WORKER_FILES
            .iter()
            .any(|(file, _)| Path::new(file) == name || Path::new(file).starts_with(name));
        if meta.is_dir() && known {
            remove_strangers(package, &path).or_else(gone)?;
        } else if meta.is_dir() {
            fs::remove_dir_all(&path).or_else(gone)?;
        } else if !known {
            fs::remove_file(&path).or_else(gone)?;
        }
    }
    Ok(())
}

/// Whether this process runs as root, whose package must be root's and read-only.
fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Modes of the package's directories and files.
#[derive(Debug, Clone, Copy)]
struct Modes {
    dir: u32,
    file: u32,
}

impl Modes {
    /// Root's package is readable by the session uids and writable by none; anyone else's
    /// is private.
    fn for_owner() -> Modes {
        if is_root() {
            Modes {
                dir: 0o755,
                file: 0o444,
            }
        } else {
            Modes {
                dir: 0o700,
                file: 0o600,
            }
        }
    }
}

/// Writes `contents` to `path` by renaming a temporary file beside it, creating its directory
/// (with its parents) if need be.
fn write_file(path: &Path, contents: &str, modes: Modes) -> io::Result<()> {
    let dir = path
        .parent()
        .expect("a file of the package is in a directory");
    fs::DirBuilder::new()
        .recursive(true)
        .mode(modes.dir)
        .create(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(modes.dir))?;
    let mut temp = tempfile::NamedTempFile::new_in(dir)?;
    temp.write_all(contents.as_bytes())?;
    temp.as_file()
        .set_permissions(fs::Permissions::from_mode(modes.file))?;
    temp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Resolves `python` (a name on `PATH` or a path, possibly a pyenv shim) to the real
/// interpreter binary by asking it for `sys.executable`, so that every spawn skips the shim.
pub fn resolve_interpreter(python: &str) -> Result<PathBuf, SpawnError> {
    let output = Command::new(python)
        .args(["-I", "-c", "import sys; sys.stdout.write(sys.executable)"])
        .output()
        .map_err(|source| SpawnError::Interpreter {
            python: python.to_owned(),
            reason: source.to_string(),
        })?;
    let executable = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if !output.status.success() || executable.is_empty() {
        return Err(SpawnError::Interpreter {
            python: python.to_owned(),
            reason: format!(
                "{} printed no sys.executable: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    Ok(PathBuf::from(executable))
}

/// The content hash that names the package's directory: of every file's path and source,
/// each preceded by its length.
fn package_hash() -> u64 {
    WORKER_FILES
        .iter()
        .flat_map(|(name, source)| [name.as_bytes(), source.as_bytes()])
        .fold(FNV_OFFSET, |hash, part| {
            fnv1a(fnv1a(hash, &(part.len() as u64).to_le_bytes()), part)
        })
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// 64-bit FNV-1a of `bytes`, continuing from `hash`: a stable hash for file names.
fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn every_file_of_pyworker_is_embedded() {
        fn python_files(root: &Path, dir: &Path, found: &mut Vec<String>) {
            for entry in fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    python_files(root, &path, found);
                } else if path.extension().is_some_and(|ext| ext == "py") {
                    let name = path.strip_prefix(root).unwrap();
                    found.push(name.to_string_lossy().into_owned());
                }
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pyworker");
        let mut on_disk = Vec::new();
        python_files(&root, &root, &mut on_disk);
        on_disk.sort();
        let mut embedded: Vec<_> = WORKER_FILES.iter().map(|(name, _)| *name).collect();
        embedded.sort();
        assert_eq!(
            embedded, on_disk,
            "WORKER_FILES lists every .py file of pyworker/"
        );
    }

    #[test]
    fn installs_once_reuses_the_same_directory_and_repairs_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = install_worker_package(dir.path()).unwrap();
        let second = install_worker_package(dir.path()).unwrap();
        assert_eq!(first, second);
        let mode = fs::metadata(&first).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, Modes::for_owner().dir);
        for (name, source) in WORKER_FILES {
            assert_eq!(fs::read_to_string(first.join(name)).unwrap(), *source);
        }
        // A file gone or changed is written again.
        let (removed, _) = WORKER_FILES[1];
        let (changed, source) = WORKER_FILES[2];
        fs::remove_file(first.join(removed)).unwrap();
        fs::write(first.join(changed), "broken").unwrap();
        assert_eq!(install_worker_package(dir.path()).unwrap(), first);
        assert!(first.join(removed).exists());
        assert_eq!(fs::read_to_string(first.join(changed)).unwrap(), *source);
    }

    #[test]
    fn engines_installing_at_once_all_get_the_whole_package() {
        // Each round starts from an empty cache, where every engine writes every file.
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let installs: Vec<_> = (0..8)
                .map(|_| {
                    let cache = dir.path().join("cache");
                    std::thread::spawn(move || install_worker_package(&cache))
                })
                .collect();
            for install in installs {
                let package = install.join().unwrap().expect("every install succeeds");
                for (name, source) in WORKER_FILES {
                    assert_eq!(fs::read_to_string(package.join(name)).unwrap(), *source);
                }
            }
        }
    }

    #[test]
    fn unknown_interpreter_is_a_typed_error() {
        let err = resolve_interpreter("/nonexistent/python9").unwrap_err();
        assert!(matches!(err, SpawnError::Interpreter { .. }), "{err}");
    }
}
