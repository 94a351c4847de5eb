//! One session as the predictor sees it: the cells it ran (as templates), the latest summary
//! of each data object it holds, which objects and columns it used last, and its hints.
//!
//! The caller feeds it every real execution ([`SessionModel::observe`]); `predict` (in
//! `candidates.rs`) reads it.

use std::collections::{HashMap, HashSet, VecDeque};

use pyvisor_protocol::messages::{CellFacts, ColumnSummary, ObjectSummary};

use super::normal::{normalise, single_expression};
use super::syntax::{assigned, imported, mutated};
use super::template::{abstract_tokens, Scope, Template};
use super::tokens::tokenize;

/// How many past cells a session keeps.
const HISTORY: usize = 32;
/// A cell naming more columns than this selects or renames them rather than inspecting
/// each: they do not count as used when guessing which column comes next.
const INSPECTED_COLUMNS: usize = 2;
/// The worker counts a column's distinct values on SAMPLED_ROWS rows of a frame of more than
/// SAMPLED_ABOVE rows, on all of a smaller one (`summaries.py`'s SAMPLE and SAMPLE_ABOVE).
const SAMPLED_ROWS: u64 = 1000;
const SAMPLED_ABOVE: u64 = 2000;

/// One cell the session ran.
#[derive(Debug, Clone)]
pub struct Observed {
    pub code: String,
    pub normal: Option<String>,
    /// The whole cell abstracted.
    pub template: Template,
    /// Its last simple statement abstracted on its own.
    pub last: Template,
    pub single: bool,
    pub ok: bool,
    /// Data objects it bound, in order.
    pub bound: Vec<String>,
    /// Data objects it changed in place.
    pub touched: Vec<String>,
    /// Position of the cell in the session (0 for the first).
    pub seq: usize,
}

/// A context a prediction is conditioned on, from the last cell: a key into the table and
/// the names that the `$p…` slots of what follows refer to.
#[derive(Debug, Clone, PartialEq)]
pub struct Context {
    pub key: String,
    pub vars: Vec<String>,
    pub cols: Vec<String>,
}

/// The predictor's view of one session.
#[derive(Debug, Clone, Default)]
pub struct SessionModel {
    pub(super) history: VecDeque<Observed>,
    pub(super) objects: HashMap<String, ObjectSummary>,
    /// Data object names, the most recently bound, changed or read first.
    pub(super) recency: Vec<String>,
    /// When each data object was last bound (cell position).
    pub(super) bound_at: HashMap<String, usize>,
    /// Data object names in the order they were last bound, the first bound first.
    pub(super) bound_order: Vec<String>,
    modules: HashSet<String>,
    vars: HashSet<String>,
    /// Column labels the session used, most recent first.
    pub(super) used_columns: Vec<String>,
    pub(super) hints: Vec<String>,
    cells: usize,
}

impl SessionModel {
    /// A model of a session that has run nothing yet.
    pub fn new() -> SessionModel {
        SessionModel::default()
    }

