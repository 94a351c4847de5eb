//! Per-session resource containment with cgroups: a pids limit that binds root (unlike
//! `RLIMIT_NPROC`), a memory limit and CPU accounting, one leaf group per worker, and the
//! guarantee that every process in a leaf dies with it.
//!
//! The engine calls [`CgroupManager::detect`] once at startup and shares the manager (via
//! `Arc`) with every session; a session calls [`CgroupManager::create_leaf`] for its worker,
//! adds the worker's pid to the [`CgroupLeaf`] and drops the leaf when the worker is gone.
//! Detection prefers cgroup v2 (a delegated unified hierarchy offering `pids` and `memory`,
//! and `cpu` when it can), then cgroup v1 (separate `pids` and `memory` hierarchies, joined
//! by `cpuacct` and `freezer` where mounted), and otherwise reports
//! [`CgroupMechanism::None`] so the caller relies on rlimits alone; it never fails.
//!
//! The manager owns this engine's parent group `pyvisor-<engine pid>-<n>` (`n` tells apart the
//! engines of one process; one dir on v2, one per hierarchy on v1), created under the engine's
//! own cgroup; a leaf owns its dirs and every process in them. Every group dir is the engine's, mode 0755, and its files the kernel's
//! default 0644: nothing is delegated to the worker. On v2 the engine first moves itself into
//! `<own>/pyvisor-supervisor`, because a cgroup with processes may not enable controllers for
//! its children. At detection the groups of engines that died without cleanup are emptied
//! and removed. Killing a leaf (and so dropping one) polls for up to a second: do it off the
//! async executor.

mod files;
mod leaf;
mod teardown;
#[cfg(test)]
mod tests;

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use leaf::CgroupLeaf;

use super::janitor::Janitor;
use files::{create_leaf_dir, ensure_dir, own_dir, read, write};

/// Leaf of the engine's own v2 cgroup that the engine process moves itself into.
const SUPERVISOR_DIR: &str = "pyvisor-supervisor";
/// Prefix of every engine's parent group; the name goes on with the engine's pid and a dash.
const PARENT_PREFIX: &str = "pyvisor-";
/// v1 controllers a leaf joins when their hierarchy is mounted, beyond `pids` and `memory`:
/// CPU accounting, and the freezer that lets a kill leave no fork behind.
const V1_OPTIONAL: [&str; 2] = ["cpuacct", "freezer"];

/// Which containment mechanism is in force, as reported in session info.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMechanism {
    /// A delegated cgroup v2 subtree.
    V2,
    /// The cgroup v1 `pids` and `memory` hierarchies (and `cpuacct`, `freezer`).
    V1,
    /// No writable cgroups: rlimits only.
    None,
}

impl CgroupMechanism {
    /// The name reported to clients: "cgroup2", "cgroup1" or "rlimit".
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupMechanism::V2 => "cgroup2",
            CgroupMechanism::V1 => "cgroup1",
            CgroupMechanism::None => "rlimit",
        }
    }
}

/// Limits applied to one leaf; `None` leaves that resource unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Memory (and, where accounted, memory plus swap) in bytes.
    pub memory_bytes: Option<u64>,
    /// Processes and threads alive at once.
    pub pids: Option<u64>,
}

/// One cgroup hierarchy the engine uses (v2 has exactly one).
#[derive(Debug, Clone)]
struct Hierarchy {
    /// The engine's own cgroup in it: where parent groups are made.
    base: PathBuf,
    /// The controllers whose files its groups carry (co-mounted v1 controllers share one).
    controllers: Vec<&'static str>,
}

/// This engine's parent group(s), under which every worker's leaf is created.
#[derive(Debug)]
pub struct CgroupManager {
    mechanism: CgroupMechanism,
    hierarchies: Vec<Hierarchy>,
    /// The parent group's name in every hierarchy.
    name: String,
    /// Told about every leaf, so that it can kill their processes if the engine dies.
    janitor: Option<Arc<Janitor>>,
}

