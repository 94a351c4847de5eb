//! The scenario of a load test: what to drive (target), for how long, with how many clients
//! and what they do (a weighted mix of operations), and which faults to inject. Read from a
//! TOML file ([`Scenario::from_toml`]) or built in code; [`Scenario::validate`] gives every
//! mistake a clear message naming the field.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::faults::FaultSpec;
use super::ops::OpSpec;
use super::LoadtestError;
use crate::DurabilityMode;

/// A whole load test.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Shown in the live view and the report.
    #[serde(default = "default_name")]
    pub name: String,
    pub target: TargetSpec,
    /// How long the clients run, in seconds (after the ramp-up starts).
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// Or: how many operations each client runs.
    #[serde(default)]
    pub iterations: Option<u64>,
    /// Seconds at the start whose samples of memory are left out of the RSS slope.
    #[serde(default)]
    pub warmup_s: f64,
    /// Closed model: this many clients, each in a loop.
    #[serde(default = "one")]
    pub clients: usize,
    /// Seconds over which the clients start, evenly spread.
    #[serde(default)]
    pub ramp_up_s: f64,
    /// Pause of a client between operations.
    #[serde(default)]
    pub think: Think,
    /// Open model: operations started per second across all clients (each client then waits
    /// for its next arrival rather than looping), when set.
    #[serde(default)]
    pub rate: Option<f64>,
    /// Timeout of each execution, in seconds.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// The operation mix.
    #[serde(default, rename = "op")]
    pub ops: Vec<OpSpec>,
    /// The faults.
    #[serde(default, rename = "fault")]
    pub faults: Vec<FaultSpec>,
    /// Where relative paths (code files, traces) are found: the scenario file's directory.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

fn default_name() -> String {
    "loadtest".to_owned()
}

fn one() -> usize {
    1
}

fn default_timeout() -> f64 {
    30.0
}

fn three() -> usize {
    3
}

fn default_lease_ttl() -> f64 {
    5.0
}

/// What the scenario drives.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "lowercase")]
pub enum TargetSpec {
    /// An engine started by the harness in this process, with a temporary state directory.
    Embedded {
        /// `[state] durability` of that engine: `debounced` (default) or `reply`.
        #[serde(default)]
        durability: DurabilityMode,
    },
    /// A daemon's JSON-RPC socket: `path`, else the configured one (`$PYVISOR_SOCKET`, then
    /// `server.socket`, as `pyvisor exec` finds it).
    Socket {
        #[serde(default)]
        path: Option<PathBuf>,
        /// The daemon's `[state] durability`, which sets what loss is allowed.
        #[serde(default)]
        durability: DurabilityMode,
    },
    /// A daemon the harness starts itself (`binary serve`, this program by default) on a
    /// socket and state directory of its own, and can SIGKILL and start again
    /// (`kill_daemon`).
    Daemon {
        #[serde(default)]
        binary: Option<PathBuf>,
        #[serde(default)]
        durability: DurabilityMode,
    },
    /// A cluster the harness runs itself (see `cluster`): a throwaway PostgreSQL, `nodes`
    /// `pyvisor serve` nodes sharing it with HTTP on loopback, and HAProxy in front when
    /// `haproxy`; the clients' sessions are spread over the nodes (or all go through HAProxy),
    /// and the `node_kill` fault SIGKILLs a node and starts it again.
    ///
    /// With `urls`, a cluster that runs already: the harness starts nothing, and spreads the
    /// clients' sessions over those URLs (the nodes', or one load balancer's), tried again as
    /// for its own cluster; `token_env` names the variable holding the bearer token.
    Cluster {
        #[serde(default = "three")]
        nodes: usize,
        #[serde(default)]
        haproxy: bool,
        #[serde(default)]
        binary: Option<PathBuf>,
        /// `[cluster] lease_ttl_s` of the nodes (the engine's default, 5 s, when unset).
        #[serde(default = "default_lease_ttl")]
        lease_ttl_s: f64,
        #[serde(default)]
        durability: DurabilityMode,
        /// The URLs of a cluster that runs already (`http://host:port`).
        #[serde(default)]
        urls: Vec<String>,
        #[serde(default)]
        token_env: Option<String>,
    },
    /// A daemon's HTTP API.
    Http {
        url: String,
        /// The environment variable holding the bearer token, if the server wants one.
        #[serde(default)]
        token_env: Option<String>,
        #[serde(default)]
        durability: DurabilityMode,
    },
}

impl TargetSpec {
    /// The durability mode of the engine behind the target.
    pub fn durability(&self) -> DurabilityMode {
        match self {
            TargetSpec::Embedded { durability }
            | TargetSpec::Socket { durability, .. }
            | TargetSpec::Daemon { durability, .. }
            | TargetSpec::Cluster { durability, .. }
            | TargetSpec::Http { durability, .. } => *durability,
        }
    }

    /// The nodes' lease, for a cluster the harness runs.
    pub fn lease_ttl_s(&self) -> Option<f64> {
        match self {
            TargetSpec::Cluster { lease_ttl_s, .. } => Some(*lease_ttl_s),
            _ => None,
        }
    }

