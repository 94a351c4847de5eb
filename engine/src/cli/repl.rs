//! `pyvisor repl`: an interactive prompt on a session of the daemon when its socket answers
//! (the named one with `--session`), else of an embedded engine. Statements are read as
//! [`super::block`] decides, run with [`drive`] like `exec` runs code, and their value or
//! traceback printed as Python's own REPL does. Ctrl-C interrupts running code and clears
//! the line at the prompt; Ctrl-D at the prompt leaves.

use std::io;

use clap::Args;
use pyvisor::ExecutionStatus;

use super::backend::{self, Backend, Open};
use super::block::is_complete;
use super::drive::{drive, exit_status, report, write_flush, Answer, Console, Format};
use super::lines::{Lines, Read};
use super::EXIT_USAGE;

/// Arguments of `pyvisor repl`.
#[derive(Debug, Args)]
pub struct ReplArgs {
    /// Use the daemon's session NAME (created on first use), which outlives the REPL.
    #[arg(long, value_name = "NAME")]
    session: Option<String>,
    /// Say on stderr whether the daemon or an embedded engine runs the code.
    #[arg(long)]
    verbose: bool,
}

pub async fn run(args: ReplArgs) -> u8 {
    let open = Open {
        session: args.session.as_deref(),
        // Embedded, the session's state still lasts as long as the REPL: warn only.
        session_needs_daemon: false,
        verbose: args.verbose,
    };
    let backend = match backend::open(open).await {
        Ok(backend) => backend,
        Err(err) => {
            eprintln!("pyvisor: failed to {err}");
            return EXIT_USAGE;
        }
    };
    let lines = match Lines::start() {
        Ok(lines) => lines,
        Err(err) => {
            eprintln!("pyvisor: failed to start the line editor: {err}");
            return EXIT_USAGE;
        }
    };
    if lines.interactive() {
        eprintln!(
            "pyvisor repl on session {}; Ctrl-C interrupts, Ctrl-D leaves",
            backend.session_id()
        );
    }
    let status = repl(&backend, &lines).await;
    if let Err(err) = backend.finish().await {
        eprintln!("pyvisor: failed to close the session: {err}");
    }
    status
}

/// Reads, runs and prints until the end of input; the exit status.
async fn repl(backend: &Backend, lines: &Lines) -> u8 {
    let mut console = ReplConsole { lines };
    while let Some(code) = read_statement(lines).await {
        match drive(backend, code, None, Format::Text, &mut console).await {
            Ok(result) => report(&result, Format::Text),
            Err(err) => {
                eprintln!("pyvisor: failed to {err}");
                return exit_status(ExecutionStatus::Crashed);
            }
        }
    }
    0
}

/// The next statement to run; `None` at the end of input.
async fn read_statement(lines: &Lines) -> Option<String> {
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() { ">>> " } else { "... " };
        match lines.read(prompt, true).await {
            Read::Line(line) => {
                if buffer.is_empty() && line.trim().is_empty() {
                    continue;
                }
                buffer.push_str(&line);
                buffer.push('\n');
                if is_complete(&buffer) {
                    return Some(buffer);
                }
            }
            // As in Python: Ctrl-C drops what was typed and shows a fresh prompt.
            Read::Interrupted => buffer.clear(),
            // The end of input still runs an unfinished block (a file that ends without
            // the empty line after it).
            Read::Eof if buffer.trim().is_empty() => return None,
            Read::Eof => return Some(buffer),
        }
    }
}

/// Answers `input()` with a line from the REPL's own line reader.
struct ReplConsole<'a> {
    lines: &'a Lines,
}

impl Console for ReplConsole<'_> {
    async fn answer(&mut self, prompt: &str, _password: bool) -> Answer {
        if !self.lines.interactive() {
            // Off a terminal the editor shows no prompt; `input()` still should.
            let _ = write_flush(&mut io::stdout(), prompt);
        }
        match self.lines.read(prompt, false).await {
            Read::Line(line) => Answer::Line(line),
            Read::Interrupted => Answer::Interrupt,
            Read::Eof => Answer::Eof,
        }
    }
}
