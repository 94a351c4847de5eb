//! Counting the corpus into a [`Table`]: each cell, abstracted as the session model saw it,
//! is counted after every context of the cell before it; the ranks of the objects and columns
//! that filled free slots, the kinds and column classes templates were used with, how often
//! the history source was right, and template runtimes are counted alongside.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::model::{column_class, SessionModel};
use super::normal::{is_single_expression, normalise};
use super::offline::TraceCell;
use super::table::{Followers, Rate, Table};
use super::template::{relative, Template};

/// How much of the counts a table keeps.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Followers kept per context, by the context's level.
    pub per_cell_context: usize,
    pub per_object_context: usize,
    pub unconditional: usize,
    /// Contexts of a whole cell or statement seen fewer times are dropped.
    pub min_context: u32,
    /// At most this many contexts, the most frequent.
    pub contexts: usize,
    /// Ranks of free slots counted.
    pub ranks: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            per_cell_context: 12,
            per_object_context: 60,
            unconditional: 300,
            min_context: 2,
            contexts: 1500,
            ranks: 12,
        }
    }
}

/// Counts of the corpus, turned into a [`Table`] by [`TableBuilder::build`].
#[derive(Debug, Default)]
pub struct TableBuilder {
    cells: u64,
    next: HashMap<String, HashMap<String, u32>>,
    totals: HashMap<String, u32>,
    distinct: HashMap<String, HashSet<String>>,
    var_rank: Vec<u64>,
    var_slots: u64,
    col_rank: Vec<u64>,
    col_slots: u64,
    kinds: HashMap<String, BTreeMap<String, u32>>,
    col_classes: HashMap<String, BTreeMap<String, u32>>,
    history: Rate,
    runtimes: HashMap<String, (u64, f64)>,
}

impl TableBuilder {
    /// Nothing counted yet.
    pub fn new() -> TableBuilder {
        TableBuilder::default()
    }

    /// Counts one sequence, its cells in order.
    pub fn add_sequence(&mut self, cells: &[TraceCell], ranks: usize) {
        let mut model = SessionModel::new();
        for (i, cell) in cells.iter().enumerate() {
            self.cells += 1;
            if i > 0 {
                if let Some(next) = model.abstract_next(&cell.code) {
                    self.count(&model, &next, cell, ranks);
                }
            }
            model.observe(&cell.code, &cell.facts, cell.ok());
        }
    }

    fn count(&mut self, model: &SessionModel, next: &Template, cell: &TraceCell, ranks: usize) {
        let single = is_single_expression(&cell.code);
        for context in model.contexts() {
            let rel = relative(next, &context.vars, &context.cols);
            *self.totals.entry(context.key.clone()).or_default() += 1;
            self.distinct
                .entry(context.key.clone())
                .or_default()
                .insert(rel.clone());
            if single {
                *self
                    .next
                    .entry(context.key)
                    .or_default()
                    .entry(rel)
                    .or_default() += 1;
            }
        }
        if !single {
            return;
        }
        for name in &next.vars {
            self.var_slots += 1;
            if let Some(rank) = model.recent_objects().iter().position(|n| n == name) {
                bump(&mut self.var_rank, rank, ranks);
            }
        }
        for label in &next.cols {
            self.col_slots += 1;
            let owner = next
                .vars
                .iter()
                .find(|v| model.ranked_columns(v).iter().any(|c| &c.name == label));
            if let Some(owner) = owner {
                let ranked = model.ranked_columns(owner);
                if let Some(rank) = ranked.iter().position(|c| &c.name == label) {
                    bump(&mut self.col_rank, rank, ranks);
                }
            }
        }
        if let Some(first) = next.vars.first() {
            *self
                .kinds
                .entry(next.key.clone())
                .or_default()
                .entry(model.kind(first).to_string())
                .or_default() += 1;
            let object = model.object(first);
            let column = next
                .cols
                .first()
                .and_then(|label| object?.columns.iter().find(|c| &c.name == label));
            if let Some(column) = column {
                let class = column_class(column, object.and_then(|o| o.len));
                *self
                    .col_classes
                    .entry(next.key.clone())
                    .or_default()
                    .entry(class)
                    .or_default() += 1;
            }
        }
        let guesses = model.history_guesses();
        let normal = normalise(&cell.code);
        self.history.trials += guesses.len() as u64;
        self.history.hits += guesses
            .iter()
            .filter(|(code, _, _)| normalise(code) == normal)
            .count() as u64;
        if cell.ok() && cell.duration_ms > 0.0 {
            let r = self.runtimes.entry(next.key.clone()).or_default();
            r.0 += 1;
            r.1 += cell.duration_ms;
        }
    }

    /// The table, cut to `limits`.
    pub fn build(self, limits: &Limits) -> Table {
        let mut contexts: Vec<(String, u32)> = self
            .totals
            .iter()
            .filter(|(key, &total)| !is_cell_context(key) || total >= limits.min_context)
            .map(|(k, &t)| (k.clone(), t))
            .collect();
        contexts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        contexts.truncate(limits.contexts);
        let mut next = BTreeMap::new();
        let mut used: HashSet<String> = HashSet::new();
        for (key, total) in contexts {
            let keep = if key == "u" {
                limits.unconditional
            } else if is_cell_context(&key) {
                limits.per_cell_context
            } else {
                limits.per_object_context
            };
            let mut top: Vec<(String, u32)> = self
                .next
                .get(&key)
                .map(|m| m.iter().map(|(r, &c)| (r.clone(), c)).collect())
                .unwrap_or_default();
            // A follower seen once after a specific context is noise, not a pattern.
            top.retain(|(_, c)| *c >= 2 || !is_cell_context(&key));
            top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            top.truncate(keep);
            if top.is_empty() {
                continue;
            }
            used.extend(top.iter().map(|(r, _)| super::template::absolute(r)));
            let distinct = self.distinct.get(&key).map_or(0, |d| d.len() as u32);
            next.insert(
                key,
                Followers {
                    total,
                    distinct,
                    top,
                },
            );
        }
        let keep = |m: HashMap<String, BTreeMap<String, u32>>| -> BTreeMap<_, _> {
            m.into_iter().filter(|(k, _)| used.contains(k)).collect()
        };
        Table {
            cells: self.cells,
            next,
            var_rank: shares(&self.var_rank, self.var_slots),
            col_rank: shares(&self.col_rank, self.col_slots),
            kinds: keep(self.kinds),
            col_classes: keep(self.col_classes),
            history: self.history,
            runtime_ms: self
                .runtimes
                .iter()
                .filter(|(k, _)| used.contains(*k))
                .map(|(k, (n, sum))| (k.clone(), (sum / *n as f64 * 100.0).round() / 100.0))
                .collect(),
        }
    }
}

fn is_cell_context(key: &str) -> bool {
    key.starts_with('c') || key.starts_with("l:")
}

fn bump(counts: &mut Vec<u64>, rank: usize, ranks: usize) {
    if rank >= ranks {
        return;
    }
    if counts.len() <= rank {
        counts.resize(rank + 1, 0);
    }
    counts[rank] += 1;
}

fn shares(counts: &[u64], total: u64) -> Vec<f64> {
    counts
        .iter()
        .map(|&c| ((c as f64 / total.max(1) as f64) * 1e4).round() / 1e4)
        .collect()
}
