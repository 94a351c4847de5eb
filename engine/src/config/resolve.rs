//! What the settings of the config file mean to the rest of the program: the socket, PID
//! file and log paths with their defaults, and the [`EngineConfig`], pool sizes and session
//! limits the engine and the server run with.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pyvisor_actors::pool::PoolConfig;
use pyvisor_actors::session::AutoCheckpoint;
use pyvisor_actors::supervisor::Quotas;
use pyvisor_actors::SessionLimits;

use super::file::Settings;
use super::{EngineConfig, StateConfig};
use crate::rpc::LimitPolicy;

impl Settings {
    /// The Unix socket: `server.socket`, else `$XDG_RUNTIME_DIR/pyvisor/pyvisor.sock`, else
    /// `~/.pyvisor/pyvisor.sock`.
    pub fn socket_path(&self) -> PathBuf {
        self.socket_path_in(|name| std::env::var_os(name))
    }

    /// [`Settings::socket_path`] with the environment given.
    fn socket_path_in(&self, var: impl Fn(&str) -> Option<OsString>) -> PathBuf {
        if !self.server.socket.as_os_str().is_empty() {
            return self.server.socket.clone();
        }
        let var = |name| {
            var(name)
                .filter(|value| !value.is_empty())
                .map(PathBuf::from)
        };
        if let Some(runtime) = var("XDG_RUNTIME_DIR").filter(|dir| dir.is_absolute()) {
            return runtime.join("pyvisor").join("pyvisor.sock");
        }
        // Without a home, the temp dir; the server refuses a directory another user owns.
        let home = var("HOME").unwrap_or_else(std::env::temp_dir);
        home.join(".pyvisor").join("pyvisor.sock")
    }

    /// The PID file: `server.pid_file`, else `pyvisor.pid` beside the socket.
    pub fn pid_file(&self) -> PathBuf {
        self.beside_socket(&self.server.pid_file, "pyvisor.pid")
    }

    /// The daemon's log: `server.log_file`, else `pyvisor.log` beside the socket.
    pub fn log_file(&self) -> PathBuf {
        self.beside_socket(&self.server.log_file, "pyvisor.log")
    }

    /// `path`, or `name` in the socket's directory when `path` is empty.
    fn beside_socket(&self, path: &Path, name: &str) -> PathBuf {
        if path.as_os_str().is_empty() {
            self.socket_path().with_file_name(name)
        } else {
            path.to_path_buf()
        }
    }

    /// The HTTP listen address, if an HTTP server is asked for.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        http_addr(&self.server.http)
    }

    /// The bearer token HTTP requests must carry, if any.
    pub fn token(&self) -> Option<&str> {
        Some(self.server.token.as_str()).filter(|token| !token.is_empty())
    }

    /// How long running executions may finish after SIGTERM.
    pub fn shutdown_grace(&self) -> Duration {
        duration(self.server.shutdown_grace_s)
    }

    /// The pool's sizes and timeouts.
    pub fn pool_config(&self) -> PoolConfig {
        let pool = &self.pool;
        PoolConfig {
            min_idle: pool.min_idle,
            max_idle: pool.max_idle,
            max_total: pool.max_total,
            idle_ttl: duration(pool.idle_ttl_s),
            acquire_timeout: duration(pool.acquire_timeout_s),
        }
    }

    /// The default limits of every session.
    pub fn limits(&self) -> SessionLimits {
        let limits = &self.limits;
        let nonzero = |n: u64| Some(n).filter(|&n| n > 0);
        SessionLimits {
            timeout: duration(limits.timeout_s),
            output_bytes: limits.output_bytes,
            result_repr_bytes: limits.result_repr_bytes,
            input_timeout: duration(limits.input_timeout_s),
            interrupt_grace: duration(limits.interrupt_grace_s),
            memory_mb: nonzero(limits.memory_mb),
            cpu_s: nonzero(limits.cpu_s),
            open_files: nonzero(limits.open_files),
            processes: nonzero(limits.processes),
            file_bytes: limits.file_bytes,
            disk_mb: nonzero(limits.disk_mb),
        }
    }

    /// The default limits of every session, under the ceilings clients may ask up to.
    pub fn limit_policy(&self) -> LimitPolicy {
        LimitPolicy {
            defaults: self.limits(),
            ceilings: self.limits.max.clone(),
        }
    }

    /// What one owner may hold, and when an idle session is closed.
    pub fn quotas(&self) -> Quotas {
        let limits = &self.limits;
        Quotas {
            max_sessions_per_owner: Some(limits.max_sessions_per_owner).filter(|&n| n > 0),
            idle_timeout: Some(limits.idle_timeout_s)
                .filter(|&s| s > 0.0)
                .map(duration),
        }
    }

    /// The configuration of the daemon's engine.
    pub fn engine_config(&self) -> EngineConfig {
        let defaults = EngineConfig::default();
        let engine = &self.engine;
        let state = &self.state;
        let dir = |path: &PathBuf| Some(path.clone()).filter(|p| !p.as_os_str().is_empty());
        EngineConfig {
            python: engine.python.clone(),
            pool: self.pool_config(),
            preload: engine.preload.clone(),
            zygote: engine.zygote,
            limits: self.limits(),
            quotas: self.quotas(),
            cache_dir: dir(&engine.cache_dir),
            handshake_timeout: duration(engine.handshake_timeout_s),
            arbiters: match engine.arbiters {
                0 => defaults.arbiters,
                n => n,
            },
            use_cgroups: engine.use_cgroups,
            state: StateConfig {
                enabled: state.enabled,
                dir: dir(&state.dir),
                retention: state.retention,
                max_bytes: Some(state.max_bytes).filter(|bytes| *bytes > 0),
                session_disk_bytes: state.session_disk_mb.saturating_mul(1024 * 1024),
                total_disk_bytes: state.total_disk_mb.saturating_mul(1024 * 1024),
                auto: AutoCheckpoint {
                    after_changes: state.auto_after_changes,
                    min_interval: duration(state.auto_min_interval_s),
                    durability: state.durability,
                },
            },
            proactive: self.proactive.config(),
            sandbox: self.sandbox.config(),
            memory: self.memory.config(),
            llm: self.llm.config(),
            client_llm: self.llm.client_config(),
            ..defaults
        }
    }
}

