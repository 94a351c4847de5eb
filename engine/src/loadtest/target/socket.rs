//! A daemon's JSON-RPC socket as a target, and, when the harness runs the daemon, its kill and
//! restart: calls wait while the new daemon starts and the sessions are created again, which
//! brings them back from their checkpoints.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use tokio::sync::watch;

use super::{kind, Target};
use crate::client::Client;
use crate::loadtest::daemon::HarnessDaemon;
use crate::rpc::wire::CreateParams;

/// A daemon's socket, and the daemon itself when the harness runs it.
pub struct Socket {
    /// Replaced when the daemon is restarted.
    client: RwLock<Client>,
    pub(super) path: PathBuf,
    daemon: Option<HarnessDaemon>,
    /// True while the daemon is being restarted and its sessions brought back: calls wait.
    restarting: watch::Sender<bool>,
    /// How many times the daemon has been killed and restarted.
    restarts: AtomicU64,
}

impl Socket {
    pub(super) fn new(client: Client, path: PathBuf, daemon: Option<HarnessDaemon>) -> Socket {
        Socket {
            client: RwLock::new(client),
            path,
            daemon,
            restarting: watch::Sender::new(false),
            restarts: AtomicU64::new(0),
        }
    }

    /// Kills and restarts `daemon`, connects to the new one and creates `sessions` again.
    async fn restart(&self, daemon: &HarnessDaemon, sessions: &[String]) -> Result<String, String> {
        let began = std::time::Instant::now();
        let (killed, started, client) = daemon.kill_and_restart().await?;
        *self.client.write().unwrap_or_else(|p| p.into_inner()) = client.clone();
        let mut detail = format!(
            "SIGKILL to daemon {killed}; daemon {started} answered {:.2} s later",
            began.elapsed().as_secs_f64()
        );
        let mut back = 0;
        for name in sessions {
            let params = CreateParams {
                name: Some(name.clone()),
                ..CreateParams::default()
            };
            // Straight to the new client: `client()` waits for the restart to be over.
            match client.create_session(params).await {
                Ok(_) => back += 1,
                Err(err) => detail.push_str(&format!("; {name} not back: {}", kind(err))),
            }
        }
        detail.push_str(&format!("; {back} of {} sessions back", sessions.len()));
        Ok(detail)
    }

    /// The connection to the daemon, once no restart is under way.
    pub(super) async fn client(&self) -> Client {
        let _ = self.restarting.subscribe().wait_for(|busy| !busy).await;
        self.client
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Target {
    /// Whether the harness runs the daemon, so it can kill and restart it.
    pub fn restartable(&self) -> bool {
        matches!(
            self,
            Target::Socket(Socket {
                daemon: Some(_),
                ..
            })
        )
    }

    /// SIGKILLs the daemon the harness runs, starts it again on the same state, and creates
    /// each of `sessions` (names) again, which brings them back from their checkpoints. Calls
    /// made meanwhile wait for all that (calls in flight at the kill fail). What was done,
    /// for the fault log.
    pub async fn kill_and_restart_daemon(&self, sessions: &[String]) -> Result<String, String> {
        let Target::Socket(
            socket @ Socket {
                daemon: Some(daemon),
                ..
            },
        ) = self
        else {
            return Err("the harness does not run this target's daemon".into());
        };
        socket.restarting.send_replace(true);
        socket.restarts.fetch_add(1, Ordering::SeqCst);
        let restarted = socket.restart(daemon, sessions).await;
        socket.restarting.send_replace(false);
        restarted
    }

    /// How many times the harness has killed and restarted the daemon so far (counted from
    /// the kill): a session no client names does not outlive a change of this number.
    pub fn daemon_restarts(&self) -> u64 {
        match self {
            Target::Socket(socket) => socket.restarts.load(Ordering::SeqCst),
            Target::Embedded { .. } | Target::Http(_) | Target::Cluster { .. } => 0,
        }
    }

    /// The daemon's socket, for faults that open connections of their own.
    pub fn socket_path(&self) -> Option<&Path> {
        match self {
            Target::Socket(socket) => Some(&socket.path),
            _ => None,
        }
    }
}
