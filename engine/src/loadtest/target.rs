//! The engine a load test drives, behind one set of calls: an embedded [`Engine`] (one the
//! harness starts, or the caller's own), a daemon's JSON-RPC socket ([`Client`]; of a daemon
//! the harness runs itself, which it can kill and restart), a daemon's HTTP API (`http`), or
//! the HTTP APIs of a cluster the harness runs (`cluster`), whose nodes it can kill and
//! restart. Every call answers `Err(kind)` with a short error kind for the report.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::watch;

use super::cluster::{ClusterSpec, HarnessCluster};
use super::daemon::HarnessDaemon;
use super::http::Http;
use super::scenario::TargetSpec;
use super::LoadtestError;
use crate::client::{Client, Event};
use crate::rpc::wire::{CreateParams, ExecuteParams, Stats};
use crate::{
    Engine, EngineConfig, ExecuteRequest, ExecutionEvent, ExecutionResult, SessionOptions,
    StateConfig,
};

/// How long the target has to answer its first health check.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

/// The engine under test.
pub enum Target {
    Embedded {
        engine: Engine,
        /// The state directory of an engine the harness started; removed at the end.
        _state: Option<tempfile::TempDir>,
    },
    Socket(Socket),
    Http(Http),
    /// A cluster the harness runs, and the client of its nodes (or of HAProxy in front).
    Cluster {
        http: Http,
        cluster: Box<HarnessCluster>,
    },
}

/// A daemon's socket, and the daemon itself when the harness runs it.
pub struct Socket {
    /// Replaced when the daemon is restarted.
    client: RwLock<Client>,
    path: PathBuf,
    daemon: Option<HarnessDaemon>,
    /// True while the daemon is being restarted and its sessions brought back: calls wait.
    restarting: watch::Sender<bool>,
    /// How many times the daemon has been killed and restarted.
    restarts: AtomicU64,
}

impl Socket {
    fn new(client: Client, path: PathBuf, daemon: Option<HarnessDaemon>) -> Socket {
        Socket {
            client: RwLock::new(client),
            path,
            daemon,
            restarting: watch::Sender::new(false),
            restarts: AtomicU64::new(0),
        }
    }

    /// Kills and restarts `daemon`, connects to the new one and creates `sessions` again.
    async fn restart(&self, daemon: &HarnessDaemon, sessions: &[String]) -> Result<String, String> {
        let began = std::time::Instant::now();
        let (killed, started, client) = daemon.kill_and_restart().await?;
        *self.client.write().unwrap_or_else(|p| p.into_inner()) = client.clone();
        let mut detail = format!(
            "SIGKILL to daemon {killed}; daemon {started} answered {:.2} s later",
            began.elapsed().as_secs_f64()
        );
        let mut back = 0;
        for name in sessions {
            let params = CreateParams {
                name: Some(name.clone()),
                ..CreateParams::default()
            };
            // Straight to the new client: `client()` waits for the restart to be over.
            match client.create_session(params).await {
                Ok(_) => back += 1,
                Err(err) => detail.push_str(&format!("; {name} not back: {}", kind(err))),
            }
        }
        detail.push_str(&format!("; {back} of {} sessions back", sessions.len()));
        Ok(detail)
    }

    /// The connection to the daemon, once no restart is under way.
    async fn client(&self) -> Client {
        let _ = self.restarting.subscribe().wait_for(|busy| !busy).await;
        self.client
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Engine-wide totals the report takes differences of.
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    pub hits: u64,
    pub misses: u64,
    pub crashes: u64,
    pub restores: u64,
}

impl Totals {
    pub fn of(stats: &Stats) -> Totals {
        Totals {
            hits: stats.pool.hits,
            misses: stats.pool.misses,
            crashes: stats.crashes,
            restores: stats.restores,
        }
    }

