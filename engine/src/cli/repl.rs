//! `pyvisor repl`: an interactive prompt on a session of the daemon when its socket answers
//! (the named one with `--session`), else of an embedded engine. Statements are read as
//! [`super::block`] decides, run with [`drive`] like `exec` runs code, and their value or
//! traceback printed as Python's own REPL does. Ctrl-C interrupts running code and clears
//! the line at the prompt; Ctrl-D at the prompt leaves; Tab completes names from the session.
//!
//! Pasted code (a terminal sends it as one bracketed paste, which the line editor returns as
//! one multi-line "line" once Enter is pressed) is taken apart line by line as if typed, so
//! each complete statement runs on its own, in order, and shows its value.

use std::collections::VecDeque;
use std::io;

use clap::Args;
use pyvisor::ExecutionStatus;

use super::backend::{self, Backend, Open};
use super::block::{is_complete, starts_next_statement};
use super::completer::ReplHelper;
use super::drive::{drive, exit_status, report, write_flush, Answer, Console, Format};
use super::lines::{Lines, Read};
use super::EXIT_USAGE;

/// Arguments of `pyvisor repl`.
#[derive(Debug, Args)]
pub struct ReplArgs {
    /// Use the daemon's session NAME (created on first use), which outlives the REPL.
    #[arg(long, value_name = "NAME")]
    session: Option<String>,
    #[arg(long, value_name = "PATH", help = super::config::CONFIG_HELP)]
    config: Option<std::path::PathBuf>,
    /// The daemon's socket (else `$PYVISOR_SOCKET`, else the configured `server.socket` or
    /// the default).
    #[arg(long, value_name = "PATH")]
    socket: Option<std::path::PathBuf>,
    /// Say on stderr whether the daemon or an embedded engine runs the code, and show the
    /// engine's warnings (otherwise kept off the REPL's screen; PYVISOR_LOG also shows them).
    #[arg(short, long)]
    verbose: bool,
}

impl ReplArgs {
    pub fn verbose(&self) -> bool {
        self.verbose
    }
}

pub async fn run(args: ReplArgs) -> u8 {
    let open = Open {
        config: args.config.as_deref(),
        socket: args.socket.as_deref(),
        session: args.session.as_deref(),
        // Embedded, the session's state still lasts as long as the REPL: warn only.
        session_needs_daemon: false,
        verbose: args.verbose,
        recover_crashes: true,
    };
    let backend = match backend::open(open).await {
        Ok(backend) => backend,
        Err(err) => {
            eprintln!("pyvisor: failed to {err}");
            return EXIT_USAGE;
        }
    };
    let helper = ReplHelper::new(backend.completer(), tokio::runtime::Handle::current());
    let lines = match Lines::start(helper) {
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
    let mut statements = Statements {
        lines,
        pending: VecDeque::new(),
    };
    while let Some(code) = statements.next().await {
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

/// Statements read from the line editor, with the lines of a paste not taken yet.
struct Statements<'a> {
    lines: &'a Lines,
    /// Lines already read (the rest of a paste, or a line that ended the block before it).
    pending: VecDeque<String>,
}

impl Statements<'_> {
    /// The next statement to run; `None` at the end of input.
    async fn next(&mut self) -> Option<String> {
        let mut buffer = String::new();
        loop {
            let read = match self.pending.pop_front() {
                Some(line) => Read::Line(line),
                None => {
                    let prompt = if buffer.is_empty() { ">>> " } else { "... " };
                    self.lines.read(prompt, true).await
                }
            };
            match read {
                Read::Line(line) if line.contains('\n') => {
                    // A paste: its lines go first, one by one.
                    for (at, pasted) in line.split('\n').enumerate() {
                        self.pending
                            .insert(at, pasted.trim_end_matches('\r').to_owned());
                    }
                }
                Read::Line(line) => {
                    if buffer.is_empty() && line.trim().is_empty() {
                        continue;
                    }
                    if starts_next_statement(&buffer, &line) {
                        self.pending.push_front(line);
                        return Some(buffer);
                    }
                    buffer.push_str(&line);
                    buffer.push('\n');
                    if is_complete(&buffer) {
                        return Some(buffer);
                    }
                }
                // As in Python: Ctrl-C drops what was typed and shows a fresh prompt.
                Read::Interrupted => {
                    buffer.clear();
                    self.pending.clear();
                }
                // The end of input still runs an unfinished block (a file that ends without
                // the empty line after it).
                Read::Eof if buffer.trim().is_empty() => return None,
                Read::Eof => return Some(buffer),
            }
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
