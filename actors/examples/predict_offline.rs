//! Measures the predictor on recorded sessions: the share of all cells whose normal form is
//! among the top K guesses made before it.
//!
//! ```sh
//! cargo run --release -p pyvisor-actors --example predict_offline -- \
//!     /tmp/facts-train.jsonl --hold-out owner.repo,... [--k 10,30,60] [--table TABLE.json] \
//!     [--vocabulary EXAMPLES.jsonl]
//! ```
//!
//! Without `--table`, the table is learned from the input's sequences that are not held out
//! (and the vocabulary of edits also from `--vocabulary`, as `learn_templates` takes it), so
//! held-out figures are honest; with no `--hold-out` they are in-sample.

use std::path::PathBuf;
use std::process::ExitCode;

use pyvisor_actors::proactive::predict::offline::{load, repository, TraceCell};
use pyvisor_actors::proactive::predict::{
    evaluate, folds_by_repository, train, Coverage, Learned, Limits, SessionModel, Table,
};

/// Guesses speculated per idle gap, whose outcomes are recorded.
const OFFERED: usize = 30;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut input: Option<PathBuf> = None;
    let mut table_path: Option<PathBuf> = None;
    let mut hold_out: Vec<String> = Vec::new();
    let mut ks: Vec<usize> = vec![10, 30, 60];
    let mut show_misses = 0;
    let mut folds = 0usize;
    let mut explain: Option<String> = None;
    let mut vocabulary_path: Option<PathBuf> = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--table" => table_path = args.next().map(PathBuf::from),
            "--vocabulary" => vocabulary_path = args.next().map(PathBuf::from),
            "--hold-out" => hold_out = list(args.next()),
            "--folds" => folds = args.next().and_then(|n| n.parse().ok()).unwrap_or(0),
            "--explain" => explain = args.next(),
            "--misses" => show_misses = args.next().and_then(|n| n.parse().ok()).unwrap_or(0),
            "--k" => {
                ks = list(args.next())
                    .iter()
                    .filter_map(|k| k.parse().ok())
                    .collect()
            }
            _ if input.is_none() => input = Some(PathBuf::from(arg)),
            _ => return usage(&format!("unexpected argument {arg}")),
        }
    }
    let Some(input) = input else {
        return usage("an input is needed");
    };
    let sequences = match load(&input) {
        Ok(s) => s,
        Err(e) => return usage(&format!("failed to read {}: {e}", input.display())),
    };
    let vocabulary = match vocabulary_path.as_deref().map(load).transpose() {
        Ok(v) => v.unwrap_or_default(),
        Err(e) => return usage(&format!("failed to read the vocabulary: {e}")),
    };
    if let Some(at) = explain {
        let k = ks.iter().copied().max().unwrap_or(60);
        return explain_cell(&sequences, &vocabulary, &hold_out, &at, k);
    }
    if folds > 1 {
        let folded = cross_validate(&sequences, &vocabulary, folds, &ks);
        report(&format!("{folds}-fold by repository"), &folded, &ks);
        show(&folded, show_misses);
        return ExitCode::SUCCESS;
    }
    let held = |cells: &&Vec<TraceCell>| {
        cells
            .first()
            .is_some_and(|c| hold_out.iter().any(|h| h == repository(&c.sequence)))
    };
    let (test, training_set): (Vec<Vec<TraceCell>>, Vec<Vec<TraceCell>>) =
        sequences.iter().cloned().partition(|c| held(&c));
    let table = match table_path {
        Some(path) => match std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<Table>(&t).map_err(|e| e.to_string()))
        {
            Ok(t) => t,
            Err(e) => return usage(&format!("failed to read {}: {e}", path.display())),
        },
        None => train(&training_set, &vocabulary, &Limits::default()),
    };
    let mut learned = Learned::new();
    let training = evaluate(&training_set, &table, &mut learned, &ks, OFFERED);
    report("training repositories", &training, &ks);
    if !test.is_empty() {
        let mut learned = Learned::new();
        let held_out = evaluate(&test, &table, &mut learned, &ks, OFFERED);
        report("held-out repositories", &held_out, &ks);
        show(&held_out, show_misses);
    }
    ExitCode::SUCCESS
}

