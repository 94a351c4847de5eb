//! Replays recorded notebook sequences through real workers and writes the facts of every
//! cell, one JSON line each, for tuning the proactive engine offline.
//!
//! ```sh
//! cargo run --release -p pyvisor-actors --example record_facts -- \
//!     SEQUENCES_DIR DATA_DIR OUT.jsonl [--limit N]
//! ```
//!
//! Each `*.json` file of SEQUENCES_DIR is one sequence (`{"name", "source", "data", "cells"}`,
//! the format `pyvisor replay` reads, docs/proactive.md); it runs in a fresh worker whose working directory is
//! DATA_DIR, every cell asked for its facts. Each line of OUT.jsonl is `{"sequence", "index",
//! "code", "status", "facts", "duration_ms"}`. `--limit N` stops after N sequences. At the end
//! the median and 99th percentile of the facts' own cost are printed.

use std::error::Error;
use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pyvisor_actors::worker::WorkerSpec;
use pyvisor_actors::worker::{install_worker_package, resolve_interpreter, Worker, WorkerEvent};
use pyvisor_actors::ProcessLimits;
use pyvisor_protocol::{CellFacts, HostMessage, Transaction, WorkerMessage, WorkerStatus};
use serde::{Deserialize, Serialize};

/// Longest a single cell may run before its sequence is abandoned.
const CELL_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Deserialize)]
struct Sequence {
    name: String,
    cells: Vec<String>,
}

#[derive(Serialize)]
struct Line<'a> {
    sequence: &'a str,
    index: usize,
    code: &'a str,
    status: &'static str,
    facts: Option<&'a CellFacts>,
    duration_ms: f64,
}

struct Args {
    sequences: PathBuf,
    data: PathBuf,
    out: PathBuf,
    limit: Option<usize>,
}

fn parse_args() -> Result<Args, String> {
    let usage = "usage: record_facts SEQUENCES_DIR DATA_DIR OUT.jsonl [--limit N]";
    let mut positional = Vec::new();
    let mut limit = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--limit" => {
                let value = args.next().ok_or(usage)?;
                limit = Some(value.parse().map_err(|_| format!("bad --limit {value}"))?);
            }
            "--data" => positional.insert(1.min(positional.len()), args.next().ok_or(usage)?),
            _ => positional.push(arg),
        }
    }
    let [sequences, data, out] = <[String; 3]>::try_from(positional).map_err(|_| usage)?;
    Ok(Args {
        sequences: sequences.into(),
        data: fs::canonicalize(&data).map_err(|e| format!("data directory {data}: {e}"))?,
        out: out.into(),
        limit,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let args = parse_args()?;
    let python = resolve_interpreter("python3")?;
    let script = install_worker_package(&std::env::temp_dir().join("pyvisor-record-facts"))?;
    let spec = WorkerSpec {
        python,
        script,
        cwd: Some(args.data.clone()),
        env: Vec::new(),
        handshake_timeout: Duration::from_secs(30),
        max_frame: pyvisor_protocol::DEFAULT_MAX_FRAME_BYTES,
        limits: ProcessLimits::default(),
        cgroups: None,
        janitor: None,
        preload: Vec::new(),
        zygote: None,
        sandbox: None,
        network: true,
    };
    let mut files: Vec<PathBuf> = fs::read_dir(&args.sequences)?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|path| path.extension().is_some_and(|ext| ext == "json"));
    files.sort();
    files.truncate(args.limit.unwrap_or(usize::MAX));
    let mut out = BufWriter::new(fs::File::create(&args.out)?);
    let mut costs = Vec::new();
    for path in &files {
        record_sequence(&spec, path, &mut out, &mut costs).await?;
    }
    out.flush()?;
    costs.sort_by(f64::total_cmp);
    let percentile = |p: f64| costs[((costs.len() - 1) as f64 * p).round() as usize];
    if costs.is_empty() {
        println!("no cells recorded");
    } else {
        println!(
            "{} cells of {} sequences: facts cost p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            costs.len(),
            files.len(),
            percentile(0.5),
            percentile(0.99),
            costs[costs.len() - 1],
        );
    }
    Ok(())
}

/// Runs the sequence in `path` in a fresh worker, writing one line per cell to `out`.
async fn record_sequence(
    spec: &WorkerSpec,
    path: &Path,
    out: &mut impl Write,
    costs: &mut Vec<f64>,
) -> Result<(), Box<dyn Error>> {
    let sequence: Sequence = serde_json::from_slice(&fs::read(path)?)?;
    let mut worker = Worker::start(spec).await?;
    for (index, code) in sequence.cells.iter().enumerate() {
        let started = Instant::now();
        worker.writer.send(&HostMessage::Execute {
            id: format!("c{index}"),
            code: code.clone(),
            repr_limit: 65536,
            transaction: Transaction::CommitAlways,
            facts: true,
            cell: None,
        })?;
        let Ok(reply) = tokio::time::timeout(CELL_TIMEOUT, result(&mut worker)).await else {
            eprintln!("{}: cell {index} timed out; rest skipped", sequence.name);
            break;
        };
        let Some((status, facts)) = reply else {
            eprintln!("{}: the worker died at cell {index}", sequence.name);
            break;
        };
        if let Some(facts) = &facts {
            costs.push(facts.cost_ms);
        }
        let line = Line {
            sequence: &sequence.name,
            index,
            code,
            status: match status {
                WorkerStatus::Ok => "ok",
                WorkerStatus::Error => "error",
            },
            facts: facts.as_deref(),
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
        };
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// The status of the next result and the facts that follow it; None when the worker is gone.
async fn result(worker: &mut Worker) -> Option<(WorkerStatus, Option<Box<CellFacts>>)> {
    let mut status = None;
    loop {
        match worker.events.recv().await? {
            WorkerEvent::Message(WorkerMessage::Result { status: ended, .. }) => {
                status = Some(ended);
            }
            WorkerEvent::Message(WorkerMessage::Facts { facts, .. }) => {
                return status.map(|status| (status, facts));
            }
            WorkerEvent::Exited(_) | WorkerEvent::ProtocolError(_) => return None,
            _ => {}
        }
    }
}
