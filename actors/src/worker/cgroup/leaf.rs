//! One worker's cgroup leaf (one dir per hierarchy on v1): what it tells about the worker (CPU
//! used, kills by the memory limit) and how everything in it dies.
//!
//! Killing empties the leaf without a fork race: v2 writes `cgroup.kill`; v1 freezes the
//! leaf's freezer group, SIGKILLs every member, thaws (the pending SIGKILL is the first thing
//! each process meets), then repeats for whatever is still listed. Membership is the union of
//! every hierarchy's `cgroup.procs`, so a process that moved itself out of one hierarchy is
//! still found through the others. While the leaf exists the engine's janitor knows it, and
//! kills its members if the engine dies first.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::files::{keyed_value, procs, read, write};
use super::CgroupMechanism;
use crate::worker::janitor::Janitor;

/// Longest a leaf spends killing its processes and waiting for them to leave.
const KILL_BUDGET: Duration = Duration::from_secs(1);
/// Longest a v1 leaf waits for its freezer to report `FROZEN` before killing anyway.
const FREEZE_BUDGET: Duration = Duration::from_millis(250);
/// Pause between two reads of `cgroup.procs` (or `freezer.state`) while killing.
const KILL_POLL: Duration = Duration::from_millis(5);

/// Where a leaf's CPU usage is read.
#[derive(Debug)]
enum CpuUsageFile {
    /// v2 `cpu.stat`, key `usage_usec`.
    Stat(PathBuf),
    /// v1 `cpuacct.usage`, in nanoseconds.
    Cpuacct(PathBuf),
}

/// One worker's cgroup; dropping it kills what is inside and removes it.
#[derive(Debug)]
pub struct CgroupLeaf {
    dirs: Vec<PathBuf>,
    /// v2 `cgroup.kill`, when the kernel has it (5.14+).
    kill_file: Option<PathBuf>,
    /// v1 `freezer.state`, when the freezer hierarchy is mounted.
    freezer_state: Option<PathBuf>,
    /// v2 `memory.events` or v1 `memory.oom_control`: both count `oom_kill`s.
    oom_events: Option<PathBuf>,
    cpu_usage: Option<CpuUsageFile>,
    memory_limit: Option<u64>,
    /// The janitor and the line it knows this leaf by.
    janitor: Option<(Arc<Janitor>, String)>,
}

impl CgroupLeaf {
    /// The leaf made of the existing `dirs`, each with the controllers of its hierarchy,
    /// registered with `janitor` until it is dropped.
    pub(super) fn new(
        mechanism: CgroupMechanism,
        dirs: Vec<(PathBuf, &[&str])>,
        memory_limit: Option<u64>,
        janitor: Option<Arc<Janitor>>,
    ) -> CgroupLeaf {
        let with = |controller: &str| {
            dirs.iter()
                .find(|(_, controllers)| controllers.contains(&controller))
                .map(|(dir, _)| dir.clone())
        };
        let v2 = mechanism == CgroupMechanism::V2;
        let existing = |file: PathBuf| file.exists().then_some(file);
        let kill_file = with("pids")
            .filter(|_| v2)
            .and_then(|d| existing(d.join("cgroup.kill")));
        let freezer_state = with("freezer").and_then(|d| existing(d.join("freezer.state")));
        let oom_file = if v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let oom_events = with("memory").map(|d| d.join(oom_file));
        let cpu_usage = if v2 {
            // A core file of every v2 group, with or without the cpu controller.
            with("pids").map(|d| CpuUsageFile::Stat(d.join("cpu.stat")))
        } else {
            with("cpuacct").map(|d| CpuUsageFile::Cpuacct(d.join("cpuacct.usage")))
        };
        let dirs: Vec<PathBuf> = dirs.into_iter().map(|(dir, _)| dir).collect();
        let janitor = janitor.map(|janitor| {
            let line = serde_json::json!({
                "dirs": dirs.iter().map(|d| d.to_string_lossy()).collect::<Vec<_>>(),
                "freezer": freezer_state.as_ref().map(|f| f.to_string_lossy()),
                "kill": kill_file.as_ref().map(|f| f.to_string_lossy()),
            })
            .to_string();
            janitor.register_leaf(&line);
            (janitor, line)
        });
        CgroupLeaf {
            dirs,
            kill_file,
            freezer_state,
            oom_events,
            cpu_usage,
            memory_limit,
            janitor,
        }
    }

