//! The Supervisor: owns every session actor and the arbiter threads they run on.
//!
//! The engine sends it [`CreateSession`], [`ListSessions`] and
//! [`StopAll`]. It keeps the registry of live sessions (slotmap keys inside, stable string
//! ids outside), spreads sessions over a few long-lived arbiter threads (a worker's
//! `PR_SET_PDEATHSIG` is tied to the thread that spawned it), and on stop ends every worker
//! before it replies.

use std::collections::HashMap;
use std::path::PathBuf;

use actix::prelude::*;
use futures::future::join_all;
use slotmap::{new_key_type, SlotMap};
use tokio::sync::oneshot;

use crate::errors::SupervisorError;
use crate::limits::{ProcessLimits, SessionLimits};
use crate::session::{Close, SessionActor, SessionEnded};
use crate::worker::{WorkerInfo, WorkerSpec};

new_key_type! {
    /// Internal key of a registered session.
    struct SessionKey;
}

/// Defaults every new session starts from.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// How to start a worker; per-session options are applied on top.
    pub worker: WorkerSpec,
    /// Default limits of a session.
    pub limits: SessionLimits,
    /// Arbiter threads that host session actors.
    pub arbiters: usize,
}

/// What a caller may choose about a new session.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// Working directory of the worker.
    pub cwd: Option<PathBuf>,
    /// Extra environment variables of the worker.
    pub env: Vec<(String, String)>,
    /// Limits replacing the engine defaults.
    pub limits: Option<SessionLimits>,
}

/// Create a session and start its worker.
#[derive(Message)]
#[rtype(result = "Result<SessionHandle, SupervisorError>")]
pub struct CreateSession {
    pub options: SessionOptions,
}

/// A live session: its public id, its actor, and the worker it started with.
#[derive(Debug, Clone)]
pub struct SessionHandle {
    pub session_id: String,
    pub addr: Addr<SessionActor>,
    pub worker: WorkerInfo,
}

/// Ids of every live session.
#[derive(Message)]
#[rtype(result = "Vec<String>")]
pub struct ListSessions;

/// Refuse new sessions, end every worker, and reply when all are gone.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopAll;

struct Entry {
    session_id: String,
    addr: Addr<SessionActor>,
}

/// The root actor of an engine.
pub struct Supervisor {
    config: SupervisorConfig,
    arbiters: Vec<Arbiter>,
    next_arbiter: usize,
    sessions: SlotMap<SessionKey, Entry>,
    by_id: HashMap<String, SessionKey>,
    id_prefix: String,
    created: u64,
    stopping: bool,
}

impl Supervisor {
    /// A supervisor with its own arbiter threads.
    pub fn new(config: SupervisorConfig) -> Self {
        let arbiters = (0..config.arbiters.max(1))
            .map(|_| Arbiter::new())
            .collect();
        Self {
            config,
            arbiters,
            next_arbiter: 0,
            sessions: SlotMap::with_key(),
            by_id: HashMap::new(),
            id_prefix: session_id_prefix(),
            created: 0,
            stopping: false,
        }
    }

    fn next_arbiter(&mut self) -> ArbiterHandle {
        let arbiter = &self.arbiters[self.next_arbiter % self.arbiters.len()];
        self.next_arbiter += 1;
        arbiter.handle()
    }
}

/// A prefix that keeps session ids of different engine runs apart.
fn session_id_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!(
        "s-{:06x}",
        (nanos ^ std::process::id().rotate_left(12)) & 0xff_ffff
    )
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Context<Self>) {
        for arbiter in &self.arbiters {
            arbiter.stop();
        }
    }
}

impl Handler<CreateSession> for Supervisor {
    type Result = ResponseActFuture<Self, Result<SessionHandle, SupervisorError>>;

    fn handle(&mut self, msg: CreateSession, ctx: &mut Context<Self>) -> Self::Result {
        if self.stopping {
            return Box::pin(fut::ready(Err(SupervisorError::ShuttingDown)));
        }
        self.created += 1;
        let session_id = format!("{}-{}", self.id_prefix, self.created);
        let mut spec = self.config.worker.clone();
        spec.cwd = msg.options.cwd.or(spec.cwd);
        spec.env.extend(msg.options.env);
        let limits = msg
            .options
            .limits
            .unwrap_or_else(|| self.config.limits.clone());
        spec.limits = ProcessLimits::from(&limits);
        let (ready_tx, ready_rx) = oneshot::channel();
        let on_end = ctx.address().recipient();
        let id = session_id.clone();
        let addr = SessionActor::start_in_arbiter(&self.next_arbiter(), move |_| {
            SessionActor::new(id, spec, limits, ready_tx, Some(on_end))
        });
        Box::pin(ready_rx.into_actor(self).map(move |ready, act, _| {
            let worker = match ready {
                Ok(Ok(info)) => info,
                Ok(Err(err)) => return Err(SupervisorError::Spawn(err)),
                Err(_) => return Err(SupervisorError::ShuttingDown),
            };
            let key = act.sessions.insert(Entry {
                session_id: session_id.clone(),
                addr: addr.clone(),
            });
            act.by_id.insert(session_id.clone(), key);
            Ok(SessionHandle {
                session_id,
                addr,
                worker,
            })
        }))
    }
}

impl Handler<ListSessions> for Supervisor {
    type Result = Vec<String>;

    fn handle(&mut self, _: ListSessions, _: &mut Context<Self>) -> Vec<String> {
        self.sessions
            .values()
            .map(|entry| entry.session_id.clone())
            .collect()
    }
}

impl Handler<SessionEnded> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: SessionEnded, _: &mut Context<Self>) {
        if let Some(key) = self.by_id.remove(&msg.session_id) {
            self.sessions.remove(key);
        }
    }
}

impl Handler<StopAll> for Supervisor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: StopAll, _: &mut Context<Self>) -> Self::Result {
        self.stopping = true;
        let closing: Vec<_> = self
            .sessions
            .values()
            .map(|entry| entry.addr.send(Close { graceful: false }))
            .collect();
        Box::pin(async move {
            join_all(closing).await;
        })
    }
}
