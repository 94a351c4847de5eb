//! What `[state] durability = "reply"` costs, and the window the default leaves open.
//!
//! For each mode, the round trip of an execution that changes the namespace: `x = i` in a
//! small session, and a column assignment in a session holding a DataFrame (when pandas
//! imports). For the default (`debounced`), how long after the reply the change is on disk
//! (`session.info().durability.saved`): once for an execution after a quiet second (the
//! checkpoint starts at once) and once for back-to-back executions (it waits for the debounce).
//!
//! Run: `cargo bench -p pyvisor --bench durability` (`PYVISOR_BENCH_QUICK=1` for a short run).

use std::path::Path;
use std::time::{Duration, Instant};

use pyvisor::{
    AutoCheckpoint, DurabilityMode, Engine, EngineConfig, ExecutionStatus, Session, StateConfig,
};

mod common;

use common::{quantile, sorted};

/// A frame of a million rows (about 24 MB of column data).
const FRAME: &str = "import pandas as pd\n\
    df = pd.DataFrame({'a': range(1_000_000), 'b': [0.5] * 1_000_000, 'c': ['x'] * 1_000_000})";

async fn engine_in(dir: &Path, durability: DurabilityMode) -> Engine {
    Engine::start(EngineConfig {
        state: StateConfig {
            dir: Some(dir.to_owned()),
            auto: AutoCheckpoint {
                durability,
                ..AutoCheckpoint::default()
            },
            ..StateConfig::default()
        },
        ..EngineConfig::default()
    })
    .await
    .expect("engine starts")
}

async fn ok(session: &Session, code: &str) -> bool {
    let result = session.run(code).await.expect("the session runs code");
    result.status == ExecutionStatus::Ok
}

/// Round trips of `code(i)` for `n` executions, back to back.
async fn round_trips(session: &Session, n: usize, code: impl Fn(usize) -> String) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let started = Instant::now();
        assert!(ok(session, &code(i)).await);
        samples.push(started.elapsed());
    }
    samples
}

/// How long after the reply of `x = i` the session reports its state saved, for `n`
/// executions each `spacing` after the previous one was saved.
async fn window(session: &Session, n: usize, spacing: Duration) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        tokio::time::sleep(spacing).await;
        assert!(ok(session, &format!("x = {i}")).await);
        let replied = Instant::now();
        while !session.info().await.unwrap().durability.saved {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        samples.push(replied.elapsed());
    }
    samples
}

fn report(what: &str, samples: Vec<Duration>) {
    let samples = sorted(samples);
    let ms = |q: f64| quantile(&samples, q).as_secs_f64() * 1000.0;
    println!(
        "{what:<58} p50 {:>8.2} ms  p99 {:>8.2} ms  max {:>8.2} ms  (n={})",
        ms(0.5),
        ms(0.99),
        ms(1.0),
        samples.len()
    );
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("durability: bench");
        return;
    }
    let quick = std::env::var_os("PYVISOR_BENCH_QUICK").is_some();
    let (n_small, n_frame, n_window) = if quick { (20, 5, 3) } else { (200, 30, 10) };
    println!(
        "pyvisor durability benchmarks{}\n",
        if quick { ", quick run" } else { "" }
    );
    for (label, mode) in [
        ("debounced", DurabilityMode::Debounced),
        ("reply", DurabilityMode::Reply),
    ] {
        let dir = tempfile::Builder::new()
            .prefix("pyvisor-bench-durability-")
            .tempdir_in("/tmp")
            .expect("a temporary state directory");
        let engine = engine_in(dir.path(), mode).await;
        let session = engine.create_session(Default::default()).await.unwrap();
        let small = round_trips(&session, n_small, |i| format!("x = {i}")).await;
        report(&format!("[{label}] `x = i` round trip"), small);
        let framed = engine.create_session(Default::default()).await.unwrap();
        if ok(&framed, FRAME).await {
            let frame = round_trips(&framed, n_frame, |i| format!("df['d'] = {i}")).await;
            report(
                &format!("[{label}] `df['d'] = i` round trip (1M-row frame)"),
                frame,
            );
        } else {
            println!("[{label}] pandas does not import: no DataFrame figures");
        }
        if mode == DurabilityMode::Debounced {
            let quiet = window(&session, n_window, Duration::from_millis(1100)).await;
            report("[debounced] reply to saved, after a quiet second", quiet);
            let busy = window(&session, n_window, Duration::ZERO).await;
            report("[debounced] reply to saved, back to back", busy);
        }
        drop(engine);
    }
}
