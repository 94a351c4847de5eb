//! `pyvisor exec`: run code once, in the daemon when its socket answers (in a temporary
//! session, or the named one with `--session`), else in an engine embedded for this one call;
//! stream output live, answer `input()` from stdin, and exit with a status that says how the
//! code ended. With `--save DIR`, rich output goes to files (see [`super::save`]).

use std::io::{self, BufRead, IsTerminal, Read};
use std::path::Path;
use std::time::Duration;

use clap::Args;
use pyvisor::{ExecutionResult, ExecutionStatus};

use super::backend::{self, Open};
use super::drive::{drive, exit_status, report, write_flush, Answer, Console, Format};
use super::{save, table, EXIT_USAGE};

/// Arguments of `pyvisor exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Run in the daemon's session NAME (created on first use), which keeps its state
    /// between calls. Needs a running daemon.
    #[arg(long, value_name = "NAME")]
    session: Option<String>,
    /// Wall-clock limit in seconds (default: `limits.timeout_s`, 30).
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// `text` streams output live; `json` prints only the result object.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    #[arg(long, value_name = "PATH", help = super::config::CONFIG_HELP)]
    config: Option<std::path::PathBuf>,
    /// The daemon's socket (else `$PYVISOR_SOCKET`, else the configured `server.socket` or
    /// the default).
    #[arg(long, value_name = "PATH")]
    socket: Option<std::path::PathBuf>,
    /// Say on stderr whether the daemon or an embedded engine runs the code.
    #[arg(long)]
    verbose: bool,
    /// Write rich output (PNG, SVG, HTML, JSON displays and the HTML of a final value) to
    /// files `DIR/<n>-<kind>.<ext>`, listed on stderr, instead of dropping it.
    #[arg(long, value_name = "DIR")]
    save: Option<std::path::PathBuf>,
    /// The code to run; `-` or nothing reads it from stdin.
    code: Option<String>,
}

pub async fn run(args: ExecArgs) -> u8 {
    let (code, stdin_free) = match args.code.as_deref() {
        Some(code) if code != "-" => (code.to_owned(), true),
        _ => {
            if io::stdin().is_terminal() {
                eprintln!("pyvisor: reading the code from the terminal; end it with Ctrl-D");
            }
            let mut code = String::new();
            if let Err(err) = io::stdin().read_to_string(&mut code) {
                eprintln!("pyvisor: failed to read code from stdin: {err}");
                return EXIT_USAGE;
            }
            (code, false)
        }
    };
    let timeout = match args
        .timeout
        .map(|secs| (secs, Duration::try_from_secs_f64(secs)))
    {
        None => None,
        Some((secs, Ok(timeout))) if secs > 0.0 => Some(timeout),
        Some((secs, _)) => {
            eprintln!("pyvisor: --timeout must be a positive number of seconds, got {secs}");
            return EXIT_USAGE;
        }
    };
    if let Some(dir) = &args.save {
        if let Err(err) = save::prepare(dir) {
            eprintln!("pyvisor: --save {}: {err}", dir.display());
            return EXIT_USAGE;
        }
    }
    let open = Open {
        config: args.config.as_deref(),
        socket: args.socket.as_deref(),
        session: args.session.as_deref(),
        // Without a daemon the session would end with this call, and the state the caller
        // asked to keep would be lost without a word.
        session_needs_daemon: true,
        verbose: args.verbose,
        recover_crashes: false,
    };
    let backend = match backend::open(open).await {
        Ok(backend) => backend,
        Err(err) => {
            eprintln!("pyvisor: failed to {err}");
            return EXIT_USAGE;
        }
    };
    if args.verbose {
        eprintln!("pyvisor: session {}", backend.session_id());
    }
    let mut console = StdinConsole {
        free: stdin_free,
        show_prompts: args.format == Format::Text,
    };
    let status = match drive(&backend, code, timeout, args.format, &mut console).await {
        Ok(mut result) => {
            let status = exit_status(result.status);
            if let Some(dir) = &args.save {
                save_rich(dir, &mut result, args.format);
            }
            report(&result, args.format);
            status
        }
        Err(err) => {
            eprintln!("pyvisor: failed to {err}");
            exit_status(ExecutionStatus::Crashed)
        }
    };
    if let Err(err) = backend.finish().await {
        eprintln!("pyvisor: failed to close the session: {err}");
    }
    status
}

/// Writes the rich output of `result` into `dir` and lists the files on stderr; in text, the
/// saved displays are then left out of the report, which would only say they were there.
fn save_rich(dir: &Path, result: &mut ExecutionResult, format: Format) {
    match save::save(dir, result) {
        Ok(saved) => {
            for file in saved {
                eprintln!(
                    "pyvisor: saved {} ({}, {})",
                    file.path.display(),
                    file.mime,
                    table::bytes(file.bytes as u64)
                );
            }
            if format == Format::Text {
                result.display.retain(|display| !save::is_saved(display));
            }
        }
        Err(err) => eprintln!(
            "pyvisor: failed to save the rich output in {}: {err}",
            dir.display()
        ),
    }
}

/// Answers `input()` from stdin, when the code did not come from there.
struct StdinConsole {
    free: bool,
    show_prompts: bool,
}

impl Console for StdinConsole {
    async fn answer(&mut self, prompt: &str, _password: bool) -> Answer {
        if !self.free {
            return Answer::Eof;
        }
        if self.show_prompts {
            let _ = write_flush(&mut io::stdout(), prompt);
        }
        match tokio::task::spawn_blocking(read_line).await {
            Ok(Some(line)) => Answer::Line(line),
            _ => Answer::Eof,
        }
    }
}

/// One line from stdin without its newline; `None` at end of input.
fn read_line() -> Option<String> {
    let mut line = String::new();
    match io::stdin().lock().read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => {
            if line.ends_with('\n') {
                line.pop();
                if line.ends_with('\r') {
                    line.pop();
                }
            }
            Some(line)
        }
    }
}