/// An HTTP listen address: `host:port`, or a bare `port` (or `:port`) on the loopback
/// address, the default bind of docs/protocol.md (HTTP).
pub fn http_addr(value: &str) -> Option<SocketAddr> {
    let port = value.strip_prefix(':').unwrap_or(value);
    if let Ok(port) = port.parse::<u16>() {
        return Some(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    value.parse().ok()
}

/// Seconds as a duration; out-of-range values (only possible without validation) saturate.
fn duration(seconds: f64) -> Duration {
    if seconds.is_nan() || seconds <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_port_binds_the_loopback_address() {
        assert_eq!(http_addr("8787"), "127.0.0.1:8787".parse().ok());
        assert_eq!(http_addr(":8787"), "127.0.0.1:8787".parse().ok());
        assert_eq!(http_addr("0.0.0.0:80"), "0.0.0.0:80".parse().ok());
        assert_eq!(http_addr("[::1]:80"), "[::1]:80".parse().ok());
        assert_eq!(http_addr("localhost"), None);
        assert_eq!(http_addr(""), None);
    }

    #[test]
    fn socket_pid_and_log_files_default_beside_each_other() {
        fn vars(runtime: Option<&'static str>) -> impl Fn(&str) -> Option<OsString> {
            move |name| match name {
                "XDG_RUNTIME_DIR" => runtime.map(OsString::from),
                "HOME" => Some("/home/ada".into()),
                _ => None,
            }
        }
        let mut settings = Settings::default();
        assert_eq!(
            settings.socket_path_in(vars(Some("/run/user/1000"))),
            Path::new("/run/user/1000/pyvisor/pyvisor.sock")
        );
        assert_eq!(
            settings.socket_path_in(vars(None)),
            Path::new("/home/ada/.pyvisor/pyvisor.sock")
        );
        assert_eq!(
            settings.socket_path_in(vars(Some("relative"))),
            Path::new("/home/ada/.pyvisor/pyvisor.sock")
        );
        settings.server.socket = "/srv/pyvisor/api.sock".into();
        assert_eq!(
            settings.socket_path_in(vars(None)),
            Path::new("/srv/pyvisor/api.sock")
        );
        assert_eq!(settings.pid_file(), Path::new("/srv/pyvisor/pyvisor.pid"));
        assert_eq!(settings.log_file(), Path::new("/srv/pyvisor/pyvisor.log"));
        settings.server.pid_file = "/run/pyvisor.pid".into();
        settings.server.log_file = "/var/log/pyvisor.log".into();
        assert_eq!(settings.pid_file(), Path::new("/run/pyvisor.pid"));
        assert_eq!(settings.log_file(), Path::new("/var/log/pyvisor.log"));
    }
}
