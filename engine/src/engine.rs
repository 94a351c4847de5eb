//! The [`Engine`] handle; the thread that runs its actor system is in `system`.
//!
//! `Engine::start` resolves the interpreter, installs the worker package and starts an actix
//! system on a thread the engine owns; the handle only holds the RegistryActor's address, so it
//! is `Clone + Send + Sync` and usable from any async runtime. When the last handle is
//! dropped, the thread ends every worker, stops the system, and is joined.

#[cfg(feature = "server")]
use std::path::Path;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, ThreadId};
use std::time::Duration;

use actix::prelude::*;
#[cfg(feature = "server")]
use pyvisor_actors::checkpoint::CheckpointStore;
use pyvisor_actors::memory::Memory;
use pyvisor_actors::metrics::EngineCounters;
use pyvisor_actors::pool::{PoolConfig, PoolStats, Resize};
use pyvisor_actors::proactive::stats::{ProactiveCounters, ProactiveStats};
#[cfg(feature = "server")]
use pyvisor_actors::session::DurabilityMode;
use pyvisor_actors::supervisor::{
    CreateSession, FindSession, GetStats, Interpreter, ListSessions, LlmOptions, RegistryActor,
    SessionOptions, StateOptions, StopAll,
};
use pyvisor_actors::worker::resolve_interpreter;
use tokio::sync::oneshot;

use crate::config::{ClientLlmConfig, EngineConfig, RlmConfig};
use crate::errors::EngineError;
use crate::llm::{Dispatcher, LlmClient, LlmCounters, LlmStats, OpenAiClient};
use crate::session::Session;

mod system;

use system::run_system;

/// A running pyvisor engine. Cheap to clone; the last clone dropped stops it.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

/// The figures of `engine.stats` (docs/protocol.md) that exist so far.
#[derive(Debug, Clone)]
pub struct EngineStats {
    pub pool: PoolStats,
    /// Live sessions.
    pub sessions: usize,
    /// Executions that ran on a worker and ended, whatever their status.
    pub executions: u64,
    /// Workers that died while their session still wanted them.
    pub crashes: u64,
    /// Namespaces brought back from a checkpoint.
    pub restores: u64,
    /// What proactive computation did: predictions, speculations, hits, CPU, cache.
    pub proactive: ProactiveStats,
    /// What LLM calls used; `None` without `[llm]`.
    pub llm: Option<LlmStats>,
}

struct EngineInner {
    supervisor: Addr<RegistryActor>,
    /// The installed worker package, for interpreters other than the engine's.
    worker_package: PathBuf,
    /// The checkpoint store and the scratch directory beside it, when the engine keeps state
    /// (for the cluster, which copies checkpoints to and from its shared store).
    #[cfg_attr(not(feature = "server"), expect(dead_code))]
    state: Option<StateOptions>,
    counters: Arc<EngineCounters>,
    proactive: Arc<ProactiveCounters>,
    /// The memory of outcomes, when it is enabled.
    memory: Option<Arc<Memory>>,
    /// The LLM bridge and its totals, with `[llm]`.
    llm: Option<(Dispatcher, Arc<LlmCounters>, bool, RlmConfig)>,
    /// The client-answered bridge's settings, and the totals its calls count in (the
    /// engine bridge's, with `[llm]`).
    client_llm: (ClientLlmConfig, Arc<LlmCounters>),
    /// The task loops that run, for `task.cancel`.
    tasks: crate::task::Tasks,
    shutdown: Mutex<Option<oneshot::Sender<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_id: ThreadId,
}

impl Engine {
    /// Starts an engine with `config`.
    pub async fn start(config: EngineConfig) -> Result<Engine, EngineError> {
        Self::start_with_llm(config, None).await
    }

