//! The methods of docs/protocol.md over an [`Engine`]: decode params, call the engine, encode the
//! result. Every transport (Unix socket, stdio, HTTP, WebSocket) goes through one
//! [`Dispatcher`], so they behave alike.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use futures::StreamExt;
use pyvisor_actors::session::SessionPhase;
use serde_json::value::RawValue;
use serde_json::Value;

use super::caller::Caller;
use super::errors::RpcError;
use super::limits::LimitPolicy;
use super::memory;
use super::outbound::Outbound;
use super::params::{check_name, decode, decode_or_default, encode, no_params, take_owner};
use super::task;
use super::wire::{self, method, notification};
use crate::{
    Engine, EngineError, ExecuteRequest, ExecutionEvent, Session, SessionError, SessionOptions,
};

/// Serves JSON-RPC method calls against one engine. Shared by every connection.
pub struct Dispatcher {
    engine: Engine,
    /// Limits of a session that asks for none, the base of the ones that ask for some, and
    /// the ceilings of what they may ask for. Replaced when the daemon reloads its settings.
    limits: RwLock<LimitPolicy>,
    started: Instant,
    stopping: AtomicBool,
    /// Sessions looked up before, by the owner scope and the id or name the client used:
    /// saves the registry actor a message on every call. (Not the proactive cache.)
    sessions: Mutex<HashMap<(Option<String>, String), Session>>,
}

