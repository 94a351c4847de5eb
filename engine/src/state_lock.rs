//! One engine per state directory: an exclusive `flock` on `<state dir>/engine.lock`, held for
//! the engine's life, with the holder's pid written inside so that a second engine can say
//! who holds it. Two engines on one directory would remove each other's temporary files and
//! prune each other's checkpoints.
//!
//! The kernel drops the lock when its holder dies, however it dies, so a stale lock file
//! never blocks a restart.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// Name of the lock file in the state directory.
const LOCK_FILE: &str = "engine.lock";

/// The held lock; dropping it releases the directory.
#[derive(Debug)]
pub(crate) struct StateDirLock {
    _file: Flock<File>,
}

impl StateDirLock {
    /// Takes the lock of `state_dir` (which must exist), or says which process holds it.
    pub fn acquire(state_dir: &Path) -> Result<StateDirLock, String> {
        let path = state_dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|err| format!("open {}: {err}", path.display()))?;
        let mut file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => locked,
            Err((mut file, Errno::EWOULDBLOCK)) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => "a process that has not written its pid yet".to_owned(),
                    pid => format!("pid {pid}"),
                };
                return Err(format!(
                    "the state directory {} is in use by another pyvisor engine ({holder}); \
                     give each engine a state directory of its own",
                    state_dir.display()
                ));
            }
            Err((_, errno)) => return Err(format!("lock {}: {errno}", path.display())),
        };
        let pid = std::process::id().to_string();
        (|| {
            file.set_len(0)?;
            file.rewind()?;
            file.write_all(pid.as_bytes())
        })()
        .map_err(|err| format!("write {}: {err}", path.display()))?;
        Ok(StateDirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_holder_and_the_first_release_frees_the_dir() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateDirLock::acquire(dir.path()).unwrap();
        let refusal = StateDirLock::acquire(dir.path()).unwrap_err();
        assert!(
            refusal.contains(&format!("pid {}", std::process::id())),
            "{refusal}"
        );
        drop(first);
        StateDirLock::acquire(dir.path()).unwrap();
    }
}