    /// These and `other` added up (two engines').
    pub fn plus(self, other: Totals) -> Totals {
        Totals {
            hits: self.hits + other.hits,
            misses: self.misses + other.misses,
            crashes: self.crashes + other.crashes,
            restores: self.restores + other.restores,
        }
    }
}

impl Target {
    /// Opens the target of `spec` (or wraps `engine`, the caller's own) and checks it answers.
    pub async fn open(spec: &TargetSpec, engine: Option<Engine>) -> Result<Target, LoadtestError> {
        let unreachable = LoadtestError::Target;
        let target = match (spec, engine) {
            (_, Some(engine)) => Target::Embedded {
                engine,
                _state: None,
            },
            (TargetSpec::Embedded { durability }, None) => {
                let state = tempfile::Builder::new()
                    .prefix("pyvisor-loadtest-")
                    .tempdir()
                    .map_err(|err| unreachable(format!("create a state directory: {err}")))?;
                let defaults = EngineConfig::default();
                let config = EngineConfig {
                    state: StateConfig {
                        dir: Some(state.path().to_owned()),
                        auto: crate::AutoCheckpoint {
                            durability: *durability,
                            ..defaults.state.auto
                        },
                        ..defaults.state
                    },
                    ..defaults
                };
                let engine = Engine::start(config)
                    .await
                    .map_err(|err| unreachable(format!("start an engine: {err}")))?;
                Target::Embedded {
                    engine,
                    _state: Some(state),
                }
            }
            (TargetSpec::Socket { path, .. }, None) => {
                let path = match path {
                    Some(path) => path.clone(),
                    None => configured_socket().map_err(unreachable)?,
                };
                let path = &path;
                let connect = tokio::time::timeout(HEALTH_TIMEOUT, Client::connect(path));
                let client = match connect.await {
                    Ok(Ok(client)) => client,
                    Ok(Err(err)) => {
                        return Err(unreachable(format!(
                            "the socket {} does not answer: {err}",
                            path.display()
                        )))
                    }
                    Err(_) => {
                        return Err(unreachable(format!(
                            "the socket {} does not answer within {HEALTH_TIMEOUT:?}",
                            path.display()
                        )))
                    }
                };
                Target::Socket(Socket::new(client, path.clone(), None))
            }
            (TargetSpec::Daemon { binary, durability }, None) => {
                let (daemon, client) = HarnessDaemon::start(binary.as_deref(), *durability)
                    .await
                    .map_err(unreachable)?;
                Target::Socket(Socket::new(
                    client,
                    daemon.socket().to_owned(),
                    Some(daemon),
                ))
            }
            (TargetSpec::Http { url, token_env, .. }, None) => {
                let token = token_from(token_env.as_deref())?;
                Target::Http(Http::new(url, token).map_err(unreachable)?)
            }
            (
                TargetSpec::Cluster {
                    urls, token_env, ..
                },
                None,
            ) if !urls.is_empty() => {
                let token = token_from(token_env.as_deref())?;
                Target::Http(Http::urls(urls, token).map_err(unreachable)?)
            }
            (
                TargetSpec::Cluster {
                    nodes,
                    haproxy,
                    binary,
                    lease_ttl_s,
                    durability,
                    ..
                },
                None,
            ) => {
                let spec = ClusterSpec {
                    nodes: *nodes,
                    haproxy: *haproxy,
                    binary: binary.as_deref(),
                    lease_ttl_s: *lease_ttl_s,
                    durability: *durability,
                };
                let cluster = HarnessCluster::start(&spec).await.map_err(unreachable)?;
                let http = Http::cluster(&cluster.nodes(), cluster.front()).map_err(unreachable)?;
                Target::Cluster {
                    http,
                    cluster: Box::new(cluster),
                }
            }
        };
        match tokio::time::timeout(HEALTH_TIMEOUT, target.health()).await {
            Ok(Ok(())) => Ok(target),
            Ok(Err(kind)) => Err(unreachable(format!(
                "the target's health check failed: {kind}"
            ))),
            Err(_) => Err(unreachable(format!(
                "the target did not answer a health check within {HEALTH_TIMEOUT:?}"
            ))),
        }
    }

