//! The [`Engine`] handle and the thread that runs its actor system.
//!
//! `Engine::start` resolves the interpreter, installs the worker script and starts an actix
//! system on a thread the engine owns; the handle only holds the Supervisor's address, so it
//! is `Clone + Send + Sync` and usable from any async runtime. When the last handle is
//! dropped, the thread ends every worker, stops the system, and is joined.

use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, ThreadId};

use actix::prelude::*;
use pyvisor_actors::supervisor::{
    CreateSession, ListSessions, SessionOptions, StopAll, Supervisor, SupervisorConfig,
};
use pyvisor_actors::worker::{
    install_worker_script, resolve_interpreter, CgroupManager, CgroupMechanism, Janitor, WorkerSpec,
};
use pyvisor_actors::ProcessLimits;
use tokio::sync::oneshot;

use crate::config::EngineConfig;
use crate::errors::EngineError;
use crate::session::Session;

/// A running pyvisor engine. Cheap to clone; the last clone dropped stops it.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    supervisor: Addr<Supervisor>,
    shutdown: Mutex<Option<oneshot::Sender<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_id: ThreadId,
}

impl Engine {
    /// Starts an engine with `config`.
    pub async fn start(config: EngineConfig) -> Result<Engine, EngineError> {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        let thread = thread::Builder::new()
            .name("pyvisor-engine".into())
            .spawn(move || run_system(config, ready_tx, shutdown_rx))
            .map_err(|e| EngineError::Start(format!("spawn the engine thread: {e}")))?;
        let thread_id = thread.thread().id();
        match ready_rx.await {
            Ok(Ok(supervisor)) => Ok(Engine {
                inner: Arc::new(EngineInner {
                    supervisor,
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

    /// Creates a session with a fresh worker.
    pub async fn create_session(&self, options: SessionOptions) -> Result<Session, EngineError> {
        let handle = self
            .inner
            .supervisor
            .send(CreateSession { options })
            .await??;
        Ok(Session::new(handle))
    }

    /// Ids of every live session.
    pub async fn session_ids(&self) -> Result<Vec<String>, EngineError> {
        Ok(self.inner.supervisor.send(ListSessions).await?)
    }
}

/// Body of the engine thread: start the system, serve until shutdown, end every worker.
fn run_system(
    config: EngineConfig,
    ready: oneshot::Sender<Result<Addr<Supervisor>, EngineError>>,
    shutdown: oneshot::Receiver<()>,
) {
    let supervisor_config = match supervisor_config(&config) {
        Ok(c) => c,
        Err(err) => {
            let _ = ready.send(Err(err));
            return;
        }
    };
    let system = System::new();
    system.block_on(async move {
        let supervisor = Supervisor::new(supervisor_config).start();
        if ready.send(Ok(supervisor.clone())).is_err() {
            return;
        }
        // Both an explicit shutdown and a dropped sender mean: stop.
        let _ = shutdown.await;
        let _ = supervisor.send(StopAll).await;
        System::current().stop();
    });
}

/// Resolves the interpreter and installs the worker script (blocking; engine thread only).
fn supervisor_config(config: &EngineConfig) -> Result<SupervisorConfig, EngineError> {
    let python = resolve_interpreter(&config.python)?;
    let script = install_worker_script(&config.cache_dir())?;
    let janitor = Arc::new(Janitor::start(&python)?);
    Ok(SupervisorConfig {
        worker: WorkerSpec {
            python,
            script,
            cwd: None,
            env: Vec::new(),
            handshake_timeout: config.handshake_timeout,
            max_frame: config.max_frame_bytes,
            limits: ProcessLimits::from(&config.limits),
            cgroups: config
                .use_cgroups
                .then(|| {
                    let cgroups = CgroupManager::detect();
                    (cgroups.mechanism() != CgroupMechanism::None).then(|| Arc::new(cgroups))
                })
                .flatten(),
            janitor: Some(janitor),
        },
        limits: config.limits.clone(),
        arbiters: config.arbiters,
    })
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
