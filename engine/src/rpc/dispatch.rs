//! The methods of docs/protocol.md over an [`Engine`]: decode params, call the engine, encode the
//! result. Every transport (Unix socket, stdio, HTTP, WebSocket) goes through one
//! [`Dispatcher`], so they behave alike.
//!
//! This file routes a call to its method and finds the session it names within the caller's
//! scope; the session methods are in `methods`, the `session.info` report in `report`, the
//! handles of sessions found before in `handles`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

use serde_json::value::RawValue;
use serde_json::Value;

mod cluster;
mod handles;
mod methods;
mod report;

use cluster::Sent;
use handles::SessionHandles;

use super::caller::Caller;
use super::client_llm::ClientBridge;
use super::errors::RpcError;
use super::files;
use super::limits::LimitPolicy;
use super::memory;
use super::outbound::Outbound;
use super::params::{decode, decode_or_default, encode, no_params, take_owner};
use super::task;
use super::wire::{self, method};
use crate::files::SessionFiles;
use crate::{Engine, EngineError, Session, SupervisorError};

/// Serves JSON-RPC method calls against one engine. Shared by every connection.
pub struct Dispatcher {
    engine: Engine,
    /// Limits of a session that asks for none, the base of the ones that ask for some, and
    /// the ceilings of what they may ask for. Replaced when the daemon reloads its settings.
    limits: RwLock<LimitPolicy>,
    started: Instant,
    stopping: AtomicBool,
    /// Sessions looked up before.
    sessions: SessionHandles,
    /// Answers the LLM calls of sessions whose client answers them.
    client_llm: Arc<ClientBridge>,
    /// The node of the cluster this daemon is part of, with `[cluster]`.
    cluster: OnceLock<Arc<crate::cluster::Node>>,
}

impl Dispatcher {
    /// A dispatcher over `engine`, whose sessions get their limits from `limits`.
    pub fn new(engine: Engine, limits: impl Into<LimitPolicy>) -> Arc<Self> {
        let (config, counters) = engine.client_llm();
        Arc::new(Self {
            client_llm: ClientBridge::new(config, counters),
            engine,
            limits: RwLock::new(limits.into()),
            started: Instant::now(),
            stopping: AtomicBool::new(false),
            sessions: SessionHandles::default(),
            cluster: OnceLock::new(),
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
    /// produces go to `out` before this returns. With `[cluster]`, a call for a session
    /// another live node holds is sent on to that node; when that node cannot be reached,
    /// the call waits for its lease to run out and takes the session over here.
    pub async fn call(
        &self,
        caller: &Caller,
        method: &str,
        params: Option<Value>,
        out: &Outbound,
    ) -> Result<Box<RawValue>, RpcError> {
        let Some(target) = self.forwardable(caller, method, &params) else {
            return self.call_here(caller, method, params, out).await;
        };
        if let Some(answer) = self
            .forward_to_known_holder(&target, method, &params, out)
            .await
        {
            return answer;
        }
        let copy = params.clone();
        let err = match self.call_here(caller, method, params, out).await {
            Err(err) => err,
            answer => return answer,
        };
        match self.forward(&target, method, &copy, err, out).await {
            // The holder is gone, it seems: its lease runs out soon, and then the call may
            // take the session over here, once, rather than be refused and sent again.
            Sent::Unreachable(_) if target.wait_out_lease().await => {
                match self.call_here(caller, method, copy.clone(), out).await {
                    Err(err) => self
                        .forward(&target, method, &copy, err, out)
                        .await
                        .answer(),
                    answer => answer,
                }
            }
            sent => sent.answer(),
        }
    }

    /// [`Dispatcher::call`] on this node's engine.
    async fn call_here(
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
            method::EXECUTE => {
                let params: wire::ExecuteParams = decode(params)?;
                let session_id = params.session_id.clone();
                let mut result = self.execute(&at, params, out).await?;
                self.note_result(&session_id, &mut result).await;
                encode(result)
            }
            method::INPUT => encode(self.input(&at, decode(params)?).await?),
            method::INTERRUPT => encode(self.interrupt(&at, decode(params)?).await?),
            method::CHECKPOINT => encode(self.checkpoint(&at, decode(params)?).await?),
            method::RESTORE => encode(self.restore(&at, decode(params)?).await?),
            method::CHECKPOINTS => encode(self.checkpoints(&at, decode(params)?).await?),
            method::INFO => encode(self.info(&at, decode(params)?).await?),
            method::LIST => encode(self.list(&at, decode_or_default(params)?).await?),
            method::CLOSE => encode(self.close(&at, decode(params)?).await?),
            method::HINT => encode(self.hint(&at, decode(params)?).await?),
            method::FORK => encode(self.fork(&at, decode(params)?).await?),
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
            method::CLUSTER_STATUS => {
                no_params(params)?;
                encode(self.cluster_status(&at).await?)
            }
            method::NODE_DRAIN => {
                no_params(params)?;
                self.drain(&at).await?;
                encode(serde_json::json!({}))
            }
            method if files::is_files_method(method) => {
                let session = self.session(&at, &files::session_key(&params)?).await?;
                files::call(&session, method, params).await
            }
            task::RUN | task::CANCEL => {
                at.unpinned()?;
                task::call(&self.engine, at.owner(), method, params, out).await
            }
            other => Err(RpcError::method_not_found(other)),
        }
    }

    /// The id of the session `key` names for `caller` (a WebSocket's path); another owner's
    /// session is unknown, like a missing one. With `[cluster]`, a session another live node
    /// holds is `key` too: the calls about it are forwarded there.
    pub async fn resolve(&self, caller: &Caller, key: &str) -> Result<String, RpcError> {
        let at = Scope {
            caller,
            owner: caller.scope(None)?,
        };
        match self.session(&at, key).await {
            Ok(session) => Ok(session.id().to_owned()),
            Err(err) if self.forwards_to_holder(caller, &err) => Ok(key.to_owned()),
            Err(err) => Err(err),
        }
    }

    /// The files of the session `key` names for `caller` (an HTTP file route); another
    /// owner's session is unknown, like a missing one.
    pub async fn files(&self, caller: &Caller, key: &str) -> Result<SessionFiles, RpcError> {
        let at = Scope {
            caller,
            owner: caller.scope(None)?,
        };
        Ok(self.session(&at, key).await?.files())
    }

    /// The session `key` names (an id or a name) within the caller's scope, from the handles
    /// looked up before or from the engine. Another owner's session is unknown, like a missing one.
    async fn session(&self, at: &Scope<'_>, key: &str) -> Result<Session, RpcError> {
        let session = match self.sessions.looked_up(&at.owner, key) {
            Some(session) => session,
            None => {
                let session = match self.engine.session(key, at.owner.as_deref()).await {
                    Ok(session) => session,
                    Err(
                        not_here @ EngineError::Supervisor(SupervisorError::UnknownSession {
                            ..
                        }),
                    ) => self.take_over(key, at.owner(), not_here).await?,
                    Err(err) => return Err(err.into()),
                };
                self.sessions.remember(&at.owner, key, session.clone());
                session
            }
        };
        let session = self.held_here(session, key, at.owner()).await?;
        if let Some(pinned) = at.caller.pinned() {
            if session.id() != pinned {
                return Err(RpcError::invalid_params(format!(
                    "session_id: this WebSocket serves session {pinned} only"
                )));
            }
        }
        Ok(session)
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
