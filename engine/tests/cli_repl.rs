//! `pyvisor repl` with stdin as a pipe (rustyline then reads plain lines and shows no
//! prompts): statements and blocks, values and tracebacks, `input()` answered from the same
//! stdin, the exit status at end of input; embedded and through a daemon.

mod common;

use std::process::Output;

use common::{text, Daemon};

fn repl(args: &[&str], stdin: &str) -> Output {
    common::run_embedded("repl", args, stdin)
}

/// `pyvisor repl` through `daemon`.
fn repl_in(daemon: &Daemon, args: &[&str], stdin: &str) -> Output {
    common::run_in(daemon, "repl", args, stdin)
}

fn daemon() -> Daemon {
    tokio::runtime::Runtime::new()
        .expect("a runtime")
        .block_on(Daemon::start())
}

#[test]
fn statements_run_one_by_one_and_values_are_printed() {
    let out = repl(&[], "x = 6\nx * 7\nNone\nprint('printed')\n");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "42\nprinted\n");
}

#[test]
fn a_block_runs_after_its_empty_line() {
    let out = repl(
        &[],
        "def f():\n    return 5\n\nf()\nfor i in range(2):\n    i\n",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // The last block ends with the input, which still runs it; a loop prints no values.
    assert_eq!(text(&out.stdout), "5\n");
}

#[test]
fn errors_print_the_traceback_and_the_repl_goes_on() {
    let out = repl(&[], "1 / 0\n'after'\n");
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("ZeroDivisionError: division by zero"));
    assert_eq!(text(&out.stdout), "'after'\n");
}

#[test]
fn input_is_answered_from_the_next_line() {
    let out = repl(
        &[],
        "name = input('who? ')\nbob\nprint('hello', name)\ninput('again? ')\n",
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "who? hello bob\nagain? ");
    assert!(text(&out.stderr).contains("EOFError"));
}

#[test]
fn a_session_without_a_daemon_warns_and_still_runs() {
    let out = repl(&["--session", "s"], "1 + 1\n");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "2\n");
    assert!(text(&out.stderr).contains("warning: no daemon at"));
}

#[test]
fn through_the_daemon_a_named_session_outlives_the_repl() {
    let daemon = daemon();
    let out = repl_in(&daemon, &["--verbose", "--session", "r"], "x = 6\nx * 7\n");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "42\n");
    assert!(text(&out.stderr).contains("using the daemon at"));
    let out = repl_in(
        &daemon,
        &["--session", "r"],
        "def f():\n    return x - 1\n\nf()\n",
    );
    assert_eq!(text(&out.stdout), "5\n", "{}", text(&out.stderr));
    let out = repl_in(&daemon, &[], "a = input('a? ')\nyes\na\n");
    assert_eq!(text(&out.stdout), "a? 'yes'\n", "{}", text(&out.stderr));
}
