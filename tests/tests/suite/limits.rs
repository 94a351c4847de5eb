//! Per-session resource limits: each violation ends with a clear status or Python exception
//! and leaves the engine and other sessions unaffected.

use pyvisor::{EngineConfig, ExecutionStatus, SessionLimits, SessionOptions};
use pyvisor_tests::{engine, run, within};

fn with_limits(limits: SessionLimits) -> SessionOptions {
    SessionOptions {
        limits: Some(limits),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_huge_allocation_raises_memory_error() {
    let engine = engine().await;
    let session = engine.create_session(Default::default()).await.unwrap();
    run(&session, "kept = 1").await;
    let result = run(&session, "bytearray(10**11)").await;
    assert_eq!(result.status, ExecutionStatus::Error);
    assert_eq!(result.error.unwrap().type_name, "MemoryError");
    assert_eq!(run(&session, "kept").await.result.unwrap().repr, "1");
}

#[tokio::test]
async fn memory_limit_stops_a_worker_that_touches_too_much() {
    let engine = engine().await;
    let limits = SessionLimits {
        memory_mb: Some(128),
        ..Default::default()
    };
    let session = engine.create_session(with_limits(limits)).await.unwrap();
    // 512 MiB actually written: either refused up front or killed when the pages are touched.
    let result = run(
        &session,
        "b = bytearray(512 * 1024 * 1024)\nb[::4096] = b'x' * len(b[::4096])",
    )
    .await;
    assert!(
        matches!(
            result.status,
            ExecutionStatus::Error | ExecutionStatus::Crashed
        ),
        "{result:?}"
    );
    assert_eq!(run(&session, "2 + 2").await.result.unwrap().repr, "4");
}

#[tokio::test]
async fn a_fork_bomb_is_contained_and_the_engine_serves_others() {
    let engine = engine().await;
    let limits = SessionLimits {
        processes: Some(16),
        ..Default::default()
    };
    let bomb = engine.create_session(with_limits(limits)).await.unwrap();
    let bystander = engine.create_session(Default::default()).await.unwrap();
    let code = "import os, time\n\
                children = 0\n\
                try:\n\
                \x20   for _ in range(1000):\n\
                \x20       if os.fork() == 0:\n\
                \x20           time.sleep(30)\n\
                \x20           os._exit(0)\n\
                \x20       children += 1\n\
                except OSError as e:\n\
                \x20   print('stopped after', children, type(e).__name__)\n\
                children";
    let result = run(&bomb, code).await;
    assert_eq!(result.status, ExecutionStatus::Ok, "{:?}", result.error);
    let children: u64 = result.result.unwrap().repr.parse().unwrap();
    assert!(
        children < 16,
        "{children} children forked under a limit of 16"
    );
    assert!(result.stdout.contains("stopped after"), "{}", result.stdout);
    assert_eq!(
        run(&bystander, "'still serving'")
            .await
            .result
            .unwrap()
            .repr,
        "'still serving'"
    );
    let info = bomb.info().await.unwrap();
    assert_ne!(
        info.containment,
        Some("rlimit"),
        "this machine offers a pids cgroup"
    );
}

#[tokio::test]
async fn busy_loop_under_a_cpu_limit_ends_with_a_clear_status() {
    let engine = engine().await;
    let limits = SessionLimits {
        cpu_s: Some(1),
        ..Default::default()
    };
    let session = engine.create_session(with_limits(limits)).await.unwrap();
    let result = within(session.run("while True:\n    pass")).await.unwrap();
    assert_eq!(result.status, ExecutionStatus::Crashed);
    let message = result.error.unwrap().message;
    assert!(message.contains("cpu limit"), "{message}");
    assert_eq!(run(&session, "'back'").await.result.unwrap().repr, "'back'");
}

#[tokio::test]
async fn opening_ten_thousand_files_fails_with_os_error() {
    let engine = engine().await;
    let session = engine.create_session(Default::default()).await.unwrap();
    let result = run(
        &session,
        "files = [open('/dev/null') for _ in range(10_000)]",
    )
    .await;
    assert_eq!(result.status, ExecutionStatus::Error);
    let error = result.error.unwrap();
    assert_eq!(error.type_name, "OSError");
    assert!(
        error.message.contains("Too many open files"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn without_cgroups_rlimits_still_bound_memory() {
    let config = EngineConfig {
        use_cgroups: false,
        ..Default::default()
    };
    let engine = pyvisor_tests::engine_with(config).await;
    let session = engine.create_session(Default::default()).await.unwrap();
    assert_eq!(session.info().await.unwrap().containment, Some("rlimit"));
    let result = run(&session, "bytearray(4 * 1024**3)").await;
    assert_eq!(result.error.unwrap().type_name, "MemoryError");
}
