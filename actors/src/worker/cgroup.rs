//! Per-session resource containment with cgroups: a pids limit that binds root (unlike
//! `RLIMIT_NPROC`) and a memory limit, one leaf group per worker.
//!
//! The engine calls [`CgroupManager::detect`] once at startup and shares the manager (via
//! `Arc`) with every session; a session calls [`CgroupManager::create_leaf`] for its worker,
//! adds the worker's pid to the [`CgroupLeaf`] and drops the leaf when the worker is gone.
//! Detection prefers cgroup v2 (a delegated unified hierarchy offering `pids` and `memory`),
//! then cgroup v1 (separate `pids` and `memory` hierarchies), and otherwise reports
//! [`CgroupMechanism::None`] so the caller relies on rlimits alone; it never fails.
//!
//! The manager owns this engine's parent group `pyvisor-<engine pid>` (one dir on v2, one per
//! hierarchy on v1), created under the engine's own cgroup; a leaf owns its dirs and every
//! process in them. On v2 the engine first moves itself into `<own>/pyvisor-supervisor`,
//! because a cgroup with processes may not enable controllers for its children. Killing a
//! leaf (and so dropping one) polls for up to a second: do it off the async executor.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Leaf of the engine's own v2 cgroup that the engine process moves itself into.
const SUPERVISOR_DIR: &str = "pyvisor-supervisor";
/// Prefix of every engine's parent group; the rest of the name is the engine's pid.
const PARENT_PREFIX: &str = "pyvisor-";
/// Longest a leaf spends killing its processes and waiting for them to leave.
const KILL_BUDGET: Duration = Duration::from_secs(1);
/// Pause between two reads of `cgroup.procs` while killing.
const KILL_POLL: Duration = Duration::from_millis(5);

/// Which containment mechanism is in force, as reported in session info.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMechanism {
    /// A delegated cgroup v2 subtree.
    V2,
    /// The cgroup v1 `pids` and `memory` hierarchies.
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

/// This engine's parent group(s), under which every worker's leaf is created.
#[derive(Debug)]
pub struct CgroupManager {
    mechanism: CgroupMechanism,
    /// v2: the one parent dir; v1: the pids parent, then the memory parent.
    parents: Vec<PathBuf>,
}

impl CgroupManager {
    /// Detects the mechanism and creates this engine's parent group; falls back to `None`.
    pub fn detect() -> CgroupManager {
        Self::detect_named(&format!("{PARENT_PREFIX}{}", std::process::id()))
    }

    /// [`Self::detect`] with the parent group called `name` (tests use several per process).
    fn detect_named(name: &str) -> CgroupManager {
        match Self::try_v2(name) {
            Ok(manager) => return manager,
            Err(e) => tracing::debug!("cgroup v2 containment unavailable: {e}"),
        }
        match Self::try_v1(name) {
            Ok(manager) => return manager,
            Err(e) => tracing::debug!("cgroup v1 containment unavailable: {e}"),
        }
        CgroupManager {
            mechanism: CgroupMechanism::None,
            parents: Vec::new(),
        }
    }

    fn try_v2(name: &str) -> io::Result<CgroupManager> {
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
        let supervisor = base.join(SUPERVISOR_DIR);
        ensure_dir(&supervisor)?;
        write(
            &supervisor.join("cgroup.procs"),
            &std::process::id().to_string(),
        )?;
        write(&base.join("cgroup.subtree_control"), "+pids +memory")?;
        remove_stale_parents(&base);
        let manager = CgroupManager {
            mechanism: CgroupMechanism::V2,
            parents: vec![base.join(name)],
        };
        manager.ensure_parents()?;
        Ok(manager)
    }

    fn try_v1(name: &str) -> io::Result<CgroupManager> {
        let mut parents = Vec::new();
        for controller in ["pids", "memory"] {
            let base = own_dir(Some(controller))?;
            remove_stale_parents(&base);
            parents.push(base.join(name));
        }
        let manager = CgroupManager {
            mechanism: CgroupMechanism::V1,
            parents,
        };
        // On failure `manager` drops and removes whatever parent dir it did create.
        manager.ensure_parents()?;
        Ok(manager)
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
        let mut leaf = CgroupLeaf {
            dirs: Vec::new(),
            kill_file: None,
        };
        // From here on an error drops `leaf`, which removes the dirs already created.
        for parent in &self.parents {
            let dir = parent.join(name);
            create_leaf_dir(&dir)?;
            leaf.dirs.push(dir);
        }
        // v2 has one dir for both controllers; v1 has the pids dir, then the memory dir.
        let pids_dir = leaf.dirs[0].clone();
        let memory_dir = leaf.dirs[leaf.dirs.len() - 1].clone();
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
        if self.mechanism == CgroupMechanism::V2 {
            leaf.kill_file = Some(pids_dir.join("cgroup.kill")).filter(|f| f.exists());
        }
        Ok(Some(leaf))
    }

