//! The embedded worker script and the interpreter that runs it.
//!
//! The script is compiled into the binary and written once to a private, content-addressed
//! path, so an installed binary needs nothing beside it but a Python 3.9+ interpreter.

use std::fs;
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::errors::SpawnError;

/// Source of `pyworker/worker.py`, embedded at build time.
pub const WORKER_SOURCE: &str = include_str!("../../../pyworker/worker.py");

/// Writes the worker script under `cache_dir` (once per content) and returns its path.
pub fn install_worker_script(cache_dir: &Path) -> Result<PathBuf, SpawnError> {
    let io_error = |source| SpawnError::Script {
        path: cache_dir.to_path_buf(),
        source,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(cache_dir)
        .map_err(io_error)?;
    let path = cache_dir.join(format!(
        "worker-{:016x}.py",
        fnv1a(WORKER_SOURCE.as_bytes())
    ));
    if fs::read(&path).is_ok_and(|existing| existing == WORKER_SOURCE.as_bytes()) {
        return Ok(path);
    }
    // Write beside the target and rename, so a concurrent engine never runs half a script.
    let mut temp = tempfile::NamedTempFile::new_in(cache_dir).map_err(io_error)?;
    temp.write_all(WORKER_SOURCE.as_bytes()).map_err(io_error)?;
    temp.persist(&path).map_err(|e| io_error(e.error))?;
    Ok(path)
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

/// 64-bit FNV-1a: a stable content hash for the script's file name.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_once_and_reuses_the_same_path() {
        let dir = std::env::temp_dir().join(format!("pyvisor-script-test-{}", std::process::id()));
        let first = install_worker_script(&dir).unwrap();
        let second = install_worker_script(&dir).unwrap();
        assert_eq!(first, second);
        assert_eq!(fs::read_to_string(&first).unwrap(), WORKER_SOURCE);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unknown_interpreter_is_a_typed_error() {
        let err = resolve_interpreter("/nonexistent/python9").unwrap_err();
        assert!(matches!(err, SpawnError::Interpreter { .. }), "{err}");
    }
}