    /// Takes in one real execution: its code, what the worker reported, and whether it ran
    /// without error.
    pub fn observe(&mut self, code: &str, facts: &CellFacts, ok: bool) {
        let tokens = tokenize(code);
        if let Some(tokens) = &tokens {
            self.modules.extend(imported(tokens));
        }
        for name in &facts.binds {
            if !self.modules.contains(name) {
                self.vars.insert(name.clone());
            }
        }
        let mut scope = self.scope();
        for object in &facts.objects {
            scope.columns.extend(string_labels(object));
            scope.labels.extend(object.labels.iter().cloned());
            scope
                .values
                .extend(object.columns.iter().flat_map(|c| c.values.iter().cloned()));
        }
        let tokens = tokens.unwrap_or_default();
        let template = abstract_tokens(&tokens, &scope);
        let last = super::syntax::statements(&tokens)
            .last()
            .map(|s| abstract_tokens(s, &scope))
            .unwrap_or_default();

        for name in &facts.reads {
            if self.objects.contains_key(name) {
                self.bump(name);
            }
        }
        let summarised: HashSet<&str> = facts.objects.iter().map(|o| o.name.as_str()).collect();
        for name in &facts.binds {
            if !summarised.contains(name.as_str()) {
                self.objects.remove(name);
                self.recency.retain(|n| n != name);
                self.bound_order.retain(|n| n != name);
            }
        }
        let mut bound = Vec::new();
        let mut touched = Vec::new();
        for object in &facts.objects {
            self.objects.insert(object.name.clone(), object.clone());
            self.bump(&object.name);
            if facts.binds.contains(&object.name) {
                self.bound_at.insert(object.name.clone(), self.cells);
                self.bound_order.retain(|n| n != &object.name);
                self.bound_order.push(object.name.clone());
                bound.push(object.name.clone());
            } else {
                touched.push(object.name.clone());
            }
        }
        // Bound names last, so that the last one bound is the most recent.
        for name in &facts.binds {
            if self.objects.contains_key(name) {
                self.bump(name);
            }
        }
        let inspected = if template.cols.len() <= INSPECTED_COLUMNS {
            template.cols.as_slice()
        } else {
            &[]
        };
        for column in inspected.iter().rev() {
            self.used_columns.retain(|c| c != column);
            self.used_columns.insert(0, column.clone());
        }
        if let Some(normal) = normalise(code) {
            self.hints
                .retain(|h| normalise(h).as_deref() != Some(normal.as_str()));
        }
        self.history.push_back(Observed {
            code: code.to_string(),
            normal: normalise(code),
            single: single_expression(&tokens),
            template,
            last,
            ok,
            bound: order_like(&facts.binds, &bound),
            touched,
            seq: self.cells,
        });
        if self.history.len() > HISTORY {
            self.history.pop_front();
        }
        self.cells += 1;
    }

    /// Code the caller expects to run next (from `session.hint`); replaces earlier hints.
    pub fn hint(&mut self, code: Vec<String>) {
        self.hints = code;
    }

    /// The namespace was replaced (restore, rollback): object summaries are dropped until new
    /// facts arrive; the history stays.
    pub fn forget(&mut self) {
        self.objects.clear();
        self.recency.clear();
        self.bound_at.clear();
        self.bound_order.clear();
    }

    /// The latest summary of a data object.
    pub fn object(&self, name: &str) -> Option<&ObjectSummary> {
        self.objects.get(name)
    }

    /// The cells this model remembers, oldest first.
    pub fn history(&self) -> impl Iterator<Item = &Observed> {
        self.history.iter()
    }

    /// The names templates abstract: the session's variables and its frames' column labels,
    /// and the literals of its data (index labels, column values).
    pub fn scope(&self) -> Scope {
        Scope {
            vars: self.vars.clone(),
            columns: self.objects.values().flat_map(string_labels).collect(),
            labels: self
                .objects
                .values()
                .flat_map(|o| o.labels.iter().cloned())
                .collect(),
            values: self
                .objects
                .values()
                .flat_map(|o| o.columns.iter().flat_map(|c| c.values.iter().cloned()))
                .collect(),
        }
    }

    /// `code` abstracted as the next cell of this session (its own assignments count as
    /// variables).
    pub fn abstract_next(&self, code: &str) -> Option<Template> {
        let tokens = tokenize(code)?;
        let mut scope = self.scope();
        for name in assigned(&tokens).into_iter().chain(mutated(&tokens)) {
            if !self.modules.contains(&name) {
                scope.vars.insert(name);
            }
        }
        Some(abstract_tokens(&tokens, &scope))
    }

