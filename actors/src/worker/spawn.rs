//! Starting a worker process: the one place that sets up everything a worker needs.
//!
//! [`Worker::start`] gets the process from the spec's zygote when it has one and it is up
//! (a fork with the preload modules already imported), else spawns a fresh interpreter.
//! Either way it creates the pipes (fds 1/2 captured, protocol on fds 3/4 and control on
//! fd 5), the worker ends up in its own process group with its rlimits, only fds 0-5 open, registered with the janitor
//! and in its cgroup leaf, then the output/frame pump starts and the worker's `hello` is
//! awaited within a timeout.
//!
//! Every process pyvisor execs is prepared by [`child_command`] (see `child`). A forked worker
//! gets none of those pre-exec steps: the zygote's child sets itself up (see `zygote`).

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use command_fds::FdMapping;
use nix::fcntl::OFlag;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::{pipe2, Pid};
use pyvisor_protocol::{HostMessage, SandboxApplied, WorkerMessage, PROTOCOL_VERSION};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use super::cgroup::{CgroupLeaf, CgroupLimits, CgroupManager, CgroupMechanism};
use super::child::{child_command, ChildPlan, RlimitPlan};
use super::exit::ExitSource;
use super::janitor::Janitor;
use super::output::Utf8Chunker;
use super::pump::{pump, PumpPipes, WorkerEvent};
use super::sandbox::{Confinement, Sandbox};
use super::script::verify_worker_package;
use super::writer::FrameWriter;
use super::zygote::{ForkOrder, Zygote};
use crate::errors::SpawnError;
use crate::limits::ProcessLimits;

/// Events buffered between the pump and the session before the pump waits (back-pressure).
const EVENT_BUFFER: usize = 64;

/// How to start a worker.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// The real interpreter (already resolved, see `resolve_interpreter`).
    pub python: PathBuf,
    /// The installed worker package: the directory the interpreter runs.
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
    /// Modules imported before the worker says hello.
    pub preload: Vec<String>,
    /// Forks workers with `preload` already imported; plain spawn when `None` or down.
    pub zygote: Option<Arc<Zygote>>,
    /// How the worker is confined; not at all when `None`.
    pub sandbox: Option<Arc<Sandbox>>,
    /// Whether the worker may open internet sockets (only with a sandbox).
    pub network: bool,
}

/// What the worker said about itself in its `hello`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    pub pid: u32,
    pub python_version: String,
    pub executable: String,
    /// The confinement the worker reported applying; `None` for an unconfined worker.
    pub sandbox: Option<SandboxApplied>,
    /// The optional requests the worker announced it serves (`"speculate"`, ...).
    pub capabilities: Vec<String>,
}

impl WorkerInfo {
    /// Whether the worker announced `capability`: a host sends an optional request only to a
    /// worker that did, so a newer host can drive an older worker.
    pub fn supports(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|c| c == capability)
    }
}

/// How a worker process came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerOrigin {
    /// A fresh interpreter, spawned by the host.
    Spawned,
    /// Forked by the zygote, with its preload modules already imported.
    Forked,
    /// Forked by another session's worker: a clone of that session (`session.fork`).
    Cloned,
}

/// A running worker: its identity, the way to send it frames, and its event stream.
#[derive(Debug)]
pub struct Worker {
    pub info: WorkerInfo,
    pub writer: FrameWriter,
    pub events: mpsc::Receiver<WorkerEvent>,
    /// What enforces memory and process limits: "cgroup2", "cgroup1" or "rlimit".
    pub containment: &'static str,
    /// Whether the process was spawned or forked by the zygote.
    pub origin: WorkerOrigin,
    /// The worker's cgroup; dropping it kills whatever is left in it.
    leaf: Option<CgroupLeaf>,
    /// The worker's uid and directories, shared with its clones (see `clone`); dropping the
    /// last holder sweeps the uid and removes them.
    confinement: Option<Arc<Confinement>>,
    janitor: Option<Arc<Janitor>>,
}

