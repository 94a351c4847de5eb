//! Checkpoint figures at data scale, for the README: a session holding a 200 MB and a 2 GB
//! DataFrame (five float columns of random data, which does not compress), each measured beside
//! a plain `pickle.dumps`/`pickle.loads` of the same frame in the same session, in one run.
//!
//! Per size: a full checkpoint (the frame rebound to a copy, so every byte is written again),
//! a checkpoint after a small change (`k = i`, the frame untouched), one after a column was
//! added, a restore of the frame (`df` rebound, then the latest checkpoint restored), the time
//! from `kill -9` of the worker to the first answer that uses the frame, and the disk the
//! session's retained checkpoints take, against one copy of its data.
//!
//! A third frame is real data: flight records from `tests/data/flights.csv`, repeated to about
//! 200 MB, whose blobs the store compresses (random floats it leaves as they are).
//!
//! Run: `cargo bench -p pyvisor --bench data_scale` (`PYVISOR_BENCH_FRAMES=200,flights` for
//! some of them: a size in MB of random floats, or `flights`).

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pyvisor::{
    AutoCheckpoint, Engine, EngineConfig, ExecutionStatus, PoolConfig, Session, SessionLimits,
    SessionOptions, StateConfig,
};

mod common;

use common::{quantile, sorted};

/// Checkpoints each session keeps in this bench: the disk figure is for five.
const RETENTION: usize = 5;

