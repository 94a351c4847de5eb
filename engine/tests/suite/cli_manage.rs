//! The commands that manage and watch a running daemon, through the real binary: `pyvisor
//! session …`, `pyvisor top --once`, `pyvisor logs [-f]`, `session.complete` over the socket,
//! and `pyvisor exec --save DIR` for rich output.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{text, Daemon, NO_DAEMON};
use serde_json::{json, Value};

fn daemon() -> Daemon {
    runtime().block_on(Daemon::start())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("a runtime")
}

/// `pyvisor ARGS…` against `daemon`.
fn pyvisor(daemon: &Daemon, args: &[&str]) -> Output {
    common::run_in(daemon, args[0], &args[1..], "")
}

/// `pyvisor ARGS…` that must succeed; its stdout.
fn ok(daemon: &Daemon, args: &[&str]) -> String {
    let out = pyvisor(daemon, args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// `pyvisor ARGS… --format json` that must succeed; its one JSON value.
fn json_of(daemon: &Daemon, args: &[&str]) -> Value {
    let args = [args, &["--format", "json"]].concat();
    serde_json::from_str(&ok(daemon, &args)).expect("one JSON value")
}

#[test]
fn session_commands_manage_the_daemons_sessions() {
    let daemon = daemon();
    ok(&daemon, &["exec", "--session", "nb", "x = 41\nimport math"]);
    let listed = ok(&daemon, &["session", "list"]);
    assert!(listed.starts_with("ID "), "{listed}");
    assert!(listed.contains(" nb "), "{listed}");
    let sessions = json_of(&daemon, &["session", "list"]);
    let nb = sessions
        .as_array()
        .unwrap()
        .iter()
        .find(|session| session["name"] == "nb")
        .expect("nb is listed");
    let id = nb["session_id"].as_str().unwrap().to_owned();

    let info = ok(&daemon, &["session", "info", "nb"]);
    assert!(info.contains(&format!("session      {id}")), "{info}");
    assert!(info.contains("x         int"), "{info}");
    let info = json_of(&daemon, &["session", "info", &id]);
    assert_eq!(info["name"], "nb");
    assert!(info["variables"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v["name"] == "math"));

    let taken = json_of(&daemon, &["session", "checkpoint", "nb"]);
    let checkpoint = taken["checkpoint_id"].as_str().unwrap().to_owned();
    assert!(taken["saved"].as_array().unwrap().contains(&json!("x")));
    let listed = ok(&daemon, &["session", "checkpoints", "nb"]);
    assert!(listed.contains(&checkpoint), "{listed}");
    let entries = json_of(&daemon, &["session", "checkpoints", "nb"]);
    assert_eq!(entries[0]["checkpoint_id"], checkpoint.as_str());

    ok(&daemon, &["exec", "--session", "nb", "x = 0"]);
    let restored = ok(&daemon, &["session", "restore", "nb", &checkpoint]);
    assert!(
        restored.starts_with(&format!("restored {checkpoint}: ")),
        "{restored}"
    );
    assert_eq!(
        ok(&daemon, &["exec", "--session", "nb", "print(x)"]),
        "41\n"
    );

    assert_eq!(ok(&daemon, &["session", "close", "nb"]), "closed nb\n");
    let gone = pyvisor(&daemon, &["session", "info", "nb"]);
    assert_eq!(gone.status.code(), Some(1), "{}", text(&gone.stdout));
    assert!(
        text(&gone.stderr).contains("no such session"),
        "{}",
        text(&gone.stderr)
    );
    assert_eq!(ok(&daemon, &["session", "list"]), "no sessions\n");
}

#[test]
fn session_commands_refuse_bad_input_and_the_daemon_goes_on() {
    let daemon = daemon();
    ok(&daemon, &["exec", "--session", "s", "y = 1"]);
    let missing = pyvisor(&daemon, &["session", "restore", "s", "c-999"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains("pyvisor: failed to call the server"));
    let bad = pyvisor(&daemon, &["session", "restore", "s", "../../etc"]);
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad.stderr));
    let usage = pyvisor(&daemon, &["session", "info"]);
    assert_eq!(usage.status.code(), Some(2));
    assert_eq!(ok(&daemon, &["exec", "--session", "s", "print(y)"]), "1\n");
}

#[test]
fn without_a_daemon_the_commands_say_how_to_start_one() {
    for args in [
        &["session", "list"][..],
        &["session", "info", "nb"],
        &["top", "--once"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_pyvisor"))
            .args(args)
            .args(["--socket", NO_DAEMON])
            .output()
            .expect("pyvisor runs");
        assert_eq!(out.status.code(), Some(3), "{args:?}");
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!("no daemon answers at {NO_DAEMON}")),
            "{err}"
        );
        assert!(
            err.contains("start one with `pyvisor daemon start`"),
            "{err}"
        );
    }
}

