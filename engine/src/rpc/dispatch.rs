//! The methods of SPEC.md §2 over an [`Engine`]: decode params, call the engine, encode the
//! result. Every transport (Unix socket, stdio, HTTP, WebSocket) goes through one
//! [`Dispatcher`], so they behave alike.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use pyvisor_actors::session::SessionPhase;
use pyvisor_actors::SessionLimits;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::errors::RpcError;
use super::outbound::Outbound;
use super::wire::{self, method, notification};
use crate::{
    Engine, EngineError, ExecuteRequest, ExecutionEvent, Session, SessionError, SessionOptions,
};

/// Serves JSON-RPC method calls against one engine. Shared by every connection.
pub struct Dispatcher {
    engine: Engine,
    /// Limits of a session that asks for none; the base of the ones that ask for some.
    /// Replaced when the daemon reloads its settings.
    default_limits: RwLock<SessionLimits>,
    started: Instant,
    stopping: AtomicBool,
    /// Sessions looked up before, by the id or name the client used: saves the
    /// supervisor a message on every call.
    sessions: Mutex<HashMap<String, Session>>,
}

impl Dispatcher {
    /// A dispatcher over `engine`, whose sessions default to `default_limits`.
    pub fn new(engine: Engine, default_limits: SessionLimits) -> Arc<Self> {
        Arc::new(Self {
            engine,
            default_limits: RwLock::new(default_limits),
            started: Instant::now(),
            stopping: AtomicBool::new(false),
            sessions: Mutex::new(HashMap::new()),
        })
    }

    /// The engine the methods run against.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Limits for sessions created from now on (a reload); live sessions keep theirs.
    pub fn set_default_limits(&self, limits: SessionLimits) {
        *self
            .default_limits
            .write()
            .expect("limits lock is never poisoned") = limits;
    }

    /// Marks the server as stopping: `engine.health` says so from now on.
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Whether a graceful stop has begun.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Runs `method` with `params`. Notifications a streaming execution produces go to
    /// `out` before this returns.
    pub async fn call(
        &self,
        method: &str,
        params: Option<Value>,
        out: &Outbound,
    ) -> Result<Box<RawValue>, RpcError> {
        match method {
            method::CREATE => encode(self.create(decode_or_default(params)?).await?),
            method::EXECUTE => encode(self.execute(decode(params)?, out).await?),
            method::INPUT => encode(self.input(decode(params)?).await?),
            method::INTERRUPT => encode(self.interrupt(decode(params)?).await?),
            method::CHECKPOINT => encode(self.checkpoint(decode(params)?).await?),
            method::RESTORE => encode(self.restore(decode(params)?).await?),
            method::CHECKPOINTS => encode(self.checkpoints(decode(params)?).await?),
            method::INFO => encode(self.info(decode(params)?).await?),
            method::LIST => encode(self.list(decode_or_default(params)?).await?),
            method::CLOSE => encode(self.close(decode(params)?).await?),
            method::HINT => encode(self.hint(decode(params)?).await?),
            method::STATS => {
                no_params(params)?;
                encode(self.stats().await?)
            }
            method::HEALTH => {
                no_params(params)?;
                encode(self.health())
            }
            other => Err(RpcError::method_not_found(other)),
        }
    }

    async fn create(&self, params: wire::CreateParams) -> Result<wire::Created, RpcError> {
        let python = match params.python.as_deref() {
            Some(python) => Some(
                self.engine
                    .interpreter(python)
                    .await
                    .map_err(|err| RpcError::invalid_params(format!("python: {err}")))?,
            ),
            None => None,
        };
        if let Some(cwd) = &params.cwd {
            if !std::path::Path::new(cwd).is_dir() {
                return Err(RpcError::invalid_params(format!(
                    "cwd: {cwd:?} is not a directory"
                )));
            }
        }
        let limits = Some(self.limits(params.limits.unwrap_or_default())?);
        let options = SessionOptions {
            name: params.name,
            owner: params.owner,
            python,
            cwd: params.cwd.map(PathBuf::from),
            env: params.env.unwrap_or_default().into_iter().collect(),
            limits,
            proactive: params.proactive,
            network: params.network,
        };
        let session = self.engine.create_session(options).await?;
        let (pid, python_version) = match session.pid() {
            Some(pid) => (Some(pid), session.python_version().map(str::to_owned)),
            None => {
                // An attach does not carry the worker; ask the session.
                let info = session.info().await?;
                (info.pid, info.python_version)
            }
        };
        let created = wire::Created {
            session_id: session.id().to_owned(),
            pid,
            python_version,
            warm: session.warm(),
            attached: session.attached(),
            restored: session.restored(),
        };
        self.remember(&created.session_id, session);
        Ok(created)
    }

