//! A session's account of its durable state: which checkpoint its namespace could come back
//! from, how many executions a crash would lose now, which names no checkpoint holds and why,
//! and what a result must say about it (docs/protocol.md `warnings`, `recovered` and
//! `session.info` `durability`).
//!
//! Pure bookkeeping: the SessionActor tells it what happened (an execution changed the
//! namespace, a checkpoint was stored or failed, a restore finished, the worker died) and asks
//! what to report. It never touches the worker or the disk.

use std::time::Instant;

use pyvisor_protocol::LostName;

use crate::checkpoint::CheckpointId;
use crate::execution::Recovered;

/// Names listed by name in a warning; the rest are counted.
const NAMES_IN_A_WARNING: usize = 5;

/// The latest checkpoint this session wrote or restored.
#[derive(Debug, Clone, Copy)]
pub(super) struct LastCheckpoint {
    pub id: CheckpointId,
    /// The session's execution count when the checkpoint was taken.
    pub execution_count: u64,
    pub at: Instant,
}

/// What `session.info` reports of a session's durable state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurabilityReport {
    /// Whether a crash now would lose nothing: the latest checkpoint holds every change and
    /// every name.
    pub saved: bool,
    /// The checkpoint a crash would come back from.
    pub last_checkpoint: Option<String>,
    /// Executions that may have changed the namespace since that checkpoint.
    pub unsaved_executions: u64,
    /// Names the latest checkpoint could not save, with the reason.
    pub lost_names: Vec<LostName>,
    /// Why the latest checkpoint attempt failed, until one succeeds.
    pub failure: Option<String>,
}

/// The bookkeeping itself.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// Whether the session keeps checkpoints at all.
    pub checkpoints_on: bool,
    pub last: Option<LastCheckpoint>,
    /// Executions that may have changed the namespace, since the session began.
    changes: u64,
    /// `changes` as of the namespace the latest stored or restored checkpoint holds.
    saved_changes: u64,
    /// The execution count the namespace started from when it last started empty.
    fresh_since: u64,
    lost_names: Vec<LostName>,
    failure: Option<String>,
}

impl Ledger {
    pub fn new(checkpoints_on: bool) -> Self {
        Self {
            checkpoints_on,
            ..Self::default()
        }
    }

    /// An execution ended that may have changed the namespace.
    pub fn changed(&mut self) {
        self.changes += 1;
    }

    /// The mark to hand back to [`Ledger::stored`]: the changes a checkpoint asked for now
    /// will hold.
    pub fn mark(&self) -> u64 {
        self.changes
    }

    /// Executions that may have changed the namespace since the latest checkpoint.
    pub fn unsaved(&self) -> u64 {
        self.changes - self.saved_changes
    }

    /// A checkpoint asked for at `mark` is stored.
    pub fn stored(&mut self, last: LastCheckpoint, mark: u64, lost: Vec<LostName>) {
        self.last = Some(last);
        self.saved_changes = self.saved_changes.max(mark);
        self.lost_names = lost;
        self.failure = None;
    }

    /// A checkpoint could not be stored, for `reason`.
    pub fn failed(&mut self, reason: String) {
        self.failure = Some(reason);
    }

    /// The namespace is now what checkpoint `last` holds.
    pub fn restored(&mut self, last: LastCheckpoint) {
        self.last = Some(last);
        self.saved_changes = self.changes;
        self.lost_names.clear();
        self.failure = None;
    }

    /// The worker died. Returns what the session comes back with: the latest checkpoint when
    /// there is one (the caller has the next worker restore it), else a fresh namespace.
    /// `started` is the count of the last execution that reached the worker.
    pub fn crashed(&mut self, started: u64) -> Recovered {
        match self.last.filter(|_| self.checkpoints_on) {
            Some(last) => Recovered {
                checkpoint_id: Some(last.id.to_string()),
                lost_executions: started.saturating_sub(last.execution_count),
                execution_count: Some(last.execution_count),
                fresh_namespace: false,
                lost_may_be_more: false,
                from_node: None,
            },
            None => self.fresh(started),
        }
    }

    /// The namespace starts empty again after executions up to `started`: whatever the
    /// session held is gone, and so nothing is unsaved any more.
    pub fn fresh(&mut self, started: u64) -> Recovered {
        let lost_executions = started.saturating_sub(self.fresh_since);
        let came_back_to = self.fresh_since;
        self.last = None;
        self.fresh_since = started;
        self.saved_changes = self.changes;
        self.lost_names.clear();
        self.failure = None;
        Recovered {
            checkpoint_id: None,
            lost_executions,
            execution_count: Some(came_back_to),
            fresh_namespace: true,
            lost_may_be_more: false,
            from_node: None,
        }
    }

