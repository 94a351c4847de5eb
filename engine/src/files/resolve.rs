//! Safe resolution of a client's path inside a session's work directory: the path is checked
//! as text first (relative, no `..`, no NUL), then opened with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS)` relative to a descriptor of the work directory, so that neither an
//! absolute symlink nor a `..` inside one, nor a symlink swapped in while the call runs, can
//! lead out of it: the kernel resolves every component beneath that descriptor, atomically.
//! On a kernel without `openat2` (before 5.6) the same holds by a walk of one component at a
//! time with `O_NOFOLLOW`, which refuses every symlink.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{open, openat, openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{mkdirat, Mode};

use super::FileError;

/// The longest path a client may name, in bytes.
const MAX_PATH_BYTES: usize = 4096;
/// How often an `openat2` that a concurrent rename made give up (`EAGAIN`) is tried again.
const RETRIES: usize = 16;

/// A client's path, checked: relative, made of plain components.
#[derive(Debug, Clone)]
pub(super) struct RelPath {
    /// As the client gave it, for messages.
    pub given: String,
    /// The components, without `.` and empty ones; none for the work directory itself.
    pub parts: Vec<String>,
}

impl RelPath {
    /// Checks `path`: `-32602` for an absolute one, a `..`, a NUL or an overlong one.
    pub fn parse(path: &str) -> Result<RelPath, FileError> {
        let refuse = |reason: &str| FileError::BadPath {
            path: path.to_owned(),
            reason: reason.to_owned(),
        };
        if path.len() > MAX_PATH_BYTES {
            return Err(refuse("longer than 4096 bytes"));
        }
        if path.contains('\0') {
            return Err(refuse("contains a NUL byte"));
        }
        if path.starts_with('/') {
            return Err(refuse(
                "absolute paths are refused: paths are relative to the session's work directory",
            ));
        }
        let mut parts = Vec::new();
        for part in path.split('/') {
            match part {
                "" | "." => {}
                ".." => return Err(refuse("`..` is refused: paths stay in the work directory")),
                part => parts.push(part.to_owned()),
            }
        }
        Ok(RelPath {
            given: path.to_owned(),
            parts,
        })
    }

    /// The path as the kernel resolves it below the work directory (`.` for itself).
    pub fn joined(&self) -> String {
        if self.parts.is_empty() {
            ".".to_owned()
        } else {
            self.parts.join("/")
        }
    }

    /// The parent's components and the last one; `-32602` for the work directory itself.
    pub fn split_last(&self) -> Result<(&[String], &str), FileError> {
        match self.parts.split_last() {
            Some((last, parent)) => Ok((parent, last.as_str())),
            None => Err(FileError::BadPath {
                path: self.given.clone(),
                reason: "names the work directory itself, not a file in it".into(),
            }),
        }
    }

    /// A path error of this path for `errno`.
    pub fn error(&self, errno: Errno) -> FileError {
        FileError::from_errno(&self.given, errno)
    }
}

/// Opens the work directory `dir`. Its last component is not followed: session code that
/// can write the directory above its own (a sandboxed worker's `w-N`) must not swap a
/// symlink in for it.
pub(super) fn open_root(dir: &Path) -> Result<OwnedFd, FileError> {
    open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| FileError::Io {
        path: String::new(),
        source: std::io::Error::other(format!(
            "open the session's work directory {}: {errno}",
            dir.display()
        )),
    })
}

/// Opens `path` (relative, checked) beneath the directory `dir` with `flags` (`mode` when it
/// creates): never outside `dir`, never through a magic link.
pub(super) fn open_beneath(
    dir: impl AsFd,
    path: &str,
    flags: OFlag,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .mode(mode)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    for _ in 0..RETRIES {
        match openat2(dir.as_fd(), path, how) {
            Err(Errno::EAGAIN) => continue,
            Err(Errno::ENOSYS) => return walk(dir.as_fd(), path, flags, mode),
            done => return done,
        }
    }
    Err(Errno::EAGAIN)
}

/// [`open_beneath`] without `openat2`: one component at a time, no symlink followed.
fn walk(dir: impl AsFd, path: &str, flags: OFlag, mode: Mode) -> Result<OwnedFd, Errno> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let Some((last, parents)) = parts.split_last() else {
        return openat(dir, ".", flags | OFlag::O_CLOEXEC, mode);
    };
    let step = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut current: Option<OwnedFd> = None;
    for part in parents {
        let next = match &current {
            Some(fd) => openat(fd, *part, step, Mode::empty()),
            None => openat(dir.as_fd(), *part, step, Mode::empty()),
        }?;
        current = Some(next);
    }
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match &current {
        Some(fd) => openat(fd, *last, flags, mode),
        None => openat(dir, *last, flags, mode),
    }
}

/// Opens the directory of `parts` beneath `root`, creating what is missing (0755): each step
/// is resolved beneath the directory before it.
pub(super) fn make_dirs(
    root: &OwnedFd,
    path: &RelPath,
    parts: &[String],
) -> Result<OwnedFd, FileError> {
    let dir_flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
    let mut current =
        open_beneath(root, ".", dir_flags, Mode::empty()).map_err(|e| path.error(e))?;
    for part in parts {
        match mkdirat(&current, part.as_str(), Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(errno) => return Err(path.error(errno)),
        }
        current =
            open_beneath(&current, part, dir_flags, Mode::empty()).map_err(|e| path.error(e))?;
    }
    Ok(current)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_could_leave_the_work_directory_are_refused_as_text() {
        for path in ["/etc/passwd", "..", "a/../../b", "a/..", "x\0y"] {
            let err = RelPath::parse(path).unwrap_err();
            assert!(matches!(err, FileError::BadPath { .. }), "{path:?}: {err}");
        }
        let long = "a/".repeat(3000);
        assert!(RelPath::parse(&long).is_err());
    }

    #[test]
    fn plain_paths_keep_their_components() {
        let path = RelPath::parse("./data//in/x.csv").unwrap();
        assert_eq!(path.parts, ["data", "in", "x.csv"]);
        assert_eq!(path.joined(), "data/in/x.csv");
        assert_eq!(RelPath::parse("").unwrap().joined(), ".");
        assert!(RelPath::parse(".").unwrap().split_last().is_err());
    }

    #[test]
    fn a_symlink_out_of_the_directory_is_refused_and_one_inside_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("work")).unwrap();
        std::fs::write(dir.path().join("secret"), "s").unwrap();
        std::fs::write(dir.path().join("work/inside"), "i").unwrap();
        std::os::unix::fs::symlink("../secret", dir.path().join("work/out")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("work/abs")).unwrap();
        std::os::unix::fs::symlink("inside", dir.path().join("work/in")).unwrap();
        let root = open_root(&dir.path().join("work")).unwrap();
        for (path, walked) in [("out", true), ("abs", true), ("in", false)] {
            let beneath = open_beneath(&root, path, OFlag::O_RDONLY, Mode::empty());
            assert_eq!(beneath.is_err(), walked, "{path}: {beneath:?}");
            // The fallback walk refuses every symlink.
            assert!(
                walk(&root, path, OFlag::O_RDONLY, Mode::empty()).is_err(),
                "{path}"
            );
        }
        assert!(walk(&root, "inside", OFlag::O_RDONLY, Mode::empty()).is_ok());
    }

    #[test]
    fn the_work_directory_itself_is_not_followed_when_it_is_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("work")).unwrap();
        assert!(open_root(&dir.path().join("work")).is_err());
    }
}
