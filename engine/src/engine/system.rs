//! The engine thread's side of [`Engine::start`](super::Engine::start): what it assembles
//! before the handle is given out (the worker package, the sandbox and its directories, the
//! state directory and its lock, the memory, the zygote, the registry's configuration), and
//! the actix system it then runs until the last handle is dropped.

use std::num::NonZeroUsize;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use pyvisor_actors::checkpoint::{
    default_state_dir, CheckpointStore, CheckpointStoreConfig, DEFAULT_RETENTION,
};
use pyvisor_actors::memory::{Embedder, LocalEmbedder, Memory};
use pyvisor_actors::metrics::EngineCounters;
use pyvisor_actors::proactive::cache::CacheLimits;
use pyvisor_actors::proactive::predictor::PredictorConfig;
use pyvisor_actors::proactive::stats::ProactiveCounters;
use pyvisor_actors::supervisor::{
    LlmOptions, ProactiveOptions, RegistryActor, StateOptions, StopAll, SupervisorConfig,
};
use pyvisor_actors::worker::{
    install_worker_package, landlock_abi, probe_uid, resolve_interpreter, seccomp_available,
    CgroupManager, CgroupMechanism, Janitor, Sandbox, SandboxSetup, WorkerSpec, Zygote,
    UID_CLAIMS_DIR,
};
use pyvisor_actors::ProcessLimits;
use tokio::sync::oneshot;

use crate::config::{EngineConfig, MemoryConfig, SandboxLayer, StateConfig};
use crate::errors::EngineError;
use crate::memory::{RemoteEmbedder, RemoteEmbedderError};
use crate::scratch::Scratch;
use crate::state_lock::StateDirLock;

/// What the engine thread hands the [`Engine`] once it runs.
type Started = (
    Addr<RegistryActor>,
    PathBuf,
    Option<Arc<Memory>>,
    Option<StateOptions>,
);

/// Body of the engine thread: start the system, serve until shutdown, end every worker.
pub(super) fn run_system(
    config: EngineConfig,
    counters: (Arc<EngineCounters>, Arc<ProactiveCounters>),
    llm: Option<LlmOptions>,
    ready: oneshot::Sender<Result<Started, EngineError>>,
    shutdown: oneshot::Receiver<()>,
) {
    // The state dir's lock and the scratch directories live as long as this thread, so they
    // outlive every worker.
    let (mut supervisor_config, worker_package, _held) = match supervisor_config(&config, counters)
    {
        Ok(c) => c,
        Err(err) => {
            let _ = ready.send(Err(err));
            return;
        }
    };
    supervisor_config.llm = llm;
    let memory = supervisor_config.memory.clone();
    let state = supervisor_config.state.clone();
    let system = System::new();
    let handed = memory.clone();
    system.block_on(async move {
        let supervisor = RegistryActor::new(supervisor_config).start();
        if ready
            .send(Ok((supervisor.clone(), worker_package, handed, state)))
            .is_err()
        {
            return;
        }
        // Both an explicit shutdown and a dropped sender mean: stop.
        let _ = shutdown.await;
        let _ = supervisor
            .send(StopAll {
                grace: Duration::ZERO,
                checkpoint: false,
            })
            .await;
        System::current().stop();
    });
    // Everything the sessions recorded is in the store before the state dir is let go.
    if let Some(memory) = memory {
        memory.flush();
    }
}