    /// The current default limits with `params` applied.
    fn limits(&self, params: wire::LimitParams) -> Result<SessionLimits, RpcError> {
        let mut limits = self
            .default_limits
            .read()
            .expect("limits lock is never poisoned")
            .clone();
        if let Some(memory_mb) = params.memory_mb {
            limits.memory_mb = Some(memory_mb);
        }
        if let Some(cpu_s) = params.cpu_s {
            limits.cpu_s = Some(cpu_s);
        }
        if let Some(open_files) = params.open_files {
            limits.open_files = Some(open_files);
        }
        if let Some(processes) = params.processes {
            limits.processes = Some(processes);
        }
        if let Some(timeout_s) = params.timeout_s {
            limits.timeout = seconds("limits.timeout_s", timeout_s)?;
        }
        if let Some(output_bytes) = params.output_bytes {
            limits.output_bytes = output_bytes;
        }
        Ok(limits)
    }

    async fn execute(
        &self,
        params: wire::ExecuteParams,
        out: &Outbound,
    ) -> Result<wire::ExecutionResult, RpcError> {
        let mut request = ExecuteRequest::new(params.code);
        if let Some(timeout_s) = params.timeout_s {
            request.timeout = Some(seconds("timeout_s", timeout_s)?);
        }
        if let Some(transaction) = params.transaction {
            request.transaction = transaction;
        }
        request.queue = params.queue.unwrap_or(true);
        request.cache = params.cache.unwrap_or(true);
        request.input = params.stream;
        let session = self.session(&params.session_id).await?;
        if !params.stream {
            return session.run(request).await.map_err(|err| {
                self.forget_if_closed(&params.session_id, &err);
                RpcError::from(err)
            });
        }
        let mut execution = session.execute(request).await.map_err(|err| {
            self.forget_if_closed(&params.session_id, &err);
            RpcError::from(err)
        })?;
        let session_id = session.id().to_owned();
        let execution_id = execution.id().to_owned();
        while let Some(event) = execution.next().await {
            // A closed connection only loses the notifications; the execution goes on.
            match event {
                ExecutionEvent::Output { stream, data } => {
                    let note = wire::OutputNote {
                        session_id: session_id.clone(),
                        execution_id: execution_id.clone(),
                        stream,
                        data,
                    };
                    out.notify(notification::OUTPUT, &note).await;
                }
                ExecutionEvent::InputRequest { prompt, password } => {
                    let note = wire::InputRequestNote {
                        session_id: session_id.clone(),
                        execution_id: execution_id.clone(),
                        prompt,
                        password,
                    };
                    if !out.notify(notification::INPUT_REQUEST, &note).await {
                        // Nobody is left to answer: input() raises EOFError now rather
                        // than after the input timeout.
                        let _ = session.send_input(&execution_id, None).await;
                    }
                }
                ExecutionEvent::Display(display) => {
                    let note = wire::DisplayNote {
                        session_id: session_id.clone(),
                        execution_id: execution_id.clone(),
                        mime: display.mime,
                        data: display.data,
                    };
                    out.notify(notification::DISPLAY, &note).await;
                }
                ExecutionEvent::Finished(result) => return Ok(*result),
            }
        }
        Err(EngineError::Stopped.into())
    }

    async fn input(&self, params: wire::InputParams) -> Result<wire::Empty, RpcError> {
        let session = self.session(&params.session_id).await?;
        session
            .send_input(&params.execution_id, params.value)
            .await?;
        Ok(wire::Empty {})
    }

    async fn interrupt(&self, params: wire::SessionRef) -> Result<wire::Interrupted, RpcError> {
        let session = self.session(&params.session_id).await?;
        let interrupted = session.interrupt().await?;
        Ok(wire::Interrupted { interrupted })
    }

    async fn checkpoint(
        &self,
        params: wire::SessionRef,
    ) -> Result<wire::CheckpointTaken, RpcError> {
        let summary = self.session(&params.session_id).await?.checkpoint().await?;
        Ok(wire::CheckpointTaken {
            checkpoint_id: summary.checkpoint_id,
            bytes: summary.bytes,
            state_bytes: summary.state_bytes,
            saved: summary.saved,
            lost: summary.lost,
            duration_ms: summary.duration_ms,
        })
    }

