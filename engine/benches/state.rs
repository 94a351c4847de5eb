//! Checkpoint figures for the README: checkpoint and restore of a ~1 MB namespace, the
//! foreground pause while a ~100 MB namespace is checkpointed in the background, recovery
//! from a killed worker, and the cost of a `rollback_on_failure` transaction.
//!
//! Run: `cargo bench -p pyvisor --bench state` (set `PYVISOR_BENCH_QUICK=1` for a short run).

use std::future::Future;
use std::path::Path;
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pyvisor::{
    AutoCheckpoint, Engine, EngineConfig, ExecuteRequest, ExecutionStatus, PoolConfig, Session,
    StateConfig,
};

mod common;

use common::{quantile, sorted};

/// ~1 MB once pickled: a list of dicts of ints, floats and strs, and a 200 KB string.
const MIXED_NAMESPACE: &str = r#"
import random as _random, string as _string
_rng = _random.Random(7)
rows = [
    {"id": i, "score": _rng.random() * 100, "name": "user-%06d" % i, "flag": i % 3 == 0}
    for i in range(14_000)
]
blob = "".join(_rng.choices(_string.ascii_letters + _string.digits, k=200_000))
probe = 42
del _rng, _random, _string
"#;

/// A small DataFrame, added to the mixed namespace when pandas imports.
const PANDAS_FRAME: &str = r#"
import pandas as pd
frame = pd.DataFrame({"a": range(1_000), "b": [i * 0.5 for i in range(1_000)], "c": ["x"] * 1_000})
"#;

/// ~100 MB that does not compress (like real array data), plus 100,000 small objects.
const BIG_NAMESPACE: &str = r#"
import os
big = bytearray(os.urandom(100 * 1024 * 1024))
objs = [{"i": i, "s": str(i)} for i in range(100_000)]
"#;

/// Summary of `samples`, in milliseconds.
#[derive(Clone, Copy)]
struct Stats {
    p50: f64,
    p99: f64,
    max: f64,
    n: usize,
}

fn stats(samples: &[Duration]) -> Stats {
    let samples = sorted(samples.to_vec());
    let millis = |q| quantile(&samples, q).as_secs_f64() * 1e3;
    Stats {
        p50: millis(0.50),
        p99: millis(0.99),
        max: millis(1.0),
        n: samples.len(),
    }
}

fn stats_ms(samples: &[f64]) -> Stats {
    let durations: Vec<Duration> = samples
        .iter()
        .map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1e3))
        .collect();
    stats(&durations)
}

/// The 1, 5 and 15 minute load averages: other work on the machine skews every figure.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn report(name: &str, s: Stats) {
    println!(
        "{name:<60} p50 {:>9.3} ms   p99 {:>9.3} ms   max {:>9.3} ms   (n = {})",
        s.p50, s.p99, s.max, s.n
    );
}

/// One row of the closing table.
struct Row {
    what: String,
    p50: f64,
    p99: f64,
    target_ms: f64,
}

async fn engine_in(dir: &Path, preload: &[&str]) -> Engine {
    Engine::start(EngineConfig {
        preload: preload.iter().map(|m| m.to_string()).collect(),
        pool: PoolConfig {
            min_idle: 2,
            ..PoolConfig::default()
        },
        state: StateConfig {
            dir: Some(dir.to_owned()),
            max_bytes: Some(512 * 1024 * 1024),
            auto: AutoCheckpoint {
                after_changes: 0,
                ..AutoCheckpoint::default()
            },
            ..StateConfig::default()
        },
        ..EngineConfig::default()
    })
    .await
    .expect("engine starts")
}

async fn ok(session: &Session, code: &str) {
    let result = session.run(code).await.expect("the session runs code");
    assert_eq!(result.status, ExecutionStatus::Ok, "{code}: {result:?}");
}

