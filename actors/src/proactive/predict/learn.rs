//! Counting the corpus into a [`Table`]: each cell, abstracted as the session model saw it,
//! is counted after every context of the cell before it; the ranks of the objects and columns
//! that filled free slots, the kinds and column classes templates were used with, the
//! vocabulary of edits (`edits.rs`), how often the history source was right, and template
//! runtimes are counted alongside.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::chain::{added, drop_key, drop_key_general, drop_key_shape, split};
use super::edits::{EditCounts, Edits};
use super::model::{column_class, SessionModel};
use super::normal::{is_single_expression, normalise};
use super::offline::{repository, TraceCell};
use super::table::{Followers, Rate, Table};
use super::template::{absolute, relative, subscript_columns, Template};
use super::tokens::{tokenize, Token};

/// How much of the counts a table keeps.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Followers kept per context, by the context's level.
    pub per_cell_context: usize,
    pub per_object_context: usize,
    pub unconditional: usize,
    /// Followers kept per chain context.
    pub per_chain_context: usize,
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
            per_chain_context: 30,
            unconditional: 300,
            min_context: 2,
            contexts: 1500,
            ranks: 12,
        }
    }
}

/// Followers counted per context.
#[derive(Debug, Default)]
struct Counts {
    followers: HashMap<String, HashMap<String, u32>>,
    totals: HashMap<String, u32>,
    distinct: HashMap<String, HashSet<String>>,
}

impl Counts {
    /// One cell after `context`, whose template relative to it is `rel`; `servable` says
    /// whether it may be predicted (a single expression).
    fn add(&mut self, context: &str, rel: Option<&str>, servable: bool) {
        *self.totals.entry(context.to_string()).or_default() += 1;
        let Some(rel) = rel else {
            return;
        };
        self.distinct
            .entry(context.to_string())
            .or_default()
            .insert(rel.to_string());
        if servable {
            *self
                .followers
                .entry(context.to_string())
                .or_default()
                .entry(rel.to_string())
                .or_default() += 1;
        }
    }

    /// The contexts seen at least `min` times (those `keep` allows any number of times), the
    /// most frequent first, each with its top followers.
    fn build(
        &self,
        limit: usize,
        keep: impl Fn(&str) -> (usize, u32),
    ) -> BTreeMap<String, Followers> {
        let mut contexts: Vec<(&String, u32)> = self
            .totals
            .iter()
            .filter(|(key, &total)| total >= keep(key).1)
            .map(|(k, &t)| (k, t))
            .collect();
        contexts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        contexts.truncate(limit);
        let mut out = BTreeMap::new();
        for (key, total) in contexts {
            let (size, min) = keep(key);
            let mut top: Vec<(String, u32)> = self
                .followers
                .get(key)
                .map(|m| m.iter().map(|(r, &c)| (r.clone(), c)).collect())
                .unwrap_or_default();
            // A follower seen once after a specific context is noise, not a pattern.
            top.retain(|(_, c)| *c >= min);
            top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            top.truncate(size);
            if top.is_empty() {
                continue;
            }
            let distinct = self.distinct.get(key).map_or(0, |d| d.len() as u32);
            out.insert(
                key.clone(),
                Followers {
                    total,
                    distinct,
                    top,
                },
            );
        }
        out
    }
}

/// Counts of the corpus, turned into a [`Table`] by [`TableBuilder::build`].
#[derive(Debug, Default)]
pub struct TableBuilder {
    cells: u64,
    next: Counts,
    chain: Counts,
    attribute_columns: Rate,
    var_rank: Vec<u64>,
    var_slots: u64,
    col_rank: Vec<u64>,
    col_slots: u64,
    kinds: HashMap<String, BTreeMap<String, u32>>,
    col_classes: HashMap<String, BTreeMap<String, u32>>,
    history: BTreeMap<String, Rate>,
    edits: EditCounts,
    runtimes: HashMap<String, (u64, f64)>,
}

impl TableBuilder {
    /// Nothing counted yet.
    pub fn new() -> TableBuilder {
        TableBuilder::default()
    }

    /// Counts the vocabulary of edits of one sequence; every sequence's must be counted
    /// before any is passed to [`TableBuilder::add_sequence`].
    pub fn add_vocabulary(&mut self, cells: &[TraceCell]) {
        let mut model = SessionModel::new();
        let mut recent: Vec<Vec<Token>> = Vec::new();
        for cell in cells {
            let tokens = tokenize(&cell.code).unwrap_or_default();
            let repo = repository(&cell.sequence);
            self.edits.add_cell(repo, &tokens, &recent, &model.scope());
            recent.push(tokens);
            model.observe(&cell.code, &cell.facts, cell.ok());
        }
    }