#[test]
fn top_once_shows_the_sessions_the_pool_and_the_cache() {
    let daemon = daemon();
    ok(&daemon, &["exec", "--session", "alpha", "a = 1"]);
    ok(&daemon, &["exec", "--session", "beta", "b = 2"]);
    let frame = ok(&daemon, &["top", "--once"]);
    assert!(frame.starts_with("pyvisor: 2 session(s), "), "{frame}");
    assert!(frame.contains("\npool: "), "{frame}");
    assert!(frame.contains("\nproactive cache: hit rate "), "{frame}");
    let header = frame
        .lines()
        .find(|line| line.starts_with("ID "))
        .expect("a table of sessions");
    for column in ["NAME", "OWNER", "STATE", "RSS", "CPU", "EXEC/S", "EXECS"] {
        assert!(header.contains(column), "{header}");
    }
    for name in ["alpha", "beta"] {
        let row = frame
            .lines()
            .find(|line| line.contains(&format!(" {name} ")))
            .unwrap_or_else(|| panic!("no row for {name}: {frame}"));
        assert!(row.contains(" idle "), "{row}");
        // Both samples saw the session: the rate is a number, not a dash.
        assert!(row.contains(" 0.0 "), "{row}");
    }
    let json = json_of(&daemon, &["top", "--once"]);
    assert_eq!(json["stats"]["sessions"], 2);
    assert_eq!(json["sessions"].as_array().unwrap().len(), 2);
}

#[test]
fn complete_over_the_socket_answers_matches_and_refuses_bad_params() {
    let daemon = daemon();
    runtime().block_on(async {
        let mut conn = daemon.connect().await;
        let created = conn.call("session.create", json!({})).await;
        let id = created["session_id"].clone();
        conn.call(
            "session.execute",
            json!({"session_id": id, "code": "import json"}),
        )
        .await;
        let done = conn
            .call(
                "session.complete",
                json!({"session_id": id, "code": "json.dum"}),
            )
            .await;
        assert_eq!(
            done,
            json!({"matches": ["json.dump(", "json.dumps("], "busy": false})
        );
        let code = conn
            .error_code(
                "session.complete",
                json!({"session_id": id, "code": "js", "cursor": 3}),
            )
            .await;
        assert_eq!(code, -32602);
        let code = conn
            .error_code("session.complete", json!({"session_id": id, "text": "js"}))
            .await;
        assert_eq!(code, -32602);
        let code = conn
            .error_code(
                "session.complete",
                json!({"session_id": "nope", "code": "x"}),
            )
            .await;
        assert_eq!(code, -32001);
        let after = conn
            .call(
                "session.complete",
                json!({"session_id": id, "code": "js", "cursor": 2}),
            )
            .await;
        assert_eq!(after["matches"], json!(["json"]));
    });
}

/// `pyvisor logs ARGS…` reading the log at `log`.
fn logs(log: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pyvisor"));
    command.arg("logs").env("PYVISOR_SERVER__LOG_FILE", log);
    command
}

