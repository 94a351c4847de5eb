//! The RegistryActor: the root actor of an engine, owning the pool and every session.
//!
//! The engine sends it [`CreateSession`], [`FindSession`], [`ListSessions`], [`GetStats`],
//! [`Resize`] and [`StopAll`]; sessions tell it when they close ([`SessionEvent::Closed`]). It keeps the registry of live
//! sessions (slotmap keys inside, stable ids and unique names outside), gets each new
//! session's worker from the [`PoolActor`], and starts the session actor under actix
//! supervision on the arbiter thread that serves that worker's pipes, so a session whose
//! worker dies is restarted under the same id. A worker's `PR_SET_PDEATHSIG` is tied to the
//! thread that spawned it, so spawns only happen on these long-lived arbiters. On stop it
//! refuses new work, lets running executions finish for a grace period, then ends every
//! worker before it replies.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use actix::prelude::*;
use futures::future::join_all;
use tokio::sync::oneshot;

use crate::checkpoint::{CheckpointStore, StoredOptions};
use crate::errors::SupervisorError;
use crate::limits::ProcessLimits;
use crate::memory::MemoryActor;
use crate::pool::{Acquire, DrainPool, GetPoolStats, Lease, PoolActor, Release, Resize, Slot};
use crate::proactive::cache::CacheActor;
use crate::proactive::predict::Table;
use crate::proactive::predictor::PredictorActor;
use crate::session::{
    events, Close, CloseState, Delivery, Drain, LlmLink, MemoryLink, ProactiveSetup, SessionActor,
    SessionEvent, SessionSetup, StateSetup, Subscribers, Subscription,
};
use crate::worker::WorkerSpec;

mod forking;
mod messages;
mod registry;

pub use forking::{ForkSession, ForkedSessions};
pub use messages::{
    CreateSession, FindSession, GetStats, Interpreter, ListSessions, LlmOptions, ProactiveOptions,
    Quotas, SessionHandle, SessionOptions, StateOptions, StopAll, SupervisorConfig,
    SupervisorStats,
};
use registry::Registry;

/// The root actor of an engine.
pub struct RegistryActor {
    config: SupervisorConfig,
    arbiters: Vec<Arbiter>,
    pool: Option<Addr<PoolActor>>,
    /// The proactive actors, started with the supervisor.
    proactive: Option<(Addr<PredictorActor>, Addr<CacheActor>)>,
    /// The actor that follows sessions for the memory, started with the supervisor.
    memory: Option<Addr<MemoryActor>>,
    registry: Registry,
    /// Names (per owner) whose session is being created, with the creates that wait to
    /// attach to it.
    creating: HashMap<(Option<String>, String), Vec<oneshot::Sender<()>>>,
    /// Sessions being created, per owner: they count against the owner's quota already.
    creating_for: HashMap<String, usize>,
    id_prefix: String,
    created: u64,
    stopping: bool,
}

impl RegistryActor {
    /// Counts a session being created for `owner` against its quota, or refuses it.
    fn count_against_quota(&mut self, owner: Option<&str>) -> Result<(), SupervisorError> {
        let (Some(owner), Some(limit)) = (owner, self.config.quotas.max_sessions_per_owner) else {
            return Ok(());
        };
        let live = self
            .registry
            .handles()
            .filter(|handle| handle.owner.as_deref() == Some(owner))
            .count();
        let creating = self.creating_for.entry(owner.to_owned()).or_default();
        if live + *creating >= limit {
            return Err(SupervisorError::TooManySessions {
                owner: owner.to_owned(),
                limit,
            });
        }
        *creating += 1;
        Ok(())
    }

    /// A create for `owner` is over: the session is in the registry now, or failed.
    fn created_for(&mut self, owner: Option<&str>) {
        let Some(owner) = owner else { return };
        if let Some(creating) = self.creating_for.get_mut(owner) {
            *creating = creating.saturating_sub(1);
            if *creating == 0 {
                self.creating_for.remove(owner);
            }
        }
    }

