//! The lost-state detector. Every client keeps a counter (`__lt_n`) in its session and,
//! after every operation, increments it and reads it back with a tag printed beside it. The
//! value must be the one the client last saw plus one; stdout must be exactly the tag.
//!
//! - A value lower than expected is state that went back. Under `debounced` durability that
//!   is allowed when the engine said so: a result since the last check carried `recovered`
//!   with at least that many `lost_executions` (a fault's recovery probe in the session
//!   included: it may be the first to run on the restored worker). Under `reply` durability
//!   nothing is allowed.
//!   On a cluster, `lost_executions` of a session taken over from a killed node is a lower
//!   bound (docs/cluster.md#failover): it counts what the dead node reported at its last
//!   heartbeat, not what it acknowledged since. So a loss beyond it is allowed, and counted
//!   apart ([`Verdict::uncounted`]), up to the checks this client saw acknowledged in the
//!   window that bound leaves out: two heartbeat periods (`2 × lease_ttl_s / 3`) before the
//!   kill.
//!   Anything beyond is a [`LostState`], with the session, the fault that preceded it and the
//!   checkpoint the session came back from.
//! - A value higher than expected, or stdout other than the tag (output of another session),
//!   is a wrong answer.
//! - After a check that did not come back `ok` (the worker died under it), the increment may
//!   or may not have been kept: the next check accepts either.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;

use super::faults::FaultLog;
use super::ops::status_kind;
use super::scenario::TargetSpec;
use super::target::Target;
use crate::DurabilityMode;
use crate::{ExecutionStatus, Recovered};

/// State lost beyond what the durability mode allows.
#[derive(Debug, Clone, Serialize)]
pub struct LostState {
    pub session: String,
    /// Seconds since the start of the run.
    pub at_s: f64,
    /// The counter the client expected before its increment, and what the session had.
    pub expected: u64,
    pub found: u64,
    /// Executions the engine said it lost since the previous check.
    pub reported_lost: u64,
    /// The last fault before the loss was seen (`kind at t s`), if any.
    pub after_fault: Option<String>,
    /// The checkpoint the session came back from, if it said.
    pub checkpoint: Option<String>,
}

/// What one check found.
#[derive(Debug, Default)]
pub struct Verdict {
    pub lost: Option<LostState>,
    /// Counter increments lost beyond the `lost_executions` of a failover, within the window
    /// that lower bound leaves out (acknowledged after the dead node's last heartbeat).
    pub uncounted: u64,
    pub wrong: Option<String>,
    pub error: Option<String>,
}

/// One client's counter.
pub struct Counter {
    durability: DurabilityMode,
    /// The value the session holds, as far as the client knows.
    expected: u64,
    /// The last check did not finish: the session may hold `expected + 1`.
    uncertain: bool,
    /// Executions the engine reported lost since the last check.
    reported_lost: u64,
    checkpoint: Option<String>,
    /// A result since the last check said the session came back from a dead node.
    failed_over: bool,
    /// Seconds before a node's kill in which acknowledged executions may be lost uncounted:
    /// on a cluster in the `debounced` mode, two heartbeat periods; else none.
    uncounted_window_s: Option<f64>,
    /// When recent checks were acknowledged, in seconds since the start of the run.
    acked_s: VecDeque<f64>,
}

/// Acknowledged checks a counter remembers, for the window before a node's kill.
const ACKS_KEPT: usize = 256;

impl Counter {
    pub fn new(target: &TargetSpec) -> Self {
        let durability = target.durability();
        let uncounted_window_s = (target.lease_ttl_s())
            .filter(|_| durability == DurabilityMode::Debounced)
            .map(|lease_ttl_s| 2.0 * lease_ttl_s / 3.0);
        Self {
            durability,
            expected: 0,
            uncertain: false,
            reported_lost: 0,
            checkpoint: None,
            failed_over: false,
            uncounted_window_s,
            acked_s: VecDeque::new(),
        }
    }

    /// Sets the counter up in a new session.
    pub async fn init(target: &Target, session: &str, timeout: Duration) -> Result<(), String> {
        let result = target.execute(session, "__lt_n = 0", timeout).await?;
        match result.status {
            ExecutionStatus::Ok => Ok(()),
            _ => Err(status_kind(&result)),
        }
    }

    /// Notes what an operation's result said the session recovered from.
    pub fn note(&mut self, recovered: Option<&Recovered>) {
        if let Some(recovered) = recovered {
            self.reported_lost += recovered.lost_executions;
            self.failed_over |= recovered.from_node.is_some();
            if recovered.checkpoint_id.is_some() || recovered.fresh_namespace {
                self.checkpoint = recovered.checkpoint_id.clone();
            }
        }
    }

    fn note_probes(&mut self, faults: &FaultLog, session: &str) {
        for report in faults.take_reports(session) {
            self.note(Some(&report));
        }
    }

    /// How far the counter may go back, from what the engine reported since the last check.
    fn allowed_loss(&self) -> u64 {
        match self.durability {
            DurabilityMode::Debounced => self.reported_lost,
            DurabilityMode::Reply => 0,
        }
    }

    /// How much more may have gone back uncounted: after a failover, the checks acknowledged
    /// within the window before the last node's kill that `lost_executions` leaves out.
    fn uncounted_allowance(&self, faults: &FaultLog) -> u64 {
        match (self.uncounted_window_s, faults.last_node_kill()) {
            (Some(window_s), Some(kill_s)) if self.failed_over => {
                acked_since(&self.acked_s, kill_s - window_s)
            }
            _ => 0,
        }
    }

