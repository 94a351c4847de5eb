//! The session's own history as a source of guesses: what it ran on one object, run on a
//! newer object of the same kind (`df.shape` after `df2 = ...` gives `df2.shape`), an
//! earlier inspection run again once what it reads has changed (`df.head()` after
//! `df['b'] = ...`), and the last few cells varied (`varied.rs`) or edited (`edits.rs`).

use super::candidates::Pool;
use super::edits::Edits;
use super::model::{Observed, SessionModel};
use super::prediction::Source;
use super::table::Table;
use super::template::{instantiate, Filling};

/// How far back the session's cells are looked at.
const LOOK_BACK: usize = 16;
/// Newer objects an earlier cell is re-applied to.
const NEWER_OBJECTS: usize = 4;
/// How many of the last inspections are varied and edited.
const RECENT_INSPECTIONS: usize = 3;

/// One guess from the history.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryGuess {
    /// Normal form of the code.
    pub code: String,
    pub template: String,
    pub cost_ms: f64,
    pub kind: GuessKind,
    /// How many cells back the cell it comes from is (0 for the last one).
    pub age: usize,
    /// Its place among the choices of its way of varying or editing that cell (0 for the
    /// likeliest column or member), for the kinds that offer several.
    pub order: usize,
}

impl HistoryGuess {
    /// The key of the rate this guess is counted under: its kind, how old its cell is and,
    /// for the kinds that offer several choices, its place among them (the fifth column after
    /// the last one is right less often than the next).
    pub fn rate_key(&self) -> String {
        let age = match self.age {
            0..=2 => self.age.to_string(),
            3..=4 => "3-4".to_string(),
            5..=8 => "5-8".to_string(),
            _ => "9+".to_string(),
        };
        let order = match self.kind {
            GuessKind::OtherColumn
            | GuessKind::OtherObject
            | GuessKind::Swapped
            | GuessKind::Alike => match self.order {
                0 => "#0",
                1 => "#1",
                2..=3 => "#2-3",
                _ => "#4+",
            },
            _ => "",
        };
        format!("{}/{age}{order}", self.kind.as_str())
    }
}

impl GuessKind {
    fn as_str(self) -> &'static str {
        match self {
            GuessKind::Reapplied => "reapplied",
            GuessKind::RepeatedChanged => "repeated-changed",
            GuessKind::Repeated => "repeated",
            GuessKind::OtherColumn => "other-column",
            GuessKind::OtherObject => "other-object",
            GuessKind::OtherLiteral => "other-literal",
            GuessKind::Argument => "argument",
            GuessKind::Swapped => "swapped",
            GuessKind::Alike => "alike",
        }
    }
}

/// Which way the history gave a guess; each has its own learned rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuessKind {
    /// An earlier cell applied to a newer object.
    Reapplied,
    /// An earlier cell again, after what it reads changed.
    RepeatedChanged,
    /// An earlier cell again, nothing it reads changed.
    Repeated,
    /// A recent cell with another column (`varied.rs`).
    OtherColumn,
    /// A recent cell on another object of the same kind (`varied.rs`).
    OtherObject,
    /// A recent cell with other literals of the data (`varied.rs`).
    OtherLiteral,
    /// A recent cell with an argument dropped, added or changed (`edits.rs`).
    Argument,
    /// A recent cell with a member swapped for a learned sibling (`edits.rs`).
    Swapped,
    /// A recent cell with a member swapped for one written in the same surroundings
    /// (`edits.rs`).
    Alike,
}

impl SessionModel {
    /// Adds the history's guesses to `pool`, each with its kind's learned rate.
    pub(super) fn guess_from_history(&self, table: &Table, pool: &mut Pool) {
        for guess in self.history_guesses(&table.edits) {
            let p = table.history_rate(&guess.rate_key());
            pool.add(
                guess.code,
                guess.template,
                Source::History,
                p,
                guess.cost_ms,
            );
        }
    }

    /// The guesses of the history source, the last cells edited with the vocabulary `edits`.
    pub(super) fn history_guesses(&self, edits: &Edits) -> Vec<HistoryGuess> {
        let mut out: Vec<HistoryGuess> = Vec::new();
        for (age, past) in self.history.iter().rev().take(LOOK_BACK).enumerate() {
            if !past.single || !past.ok {
                continue;
            }
            if let Some(normal) = &past.normal {
                if !out.iter().any(|g| &g.code == normal) {
                    let kind = if self.changed_since(past) {
                        GuessKind::RepeatedChanged
                    } else {
                        GuessKind::Repeated
                    };
                    out.push(HistoryGuess {
                        code: normal.clone(),
                        template: past.template.key.clone(),
                        cost_ms: self.default_cost(&past.template.vars),
                        kind,
                        age,
                        order: 0,
                    });
                }
            }
            out.extend(self.reapplied(past, age));
        }
        for guess in self
            .varied_guesses()
            .into_iter()
            .chain(self.edited_guesses(edits))
        {
            if !out.iter().any(|g| g.code == guess.code) {
                out.push(guess);
            }
        }
        out
    }