impl Dispatcher {
    /// A dispatcher over `engine`, whose sessions get their limits from `limits`.
    pub fn new(engine: Engine, limits: impl Into<LimitPolicy>) -> Arc<Self> {
        Arc::new(Self {
            engine,
            limits: RwLock::new(limits.into()),
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
    pub fn set_limits(&self, limits: LimitPolicy) {
        *self.limits.write().expect("limits lock is never poisoned") = limits;
    }

    fn limit_policy(&self) -> std::sync::RwLockReadGuard<'_, LimitPolicy> {
        self.limits.read().expect("limits lock is never poisoned")
    }

    /// Marks the server as stopping: `engine.health` says so from now on.
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Whether a graceful stop has begun.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Runs `method` with `params` for `caller`. Notifications a streaming execution
    /// produces go to `out` before this returns.
    pub async fn call(
        &self,
        caller: &Caller,
        method: &str,
        mut params: Option<Value>,
        out: &Outbound,
    ) -> Result<Box<RawValue>, RpcError> {
        let is_session_method = !matches!(method, method::STATS | method::HEALTH);
        // Every session method takes `owner`; whom the call may reach follows from it.
        let scope = if is_session_method {
            caller.scope(take_owner(&mut params)?.as_deref())?
        } else {
            None
        };
        let at = Scope {
            caller,
            owner: scope,
        };
        match method {
            method::CREATE => encode(self.create(&at, decode_or_default(params)?).await?),
            method::EXECUTE => encode(self.execute(&at, decode(params)?, out).await?),
            method::INPUT => encode(self.input(&at, decode(params)?).await?),
            method::INTERRUPT => encode(self.interrupt(&at, decode(params)?).await?),
            method::CHECKPOINT => encode(self.checkpoint(&at, decode(params)?).await?),
            method::RESTORE => encode(self.restore(&at, decode(params)?).await?),
            method::CHECKPOINTS => encode(self.checkpoints(&at, decode(params)?).await?),
            method::INFO => encode(self.info(&at, decode(params)?).await?),
            method::LIST => encode(self.list(&at, decode_or_default(params)?).await?),
            method::CLOSE => encode(self.close(&at, decode(params)?).await?),
            method::HINT => encode(self.hint(&at, decode(params)?).await?),
            method::COMPLETE => {
                let params: wire::CompleteParams = decode(params)?;
                let session = self.session(&at, &params.session_id).await?;
                let done = session.complete(params.code, params.cursor).await?;
                encode(wire::Completed {
                    matches: done.matches,
                    busy: done.busy,
                })
            }
            method::STATS => {
                no_params(params)?;
                encode(self.stats().await?)
            }
            memory::CHECK => {
                let params: memory::CheckParams = decode(params)?;
                let session = match &params.session_id {
                    Some(id) => Some(self.session(&at, id).await?),
                    None => None,
                };
                encode(memory::check(
                    &self.engine,
                    at.owner.as_deref(),
                    &params,
                    session.as_ref(),
                )?)
            }
            memory::FEEDBACK => {
                encode(memory::feedback(&self.engine, at.owner.as_deref(), decode(params)?).await?)
            }
            memory::SEARCH => {
                encode(memory::search(&self.engine, at.owner.as_deref(), decode(params)?).await?)
            }
            memory::STATS => {
                no_params(params)?;
                encode(memory::stats(&self.engine, at.owner.as_deref()))
            }
            method::HEALTH => {
                no_params(params)?;
                encode(self.health())
            }
            task::RUN | task::CANCEL => {
                at.unpinned()?;
                task::call(&self.engine, at.owner(), method, params, out).await
            }
            other => Err(RpcError::method_not_found(other)),
        }
    }

    /// The id of the session `key` names for `caller` (a WebSocket's path); another owner's
    /// session is unknown, like a missing one.
    pub async fn resolve(&self, caller: &Caller, key: &str) -> Result<String, RpcError> {
        let at = Scope {
            caller,
            owner: caller.scope(None)?,
        };
        Ok(self.session(&at, key).await?.id().to_owned())
    }

    async fn create(
        &self,
        at: &Scope<'_>,
        params: wire::CreateParams,
    ) -> Result<wire::Created, RpcError> {
        at.unpinned()?;
        if let Some(name) = &params.name {
            check_name(name)?;
        }
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
        let limits = Some(
            self.limit_policy()
                .session_limits(&params.limits.unwrap_or_default())?,
        );
        let options = SessionOptions {
            name: params.name,
            owner: at.owner.clone(),
            python,
            cwd: params.cwd.map(PathBuf::from),
            env: params.env.unwrap_or_default().into_iter().collect(),
            limits,
            proactive: params.proactive,
            network: params.network,
            llm: params.llm,
            bridge: None,
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
        self.remember(&at.owner, &created.session_id, session);
        Ok(created)
    }

    async fn execute(
        &self,
        at: &Scope<'_>,
        params: wire::ExecuteParams,
        out: &Outbound,
    ) -> Result<wire::ExecutionResult, RpcError> {
        let mut request = ExecuteRequest::new(params.code);
        if let Some(timeout_s) = params.timeout_s {
            request.timeout = Some(self.limit_policy().timeout("timeout_s", timeout_s)?);
        }
        if let Some(transaction) = params.transaction {
            request.transaction = transaction;
        }
        request.queue = params.queue.unwrap_or(true);
        request.cache = params.cache.unwrap_or(true);
        request.input = params.stream;
        request.meta = params.meta;
        let session = self.session(at, &params.session_id).await?;
        if !params.stream {
            return session.run(request).await.map_err(|err| {
                self.forget_if_closed(&err);
                RpcError::from(err)
            });
        }
        let mut execution = session.execute(request).await.map_err(|err| {
            self.forget_if_closed(&err);
            RpcError::from(err)
        })?;
        let echo = params.stream_echo.unwrap_or(true);
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
                ExecutionEvent::Finished(mut result) => {
                    if !echo {
                        // The caller has every byte from the notifications already.
                        result.stdout.clear();
                        result.stderr.clear();
                    }
                    return Ok(*result);
                }
            }
        }
        Err(EngineError::Stopped.into())
    }

    async fn input(
        &self,
        at: &Scope<'_>,
        params: wire::InputParams,
    ) -> Result<wire::Empty, RpcError> {
        let session = self.session(at, &params.session_id).await?;
        session
            .send_input(&params.execution_id, params.value)
            .await?;
        Ok(wire::Empty {})
    }

    async fn interrupt(
        &self,
        at: &Scope<'_>,
        params: wire::SessionRef,
    ) -> Result<wire::Interrupted, RpcError> {
        let session = self.session(at, &params.session_id).await?;
        let interrupted = session.interrupt().await?;
        Ok(wire::Interrupted { interrupted })
    }

    async fn checkpoint(
        &self,
        at: &Scope<'_>,
        params: wire::SessionRef,
    ) -> Result<wire::CheckpointTaken, RpcError> {
        let summary = self
            .session(at, &params.session_id)
            .await?
            .checkpoint()
            .await?;
        Ok(wire::CheckpointTaken {
            checkpoint_id: summary.checkpoint_id,
            bytes: summary.bytes,
            state_bytes: summary.state_bytes,
            saved: summary.saved,
            lost: summary.lost,
            duration_ms: summary.duration_ms,
        })
    }

    async fn restore(
        &self,
        at: &Scope<'_>,
        params: wire::RestoreParams,
    ) -> Result<wire::Restored, RpcError> {
        let session = self.session(at, &params.session_id).await?;
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
        at: &Scope<'_>,
        params: wire::SessionRef,
    ) -> Result<Vec<wire::CheckpointEntry>, RpcError> {
        let session = self.session(at, &params.session_id).await?;
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

    async fn info(
        &self,
        at: &Scope<'_>,
        params: wire::SessionRef,
    ) -> Result<wire::SessionInfo, RpcError> {
        let session = self.session(at, &params.session_id).await?;
        session_info(&session).await.map_err(|err| {
            self.forget_if_closed(&err);
            RpcError::from(err)
        })
    }

    /// `params.owner` was taken out by [`Dispatcher::call`] into the scope.
    async fn list(
        &self,
        at: &Scope<'_>,
        _params: wire::ListParams,
    ) -> Result<Vec<wire::SessionInfo>, RpcError> {
        at.unpinned()?;
        let sessions = self.engine.sessions(at.owner.as_deref()).await?;
        let infos = futures::future::join_all(sessions.iter().map(session_info)).await;
        // A session closed between the listing and its info is no longer in the list.
        Ok(infos.into_iter().filter_map(Result::ok).collect())
    }

    async fn close(
        &self,
        at: &Scope<'_>,
        params: wire::CloseParams,
    ) -> Result<wire::Empty, RpcError> {
        let session = self.session(at, &params.session_id).await?;
        self.forget(session.id());
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
            memory: self.engine.memory_stats(None),
            llm: stats.llm,
        })
    }