    /// Starts an engine whose LLM calls `client` answers instead of `config.llm`'s endpoint
    /// (a [`crate::task::ReplayClient`], say); `config.llm`'s other settings apply, so it must
    /// be set when `client` is.
    pub async fn start_with_llm(
        config: EngineConfig,
        client: Option<Arc<dyn LlmClient>>,
    ) -> Result<Engine, EngineError> {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        let counters = Arc::new(EngineCounters::default());
        let proactive = Arc::new(ProactiveCounters::default());
        let shared = (counters.clone(), proactive.clone());
        if client.is_some() && config.llm.is_none() {
            return Err(EngineError::Start(
                "an LLM client needs the [llm] settings it works under".into(),
            ));
        }
        let totals = Arc::new(LlmCounters::default());
        let client_llm = (config.client_llm, totals.clone());
        let llm = match &config.llm {
            Some(llm_config) => {
                let client: Arc<dyn LlmClient> = match client {
                    Some(client) => client,
                    None => Arc::new(
                        OpenAiClient::new(llm_config)
                            .map_err(|err| EngineError::Start(err.to_string()))?,
                    ),
                };
                let dispatcher = Dispatcher::start(client, llm_config, totals.clone())
                    .map_err(|e| EngineError::Start(format!("start the LLM thread: {e}")))?;
                Some((dispatcher, totals, llm_config.sessions, llm_config.rlm))
            }
            None => None,
        };
        let bridge = llm
            .as_ref()
            .map(|(dispatcher, _, by_default, _)| LlmOptions {
                bridge: Arc::new(dispatcher.clone()),
                by_default: *by_default,
            });
        let thread = thread::Builder::new()
            .name("pyvisor-engine".into())
            .spawn(move || run_system(config, shared, bridge, ready_tx, shutdown_rx))
            .map_err(|e| EngineError::Start(format!("spawn the engine thread: {e}")))?;
        let thread_id = thread.thread().id();
        match ready_rx.await {
            Ok(Ok((supervisor, worker_package, memory, state))) => Ok(Engine {
                inner: Arc::new(EngineInner {
                    supervisor,
                    worker_package,
                    state,
                    counters,
                    proactive,
                    memory,
                    llm,
                    client_llm,
                    tasks: Default::default(),
                    shutdown: Mutex::new(Some(shutdown_tx)),
                    thread: Mutex::new(Some(thread)),
                    thread_id,
                }),
            }),
            Ok(Err(err)) => {
                let _ = thread.join();
                Err(err)
            }
            Err(_) => {
                let _ = thread.join();
                Err(EngineError::Start(
                    "the engine thread ended during start".into(),
                ))
            }
        }
    }

    /// Creates a session with a worker from the pool; with the `name` of a live session,
    /// returns that session instead ([`Session::attached`] tells).
    pub async fn create_session(&self, options: SessionOptions) -> Result<Session, EngineError> {
        if options.llm == Some(true) && self.inner.llm.is_none() {
            return Err(EngineError::NoLlm);
        }
        let handle = self
            .inner
            .supervisor
            .send(CreateSession { options })
            .await??;
        Ok(Session::new(handle))
    }

    /// The live session with this id or name. With an `owner`, only that owner's sessions
    /// are found.
    pub async fn session(
        &self,
        session: &str,
        owner: Option<&str>,
    ) -> Result<Session, EngineError> {
        let handle = self
            .inner
            .supervisor
            .send(FindSession {
                session: session.to_owned(),
                owner: owner.map(str::to_owned),
            })
            .await??;
        Ok(Session::new(handle))
    }

    /// Whether results of executions that changed the namespace wait for its checkpoint
    /// (`[state] durability = "reply"`).
    #[cfg(feature = "server")]
    pub(crate) fn replies_after_checkpoint(&self) -> bool {
        (self.inner.state.as_ref())
            .is_some_and(|state| state.policy.durability == DurabilityMode::Reply)
    }

    /// The checkpoint store, and a scratch directory on its file system for files the store
    /// takes in; `None` when the engine keeps no state.
    #[cfg(feature = "server")]
    pub(crate) fn checkpoint_store(&self) -> Option<(&CheckpointStore, &Path)> {
        (self.inner.state.as_ref()).map(|state| (&state.store, state.scratch.as_path()))
    }

    /// Every live session, oldest first; with an `owner`, only that owner's.
    pub async fn sessions(&self, owner: Option<&str>) -> Result<Vec<Session>, EngineError> {
        let handles = self
            .inner
            .supervisor
            .send(ListSessions {
                owner: owner.map(str::to_owned),
            })
            .await?;
        Ok(handles.into_iter().map(Session::new).collect())
    }

