//! The zygote: one Python process per interpreter and preload set, with the preload modules
//! imported, that forks ready workers on request, in milliseconds instead of the hundreds an
//! interpreter takes to import pandas.
//!
//! [`Zygote`] is the handle; [`Worker::start`](super::Worker::start) asks it for a worker
//! through [`Zygote::fork`]. Behind the handle, one std thread ("pyvisor-zygote") owns the
//! zygote process and does all the blocking socket work, so that nothing blocks an arbiter.
//! The thread is long-lived, which matters: the zygote is started from it through the same
//! [`child_command`](super::child::child_command) as every worker (own process group,
//! `PR_SET_PDEATHSIG` tied to the thread, `PR_SET_NO_NEW_PRIVS`, only fds 0-3), with no memory
//! or process rlimits, and is registered with the janitor. pyworker/pyvisor_worker/zygote.py
//! documents the zygote's side. The thread's loop is in this file; `lifecycle` starts, takes
//! down and stops the process, and `protocol` is what goes over its socket.
//!
//! The zygote talks over a `SOCK_SEQPACKET` socketpair (its fd 3): one JSON
//! [`ZygoteRequest`](pyvisor_protocol::ZygoteRequest) or
//! [`ZygoteReply`](pyvisor_protocol::ZygoteReply) per datagram. A fork request carries the
//! child's fds 0-5 as `SCM_RIGHTS`: the host makes these pipes exactly as for a plain spawn,
//! and closes its copies of the child's ends once they are sent. The zygote keeps one child
//! forked ahead of the next request, so a request costs a message to that child rather than a
//! fork of a process as big as pandas makes it. The zygote reaps its children and reports each
//! exit; the thread hands each report to the pump of that worker through a oneshot channel that
//! it creates when the fork is reported, so no report can come first.
//!
//! A forked child differs from a spawned worker only in what it inherits from the zygote:
//! the preload modules, and the environment the host had when the zygote started (the spec's
//! `env` is applied on top of it, as on top of the host's current one for a spawn).
//!
//! Containment: a forked child sets its own process group, fds and rlimits, then blocks
//! reading its fd 3 until the host sends `start`, which the host does only once the child is
//! registered with the janitor and in its cgroup leaf. No code of the session runs before it
//! is contained, and a child whose host gives up or dies before that reads end of file and
//! exits. The child needs no `PR_SET_PDEATHSIG`: its parent is the zygote, whose death must
//! not take the sessions' workers with it, and the host's death is covered twice over, by the
//! janitor killing the child's group and by end of file on fd 3 ending the worker.
//!
//! When the zygote dies (end of file on its socket), forks fail at once and
//! [`Worker::start`](super::Worker::start) spawns plain workers instead. The next fork
//! request after a backoff (doubling from 100 ms to 30 s with each consecutive failure)
//! starts a new zygote in the background. Workers the dead zygote forked live on, re-parented;
//! their oneshot channels close and their pumps watch their pidfds instead, so their exits
//! are still seen, status unknown. Dropping the last handle closes the socket: the zygote
//! exits (it is killed if it does not within a grace period) and the thread ends.

mod lifecycle;
mod protocol;

use std::collections::HashMap;
use std::mem;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::unistd::{pipe2, read, write};
use pyvisor_protocol::{Rlimit, SandboxPlan};
use tokio::sync::oneshot;

use super::janitor::Janitor;
use crate::errors::SpawnError;

/// Handle on a zygote fork server. Dropping the last handle ends the zygote.
#[derive(Debug)]
pub struct Zygote {
    preload: Vec<String>,
    commands: std_mpsc::Sender<Command>,
    /// Write end of the pipe that wakes the thread when a command is queued.
    wake: OwnedFd,
    /// Pid of the zygote while it serves forks, 0 otherwise.
    pid: Arc<AtomicU32>,
    thread: Option<JoinHandle<()>>,
}

/// What a fork request needs: the child's fds 0-5 and how it sets itself up.
pub(crate) struct ForkOrder {
    /// stdin (/dev/null), stdout, stderr, request pipe (read end), reply pipe (write end).
    pub fds: [OwnedFd; 6],
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    pub rlimits: Vec<Rlimit>,
    /// How the child confines itself before it waits for its start frame.
    pub sandbox: Option<SandboxPlan>,
}

/// A child that the zygote has forked; it waits for its start frame.
pub(crate) struct Forked {
    pub pid: u32,
    /// The child's raw wait status, once the zygote has reaped it. Closes without one when
    /// the zygote is gone.
    pub exit: oneshot::Receiver<i32>,
}

type ForkReply = oneshot::Sender<Result<Forked, SpawnError>>;

enum Command {
    Fork(ForkOrder, ForkReply),
    Stop,
}

