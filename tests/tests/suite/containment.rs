//! Everything in a session's cgroup dies with the session: at close, when the worker crashes,
//! when the engine is SIGKILLed (its janitor), and when engine and janitor both died (the next
//! engine's start). Also: the memory limit's kill is reported as such, the session reports the
//! CPU its cgroup used, and a process cannot leave the leaf through one hierarchy.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use pyvisor::{ExecutionStatus, Session, SessionLimits, SessionOptions};
use pyvisor_tests::{
    engine, process_running, run, session, start_host_printing_pids, SETSID_GRANDCHILD,
};

/// Waits up to 10 s for process `pid` to stop running; true if it did.
fn gone_within_10s(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while process_running(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Runs [`SETSID_GRANDCHILD`] in `session` and returns the running grandchild's pid.
async fn start_setsid_grandchild(session: &Session) -> u32 {
    let result = run(session, SETSID_GRANDCHILD).await;
    assert_eq!(result.status, ExecutionStatus::Ok, "{:?}", result.error);
    let pid: u32 = result.result.unwrap().repr.parse().unwrap();
    assert!(process_running(pid), "the grandchild {pid} runs");
    pid
}

/// The session's containment, which every test here needs to be a cgroup.
async fn assert_in_cgroup(session: &Session) -> &'static str {
    let containment = session.info().await.unwrap().containment.unwrap();
    assert!(
        containment.starts_with("cgroup"),
        "this machine offers writable cgroups, yet containment is {containment}"
    );
    containment
}

#[tokio::test]
async fn a_setsid_grandchild_dies_when_its_session_closes() {
    let (engine, session) = session().await;
    let bystander = engine.create_session(Default::default()).await.unwrap();
    assert_in_cgroup(&session).await;
    let grandchild = start_setsid_grandchild(&session).await;
    session.close().await.unwrap();
    assert!(gone_within_10s(grandchild), "{grandchild} outlived close");
    assert_eq!(run(&bystander, "1 + 1").await.result.unwrap().repr, "2");
}

#[tokio::test]
async fn a_setsid_grandchild_dies_when_the_worker_crashes() {
    let (_engine, session) = session().await;
    assert_in_cgroup(&session).await;
    let grandchild = start_setsid_grandchild(&session).await;
    let crash = run(&session, "import os\nos._exit(3)").await;
    assert_eq!(crash.status, ExecutionStatus::Crashed);
    assert!(
        gone_within_10s(grandchild),
        "{grandchild} outlived the crash"
    );
    assert_eq!(run(&session, "'back'").await.result.unwrap().repr, "'back'");
}

/// A `contained_host` process and the pids it printed: its worker, its grandchild.
fn start_host() -> (Child, u32, u32) {
    let host = Command::new(env!("CARGO_BIN_EXE_contained_host"));
    let (host, worker, grandchild) = start_host_printing_pids(host);
    assert!(process_running(grandchild), "the grandchild runs");
    (host, worker, grandchild)
}

#[test]
fn a_setsid_grandchild_dies_when_the_engine_is_sigkilled() {
    let (mut host, worker, grandchild) = start_host();
    host.kill().unwrap();
    host.wait().unwrap();
    assert!(
        gone_within_10s(worker),
        "the worker {worker} outlived the host"
    );
    assert!(
        gone_within_10s(grandchild),
        "the grandchild {grandchild} outlived the host"
    );
}

/// The cgroup dirs of `pid` that belong to the engine `engine_pid`, as /proc says.
fn engine_groups_of(pid: u32, engine_pid: u32) -> Vec<PathBuf> {
    let marker = format!("/pyvisor-{engine_pid}-");
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            if !path.contains(&marker) {
                return None;
            }
            let mount = match controllers {
                "" => ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
                    .into_iter()
                    .find(|m| PathBuf::from(format!("{m}{path}")).is_dir())?
                    .to_owned(),
                v1 => format!("/sys/fs/cgroup/{v1}"),
            };
            let dir = PathBuf::from(format!("{mount}{path}"));
            dir.is_dir().then_some(dir)
        })
        .collect()
}

/// The direct children of process `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).unwrap();
}

#[tokio::test]
async fn the_next_engine_start_kills_what_a_dead_engine_and_its_janitor_left() {
    let (mut host, _, grandchild) = start_host();
    let groups = engine_groups_of(grandchild, host.id());
    assert!(!groups.is_empty(), "the grandchild is in the host's leaf");
    // Stopped, the host cannot react to its children's deaths; then the janitor and every
    // other child die before it, so nobody is left to clean up.
    signal(host.id(), nix::sys::signal::Signal::SIGSTOP);
    for child in children_of(host.id()) {
        signal(child, nix::sys::signal::Signal::SIGKILL);
    }
    host.kill().unwrap();
    host.wait().unwrap();
    assert!(
        process_running(grandchild),
        "with the janitor dead too, the grandchild is left over"
    );
    assert!(
        groups.iter().all(|g| g.is_dir()),
        "its groups are left over"
    );

    let _next = engine().await;
    assert!(
        gone_within_10s(grandchild),
        "{grandchild} outlived the next engine's start"
    );
    let parents: Vec<PathBuf> = groups.iter().map(|g| g.parent().unwrap().into()).collect();
    let left: Vec<&PathBuf> = groups
        .iter()
        .chain(&parents)
        .filter(|g| g.exists())
        .collect();
    assert!(
        left.is_empty(),
        "the dead engine's groups are left: {left:?}"
    );
}