async fn pool_has_idle(engine: &Engine, idle: usize) {
    while engine.stats().await.unwrap().pool.idle < idle {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A session holding the mixed namespace (with a DataFrame when `pandas`); whether it has one.
async fn mixed_session(engine: &Engine, pandas: bool) -> (Session, bool) {
    let session = engine.create_session(Default::default()).await.unwrap();
    ok(&session, MIXED_NAMESPACE).await;
    let with_frame =
        pandas && session.run(PANDAS_FRAME).await.unwrap().status == ExecutionStatus::Ok;
    (session, with_frame)
}

/// 1 and 2: `checkpoint()` and `restore(None)` of the mixed namespace.
async fn checkpoint_and_restore(
    engine: &Engine,
    pandas: bool,
    n: usize,
) -> (Vec<Duration>, Vec<Duration>, bool) {
    let (session, with_frame) = mixed_session(engine, pandas).await;
    let first = session.checkpoint().await.expect("checkpoint");
    let info = session.checkpoints().await.unwrap();
    let latest = info.first().expect("a checkpoint was listed");
    println!(
        "mixed namespace{}: state {} bytes in blobs, {} bytes written, {} names saved",
        if with_frame {
            " + DataFrame"
        } else {
            " (pandas not importable)"
        },
        latest.state_bytes,
        first.bytes,
        first.saved.len()
    );
    let mut checkpoints = Vec::with_capacity(n);
    let mut restores = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        session.checkpoint().await.expect("checkpoint");
        checkpoints.push(start.elapsed());
        let start = Instant::now();
        let restored = session.restore(None).await.expect("restore");
        restores.push(start.elapsed());
        assert!(restored.lost.is_empty(), "{restored:?}");
    }
    let check = session.run("(probe, len(rows), len(blob))").await.unwrap();
    assert_eq!(check.result.unwrap().repr, "(42, 14000, 200000)");
    session.close().await.unwrap();
    (checkpoints, restores, with_frame)
}

/// Round trips of `x = 1` on `session` until `until` completes (polled between them), each
/// with when it was sent, after the first poll of `until`; and the output of `until`.
async fn round_trips_until<T>(
    session: &Session,
    until: impl Future<Output = T>,
) -> (T, Vec<(Duration, Duration)>) {
    let mut until = pin!(until);
    let begun = Instant::now();
    // The first poll queues the request on the session, ahead of the executions below.
    let mut output = match futures::poll!(until.as_mut()) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    };
    let mut samples = Vec::new();
    loop {
        let start = Instant::now();
        let result = session.run("x = 1").await.unwrap();
        samples.push((start - begun, start.elapsed()));
        assert_eq!(result.status, ExecutionStatus::Ok);
        if output.is_none() {
            if let Poll::Ready(done) = futures::poll!(until.as_mut()) {
                output = Some(done);
            }
        }
        if let Some(output) = output {
            return (output, samples);
        }
    }
}

async fn round_trips(session: &Session, n: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        session.run("x = 1").await.unwrap();
        samples.push(start.elapsed());
    }
    samples
}

/// Per checkpoint of the big namespace: `x = 1` round trips while it is in flight, then the
/// same number of round trips without one.
struct PauseFigures {
    checkpoint: Vec<Duration>,
    first_after: Vec<Duration>,
    during_max: Vec<f64>,
    during_p50: Vec<f64>,
    quiet_max: Vec<f64>,
    quiet_p50: Vec<f64>,
    during_all: Vec<Duration>,
    quiet_all: Vec<Duration>,
    /// Per checkpoint: when its longest round trip was sent, that round trip, and how long
    /// the checkpoint took.
    longest: Vec<(Duration, Duration, Duration)>,
    bytes: u64,
}

/// 3: the foreground pause caused by a background checkpoint of ~100 MB.
async fn background_pause(session: &Session, n: usize) -> PauseFigures {
    let mut figures = PauseFigures {
        checkpoint: Vec::new(),
        first_after: Vec::new(),
        during_max: Vec::new(),
        during_p50: Vec::new(),
        quiet_max: Vec::new(),
        quiet_p50: Vec::new(),
        during_all: Vec::new(),
        quiet_all: Vec::new(),
        longest: Vec::new(),
        bytes: 0,
    };
    round_trips(session, 500).await; // warm up
    for _ in 0..n {
        let ((elapsed, bytes), during) = round_trips_until(session, async {
            let start = Instant::now();
            let bytes = session.checkpoint().await.expect("checkpoint").bytes;
            (start.elapsed(), bytes)
        })
        .await;
        figures.checkpoint.push(elapsed);
        figures.bytes = bytes;
        let (at, longest) = during.iter().copied().max_by_key(|(_, rtt)| *rtt).unwrap();
        figures.longest.push((at, longest, elapsed));
        let during: Vec<Duration> = during.into_iter().map(|(_, rtt)| rtt).collect();
        let quiet = round_trips(session, during.len()).await;
        figures.first_after.push(during[0]);
        let (d, q) = (stats(&during), stats(&quiet));
        figures.during_max.push(d.max);
        figures.during_p50.push(d.p50);
        figures.quiet_max.push(q.max);
        figures.quiet_p50.push(q.p50);
        figures.during_all.extend(during);
        figures.quiet_all.extend(quiet);
    }
    figures
}

