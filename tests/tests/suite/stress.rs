//! A randomized stress test: 64 sessions, each doing a random mix of create, execute,
//! interrupt, kill-the-worker and close, all at once. It must end with no deadlock (every
//! call returns), no leaked Python process, and `engine.stats()` consistent with what the
//! test saw. The seed is printed; `PYVISOR_STRESS_SEED=N` replays a run.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pyvisor::{
    Engine, EngineConfig, ExecuteRequest, ExecutionResult, ExecutionStatus, PoolConfig, Session,
};
use pyvisor_tests::engine_with;

const SESSIONS: usize = 64;
const STEPS: usize = 12;

/// What the test saw, to compare with the engine's own figures.
#[derive(Default)]
struct Tally {
    creates: AtomicU64,
    finished: AtomicU64,
    kills: AtomicU64,
    /// The step each session is in, for the report of a hang.
    doing: Mutex<Vec<&'static str>>,
}

impl Tally {
    /// Counts `result` if it ran on a worker (the engine does not count refusals: code that
    /// never reached one, or that came after a crash that lost the session's state).
    fn ran(&self, result: &ExecutionResult) {
        let refused = result
            .error
            .as_ref()
            .is_some_and(|e| e.type_name == "NotExecuted" || e.type_name == "StateLost");
        if !refused {
            self.finished.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn doing(&self, session: usize, step: &'static str) {
        self.doing.lock().unwrap()[session] = step;
    }
}

/// xorshift64*: enough randomness for choosing steps, and reproducible from a seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_operations_on_64_sessions_leave_nothing_behind() {
    let seed = std::env::var("PYVISOR_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1234_u64);
    println!("stress seed {seed}");
    let cache = tempfile::tempdir().unwrap();
    let engine = engine_with(EngineConfig {
        cache_dir: Some(cache.path().to_owned()),
        pool: PoolConfig {
            min_idle: 4,
            max_total: SESSIONS + 8,
            acquire_timeout: Duration::from_secs(60),
            ..PoolConfig::default()
        },
        ..EngineConfig::default()
    })
    .await;
    let tally = Arc::new(Tally::default());
    *tally.doing.lock().unwrap() = vec!["not started"; SESSIONS];

    let tasks: Vec<_> = (0..SESSIONS as u64)
        .map(|n| {
            let engine = engine.clone();
            let tally = tally.clone();
            tokio::spawn(drive_one_session(
                engine,
                tally,
                n as usize,
                Rng(seed ^ ((n + 1) * 0x9e37_79b9)),
            ))
        })
        .collect();
    let all = futures::future::join_all(tasks);
    let Ok(outcomes) = tokio::time::timeout(Duration::from_secs(120), all).await else {
        let doing = tally.doing.lock().unwrap().clone();
        let stuck: Vec<_> = doing
            .iter()
            .enumerate()
            .filter(|(_, d)| **d != "done")
            .collect();
        panic!("deadlock: sessions still in a step after 120 s: {stuck:?}");
    };
    for outcome in outcomes {
        outcome.expect("a session task panicked");
    }

    let stats = engine.stats().await.unwrap();
    let creates = tally.creates.load(Ordering::Relaxed);
    assert_eq!(stats.sessions, 0, "every session was closed");
    assert_eq!(
        stats.pool.active, 0,
        "every place under max_total was released"
    );
    assert!(stats.pool.idle <= PoolConfig::default().max_idle);
    assert!(stats.pool.idle + stats.pool.warming <= SESSIONS + 8);
    // Every create and every restart after a crash is one acquire.
    let acquires = stats.pool.hits + stats.pool.misses;
    assert!(
        acquires >= creates && acquires <= creates + stats.crashes,
        "acquires {acquires}, creates {creates}, crashes {}",
        stats.crashes
    );
    assert_eq!(
        stats.executions,
        tally.finished.load(Ordering::Relaxed),
        "the engine counts exactly the executions that ran"
    );
    assert!(stats.crashes <= tally.kills.load(Ordering::Relaxed) + creates);

    drop(engine);
    let script_dir = cache.path().to_owned();
    let mut leaked = Vec::new();
    for _ in 0..100 {
        leaked = processes_running_from(&script_dir);
        if leaked.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        leaked.is_empty(),
        "python processes left behind: {leaked:?}"
    );
}

/// One session's random walk.
async fn drive_one_session(engine: Engine, tally: Arc<Tally>, me: usize, mut rng: Rng) {
    let mut session: Option<Session> = None;
    // This session's worker was killed since its last execution, which may then crash.
    let mut killed = false;
    for _ in 0..STEPS {
        let Some(current) = session.clone() else {
            tally.doing(me, "create");
            let created = engine.create_session(Default::default()).await;
            session = Some(created.expect("creates succeed below max_total"));
            tally.creates.fetch_add(1, Ordering::Relaxed);
            killed = false;
            continue;
        };
        match rng.below(10) {
            0..=3 => {
                tally.doing(me, "run");
                let result = current
                    .run("n = globals().get('n', 0) + 1\nprint('step', n)\nn")
                    .await
                    .expect("an open session accepts work");
                assert!(
                    matches!(
                        result.status,
                        ExecutionStatus::Ok | ExecutionStatus::Crashed
                    ),
                    "unexpected {result:?}"
                );
                tally.ran(&result);
                killed = false;
            }
            4..=5 => {
                tally.doing(me, "interrupt");
                let execution = current
                    .execute(ExecuteRequest::new("import time\ntime.sleep(30)"))
                    .await
                    .expect("an open session accepts work");
                tokio::time::sleep(Duration::from_millis(rng.below(50))).await;
                // The execution may wait behind a restart (nothing runs to interrupt yet),
                // or end first (its worker was killed in the step before): interrupt once it
                // runs, unless it is over.
                let mut result = Box::pin(execution.result());
                let result = loop {
                    if current.interrupt().await.unwrap() {
                        break result.await.unwrap();
                    }
                    tokio::select! {
                        ended = &mut result => break ended.unwrap(),
                        _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                    }
                };
                // An interrupt is never lost, even one sent as the execution starts: only a
                // worker killed since the last execution makes it crash.
                assert!(
                    result.status == ExecutionStatus::Interrupted
                        || (killed && result.status == ExecutionStatus::Crashed),
                    "unexpected {result:?} (worker killed before: {killed})"
                );
                tally.ran(&result);
                killed = false;
            }
            6..=7 => {
                tally.doing(me, "kill");
                if let Some(pid) = current.info().await.unwrap().pid {
                    if kill(Pid::from_raw(pid as i32), Signal::SIGKILL).is_ok() {
                        tally.kills.fetch_add(1, Ordering::Relaxed);
                        killed = true;
                    }
                }
            }
            _ => {
                tally.doing(me, "close");
                current.close().await.unwrap();
                session = None;
            }
        }
    }
    if let Some(session) = session {
        tally.doing(me, "final close");
        session.close().await.unwrap();
    }
    tally.doing(me, "done");
}

/// Live (non-zombie) processes whose command line mentions `dir`.
fn processes_running_from(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|cmdline| String::from_utf8_lossy(&cmdline).contains(&needle))
                .unwrap_or(false)
        })
        .filter(|pid| pyvisor_tests::process_running(*pid))
        .collect()
}
