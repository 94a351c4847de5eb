//! The PID file `pyvisor daemon start` writes and `daemon stop` removes: parsing its text,
//! writing it atomically (a temp file renamed over it, in a directory created 0700), and the
//! lock file beside it that keeps two `daemon` commands from racing.
//!
//! `pyvisor serve` itself never touches the PID file: under systemd the unit knows the pid,
//! and in the background `daemon start` owns the file from spawn to `daemon stop`.

use std::fmt;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use nix::fcntl::{Flock, FlockArg};
use nix::unistd::Pid;

/// What the PID file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contents {
    /// There is no PID file.
    Missing,
    /// A process id.
    Pid(Pid),
    /// Text that is not a process id; the reason says why.
    Invalid(String),
}

/// The daemon's PID file.
#[derive(Debug, Clone)]
pub struct PidFile {
    path: PathBuf,
}

impl PidFile {
    /// The PID file at `path`.
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }

    /// Reads and parses it.
    pub fn read(&self) -> anyhow::Result<Contents> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => Ok(match parse_pid(&text) {
                Ok(pid) => Contents::Pid(pid),
                Err(reason) => Contents::Invalid(reason),
            }),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(Contents::Missing),
            Err(err) => Err(err).with_context(|| format!("read {}", self.path.display())),
        }
    }

    /// Writes `pid` atomically: readers see the old file or the new one, never a partial one.
    pub fn write(&self, pid: Pid) -> anyhow::Result<()> {
        create_private_dir(&self.path)?;
        let temp = self.path.with_file_name(format!(
            ".{}.{}.tmp",
            file_name(&self.path),
            std::process::id()
        ));
        let written = (|| {
            let mut file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o644)
                .open(&temp)?;
            writeln!(file, "{pid}")?;
            file.sync_all()?;
            std::fs::rename(&temp, &self.path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written.with_context(|| format!("write {}", self.path.display()))
    }

    /// Removes it if it still names `pid` (a newer daemon's file is left alone).
    pub fn remove_if(&self, pid: Pid) -> anyhow::Result<()> {
        if self.read()? == Contents::Pid(pid) {
            self.remove()?;
        }
        Ok(())
    }

    /// Removes it; a missing file is fine.
    pub fn remove(&self) -> anyhow::Result<()> {
        match std::fs::remove_file(&self.path) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => {
                Err(err).with_context(|| format!("remove {}", self.path.display()))
            }
            _ => Ok(()),
        }
    }

    /// Takes the exclusive lock beside the PID file (`<pid file>.lock`), waiting for another
    /// `daemon start` or `daemon stop` to finish. Released when the guard is dropped;
    /// [`PidLock::remove`] also removes the file once no daemon is left.
    pub fn lock(&self) -> anyhow::Result<PidLock> {
        create_private_dir(&self.path)?;
        let path = self
            .path
            .with_file_name(format!("{}.lock", file_name(&self.path)));
        loop {
            let file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&path)
                .with_context(|| format!("open {}", path.display()))?;
            let file = Flock::lock(file, FlockArg::LockExclusive)
                .map_err(|(_, errno)| io::Error::from(errno))
                .with_context(|| format!("lock {}", path.display()))?;
            // The command that held the lock may have removed the file meanwhile: then this
            // lock is on a file nobody else will open, and the one to take is at the path now.
            let held = file
                .metadata()
                .with_context(|| format!("stat {}", path.display()))?;
            match std::fs::metadata(&path) {
                Ok(now) if now.dev() == held.dev() && now.ino() == held.ino() => {
                    return Ok(PidLock { file, path });
                }
                Ok(_) => continue,
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err).with_context(|| format!("stat {}", path.display())),
            }
        }
    }
}

/// The lock of [`PidFile::lock`], held until it is dropped.
#[derive(Debug)]
pub struct PidLock {
    file: Flock<File>,
    path: PathBuf,
}

impl PidLock {
    /// Removes the lock file, then releases the lock: after a stop nothing is left behind.
    /// A command waiting for the lock meanwhile sees that its file is gone and locks anew.
    pub fn remove(self) -> anyhow::Result<()> {
        let removed = std::fs::remove_file(&self.path);
        drop(self.file);
        match removed {
            Err(err) if err.kind() != io::ErrorKind::NotFound => {
                Err(err).with_context(|| format!("remove {}", self.path.display()))
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for PidFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())
    }
}

/// Parses the text of a PID file: one positive process id, surrounding whitespace allowed.
/// Zero and negative numbers are refused: `kill` would take them for process groups.
pub fn parse_pid(text: &str) -> Result<Pid, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("it is empty".into());
    }
    match text.parse::<i32>() {
        Ok(pid) if pid > 0 => Ok(Pid::from_raw(pid)),
        _ => Err(format!("{:?} is not a process id", shorten(text))),
    }
}

/// Creates the parent directory of `path` (and its missing ancestors) with mode 0700.
pub fn create_private_dir(path: &Path) -> anyhow::Result<()> {
    match path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        Some(dir) => DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("create {}", dir.display())),
        None => Ok(()),
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || "pyvisor.pid".into(),
        |name| name.to_string_lossy().into(),
    )
}

/// At most 40 characters of `text`, for messages about garbage.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_a_positive_pid_with_whitespace() {
        assert_eq!(parse_pid("1234\n"), Ok(Pid::from_raw(1234)));
        assert_eq!(parse_pid("  42  "), Ok(Pid::from_raw(42)));
        assert_eq!(parse_pid("1"), Ok(Pid::from_raw(1)));
    }

    #[test]
    fn parse_refuses_what_kill_would_take_for_a_group() {
        for text in ["0", "-1", "-4321", "+-5"] {
            assert!(parse_pid(text).is_err(), "{text:?} accepted");
        }
    }

    #[test]
    fn parse_refuses_garbage_and_says_why() {
        assert_eq!(parse_pid(""), Err("it is empty".to_owned()));
        assert_eq!(parse_pid(" \n"), Err("it is empty".to_owned()));
        assert_eq!(
            parse_pid("12 34"),
            Err("\"12 34\" is not a process id".to_owned())
        );
        assert!(parse_pid("pyvisor").is_err());
        assert!(parse_pid("99999999999").is_err());
        let long = "x".repeat(100);
        let err = parse_pid(&long).unwrap_err();
        assert_eq!(err, format!("\"{}…\" is not a process id", "x".repeat(40)));
    }

    #[test]
    fn write_read_remove_round_trip_in_a_private_dir() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = PidFile::new(dir.path().join("run/pyvisor/pyvisor.pid"));
        assert_eq!(file.read().unwrap(), Contents::Missing);
        file.write(Pid::from_raw(77)).unwrap();
        assert_eq!(file.read().unwrap(), Contents::Pid(Pid::from_raw(77)));
        let mode = std::fs::metadata(dir.path().join("run/pyvisor"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // Only the PID file is left: the temp file was renamed over it.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("run/pyvisor"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, ["pyvisor.pid"]);
        file.write(Pid::from_raw(78)).unwrap();
        file.remove_if(Pid::from_raw(77)).unwrap();
        assert_eq!(file.read().unwrap(), Contents::Pid(Pid::from_raw(78)));
        file.remove_if(Pid::from_raw(78)).unwrap();
        assert_eq!(file.read().unwrap(), Contents::Missing);
        file.remove().unwrap();
    }

    #[test]
    fn invalid_contents_are_reported_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pyvisor.pid");
        std::fs::write(&path, "garbage\n").unwrap();
        let file = PidFile::new(path);
        assert!(matches!(file.read().unwrap(), Contents::Invalid(_)));
    }
}