/// 4: SIGKILL of the worker to the first ok result of the restored session.
async fn kill_to_restored(engine: &Engine, pandas: bool, n: usize) -> (Vec<Duration>, f64) {
    let (session, _) = mixed_session(engine, pandas).await;
    session.checkpoint().await.expect("checkpoint");
    let mut samples = Vec::with_capacity(n);
    let mut failed_attempts = 0;
    for _ in 0..n {
        pool_has_idle(engine, 2).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let pid = session.info().await.unwrap().pid.expect("a live worker");
        let start = Instant::now();
        kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("kill the worker");
        loop {
            // Never an answer computed ahead: the probe measures the recovery, not the cache
            // (which answers for the namespace as it was before the kill).
            let probe = session
                .execute(ExecuteRequest::new("probe").no_cache())
                .await
                .map(|execution| execution.result());
            let probe = match probe {
                Ok(result) => result.await,
                Err(err) => Err(err),
            };
            match probe {
                Ok(r) if r.status == ExecutionStatus::Ok => {
                    assert_eq!(r.result.map(|v| v.repr).as_deref(), Some("42"));
                    break;
                }
                _ => failed_attempts += 1,
            }
            assert!(start.elapsed() < Duration::from_secs(30), "no recovery");
        }
        samples.push(start.elapsed());
    }
    session.close().await.unwrap();
    (samples, failed_attempts as f64 / n as f64)
}

async fn execute_once(session: &Session, request: ExecuteRequest) -> Duration {
    let start = Instant::now();
    let result = session
        .execute(request)
        .await
        .unwrap()
        .result()
        .await
        .unwrap();
    let elapsed = start.elapsed();
    assert_eq!(result.status, ExecutionStatus::Ok, "{result:?}");
    elapsed
}

