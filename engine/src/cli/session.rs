//! `pyvisor session list|info|close|checkpoint|restore|checkpoints|fork|cp|ls`: manage the daemon's
//! sessions from the shell (`cp` and `ls` are in `session_files`). Each command is one JSON-RPC call on the daemon's socket; its
//! answer is printed as a table (text) or as the method's result (`--format json`).
//!
//! Exit status: 0 done, 1 the daemon refused (unknown session, checkpoint not found), 2 usage
//! or configuration error, 3 no daemon answers on the socket.

use std::fmt::Write as _;

use clap::{Args, Subcommand};
use pyvisor::client::Client;
use pyvisor::rpc::wire::{
    CheckpointEntry, CheckpointTaken, ForkResult, Restored, SessionInfo, VariableInfo,
};
use pyvisor::LostName;

use super::session_files::{self, CpArgs, LsArgs};
use super::table::{age, bytes, or_dash, render_or};
use super::target::{refused, Target};

/// Subcommands of `pyvisor session`.
#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// The daemon's live sessions, oldest first.
    List(ListArgs),
    /// One session: its state, limits, durability, variables and definitions.
    Info(SessionArgs),
    /// End a session; its checkpoints are deleted unless --keep.
    Close(CloseArgs),
    /// Checkpoint a session's namespace now.
    Checkpoint(SessionArgs),
    /// Put a session's namespace back as a checkpoint saved it (the latest by default).
    Restore(RestoreArgs),
    /// A session's checkpoints, newest first.
    Checkpoints(SessionArgs),
    /// Fork a session: clones that start from its namespace as it is between executions.
    Fork(ForkArgs),
    /// Copy a file between here and a session's work directory:
    /// `cp LOCAL SESSION:PATH` or `cp SESSION:PATH LOCAL`.
    Cp(CpArgs),
    /// The files of a session's work directory: `ls SESSION[:DIR]`.
    Ls(LsArgs),
}

/// Arguments of `session list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this owner's sessions.
    #[arg(long, value_name = "OWNER")]
    owner: Option<String>,
    #[command(flatten)]
    target: Target,
}

/// A command on one session.
#[derive(Debug, Args)]
pub struct SessionArgs {
    /// The session's id or name.
    session: String,
    #[command(flatten)]
    target: Target,
}

/// Arguments of `session close`.
#[derive(Debug, Args)]
pub struct CloseArgs {
    #[command(flatten)]
    session: SessionArgs,
    /// Take a last checkpoint and keep the checkpoints, so that a named session comes back on
    /// its next use.
    #[arg(long)]
    keep: bool,
}

/// Arguments of `session fork`.
#[derive(Debug, Args)]
pub struct ForkArgs {
    #[command(flatten)]
    session: SessionArgs,
    /// How many clones (1 to 16); the number of --name when they are given, else 1.
    #[arg(long, value_name = "N")]
    count: Option<usize>,
    /// A name for a clone (repeat for each).
    #[arg(long = "name", value_name = "NAME")]
    names: Vec<String>,
}

/// Arguments of `session restore`.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    session: SessionArgs,
    /// The checkpoint (`c-N`, from `session checkpoints`); the latest when left out.
    checkpoint: Option<String>,
}

pub async fn run(command: SessionCommand) -> u8 {
    let target = match &command {
        SessionCommand::List(args) => &args.target,
        SessionCommand::Info(args)
        | SessionCommand::Checkpoint(args)
        | SessionCommand::Checkpoints(args) => &args.target,
        SessionCommand::Close(args) => &args.session.target,
        SessionCommand::Restore(args) => &args.session.target,
        SessionCommand::Fork(args) => &args.session.target,
        SessionCommand::Cp(args) => &args.target,
        SessionCommand::Ls(args) => &args.target,
    };
    let client = match target.connect().await {
        Ok(client) => client,
        Err(status) => return status,
    };
    call(&client, &command).await
}

async fn call(client: &Client, command: &SessionCommand) -> u8 {
    match command {
        SessionCommand::List(args) => match client.list(args.owner.as_deref()).await {
            Ok(sessions) => args.target.print(&sessions, |sessions| list(sessions)),
            Err(err) => refused(err),
        },
        SessionCommand::Info(args) => match client.info(&args.session).await {
            Ok(info) => args.target.print(&info, info_text),
            Err(err) => refused(err),
        },
        SessionCommand::Close(args) => {
            let SessionArgs { session, target } = &args.session;
            match client.close(session, args.keep).await {
                Ok(()) => target.print(&serde_json::json!({}), |_| {
                    let kept = if args.keep { ", checkpoints kept" } else { "" };
                    format!("closed {session}{kept}\n")
                }),
                Err(err) => refused(err),
            }
        }
        SessionCommand::Checkpoint(args) => match client.checkpoint(&args.session).await {
            Ok(taken) => args.target.print(&taken, checkpoint_text),
            Err(err) => refused(err),
        },
        SessionCommand::Restore(args) => {
            let SessionArgs { session, target } = &args.session;
            match client.restore(session, args.checkpoint.as_deref()).await {
                Ok(restored) => target.print(&restored, restore_text),
                Err(err) => refused(err),
            }
        }
        SessionCommand::Checkpoints(args) => match client.checkpoints(&args.session).await {
            Ok(entries) => args.target.print(&entries, |entries| checkpoints(entries)),
            Err(err) => refused(err),
        },
        SessionCommand::Fork(args) => {
            let SessionArgs { session, target } = &args.session;
            match client.fork(session, args.count, args.names.clone()).await {
                Ok(forked) => target.print(&forked, fork_text),
                Err(err) => refused(err),
            }
        }
        SessionCommand::Cp(args) => session_files::cp(client, args).await,
        SessionCommand::Ls(args) => session_files::ls(client, args).await,
    }
}

