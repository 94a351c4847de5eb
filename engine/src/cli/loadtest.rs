//! `pyvisor loadtest SCENARIO.toml [--json REPORT] [--compare BASE [--threshold R]]`: runs a
//! load-test scenario ([`crate::loadtest`]), prints the report, writes it as JSON, and
//! compares it with a baseline report figure by figure.
//!
//! Exit status: 0 when the run passed (no wrong answer, no lost state, every fault recovered)
//! and no figure is worse than the baseline by more than the threshold; 1 otherwise; 2 for a
//! bad scenario, an unreachable target or an unreadable baseline.

use std::path::PathBuf;

use clap::Args;

use super::EXIT_USAGE;
use pyvisor::loadtest::{self, LoadtestError, Scenario};

/// Arguments of `pyvisor loadtest`.
#[derive(Debug, Args)]
pub struct LoadtestArgs {
    /// The scenario file (TOML; see examples/loadtest/).
    #[arg(value_name = "SCENARIO")]
    scenario: PathBuf,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "REPORT")]
    json: Option<PathBuf>,
    /// A report of an earlier run (`--json`) to compare with.
    #[arg(long, value_name = "BASE")]
    compare: Option<PathBuf>,
    /// Fail when a figure is worse than the baseline's by more than this ratio.
    #[arg(
        long,
        default_value_t = 1.2,
        value_name = "RATIO",
        requires = "compare"
    )]
    threshold: f64,
}

pub async fn run(args: LoadtestArgs) -> u8 {
    if !(args.threshold.is_finite() && args.threshold >= 1.0) {
        eprintln!(
            "pyvisor: --threshold must be 1 or more, got {}",
            args.threshold
        );
        return EXIT_USAGE;
    }
    let baseline = match &args.compare {
        Some(path) => match std::fs::read_to_string(path)
            .map_err(|err| err.to_string())
            .and_then(|text| {
                serde_json::from_str::<serde_json::Value>(&text).map_err(|e| e.to_string())
            }) {
            Ok(base) => Some(base),
            Err(err) => {
                eprintln!("pyvisor: --compare {}: {err}", path.display());
                return EXIT_USAGE;
            }
        },
        None => None,
    };
    let report = match Scenario::from_file(&args.scenario) {
        Ok(scenario) => loadtest::run(&scenario).await,
        Err(err) => Err(err),
    };
    let report = match report {
        Ok(report) => report,
        Err(err @ (LoadtestError::Scenario(_) | LoadtestError::Target(_))) => {
            eprintln!("pyvisor: {}: {err}", args.scenario.display());
            return EXIT_USAGE;
        }
    };
    print!("{}", report.text());
    let json = serde_json::to_value(&report).expect("a report is plain JSON");
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&json).expect("a report is plain JSON");
        if let Err(err) = std::fs::write(path, text + "\n") {
            eprintln!("pyvisor: --json {}: {err}", path.display());
            return 1;
        }
    }
    let mut status = if report.passed() { 0 } else { 1 };
    if let Some(base) = baseline {
        println!(
            "\ncompared with {}:",
            args.compare.unwrap_or_default().display()
        );
        for figure in loadtest::compare(&base, &json) {
            let verdict = match figure.worse_by {
                Some(worse) if worse > args.threshold => {
                    status = 1;
                    "WORSE"
                }
                Some(_) => "",
                None => "(base 0)",
            };
            println!(
                "  {:<40} {:>12.3} -> {:>12.3}  x{:<8} {verdict}",
                figure.figure,
                figure.base,
                figure.new,
                figure
                    .worse_by
                    .map_or("-".to_owned(), |w| format!("{w:.2}")),
            );
        }
    }
    status
}
