//! SIGKILL of the process that embeds the engine leaves no Python process behind: not the
//! session's worker, not its grandchild, not the pool's ready workers.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use pyvisor_tests::{process_running, start_host_printing_pids};

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
    let mut command = Command::new(env!("CARGO_BIN_EXE_engine_host"));
    command.arg(cache.path());
    let (mut host, worker, grandchild) = start_host_printing_pids(command);
    let pids = [worker, grandchild];
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