    /// What `session.info` reports.
    pub fn report(&self) -> DurabilityReport {
        let unsaved = self.unsaved();
        DurabilityReport {
            saved: self.checkpoints_on && unsaved == 0 && self.lost_names.is_empty(),
            last_checkpoint: self.last.map(|last| last.id.to_string()),
            unsaved_executions: unsaved,
            lost_names: self.lost_names.clone(),
            failure: self.failure.clone(),
        }
    }

    /// What every result says while the session's state is not saved; empty while it is,
    /// or while the latest changes simply wait for their automatic checkpoint.
    pub fn warnings(&self) -> Vec<String> {
        let unsaved = self.unsaved();
        let mut warnings = Vec::new();
        if !self.checkpoints_on {
            if self.changes > 0 {
                warnings.push(
                    "state not saved: checkpoints are off for this session; a crash loses the \
                     whole namespace"
                        .to_owned(),
                );
            }
            return warnings;
        }
        if let (Some(failure), true) = (&self.failure, unsaved > 0) {
            warnings.push(format!(
                "state not saved: {failure}; a crash now loses {unsaved} execution(s)"
            ));
        }
        if !self.lost_names.is_empty() {
            let named: Vec<String> = self
                .lost_names
                .iter()
                .take(NAMES_IN_A_WARNING)
                .map(|lost| format!("{} ({})", lost.name, lost.reason))
                .collect();
            let more = self.lost_names.len().saturating_sub(NAMES_IN_A_WARNING);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            warnings.push(format!(
                "state not saved for {}{more}: a crash loses them",
                named.join(", ")
            ));
        }
        warnings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(sequence: u64, execution_count: u64) -> LastCheckpoint {
        LastCheckpoint {
            id: format!("c-{sequence}").parse().unwrap(),
            execution_count,
            at: Instant::now(),
        }
    }

    #[test]
    fn a_stored_checkpoint_saves_the_changes_it_was_asked_for_at() {
        let mut ledger = Ledger::new(true);
        ledger.changed();
        let mark = ledger.mark();
        ledger.changed();
        ledger.stored(checkpoint(1, 1), mark, Vec::new());
        let report = ledger.report();
        assert!(!report.saved);
        assert_eq!(report.unsaved_executions, 1);
        assert_eq!(report.last_checkpoint.as_deref(), Some("c-1"));
        // Waiting for the next automatic checkpoint is no reason to warn.
        assert!(ledger.warnings().is_empty());
    }

    #[test]
    fn a_failed_checkpoint_warns_until_one_succeeds() {
        let mut ledger = Ledger::new(true);
        ledger.changed();
        ledger.changed();
        ledger.failed("checkpoint of 21.0 MB over the limit of 10.0 MB".into());
        let warnings = ledger.warnings();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].starts_with("state not saved: checkpoint of 21.0 MB"));
        assert!(warnings[0].ends_with("a crash now loses 2 execution(s)"));
        assert!(ledger.report().failure.is_some());
        let mark = ledger.mark();
        ledger.stored(checkpoint(1, 2), mark, Vec::new());
        assert!(ledger.warnings().is_empty());
        assert!(ledger.report().saved);
    }

    #[test]
    fn names_a_checkpoint_could_not_save_are_named_in_the_warning() {
        let mut ledger = Ledger::new(true);
        ledger.changed();
        let lost = (0..7)
            .map(|i| LostName {
                name: format!("n{i}"),
                reason: "TypeError: cannot pickle".into(),
            })
            .collect();
        let mark = ledger.mark();
        ledger.stored(checkpoint(1, 1), mark, lost);
        let warnings = ledger.warnings();
        assert!(
            warnings[0].contains("n0 (TypeError: cannot pickle)"),
            "{warnings:?}"
        );
        assert!(warnings[0].contains("and 2 more"), "{warnings:?}");
        assert!(!ledger.report().saved);
    }

    #[test]
    fn checkpoints_off_warn_once_the_namespace_changed() {
        let mut ledger = Ledger::new(false);
        assert!(ledger.warnings().is_empty());
        ledger.changed();
        assert!(ledger.warnings()[0].contains("checkpoints are off"));
        assert!(!ledger.report().saved);
    }

    #[test]
    fn a_crash_comes_back_from_the_last_checkpoint_or_says_the_namespace_is_fresh() {
        let mut ledger = Ledger::new(true);
        let fresh = ledger.crashed(3);
        assert_eq!(fresh.checkpoint_id, None);
        assert!(fresh.fresh_namespace);
        assert_eq!(fresh.lost_executions, 3);
        // A second crash loses only what ran since the first.
        assert_eq!(ledger.crashed(5).lost_executions, 2);
        ledger.stored(checkpoint(4, 6), ledger.mark(), Vec::new());
        let back = ledger.crashed(9);
        assert_eq!(back.checkpoint_id.as_deref(), Some("c-4"));
        assert_eq!(back.lost_executions, 3);
        assert!(!back.fresh_namespace);
    }
}
