//! The engine's scratch directory: where checkpoint payloads wait between a worker and the
//! checkpoint store.
//!
//! Each engine gets `<state dir>/scratch/<pid>-<nonce>/` (mode 0700) and removes it when it
//! stops. Directories of engines that died without removing theirs (their pid is gone) are
//! removed when the next engine starts.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

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
            .mode(0o700)
            .create(&base)?;
        remove_stale(&base);
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let path = base.join(format!("{}-{nonce:x}", std::process::id()));
        DirBuilder::new().mode(0o700).create(&path)?;
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
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}
