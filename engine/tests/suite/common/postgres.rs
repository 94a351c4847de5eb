//! A throwaway PostgreSQL for the cluster tests (`pyvisor::loadtest::postgres`, which the
//! load-test harness's cluster uses too): `initdb` in a temp dir, the server listening on a
//! Unix socket in that dir only (no TCP), one server per test binary and one database per
//! test.
//!
//! PostgreSQL refuses to run as root: as root (as CI runs), the server runs as the system user
//! `pyvisor-pg`, which `scripts/test.sh` creates. Nothing is skipped: a server that cannot be
//! started fails the test with the reason. The server is stopped, and its directory removed,
//! when the test binary exits.

#![allow(dead_code)] // the cluster tests and the cluster bench each use their own part

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pyvisor::loadtest::postgres::{self as server, Postgres};

/// The server's superuser, and the role the nodes connect as.
pub const ROLE: &str = server::ROLE;

/// The server of this test binary, started by the first test that asks for a database.
static SERVER: Mutex<Option<Postgres>> = Mutex::new(None);

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
            let started = Postgres::start().unwrap_or_else(|err| panic!("{err}"));
            *server = Some(started);
            // SAFETY: `stop_server` is a plain function that only takes the server out of
            // its mutex and drops it; registering it has no other effect.
            unsafe { libc::atexit(stop_server) };
        }
        server
            .as_ref()
            .expect("started above")
            .socket_dir()
            .to_owned()
    };
    let name = format!(
        "test_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    if let Err(err) = server::create_database(&socket_dir, &name).await {
        panic!("{err}")
    }
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

extern "C" fn stop_server() {
    let server = SERVER.lock().unwrap_or_else(|p| p.into_inner()).take();
    drop(server);
}
