//! The operations a client runs, with their weights, and how each is run and judged: an
//! operation fails (an error kind for the report) or answers wrongly (output of another
//! session, lines out of order), and says what the engine reported it recovered from.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::scenario::{Scenario, TargetSpec};
use super::target::Target;
use crate::{ExecutionResult, ExecutionStatus, Recovered};

/// One operation of the mix.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpSpec {
    pub kind: OpKind,
    /// Relative weight in the mix; more than 0.
    #[serde(default = "default_weight")]
    pub weight: f64,
    /// `execute`: the code, inline.
    #[serde(default)]
    pub code: Option<String>,
    /// `execute`: or a file holding it (relative to the scenario).
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// `print_flood`: bytes printed.
    #[serde(default)]
    pub bytes: Option<u64>,
    /// `interrupt`: seconds after which the long cell is interrupted.
    #[serde(default)]
    pub after_s: Option<f64>,
    /// `replay`: a directory of trace sequences (`*.json`, the training format).
    #[serde(default)]
    pub sequences: Option<PathBuf>,
    /// `replay`: the directory the cells read their files from.
    #[serde(default)]
    pub data: Option<PathBuf>,
}

fn default_weight() -> f64 {
    1.0
}

/// The kinds of operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// Runs code (`code` or `file`) in the client's session.
    Execute,
    /// Prints numbered lines totalling `bytes`, checked for order and origin.
    PrintFlood,
    /// An `input()` round trip, checked.
    Input,
    /// Creates a session, runs `1 + 1` in it, closes it.
    CreateClose,
    /// Checkpoints the client's session.
    Checkpoint,
    /// Checkpoints, changes nothing, restores that checkpoint.
    Restore,
    /// Starts a long cell and interrupts it after `after_s`.
    Interrupt,
    /// Runs one trace sequence in a new session working in `data`, then closes it.
    Replay,
}

impl OpKind {
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Execute => "execute",
            OpKind::PrintFlood => "print_flood",
            OpKind::Input => "input",
            OpKind::CreateClose => "create_close",
            OpKind::Checkpoint => "checkpoint",
            OpKind::Restore => "restore",
            OpKind::Interrupt => "interrupt",
            OpKind::Replay => "replay",
        }
    }
}

impl OpSpec {
    pub fn kind_name(&self) -> &'static str {
        self.kind.name()
    }

    /// Checks the fields the kind needs; a message naming the field otherwise.
    pub(super) fn validate(&self, scenario: &Scenario) -> Result<(), String> {
        if !(self.weight.is_finite() && self.weight > 0.0) {
            return Err(format!("weight: must be more than 0, got {}", self.weight));
        }
        match self.kind {
            OpKind::Execute => match (&self.code, &self.file) {
                (Some(_), None) => Ok(()),
                (None, Some(file)) => std::fs::metadata(scenario.resolve(file))
                    .map(drop)
                    .map_err(|err| format!("file: cannot read {}: {err}", file.display())),
                _ => Err("set exactly one of code and file".into()),
            },
            OpKind::PrintFlood => match self.bytes {
                Some(bytes) if bytes > 0 => Ok(()),
                _ => Err("bytes: must be set and more than 0".into()),
            },
            OpKind::Input if matches!(scenario.target, TargetSpec::Http { .. }) => {
                Err("the http target has no input round trip (use socket)".into())
            }
            OpKind::Interrupt => match self.after_s {
                Some(after) if after.is_finite() && after >= 0.0 => Ok(()),
                None => Ok(()),
                Some(after) => Err(format!("after_s: must be 0 or more, got {after}")),
            },
            OpKind::Replay => {
                let (Some(sequences), Some(data)) = (&self.sequences, &self.data) else {
                    return Err("set sequences and data".into());
                };
                if !scenario.resolve(data).is_dir() {
                    return Err(format!("data: {} is not a directory", data.display()));
                }
                match super::replay::load(&scenario.resolve(sequences)) {
                    Ok(found) if !found.is_empty() => Ok(()),
                    Ok(_) => Err(format!("sequences: no *.json in {}", sequences.display())),
                    Err(err) => Err(format!("sequences: {err}")),
                }
            }
            OpKind::Input | OpKind::CreateClose | OpKind::Checkpoint | OpKind::Restore => Ok(()),
        }
    }
}

/// What one operation came to.
#[derive(Debug, Default)]
pub struct OpOutcome {
    /// Why it failed, as a short kind.
    pub error: Option<String>,
    /// What was wrong with its answer.
    pub wrong: Option<String>,
    /// What the engine said it recovered from, on any result of the operation.
    pub recovered: Option<Recovered>,
}

impl OpOutcome {
    pub(super) fn failed(kind: impl Into<String>) -> Self {
        OpOutcome {
            error: Some(kind.into()),
            ..OpOutcome::default()
        }
    }

    /// Judges a result that must be `ok`; `expected` is its exact stdout, when known.
    fn from_result(result: Result<ExecutionResult, String>, expected: Option<&str>) -> Self {
        let result = match result {
            Ok(result) => result,
            Err(kind) => return OpOutcome::failed(kind),
        };
        let mut outcome = OpOutcome {
            recovered: result.recovered.clone(),
            ..OpOutcome::default()
        };
        if result.status != ExecutionStatus::Ok {
            outcome.error = Some(status_kind(&result));
        } else if let Some(expected) = expected.filter(|e| *e != result.stdout) {
            outcome.wrong = Some(format!(
                "stdout differs: expected {} bytes starting {:?}, got {} bytes starting {:?}",
                expected.len(),
                head(expected),
                result.stdout.len(),
                head(&result.stdout)
            ));
        }
        outcome
    }
}