    async fn health(&self) -> Result<(), String> {
        match self {
            Target::Embedded { engine, .. } => engine.stats().await.map(drop).map_err(kind),
            Target::Socket(socket) => socket.client().await.health().await.map(drop).map_err(kind),
            Target::Http(http) | Target::Cluster { http, .. } => {
                http.get::<Value>("/v1/health").await.map(drop)
            }
        }
    }

    /// A new session (named `name`, working in `cwd`); its id.
    pub async fn create(&self, name: Option<&str>, cwd: Option<&Path>) -> Result<String, String> {
        match self {
            Target::Embedded { engine, .. } => {
                let options = SessionOptions {
                    name: name.map(str::to_owned),
                    cwd: cwd.map(Path::to_owned),
                    ..SessionOptions::default()
                };
                let session = engine.create_session(options).await.map_err(kind)?;
                Ok(session.id().to_owned())
            }
            Target::Socket(socket) => {
                let client = socket.client().await;
                let params = CreateParams {
                    name: name.map(str::to_owned),
                    cwd: cwd.map(|dir| dir.to_string_lossy().into_owned()),
                    ..CreateParams::default()
                };
                let created = client.create_session(params).await.map_err(kind)?;
                Ok(created.session_id)
            }
            Target::Http(http) | Target::Cluster { http, .. } => {
                let body = json!({"name": name, "cwd": cwd.map(|dir| dir.to_string_lossy())});
                let created: Value = http.post("/v1/sessions", &body).await?;
                Ok(created["session_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned())
            }
        }
    }

    /// Runs `code` in `session` and waits for its result.
    pub async fn execute(
        &self,
        session: &str,
        code: &str,
        timeout: Duration,
    ) -> Result<ExecutionResult, String> {
        match self {
            Target::Embedded { engine, .. } => {
                let mut request = ExecuteRequest::new(code);
                request.timeout = Some(timeout);
                let session = engine.session(session, None).await.map_err(kind)?;
                session.run(request).await.map_err(kind)
            }
            Target::Socket(socket) => {
                let client = socket.client().await;
                let params = ExecuteParams {
                    timeout_s: Some(timeout.as_secs_f64()),
                    ..ExecuteParams::new(session, code)
                };
                client.execute(params).await.map_err(kind)
            }
            Target::Http(http) | Target::Cluster { http, .. } => {
                let body = json!({"code": code, "timeout_s": timeout.as_secs_f64()});
                let result: ExecutionResult = http
                    .post(&format!("/v1/sessions/{session}/execute"), &body)
                    .await?;
                http.answered(session, result.node.as_deref());
                Ok(result)
            }
        }
    }

    /// Runs `code`, answering its first `input()` with `answer`.
    pub async fn execute_with_input(
        &self,
        session: &str,
        code: &str,
        answer: &str,
        timeout: Duration,
    ) -> Result<ExecutionResult, String> {
        match self {
            Target::Embedded { engine, .. } => {
                let mut request = ExecuteRequest::new(code).with_input();
                request.timeout = Some(timeout);
                let session = engine.session(session, None).await.map_err(kind)?;
                let mut execution = session.execute(request).await.map_err(kind)?;
                let execution_id = execution.id().to_owned();
                while let Some(event) = execution.next().await {
                    match event {
                        // An answer that finds no input() pending (the worker died as it
                        // asked) is not the outcome: the result, and what it says of the
                        // session's recovery, is.
                        ExecutionEvent::InputRequest { .. } => {
                            let _ = session
                                .send_input(&execution_id, Some(answer.to_owned()))
                                .await;
                        }
                        ExecutionEvent::Finished(result) => return Ok(*result),
                        _ => {}
                    }
                }
                Err("stream_ended".into())
            }
            Target::Socket(socket) => {
                let client = socket.client().await;
                let params = ExecuteParams {
                    timeout_s: Some(timeout.as_secs_f64()),
                    ..ExecuteParams::new(session, code)
                };
                let mut execution = client.execute_streaming(params).await.map_err(kind)?;
                while let Some(event) = execution.next().await {
                    match event.map_err(kind)? {
                        // As above: the result says what became of the execution.
                        Event::InputRequest { execution_id, .. } => {
                            let _ = client
                                .send_input(session, &execution_id, Some(answer.to_owned()))
                                .await;
                        }
                        Event::Finished(result) => return Ok(*result),
                        _ => {}
                    }
                }
                Err("stream_ended".into())
            }
            Target::Http(_) | Target::Cluster { .. } => Err("input_unsupported".into()),
        }
    }

    /// Interrupts what runs in `session`; whether something did.
    pub async fn interrupt(&self, session: &str) -> Result<bool, String> {
        match self {
            Target::Embedded { engine, .. } => {
                let session = engine.session(session, None).await.map_err(kind)?;
                session.interrupt().await.map_err(kind)
            }
            Target::Socket(socket) => socket.client().await.interrupt(session).await.map_err(kind),
            Target::Http(http) | Target::Cluster { http, .. } => {
                let answer: Value = http
                    .post(&format!("/v1/sessions/{session}/interrupt"), &json!({}))
                    .await?;
                Ok(answer["interrupted"].as_bool().unwrap_or(false))
            }
        }
    }

    /// Checkpoints `session`; the checkpoint's id.
    pub async fn checkpoint(&self, session: &str) -> Result<String, String> {
        match self {
            Target::Embedded { engine, .. } => {
                let session = engine.session(session, None).await.map_err(kind)?;
                Ok(session.checkpoint().await.map_err(kind)?.checkpoint_id)
            }
            Target::Socket(socket) => Ok(socket
                .client()
                .await
                .checkpoint(session)
                .await
                .map_err(kind)?
                .checkpoint_id),
            Target::Http(http) | Target::Cluster { http, .. } => {
                let taken: Value = http
                    .post(&format!("/v1/sessions/{session}/checkpoint"), &json!({}))
                    .await?;
                Ok(taken["checkpoint_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned())
            }
        }
    }

    /// Puts `session` back as checkpoint `id`.
    pub async fn restore(&self, session: &str, id: &str) -> Result<(), String> {
        match self {
            Target::Embedded { engine, .. } => {
                let session = engine.session(session, None).await.map_err(kind)?;
                session.restore(Some(id)).await.map(drop).map_err(kind)
            }
            Target::Socket(socket) => socket
                .client()
                .await
                .restore(session, Some(id))
                .await
                .map(drop)
                .map_err(kind),
            Target::Http(http) | Target::Cluster { http, .. } => {
                let body = json!({"checkpoint_id": id});
                http.post::<Value>(&format!("/v1/sessions/{session}/restore"), &body)
                    .await
                    .map(drop)
            }
        }
    }

    /// Ends `session` and deletes its checkpoints.
    pub async fn close(&self, session: &str) -> Result<(), String> {
        match self {
            Target::Embedded { engine, .. } => {
                let session = engine.session(session, None).await.map_err(kind)?;
                session.close().await.map_err(kind)
            }
            Target::Socket(socket) => socket
                .client()
                .await
                .close(session, false)
                .await
                .map_err(kind),
            Target::Http(http) | Target::Cluster { http, .. } => {
                http.request::<Value>("DELETE", &format!("/v1/sessions/{session}"), None)
                    .await?;
                http.forget(session);
                Ok(())
            }
        }
    }

    /// The pid of `session`'s worker, when it has one.
    pub async fn worker_pid(&self, session: &str) -> Result<Option<u32>, String> {
        match self {
            Target::Embedded { engine, .. } => {
                let session = engine.session(session, None).await.map_err(kind)?;
                Ok(session.info().await.map_err(kind)?.pid)
            }
            Target::Socket(socket) => {
                Ok(socket.client().await.info(session).await.map_err(kind)?.pid)
            }
            Target::Http(http) | Target::Cluster { http, .. } => {
                let info: Value = http.get(&format!("/v1/sessions/{session}")).await?;
                Ok(info["pid"].as_u64().and_then(|pid| u32::try_from(pid).ok()))
            }
        }
    }

    /// The engine's totals of pool hits, crashes and restores.
    pub async fn totals(&self) -> Result<Totals, String> {
        match self {
            Target::Embedded { engine, .. } => {
                let stats = engine.stats().await.map_err(kind)?;
                Ok(Totals {
                    hits: stats.pool.hits,
                    misses: stats.pool.misses,
                    crashes: stats.crashes,
                    restores: stats.restores,
                })
            }
            Target::Socket(socket) => {
                let stats = socket.client().await.stats().await.map_err(kind)?;
                Ok(Totals::of(&stats))
            }
            Target::Http(http) => Ok(Totals::of(&http.get::<Stats>("/v1/stats").await?)),
            Target::Cluster { cluster, .. } => cluster.totals().await,
        }
    }

    /// The processes that run the engine, for their memory and CPU: this one when embedded,
    /// the socket's peer for a daemon, each node of a cluster the harness runs; none known
    /// over HTTP.
    pub async fn engine_pids(&self) -> Vec<u32> {
        match self {
            Target::Embedded { .. } => vec![std::process::id()],
            Target::Socket(socket) => {
                let peer = async {
                    let stream = tokio::net::UnixStream::connect(&socket.path).await.ok()?;
                    u32::try_from(stream.peer_cred().ok()?.pid()?).ok()
                };
                peer.await.into_iter().collect()
            }
            Target::Cluster { cluster, .. } => cluster.pids(),
            Target::Http(_) => Vec::new(),
        }
    }

    /// The cluster the harness runs, and the client that knows which node answered for
    /// each session.
    pub fn cluster(&self) -> Option<(&HarnessCluster, &Http)> {
        match self {
            Target::Cluster { http, cluster } => Some((cluster.as_ref(), http)),
            _ => None,
        }
    }

    /// Whether the harness runs the daemon, so it can kill and restart it.
    pub fn restartable(&self) -> bool {
        matches!(
            self,
            Target::Socket(Socket {
                daemon: Some(_),
                ..
            })
        )
    }

    /// SIGKILLs the daemon the harness runs, starts it again on the same state, and creates
    /// each of `sessions` (names) again, which brings them back from their checkpoints. Calls
    /// made meanwhile wait for all that (calls in flight at the kill fail). What was done,
    /// for the fault log.
    pub async fn kill_and_restart_daemon(&self, sessions: &[String]) -> Result<String, String> {
        let Target::Socket(
            socket @ Socket {
                daemon: Some(daemon),
                ..
            },
        ) = self
        else {
            return Err("the harness does not run this target's daemon".into());
        };
        socket.restarting.send_replace(true);
        socket.restarts.fetch_add(1, Ordering::SeqCst);
        let restarted = socket.restart(daemon, sessions).await;
        socket.restarting.send_replace(false);
        restarted
    }

    /// How many times the harness has killed and restarted the daemon so far (counted from
    /// the kill): a session no client names does not outlive a change of this number.
    pub fn daemon_restarts(&self) -> u64 {
        match self {
            Target::Socket(socket) => socket.restarts.load(Ordering::SeqCst),
            Target::Embedded { .. } | Target::Http(_) | Target::Cluster { .. } => 0,
        }
    }

    /// The daemon's socket, for faults that open connections of their own.
    pub fn socket_path(&self) -> Option<&Path> {
        match self {
            Target::Socket(socket) => Some(&socket.path),
            _ => None,
        }
    }
}

/// The bearer token in the environment variable `name`, when one is named.
fn token_from(name: Option<&str>) -> Result<Option<String>, LoadtestError> {
    name.map(|name| {
        std::env::var(name)
            .map_err(|_| LoadtestError::Target(format!("the token variable {name} is not set")))
    })
    .transpose()
}

/// The daemon socket the configuration names, as `pyvisor exec` finds it.
fn configured_socket() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("PYVISOR_SOCKET") {
        return Ok(PathBuf::from(path));
    }
    let loaded = crate::config::Settings::load(None)
        .map_err(|err| format!("load the configuration for its socket: {err}"))?;
    Ok(loaded.settings.socket_path())
}

/// A short kind for an error, as the report counts them: the first 80 characters of its
/// message.
fn kind(err: impl std::fmt::Display) -> String {
    err.to_string().chars().take(80).collect()
}
