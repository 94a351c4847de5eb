//! A throwaway PostgreSQL, for a cluster the harness runs (`[target] kind = "cluster"`) and
//! for the project's own cluster tests and bench, from Debian's packages as
//! `scripts/cluster-packages.sh` installs them: `initdb` in a temporary directory, the server
//! on a Unix socket in it only (no TCP), `fsync` off (the data dies with it). PostgreSQL
//! refuses to run as root: as root the server runs as the system user `pyvisor-pg`, which
//! that script creates. Stopped (fast shutdown) and removed when dropped; a test can restart
//! it on the same data ([`Postgres::stop`], [`Postgres::start_again`]).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The system user the server runs as when this process runs as root.
pub const SERVER_USER: &str = "pyvisor-pg";

/// The server's superuser, and the role the nodes connect as.
pub const ROLE: &str = "pyvisor";

/// How long the server has to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A running throwaway PostgreSQL.
pub struct Postgres {
    child: Child,
    dir: tempfile::TempDir,
    /// [`Postgres::stop`] stopped it.
    stopped: bool,
}

impl Postgres {
    /// Starts a server (`initdb`, then `postgres`); [`Postgres::create_database`] waits until
    /// it accepts connections.
    pub fn start() -> Result<Postgres, String> {
        let bin = bin_dir()?;
        let ids = server_ids()?;
        let dir = tempfile::Builder::new()
            .prefix("pyvisor-loadtest-pg-")
            .tempdir()
            .map_err(|err| format!("create PostgreSQL's directory: {err}"))?;
        let give = |path: &Path| match ids {
            Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .map_err(|err| format!("give {} to {SERVER_USER}: {err}", path.display())),
            None => Ok(()),
        };
        give(dir.path())?;
        let initdb = as_server_user(Command::new(bin.join("initdb")), ids)
            .current_dir(dir.path())
            .args([
                "--no-sync",
                "--auth=trust",
                "--encoding=UTF8",
                "--username",
                ROLE,
            ])
            .arg("-D")
            .arg(dir.path().join("data"))
            .output()
            .map_err(|err| format!("run {}: {err}", bin.join("initdb").display()))?;
        if !initdb.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&initdb.stderr).trim()
            ));
        }
        let log_path = dir.path().join("server.log");
        std::fs::File::create(&log_path)
            .map_err(|err| format!("create PostgreSQL's log: {err}"))?;
        give(&log_path)?;
        let child = serve(dir.path(), &bin, ids)?;
        Ok(Postgres {
            child,
            dir,
            stopped: false,
        })
    }

    /// Starts the server again on the same data after [`Postgres::stop`], as an operator's
    /// restart does; returns once it accepts connections.
    pub async fn start_again(&mut self) -> Result<(), String> {
        if self.stopped {
            self.child = serve(self.dir.path(), &bin_dir()?, server_ids()?)?;
            self.stopped = false;
        }
        ready(self.dir.path()).await.map(drop)
    }

    /// Stops the server: a fast shutdown (its connections end), then SIGKILL after 10 s.
    pub fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        // SIGINT is PostgreSQL's fast shutdown: it ends the backends and exits.
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The directory of the server's Unix socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        log(self.dir.path())
    }

    /// Waits until the server accepts connections, then creates the database `name`.
    pub async fn create_database(&self, name: &str) -> Result<(), String> {
        create_database(self.dir.path(), name).await
    }
}

/// The server of the data in `dir`, listening on a socket there only, its log appended to
/// `dir/server.log`.
fn serve(dir: &Path, bin: &Path, ids: Option<(u32, u32)>) -> Result<Child, String> {
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("server.log"))
        .map_err(|err| format!("open PostgreSQL's log: {err}"))?;
    as_server_user(Command::new(bin.join("postgres")), ids)
        .current_dir(dir)
        .arg("-D")
        .arg(dir.join("data"))
        .arg("-k")
        .arg(dir)
        .args(["-c", "listen_addresses=", "-c", "fsync=off"])
        .args(["-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|err| format!("start {}: {err}", bin.join("postgres").display()))
}

/// [`Postgres::create_database`] of the server whose socket is in `socket_dir`.
pub async fn create_database(socket_dir: &Path, name: &str) -> Result<(), String> {
    let client = ready(socket_dir).await?;
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .map_err(|err| format!("create the database {name}: {err}"))
}

/// A connection to the server whose socket is in `socket_dir`, once it accepts one.
async fn ready(socket_dir: &Path) -> Result<tokio_postgres::Client, String> {
    let admin = format!("host={} user={ROLE} dbname=postgres", socket_dir.display());
    let config: tokio_postgres::Config = admin
        .parse()
        .map_err(|err| format!("the server's address: {err}"))?;
    let deadline = Instant::now() + READY_TIMEOUT;
    let client = loop {
        match config.connect(tokio_postgres::NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                break client;
            }
            Err(err) if Instant::now() > deadline => {
                return Err(format!(
                    "PostgreSQL did not accept a connection ({err}); its log: {}",
                    log(socket_dir).trim()
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    Ok(client)
}

/// The log of the server in `dir`.
fn log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `command` run as the server's user when `ids` names one.
fn as_server_user(mut command: Command, ids: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = ids {
        command.uid(uid).gid(gid).env("HOME", "/tmp");
    }
    command
}

/// The uid and gid of [`SERVER_USER`] as root, none otherwise.
fn server_ids() -> Result<Option<(u32, u32)>, String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Ok(None);
    }
    match nix::unistd::User::from_name(SERVER_USER) {
        Ok(Some(user)) => Ok(Some((user.uid.as_raw(), user.gid.as_raw()))),
        _ => Err(format!(
            "PostgreSQL refuses to run as root, and there is no user {SERVER_USER} to run it \
             as: run scripts/cluster-packages.sh as root, which creates it"
        )),
    }
}

/// PostgreSQL's server binaries: `pg_config --bindir`, else the newest version under
/// `/usr/lib/postgresql` (Debian's layout).
fn bin_dir() -> Result<PathBuf, String> {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        .filter(|dir| dir.join("initdb").exists() && dir.join("postgres").exists());
    if let Some(dir) = from_pg_config {
        return Ok(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        "no PostgreSQL server binaries (initdb, postgres) under /usr/lib/postgresql: run \
         scripts/cluster-packages.sh as root, which installs Debian's postgresql package"
            .to_owned()
    })
}
