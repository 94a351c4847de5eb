//! The HTTP transport of docs/protocol.md (HTTP): REST routes that map onto the [`Dispatcher`]'s
//! methods, a WebSocket route that speaks the JSON-RPC of §2, `/metrics`, `/healthz`,
//! `/readyz`, and in front of all of them the guards of `guard`: `Host` and `Origin`
//! checks, bearer-token auth that tells who the caller is, and JSON-only bodies.
//!
//! [`HttpServer::start`] runs actix-web on an actix System on a thread of its own, so the
//! rest of the daemon may use any runtime. actix-server's own signal handling is off: the
//! daemon decides when to stop and calls [`HttpServer::stop`]. The REST handlers live in
//! `routes`, the streamed execution in `stream` (the bridge of a forwarded one in `bridge`),
//! the WebSocket connection in `ws`, the file routes in `files`.

mod bridge;
mod files;
mod guard;
mod memory;
mod routes;
mod stream;
mod tasks;
mod ws;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::http::StatusCode;
use actix_web::middleware::from_fn;
use actix_web::{web, App, HttpResponse, ResponseError};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use serde::Serialize;
use tokio::sync::{oneshot, watch};

use crate::rpc::{code, Dispatcher, RpcError};

pub use guard::{HttpAccess, OwnerToken};

/// Worker threads of the HTTP server; the engine does the heavy lifting elsewhere.
const WORKERS: usize = 2;
/// actix's own bound on a graceful stop; [`HttpServer::stop`] enforces the caller's grace.
const SHUTDOWN_TIMEOUT_S: u64 = 300;
/// How often the Prometheus recorder drains its histogram buffers.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);
/// Bucket bounds of the `*_seconds` histograms.
const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];
/// Bucket bounds of the `*_bytes` histograms: 1 KiB to 1 GiB.
const BYTES_BUCKETS: &[f64] = &[
    1024.0,
    16384.0,
    131072.0,
    1048576.0,
    8388608.0,
    67108864.0,
    268435456.0,
    1073741824.0,
];

/// What the HTTP server listens on and how it guards and measures itself.
pub struct HttpOptions {
    /// Where to listen (port 0 picks a free one).
    pub addr: SocketAddr,
    /// The admin token (`server.token`). With it or owner tokens set, every request needs
    /// `Authorization: Bearer <token>`; with neither, every caller is an admin and the
    /// address must be a loopback one.
    pub token: Option<String>,
    /// Owner tokens, allowed origins and hosts, and the request timeout.
    pub access: HttpAccess,
    /// Largest request body or WebSocket message.
    pub max_request_bytes: usize,
    /// Connections held at once, over all workers; more wait in the listen backlog.
    pub max_connections: usize,
    /// What `/metrics` renders; `/metrics` answers 404 without it.
    pub metrics: Option<PrometheusHandle>,
    /// Whether `/readyz` says ready (the pool is warm).
    pub ready: Arc<AtomicBool>,
}

/// A running HTTP server. Dropping it stops the server without waiting.
pub struct HttpServer {
    local_addr: SocketAddr,
    handle: ServerHandle,
    /// Tells WebSocket connections to stop reading and finish what they have.
    shutdown: watch::Sender<bool>,
    system: Option<actix_rt::System>,
    done: Option<oneshot::Receiver<()>>,
    thread: Option<JoinHandle<()>>,
}

/// What every handler shares.
struct State {
    dispatcher: Arc<Dispatcher>,
    token: Option<String>,
    access: HttpAccess,
    max_request_bytes: usize,
    metrics: Option<PrometheusHandle>,
    ready: Arc<AtomicBool>,
    shutdown: watch::Receiver<bool>,
    /// The streamed answers whose `bridge.llm` requests another node relays.
    bridges: Arc<bridge::Bridges>,
}

