//! Preparing every process pyvisor execs, workers and zygotes alike: `python -I -B -u` on the
//! worker package in a new process group, with `PR_SET_PDEATHSIG`, `PR_SET_NO_NEW_PRIVS`, its
//! rlimits, an environment of only the host's harmless variables plus its own, fds 3 and up
//! mapped and every other fd closed. The death signal fires when the spawning thread exits, so
//! plain spawns must run on a long-lived thread (an arbiter).
//!
//! glibc's malloc is told to ask for transparent huge pages for the large blocks it maps
//! ([`MALLOC_TUNABLES`]): a worker forks for every checkpoint, speculation and clone, and a
//! fork copies the page table of the whole namespace; for 400 MB of 4 KiB pages that is
//! 100,000 entries (16-70 ms on this VM), for 2 MiB pages 200 (about 1 ms). A page written after
//! a fork is still copied 4 KiB at a time. numpy already asks for huge pages for its arrays.

use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;

use command_fds::{CommandFdExt, FdMapping};
use pyvisor_protocol::{Rlimit, RlimitResource};

use crate::limits::ProcessLimits;

/// Everything a process that pyvisor execs is given; [`child_command`] applies all of it.
pub(crate) struct ChildPlan<'a> {
    pub python: &'a Path,
    pub script: &'a Path,
    /// Arguments after the script.
    pub args: Vec<String>,
    pub stdout: Stdio,
    pub stderr: Stdio,
    /// Host fds that become the child's fds 3 and up; every other fd above 2 is closed.
    pub fds: Vec<FdMapping>,
    /// Working directory; the host's when `None`.
    pub cwd: Option<&'a Path>,
    /// Environment variables on top of those of [`INHERITED_VARS`] the host has.
    pub env: &'a [(String, String)],
    pub rlimits: RlimitPlan,
}

/// The host's variables a child gets (and every `LC_*` one): nothing else of the host's
/// environment, which may hold the daemon's socket path, tokens or other secrets
/// (`PYVISOR_*`), or systemd's variables addressed to the daemon alone.
const INHERITED_VARS: [&str; 4] = ["PATH", "LANG", "TZ", "TERM"];

/// The glibc tunables every child starts with (glibc 2.35 and later; older ones and other C
/// libraries ignore them): malloc asks for transparent huge pages for the blocks it maps
/// itself (`madvise(MADV_HUGEPAGE)`, which the kernel's default THP mode honours). A
/// `GLIBC_TUNABLES` in the worker's own environment replaces it.
const MALLOC_TUNABLES: &str = "glibc.malloc.hugetlb=1";

/// Whether a child gets the host's variable `name`.
pub fn inherited(name: &str) -> bool {
    INHERITED_VARS.contains(&name) || name.starts_with("LC_")
}

/// The command that runs `python -I -B -u script args...` as `plan` says, in its own process
/// group, with the death signal, no new privileges, its rlimits and only its own fds.
pub(crate) fn child_command(plan: ChildPlan<'_>) -> std::process::Command {
    let mut command = std::process::Command::new(plan.python);
    command
        .arg("-I")
        .arg("-B")
        .arg("-u")
        .arg(plan.script)
        .args(&plan.args)
        .stdin(Stdio::null())
        .stdout(plan.stdout)
        .stderr(plan.stderr)
        .env_clear()
        .envs(std::env::vars_os().filter(|(name, _)| name.to_str().is_some_and(inherited)))
        .env("GLIBC_TUNABLES", MALLOC_TUNABLES)
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .process_group(0);
    if let Some(cwd) = plan.cwd {
        command.current_dir(cwd);
    }
    // The first fd after the mapped ones (3 and up): it and every fd above it are closed.
    let first_closed = plan.fds.iter().map(|m| m.child_fd + 1).max().unwrap_or(3) as u32;
    command
        .fd_mappings(plan.fds)
        .expect("the child's fds 3 and up are distinct");
    let rlimits = plan.rlimits;
    // SAFETY: the hook runs between fork and exec and only makes async-signal-safe syscalls;
    // it is registered after the fd mappings, so the mapped fds are in place when it runs.
    unsafe {
        command.pre_exec(move || prepare_child(&rlimits, first_closed));
    }
    command
}

