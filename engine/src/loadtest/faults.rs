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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

use super::scenario::TargetSpec;
use super::target::Target;
use crate::{DurabilityMode, Recovered};

/// How long a session has to answer again after a fault.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a node killed by `node_kill` stays down unless `for_s` says.
const NODE_DOWN_S: f64 = 10.0;

/// One fault of the scenario.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    pub kind: FaultKind,
    /// Seconds from the start at which it happens.
    #[serde(default)]
    pub at_s: Vec<f64>,
    /// Or: every this many seconds.
    #[serde(default)]
    pub every_s: Option<f64>,
    /// Or: at random, this many seconds apart on average.
    #[serde(default)]
    pub random_every_s: Option<f64>,
    /// `stop_worker`: how long the worker stays stopped; `slow_client`: how long the client
    /// does not read; `node_kill`: how long the node stays down (default 10).
    #[serde(default)]
    pub for_s: Option<f64>,
    /// `memory_hog`: megabytes allocated (default 3000, past the default 2048 MB limit).
    #[serde(default)]
    pub mb: Option<u64>,
    /// `cpu_spinner`: seconds of spinning before its timeout stops it.
    #[serde(default)]
    pub seconds: Option<f64>,
    /// `fork_bomb`: processes it tries to start at most (default 200).
    #[serde(default)]
    pub max_procs: Option<u32>,
    /// `print_flood`: bytes printed (default 200 MB).
    #[serde(default)]
    pub bytes: Option<u64>,
}

/// The kinds of faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGKILL of a client session's worker.
    KillWorker,
    /// SIGSTOP of a client session's worker, SIGCONT after `for_s`.
    StopWorker,
    /// A session allocating `mb` megabytes.
    MemoryHog,
    /// A session spinning the CPU until its timeout.
    CpuSpinner,
    /// A session forking until its process limit (at most `max_procs`).
    ForkBomb,
    /// A session printing `bytes`.
    PrintFlood,
    /// A socket client that asks for a large streamed output and does not read for `for_s`.
    SlowClient,
    /// A socket client that disconnects in the middle of a streamed output.
    VanishedClient,
    /// SIGKILL of the daemon, which the harness then starts again on the same state.
    KillDaemon,
    /// SIGKILL of a cluster node (the one holding the most clients' sessions), started again
    /// after `for_s`.
    NodeKill,
}

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillWorker => "kill_worker",
            FaultKind::StopWorker => "stop_worker",
            FaultKind::MemoryHog => "memory_hog",
            FaultKind::CpuSpinner => "cpu_spinner",
            FaultKind::ForkBomb => "fork_bomb",
            FaultKind::PrintFlood => "print_flood",
            FaultKind::SlowClient => "slow_client",
            FaultKind::VanishedClient => "vanished_client",
            FaultKind::KillDaemon => "kill_daemon",
            FaultKind::NodeKill => "node_kill",
        }
    }
}

impl FaultSpec {
    pub(super) fn validate(&self, target: &TargetSpec) -> Result<(), String> {
        let schedules = usize::from(!self.at_s.is_empty())
            + usize::from(self.every_s.is_some())
            + usize::from(self.random_every_s.is_some());
        if schedules != 1 {
            return Err("set exactly one of at_s, every_s and random_every_s".into());
        }
        let positive = |name: &str, value: Option<f64>| match value {
            Some(v) if !(v.is_finite() && v > 0.0) => {
                Err(format!("{name}: must be more than 0, got {v}"))
            }
            _ => Ok(()),
        };
        positive("every_s", self.every_s)?;
        positive("random_every_s", self.random_every_s)?;
        positive("for_s", self.for_s)?;
        positive("seconds", self.seconds)?;
        if let Some(at) = self.at_s.iter().find(|at| !(at.is_finite() && **at >= 0.0)) {
            return Err(format!("at_s: times must be 0 or more, got {at}"));
        }
        let socket = matches!(
            target,
            TargetSpec::Socket { .. } | TargetSpec::Daemon { .. }
        );
        match (self.kind, target) {
            (FaultKind::SlowClient | FaultKind::VanishedClient, _) if !socket => {
                Err("needs the socket or daemon target".into())
            }
            (FaultKind::KillDaemon, TargetSpec::Daemon { durability, .. }) => match durability {
                DurabilityMode::Reply => Ok(()),
                // A SIGKILLed daemon cannot say what it lost: only a loss-free mode can be
                // checked.
                DurabilityMode::Debounced => Err(
                    "needs durability = \"reply\": a SIGKILLed daemon cannot report what a \
                     debounced checkpoint lost, so no loss could be told from an allowed one"
                        .into(),
                ),
            },
            (FaultKind::KillDaemon, _) => {
                Err("needs the daemon target (kind = \"daemon\"), which the harness runs".into())
            }
            (FaultKind::NodeKill, TargetSpec::Cluster { urls, .. }) if !urls.is_empty() => Err(
                "needs a cluster the harness runs (no urls): it kills and starts its nodes".into(),
            ),
            (FaultKind::NodeKill, TargetSpec::Cluster { nodes, .. }) if *nodes < 2 => {
                Err("needs at least 2 nodes, so that another one takes the sessions over".into())
            }
            (FaultKind::NodeKill, TargetSpec::Cluster { .. }) => Ok(()),
            (FaultKind::NodeKill, _) => {
                Err("needs the cluster target (kind = \"cluster\"), which the harness runs".into())
            }
            _ => Ok(()),
        }
    }

