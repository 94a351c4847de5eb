//! The load-test harness behind `pyvisor loadtest`: drives an engine (embedded, a daemon's
//! socket, or its HTTP API) with clients that run a weighted mix of operations, injects
//! faults, checks after every operation that no client's state was lost or mixed up, and
//! reports latencies, throughput, errors, recoveries and the engine's memory and CPU.
//!
//! The daemon target (`kind = "daemon"`, see `daemon`) is one the harness runs itself, so
//! a fault can kill and restart it; so is the cluster target (`kind = "cluster"`, see
//! `cluster` and `postgres`: PostgreSQL, the nodes, HAProxy), whose nodes `node_kill` kills
//! and restarts.
//!
//! A Rust program (a user's own test) runs a scenario with [`run`], or against an engine it
//! built with [`run_on`]:
//!
//! ```no_run
//! # async fn demo() -> Result<(), pyvisor::loadtest::LoadtestError> {
//! let scenario = pyvisor::loadtest::Scenario::from_file("examples/loadtest/smoke.toml".as_ref())?;
//! let report = pyvisor::loadtest::run(&scenario).await?;
//! assert!(report.passed(), "{}", report.text());
//! # Ok(()) }
//! ```
//!
//! One file per job: `scenario` (the file format and its checks), `ops` and `replay` (the
//! operations), `faults`, `target` (the engine's calls; `http` for the HTTP API),
//! `checker` (the lost-state
//! detector), `report` (figures and comparison), `sample` (memory and CPU), `live` (the
//! progress view); this file runs the clients.

mod checker;
mod cluster;
mod daemon;
mod faults;
mod http;
mod live;
mod ops;
pub mod postgres;
mod replay;
mod report;
mod sample;
mod scenario;
mod target;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

pub use checker::LostState;
pub use cluster::haproxy_config;
pub use faults::{FaultKind, FaultRecord, FaultSpec};
pub use ops::{OpKind, OpSpec};
pub use report::{compare, Compared, Failover, OpFigures, Report, COUNTER};
pub use sample::Resources;
pub use scenario::{Scenario, TargetSpec, Think};

use checker::Counter;
use faults::FaultLog;
use report::{EndFigures, Header, Recorder};
use target::Target;

use crate::Engine;

/// Why a load test could not run.
#[derive(Debug, thiserror::Error)]
pub enum LoadtestError {
    /// The scenario is not valid; the message names the field.
    #[error("scenario: {0}")]
    Scenario(String),
    /// The target could not be reached or started.
    #[error("target: {0}")]
    Target(String),
}

/// How long fault tasks of a run bounded by iterations plan ahead.
const UNTIMED_HORIZON: Duration = Duration::from_secs(24 * 3600);

/// Runs `scenario` against its target.
pub async fn run(scenario: &Scenario) -> Result<Report, LoadtestError> {
    run_with(scenario, None).await
}

/// Runs `scenario` against `engine`, whatever the scenario's target says.
pub async fn run_on(scenario: &Scenario, engine: Engine) -> Result<Report, LoadtestError> {
    run_with(scenario, Some(engine)).await
}

