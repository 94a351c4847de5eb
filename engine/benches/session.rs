//! Whole-system latency figures for the README, measured against this machine's own floor
//! in the same run: a bare Rust host driving a minimal length-prefixed Python loop over
//! pipes. Every figure is reported for both placements of host and worker (same core,
//! different cores), as medians and p99, and the round trip also as the thread switches it
//! costs in the engine's process and in the worker (the floor's: one each).
//!
//! Run: `cargo bench -p pyvisor --bench session` (set `PYVISOR_BENCH_QUICK=1` for a short
//! run).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use pyvisor::{Engine, EngineConfig, ExecuteRequest, ExecutionEvent, PoolConfig, Session};
use pyvisor_actors::worker::resolve_interpreter;

mod common;
mod floor;

use common::{quantile, sorted};
use floor::{pin, thread_switches};

#[derive(Clone, Copy, Debug)]
enum Placement {
    SameCore,
    CrossCore,
}

impl Placement {
    fn name(self) -> &'static str {
        match self {
            Placement::SameCore => "same core",
            Placement::CrossCore => "cross core",
        }
    }

    fn worker_cpu(self) -> usize {
        match self {
            Placement::SameCore => 0,
            Placement::CrossCore => 1,
        }
    }
}

fn report(name: &str, placement: Placement, samples: Vec<Duration>) -> f64 {
    let samples = sorted(samples);
    let micros = |q| quantile(&samples, q).as_secs_f64() * 1e6;
    let (p50, p99) = (micros(0.50), micros(0.99));
    println!(
        "{name:<44} {:<10} p50 {p50:>9.1} µs   p99 {p99:>9.1} µs",
        placement.name()
    );
    p50
}

async fn session_on(engine: &Engine, placement: Placement) -> Session {
    let session = engine.create_session(Default::default()).await.unwrap();
    let pid = session.pid().expect("a created session knows its worker");
    pin(pid, placement.worker_cpu());
    session.run("import time").await.unwrap();
    session
}

async fn session_round_trips(session: &Session, n: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let start = Instant::now();
        session.run("x = 1").await.unwrap();
        if i >= n / 10 {
            samples.push(start.elapsed());
        }
    }
    samples
}

/// Executions per second on one session with many executions queued.
async fn throughput(session: &Session, n: usize) -> f64 {
    let start = Instant::now();
    let mut in_flight = futures::stream::FuturesOrdered::new();
    for _ in 0..n {
        in_flight.push_back(async {
            session
                .execute("x = 1")
                .await
                .unwrap()
                .result()
                .await
                .unwrap()
        });
        if in_flight.len() >= 256 {
            in_flight.next().await;
        }
    }
    while in_flight.next().await.is_some() {}
    n as f64 / start.elapsed().as_secs_f64()
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Delay from `print` in the worker to the chunk reaching the caller (wall clock).
async fn first_chunk_latency(session: &Session, n: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let mut execution = session
            .execute("print(time.time_ns())\ntime.sleep(0.002)")
            .await
            .unwrap();
        let mut measured = false;
        while let Some(event) = execution.next().await {
            // `print` writes the number and the newline separately: time the number.
            if let ExecutionEvent::Output { data, .. } = event {
                let received = now_ns();
                if let (false, Ok(written)) = (measured, data.trim().parse::<u128>()) {
                    samples.push(Duration::from_nanos(received.saturating_sub(written) as u64));
                    measured = true;
                }
            }
        }
    }
    samples
}

/// Host → worker → host round trip of one `input()` answer, seen from the caller.
async fn input_round_trips(session: &Session, n: usize) -> Vec<Duration> {
    let code = format!("for _ in range({n}):\n    input()");
    let mut execution = session
        .execute(ExecuteRequest::new(code).with_input())
        .await
        .unwrap();
    let id = execution.id().to_owned();
    let mut samples = Vec::with_capacity(n);
    let mut answered_at: Option<Instant> = None;
    while let Some(event) = execution.next().await {
        if let ExecutionEvent::InputRequest { .. } = event {
            if let Some(at) = answered_at {
                samples.push(at.elapsed());
            }
            answered_at = Some(Instant::now());
            session.send_input(&id, Some(String::new())).await.unwrap();
        }
    }
    samples
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("session: bench");
        return;
    }
    let quick = std::env::var_os("PYVISOR_BENCH_QUICK").is_some();
    let n = if quick { 500 } else { 5000 };
    // The host (this thread and every engine thread created after this) runs on CPU 0.
    pin(0, 0);
    // The real interpreter behind `python3` (which may be a shim script), as the engine uses.
    let python = resolve_interpreter("python3").expect("python3 runs");
    // No ready workers in the background: only the measured session's worker runs.
    let engine = Engine::start(EngineConfig {
        pool: PoolConfig {
            min_idle: 0,
            ..PoolConfig::default()
        },
        ..EngineConfig::default()
    })
    .await
    .unwrap();
    println!("pyvisor session benchmarks, {n} samples each (host pinned to CPU 0)\n");
    for placement in [Placement::SameCore, Placement::CrossCore] {
        let floor = report(
            "floor: bare host + exec loop, `x = 1`",
            placement,
            floor::round_trips(&python, n, Some(placement.worker_cpu())),
        );
        let session = session_on(&engine, placement).await;
        let worker = session.pid().expect("a created session knows its worker");
        let before = (thread_switches(std::process::id()), thread_switches(worker));
        let api = report(
            "Session::run(\"x = 1\") round trip",
            placement,
            session_round_trips(&session, n).await,
        );
        let after = (thread_switches(std::process::id()), thread_switches(worker));
        let per_run = |from: u64, to: u64| (to - from) as f64 / (n + n / 10) as f64;
        println!(
            "{:<44} {:<10} host {:.2}, worker {:.2}",
            "  thread switches per round trip",
            placement.name(),
            per_run(before.0, after.0),
            per_run(before.1, after.1)
        );
        println!(
            "{:<44} {:<10} {:.2}x the floor",
            "  ratio",
            placement.name(),
            api / floor
        );
        let rate = throughput(&session, n * 4).await;
        println!(
            "{:<44} {:<10} {rate:>9.0} executions/s",
            "throughput, one session",
            placement.name()
        );
        report(
            "first streamed chunk after print",
            placement,
            first_chunk_latency(&session, n / 10).await,
        );
        report(
            "input() round trip",
            placement,
            input_round_trips(&session, n).await,
        );
        session.close().await.unwrap();
        println!();
    }
}
