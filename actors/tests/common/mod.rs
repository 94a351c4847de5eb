//! What the actors crate's integration tests share: the real interpreter, the installed
//! worker package, one janitor, and a worker spec built the way the engine builds one.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use pyvisor_actors::worker::{
    install_worker_package, resolve_interpreter, Janitor, WorkerSpec, Zygote,
};
use pyvisor_actors::ProcessLimits;

/// Longest wait for anything in these tests; only a broken build comes near it.
pub const PATIENCE: Duration = Duration::from_secs(60);

pub struct Setup {
    pub python: PathBuf,
    pub script: PathBuf,
    pub janitor: Arc<Janitor>,
}

/// Resolved once per test binary.
pub fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let python = resolve_interpreter("python3").expect("python3 runs");
        // Content-addressed and installed atomically: every run can share one directory.
        let cache = std::env::temp_dir().join("pyvisor-actors-test");
        let script = install_worker_package(&cache).expect("the worker package installs");
        let janitor = Arc::new(Janitor::start(&python).expect("the janitor starts"));
        Setup {
            python,
            script,
            janitor,
        }
    })
}

/// A spec as the engine builds it, with `preload` and `zygote`.
pub fn spec(preload: &[&str], zygote: Option<Arc<Zygote>>) -> WorkerSpec {
    let setup = setup();
    WorkerSpec {
        python: setup.python.clone(),
        script: setup.script.clone(),
        cwd: None,
        env: Vec::new(),
        handshake_timeout: Duration::from_secs(30),
        max_frame: pyvisor_protocol::DEFAULT_MAX_FRAME_BYTES,
        limits: ProcessLimits::default(),
        cgroups: None,
        janitor: Some(setup.janitor.clone()),
        preload: preload.iter().map(|m| m.to_string()).collect(),
        zygote,
        sandbox: None,
        network: true,
    }
}

/// Whether `module` imports in the test interpreter.
pub fn python_has(module: &str) -> bool {
    std::process::Command::new(&setup().python)
        .args(["-I", "-c", &format!("import {module}")])
        .status()
        .is_ok_and(|status| status.success())
}
