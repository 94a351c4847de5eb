//! `pyvisor replay`: replays recorded analysis sessions through an engine, one session per
//! sequence, with a pause between cells as a person (or an agent) would leave, and reports how
//! much proactive computation answered ahead of the request: the share of cells served from
//! speculation, hit and miss latency, the CPU speculation used and the cache's peak size.
//! With `--verify`, a twin session without proactive computation runs every cell too, and any
//! answer that differs is listed (object addresses, `0x7f...`, aside: they differ between any two
//! processes): there must be none. Every session first seeds Python's and
//! numpy's random generators alike (without binding a name), so that code that samples
//! (`df.sample(5)`) answers the same in both.
//!
//! A sequence is a JSON file `{"name", "cells": [code, ...], ...}` (the training traces'
//! format); its cells run with `--data` as the working directory.

mod report;
mod target;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Deserialize;

use super::EXIT_USAGE;
use report::{Difference, Format, Report};
use target::Target;

/// Arguments of `pyvisor replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Sequence files, or directories of them (`*.json`).
    #[arg(required = true, value_name = "SEQUENCES")]
    sequences: Vec<PathBuf>,
    /// The directory the cells read their files from (their working directory).
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// Seconds between the end of one cell and the request of the next.
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    think: f64,
    /// Run the sessions without proactive computation (the baseline).
    #[arg(long)]
    no_proactive: bool,
    /// Run a twin session without proactive computation beside each one and list every
    /// answer that differs.
    #[arg(long)]
    verify: bool,
    /// Replay through the daemon at this socket instead of an embedded engine.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// `text` prints a summary; `json` prints the report as one JSON object.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// Run in every session before its first cell, and not counted: the same random state in a
/// session and its twin.
const SEED: &str = "__import__('random').seed(0)\n\
                    try:\n    __import__('numpy').random.seed(0)\n\
                    except ImportError:\n    pass";

/// One recorded analysis session.
#[derive(Debug, Deserialize)]
struct Sequence {
    name: String,
    cells: Vec<String>,
}

pub async fn run(args: ReplayArgs) -> u8 {
    let think = match Duration::try_from_secs_f64(args.think) {
        Ok(think) => think,
        Err(_) => {
            eprintln!(
                "pyvisor: --think must be 0 or more seconds, got {}",
                args.think
            );
            return EXIT_USAGE;
        }
    };
    if !args.data.is_dir() {
        eprintln!("pyvisor: --data {} is not a directory", args.data.display());
        return EXIT_USAGE;
    }
    let sequences = match load_sequences(&args.sequences) {
        Ok(sequences) if !sequences.is_empty() => sequences,
        Ok(_) => {
            eprintln!("pyvisor: no sequence files (*.json) found");
            return EXIT_USAGE;
        }
        Err(reason) => {
            eprintln!("pyvisor: {reason}");
            return EXIT_USAGE;
        }
    };
    let target = match Target::open(args.socket.as_deref()).await {
        Ok(target) => target,
        Err(reason) => {
            eprintln!("pyvisor: {reason}");
            return 1;
        }
    };
    let data = match args.data.canonicalize() {
        Ok(data) => data,
        Err(err) => {
            eprintln!("pyvisor: --data {}: {err}", args.data.display());
            return EXIT_USAGE;
        }
    };
    let replay = Replay {
        target: &target,
        data: &data,
        think,
        proactive: !args.no_proactive,
        verify: args.verify,
    };
    let report = match replay.all(&sequences).await {
        Ok(report) => report,
        Err(reason) => {
            eprintln!("pyvisor: replay failed: {reason}");
            return 1;
        }
    };
    report.print(args.format);
    if report.differences.is_empty() {
        0
    } else {
        1
    }
}

/// The sequences in `paths` (files, or directories of `*.json`), in name order per directory.
fn load_sequences(paths: &[PathBuf]) -> Result<Vec<Sequence>, String> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let entries =
                std::fs::read_dir(path).map_err(|err| format!("read {}: {err}", path.display()))?;
            let mut found: Vec<PathBuf> = entries
                .filter_map(|entry| entry.ok().map(|entry| entry.path()))
                .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    files.iter().map(|file| read_sequence(file)).collect()
}

fn read_sequence(file: &Path) -> Result<Sequence, String> {
    let text =
        std::fs::read_to_string(file).map_err(|err| format!("read {}: {err}", file.display()))?;
    serde_json::from_str(&text).map_err(|err| format!("{}: not a sequence: {err}", file.display()))
}

/// One replay run.
struct Replay<'a> {
    target: &'a Target,
    data: &'a Path,
    think: Duration,
    proactive: bool,
    verify: bool,
}

impl Replay<'_> {
    async fn all(&self, sequences: &[Sequence]) -> Result<Report, String> {
        let started = Instant::now();
        let before = self.target.proactive_stats().await?;
        let mut report = Report::default();
        let total: usize = sequences.iter().map(|s| s.cells.len()).sum();
        for (number, sequence) in sequences.iter().enumerate() {
            self.one(sequence, &mut report).await?;
            eprint!(
                "\rpyvisor replay: {}/{} sequences, {}/{} cells, {} answered ahead",
                number + 1,
                sequences.len(),
                report.cells,
                total,
                report.served
            );
        }
        eprintln!();
        let after = self.target.proactive_stats().await?;
        report.finish(&before, &after, started.elapsed());
        Ok(report)
    }

    async fn one(&self, sequence: &Sequence, report: &mut Report) -> Result<(), String> {
        let session = self.target.create(self.proactive, self.data).await?;
        let twin = match self.verify {
            true => Some(self.target.create(false, self.data).await?),
            false => None,
        };
        for seeded in [Some(&session), twin.as_ref()].into_iter().flatten() {
            self.target.execute(seeded, SEED).await?;
        }
        for (index, code) in sequence.cells.iter().enumerate() {
            if index > 0 {
                tokio::time::sleep(self.think).await;
            }
            // With a twin, every other cell runs in the twin first, so that the pause before
            // a request, which costs a cold start of its own, falls on each alike.
            let twin_first = index % 2 == 1;
            let real_before = match (&twin, twin_first) {
                (Some(twin), true) => Some(self.timed(twin, code).await?),
                _ => None,
            };
            let (answer, latency) = self.timed(&session, code).await?;
            report.cell(index == 0, answer.from_cache, latency);
            report.sample_cache(self.target.proactive_stats().await?.cache_bytes);
            let Some(twin) = &twin else {
                continue;
            };
            let (real, real_latency) = match real_before {
                Some(before) => before,
                None => self.timed(twin, code).await?,
            };
            if !answer.from_cache {
                report.twin_miss(real_latency);
            }
            if let Some(difference) = Difference::between(&sequence.name, index, &answer, &real) {
                report.differences.push(difference);
            }
        }
        self.target.close(&session).await?;
        if let Some(twin) = &twin {
            self.target.close(twin).await?;
        }
        Ok(())
    }

    /// Runs `code` in `session`: its result and how long the caller waited for it.
    async fn timed(
        &self,
        session: &target::Replayed,
        code: &str,
    ) -> Result<(pyvisor::ExecutionResult, Duration), String> {
        let asked = Instant::now();
        let answer = self.target.execute(session, code).await?;
        Ok((answer, asked.elapsed()))
    }
}
