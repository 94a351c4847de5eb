//! Command-line parsing and dispatch; each command lives in its own module.

mod backend;
mod block;
mod cluster;
mod completer;
mod config;
mod daemon;
mod drive;
mod exec;
mod lines;
mod loadtest;
mod logs;
mod memory_eval;
mod repl;
mod replay;
mod save;
mod serve;
mod session;
mod session_files;
mod table;
mod target;
mod task;
mod top;

use clap::{Parser, Subcommand};

pub use cluster::ClusterCommand;
pub use config::ConfigCommand;
pub use daemon::DaemonCommand;
pub use exec::ExecArgs;
pub use loadtest::LoadtestArgs;
pub use logs::LogsArgs;
pub use memory_eval::MemoryCommand;
pub use repl::ReplArgs;
pub use replay::ReplayArgs;
pub use serve::ServeArgs;
pub use session::SessionCommand;
pub use task::TaskArgs;
pub use top::TopArgs;

/// Exit status for usage and configuration errors (README, `pyvisor exec`).
pub const EXIT_USAGE: u8 = 2;

/// Supervise persistent Python sessions.
#[derive(Debug, Parser)]
#[command(name = "pyvisor", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run Python code and stream its output.
    Exec(ExecArgs),
    /// Read, run and print Python statements interactively.
    Repl(ReplArgs),
    /// Check the configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Run the supervisor daemon in the foreground (JSON-RPC on a Unix socket or stdio).
    Serve(ServeArgs),
    /// The nodes sharing this daemon's cluster store.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Run the daemon in the background: start, stop, status (with a PID file), drain.
    Daemon {
        #[command(subcommand)]
        command: DaemonCommand,
    },
    /// Manage the daemon's sessions: list, info, close, checkpoint, restore, checkpoints.
    Session {
        #[command(subcommand)]
        command: SessionCommand,
    },
    /// Print the daemon's log (the last lines; with -f, follow it).
    Logs(LogsArgs),
    /// A live view of the daemon: sessions, pool, cache hit rate (q quits).
    Top(TopArgs),
    /// Replay recorded analysis sessions and report how much was answered from speculation.
    Replay(ReplayArgs),
    /// Drive an engine with a load-test scenario, with faults, and report.
    Loadtest(LoadtestArgs),
    /// The memory of outcomes: evaluate its insights on a labelled corpus.
    Memory {
        #[command(subcommand)]
        command: MemoryCommand,
    },
    /// Run an LLM task loop in a session, showing each step.
    Task(TaskArgs),
}

impl Cli {
    /// Whether the command owns the terminal's screen (the REPL without `--verbose`), where
    /// log lines would land in the middle of the user's session.
    pub fn keeps_the_screen(&self) -> bool {
        matches!(&self.command, Command::Repl(args) if !args.verbose())
    }
}

/// Runs the parsed command and returns the process exit status.
pub async fn run(cli: Cli) -> u8 {
    match cli.command {
        Command::Exec(args) => exec::run(args).await,
        Command::Repl(args) => repl::run(args).await,
        Command::Config { command } => config::run(command),
        Command::Serve(args) => serve::run(args).await,
        Command::Cluster { command } => cluster::run(command).await,
        Command::Daemon { command } => daemon::run(command).await,
        Command::Session { command } => session::run(command).await,
        Command::Logs(args) => logs::run(args),
        Command::Top(args) => top::run(args).await,
        Command::Replay(args) => replay::run(args).await,
        Command::Loadtest(args) => loadtest::run(args).await,
        Command::Memory { command } => memory_eval::run(command).await,
        Command::Task(args) => task::run(args).await,
    }
}
