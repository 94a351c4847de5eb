//! Memory figures for the README: how long a check takes against 100,000 stored outcomes
//! (p50/p99; target ≤ 5 ms p99), and what memory costs an execution: `x = 1` p50 after a flood
//! of 10,000 executions, with memory on and off (target: within 5%).
//!
//! Run: `cargo bench -p pyvisor --bench memory` (set `PYVISOR_BENCH_QUICK=1` for a short run).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyvisor::{Engine, EngineConfig, ExecutionStatus, MemoryConfig, SessionOptions};
use pyvisor_actors::memory::{LocalEmbedder, Memory, OutcomeDraft};
use pyvisor_actors::ExecutionStatus as Status;

mod common;

use common::{quantile, sorted};

const OUTCOMES: usize = 100_000;
const FLOOD: usize = 10_000;

fn quick() -> bool {
    std::env::var_os("PYVISOR_BENCH_QUICK").is_some()
}

/// Cell `i` of a stream of varied pandas-like code: frames, methods, columns, keyword
/// arguments and the shape of the cell change, so that outcomes spread over the vector space
/// as real ones do (a repeated approach recurs tens of times, not thousands).
fn cell(i: usize) -> String {
    const FRAMES: [&str; 12] = [
        "df", "sales", "orders", "raw", "table", "frame", "prices", "events", "users", "logs",
        "stock", "trips",
    ];
    const METHODS: [&str; 32] = [
        "mean",
        "sum",
        "head",
        "describe",
        "dropna",
        "ffill",
        "sort_values",
        "groupby",
        "merge",
        "pivot_table",
        "melt",
        "rolling",
        "resample",
        "agg",
        "apply",
        "value_counts",
        "nunique",
        "fillna",
        "astype",
        "rename",
        "drop",
        "query",
        "assign",
        "explode",
        "corr",
        "cumsum",
        "diff",
        "shift",
        "rank",
        "clip",
        "round",
        "sample",
    ];
    const KEYWORDS: [&str; 10] = [
        "axis", "how", "on", "columns", "index", "n", "freq", "errors", "method", "by",
    ];
    let mix = |k: usize| (i.wrapping_mul(2_654_435_761).rotate_left(k as u32 * 7)) >> 3;
    let frame = FRAMES[mix(1) % FRAMES.len()];
    let method = METHODS[mix(2) % METHODS.len()];
    let other = METHODS[mix(3) % METHODS.len()];
    let keyword = KEYWORDS[mix(4) % KEYWORDS.len()];
    let column = format!("c{}", mix(5) % 400);
    match mix(6) % 6 {
        0 => format!("{frame}['{column}'].{method}()"),
        1 => format!(
            "r{} = {frame}.{method}({keyword}={})",
            mix(7) % 50,
            mix(8) % 5
        ),
        2 => format!(
            "{frame} = {frame}.{method}()\nprint(len({frame}), {})",
            mix(9) % 1000
        ),
        3 => format!(
            "x = pd.read_csv('d{}.csv', {keyword}='{column}')\nx.{other}()",
            mix(10) % 90
        ),
        4 => format!("{frame}.{method}().{other}({keyword}='{column}')"),
        _ => format!("for col in {frame}.columns:\n    {frame}[col] = {frame}[col].{method}()"),
    }
}

/// A memory with `OUTCOMES` outcomes of one owner, `failing` of them failures.
fn filled(failing: f64) -> Memory {
    let memory = Memory::open(Default::default(), Arc::new(LocalEmbedder));
    let owner: Arc<str> = "bench".into();
    for i in 0..OUTCOMES {
        let failure = (i as f64 * failing).fract() + failing >= 1.0;
        memory.record(OutcomeDraft {
            owner: owner.clone(),
            session_id: format!("s-{}", i / 50).into(),
            execution_id: format!("e-{i}"),
            execution_count: (i % 50) as u64 + 1,
            code: cell(i),
            status: if failure { Status::Error } else { Status::Ok },
            error: failure.then(|| ("KeyError".to_owned(), format!("'col{}'", i % 97))),
            failing_line: failure.then_some(1),
            duration_ms: 1.0,
            meta: None,
        });
    }
    memory
}