/// The rlimits a worker gets: CPU time, open files and no core dumps always; memory and
/// processes only when no cgroup leaf enforces them (`RLIMIT_NPROC` counts every process of
/// the user, so it is a poor fallback, and it does not bind root at all).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RlimitPlan {
    limits: [(RlimitResource, Option<u64>); 5],
}

impl RlimitPlan {
    pub(crate) fn new(limits: ProcessLimits, in_cgroup: bool) -> Self {
        let fallback = |value: Option<u64>| if in_cgroup { None } else { value };
        Self {
            limits: [
                (RlimitResource::Core, Some(0)),
                (RlimitResource::Cpu, limits.cpu_seconds),
                (RlimitResource::Nofile, limits.open_files),
                (RlimitResource::As, fallback(limits.memory_bytes)),
                (RlimitResource::Nproc, fallback(limits.processes)),
            ],
        }
    }

    /// Every limit that is set, with its soft and hard values. Allocates nothing.
    fn each(&self) -> impl Iterator<Item = Rlimit> + '_ {
        self.limits.iter().filter_map(|&(resource, value)| {
            let soft = value?;
            // The soft CPU limit sends SIGXCPU; the hard one a second later kills for sure.
            let hard = match resource {
                RlimitResource::Cpu => soft.saturating_add(1),
                _ => soft,
            };
            Some(Rlimit {
                resource,
                soft,
                hard,
            })
        })
    }

    /// The limits as a forked worker sets them on itself.
    pub(crate) fn to_wire(self) -> Vec<Rlimit> {
        self.each().collect()
    }
}

fn libc_resource(resource: RlimitResource) -> libc::__rlimit_resource_t {
    match resource {
        RlimitResource::Core => libc::RLIMIT_CORE,
        RlimitResource::Cpu => libc::RLIMIT_CPU,
        RlimitResource::Nofile => libc::RLIMIT_NOFILE,
        RlimitResource::As => libc::RLIMIT_AS,
        RlimitResource::Nproc => libc::RLIMIT_NPROC,
    }
}

/// Runs in the child between fork and exec: death signal, no new privileges, rlimits, then
/// close every fd from `first_closed` up.
fn prepare_child(rlimits: &RlimitPlan, first_closed: u32) -> io::Result<()> {
    // SAFETY: plain syscalls on values already in memory; nothing allocates.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
            || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
        {
            return Err(io::Error::last_os_error());
        }
        for limit in rlimits.each() {
            let value = libc::rlimit {
                rlim_cur: limit.soft,
                rlim_max: limit.hard,
            };
            if libc::setrlimit(libc_resource(limit.resource), &value) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if libc::syscall(libc::SYS_close_range, first_closed, u32::MAX, 0u32) != 0 {
            // Kernels before 5.9: close what a sane fd limit allows, one by one.
            for fd in first_closed as i32..65_536 {
                libc::close(fd);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rlimits_fall_back_to_memory_and_processes_only_outside_a_cgroup() {
        let limits = ProcessLimits {
            memory_bytes: Some(1 << 30),
            cpu_seconds: Some(10),
            open_files: Some(256),
            processes: Some(64),
        };
        let resources = |plan: RlimitPlan| {
            plan.to_wire()
                .into_iter()
                .map(|limit| (limit.resource, limit.soft, limit.hard))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            resources(RlimitPlan::new(limits, true)),
            [
                (RlimitResource::Core, 0, 0),
                (RlimitResource::Cpu, 10, 11),
                (RlimitResource::Nofile, 256, 256),
            ]
        );
        assert_eq!(resources(RlimitPlan::new(limits, false)).len(), 5);
    }
}
