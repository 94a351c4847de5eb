//! `pyvisor memory eval CORPUS`: replays a labelled corpus (see
//! `scripts/memory-eval/generate.py`) through a real embedded engine, one session per
//! sequence under the sequence's owner, in corpus order, and reports how the insights on the
//! results compare with the labels: precision, recall and the interruption rate (insights per
//! failing execution). The engine takes the configuration as `pyvisor serve` would (its
//! `[memory]` settings included) with a fresh state directory, removed afterwards, and without
//! proactive computation.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

use super::drive::print_json_report;
use super::EXIT_USAGE;
use pyvisor::config::Settings;
use pyvisor::{
    Engine, EngineConfig, ExecuteRequest, ExecutionMeta, ExecutionStatus, SessionOptions,
};

/// `pyvisor memory ...`.
#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// Replay a labelled corpus and report the precision, recall and interruption rate of the
    /// insights.
    Eval(EvalArgs),
}

/// Arguments of `pyvisor memory eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The corpus (JSON, as `scripts/memory-eval/generate.py` writes it).
    #[arg(value_name = "CORPUS")]
    corpus: PathBuf,
    /// `text` prints a summary; `json` prints the report as one JSON object.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(Debug, Deserialize)]
struct Corpus {
    sequences: Vec<Sequence>,
}

#[derive(Debug, Deserialize)]
struct Sequence {
    name: String,
    owner: String,
    steps: Vec<Step>,
}

#[derive(Debug, Deserialize)]
struct Step {
    code: String,
    expect_insight: bool,
    label: String,
    #[serde(default)]
    meta: Option<ExecutionMeta>,
}

/// What the replay found.
#[derive(Debug, Default, Serialize)]
struct Report {
    sequences: usize,
    executions: usize,
    failing: usize,
    expected: usize,
    shown: usize,
    true_positives: usize,
    precision: f64,
    recall: f64,
    interruption_rate: f64,
    /// Per label: (expected, shown, shown where expected).
    by_label: BTreeMap<String, (usize, usize, usize)>,
    /// Insights where none was expected: sequence, label, code.
    false_positives: Vec<(String, String, String)>,
    seconds: f64,
}

pub async fn run(command: MemoryCommand) -> u8 {
    let MemoryCommand::Eval(args) = command;
    let corpus: Corpus = match std::fs::read(&args.corpus)
        .map_err(|err| err.to_string())
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|err| err.to_string()))
    {
        Ok(corpus) => corpus,
        Err(err) => {
            eprintln!("pyvisor: read {}: {err}", args.corpus.display());
            return EXIT_USAGE;
        }
    };
    match eval(&corpus).await {
        Ok(report) => {
            report.print(args.format);
            0
        }
        Err(err) => {
            eprintln!("pyvisor: memory eval: {err}");
            1
        }
    }
}

async fn eval(corpus: &Corpus) -> Result<Report, String> {
    let started = std::time::Instant::now();
    let settings = Settings::load(None)
        .map_err(|err| format!("load the configuration: {err}"))?
        .settings;
    if !settings.memory.enabled {
        return Err("memory is disabled ([memory] enabled = false)".into());
    }
    let state = tempfile::Builder::new()
        .prefix("pyvisor-memory-eval-")
        .tempdir()
        .map_err(|err| format!("create a state directory: {err}"))?;
    let mut config: EngineConfig = settings.engine_config();
    config.state.dir = Some(state.path().to_owned());
    config.proactive.enabled = false;
    // Checkpoints play no part here; none are taken unless asked.
    config.state.auto.after_changes = 0;
    if !config.preload.iter().any(|module| module == "pandas") {
        config.preload.push("pandas".into());
    }
    let engine = Engine::start(config)
        .await
        .map_err(|err| format!("start an engine: {err}"))?;
    let mut report = Report {
        sequences: corpus.sequences.len(),
        ..Report::default()
    };
    for sequence in &corpus.sequences {
        let options = SessionOptions {
            owner: Some(sequence.owner.clone()),
            ..SessionOptions::default()
        };
        let session = engine
            .create_session(options)
            .await
            .map_err(|err| format!("{}: create a session: {err}", sequence.name))?;
        for step in &sequence.steps {
            let mut request = ExecuteRequest::new(step.code.clone());
            request.meta = step.meta.clone();
            let result = session
                .run(request)
                .await
                .map_err(|err| format!("{}: run: {err}", sequence.name))?;
            report.count(sequence, step, result.status, !result.insights.is_empty());
        }
        session
            .close()
            .await
            .map_err(|err| format!("{}: close: {err}", sequence.name))?;
    }
    report.finish(started.elapsed().as_secs_f64());
    Ok(report)
}

impl Report {
    fn count(&mut self, sequence: &Sequence, step: &Step, status: ExecutionStatus, shown: bool) {
        self.executions += 1;
        self.failing += usize::from(status != ExecutionStatus::Ok);
        self.expected += usize::from(step.expect_insight);
        self.shown += usize::from(shown);
        self.true_positives += usize::from(shown && step.expect_insight);
        let label = self.by_label.entry(step.label.clone()).or_default();
        label.0 += usize::from(step.expect_insight);
        label.1 += usize::from(shown);
        label.2 += usize::from(shown && step.expect_insight);
        if shown && !step.expect_insight {
            self.false_positives.push((
                sequence.name.clone(),
                step.label.clone(),
                step.code.clone(),
            ));
        }
    }

    fn finish(&mut self, seconds: f64) {
        let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        self.precision = ratio(self.true_positives, self.shown);
        self.recall = ratio(self.true_positives, self.expected);
        self.interruption_rate = ratio(self.shown, self.failing);
        self.seconds = seconds;
    }

    fn print(&self, format: Format) {
        if format == Format::Json {
            print_json_report(self);
            return;
        }
        println!(
            "{} sequences, {} executions ({} failing) in {:.1} s",
            self.sequences, self.executions, self.failing, self.seconds
        );
        println!(
            "insights: {} shown, {} expected, {} both",
            self.shown, self.expected, self.true_positives
        );
        println!(
            "precision {:.1}%  recall {:.1}%  interruption rate {:.1}% of failing executions",
            self.precision * 100.0,
            self.recall * 100.0,
            self.interruption_rate * 100.0
        );
        println!("by label (expected / shown / shown where expected):");
        for (label, (expected, shown, both)) in &self.by_label {
            if *expected + *shown > 0 {
                println!("  {label:<24} {expected:>4} {shown:>4} {both:>4}");
            }
        }
        for (sequence, label, code) in &self.false_positives {
            let first = code.lines().next().unwrap_or_default();
            println!("unexpected insight: {sequence} [{label}] {first}");
        }
    }
}
