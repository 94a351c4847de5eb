//! A throwaway PostgreSQL for the cluster tests, from Debian's packages: `initdb` in a temp
//! dir, the server listening on a Unix socket in that dir only (no TCP), one server per test
//! binary and one database per test.
//!
//! PostgreSQL refuses to run as root: as root (as CI runs), the server runs as the system user
//! `pyvisor-pg`, which `scripts/test.sh` creates. Nothing is skipped: a server that cannot be
//! started fails the test with the reason. The server is stopped, and its directory removed,
//! when the test binary exits.

#![allow(dead_code)] // the cluster tests and the cluster bench each use their own part

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// The system user the server runs as when the tests run as root.
pub const SERVER_USER: &str = "pyvisor-pg";

/// The server's superuser, and the role the nodes connect as.
pub const ROLE: &str = "pyvisor";

/// The server of this test binary, started by the first test that asks for a database.
static SERVER: Mutex<Option<Postgres>> = Mutex::new(None);

/// A running PostgreSQL; stopped and removed when dropped.
pub struct Postgres {
    child: Child,
    dir: TempDir,
}

/// A database of its own for one test.
#[derive(Debug, Clone)]
pub struct Database {
    /// The directory of the server's Unix socket.
    pub socket_dir: PathBuf,
    pub name: String,
}

impl Database {
    /// The connection string of `[cluster] store`.
    pub fn url(&self) -> String {
        format!(
            "host={} user={ROLE} dbname={}",
            self.socket_dir.display(),
            self.name
        )
    }

    /// The same, as a tokio-postgres config.
    pub fn config(&self) -> tokio_postgres::Config {
        self.url().parse().expect("a valid connection string")
    }

    /// A plain connection, for a test's own queries.
    pub async fn connect(&self) -> tokio_postgres::Client {
        connect(&self.config())
            .await
            .expect("connect to the test database")
    }
}

/// A way to the server's socket that a test can cut, as a network cut would: the link a
/// [`Database::through_link`] connects by.
pub struct Link {
    socket: PathBuf,
    link: PathBuf,
}

impl Link {
    /// Cuts the way: no new connection, and the open ones of the nodes (`application_name`
    /// `pyvisor`) to `db` ended.
    pub async fn cut(&self, db: &Database) {
        std::fs::remove_file(&self.link).expect("cut the link");
        db.connect()
            .await
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = $1 AND application_name = 'pyvisor'",
                &[&db.name],
            )
            .await
            .expect("end the node's connections");
    }

    /// Opens the way again.
    pub fn restore(&self) {
        std::os::unix::fs::symlink(&self.socket, &self.link).expect("restore the link");
    }
}

impl Database {
    /// This database reached through a link to the server's socket made in `dir`, and the
    /// link.
    pub fn through_link(&self, dir: &std::path::Path) -> (Database, Link) {
        std::fs::create_dir_all(dir).expect("the link's dir");
        let link = Link {
            socket: self.socket_dir.join(".s.PGSQL.5432"),
            link: dir.join(".s.PGSQL.5432"),
        };
        link.restore();
        let linked = Database {
            socket_dir: dir.to_owned(),
            name: self.name.clone(),
        };
        (linked, link)
    }
}

