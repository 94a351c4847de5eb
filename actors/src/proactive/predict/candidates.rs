//! Candidate generation: the session's likely next cells, from its hints, the learned table
//! (what follows the last cell, what follows binding or changing an object, what sessions
//! run on objects like these), and its own history, ranked by expected saving.

use std::collections::{HashMap, HashSet};

use super::chain::{drop_key, drop_key_general, drop_key_shape, join, kept_columns, split};
use super::learned::Learned;
use super::model::{column_class, Context, SessionModel};
use super::normal::render;
use super::normal::{normalise, single_expression};
use super::prediction::{Prediction, Source};
use super::rank::Features;
use super::syntax::{assigned, mutated};
use super::table::Table;
use super::template::{
    absolute, attribute_columns, instantiate, instantiate_tokens, slots, Filling, Slot,
};
use super::tokens::{tokenize, Token};

/// Below this a table entry is not worth filling.
const MIN_SHARE: f64 = 1e-4;
/// Objects tried for one free variable slot, and columns for one free column slot.
const VAR_CHOICES: usize = 6;
const COLUMN_CHOICES: usize = 10;
/// Fillings tried for one template.
const MAX_FILLINGS: usize = 40;
/// Guesses built on a hinted assignment.
const HINT_CHILDREN: usize = 6;
/// The probability a hint starts with.
const HINT_PRIOR: f64 = 0.9;
/// Guesses pooled from the sources, before ranking: the fewest a call of `predict` ranks
/// (more when it is asked for more).
const CANDIDATES: usize = 300;

/// A pooled guess and its features for the ranker.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub prediction: Prediction,
    pub features: Features,
}

/// A filling of a template's slots under construction.
#[derive(Debug, Clone)]
struct Partial {
    vars: Vec<String>,
    cols: Vec<String>,
    owner: Option<String>,
    fit: f64,
}

impl Default for Partial {
    fn default() -> Partial {
        Partial {
            vars: Vec::new(),
            cols: Vec::new(),
            owner: None,
            fit: 1.0,
        }
    }
}

/// Guesses accumulated by normal form.
#[derive(Default)]
pub(super) struct Pool {
    entries: HashMap<String, Entry>,
    /// Guesses that change an object in place (`df.drop(columns='a', inplace=True)`): no
    /// speculation of them could ever be served, so none is pooled.
    in_place: HashSet<String>,
}

struct Entry {
    code: String,
    template: String,
    by_source: [f64; 5],
    cost_ms: f64,
}

impl Pool {
    /// Adds `p` to the guess `code`, which is in normal form.
    pub(super) fn add(
        &mut self,
        code: String,
        template: String,
        source: Source,
        p: f64,
        cost_ms: f64,
    ) {
        if self.in_place.contains(&code) {
            return;
        }
        if !self.entries.contains_key(&code)
            && tokenize(&code).is_some_and(|tokens| !mutated(&tokens).is_empty())
        {
            self.in_place.insert(code);
            return;
        }
        let entry = self.entries.entry(code.clone()).or_insert_with(|| Entry {
            code,
            template,
            by_source: [0.0; 5],
            cost_ms,
        });
        entry.by_source[source as usize] += p;
    }
}

impl SessionModel {
    /// The likeliest next cells, at most `limit`: hints (and what follows a hinted
    /// assignment) first, then single expressions by expected saving.
    pub fn predict(&self, table: &Table, learned: &Learned, limit: usize) -> Vec<Prediction> {
        let mut out = self.hinted(table, learned);
        let mut ranked: Vec<Prediction> = self
            .candidates(table, limit.max(CANDIDATES))
            .into_iter()
            .filter(|c| !out.iter().any(|p| p.normal == c.prediction.normal))
            .map(|c| {
                let mut p = c.prediction;
                let prior = match &table.ranker {
                    Some(ranker) => ranker.probability(&c.features),
                    None => p.probability,
                };
                p.probability = learned.probability(p.source, &p.template, prior);
                if let Some(ms) = learned.runtime(&p.template) {
                    p.cost_ms = ms;
                }
                p
            })
            .collect();
        ranked.sort_by(|a, b| {
            b.expected_saving()
                .total_cmp(&a.expected_saving())
                .then_with(|| a.normal.cmp(&b.normal))
        });
        out.extend(ranked);
        out.truncate(limit);
        out
    }

