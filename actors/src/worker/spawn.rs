//! Starting a worker process: the one place that sets up everything a worker needs.
//!
//! [`Worker::start`] creates the pipes (fds 1/2 captured, protocol on fds 3/4), puts the
//! child in its own process group, arms `PR_SET_PDEATHSIG`, closes every other inherited fd,
//! starts the output/frame pump and waits for the worker's `hello` within a timeout. It must
//! run on a long-lived thread (an arbiter): the death signal fires when the spawning thread
//! exits.

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use command_fds::{CommandFdExt, FdMapping};
use nix::fcntl::OFlag;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::{pipe2, Pid};
use pyvisor_protocol::{WorkerMessage, PROTOCOL_VERSION};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use super::cgroup::{CgroupLeaf, CgroupLimits, CgroupManager, CgroupMechanism};
use super::janitor::Janitor;
use super::output::Utf8Chunker;
use super::pump::{pump, PumpPipes, WorkerEvent};
use super::writer::FrameWriter;
use crate::errors::SpawnError;
use crate::limits::ProcessLimits;

/// Events buffered between the pump and the session before the pump waits (back-pressure).
const EVENT_BUFFER: usize = 64;

/// How to start a worker.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// The real interpreter (already resolved, see `resolve_interpreter`).
    pub python: PathBuf,
    /// Path of the installed worker script.
    pub script: PathBuf,
    /// Working directory of the worker; the host's when `None`.
    pub cwd: Option<PathBuf>,
    /// Extra environment variables for the worker.
    pub env: Vec<(String, String)>,
    /// How long the worker may take to say hello.
    pub handshake_timeout: Duration,
    /// Largest frame accepted from the worker.
    pub max_frame: usize,
    /// Kernel limits of the worker and its children.
    pub limits: ProcessLimits,
    /// Where per-worker cgroup leaves are made; rlimits alone when `None`.
    pub cgroups: Option<Arc<CgroupManager>>,
    /// Ends the worker's process group if the host dies.
    pub janitor: Option<Arc<Janitor>>,
}

/// What the worker said about itself in its `hello`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    pub pid: u32,
    pub python_version: String,
    pub executable: String,
}

/// A running worker: its identity, the way to send it frames, and its event stream.
#[derive(Debug)]
pub struct Worker {
    pub info: WorkerInfo,
    pub writer: FrameWriter,
    pub events: mpsc::Receiver<WorkerEvent>,
    /// What enforces memory and process limits: "cgroup2", "cgroup1" or "rlimit".
    pub containment: &'static str,
    /// The worker's cgroup; dropping it kills whatever is left in it.
    leaf: Option<CgroupLeaf>,
    janitor: Option<Arc<Janitor>>,
}

impl Worker {
    /// Spawns a worker and waits for its `hello`.
    pub async fn start(spec: &WorkerSpec) -> Result<Worker, SpawnError> {
        let Spawned {
            pid,
            writer,
            mut events,
            leaf,
        } = spawn_process(spec)?;
        let hello = tokio::time::timeout(spec.handshake_timeout, wait_for_hello(&mut events));
        match hello.await {
            Ok(Ok(info)) => Ok(Worker {
                info,
                writer,
                events,
                containment: match (&leaf, &spec.cgroups) {
                    (Some(_), Some(cgroups)) => cgroups.mechanism().as_str(),
                    _ => CgroupMechanism::None.as_str(),
                },
                leaf,
                janitor: spec.janitor.clone(),
            }),
            Ok(Err(err)) => {
                forget_group(pid, spec.janitor.as_deref());
                Err(err)
            }
            Err(_) => {
                forget_group(pid, spec.janitor.as_deref());
                Err(SpawnError::Handshake {
                    reason: format!("no hello within {:?}", spec.handshake_timeout),
                })
            }
        }
    }

    /// Process id of the worker (also its process group id).
    pub fn pid(&self) -> u32 {
        self.info.pid
    }

    /// Sends SIGINT to the worker itself (not its children): `KeyboardInterrupt` in user code.
    pub fn interrupt(&self) {
        let _ = kill(Pid::from_raw(self.info.pid as i32), Signal::SIGINT);
    }