async fn run_with(scenario: &Scenario, engine: Option<Engine>) -> Result<Report, LoadtestError> {
    scenario.validate()?;
    let embedded = engine.is_some() || matches!(scenario.target, TargetSpec::Embedded { .. });
    let target = Arc::new(Target::open(&scenario.target, engine).await?);
    let before = target.totals().await.unwrap_or_default();
    let started = Instant::now();
    let scenario = Arc::new(scenario.clone());
    let recorder = Arc::new(Recorder::default());
    let log = FaultLog::new(started);
    let sessions: Arc<Mutex<Vec<String>>> = Arc::default();

    let (stop_sampling, mut sampling_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut sampler = sample::Sampler::new(target.engine_pids().await, started);
    let sampled = target.clone();
    let sampling = tokio::spawn(async move {
        loop {
            // A restarted daemon or node is a new process.
            if sampled.restartable() || sampled.cluster().is_some() {
                sampler.set_pids(sampled.engine_pids().await);
            }
            sampler.sample();
            tokio::select! {
                _ = &mut sampling_stopped => return sampler,
                () = tokio::time::sleep(sample::PERIOD) => {}
            }
        }
    });
    let (stop_live, live_stopped) = tokio::sync::oneshot::channel();
    let live = live::start(
        scenario.name.clone(),
        recorder.clone(),
        started,
        scenario.duration(),
        live_stopped,
    );

    let arrivals = scenario.rate.map(|rate| {
        let permits = Arc::new(Semaphore::new(0));
        let feeding = permits.clone();
        let feeder = tokio::spawn(async move {
            loop {
                let gap = -(1.0 - fastrand::f64()).ln() / rate;
                tokio::time::sleep(Duration::from_secs_f64(gap)).await;
                feeding.add_permits(1);
            }
        });
        (permits, feeder)
    });

    let stop_faults = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut fault_tasks = Vec::new();
    for spec in scenario.faults.clone() {
        let (target, sessions, log, stop) = (
            target.clone(),
            sessions.clone(),
            log.clone(),
            stop_faults.clone(),
        );
        let horizon = scenario.duration().unwrap_or(UNTIMED_HORIZON);
        fault_tasks.push(tokio::spawn(async move {
            for at in spec.times(horizon) {
                tokio::time::sleep_until((started + at).into()).await;
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let now: Vec<String> = sessions.lock().unwrap_or_else(|p| p.into_inner()).clone();
                faults::inject(&spec, &target, &now, &log).await;
            }
        }));
    }

    let mut clients = Vec::new();
    for index in 0..scenario.clients {
        let delay = scenario.ramp_up_s * index as f64 / scenario.clients as f64;
        let client = Client {
            index,
            target: target.clone(),
            scenario: scenario.clone(),
            recorder: recorder.clone(),
            log: log.clone(),
            sessions: sessions.clone(),
            arrivals: arrivals.as_ref().map(|(permits, _)| permits.clone()),
            started,
        };
        clients.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(delay)).await;
            client.run().await;
        }));
    }
    for client in clients {
        let _ = client.await;
    }
    let elapsed = started.elapsed();
    stop_faults.store(true, std::sync::atomic::Ordering::SeqCst);
    // A fault under way finishes (a stopped worker gets its SIGCONT); later ones never start.
    for task in fault_tasks {
        let _ = task.await;
    }
    if let Some((_, feeder)) = arrivals {
        feeder.abort();
    }
    let _ = stop_live.send(());
    let _ = live.await;
    let _ = stop_sampling.send(());
    let resources = match sampling.await {
        Ok(sampler) => sampler.resources(Duration::from_secs_f64(scenario.warmup_s), embedded),
        Err(_) => Resources::default(),
    };
    let after = target.totals().await.unwrap_or_default();
    // A restarted daemon's totals start again from 0: no difference is below 0.
    let (hits, misses) = (
        after.hits.saturating_sub(before.hits),
        after.misses.saturating_sub(before.misses),
    );
    let header = Header {
        scenario: scenario.name.clone(),
        target: match &scenario.target {
            _ if embedded => "embedded".to_owned(),
            TargetSpec::Socket { path, .. } => match path {
                Some(path) => format!("socket {}", path.display()),
                None => "socket (configured)".to_owned(),
            },
            TargetSpec::Daemon { .. } => match target.socket_path() {
                Some(path) => format!("daemon on {}", path.display()),
                None => "daemon".to_owned(),
            },
            TargetSpec::Http { url, .. } => format!("http {url}"),
            TargetSpec::Cluster { urls, .. } if !urls.is_empty() => {
                format!("cluster at {}", urls.join(", "))
            }
            TargetSpec::Cluster { nodes, .. } => match target.cluster() {
                Some((cluster, _)) => match cluster.front() {
                    Some(url) => format!("cluster of {nodes} nodes through HAProxy at {url}"),
                    None => format!("cluster of {nodes} nodes, clients spread over them"),
                },
                None => "cluster".to_owned(),
            },
            TargetSpec::Embedded { .. } => "embedded".to_owned(),
        },
        durability: scenario.target.durability().name().to_owned(),
        clients: scenario.clients,
        lease_ttl_s: scenario.target.lease_ttl_s(),
    };
    let end = EndFigures {
        faults: log.records(),
        crashes: after.crashes.saturating_sub(before.crashes),
        restores: after.restores.saturating_sub(before.restores),
        pool_hit_rate: (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
        resources,
    };
    Ok(recorder.report(header, elapsed, end))
}