    /// What the next cell may be conditioned on, from the most specific to the least.
    pub fn contexts(&self) -> Vec<Context> {
        let mut out = Vec::new();
        if let Some(last) = self.history.back() {
            let status = if last.ok { "" } else { "!" };
            out.push(Context {
                key: format!("c{status}:{}", last.template.context),
                vars: last.template.vars.clone(),
                cols: last.template.cols.clone(),
            });
            if last.last.context != last.template.context {
                out.push(Context {
                    key: format!("l:{}", last.last.context),
                    vars: last.last.vars.clone(),
                    cols: last.last.cols.clone(),
                });
            }
            let event = match (last.bound.last(), last.touched.first()) {
                (Some(name), _) => Some(("b", name)),
                (None, Some(name)) => Some(("m", name)),
                _ => None,
            };
            if let Some((what, name)) = event {
                out.push(Context {
                    key: format!("{what}:{}", self.kind(name)),
                    vars: vec![name.clone()],
                    cols: Vec::new(),
                });
            }
            if let Some(first) = last.template.vars.first() {
                if self.objects.contains_key(first) {
                    out.push(Context {
                        key: format!("v:{}", self.kind(first)),
                        vars: vec![first.clone()],
                        cols: last.template.cols.clone(),
                    });
                }
            }
        }
        out.push(Context {
            key: "u".to_string(),
            vars: Vec::new(),
            cols: Vec::new(),
        });
        out
    }

    /// The short kind of a data object (`F` frame, `S` series, ...), `?` when unknown.
    pub fn kind(&self, name: &str) -> &'static str {
        self.objects.get(name).map_or("?", kind_of)
    }

    /// The data objects, the most recent first.
    pub fn recent_objects(&self) -> &[String] {
        &self.recency
    }

    /// The string column labels of a frame, the likeliest next first: those not used yet,
    /// from the one after the last used, then the used ones, the most recent first.
    pub fn ranked_columns(&self, name: &str) -> Vec<&ColumnSummary> {
        let Some(object) = self.objects.get(name) else {
            return Vec::new();
        };
        let columns: Vec<&ColumnSummary> =
            object.columns.iter().filter(|c| c.label_is_str).collect();
        let at: HashMap<&str, usize> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.as_str(), i))
            .collect();
        // Used columns of this frame, the most recent first.
        let used: Vec<usize> = self
            .used_columns
            .iter()
            .filter_map(|u| at.get(u.as_str()).copied())
            .collect();
        let start = used.first().map_or(0, |&i| i + 1);
        let mut out: Vec<&ColumnSummary> = columns[start..]
            .iter()
            .chain(&columns[..start])
            .filter(|c| !used.contains(&at[c.name.as_str()]))
            .copied()
            .collect();
        out.extend(used.iter().map(|&i| columns[i]));
        out
    }

    /// Whether the frame `name` has every one of the string column `labels`.
    pub fn has_columns(&self, name: &str, labels: &[String]) -> bool {
        let Some(object) = self.objects.get(name) else {
            return labels.is_empty();
        };
        labels.iter().all(|label| {
            object
                .columns
                .iter()
                .any(|c| c.label_is_str && &c.name == label)
        })
    }

    /// The share of column accesses this session writes as attributes (`df.a`), starting
    /// from the corpus's share.
    pub fn attribute_share(&self, table: &super::table::Table) -> f64 {
        let (mut attribute, mut all) = (0.0, 0.0);
        for cell in &self.history {
            attribute += cell.template.key.matches(".$c").count() as f64;
            all += cell.template.cols.len() as f64;
        }
        let prior = table.attribute_columns.smoothed(2.0).clamp(0.05, 0.95);
        (attribute + 2.0 * prior) / (all + 2.0)
    }

    fn bump(&mut self, name: &str) {
        self.recency.retain(|n| n != name);
        self.recency.insert(0, name.to_string());
    }
}

/// `subset` in the order of `order`.
fn order_like(order: &[String], subset: &[String]) -> Vec<String> {
    order
        .iter()
        .filter(|n| subset.contains(n))
        .cloned()
        .collect()
}