impl HttpServer {
    /// Binds and starts serving on a thread of its own (an actix System); returns once bound.
    /// The caller's thread waits only for the bind.
    /// Refuses a non-loopback address without any token.
    pub fn start(dispatcher: Arc<Dispatcher>, options: HttpOptions) -> io::Result<HttpServer> {
        if !options.addr.ip().is_loopback()
            && options.token.is_none()
            && options.access.owner_tokens.is_empty()
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "refusing to serve HTTP on {} without a token: set server.token (or \
                     [[server.tokens]]), or bind a loopback address such as 127.0.0.1",
                    options.addr
                ),
            ));
        }
        let (shutdown, shutdown_rx) = watch::channel(false);
        let request_timeout = options.access.request_timeout;
        let state = web::Data::new(State {
            dispatcher,
            token: options.token,
            access: options.access,
            max_request_bytes: options.max_request_bytes,
            metrics: options.metrics,
            ready: options.ready,
            shutdown: shutdown_rx,
            bridges: Arc::default(),
        });
        let (addr, max_connections) = (options.addr, options.max_connections);
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = oneshot::channel();
        let thread = thread::Builder::new()
            .name("pyvisor-http".into())
            .spawn(move || {
                let system = actix_rt::System::new();
                let started = system
                    .block_on(async move { serve(state, addr, max_connections, request_timeout) });
                let serving = started.is_ok();
                let _ = bound_tx.send(
                    started.map(|(addr, handle)| (addr, handle, actix_rt::System::current())),
                );
                if serving {
                    // Until the server has stopped, or stop() gave up waiting for it.
                    if let Err(err) = system.run() {
                        tracing::warn!("the HTTP server's system ended badly: {err}");
                    }
                }
                let _ = done_tx.send(());
            })?;
        match bound_rx.recv() {
            Ok(Ok((local_addr, handle, system))) => Ok(HttpServer {
                local_addr,
                handle,
                shutdown,
                system: Some(system),
                done: Some(done_rx),
                thread: Some(thread),
            }),
            Ok(Err(err)) => {
                let _ = thread.join();
                Err(err)
            }
            Err(_) => {
                let _ = thread.join();
                Err(io::Error::other(
                    "the HTTP server thread ended during start",
                ))
            }
        }
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, lets in-flight requests finish up to `grace`, joins the thread.
    /// Open WebSockets stop once nothing is in flight on them and are closed with 1001.
    /// Needs a tokio timer (any tokio or actix runtime).
    pub async fn stop(mut self, grace: Duration) {
        self.shutdown.send_replace(true);
        if tokio::time::timeout(grace, self.handle.stop(true))
            .await
            .is_err()
        {
            tracing::warn!("HTTP requests still running after {grace:?}; dropping them");
        }
        if let Some(system) = self.system.take() {
            system.stop();
        }
        if let Some(done) = self.done.take() {
            let _ = done.await;
        }
        if let Some(thread) = self.thread.take() {
            // The thread has sent `done` as its last act: this join does not block.
            let _ = thread.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(system) = self.system.take() {
            self.shutdown.send_replace(true);
            system.stop();
        }
    }
}

/// Builds, binds and starts the actix-web server; runs inside the server's System.
fn serve(
    state: web::Data<State>,
    addr: SocketAddr,
    max_connections: usize,
    request_timeout: Duration,
) -> io::Result<(SocketAddr, ServerHandle)> {
    let server = actix_web::HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .wrap(from_fn(guard::guard))
            .route("/healthz", web::get().to(healthz))
            .route("/readyz", web::get().to(readyz))
            .route("/metrics", web::get().to(metrics))
            .configure(routes::configure)
            .default_service(web::to(not_found))
    })
    .workers(WORKERS)
    // A streamed answer is written a line at a time: without this, each line after the
    // first waits for the peer's delayed ACK (40 ms on Linux) on a kept-alive connection,
    // which is what another node's forwards use.
    .tcp_nodelay(true)
    // A client that trickles its headers is cut off (the body has its own timeout).
    .client_request_timeout(request_timeout)
    .max_connections(max_connections.div_ceil(WORKERS).max(1))
    .disable_signals()
    .shutdown_timeout(SHUTDOWN_TIMEOUT_S)
    .bind(addr)?;
    let local_addr = server
        .addrs()
        .first()
        .copied()
        .ok_or_else(|| io::Error::other(format!("no address bound for {addr}")))?;
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(async move {
        if let Err(err) = server.await {
            tracing::error!("the HTTP server failed: {err}");
        }
        actix_rt::System::current().stop();
    });
    Ok((local_addr, handle))
}

/// Installs the process-wide Prometheus recorder (once) and returns its handle; spawns the
/// upkeep timer. Later calls return the same handle.
pub fn install_prometheus() -> Result<PrometheusHandle, BuildError> {
    static INSTALLED: Mutex<Option<PrometheusHandle>> = Mutex::new(None);
    let mut installed = INSTALLED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(handle) = installed.as_ref() {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)?
        .set_buckets_for_metric(Matcher::Suffix("_bytes".into()), BYTES_BUCKETS)?
        .install_recorder()?;
    let upkeep = handle.clone();
    let spawned = thread::Builder::new()
        .name("pyvisor-metrics".into())
        .spawn(move || loop {
            thread::sleep(UPKEEP_INTERVAL);
            upkeep.run_upkeep();
        });
    if let Err(err) = spawned {
        // Rendering drains the buffers too; only idle memory grows without upkeep.
        tracing::warn!("no metrics upkeep thread: {err}");
    }
    *installed = Some(handle.clone());
    Ok(handle)
}