/// The table of `session list`.
fn list(sessions: &[SessionInfo]) -> String {
    let rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|session| {
            vec![
                session.session_id.clone(),
                or_dash(session.name.as_deref()),
                or_dash(session.owner.as_deref()),
                session.state.clone(),
                or_dash(session.pid),
                session.execution_count.to_string(),
                or_dash(session.rss_bytes.map(bytes)),
                or_dash(session.cpu_s.map(|cpu| format!("{cpu:.1}s"))),
                or_dash(session.last_checkpoint.as_deref()),
                age(session.created_at),
            ]
        })
        .collect();
    render_or(
        "no sessions",
        &[
            "ID",
            "NAME",
            "OWNER",
            "STATE",
            "PID",
            "EXECS",
            "RSS",
            "CPU",
            "CHECKPOINT",
            "AGE",
        ],
        &rows,
    )
}

/// The text of `session info`.
fn info_text(info: &SessionInfo) -> String {
    let mut out = String::new();
    let mut field = |label: &str, value: String| {
        let _ = writeln!(out, "{label:<12} {value}");
    };
    field("session", info.session_id.clone());
    field("name", or_dash(info.name.as_deref()));
    field("owner", or_dash(info.owner.as_deref()));
    field("state", info.state.clone());
    field("pid", or_dash(info.pid));
    field("executions", info.execution_count.to_string());
    field("rss", or_dash(info.rss_bytes.map(bytes)));
    field("cpu", or_dash(info.cpu_s.map(|cpu| format!("{cpu:.2} s"))));
    field("created", format!("{} ago", age(info.created_at)));
    field("containment", or_dash(info.containment.as_deref()));
    let durability = &info.durability;
    let saved = match (durability.saved, &durability.failure) {
        (true, _) => "saved".to_owned(),
        (false, Some(failure)) => format!("not saved: {failure}"),
        (false, None) => format!(
            "not saved: {} execution(s) since the last checkpoint",
            durability.unsaved_executions
        ),
    };
    field(
        "checkpoint",
        format!(
            "{} ({saved})",
            or_dash(durability.last_checkpoint.as_deref())
        ),
    );
    if let Some(limits) = &info.limits {
        field(
            "limits",
            format!(
                "memory {} MB, cpu {} s, timeout {} s, open files {}, processes {}",
                or_dash(limits.memory_mb),
                or_dash(limits.cpu_s),
                limits.timeout_s,
                or_dash(limits.open_files),
                or_dash(limits.processes)
            ),
        );
    }
    lost_names(&mut out, "not saved", &durability.lost_names);
    out.push('\n');
    out.push_str(&variables(&info.variables));
    if !info.definitions.is_empty() {
        let names: Vec<String> = info
            .definitions
            .iter()
            .map(|definition| format!("{} ({})", definition.name, definition.kind))
            .collect();
        let _ = writeln!(out, "\ndefinitions: {}", names.join(", "));
    }
    out
}

fn variables(variables: &[VariableInfo]) -> String {
    let rows: Vec<Vec<String>> = variables
        .iter()
        .map(|variable| {
            vec![
                variable.name.clone(),
                variable.type_name.clone(),
                or_dash(variable.size_bytes.map(bytes)),
            ]
        })
        .collect();
    render_or("no variables", &["VARIABLE", "TYPE", "SIZE"], &rows)
}

/// The text of `session checkpoint`.
fn checkpoint_text(taken: &CheckpointTaken) -> String {
    let mut out = format!(
        "checkpoint {}: {} name(s) saved, {} written ({} of state) in {:.0} ms\n",
        taken.checkpoint_id,
        taken.saved.len(),
        bytes(taken.bytes),
        bytes(taken.state_bytes),
        taken.duration_ms
    );
    lost_names(&mut out, "not saved", &taken.lost);
    out
}

/// The text of `session fork`: one line per clone.
fn fork_text(forked: &ForkResult) -> String {
    let mut out = String::new();
    for clone in &forked.sessions {
        let _ = writeln!(
            out,
            "{} (pid {}{})",
            clone.session_id,
            or_dash(clone.pid),
            clone
                .name
                .as_deref()
                .map(|name| format!(", name {name}"))
                .unwrap_or_default()
        );
    }
    let _ = writeln!(
        out,
        "forked {} clone(s) in {:.1} ms",
        forked.sessions.len(),
        forked.duration_ms
    );
    if forked.threads > 0 {
        let _ = writeln!(
            out,
            "{} thread(s) of the source do not run in the clones",
            forked.threads
        );
    }
    out
}

/// The text of `session restore`.
fn restore_text(restored: &Restored) -> String {
    let mut out = format!(
        "restored {}: {} name(s) reloaded, {} kept as they were\n",
        restored.checkpoint_id,
        restored.restored.len(),
        restored.kept.len()
    );
    lost_names(&mut out, "not restored", &restored.lost);
    out
}

/// The table of `session checkpoints`.
fn checkpoints(entries: &[CheckpointEntry]) -> String {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|entry| {
            vec![
                entry.checkpoint_id.clone(),
                age(entry.created_at),
                entry.execution_count.to_string(),
                bytes(entry.state_bytes),
                entry.saved.join(","),
            ]
        })
        .collect();
    render_or(
        "no checkpoints",
        &["ID", "AGE", "EXECS", "STATE", "NAMES"],
        &rows,
    )
}

/// One line per name in `lost`, saying why.
fn lost_names(out: &mut String, what: &str, lost: &[LostName]) {
    for name in lost {
        let _ = writeln!(out, "{what}: {} ({})", name.name, name.reason);
    }
}
