//! `pyvisor repl` with stdin as a pipe (rustyline then reads plain lines and shows no
//! prompts): statements and blocks, values and tracebacks, `input()` answered from the same
//! stdin, the exit status at end of input; embedded and through a daemon.

use crate::common;

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

#[test]
fn the_engines_warnings_stay_off_the_repl_unless_asked_for() {
    // A crash makes the engine log a warning; the REPL shows the crash, not the log line.
    let crash = "import os; os._exit(1)\n";
    let quiet = repl(&[], crash);
    assert!(
        text(&quiet.stderr).contains("WorkerCrashed"),
        "{}",
        text(&quiet.stderr)
    );
    assert!(
        !text(&quiet.stderr).contains("WARN"),
        "{}",
        text(&quiet.stderr)
    );
    let verbose = repl(&["--verbose"], crash);
    let shown = text(&verbose.stderr);
    assert!(shown.contains("WARN"), "{shown}");
    // Not a terminal: no colour codes.
    assert!(!shown.contains('\x1b'), "{shown:?}");
}

/// `pyvisor repl` on a pseudo-terminal, as a user at a terminal runs it.
mod on_a_terminal {
    use std::io::{Read, Write};
    use std::os::fd::OwnedFd;
    use std::process::{Child, Stdio};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use nix::pty::openpty;

    /// A REPL whose stdin, stdout and stderr are the pty; what it writes arrives on `output`.
    struct Terminal {
        child: Child,
        input: std::fs::File,
        output: mpsc::Receiver<Vec<u8>>,
        seen: String,
    }

    impl Terminal {
        fn start(home: &std::path::Path) -> Terminal {
            let pty = openpty(None, None).expect("open a pty");
            let slave = |fd: &OwnedFd| Stdio::from(fd.try_clone().unwrap());
            let tmp = home.join("tmp");
            std::fs::create_dir_all(&tmp).unwrap();
            let child = super::common::command(home)
                .arg("repl")
                .env("TMPDIR", &tmp)
                .env("TERM", "xterm")
                .stdin(slave(&pty.slave))
                .stdout(slave(&pty.slave))
                .stderr(slave(&pty.slave))
                .spawn()
                .expect("spawn pyvisor repl");
            drop(pty.slave);
            let master = std::fs::File::from(pty.master);
            let mut reader = master.try_clone().unwrap();
            let (sender, output) = mpsc::channel();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n @ 1..) = reader.read(&mut chunk) {
                    if sender.send(chunk[..n].to_vec()).is_err() {
                        break;
                    }
                }
            });
            Terminal {
                child,
                input: master,
                output,
                seen: String::new(),
            }
        }

        fn type_keys(&mut self, keys: &str) {
            self.input.write_all(keys.as_bytes()).unwrap();
        }

        /// Waits until the screen shows `text` after what earlier waits saw.
        fn wait_for(&mut self, text: &str) {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if let Some(at) = self.seen.find(text) {
                    self.seen.drain(..at + text.len());
                    return;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                match self.output.recv_timeout(left) {
                    Ok(chunk) => self.seen.push_str(&String::from_utf8_lossy(&chunk)),
                    Err(_) => panic!("never saw {text:?}; the screen shows {:?}", self.seen),
                }
            }
        }
    }

    impl Drop for Terminal {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    #[test]
    fn pasted_lines_run_one_by_one_with_their_values() {
        let home = tempfile::tempdir().unwrap();
        let mut terminal = Terminal::start(home.path());
        terminal.wait_for(">>> ");
        // What a terminal sends for a paste of three lines, then Enter.
        terminal.type_keys("\x1b[200~1+1\r2+2\r3+3\r\x1b[201~\r");
        terminal.wait_for("2\r\n4\r\n6\r\n");
        // A pasted block followed by a statement at the margin: the block ends there.
        terminal.type_keys(
            "\x1b[200~for i in range(2):\r    print(i * 10)\rprint('done')\r\x1b[201~\r",
        );
        terminal.wait_for("0\r\n10\r\ndone\r\n");
        // Keys typed before the prompt shows are lost by the line editor (rustyline).
        terminal.wait_for(">>> ");
        terminal.type_keys("\x04");
        let status = terminal.child.wait().unwrap();
        assert!(status.success(), "{status}");
    }

    #[test]
    fn tab_completes_names_from_the_session() {
        let home = tempfile::tempdir().unwrap();
        let mut terminal = Terminal::start(home.path());
        terminal.wait_for(">>> ");
        terminal.type_keys("import math\r");
        terminal.wait_for(">>> ");
        // One match: Tab completes it in the line, with the "(" of a callable.
        terminal.type_keys("math.facto\t");
        terminal.wait_for("math.factorial(");
        terminal.type_keys("5)\r");
        terminal.wait_for("120\r\n");
        terminal.wait_for(">>> ");
        // Several: the first Tab completes their common part, the second lists them.
        terminal.type_keys("sales_north = 1; sales_south = 2\r");
        terminal.wait_for(">>> ");
        terminal.type_keys("sal\t");
        terminal.wait_for("sales_");
        terminal.type_keys("\t");
        terminal.wait_for("sales_north");
        terminal.wait_for("sales_south");
        terminal.type_keys("s\t\r");
        terminal.wait_for("2\r\n");
        terminal.wait_for(">>> ");
        terminal.type_keys("\x04");
        assert!(terminal.child.wait().unwrap().success());
    }

    /// Whether a checkpoint file exists anywhere under `dir`.
    fn holds_a_checkpoint(dir: &std::path::Path) -> bool {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| {
                let path = entry.path();
                path.extension().is_some_and(|ext| ext == "ckpt")
                    || (path.is_dir() && holds_a_checkpoint(&path))
            })
    }

    #[test]
    fn without_a_daemon_a_crashed_interpreter_comes_back_with_its_namespace() {
        let home = tempfile::tempdir().unwrap();
        // Durable replies: `x = 41` is answered once its checkpoint is on disk. With the
        // debounced default, an earlier checkpoint could be the one on disk when the
        // interpreter dies, and the test would race the debounce.
        let config = home.path().join("config/pyvisor");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(
            config.join("config.toml"),
            "[pool]\nmin_idle = 1\n[state]\ndurability = \"reply\"\n",
        )
        .unwrap();
        let mut terminal = Terminal::start(home.path());
        terminal.wait_for(">>> ");
        terminal.type_keys("x = 41\r");
        terminal.wait_for("x = 41");
        terminal.wait_for(">>> ");
        assert!(holds_a_checkpoint(&home.path().join("tmp")));
        terminal.type_keys("import os; os._exit(1)\r");
        terminal.wait_for("WorkerCrashed");
        terminal.wait_for(">>> ");
        terminal.type_keys("x + 1\r");
        terminal.wait_for("42\r\n");
        terminal.wait_for(">>> ");
        terminal.type_keys("\x04");
        assert!(terminal.child.wait().unwrap().success());
        // The temporary state directory goes with the REPL.
        assert!(!holds_a_checkpoint(&home.path().join("tmp")));
    }
}
