//! `pyvisor replay` through the real binary, on real analysis sequences copied from the
//! training traces (tests/data/traces): with `--verify`, every answer equals a real run's,
//! and speculation answers at least a floor share of the cells; bad input is a usage error.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::{text, Daemon, NO_DAEMON};
use serde_json::Value;

/// Share of the cells after the first of each sequence that speculation must answer. Set
/// below what these sequences measure (see the README's proactive figures), so that a slow
/// machine passes and a broken predictor or cache does not.
const SERVED_FLOOR: f64 = 0.22;

fn traces() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/traces")
}

/// `pyvisor replay` in an embedded engine that speculates whatever the machine's load (tests
/// run side by side) with half a core.
fn replay(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pyvisor"));
    command
        .env("PYVISOR_SERVER__SOCKET", NO_DAEMON)
        .env("PYVISOR_PROACTIVE__YIELD_TO_LOAD", "false")
        .env("PYVISOR_PROACTIVE__CPU_BUDGET", "0.5");
    common::run(command, "replay", args, "")
}

fn report(output: &Output) -> Value {
    serde_json::from_str(&text(&output.stdout))
        .unwrap_or_else(|err| panic!("{err}: {}\n{}", text(&output.stdout), text(&output.stderr)))
}

#[test]
fn replayed_sequences_are_answered_ahead_and_exactly() {
    let traces = traces();
    let sequences = traces.join("sequences");
    let data = traces.join("data");
    let output = replay(&[
        sequences.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--think",
        "0.4",
        "--verify",
        "--format",
        "json",
    ]);
    let report = report(&output);
    assert_eq!(
        report["differences"],
        Value::Array(Vec::new()),
        "{report:#}"
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(report["cells"], 125);
    let served = report["served_share"].as_f64().unwrap();
    assert!(served >= SERVED_FLOOR, "{report:#}");
    assert!(report["hit_ms"]["count"].as_u64().unwrap() > 0);
}

#[test]
fn replay_through_the_daemon_matches_real_runs() {
    let daemon = tokio::runtime::Runtime::new()
        .expect("a runtime")
        .block_on(Daemon::start_with(
            &[],
            &[("PYVISOR_PROACTIVE__YIELD_TO_LOAD", "false")],
        ));
    let traces = traces();
    let sequence =
        traces.join("sequences/aeturrell.coding-for-economists--data-analysis-quickstart.json");
    let data = traces.join("data");
    let output = common::run_in(
        &daemon,
        "replay",
        &[
            sequence.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--think",
            "0.2",
            "--verify",
            "--socket",
            daemon.socket.to_str().unwrap(),
            "--format",
            "json",
        ],
        "",
    );
    let report = report(&output);
    assert_eq!(
        report["differences"],
        Value::Array(Vec::new()),
        "{report:#}"
    );
    assert_eq!(report["cells"], 18);
    assert_eq!(output.status.code(), Some(0));
}

#[test]
fn bad_sequences_and_directories_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let missing = replay(&["/nonexistent/sequence.json", "--data", data]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing.stderr));
    let malformed = dir.path().join("broken.json");
    std::fs::write(&malformed, "{\"cells\": 3}").unwrap();
    let output = replay(&[malformed.to_str().unwrap(), "--data", data]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("not a sequence"),
        "{}",
        text(&output.stderr)
    );
    let no_data = replay(&[malformed.to_str().unwrap(), "--data", "/nonexistent"]);
    assert_eq!(no_data.status.code(), Some(2));
    assert!(text(&no_data.stderr).contains("not a directory"));
}
