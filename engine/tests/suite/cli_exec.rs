//! `pyvisor exec` through the real binary: streaming, input from stdin, JSON output and the
//! exit statuses the README gives, in an embedded engine and through a daemon.

use crate::common;

use std::process::{Command, Output, Stdio};

use common::{text, Daemon, NO_DAEMON};
use pyvisor_actors::worker::is_running;

fn exec(args: &[&str], stdin: &str) -> Output {
    common::run_embedded("exec", args, stdin)
}

/// `pyvisor exec` through `daemon`.
fn exec_in(daemon: &Daemon, args: &[&str], stdin: &str) -> Output {
    common::run_in(daemon, "exec", args, stdin)
}

#[test]
fn prints_output_and_the_final_value() {
    let out = exec(&["print('hi')\n6 * 7"], "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi\n42\n");
}

#[test]
fn reads_code_from_stdin() {
    let out = exec(&["-"], "x = 2\nprint(x + 1)\n");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "3\n");
}

#[test]
fn answers_input_from_stdin_and_eof_after() {
    let out = exec(
        &["a = input('first? ')\nprint('got', a)\ninput('second? ')"],
        "yes\n",
    );
    assert_eq!(text(&out.stdout), "first? got yes\nsecond? ");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("EOFError"));
}

#[test]
fn python_error_exits_1_with_the_traceback() {
    let out = exec(&["1 / 0"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("ZeroDivisionError: division by zero"));
}

#[test]
fn timeout_exits_3() {
    let out = exec(&["--timeout", "0.3", "import time\ntime.sleep(30)"], "");
    assert_eq!(out.status.code(), Some(3));
    // Not only the KeyboardInterrupt that stopped it: the reason, and after how long.
    assert!(
        text(&out.stderr).contains("pyvisor: the execution timed out after 0."),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn crash_exits_4() {
    let out = exec(&["import os\nos._exit(9)"], "");
    assert_eq!(out.status.code(), Some(4));
    assert!(text(&out.stderr).contains("exited with code 9"));
}

#[test]
fn bad_timeout_is_a_usage_error() {
    let out = exec(&["--timeout", "-1", "1"], "");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn json_format_prints_exactly_one_result_object() {
    let out = exec(&["--format", "json", "print('streamed?')\n{'a': 1}"], "");
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let result: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(result["status"], "ok");
    assert_eq!(result["stdout"], "streamed?\n");
    assert_eq!(result["result"]["repr"], "{'a': 1}");
    assert_eq!(result["result"]["type"], "dict");
    assert_eq!(result["execution_id"], "e-1");
    assert!(result["error"].is_null());
}

#[test]
fn sigkill_of_the_host_leaves_no_python_process_behind() {
    use std::io::{BufRead, BufReader};
    let mut host = Command::new(env!("CARGO_BIN_EXE_pyvisor"))
        .env("PYVISOR_SERVER__SOCKET", NO_DAEMON)
        .args([
            "exec",
            "import os, subprocess, time\n\
             child = subprocess.Popen(['sleep', '60'])\n\
             print(os.getpid(), child.pid, flush=True)\n\
             time.sleep(60)",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(host.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pids: Vec<u32> = line
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "worker and child pids: {line:?}");
    host.kill().unwrap();
    host.wait().unwrap();
    for pid in pids {
        let gone = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            !is_running(pid)
        });
        assert!(gone, "process {pid} outlived the SIGKILLed host");
    }
}

#[test]
fn verbose_says_when_no_daemon_answers() {
    let out = exec(&["--verbose", "1"], "");
    assert_eq!(out.status.code(), Some(0));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("no daemon at {NO_DAEMON}")),
        "{stderr}"
    );
    assert!(stderr.contains("running an embedded engine"), "{stderr}");
}

#[test]
fn session_without_a_daemon_is_a_usage_error() {
    let out = exec(&["--session", "s", "x = 1"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--session"));
    assert!(
        text(&out.stderr).contains("start one with `pyvisor daemon start`"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn socket_flag_and_env_choose_the_daemon() {
    let daemon = daemon();
    let socket = daemon.socket.to_str().unwrap();
    // `--socket` beats the configured (here: missing) socket.
    let out = exec(&["--socket", socket, "--verbose", "6 * 7"], "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("using the daemon at {socket}")));
    // So does $PYVISOR_SOCKET.
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_pyvisor"));
    command
        .env("PYVISOR_SERVER__SOCKET", common::NO_DAEMON)
        .env("PYVISOR_SOCKET", socket);
    let out = common::run(command, "exec", &["--verbose", "6 * 7"], "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("using the daemon at {socket}")));
}

/// A daemon for one test; the runtime only starts it (its guard kills it without one).
fn daemon() -> Daemon {
    tokio::runtime::Runtime::new()
        .expect("a runtime")
        .block_on(Daemon::start())
}

#[test]
fn verbose_says_the_daemon_runs_the_code() {
    let daemon = daemon();
    let out = exec_in(&daemon, &["--verbose", "print('hi')\n6 * 7"], "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi\n42\n");
    let stderr = text(&out.stderr);
    let expected = format!("using the daemon at {}", daemon.socket.display());
    assert!(stderr.contains(&expected), "{stderr}");
}

#[test]
fn a_named_session_keeps_its_state_between_calls() {
    let daemon = daemon();
    let out = exec_in(&daemon, &["--session", "s", "x = 1"], "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = exec_in(&daemon, &["--session", "s", "print(x)"], "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "1\n");
    // Without --session, each call has a fresh namespace.
    let out = exec_in(&daemon, &["y = 2"], "");
    assert_eq!(out.status.code(), Some(0));
    let out = exec_in(&daemon, &["y"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("NameError"));
}

#[test]
fn temporary_sessions_are_closed_and_named_ones_stay() {
    let daemon = daemon();
    for args in [&["1"][..], &["--session", "kept", "1"][..]] {
        let out = exec_in(&daemon, args, "");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let sessions = runtime.block_on(async {
        let client = pyvisor::client::Client::connect(&daemon.socket)
            .await
            .unwrap();
        client.list(None).await.unwrap()
    });
    let names: Vec<_> = sessions.iter().map(|s| s.name.as_deref()).collect();
    assert_eq!(names, [Some("kept")]);
}

#[test]
fn json_format_through_the_daemon_prints_exactly_one_result_object() {
    let daemon = daemon();
    let out = exec_in(
        &daemon,
        &["--format", "json", "print('streamed?')\n{'a': 1}"],
        "",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let result: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(result["status"], "ok");
    assert_eq!(result["stdout"], "streamed?\n");
    assert_eq!(result["result"]["repr"], "{'a': 1}");
    assert!(result["error"].is_null());
}

#[test]
fn input_and_exit_statuses_through_the_daemon() {
    let daemon = daemon();
    let out = exec_in(
        &daemon,
        &["a = input('first? ')\nprint('got', a)\ninput('second? ')"],
        "yes\n",
    );
    assert_eq!(text(&out.stdout), "first? got yes\nsecond? ");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("EOFError"));

    // Code from stdin leaves nothing to answer input() with.
    let out = exec_in(&daemon, &["-"], "input('q? ')\n");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("EOFError"));

    let out = exec_in(
        &daemon,
        &["--timeout", "0.3", "import time\ntime.sleep(30)"],
        "",
    );
    assert_eq!(out.status.code(), Some(3));
    let out = exec_in(&daemon, &["import os\nos._exit(9)"], "");
    assert_eq!(out.status.code(), Some(4));
    assert!(text(&out.stderr).contains("exited with code 9"));
}