impl Worker {
    /// Starts a worker, forked by the spec's zygote when that works, and waits for its
    /// `hello`.
    pub async fn start(spec: &WorkerSpec) -> Result<Worker, SpawnError> {
        if let Some(zygote) = spec.zygote.as_deref() {
            match Self::fork(spec, zygote).await {
                Ok(worker) => return Ok(worker),
                Err(err @ SpawnError::Zygote { .. }) => {
                    tracing::debug!(error = %err, "no worker from the zygote; spawning one");
                }
                Err(err) => {
                    tracing::info!(error = %err, "the forked worker failed; spawning one");
                }
            }
        }
        let spawned = spawn_process(spec)?;
        handshake(spec, spawned, WorkerOrigin::Spawned).await
    }

    async fn fork(spec: &WorkerSpec, zygote: &Zygote) -> Result<Worker, SpawnError> {
        if !zygote.has_imported(&spec.preload) {
            return Err(SpawnError::Zygote {
                reason: format!("it has not imported every module of {:?}", spec.preload),
            });
        }
        let forked = fork_process(spec, zygote).await?;
        handshake(spec, forked, WorkerOrigin::Forked).await
    }

    /// Process id of the worker (also its process group id).
    pub fn pid(&self) -> u32 {
        self.info.pid
    }

    /// Asks the worker to interrupt the execution `execution_id`: `KeyboardInterrupt` in its
    /// code, or at once if the worker has not started it yet. An interrupt frame, not a
    /// signal, so that it names the execution: it is neither lost while the worker has yet to
    /// take the execution up, nor does a late one reach the next execution.
    pub fn interrupt(&self, execution_id: &str) {
        let _ = self.writer.send(&HostMessage::Interrupt {
            id: execution_id.to_owned(),
        });
    }

    /// Sends SIGKILL to the worker's whole process group.
    pub fn kill(&self) {
        kill_group(self.info.pid);
    }

    /// The worker's cgroup leaf, when it has one: its CPU usage and memory-limit kills.
    pub fn cgroup(&self) -> Option<&CgroupLeaf> {
        self.leaf.as_ref()
    }

    /// The worker's confinement (uid, directories), when it has one.
    pub fn confinement(&self) -> Option<&Confinement> {
        self.confinement.as_deref()
    }