/// Resolves the interpreter, installs the worker package, starts the janitor and the zygote,
/// and opens the checkpoint store (blocking; engine thread only).
fn supervisor_config(
    config: &EngineConfig,
    (counters, proactive): (Arc<EngineCounters>, Arc<ProactiveCounters>),
) -> Result<(SupervisorConfig, PathBuf, HeldDirs), EngineError> {
    let python = resolve_interpreter(&config.python)?;
    let sandbox_base = sandbox_base(config);
    // Workers with uids of their own must reach the package: a root-owned one beside their
    // directories (the cache dir may be in a home they cannot enter).
    let package_dir = match &config.sandbox.uid_range {
        Some(_) => sandbox_base.clone(),
        None => config.cache_dir(),
    };
    let mut package = install_worker_package(&package_dir)?;
    let janitor = Arc::new(Janitor::start(&python)?);
    let (state, held_state_dir) = open_state(&config.state)?.unzip();
    let (sandbox, sandbox_dirs) = start_sandbox(
        config,
        &python,
        &package,
        &sandbox_base,
        state.as_ref().map(|state| state.scratch.clone()),
    )?;
    if package_dir != config.cache_dir() && !sandbox.separates_uids() {
        // The range's uids turned out unusable: the package goes where it always is.
        package = install_worker_package(&config.cache_dir())?;
    }
    let zygote = start_zygote(config, &python, &package, &janitor);
    let memory = open_memory(
        &config.memory,
        held_state_dir
            .as_ref()
            .map(|held| held.dir.join(MEMORY_FILE)),
    )?;
    let supervisor = SupervisorConfig {
        worker: WorkerSpec {
            python,
            script: package.clone(),
            cwd: None,
            env: Vec::new(),
            handshake_timeout: config.handshake_timeout,
            max_frame: config.max_frame_bytes,
            limits: ProcessLimits::from(&config.limits),
            cgroups: config
                .use_cgroups
                .then(|| {
                    let cgroups = CgroupManager::detect(Some(janitor.clone()));
                    (cgroups.mechanism() != CgroupMechanism::None).then(|| Arc::new(cgroups))
                })
                .flatten(),
            janitor: Some(janitor),
            preload: config.preload.clone(),
            zygote,
            sandbox: Some(sandbox),
            network: config.sandbox.network,
        },
        limits: config.limits.clone(),
        arbiters: config.arbiters,
        pool: config.pool.clone(),
        counters,
        state,
        proactive: ProactiveOptions {
            by_default: config.proactive.enabled,
            predictor: PredictorConfig {
                cpu_budget: config.proactive.cpu_budget,
                yield_to_load: config.proactive.yield_to_load,
            },
            cache: CacheLimits {
                bytes: config.proactive.cache_bytes,
                ..CacheLimits::default()
            },
            counters: proactive,
        },
        quotas: config.quotas,
        memory,
        llm: None,
    };
    let held = HeldDirs {
        _state: held_state_dir,
        _sandbox: sandbox_dirs,
    };
    Ok((supervisor, package, held))
}

/// Where the sandbox keeps the workers' directories (and, with uid separation, the worker
/// package): the configured directory, `/run/pyvisor-sandbox` as root, else `sandbox` in the
/// cache directory.
fn sandbox_base(config: &EngineConfig) -> PathBuf {
    match &config.sandbox.dir {
        Some(dir) => dir.clone(),
        None if nix::unistd::geteuid().is_root() => PathBuf::from("/run/pyvisor-sandbox"),
        None => config.cache_dir().join("sandbox"),
    }
}

/// The engine's sandbox, with each configured layer checked: one that is unavailable is a
/// start-up error when `[sandbox] require` names it, else a warning, once, and it is off.
fn start_sandbox(
    config: &EngineConfig,
    python: &Path,
    package: &Path,
    base: &Path,
    checkpoint_scratch: Option<PathBuf>,
) -> Result<(Arc<Sandbox>, Scratch), EngineError> {
    let wanted = &config.sandbox;
    let mut setup = SandboxSetup {
        uid_range: wanted.uid_range.clone(),
        uid_claims: PathBuf::from(UID_CLAIMS_DIR),
        landlock: wanted.landlock,
        seccomp: wanted.seccomp,
        dirs: PathBuf::new(),
        read: wanted.read_paths.clone(),
        write: checkpoint_scratch.into_iter().collect(),
    };
    let mut missing = Vec::new();
    if let Some(range) = &setup.uid_range {
        let unavailable = if !nix::unistd::geteuid().is_root() {
            Some("the engine does not run as root".to_owned())
        } else {
            probe_uid(python, package, *range.start()).err()
        };
        if let Some(reason) = unavailable {
            missing.push((SandboxLayer::Uid, "uid", reason));
            setup.uid_range = None;
        }
    }
    if setup.landlock && landlock_abi().is_none() {
        missing.push((
            SandboxLayer::Landlock,
            "landlock",
            "the kernel has no Landlock".into(),
        ));
        setup.landlock = false;
    }
    if setup.seccomp && !seccomp_available() {
        missing.push((
            SandboxLayer::Seccomp,
            "seccomp",
            "the kernel has no seccomp".into(),
        ));
        setup.seccomp = false;
    }
    for (layer, name, reason) in missing {
        if wanted.require.contains(&layer) {
            return Err(EngineError::Start(format!(
                "the sandbox layer {name} is required but unavailable: {reason}"
            )));
        }
        tracing::warn!(
            layer = name,
            %reason,
            "SANDBOX LAYER UNAVAILABLE: workers run without it"
        );
    }
    for layer in &wanted.require {
        let on = match layer {
            SandboxLayer::Uid => setup.uid_range.is_some(),
            SandboxLayer::Landlock => setup.landlock,
            SandboxLayer::Seccomp => setup.seccomp,
        };
        if !on {
            return Err(EngineError::Start(format!(
                "the sandbox layer {layer:?} is required but not configured"
            )));
        }
    }
    let dirs = Scratch::create(base)
        .map_err(|e| EngineError::Start(format!("create the sandbox directory: {e}")))?;
    setup.dirs = dirs.path().to_owned();
    let sandbox = Sandbox::new(setup)
        .map_err(|e| EngineError::Start(format!("create the sandbox directory: {e}")))?;
    Ok((Arc::new(sandbox), dirs))
}

