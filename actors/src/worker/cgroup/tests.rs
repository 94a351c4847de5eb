//! Unit tests of the cgroup leaves against the machine's real cgroups (run as root).

use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::files::ensure_dir;
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
        CgroupManager::detect_named(&format!("pyvisor-{}-{test}", std::process::id()), None);
    assert_ne!(
        manager.mechanism(),
        CgroupMechanism::None,
        "no writable cgroups"
    );
    manager
}

fn leaf(manager: &CgroupManager, name: &str, pids: Option<u64>, mib: Option<u64>) -> CgroupLeaf {
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
    // Watch until the controller has refused a fork (its `pids.events` counts them) and the
    // leaf was seen full of sleepers.
    let refused = || {
        leaf.dirs()
            .iter()
            .filter_map(|dir| std::fs::read_to_string(dir.join("pids.events")).ok())
            .filter_map(|events| events.trim().strip_prefix("max ")?.parse::<u64>().ok())
            .sum::<u64>()
    };
    let (mut most, mut seen) = (0, HashSet::new());
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until && (refused() == 0 || most < 2) {
        let pids = leaf.pids();
        most = most.max(pids.len());
        seen.extend(pids);
        sleep(Duration::from_millis(5));
    }
    assert!(refused() > 0, "the pids controller refused no fork");
    assert!(
        (2..=8).contains(&most),
        "{most} processes in a leaf limited to 8"
    );

    let dirs = leaf.dirs().to_vec();
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
    assert_eq!(
        status.signal(),
        Some(9),
        "not killed: {status:?} {stderr:?}"
    );
    assert_eq!(
        leaf.oom_kills(),
        1,
        "the kill is counted as the memory limit's"
    );
    assert_eq!(leaf.memory_limit(), Some(64 << 20));
}

#[test]
fn a_leaf_without_memory_trouble_counts_no_oom_kill() {
    let manager = manager("no-oom");
    let leaf = leaf(&manager, "w-no-oom", None, Some(64));
    let mut child = spawn_in(&leaf, "python3", &["-c", "b = bytearray(8 << 20)"]);
    let (status, stderr) = finish(&mut child, Duration::from_secs(60));
    assert!(status.success(), "{stderr}");
    assert_eq!(leaf.oom_kills(), 0);
}

#[test]
fn cpu_usage_of_a_busy_leaf_grows() {
    let manager = manager("cpu");
    let leaf = leaf(&manager, "w-cpu", None, None);
    let before = leaf.cpu_usage().expect("a CPU accounting controller");
    let code =
        "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass";
    let mut child = spawn_in(&leaf, "python3", &["-c", code]);
    let (status, stderr) = finish(&mut child, Duration::from_secs(60));
    assert!(status.success(), "{stderr}");
    let used = leaf.cpu_usage().unwrap() - before;
    assert!(used >= Duration::from_millis(300), "only {used:?} counted");
}

#[test]
fn a_process_that_left_one_hierarchy_still_dies_with_the_leaf() {
    let manager = manager("escape");
    if manager.mechanism() == CgroupMechanism::V1 {
        let joined: Vec<&str> = (manager.hierarchies.iter())
            .flat_map(|h| h.controllers.iter().copied())
            .collect();
        assert_eq!(joined, ["pids", "memory", "cpuacct", "freezer"]);
    }
    let leaf = leaf(&manager, "w-escape", Some(8), None);
    let mut child = spawn_in(&leaf, "sleep", &["300"]);
    if manager.mechanism() == CgroupMechanism::V1 {
        // What root session code can do: move itself back to the engine's pids group.
        let pids = manager
            .hierarchies
            .iter()
            .find(|h| h.controllers.contains(&"pids"));
        files::write(
            &pids.unwrap().base.join("cgroup.procs"),
            &child.id().to_string(),
        )
        .unwrap();
    }
    assert!(
        leaf.pids().contains(&child.id()),
        "still a member through another hierarchy"
    );
    drop(leaf);
    let (status, _) = finish(&mut child, Duration::from_secs(5));
    assert_eq!(status.signal(), Some(9));
}

#[test]
fn leaf_files_belong_to_the_engine_and_only_it_may_write_them() {
    let manager = manager("modes");
    let leaf = leaf(&manager, "w-modes", Some(8), Some(64));
    let engine_uid = nix::unistd::geteuid().as_raw();
    let mut checked = 0;
    for dir in leaf.dirs() {
        let meta = std::fs::metadata(dir).unwrap();
        assert_eq!(
            (meta.uid(), meta.mode() & 0o7777),
            (engine_uid, 0o755),
            "{dir:?}"
        );
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let meta = entry.metadata().unwrap();
            let path = entry.path();
            assert_eq!(meta.uid(), engine_uid, "{path:?} is not the engine's");
            assert_eq!(meta.mode() & 0o022, 0, "{path:?} is writable by others");
            checked += 1;
        }
    }
    assert!(checked > 10, "only {checked} files in the leaf");
}

#[test]
fn the_janitor_empties_registered_leaves_when_the_engine_goes_away() {
    let python = crate::worker::resolve_interpreter("python3").unwrap();
    let janitor = Arc::new(crate::worker::Janitor::start(&python).unwrap());
    let name = format!("pyvisor-{}-janitor", std::process::id());
    let manager = CgroupManager::detect_named(&name, Some(janitor.clone()));
    let leaf = leaf(&manager, "w-janitor", None, None);
    // A child in a new session, out of every process group the janitor knows.
    let mut child = spawn_in(&leaf, "setsid", &["sleep", "300"]);
    let dirs = leaf.dirs().to_vec();
    janitor.hang_up();
    let (status, _) = finish(&mut child, Duration::from_secs(10));
    assert_eq!(status.signal(), Some(9));
    let until = Instant::now() + Duration::from_secs(5);
    while dirs.iter().any(|d| d.exists()) && Instant::now() < until {
        sleep(Duration::from_millis(10));
    }
    assert!(
        dirs.iter().all(|d| !d.exists()),
        "the janitor left {dirs:?}"
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
    let stale: Vec<PathBuf> = (probe.hierarchies.iter())
        .map(|h| h.base.join(format!("pyvisor-{dead}")))
        .collect();
    let mut left_running = Command::new("sleep").arg("300").spawn().unwrap();
    for dir in &stale {
        ensure_dir(dir).unwrap();
        ensure_dir(&dir.join("w-1")).unwrap();
        files::write(
            &dir.join("w-1/cgroup.procs"),
            &left_running.id().to_string(),
        )
        .unwrap();
    }
    let _again = manager("stale");
    let (status, _) = finish(&mut left_running, Duration::from_secs(5));
    assert_eq!(
        status.signal(),
        Some(9),
        "the dead engine's process was killed"
    );
    assert!(
        stale.iter().all(|d| !d.exists()),
        "stale groups kept: {stale:?}"
    );
}

#[test]
fn dropping_the_manager_removes_its_parent_groups() {
    let manager = CgroupManager::detect(None);
    assert_ne!(manager.mechanism(), CgroupMechanism::None);
    assert!(manager.mechanism().as_str().starts_with("cgroup"));
    let parents: Vec<PathBuf> = (manager.hierarchies.iter())
        .map(|h| manager.parent(h))
        .collect();
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
