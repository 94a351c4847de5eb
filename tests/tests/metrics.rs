//! The metrics of docs/metrics.md reach whatever recorder the embedding program installs.
//!
//! One test in its own binary: the recorder is process-wide, and the engine's actors record
//! from threads of their own, so a thread-local recorder would not see them.

use std::collections::HashSet;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use pyvisor::{EngineConfig, PoolConfig};
use pyvisor_tests::{engine_with, manual_checkpoints, run, within};

#[tokio::test]
async fn the_engine_records_the_spec_metrics() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("no other recorder in this test binary");

    let engine = engine_with(EngineConfig {
        pool: PoolConfig {
            min_idle: 1,
            ..PoolConfig::default()
        },
        // The test takes its one checkpoint itself: an automatic one, written in the
        // background, would race the metrics and the crash below.
        state: manual_checkpoints(),
        ..EngineConfig::default()
    })
    .await;
    let session = engine.create_session(Default::default()).await.unwrap();
    run(&session, "x = 1").await;
    // Its reply comes after the checkpoint's metrics are recorded, and the crash below then
    // restores from it.
    within(session.checkpoint()).await.unwrap();
    run(&session, "1 + 1").await;
    run(&session, "1 / 0").await;
    run(
        &session,
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    )
    .await;
    run(&session, "'back'").await;
    // A message handled after the last result means the session has published its phase.
    session.info().await.unwrap();

    let snapshot = snapshotter.snapshot().into_vec();
    let names: HashSet<&str> = snapshot.iter().map(|(key, ..)| key.key().name()).collect();
    for name in [
        "pyvisor_executions_total",
        "pyvisor_execution_seconds",
        "pyvisor_sessions",
        "pyvisor_pool_acquire_seconds",
        "pyvisor_worker_spawn_seconds",
        "pyvisor_worker_crashes_total",
        "pyvisor_checkpoint_seconds",
        "pyvisor_checkpoint_bytes",
        "pyvisor_restores_total",
    ] {
        assert!(names.contains(name), "{name} missing from {names:?}");
    }
    assert!(
        names.contains("pyvisor_pool_hits_total") || names.contains("pyvisor_pool_misses_total")
    );
    let counter = |name: &str, label: Option<(&str, &str)>| -> u64 {
        snapshot
            .iter()
            .filter(|(key, ..)| key.key().name() == name)
            .filter(|(key, ..)| {
                label
                    .is_none_or(|(k, v)| key.key().labels().any(|l| l.key() == k && l.value() == v))
            })
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => *n,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    };
    assert_eq!(
        counter("pyvisor_executions_total", Some(("status", "ok"))),
        3
    );
    assert_eq!(counter("pyvisor_restores_total", None), 1);
    assert_eq!(
        counter("pyvisor_executions_total", Some(("status", "error"))),
        1
    );
    assert_eq!(
        counter("pyvisor_executions_total", Some(("status", "crashed"))),
        1
    );
    assert_eq!(counter("pyvisor_worker_crashes_total", None), 1);
    let idle_sessions = snapshot.iter().find_map(|(key, .., value)| {
        let idle = key.key().name() == "pyvisor_sessions"
            && key
                .key()
                .labels()
                .any(|l| l.key() == "state" && l.value() == "idle");
        match value {
            DebugValue::Gauge(g) if idle => Some(g.into_inner()),
            _ => None,
        }
    });
    assert_eq!(idle_sessions, Some(1.0), "one live idle session");
}
