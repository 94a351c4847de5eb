//! The life of `pyvisor serve`: start the engine and the listeners, tell systemd when the
//! pool is warm, ping its watchdog, reload pool and limit settings on SIGHUP, and on
//! SIGTERM/SIGINT (or the end of stdin with `--stdio`) stop gracefully: refuse new work,
//! let running executions finish within the grace period, checkpoint every session, close
//! the connections once their answers are written, and return.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use super::http::{install_prometheus, HttpOptions, HttpServer};
use super::stdio::serve_stdio;
use super::systemd;
use super::unix::{SocketAccess, UnixServer};
use crate::cluster::{ClusterConfig, Node};
use crate::config::LimitCeilings;
use crate::errors::ServeError;
use crate::rpc::{Dispatcher, LimitPolicy};
use crate::{Engine, EngineConfig, PoolConfig};

/// How long `serve` waits for the pool to warm before it reports ready anyway.
const WARM_WAIT: Duration = Duration::from_secs(60);

/// Where the JSON-RPC API is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A Unix socket at this path.
    Socket(PathBuf),
    /// The process's stdin and stdout.
    Stdio,
}

/// Everything `serve` needs, resolved from the config file and the command line.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub engine: EngineConfig,
    pub listen: Listen,
    /// Who may use the socket, and as whom.
    pub socket_access: SocketAccess,
    pub max_request_bytes: usize,
    pub max_connections: usize,
    /// How long running executions may finish after SIGTERM.
    pub shutdown_grace: Duration,
    /// Ping systemd's watchdog when it asks for pings.
    pub watchdog: bool,
    /// Also serve HTTP (docs/protocol.md (HTTP)).
    pub http: Option<HttpListen>,
    /// The most a client may ask for in a session's limits (`[limits.max]`).
    pub limit_ceilings: LimitCeilings,
    /// The cluster this node joins (`[cluster]`); `None` for a node alone.
    pub cluster: Option<ClusterConfig>,
}

/// Where and how the HTTP API is served.
#[derive(Debug, Clone)]
pub struct HttpListen {
    pub addr: SocketAddr,
    /// The admin token, if any.
    pub token: Option<String>,
    /// Owner tokens, allowed origins and hosts, the request timeout.
    pub access: super::HttpAccess,
}

/// The settings a SIGHUP applies to the running daemon.
#[derive(Debug, Clone)]
pub struct Reload {
    pub pool: PoolConfig,
    pub limits: LimitPolicy,
}

/// Reads the settings again for a SIGHUP; the error says why they are unusable.
pub type Reloader = Box<dyn Fn() -> Result<Reload, String> + Send + Sync>;