impl Zygote {
    /// Starts a zygote that imports `preload` with `python` running `script`, and waits until
    /// it is ready (up to `ready_timeout`; pandas takes about half a second). Blocking: call
    /// it from a blocking context, not from an async task.
    pub fn start(
        python: &Path,
        script: &Path,
        preload: &[String],
        janitor: Option<Arc<Janitor>>,
        ready_timeout: Duration,
    ) -> Result<Zygote, SpawnError> {
        let (commands, queue) = std_mpsc::channel();
        let (wake_read, wake) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .map_err(|errno| SpawnError::Pipe(errno.into()))?;
        let pid = Arc::new(AtomicU32::new(0));
        let server = Server {
            python: python.to_path_buf(),
            script: script.to_path_buf(),
            preload: preload.to_vec(),
            janitor,
            ready_timeout,
            queue,
            wake: wake_read,
            pid: pid.clone(),
            state: State::Down,
            failures: 0,
            retry_at: Instant::now(),
            last_failure: String::new(),
            next_id: 1,
            pending: HashMap::new(),
            watchers: HashMap::new(),
        };
        let (started_tx, started) = std_mpsc::sync_channel(1);
        let thread = thread::Builder::new()
            .name("pyvisor-zygote".into())
            .spawn(move || server.run(started_tx))
            .map_err(|source| SpawnError::Spawn {
                python: python.to_path_buf(),
                source,
            })?;
        let outcome = started.recv().unwrap_or_else(|_| {
            Err(SpawnError::Zygote {
                reason: "its thread ended while it started".into(),
            })
        });
        if let Err(err) = outcome {
            let _ = thread.join();
            return Err(err);
        }
        Ok(Zygote {
            preload: preload.to_vec(),
            commands,
            wake,
            pid,
            thread: Some(thread),
        })
    }

    /// Pid of the zygote process while it serves forks; `None` while it is down or starting.
    pub fn pid(&self) -> Option<u32> {
        match self.pid.load(Ordering::Acquire) {
            0 => None,
            pid => Some(pid),
        }
    }

    /// Whether every module of `modules` is among the zygote's preload modules.
    pub(crate) fn has_imported(&self, modules: &[String]) -> bool {
        modules.iter().all(|module| self.preload.contains(module))
    }

    /// Forks a child as `order` says. Fails at once while the zygote is down or starting
    /// (a request while it is down and its backoff has passed starts it again).
    pub(crate) async fn fork(&self, order: ForkOrder) -> Result<Forked, SpawnError> {
        let gone = || SpawnError::Zygote {
            reason: "its thread has ended".into(),
        };
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Fork(order, reply))
            .map_err(|_| gone())?;
        self.wake();
        answer.await.map_err(|_| gone())?
    }

    fn wake(&self) {
        // A full pipe already holds a wake-up; nothing else can fail here.
        let _ = write(&self.wake, &[1]);
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Stop);
        self.wake();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The zygote process and the host's end of its control socket.
struct Process {
    child: Child,
    pid: u32,
    control: OwnedFd,
}

enum State {
    /// No zygote; the next fork request after `retry_at` starts one.
    Down,
    /// Started, not yet ready; given up at `deadline`.
    Starting { process: Process, deadline: Instant },
    /// Serving forks.
    Ready { process: Process },
}

impl State {
    fn process(&self) -> Option<&Process> {
        match self {
            State::Down => None,
            State::Starting { process, .. } | State::Ready { process } => Some(process),
        }
    }

    fn into_process(self) -> Option<Process> {
        match self {
            State::Down => None,
            State::Starting { process, .. } | State::Ready { process } => Some(process),
        }
    }
}

/// The zygote thread: owns the process, serves fork commands, routes replies.
struct Server {
    python: PathBuf,
    script: PathBuf,
    preload: Vec<String>,
    janitor: Option<Arc<Janitor>>,
    ready_timeout: Duration,
    queue: std_mpsc::Receiver<Command>,
    /// Read end of the wake-up pipe.
    wake: OwnedFd,
    pid: Arc<AtomicU32>,
    state: State,
    /// Consecutive failures to start or keep a zygote; reset when one becomes ready.
    failures: u32,
    retry_at: Instant,
    last_failure: String,
    next_id: u64,
    /// Fork requests sent to the zygote and not answered yet.
    pending: HashMap<u64, ForkReply>,
    /// Where the exit status of each live forked child goes.
    watchers: HashMap<u32, oneshot::Sender<i32>>,
}

/// What one turn of the thread's loop found.
enum Turn {
    Continue,
    Stop,
}

