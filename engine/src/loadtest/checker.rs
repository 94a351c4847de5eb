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
//!   heartbeat, not what it acknowledged since. The exact loss is what the result's
//!   `recovered.execution_count` admits: every execution acknowledged with a higher count is
//!   gone. So a loss beyond `lost_executions` is allowed, and counted apart
//!   ([`Verdict::uncounted`]), up to the checks of this client acknowledged with an
//!   execution count above that one, and no further.
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
    /// The lowest execution count a session taken over from a dead node came back to, by a
    /// result since the last check: the executions above it are lost, counted or not.
    failed_over_to: Option<u64>,
    /// The execution counts of the recent checks that were acknowledged, oldest first.
    acked: VecDeque<u64>,
}

/// Acknowledged checks a counter remembers: more than one run makes between two failovers.
const ACKS_KEPT: usize = 256;

impl Counter {
    pub fn new(target: &TargetSpec) -> Self {
        Self {
            durability: target.durability(),
            expected: 0,
            uncertain: false,
            reported_lost: 0,
            checkpoint: None,
            failed_over_to: None,
            acked: VecDeque::new(),
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
            // An engine that does not say where the count went back to admits nothing more.
            if recovered.from_node.is_some() && recovered.lost_may_be_more {
                let back_to = recovered.execution_count.unwrap_or(u64::MAX);
                self.failed_over_to = Some(self.failed_over_to.map_or(back_to, |n| n.min(back_to)));
            }
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

    /// How much more may have gone back uncounted in the `debounced` mode: after a failover,
    /// the checks acknowledged with an execution count above the one the session came back
    /// to, which `lost_executions` may leave out.
    fn uncounted_allowance(&self) -> u64 {
        match (self.durability, self.failed_over_to) {
            (DurabilityMode::Debounced, Some(back_to)) => {
                self.acked.iter().filter(|&&count| count > back_to).count() as u64
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
            if beyond > 0 && beyond <= self.uncounted_allowance() {
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
            // What came back from a dead node counts on from where it went back to: the
            // acknowledgements above it are gone, and their counts are given again.
            if let Some(back_to) = self.failed_over_to {
                self.acked.retain(|&count| count <= back_to);
            }
            if self.acked.len() == ACKS_KEPT {
                self.acked.pop_front();
            }
            self.acked.push_back(result.execution_count);
        }
        self.reported_lost = 0;
        self.failed_over_to = None;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(durability: &str) -> TargetSpec {
        toml::from_str(&format!(
            "kind = \"cluster\"\nlease_ttl_s = 3\ndurability = \"{durability}\""
        ))
        .expect("a cluster target")
    }

    /// What a result says of a session taken over from a dead node that came back to
    /// execution `back_to`.
    fn failover(back_to: Option<u64>, lost_may_be_more: bool) -> Recovered {
        Recovered {
            checkpoint_id: Some("c-1".into()),
            lost_executions: 0,
            execution_count: back_to,
            fresh_namespace: false,
            lost_may_be_more,
            from_node: Some("node-1".into()),
        }
    }

    #[test]
    fn after_a_failover_the_acks_above_the_count_it_came_back_to_may_be_lost() {
        let mut counter = Counter::new(&cluster("debounced"));
        counter.acked = [10, 11, 12, 13].into_iter().collect();
        assert_eq!(counter.uncounted_allowance(), 0, "no failover");
        counter.note(Some(&failover(Some(11), true)));
        assert_eq!(counter.uncounted_allowance(), 2, "checks 12 and 13");
        // Two failovers before the next check: the lower count holds.
        counter.note(Some(&failover(Some(12), true)));
        assert_eq!(counter.uncounted_allowance(), 2);
        // An engine that does not say where the count went back to admits nothing more.
        counter.failed_over_to = None;
        counter.note(Some(&failover(None, true)));
        assert_eq!(counter.uncounted_allowance(), 0);
        // Nor does one whose count is exact (a durable reply, or a drain's hand-over).
        counter.failed_over_to = None;
        counter.note(Some(&failover(Some(11), false)));
        assert_eq!(counter.uncounted_allowance(), 0);
        let mut durable = Counter::new(&cluster("reply"));
        durable.acked = [10, 11].into_iter().collect();
        durable.note(Some(&failover(Some(9), true)));
        assert_eq!(durable.uncounted_allowance(), 0, "reply mode loses nothing");
    }
}