    /// A supervisor with its own arbiter threads; the pool starts with the actor.
    pub fn new(config: SupervisorConfig) -> Self {
        let arbiters = (0..config.arbiters.max(1))
            .map(|_| Arbiter::new())
            .collect();
        Self {
            config,
            arbiters,
            pool: None,
            proactive: None,
            memory: None,
            registry: Registry::default(),
            creating: HashMap::new(),
            creating_for: HashMap::new(),
            id_prefix: session_id_prefix(),
            created: 0,
            stopping: false,
        }
    }

    /// The checkpoint store, when the engine keeps checkpoints.
    fn store(&self) -> Option<CheckpointStore> {
        self.config.state.as_ref().map(|state| state.store.clone())
    }

    fn pool(&self) -> &Addr<PoolActor> {
        self.pool
            .as_ref()
            .expect("the pool starts with the supervisor")
    }

    /// The worker a session with `options` needs, when it is not the pool's own kind.
    fn custom_spec(&self, options: &SessionOptions) -> Option<Box<WorkerSpec>> {
        let limits = options.limits.as_ref().unwrap_or(&self.config.limits);
        let process = ProcessLimits::from(limits);
        let base = &self.config.worker;
        let other_python = options
            .python
            .as_ref()
            .filter(|interpreter| interpreter.python != base.python);
        let network = options.network.unwrap_or(base.network);
        if other_python.is_none()
            && options.cwd.is_none()
            && options.env.is_empty()
            && process == base.limits
            && network == base.network
        {
            return None;
        }
        let mut spec = base.clone();
        if let Some(interpreter) = other_python {
            // The zygote forks the engine's interpreter only, and the preload list is meant
            // for it.
            spec.python = interpreter.python.clone();
            spec.script = interpreter.script.clone();
            spec.zygote = None;
            spec.preload.clear();
        }
        spec.cwd = options.cwd.clone().or(spec.cwd);
        spec.env.extend(options.env.iter().cloned());
        spec.limits = process;
        spec.network = network;
        Some(Box::new(spec))
    }