/// Runs the daemon until a graceful stop has completed.
pub async fn serve(options: ServeOptions, reload: Reloader) -> Result<(), ServeError> {
    // Handlers first: a signal that arrives while the pool warms is acted on, not fatal.
    let mut terminate = signal(SignalKind::terminate()).map_err(ServeError::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(ServeError::Signals)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(ServeError::Signals)?;
    let min_idle = options.engine.pool.min_idle;
    let limits = LimitPolicy {
        defaults: options.engine.limits.clone(),
        ceilings: options.limit_ceilings.clone(),
    };
    // Bind before starting workers, so a second daemon fails fast and starts nothing.
    let listener = match &options.listen {
        Listen::Socket(path) => Some(UnixServer::bind(path, options.socket_access.group).await?),
        Listen::Stdio => None,
    };
    let mut engine_config = options.engine;
    if let Some(cluster) = &options.cluster {
        engine_config.memory.shared = Some(crate::cluster::memory::opener(cluster));
    }
    let engine = Engine::start(engine_config)
        .await
        .map_err(ServeError::Engine)?;
    let dispatcher = Dispatcher::new(engine.clone(), limits);
    let mut drained = None;
    if let Some(cluster) = options.cluster {
        let node = Node::start(cluster, engine.clone())
            .await
            .map_err(ServeError::Cluster)?;
        drained = Some(node.drained());
        dispatcher.join_cluster(node);
    }
    // A drained node stops as on SIGTERM; a node outside a cluster never drains.
    let drained = async move {
        match drained {
            Some(mut drained) => {
                let _ = drained.wait_for(|done| *done).await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::pin!(drained);
    let (stop_tx, stop_rx) = watch::channel(false);

    // HTTP first: it installs the Prometheus recorder, and what the engine records before
    // there is one is lost, so no request may be served before it (the socket's included).
    let ready = Arc::new(AtomicBool::new(false));
    let http = match options.http {
        Some(listen) => Some(start_http(
            listen,
            dispatcher.clone(),
            (options.max_request_bytes, options.max_connections),
            ready.clone(),
        )?),
        None => None,
    };

    let mut serving = tokio::task::JoinSet::new();
    let listener = listener.map(Arc::new);
    if let Some(listener) = &listener {
        // One line per listener on stderr (the journal, or the daemon's log file), whatever
        // the log level: where to reach this daemon.
        eprintln!(
            "pyvisor: JSON-RPC on unix socket {}",
            listener.path().display()
        );
        let listener = listener.clone();
        let dispatcher = dispatcher.clone();
        let access = Arc::new(options.socket_access.clone());
        let stop = stop_rx.clone();
        let (max_request_bytes, max_connections) =
            (options.max_request_bytes, options.max_connections);
        serving.spawn(async move {
            listener
                .serve(dispatcher, access, max_request_bytes, max_connections, stop)
                .await;
        });
    }
    let (stdio_done_tx, mut stdio_done) = watch::channel(false);
    if options.listen == Listen::Stdio {
        let dispatcher = dispatcher.clone();
        let stop = stop_rx.clone();
        let max_request_bytes = options.max_request_bytes;
        serving.spawn(async move {
            serve_stdio(dispatcher, max_request_bytes, stop).await;
            let _ = stdio_done_tx.send(true);
        });
    }

    if let Some(http) = &http {
        let addr = http.local_addr();
        eprintln!("pyvisor: HTTP on http://{addr} (metrics at http://{addr}/metrics)");
    }
    let warming = {
        let (engine, ready) = (engine.clone(), ready.clone());
        tokio::spawn(async move {
            wait_until_warm(&engine, min_idle).await;
            ready.store(true, Ordering::SeqCst);
            systemd::ready();
            tracing::info!("ready");
        })
    };
    let watchdog = options
        .watchdog
        .then(systemd::watchdog_interval)
        .flatten()
        .map(|interval| tokio::spawn(ping_watchdog(engine.clone(), interval)));

    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            _ = stdio_done.wait_for(|done| *done) => break,
            _ = &mut drained => break,
            _ = hangup.recv() => apply_reload(&engine, &dispatcher, &reload).await,
        }
    }

    tracing::info!(grace = ?options.shutdown_grace, "stopping");
    warming.abort();
    ready.store(false, Ordering::SeqCst);
    systemd::stopping();
    dispatcher.set_stopping();
    if let Some(watchdog) = watchdog {
        watchdog.abort();
    }
    if let Err(err) = engine.shutdown(options.shutdown_grace).await {
        tracing::warn!(error = %err, "the engine did not stop cleanly");
    }
    // Executions have ended and their answers are queued: close the connections once
    // they are written.
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while serving.join_next().await.is_some() {}
    })
    .await;
    drop(listener);
    if let Some(http) = http {
        http.stop(Duration::from_secs(5)).await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Starts the HTTP server, with `/metrics` from a Prometheus recorder installed now.
fn start_http(
    listen: HttpListen,
    dispatcher: Arc<Dispatcher>,
    (max_request_bytes, max_connections): (usize, usize),
    ready: Arc<AtomicBool>,
) -> Result<HttpServer, ServeError> {
    let metrics = match install_prometheus() {
        Ok(handle) => {
            pyvisor_actors::metrics::describe();
            crate::llm::describe();
            crate::cluster::metrics::describe();
            Some(handle)
        }
        Err(err) => {
            tracing::warn!(error = %err, "no /metrics: the Prometheus recorder did not install");
            None
        }
    };
    let options = HttpOptions {
        addr: listen.addr,
        token: listen.token,
        access: listen.access,
        max_request_bytes,
        max_connections,
        metrics,
        ready,
    };
    let server = HttpServer::start(dispatcher, options).map_err(|source| ServeError::Http {
        addr: listen.addr,
        source,
    })?;
    tracing::info!(addr = %server.local_addr(), "serving HTTP");
    Ok(server)
}

/// Waits until the pool holds `min_idle` ready workers, or [`WARM_WAIT`] has passed.
async fn wait_until_warm(engine: &Engine, min_idle: usize) {
    let warm = async {
        loop {
            match engine.stats().await {
                Ok(stats) if stats.pool.idle >= min_idle => return,
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(_) => return,
            }
        }
    };
    if tokio::time::timeout(WARM_WAIT, warm).await.is_err() {
        tracing::warn!(min_idle, "the pool is not warm yet; reporting ready anyway");
    }
}

/// Pings systemd's watchdog every `interval` while the engine answers: a wedged engine
/// misses its pings and systemd restarts the service.
async fn ping_watchdog(engine: Engine, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    loop {
        ticks.tick().await;
        if let Ok(Ok(_)) = tokio::time::timeout(interval, engine.stats()).await {
            systemd::watchdog();
        }
    }
}

/// SIGHUP: reads the settings again and applies the pool sizes and session limits; live
/// sessions keep running. Unusable settings are logged and the old ones stay.
async fn apply_reload(engine: &Engine, dispatcher: &Dispatcher, reload: &Reloader) {
    systemd::reloading();
    match reload() {
        Ok(settings) => {
            let pool = settings.pool.clone();
            match engine.resize_pool(settings.pool).await {
                Ok(()) => {
                    dispatcher.set_limits(settings.limits);
                    tracing::info!(?pool, "reloaded pool and limit settings");
                }
                Err(err) => tracing::warn!(error = %err, "reload failed"),
            }
        }
        Err(err) => tracing::warn!(error = %err, "reload failed; keeping the current settings"),
    }
    systemd::ready();
}