    /// The last few cells that were single expressions and ran, the last first, each with
    /// how many cells back it is: what `varied.rs` and `edits.rs` start from.
    pub(super) fn recent_inspections(&self) -> impl Iterator<Item = (usize, &Observed)> {
        self.history
            .iter()
            .rev()
            .enumerate()
            .filter(|(_, past)| past.single && past.ok)
            .take(RECENT_INSPECTIONS)
    }

    /// Whether a later cell bound or changed a name that `past` reads.
    pub(super) fn changed_since(&self, past: &Observed) -> bool {
        self.history.iter().filter(|h| h.seq > past.seq).any(|h| {
            h.bound
                .iter()
                .chain(&h.touched)
                .any(|n| past.template.vars.contains(n))
        })
    }

    /// `past`, a cell on one object, applied to the newer objects of the same kind.
    fn reapplied(&self, past: &Observed, age: usize) -> Vec<HistoryGuess> {
        let mut out = Vec::new();
        let [name] = past.template.vars.as_slice() else {
            return out;
        };
        let kind = self.kind(name);
        for other in self.recency.iter().take(NEWER_OBJECTS) {
            let newer = self.bound_at.get(other).is_some_and(|&at| at > past.seq);
            let already = self.history.iter().any(|h| {
                h.template.key == past.template.key && h.template.vars.first() == Some(other)
            });
            if other == name || !newer || already || self.kind(other) != kind {
                continue;
            }
            out.extend(self.on_object(past, other, GuessKind::Reapplied, age));
        }
        out
    }

    /// `past`'s template filled with `vars` and `cols`, as a guess of `kind`.
    pub(super) fn refilled(
        &self,
        past: &Observed,
        vars: &[String],
        cols: &[String],
        kind: GuessKind,
        age: usize,
    ) -> Option<HistoryGuess> {
        let filling = Filling {
            vars,
            cols,
            literals: &past.template.literals,
            ..Filling::default()
        };
        Some(HistoryGuess {
            code: instantiate(&past.template.key, &filling)?,
            template: past.template.key.clone(),
            cost_ms: self.default_cost(vars),
            kind,
            age,
            order: 0,
        })
    }

    /// `past`, a cell on one object, on `other` instead, when `other` has its columns.
    pub(super) fn on_object(
        &self,
        past: &Observed,
        other: &str,
        kind: GuessKind,
        age: usize,
    ) -> Option<HistoryGuess> {
        if !self.has_columns(other, &past.template.cols) {
            return None;
        }
        self.refilled(past, &[other.to_owned()], &past.template.cols, kind, age)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guess(kind: GuessKind, age: usize) -> HistoryGuess {
        HistoryGuess {
            code: "df.head()".to_string(),
            template: "$0.head()".to_string(),
            cost_ms: 1.0,
            kind,
            age,
            order: 0,
        }
    }

    #[test]
    fn rates_are_kept_by_kind_age_and_order() {
        assert_eq!(guess(GuessKind::Reapplied, 0).rate_key(), "reapplied/0");
        assert_eq!(guess(GuessKind::Repeated, 4).rate_key(), "repeated/3-4");
        assert_eq!(
            guess(GuessKind::RepeatedChanged, 30).rate_key(),
            "repeated-changed/9+"
        );
        let mut table = Table::default();
        table.history.insert(
            "reapplied/0".to_string(),
            super::super::table::Rate {
                hits: 49,
                trials: 100,
            },
        );
        let third_column = HistoryGuess {
            order: 2,
            ..guess(GuessKind::OtherColumn, 0)
        };
        assert_eq!(third_column.rate_key(), "other-column/0#2-3");
        let repeated = HistoryGuess {
            order: 5,
            ..guess(GuessKind::Repeated, 0)
        };
        assert_eq!(
            repeated.rate_key(),
            "repeated/0",
            "one choice only: no order"
        );
        assert!(table.history_rate("reapplied/0") > 0.2);
        assert!(table.history_rate("reapplied/1") < 0.02);
    }
}
