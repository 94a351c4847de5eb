//! Finding this process's cgroups and reading and writing cgroup files, with errors that
//! name the file.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of every group dir the engine makes: only its owner (the engine) may create groups
/// or files in it; the kernel makes the files in it owned by the engine, mode 0644.
const GROUP_DIR_MODE: u32 = 0o755;

/// The directory of this process's cgroup in the v1 hierarchy of `controller` (v2 for `None`).
pub(super) fn own_dir(controller: Option<&str>) -> io::Result<PathBuf> {
    let fstype = if controller.is_some() {
        "cgroup"
    } else {
        "cgroup2"
    };
    let (root, point) = find_mount(fstype, controller)?;
    let own = own_cgroup(controller)?;
    // The mount root is `/` unless the host bind-mounted a subgroup (a container without
    // a cgroup namespace); /proc/self/cgroup names paths from the hierarchy's real root.
    let relative = Path::new(&own).strip_prefix(&root).map_err(|_| {
        io::Error::other(format!(
            "own cgroup {own} is outside its mount {}",
            root.display()
        ))
    })?;
    Ok(point.join(relative))
}

/// The root and mount point of filesystem `fstype` (with super option `controller`, for v1).
fn find_mount(fstype: &str, controller: Option<&str>) -> io::Result<(PathBuf, PathBuf)> {
    let mountinfo = read(Path::new("/proc/self/mountinfo"))?;
    for line in mountinfo.lines() {
        // "id parent dev root point options [tags...] - fstype source super_options"
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let has_option = |c: &str| right.get(2).is_some_and(|o| o.split(',').any(|o| o == c));
        let wanted = match controller {
            Some(c) => has_option(c),
            None => true,
        };
        if left.len() >= 5 && right[0] == fstype && wanted {
            return Ok((PathBuf::from(left[3]), PathBuf::from(left[4])));
        }
    }
    let what = controller.map_or(String::new(), |c| format!(" with {c}"));
    Err(io::Error::other(format!("no {fstype} mount{what}")))
}

/// This process's cgroup path in the v1 hierarchy of `controller`, or in v2 for `None`.
fn own_cgroup(controller: Option<&str>) -> io::Result<String> {
    let text = read(Path::new("/proc/self/cgroup"))?;
    for line in text.lines() {
        // "hierarchy-id:controller,list:/path"; v2 is "0::/path".
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let matches = match controller {
            None => id == "0" && controllers.is_empty(),
            Some(c) => controllers.split(',').any(|x| x == c),
        };
        if matches {
            return Ok(path.to_string());
        }
    }
    Err(io::Error::other(format!(
        "/proc/self/cgroup has no {} line",
        controller.unwrap_or("cgroup v2")
    )))
}

/// Creates a fresh leaf dir; a leftover empty one of the same name is replaced.
pub(super) fn create_leaf_dir(dir: &Path) -> io::Result<()> {
    match make_group_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            fs::remove_dir(dir).map_err(|e| annotate(e, "replacing leftover", dir))?;
            make_group_dir(dir)
        }
        result => result,
    }
}

/// Creates `dir` unless it exists.
pub(super) fn ensure_dir(dir: &Path) -> io::Result<()> {
    match make_group_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        result => result,
    }
}

/// Makes a group dir with [`GROUP_DIR_MODE`] whatever the umask.
fn make_group_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .mode(GROUP_DIR_MODE)
        .create(dir)
        .map_err(|e| annotate(e, "creating", dir))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(GROUP_DIR_MODE))
        .map_err(|e| annotate(e, "setting the mode of", dir))
}

/// The pids listed in `dir`'s `cgroup.procs`; none when the dir is gone.
pub(super) fn procs(dir: &Path) -> Vec<u32> {
    match read(&dir.join("cgroup.procs")) {
        Ok(text) => text
            .lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .collect(),
        Err(e) => {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::debug!("cgroup unreadable: {e}");
            }
            Vec::new()
        }
    }
}

/// The number after `key` in a flat-keyed file such as `memory.events` or `cpu.stat`.
pub(super) fn keyed_value(path: &Path, key: &str) -> Option<u64> {
    read(path).ok()?.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok())?
    })
}

pub(super) fn read(path: &Path) -> io::Result<String> {
    fs::read_to_string(path).map_err(|e| annotate(e, "reading", path))
}

pub(super) fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| annotate(e, &format!("writing {value:?} to"), path))
}

pub(super) fn annotate(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}
