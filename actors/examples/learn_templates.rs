//! Learns the predictor's template table from the training corpus.
//!
//! ```sh
//! cargo run --release -p pyvisor-actors --example learn_templates -- \
//!     CORPUS/sequences --out actors/src/proactive/predict/templates.json \
//!     [--hold-out owner.repo,...] [--vocabulary EXAMPLES.jsonl]
//! ```
//!
//! The input is a folder of training sequences (facts read from the code, CSV headers from
//! the `data` folder beside it) or a facts trace (`.jsonl`, one executed cell a line).
//! Sequences of held-out repositories are left out of the counts. The table holds the
//! counts and the ranker's weights, fitted on guesses for each group of repositories made
//! with a table counted without them (`train.rs`); the weights are printed. `--vocabulary`
//! takes code that is not sessions, in the same trace format (the documented examples of
//! pandas, written by `scripts/pandas-examples.py`): it adds to the vocabulary of edits only.

use std::path::PathBuf;
use std::process::ExitCode;

use pyvisor_actors::proactive::predict::offline::{load, repository, TraceCell};
use pyvisor_actors::proactive::predict::{train, Limits, FEATURE_NAMES};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut input: Option<PathBuf> = None;
    let mut out: Option<PathBuf> = None;
    let mut hold_out: Vec<String> = Vec::new();
    let mut vocabulary_path: Option<PathBuf> = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--out" => out = args.next().map(PathBuf::from),
            "--vocabulary" => vocabulary_path = args.next().map(PathBuf::from),
            "--hold-out" => {
                hold_out = args
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .map(str::to_string)
                    .collect()
            }
            _ if input.is_none() => input = Some(PathBuf::from(arg)),
            _ => return usage(&format!("unexpected argument {arg}")),
        }
    }
    let (Some(input), Some(out)) = (input, out) else {
        return usage("an input and --out are needed");
    };
    let sequences = match load(&input) {
        Ok(s) => s,
        Err(e) => return usage(&format!("failed to read {}: {e}", input.display())),
    };
    let vocabulary = match vocabulary_path.as_deref().map(load).transpose() {
        Ok(v) => v.unwrap_or_default(),
        Err(e) => return usage(&format!("failed to read the vocabulary: {e}")),
    };
    let kept: Vec<Vec<TraceCell>> = sequences
        .iter()
        .filter(|cells| {
            !cells
                .first()
                .is_some_and(|c| hold_out.iter().any(|h| h == repository(&c.sequence)))
        })
        .cloned()
        .collect();
    let used = kept.len();
    let table = train(&kept, &vocabulary, &Limits::default());
    let json = match serde_json::to_string_pretty(&table) {
        Ok(j) => j,
        Err(e) => return usage(&format!("failed to serialise the table: {e}")),
    };
    if let Err(e) = std::fs::write(&out, json.as_bytes()) {
        return usage(&format!("failed to write {}: {e}", out.display()));
    }
    if let Some(ranker) = &table.ranker {
        for (name, weight) in FEATURE_NAMES.iter().zip(&ranker.weights) {
            eprintln!("ranker: {weight:>8.4}  {name}");
        }
    }
    let followers: usize = table.next.values().map(|f| f.top.len()).sum();
    eprintln!(
        "{used} of {} sequences, {} cells: {} contexts, {followers} followers, {} bytes",
        sequences.len(),
        table.cells,
        table.next.len(),
        json.len()
    );
    ExitCode::SUCCESS
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("learn_templates: {problem}");
    eprintln!(
        "usage: learn_templates SEQUENCES_DIR|FACTS.jsonl --out TABLE.json [--hold-out REPO,...] [--vocabulary EXAMPLES.jsonl]"
    );
    ExitCode::from(2)
}