struct Figures {
    dumps: Vec<Duration>,
    /// `pickle.dump` of the frame to a file in the session's directory.
    dump_to_file: Vec<Duration>,
    loads: Vec<Duration>,
    full: Vec<Duration>,
    full_bytes: u64,
    small: Vec<Duration>,
    small_bytes: Vec<u64>,
    column: Vec<Duration>,
    column_bytes: u64,
    restore: Vec<Duration>,
    killed: Vec<Duration>,
    pickle_bytes: u64,
    /// After five checkpoints of small changes.
    disk_bytes: u64,
    /// At the end, the retained checkpoints holding the frame with and without the column.
    disk_after_column: u64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn p50(samples: &[Duration]) -> f64 {
    ms(quantile(&sorted(samples.to_vec()), 0.5))
}

fn p99(samples: &[Duration]) -> f64 {
    ms(quantile(&sorted(samples.to_vec()), 0.99))
}

async fn ok(session: &Session, code: &str) -> String {
    let result = session.run(code).await.expect("the session runs code");
    assert_eq!(result.status, ExecutionStatus::Ok, "{code}: {result:?}");
    result.result.map(|r| r.repr).unwrap_or_default()
}

/// Seconds as Python measured them, from a repr like `0.1234`.
fn seconds(repr: &str) -> Duration {
    Duration::from_secs_f64(repr.parse().expect("a number of seconds"))
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

/// A frame to measure: what it is, the code that makes `df`, rounds to run.
struct Frame {
    label: String,
    setup: String,
    rounds: usize,
    /// Whether its blobs end up compressed, which the disk figure waits for.
    compressible: bool,
}

impl Frame {
    /// Five columns of random floats: `megabytes` of data that does not compress.
    fn random(megabytes: u64) -> Frame {
        let rows = megabytes * 1_000_000 / 40;
        Frame {
            label: format!("{megabytes} MB DataFrame of random floats"),
            setup: format!(
                "df = pd.DataFrame(np.random.default_rng(7).random(({rows}, 5)), columns=list('abcde'))"
            ),
            rounds: if megabytes >= 1000 { 3 } else { 7 },
            compressible: false,
        }
    }

    /// Real flight records (tests/data/flights.csv: 58,492 rows, 14 columns of numbers and
    /// strings), repeated to about 200 MB of pickle.
    fn flights() -> Frame {
        let csv = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/flights.csv");
        Frame {
            label: "flights.csv repeated 36 times (2.1 M rows)".into(),
            setup: format!("df = pd.concat([pd.read_csv({csv:?})] * 36, ignore_index=True)"),
            rounds: 5,
            compressible: true,
        }
    }
}

/// Waits until no blob of 1 MiB or more under `dir` is left uncompressed (at most 60 s).
async fn compressed(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let mut pending = Vec::new();
        let mut dirs = vec![dir.to_owned()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let meta = entry.metadata().unwrap();
                let name = entry.file_name().to_string_lossy().into_owned();
                if meta.is_dir() {
                    dirs.push(entry.path());
                } else if !name.ends_with(".zst") && meta.len() >= 1 << 20 {
                    pending.push(name);
                }
            }
        }
        if pending.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn measure(engine: &Engine, state_dir: &Path, frame: &Frame) -> Figures {
    let session = engine
        .create_session(SessionOptions::default())
        .await
        .expect("a session");
    ok(
        &session,
        &format!(
            "import pickle, time, numpy as np, pandas as pd\n{}\nk = 0",
            frame.setup
        ),
    )
    .await;
    let rows = ok(&session, "len(df)").await;
    let mut figures = Figures {
        dumps: Vec::new(),
        dump_to_file: Vec::new(),
        loads: Vec::new(),
        full: Vec::new(),
        full_bytes: 0,
        small: Vec::new(),
        small_bytes: Vec::new(),
        column: Vec::new(),
        column_bytes: 0,
        restore: Vec::new(),
        killed: Vec::new(),
        pickle_bytes: 0,
        disk_bytes: 0,
        disk_after_column: 0,
    };
    for _ in 0..frame.rounds {
        let plain = ok(
            &session,
            "_t = time.perf_counter(); _b = pickle.dumps(df, protocol=5); _d = time.perf_counter() - _t\n\
             _t = time.perf_counter(); pickle.loads(_b); _l = time.perf_counter() - _t\n\
             _n = len(_b); del _b\n\
             _t = time.perf_counter()\n\
             with open('plain.pickle', 'wb') as _f: pickle.dump(df, _f, protocol=5)\n\
             _w = time.perf_counter() - _t; import os; os.remove('plain.pickle'); del _t, _f\n\
             (_d, _l, _n, _w)",
        )
        .await;
        let parts: Vec<&str> = plain
            .trim_matches(|c| c == '(' || c == ')')
            .split(", ")
            .collect();
        figures.dumps.push(seconds(parts[0]));
        figures.loads.push(seconds(parts[1]));
        figures.pickle_bytes = parts[2].parse().unwrap();
        figures.dump_to_file.push(seconds(parts[3]));
        ok(&session, "del _d, _l, _n, _w").await;

        // Full: a copy of the frame is a new object, so every byte is pickled again.
        ok(&session, "df = df.copy()").await;
        let start = Instant::now();
        let taken = session.checkpoint().await.expect("a full checkpoint");
        figures.full.push(start.elapsed());
        figures.full_bytes = taken.state_bytes;

        for _ in 0..RETENTION {
            ok(&session, "k += 1").await;
            let start = Instant::now();
            let taken = session.checkpoint().await.expect("a small checkpoint");
            figures.small.push(start.elapsed());
            figures.small_bytes.push(taken.bytes);
        }
        // The retained checkpoints are now the last five, all with this frame.
        if frame.compressible {
            compressed(state_dir).await;
        }
        figures.disk_bytes = dir_bytes(&state_dir.join("sessions"));

        ok(&session, "df['f'] = df.index * 2").await;
        let start = Instant::now();
        let taken = session
            .checkpoint()
            .await
            .expect("a checkpoint after a new column");
        figures.column.push(start.elapsed());
        figures.column_bytes = taken.bytes;
        ok(&session, "del df['f']").await;
        session
            .checkpoint()
            .await
            .expect("a checkpoint without the column");

        // Restore: the frame rebound, then brought back from its blob.
        ok(&session, "_saved, df = df, None").await;
        let start = Instant::now();
        session.restore(None).await.expect("a restore");
        figures.restore.push(start.elapsed());
        ok(&session, "len(df)").await;

        let pid = session.info().await.unwrap().pid.expect("a live worker");
        let start = Instant::now();
        kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("kill the worker");
        loop {
            let result = session.run("len(df)").await.expect("the session answers");
            if result.status == ExecutionStatus::Ok {
                assert_eq!(result.result.unwrap().repr, rows);
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(120), "no recovery");
        }
        figures.killed.push(start.elapsed());
    }
    figures.disk_after_column = dir_bytes(&state_dir.join("sessions"));
    session.close().await.unwrap();
    figures
}

fn report(label: &str, f: &Figures) {
    let small_max = f.small_bytes.iter().copied().max().unwrap_or(0);
    println!("\n== {label} (pickle {} bytes)", f.pickle_bytes);
    println!(
        "{:<46} {:>10} {:>10} {:>8}  target",
        "", "p50 ms", "p99 ms", "ratio"
    );
    let base_dumps = p50(&f.dumps);
    let base_loads = p50(&f.loads);
    let row = |what: &str, samples: &[Duration], base: Option<f64>, target: &str| {
        let ratio = base.map_or(String::new(), |b| format!("{:.2}x", p50(samples) / b));
        println!(
            "{what:<46} {:>10.1} {:>10.1} {ratio:>8}  {target}",
            p50(samples),
            p99(samples)
        );
    };
    row("plain pickle.dumps (in memory)", &f.dumps, None, "");
    row("plain pickle.loads", &f.loads, None, "");
    row(
        "plain pickle.dump to a file",
        &f.dump_to_file,
        Some(base_dumps),
        "",
    );
    row(
        "full checkpoint, to disk",
        &f.full,
        Some(base_dumps),
        "<= 2x dumps",
    );
    println!(
        "{:<46} {:>31.2}x",
        "  full checkpoint / plain pickle.dump to a file",
        p50(&f.full) / p50(&f.dump_to_file)
    );
    row("checkpoint after k += 1", &f.small, None, "<= 20 ms");
    row(
        "checkpoint after a column added",
        &f.column,
        Some(base_dumps),
        "",
    );
    row(
        "restore of the frame",
        &f.restore,
        Some(base_loads),
        "<= 1.5x loads",
    );
    row("kill -9 to the answer with the frame", &f.killed, None, "");
    println!(
        "written: full {:.1} MB, after k += 1 at most {:.3} MB (target <= 1 MB), after a column {:.1} MB",
        f.full_bytes as f64 / 1e6,
        small_max as f64 / 1e6,
        f.column_bytes as f64 / 1e6
    );
    println!(
        "disk with {RETENTION} checkpoints of small changes retained: {:.1} MB = {:.2}x one copy of the data (target <= 1.3x)",
        f.disk_bytes as f64 / 1e6,
        f.disk_bytes as f64 / f.pickle_bytes as f64
    );
    println!(
        "disk at the end ({RETENTION} retained, the frame with and without a column): {:.1} MB = {:.2}x",
        f.disk_after_column as f64 / 1e6,
        f.disk_after_column as f64 / f.pickle_bytes as f64
    );
}

fn main() {
    let frames: Vec<Frame> = match std::env::var("PYVISOR_BENCH_FRAMES") {
        Ok(names) => names
            .split(',')
            .map(|name| match name.trim() {
                "flights" => Frame::flights(),
                megabytes => Frame::random(megabytes.parse().expect("flights or a size in MB")),
            })
            .collect(),
        Err(_) => vec![Frame::random(200), Frame::flights(), Frame::random(2000)],
    };
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        println!(
            "load average before: {}",
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
        );
        for frame in frames {
            let state_dir = tempfile::tempdir().expect("a state dir");
            let engine = Engine::start(EngineConfig {
                preload: vec!["pandas".into()],
                pool: PoolConfig {
                    min_idle: 1,
                    ..PoolConfig::default()
                },
                // Room for the frame, its plain pickle and its copy; the pool's own workers
                // (forked from the zygote) get it, as a session with default limits does.
                limits: SessionLimits {
                    memory_mb: Some(16 * 1024),
                    timeout: Duration::from_secs(600),
                    ..SessionLimits::default()
                },
                state: StateConfig {
                    dir: Some(state_dir.path().to_owned()),
                    retention: RETENTION,
                    auto: AutoCheckpoint {
                        after_changes: 0,
                        ..AutoCheckpoint::default()
                    },
                    ..StateConfig::default()
                },
                ..EngineConfig::default()
            })
            .await
            .expect("engine starts");
            let figures = measure(&engine, state_dir.path(), &frame).await;
            report(&frame.label, &figures);
            engine.shutdown(Duration::from_secs(30)).await.ok();
        }
    });
}
