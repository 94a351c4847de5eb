//! The zygote process's life: starting it from the zygote thread, taking it down when it fails,
//! stopping it when the last handle goes, and the backoff before a restart.

use std::mem;
use std::process::{Child, Stdio};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use command_fds::FdMapping;
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

use super::{Process, Server, State};
use crate::errors::SpawnError;
use crate::limits::ProcessLimits;
use crate::worker::child::{child_command, ChildPlan, RlimitPlan};
use crate::worker::script::verify_worker_package;
use crate::worker::spawn::kill_group;

/// Wait before the first restart after a failure; doubles with each consecutive failure.
const RESTART_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between restarts of a zygote that keeps failing.
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long a zygote whose socket was closed may take to exit before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(2);

impl Server {
    /// Starts a zygote process; it is ready once it says so.
    pub(super) fn launch(&mut self) -> Result<(), SpawnError> {
        // A restarted zygote, too, imports nothing a session could have written.
        verify_worker_package(&self.script)?;
        let (control, zygote_end) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|errno| SpawnError::Pipe(errno.into()))?;
        let mut args = vec!["--zygote".to_owned()];
        if !self.preload.is_empty() {
            args.push("--preload".to_owned());
            args.push(self.preload.join(","));
        }
        let mut command = child_command(ChildPlan {
            python: &self.python,
            script: &self.script,
            args,
            stdout: Stdio::null(),
            stderr: Stdio::null(),
            fds: vec![FdMapping {
                parent_fd: zygote_end,
                child_fd: 3,
            }],
            cwd: None,
            env: &[],
            rlimits: RlimitPlan::new(ProcessLimits::default(), false),
        });
        let child = command.spawn().map_err(|source| SpawnError::Spawn {
            python: self.python.clone(),
            source,
        })?;
        // Dropping the command closes our copy of the zygote's end of the socket.
        drop(command);
        let pid = child.id();
        if let Some(janitor) = &self.janitor {
            janitor.register(pid);
        }
        self.state = State::Starting {
            process: Process {
                child,
                pid,
                control,
            },
            deadline: Instant::now() + self.ready_timeout,
        };
        Ok(())
    }

    /// The zygote is gone or unusable: kill it, fail what waits on it, plan the restart.
    pub(super) fn down(&mut self, reason: String) {
        tracing::warn!(%reason, preload = ?self.preload, "zygote down");
        if let Some(process) = mem::replace(&mut self.state, State::Down).into_process() {
            kill_group(process.pid);
            self.reap(process.child, process.pid);
        }
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Instant::now() + restart_backoff(self.failures);
        self.orphan(&reason);
        self.last_failure = reason;
    }

    /// Ends the zygote cleanly: closing its socket makes it exit; it is killed if it does not.
    pub(super) fn stop(&mut self) {
        if let Some(process) = mem::replace(&mut self.state, State::Down).into_process() {
            let Process {
                mut child,
                pid,
                control,
            } = process;
            drop(control);
            let deadline = Instant::now() + STOP_GRACE;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                // This thread is the zygote's own; no actor waits on it.
                thread::sleep(Duration::from_millis(5));
            }
            kill_group(pid);
            self.reap(child, pid);
        }
        self.orphan("it was stopped");
    }

    /// Waits for the (killed or exited) zygote and tells the janitor its group is gone.
    fn reap(&self, mut child: Child, pid: u32) {
        let _ = child.wait();
        if let Some(janitor) = &self.janitor {
            janitor.unregister(pid);
        }
        self.pid.store(0, Ordering::Release);
    }

    /// Fails the forks in flight and lets go of the forked children: their pumps watch their
    /// pidfds from now on.
    fn orphan(&mut self, reason: &str) {
        for (_, reply) in self.pending.drain() {
            let _ = reply.send(Err(SpawnError::Zygote {
                reason: format!("it went down during the fork: {reason}"),
            }));
        }
        self.watchers.clear();
    }
}

/// How long to wait before restarting after `failures` consecutive failures (at least 1).
fn restart_backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (RESTART_BACKOFF * 2u32.pow(doublings)).min(RESTART_BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_backoff_doubles_up_to_its_cap() {
        assert_eq!(restart_backoff(1), Duration::from_millis(100));
        assert_eq!(restart_backoff(2), Duration::from_millis(200));
        assert_eq!(restart_backoff(5), Duration::from_millis(1600));
        assert_eq!(restart_backoff(40), RESTART_BACKOFF_MAX);
    }
}