    /// Registers a session around a leased worker and starts its actor; `on_disk` is the
    /// execution count of the newest checkpoint the session has to come back from, if any.
    fn start_session(
        &mut self,
        lease: Lease,
        options: SessionOptions,
        spec: Option<Box<WorkerSpec>>,
        on_disk: Option<u64>,
        ctx: &mut Context<Self>,
    ) -> Result<SessionHandle, SupervisorError> {
        if self.stopping {
            // The lease's worker ends as it is dropped.
            self.pool().do_send(Release);
            return Err(SupervisorError::ShuttingDown);
        }
        self.created += 1;
        let session_id = match options.take_over.clone() {
            Some(id) => id,
            None => format!("{}-{}", self.id_prefix, self.created),
        };
        let state = self.config.state.as_ref().map(|state| StateSetup {
            store: state.store.clone(),
            key: StateSetup::key_for(
                options.owner.as_deref(),
                options.name.as_deref(),
                &session_id,
            ),
            policy: state.policy,
            scratch: state.scratch.clone(),
            restore_on_start: on_disk.is_some(),
            counted_from: on_disk.unwrap_or(0),
            max_bytes: state.max_bytes.unwrap_or_else(|| {
                let limits = options.limits.as_ref().unwrap_or(&self.config.limits);
                limits
                    .memory_mb
                    .map_or(u64::MAX, |mb| mb.saturating_mul(1024 * 1024))
            }),
        });
        let owner: Arc<str> = options.owner.as_deref().unwrap_or_default().into();
        let own_bridge = options.bridge.is_some();
        let bridge = match options.bridge {
            Some(own) => Some(Some(own.0)),
            // The client that starts each execution answers its calls.
            None if options.llm_by_client => Some(None),
            None => (self.config.llm.as_ref())
                .filter(|llm| options.llm.unwrap_or(llm.by_default))
                .map(|llm| Some(llm.bridge.clone())),
        };
        let llm = bridge.map(|bridge| LlmLink {
            bridge,
            owner: owner.clone(),
        });
        if let (Some(state), Some(_), false) = (&state, &options.name, own_bridge) {
            // A later engine restoring this named session gives it the same bridge.
            let (store, key) = (state.store.clone(), state.key.clone());
            let kept = StoredOptions {
                llm: llm.is_some(),
                llm_by_client: llm.as_ref().is_some_and(|link| link.bridge.is_none()),
            };
            tokio::task::spawn_blocking(move || {
                if let Err(err) = store.save_options(&key, kept) {
                    tracing::warn!(session = %key, error = %err, "cannot keep a session's options");
                }
            });
        }
        // A speculative run must never call a model: a session with the bridge computes
        // nothing ahead.
        let proactive = self.proactive.clone().filter(|_| {
            llm.is_none()
                && options
                    .proactive
                    .unwrap_or(self.config.proactive.by_default)
        });
        let mut subscribers = vec![Subscription::new(
            ctx.address().recipient(),
            events::closing_only,
            Delivery::AtOnce,
        )];
        if let Some((predictor, _)) = &proactive {
            subscribers.push(Subscription::new(
                predictor.clone().recipient(),
                events::every_event,
                Delivery::WhenQuiet,
            ));
        }
        if let Some(actor) = &self.memory {
            subscribers.push(Subscription::new(
                actor.clone().recipient(),
                MemoryActor::interest,
                Delivery::AtOnce,
            ));
        }
        let memory = self
            .config
            .memory
            .clone()
            .map(|memory| MemoryLink { memory, owner });
        let setup = SessionSetup {
            state,
            spec,
            max_frame: self.config.worker.max_frame,
            limits: options.limits.unwrap_or_else(|| self.config.limits.clone()),
            idle_timeout: self.config.quotas.idle_timeout,
            pool: self.pool().clone(),
            counters: self.config.counters.clone(),
            events: Subscribers::new(subscribers),
            memory,
            llm,
            proactive: proactive.as_ref().map(|(_, cache)| ProactiveSetup {
                cache: cache.clone(),
                kept: self.config.proactive.cache.per_session,
                counters: self.config.proactive.counters.clone(),
            }),
        };
        let worker_info = lease.worker.info.clone();
        let worker = lease.worker;
        let id = session_id.clone();
        let addr = actix::Supervisor::start_in_arbiter(&lease.arbiter, move |_| {
            SessionActor::new(id, worker, setup)
        });
        let handle = SessionHandle {
            session_id,
            name: options.name,
            owner: options.owner,
            addr,
            created_at: SystemTime::now(),
            warm: lease.warm,
            attached: false,
            worker: Some(worker_info),
            restored: on_disk.is_some(),
            predictor: proactive.map(|(predictor, _)| predictor),
            registry: ctx.address(),
        };
        self.registry.insert(handle.clone());
        Ok(handle)
    }
}

/// A create that found its owner's name taken: that session, attached to.
fn attach(existing: &SessionHandle) -> SessionHandle {
    SessionHandle {
        attached: true,
        worker: None,
        restored: false,
        ..existing.clone()
    }
}

/// The checkpoints of a session that an earlier engine (or another node) left.
struct OnDisk {
    /// The options kept with them.
    kept: StoredOptions,
    /// The execution count of the newest, which the session restores on start and counts
    /// its executions on from.
    execution_count: u64,
}