    /// Sends SIGKILL to the worker's whole process group.
    pub fn kill(&self) {
        kill_group(self.info.pid);
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Whatever the code left running in the worker's group ends with the worker.
        forget_group(self.info.pid, self.janitor.as_deref());
        // Emptying a cgroup waits for its processes to die: keep that off the actor thread.
        if let Some(leaf) = self.leaf.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(move || drop(leaf))),
                Err(_) => drop(leaf),
            }
        }
    }
}

/// Kills process group `pgid` and tells the janitor it is gone.
fn forget_group(pgid: u32, janitor: Option<&Janitor>) {
    kill_group(pgid);
    if let Some(janitor) = janitor {
        janitor.unregister(pgid);
    }
}

/// SIGKILL to process group `pgid`; a group that is already gone is not an error.
pub(crate) fn kill_group(pgid: u32) {
    let _ = killpg(Pid::from_raw(pgid as i32), Signal::SIGKILL);
}

/// A worker process that has been started but has not said hello yet.
struct Spawned {
    pid: u32,
    writer: FrameWriter,
    events: mpsc::Receiver<WorkerEvent>,
    leaf: Option<CgroupLeaf>,
}

/// Distinguishes the cgroup leaves of one engine.
static NEXT_LEAF: AtomicU64 = AtomicU64::new(1);

fn spawn_process(spec: &WorkerSpec) -> Result<Spawned, SpawnError> {
    let leaf = match &spec.cgroups {
        Some(cgroups) => {
            let name = format!("w-{}", NEXT_LEAF.fetch_add(1, Ordering::Relaxed));
            let limits = CgroupLimits {
                memory_bytes: spec.limits.memory_bytes,
                pids: spec.limits.processes,
            };
            cgroups
                .create_leaf(&name, limits)
                .map_err(SpawnError::Containment)?
        }
        None => None,
    };
    let rlimits = RlimitPlan::new(spec.limits, leaf.is_some());
    let (stdout_read, stdout_write) = cloexec_pipe()?;
    let (stderr_read, stderr_write) = cloexec_pipe()?;
    let (to_worker_read, to_worker_write) = cloexec_pipe()?;
    let (from_worker_read, from_worker_write) = cloexec_pipe()?;

    let mut command = tokio::process::Command::new(&spec.python);
    command
        .arg("-I")
        .arg("-u")
        .arg(&spec.script)
        .stdin(Stdio::null())
        .stdout(Stdio::from(stdout_write))
        .stderr(Stdio::from(stderr_write))
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .kill_on_drop(false);
    if let Some(cwd) = &spec.cwd {
        command.current_dir(cwd);
    }
    command
        .fd_mappings(vec![
            FdMapping {
                parent_fd: to_worker_read,
                child_fd: 3,
            },
            FdMapping {
                parent_fd: from_worker_write,
                child_fd: 4,
            },
        ])
        .expect("fds 3 and 4 are distinct");
    // SAFETY: the hook runs between fork and exec and only makes async-signal-safe syscalls;
    // it is registered after the fd mappings, so fds 3 and 4 are in place when it runs.
    unsafe {
        command.pre_exec(move || prepare_child(&rlimits));
    }
    let child = command.spawn().map_err(|source| SpawnError::Spawn {
        python: spec.python.clone(),
        source,
    })?;
    // Dropping the command closes our copies of the child's pipe ends, so EOF is seen.
    drop(command);
    let pid = child.id().ok_or_else(|| SpawnError::Handshake {
        reason: "worker exited before it could be tracked".into(),
    })?;
    if let Some(janitor) = &spec.janitor {
        janitor.register(pid);
    }
    // The interpreter takes milliseconds to start, so it cannot fork before it is in the leaf.
    if let Some(leaf) = &leaf {
        if let Err(err) = leaf.add(pid) {
            forget_group(pid, spec.janitor.as_deref());
            return Err(SpawnError::Containment(err));
        }
    }

    let pipes = PumpPipes {
        frames: pipe::Receiver::from_owned_fd(from_worker_read).map_err(SpawnError::Pipe)?,
        stdout: pipe::Receiver::from_owned_fd(stdout_read).map_err(SpawnError::Pipe)?,
        stderr: pipe::Receiver::from_owned_fd(stderr_read).map_err(SpawnError::Pipe)?,
    };
    let to_worker = pipe::Sender::from_owned_fd(to_worker_write).map_err(SpawnError::Pipe)?;
    let (events_tx, events_rx) = mpsc::channel(EVENT_BUFFER);
    tokio::spawn(pump(child, pipes, events_tx, spec.max_frame));
    Ok(Spawned {
        pid,
        writer: FrameWriter::start(to_worker, spec.max_frame),
        events: events_rx,
        leaf,
    })
}

