//! What a run measured: the [`Recorder`] the clients write to as they go (and the live view
//! reads), the [`Report`] made of it at the end (text and JSON), and the comparison of a
//! report with a baseline.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::checker::{LostState, Verdict};
use super::faults::FaultRecord;
use super::ops::OpOutcome;
use super::sample::Resources;

/// Wrong answers kept as examples in the report.
const WRONG_EXAMPLES: usize = 20;

/// The figures of a run so far, shared by the clients.
#[derive(Default)]
pub struct Recorder {
    inner: Mutex<Recorded>,
}

#[derive(Default)]
struct Recorded {
    /// Latencies in milliseconds, per operation.
    latencies: BTreeMap<&'static str, Vec<f64>>,
    /// Failed operations, per operation.
    failures: BTreeMap<&'static str, u64>,
    errors: BTreeMap<String, u64>,
    wrong: u64,
    wrong_examples: Vec<String>,
    lost: Vec<LostState>,
    uncounted: u64,
}

/// A summary for the live view.
pub struct Live {
    pub ops: u64,
    pub errors: u64,
    pub wrong: u64,
    pub lost: u64,
    /// Of the counter round trips (`x += 1`), in milliseconds.
    pub p50_ms: f64,
    pub p99_ms: f64,
}

impl Recorder {
    fn with<T>(&self, f: impl FnOnce(&mut Recorded) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// An operation took `took` and came to `outcome`.
    pub fn op(&self, name: &'static str, took: Duration, outcome: &OpOutcome) {
        self.with(|r| {
            r.took(name, took);
            if let Some(kind) = &outcome.error {
                r.fail(name, kind);
            }
            if let Some(wrong) = &outcome.wrong {
                r.wrong(format!("{name}: {wrong}"));
            }
        });
    }

    /// A counter check took `took` and found `verdict`.
    pub fn check(&self, took: Duration, verdict: Verdict) {
        self.with(|r| {
            r.took(COUNTER, took);
            if let Some(kind) = &verdict.error {
                r.fail(COUNTER, kind);
            }
            if let Some(wrong) = verdict.wrong {
                r.wrong(format!("{COUNTER}: {wrong}"));
            }
            if let Some(lost) = verdict.lost {
                r.lost.push(lost);
            }
            r.uncounted += verdict.uncounted;
        });
    }

    /// An error outside any operation (a client could not get a session).
    pub fn error(&self, name: &'static str, kind: &str) {
        self.with(|r| r.fail(name, kind));
    }

    pub fn live(&self) -> Live {
        self.with(|r| {
            let counter = r
                .latencies
                .get(COUNTER)
                .map(|l| sorted(l))
                .unwrap_or_default();
            Live {
                ops: r.latencies.values().map(|l| l.len() as u64).sum(),
                errors: r.errors.values().sum(),
                wrong: r.wrong,
                lost: r.lost.len() as u64,
                p50_ms: quantile(&counter, 0.5),
                p99_ms: quantile(&counter, 0.99),
            }
        })
    }

    /// The report of a run that lasted `elapsed`.
    pub fn report(&self, header: Header, elapsed: Duration, end: EndFigures) -> Report {
        self.with(|r| {
            let seconds = elapsed.as_secs_f64().max(f64::EPSILON);
            let ops = r
                .latencies
                .iter()
                .map(|(name, samples)| {
                    let sorted = sorted(samples);
                    let figures = OpFigures {
                        count: sorted.len() as u64,
                        errors: r.failures.get(name).copied().unwrap_or(0),
                        p50_ms: quantile(&sorted, 0.5),
                        p95_ms: quantile(&sorted, 0.95),
                        p99_ms: quantile(&sorted, 0.99),
                        max_ms: sorted.last().copied().unwrap_or(0.0),
                        throughput_per_s: sorted.len() as f64 / seconds,
                    };
                    (name.to_string(), figures)
                })
                .collect::<BTreeMap<_, _>>();
            let total: u64 = ops.values().map(|o| o.count).sum();
            let faults_unrecovered = end
                .faults
                .iter()
                .filter(|f| !f.recovered && !f.cut_by_restart)
                .count() as u64;
            let faults_cut_by_restart =
                end.faults.iter().filter(|f| f.cut_by_restart).count() as u64;
            let failover = header.lease_ttl_s.map(|ttl| Failover::of(&end.faults, ttl));
            Report {
                scenario: header.scenario,
                target: header.target,
                durability: header.durability,
                clients: header.clients,
                duration_s: seconds,
                total_ops: total,
                throughput_per_s: total as f64 / seconds,
                ops,
                errors: r.errors.clone(),
                wrong_answers: r.wrong,
                wrong_examples: r.wrong_examples.clone(),
                lost_state: r.lost.clone(),
                lost_uncounted: r.uncounted,
                faults: end.faults,
                faults_unrecovered,
                faults_cut_by_restart,
                failover,
                crashes: end.crashes,
                restores: end.restores,
                pool_hit_rate: end.pool_hit_rate,
                resources: end.resources,
            }
        })
    }
}

impl Recorded {
    fn took(&mut self, name: &'static str, took: Duration) {
        let ms = took.as_secs_f64() * 1000.0;
        self.latencies.entry(name).or_default().push(ms);
    }