/// What `store` holds of the session whose store key is `key`, when it holds checkpoints of
/// it that an earlier engine (or another node) left (read on the blocking pool, never on the
/// actor's thread).
async fn left_on_disk(store: Option<CheckpointStore>, key: Option<String>) -> Option<OnDisk> {
    let (Some(store), Some(key)) = (store, key) else {
        return None;
    };
    tokio::task::spawn_blocking(move || {
        let newest = (store.list(&key).ok()?)
            .into_iter()
            .max_by_key(|info| info.id.sequence())?;
        Some(OnDisk {
            kept: store.load_options(&key),
            execution_count: newest.meta.execution_count,
        })
    })
    .await
    .unwrap_or(None)
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

impl Actor for RegistryActor {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Context<Self>) {
        let arbiters = self.arbiters.iter().map(Arbiter::handle).collect();
        let pool = PoolActor::new(
            self.config.pool.clone(),
            self.config.worker.clone(),
            arbiters,
        );
        self.pool = Some(pool.start());
        let ProactiveOptions {
            predictor,
            cache,
            counters,
            ..
        } = self.config.proactive.clone();
        let cache = CacheActor::new(cache, counters.clone()).start();
        let predictor = PredictorActor::new(predictor, Table::builtin(), counters).start();
        self.proactive = Some((predictor, cache));
        self.memory = self
            .config
            .memory
            .clone()
            .map(|memory| MemoryActor::new(memory).start());
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        for arbiter in &self.arbiters {
            arbiter.stop();
        }
    }
}

impl Handler<CreateSession> for RegistryActor {
    type Result = ResponseActFuture<Self, Result<SessionHandle, SupervisorError>>;

    fn handle(&mut self, msg: CreateSession, ctx: &mut Context<Self>) -> Self::Result {
        if self.stopping {
            return Box::pin(fut::ready(Err(SupervisorError::ShuttingDown)));
        }
        let options = msg.options;
        if let Some(id) = &options.take_over {
            if let Some(existing) = self.registry.find(id, options.owner.as_deref()) {
                return Box::pin(fut::ready(Ok(attach(existing))));
            }
        }
        if let Some(name) = options.name.clone() {
            if let Some(existing) = self.registry.named(options.owner.as_deref(), &name) {
                // A session taken over must never be answered by another one of its name.
                let answer = match &options.take_over {
                    Some(id) => Err(SupervisorError::NameTaken {
                        session_id: id.clone(),
                        name,
                        other: existing.session_id.clone(),
                    }),
                    None => Ok(attach(existing)),
                };
                return Box::pin(fut::ready(answer));
            }
            let name = (options.owner.clone(), name);
            if let Some(waiting) = self.creating.get_mut(&name) {
                // Another create of this name is under way: ask again once it is done.
                let (done, created) = oneshot::channel();
                waiting.push(done);
                let supervisor = ctx.address();
                let retry = async move {
                    let _ = created.await;
                    supervisor
                        .send(CreateSession { options })
                        .await
                        .unwrap_or(Err(SupervisorError::ShuttingDown))
                };
                return Box::pin(retry.into_actor(self));
            }
            self.creating.insert(name, Vec::new());
        }
        if let Err(err) = self.count_against_quota(options.owner.as_deref()) {
            if let Some(name) = options.name.clone() {
                let name = (options.owner.clone(), name);
                for waiting in self.creating.remove(&name).unwrap_or_default() {
                    let _ = waiting.send(());
                }
            }
            return Box::pin(fut::ready(Err(err)));
        }
        let spec = self.custom_spec(&options);
        // Any arbiter: the session is started on the lease's.
        let acquire = self.pool().send(Acquire {
            spec: spec.clone(),
            slot: Slot::New,
            arbiter: None,
        });
        let owner = options.owner.as_deref();
        let key = match &options.take_over {
            Some(id) => Some(StateSetup::key_for(owner, options.name.as_deref(), id)),
            None => (options.name.as_deref()).map(|name| StateSetup::named_key(owner, name)),
        };
        let on_disk = left_on_disk(self.store(), key);
        let looked_up = async move {
            let on_disk = on_disk.await;
            (acquire.await, on_disk)
        };
        Box::pin(
            looked_up
                .into_actor(self)
                .map(move |(outcome, on_disk), act, ctx| {
                    let mut options = options;
                    let counted_from = on_disk.as_ref().map(|on_disk| on_disk.execution_count);
                    let kept = on_disk.map(|on_disk| on_disk.kept);
                    if let Some(kept) = kept.filter(|_| options.bridge.is_none()) {
                        if options.llm.is_none() && !options.llm_by_client {
                            options.llm = Some(kept.llm);
                            options.llm_by_client = kept.llm_by_client;
                        }
                    }
                    act.created_for(options.owner.as_deref());
                    if let Some(name) = options.name.clone() {
                        let name = (options.owner.clone(), name);
                        for waiting in act.creating.remove(&name).unwrap_or_default() {
                            let _ = waiting.send(());
                        }
                    }
                    match outcome {
                        Ok(Ok(lease)) => act.start_session(lease, options, spec, counted_from, ctx),
                        Ok(Err(err)) => Err(err.into()),
                        Err(_) => Err(SupervisorError::ShuttingDown),
                    }
                }),
        )
    }
}

