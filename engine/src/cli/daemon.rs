//! `pyvisor daemon start|stop|status`: run `pyvisor serve` in the background, owned through a
//! PID file, for hosts without systemd (under systemd, use the unit in `examples/systemd/`).
//!
//! `start` spawns `pyvisor serve` in a new session with its output appended to the log file;
//! the daemon takes and writes the PID file, and `start` returns once the socket answers `engine.health`. `stop` sends
//! SIGTERM (the daemon drains, checkpoints and exits), waits, and with `--force` SIGKILLs the
//! daemon's process group when it takes too long. `status` reads the PID file and asks the
//! socket for figures. The daemon holds an `flock` on its PID file for its whole life
//! (`pidfile`): a PID file is believed only while its lock is held; otherwise it is stale,
//! reported, and replaced or removed, and its pid is never signalled. The PID file, socket and
//! log are the ones `pyvisor config check` shows.
//!
//! Exit status (start/stop follow LSB init scripts, status LSB's `status` action):
//! - `start`: 0 started or already running; 1 failed to start, or a daemon that `daemon
//!   start` does not own already answers on the socket; 2 usage or configuration error.
//! - `stop`: 0 stopped, killed with `--force`, or not running; 1 still stopping after the
//!   timeout (without `--force`) or no PID to signal; 2 usage or configuration error.
//! - `status`: 0 running; 1 not running but a stale PID file is left; 3 not running;
//!   4 running but its socket does not answer; 2 usage or configuration error.

pub(super) mod pidfile;
mod process;

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use pyvisor::client::{Client, ClientError};
use pyvisor::config::Settings;
use pyvisor::rpc::wire::Health;

use self::pidfile::{shown, Holder, PidFile};
use super::EXIT_USAGE;

/// How long `start` waits for the new daemon to answer on its socket.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How much longer than `server.shutdown_grace_s` `stop` waits by default: the daemon
/// checkpoints every session after the grace period.
const STOP_MARGIN: Duration = Duration::from_secs(10);

/// How long `stop --force` waits for the process to vanish after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How long `stop` waits, once the daemon released its PID file, for its process to be gone.
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// How long connecting to the daemon's socket, or one call on it, may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Lines of the log shown when the daemon fails to start.
const LOG_TAIL_LINES: usize = 20;

/// Variables by which a service manager talks to *its* main process; the background daemon
/// is not that process.
const SERVICE_MANAGER_VARS: &[&str] = &[
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
];

/// LSB exit status of `status` when the daemon is not running.
const EXIT_NOT_RUNNING: u8 = 3;

/// LSB exit status of `status` when the state cannot be told (the socket does not answer).
const EXIT_UNKNOWN: u8 = 4;

/// Subcommands of `pyvisor daemon`.
#[derive(Debug, Subcommand)]
pub enum DaemonCommand {
    /// Start `pyvisor serve` in the background; return once its socket answers.
    Start(ConfigArg),
    /// Stop the background daemon: SIGTERM, wait, and with --force SIGKILL.
    Stop(StopArgs),
    /// Say whether the daemon runs, with its pid, socket, uptime, sessions and pool.
    Status(ConfigArg),
    /// Drain this cluster node for an upgrade: it takes no new session, hands each session it
    /// holds over to the cluster store (other nodes serve them at their next request) and
    /// exits when none is left. Waits for the exit.
    Drain(DrainArgs),
}

/// Arguments of `pyvisor daemon drain`.
#[derive(Debug, Args)]
pub struct DrainArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Seconds to wait for the node to hand its sessions over and exit (default 600).
    #[arg(long, value_name = "SECS", default_value_t = 600.0)]
    timeout: f64,
}

/// The config file option every `daemon` command takes, as `serve` does.
#[derive(Debug, Args)]
pub struct ConfigArg {
    #[arg(long, value_name = "PATH", help = super::config::CONFIG_HELP)]
    config: Option<PathBuf>,
}

/// Arguments of `pyvisor daemon stop`.
#[derive(Debug, Args)]
pub struct StopArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// SIGKILL the daemon's process group if it has not exited within the timeout.
    #[arg(long)]
    force: bool,
    /// Seconds to wait for the daemon to exit after SIGTERM (default: server.shutdown_grace_s
    /// + 10).
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
}