    fn fail(&mut self, name: &'static str, kind: &str) {
        *self.failures.entry(name).or_default() += 1;
        *self.errors.entry(format!("{name}: {kind}")).or_default() += 1;
    }

    fn wrong(&mut self, what: String) {
        self.wrong += 1;
        if self.wrong_examples.len() < WRONG_EXAMPLES {
            self.wrong_examples.push(what);
        }
    }
}

/// The name under which counter round trips are reported.
pub const COUNTER: &str = "counter (x += 1)";

fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
}

/// The `q` quantile of `sorted` by nearest rank; 0 when empty.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// What the report says of the run before its figures.
pub struct Header {
    pub scenario: String,
    pub target: String,
    pub durability: String,
    pub clients: usize,
    /// The nodes' lease, for a cluster the harness runs.
    pub lease_ttl_s: Option<f64>,
}

/// Figures known only at the end.
pub struct EndFigures {
    pub faults: Vec<FaultRecord>,
    pub crashes: u64,
    pub restores: u64,
    pub pool_hit_rate: Option<f64>,
    pub resources: Resources,
}

/// The figures of one operation.
#[derive(Debug, Clone, Serialize)]
pub struct OpFigures {
    pub count: u64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub throughput_per_s: f64,
}

/// The report of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub target: String,
    pub durability: String,
    pub clients: usize,
    pub duration_s: f64,
    pub total_ops: u64,
    pub throughput_per_s: f64,
    pub ops: BTreeMap<String, OpFigures>,
    /// `operation: kind` → count.
    pub errors: BTreeMap<String, u64>,
    pub wrong_answers: u64,
    pub wrong_examples: Vec<String>,
    pub lost_state: Vec<LostState>,
    /// Counter increments that sessions taken over from a killed node lost beyond their
    /// `lost_executions` (acknowledged after the dead node's last heartbeat), each admitted
    /// by the `recovered.execution_count` the session came back to
    /// (docs/cluster.md#failover): allowed, and shown.
    pub lost_uncounted: u64,
    pub faults: Vec<FaultRecord>,
    pub faults_unrecovered: u64,
    /// Faults a `kill_daemon` cut short ([`FaultRecord::cut_by_restart`]).
    pub faults_cut_by_restart: u64,
    /// Of a cluster the harness ran: how long sessions of killed nodes took to answer again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<Failover>,
    /// Workers that died during the run, and namespaces restored from checkpoints.
    pub crashes: u64,
    pub restores: u64,
    /// Sessions created during the run that got a ready worker from the pool.
    pub pool_hit_rate: Option<f64>,
    pub resources: Resources,
}

/// The failover gaps of a cluster run: from each `node_kill` until each client session the
/// node held answered again on another node.
#[derive(Debug, Clone, Serialize)]
pub struct Failover {
    pub node_kills: u64,
    /// Sessions that answered again (a gap each).
    pub sessions: u64,
    pub p50_s: f64,
    pub p99_s: f64,
    pub max_s: f64,
    /// The target for the p99: the lease plus 1 s.
    pub target_p99_s: f64,
    /// Whether the p99 is within the target (no gap measured: not met).
    pub met: bool,
}

impl Failover {
    fn of(faults: &[FaultRecord], lease_ttl_s: f64) -> Failover {
        let gaps: Vec<f64> = faults
            .iter()
            .flat_map(|fault| fault.failover_gaps_s.iter().copied())
            .collect();
        let gaps = sorted(&gaps);
        let target_p99_s = lease_ttl_s + 1.0;
        let p99_s = quantile(&gaps, 0.99);
        Failover {
            node_kills: faults.iter().filter(|f| f.kind == "node_kill").count() as u64,
            sessions: gaps.len() as u64,
            p50_s: quantile(&gaps, 0.5),
            p99_s,
            max_s: gaps.last().copied().unwrap_or(0.0),
            target_p99_s,
            met: !gaps.is_empty() && p99_s <= target_p99_s,
        }
    }
}

impl Report {
    /// No wrong answer, no lost state, every fault recovered.
    pub fn passed(&self) -> bool {
        self.wrong_answers == 0 && self.lost_state.is_empty() && self.faults_unrecovered == 0
    }

