//! `pyvisor serve`: run the daemon in the foreground with the settings of the config file,
//! the environment and the command line.

use std::path::PathBuf;

use clap::Args;
use pyvisor::config::Settings;
use pyvisor::server::{self, HttpListen, Listen, Reload, ServeOptions};

use super::daemon::pidfile::{shown, PidFile};
use super::EXIT_USAGE;

/// Arguments of `pyvisor serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[arg(long, value_name = "PATH", help = super::config::CONFIG_HELP)]
    config: Option<PathBuf>,
    /// Unix socket to listen on (overrides `server.socket`).
    #[arg(long, value_name = "PATH", conflicts_with = "stdio")]
    socket: Option<PathBuf>,
    /// Also serve HTTP on this address (overrides `server.http`), e.g. 127.0.0.1:8787; a bare
    /// port binds 127.0.0.1.
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// Speak JSON-RPC on stdin/stdout instead of a socket.
    #[arg(long)]
    stdio: bool,
    /// The PID file to hold locked for the daemon's life (given by `pyvisor daemon start`).
    #[arg(long, value_name = "PATH", hide = true)]
    pid_file: Option<PathBuf>,
}

pub async fn run(args: ServeArgs) -> u8 {
    // Before anything else: a second daemon on this PID file must not touch the first's socket.
    let _pid_file = match args.pid_file.map(PidFile::new) {
        Some(file) => match file.hold() {
            Ok(Ok(held)) => Some(held),
            Ok(Err(pid)) => {
                eprintln!(
                    "pyvisor: already running (pid {}): {file} is held",
                    shown(pid)
                );
                return 1;
            }
            Err(err) => {
                eprintln!("pyvisor: failed to {err:#}");
                return 1;
            }
        },
        None => None,
    };
    let loaded = match Settings::load(args.config.as_deref()) {
        Ok(loaded) => loaded,
        Err(err) => {
            eprintln!("pyvisor: {err}");
            return EXIT_USAGE;
        }
    };
    let mut settings = loaded.settings;
    if let Some(socket) = args.socket {
        settings.server.socket = socket;
    }
    if let Some(http) = args.http {
        if pyvisor::config::http_addr(&http).is_none() {
            eprintln!(
                "pyvisor: --http expects an address such as 127.0.0.1:8787 or a port, got {http:?}"
            );
            return EXIT_USAGE;
        }
        settings.server.http = http;
    }
    let access = settings
        .server
        .socket_access()
        .and_then(|socket| Ok((socket, settings.server.http_access()?)));
    let (mut socket_access, http_access) = match access {
        Ok(access) => access,
        Err(err) => {
            eprintln!("pyvisor: {err}");
            return EXIT_USAGE;
        }
    };
    let cluster = settings
        .cluster
        .resolve(settings.http_addr().map(|addr| addr.to_string()), |var| {
            std::env::var(var).ok()
        });
    let cluster = match cluster {
        Ok(cluster) => cluster.map(|mut cluster| {
            cluster.token = settings.token().map(str::to_owned);
            cluster.max_sessions_per_owner = settings.engine_config().quotas.max_sessions_per_owner;
            cluster
        }),
        Err((key, message)) => {
            eprintln!("pyvisor: {key}: {message}");
            return EXIT_USAGE;
        }
    };
    let engine = settings.engine_config();
    // Session code runs under these uids: it never speaks to the daemon.
    socket_access.refused_uids = engine.sandbox.uid_range.clone();
    let listen = if args.stdio {
        Listen::Stdio
    } else {
        Listen::Socket(settings.socket_path())
    };
    let options = ServeOptions {
        engine,
        listen,
        socket_access,
        max_request_bytes: settings.server.max_request_bytes,
        max_connections: settings.server.max_connections,
        shutdown_grace: settings.shutdown_grace(),
        watchdog: settings.server.watchdog,
        http: settings.http_addr().map(|addr| HttpListen {
            addr,
            token: settings.token().map(str::to_owned),
            access: http_access,
        }),
        limit_ceilings: settings.limits.max.clone(),
        cluster,
    };
    // SIGHUP reads the file found at start again (or searches again if there was none).
    let config = args.config.or(loaded.source);
    let reload = Box::new(move || {
        let settings = Settings::load(config.as_deref())
            .map_err(|err| err.to_string())?
            .settings;
        Ok(Reload {
            pool: settings.pool_config(),
            limits: settings.limit_policy(),
        })
    });
    match server::serve(options, reload).await {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("pyvisor: failed to {err}");
            1
        }
    }
}