/// Splits the repositories into `folds` groups; each group is evaluated with a table
/// learned from the others, and the figures are summed.
fn cross_validate(
    sequences: &[Vec<TraceCell>],
    vocabulary: &[Vec<TraceCell>],
    folds: usize,
    ks: &[usize],
) -> Coverage {
    let fold_of = folds_by_repository(sequences, folds);
    let mut total = Coverage::default();
    for fold in 0..folds {
        let pick = |in_fold: bool| -> Vec<Vec<TraceCell>> {
            sequences
                .iter()
                .zip(&fold_of)
                .filter(|(_, f)| (**f == fold) == in_fold)
                .map(|(cells, _)| cells.clone())
                .collect()
        };
        let table = train(&pick(false), vocabulary, &Limits::default());
        let part = evaluate(&pick(true), &table, &mut Learned::new(), ks, OFFERED);
        total.cells += part.cells;
        total.single += part.single;
        for (k, n) in part.covered {
            *total.covered.entry(k).or_default() += n;
        }
        for (k, sources) in part.by_source {
            for (source, n) in sources {
                *total
                    .by_source
                    .entry(k)
                    .or_default()
                    .entry(source)
                    .or_default() += n;
            }
        }
        total.misses.extend(part.misses);
        total.predict_calls += part.predict_calls;
        total.predict_time += part.predict_time;
        total.predict_slowest = total.predict_slowest.max(part.predict_slowest);
    }
    total
}

fn report(title: &str, coverage: &Coverage, ks: &[usize]) {
    println!(
        "{title}: {} cells, {} single expressions ({:.1}%)",
        coverage.cells,
        coverage.single,
        100.0 * coverage.single as f64 / coverage.cells.max(1) as f64
    );
    println!(
        "  predict: {:.3} ms a call on average, {:.3} ms at most ({} calls)",
        coverage.predict_time.as_secs_f64() * 1e3 / coverage.predict_calls.max(1) as f64,
        coverage.predict_slowest.as_secs_f64() * 1e3,
        coverage.predict_calls
    );
    for k in ks {
        let sources: Vec<String> = coverage.by_source[k]
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect();
        println!(
            "  coverage@{k}: {:.1}% ({} cells; {})",
            100.0 * coverage.share(*k),
            coverage.covered.get(k).copied().unwrap_or(0),
            sources.join(", ")
        );
    }
}

fn show(coverage: &Coverage, misses: usize) {
    for (at, before, cell) in coverage.misses.iter().take(misses) {
        println!("--- {at} missed after:\n{before}\n>>> {cell}");
    }
}

/// Prints the first `k` guesses before cell `SEQUENCE:INDEX`, with a table learned from the
/// repositories not in `hold_out` (from the other repositories when it is empty), and the
/// facts of the objects the session holds.
fn explain_cell(
    sequences: &[Vec<TraceCell>],
    vocabulary: &[Vec<TraceCell>],
    hold_out: &[String],
    at: &str,
    k: usize,
) -> ExitCode {
    let Some((name, index)) = at
        .rsplit_once(':')
        .and_then(|(n, i)| Some((n, i.parse::<usize>().ok()?)))
    else {
        return usage("--explain takes SEQUENCE:INDEX");
    };
    let Some(cells) = sequences
        .iter()
        .find(|c| c.first().is_some_and(|c| c.sequence == name))
    else {
        return usage(&format!("no sequence {name}"));
    };
    let learned_from = |repo: &str| match hold_out {
        [] => repo != repository(name),
        _ => !hold_out.iter().any(|h| h == repo),
    };
    let others: Vec<Vec<TraceCell>> = sequences
        .iter()
        .filter(|c| {
            c.first()
                .is_some_and(|c| learned_from(repository(&c.sequence)))
        })
        .cloned()
        .collect();
    let table = train(&others, vocabulary, &Limits::default());
    let mut model = SessionModel::new();
    for cell in cells.iter().take(index) {
        model.observe(&cell.code, &cell.facts, cell.ok());
    }
    for name in model.recent_objects() {
        if let Some(object) = model.object(name) {
            let columns: Vec<String> = object
                .columns
                .iter()
                .map(|c| format!("{}:{}:{}", c.name, c.dtype, c.distinct))
                .collect();
            println!(
                "object {name} {} {:?} [{}]",
                object.kind,
                object.shape,
                columns.join(" ")
            );
        }
    }
    for guess in model.predict(&table, &Learned::new(), k) {
        println!(
            "{:.4} {:<9} {:<40} {}",
            guess.probability,
            guess.source.as_str(),
            guess.template,
            guess.code
        );
    }
    if let Some(cell) = cells.get(index) {
        println!(">>> {}", cell.code);
    }
    ExitCode::SUCCESS
}

fn list(arg: Option<String>) -> Vec<String> {
    arg.unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("predict_offline: {problem}");
    eprintln!("usage: predict_offline FACTS.jsonl|SEQUENCES_DIR [--hold-out REPO,...] [--k 10,30,60] [--table TABLE.json] [--vocabulary EXAMPLES.jsonl] [--misses N] [--folds N] [--explain SEQUENCE:INDEX]");
    ExitCode::from(2)
}
