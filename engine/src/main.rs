//! The `pyvisor` command line: run code (`exec`, `repl`), run the daemon (`serve`,
//! `daemon`), check the configuration (`config check`).

mod cli;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    // Logs go to stderr, coloured only on a terminal (never in a log file), and never onto the
    // REPL's screen unless asked for (`repl --verbose`, or PYVISOR_LOG).
    let default_level = if args.keeps_the_screen() {
        "off"
    } else {
        "warn"
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PYVISOR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .init();
    // The engine runs its actors on threads of its own; these serve the connections.
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("pyvisor: failed to start the runtime: {err}");
            return ExitCode::from(cli::EXIT_USAGE);
        }
    };
    let status = runtime.block_on(cli::run(args));
    // A read of stdin for an `input()` that was interrupted may still be waiting for a line:
    // do not wait for it.
    runtime.shutdown_background();
    ExitCode::from(status)
}