    /// Creates the parent dir(s) when missing and, on v2, delegates the controllers to leaves.
    fn ensure_parents(&self) -> io::Result<()> {
        for parent in &self.parents {
            ensure_dir(parent)?;
            if self.mechanism == CgroupMechanism::V2 {
                write(&parent.join("cgroup.subtree_control"), "+pids +memory")?;
            }
        }
        Ok(())
    }
}

impl Drop for CgroupManager {
    fn drop(&mut self) {
        for parent in &self.parents {
            if let Err(e) = remove_group_tree(parent) {
                tracing::debug!("cgroup parent not removed: {e}");
            }
        }
    }
}

/// One worker's cgroup (one dir per hierarchy on v1); dropping it kills what is inside.
#[derive(Debug)]
pub struct CgroupLeaf {
    dirs: Vec<PathBuf>,
    /// v2 `cgroup.kill`, when the kernel has it (5.14+).
    kill_file: Option<PathBuf>,
}

impl CgroupLeaf {
    /// Moves process `pid` (and so its future children) into the leaf, in every hierarchy.
    pub fn add(&self, pid: u32) -> io::Result<()> {
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

    /// Pids currently in the leaf.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = BTreeSet::new();
        for dir in &self.dirs {
            match read(&dir.join("cgroup.procs")) {
                Ok(text) => pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok())),
                Err(e) => tracing::debug!("cgroup leaf unreadable: {e}"),
            }
        }
        pids.into_iter().collect()
    }

    /// Kills until `cgroup.procs` is empty or `budget` runs out; true when empty. A fork bomb
    /// keeps forking between a read and the kills, so one round is not enough on v1.
    fn kill_until_empty(&self, budget: Duration) -> bool {
        let deadline = Instant::now() + budget;
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
}

impl Drop for CgroupLeaf {
    fn drop(&mut self) {
        if !self.kill_until_empty(KILL_BUDGET) {
            tracing::debug!("cgroup leaf not empty after {KILL_BUDGET:?}; leaving it");
        }
        for dir in &self.dirs {
            if let Err(e) = fs::remove_dir(dir) {
                tracing::debug!("cgroup leaf {} not removed: {e}", dir.display());
            }
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

/// The directory of this process's cgroup in the v1 hierarchy of `controller` (v2 for `None`).
fn own_dir(controller: Option<&str>) -> io::Result<PathBuf> {
    let fstype = if controller.is_some() {
        "cgroup"
    } else {
        "cgroup2"
    };
    let (root, point) = find_mount(fstype, controller)?;
    let own = own_cgroup(controller)?;
    // The mount root is `/` unless the host bind-mounted a subgroup (a container without
    // a cgroup namespace); /proc/self/cgroup names paths from the hierarchy's real root.
    let relative = Path::new(&own).strip_prefix(&root).map_err(|_| {
        io::Error::other(format!(
            "own cgroup {own} is outside its mount {}",
            root.display()
        ))
    })?;
    Ok(point.join(relative))
}

/// The root and mount point of filesystem `fstype` (with super option `controller`, for v1).
fn find_mount(fstype: &str, controller: Option<&str>) -> io::Result<(PathBuf, PathBuf)> {
    let mountinfo = read(Path::new("/proc/self/mountinfo"))?;
    for line in mountinfo.lines() {
        // "id parent dev root point options [tags...] - fstype source super_options"
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let has_option = |c: &str| right.get(2).is_some_and(|o| o.split(',').any(|o| o == c));
        let wanted = match controller {
            Some(c) => has_option(c),
            None => true,
        };
        if left.len() >= 5 && right[0] == fstype && wanted {
            return Ok((PathBuf::from(left[3]), PathBuf::from(left[4])));
        }
    }
    let what = controller.map_or(String::new(), |c| format!(" with {c}"));
    Err(io::Error::other(format!("no {fstype} mount{what}")))
}

/// This process's cgroup path in the v1 hierarchy of `controller`, or in v2 for `None`.
fn own_cgroup(controller: Option<&str>) -> io::Result<String> {
    let text = read(Path::new("/proc/self/cgroup"))?;
    for line in text.lines() {
        // "hierarchy-id:controller,list:/path"; v2 is "0::/path".
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let matches = match controller {
            None => id == "0" && controllers.is_empty(),
            Some(c) => controllers.split(',').any(|x| x == c),
        };
        if matches {
            return Ok(path.to_string());
        }
    }
    Err(io::Error::other(format!(
        "/proc/self/cgroup has no {} line",
        controller.unwrap_or("cgroup v2")
    )))
}

/// Removes empty `pyvisor-<pid>` groups in `base` left by engines that died without cleanup.
fn remove_stale_parents(base: &Path) {
    let pid_of = |name: &str| {
        name.strip_prefix(PARENT_PREFIX)
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u32>().ok())
    };
    for group in super::left_by_dead_processes(base, pid_of) {
        match remove_group_tree(&group) {
            Ok(()) => tracing::debug!("removed stale cgroup {}", group.display()),
            Err(e) => tracing::debug!("stale cgroup kept: {e}"),
        }
    }
}

/// Removes a parent group and its leaves; fails (EBUSY) if any still holds a process.
fn remove_group_tree(dir: &Path) -> io::Result<()> {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = fs::remove_dir(entry.path());
            }
        }
    }
    fs::remove_dir(dir).map_err(|e| annotate(e, "removing", dir))
}