    /// The guesses of every source but hints, pooled by normal form, the likeliest by their
    /// sources' shares first (at most `at_most`), each with its features for the ranker.
    /// A guess's probability is its sources' share, before the ranker and outcomes.
    pub fn candidates(&self, table: &Table, at_most: usize) -> Vec<Candidate> {
        let mut pool = Pool::default();
        self.guess_from_table(table, &mut pool);
        self.guess_from_chain(table, &mut pool);
        self.guess_from_history(table, &mut pool);
        let mut entries: Vec<(String, Entry)> = pool.entries.into_iter().collect();
        let share = |e: &Entry| e.by_source.iter().sum::<f64>().min(1.0);
        entries.sort_by(|a, b| {
            share(&b.1)
                .total_cmp(&share(&a.1))
                .then_with(|| a.0.cmp(&b.0))
        });
        entries.truncate(at_most);
        let recall = self.recall();
        entries
            .into_iter()
            .map(|(normal, e)| {
                let (source, _) = Source::ALL
                    .iter()
                    .map(|&s| (s, e.by_source[s as usize]))
                    .fold(
                        (Source::Namespace, -1.0),
                        |a, b| if b.1 > a.1 { b } else { a },
                    );
                let features = self.features(&normal, &e.template, &e.by_source, &recall);
                let cost_ms = table
                    .runtime_ms
                    .get(&e.template)
                    .copied()
                    .unwrap_or(e.cost_ms);
                Candidate {
                    prediction: Prediction {
                        probability: share(&e),
                        code: e.code,
                        normal,
                        source,
                        template: e.template,
                        cost_ms,
                        after: None,
                    },
                    features,
                }
            })
            .collect()
    }

    /// Hints, and for a hinted assignment what usually follows binding its name.
    fn hinted(&self, table: &Table, learned: &Learned) -> Vec<Prediction> {
        let mut out: Vec<Prediction> = Vec::new();
        for code in &self.hints {
            let Some(tokens) = tokenize(code) else {
                continue;
            };
            let Some(normal) = normalise(code) else {
                continue;
            };
            if out.iter().any(|p| p.normal == normal) {
                continue;
            }
            let parent = out.len();
            let probability = learned.probability(Source::Hint, &normal, HINT_PRIOR);
            out.push(Prediction {
                code: code.clone(),
                normal: normal.clone(),
                source: Source::Hint,
                template: normal,
                probability,
                cost_ms: self.default_cost(&[]),
                after: None,
            });
            if single_expression(&tokens) {
                continue;
            }
            let Some(name) = assigned(&tokens).pop() else {
                continue;
            };
            let reads_data = tokens.iter().any(|t| t.text.starts_with("read_"));
            let key = if reads_data { "b:F" } else { "b:?" };
            let Some(followers) = table.next.get(key).or_else(|| table.next.get("b:?")) else {
                continue;
            };
            let prev = [name];
            let children = followers
                .top
                .iter()
                .filter(|(rel, _)| slots(rel).iter().all(|s| s.prev && !s.column))
                .filter_map(|(rel, count)| {
                    let filling = Filling {
                        prev_vars: &prev,
                        ..Filling::default()
                    };
                    let code = instantiate(rel, &filling)?;
                    let share = f64::from(*count) / f64::from(followers.total.max(1));
                    Some((code, absolute(rel), share))
                })
                .take(HINT_CHILDREN);
            for (code, template, share) in children.collect::<Vec<_>>() {
                let Some(normal) = normalise(&code) else {
                    continue;
                };
                if out.iter().any(|p| p.normal == normal) {
                    continue;
                }
                out.push(Prediction {
                    code,
                    normal,
                    source: Source::Hint,
                    probability: learned.probability(Source::Hint, &template, probability * share),
                    template,
                    cost_ms: self.default_cost(&[]),
                    after: Some(parent),
                });
            }
        }
        out
    }