    /// Counts one sequence, its cells in order. The history's edits are counted with the
    /// vocabulary of the other repositories, as a session unlike the corpus would see it.
    pub fn add_sequence(&mut self, cells: &[TraceCell], ranks: usize) {
        let edits = cells
            .first()
            .map(|c| self.edits.build(Some(repository(&c.sequence))))
            .unwrap_or_default();
        let mut model = SessionModel::new();
        for (i, cell) in cells.iter().enumerate() {
            self.cells += 1;
            if i > 0 {
                if let Some(next) = model.abstract_next(&cell.code) {
                    self.count(&model, &next, cell, ranks, &edits);
                }
            }
            model.observe(&cell.code, &cell.facts, cell.ok());
        }
    }

    fn count(
        &mut self,
        model: &SessionModel,
        next: &Template,
        cell: &TraceCell,
        ranks: usize,
        edits: &Edits,
    ) {
        let single = is_single_expression(&cell.code);
        for context in model.contexts() {
            let rel = subscript_columns(&relative(next, &context.vars, &context.cols));
            self.next.add(&context.key, Some(&rel), single);
        }
        self.count_chain(model, cell);
        if !single {
            return;
        }
        self.attribute_columns.trials += next.cols.len() as u64;
        self.attribute_columns.hits += next.key.matches(".$c").count() as u64;
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
                .entry(subscript_columns(&next.key))
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
                    .entry(subscript_columns(&next.key))
                    .or_default()
                    .entry(class)
                    .or_default() += 1;
            }
        }
        let normal = normalise(&cell.code);
        for guess in model.history_guesses(edits) {
            let rate = self.history.entry(guess.rate_key()).or_default();
            rate.trials += 1;
            rate.hits += u64::from(Some(&guess.code) == normal.as_ref());
        }
        if cell.ok() && cell.duration_ms > 0.0 {
            let r = self
                .runtimes
                .entry(subscript_columns(&next.key))
                .or_default();
            r.0 += 1;
            r.1 += cell.duration_ms;
        }
    }

    /// Counts what the cell added to the last cell's chain, after every way of cutting it.
    fn count_chain(&mut self, model: &SessionModel, cell: &TraceCell) {
        let Some(last) = model.history().last().filter(|l| l.single && l.ok) else {
            return;
        };
        let scope = model.scope();
        let Some(prev) = tokenize(&last.code).and_then(|t| split(&t, &scope)) else {
            return;
        };
        let next = tokenize(&cell.code)
            .filter(|_| is_single_expression(&cell.code))
            .and_then(|t| split(&t, &scope));
        let n = prev.trailers.len();
        // The longest kept prefix that the next cell extends.
        let event = next.as_ref().and_then(|next| {
            (0..=n)
                .rev()
                .find_map(|keep| added(&prev, keep, next, &scope).map(|rel| (keep, rel)))
        });
        for keep in 0..=n {
            let rel = event
                .as_ref()
                .filter(|(k, _)| *k == keep)
                .map(|(_, rel)| subscript_columns(rel));
            for key in [
                drop_key(&prev, n - keep, &scope),
                drop_key_shape(&prev, n - keep),
                drop_key_general(n - keep),
            ] {
                self.chain.add(&key, rel.as_deref(), true);
            }
        }
    }

    /// The table, cut to `limits`.
    pub fn build(self, limits: &Limits) -> Table {
        let next = self.next.build(limits.contexts, |key| {
            if key == "u" {
                (limits.unconditional, 1)
            } else if is_cell_context(key) {
                (limits.per_cell_context, limits.min_context)
            } else {
                (limits.per_object_context, 1)
            }
        });
        let chain = self.chain.build(limits.contexts, |key| {
            let general = key.ends_with(":*");
            let min = if general { 1 } else { limits.min_context };
            (limits.per_chain_context, min)
        });
        let used: HashSet<String> = next
            .values()
            .chain(chain.values())
            .flat_map(|f| f.top.iter().map(|(r, _)| absolute(r)))
            .collect();
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
            edits: self.edits.build(None),
            chain,
            attribute_columns: self.attribute_columns,
            runtime_ms: self
                .runtimes
                .iter()
                .filter(|(k, _)| used.contains(*k))
                .map(|(k, (n, sum))| (k.clone(), (sum / *n as f64 * 100.0).round() / 100.0))
                .collect(),
            ranker: None,
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