    /// Moves process `pid` (and so its future children) into the leaf, in every hierarchy.
    pub fn add(&self, pid: u32) -> std::io::Result<()> {
        for dir in &self.dirs {
            write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// SIGKILLs every process in the leaf, repeating (within a bound) until it is empty.
    pub fn kill_all(&self) {
        if !self.kill_until_empty(KILL_BUDGET) {
            tracing::debug!("cgroup leaf still holds {:?} after kill", self.pids());
        }
    }

    /// Pids currently in the leaf, in any of its hierarchies.
    pub fn pids(&self) -> Vec<u32> {
        let pids: BTreeSet<u32> = self.dirs.iter().flat_map(|dir| procs(dir)).collect();
        pids.into_iter().collect()
    }

    /// CPU time used by every process that has been in the leaf; `None` without a CPU
    /// accounting controller.
    pub fn cpu_usage(&self) -> Option<Duration> {
        match self.cpu_usage.as_ref()? {
            CpuUsageFile::Stat(file) => keyed_value(file, "usage_usec").map(Duration::from_micros),
            CpuUsageFile::Cpuacct(file) => read(file)
                .ok()?
                .trim()
                .parse()
                .ok()
                .map(Duration::from_nanos),
        }
    }

    /// The memory limit in bytes, when the leaf has one.
    pub fn memory_limit(&self) -> Option<u64> {
        self.memory_limit
    }

    /// How many processes the kernel killed in this leaf for going over its memory limit.
    pub fn oom_kills(&self) -> u64 {
        let file = self.oom_events.as_deref();
        file.and_then(|f| keyed_value(f, "oom_kill")).unwrap_or(0)
    }

    /// Kills until every hierarchy's `cgroup.procs` is empty or `budget` runs out; true when
    /// empty. The freezer (v1) or `cgroup.kill` (v2) keeps members from forking in between.
    fn kill_until_empty(&self, budget: Duration) -> bool {
        let deadline = Instant::now() + budget;
        let mut pids = self.pids();
        if pids.is_empty() {
            return true;
        }
        if self.kill_file.is_none() {
            let frozen = self.freeze(deadline.min(Instant::now() + FREEZE_BUDGET));
            // Frozen members cannot fork: this list is all of them (bar escapees).
            pids = self.pids();
            pids.into_iter().for_each(sigkill);
            if frozen {
                self.set_freezer("THAWED");
            }
        }
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            match &self.kill_file {
                Some(file) => {
                    if let Err(e) = write(file, "1") {
                        tracing::debug!("cgroup.kill failed: {e}");
                    }
                }
                None => pids.into_iter().for_each(sigkill),
            }
            sleep(KILL_POLL);
        }
    }

    /// Freezes the v1 freezer group and waits (until `until`) for it to be frozen; true when
    /// it must be thawed afterwards.
    fn freeze(&self, until: Instant) -> bool {
        let Some(state) = &self.freezer_state else {
            return false;
        };
        if !self.set_freezer("FROZEN") {
            return false;
        }
        while read(state).is_ok_and(|s| s.trim() != "FROZEN") && Instant::now() < until {
            sleep(KILL_POLL);
        }
        true
    }

    fn set_freezer(&self, value: &str) -> bool {
        let Some(state) = &self.freezer_state else {
            return false;
        };
        write(state, value)
            .map_err(|e| tracing::debug!("cgroup freezer: {e}"))
            .is_ok()
    }

    #[cfg(test)]
    pub(super) fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }
}

impl Drop for CgroupLeaf {
    fn drop(&mut self) {
        if !self.kill_until_empty(KILL_BUDGET) {
            // Left registered: the janitor tries again when the engine goes away.
            tracing::warn!(
                "cgroup leaf {:?} not empty after {KILL_BUDGET:?}",
                self.dirs
            );
            return;
        }
        for dir in &self.dirs {
            if let Err(e) = fs::remove_dir(dir) {
                tracing::debug!("cgroup leaf {} not removed: {e}", dir.display());
            }
        }
        if let Some((janitor, line)) = &self.janitor {
            janitor.unregister_leaf(line);
        }
    }
}

/// Sends SIGKILL to `pid`, never to pid 0 (our process group) nor to the engine itself.
fn sigkill(pid: u32) {
    let Ok(raw) = i32::try_from(pid) else { return };
    if raw == 0 || pid == std::process::id() {
        return;
    }
    // ESRCH: it exited since cgroup.procs was read.
    let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
}