pub async fn run(command: DaemonCommand) -> u8 {
    let config = match &command {
        DaemonCommand::Start(args) | DaemonCommand::Status(args) => args.config.clone(),
        DaemonCommand::Stop(args) => args.config.config.clone(),
        DaemonCommand::Drain(args) => args.config.config.clone(),
    };
    let daemon = match Daemon::load(config.as_deref()) {
        Ok(daemon) => daemon,
        Err(err) => {
            eprintln!("pyvisor: {err}");
            return EXIT_USAGE;
        }
    };
    let (result, failed) = match command {
        DaemonCommand::Start(_) => (daemon.start().await, 1),
        DaemonCommand::Stop(args) => (daemon.stop(args).await, 1),
        DaemonCommand::Status(_) => (daemon.status().await, EXIT_UNKNOWN),
        DaemonCommand::Drain(args) => (daemon.drain(args.timeout).await, 1),
    };
    result.unwrap_or_else(|err| {
        eprintln!("pyvisor: failed to {err:#}");
        failed
    })
}

/// The daemon as the configuration describes it.
struct Daemon {
    settings: Settings,
    /// The config file found; handed to `serve` so that it reads the same one.
    source: Option<PathBuf>,
    pid_file: PidFile,
    socket: PathBuf,
    /// This binary: a daemon started from it counts as ours whatever it is named.
    exe: Option<PathBuf>,
}

impl Daemon {
    fn load(config: Option<&Path>) -> Result<Daemon, pyvisor::errors::ConfigError> {
        let loaded = Settings::load(config)?;
        Ok(Daemon {
            pid_file: PidFile::new(loaded.settings.pid_file()),
            socket: loaded.settings.socket_path(),
            settings: loaded.settings,
            source: loaded.source,
            exe: std::env::current_exe().ok(),
        })
    }

    async fn start(&self) -> anyhow::Result<u8> {
        let _lock = self.pid_file.lock()?;
        match self.pid_file.probe()? {
            Holder::Live(pid) => {
                println!("pyvisor: already running (pid {})", shown(pid));
                return Ok(0);
            }
            Holder::Stale(reason) => eprintln!(
                "pyvisor: stale PID file {}: {reason}; replacing it",
                self.pid_file
            ),
            Holder::Missing => {}
        }
        if health(&self.socket).await.is_ok() {
            eprintln!(
                "pyvisor: a daemon that `pyvisor daemon start` did not start (no PID file) \
                 already answers on {}",
                self.socket.display()
            );
            return Ok(1);
        }

        let log_path = self.settings.log_file();
        let log = open_log(&log_path)?;
        let log_start = log.metadata().map_or(0, |meta| meta.len());
        let mut child = self.spawn_serve(log)?;
        let pid = child.id();

        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().context("wait for the daemon")? {
                eprintln!("pyvisor: the daemon exited during start-up ({status})");
                eprint!("{}", log_tail(&log_path, log_start, LOG_TAIL_LINES));
                self.pid_file.remove_unheld()?;
                return Ok(1);
            }
            if let Ok(health) = health(&self.socket).await {
                if health.status == "ok" {
                    break;
                }
            }
            if Instant::now() >= deadline {
                eprintln!(
                    "pyvisor: the daemon (pid {pid}) did not answer on {} within {}s; it may \
                     still be starting: see {}",
                    self.socket.display(),
                    START_TIMEOUT.as_secs(),
                    log_path.display()
                );
                return Ok(1);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!(
            "pyvisor: started (pid {pid}, socket {})",
            self.socket.display()
        );
        Ok(0)
    }

    /// Spawns `pyvisor serve` detached: a new session (no controlling terminal, its own
    /// process group), stdin from /dev/null, stdout and stderr appended to `log`. It keeps
    /// the working directory and environment, so relative paths and `PYVISOR_*` overrides mean
    /// what they meant here.
    /// The daemon holds the PID file (`--pid-file`) from its first step to its exit.
    fn spawn_serve(&self, log: File) -> anyhow::Result<Child> {
        let exe = self
            .exe
            .as_deref()
            .context("find the pyvisor binary to run")?;
        let mut command = Command::new(exe);
        command
            .arg("serve")
            .arg("--pid-file")
            .arg(self.pid_file.path());
        if let Some(config) = &self.source {
            command.arg("--config").arg(config);
        }
        for var in SERVICE_MANAGER_VARS {
            command.env_remove(var);
        }
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("open the daemon's log")?)
            .stderr(log);
        // SAFETY: setsid is a single async-signal-safe syscall; nothing is allocated or
        // locked between fork and exec.
        unsafe {
            command.pre_exec(|| nix::unistd::setsid().map(drop).map_err(Into::into));
        }
        command
            .spawn()
            .with_context(|| format!("start {} serve", exe.display()))
    }

