//! `pyvisor exec`: run code once in an embedded engine, streaming output live, answering
//! `input()` from stdin, and exiting with a status that says how the code ended.

use std::io::{self, BufRead, Read, Write};
use std::time::Duration;

use clap::{Args, ValueEnum};
use futures::StreamExt;
use pyvisor::{
    Engine, EngineConfig, ExecuteRequest, ExecutionEvent, ExecutionResult, ExecutionStatus,
    OutputStream, PoolConfig, Session, StateConfig,
};

use super::EXIT_USAGE;

/// Arguments of `pyvisor exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Wall-clock limit in seconds (default: `limits.timeout_s`, 30).
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// `text` streams output live; `json` prints only the result object.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// The code to run; `-` or nothing reads it from stdin.
    code: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
}

/// The exit status for an execution outcome (SPEC.md §1).
pub fn exit_status(status: ExecutionStatus) -> u8 {
    match status {
        ExecutionStatus::Ok => 0,
        ExecutionStatus::Error => 1,
        ExecutionStatus::Timeout | ExecutionStatus::Interrupted => 3,
        ExecutionStatus::Crashed => 4,
    }
}

pub async fn run(args: ExecArgs) -> u8 {
    let (code, stdin_free) = match args.code.as_deref() {
        Some(code) if code != "-" => (code.to_owned(), true),
        _ => {
            let mut code = String::new();
            if let Err(err) = io::stdin().read_to_string(&mut code) {
                eprintln!("pyvisor: failed to read code from stdin: {err}");
                return EXIT_USAGE;
            }
            (code, false)
        }
    };
    let mut request = ExecuteRequest::new(code);
    request.input = stdin_free;
    if let Some(secs) = args.timeout {
        match Duration::try_from_secs_f64(secs) {
            Ok(timeout) if secs > 0.0 => request.timeout = Some(timeout),
            _ => {
                eprintln!("pyvisor: --timeout must be a positive number of seconds, got {secs}");
                return EXIT_USAGE;
            }
        }
    }
    // One call, one session: ready workers or a zygote would only cost time.
    let config = EngineConfig {
        pool: PoolConfig {
            min_idle: 0,
            ..PoolConfig::default()
        },
        zygote: false,
        state: StateConfig {
            enabled: false,
            ..StateConfig::default()
        },
        ..EngineConfig::default()
    };
    let engine = match Engine::start(config).await {
        Ok(engine) => engine,
        Err(err) => {
            eprintln!("pyvisor: failed to {err}");
            return EXIT_USAGE;
        }
    };
    let session = match engine.create_session(Default::default()).await {
        Ok(session) => session,
        Err(err) => {
            eprintln!("pyvisor: failed to create a session: {err}");
            return EXIT_USAGE;
        }
    };
    match drive(&session, request, args.format).await {
        Ok(result) => {
            let status = exit_status(result.status);
            report(&result, args.format);
            status
        }
        Err(err) => {
            eprintln!("pyvisor: failed to {err}");
            exit_status(ExecutionStatus::Crashed)
        }
    }
}

/// Streams the events of one execution to the terminal; Ctrl-C interrupts the code.
async fn drive(
    session: &Session,
    request: ExecuteRequest,
    format: Format,
) -> Result<ExecutionResult, pyvisor::EngineError> {
    let mut execution = session.execute(request).await?;
    let execution_id = execution.id().to_owned();
    loop {
        let event = tokio::select! {
            event = execution.next() => event,
            _ = tokio::signal::ctrl_c() => {
                session.interrupt().await?;
                continue;
            }
        };
        match event {
            Some(ExecutionEvent::Output { stream, data }) if format == Format::Text => {
                let _ = match stream {
                    OutputStream::Stdout => write_flush(&mut io::stdout(), &data),
                    OutputStream::Stderr => write_flush(&mut io::stderr(), &data),
                };
            }
            Some(ExecutionEvent::InputRequest { prompt, .. }) => {
                if format == Format::Text {
                    let _ = write_flush(&mut io::stdout(), &prompt);
                }
                let line = tokio::task::spawn_blocking(read_line).await.ok().flatten();
                session.send_input(&execution_id, line).await?;
            }
            Some(ExecutionEvent::Finished(result)) => return Ok(*result),
            Some(_) => {}
            None => return Err(pyvisor::EngineError::Stopped),
        }
    }
}

fn write_flush(out: &mut impl Write, data: &str) -> io::Result<()> {
    out.write_all(data.as_bytes())?;
    out.flush()
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

/// Prints what the streamed output did not already show.
fn report(result: &ExecutionResult, format: Format) {
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
}