impl Server {
    fn run(mut self, started: std_mpsc::SyncSender<Result<(), SpawnError>>) {
        let first = self.launch().and_then(|()| {
            while let State::Starting { .. } = self.state {
                // No handle exists yet, so no command can arrive: only the zygote speaks.
                if let Turn::Stop = self.turn() {
                    break;
                }
            }
            match self.state {
                State::Ready { .. } => Ok(()),
                _ => Err(SpawnError::Zygote {
                    reason: mem::take(&mut self.last_failure),
                }),
            }
        });
        let failed = first.is_err();
        let _ = started.send(first);
        if failed {
            self.stop();
            return;
        }
        while let Turn::Continue = self.turn() {}
        self.stop();
    }

    /// Waits for a command, a reply, or the start deadline, and handles what came.
    fn turn(&mut self) -> Turn {
        let timeout = match &self.state {
            State::Starting { deadline, .. } => {
                let left = deadline.saturating_duration_since(Instant::now());
                PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX)
            }
            _ => PollTimeout::NONE,
        };
        let (woken, replies) = {
            let mut fds = vec![PollFd::new(self.wake.as_fd(), PollFlags::POLLIN)];
            if let Some(process) = self.state.process() {
                fds.push(PollFd::new(process.control.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, timeout) {
                Ok(_) => {}
                Err(Errno::EINTR) => return Turn::Continue,
                Err(errno) => {
                    tracing::error!(error = %errno, "the zygote thread cannot poll; it stops");
                    self.last_failure = format!("its thread cannot poll: {errno}");
                    return Turn::Stop;
                }
            }
            let ready = |fd: &PollFd| fd.revents().is_some_and(|events| !events.is_empty());
            (ready(&fds[0]), fds.get(1).is_some_and(ready))
        };
        if replies {
            self.read_replies();
        }
        if let State::Starting { deadline, .. } = &self.state {
            if Instant::now() >= *deadline {
                let reason = format!("it was not ready within {:?}", self.ready_timeout);
                self.down(reason);
            }
        }
        if woken {
            let mut buffer = [0u8; 64];
            while matches!(read(&self.wake, &mut buffer), Ok(n) if n > 0) {}
            loop {
                match self.queue.try_recv() {
                    Ok(Command::Fork(order, reply)) => self.fork(order, reply),
                    Ok(Command::Stop) | Err(std_mpsc::TryRecvError::Disconnected) => {
                        return Turn::Stop;
                    }
                    Err(std_mpsc::TryRecvError::Empty) => break,
                }
            }
        }
        Turn::Continue
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    use super::*;
    use crate::worker::{install_worker_package, resolve_interpreter};

    #[tokio::test]
    async fn a_child_runs_nothing_before_its_start_frame_and_exits_without_one() {
        let python = resolve_interpreter("python3").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let script = install_worker_package(dir.path()).unwrap();
        let zygote = tokio::task::spawn_blocking(move || {
            Zygote::start(&python, &script, &[], None, Duration::from_secs(30))
        })
        .await
        .unwrap()
        .unwrap();
        let (requests_read, requests_write) = pipe2(OFlag::O_CLOEXEC).unwrap();
        let (replies_read, replies_write) = pipe2(OFlag::O_CLOEXEC).unwrap();
        let (control_read, _control_write) = pipe2(OFlag::O_CLOEXEC).unwrap();
        let null = || File::options().read(true).write(true).open("/dev/null");
        let order = ForkOrder {
            fds: [
                null().unwrap().into(),
                null().unwrap().into(),
                null().unwrap().into(),
                requests_read,
                replies_write,
                control_read,
            ],
            cwd: None,
            env: Vec::new(),
            rlimits: Vec::new(),
            sandbox: None,
        };
        let forked = zygote.fork(order).await.unwrap();
        // Set up, the child blocks reading fd 3 on its main thread, having said nothing.
        let pid = forked.pid;
        let waiting = || {
            std::fs::read_to_string(format!("/proc/{pid}/syscall")).is_ok_and(|call| {
                let mut fields = call.split_whitespace();
                fields.next() == Some(libc::SYS_read.to_string().as_str())
                    && fields.next() == Some("0x3")
            })
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !waiting() {
            assert!(Instant::now() < deadline, "the child never waited on fd 3");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut replies = File::from(replies_read);
        let mut said = Vec::new();
        // The host gives up on the child before it is contained: no start frame comes.
        drop(requests_write);
        let status = tokio::time::timeout(Duration::from_secs(60), forked.exit)
            .await
            .expect("the child exits")
            .expect("the zygote reports it");
        assert_eq!(ExitStatus::from_raw(status).code(), Some(0));
        replies.read_to_end(&mut said).unwrap();
        assert!(said.is_empty(), "no hello before start: {said:?}");
    }
}