    /// Learned successors of each context of the last cell, backing off from the most
    /// specific context to the unconditional frequencies.
    fn guess_from_table(&self, table: &Table, pool: &mut Pool) {
        let attribute = self.attribute_share(table);
        let mut mass = 1.0;
        for context in self.contexts() {
            let Some(followers) = table.next.get(&context.key) else {
                continue;
            };
            let unconditional = context.key == "u";
            let weight = if unconditional {
                1.0
            } else {
                followers.weight()
            };
            let share = mass * weight;
            mass *= 1.0 - weight;
            let total = f64::from(followers.total.max(1));
            for (rel, count) in &followers.top {
                let p = share * f64::from(*count) / total;
                if p < MIN_SHARE {
                    break;
                }
                let source = match context.key.split(':').next() {
                    Some("u") => Source::Namespace,
                    Some("b") if rel == "$p0" => Source::Display,
                    _ => Source::Template,
                };
                let template = absolute(rel);
                for (form, share) in column_forms(rel, attribute) {
                    for (code, fit, cost) in self.fillings(
                        &form,
                        &template,
                        &context,
                        table,
                        MIN_SHARE / (p * share),
                        |c| c,
                    ) {
                        pool.add(code, template.clone(), source, p * share * fit, cost);
                    }
                }
            }
        }
    }

    /// Learned continuations of the last cell's method chain: its first trailers kept, the
    /// last ones dropped, others added (`df[m]` then `df[m].shape`; `s.mean()` then
    /// `s.median()`).
    fn guess_from_chain(&self, table: &Table, pool: &mut Pool) {
        let Some(last) = self.history.back().filter(|l| l.single && l.ok) else {
            return;
        };
        let scope = self.scope();
        let Some(chain) = tokenize(&last.code).and_then(|t| split(&t, &scope)) else {
            return;
        };
        let attribute = self.attribute_share(table);
        let n = chain.trailers.len();
        for keep in 0..=n {
            let Some(general) = table.chain.get(&drop_key_general(n - keep)) else {
                continue;
            };
            // Backing off from the dropped trailers as written to their shape, then to
            // any trailers.
            let specific = table.chain.get(&drop_key(&chain, n - keep, &scope));
            let shape = table.chain.get(&drop_key_shape(&chain, n - keep));
            let mut levels = Vec::new();
            let mut mass = 1.0;
            for followers in [specific, shape].into_iter().flatten() {
                levels.push((followers, mass * followers.weight()));
                mass *= 1.0 - followers.weight();
            }
            levels.push((general, mass));
            let mut guesses: HashMap<&str, f64> = HashMap::new();
            for (followers, share) in levels {
                let total = f64::from(followers.total.max(1));
                for (rel, count) in &followers.top {
                    *guesses.entry(rel.as_str()).or_default() += share * f64::from(*count) / total;
                }
            }
            let context = Context {
                key: String::new(),
                vars: vec![chain.root.clone()],
                cols: kept_columns(&chain, keep, &scope),
            };
            let mut guesses: Vec<(&str, f64)> = guesses.into_iter().collect();
            guesses.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
            if chain.needs_subscript(keep) {
                guesses.retain(|(rel, _)| rel.starts_with('['));
            }
            for (rel, p) in guesses.into_iter().filter(|(_, p)| *p >= MIN_SHARE) {
                // Outcomes are recorded under the cut and what was added.
                let counted = absolute(rel);
                let template = format!("-{}:{counted}", n - keep);
                for (form, share) in column_forms(rel, attribute) {
                    let wrap = |suffix: Vec<Token>| join(&chain, keep, suffix);
                    for (code, fit, cost) in self.fillings(
                        &form,
                        &counted,
                        &context,
                        table,
                        MIN_SHARE / (p * share),
                        wrap,
                    ) {
                        pool.add(
                            code,
                            template.clone(),
                            Source::Template,
                            p * share * fit,
                            cost,
                        );
                    }
                }
            }
        }
    }