    /// Increments and reads back the counter of `session`.
    pub async fn check(
        &mut self,
        target: &Target,
        session: &str,
        tag: &str,
        timeout: Duration,
        faults: &FaultLog,
    ) -> Verdict {
        let code = format!("__lt_n += 1\nprint({tag:?})\n__lt_n");
        let result = match target.execute(session, &code, timeout).await {
            Ok(result) => result,
            Err(kind) => {
                self.uncertain = true;
                return Verdict {
                    error: Some(kind),
                    ..Verdict::default()
                };
            }
        };
        self.note(result.recovered.as_ref());
        // A fault's recovery probe may have run first on the restored worker and been told
        // what was lost: that report is this session's too.
        self.note_probes(faults, session);
        let found = match (&result.status, &result.error) {
            (ExecutionStatus::Ok, _) => {
                let value = result
                    .result
                    .as_ref()
                    .and_then(|r| r.repr.parse::<u64>().ok());
                match value {
                    Some(value) if value > 0 => value - 1,
                    _ => return self.wrong(format!("counter read back as {:?}", result.result)),
                }
            }
            // The namespace is empty: everything is gone.
            (ExecutionStatus::Error, Some(error)) if error.type_name == "NameError" => 0,
            _ => {
                self.uncertain = true;
                return Verdict {
                    error: Some(status_kind(&result)),
                    ..Verdict::default()
                };
            }
        };
        let mut verdict = Verdict::default();
        let allowed_ahead = u64::from(self.uncertain);
        if found > self.expected + allowed_ahead {
            verdict.wrong = Some(format!(
                "counter of {session} ahead: expected {}, found {found}",
                self.expected
            ));
        } else if found < self.expected {
            if self.expected - found > self.allowed_loss() {
                // Its answer may not have reached the probe yet.
                faults.probe_done(session).await;
                self.note_probes(faults, session);
            }
            let beyond = (self.expected - found).saturating_sub(self.allowed_loss());
            if beyond > 0 && beyond <= self.uncounted_allowance(faults) {
                verdict.uncounted = beyond;
            } else if beyond > 0 {
                verdict.lost = Some(LostState {
                    session: session.to_owned(),
                    at_s: faults.elapsed_s(),
                    expected: self.expected,
                    found,
                    reported_lost: self.reported_lost,
                    after_fault: faults.last(),
                    checkpoint: self.checkpoint.clone(),
                });
            }
        }
        if result.status == ExecutionStatus::Ok && result.stdout != format!("{tag}\n") {
            verdict.wrong = Some(format!(
                "stdout of {session} is {:?}, not its tag {tag:?}",
                result.stdout.chars().take(80).collect::<String>()
            ));
        }
        self.expected = found + u64::from(result.status == ExecutionStatus::Ok);
        if result.status != ExecutionStatus::Ok {
            // Start the counter again in the fresh namespace.
            if let Err(kind) = Counter::init(target, session, timeout).await {
                verdict.error = Some(kind);
                self.uncertain = true;
            }
            self.expected = 0;
        } else {
            self.uncertain = false;
            if self.acked_s.len() == ACKS_KEPT {
                self.acked_s.pop_front();
            }
            self.acked_s.push_back(faults.elapsed_s());
        }
        self.reported_lost = 0;
        self.failed_over = false;
        verdict
    }

    fn wrong(&mut self, what: String) -> Verdict {
        self.uncertain = true;
        Verdict {
            wrong: Some(what),
            ..Verdict::default()
        }
    }
}

/// How many of the acknowledgements at `acked_s` (seconds, oldest first) came after `since_s`.
fn acked_since(acked_s: &VecDeque<f64>, since_s: f64) -> u64 {
    acked_s.iter().rev().take_while(|&&at| at > since_s).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(durability: &str) -> TargetSpec {
        toml::from_str(&format!(
            "kind = \"cluster\"\nlease_ttl_s = 3\ndurability = \"{durability}\""
        ))
        .expect("a cluster target")
    }

    #[test]
    fn only_a_debounced_cluster_leaves_a_window_uncounted() {
        assert_eq!(
            Counter::new(&cluster("debounced")).uncounted_window_s,
            Some(2.0)
        );
        assert_eq!(Counter::new(&cluster("reply")).uncounted_window_s, None);
        let daemon: TargetSpec = toml::from_str("kind = \"embedded\"").expect("a target");
        assert_eq!(Counter::new(&daemon).uncounted_window_s, None);
    }

    #[test]
    fn the_allowance_counts_the_acks_of_the_window_before_the_kill_after_a_failover() {
        let faults = FaultLog::new(std::time::Instant::now());
        let mut counter = Counter::new(&cluster("debounced"));
        counter.acked_s = [1.0, 5.0, 8.5, 9.5, 10.0].into_iter().collect();
        // No node was killed: nothing goes back uncounted.
        counter.failed_over = true;
        assert_eq!(counter.uncounted_allowance(&faults), 0);
        faults.node_killed();
        let kill_s = faults.last_node_kill().expect("the kill was noted");
        counter.acked_s = [kill_s - 9.0, kill_s - 2.5, kill_s - 1.5, kill_s - 0.1]
            .into_iter()
            .collect();
        // The window is 2 s (two heartbeats of a 3 s lease): the last two acks.
        assert_eq!(counter.uncounted_allowance(&faults), 2);
        // A session that did not come back from a dead node has no allowance.
        counter.failed_over = false;
        assert_eq!(counter.uncounted_allowance(&faults), 0);
    }
}