    async fn restore(&self, params: wire::RestoreParams) -> Result<wire::Restored, RpcError> {
        let session = self.session(&params.session_id).await?;
        let summary = session.restore(params.checkpoint_id.as_deref()).await?;
        Ok(wire::Restored {
            checkpoint_id: summary.checkpoint_id,
            restored: summary.restored,
            kept: summary.kept,
            lost: summary.lost,
        })
    }

    async fn checkpoints(
        &self,
        params: wire::SessionRef,
    ) -> Result<Vec<wire::CheckpointEntry>, RpcError> {
        let session = self.session(&params.session_id).await?;
        let checkpoints = session.checkpoints().await?;
        Ok(checkpoints
            .into_iter()
            .map(|info| wire::CheckpointEntry {
                checkpoint_id: info.id.to_string(),
                created_at: wire::unix_seconds(info.created_at),
                bytes: info.file_bytes,
                state_bytes: info.state_bytes,
                execution_count: info.meta.execution_count,
                saved: info.meta.names_saved,
                lost: info
                    .meta
                    .names_lost
                    .into_iter()
                    .map(|lost| wire::LostName {
                        name: lost.name,
                        reason: lost.reason,
                    })
                    .collect(),
            })
            .collect())
    }

    async fn info(&self, params: wire::SessionRef) -> Result<wire::SessionInfo, RpcError> {
        let session = self.session(&params.session_id).await?;
        session_info(&session).await.map_err(|err| {
            self.forget_if_closed(&params.session_id, &err);
            RpcError::from(err)
        })
    }

    async fn list(&self, params: wire::ListParams) -> Result<Vec<wire::SessionInfo>, RpcError> {
        let sessions = self.engine.sessions(params.owner.as_deref()).await?;
        let infos = futures::future::join_all(sessions.iter().map(session_info)).await;
        // A session closed between the listing and its info is no longer in the list.
        Ok(infos.into_iter().filter_map(Result::ok).collect())
    }

    async fn close(&self, params: wire::CloseParams) -> Result<wire::Empty, RpcError> {
        let session = self.session(&params.session_id).await?;
        self.forget(&params.session_id, session.id());
        if params.checkpoint {
            session.close_with_checkpoint().await?;
        } else {
            session.close().await?;
        }
        Ok(wire::Empty {})
    }

    async fn stats(&self) -> Result<wire::Stats, RpcError> {
        let stats = self.engine.stats().await?;
        Ok(wire::Stats {
            pool: stats.pool,
            sessions: stats.sessions,
            executions: stats.executions,
            crashes: stats.crashes,
            restores: stats.restores,
            proactive: stats.proactive,
        })
    }

    async fn hint(&self, params: wire::HintParams) -> Result<wire::Hinted, RpcError> {
        const MAX_HINTS: usize = 64;
        const MAX_HINT_BYTES: usize = 64 * 1024;
        if params.code.len() > MAX_HINTS {
            return Err(RpcError::invalid_params(format!(
                "code: at most {MAX_HINTS} snippets per hint, got {}",
                params.code.len()
            )));
        }
        if let Some(long) = params.code.iter().find(|code| code.len() > MAX_HINT_BYTES) {
            return Err(RpcError::invalid_params(format!(
                "code: a snippet of {} bytes; a hint takes snippets of at most {MAX_HINT_BYTES}",
                long.len()
            )));
        }
        let session = self.session(&params.session_id).await?;
        let accepted = session.hint(params.code).await?;
        Ok(wire::Hinted { accepted })
    }

    fn health(&self) -> wire::Health {
        wire::Health {
            status: if self.is_stopping() { "stopping" } else { "ok" }.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            uptime_s: self.started.elapsed().as_secs_f64(),
        }
    }

    /// The session `key` names (an id or a name), from the cache or the engine.
    async fn session(&self, key: &str) -> Result<Session, RpcError> {
        if let Some(session) = self.cached(key) {
            return Ok(session);
        }
        let session = self.engine.session(key, None).await?;
        self.remember(key, session.clone());
        Ok(session)
    }

    fn cached(&self, key: &str) -> Option<Session> {
        let sessions = self
            .sessions
            .lock()
            .expect("session cache lock is never poisoned");
        sessions.get(key).cloned()
    }

    fn remember(&self, key: &str, session: Session) {
        let mut sessions = self
            .sessions
            .lock()
            .expect("session cache lock is never poisoned");
        sessions.insert(key.to_owned(), session);
    }

