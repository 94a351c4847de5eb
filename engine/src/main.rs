//! The `pyvisor` command line: `pyvisor exec` runs code in an embedded engine.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PYVISOR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("pyvisor: failed to start the runtime: {err}");
            return ExitCode::from(cli::EXIT_USAGE);
        }
    };
    ExitCode::from(runtime.block_on(cli::run(args)))
}