/// `status` or `status:ErrorType`, as the report counts errors.
pub fn status_kind(result: &ExecutionResult) -> String {
    match &result.error {
        Some(error) => format!("{}:{}", result.status.as_str(), error.type_name),
        None => result.status.as_str().to_owned(),
    }
}

fn head(text: &str) -> String {
    text.chars().take(40).collect()
}

/// What an operation works with.
pub struct OpContext<'a> {
    pub target: &'a Target,
    pub scenario: &'a Scenario,
    /// The client's session.
    pub session: &'a str,
    /// Unique per operation: `c3-17`.
    pub tag: String,
}

/// Runs `op` and judges it.
pub async fn run(op: &OpSpec, cx: &OpContext<'_>) -> OpOutcome {
    let timeout = cx.scenario.timeout();
    match op.kind {
        OpKind::Execute => {
            let code = match (&op.code, &op.file) {
                (Some(code), _) => code.clone(),
                (None, Some(file)) => match std::fs::read_to_string(cx.scenario.resolve(file)) {
                    Ok(code) => code,
                    Err(err) => return OpOutcome::failed(format!("read code file: {err}")),
                },
                (None, None) => return OpOutcome::failed("no code"),
            };
            OpOutcome::from_result(cx.target.execute(cx.session, &code, timeout).await, None)
        }
        OpKind::PrintFlood => {
            let (code, expected) = flood(&cx.tag, op.bytes.unwrap_or(1));
            let result = cx.target.execute(cx.session, &code, timeout).await;
            OpOutcome::from_result(result, Some(&expected))
        }
        OpKind::Input => {
            let code = "__lt_in = input('say? ')\nprint(__lt_in[::-1])";
            let expected = format!("{}\n", cx.tag.chars().rev().collect::<String>());
            let result = (cx.target)
                .execute_with_input(cx.session, code, &cx.tag, timeout)
                .await;
            OpOutcome::from_result(result, Some(&expected))
        }
        OpKind::CreateClose => {
            let session = match cx.target.create(None, None).await {
                Ok(session) => session,
                Err(kind) => return OpOutcome::failed(format!("create: {kind}")),
            };
            let code = format!("print({:?})", cx.tag);
            let ran = cx.target.execute(&session, &code, timeout).await;
            let mut outcome = OpOutcome::from_result(ran, Some(&format!("{}\n", cx.tag)));
            if let Err(kind) = cx.target.close(&session).await {
                outcome.error.get_or_insert(format!("close: {kind}"));
            }
            outcome
        }
        OpKind::Checkpoint => match cx.target.checkpoint(cx.session).await {
            Ok(_) => OpOutcome::default(),
            Err(kind) => OpOutcome::failed(format!("checkpoint: {kind}")),
        },
        OpKind::Restore => {
            let id = match cx.target.checkpoint(cx.session).await {
                Ok(id) => id,
                Err(kind) => return OpOutcome::failed(format!("checkpoint: {kind}")),
            };
            match cx.target.restore(cx.session, &id).await {
                Ok(()) => OpOutcome::default(),
                Err(kind) => OpOutcome::failed(format!("restore: {kind}")),
            }
        }
        OpKind::Interrupt => interrupt(cx, op.after_s.unwrap_or(0.2)).await,
        OpKind::Replay => super::replay::run_one(cx, op).await,
    }
}

/// Code that prints numbered lines tagged `tag` totalling about `bytes`, and that output.
fn flood(tag: &str, bytes: u64) -> (String, String) {
    let line = format!("{tag} 0000000\n").len() as u64;
    let lines = bytes.div_ceil(line).max(1);
    let code = format!(
        "import sys\nfor __lt_i in range({lines}):\n    sys.stdout.write('%s %07d\\n' % ({tag:?}, __lt_i))"
    );
    let expected = (0..lines).map(|i| format!("{tag} {i:07}\n")).collect();
    (code, expected)
}

/// Starts `time.sleep(60)`, interrupts it after `after_s`, and expects `interrupted`.
async fn interrupt(cx: &OpContext<'_>, after_s: f64) -> OpOutcome {
    let long = cx.target.execute(
        cx.session,
        "import time\ntime.sleep(60)",
        Duration::from_secs(120),
    );
    let stop = async {
        tokio::time::sleep(Duration::from_secs_f64(after_s)).await;
        // The cell may still be queued behind another: ask until it is the one running.
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            match cx.target.interrupt(cx.session).await {
                Ok(true) => return Ok(()),
                Ok(false) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(kind) => return Err(kind),
            }
        }
        Err("nothing to interrupt within 30 s".to_owned())
    };
    // An execution that ends first (its worker or the daemon killed under it) leaves nothing
    // to interrupt: stop asking then, or the operation would count 30 s of asking.
    let mut long = std::pin::pin!(long);
    let (result, stopped) = tokio::select! {
        result = &mut long => (result, Ok(())),
        stopped = stop => (long.await, stopped),
    };
    let mut outcome = match result {
        Ok(result) => {
            let mut outcome = OpOutcome {
                recovered: result.recovered.clone(),
                ..OpOutcome::default()
            };
            if result.status != ExecutionStatus::Interrupted {
                outcome.error = Some(format!("not interrupted: {}", status_kind(&result)));
            }
            outcome
        }
        Err(kind) => OpOutcome::failed(kind),
    };
    if let Err(kind) = stopped {
        outcome.error.get_or_insert(format!("interrupt: {kind}"));
    }
    outcome
}
