//! `pyvisor memory eval CORPUS`: the real binary replays a small labelled corpus through a
//! real engine and reports precision, recall and the interruption rate the labels give; a
//! corpus it cannot read is a usage error.

use crate::common;

use common::{command, run, text};
use serde_json::{json, Value};

const SETUP: &str = "import pandas as pd\ndf = pd.DataFrame({'a': [1.0, None]})";

/// Three sessions of one owner failing with `fillna(method=...)` and fixing it: the third
/// failure expects an insight. A careful owner's sessions expect none.
fn labelled() -> Value {
    let mut sequences = Vec::new();
    for (i, name) in ["out", "frame", "filled"].iter().enumerate() {
        sequences.push(
            json!({"name": format!("habit-{i}"), "owner": "habit", "steps": [
                {"code": SETUP, "expect_insight": false, "label": "setup"},
                {"code": format!("{name} = df.fillna(method='ffill')"), "expect_insight": i >= 2,
                 "label": "fillna_method", "meta": {"approach": "fillna(method=)"}},
                {"code": "df = df.ffill()", "expect_insight": false, "label": "fillna_method_fix"},
            ]}),
        );
        sequences.push(
            json!({"name": format!("careful-{i}"), "owner": "careful", "steps": [
                {"code": SETUP, "expect_insight": false, "label": "setup"},
                {"code": format!("1 / {i}"), "expect_insight": false, "label": "one_off"},
            ]}),
        );
    }
    json!({"sequences": sequences})
}

#[test]
fn eval_reports_precision_recall_and_the_interruption_rate() {
    let home = tempfile::tempdir().unwrap();
    let corpus = home.path().join("corpus.json");
    std::fs::write(&corpus, labelled().to_string()).unwrap();
    let output = run(
        command(home.path()),
        "memory",
        &["eval", corpus.to_str().unwrap(), "--format", "json"],
        "",
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).expect("a JSON report");
    assert_eq!(report["sequences"], 6, "{report}");
    assert_eq!(report["executions"], 15);
    // Three fillna failures and the division by zero of careful-0.
    assert_eq!(report["failing"], 4, "{report}");
    assert_eq!(
        (report["expected"].as_u64(), report["shown"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(report["precision"], 1.0);
    assert_eq!(report["recall"], 1.0);
    assert_eq!(report["interruption_rate"], 0.25);

    let missing = run(
        command(home.path()),
        "memory",
        &["eval", "/nonexistent.json"],
        "",
    );
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing.stderr));
    assert!(text(&missing.stderr).contains("/nonexistent.json"));
}