fn check_figures(failing: f64) {
    let started = Instant::now();
    let memory = filled(failing);
    let filled_in = started.elapsed();
    let rounds = if quick() { 200 } else { 2_000 };
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..rounds {
        // Code like what is stored, but not a stored cell itself.
        let code = cell(OUTCOMES + round);
        let started = Instant::now();
        let insights = memory.check("bench", &code);
        samples.push(started.elapsed());
        std::hint::black_box(insights);
    }
    let samples = sorted(samples);
    println!(
        "memory.check at {OUTCOMES} outcomes ({:.0}% failures, filled in {:.1} s): p50 {:.2} ms, p99 {:.2} ms",
        failing * 100.0,
        filled_in.as_secs_f64(),
        quantile(&samples, 0.5).as_secs_f64() * 1e3,
        quantile(&samples, 0.99).as_secs_f64() * 1e3,
    );
}

/// An engine with memory on or off and a session in it that has run a flood of executions.
async fn flooded(memory: bool) -> (Engine, pyvisor::Session) {
    let mut config = EngineConfig {
        memory: MemoryConfig {
            enabled: memory,
            ..MemoryConfig::default()
        },
        ..EngineConfig::default()
    };
    config.state.dir = Some(tempfile::tempdir().expect("a state dir").keep());
    config.state.auto.after_changes = 0;
    config.proactive.enabled = false;
    let engine = Engine::start(config).await.expect("engine starts");
    let options = SessionOptions {
        owner: Some("bench".into()),
        ..SessionOptions::default()
    };
    let session = engine.create_session(options).await.expect("a session");
    let flood = if quick() { FLOOD / 10 } else { FLOOD };
    for i in 0..flood {
        // Every tenth raises, as real code does now and then.
        let code = if i % 10 == 0 {
            format!("{{}}['k{}']", i % 31)
        } else {
            format!("v{} = {i}", i % 101)
        };
        session.run(code.as_str()).await.expect("runs");
    }
    engine.memory_flush().await;
    (engine, session)
}

/// `x = 1` p50 in two flooded engines, memory on and off, measured in alternating blocks so
/// that whatever else the machine does falls on both alike.
async fn x_equals_one() -> (Duration, Duration) {
    let (_on_engine, on) = flooded(true).await;
    let (_off_engine, off) = flooded(false).await;
    let (blocks, per_block) = if quick() { (4, 50) } else { (40, 100) };
    let (mut on_samples, mut off_samples) = (Vec::new(), Vec::new());
    for block in 0..blocks {
        let order = if block % 2 == 0 {
            [(&on, true), (&off, false)]
        } else {
            [(&off, false), (&on, true)]
        };
        for (session, memory) in order {
            for _ in 0..per_block {
                let started = Instant::now();
                let result = session.run("x = 1").await.expect("runs");
                let took = started.elapsed();
                assert_eq!(result.status, ExecutionStatus::Ok);
                if memory {
                    on_samples.push(took)
                } else {
                    off_samples.push(took)
                }
            }
        }
    }
    (
        quantile(&sorted(on_samples), 0.5),
        quantile(&sorted(off_samples), 0.5),
    )
}

#[tokio::main]
async fn main() {
    check_figures(0.3);
    check_figures(1.0);
    let (on, off) = x_equals_one().await;
    println!(
        "x = 1 p50 after {FLOOD} executions: memory on {:.1} µs, off {:.1} µs ({:+.1}%)",
        on.as_secs_f64() * 1e6,
        off.as_secs_f64() * 1e6,
        (on.as_secs_f64() / off.as_secs_f64() - 1.0) * 100.0
    );
}
