//! Helpers shared by the integration tests: start an engine, run code, collect events, and
//! a fake LLM provider ([`fake_llm`]).

pub mod fake_llm;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use pyvisor::{
    AutoCheckpoint, Engine, EngineConfig, ExecuteRequest, Execution, ExecutionEvent,
    ExecutionResult, SandboxConfig, Session, StateConfig,
};

/// An interpreter every session uid can run (the test's own may live under /root, 0700).
pub const PYTHON: &str = "/usr/bin/python3";

/// An engine config whose workers each run as a uid of `first_uid..=first_uid + 9` (give each
/// test a range of its own), under Landlock and seccomp, checkpointing only when asked.
pub fn confined(first_uid: u32) -> EngineConfig {
    let state = state_dir();
    // The workers enter the state directory to reach their checkpoint directories.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o711)).unwrap();
    let mut config = EngineConfig {
        python: PYTHON.into(),
        sandbox: SandboxConfig {
            uid_range: Some(first_uid..=first_uid + 9),
            landlock: true,
            seccomp: true,
            ..SandboxConfig::default()
        },
        state: manual_checkpoints(),
        ..EngineConfig::default()
    };
    config.state.dir = Some(state);
    config
}

/// An engine with default settings, as an embedder gets it.
pub async fn engine() -> Engine {
    engine_with(EngineConfig::default()).await
}

/// An engine with `config`. Unless the test chose a state directory, the engine gets a
/// fresh one, so that named sessions of tests running side by side never meet on disk.
pub async fn engine_with(mut config: EngineConfig) -> Engine {
    if config.state.dir.is_none() {
        config.state.dir = Some(state_dir());
    }
    Engine::start(config).await.expect("engine starts")
}

/// Checkpoint settings under which sessions checkpoint only when asked, so that a test knows
/// what is on disk: an automatic checkpoint is written in the background, at a moment no test
/// can count on.
pub fn manual_checkpoints() -> StateConfig {
    StateConfig {
        auto: AutoCheckpoint {
            after_changes: 0,
            ..AutoCheckpoint::default()
        },
        ..StateConfig::default()
    }
}

/// A new, empty state directory under the system's temporary directory. It is left behind
/// (a few kilobytes) so that it can outlive the engine for restart tests.
pub fn state_dir() -> PathBuf {
    tempfile::Builder::new()
        .prefix("pyvisor-test-state-")
        .tempdir()
        .expect("a temporary directory")
        .keep()
}

/// An engine and one session in it.
pub async fn session() -> (Engine, Session) {
    let engine = engine().await;
    let session = engine
        .create_session(Default::default())
        .await
        .expect("session starts");
    (engine, session)
}

/// Runs `code` and returns its result, failing the test after 60 s.
pub async fn run(session: &Session, code: &str) -> ExecutionResult {
    within(session.run(code))
        .await
        .expect("execution completes")
}

/// Runs `code`, which must end with an expression, and returns its repr; fails the test
/// when the code does not run to the end.
pub async fn value(session: &Session, code: &str) -> String {
    let result = run(session, code).await;
    assert_eq!(
        result.status,
        pyvisor::ExecutionStatus::Ok,
        "{code}: {:?} {:?}",
        result.error,
        result.stderr
    );
    result.result.expect("a value").repr
}

/// Runs `attack` (one line of Python) in a try block; returns the errno name it failed with
/// (`EACCES`, `EPERM`, ...), or `"none"` when it succeeded.
pub async fn attack(session: &Session, attack: &str) -> String {
    let code = format!(
        "import errno\ntry:\n    {attack}\n    _outcome = 'none'\nexcept OSError as e:\n    _outcome = errno.errorcode.get(e.errno, str(e))\n_outcome"
    );
    value(session, &code).await.trim_matches('\'').to_owned()
}

/// Awaits `future`, failing the test if it takes longer than 60 s (a hang is a bug).
pub async fn within<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .expect("no hang")
}

/// Kills `pid` with SIGKILL and waits until it is gone: kill(2) returns before the process
/// is, and code sent to a worker that is still dying dies with it.
pub async fn kill_and_wait(pid: u32) {
    let pid_t = i32::try_from(pid).expect("a pid fits in pid_t");
    // SAFETY: kill(2) has no memory effects; a pid that is gone answers ESRCH.
    assert_eq!(unsafe { libc::kill(pid_t, libc::SIGKILL) }, 0, "kill {pid}");
    within(async {
        while process_running(pid) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
}

/// Starts `request` (whose code must print once it is under way) and waits for that first
/// output: from then on the execution is running in the worker.
pub async fn started(session: &Session, request: impl Into<ExecuteRequest>) -> Execution {
    let mut execution = session
        .execute(request)
        .await
        .expect("the execution starts");
    match within(execution.next()).await {
        Some(ExecutionEvent::Output { .. }) => execution,
        other => panic!("expected output first, got {other:?}"),
    }
}

/// Collects every event of `execution`, the final result last.
pub async fn events(execution: Execution) -> Vec<ExecutionEvent> {
    within(execution.collect::<Vec<_>>()).await
}

/// Whether process `pid` still exists; a zombie counts as existing (it was not reaped).
pub fn process_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Whether process `pid` is running: it exists and is not a zombie.
pub use pyvisor_actors::worker::is_running as process_running;

/// Waits up to 5 s for `still_there(pid)` to turn false; true if it did.
pub async fn eventually_gone(pid: u32, still_there: fn(u32) -> bool) -> bool {
    for _ in 0..100 {
        if !still_there(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Waits up to 5 s for our child `pid` to be killed and reaped.
pub async fn process_gone(pid: u32) -> bool {
    eventually_gone(pid, process_exists).await
}

/// Session code that starts `sleep 300` in a new session through an intermediate process
/// that exits at once, so that it belongs to neither the worker's process group nor its
/// tree; its value is the sleeper's pid.
pub const SETSID_GRANDCHILD: &str = "import subprocess, sys\n\
    starter = \"import subprocess; print(subprocess.Popen(['sleep', '300'], \
    start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)\"\n\
    int(subprocess.run([sys.executable, '-c', starter], capture_output=True, text=True, \
    check=True).stdout)";

/// Starts one of this crate's host binaries (`command`) and reads the line of pids it prints
/// once its engine is up: its worker's, then the grandchild's that the worker started.
pub fn start_host_printing_pids(
    mut command: std::process::Command,
) -> (std::process::Child, u32, u32) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let mut host = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the host binary starts");
    let mut line = String::new();
    BufReader::new(host.stdout.take().expect("stdout is piped"))
        .read_line(&mut line)
        .expect("the host prints its pids");
    let pids: Vec<u32> = line
        .split_whitespace()
        .map(|p| p.parse().expect("pids"))
        .collect();
    assert_eq!(pids.len(), 2, "worker and grandchild pids: {line:?}");
    (host, pids[0], pids[1])
}
