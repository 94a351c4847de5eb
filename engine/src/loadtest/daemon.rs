//! A daemon the harness runs itself (`[target] kind = "daemon"`): `pyvisor serve` on a socket
//! and state directory in a temporary directory, so the `kill_daemon` fault can SIGKILL it and
//! start it again on the same state, as systemd would.
//!
//! The daemon's stderr goes to `daemon.log` in that directory, which is removed at the end of
//! the run (the daemon with it).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::client::Client;
use crate::DurabilityMode;

/// How long a started daemon has to answer on its socket.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A `pyvisor serve` process the harness owns.
pub struct HarnessDaemon {
    binary: PathBuf,
    dir: tempfile::TempDir,
    socket: PathBuf,
    child: Mutex<Child>,
}

impl HarnessDaemon {
    /// Starts `binary serve` (this program when `None`) with `durability`, and waits until it
    /// answers; the daemon and a client connected to it.
    pub async fn start(
        binary: Option<&Path>,
        durability: DurabilityMode,
    ) -> Result<(HarnessDaemon, Client), String> {
        let binary = program(binary)?;
        let dir = tempfile::Builder::new()
            .prefix("pyvisor-loadtest-daemon-")
            .tempdir()
            .map_err(|err| format!("create the daemon's directory: {err}"))?;
        let socket = dir.path().join("pyvisor.sock");
        let config = format!(
            "[server]\nsocket = {socket:?}\n\n[state]\ndir = {state:?}\ndurability = \"{mode}\"\n",
            state = dir.path().join("state"),
            mode = durability.name(),
        );
        std::fs::write(dir.path().join("config.toml"), config)
            .map_err(|err| format!("write the daemon's config: {err}"))?;
        let child = spawn(&binary, dir.path())?;
        let daemon = HarnessDaemon {
            binary,
            dir,
            socket,
            child: Mutex::new(child),
        };
        let client = daemon.ready().await?;
        Ok((daemon, client))
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// SIGKILLs the daemon, starts it again on the same state and waits until it answers:
    /// the old pid, the new one, and a client of the new daemon.
    pub async fn kill_and_restart(&self) -> Result<(u32, u32, Client), String> {
        let killed = {
            let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
            let pid = child.id();
            child
                .kill()
                .map_err(|err| format!("SIGKILL to daemon {pid}: {err}"))?;
            // Reaped before the next one starts, so its socket and lock are released.
            let _ = child.wait();
            *child = spawn(&self.binary, self.dir.path())?;
            pid
        };
        let client = self.ready().await?;
        let started = self.child.lock().unwrap_or_else(|p| p.into_inner()).id();
        Ok((killed, started, client))
    }

    /// Polls the socket until `engine.health` answers.
    async fn ready(&self) -> Result<Client, String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(client) = Client::connect(&self.socket).await {
                if client.health().await.is_ok() {
                    return Ok(client);
                }
            }
            let exited = {
                let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
                child.try_wait().ok().flatten()
            };
            if let Some(status) = exited {
                return Err(format!(
                    "the daemon exited ({status}) before it answered; its log: {}",
                    log_tail(self.dir.path())
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the daemon did not answer on {} within {READY_TIMEOUT:?}",
                    self.socket.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for HarnessDaemon {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The program to run `serve` with: `binary`, else this one.
pub(super) fn program(binary: Option<&Path>) -> Result<PathBuf, String> {
    match binary {
        Some(binary) => Ok(binary.to_owned()),
        None => std::env::current_exe()
            .map_err(|err| format!("find this program to run `serve`: {err}")),
    }
}

/// The end of the log of the daemon in `dir`, for an error message.
pub(super) fn log_tail(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// `binary serve` with the config in `dir`, its stderr in `dir/daemon.log`.
pub(super) fn spawn(binary: &Path, dir: &Path) -> Result<Child, String> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("daemon.log"))
        .map_err(|err| format!("open the daemon's log: {err}"))?;
    Command::new(binary)
        .arg("serve")
        .arg("--config")
        .arg(dir.join("config.toml"))
        .env_remove("PYVISOR_CONFIG")
        .env_remove("PYVISOR_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|err| format!("start {} serve: {err}", binary.display()))
}
