//! Pool figures for the README: warm acquire through the Rust API, the hit rate of a steady
//! create+close load, and cold spawn against a bare `python3` start measured in the same run.
//!
//! Run: `cargo bench -p pyvisor --bench pool` (set `PYVISOR_BENCH_QUICK=1` for a short run).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pyvisor::{Engine, EngineConfig, PoolConfig};
use pyvisor_actors::worker::resolve_interpreter;

mod common;

use common::{quantile, sorted};

fn report(name: &str, samples: Vec<Duration>) -> f64 {
    let samples = sorted(samples);
    let micros = |q| quantile(&samples, q).as_secs_f64() * 1e6;
    let (n, p50, p99) = (samples.len(), micros(0.50), micros(0.99));
    println!("{name:<52} p50 {p50:>10.1} µs   p99 {p99:>10.1} µs   (n = {n})");
    p50
}

async fn engine(pool: PoolConfig) -> Engine {
    Engine::start(EngineConfig {
        pool,
        ..EngineConfig::default()
    })
    .await
    .expect("engine starts")
}

/// A bare interpreter started the way pyvisor starts one, until it has printed a line.
fn bare_python_starts(n: usize) -> Vec<Duration> {
    // The real interpreter behind `python3` (which may be a shim script), as the engine uses.
    let python = resolve_interpreter("python3").expect("python3 runs");
    (0..n)
        .map(|_| {
            let start = Instant::now();
            let mut child = Command::new(&python)
                .args(["-I", "-u", "-c", "print(1)"])
                .stdout(Stdio::piped())
                .spawn()
                .expect("python3 starts");
            let mut byte = [0u8; 1];
            child
                .stdout
                .take()
                .expect("piped stdout")
                .read_exact(&mut byte)
                .expect("python3 prints");
            let elapsed = start.elapsed();
            child.wait().expect("python3 exits");
            elapsed
        })
        .collect()
}

/// `create_session` with nothing ready in the pool: a spawn for each.
async fn cold_creates(n: usize) -> Vec<Duration> {
    let engine = engine(PoolConfig {
        min_idle: 0,
        ..PoolConfig::default()
    })
    .await;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let session = engine.create_session(Default::default()).await.unwrap();
        samples.push(start.elapsed());
        session.close().await.unwrap();
    }
    samples
}

/// Waits until the pool has `idle` ready workers.
async fn pool_has_idle(engine: &Engine, idle: usize) {
    while engine.stats().await.unwrap().pool.idle < idle {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `engine.stats()`: the same trips to the engine thread and the pool as an acquire.
async fn stats_round_trips(n: usize) -> Vec<Duration> {
    let engine = engine(PoolConfig::default()).await;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        engine.stats().await.unwrap();
        samples.push(start.elapsed());
    }
    samples
}

/// `create_session` served from a full pool, one at a time after a quiet moment (so every
/// thread on the path has gone to sleep: the latency of an occasional create).
async fn warm_single_creates(n: usize) -> Vec<Duration> {
    let engine = engine(PoolConfig {
        min_idle: 4,
        max_idle: 4,
        ..PoolConfig::default()
    })
    .await;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        pool_has_idle(&engine, 4).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let start = Instant::now();
        let session = engine.create_session(Default::default()).await.unwrap();
        samples.push(start.elapsed());
        assert!(session.warm(), "a full pool serves from its idle workers");
        session.close().await.unwrap();
    }
    samples
}

/// `create_session` served from a full pool, in bursts of back-to-back creates.
async fn warm_creates(n: usize) -> Vec<Duration> {
    const BURST: usize = 16;
    let engine = engine(PoolConfig {
        min_idle: BURST,
        max_idle: BURST,
        ..PoolConfig::default()
    })
    .await;
    let mut samples = Vec::with_capacity(n);
    while samples.len() < n {
        pool_has_idle(&engine, BURST).await;
        let mut sessions = Vec::with_capacity(BURST);
        for _ in 0..BURST {
            let start = Instant::now();
            let session = engine.create_session(Default::default()).await.unwrap();
            samples.push(start.elapsed());
            assert!(session.warm(), "a full pool serves from its idle workers");
            sessions.push(session);
        }
        for session in sessions {
            session.close().await.unwrap();
        }
    }
    samples
}

/// 50 sessions a second, each created, used once and closed, against `min_idle = 4`.
async fn steady_load(duration: Duration) -> (f64, u64, Vec<Duration>) {
    let engine = engine(PoolConfig {
        min_idle: 4,
        ..PoolConfig::default()
    })
    .await;
    pool_has_idle(&engine, 4).await;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut creates = Vec::new();
    let mut users = Vec::new();
    let start = Instant::now();
    while start.elapsed() < duration {
        tick.tick().await;
        let begun = Instant::now();
        let session = engine.create_session(Default::default()).await.unwrap();
        creates.push(begun.elapsed());
        users.push(tokio::spawn(async move {
            session.run("x = 1").await.unwrap();
            session.close().await.unwrap();
        }));
    }
    for user in users {
        user.await.unwrap();
    }
    let stats = engine.stats().await.unwrap();
    (
        stats.pool.hit_rate,
        stats.pool.hits + stats.pool.misses,
        creates,
    )
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("pool: bench");
        return;
    }
    let quick = std::env::var_os("PYVISOR_BENCH_QUICK").is_some();
    let (spawns, acquires, load) = if quick {
        (10, 50, Duration::from_secs(3))
    } else {
        (50, 500, Duration::from_secs(20))
    };
    println!("pyvisor pool benchmarks\n");
    let bare = report(
        "bare `python3 -I -u -c print(1)` to first line",
        bare_python_starts(spawns),
    );
    let cold = report(
        "create_session, empty pool (cold spawn)",
        cold_creates(spawns).await,
    );
    println!("{:<52} {:.2}x a bare python3 start", "  ratio", cold / bare);
    report(
        "engine.stats() (engine thread and pool, no worker)",
        stats_round_trips(acquires).await,
    );
    report(
        "create_session, warm pool, one after 20 ms quiet",
        warm_single_creates(acquires / 2).await,
    );
    let warm = report(
        "create_session, warm pool (bursts of 16)",
        warm_creates(acquires).await,
    );
    println!(
        "{:<52} {:.0}x faster than a cold spawn",
        "  ratio",
        cold / warm
    );
    let (hit_rate, total, creates) = steady_load(load).await;
    report("create_session under 50 creates+closes per s", creates);
    println!(
        "{:<52} {:.1}% of {total} acquires",
        "pool hit rate under 50 creates+closes per s",
        hit_rate * 100.0
    );
}