    fn validate(&self) -> Result<(), String> {
        match self {
            TargetSpec::Cluster {
                nodes,
                lease_ttl_s,
                urls,
                haproxy,
                binary,
                token_env,
                ..
            } => {
                if *nodes == 0 {
                    return Err("target.nodes: must be at least 1".into());
                }
                if urls.is_empty() && token_env.is_some() {
                    return Err("target.token_env: only for a cluster given by its urls".into());
                }
                if !urls.is_empty() && (*haproxy || binary.is_some()) {
                    return Err(
                        "target.urls: a cluster that runs already; haproxy and binary are for \
                         one the harness runs"
                            .into(),
                    );
                }
                // The nodes check the rest of `[cluster] lease_ttl_s` (and say so at start).
                if !(lease_ttl_s.is_finite() && *lease_ttl_s > 0.0) {
                    return Err(format!(
                        "target.lease_ttl_s: must be more than 0, got {lease_ttl_s}"
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// The pause of a client between two operations.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "lowercase")]
pub enum Think {
    Fixed { ms: f64 },
    Uniform { min_ms: f64, max_ms: f64 },
    Exponential { mean_ms: f64 },
}

impl Default for Think {
    fn default() -> Self {
        Think::Fixed { ms: 0.0 }
    }
}

impl Think {
    /// One pause drawn from the distribution.
    pub fn draw(&self) -> Duration {
        let ms = match *self {
            Think::Fixed { ms } => ms,
            Think::Uniform { min_ms, max_ms } => min_ms + fastrand::f64() * (max_ms - min_ms),
            // Inverse transform; 1 - u is in (0, 1], so the log is finite.
            Think::Exponential { mean_ms } => -mean_ms * (1.0 - fastrand::f64()).ln(),
        };
        Duration::from_secs_f64(ms.max(0.0) / 1000.0)
    }

    fn validate(&self) -> Result<(), String> {
        let ok = match *self {
            Think::Fixed { ms } => ms.is_finite() && ms >= 0.0,
            Think::Uniform { min_ms, max_ms } => {
                min_ms.is_finite() && max_ms.is_finite() && 0.0 <= min_ms && min_ms <= max_ms
            }
            Think::Exponential { mean_ms } => mean_ms.is_finite() && mean_ms >= 0.0,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "think: times must be finite, 0 or more, min_ms <= max_ms; got {self:?}"
            ))
        }
    }
}

impl Scenario {
    /// Reads and checks the scenario file at `path`.
    pub fn from_file(path: &Path) -> Result<Scenario, LoadtestError> {
        let text = std::fs::read_to_string(path).map_err(|err| {
            LoadtestError::Scenario(format!("cannot read {}: {err}", path.display()))
        })?;
        let base = path.parent().unwrap_or(Path::new(".")).to_owned();
        Scenario::from_toml(&text, &base)
    }

    /// Parses and checks a scenario; relative paths in it are relative to `base_dir`.
    pub fn from_toml(text: &str, base_dir: &Path) -> Result<Scenario, LoadtestError> {
        let table: toml::Table = text.parse().map_err(|err: toml::de::Error| {
            LoadtestError::Scenario(err.to_string().trim().to_owned())
        })?;
        let mut scenario: Scenario = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|err| {
                let path = err.path().to_string();
                let inner = err.into_inner().message().trim().to_owned();
                LoadtestError::Scenario(format!("{path}: {inner}"))
            })?;
        scenario.base_dir = base_dir.to_owned();
        scenario.validate()?;
        Ok(scenario)
    }

    /// Checks what the types cannot: positive counts, weights and times, a way to end.
    pub fn validate(&self) -> Result<(), LoadtestError> {
        let fail = |message: String| Err(LoadtestError::Scenario(message));
        match (self.duration_s, self.iterations) {
            (None, None) => return fail("set duration_s or iterations".into()),
            (Some(d), _) if !(d.is_finite() && d > 0.0) => {
                return fail(format!("duration_s: must be more than 0, got {d}"))
            }
            (_, Some(0)) => return fail("iterations: must be at least 1".into()),
            _ => {}
        }
        if self.clients == 0 {
            return fail("clients: must be at least 1".into());
        }
        for (field, value) in [("warmup_s", self.warmup_s), ("ramp_up_s", self.ramp_up_s)] {
            if !(value.is_finite() && value >= 0.0) {
                return fail(format!("{field}: must be 0 or more, got {value}"));
            }
        }
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0) {
            return fail(format!(
                "timeout_s: must be more than 0, got {}",
                self.timeout_s
            ));
        }
        if let Some(rate) = self.rate {
            if !(rate.is_finite() && rate > 0.0) {
                return fail(format!("rate: must be more than 0 per second, got {rate}"));
            }
        }
        self.think.validate().or_else(fail)?;
        self.target.validate().or_else(fail)?;
        if self.ops.is_empty() {
            return fail("op: at least one [[op]] is needed".into());
        }
        for (index, op) in self.ops.iter().enumerate() {
            op.validate(self)
                .or_else(|message| fail(format!("op[{index}] ({}): {message}", op.kind_name())))?;
        }
        for (index, fault) in self.faults.iter().enumerate() {
            fault.validate(&self.target).or_else(|message| {
                fail(format!("fault[{index}] ({}): {message}", fault.kind.name()))
            })?;
        }
        Ok(())
    }

    /// A path of the scenario, relative to its file's directory.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        self.base_dir.join(path)
    }

    /// How long the run lasts, when it is timed.
    pub fn duration(&self) -> Option<Duration> {
        self.duration_s.map(Duration::from_secs_f64)
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_s)
    }
}