/// 5: successful executions on the big namespace, by transaction and cell (interleaved).
async fn rollback_overhead(session: &Session, n: usize) -> [Vec<Duration>; 4] {
    let mut samples: [Vec<Duration>; 4] = Default::default();
    for _ in 0..n {
        for (i, (code, rollback)) in [
            ("len(big)", false),
            ("len(big)", true),
            ("y = 1", false),
            ("y = 1", true),
        ]
        .into_iter()
        .enumerate()
        {
            let request = ExecuteRequest::new(code);
            let request = if rollback {
                request.rollback_on_failure()
            } else {
                request
            };
            // Untimed: the worker frees a rollback's 100 MB copy after it has replied, which
            // would otherwise land on the next sample.
            ok(session, "pass").await;
            samples[i].push(execute_once(session, request).await);
        }
    }
    samples
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("state: bench");
        return;
    }
    let quick = std::env::var_os("PYVISOR_BENCH_QUICK").is_some();
    let (n_small, n_pause, n_kill, n_rollback) = if quick {
        (20, 3, 5, 10)
    } else {
        (200, 10, 30, 100)
    };
    let dir = tempfile::Builder::new()
        .prefix("pyvisor-bench-state-")
        .tempdir_in("/tmp")
        .expect("a temporary state directory");
    let engine = engine_in(dir.path(), &[]).await;
    pool_has_idle(&engine, 2).await;
    println!(
        "pyvisor state benchmarks{} (state dir {}, load average {})\n",
        if quick { ", quick run" } else { "" },
        dir.path().display(),
        load_average()
    );
    let mut rows = Vec::new();

    let mut pandas_available = false;
    for pandas in [true, false] {
        let (checkpoints, restores, with_frame) =
            checkpoint_and_restore(&engine, pandas, n_small).await;
        pandas_available |= with_frame;
        let what = if with_frame {
            "~1 MB + DataFrame"
        } else {
            "~1 MB, no pandas"
        };
        let (c, r) = (stats(&checkpoints), stats(&restores));
        report(&format!("session.checkpoint(), {what}"), c);
        report(&format!("session.restore(None), {what}"), r);
        rows.push(Row {
            what: format!("checkpoint(), {what}"),
            p50: c.p50,
            p99: c.p99,
            target_ms: 20.0,
        });
        rows.push(Row {
            what: format!("restore(None), {what}"),
            p50: r.p50,
            p99: r.p99,
            target_ms: 30.0,
        });
        if !with_frame {
            break;
        }
    }

    let big = engine.create_session(Default::default()).await.unwrap();
    ok(&big, BIG_NAMESPACE).await;
    let pause = background_pause(&big, n_pause).await;
    println!(
        "\nbig namespace: checkpoint file {} bytes, {} checkpoints",
        pause.bytes, n_pause
    );
    report(
        "session.checkpoint(), ~100 MB namespace (whole call)",
        stats(&pause.checkpoint),
    );
    report(
        "`x = 1` round trip, first one after the checkpoint request",
        stats(&pause.first_after),
    );
    let (during_all, quiet_all) = (stats(&pause.during_all), stats(&pause.quiet_all));
    report(
        "`x = 1` round trip while a checkpoint is in flight",
        during_all,
    );
    report(
        "`x = 1` round trip, no checkpoint (same count after)",
        quiet_all,
    );
    report(
        "  max round trip per checkpoint window",
        stats_ms(&pause.during_max),
    );
    report(
        "  max round trip per quiet window",
        stats_ms(&pause.quiet_max),
    );
    let excess_max: Vec<f64> = pause
        .during_max
        .iter()
        .zip(&pause.quiet_max)
        .map(|(d, q)| d - q)
        .collect();
    let excess_p50: Vec<f64> = pause
        .during_p50
        .iter()
        .zip(&pause.quiet_p50)
        .map(|(d, q)| d - q)
        .collect();
    let (excess_max, excess_p50) = (stats_ms(&excess_max), stats_ms(&excess_p50));
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let longest: Vec<String> = pause
        .longest
        .iter()
        .map(|(at, rtt, total)| format!("{:.1}@{:.0}/{:.0}", ms(rtt), ms(at), ms(total)))
        .collect();
    println!(
        "  longest round trip per checkpoint, ms @ sent ms after the request / checkpoint ms:\n    {}",
        longest.join("  ")
    );
    report("pause: max during − max quiet, per checkpoint", excess_max);
    report("  p50 during − p50 quiet, per checkpoint", excess_p50);
    rows.push(Row {
        what: "pause from a background ~100 MB checkpoint".into(),
        p50: excess_max.p50,
        p99: excess_max.p99,
        target_ms: 10.0,
    });

    println!();
    // Without pandas; with a DataFrame (the new worker imports pandas to restore it); and
    // the same with pandas preloaded in the pool's workers.
    // A second engine needs a state directory of its own (each engine locks its own).
    let preloaded_dir = tempfile::Builder::new()
        .prefix("pyvisor-bench-state-preloaded-")
        .tempdir_in("/tmp")
        .expect("a temp dir");
    let preloaded = if pandas_available {
        let engine = engine_in(preloaded_dir.path(), &["pandas"]).await;
        pool_has_idle(&engine, 2).await;
        Some(engine)
    } else {
        None
    };
    let mut cases = vec![(&engine, false, "~1 MB, no pandas")];
    if let Some(preloaded) = &preloaded {
        cases.push((&engine, true, "~1 MB + DataFrame"));
        cases.push((preloaded, true, "~1 MB + DataFrame, pandas preloaded"));
    }
    for (engine, pandas, what) in cases {
        let (samples, failed) = kill_to_restored(engine, pandas, n_kill).await;
        let label = format!("kill -9 to first ok result, {what}");
        let s = stats(&samples);
        report(&label, s);
        println!(
            "{:<60} {failed:.2} per kill",
            "  executions that failed first"
        );
        rows.push(Row {
            what: label,
            p50: s.p50,
            p99: s.p99,
            target_ms: 200.0,
        });
    }
    drop(preloaded);

    println!();
    let [len_commit, len_rollback, y_commit, y_rollback] =
        rollback_overhead(&big, n_rollback).await;
    let names = [
        "execute `len(big)` (100 MB namespace), commit_always",
        "execute `len(big)` (100 MB namespace), rollback_on_failure",
        "execute `y = 1` (100 MB namespace), commit_always",
        "execute `y = 1` (100 MB namespace), rollback_on_failure",
    ];
    let figures: Vec<Stats> = [&len_commit, &len_rollback, &y_commit, &y_rollback]
        .into_iter()
        .map(|s| stats(s))
        .collect();
    for (name, s) in names.iter().zip(&figures) {
        report(name, *s);
    }
    println!(
        "{:<60} `len(big)` {:+.3} ms, `y = 1` {:+.3} ms (p50)",
        "rollback overhead",
        figures[1].p50 - figures[0].p50,
        figures[3].p50 - figures[2].p50
    );
    big.close().await.unwrap();

    println!("\n| what | p50 | p99 | target | met |\n| --- | --- | --- | --- | --- |");
    for row in &rows {
        let met = match (row.p50 <= row.target_ms, row.p99 <= row.target_ms) {
            (true, true) => "yes",
            (true, false) => "p50 yes, p99 no",
            _ => "**no**",
        };
        println!(
            "| {} | {:.2} ms | {:.2} ms | ≤ {} ms | {met} |",
            row.what, row.p50, row.p99, row.target_ms
        );
    }
    println!(
        "| rollback_on_failure − commit_always, `len(big)` / `y = 1` | {:+.2} / {:+.3} ms | — | — | — |",
        figures[1].p50 - figures[0].p50,
        figures[3].p50 - figures[2].p50
    );
    println!("\nload average at the end: {}", load_average());
    println!(
        "command: {}cargo bench -p pyvisor --bench state",
        if quick { "PYVISOR_BENCH_QUICK=1 " } else { "" }
    );
}