    async fn stop(&self, args: StopArgs) -> anyhow::Result<u8> {
        let timeout = match args.timeout {
            Some(secs) => match Duration::try_from_secs_f64(secs) {
                Ok(timeout) => timeout,
                Err(_) => {
                    eprintln!("pyvisor: --timeout must be 0 or more seconds, got {secs}");
                    return Ok(EXIT_USAGE);
                }
            },
            None => self.settings.shutdown_grace().saturating_add(STOP_MARGIN),
        };
        let lock = self.pid_file.lock()?;
        let status = self.stop_locked(timeout, args.force).await?;
        if status == 0 {
            // No daemon is left: neither is its lock file.
            lock.remove()?;
        }
        Ok(status)
    }

    /// `node.drain`, then waits until the daemon's socket no longer answers: it has handed
    /// every session over and exited.
    async fn drain(&self, timeout: f64) -> anyhow::Result<u8> {
        let Ok(timeout) = Duration::try_from_secs_f64(timeout) else {
            eprintln!("pyvisor: --timeout must be 0 or more seconds, got {timeout}");
            return Ok(EXIT_USAGE);
        };
        let client = within("connect", Client::connect(&self.socket)).await?;
        within(
            "node.drain",
            client.call("node.drain", serde_json::json!({})),
        )
        .await?;
        drop(client);
        println!("pyvisor: draining: the node hands its sessions over to the cluster, then exits");
        let deadline = Instant::now() + timeout;
        while health(&self.socket).await.is_ok() {
            if Instant::now() >= deadline {
                eprintln!(
                    "pyvisor: the node still runs after {}; it goes on draining: run                      `pyvisor cluster status` to follow it",
                    seconds(timeout)
                );
                return Ok(1);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!("pyvisor: drained; the node has exited");
        Ok(0)
    }

    /// `stop` with the PID file's lock held.
    async fn stop_locked(&self, timeout: Duration, force: bool) -> anyhow::Result<u8> {
        let pid = match self.pid_file.probe()? {
            Holder::Live(Some(pid)) => pid,
            Holder::Live(None) => {
                eprintln!(
                    "pyvisor: the daemon holding {} has not written its pid yet; no PID to signal",
                    self.pid_file
                );
                return Ok(1);
            }
            holder => {
                if let Holder::Stale(reason) = holder {
                    self.pid_file.remove_unheld()?;
                    eprintln!(
                        "pyvisor: removed the stale PID file {}: {reason}",
                        self.pid_file
                    );
                }
                if health(&self.socket).await.is_ok() {
                    eprintln!(
                        "pyvisor: a daemon that `pyvisor daemon start` did not start (no PID \
                         file) answers on {}; stop it the way it was started",
                        self.socket.display()
                    );
                    return Ok(1);
                }
                println!("pyvisor: not running");
                return Ok(0);
            }
        };

        process::terminate(pid).with_context(|| format!("send SIGTERM to {pid}"))?;
        if self.pid_file.wait_released(timeout).await? {
            self.pid_file.remove_unheld()?;
            process::wait_gone(pid, EXIT_WAIT).await;
            println!("pyvisor: stopped (pid {pid})");
            return Ok(0);
        }
        if !force {
            eprintln!(
                "pyvisor: the daemon (pid {pid}) is still stopping after {}; wait, or run \
                 `pyvisor daemon stop --force`",
                seconds(timeout)
            );
            return Ok(1);
        }
        eprintln!(
            "pyvisor: the daemon (pid {pid}) did not stop within {}; sending SIGKILL to its \
             process group",
            seconds(timeout)
        );
        process::kill_group(pid).with_context(|| format!("send SIGKILL to {pid}"))?;
        if !self.pid_file.wait_released(KILL_WAIT).await? {
            eprintln!("pyvisor: process {pid} survived SIGKILL");
            return Ok(1);
        }
        self.pid_file.remove_unheld()?;
        process::wait_gone(pid, EXIT_WAIT).await;
        // Killed, it could not remove its socket; a later `serve` would replace it anyway.
        if health(&self.socket).await.is_err() {
            let _ = std::fs::remove_file(&self.socket);
        }
        println!("pyvisor: killed (pid {pid})");
        Ok(0)
    }

    async fn status(&self) -> anyhow::Result<u8> {
        let pid = match self.pid_file.probe()? {
            Holder::Live(pid) => Some(shown(pid)),
            Holder::Missing => None,
            Holder::Stale(reason) => {
                println!(
                    "pyvisor: not running (stale PID file {}: {reason})",
                    self.pid_file
                );
                return Ok(1);
            }
        };
        let figures = async {
            let client = within("connect", Client::connect(&self.socket)).await?;
            let health = within("engine.health", client.health()).await?;
            let stats = within("engine.stats", client.stats()).await?;
            anyhow::Ok((health, stats))
        };
        let (health, stats) = match (&pid, figures.await) {
            (_, Ok(figures)) => figures,
            (None, Err(_)) => {
                println!("pyvisor: not running");
                return Ok(EXIT_NOT_RUNNING);
            }
            (Some(pid), Err(err)) => {
                println!("pyvisor: running (pid {pid}) but not answering: {err:#}");
                return Ok(EXIT_UNKNOWN);
            }
        };
        let pool = &stats.pool;
        match pid {
            Some(pid) => println!("pyvisor: running (pid {pid})"),
            None => {
                println!("pyvisor: running (pid unknown: not started by `pyvisor daemon start`)")
            }
        }
        println!("  socket:     {}", self.socket.display());
        if let Some(addr) = self.settings.http_addr() {
            println!("  http:       http://{addr} (metrics at http://{addr}/metrics)");
        }
        println!(
            "  state:      {} (version {})",
            health.status, health.version
        );
        println!("  uptime:     {}", uptime(health.uptime_s));
        println!("  sessions:   {}", stats.sessions);
        println!(
            "  pool:       {} idle, {} active, {} warming, at most {}",
            pool.idle, pool.active, pool.warming, pool.max_total
        );
        println!(
            "  executions: {} ({} crashes, {} restores)",
            stats.executions, stats.crashes, stats.restores
        );
        Ok(0)
    }
}

/// `engine.health` of the daemon at `socket`.
async fn health(socket: &Path) -> anyhow::Result<Health> {
    let client = within("connect", Client::connect(socket)).await?;
    within("engine.health", client.health()).await
}

/// `call` (`what` names it) within [`PROBE_TIMEOUT`]: a daemon that hangs is not one that
/// answers.
async fn within<T>(
    what: &str,
    call: impl Future<Output = Result<T, ClientError>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(PROBE_TIMEOUT, call).await {
        Ok(result) => Ok(result?),
        Err(_) => bail!("{what}: no answer within {}s", PROBE_TIMEOUT.as_secs()),
    }
}

/// Opens the daemon's log for appending (0600, directory created 0700).
fn open_log(path: &Path) -> anyhow::Result<File> {
    pidfile::create_private_dir(path)?;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("open {}", path.display()))
}

/// The last `lines` lines the log received after byte `from`, each indented, for an error.
fn log_tail(path: &Path, from: u64, lines: usize) -> String {
    let mut text = String::new();
    let read = File::open(path).and_then(|mut file| {
        file.seek(SeekFrom::Start(from))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        text = String::from_utf8_lossy(&bytes).into_owned();
        Ok(())
    });
    if read.is_err() || text.trim().is_empty() {
        return format!("  (nothing in {})\n", path.display());
    }
    let all: Vec<&str> = text.lines().collect();
    let shown = &all[all.len().saturating_sub(lines)..];
    let mut tail = format!("  last lines of {}:\n", path.display());
    for line in shown {
        tail.push_str("  | ");
        tail.push_str(line);
        tail.push('\n');
    }
    tail
}

/// `1d 2h 3m 4s`, leaving out leading zero units.
fn uptime(seconds: f64) -> String {
    let total = if seconds.is_finite() && seconds > 0.0 {
        seconds as u64
    } else {
        0
    };
    let parts = [
        (total / 86_400, "d"),
        (total / 3_600 % 24, "h"),
        (total / 60 % 60, "m"),
        (total % 60, "s"),
    ];
    let first = parts.iter().position(|&(n, _)| n > 0).unwrap_or(3);
    parts[first..]
        .iter()
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A duration in seconds, as options give them.
fn seconds(duration: Duration) -> String {
    format!("{}s", duration.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uptime_leaves_out_leading_zero_units() {
        assert_eq!(uptime(0.0), "0s");
        assert_eq!(uptime(4.9), "4s");
        assert_eq!(uptime(61.0), "1m 1s");
        assert_eq!(uptime(3_600.0), "1h 0m 0s");
        assert_eq!(uptime(93_784.0), "1d 2h 3m 4s");
        assert_eq!(uptime(-3.0), "0s");
        assert_eq!(uptime(f64::NAN), "0s");
    }

    #[test]
    fn log_tail_shows_only_what_this_start_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pyvisor.log");
        std::fs::write(&path, "old run\n").unwrap();
        let from = std::fs::metadata(&path).unwrap().len();
        let mut text = String::from("old run\n");
        for n in 0..30 {
            text.push_str(&format!("line {n}\n"));
        }
        std::fs::write(&path, &text).unwrap();
        let tail = log_tail(&path, from, 3);
        assert_eq!(
            tail,
            format!(
                "  last lines of {}:\n  | line 27\n  | line 28\n  | line 29\n",
                path.display()
            )
        );
        let empty = log_tail(&path, text.len() as u64, 3);
        assert!(empty.contains("nothing in"), "{empty}");
    }
}
