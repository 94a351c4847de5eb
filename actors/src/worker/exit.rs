//! How the pump learns that a worker process has exited, and with what status.
//!
//! A spawned worker is the host's own child: tokio's [`Child`] waits for it and reaps it. A
//! forked worker is the zygote's child: the zygote reaps it and reports its wait status, which
//! the zygote thread passes on through a oneshot channel. When that channel closes without a
//! status, the zygote is gone, the worker has been re-parented, and nobody will ever report
//! its status: the pidfd opened right after the fork then tells when it exits, status unknown.
//! The pidfd is opened while the worker is known to be alive (it waits for its start frame),
//! so it names that process even if its pid is reused later.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::process::Child;
use tokio::sync::oneshot;

/// Whether process `pid` is running: it exists and is neither a zombie nor dead. A
/// process nobody has reaped yet still exists, so its pid alone does not say it runs.
pub fn is_running(pid: u32) -> bool {
    // The state follows the command name, which is in parentheses and may hold spaces.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X']))
    })
}

/// The entries of `base` whose name, read by `pid_of`, names a process that no longer
/// exists: what engines that died without cleaning up left behind.
pub fn left_by_dead_processes(
    base: &std::path::Path,
    pid_of: impl Fn(&str) -> Option<u32>,
) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| {
            let pid = entry.file_name().to_str().and_then(&pid_of);
            // Any answer but "no such process" (EPERM included) means it still lives.
            pid.and_then(|pid| i32::try_from(pid).ok())
                .filter(|&pid| pid > 0)
                .is_some_and(|pid| {
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                        == Err(nix::errno::Errno::ESRCH)
                })
        })
        .map(|entry| entry.path())
        .collect()
}

/// Where the exit of one worker process is observed.
pub(crate) enum ExitSource {
    /// The host spawned the worker and reaps it.
    Spawned(Child),
    /// The zygote forked the worker: its report while it lives, the pidfd after.
    Forked {
        report: Option<oneshot::Receiver<i32>>,
        pidfd: AsyncFd<OwnedFd>,
    },
}

impl ExitSource {
    /// Watches the forked worker `pid`, whose wait status the zygote sends on `report`.
    pub(crate) fn forked(pid: u32, report: oneshot::Receiver<i32>) -> io::Result<Self> {
        // SAFETY: the AsyncFd owns the pidfd, which stays open for as long as it does.
        let pidfd =
            unsafe { AsyncFd::register_with_interest(pidfd_open(pid)?, Interest::READABLE) }?;
        Ok(Self::Forked {
            report: Some(report),
            pidfd,
        })
    }

    /// Waits until the process has exited; `None` when its status cannot be known.
    ///
    /// Cancel-safe: the pump polls it in a `select!` loop.
    pub(crate) async fn wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match self {
            Self::Spawned(child) => child.wait().await.map(Some),
            Self::Forked { report, pidfd } => {
                if let Some(receiver) = report {
                    if let Ok(status) = receiver.await {
                        return Ok(Some(ExitStatus::from_raw(status)));
                    }
                    *report = None;
                }
                // A pidfd polls readable once its process has exited.
                let _ready = pidfd.readable().await?;
                Ok(None)
            }
        }
    }
}

/// A pidfd (close-on-exec) for process `pid`.
fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; nothing is borrowed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel has just returned this fd (an int, so the cast is exact); nothing
    // else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_entries_of_dead_processes_are_left_behind() {
        let base = tempfile::tempdir().expect("a temp dir");
        let mut reaped = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let dead = reaped.id();
        reaped.wait().expect("reap true");
        let alive = std::process::id();
        for name in [format!("{dead}-a"), format!("{alive}-b"), "junk".to_owned()] {
            std::fs::create_dir(base.path().join(name)).expect("create an entry");
        }
        let pid_of = |name: &str| name.split_once('-')?.0.parse::<u32>().ok();
        let left = left_by_dead_processes(base.path(), pid_of);
        assert_eq!(left, vec![base.path().join(format!("{dead}-a"))]);
        assert!(is_running(alive));
        assert!(!is_running(dead));
    }
}