/// An [`RpcError`] as an HTTP response: `{"error": {code, message}}` with the status of
/// [`http_status`], or one the guards chose.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
struct ApiError {
    error: RpcError,
    status: StatusCode,
}

impl From<RpcError> for ApiError {
    fn from(error: RpcError) -> Self {
        let status = http_status(error.code);
        Self { error, status }
    }
}

impl From<crate::EngineError> for ApiError {
    fn from(error: crate::EngineError) -> Self {
        RpcError::from(error).into()
    }
}

impl ApiError {
    /// `error` answered with `status` rather than the one its code maps to.
    fn with_status(status: StatusCode, error: RpcError) -> Self {
        Self { error, status }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        #[derive(Serialize)]
        struct Body<'a> {
            error: &'a RpcError,
        }
        HttpResponse::build(self.status_code()).json(Body { error: &self.error })
    }
}

/// The HTTP status of a JSON-RPC error code.
fn http_status(code: i64) -> StatusCode {
    match code {
        code::UNKNOWN_SESSION | code::CHECKPOINT_NOT_FOUND | code::METHOD_NOT_FOUND => {
            StatusCode::NOT_FOUND
        }
        code::POOL_EXHAUSTED | code::SHUTTING_DOWN => StatusCode::SERVICE_UNAVAILABLE,
        code::SESSION_BUSY => StatusCode::CONFLICT,
        // Another node of the cluster holds the session (docs/cluster.md).
        code::HELD_ELSEWHERE => StatusCode::MISDIRECTED_REQUEST,
        code::LIMIT_EXCEEDED => StatusCode::PAYLOAD_TOO_LARGE,
        code::UNAUTHORIZED => StatusCode::UNAUTHORIZED,
        code::INVALID_REQUEST | code::INVALID_PARAMS | code::PARSE_ERROR => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// `GET /healthz`: the process is alive.
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

/// `GET /readyz`: the pool is warm, no stop or drain has begun, and a cluster node reaches its
/// store.
async fn readyz(state: web::Data<State>) -> HttpResponse {
    if state.dispatcher.is_stopping() {
        HttpResponse::ServiceUnavailable().json(serde_json::json!({"status": "stopping"}))
    } else if state.dispatcher.is_draining() {
        HttpResponse::ServiceUnavailable().json(serde_json::json!({"status": "draining"}))
    } else if !state.dispatcher.store_reachable() {
        HttpResponse::ServiceUnavailable().json(serde_json::json!({"status": "store unreachable"}))
    } else if state.ready.load(Ordering::SeqCst) {
        HttpResponse::Ok().json(serde_json::json!({"status": "ready"}))
    } else {
        HttpResponse::ServiceUnavailable().json(serde_json::json!({"status": "warming"}))
    }
}

/// `GET /metrics`: the Prometheus text format.
async fn metrics(state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let handle = state.metrics.as_ref().ok_or_else(|| {
        RpcError::new(
            code::METHOD_NOT_FOUND,
            "metrics are not enabled on this server",
        )
    })?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(handle.render()))
}

/// Any other path.
async fn not_found(req: actix_web::HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::from(RpcError::new(
        code::METHOD_NOT_FOUND,
        format!("no route for {} {}", req.method(), req.path()),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_rpc_codes_map_to_http_statuses() {
        let cases = [
            (code::UNKNOWN_SESSION, 404),
            (code::POOL_EXHAUSTED, 503),
            (code::SESSION_BUSY, 409),
            (code::CHECKPOINT_NOT_FOUND, 404),
            (code::LIMIT_EXCEEDED, 413),
            (code::SHUTTING_DOWN, 503),
            (code::UNAUTHORIZED, 401),
            (code::INVALID_REQUEST, 400),
            (code::INVALID_PARAMS, 400),
            (code::PARSE_ERROR, 400),
            (code::METHOD_NOT_FOUND, 404),
            (code::INTERNAL_ERROR, 500),
            (code::ENGINE_ERROR, 500),
        ];
        for (code, status) in cases {
            assert_eq!(http_status(code).as_u16(), status, "code {code}");
        }
    }
}