/// Creates a fresh leaf dir; a leftover empty one of the same name is replaced.
fn create_leaf_dir(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            fs::remove_dir(dir).map_err(|e| annotate(e, "replacing leftover", dir))?;
            fs::create_dir(dir).map_err(|e| annotate(e, "creating", dir))
        }
        result => result.map_err(|e| annotate(e, "creating", dir)),
    }
}

/// Creates `dir` unless it exists.
fn ensure_dir(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        result => result.map_err(|e| annotate(e, "creating", dir)),
    }
}

fn read(path: &Path) -> io::Result<String> {
    fs::read_to_string(path).map_err(|e| annotate(e, "reading", path))
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| annotate(e, &format!("writing {value:?} to"), path))
}

fn annotate(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Child, Command, ExitStatus, Stdio};

    use super::*;

    /// The manager is shared across arbiter threads and a leaf moves between them.
    const _: fn() = || {
        fn shared<T: Send + Sync>() {}
        shared::<CgroupManager>();
        shared::<CgroupLeaf>();
    };

    /// A manager with its own parent group, so tests running in parallel never share one.
    fn manager(test: &str) -> CgroupManager {
        let manager =
            CgroupManager::detect_named(&format!("pyvisor-{}-{test}", std::process::id()));
        assert_ne!(
            manager.mechanism(),
            CgroupMechanism::None,
            "no writable cgroups"
        );
        manager
    }

    fn leaf(
        manager: &CgroupManager,
        name: &str,
        pids: Option<u64>,
        mib: Option<u64>,
    ) -> CgroupLeaf {
        let limits = CgroupLimits {
            pids,
            memory_bytes: mib.map(|m| m << 20),
        };
        manager.create_leaf(name, limits).unwrap().expect("a leaf")
    }

    /// Spawns `program` with a piped stderr and moves it into `leaf` right away.
    fn spawn_in(leaf: &CgroupLeaf, program: &str, args: &[&str]) -> Child {
        let mut command = Command::new(program);
        command
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = command.spawn().expect("spawn test process");
        leaf.add(child.id()).unwrap();
        child
    }

    /// Waits for `child` (at most `limit`) and returns its status and stderr.
    fn finish(child: &mut Child, limit: Duration) -> (ExitStatus, String) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for test process") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                panic!("test process still running after {limit:?}");
            }
            sleep(Duration::from_millis(10));
        };
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            pipe.read_to_string(&mut stderr).expect("read stderr");
        }
        (status, stderr)
    }

    #[test]
    fn pids_limit_contains_fork_bomb_and_drop_kills_it() {
        let manager = manager("pids");
        let leaf = leaf(&manager, "w-pids", Some(8), None);
        let script = "sleep 0.2; for i in $(seq 50); do sleep 5 & done; wait";
        let mut child = spawn_in(&leaf, "sh", &["-c", script]);
        let (mut most, mut seen) = (0, HashSet::new());
        let until = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < until {
            let pids = leaf.pids();
            most = most.max(pids.len());
            seen.extend(pids);
            sleep(Duration::from_millis(5));
        }
        assert!(
            (2..=8).contains(&most),
            "{most} processes in a leaf limited to 8"
        );

        let dirs = leaf.dirs.clone();
        drop(leaf);
        assert!(dirs.iter().all(|d| !d.exists()), "leaf dirs left: {dirs:?}");
        let (_, stderr) = finish(&mut child, Duration::from_secs(5));
        let failed = stderr.contains("fork") || stderr.contains("Resource temporarily unavailable");
        assert!(failed, "no fork failure reported: {stderr:?}");
        let alive: Vec<u32> = seen
            .into_iter()
            .filter(|&p| crate::worker::is_running(p))
            .collect();
        assert!(alive.is_empty(), "still running after drop: {alive:?}");
    }

    #[test]
    fn memory_limit_stops_large_allocation() {
        let manager = manager("memory");
        let leaf = leaf(&manager, "w-memory", None, Some(64));
        let code = "import time; time.sleep(0.2)\n\
                    b = bytearray(512*1024*1024); b[::4096] = b'x'*len(b[::4096])";
        let mut child = spawn_in(&leaf, "python3", &["-c", code]);
        let (status, stderr) = finish(&mut child, Duration::from_secs(60));
        let stopped = status.signal() == Some(9) || stderr.contains("MemoryError");
        assert!(
            stopped && !status.success(),
            "not stopped: {status:?} {stderr:?}"
        );
    }

    #[test]
    fn kill_all_empties_a_fork_loop() {
        let manager = manager("kill");
        let leaf = leaf(&manager, "w-kill", Some(16), Some(512));
        let code = "import os, time\ntime.sleep(0.2)\nwhile True:\n    \
                    try: os.fork()\n    except OSError: time.sleep(0.001)";
        let mut child = spawn_in(&leaf, "python3", &["-c", code]);
        let until = Instant::now() + Duration::from_secs(10);
        while leaf.pids().len() < 10 && Instant::now() < until {
            sleep(Duration::from_millis(10));
        }
        assert!(
            leaf.pids().len() >= 10,
            "the fork loop never filled the leaf"
        );

        leaf.kill_all();
        assert_eq!(leaf.pids(), Vec::<u32>::new());
        let (status, _) = finish(&mut child, Duration::from_secs(5));
        assert_eq!(status.signal(), Some(9));
    }

    #[test]
    fn detect_removes_stale_parent_groups() {
        // Above PID_MAX_LIMIT (2^22), so never a live engine, and unique to this test run.
        let dead = 4_194_304 + std::process::id();
        let probe = manager("stale-probe");
        let stale: Vec<PathBuf> = (probe.parents.iter())
            .filter_map(|p| Some(p.parent()?.join(format!("pyvisor-{dead}"))))
            .collect();
        assert_eq!(stale.len(), probe.parents.len());
        for dir in &stale {
            ensure_dir(dir).unwrap();
            ensure_dir(&dir.join("w-1")).unwrap();
        }
        let _again = manager("stale");
        assert!(
            stale.iter().all(|d| !d.exists()),
            "stale groups kept: {stale:?}"
        );
    }

    #[test]
    fn dropping_the_manager_removes_its_parent_groups() {
        let manager = CgroupManager::detect();
        assert_ne!(manager.mechanism(), CgroupMechanism::None);
        assert!(manager.mechanism().as_str().starts_with("cgroup"));
        let parents = manager.parents.clone();
        assert!(
            parents.iter().all(|p| p.is_dir()),
            "parents missing: {parents:?}"
        );
        drop(leaf(&manager, "w-drop", None, None));
        drop(manager);
        assert!(
            parents.iter().all(|p| !p.exists()),
            "parents left: {parents:?}"
        );
    }

    #[test]
    fn leaf_names_that_escape_the_parent_are_rejected() {
        let manager = manager("names");
        for name in ["", ".", "..", "a/b"] {
            let error = manager
                .create_leaf(name, CgroupLimits::default())
                .unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{name:?}");
        }
    }
}
