//! `pyvisor cluster status`: the nodes sharing the daemon's cluster store, as a table or
//! as the `cluster.status` answer (`--format json`).

use clap::{Args, Subcommand};
use serde_json::Value;

use super::table;
use super::target::{refused, Target, EXIT_REFUSED};

/// Subcommands of `pyvisor cluster`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// The nodes sharing the store: heartbeat age, sessions held, whether each drains.
    Status(StatusArgs),
}

/// Arguments of `pyvisor cluster status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    target: Target,
}

pub async fn run(command: ClusterCommand) -> u8 {
    let ClusterCommand::Status(args) = command;
    let client = match args.target.connect().await {
        Ok(client) => client,
        Err(status) => return status,
    };
    match client.call("cluster.status", serde_json::json!({})).await {
        Ok(status) if status["nodes"].is_array() => args.target.print(&status, status_table),
        Ok(other) => {
            eprintln!("pyvisor: cluster.status answered what it does not say: {other}");
            EXIT_REFUSED
        }
        Err(err) => refused(err),
    }
}

/// One row per node, then the directory's count.
fn status_table(status: &Value) -> String {
    let text = |value: &Value| match value {
        Value::String(text) => text.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    let rows: Vec<Vec<String>> = (status["nodes"].as_array().into_iter().flatten())
        .map(|node| {
            let age = node["heartbeat_age_ms"].as_i64().unwrap_or_default();
            vec![
                text(&node["node_id"]),
                text(&node["advertise_url"]),
                format!("{:.1}s", age as f64 / 1000.0),
                text(&node["sessions"]),
                match node["draining"].as_bool() {
                    Some(true) => "draining".to_owned(),
                    _ => "serving".to_owned(),
                },
            ]
        })
        .collect();
    let headers = ["NODE", "URL", "HEARTBEAT", "SESSIONS", "STATE"];
    let mut out = table::render_or("no node has joined", &headers, &rows);
    out.push_str(&format!(
        "{} sessions in the directory\n",
        text(&status["sessions"])
    ));
    out
}
