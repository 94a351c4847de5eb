//! The engine a load test drives, behind one set of calls: an embedded [`Engine`] (one the
//! harness starts, or the caller's own), a daemon's JSON-RPC socket
//! ([`Client`](crate::client::Client); of a daemon the harness runs itself, which it can kill
//! and restart), a daemon's HTTP API (`http`), or the HTTP APIs of a cluster the harness runs
//! (`cluster`), whose nodes it can kill and restart. Every call answers `Err(kind)` with a
//! short error kind for the report.
//!
//! `open` starts the target or connects to it; `socket` is a daemon's socket and the kill and
//! restart of a daemon the harness runs.

mod open;
mod socket;

use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use super::cluster::HarnessCluster;
use super::http::Http;
use crate::client::Event;
use crate::rpc::wire::{CreateParams, ExecuteParams, Stats};
use crate::{Engine, ExecuteRequest, ExecutionEvent, ExecutionResult, SessionOptions};
use socket::Socket;

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
}

/// A short kind for an error, as the report counts them: the first 80 characters of its
/// message.
fn kind(err: impl std::fmt::Display) -> String {
    err.to_string().chars().take(80).collect()
}
