//! A huge print is capped at `limits.output_bytes` and never buffered by the host.
//! (Its own test binary, so the peak memory measured is this test's alone.)

use pyvisor::ExecutionStatus;
use pyvisor_tests::{run, session};

/// Peak resident memory of this process, in bytes.
fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[tokio::test]
async fn a_200_mb_print_is_capped_and_host_memory_stays_bounded() {
    let (_engine, session) = session().await;
    let result = run(
        &session,
        "import sys\nsys.stdout.write('x' * 200_000_000)\n'done'",
    )
    .await;
    assert_eq!(result.status, ExecutionStatus::Ok);
    assert_eq!(result.result.unwrap().repr, "'done'");
    let cap = 10 * 1024 * 1024;
    assert!(
        result.stdout.len() < cap + 200,
        "stdout kept {} bytes",
        result.stdout.len()
    );
    assert!(result.stdout.contains("[pyvisor: output truncated]"));
    assert!(result.stdout.contains("bytes dropped]"));
    let peak = peak_rss_bytes();
    assert!(peak < 120 * 1024 * 1024, "host peak RSS {} MiB", peak >> 20);
    // The session is still in step: the next execution sees only its own output.
    assert_eq!(run(&session, "print('after')").await.stdout, "after\n");
}