impl CgroupManager {
    /// Detects the mechanism, cleans up after dead engines and creates this engine's parent
    /// group; falls back to `None`. Leaves are registered with `janitor`.
    pub fn detect(janitor: Option<Arc<Janitor>>) -> CgroupManager {
        static ENGINES: AtomicU64 = AtomicU64::new(1);
        let engine = ENGINES.fetch_add(1, Ordering::Relaxed);
        let name = format!("{PARENT_PREFIX}{}-{engine}", std::process::id());
        Self::detect_named(&name, janitor)
    }

    /// [`Self::detect`] with the parent group called `name` (tests use several per process).
    fn detect_named(name: &str, janitor: Option<Arc<Janitor>>) -> CgroupManager {
        let found = Self::try_v2().or_else(|e| {
            tracing::debug!("cgroup v2 containment unavailable: {e}");
            Self::try_v1()
        });
        let (mechanism, hierarchies) = match found {
            Ok(found) => found,
            Err(e) => {
                tracing::debug!("cgroup v1 containment unavailable: {e}");
                (CgroupMechanism::None, Vec::new())
            }
        };
        teardown::remove_stale_parents(mechanism, &hierarchies);
        let mut manager = CgroupManager {
            mechanism,
            hierarchies,
            name: name.to_owned(),
            janitor,
        };
        // An optional v1 hierarchy the engine cannot write to is left out; a required one
        // leaves the engine without cgroups.
        let mut failed = None;
        let all = std::mem::take(&mut manager.hierarchies);
        for hierarchy in all {
            match manager.ensure_parent(&hierarchy) {
                Err(e)
                    if hierarchy
                        .controllers
                        .iter()
                        .all(|c| V1_OPTIONAL.contains(c)) =>
                {
                    tracing::warn!("cgroup {:?} left out: {e}", hierarchy.controllers);
                }
                Err(e) => {
                    failed.get_or_insert(e);
                    manager.hierarchies.push(hierarchy);
                }
                Ok(()) => manager.hierarchies.push(hierarchy),
            }
        }
        match failed {
            None => manager,
            // Dropping `manager` removes whatever parent dir it did create.
            Some(e) => {
                tracing::debug!("cgroup parent group not created: {e}");
                CgroupManager {
                    mechanism: CgroupMechanism::None,
                    hierarchies: Vec::new(),
                    name: manager.name.clone(),
                    janitor: None,
                }
            }
        }
    }

    fn try_v2() -> io::Result<(CgroupMechanism, Vec<Hierarchy>)> {
        let mut base = own_dir(None)?;
        // A second detect() in the same process finds the engine already in its supervisor leaf.
        if base.file_name().is_some_and(|n| n == SUPERVISOR_DIR) {
            base.pop();
        }
        let available = read(&base.join("cgroup.controllers"))?;
        let has = |c: &str| available.split_whitespace().any(|a| a == c);
        if !(has("pids") && has("memory")) {
            return Err(io::Error::other(format!(
                "{} offers controllers [{}], not pids and memory",
                base.display(),
                available.trim()
            )));
        }
        let mut controllers = vec!["pids", "memory"];
        let supervisor = base.join(SUPERVISOR_DIR);
        ensure_dir(&supervisor)?;
        write(
            &supervisor.join("cgroup.procs"),
            &std::process::id().to_string(),
        )?;
        let subtree_control = base.join("cgroup.subtree_control");
        write(&subtree_control, "+pids +memory")?;
        // The CPU controller; `cpu.stat` counts usage even where it cannot be enabled.
        match has("cpu").then(|| write(&subtree_control, "+cpu")) {
            Some(Ok(())) => controllers.push("cpu"),
            Some(Err(e)) => tracing::warn!("cgroup2 cpu controller not enabled: {e}"),
            None => tracing::warn!("cgroup2 offers no cpu controller to its workers"),
        }
        Ok((CgroupMechanism::V2, vec![Hierarchy { base, controllers }]))
    }

    fn try_v1() -> io::Result<(CgroupMechanism, Vec<Hierarchy>)> {
        let mut hierarchies: Vec<Hierarchy> = Vec::new();
        for controller in ["pids", "memory"].into_iter().chain(V1_OPTIONAL) {
            let base = match own_dir(Some(controller)) {
                Ok(base) => base,
                Err(e) if V1_OPTIONAL.contains(&controller) => {
                    tracing::warn!("cgroup v1 {controller} unavailable ({e}): leaves go without");
                    continue;
                }
                Err(e) => return Err(e),
            };
            // Co-mounted controllers (such as cpu,cpuacct) share one hierarchy.
            match hierarchies.iter_mut().find(|h| h.base == base) {
                Some(shared) => shared.controllers.push(controller),
                None => hierarchies.push(Hierarchy {
                    base,
                    controllers: vec![controller],
                }),
            }
        }
        Ok((CgroupMechanism::V1, hierarchies))
    }