fn string_labels(object: &ObjectSummary) -> impl Iterator<Item = String> + '_ {
    let frame = object.kind != "Series";
    object
        .columns
        .iter()
        .filter(move |c| c.label_is_str && frame)
        .map(|c| c.name.clone())
}

/// The short kind of an object summary.
pub fn kind_of(object: &ObjectSummary) -> &'static str {
    match (object.module.as_str(), object.kind.as_str()) {
        (_, "DataFrame") => "F",
        (_, "Series") => "S",
        ("numpy", "ndarray") => "A",
        (_, k) if k.contains("GroupBy") => "G",
        ("pandas", _) => "P",
        (_, "?") | (_, "") => "?",
        _ => "O",
    }
}

/// The class of a column that templates are fitted to: `num`, `bool`, `date` or `obj`, and
/// `low` or `high` cardinality.
pub fn column_class(column: &ColumnSummary, rows: Option<u64>) -> String {
    let dtype = column.dtype.to_ascii_lowercase();
    let base = if dtype.is_empty() {
        "?"
    } else if dtype.starts_with("int") || dtype.starts_with("uint") || dtype.starts_with("float") {
        "num"
    } else if dtype.starts_with("bool") {
        "bool"
    } else if dtype.contains("datetime") || dtype.contains("timedelta") {
        "date"
    } else {
        "obj"
    };
    let cardinality = if has_few_values(column, rows) {
        "low"
    } else {
        "high"
    };
    format!("{base}-{cardinality}")
}

/// Whether `column`, of a frame of `rows` rows, has few distinct values (the `low` of
/// [`column_class`]): 30 at most, or one in 20 of the rows they were counted on.
pub fn has_few_values(column: &ColumnSummary, rows: Option<u64>) -> bool {
    let counted_on = rows.map(|n| if n > SAMPLED_ABOVE { SAMPLED_ROWS } else { n });
    column.distinct <= 30 || counted_on.is_some_and(|n| column.distinct * 20 <= n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str, labels: &[&str]) -> ObjectSummary {
        ObjectSummary {
            name: name.to_string(),
            kind: "DataFrame".to_string(),
            columns: labels
                .iter()
                .map(|l| ColumnSummary {
                    name: l.to_string(),
                    label_is_str: true,
                    ..ColumnSummary::default()
                })
                .collect(),
            ..ObjectSummary::default()
        }
    }

    #[test]
    fn columns_rank_from_the_one_after_the_last_used_and_used_ones_last() {
        let mut model = SessionModel::new();
        let df = frame("df", &["a", "b", "c", "d"]);
        let facts = |binds: &[&str]| CellFacts {
            binds: binds.iter().map(|s| s.to_string()).collect(),
            objects: vec![df.clone()],
            ..CellFacts::default()
        };
        model.observe("df = load()", &facts(&["df"]), true);
        model.observe("df['a'].sum()", &facts(&[]), true);
        model.observe("df['c'].sum()", &facts(&[]), true);
        let ranked: Vec<&str> = model
            .ranked_columns("df")
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(ranked, ["d", "b", "c", "a"]);
        assert!(model.has_columns("df", &["d".to_string(), "a".to_string()]));
        assert!(!model.has_columns("df", &["e".to_string()]));
        assert!(!model.has_columns("other", &["a".to_string()]));
    }

    #[test]
    fn few_values_are_judged_on_the_rows_they_were_counted_on() {
        let column = ColumnSummary {
            distinct: 60,
            ..ColumnSummary::default()
        };
        // Counted on all 1,500 rows: one value in 25.
        assert!(has_few_values(&column, Some(1500)));
        // Counted on a sample of 1,000 rows of 6,000: one value in 17.
        assert!(!has_few_values(&column, Some(6000)));
        assert!(has_few_values(
            &ColumnSummary {
                distinct: 30,
                ..ColumnSummary::default()
            },
            Some(40)
        ));
    }
}