    /// The report as text, for a terminal.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "loadtest {}: {} target ({} durability), {} clients, {:.1} s, {} operations, {:.1}/s",
            self.scenario,
            self.target,
            self.durability,
            self.clients,
            self.duration_s,
            self.total_ops,
            self.throughput_per_s
        );
        let _ = writeln!(
            out,
            "\n{:<22} {:>7} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "operation", "count", "errors", "p50 ms", "p95 ms", "p99 ms", "max ms", "per s"
        );
        for (name, o) in &self.ops {
            let _ = writeln!(
                out,
                "{name:<22} {:>7} {:>6} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>8.2}",
                o.count, o.errors, o.p50_ms, o.p95_ms, o.p99_ms, o.max_ms, o.throughput_per_s
            );
        }
        let _ = writeln!(
            out,
            "\nwrong answers {}, lost state {}{}, crashes {}, restores {}, pool hit rate {}",
            self.wrong_answers,
            self.lost_state.len(),
            match self.lost_uncounted {
                0 => String::new(),
                n => format!(
                    " (and {n} executions lost after a dead node's last heartbeat, \
                     beyond lost_executions, admitted by recovered.execution_count)"
                ),
            },
            self.crashes,
            self.restores,
            self.pool_hit_rate
                .map_or("n/a".to_owned(), |rate| format!("{:.0}%", rate * 100.0))
        );
        let r = &self.resources;
        let _ = writeln!(
            out,
            "engine peak RSS {} MB{}, workers peak RSS {} MB, CPU {} s, RSS slope {} MB/min \
             after warm-up",
            opt(r.engine_peak_rss_mb),
            if r.engine_is_harness {
                " (with the harness)".to_owned()
            } else if r.engine_processes > 1 {
                format!(
                    " (the largest of {} nodes; workers and CPU of all)",
                    r.engine_processes
                )
            } else {
                String::new()
            },
            opt(r.workers_peak_rss_mb),
            opt(r.cpu_s),
            opt(r.rss_slope_mb_per_min)
        );
        if !self.errors.is_empty() {
            let _ = writeln!(out, "\nerrors:");
            for (kind, count) in &self.errors {
                let _ = writeln!(out, "  {count:>6}  {kind}");
            }
        }
        if let Some(f) = &self.failover {
            let _ = writeln!(
                out,
                "failover: {} node kills, {} sessions answered again: gap p50 {:.2} s, p99 \
                 {:.2} s, max {:.2} s; target p99 <= lease + 1 s = {:.1} s: {}",
                f.node_kills,
                f.sessions,
                f.p50_s,
                f.p99_s,
                f.max_s,
                f.target_p99_s,
                if f.met { "met" } else { "NOT MET" }
            );
        }
        if !self.faults.is_empty() {
            let _ = writeln!(
                out,
                "\nfaults ({}, {} not recovered, {} cut short by a daemon restart):",
                self.faults.len(),
                self.faults_unrecovered,
                self.faults_cut_by_restart
            );
            for f in &self.faults {
                let _ = writeln!(
                    out,
                    "  {:>7.1} s  {:<16} {}  {}",
                    f.at_s,
                    f.kind,
                    match f.recovery_s {
                        Some(s) => format!("recovered in {s:.2} s"),
                        None if f.cut_by_restart => "cut short by a daemon restart".to_owned(),
                        None => "NOT RECOVERED".to_owned(),
                    },
                    f.detail
                );
            }
        }
        for wrong in &self.wrong_examples {
            let _ = writeln!(out, "WRONG ANSWER: {wrong}");
        }
        for lost in &self.lost_state {
            let _ = writeln!(
                out,
                "LOST STATE: {} at {:.1} s: counter {} expected {} (engine reported {} lost), \
                 after {}, back from {}",
                lost.session,
                lost.at_s,
                lost.found,
                lost.expected,
                lost.reported_lost,
                lost.after_fault.as_deref().unwrap_or("no fault"),
                lost.checkpoint.as_deref().unwrap_or("no checkpoint")
            );
        }
        out
    }
}

fn opt(value: Option<f64>) -> String {
    value.map_or("n/a".to_owned(), |v| format!("{v:.1}"))
}

/// One figure of a comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Compared {
    pub figure: String,
    pub base: f64,
    pub new: f64,
    /// How much worse the new figure is (above 1: worse); `None` when the base is 0.
    pub worse_by: Option<f64>,
}

/// Compares `new` with `base` (both report JSON), figure by figure.
pub fn compare(base: &Value, new: &Value) -> Vec<Compared> {
    let (mut base_figures, mut new_figures) = (BTreeMap::new(), BTreeMap::new());
    flatten("", base, &mut base_figures);
    flatten("", new, &mut new_figures);
    let mut compared = Vec::new();
    for (figure, new) in new_figures {
        let Some(&base) = base_figures.get(&figure) else {
            continue;
        };
        let higher_is_better = figure.contains("throughput") || figure.contains("hit_rate");
        let worse_by = if base == 0.0 {
            None
        } else if higher_is_better {
            Some(if new == 0.0 {
                f64::INFINITY
            } else {
                base / new
            })
        } else {
            Some(new / base)
        };
        compared.push(Compared {
            figure,
            base,
            new,
            worse_by,
        });
    }
    compared
}

/// The figures worth comparing: every number but counts of samples and times of faults.
fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, f64>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                if matches!(
                    key.as_str(),
                    "faults"
                        | "wrong_examples"
                        | "clients"
                        | "count"
                        | "duration_s"
                        | "total_ops"
                        | "samples"
                ) {
                    continue;
                }
                let name = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                flatten(&name, value, out);
            }
        }
        Value::Array(items) if prefix == "lost_state" => {
            out.insert(prefix.to_owned(), items.len() as f64);
        }
        Value::Number(number) => {
            if let Some(number) = number.as_f64() {
                out.insert(prefix.to_owned(), number);
            }
        }
        _ => {}
    }
}
