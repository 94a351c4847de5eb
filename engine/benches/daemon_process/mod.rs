//! The real `pyvisor serve` for the benches that measure the daemon: started in a home of
//! its own, killed when the bench ends, and a client once it answers.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pyvisor::client::Client;

/// Kills the daemon when the bench ends, a panic included.
pub struct DaemonGuard(Child);

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl DaemonGuard {
    /// The daemon's process id.
    #[allow(
        dead_code,
        reason = "used by the daemon bench, not by the cluster bench"
    )]
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

/// `pyvisor serve` on `home/pyvisor.sock` with `args` and the environment variables `env`
/// besides, its state and cache in `home`.
pub fn start_daemon(home: &Path, args: &[String], env: &[(&str, &str)]) -> DaemonGuard {
    let child = Command::new(env!("CARGO_BIN_EXE_pyvisor"))
        .args(["serve", "--socket"])
        .arg(home.join("pyvisor.sock"))
        .args(args)
        .current_dir(home)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("PYVISOR_STATE__DIR", home.join("daemon-state"))
        .env("PYVISOR_ENGINE__CACHE_DIR", home.join("cache"))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start pyvisor serve");
    DaemonGuard(child)
}

/// A client of the daemon at `socket`, once it answers `engine.health`.
pub async fn connect(socket: &Path) -> Client {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(client) = Client::connect(socket).await {
            if client.health().await.is_ok() {
                return client;
            }
        }
        assert!(Instant::now() < deadline, "the daemon never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