#[tokio::test]
async fn the_memory_limit_kill_is_reported_as_such() {
    let engine = engine().await;
    let limits = SessionLimits {
        memory_mb: Some(64),
        ..Default::default()
    };
    let options = SessionOptions {
        limits: Some(limits),
        ..Default::default()
    };
    let session = engine.create_session(options).await.unwrap();
    let bystander = engine.create_session(Default::default()).await.unwrap();
    assert_in_cgroup(&session).await;
    let result = run(&session, "blob = b'x' * (256 << 20)").await;
    assert_eq!(result.status, ExecutionStatus::Crashed);
    let error = result.error.unwrap();
    assert_eq!(error.type_name, "WorkerCrashed");
    assert!(
        error
            .message
            .starts_with("the worker was killed by the memory limit (64 MB)"),
        "{}",
        error.message
    );
    assert!(!error.message.contains("protocol"), "{}", error.message);
    assert_eq!(run(&session, "'back'").await.result.unwrap().repr, "'back'");
    assert_eq!(run(&bystander, "1 + 1").await.result.unwrap().repr, "2");
}

#[tokio::test]
async fn session_info_reports_the_cpu_its_cgroup_used() {
    let (_engine, session) = session().await;
    assert_in_cgroup(&session).await;
    let before = session.info().await.unwrap().cpu_s.expect("cpu_s");
    // A child does half of the work: the cgroup counts it, the worker's rusage would not.
    let code = "import subprocess, sys, time\n\
        burn = 'import time\\nend = time.process_time() + 0.3\\nwhile time.process_time() < end: pass'\n\
        child = subprocess.Popen([sys.executable, '-c', burn])\n\
        end = time.process_time() + 0.3\n\
        while time.process_time() < end: pass\n\
        child.wait()";
    let result = run(&session, code).await;
    assert_eq!(result.status, ExecutionStatus::Ok, "{:?}", result.error);
    let after = session.info().await.unwrap().cpu_s.unwrap();
    assert!(after - before >= 0.6, "cpu_s went from {before} to {after}");
}

#[tokio::test]
async fn leaving_the_pids_group_does_not_outlive_close_and_leaf_files_are_not_the_workers() {
    let (engine, session) = session().await;
    let containment = assert_in_cgroup(&session).await;
    assert_eq!(
        containment, "cgroup1",
        "on cgroup2 a root worker can leave its only hierarchy: that needs per-session uids"
    );
    // The leaf's files, as the worker sees them: the engine's (root's), writable by it alone.
    let check = "import os, stat\n\
        bad, seen = [], 0\n\
        for line in open('/proc/self/cgroup'):\n\
        \x20   _, controllers, path = line.strip().split(':', 2)\n\
        \x20   if 'pyvisor-' not in path: continue\n\
        \x20   d = '/sys/fs/cgroup/' + controllers + path\n\
        \x20   for name in os.listdir(d) + ['.']:\n\
        \x20       st = os.stat(os.path.join(d, name))\n\
        \x20       seen += 1\n\
        \x20       if st.st_uid != 0 or st.st_mode & 0o022: bad.append((d, name, oct(st.st_mode)))\n\
        (seen > 10, bad)";
    assert_eq!(
        run(&session, check).await.result.unwrap().repr,
        "(True, [])"
    );
    // A setsid grandchild moves itself out of the leaf's pids group (root may write there).
    let escape = "import subprocess, time\n\
        mover = \"echo $$ > /sys/fs/cgroup/pids/cgroup.procs; exec sleep 300\"\n\
        p = subprocess.Popen(['setsid', 'sh', '-c', mover])\n\
        deadline = time.monotonic() + 10\n\
        while time.monotonic() < deadline:\n\
        \x20   groups = open(f'/proc/{p.pid}/cgroup').read()\n\
        \x20   if ':pids:/\\n' in groups and 'sleep' in open(f'/proc/{p.pid}/cmdline').read(): break\n\
        \x20   time.sleep(0.01)\n\
        (p.pid, ':pids:/\\n' in groups)";
    let result = run(&session, escape).await;
    let repr = result.result.expect("the escape ran").repr;
    let (pid, moved) = repr
        .trim_matches(['(', ')'])
        .split_once(", ")
        .expect("a pair");
    assert_eq!(moved, "True", "the grandchild left the leaf's pids group");
    let pid: u32 = pid.parse().unwrap();
    session.close().await.unwrap();
    assert!(
        gone_within_10s(pid),
        "{pid} left one hierarchy and outlived close"
    );
    let other = engine.create_session(Default::default()).await.unwrap();
    assert_eq!(run(&other, "1 + 1").await.result.unwrap().repr, "2");
}