    /// Seconds from the start of every occurrence up to `end`.
    pub fn times(&self, end: Duration) -> Vec<Duration> {
        let end = end.as_secs_f64();
        let mut times = Vec::new();
        if let Some(every) = self.every_s {
            let mut t = every;
            while t < end {
                times.push(t);
                t += every;
            }
        } else if let Some(mean) = self.random_every_s {
            let mut t = -mean * (1.0 - fastrand::f64()).ln();
            while t < end {
                times.push(t);
                t += -mean * (1.0 - fastrand::f64()).ln();
            }
        } else {
            times.extend(self.at_s.iter().copied().filter(|at| *at < end));
        }
        times.into_iter().map(Duration::from_secs_f64).collect()
    }
}

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

/// SIGKILL or SIGSTOP/SIGCONT of `session`'s worker.
async fn worker_fault(
    spec: &FaultSpec,
    target: &Target,
    session: &str,
) -> Result<(String, String), String> {
    let pid = target
        .worker_pid(session)
        .await?
        .ok_or_else(|| format!("{session} has no worker now"))?;
    let process = Pid::from_raw(i32::try_from(pid).map_err(|err| err.to_string())?);
    let detail = if spec.kind == FaultKind::KillWorker {
        kill(process, Signal::SIGKILL).map_err(|err| format!("kill {pid}: {err}"))?;
        format!("SIGKILL to worker {pid}")
    } else {
        let pause = Duration::from_secs_f64(spec.for_s.unwrap_or(2.0));
        kill(process, Signal::SIGSTOP).map_err(|err| format!("stop {pid}: {err}"))?;
        tokio::time::sleep(pause).await;
        let _ = kill(process, Signal::SIGCONT);
        format!("SIGSTOP of worker {pid} for {pause:?}")
    };
    Ok((session.to_owned(), detail))
}

/// SIGKILL and restart of the daemon, every client's session brought back by its name.
async fn daemon_fault(target: &Target, sessions: &[String]) -> Result<(String, String), String> {
    let detail = target.kill_and_restart_daemon(sessions).await?;
    let probe = sessions
        .get(fastrand::usize(..sessions.len().max(1)))
        .ok_or_else(|| format!("{detail}; no client session to probe"))?;
    Ok((probe.clone(), detail))
}

