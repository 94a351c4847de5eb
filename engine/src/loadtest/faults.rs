//! The faults a scenario injects, on a schedule (`at_s`), periodically (`every_s`) or at
//! random (`random_every_s`, exponential gaps of that mean), and the log of each with its
//! time and whether the engine recovered: after every fault the session it hit must answer
//! `1 + 1` again within [`RECOVERY_TIMEOUT`].
//!
//! Worker faults (`kill_worker`, `stop_worker`) hit the worker of a random client's session,
//! so the clients' counters see them. The others run in a session of their own
//! (`memory_hog`, `cpu_spinner`, `fork_bomb`, `print_flood`) or on a raw connection to the
//! daemon's socket (`slow_client`, `vanished_client`), and show that everyone else keeps
//! being served. `kill_daemon` SIGKILLs a daemon the harness runs and starts it again: every
//! client's session must come back from its checkpoints with nothing lost. `node_kill`
//! SIGKILLs the node of a cluster the harness runs that holds the most clients' sessions, and
//! starts it again after `for_s`: each of those sessions must answer again on another node
//! (the failover gap, from the kill until it does, is logged for the report).
//!
//! `spec` is what a scenario says of a fault; `signals` and `neighbours` carry the faults out.

mod neighbours;
mod signals;
mod spec;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::Notify;

use super::target::Target;
use crate::Recovered;
use neighbours::{own_session, raw_client};
use signals::{daemon_fault, node_fault, worker_fault};
pub use spec::{FaultKind, FaultSpec};

/// How long a session has to answer again after a fault.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(60);

/// One fault as it happened.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub kind: &'static str,
    /// Seconds since the start of the run.
    pub at_s: f64,
    pub session: Option<String>,
    /// What was done and what the engine answered.
    pub detail: String,
    /// Whether the session answered again within the recovery timeout.
    pub recovered: bool,
    /// Seconds until it did.
    pub recovery_s: Option<f64>,
    /// A `kill_daemon` cut the fault short: it ended the fault's own session (unnamed sessions
    /// do not outlive their daemon) before that answered again, or killed the daemon while the
    /// fault was being set up. Whether the engine would have recovered is not known, and the
    /// fault is not counted as unrecovered.
    pub cut_by_restart: bool,
    /// `node_kill`: for each client session the node held that answered again, the seconds
    /// from the kill until it did.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failover_gaps_s: Vec<f64>,
}

/// The faults of a run, shared by the clients (which name the last one when they see a loss).
#[derive(Clone)]
pub struct FaultLog {
    started: Instant,
    records: Arc<Mutex<Vec<FaultRecord>>>,
    /// `kind at t s` of the last fault started.
    last: Arc<Mutex<Option<String>>>,
    /// Recovery probes running in clients' sessions, and what they were told.
    probes: Arc<Mutex<HashMap<String, Probe>>>,
    probe_ended: Arc<Notify>,
}

/// A recovery probe of one session: the first execution after a crash may be the probe's,
/// and the engine's `recovered` report on it belongs to the session's client.
#[derive(Default)]
struct Probe {
    running: bool,
    reports: Vec<Recovered>,
}

impl FaultLog {
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            records: Arc::default(),
            last: Arc::default(),
            probes: Arc::default(),
            probe_ended: Arc::default(),
        }
    }

    fn probes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Probe>> {
        self.probes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What recovery probes of `session` were told since the last call.
    pub fn take_reports(&self, session: &str) -> Vec<Recovered> {
        self.probes()
            .get_mut(session)
            .map(|probe| std::mem::take(&mut probe.reports))
            .unwrap_or_default()
    }

    /// Waits until no recovery probe runs in `session`.
    pub async fn probe_done(&self, session: &str) {
        loop {
            let ended = self.probe_ended.notified();
            if !self
                .probes()
                .get(session)
                .is_some_and(|probe| probe.running)
            {
                return;
            }
            ended.await;
        }
    }

    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The last fault started, as `kind at t s`.
    pub fn last(&self) -> Option<String> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn started(&self, kind: FaultKind) -> f64 {
        let at = self.elapsed_s();
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(format!("{} at {at:.1} s", kind.name()));
        at
    }

    fn push(&self, record: FaultRecord) {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record);
    }

    pub fn records(&self) -> Vec<FaultRecord> {
        let mut records = self
            .records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        records.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        records
    }
}

