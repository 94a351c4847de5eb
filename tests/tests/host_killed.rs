//! SIGKILL of the process that embeds the engine leaves no Python process behind: not the
//! session's worker, not its grandchild, not the pool's ready workers.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use pyvisor_tests::process_running;

/// Live processes whose command line mentions `dir` (every worker of the engine does).
fn engine_processes(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .expect("/proc is readable")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(&needle))
        })
        .filter(|pid| process_running(*pid))
        .collect()
}

#[test]
fn sigkill_of_the_host_leaves_no_worker_idle_or_busy_behind() {
    let cache = tempfile::tempdir().unwrap();
    let mut host = Command::new(env!("CARGO_BIN_EXE_engine_host"))
        .arg(cache.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(host.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pids: Vec<u32> = line
        .split_whitespace()
        .map(|p| p.parse().expect("pids"))
        .collect();
    assert_eq!(pids.len(), 2, "worker and grandchild pids: {line:?}");
    let before = engine_processes(cache.path());
    assert!(
        before.len() >= 3,
        "the session's worker and two ready workers run: {before:?}"
    );

    host.kill().unwrap();
    host.wait().unwrap();
    let mut left = Vec::new();
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(50));
        left = engine_processes(cache.path());
        left.extend(pids.iter().copied().filter(|pid| process_running(*pid)));
        if left.is_empty() {
            break;
        }
    }
    assert!(
        left.is_empty(),
        "processes outlived the SIGKILLed host: {left:?}"
    );
}