/// SIGKILL of the cluster node holding the most of `sessions`, its restart after `for_s`
/// meanwhile, and a recovery probe in each of its sessions: the record, with the failover gap
/// of each session that answered again.
async fn node_fault(
    spec: &FaultSpec,
    target: &Target,
    sessions: &[String],
    log: &FaultLog,
    at_s: f64,
) -> FaultRecord {
    let mut record = FaultRecord {
        kind: spec.kind.name(),
        at_s,
        session: None,
        detail: String::new(),
        recovered: false,
        recovery_s: None,
        cut_by_restart: false,
        failover_gaps_s: Vec::new(),
    };
    let Some((cluster, http)) = target.cluster() else {
        record.detail = "the harness does not run this target's cluster".into();
        return record;
    };
    let mut held: Vec<Vec<&String>> = vec![Vec::new(); cluster.len()];
    for session in sessions {
        if let Some(index) = http.holder(session).and_then(|id| cluster.index_of(&id)) {
            held[index].push(session);
        }
    }
    let index = (0..held.len())
        .max_by_key(|&index| (held[index].len(), std::cmp::Reverse(index)))
        .unwrap_or(0);
    let node = cluster.node_id(index).to_owned();
    let pid = match cluster.kill_node(index).await {
        Ok(pid) => pid,
        Err(err) => {
            record.detail = err;
            return record;
        }
    };
    let down = Duration::from_secs_f64(spec.for_s.unwrap_or(NODE_DOWN_S));
    let restart = async {
        tokio::time::sleep(down).await;
        let began = Instant::now();
        let pid = cluster.restart_node(index).await?;
        Ok::<_, String>((pid, began.elapsed()))
    };
    let probes = held[index]
        .iter()
        .map(|session| recovered(target, session, log, || false));
    let (restarted, recoveries) = tokio::join!(restart, futures::future::join_all(probes));
    let mut gaps: Vec<f64> = recoveries
        .iter()
        .filter_map(|recovery| match recovery {
            Recovery::After(took) => Some(took.as_secs_f64()),
            Recovery::Never | Recovery::CutByRestart => None,
        })
        .collect();
    gaps.sort_by(f64::total_cmp);
    let mut detail = format!(
        "SIGKILL to {node} (pid {pid}) holding {} client sessions",
        held[index].len()
    );
    if let (Some(first), Some(last)) = (gaps.first(), gaps.last()) {
        detail.push_str(&format!(
            "; {} answered again on another node after {first:.2}-{last:.2} s",
            gaps.len()
        ));
    }
    match &restarted {
        Ok((pid, took)) => detail.push_str(&format!(
            "; restarted after {down:?} as pid {pid}, ready {:.2} s later",
            took.as_secs_f64()
        )),
        Err(err) => detail.push_str(&format!("; not restarted: {err}")),
    }
    record.recovered = restarted.is_ok() && gaps.len() == held[index].len();
    record.recovery_s = match (record.recovered, gaps.last(), &restarted) {
        (false, ..) => None,
        (true, Some(last), _) => Some(*last),
        // It held no client session: back when the node is.
        (true, None, Ok((_, took))) => Some((down + *took).as_secs_f64()),
        (true, None, Err(_)) => None,
    };
    record.detail = detail;
    record.failover_gaps_s = gaps;
    record
}

/// Runs `code` in a new session with a timeout of `timeout_s`; the session and what came of it.
async fn own_session(
    target: &Target,
    code: &str,
    timeout_s: f64,
) -> Result<(String, String), String> {
    let session = target.create(None, None).await?;
    let detail = match target
        .execute(&session, code, Duration::from_secs_f64(timeout_s))
        .await
    {
        Ok(result) => {
            let mut detail = super::ops::status_kind(&result);
            if let Some(value) = &result.result {
                detail.push_str(&format!(" = {}", value.repr));
            }
            detail.push_str(&format!(", {} bytes of stdout", result.stdout.len()));
            detail
        }
        Err(kind) => kind,
    };
    Ok((session, detail))
}

/// A client on its own connection that asks for a large streamed output, then stops reading
/// (`slow_client`) or disconnects at once (`vanished_client`).
async fn raw_client(spec: &FaultSpec, target: &Target) -> Result<(String, String), String> {
    let path = target.socket_path().ok_or("no socket")?;
    let session = target.create(None, None).await?;
    let mut stream = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|err| format!("connect: {err}"))?;
    let request = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "session.execute",
        "params": {"session_id": session, "stream": true,
                   "code": "for i in range(2_000_000):\n    print('flood', i)"}
    });
    let mut line = request.to_string();
    line.push('\n');
    stream
        .write_all(line.as_bytes())
        .await
        .map_err(|err| format!("write: {err}"))?;
    let detail = if spec.kind == FaultKind::SlowClient {
        let pause = Duration::from_secs_f64(spec.for_s.unwrap_or(5.0));
        tokio::time::sleep(pause).await;
        format!("a client that did not read for {pause:?}")
    } else {
        tokio::time::sleep(Duration::from_millis(200)).await;
        "a client that disconnected mid-stream".to_owned()
    };
    drop(stream);
    // The flood goes on without its reader: stop it so that the session answers again.
    let _ = target.interrupt(&session).await;
    Ok((session, detail))
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
