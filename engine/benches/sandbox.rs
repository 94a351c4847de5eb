//! What worker confinement costs: a session's start (a warm acquire from the pool, and a
//! cold one that forks and confines a worker) and `x = 1` latency, with every layer on (own
//! uid, Landlock, seccomp) against every layer off, in one run on one interpreter that every
//! uid can read. Needs root.
//!
//! Run: `cargo bench -p pyvisor --bench sandbox` (set `PYVISOR_BENCH_QUICK=1` for a short
//! run).

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use pyvisor::{Engine, EngineConfig, PoolConfig, SandboxConfig, SessionOptions, StateConfig};

mod common;

use common::{quantile, sorted};

/// An interpreter the sessions' uids can run (one under /root is not readable by them).
const PYTHON: &str = "/usr/bin/python3";

fn report(name: &str, samples: Vec<Duration>) -> (f64, f64) {
    let samples = sorted(samples);
    let micros = |q| quantile(&samples, q).as_secs_f64() * 1e6;
    let (p50, p99) = (micros(0.50), micros(0.99));
    println!("{name:<40} p50 {p50:>9.1} µs   p99 {p99:>9.1} µs");
    (p50, p99)
}

async fn engine(sandbox: SandboxConfig, min_idle: usize, state: &std::path::Path) -> Engine {
    Engine::start(EngineConfig {
        python: PYTHON.into(),
        pool: PoolConfig {
            min_idle,
            max_idle: min_idle.max(1),
            ..PoolConfig::default()
        },
        sandbox,
        state: StateConfig {
            dir: Some(state.to_owned()),
            ..StateConfig::default()
        },
        ..EngineConfig::default()
    })
    .await
    .expect("engine starts")
}

/// Waits until the pool holds a ready worker.
async fn pool_ready(engine: &Engine) {
    while engine.stats().await.expect("stats").pool.idle == 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Session starts: each from a ready worker (warm) when `warm`, else forked on demand.
async fn starts(engine: &Engine, warm: bool, n: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        if warm {
            pool_ready(engine).await;
        }
        let started = Instant::now();
        let session = engine
            .create_session(SessionOptions::default())
            .await
            .expect("session starts");
        samples.push(started.elapsed());
        assert_eq!(session.warm(), warm, "the pool did not behave as measured");
        session.close().await.expect("close");
    }
    samples
}

async fn round_trips(engine: &Engine, n: usize) -> Vec<Duration> {
    let session = engine
        .create_session(SessionOptions::default())
        .await
        .expect("session starts");
    for _ in 0..50 {
        session.run("x = 1").await.expect("runs");
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        session.run("x = 1").await.expect("runs");
        samples.push(started.elapsed());
    }
    session.close().await.expect("close");
    samples
}

#[tokio::main]
async fn main() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the sandbox bench needs root (uid separation)"
    );
    let quick = std::env::var_os("PYVISOR_BENCH_QUICK").is_some();
    let (starts_n, trips_n) = if quick { (20, 500) } else { (100, 5000) };
    let on = SandboxConfig {
        uid_range: Some(62_500..=62_599),
        landlock: true,
        seccomp: true,
        ..SandboxConfig::default()
    };
    let mut medians = Vec::new();
    for (label, sandbox) in [("off", SandboxConfig::default()), ("on", on)] {
        let state = tempfile::tempdir().expect("state dir");
        // Workers with uids of their own enter the state dir to reach their checkpoint dirs.
        std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod");
        println!("-- every layer {label}");
        let warm = engine(sandbox.clone(), 1, state.path()).await;
        let acquire = report(
            "session start, warm (from the pool)",
            starts(&warm, true, starts_n).await,
        );
        let trips = report("x = 1", round_trips(&warm, trips_n).await);
        drop(warm);
        let cold = engine(sandbox, 0, state.path()).await;
        let fork = report(
            "session start, cold (zygote fork)",
            starts(&cold, false, starts_n).await,
        );
        medians.push((label, acquire, trips, fork));
    }
    let (_, off_acquire, off_trips, off_fork) = medians[0];
    let (_, on_acquire, on_trips, on_fork) = medians[1];
    println!(
        "on/off p50 ratios: warm start {:.2}x, x = 1 {:.2}x, cold start {:.2}x",
        on_acquire.0 / off_acquire.0,
        on_trips.0 / off_trips.0,
        on_fork.0 / off_fork.0
    );
}
