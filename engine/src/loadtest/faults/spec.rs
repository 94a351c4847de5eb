//! What a scenario says of a fault: its kind, when it happens (`at_s`, `every_s` or
//! `random_every_s`) and its settings, checked against the target it needs.

use std::time::Duration;

use serde::Deserialize;

use crate::loadtest::scenario::TargetSpec;
use crate::DurabilityMode;

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
    pub(in crate::loadtest) fn validate(&self, target: &TargetSpec) -> Result<(), String> {
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