    /// The ways to fill the free slots of `rel` in this session, each with its code, how
    /// well it fits (learned shares of ranks, kinds and column classes) and its default cost;
    /// fillings that fit less than `floor` are not worth writing.
    fn fillings(
        &self,
        rel: &str,
        template: &str,
        context: &Context,
        table: &Table,
        floor: f64,
        wrap: impl Fn(Vec<Token>) -> Vec<Token>,
    ) -> Vec<(String, f64, f64)> {
        let slots = slots(rel);
        // Each partial filling: free variables, free columns, the frame the next column
        // slot belongs to (the last variable filled), and its fit.
        let mut partial: Vec<Partial> = vec![Partial::default()];
        let mut first_var = true;
        for slot in &slots {
            let mut next = Vec::new();
            for part in &partial {
                let choices = self.slot_choices(*slot, part, context, table, template, first_var);
                for (name, fit) in choices {
                    let mut part = part.clone();
                    part.fit *= fit;
                    match (slot.prev, slot.column) {
                        (true, false) => part.owner = Some(name),
                        (true, true) => {}
                        (false, true) => part.cols.push(name),
                        (false, false) => {
                            part.owner = Some(name.clone());
                            part.vars.push(name);
                        }
                    }
                    next.push(part);
                }
            }
            next.retain(|part| part.fit >= floor);
            next.sort_by(|a, b| b.fit.total_cmp(&a.fit));
            next.truncate(MAX_FILLINGS);
            partial = next;
            first_var &= slot.column;
        }
        let mut out = Vec::new();
        for part in partial {
            let filling = Filling {
                prev_vars: &context.vars,
                prev_cols: &context.cols,
                vars: &part.vars,
                cols: &part.cols,
                literals: &[],
            };
            let Some(tokens) = instantiate_tokens(rel, &filling).map(&wrap) else {
                continue;
            };
            if !single_expression(&tokens) {
                continue;
            }
            let named: Vec<String> = part.vars.iter().chain(&context.vars).cloned().collect();
            let cost = self.default_cost(&named);
            for (tokens, fit) in self.fill_literals(tokens) {
                out.push((render(&tokens), part.fit * fit, cost));
            }
        }
        out
    }

    /// The names that may fill one slot, with how well each fits.
    fn slot_choices(
        &self,
        slot: Slot,
        part: &Partial,
        context: &Context,
        table: &Table,
        template: &str,
        first_var: bool,
    ) -> Vec<(String, f64)> {
        match (slot.prev, slot.column) {
            (true, false) => match context.vars.get(slot.index) {
                Some(name) if first_var => {
                    vec![(name.clone(), table.kind_fit(template, self.kind(name)))]
                }
                Some(name) => vec![(name.clone(), 1.0)],
                None => Vec::new(),
            },
            (true, true) => match context.cols.get(slot.index) {
                Some(label) => vec![(label.clone(), 1.0)],
                None => Vec::new(),
            },
            (false, false) => self
                .recency
                .iter()
                .enumerate()
                .filter(|(_, n)| !context.vars.contains(n) && !part.vars.contains(n))
                .take(VAR_CHOICES)
                .map(|(rank, name)| {
                    let fit = if first_var {
                        table.kind_fit(template, self.kind(name))
                    } else {
                        1.0
                    };
                    (name.clone(), table.var_rank(rank) * fit)
                })
                .collect(),
            (false, true) => {
                let Some(owner) = part.owner.clone().or_else(|| self.recency.first().cloned())
                else {
                    return Vec::new();
                };
                let rows = self.objects.get(&owner).and_then(|o| o.len);
                self.ranked_columns(&owner)
                    .into_iter()
                    .enumerate()
                    .filter(|(_, c)| !context.cols.contains(&c.name))
                    .take(COLUMN_CHOICES)
                    .map(|(rank, column)| {
                        let class = column_class(column, rows);
                        let fit = table.class_fit(template, &class).unwrap_or(1.0)
                            * listing_fit(template, &class);
                        (column.name.clone(), table.col_rank(rank) * fit)
                    })
                    .collect()
            }
        }
    }

    /// A runtime estimate from the size of the objects a guess reads.
    pub(super) fn default_cost(&self, names: &[String]) -> f64 {
        let cells: u64 = names
            .iter()
            .filter_map(|n| self.objects.get(n))
            .map(|o| match o.shape.as_slice() {
                [rows, cols, ..] => rows * cols,
                [rows] => *rows,
                [] => o.len.unwrap_or(1),
            })
            .sum();
        1.0 + cells as f64 * 2e-5
    }
}

/// A template as counted (columns as subscripts) and, when it subscripts a column, as an
/// attribute access, each with the share a session writing `attribute` of its column
/// accesses as attributes gives it.
fn column_forms(rel: &str, attribute: f64) -> Vec<(String, f64)> {
    match attribute_columns(rel) {
        None => vec![(rel.to_string(), 1.0)],
        Some(form) => vec![(rel.to_string(), 1.0 - attribute), (form, attribute)],
    }
}

/// Listing the values of a column (`value_counts`, `unique`, `nunique`) is only guessed
/// for columns with few values, whatever the table says: on a column of names it is a
/// large answer nobody asked for.
fn listing_fit(template: &str, class: &str) -> f64 {
    let listing = ["value_counts(", "unique(", "nunique("]
        .iter()
        .any(|m| template.contains(m));
    if listing && class.ends_with("high") {
        0.0
    } else {
        1.0
    }
}