    async fn hint(
        &self,
        at: &Scope<'_>,
        params: wire::HintParams,
    ) -> Result<wire::Hinted, RpcError> {
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
        let session = self.session(at, &params.session_id).await?;
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

    /// The session `key` names (an id or a name) within the caller's scope, from the
    /// handles looked up before or from the engine. Another owner's session is unknown, exactly like a missing one.
    async fn session(&self, at: &Scope<'_>, key: &str) -> Result<Session, RpcError> {
        let session = match self.looked_up(&at.owner, key) {
            Some(session) => session,
            None => {
                let session = self.engine.session(key, at.owner.as_deref()).await?;
                self.remember(&at.owner, key, session.clone());
                session
            }
        };
        if let Some(pinned) = at.caller.pinned() {
            if session.id() != pinned {
                return Err(RpcError::invalid_params(format!(
                    "session_id: this WebSocket serves session {pinned} only"
                )));
            }
        }
        Ok(session)
    }

    fn looked_up(&self, owner: &Option<String>, key: &str) -> Option<Session> {
        let sessions = self
            .sessions
            .lock()
            .expect("the session handles lock is never poisoned");
        sessions.get(&(owner.clone(), key.to_owned())).cloned()
    }

    fn remember(&self, owner: &Option<String>, key: &str, session: Session) {
        let mut sessions = self
            .sessions
            .lock()
            .expect("the session handles lock is never poisoned");
        sessions.insert((owner.clone(), key.to_owned()), session);
    }

    /// Forgets the handle of the session `session_id`, whatever keys found it.
    fn forget(&self, session_id: &str) {
        let mut sessions = self
            .sessions
            .lock()
            .expect("the session handles lock is never poisoned");
        sessions.retain(|_, session| session.id() != session_id);
    }

    /// A handle that answers `Closed` belongs to a closed session: look it up anew next time.
    fn forget_if_closed(&self, err: &EngineError) {
        if let EngineError::Session(SessionError::Closed { session_id }) = err {
            self.forget(session_id);
        }
    }
}

/// Who a call is for: the caller, and the owner whose sessions it reaches (`None`: an admin
/// who named nobody reaches every session).
struct Scope<'a> {
    caller: &'a Caller,
    owner: Option<String>,
}

impl Scope<'_> {
    /// The owner the call is confined to; every owner when `None`.
    fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    /// Refuses a method that is not about the pinned session (a WebSocket's).
    fn unpinned(&self) -> Result<(), RpcError> {
        match self.caller.pinned() {
            Some(pinned) => Err(RpcError::invalid_request(format!(
                "this WebSocket serves session {pinned} only"
            ))),
            None => Ok(()),
        }
    }
}

/// `session.info` of one session.
async fn session_info(session: &Session) -> Result<wire::SessionInfo, EngineError> {
    let snapshot = session.info().await?;
    let (variables, definitions, rss_bytes) = match snapshot.namespace {
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
            namespace
                .definitions
                .into_iter()
                .map(|definition| wire::DefinitionInfo {
                    name: definition.name,
                    kind: definition.kind,
                    source: definition.source,
                })
                .collect(),
            namespace.rss_bytes,
        ),
        None => (Vec::new(), Vec::new(), None),
    };
    let limits = &snapshot.limits;
    let limits = wire::LimitsInfo {
        memory_mb: limits.memory_mb,
        cpu_s: limits.cpu_s,
        open_files: limits.open_files,
        processes: limits.processes,
        timeout_s: limits.timeout.as_secs_f64(),
        output_bytes: limits.output_bytes,
        result_repr_bytes: limits.result_repr_bytes,
        input_timeout_s: limits.input_timeout.as_secs_f64(),
        interrupt_grace_s: limits.interrupt_grace.as_secs_f64(),
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
        cpu_s: snapshot.cpu_s,
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
        containment: snapshot.containment.map(str::to_owned),
        definitions,
        limits: Some(limits),
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
