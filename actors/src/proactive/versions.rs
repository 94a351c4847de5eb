//! Versions of a session's names, the part of a cache key that says "nothing this answer
//! read has changed since".
//!
//! Every real execution bumps the version of each name it bound, rebound, removed or may
//! have changed in place, aliases included (the worker's [`CellFacts::touched`]). An execution
//! that says nothing (no facts: it timed out, crashed, or ran without facts), one that could
//! have touched anything, a rollback, a restore and a crash start a new epoch, which no key
//! of the old one matches. A speculation keeps a [`Snapshot`] taken when it was sent, so a
//! result that arrives after a real execution is keyed on the state it was computed from.

use std::collections::HashMap;

use pyvisor_protocol::CellFacts;

/// Names whose versions a session keeps at most; past it, a new epoch.
const MAX_NAMES: usize = 100_000;

/// The versions of one session's names.
#[derive(Debug, Clone, Default)]
pub struct VersionTable {
    epoch: u64,
    clock: u64,
    names: HashMap<String, u64>,
    ambient: String,
}

/// The versions as they were when a speculation was sent.
#[derive(Debug, Clone)]
pub struct Snapshot {
    epoch: u64,
    names: HashMap<String, u64>,
}

/// One name a cached answer read, and the version it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadVersion {
    pub name: String,
    pub version: u64,
    /// The name was bound by a predicted snippet before this one: the answer holds only once
    /// a real execution has bound it since (and the worker finds the same content).
    pub dependent: bool,
}

/// What must hold for a cached answer to be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadKey {
    pub epoch: u64,
    pub ambient: String,
    pub reads: Vec<ReadVersion>,
}

impl VersionTable {
    /// Takes in what a real execution did; `None` when it is not known.
    pub fn observe(&mut self, facts: Option<&CellFacts>, rolled_back: bool) {
        let Some(facts) = facts.filter(|_| !rolled_back) else {
            return self.new_epoch();
        };
        let Some(touched) = &facts.touched else {
            self.ambient.clone_from(&facts.ambient);
            return self.new_epoch();
        };
        for name in touched.iter().chain(&facts.binds) {
            self.clock += 1;
            self.names.insert(name.clone(), self.clock);
        }
        self.ambient.clone_from(&facts.ambient);
        if self.names.len() > MAX_NAMES {
            // A namespace this large churns through names: start over rather than grow.
            self.new_epoch();
        }
    }

    /// Nothing known before holds any more (a restore, a crash, an unknown change).
    pub fn new_epoch(&mut self) {
        self.epoch += 1;
        self.names.clear();
    }

    /// The worker's surroundings are known to have the ambient token `ambient` now.
    pub fn surroundings_are(&mut self, ambient: &str) {
        ambient.clone_into(&mut self.ambient);
    }

    /// The versions now, for a speculation about to be sent.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            epoch: self.epoch,
            names: self.names.clone(),
        }
    }

    /// Whether an answer keyed on `key` still reads what it read.
    pub fn holds(&self, key: &ReadKey) -> bool {
        key.epoch == self.epoch
            && key.ambient == self.ambient
            && key.reads.iter().all(|read| {
                let now = self.names.get(&read.name).copied().unwrap_or(0);
                if read.dependent {
                    now > read.version
                } else {
                    now == read.version
                }
            })
    }
}

impl Snapshot {
    /// The key of an answer that read `reads` with the ambient token `ambient`, where
    /// `predicted` are the names earlier snippets of its speculation bound.
    pub fn key<'a>(
        &self,
        reads: impl IntoIterator<Item = &'a str>,
        predicted: &[String],
        ambient: &str,
    ) -> ReadKey {
        ReadKey {
            epoch: self.epoch,
            ambient: ambient.to_owned(),
            reads: reads
                .into_iter()
                .map(|name| ReadVersion {
                    name: name.to_owned(),
                    version: self.names.get(name).copied().unwrap_or(0),
                    dependent: predicted.iter().any(|bound| bound == name),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(binds: &[&str], touched: Option<&[&str]>) -> CellFacts {
        CellFacts {
            binds: binds.iter().map(|s| s.to_string()).collect(),
            touched: touched.map(|names| names.iter().map(|s| s.to_string()).collect()),
            ambient: "a".into(),
            ..CellFacts::default()
        }
    }

    fn table() -> VersionTable {
        let mut table = VersionTable::default();
        table.observe(Some(&facts(&["df", "s"], Some(&[]))), false);
        table
    }

    #[test]
    fn a_key_holds_until_a_name_it_read_is_touched() {
        let mut table = table();
        let key = table.snapshot().key(["df"], &[], "a");
        assert!(table.holds(&key));
        table.observe(Some(&facts(&[], Some(&["s"]))), false);
        assert!(table.holds(&key), "s is not read");
        table.observe(Some(&facts(&[], Some(&["df"]))), false);
        assert!(!table.holds(&key));
    }

    #[test]
    fn unknown_effects_rollbacks_and_restores_end_every_key() {
        for change in 0..3 {
            let mut table = table();
            let key = table.snapshot().key(["df"], &[], "a");
            match change {
                0 => table.observe(Some(&facts(&[], None)), false),
                1 => table.observe(Some(&facts(&[], Some(&[]))), true),
                _ => table.new_epoch(),
            }
            assert!(!table.holds(&key), "change {change}");
        }
    }

    #[test]
    fn another_ambient_token_ends_a_key() {
        let mut table = table();
        let key = table.snapshot().key(["df"], &[], "a");
        let mut options_changed = facts(&[], Some(&[]));
        options_changed.ambient = "b".into();
        table.observe(Some(&options_changed), false);
        assert!(!table.holds(&key));
    }

    #[test]
    fn a_dependent_read_holds_only_after_a_real_binding() {
        let mut table = table();
        let key = table.snapshot().key(["df2"], &["df2".to_owned()], "a");
        assert!(!table.holds(&key), "the predicted cell has not run");
        table.observe(Some(&facts(&["df2"], Some(&[]))), false);
        assert!(table.holds(&key));
    }

    #[test]
    fn a_snapshot_keys_on_the_state_it_was_taken_from() {
        let mut table = table();
        let snapshot = table.snapshot();
        table.observe(Some(&facts(&["df"], Some(&[]))), false);
        // The answer arrives after the real execution: it read the old df.
        let key = snapshot.key(["df"], &[], "a");
        assert!(!table.holds(&key));
    }
}