    /// The confinement as its clones share it.
    pub fn shared_confinement(&self) -> Option<Arc<Confinement>> {
        self.confinement.clone()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Whatever the code left running in the worker's group ends with the worker.
        forget_group(self.info.pid, self.janitor.as_deref());
        // Emptying a cgroup waits for its processes to die, and sweeping the uid forks:
        // keep both off the actor thread. The leaf goes first, the uid after it.
        let (leaf, confinement) = (self.leaf.take(), self.confinement.take());
        if leaf.is_some() || confinement.is_some() {
            let release = move || {
                drop(leaf);
                drop(confinement);
            };
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(release)),
                Err(_) => release(),
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
pub(super) struct Spawned {
    pub(super) pid: u32,
    pub(super) writer: FrameWriter,
    pub(super) events: mpsc::Receiver<WorkerEvent>,
    pub(super) leaf: Option<CgroupLeaf>,
    pub(super) confinement: Option<Arc<Confinement>>,
}

/// Waits for the `hello` of a started worker; kills it when none comes.
pub(super) async fn handshake(
    spec: &WorkerSpec,
    started: Spawned,
    origin: WorkerOrigin,
) -> Result<Worker, SpawnError> {
    let Spawned {
        pid,
        writer,
        mut events,
        leaf,
        confinement,
    } = started;
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
            origin,
            leaf,
            confinement,
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

/// Distinguishes the cgroup leaves of one engine.
static NEXT_LEAF: AtomicU64 = AtomicU64::new(1);

/// The worker's own cgroup leaf, when the spec has a cgroup manager that can make one.
pub(super) fn create_leaf(spec: &WorkerSpec) -> Result<Option<CgroupLeaf>, SpawnError> {
    let Some(cgroups) = &spec.cgroups else {
        return Ok(None);
    };
    let name = format!("w-{}", NEXT_LEAF.fetch_add(1, Ordering::Relaxed));
    let limits = CgroupLimits {
        memory_bytes: spec.limits.memory_bytes,
        pids: spec.limits.processes,
    };
    cgroups
        .create_leaf(&name, limits)
        .map_err(SpawnError::Containment)
}

/// The worker's confinement, when the spec has a sandbox.
fn confine(spec: &WorkerSpec) -> Result<Option<Confinement>, SpawnError> {
    spec.sandbox
        .as_ref()
        .map(|sandbox| sandbox.prepare(&spec.script, spec.cwd.as_deref(), spec.network))
        .transpose()
        .map(Option::flatten)
}

/// The spec's environment, after the confinement's own (TMPDIR, HOME, MPLCONFIGDIR).
fn worker_env(spec: &WorkerSpec, confinement: Option<&Confinement>) -> Vec<(String, String)> {
    let mut env = confinement.map(Confinement::env).unwrap_or_default();
    env.extend(spec.env.iter().cloned());
    env
}

/// Spawns a fresh interpreter running the worker package.
fn spawn_process(spec: &WorkerSpec) -> Result<Spawned, SpawnError> {
    verify_worker_package(&spec.script)?;
    let confinement = confine(spec)?;
    let leaf = create_leaf(spec)?;
    let (host, child) = worker_pipes()?;
    let mut args = Vec::new();
    if !spec.preload.is_empty() {
        args.push("--preload".to_owned());
        args.push(spec.preload.join(","));
    }
    if let Some(plan) = confinement.as_ref().and_then(Confinement::plan) {
        args.push("--sandbox".to_owned());
        args.push(serde_json::to_string(plan).expect("a sandbox plan serializes"));
    }
    let env = worker_env(spec, confinement.as_ref());
    let mut command = tokio::process::Command::from(child_command(ChildPlan {
        python: &spec.python,
        script: &spec.script,
        args,
        stdout: Stdio::from(child.stdout),
        stderr: Stdio::from(child.stderr),
        fds: vec![
            FdMapping {
                parent_fd: child.requests,
                child_fd: 3,
            },
            FdMapping {
                parent_fd: child.replies,
                child_fd: 4,
            },
            FdMapping {
                parent_fd: child.control,
                child_fd: 5,
            },
        ],
        cwd: spec.cwd.as_deref(),
        env: &env,
        rlimits: RlimitPlan::new(spec.limits, leaf.is_some()),
    }));
    command.kill_on_drop(false);
    let child = command.spawn().map_err(|source| SpawnError::Spawn {
        python: spec.python.clone(),
        source,
    })?;
    // Dropping the command closes our copies of the child's pipe ends, so EOF is seen.
    drop(command);
    let pid = child.id().ok_or_else(|| SpawnError::Handshake {
        reason: "worker exited before it could be tracked".into(),
    })?;
    // The interpreter takes milliseconds to start, so it cannot fork before it is in the leaf.
    contain(spec, pid, leaf.as_ref())?;
    let (writer, events) = host.start(ExitSource::Spawned(child), spec.max_frame);
    Ok(Spawned {
        pid,
        writer,
        events,
        leaf,
        confinement: confinement.map(Arc::new),
    })
}

/// Has the zygote fork a worker, contains it, then lets it start.
async fn fork_process(spec: &WorkerSpec, zygote: &Zygote) -> Result<Spawned, SpawnError> {
    let confinement = confine(spec)?;
    let leaf = create_leaf(spec)?;
    let (host, child) = worker_pipes()?;
    let stdin = File::open("/dev/null").map_err(SpawnError::Pipe)?;
    let cwd = match &spec.cwd {
        Some(cwd) => Some(cwd.clone()),
        None => std::env::current_dir().ok(),
    };
    let cwd = match cwd {
        Some(cwd) => {
            Some(
                cwd.into_os_string()
                    .into_string()
                    .map_err(|cwd| SpawnError::Zygote {
                        reason: format!("the working directory {cwd:?} is not UTF-8"),
                    })?,
            )
        }
        None => None,
    };
    let order = ForkOrder {
        fds: [
            OwnedFd::from(stdin),
            child.stdout,
            child.stderr,
            child.requests,
            child.replies,
            child.control,
        ],
        cwd,
        env: worker_env(spec, confinement.as_ref()),
        rlimits: RlimitPlan::new(spec.limits, leaf.is_some()).to_wire(),
        sandbox: confinement.as_ref().and_then(Confinement::plan).cloned(),
    };
    let forked = tokio::time::timeout(spec.handshake_timeout, zygote.fork(order))
        .await
        .map_err(|_| SpawnError::Zygote {
            reason: format!("no fork within {:?}", spec.handshake_timeout),
        })??;
    let pid = forked.pid;
    let exit = ExitSource::forked(pid, forked.exit).map_err(|err| {
        kill_group(pid);
        SpawnError::Zygote {
            reason: format!("watch the forked worker {pid}: {err}"),
        }
    })?;
    contain(spec, pid, leaf.as_ref())?;
    let (writer, events) = host.start(exit, spec.max_frame);
    // Contained: the child may run now. Until this frame it waits, running nothing.
    writer
        .send(&HostMessage::Start)
        .map_err(|err| SpawnError::Handshake {
            reason: format!("send the start frame: {err}"),
        })?;
    Ok(Spawned {
        pid,
        writer,
        events,
        leaf,
        confinement: confinement.map(Arc::new),
    })
}

/// Registers process group `pid` with the janitor and puts `pid` in its cgroup leaf.
pub(super) fn contain(
    spec: &WorkerSpec,
    pid: u32,
    leaf: Option<&CgroupLeaf>,
) -> Result<(), SpawnError> {
    if let Some(janitor) = &spec.janitor {
        janitor.register(pid);
    }
    if let Some(leaf) = leaf {
        if let Err(err) = leaf.add(pid) {
            forget_group(pid, spec.janitor.as_deref());
            return Err(SpawnError::Containment(err));
        }
    }
    Ok(())
}

/// The host's ends of a worker's pipes, registered with the runtime.
pub(super) struct HostEnds {
    pub(super) pipes: PumpPipes,
    pub(super) requests: pipe::Sender,
    pub(super) control: pipe::Sender,
    /// A read end of the request pipe, kept unread (see the writer).
    pub(super) requests_read: Option<OwnedFd>,
}

impl HostEnds {
    /// Starts the pump and the frame writer of the worker whose exit `exit` observes.
    pub(super) fn start(
        self,
        exit: ExitSource,
        max_frame: usize,
    ) -> (FrameWriter, mpsc::Receiver<WorkerEvent>) {
        let (events_tx, events_rx) = mpsc::channel(EVENT_BUFFER);
        tokio::spawn(pump(exit, self.pipes, events_tx, max_frame));
        let writer = FrameWriter::start(self.requests, self.control, self.requests_read, max_frame);
        (writer, events_rx)
    }
}

/// The worker's ends of its pipes: fds 1, 2, 3, 4 and 5 of the worker.
struct ChildEnds {
    stdout: OwnedFd,
    stderr: OwnedFd,
    requests: OwnedFd,
    replies: OwnedFd,
    control: OwnedFd,
}

/// Creates the five pipes of a worker. The host's ends are registered with the runtime
/// before any process exists, so nothing can fail between starting a process and pumping it.
fn worker_pipes() -> Result<(HostEnds, ChildEnds), SpawnError> {
    let (stdout_read, stdout) = cloexec_pipe()?;
    let (stderr_read, stderr) = cloexec_pipe()?;
    let (requests, requests_write) = cloexec_pipe()?;
    let (replies_read, replies) = cloexec_pipe()?;
    let (control, control_write) = cloexec_pipe()?;
    let requests_read = requests.try_clone().map_err(SpawnError::Pipe)?;
    let host = HostEnds {
        pipes: PumpPipes {
            frames: pipe::Receiver::from_owned_fd(replies_read).map_err(SpawnError::Pipe)?,
            stdout: pipe::Receiver::from_owned_fd(stdout_read).map_err(SpawnError::Pipe)?,
            stderr: pipe::Receiver::from_owned_fd(stderr_read).map_err(SpawnError::Pipe)?,
        },
        requests: pipe::Sender::from_owned_fd(requests_write).map_err(SpawnError::Pipe)?,
        control: pipe::Sender::from_owned_fd(control_write).map_err(SpawnError::Pipe)?,
        requests_read: Some(requests_read),
    };
    let child = ChildEnds {
        stdout,
        stderr,
        requests,
        replies,
        control,
    };
    Ok((host, child))
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
                sandbox,
                capabilities,
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
                    sandbox,
                    capabilities,
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
                let status = match status {
                    Some(status) => status.to_string(),
                    None => "exit status unknown".to_owned(),
                };
                return Err(failure(
                    format!("worker exited before hello ({status})"),
                    &stderr_text,
                ));
            }
        }
    }
    Err(failure("worker event stream closed".into(), &stderr_text))
}
