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

/// Compiles the installed `script` for `python` once, beside it, and returns the path of the
/// bytecode, which the interpreter runs directly: a script given by path is compiled anew at
/// every start (there is no bytecode cache for `__main__`), about 13 ms per plain spawn. The
/// bytecode's name carries the interpreter's identity (path, size, modification time), so an
/// upgraded interpreter never meets bytecode of another version. Falls back to the script
/// itself when it cannot be compiled.
pub fn compile_worker_script(python: &Path, script: &Path) -> PathBuf {
    let identity = fs::metadata(python).map(|meta| {
        use std::os::unix::fs::MetadataExt;
        format!(
            "{}:{}:{}",
            python.display(),
            meta.len(),
            meta.mtime_nsec() + meta.mtime() * 1_000_000_000
        )
    });
    let Ok(identity) = identity else {
        return script.to_owned();
    };
    let compiled = script.with_extension(format!("{:016x}.pyc", fnv1a(identity.as_bytes())));
    if compiled.exists() {
        return compiled;
    }
    const COMPILE: &str =
        "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)";
    // py_compile writes to a temporary name and renames, so a concurrent engine never runs
    // half a file.
    let outcome = Command::new(python)
        .args(["-I", "-c", COMPILE])
        .arg(script)
        .arg(&compiled)
        .output();
    match outcome {
        Ok(output) if output.status.success() && compiled.exists() => compiled,
        Ok(output) => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            tracing::warn!(error = %stderr.trim(), "worker script not compiled; running the source");
            script.to_owned()
        }
        Err(err) => {
            tracing::warn!(error = %err, "worker script not compiled; running the source");
            script.to_owned()
        }
    }
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
    fn compiles_the_script_once_into_bytecode_the_interpreter_runs() {
        let dir = std::env::temp_dir().join(format!("pyvisor-pyc-test-{}", std::process::id()));
        let script = install_worker_script(&dir).unwrap();
        let python = resolve_interpreter("python3").unwrap();
        let compiled = compile_worker_script(&python, &script);
        assert_ne!(compiled, script, "python3 compiles the worker");
        assert!(compiled.to_string_lossy().ends_with(".pyc"));
        let modified = fs::metadata(&compiled).unwrap().modified().unwrap();
        assert_eq!(compile_worker_script(&python, &script), compiled);
        assert_eq!(
            fs::metadata(&compiled).unwrap().modified().unwrap(),
            modified
        );
        // The bytecode runs: without fds 3 and 4 the worker says so and exits 1.
        let run = Command::new(&python)
            .arg("-I")
            .arg(&compiled)
            .output()
            .unwrap();
        assert_eq!(run.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&run.stderr).contains("fd 3"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unknown_interpreter_is_a_typed_error() {
        let err = resolve_interpreter("/nonexistent/python9").unwrap_err();
        assert!(matches!(err, SpawnError::Interpreter { .. }), "{err}");
    }
}
