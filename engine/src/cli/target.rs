//! The daemon that a management command (`session`, `top`, `logs`) talks to: `--config` and
//! `--socket` as `exec` takes them, `--format`, a connected client, and the exit statuses
//! these commands share.

use std::path::PathBuf;

use clap::Args;
use pyvisor::client::{Client, ClientError};
use pyvisor::config::Settings;
use serde::Serialize;

use super::backend::{connect_daemon, daemon_socket};
use super::drive::Format;
use super::EXIT_USAGE;

/// Exit status when the daemon answered with an error (an unknown session, say).
pub const EXIT_REFUSED: u8 = 1;

/// Exit status when no daemon answers on the socket (as `daemon status` says "not running").
pub const EXIT_NO_DAEMON: u8 = 3;

/// Where the daemon is, and how to print what it says.
#[derive(Debug, Args)]
pub struct Target {
    /// The config file (else the search order of `pyvisor serve`).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// The daemon's socket (else `$PYVISOR_SOCKET`, else the configured `server.socket` or
    /// the default).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// `text` prints tables; `json` prints the daemon's answer as one JSON value.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

impl Target {
    /// The effective settings, or the exit status after saying why there are none.
    pub fn settings(&self) -> Result<Settings, u8> {
        Settings::load(self.config.as_deref())
            .map(|loaded| loaded.settings)
            .map_err(|err| {
                eprintln!("pyvisor: failed to load the configuration: {err}");
                EXIT_USAGE
            })
    }

    /// A client of the daemon, or the exit status after saying that none answers and how to
    /// start one.
    pub async fn connect(&self) -> Result<Client, u8> {
        let settings = self.settings()?;
        let socket = daemon_socket(&settings, self.socket.as_deref());
        connect_daemon(&socket).await.map_err(|reason| {
            eprintln!(
                "pyvisor: no daemon answers at {} ({reason}); start one with `pyvisor daemon \
                 start`",
                socket.display()
            );
            EXIT_NO_DAEMON
        })
    }

    /// Prints `value` as one JSON line with `--format json`, else as `text` makes it; 0.
    pub fn print<T: Serialize>(&self, value: &T, text: impl FnOnce(&T) -> String) -> u8 {
        match self.format {
            Format::Json => match serde_json::to_string(value) {
                Ok(json) => println!("{json}"),
                Err(err) => {
                    eprintln!("pyvisor: failed to encode the answer: {err}");
                    return EXIT_REFUSED;
                }
            },
            Format::Text => print!("{}", text(value)),
        }
        0
    }
}

/// The exit status of a call the daemon refused, after saying why.
pub fn refused(err: ClientError) -> u8 {
    eprintln!("pyvisor: failed to {err}");
    EXIT_REFUSED
}