    /// The mechanism in force for every leaf this manager creates.
    pub fn mechanism(&self) -> CgroupMechanism {
        self.mechanism
    }

    /// Creates the leaf `name` (unique per engine) with `limits`; `Ok(None)` without cgroups.
    pub fn create_leaf(&self, name: &str, limits: CgroupLimits) -> io::Result<Option<CgroupLeaf>> {
        if self.mechanism == CgroupMechanism::None {
            return Ok(None);
        }
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid cgroup leaf name {name:?}"),
            ));
        }
        // Re-created here in case something removed an idle parent since detection.
        self.ensure_parents()?;
        let mut dirs = Vec::new();
        for hierarchy in &self.hierarchies {
            let dir = self.parent(hierarchy).join(name);
            if let Err(e) = create_leaf_dir(&dir) {
                // Dropping the partial leaf removes the dirs already created.
                drop(CgroupLeaf::new(self.mechanism, dirs, None, None));
                return Err(e);
            }
            dirs.push((dir, hierarchy.controllers.as_slice()));
        }
        let with = |controller: &str| {
            dirs.iter()
                .find(|(_, controllers)| controllers.contains(&controller))
                .map(|(dir, _)| dir.clone())
                .ok_or_else(|| io::Error::other(format!("no {controller} hierarchy")))
        };
        let (pids_dir, memory_dir) = (with("pids")?, with("memory")?);
        // From here on an error drops `leaf`, which removes its dirs.
        let leaf = CgroupLeaf::new(
            self.mechanism,
            dirs,
            limits.memory_bytes,
            self.janitor.clone(),
        );
        if let Some(pids) = limits.pids {
            write(&pids_dir.join("pids.max"), &pids.to_string())?;
        }
        if let Some(bytes) = limits.memory_bytes {
            let bytes = bytes.to_string();
            let (limit, swap, swap_value) = match self.mechanism {
                CgroupMechanism::V2 => ("memory.max", "memory.swap.max", "0"),
                _ => (
                    "memory.limit_in_bytes",
                    "memory.memsw.limit_in_bytes",
                    &*bytes,
                ),
            };
            write(&memory_dir.join(limit), &bytes)?;
            // The swap limit is absent without swap accounting; the memory limit holds anyway.
            let swap = memory_dir.join(swap);
            if swap.exists() {
                if let Err(e) = write(&swap, swap_value) {
                    tracing::debug!("cgroup swap limit not set: {e}");
                }
            }
        }
        Ok(Some(leaf))
    }

    /// This engine's parent group in `hierarchy`.
    fn parent(&self, hierarchy: &Hierarchy) -> PathBuf {
        hierarchy.base.join(&self.name)
    }

    /// Creates the parent dir(s) when missing and, on v2, delegates the controllers to leaves.
    fn ensure_parents(&self) -> io::Result<()> {
        self.hierarchies
            .iter()
            .try_for_each(|hierarchy| self.ensure_parent(hierarchy))
    }

    /// [`Self::ensure_parents`] in one hierarchy.
    fn ensure_parent(&self, hierarchy: &Hierarchy) -> io::Result<()> {
        let parent = self.parent(hierarchy);
        ensure_dir(&parent)?;
        if self.mechanism == CgroupMechanism::V2 {
            write(
                &parent.join("cgroup.subtree_control"),
                &subtree_control(&hierarchy.controllers),
            )?;
        }
        Ok(())
    }
}

impl Drop for CgroupManager {
    fn drop(&mut self) {
        teardown::remove_parent(self.mechanism, &self.hierarchies, &self.name);
    }
}

/// The `cgroup.subtree_control` line that enables `controllers`.
fn subtree_control(controllers: &[&str]) -> String {
    let enabled: Vec<String> = controllers.iter().map(|c| format!("+{c}")).collect();
    enabled.join(" ")
}