    /// Drops every cache entry of the session `key` resolved to.
    fn forget(&self, key: &str, session_id: &str) {
        let mut sessions = self
            .sessions
            .lock()
            .expect("session cache lock is never poisoned");
        sessions.remove(key);
        sessions.retain(|_, session| session.id() != session_id);
    }

    /// A handle that answers `Closed` belongs to a closed session: look it up anew next time.
    fn forget_if_closed(&self, key: &str, err: &EngineError) {
        if let EngineError::Session(SessionError::Closed { session_id }) = err {
            self.forget(key, session_id);
        }
    }
}

/// `session.info` of one session.
async fn session_info(session: &Session) -> Result<wire::SessionInfo, EngineError> {
    let snapshot = session.info().await?;
    let (variables, rss_bytes) = match snapshot.namespace {
        Some(namespace) => (
            namespace
                .variables
                .into_iter()
                .map(|variable| wire::VariableInfo {
                    name: variable.name,
                    type_name: variable.type_name,
                    size_bytes: variable.size_bytes,
                })
                .collect(),
            namespace.rss_bytes,
        ),
        None => (Vec::new(), None),
    };
    Ok(wire::SessionInfo {
        session_id: snapshot.session_id,
        name: session.name().map(str::to_owned),
        owner: session.owner().map(str::to_owned),
        pid: snapshot.pid,
        state: phase_name(snapshot.phase).into(),
        execution_count: snapshot.execution_count,
        variables,
        rss_bytes,
        created_at: wire::unix_seconds(session.created_at()),
        last_checkpoint: snapshot.last_checkpoint,
        durability: wire::Durability {
            saved: snapshot.durability.saved,
            last_checkpoint: snapshot.durability.last_checkpoint,
            unsaved_executions: snapshot.durability.unsaved_executions,
            lost_names: snapshot.durability.lost_names,
            failure: snapshot.durability.failure,
        },
        proactive: snapshot.proactive,
        sandbox: snapshot
            .sandbox
            .map(|applied| wire::SandboxInfo {
                uid: applied.uid,
                landlock: applied.landlock.map(|abi| format!("abi {abi}")),
                seccomp: applied.seccomp,
                network: applied.network,
            })
            .unwrap_or_default(),
    })
}

/// The `state` of `session.info`.
fn phase_name(phase: SessionPhase) -> &'static str {
    match phase {
        SessionPhase::Idle => "idle",
        SessionPhase::Busy => "busy",
        // Failed: no worker could be had yet; the next execution tries again.
        SessionPhase::Restarting | SessionPhase::Failed => "restarting",
        SessionPhase::Closing => "closing",
        SessionPhase::Closed => "closed",
    }
}

/// A duration from a number of seconds in a request; `field` names it in the error.
fn seconds(field: &str, value: f64) -> Result<Duration, RpcError> {
    match Duration::try_from_secs_f64(value) {
        Ok(duration) if value > 0.0 => Ok(duration),
        _ => Err(RpcError::invalid_params(format!(
            "{field}: expected a positive number of seconds, got {value}"
        ))),
    }
}

fn decode<T: DeserializeOwned>(params: Option<Value>) -> Result<T, RpcError> {
    let params = params.unwrap_or(Value::Null);
    if !params.is_object() {
        return Err(RpcError::invalid_params("expected an object"));
    }
    // The path names the field in the message, e.g. "limits.memory_mb: invalid type".
    serde_path_to_error::deserialize(params).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if path == "." {
            RpcError::invalid_params(inner)
        } else {
            RpcError::invalid_params(format!("{path}: {inner}"))
        }
    })
}

/// Like [`decode`], for methods whose params are all optional: absent params are defaults.
fn decode_or_default<T: DeserializeOwned + Default>(params: Option<Value>) -> Result<T, RpcError> {
    match params {
        None | Some(Value::Null) => Ok(T::default()),
        Some(params) => decode(Some(params)),
    }
}

fn no_params(params: Option<Value>) -> Result<(), RpcError> {
    match params {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(map)) if map.is_empty() => Ok(()),
        Some(Value::Array(list)) if list.is_empty() => Ok(()),
        Some(_) => Err(RpcError::invalid_params("this method takes no params")),
    }
}

/// The result as JSON text, serialized once: a response embeds it as it is.
fn encode<T: Serialize>(value: T) -> Result<Box<RawValue>, RpcError> {
    serde_json::value::to_raw_value(&value)
        .map_err(|err| RpcError::new(super::errors::code::INTERNAL_ERROR, err.to_string()))
}