/// One client: its own session, in a loop of operations each followed by a counter check.
struct Client {
    index: usize,
    target: Arc<Target>,
    scenario: Arc<Scenario>,
    recorder: Arc<Recorder>,
    log: FaultLog,
    sessions: Arc<Mutex<Vec<String>>>,
    /// Open model: one permit per arrival.
    arrivals: Option<Arc<Semaphore>>,
    started: Instant,
}

impl Client {
    async fn run(self) {
        let timeout = self.scenario.timeout();
        let deadline = self.scenario.duration().map(|d| self.started + d);
        let over = |done: u64| {
            deadline.is_some_and(|end| Instant::now() >= end)
                || self.scenario.iterations.is_some_and(|n| done >= n)
        };
        // A daemon the harness may restart forgets sessions without a name: the client's
        // session is named, and the name is its handle.
        let name = self
            .target
            .restartable()
            .then(|| format!("loadtest-client-{}", self.index));
        let session = loop {
            let created = match self.target.create(name.as_deref(), None).await {
                Ok(id) => {
                    let session = name.clone().unwrap_or(id);
                    Counter::init(&self.target, &session, timeout)
                        .await
                        .map(|()| session)
                }
                Err(kind) => Err(kind),
            };
            match created {
                Ok(session) => break session,
                Err(kind) => {
                    self.recorder.error("session", &kind);
                    if over(0) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(session.clone());
        let mut counter = Counter::new(&self.scenario.target);
        let weights: f64 = self.scenario.ops.iter().map(|op| op.weight).sum();
        let mut done = 0;
        while !over(done) {
            if let Some(arrivals) = &self.arrivals {
                tokio::select! {
                    permit = arrivals.acquire() => match permit {
                        Ok(permit) => permit.forget(),
                        Err(_) => break,
                    },
                    () = sleep_until(deadline) => break,
                }
            }
            let op = pick(&self.scenario.ops, weights);
            let cx = ops::OpContext {
                target: &self.target,
                scenario: &self.scenario,
                session: &session,
                tag: format!("c{}-{done}", self.index),
            };
            let began = Instant::now();
            let outcome = ops::run(op, &cx).await;
            self.recorder.op(op.kind.name(), began.elapsed(), &outcome);
            counter.note(outcome.recovered.as_ref());
            let began = Instant::now();
            let tag = format!("c{}-{done}-check", self.index);
            let verdict = counter
                .check(&self.target, &session, &tag, timeout, &self.log)
                .await;
            self.recorder.check(began.elapsed(), verdict);
            done += 1;
            if self.arrivals.is_none() {
                tokio::time::sleep(self.scenario.think.draw()).await;
            }
        }
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|s| *s != session);
        if let Err(kind) = self.target.close(&session).await {
            self.recorder.error("session", &format!("close: {kind}"));
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

/// An operation drawn by weight.
fn pick(ops: &[OpSpec], total: f64) -> &OpSpec {
    let mut point = fastrand::f64() * total;
    for op in ops {
        if point < op.weight {
            return op;
        }
        point -= op.weight;
    }
    &ops[ops.len() - 1]
}
