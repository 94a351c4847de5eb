//! The PID file of the background daemon, which is also its lock: the `pyvisor serve` that
//! `pyvisor daemon start` spawns (with the hidden `--pid-file`) takes an exclusive `flock` on
//! it before anything else, writes its pid inside and holds the lock for its whole life. A
//! PID file whose lock nobody holds is stale, whatever its pid now names: the kernel drops the
//! lock when its holder dies, however it dies (SIGKILL included), so no process is ever
//! guessed to be the daemon from its command line. Beside it, `<pid file>.lock` keeps two
//! `daemon` commands from racing.
//!
//! `pyvisor serve` run by hand or by systemd never touches the PID file.

use std::fmt;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use nix::unistd::Pid;
use pyvisor_actors::worker::is_running;

/// How long a starting daemon retries its lock while a `daemon status` probes it.
const HOLD_RETRY: Duration = Duration::from_secs(1);

/// What the PID file says of the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// There is no PID file.
    Missing,
    /// A live daemon holds the file's lock; its pid, `None` while it has not written it yet.
    Live(Option<Pid>),
    /// Nobody holds the lock: the file is stale; the reason says why.
    Stale(String),
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

    /// Its path, handed to the `serve` that is to hold it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a live daemon holds the file, and which.
    pub fn probe(&self) -> anyhow::Result<Holder> {
        let mut file = match File::open(&self.path) {
            Ok(file) => file,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Holder::Missing),
            Err(err) => return Err(err).with_context(|| format!("open {}", self.path.display())),
        };
        let mut text = String::new();
        file.read_to_string(&mut text)
            .with_context(|| format!("read {}", self.path.display()))?;
        match Flock::lock(file, FlockArg::LockSharedNonblock) {
            Err((_, Errno::EWOULDBLOCK)) => Ok(Holder::Live(parse_pid(&text).ok())),
            Err((_, errno)) => {
                Err(io::Error::from(errno)).with_context(|| format!("lock {}", self.path.display()))
            }
            Ok(_probe) => Ok(Holder::Stale(match parse_pid(&text) {
                Ok(pid) if is_running(pid.as_raw() as u32) => {
                    format!("process {pid} is not a pyvisor daemon (the pid was reused)")
                }
                Ok(pid) => format!("process {pid} is not running"),
                Err(reason) => reason,
            })),
        }
    }

    /// Waits up to `limit` until no daemon holds the file; whether none does.
    pub async fn wait_released(&self, limit: Duration) -> anyhow::Result<bool> {
        let deadline = Instant::now() + limit;
        loop {
            if !matches!(self.probe()?, Holder::Live(_)) {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Takes the file's lock for this process, the daemon, and writes its pid inside; or
    /// names the pid of the live daemon that holds it (`None` if it has not written it yet).
    pub fn hold(&self) -> anyhow::Result<Result<HeldPidFile, Option<Pid>>> {
        let deadline = Instant::now() + HOLD_RETRY;
        let mut file = loop {
            match lock_at(&self.path, FlockArg::LockExclusiveNonblock, 0o644)? {
                Some(file) => break file,
                // A `daemon status` probing it lets go at once; a daemon never does.
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                None => {
                    return Ok(Err(match self.probe()? {
                        Holder::Live(pid) => pid,
                        _ => None,
                    }))
                }
            }
        };
        let pid = std::process::id();
        (|| {
            file.set_len(0)?;
            file.rewind()?;
            writeln!(file, "{pid}")?;
            file.sync_all()
        })()
        .with_context(|| format!("write {}", self.path.display()))?;
        Ok(Ok(HeldPidFile { _file: file }))
    }

    /// Removes it unless a live daemon holds it; a missing file is fine.
    pub fn remove_unheld(&self) -> anyhow::Result<()> {
        if let Some(file) = lock_at(&self.path, FlockArg::LockExclusiveNonblock, 0o644)? {
            PidLock {
                file,
                path: self.path.clone(),
            }
            .remove()?;
        }
        Ok(())
    }

    /// Takes the exclusive lock beside the PID file (`<pid file>.lock`), waiting for another
    /// `daemon start` or `daemon stop` to finish. Released when the guard is dropped;
    /// [`PidLock::remove`] also removes the file once no daemon is left.
    pub fn lock(&self) -> anyhow::Result<PidLock> {
        let path = self
            .path
            .with_file_name(format!("{}.lock", file_name(&self.path)));
        let file = lock_at(&path, FlockArg::LockExclusive, 0o600)?
            .expect("a blocking lock is taken or fails");
        Ok(PidLock { file, path })
    }
}

/// The PID file's lock, held by the daemon until it exits.
#[derive(Debug)]
pub struct HeldPidFile {
    _file: Flock<File>,
}

/// Opens (creating it with `mode`, its directory 0700) and locks the file at `path`; `None`
/// when a non-blocking `how` finds it locked. If the holder removed the file meanwhile, this
/// lock is on a file nobody else will open: the one to take is at the path now.
fn lock_at(path: &Path, how: FlockArg, mode: u32) -> anyhow::Result<Option<Flock<File>>> {
    create_private_dir(path)?;
    loop {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(mode)
            .open(path)
            .with_context(|| format!("open {}", path.display()))?;
        let file = match Flock::lock(file, how) {
            Ok(file) => file,
            Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, errno)) => {
                return Err(io::Error::from(errno))
                    .with_context(|| format!("lock {}", path.display()))
            }
        };
        let held = file
            .metadata()
            .with_context(|| format!("stat {}", path.display()))?;
        match std::fs::metadata(path) {
            Ok(now) if now.dev() == held.dev() && now.ino() == held.ino() => {
                return Ok(Some(file));
            }
            Ok(_) => continue,
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err).with_context(|| format!("stat {}", path.display())),
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
    /// Removes the locked file, then releases the lock: nothing is left behind. A command
    /// waiting for the lock meanwhile sees that its file is gone and locks anew.
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

/// The daemon's pid as messages show it: a live daemon that has not written it yet is
/// `starting`.
pub fn shown(pid: Option<Pid>) -> String {
    pid.map_or_else(|| "starting".to_owned(), |pid| pid.to_string())
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
    fn a_held_file_is_live_in_a_private_dir_and_stale_once_released() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = PidFile::new(dir.path().join("run/pyvisor/pyvisor.pid"));
        assert_eq!(file.probe().unwrap(), Holder::Missing);
        let held = file.hold().unwrap().expect("nobody holds it");
        let me = Pid::from_raw(std::process::id() as i32);
        assert_eq!(file.probe().unwrap(), Holder::Live(Some(me)));
        let mode = std::fs::metadata(dir.path().join("run/pyvisor"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // A second holder is refused and told the first one's pid; removal leaves it alone.
        assert_eq!(file.hold().unwrap().err(), Some(Some(me)));
        file.remove_unheld().unwrap();
        assert_eq!(file.probe().unwrap(), Holder::Live(Some(me)));
        drop(held);
        // This process still runs, but it no longer holds the lock.
        assert_eq!(
            file.probe().unwrap(),
            Holder::Stale(format!(
                "process {me} is not a pyvisor daemon (the pid was reused)"
            ))
        );
        file.remove_unheld().unwrap();
        assert_eq!(file.probe().unwrap(), Holder::Missing);
        file.remove_unheld().unwrap();
    }

    #[test]
    fn unheld_contents_are_stale_and_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pyvisor.pid");
        let file = PidFile::new(path.clone());
        std::fs::write(&path, "garbage\n").unwrap();
        assert_eq!(
            file.probe().unwrap(),
            Holder::Stale("\"garbage\" is not a process id".into())
        );
        let mut dead = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = dead.id();
        dead.wait().unwrap();
        std::fs::write(&path, format!("{dead_pid}\n")).unwrap();
        assert_eq!(
            file.probe().unwrap(),
            Holder::Stale(format!("process {dead_pid} is not running"))
        );
    }
}