    /// The pool's figures and the engine's totals.
    pub async fn stats(&self) -> Result<EngineStats, EngineError> {
        let supervisor = self.inner.supervisor.send(GetStats).await??;
        Ok(EngineStats {
            pool: supervisor.pool,
            sessions: supervisor.sessions,
            executions: self.inner.counters.executions(),
            crashes: self.inner.counters.crashes(),
            restores: self.inner.counters.restores(),
            proactive: self.inner.proactive.stats(),
            llm: Some(self.inner.client_llm.1.snapshot())
                .filter(|totals| self.inner.llm.is_some() || totals.calls > 0),
        })
    }

    /// The client-answered bridge's settings and the totals its calls count in.
    #[cfg(feature = "server")]
    pub(crate) fn client_llm(&self) -> (ClientLlmConfig, Arc<LlmCounters>) {
        self.inner.client_llm.clone()
    }

    /// The LLM client and the totals its calls count in, with `[llm]`.
    pub(crate) fn llm_client(&self) -> Option<(Arc<dyn LlmClient>, Arc<LlmCounters>)> {
        let (dispatcher, totals, _, _) = self.inner.llm.as_ref()?;
        Some((dispatcher.client(), totals.clone()))
    }

    pub(crate) fn tasks(&self) -> &crate::task::Tasks {
        &self.inner.tasks
    }

    /// Resolves `python` (a name on `PATH` or a path) to an interpreter a session can run
    /// on through [`SessionOptions::python`].
    pub async fn interpreter(&self, python: &str) -> Result<Interpreter, EngineError> {
        let python = python.to_owned();
        let package = self.inner.worker_package.clone();
        tokio::task::spawn_blocking(move || {
            let python = resolve_interpreter(&python)?;
            Ok(Interpreter {
                python,
                script: package,
            })
        })
        .await
        .map_err(|err| EngineError::Start(format!("resolve the interpreter: {err}")))?
    }

    /// Applies new pool sizes to the running pool; sessions are not touched.
    pub async fn resize_pool(&self, config: PoolConfig) -> Result<(), EngineError> {
        Ok(self.inner.supervisor.send(Resize(config)).await?)
    }

    /// The engine's memory, when enabled.
    pub(crate) fn memory_handle(&self) -> Option<&Arc<Memory>> {
        self.inner.memory.as_ref()
    }

    /// Graceful stop: refuses new sessions and executions, lets running executions finish
    /// for up to `grace`, takes a last checkpoint of every session, then ends every worker.
    /// Returns when they are gone; the engine serves nothing afterwards.
    pub async fn shutdown(&self, grace: Duration) -> Result<(), EngineError> {
        let stop = StopAll {
            grace,
            checkpoint: true,
        };
        Ok(self.inner.supervisor.send(stop).await?)
    }
}

/// An [`Engine`] that does not keep it running: what a task's session bridge holds, so that
/// a session never keeps its own engine alive.
#[derive(Clone)]
pub(crate) struct WeakEngine(std::sync::Weak<EngineInner>);

impl WeakEngine {
    /// The engine, while a handle to it lives.
    pub(crate) fn upgrade(&self) -> Option<Engine> {
        self.0.upgrade().map(|inner| Engine { inner })
    }
}

impl Engine {
    pub(crate) fn downgrade(&self) -> WeakEngine {
        WeakEngine(Arc::downgrade(&self.inner))
    }

    /// The bridge of sessions and the RLM loop's defaults, with `[llm]`.
    pub(crate) fn llm_dispatcher(&self) -> Option<(&Dispatcher, &RlmConfig)> {
        (self.inner.llm.as_ref()).map(|(dispatcher, _, _, rlm)| (dispatcher, rlm))
    }
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        if let Ok(mut shutdown) = self.shutdown.lock() {
            if let Some(tx) = shutdown.take() {
                let _ = tx.send(());
            }
        }
        // Joining from the engine's own thread would wait forever; it ends by itself.
        if thread::current().id() == self.thread_id {
            return;
        }
        if let Some(thread) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = thread.join();
        }
    }
}