/// Polls `check` until it holds, up to 60 s; panics with `what` otherwise.
pub async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A new, empty database on this binary's server (started on first use).
pub async fn database() -> Database {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let socket_dir = {
        let mut server = SERVER.lock().unwrap_or_else(|p| p.into_inner());
        if server.is_none() {
            *server = Some(Postgres::start());
            // SAFETY: `stop_server` is a plain function that only takes the server out of
            // its mutex and drops it; registering it has no other effect.
            unsafe { libc::atexit(stop_server) };
        }
        server
            .as_ref()
            .expect("started above")
            .dir
            .path()
            .to_owned()
    };
    let name = format!(
        "test_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let admin = Database {
        socket_dir: socket_dir.clone(),
        name: "postgres".into(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let client = loop {
        match connect(&admin.config()).await {
            Ok(client) => break client,
            Err(err) if Instant::now() > deadline => {
                panic!("PostgreSQL never accepted a connection: {err}\n{}", log())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create the test database");
    Database { socket_dir, name }
}

async fn connect(config: &tokio_postgres::Config) -> Result<tokio_postgres::Client, String> {
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    Ok(client)
}

/// The server's log so far.
fn log() -> String {
    let server = SERVER.lock().unwrap_or_else(|p| p.into_inner());
    server
        .as_ref()
        .and_then(|server| std::fs::read_to_string(server.dir.path().join("server.log")).ok())
        .unwrap_or_default()
}

extern "C" fn stop_server() {
    let server = SERVER.lock().unwrap_or_else(|p| p.into_inner()).take();
    drop(server);
}

impl Postgres {
    fn start() -> Postgres {
        let bin = bin_dir();
        let (uid, gid) = server_ids();
        let dir = tempfile::Builder::new()
            .prefix("pyvisor-pg-")
            .tempdir()
            .expect("create the server's temp dir");
        if let Some(uid) = uid {
            std::os::unix::fs::chown(dir.path(), Some(uid), gid)
                .expect("give the server's dir to its user");
        }
        let data = dir.path().join("data");
        let initdb = as_server_user(Command::new(bin.join("initdb")), uid, gid)
            .current_dir(dir.path())
            .args([
                "--no-sync",
                "--auth=trust",
                "--encoding=UTF8",
                "--username",
                ROLE,
            ])
            .arg("-D")
            .arg(&data)
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", bin.join("initdb").display()));
        assert!(
            initdb.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&initdb.stdout),
            String::from_utf8_lossy(&initdb.stderr)
        );
        let log = std::fs::File::create(dir.path().join("server.log")).expect("the server log");
        if let Some(uid) = uid {
            std::os::unix::fs::chown(dir.path().join("server.log"), Some(uid), gid)
                .expect("give the log to the server's user");
        }
        let child = as_server_user(Command::new(bin.join("postgres")), uid, gid)
            .current_dir(dir.path())
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(dir.path())
            .args(["-c", "listen_addresses=", "-c", "fsync=off"])
            .args(["-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.join("postgres").display()));
        Postgres { child, dir }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // SIGINT is PostgreSQL's fast shutdown: it ends the backends and exits.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
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
}

/// Runs `command` as the server's user when one is given.
fn as_server_user(mut command: Command, uid: Option<u32>, gid: Option<u32>) -> Command {
    if let (Some(uid), Some(gid)) = (uid, gid) {
        command.uid(uid).gid(gid).env("HOME", "/tmp");
    }
    command
}

/// The uid and gid of [`SERVER_USER`] as root, none otherwise.
fn server_ids() -> (Option<u32>, Option<u32>) {
    if !nix::unistd::Uid::effective().is_root() {
        return (None, None);
    }
    match nix::unistd::User::from_name(SERVER_USER) {
        Ok(Some(user)) => (Some(user.uid.as_raw()), Some(user.gid.as_raw())),
        _ => panic!(
            "PostgreSQL refuses to run as root, and there is no user {SERVER_USER} to run it as: \
             run scripts/test.sh once as root, which creates it"
        ),
    }
}

/// The directory of PostgreSQL's server binaries: `pg_config --bindir`, else the newest
/// version under `/usr/lib/postgresql` (Debian's layout).
fn bin_dir() -> PathBuf {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        .filter(|dir| dir.join("initdb").exists() && dir.join("postgres").exists());
    if let Some(dir) = from_pg_config {
        return dir;
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
    match versions.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "no PostgreSQL server binaries (initdb, postgres) under /usr/lib/postgresql: \
             run scripts/test.sh once as root, which installs Debian's postgresql package"
        ),
    }
}
