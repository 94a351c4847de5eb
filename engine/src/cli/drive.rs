//! One piece of code run at the terminal, the same way for `exec` and `repl` and for both
//! kinds of [`Backend`]: output streams as it is printed, a [`Console`] answers `input()`,
//! Ctrl-C interrupts the code, then [`report`] prints the result and [`exit_status`] says
//! how it ended.

use std::io::{self, Write};
use std::time::Duration;

use clap::ValueEnum;
use pyvisor::{ExecutionEvent, ExecutionResult, ExecutionStatus, OutputStream};
use tokio::signal::unix::{signal, Signal, SignalKind};

use super::backend::{Backend, BackendError};

/// How a command shows what it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// For people: output streams live, then the value or the traceback; tables for lists.
    Text,
    /// For programs: one JSON value on stdout (for code, the result object of
    /// docs/protocol.md; nothing streams).
    Json,
}

/// Prints `report` as pretty JSON on stdout (what `--format json` gives for reports).
pub fn print_json_report(report: &impl serde::Serialize) {
    match serde_json::to_string_pretty(report) {
        Ok(json) => println!("{json}"),
        Err(err) => eprintln!("pyvisor: encode the report: {err}"),
    }
}

/// What the user said to an `input()` prompt.
pub enum Answer {
    Line(String),
    /// End of input: `input()` raises `EOFError`.
    Eof,
    /// Ctrl-C: the code gets `KeyboardInterrupt`.
    Interrupt,
}

/// Where the answers to `input()` come from.
pub trait Console {
    /// Shows `prompt` if this console shows prompts, and reads the answer.
    async fn answer(&mut self, prompt: &str, password: bool) -> Answer;
}

/// Runs `code` on `backend` to its result; with [`Format::Text`] its output streams to
/// stdout and stderr as it is printed.
pub async fn drive(
    backend: &Backend,
    code: String,
    timeout: Option<Duration>,
    format: Format,
    console: &mut impl Console,
) -> Result<ExecutionResult, BackendError> {
    let mut interrupts = Interrupts::new();
    let mut run = backend.execute(code, timeout).await?;
    loop {
        let event = tokio::select! {
            event = run.next() => event,
            () = interrupts.next() => {
                interrupt(backend).await;
                continue;
            }
        };
        match event.ok_or(BackendError::Ended)?? {
            ExecutionEvent::Output { stream, data } => {
                if format == Format::Text {
                    // A closed stdout must not stop the code; its result still counts.
                    let _ = match stream {
                        OutputStream::Stdout => write_flush(&mut io::stdout(), &data),
                        OutputStream::Stderr => write_flush(&mut io::stderr(), &data),
                    };
                }
            }
            ExecutionEvent::InputRequest { prompt, password } => {
                let answer = tokio::select! {
                    answer = console.answer(&prompt, password) => answer,
                    () = interrupts.next() => Answer::Interrupt,
                };
                let value = match answer {
                    Answer::Line(line) => Some(line),
                    Answer::Eof => None,
                    Answer::Interrupt => {
                        interrupt(backend).await;
                        continue;
                    }
                };
                // Fails only when the code stopped waiting (a timeout); its result follows.
                if let Err(err) = backend.send_input(&run, value).await {
                    tracing::debug!(%err, "input not delivered");
                }
            }
            // Displays are part of the result, and reported with it.
            ExecutionEvent::Display(_) => {}
            ExecutionEvent::Finished(result) => return Ok(*result),
        }
    }
}

async fn interrupt(backend: &Backend) {
    // A lost connection shows up as the end of the events; nothing else to do here.
    if let Err(err) = backend.interrupt().await {
        tracing::debug!(%err, "interrupt not delivered");
    }
}

/// Ctrl-C while code runs. Without a SIGINT handler (it could not be installed) it never
/// fires, and Ctrl-C ends the command as usual.
struct Interrupts(Option<Signal>);

impl Interrupts {
    fn new() -> Self {
        Self(signal(SignalKind::interrupt()).ok())
    }

    async fn next(&mut self) {
        match &mut self.0 {
            Some(signal) => {
                signal.recv().await;
            }
            None => std::future::pending().await,
        }
    }
}

/// Prints what the streamed output did not already show: displays, the value of a final
/// expression, the traceback. With [`Format::Json`], the one result object instead.
pub fn report(result: &ExecutionResult, format: Format) {
    if format == Format::Json {
        match serde_json::to_string(result) {
            Ok(json) => println!("{json}"),
            Err(err) => eprintln!("pyvisor: failed to encode the result: {err}"),
        }
        return;
    }
    for display in &result.display {
        if display.mime == "text/plain" {
            println!("{}", display.data);
        } else {
            println!("[{} output, {} bytes]", display.mime, display.data.len());
        }
    }
    if let Some(value) = &result.result {
        println!("{}", value.repr);
    }
    if let Some(error) = &result.error {
        if error.traceback.is_empty() {
            eprintln!("{}: {}", error.type_name, error.message);
        } else {
            eprint!("{}", error.traceback.concat());
        }
    }
    if result.status == ExecutionStatus::Timeout {
        // The traceback shows only the KeyboardInterrupt that stopped the code.
        eprintln!(
            "pyvisor: the execution timed out after {:.1} s (--timeout, else limits.timeout_s)",
            result.duration_ms / 1000.0
        );
    }
}

/// The exit status for an execution outcome (README, `pyvisor exec`).
pub fn exit_status(status: ExecutionStatus) -> u8 {
    match status {
        ExecutionStatus::Ok => 0,
        ExecutionStatus::Error => 1,
        ExecutionStatus::Timeout | ExecutionStatus::Interrupted => 3,
        ExecutionStatus::Crashed => 4,
    }
}

pub fn write_flush(out: &mut impl Write, data: &str) -> io::Result<()> {
    out.write_all(data.as_bytes())?;
    out.flush()
}
