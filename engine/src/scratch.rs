//! The engine's scratch directory: where checkpoint payloads wait between a worker and the
//! checkpoint store.
//!
//! Each engine gets `<state dir>/scratch/<pid>-<nonce>/` (mode 0711: workers with uids of
//! their own enter it to write their checkpoints in directories of their own, and list
//! nothing) and removes it when it stops. Directories of engines that died without removing theirs (their pid is gone) are
//! removed when the next engine starts.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use pyvisor_actors::worker::left_by_dead_processes;

/// A private directory that is removed when dropped.
#[derive(Debug)]
pub(crate) struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// Creates this engine's directory under `state_dir/scratch`, removing stale siblings.
    pub fn create(state_dir: &Path) -> io::Result<Scratch> {
        let base = state_dir.join("scratch");
        DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&base)?;
        remove_stale(&base);
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let path = base.join(format!("{}-{nonce:x}", std::process::id()));
        DirBuilder::new().mode(0o711).create(&path)?;
        Ok(Scratch { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Removes the directories of engines whose process is gone.
fn remove_stale(base: &Path) {
    let pid_of = |name: &str| name.split_once('-')?.0.parse::<u32>().ok();
    for dir in left_by_dead_processes(base, pid_of) {
        let _ = fs::remove_dir_all(dir);
    }
}
