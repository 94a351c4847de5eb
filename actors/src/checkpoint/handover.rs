//! Handing a loaded checkpoint's blobs to a confined worker.
//!
//! The store holds every session's state, so a confined worker can read none of it: its
//! files belong to the engine (mode 0600) when the worker has a uid of its own, and Landlock
//! lets a worker read only its own directories. Before such a worker restores, the blobs it
//! needs are copied into a directory of its own (inside its private area), and the load's
//! paths point there; the copies go when the restore is done, like the decompressed blobs of
//! any load.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::{chown, DirBuilderExt, PermissionsExt};
use std::path::Path;

use super::layout::unique_name;
use super::meta::LoadedCheckpoint;

/// Prefix of the directory of handed-over blobs.
const HANDOVER_PREFIX: &str = "restore-";

/// Copies the blobs of `loaded` into a new directory under `area` (mode 0700, files 0600;
/// owned by `uid` when the worker has one), points the load at the copies and drops the
/// store-side decompressed ones.
pub fn hand_over_blobs(
    loaded: &mut LoadedCheckpoint,
    uid: Option<u32>,
    area: &Path,
) -> io::Result<()> {
    if loaded.groups.is_empty() {
        return Ok(());
    }
    let dir = area.join(unique_name(HANDOVER_PREFIX));
    DirBuilder::new().mode(0o700).create(&dir)?;
    let copied = (|| {
        for group in &mut loaded.groups {
            let name = group.path.file_name().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "a blob path without a name")
            })?;
            let copy = dir.join(name);
            fs::copy(&group.path, &copy)?;
            fs::set_permissions(&copy, fs::Permissions::from_mode(0o600))?;
            chown(&copy, uid, uid)?;
            group.path = copy;
        }
        chown(&dir, uid, uid)
    })();
    if let Err(err) = copied {
        let _ = fs::remove_dir_all(&dir);
        return Err(err);
    }
    if let Some(decompressed) = loaded.restore_dir.replace(dir) {
        let _ = fs::remove_dir_all(decompressed);
    }
    Ok(())
}