/// The rlimits a worker gets: CPU time, open files and no core dumps always; memory and
/// processes only when no cgroup leaf enforces them (`RLIMIT_NPROC` counts every process of
/// the user, so it is a poor fallback, and it does not bind root at all).
#[derive(Debug, Clone, Copy)]
struct RlimitPlan {
    limits: [(libc::__rlimit_resource_t, Option<u64>); 5],
}

impl RlimitPlan {
    fn new(limits: ProcessLimits, in_cgroup: bool) -> Self {
        let fallback = |value: Option<u64>| if in_cgroup { None } else { value };
        Self {
            limits: [
                (libc::RLIMIT_CORE, Some(0)),
                (libc::RLIMIT_CPU, limits.cpu_seconds),
                (libc::RLIMIT_NOFILE, limits.open_files),
                (libc::RLIMIT_AS, fallback(limits.memory_bytes)),
                (libc::RLIMIT_NPROC, fallback(limits.processes)),
            ],
        }
    }
}

/// Runs in the child between fork and exec: death signal, no new privileges, rlimits, then
/// close every fd above 4.
fn prepare_child(rlimits: &RlimitPlan) -> io::Result<()> {
    // SAFETY: plain syscalls on values already in memory; nothing allocates.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
            || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
        {
            return Err(io::Error::last_os_error());
        }
        for (resource, value) in rlimits.limits {
            let Some(value) = value else { continue };
            // The soft CPU limit sends SIGXCPU; the hard one a second later kills for sure.
            let hard = if resource == libc::RLIMIT_CPU {
                value.saturating_add(1)
            } else {
                value
            };
            let limit = libc::rlimit {
                rlim_cur: value,
                rlim_max: hard,
            };
            if libc::setrlimit(resource, &limit) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if libc::syscall(libc::SYS_close_range, 5u32, u32::MAX, 0u32) != 0 {
            // Kernels before 5.9: close what a sane fd limit allows, one by one.
            for fd in 5..65_536 {
                libc::close(fd);
            }
        }
    }
    Ok(())
}

fn cloexec_pipe() -> Result<(OwnedFd, OwnedFd), SpawnError> {
    pipe2(OFlag::O_CLOEXEC).map_err(|errno| SpawnError::Pipe(io::Error::from(errno)))
}

/// Waits for the worker's `hello`, collecting stderr so a failed start can say why.
async fn wait_for_hello(
    events: &mut mpsc::Receiver<WorkerEvent>,
) -> Result<WorkerInfo, SpawnError> {
    let mut stderr = Utf8Chunker::default();
    let mut stderr_text = String::new();
    let failure = |what: String, stderr_text: &str| SpawnError::Handshake {
        reason: if stderr_text.trim().is_empty() {
            what
        } else {
            format!("{what}; worker stderr: {}", stderr_text.trim())
        },
    };
    while let Some(event) = events.recv().await {
        match event {
            WorkerEvent::Message(WorkerMessage::Hello {
                protocol,
                pid,
                python_version,
                executable,
            }) => {
                if protocol != PROTOCOL_VERSION {
                    return Err(failure(
                        format!("worker speaks protocol {protocol}, host {PROTOCOL_VERSION}"),
                        &stderr_text,
                    ));
                }
                return Ok(WorkerInfo {
                    pid,
                    python_version,
                    executable,
                });
            }
            WorkerEvent::Output { stream, bytes } => {
                if stream == crate::execution::OutputStream::Stderr && stderr_text.len() < 8192 {
                    stderr_text.push_str(&stderr.decode(&bytes));
                }
            }
            WorkerEvent::Message(other) => {
                return Err(failure(
                    format!("expected hello, got {other:?}"),
                    &stderr_text,
                ));
            }
            WorkerEvent::ProtocolError(reason) => {
                return Err(failure(format!("protocol error: {reason}"), &stderr_text));
            }
            WorkerEvent::Exited(status) => {
                return Err(failure(
                    format!("worker exited before hello ({status})"),
                    &stderr_text,
                ));
            }
        }
    }
    Err(failure("worker event stream closed".into(), &stderr_text))
}