impl Handler<FindSession> for RegistryActor {
    type Result = ResponseFuture<Result<SessionHandle, SupervisorError>>;

    /// A live session, or a named one an earlier engine left on disk (created and restored
    /// on this first use).
    fn handle(&mut self, msg: FindSession, ctx: &mut Context<Self>) -> Self::Result {
        if let Some(found) = self.registry.find(&msg.session, msg.owner.as_deref()) {
            let found = found.clone();
            return Box::pin(async move { Ok(found) });
        }
        let unknown = SupervisorError::UnknownSession {
            session: msg.session.clone(),
        };
        let key = StateSetup::named_key(msg.owner.as_deref(), &msg.session);
        let on_disk = left_on_disk(self.store(), Some(key));
        let supervisor = ctx.address();
        Box::pin(async move {
            if on_disk.await.is_none() {
                return Err(unknown);
            }
            let options = SessionOptions {
                name: Some(msg.session),
                owner: msg.owner,
                ..SessionOptions::default()
            };
            supervisor
                .send(CreateSession { options })
                .await
                .unwrap_or(Err(SupervisorError::ShuttingDown))
        })
    }
}

impl Handler<ListSessions> for RegistryActor {
    type Result = Vec<SessionHandle>;

    fn handle(&mut self, msg: ListSessions, _: &mut Context<Self>) -> Self::Result {
        self.registry.list(msg.owner.as_deref())
    }
}

impl Handler<GetStats> for RegistryActor {
    type Result = ResponseActFuture<Self, Result<messages::SupervisorStats, SupervisorError>>;

    fn handle(&mut self, _: GetStats, _: &mut Context<Self>) -> Self::Result {
        let pool = self.pool().send(GetPoolStats);
        Box::pin(pool.into_actor(self).map(|pool, act, _| {
            Ok(SupervisorStats {
                pool: pool.map_err(|_| SupervisorError::ShuttingDown)?,
                sessions: act.registry.len(),
            })
        }))
    }
}

/// New pool sizes, passed on to the pool.
impl Handler<Resize> for RegistryActor {
    type Result = ();

    fn handle(&mut self, msg: Resize, _: &mut Context<Self>) {
        self.config.pool = msg.0.clone();
        self.pool().do_send(msg);
    }
}

impl Handler<SessionEvent> for RegistryActor {
    type Result = ();

    fn handle(&mut self, event: SessionEvent, _: &mut Context<Self>) {
        if let SessionEvent::Closed { session_id } = event {
            if self.registry.remove(&session_id).is_some() {
                self.pool().do_send(Release);
            }
        }
    }
}

impl Handler<StopAll> for RegistryActor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: StopAll, _: &mut Context<Self>) -> Self::Result {
        self.stopping = true;
        self.pool().do_send(DrainPool);
        let state = if msg.checkpoint && self.config.state.is_some() {
            CloseState::Checkpoint
        } else {
            CloseState::Keep
        };
        let sessions: Vec<_> = self.registry.handles().map(|h| h.addr.clone()).collect();
        Box::pin(async move {
            let drained = join_all(sessions.iter().map(|addr| addr.send(Drain)));
            let _ = tokio::time::timeout(msg.grace, drained).await;
            join_all(sessions.iter().map(|addr| {
                addr.send(Close {
                    graceful: false,
                    state,
                })
            }))
            .await;
        })
    }
}