/// Injects one occurrence of `spec`, hitting one of `sessions` for worker faults.
pub async fn inject(spec: &FaultSpec, target: &Target, sessions: &[String], log: &FaultLog) {
    let at_s = log.started(spec.kind);
    if spec.kind == FaultKind::NodeKill {
        log.push(node_fault(spec, target, sessions, log, at_s).await);
        return;
    }
    let restarts_before = target.daemon_restarts();
    let hit = match spec.kind {
        FaultKind::KillWorker | FaultKind::StopWorker => {
            match sessions.get(fastrand::usize(..sessions.len().max(1))) {
                Some(session) => worker_fault(spec, target, session).await,
                None => Err("no client session yet".to_owned()),
            }
        }
        FaultKind::MemoryHog => {
            let mb = spec.mb.unwrap_or(3000);
            own_session(target, &format!("__hog = bytearray({mb} * 2**20)"), 60.0).await
        }
        FaultKind::CpuSpinner => {
            own_session(target, "while True:\n    pass", spec.seconds.unwrap_or(3.0)).await
        }
        FaultKind::ForkBomb => {
            let max = spec.max_procs.unwrap_or(200);
            let code = format!(
                "import os, time\nstarted = 0\ntry:\n    for _ in range({max}):\n        \
                 if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n        \
                 started += 1\nexcept OSError as e:\n    print('stopped by', e)\nstarted"
            );
            own_session(target, &code, 20.0).await
        }
        FaultKind::PrintFlood => {
            let bytes = spec.bytes.unwrap_or(200_000_000);
            let code = format!(
                "import sys\nchunk = 'x' * 1023 + '\\n'\nfor _ in range({}):\n    \
                 sys.stdout.write(chunk)",
                bytes / 1024
            );
            own_session(target, &code, 120.0).await
        }
        FaultKind::SlowClient | FaultKind::VanishedClient => raw_client(spec, target).await,
        FaultKind::KillDaemon => daemon_fault(target, sessions).await,
        FaultKind::NodeKill => unreachable!("handled above"),
    };
    let (session, detail) = match hit {
        Ok((session, detail)) => (Some(session), detail),
        Err(detail) => (None, detail),
    };
    let own = session.as_ref().is_some_and(|s| !sessions.contains(s));
    // A restart the fault did not cause ends a session of its own: stop probing it then.
    let restarted =
        || spec.kind != FaultKind::KillDaemon && target.daemon_restarts() != restarts_before;
    let recovery = match &session {
        Some(session) => recovered(target, session, log, || own && restarted()).await,
        // The fault could not start: because the daemon was killed under it, or a failure.
        None if restarted() => Recovery::CutByRestart,
        None => Recovery::Never,
    };
    // The sessions a fault made for itself end with it.
    if let Some(own) = session.as_ref().filter(|_| own) {
        let _ = target.close(own).await;
    }
    let recovery_s = match recovery {
        Recovery::After(took) => Some(took.as_secs_f64()),
        Recovery::Never | Recovery::CutByRestart => None,
    };
    log.push(FaultRecord {
        kind: spec.kind.name(),
        at_s,
        session,
        detail,
        recovered: recovery_s.is_some(),
        recovery_s,
        cut_by_restart: matches!(recovery, Recovery::CutByRestart),
        failover_gaps_s: Vec::new(),
    });
}

/// What came of a recovery probe.
enum Recovery {
    /// The session answered `1 + 1` after this long.
    After(Duration),
    /// It did not within [`RECOVERY_TIMEOUT`].
    Never,
    /// A daemon restart ended the session (one of the fault's own) before it answered, or
    /// kept the fault from starting at all.
    CutByRestart,
}

/// How long `session` took to answer `1 + 1` again, probing until the recovery timeout or
/// until `cut` says a daemon restart ended the session. What the engine reports it recovered
/// from is kept in `log` for the session's client.
async fn recovered(
    target: &Target,
    session: &str,
    log: &FaultLog,
    cut: impl Fn() -> bool,
) -> Recovery {
    log.probes().entry(session.to_owned()).or_default().running = true;
    let started = Instant::now();
    let mut answered = Recovery::Never;
    while started.elapsed() < RECOVERY_TIMEOUT {
        if cut() {
            answered = Recovery::CutByRestart;
            break;
        }
        if let Ok(result) = target.execute(session, "1 + 1", RECOVERY_TIMEOUT).await {
            if let Some(report) = result.recovered {
                log.probes()
                    .entry(session.to_owned())
                    .or_default()
                    .reports
                    .push(report);
            }
            if result.result.as_ref().is_some_and(|r| r.repr == "2") {
                answered = Recovery::After(started.elapsed());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if let Some(probe) = log.probes().get_mut(session) {
        probe.running = false;
    }
    log.probe_ended.notify_waiters();
    answered
}
