//! Adopting a clone of a session's worker (`session.fork`): the worker forked a child that
//! waits, running nothing, for the start frame on pipes of its own (see the worker's
//! `cloning`). The host checks that the pid it was told of is that worker's child in a
//! process group of its own (the message came from a process that session code controls),
//! opens the host's ends of the child's pipes through `/proc/<pid>/fd` (refusing anything
//! that is not a pipe) and starts it; while the clone says hello like any new worker, the
//! host gives it a cgroup leaf of its own and registers its group with the janitor. The
//! session is made only once both are done, so no request reaches a clone not yet in its
//! leaf; until then it is in its source's, with the source's limits.
//!
//! A clone keeps the uid of its source (taking another would need a capability that session
//! code could use too): the uid's lease lasts until the last worker of the family has ended.
//! Under Landlock the clone isolates itself once started ([`CloneConfinement`]): it copies its
//! source's work directory into its own first, so when there are files to copy it is started
//! only once it is in its own leaf, where the copy is counted (the leaf's creation and the
//! move then come before the start rather than beside it). Without Landlock it shares its
//! source's directories.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};

use pyvisor_protocol::{ForkedClone, HostMessage};
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use super::cgroup::CgroupLeaf;
use super::exit::ExitSource;
use super::pump::PumpPipes;
use super::sandbox::CloneConfinement;
use super::spawn::{contain, create_leaf, handshake, kill_group, HostEnds, Spawned};
use super::{Worker, WorkerOrigin, WorkerSpec};
use crate::errors::SpawnError;

impl Worker {
    /// Adopts `clone`, forked by the worker `source_pid`, as a worker of `spec`'s kind with
    /// its `share` of the source's confinement; it has said hello when this returns. A clone
    /// that cannot be adopted is killed, once it is known to be the source's.
    pub async fn adopt_clone(
        spec: &WorkerSpec,
        source_pid: u32,
        clone: &ForkedClone,
        share: Option<CloneConfinement>,
    ) -> Result<Worker, SpawnError> {
        let pid = clone.pid;
        let failed = |reason: String| SpawnError::Handshake {
            reason: format!("adopt the clone {pid} of worker {source_pid}: {reason}"),
        };
        // The pidfd first: from here on `pid` names this process, even if it dies.
        let (no_report, report) = oneshot::channel();
        drop(no_report);
        let exit = ExitSource::forked(pid, report).map_err(|err| failed(err.to_string()))?;
        check_lineage(pid, source_pid).map_err(failed)?;
        let adopted = async {
            let host = host_ends(pid, clone).map_err(failed)?;
            let (writer, events) = host.start(exit, spec.max_frame);
            let start = || {
                writer
                    .send(&HostMessage::Start)
                    .map_err(|err| failed(format!("send the start frame: {err}")))
            };
            // Until it is in its own leaf the clone is in its source's, under the same limits:
            // a clone that copies files starts only once the copy counts against its own.
            let copies = share.as_ref().is_some_and(|share| share.copies);
            let contained = if copies {
                let leaf = contain_clone(spec, pid).await?;
                start()?;
                Ok(leaf)
            } else {
                start()?;
                contain_clone(spec, pid).await
            };
            let started = |leaf| Spawned {
                pid,
                writer,
                events,
                leaf,
                confinement: share.map(|share| share.confinement),
            };
            match contained {
                Ok(leaf) => handshake(spec, started(leaf), WorkerOrigin::Cloned).await,
                // A clone that cannot isolate itself exits at once, maybe before the move:
                // what it said on its way out is the reason, not the move that found it gone.
                Err(err) => match handshake(spec, started(None), WorkerOrigin::Cloned).await {
                    Ok(alive) => {
                        drop(alive);
                        Err(err)
                    }
                    Err(died) => Err(died),
                },
            }
        };
        let adopted = adopted.await;
        if adopted.is_err() {
            kill_group(pid);
        }
        adopted
    }
}

/// Makes the clone `pid` a cgroup leaf and moves it there, on a blocking thread while the
/// clone says hello: on cgroup v1 the move waits for an RCU grace period (about 6 ms here,
/// more on a busy machine), which must hold up neither the actor thread nor the handshake.
async fn contain_clone(spec: &WorkerSpec, pid: u32) -> Result<Option<CgroupLeaf>, SpawnError> {
    let spec = spec.clone();
    let contained = tokio::task::spawn_blocking(move || {
        let leaf = create_leaf(&spec)?;
        contain(&spec, pid, leaf.as_ref())?;
        Ok(leaf)
    });
    contained.await.map_err(|err| SpawnError::Handshake {
        reason: format!("contain the clone {pid}: {err}"),
    })?
}

/// Checks that `pid` is a child of `source_pid` that leads a process group of its own.
fn check_lineage(pid: u32, source_pid: u32) -> Result<(), String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|err| format!("read its /proc stat: {err}"))?;
    // The command name is in parentheses and may hold anything: fields follow the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest.split(' ').collect())
        .unwrap_or_default();
    let number = |index: usize| fields.get(index).and_then(|f| f.parse::<u32>().ok());
    match (number(1), number(2)) {
        (Some(ppid), Some(pgrp)) if ppid == source_pid && pgrp == pid => Ok(()),
        (ppid, pgrp) => Err(format!(
            "it is not a child of the worker in a group of its own (parent {ppid:?}, group {pgrp:?})"
        )),
    }
}

/// Opens the host's ends of the clone's pipes from its descriptor table.
fn host_ends(pid: u32, clone: &ForkedClone) -> Result<HostEnds, String> {
    let open = |fd: i32, write: bool| -> Result<OwnedFd, String> {
        let path = format!("/proc/{pid}/fd/{fd}");
        let file = File::options()
            .read(!write)
            .write(write)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .map_err(|err| format!("open {path}: {err}"))?;
        let kind = file
            .metadata()
            .map_err(|err| format!("stat {path}: {err}"))?;
        if !kind.file_type().is_fifo() {
            return Err(format!("{path} is not a pipe"));
        }
        Ok(OwnedFd::from(file))
    };
    let receiver = |fd| {
        pipe::Receiver::from_owned_fd(open(fd, false)?).map_err(|err| format!("fd {fd}: {err}"))
    };
    let sender =
        |fd| pipe::Sender::from_owned_fd(open(fd, true)?).map_err(|err| format!("fd {fd}: {err}"));
    Ok(HostEnds {
        pipes: PumpPipes {
            frames: receiver(clone.replies)?,
            stdout: receiver(clone.stdout)?,
            stderr: receiver(clone.stderr)?,
        },
        requests: sender(clone.requests)?,
        control: sender(clone.control)?,
        // Opening the request pipe's end for reading gives the host a read end of its own.
        requests_read: Some(open(clone.requests, false)?),
    })
}