#[test]
fn logs_prints_the_last_lines_or_says_where_none_is() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("pyvisor.log");
    let missing = logs(&log).output().unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        text(&missing.stderr).contains(&format!("no daemon log at {}", log.display())),
        "{}",
        text(&missing.stderr)
    );
    let lines: String = (1..=30).map(|n| format!("line {n}\n")).collect();
    std::fs::write(&log, lines).unwrap();
    let out = logs(&log).args(["-n", "2"]).output().unwrap();
    assert_eq!(text(&out.stdout), "line 29\nline 30\n");
    let out = logs(&log).output().unwrap();
    assert_eq!(text(&out.stdout).lines().count(), 20);
}

/// Lines a child prints, read on a thread.
fn lines_of(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("stdout is piped");
    let (sender, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

fn next_line(lines: &mpsc::Receiver<String>) -> String {
    lines
        .recv_timeout(Duration::from_secs(30))
        .expect("a line within 30 s")
}

/// Appends `text` to the file at `path`.
fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

#[test]
fn logs_follow_survives_truncation_and_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("pyvisor.log");
    std::fs::write(&log, "old 1\nold 2\n").unwrap();
    let mut child = logs(&log)
        .args(["-f", "-n", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(&mut child);
    assert_eq!(next_line(&lines), "old 2");
    append(&log, "appended\n");
    assert_eq!(next_line(&lines), "appended");
    // Truncated in place, then written again from the start.
    // (As with `tail -F`, a truncation shows once the file is shorter than what was read.)
    std::fs::write(&log, "").unwrap();
    append(&log, "after truncation\n");
    assert_eq!(next_line(&lines), "after truncation");
    // Rotated: renamed away, a new file in its place.
    std::fs::rename(&log, dir.path().join("pyvisor.log.1")).unwrap();
    append(&log, "new file\n");
    assert_eq!(next_line(&lines), "new file");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn exec_save_writes_figures_and_tables_to_files() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let out_arg = out_dir.to_str().unwrap();
    let code = "import matplotlib.pyplot as plt\nimport pandas as pd\n\
                plt.plot([1, 2, 3])\n\
                display(pd.DataFrame({'a': [1]}))\n\
                pd.DataFrame({'region': ['north'], 'amount': [5]})";
    let out = common::run_embedded("exec", &["--save", out_arg, code], "");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let png = std::fs::read(out_dir.join("2-display.png")).expect("the figure, a PNG");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let table = std::fs::read_to_string(out_dir.join("1-display.html")).unwrap();
    assert!(table.contains("<table"), "{table}");
    let result = std::fs::read_to_string(out_dir.join("3-result.html")).unwrap();
    assert!(result.contains("north"), "{result}");
    for name in ["1-display.html", "2-display.png", "3-result.html"] {
        assert!(
            err.contains(&format!("pyvisor: saved {out_arg}/{name} (")),
            "{err}"
        );
    }
    // The value is still printed; the saved displays are not announced again.
    let stdout = text(&out.stdout);
    assert!(stdout.contains("north"), "{stdout}");
    assert!(!stdout.contains("image/png output"), "{stdout}");
    // A second call numbers on, never overwriting.
    let again = common::run_embedded(
        "exec",
        &[
            "--save",
            out_arg,
            "import pandas as pd\npd.DataFrame({'b': [2]})",
        ],
        "",
    );
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert!(out_dir.join("4-result.html").exists());
}

#[test]
fn exec_save_into_a_file_is_a_usage_error_before_any_code_runs() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let marker = dir.path().join("ran");
    let code = format!("open({:?}, 'w').close()", marker.to_str().unwrap());
    let out = common::run_embedded("exec", &["--save", file.to_str().unwrap(), &code], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--save"),
        "{}",
        text(&out.stderr)
    );
    assert!(!marker.exists());
}