/// The directories an engine holds for its whole life.
struct HeldDirs {
    _state: Option<HeldStateDir>,
    /// The workers' private directories.
    _sandbox: Scratch,
}

/// What an engine holds of its state directory for its whole life.
struct HeldStateDir {
    dir: PathBuf,
    _lock: StateDirLock,
    _scratch: Scratch,
}

/// Locks the state directory, opens the checkpoint store and this engine's scratch directory
/// (blocking).
fn open_state(config: &StateConfig) -> Result<Option<(StateOptions, HeldStateDir)>, EngineError> {
    if !config.enabled {
        return Ok(None);
    }
    let fail =
        |what: &str, err: &dyn std::fmt::Display| EngineError::Start(format!("{what}: {err}"));
    let dir = match &config.dir {
        Some(dir) => dir.clone(),
        None => default_state_dir().map_err(|e| fail("find the state directory", &e))?,
    };
    let mut store_config = CheckpointStoreConfig::new(&dir);
    store_config.retention = NonZeroUsize::new(config.retention).unwrap_or(DEFAULT_RETENTION);
    if let Some(max_bytes) = config.max_bytes {
        store_config.max_bytes = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    }
    store_config.session_disk_bytes = config.session_disk_bytes;
    store_config.total_disk_bytes = config.total_disk_bytes;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| fail("create the state directory", &e))?;
    let lock = StateDirLock::acquire(&dir).map_err(EngineError::Start)?;
    let store =
        CheckpointStore::open(store_config).map_err(|e| fail("open the checkpoint store", &e))?;
    let scratch = Scratch::create(&dir).map_err(|e| fail("create the scratch directory", &e))?;
    let options = StateOptions {
        store,
        policy: config.auto,
        scratch: scratch.path().to_owned(),
        max_bytes: config.max_bytes,
    };
    let held = HeldStateDir {
        dir,
        _lock: lock,
        _scratch: scratch,
    };
    Ok(Some((options, held)))
}

/// The engine's memory, when enabled: in the store the cluster's engines share when it has
/// one, else in `memory.db` of the state directory when the engine keeps state, else in
/// memory only (blocking: it loads what the store holds).
fn open_memory(
    config: &MemoryConfig,
    path: Option<PathBuf>,
) -> Result<Option<Arc<Memory>>, EngineError> {
    if !config.enabled {
        return Ok(None);
    }
    let embedder: Arc<dyn Embedder> = match &config.embedder {
        None => Arc::new(LocalEmbedder),
        Some(remote) => match RemoteEmbedder::connect(remote) {
            Ok(embedder) => Arc::new(embedder),
            Err(err @ RemoteEmbedderError::MissingKey(_)) => {
                return Err(EngineError::Start(err.to_string()))
            }
            Err(err) => {
                tracing::warn!("{err}; memory uses the local embedder for this run");
                Arc::new(LocalEmbedder)
            }
        },
    };
    let memory = pyvisor_actors::memory::MemoryConfig {
        max_outcomes: config.max_outcomes,
        max_age: config.max_age,
        threshold: config.threshold,
        policy: config.policy,
        path: path.filter(|_| config.shared.is_none()),
    };
    Ok(Some(match &config.shared {
        Some(shared) => Memory::open_shared(memory, embedder, &*shared.0, FOLLOW_SHARED_MEMORY),
        None => Arc::new(Memory::open(memory, embedder)),
    }))
}

/// How often an engine whose memory store is shared takes in what the others recorded: the
/// longest an outcome of another node's waits to be known here (docs/memory.md).
pub const FOLLOW_SHARED_MEMORY: Duration = Duration::from_secs(1);

/// The memory's file in the state directory.
pub const MEMORY_FILE: &str = "memory.db";

/// The zygote of `config`, if it asks for one and one starts; plain spawns otherwise.
fn start_zygote(
    config: &EngineConfig,
    python: &Path,
    script: &Path,
    janitor: &Arc<Janitor>,
) -> Option<Arc<Zygote>> {
    if !config.zygote {
        return None;
    }
    match Zygote::start(
        python,
        script,
        &config.preload,
        Some(janitor.clone()),
        config.handshake_timeout,
    ) {
        Ok(zygote) => Some(Arc::new(zygote)),
        Err(err) => {
            tracing::warn!(error = %err, "no zygote; every worker is a fresh interpreter");
            None
        }
    }
}
